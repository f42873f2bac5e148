"""Settings a run never reads are refused, naming the value and when it is read (house rule: nothing
the user asked for is silently lost): client_weights under FedBuff's and FedAsync's paper rules and
FedASMU's fixed slots, the server optimiser's settings where the update mixes models without one
(FedAsync's paper rule, FedASMU), an unknown options preset, CC-FedAvg's and PORT's options read by
one variant only, and evaluation and checkpoint settings in a timing-only run. The valid
combinations still validate and run."""
import os

import pytest

from jaxfl.cli import _configs, build_parser, main
from jaxfl.config import ConfigError, RunConfig, algorithms_reading, config_from_mapping, fields_not_read_by, validate
from jaxfl import algorithms
from jaxfl.experiment import run_experiment
from jaxfl.sweep import expand

TINY = dict(clients=4, model="logreg", local_steps=1, batch_size=16, max_updates=2, stop_at_target=False,
            progress=False, checkpoint_every=None)


def cli_configs(*argv):
    return _configs(build_parser().parse_args(["run", "--clients", "4", *argv]))


def refused(values, *parts):
    with pytest.raises(ConfigError) as error:
        config_from_mapping({"clients": 4, **values})
    message = str(error.value)
    assert "\n" not in message and all(part in message for part in parts), message
    return message


# ----------------------------------------------------------------------------- client_weights
@pytest.mark.parametrize("values", [{"algorithm": "fedbuff"}, {"algorithm": "fedbuff", "rule": "paper"},
                                    {"algorithm": "fedasync", "rule": "paper"}])
def test_client_weights_are_refused_by_the_paper_rules(values):
    refused({**values, "client_weights": "uniform"}, "client_weights='uniform' is not allowed",
            "never reads it", "rule fedcompass")


def test_client_weights_are_refused_by_fedasmu_s_fixed_slots():
    refused({"algorithm": "fedasmu", "fedasmu.slot": "middle", "client_weights": "uniform"},
            "client_weights='uniform'", "fedasmu.slot='learned'", "this run's slot is 'middle'")


@pytest.mark.parametrize("values", [{"algorithm": "fedbuff", "rule": "fedcompass"},
                                    {"algorithm": "fedasync", "rule": "fedcompass"},
                                    {"algorithm": "fedavg"}, {"algorithm": "fedasmu"}, {"algorithm": "port"},
                                    {"algorithm": "ccfedavg"}, {"algorithm": "fedcompass"}, {"algorithm": "fedat"}])
def test_client_weights_are_taken_where_read(values):
    assert config_from_mapping({"clients": 4, **values, "client_weights": "uniform"}).client_weights == "uniform"


def test_the_command_line_names_the_readers_and_routes_a_comparison(capsys):
    with pytest.raises(ConfigError, match="client_weights='uniform' is not allowed with algorithm fedbuff as set "
                                          "here: it reads it only with fedbuff's rule fedcompass"):
        cli_configs("--algorithm", "fedbuff", "--client-weights", "uniform")
    fedavg, fedbuff = cli_configs("--algorithm", "fedavg,fedbuff", "--client-weights", "uniform")
    assert (fedavg.client_weights, fedbuff.client_weights) == ("uniform", "samples")
    assert "client_weights='uniform' applies to fedavg only" in capsys.readouterr().err
    assert "fedasync with rule fedcompass" in algorithms_reading("client_weights")
    assert fields_not_read_by(algorithms.get("fedbuff"), {"client_weights": "uniform", "rule": "fedcompass"}) == []


def test_a_sweep_leaves_client_weights_out_of_the_cells_that_do_not_read_it(tmp_path):
    cells, notes = expand({"clients": 4, "client_weights": "uniform"}, {"algorithm": ["fedavg", "fedbuff"]},
                          str(tmp_path))
    assert [cell.config.client_weights for cell in cells] == ["uniform", "samples"]
    assert "client_weights applies only to the cells that read it (algorithm=fedavg)" in notes


# ----------------------------------------------------------------------------- server optimiser
@pytest.mark.parametrize("values, shown", [({"server_optimizer": "adam"}, "server_optimizer='adam'"),
                                           ({"server_lr": 0.01}, "server_lr=0.01"),
                                           ({"server_momentum": 0.9}, "server_momentum=0.9")])
def test_server_settings_are_refused_by_fedasync_s_paper_rule(values, shown):
    refused({"algorithm": "fedasync", "rule": "paper", **values}, shown, "rule fedcompass",
            "without a server optimiser")
    assert config_from_mapping({"clients": 4, "algorithm": "fedasync", "rule": "fedcompass", **values})  # it reads them


