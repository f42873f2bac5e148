"""A run evaluated on a grid of virtual seconds (eval_interval) stops at the grid point that reaches
its target, as a run evaluated every few versions stops at the version that does: the aggregation
after that grid point is neither applied nor counted, and a resumed run stops at the same point."""
import csv
import os

import pytest

from jaxfl import experiment, stopping, testing
from jaxfl.config import RunConfig
from jaxfl.experiment import RunInterrupted, resume_experiment, run_experiment

# FedAvg over 3 clients on a grid of 0.3 virtual seconds: a version every ~0.47 s, so most grid
# points fall between two aggregations (the case where the next one used to be applied first)
GRID = dict(algorithm="fedavg", clients=3, model="logreg", local_steps=2, batch_size=16, progress=False,
            checkpoint_every=None, max_updates=8, eval_interval=0.3, target_accuracy=0.5)


def grid(tmp_path, name, **changes) -> RunConfig:
    return RunConfig(**{**GRID, "output_dir": str(tmp_path), "run_name": name, **changes})


def aggregations(run_dir):
    with open(os.path.join(run_dir, "events.csv"), newline="") as handle:
        return [row for row in csv.DictReader(handle) if row["event"] == "aggregate"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grid")
    through = run_experiment(grid(folder, "through", stop_at_target=False))
    stopped = run_experiment(grid(folder, "stopped"))
    return folder, through, stopped


def test_the_run_stops_at_the_grid_point_that_reaches_the_target(runs):
    _, through, stopped = runs
    reached = next(row for row in through.metrics if row["accuracy"] >= GRID["target_accuracy"])
    version = reached["version"]  # the version in force at that grid point
    assert 0 < version < GRID["max_updates"]
    summary = stopped.summary
    assert summary["stop_reason"] == "target reached"
    assert summary["time_to_target"] == through.summary["time_to_target"] == reached["time"]
    # what reaching it cost: the versions up to the one in force there, not the one after
    assert summary["global_updates"] == version and len(aggregations(stopped.run_dir)) == version
    assert all(float(row["time"]) <= reached["time"] for row in aggregations(stopped.run_dir))
    steps_there = sum(int(row["steps"]) for row in _dispatches(through.run_dir, version))
    assert summary["client_steps_aggregated"] == steps_there
    assert summary["virtual_time"] == reached["time"]
    assert summary["final_accuracy"] == reached["accuracy"] == stopped.metrics[-1]["accuracy"]
    # the grid points before it are the uninterrupted run's
    drop = ("wall_time", "client_steps")
    assert [{k: v for k, v in row.items() if k not in drop} for row in stopped.metrics] == \
        [{k: v for k, v in row.items() if k not in drop} for row in through.metrics[:len(stopped.metrics)]]
    assert stopped.metrics[-1]["time"] == reached["time"] and stopped.metrics[-1]["client_steps"] == steps_there


def _dispatches(run_dir, version):
    """The arrivals aggregated into versions 1..version (FedAvg: every arrival of those rounds)."""
    with open(os.path.join(run_dir, "events.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    cut = [i for i, row in enumerate(rows) if row["event"] == "aggregate"][version - 1]
    return [row for row in rows[:cut] if row["event"] == "arrival"]


def test_a_target_never_reached_changes_nothing(runs):
    # the decision is taken between events; the rows are still written at the next version
    folder, through, _ = runs
    unreached = run_experiment(grid(folder, "unreached", target_accuracy=0.99))
    assert testing.metrics_without_wall_time(unreached.run_dir) == testing.metrics_without_wall_time(through.run_dir)
    assert testing.events_without_wall_time(unreached.run_dir) == testing.events_without_wall_time(through.run_dir)
    assert unreached.summary["global_updates"] == GRID["max_updates"]
    assert unreached.summary["time_to_target"] is None


@pytest.mark.parametrize("how", ["crash", "stop request"])
def test_a_resumed_run_stops_at_the_same_grid_point(runs, tmp_path, monkeypatch, how):
    _, _, stopped = runs
    last = stopped.simulation.events_processed  # the event after which the target was decided
    config = grid(tmp_path, how, checkpoint_every=1)
    if how == "crash":  # killed after that event: resumed from the checkpoint before it, decides again
        with testing._interrupt_after(last), pytest.raises(testing._Interrupted):
            run_experiment(config)
    else:  # stopped there: the checkpoint written at that point holds the decision
        original = experiment._Checkpointer.after_event

        def stop_there(self, simulation):
            if simulation.events_processed == last:
                stopping.request_stop("test")
            original(self, simulation)

        monkeypatch.setattr(experiment._Checkpointer, "after_event", stop_there)
        with pytest.raises(RunInterrupted):
            run_experiment(config)
        monkeypatch.undo()
    resumed = resume_experiment(os.path.join(config.output_dir, how), progress=False)
    testing.assert_same_run(resumed, stopped, f"resumed after a {how}")


def test_a_grid_row_counts_the_steps_of_the_model_it_evaluated(runs):
    """A grid point's row is written when the next version arrives; its client_steps are those
    aggregated into the version in force at the grid point, not that next version's too."""
    _, through, _ = runs
    rows = through.metrics
    assert any(row["version"] < next_row["version"] for row, next_row in zip(rows, rows[1:]))
    for row in rows:
        expected = sum(int(r["steps"]) for r in _dispatches(through.run_dir, row["version"])) if row["version"] else 0
        assert row["client_steps"] == expected, row


def test_a_run_ending_after_the_last_grid_point_evaluates_its_final_model_there(runs):
    """An update budget (or a max_time) between two grid points: the last versions were never
    evaluated, and final_accuracy was the last grid point's, an earlier model's than the final
    checkpoint's. Now a row at the run's end holds the final model, as eval_every's last row does."""
    folder, through, _ = runs
    rows, summary = through.metrics, through.summary
    assert summary["stop_reason"] == "update budget" and summary["global_updates"] == GRID["max_updates"]
    *on_grid, last = rows
    assert all(round(row["time"] / GRID["eval_interval"], 9).is_integer() for row in on_grid)
    assert on_grid[-1]["version"] < GRID["max_updates"] == last["version"]  # the final model no point saw
    assert last["time"] == summary["virtual_time"] and on_grid[-1]["time"] < last["time"]
    assert summary["final_accuracy"] == last["accuracy"]
    assert last["client_steps"] == summary["client_steps_aggregated"]
    # on a grid point already: no second row
    exact = run_experiment(grid(folder, "exact", stop_at_target=False, max_updates=None, max_time=1.5))
    assert exact.summary["stop_reason"] == "time budget"
    assert [row["time"] for row in exact.metrics] == pytest.approx([0.3 * k for k in range(6)])


def test_a_run_that_ends_at_time_zero_has_no_utilisation_to_give(tmp_path):
    """The initial model at the target: the run lasts 0 virtual s, and its utilisation, a fraction of
    no time, was reported as 0.0 (runlog.timeline_stats, the same figure from the log, gives None)."""
    result = run_experiment(grid(tmp_path, "zero", target_accuracy=0.0))
    assert result.summary["virtual_time"] == 0.0 and result.summary["stop_reason"] == "target reached"
    assert result.summary["timeline"]["utilisation"] == dict.fromkeys(("mean", "min", "median", "max"))
    assert result.summary["timeline"]["aggregations_per_virtual_hour"] is None
