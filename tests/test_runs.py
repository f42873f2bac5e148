"""Budgets in the units papers use, stop reasons, wall time in the logs, no unasked work, reading a
run back and metrics loggers (TensorBoard, CSV, custom callbacks)."""
import csv
import json
import os
import struct

import numpy as np
import pytest

import jaxfl
from jaxfl.cli import main
from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.experiment import budget_fraction, run_experiment
from jaxfl.loggers import CSVLogger, TensorBoardLogger, WandbLogger, check_loggers, parse_log_to

TINY = dict(algorithm="fedavg", clients=3, model="logreg", local_steps=2, batch_size=16, stop_at_target=False,
            progress=False, checkpoint_every=None)


def tiny(tmp_path, **changes) -> RunConfig:
    return RunConfig(**{**TINY, "output_dir": str(tmp_path), **changes})


def events(run_dir):
    with open(os.path.join(run_dir, "events.csv"), newline="") as handle:
        return list(csv.DictReader(handle))


# ----------------------------------------------------------------------------- budgets and stop reasons
def test_a_client_update_budget_stops_at_the_aggregation_that_reaches_it(tmp_path):
    # FedBuff K=2 with 3 clients in flight: 2 updates per aggregation, so 5 client updates need 3
    # aggregations (6 updates) — the overshoot is less than one aggregation, and no event follows it.
    result = run_experiment(tiny(tmp_path, algorithm="fedbuff", buffer_size=2, max_client_updates=5))
    summary = result.summary
    assert summary["stop_reason"] == "client-update budget"
    assert summary["accounting"]["aggregated"] == 6 and summary["global_updates"] == 3
    assert events(result.run_dir)[-1]["event"] != "arrival"  # nothing processed after the aggregation
    rows = [row for row in events(result.run_dir) if row["event"] == "aggregate"]
    assert len(rows) == 3


def test_a_client_step_budget_counts_the_local_steps_aggregated(tmp_path):
    # FedAvg, 3 clients × 2 steps = 6 client-steps a round: a budget of 7 ends after round 2 (12)
    result = run_experiment(tiny(tmp_path, max_client_steps=7))
    assert result.summary["stop_reason"] == "client-step budget"
    assert result.summary["global_updates"] == 2
    assert result.summary["client_steps_aggregated"] == 12
    assert result.metrics[-1]["client_steps"] == 12
    # exactly at the budget: it stops at the aggregation that reaches it, not one later
    exact = run_experiment(tiny(tmp_path, max_client_steps=12))
    assert exact.summary["global_updates"] == 2 and exact.summary["client_steps_aggregated"] == 12


def test_each_budget_names_itself_as_the_stop_reason(tmp_path):
    assert run_experiment(tiny(tmp_path, max_updates=1)).summary["stop_reason"] == "update budget"
    timed = run_experiment(tiny(tmp_path, max_time=0.3))
    assert timed.summary["stop_reason"] == "time budget" and timed.summary["virtual_time"] == 0.3
    # the first budget reached wins
    both = run_experiment(tiny(tmp_path, max_updates=5, max_client_updates=3))
    assert both.summary["stop_reason"] == "client-update budget" and both.summary["global_updates"] == 1


def test_timing_only_runs_honour_the_client_budgets(tmp_path):
    result = run_experiment(tiny(tmp_path, algorithm="fedbuff", buffer_size=2, max_client_updates=5,
                                 max_time=float("inf"), timing_only=True))
    assert result.summary["stop_reason"] == "client-update budget"
    assert result.summary["accounting"]["aggregated"] == 6


def test_bad_budgets_are_refused_before_any_work(tmp_path):
    for name, value in (("max_client_updates", 0), ("max_client_steps", -3), ("max_client_steps", 2.5)):
        with pytest.raises(ConfigError, match=f"{name}="):
            run_experiment(tiny(tmp_path, **{name: value}))
    assert not os.listdir(tmp_path)
    # an infinite time budget needs some budget to end: a client budget is one
    assert validate(tiny(tmp_path, max_time=float("inf"), max_client_steps=10)).max_client_steps == 10
    with pytest.raises(ConfigError, match="max_client_updates"):
        validate(tiny(tmp_path, max_time=float("inf")))