@pytest.mark.parametrize("values, shown", [({"server_lr": 0.01}, "server_lr=0.01"),
                                           ({"server_momentum": 0.9}, "server_momentum=0.9")])
def test_server_settings_are_refused_by_fedasmu(values, shown):
    refused({"algorithm": "fedasmu", **values}, shown, "fedasmu mixes models with its learned α")


@pytest.mark.parametrize("values, shown", [({"server_optimizer": "adam"}, "server_optimizer='adam'"),
                                           ({"server_lr": 0.1}, "server_lr=0.1"),
                                           ({"server_momentum": 0.9}, "server_momentum=0.9")])
def test_server_settings_are_refused_by_fedat(values, shown):
    """FedAT's tier aggregation sets the model to its tiers' weighted average (its profiling round too)."""
    refused({"algorithm": "fedat", **values}, shown, "never reads it", "fedat sets the model to its tiers' weighted")
    assert "fedat" not in " ".join(algorithms_reading(next(iter(values))))


@pytest.mark.parametrize("values, shown", [({"server_optimizer": "adam"}, "server_optimizer='adam'"),
                                           ({"server_lr": 0.1}, "server_lr=0.1"),
                                           ({"server_momentum": 0.9}, "server_momentum=0.9"),
                                           ({"staleness": "hinge"}, "staleness='hinge'"),
                                           ({"staleness_alpha": 0.5}, "staleness_alpha=0.5"),
                                           ({"client_weights": "uniform"}, "client_weights='uniform'")])
def test_fedbuff_s_rule_plato_refuses_what_a_plain_model_average_does_not_read(values, shown):
    refused({"algorithm": "fedbuff", "rule": "plato", **values}, shown, "never reads it",
            "fedbuff's rule plato averages the K models with equal weights 1/K")


def test_a_port_comparison_gives_the_staleness_settings_to_fedasync_alone(tmp_path):
    cells, notes = expand({"clients": 4, "rule": "plato", "staleness_alpha": 0.9, "staleness_a": 2.0},
                          {"algorithm": ["fedasync", "fedbuff"]}, str(tmp_path))
    assert [(cell.config.staleness_a, cell.config.rule) for cell in cells] == [(2.0, "plato"), (0.5, "plato")]
    assert "staleness_a, staleness_alpha apply only to the cells that read them (algorithm=fedasync)" in notes


def test_fedcompass_m_refuses_another_server_optimizer():
    refused({"algorithm": "fedcompass_m", "server_optimizer": "adam"}, "server_optimizer='adam'",
            "sgd for fedcompass_m (FedCompass+M is SGD with momentum)")


def test_adam_s_settings_go_with_the_refused_optimizer(capsys):
    refused({"algorithm": "fedasync", "rule": "paper", "server_tau": 0.01}, "server_tau=0.01", "rule fedcompass")
    fedavg, fedasync = cli_configs("--algorithm", "fedavg,fedasync", "--rule", "paper", "--server-optimizer", "adam",
                                   "--server-tau", "0.01")
    assert (fedavg.server_optimizer, fedavg.server_tau) == ("adam", 0.01)
    assert (fedasync.server_optimizer, fedasync.server_tau, fedasync.server_lr) == ("sgd", 1e-3, 1.0)


def test_a_recorded_config_with_the_resolved_server_lr_is_still_valid():
    config = validate(RunConfig(algorithm="fedasync", rule="paper", clients=4))
    assert config.server_lr == 1.0 and validate(config) == config  # as config.json holds it (resume)


# ----------------------------------------------------------------------------- presets
@pytest.mark.parametrize("argv, message", [
    (["--algorithm", "port", "--port.preset", "foo"], "port.preset='foo' is not allowed: one of paper, plato"),
    (["--algorithm", "fedcompass", "--compass.preset", "foo"],
     "compass.preset='foo' is not allowed: one of paper, reference_code")])
def test_an_unknown_options_preset_is_named(argv, message, tmp_path, capsys):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        cli_configs(*argv)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--clients", "4", *argv, "--output-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err and "KeyError" not in err
    assert not (tmp_path / "runs").exists()
    space = argv[2][2:].replace("-", "_")
    with pytest.raises(ConfigError, match=r"sweep cell 0 .*" + message.replace("(", r"\(")):
        expand({"clients": 4}, {"algorithm": [argv[1]], space: ["foo"]}, str(tmp_path / "sweep"))


