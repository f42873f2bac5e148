"""Options at their limits (a QA journey through every algorithm's options, 2026-12-02): each either
does what the limit means or is refused in one line before any work."""
import json
import os
import re

import pytest

from jaxfl import cli
from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.experiment import run_experiment

TINY = dict(model="mlp", clients=4, local_steps=2, batch_size=16, progress=False, timing_only=True)


@pytest.mark.parametrize("algorithm", ["fedavg", "ccfedavg", "fedat", "port"])
def test_a_round_deadline_no_client_meets_stops_the_run_as_stalled(tmp_path, algorithm):
    # it ran to its budget with 0 updates, and forever under max_time inf; CC-FedAvg counted each
    # empty round as a global update
    result = run_experiment(RunConfig(algorithm=algorithm, **TINY, round_timeout=0.01, max_updates=3,
                                      max_time=float("inf"), output_dir=str(tmp_path)))
    assert result.summary["global_updates"] == 0
    assert result.summary["stop_reason"].startswith("stalled: the last 100 updates were all dropped (the last for "
                                                    "'arrived after round deadline')")
    assert "raise round_timeout" in result.summary["stop_reason"]


def test_fedbuff_takes_a_buffer_larger_than_the_federation(tmp_path):
    # the buffer holds dispatches, and a returning client is dispatched again: it fills (refused before,
    # "a larger buffer never fills", which also refused --clients 1 at the default K = 3)
    result = run_experiment(RunConfig(algorithm="fedbuff", **{**TINY, "clients": 1}, max_updates=2,
                                      output_dir=str(tmp_path)))
    assert result.summary["global_updates"] == 2


def test_fedasync_s_mixing_weight_is_at_most_one():
    with pytest.raises(ConfigError, match=r"staleness_alpha=2.0 is not allowed: at most 1 under fedasync's rule plato"):
        validate(RunConfig(algorithm="fedasync", rule="plato", staleness="constant", staleness_alpha=2.0))
    validate(RunConfig(algorithm="fedasync", rule="fedcompass", staleness_alpha=2.0))  # a step size there
    validate(RunConfig(algorithm="fedbuff", staleness_alpha=2.0))


def test_an_evaluation_grid_longer_than_the_budget_is_refused():
    # it evaluated the initial model alone, which final_accuracy and best_accuracy then reported
    with pytest.raises(ConfigError, match=r"eval_interval=100.0 is not allowed: at most max_time \(5\)"):
        validate(RunConfig(eval_interval=100.0, max_time=5.0))
    validate(RunConfig(eval_interval=5.0, max_time=5.0))


def _refusal(capsys, *flags) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--timing-only", "--model", "mlp", "--clients", "4", "--max-updates", "2", "--no-progress",
                  *flags])
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_fedcompass_refuses_local_steps_it_does_not_read_beside_q_max(tmp_path, capsys):
    # Q_max is compass.q_max when set: --local-steps 7 was ignored (steps 1-10) and the run named q7
    err = _refusal(capsys, "--algorithm", "fedcompass", "--compass.q-max", "10", "--local-steps", "7",
                   "--out", str(tmp_path))
    assert "local_steps=7 is not allowed with algorithm fedcompass as set here: it reads it only with " \
           "fedcompass's compass.q_max unset" in err
    assert not os.listdir(tmp_path)
    with pytest.raises(ConfigError, match="local_steps=7 is not allowed"):
        validate(RunConfig(algorithm="fedcompass", local_steps=7, algorithm_options={"q_max": 10}))
    cli.main(["run", "--timing-only", "--model", "mlp", "--clients", "4", "--max-updates", "2", "--no-progress",
              "--algorithm", "fedcompass,fedavg", "--compass.q-max", "10", "--local-steps", "7",
              "--out", str(tmp_path)])
    assert "local_steps=7 applies to fedavg only (fedcompass does not read it)" in capsys.readouterr().err
    fedavg = [name for name in os.listdir(tmp_path) if name.startswith("fedavg")]
    with open(os.path.join(tmp_path, fedavg[0], "config.json")) as handle:
        assert json.load(handle)["config"]["client"]["local_steps"] == 7


def test_clients_per_round_beside_concurrency_is_refused_saying_which_replaces_which(capsys):
    err = _refusal(capsys, "--algorithm", "fedasync", "--clients-per-round", "2", "--concurrency", "3")
    assert "clients_per_round=2 is not allowed with algorithm fedasync: concurrency=3 replaces it" in err
    assert "never reads" not in err


def test_fedasmu_refuses_local_steps_that_leave_no_step_for_its_fetch_and_says_when_some_slots_skip_it(tmp_path):
    # the fetch at step round(l*·steps/epochs) was dropped without a word: fetches 0 at local_steps 1 or 2
    with pytest.raises(ConfigError, match=r"local_steps=2 is not allowed: .*local_steps at least 3 with "
                                          r"fedasmu.epochs=5 and slot first .*or fedasmu.fetch=false"):
        validate(RunConfig(algorithm="fedasmu", local_steps=2, algorithm_options={"slot": "first"}))
    validate(RunConfig(algorithm="fedasmu", local_steps=2, algorithm_options={"slot": "first", "fetch": False}))
    with pytest.warns(UserWarning, match=r"fedasmu: local_steps=2 leaves no step for the fetch at slots 1, 4 "):
        validate(RunConfig(algorithm="fedasmu", local_steps=2))  # the learned slot: 2 and 3 fetch