class StopAfterVersion:
    """A callback that asks the run to stop once version 2 is evaluated."""

    name = "early stopping"

    def __init__(self):
        self.rows = []
        self.closed = False

    def log(self, row, step):
        self.rows.append((step, row))
        return step >= 2

    def close(self):
        self.closed = True


def test_a_stop_asked_for_by_a_callback_is_named_not_called_target_reached(tmp_path):
    stopper = StopAfterVersion()
    result = run_experiment(tiny(tmp_path, max_updates=5), loggers=[stopper])
    assert result.summary["stop_reason"] == "stopped by early stopping"
    assert result.summary["global_updates"] == 2 and result.summary["time_to_target"] is None
    assert [step for step, _ in stopper.rows] == [0, 1, 2] and stopper.closed
    # the rows are metrics.csv's, plus the client updates aggregated so far
    assert stopper.rows[-1][1]["client_updates"] == 6
    assert {key: stopper.rows[-1][1][key] for key in ("version", "accuracy", "loss")} == \
        {key: result.metrics[-1][key] for key in ("version", "accuracy", "loss")}


def test_reaching_the_target_still_says_target_reached(tmp_path):
    result = run_experiment(tiny(tmp_path, max_updates=5, stop_at_target=True, target_accuracy=0.0))
    assert result.summary["stop_reason"] == "target reached" and result.summary["global_updates"] == 0


# ----------------------------------------------------------------------------- wall time
def test_aggregation_rows_carry_the_wall_time_and_the_summary_splits_it(tmp_path):
    result = run_experiment(tiny(tmp_path, max_updates=3))
    rows = events(result.run_dir)
    assert list(rows[0])[-1] == "wall_time"
    aggregations = [float(row["wall_time"]) for row in rows if row["event"] == "aggregate"]
    assert len(aggregations) == 3 and aggregations == sorted(aggregations) and aggregations[0] > 0
    assert all(row["wall_time"] == "" for row in rows if row["event"] != "aggregate")
    summary = result.summary
    parts = ("compile_wall_s", "training_wall_s", "evaluation_wall_s", "checkpoint_wall_s")
    assert all(summary[part] >= 0 for part in parts)
    assert sum(summary[part] for part in parts) <= summary["wall_time_s"]
    assert aggregations[-1] <= summary["wall_time_s"]
    run = jaxfl.load_run(result.run_dir)  # NaN where the log has no wall time
    assert np.isnan(run.events["wall_time"][run.events["event"] != "aggregate"]).all()
    assert run.events["wall_time"][run.events["event"] == "aggregate"].tolist() == aggregations


def test_timing_only_logs_have_the_wall_time_column_too(tmp_path):
    result = run_experiment(tiny(tmp_path, max_updates=2, timing_only=True))
    rows = events(result.run_dir)
    assert [row["wall_time"] != "" for row in rows] == [row["event"] == "aggregate" for row in rows]


# ----------------------------------------------------------------------------- no unasked work
def test_one_at_a_time_training_trains_no_dispatch_the_run_does_not_aggregate(tmp_path):
    # FedAvg dispatches the next round in the event that aggregates the last one: training at
    # dispatch trained a whole round (6 client-steps here) that the update budget then cut off.
    single = run_experiment(tiny(tmp_path, max_updates=2, batching=False, run_name="single"))
    batched = run_experiment(tiny(tmp_path, max_updates=2, run_name="batched"))
    for result in (single, batched):
        assert result.summary["client_steps_aggregated"] == 12
        assert result.summary["client_steps_executed"] == 12
        assert result.summary["executed_per_aggregated"] == 1.0
    assert single.summary["accounting"]["in_flight"] == 3  # the round cut off was dispatched, not trained
    assert single.engine.stats.clients_trained == 6
    np.testing.assert_allclose(np.asarray(single.params["params"]["Dense_0"]["kernel"]),
                               np.asarray(batched.params["params"]["Dense_0"]["kernel"]), atol=1e-6)