# ----------------------------------------------------------------------------- variant options
@pytest.mark.parametrize("options, shown, reader", [
    ({"cc.switch_round": 1}, "cc.switch_round=1", "cc.strategy='cc_c'"),
    ({"cc.insufficient_fraction": 0.3}, "cc.insufficient_fraction=0.3", "cc.budget='two_group'"),
    ({"cc.window": 3}, "cc.window=3", "cc.budget='two_group'"),
    ({"cc.budget": "two_group", "cc.budget_beta": 3}, "cc.budget_beta=3", "cc.budget='levels'"),
    ({"cc.total_rounds": 50}, "cc.total_rounds=50", "cc.strategy='dropout'"),
    ({"cc.nova_steps": "floor"}, "cc.nova_steps='floor'", "cc.strategy='fednova'"),
    ({"cc.strategy": "dropout", "cc.schedule": "round_robin"}, "cc.schedule='round_robin'", "cc.strategy cc,"),
])
def test_ccfedavg_options_of_another_variant_are_refused(options, shown, reader):
    refused({"algorithm": "ccfedavg", **options}, shown, f"only with {reader}", "this run's")


@pytest.mark.parametrize("options", [{"cc.strategy": "cc_c", "cc.switch_round": 1},
                                     {"cc.budget": "two_group", "cc.insufficient_fraction": 0.3, "cc.window": 3},
                                     {"cc.strategy": "dropout", "cc.total_rounds": 50},
                                     {"cc.strategy": "fednova", "cc.nova_steps": "floor"},
                                     {"cc.strategy": "strategy1", "cc.schedule": "round_robin"}])
def test_ccfedavg_options_of_the_chosen_variant_are_taken(options):
    assert config_from_mapping({"clients": 4, "algorithm": "ccfedavg", **options}).algorithm == "ccfedavg"


@pytest.mark.parametrize("options", [{"port.urgent_pull": False}, {"port.preset": "plato"}])
def test_port_s_pull_steps_need_the_urgent_pull(options):
    refused({"algorithm": "port", **options, "port.pull_steps": 3}, "port.pull_steps=3",
            "only with port.urgent_pull=True", "this run's urgent_pull is False")
    assert config_from_mapping({"clients": 4, "algorithm": "port", "port.pull_steps": 3}).algorithm_options.pull_steps == 3


# ----------------------------------------------------------------------------- timing-only
@pytest.mark.parametrize("values, shown", [({"checkpoint_every": 1}, "checkpoint_every=1"),
                                           ({"checkpoint_min_interval_s": 5.0}, "checkpoint_min_interval_s=5.0"),
                                           ({"final_checkpoint": False}, "final_checkpoint=False"),
                                           ({"eval_every": 5}, "eval_every=5"),
                                           ({"eval_interval": 5.0}, "eval_interval=5.0"),
                                           ({"eval_at_start": False}, "eval_at_start=False"),
                                           # no engine is built: devices=3 ran on a one-device machine
                                           ({"devices": 3}, "devices=3"),
                                           ({"memory_limit_mb": 1.0}, "memory_limit_mb=1.0"),
                                           ({"clients_per_call": 7}, "clients_per_call=7"),
                                           ({"steps_per_call": 2}, "steps_per_call=2"),
                                           ({"step_loop": "rolled"}, "step_loop='rolled'"),
                                           ({"batching": False}, "batching=False"),
                                           ({"cpu_friendly_layers": False}, "cpu_friendly_layers=False")])
def test_a_timing_only_run_refuses_engine_evaluation_and_checkpoint_settings(values, shown):
    refused({"timing_only": True, "max_updates": 3, **values}, shown, "never reads it",
            "a timing-only run has no training, no evaluation, no checkpoints")
    assert config_from_mapping({"clients": 4, "max_updates": 3, **values})  # a training run reads them


@pytest.mark.parametrize("values, shown, readers", [
    ({"checkpoint_every": None, "checkpoint_min_interval_s": 5.0}, "checkpoint_min_interval_s=5.0",
     "runs with periodic checkpoints"),
    ({"batching": False, "clients_per_call": 2}, "clients_per_call=2", "runs with batching"),
    ({"step_loop": "rolled", "steps_per_call": 2}, "steps_per_call=2", "step_loop unrolled"),
])
def test_engine_and_checkpoint_settings_that_another_setting_makes_unread_are_refused(values, shown, readers):
    """Each ran with exit status 0 and changed nothing (a rolled loop's metrics equal at steps_per_call 1 and 2)."""
    refused({"max_updates": 3, **values}, shown, "never reads it", readers)
    kept = {name: value for name, value in values.items() if name not in shown}
    assert config_from_mapping({"clients": 4, "max_updates": 3, **kept})