def test_a_server_optimizer_given_at_its_default_is_refused_where_the_algorithm_has_its_own(capsys):
    # --server-optimizer sgd equals the field's default: it was taken for unset, and FedAdam ran Adam
    err = _refusal(capsys, "--algorithm", "fedadam", "--server-optimizer", "sgd")
    assert "server_optimizer='sgd' is not allowed: adam for fedadam (or leave it unset)" in err


def test_a_round_s_stragglers_do_not_count_as_a_stall(tmp_path):
    # dropped during the next round, before it aggregates: 1,000 late clients of one 10^4-client round
    # (a deadline of twice the mean round, ~13 % late) stopped a learning run as stalled after 1 update
    result = run_experiment(RunConfig(algorithm="fedavg", dataset="synthetic", model="logreg", clients=10_000,
                                      timing_only=True, round_timeout=15.0, max_updates=4, progress=False,
                                      checkpoint_every=None, output_dir=str(tmp_path)))
    assert result.summary["stop_reason"] == "update budget" and result.summary["global_updates"] == 4
    assert result.summary["accounting"]["dropped_by_reason"]["arrived after round deadline"] > 1000


@pytest.mark.parametrize("field", ["batch_size", "local_steps", "num_classes", "clients_per_call"])
def test_counts_past_32_bits_are_refused_by_name(field, tmp_path):
    """batch_size or num_classes of 2^31 passed validation and crashed inside JAX with a 54-line
    OverflowError; now refused before any work, naming the field."""
    with pytest.raises(ConfigError, match=rf"^{field}=2147483648 is not allowed: an integer below 2\^31"):
        validate(RunConfig(**{field: 2 ** 31}, output_dir=str(tmp_path)))
    validate(RunConfig(**{field: 2 ** 31 - 1}, output_dir=str(tmp_path)))  # the largest is taken


@pytest.mark.parametrize("field, value, allowed", [
    ("speed_mean", 1e308, "at most 1e+30"), ("jitter", 1e31, "at most 1e+30"),
    ("delay_factor", 1e31, "at most 1e+30"), ("speed_reference_time", 1e-31, "at least 1e-30"),
    ("bandwidth", 1e-300, "at least 1e-30"),
    # 1e-320 ran, and summary.json held "aggregations_per_virtual_hour": Infinity (no JSON)
    ("speed_mean", 1e-320, "at least 1e-30: rates per virtual second divide by the times it makes")])
def test_time_settings_whose_products_overflow_are_refused_before_the_run_folder(field, value, allowed, tmp_path):
    """--speed-mean 1e308 passed validation, wrote the run folder and stopped at the first arrival with
    "event time must be finite; got time=inf", naming no setting."""
    config = RunConfig(dataset="digits", model="mlp", clients=4, max_updates=3, progress=False,
                       output_dir=str(tmp_path / "runs"), **{field: value})
    with pytest.raises(ConfigError, match="^" + re.escape(f"{field}={value!r} is not allowed: {allowed}")):
        run_experiment(config)
    assert not (tmp_path / "runs").exists()


def test_the_largest_time_settings_run_with_finite_times(tmp_path):
    """At the bound every factor at once still gives finite event times (the bound's reason)."""
    result = run_experiment(RunConfig(
        algorithm="fedasync", dataset="digits", model="mlp", clients=4, max_updates=3, max_time=float("inf"),
        heterogeneity="exp", speed_mean=1e30, jitter=1e30, delay_prob=0.5, delay_factor=1e30, latency=1e30,
        stop_at_target=False, progress=False, checkpoint_every=None, output_dir=str(tmp_path)))
    assert result.summary["global_updates"] == 3 and 0 < result.summary["virtual_time"] < 1e300


def test_local_epochs_whose_steps_pass_int32_are_refused_before_the_run_folder(tmp_path):
    """--local-epochs 1e9 (12e9 steps a round) wrote the run folder and its dispatch rows, then failed
    in an int32 OverflowError; 1e308 in a float OverflowError in the speed model."""
    for epochs, steps in ((1e9, "12,000,000,000"), (1e308, "about 10^309")):
        config = RunConfig(algorithm="fedavg", dataset="digits", model="mlp", clients=2, max_updates=1,
                           local_epochs=epochs, progress=False, output_dir=str(tmp_path / "runs"))
        with pytest.raises(ValueError, match=re.escape(f"local_epochs={epochs:g} is not allowed: it gives a client "
                                                       f"{steps} local steps") + r".*below 2\^31"):
            run_experiment(config)
        assert not (tmp_path / "runs").exists()


def test_given_times_per_step_beyond_the_time_scale_are_refused():
    from jaxfl.scheduler.speeds import check_time_per_step

    for bad in (1e-320, 1e31):
        with pytest.raises(ValueError, match=re.escape(f"time_per_step[1]={bad!r} is not allowed: seconds per step "
                                                       "from 1e-30 to 1e30")):
            check_time_per_step([0.1, bad, 0.2], 3)
