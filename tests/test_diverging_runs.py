"""Runs whose training diverges, as a researcher sweeping learning rates meets them: each stops with
its summary and a `numerical error` stop reason (status 1), whether a client, the global model or an
aggregation's weights show it; a comparison and a sweep go on with their other runs; a diverged
model's evaluations reach no target; settings float32 cannot hold are refused before any work."""
import csv
import glob
import json
import os
import warnings

import pytest

import jaxfl
from jaxfl.cli import main
from jaxfl.config import ConfigError, validate

TINY_MLP = ["--dataset", "mnist10k", "--model", "mlp", "--clients", "4", "--local-steps", "5", "--no-progress"]


def only_summary(folder) -> dict:
    (path,) = glob.glob(os.path.join(folder, "*", "summary.json"))
    with open(path) as handle:
        return json.load(handle)


def test_port_s_cosine_weights_that_overflow_stop_the_run_with_its_summary(tmp_path, capsys):
    """At client lr 1e3 PORT's ‖u‖ overflowed to inf on finite updates, its cosine weight was NaN, and
    the run ended as bad input (status 2, no summary.json; a sweep stopped there for good). Its cosine now
    holds at any size (d894728), so the run goes on until a client's own update is non-finite, and stops
    there as a numerical error with its summary; a hook's non-finite weights stop it the same way
    (tests/test_plugin_api_checks.py)."""
    with pytest.raises(SystemExit) as stopped:
        main(["run", "--algorithm", "port", *TINY_MLP, "--max-updates", "10", "--client-optimizer", "sgd",
              "--client-lr", "1e3", "--output-dir", str(tmp_path)])
    assert stopped.value.code == 1
    assert "jaxfl: run stopped: client " in capsys.readouterr().err
    summary = only_summary(tmp_path)
    assert summary["stop_reason"].startswith("numerical error: client ")
    # the aggregation that could not be weighed did not happen: its updates are counted as arrived
    counts = summary["accounting"]
    assert counts["aggregated"] + counts["arrived_unaggregated"] + counts["in_flight"] + counts["dropped"] == \
        counts["dispatched"]
    assert counts["arrived_unaggregated"] > 0
    # and the engine counted none of its steps (it counted them before weighing: 15 steps for 10 aggregated)
    assert summary["client_steps_aggregated"] == 5 * counts["aggregated"]


def test_a_model_that_diverges_in_its_last_aggregation_ends_as_a_numerical_error(tmp_path, capsys):
    """A server step of 1e38 at the run's one aggregation: the model's outputs overflow (held-out loss
    NaN) and no client trained from it before the budget ended, so the run said "update budget" and
    exited 0."""
    with pytest.raises(SystemExit) as stopped:
        main(["run", "--algorithm", "fedavg", *TINY_MLP, "--max-updates", "1", "--server-lr", "1e38",
              "--output-dir", str(tmp_path)])
    assert stopped.value.code == 1
    summary = only_summary(tmp_path)
    assert summary["stop_reason"].startswith("numerical error: the global model (version 1) gives NaN/Inf outputs "
                                             "for most held-out samples at the end of the run, which stopped on: "
                                             "update budget")
    (metrics,) = glob.glob(os.path.join(tmp_path, "*", "metrics.csv"))
    with open(metrics) as handle:
        first, last = [row.split(",") for row in handle.read().splitlines()[1:]]
    assert last[4] == "nan" and summary["best_accuracy"] == float(first[2])  # the finite evaluation's
    assert summary["diverged_evaluations"] == [{"time": float(last[0]), "version": 1}]  # what metrics.csv cannot say
    assert "lower the learning rates" in capsys.readouterr().err


def test_a_diverged_model_s_evaluation_reaches_no_target_and_is_not_the_best(tmp_path):
    """Every logit NaN: the argmax is class 0, whose share of mnist10k (9.8 %) beat the MLP's first
    evaluation (8.9 %), reached a 9.5 % target ("target reached", exit 0) and was the best accuracy."""
    config = jaxfl.RunConfig(algorithm="fedavg", dataset="mnist10k", model="mlp", clients=4, local_steps=5,
                             max_updates=3, server_lr=1e38, eval_every=1, target_accuracy=0.095, progress=False,
                             output_dir=str(tmp_path))
    with pytest.raises(jaxfl.NumericalError) as stopped:
        jaxfl.run_experiment(config)
    run_dir = stopped.value.run_dir
    with open(os.path.join(run_dir, "metrics.csv")) as handle:
        rows = handle.read().splitlines()[1:]
    assert rows[1].split(",")[4] == "nan" and float(rows[1].split(",")[2]) > 0.095 > float(rows[0].split(",")[2])
    summary = only_summary(tmp_path)
    assert summary["time_to_target"] is None and summary["stop_reason"].startswith("numerical error: client")
    assert summary["best_accuracy"] == float(rows[0].split(",")[2])  # the finite evaluation, not the NaN one
    assert summary["diverged_evaluations"] == [{"time": float(rows[1].split(",")[0]), "version": 1}]