def test_timing_only_defaults_and_the_documented_commands_are_valid():
    assert cli_configs("--timing-only")[0].timing_only
    # README "Large federations and timing-only runs" (smaller: the check is the flags)
    readme = ("--timing-only --algorithm fedbuff --dataset synthetic_iid --partition natural --model logreg "
              "--clients 1000000 --concurrency 1000 --buffer-size 10 --max-updates 100000 --max-time inf").split()
    (config,) = cli_configs(*readme)
    assert (config.timing_only, config.clients, config.concurrency) == (True, 1000000, 1000)
    # a training config replayed timing-only (tests/test_timing_only.py): no periodic checkpoints
    assert config_from_mapping({"timing_only": True, "checkpoint_every": None, "max_updates": 3}).timing_only


def test_a_sweep_leaves_evaluation_settings_out_of_its_timing_only_cells(tmp_path):
    cells, notes = expand({"clients": 4, "max_updates": 3, "eval_every": 5, "checkpoint_every": 2},
                          {"timing_only": [False, True]}, str(tmp_path))
    assert [(cell.config.eval_every, cell.config.checkpoint_every) for cell in cells] == [(5, 2), (1, 25)]
    assert notes == ["checkpoint_every, eval_every apply only to the cells that read them (timing_only=False)"]


# ----------------------------------------------------------------------------- the valid combinations run
def test_the_valid_combinations_run(tmp_path):
    for values in ({"algorithm": "fedbuff", "rule": "fedcompass", "buffer_size": 2, "client_weights": "uniform"},
                   {"algorithm": "fedasync", "rule": "fedcompass", "server_lr": 0.5, "server_momentum": 0.5},
                   {"algorithm": "fedbuff", "timing_only": True, "checkpoint_every": None}):
        result = run_experiment(config_from_mapping({**TINY, **values, "output_dir": str(tmp_path)}))
        assert result.summary["global_updates"] == 2 and os.path.isdir(result.run_dir)


def test_negative_times_is_unread_where_no_time_can_come_out_non_positive():
    """Only a normal draw or a jittered round can be non-positive: exponential speeds without jitter
    accepted --negative-times clip and changed nothing."""
    with pytest.raises(ConfigError, match=r"negative_times='clip' is not allowed: leave it at its default 'redraw', "
                                          r"this run never reads it \(read only with heterogeneity normal or jitter > 0\)"):
        validate(RunConfig(heterogeneity="exp", jitter=0.0, negative_times="clip"))
    for heterogeneity, jitter in (("exp", 0.05), ("normal", 0.0)):
        assert validate(RunConfig(heterogeneity=heterogeneity, jitter=jitter, negative_times="clip")).negative_times == "clip"


def test_steps_per_call_under_a_step_loop_chosen_rolled_is_warned_of(tmp_path):
    """step_loop unset: rolled on a CPU for a model without convolutions, where steps_per_call=2 ran
    as 1 saying nothing (config.json's execution_plan recorded 2)."""
    import jax

    from jaxfl.experiment import run_experiment

    if jax.default_backend() != "cpu":
        pytest.skip("the automatic choice is rolled on a CPU")
    config = config_from_mapping({"model": "logreg", "clients": 3, "local_steps": 4, "max_updates": 1,
                                  "steps_per_call": 2, "progress": False, "output_dir": str(tmp_path),
                                  "checkpoint_every": None, "final_checkpoint": False})
    with pytest.warns(UserWarning, match=r"steps_per_call=2 is not read: the step loop chosen for this model on cpu "
                                         r"is rolled"):
        assert run_experiment(config).summary["step_loop"] == "rolled"


def test_a_run_recorded_with_a_setting_refused_since_goes_on_and_runs_again_without_it(tmp_path, capsys):
    """clients_per_call without batching changed nothing until it was refused; a run recorded with it
    could no longer resume ("config.json does not hold a valid run config") nor run again from its record."""
    import json

    from jaxfl.cli import main
    from jaxfl.experiment import run_experiment
    from jaxfl.resume import read_run

    config = config_from_mapping({"model": "logreg", "clients": 3, "local_steps": 2, "max_updates": 1,
                                  "clients_per_call": 2, "progress": False, "output_dir": str(tmp_path),
                                  "run_name": "old"})
    run_dir = run_experiment(config).run_dir
    path = tmp_path / "old" / "config.json"
    record = json.loads(path.read_text())
    record["config"]["engine"]["batching"] = False  # as a run before the refusal recorded it
    path.write_text(json.dumps(record))
    resumed, _ = read_run(run_dir)
    assert resumed.batching is False and resumed.clients_per_call is None
    assert main(["run", "--config", str(path), "--output-dir", str(tmp_path / "again"), "--no-progress"]) == 0
    assert "clients_per_call from the config file" in capsys.readouterr().err