def test_the_start_evaluation_and_the_final_checkpoint_can_be_turned_off(tmp_path):
    on = run_experiment(tiny(tmp_path, max_updates=2, run_name="on"))
    assert [row["version"] for row in on.metrics] == [0, 1, 2]
    assert os.path.isdir(os.path.join(on.run_dir, "checkpoints"))
    off = run_experiment(tiny(tmp_path, max_updates=2, eval_at_start=False, final_checkpoint=False, run_name="off"))
    assert [row["version"] for row in off.metrics] == [1, 2]
    assert not os.path.exists(os.path.join(off.run_dir, "checkpoints"))
    assert off.summary["checkpoint_wall_s"] == 0.0
    # on a grid of virtual seconds, the first grid point is one interval in
    grid = run_experiment(tiny(tmp_path, max_updates=2, eval_interval=0.2, eval_at_start=False, run_name="grid"))
    assert grid.metrics[0]["time"] == pytest.approx(0.2)


def test_the_toggles_are_flags(tmp_path):
    assert main(["run", "--algorithm", "fedavg", "--clients", "3", "--model", "logreg", "--local-steps", "2",
                 "--max-client-updates", "3", "--no-eval-at-start", "--no-final-checkpoint", "--no-progress",
                 "--checkpoint-every", "none", "--output-dir", str(tmp_path), "--run-name", "flags"]) == 0
    summary = json.loads((tmp_path / "flags" / "summary.json").read_text())
    assert summary["stop_reason"] == "client-update budget" and summary["global_updates"] == 1
    assert not (tmp_path / "flags" / "checkpoints").exists()


# ----------------------------------------------------------------------------- progress bar
def test_the_progress_bar_follows_the_budget_that_binds(tmp_path, capsys):
    # 3 of 4 updates in 25 of 3000 virtual seconds: 75 %, not 0.8 %
    assert budget_fraction(RunConfig(max_time=3000.0, max_updates=4), 25.0, 3, 0, 0) == 0.75
    assert budget_fraction(RunConfig(max_time=100.0, max_client_steps=1000), 50.0, 3, 9, 100) == 0.5
    assert budget_fraction(RunConfig(max_time=float("inf"), max_client_updates=10), 1e6, 1, 5, 0) == 0.5
    run_experiment(tiny(tmp_path, max_updates=3, progress=True))
    bar = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "100% of the budget" in bar, bar  # max_time's 3000 virtual seconds were far from spent


def test_a_bar_written_to_a_file_or_pipe_shows_itself_at_its_start_and_end_not_at_each_evaluation(tmp_path, capsys):
    # set_postfix redrew the bar at each evaluation whatever its 30 s interval: `jaxfl demo | tee log`
    # wrote a carriage-return line per version (73 for FedAsync's 73 updates)
    run_experiment(tiny(tmp_path, max_updates=12, eval_every=1, progress=True))
    written = capsys.readouterr().err
    assert written.count("\r") <= 3, written.count("\r")
    assert "100% of the budget" in written.replace("\r", "\n").strip().splitlines()[-1]