def test_a_healthy_model_with_one_glitched_held_out_sample_is_no_diverged_run(tmp_path):
    """One held-out sample of 3e38 makes a healthy model's held-out loss Inf: that read as diverged (every
    evaluation left out of the best accuracy, the run ended as a numerical error blaming the learning
    rate), where the outputs of all the other samples are finite."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    test_x = x[:100].copy()
    test_x[0, :] = 3e38
    config = jaxfl.RunConfig(algorithm="fedavg", model="logreg", clients=4, local_steps=5, max_updates=3,
                             client_optimizer="sgd", client_lr=0.1, progress=False, target_accuracy=0.7,
                             output_dir=str(tmp_path))
    result = jaxfl.run_experiment(config, data={"train_x": x, "train_y": y, "test_x": test_x,
                                                 "test_y": y[:100]})
    assert not np.isfinite(result.metrics[-1]["loss"])
    assert result.summary["stop_reason"] in ("update budget", "target reached")
    assert result.summary["best_accuracy"] == max(row["accuracy"] for row in result.metrics) > 0.7
    assert result.summary["diverged_evaluations"] == []


def test_skip_s_diverged_stop_stays_what_it_was(tmp_path):
    """Under on_nonfinite='skip' a run whose every update is non-finite stops as "diverged: ..." (exit 0,
    as documented); the end-of-run check made it "numerical error: ... (stopped by its diverged: ...)"."""
    # FedASMU's one aggregation makes a model that every client then trains to NaN
    config = jaxfl.RunConfig(algorithm="fedasmu", dataset="mnist10k", model="mlp", clients=4, local_steps=5,
                             max_updates=10, client_optimizer="sgd", client_lr=1e3, on_nonfinite="skip",
                             progress=False, output_dir=str(tmp_path))
    result = jaxfl.run_experiment(config)
    assert result.summary["stop_reason"].startswith("diverged: the last 100 updates were all non-finite")


def test_a_comparison_goes_on_after_an_algorithm_that_diverges_and_lists_it(tmp_path, capsys):
    """`jaxfl run --algorithm fedavg,fedbuff` stopped at the first run a numerical error ended: the
    others never ran and no table was written (each rerun got one algorithm further)."""
    command = ["run", "--algorithm", "fedavg,fedbuff", *TINY_MLP, "--max-updates", "6", "--client-optimizer", "sgd",
               "--client-lr", "300", "--output-dir", str(tmp_path)]
    with warnings.catch_warnings(record=True) as caught:  # the CLI shows them as "jaxfl: note: ..."
        warnings.simplefilter("always")
        assert main(command) == 1
    captured = capsys.readouterr()
    assert [str(warning.message).partition(": run stopped: ")[0] for warning in caught
            if ": run stopped: " in str(warning.message)] == ["fedavg", "fedbuff"]
    assert "jaxfl: fedavg, fedbuff stopped early (the stop_reason of their summary.json files says why); the comparison " \
           "lists them" in captured.err
    with open(tmp_path / "comparison.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert [row["algorithm"] for row in table] == ["fedavg", "fedbuff"]
    assert all(row["stop_reason"].startswith("numerical error: client ") for row in table)
    assert "fedavg (diverged)" in captured.out and "stop: numerical error →" in captured.out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(command) == 1  # again: the runs reused, their stop said again, the status the same
    again = capsys.readouterr()
    assert again.out.count("(reused: it had finished)") == 2
    assert not [warning for warning in caught if ": run stopped: " in str(warning.message)]


def test_compare_in_python_warns_and_lists_a_diverged_run(tmp_path):
    from jaxfl.comparison import StoppedRun, compare

    configs = [jaxfl.RunConfig(algorithm=name, dataset="mnist10k", model="mlp", clients=4, local_steps=5,
                               max_updates=3, client_optimizer="sgd", client_lr=lr, progress=False,
                               output_dir=str(tmp_path)) for name, lr in (("fedavg", 300.0), ("fedbuff", 0.05))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comparison = compare(configs)
    assert [type(result) is StoppedRun for result in comparison.results] == [True, False]
    assert any(str(warning.message).startswith("fedavg: run stopped: client") for warning in caught)
    assert comparison.rows[0]["stop_reason"].startswith("numerical error") and \
        comparison.rows[1]["stop_reason"] == "update budget"


@pytest.mark.parametrize("setting, refused", [
    ({"algorithm": "fedadam", "server_tau": 1e-40}, "server_tau=1e-40 is not allowed: at least 1.175e-38"),
    ({"client_lr": 1e39, "client_optimizer": "sgd"}, "client_lr=1e+39 is not allowed: at most 3.403e+38"),
    ({"algorithm": "fedadam", "server_lr": 1e39}, "server_lr=1e+39 is not allowed: at most 3.403e+38"),
    ({"prox_mu": 1e39}, "prox_mu=1e+39 is not allowed: at most 3.403e+38"),
])
def test_settings_float32_cannot_hold_are_refused(setting, refused):
    """τ = 1e-40 is 0 in float32 (the model NaN at version 1, the message blaming the server's
    learning rate); a rate of 1e39 is inf there (accepted with only numpy's overflow warning)."""
    with pytest.raises(ConfigError, match=refused.replace("+", r"\+")):
        validate(jaxfl.RunConfig(**setting))
    validate(jaxfl.RunConfig(**{**setting, **{name: 1e-30 if name == "server_tau" else 1e38
                                              for name in setting if name != "algorithm" and name != "client_optimizer"}}))


def test_a_model_masking_impossible_classes_with_minus_inf_is_not_counted_as_diverged():
    """-Inf logits for the classes a sample cannot have are a mask a healthy model may apply; NaN or
    +Inf logits, or all of them -Inf, are a diverged model's."""
    import jax.numpy as jnp
    import numpy as np

    from jaxfl.experiment import make_evaluator

    x, y = np.ones((4, 3), np.float32), np.array([0, 1, 0, 1])
    evaluate = make_evaluator(lambda params, xb: (xb @ params).at[:, 2].set(-jnp.inf), x, y, preprocess=lambda v: v)
    assert evaluate(np.ones((3, 3), np.float32))["nonfinite_outputs"] == 0.0
    assert evaluate(np.full((3, 3), np.nan, np.float32))["nonfinite_outputs"] == 1.0
    every_minus_inf = make_evaluator(lambda params, xb: jnp.full((len(xb), 3), -jnp.inf), x, y, preprocess=lambda v: v)
    assert every_minus_inf(np.ones((3, 3), np.float32))["nonfinite_outputs"] == 1.0


def test_a_checkpoint_from_before_the_diverged_rows_were_kept_marks_its_nan_loss_rows():
    """A checkpoint written before the recorder kept its diverged models' rows loaded none: resumed, the
    run's best accuracy counted the NaN model's evaluation (0.098 where a fresh run said 0.089)."""
    from jaxfl.experiment import _Recorder

    recorder = _Recorder.__new__(_Recorder)
    rows = [{"version": 0, "accuracy": 0.089, "loss": 2.3}, {"version": 1, "accuracy": 0.098, "loss": float("nan")}]
    recorder.load_state_dict({"rows": rows, "time_to_target": None, "next_grid": 0.0, "grid_index": 0,
                              "previous_params": None, "previous_steps": 0, "previous_updates": 0})
    assert recorder.unscored == [1]
    recorder.load_state_dict({"rows": rows, "time_to_target": None, "next_grid": 0.0, "grid_index": 0,
                              "previous_params": None, "previous_steps": 0, "previous_updates": 0, "unscored": []})
    assert recorder.unscored == []



@pytest.mark.parametrize("where", ["apply", "after_update"])
def test_a_hook_that_refuses_an_aggregation_leaves_the_engine_s_counts_as_before_it(tmp_path, where):
    """A plug-in's hook may raise NumericalError (its own check of what it computes): the simulation
    undid the aggregation, but the engine had counted its steps already (and, from after_update, set
    its previous model to the current one): 15 client steps aggregated for 2 aggregations of 5."""
    from jaxfl.algorithms import DeviceHook, register
    from jaxfl.algorithms.base import unregister
    from jaxfl.algorithms.fedbuff import FedBuffAlgorithm
    from jaxfl.scheduler.simulation import NumericalError

    class Refuses(DeviceHook):
        name = "refuses"

        def refuse(self, ctx, aggregation):
            if aggregation.version == 3:
                raise NumericalError("the hook's own check: version 3 refused")

        def apply(self, ctx, aggregation, records):
            if where == "apply":
                self.refuse(ctx, aggregation)

        def after_update(self, ctx, aggregation, records):
            if where == "after_update":
                self.refuse(ctx, aggregation)

    @register
    class RefusingFedBuff(FedBuffAlgorithm):
        name = "refusing_fedbuff_test"

        def hooks(self):
            return (*super().hooks(), Refuses())

    try:
        config = jaxfl.RunConfig(algorithm="refusing_fedbuff_test", model="logreg", clients=4, local_steps=5,
                                 batch_size=8, max_updates=6, buffer_size=1, progress=False,
                                 output_dir=str(tmp_path), checkpoint_every=None, final_checkpoint=False)
        with pytest.raises(NumericalError, match="version 3 refused"):
            jaxfl.run_experiment(config)
    finally:
        unregister("refusing_fedbuff_test")
    summary = only_summary(tmp_path)
    assert summary["global_updates"] == 2 and summary["accounting"]["aggregated"] == 2
    assert summary["client_steps_aggregated"] == 10  # the refused aggregation's 5 steps not among them