# ----------------------------------------------------------------------------- loggers
def test_csv_logger_by_name_writes_every_metrics_row(tmp_path):
    result = run_experiment(tiny(tmp_path, max_updates=2), loggers=["csv"])
    with open(os.path.join(result.run_dir, "log.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["version"]) for row in rows] == [row["version"] for row in result.metrics] == [0, 1, 2]
    assert [int(row["client_updates"]) for row in rows] == [0, 3, 6]
    assert [float(row["accuracy"]) for row in rows] == [row["accuracy"] for row in result.metrics]


def read_tensorboard_scalars(folder) -> dict:
    """{tag: [(step, value)]} from TensorBoard event files, read as TFRecords of Event protos."""
    from tensorboardX.proto import event_pb2

    scalars: dict = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as handle:
            data = handle.read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4  # length, its CRC, the record, its CRC
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_tensorboard_logger_writes_scalars_tensorboard_reads(tmp_path):
    pytest.importorskip("tensorboardX")
    result = run_experiment(tiny(tmp_path, max_updates=2), loggers=["tensorboard"])
    scalars = read_tensorboard_scalars(os.path.join(result.run_dir, "tensorboard"))
    accuracy = [row["accuracy"] for row in result.metrics]
    assert [step for step, _ in scalars["accuracy"]] == [0, 1, 2]
    np.testing.assert_allclose([value for _, value in scalars["accuracy"]], accuracy, rtol=1e-6)
    assert [value for _, value in scalars["client_updates"]] == [0, 3, 6]
    assert {"loss", "time", "client_steps", "wall_time"} <= set(scalars)


def test_log_to_on_the_command_line(tmp_path):
    pytest.importorskip("tensorboardX")
    assert main(["run", "--algorithm", "fedavg", "--clients", "3", "--model", "logreg", "--local-steps", "2",
                 "--max-updates", "1", "--no-progress", "--output-dir", str(tmp_path), "--run-name", "logged",
                 "--log-to", "tensorboard,csv"]) == 0
    assert os.listdir(tmp_path / "logged" / "tensorboard")
    assert len((tmp_path / "logged" / "log.csv").read_text().splitlines()) == 3  # header, versions 0 and 1


def test_bad_loggers_are_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(ValueError, match="one of tensorboard, csv, wandb"):
        run_experiment(tiny(tmp_path), loggers=["excel"])
    with pytest.raises(ValueError, match="needs log\\(row, step\\) and close\\(\\)"):
        run_experiment(tiny(tmp_path), loggers=[print])
    with pytest.raises(ValueError, match="a list of logger objects"):
        run_experiment(tiny(tmp_path), loggers="csv")
    with pytest.raises(ValueError, match="timing-only run evaluates nothing"):
        run_experiment(tiny(tmp_path, timing_only=True, max_updates=1), loggers=["csv"])
    with pytest.raises(SystemExit):
        main(["run", "--log-to", "csv,excel", "--output-dir", str(tmp_path)])
    assert "--log-to='csv,excel' is not allowed" in capsys.readouterr().err
    assert parse_log_to("csv") == ["csv"]
    assert not os.listdir(tmp_path)


def test_missing_logger_packages_are_named(tmp_path, monkeypatch, capsys):
    import sys

    for module in ("tensorboardX", "torch", "torch.utils.tensorboard", "wandb"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it now fails
    with pytest.raises(ImportError, match="pip install tensorboardX"):
        TensorBoardLogger(str(tmp_path / "tb"))
    with pytest.raises(ImportError, match="pip install tensorboardX"):
        check_loggers(["tensorboard"])
    with pytest.raises(ImportError, match="pip install wandb"):
        WandbLogger(project="jaxfl")
    with pytest.raises(SystemExit) as stopped:
        main(["run", "--log-to", "tensorboard", "--output-dir", str(tmp_path / "out")])
    assert stopped.value.code == 2 and "pip install tensorboardX" in capsys.readouterr().err
    assert not (tmp_path / "tb").exists() and not (tmp_path / "out").exists()


def test_csv_logger_refuses_rows_that_change_columns(tmp_path):
    logger = CSVLogger(str(tmp_path / "log.csv"))
    logger.log({"version": 0, "accuracy": 0.1}, step=0)
    with pytest.raises(ValueError):
        logger.log({"version": 1, "other": 0.2}, step=1)
    logger.close()


# ----------------------------------------------------------------------------- reading results
def test_load_run_gives_numpy_columns_and_data_frames(tmp_path):
    pandas = pytest.importorskip("pandas")
    result = run_experiment(tiny(tmp_path, max_updates=2))
    run = jaxfl.load_run(result.run_dir)
    assert run.summary["stop_reason"] == "update budget" and run.config["config"]["data"]["clients"] == 3
    assert run.metrics["version"].tolist() == [0, 1, 2]
    frame = run.to_pandas("events")
    assert isinstance(frame, pandas.DataFrame) and len(frame) == run.num_events
    assert frame.loc[frame["event"] == "aggregate", "wall_time"].notna().all()
    assert frame["dispatch"].isna().sum() == np.sum(run.events["dispatch"] == -1)
    metrics = run.to_pandas("metrics")
    assert metrics["accuracy"].tolist() == [row["accuracy"] for row in result.metrics]


def test_a_log_begun_without_the_wall_time_column_is_resumed_in_its_own_columns(tmp_path, monkeypatch):
    """A run checkpointed by a jaxfl whose event log had no wall_time column, resumed by this one,
    goes on writing the columns its log started with (not rows one field longer than its header)."""
    from jaxfl import experiment, testing
    from jaxfl.experiment import resume_experiment
    from jaxfl.scheduler.simulation import EVENT_LOG_FIELDS

    full = run_experiment(tiny(tmp_path, max_updates=3, run_name="full"))
    monkeypatch.setattr(experiment, "EVENT_LOG_FIELDS", tuple(f for f in EVENT_LOG_FIELDS if f != "wall_time"))
    with testing._interrupt_after(4), pytest.raises(testing._Interrupted):
        run_experiment(tiny(tmp_path, max_updates=3, checkpoint_every=1, run_name="old"))
    monkeypatch.undo()
    resumed = resume_experiment(str(tmp_path / "old"), progress=False)
    rows = events(resumed.run_dir)
    assert "wall_time" not in rows[0] and all(None not in row for row in rows)  # no row longer than the header
    assert testing.events_without_wall_time(resumed.run_dir) == testing.events_without_wall_time(full.run_dir)


# ----------------------------------------------------------------------------- a loop of runs
@pytest.mark.parametrize("algorithm", ["fedavg", "fedbuff", "fedcompass_n", "port", "ccfedavg", "fedasmu", "fedat"])
def test_a_dropped_run_frees_its_engine_at_once_without_the_cycle_collector(tmp_path, algorithm):
    # A finished run cuts its callbacks, so nothing of it sits in a reference cycle: its compiled
    # programs and device buffers go with its result, not at Python's next full collection (before,
    # a loop of runs kept every earlier run's programs until XLA ran out of memory maps)
    import gc
    import weakref

    from jaxfl import experiment

    collecting = gc.isenabled()
    gc.disable()
    try:
        result = run_experiment(tiny(tmp_path, algorithm=algorithm, max_updates=2, checkpoint_every=1))
        engine, simulation = weakref.ref(result.engine), weakref.ref(result.simulation)
        assert len(experiment._UNFINISHED_ENGINES) == 0
        del result
        assert engine() is None and simulation() is None
    finally:
        if collecting:
            gc.enable()


def test_a_run_that_raised_leaves_its_engine_to_the_next_run_s_collection(tmp_path):
    # An exception leaves the run wired to its callbacks (in cycles): the next run collects them first
    import gc
    import weakref

    from jaxfl import experiment

    class Failing:
        def log(self, row, step):
            raise RuntimeError("logger failed")

        def close(self):
            pass

    collecting = gc.isenabled()
    gc.disable()  # only the runs' own collection can free anything here
    try:
        with pytest.raises(RuntimeError, match="logger failed"):
            run_experiment(tiny(tmp_path, max_updates=1), loggers=[Failing()])
        (failed,) = [weakref.ref(engine) for engine in experiment._UNFINISHED_ENGINES]
        assert failed() is not None  # garbage in a cycle, not freed yet
        second = run_experiment(tiny(tmp_path, max_updates=1, seed=1))
        assert failed() is None
        assert len(experiment._UNFINISHED_ENGINES) == 0 and second.engine is not None
    finally:
        if collecting:
            gc.enable()


def test_load_run_of_a_run_still_writing_pairs_its_metrics_and_class_rows_and_names_its_columns(tmp_path):
    # read between an evaluation's metrics row and its class_accuracy row, a running run loaded one row more
    # of metrics than of class accuracy (the README: class_accuracy's rows "are the metrics rows"); and
    # before the first row, metrics was {} (run.metrics["accuracy"] a KeyError)
    import shutil

    result = run_experiment(RunConfig(algorithm="fedavg", model="logreg", clients=3, local_steps=2, max_updates=2,
                                      progress=False, output_dir=str(tmp_path), run_name="done"))
    running = tmp_path / "running"
    shutil.copytree(result.run_dir, running)
    os.remove(running / "summary.json")
    last = (running / "metrics.csv").read_text().splitlines()[-1]
    with open(running / "metrics.csv", "a") as handle:
        handle.write(last.replace(",2,", ",3,", 1) + "\n")  # version 3's row, its class row not yet written
    run = jaxfl.load_run(str(running))
    assert len(run.metrics["accuracy"]) == len(run.class_accuracy) == 3
    assert run.metrics["version"].tolist() == [0, 1, 2]
    for name in ("metrics.csv", "class_accuracy.csv", "events.csv"):
        (running / name).write_text("")  # created, nothing written yet
    run = jaxfl.load_run(str(running))
    assert run.metrics["accuracy"].shape == run.events["time"].shape == (0,)
    assert run.metrics["version"].dtype == np.int64
    finished = jaxfl.load_run(result.run_dir)  # a finished run's files are read as they are
    assert len(finished.metrics["accuracy"]) == len(finished.class_accuracy) == 3
