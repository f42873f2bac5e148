"""A finished run taken further by raising the budget it stopped on (``jaxfl run --resume RUN
--max-updates N``): it goes on from its final checkpoint as the run with the larger budget would
have, evaluating at its own cadence, and says so in config.json and summary.json; what cannot be
extended is refused before any work, leaving the run as it was."""
import contextlib
import json
import os
import warnings
import shutil

import jax
import numpy as np
import pytest

from jaxfl import cli, experiment
from jaxfl.config import config_from_mapping
from jaxfl.experiment import resume_experiment, run_experiment
from jaxfl.resume import InUse, ResumeError, ResumeWarning
from jaxfl.testing import SMALL, events_without_wall_time, metrics_without_wall_time


def _runs(tmp_path, algorithm, short, long, **settings):
    base = {**SMALL, "algorithm": algorithm, **settings}
    longer = run_experiment(config_from_mapping({**base, **long, "output_dir": str(tmp_path / "long")}))
    shorter = run_experiment(config_from_mapping({**base, **short, "output_dir": str(tmp_path / "short")}))
    return shorter, longer


def _assert_as_the_longer_run(extended, longer):
    # the schedule is the longer run's exactly; the numbers to float32 reassociation (the updates
    # trained ahead at the old stop are summed in other calls than the longer run's)
    assert events_without_wall_time(extended.run_dir) == events_without_wall_time(longer.run_dir)
    rows, expected = metrics_without_wall_time(extended.run_dir), metrics_without_wall_time(longer.run_dir)
    assert [(row["time"], row["version"], row["client_steps"]) for row in rows] == \
        [(row["time"], row["version"], row["client_steps"]) for row in expected]
    np.testing.assert_allclose([float(row["loss"]) for row in rows], [float(row["loss"]) for row in expected],
                               rtol=1e-5)
    for ours, theirs in zip(jax.tree.leaves(extended.params), jax.tree.leaves(longer.params)):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-6)
    for key in ("global_updates", "virtual_time", "stop_reason", "client_steps_aggregated"):
        assert extended.summary[key] == longer.summary[key], key


@pytest.mark.parametrize("algorithm", ["fedbuff", "fedcompass"])
def test_an_extended_run_is_the_run_with_the_larger_budget(tmp_path, algorithm):
    # eval_every 3 and a stop at 5: the short run's final evaluation (version 5) is off the longer
    # run's cadence, and must not stay in the extended run's metrics
    shorter, longer = _runs(tmp_path, algorithm, {"max_updates": 5}, {"max_updates": 10}, eval_every=3)
    assert [row["version"] for row in shorter.metrics] == [0, 3, 5]
    extended = resume_experiment(shorter.run_dir, overrides={"max_updates": 10})
    assert extended.run_dir == shorter.run_dir
    assert [row["version"] for row in extended.metrics] == [0, 3, 6, 9, 10]
    _assert_as_the_longer_run(extended, longer)
    record = {"from": {"max_updates": 5}, "to": {"max_updates": 10}, "update": 5,
              "virtual_time": shorter.summary["virtual_time"]}
    assert extended.summary["extensions"] == [record]
    written = json.loads(open(os.path.join(shorter.run_dir, "config.json")).read())
    assert written["config"]["budget"]["max_updates"] == 10 and written["extensions"] == [record]
    assert extended.summary["resumes"] == 1
    assert longer.summary["extensions"] == []


def test_a_time_budget_with_an_evaluation_grid_and_a_client_update_budget_extend(tmp_path):
    shorter, longer = _runs(tmp_path / "time", "fedbuff", {"max_updates": None, "max_time": 3.0},
                            {"max_updates": None, "max_time": 7.0}, eval_interval=1.3)
    extended = resume_experiment(shorter.run_dir, overrides={"max_time": 7.0})
    _assert_as_the_longer_run(extended, longer)
    shorter, longer = _runs(tmp_path / "updates", "fedasync", {"max_updates": None, "max_client_updates": 5},
                            {"max_updates": None, "max_client_updates": 11})
    _assert_as_the_longer_run(resume_experiment(shorter.run_dir, overrides={"max_client_updates": 11}), longer)


def test_an_extension_cut_short_resumes_from_a_checkpoint_of_the_old_budget(tmp_path):
    # its checkpoints before the extension were written under max_updates 4, config.json now says 8
    shorter, longer = _runs(tmp_path, "fedbuff", {"max_updates": 4}, {"max_updates": 8})
    root = os.path.join(shorter.run_dir, "checkpoints")
    shutil.copytree(root, tmp_path / "kept")
    extended = resume_experiment(shorter.run_dir, overrides={"max_updates": 8})
    # as if it had been cut short before its first checkpoint: the old budget's checkpoints alone
    shutil.rmtree(root)
    shutil.copytree(tmp_path / "kept", root)
    os.remove(os.path.join(extended.run_dir, "summary.json"))
    again = resume_experiment(extended.run_dir)
    _assert_as_the_longer_run(again, longer)
    assert len(again.summary["extensions"]) == 1


def test_jaxfl_run_resume_with_a_larger_budget_says_extended(tmp_path, capsys):
    flags = ["--algorithm", "fedavg", "--model", "mlp", "--clients", "4", "--local-steps", "6", "--batch-size", "16",
             "--no-progress", "--no-stop-at-target", "--output-dir", str(tmp_path), "--run-name", "a"]
    assert cli.main(["run", *flags, "--max-updates", "3"]) == 0
    run_dir = str(tmp_path / "a")
    capsys.readouterr()
    assert cli.main(["run", "--resume", run_dir]) == 0  # finished: the way to take it further is named
    assert f"to take it further, raise the budget it stopped on: jaxfl run --resume {run_dir} --max-updates N" \
        in capsys.readouterr().out
    assert cli.main(["run", "--resume", run_dir, "--max-updates", "6", "--no-progress"]) == 0
    assert "fedavg: extended from update 3, " in capsys.readouterr().out
    summary = json.loads(open(os.path.join(run_dir, "summary.json")).read())
    assert summary["global_updates"] == 6 and summary["extensions"][0]["to"] == {"max_updates": 6}
    assert cli.main(["run", "--resume", run_dir, "--max-updates", "6"]) == 0  # the same budget: finished
    assert "has already finished (6 updates" in capsys.readouterr().out


def _files(run_dir):
    return {name: open(os.path.join(run_dir, name), "rb").read() for name in sorted(os.listdir(run_dir))
            if os.path.isfile(os.path.join(run_dir, name))}


def test_what_cannot_be_extended_is_refused_before_any_work(tmp_path):
    base = {**SMALL, "algorithm": "fedbuff", "output_dir": str(tmp_path)}
    run = run_experiment(config_from_mapping({**base, "max_updates": 4})).run_dir
    before = _files(run)
    with pytest.raises(ResumeError, match="with max_updates=3: the run has reached 4 updates already, so it would stop "
                                          "where it is"):
        resume_experiment(run, overrides={"max_updates": 3})
    with pytest.raises(ResumeError, match=r"its max_updates=4 is spent where it stopped \(4 updates; stop: update "
                                          r"budget\), so it would stop there again: raise max_updates \(--max-updates\) "
                                          "above 4 as well"):
        resume_experiment(run, overrides={"max_time": 5000.0})
    with pytest.raises(ResumeError, match="would change it: clients=5"):  # a budget with another change
        resume_experiment(run, overrides={"max_updates": 8, "clients": 5})
    with pytest.raises(ResumeError, match="with max_updates=0: max_updates=0 is not allowed: an integer >= 1"):
        resume_experiment(run, overrides={"max_updates": 0})
    assert _files(run) == before
    reached = run_experiment(config_from_mapping({**base, "max_updates": 40, "stop_at_target": True,
                                                  "target_accuracy": 0.3, "run_name": "target"})).run_dir
    with pytest.raises(ResumeError, match="it stopped on reaching its target accuracy, so it would stop there again: "
                                          "take it past its target with --no-stop-at-target"):
        resume_experiment(reached, overrides={"max_updates": 80})
    timing = run_experiment(config_from_mapping({**base, "max_updates": 4, "timing_only": True, "clients_per_call": None,
                                                 "checkpoint_every": None})).run_dir
    with pytest.raises(ResumeError, match="a timing-only run keeps no checkpoint .* jaxfl run --config "
                                          rf"{timing}/config.json --max-updates 8$"):
        resume_experiment(timing, overrides={"max_updates": 8})


def test_a_final_checkpoint_of_an_earlier_jaxfl_keeps_its_final_evaluation_with_a_warning(tmp_path, monkeypatch):
    save = experiment._Checkpointer.save
    # as jaxfl wrote it before 2026-12-06: after the final evaluation, with the logs as they were then
    monkeypatch.setattr(experiment._Checkpointer, "save", lambda self, simulation, positions=None: save(self, simulation))
    run = run_experiment(config_from_mapping({**SMALL, "algorithm": "fedbuff", "max_updates": 5, "eval_every": 3,
                                              "output_dir": str(tmp_path)})).run_dir
    monkeypatch.undo()
    with pytest.warns(ResumeWarning, match="final checkpoint \\(update 5\\) was written by an earlier jaxfl"):
        extended = resume_experiment(run, overrides={"max_updates": 10})
    assert [row["version"] for row in extended.metrics] == [0, 3, 5, 6, 9, 10]
    # its last evaluation on the cadence (update 5 of every 5): a row the longer run has too, so nothing to say
    monkeypatch.setattr(experiment._Checkpointer, "save", lambda self, simulation, positions=None: save(self, simulation))
    run = run_experiment(config_from_mapping({**SMALL, "algorithm": "fedbuff", "max_updates": 5, "eval_every": 5,
                                              "output_dir": str(tmp_path), "run_name": "on-cadence"})).run_dir
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeWarning)
        extended = resume_experiment(run, overrides={"max_updates": 10})
    assert [row["version"] for row in extended.metrics] == [0, 5, 10]
    # so on an evaluation grid: a time budget ending at a grid point (k·Δt) that the longer run evaluates too
    monkeypatch.setattr(experiment._Checkpointer, "save", lambda self, simulation, positions=None: save(self, simulation))
    run = run_experiment(config_from_mapping({**SMALL, "algorithm": "fedbuff", "max_updates": 1000, "eval_interval": 0.5,
                                              "max_time": 1.0, "output_dir": str(tmp_path), "run_name": "grid"})).run_dir
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeWarning)
        extended = resume_experiment(run, overrides={"max_time": 2.0})
    assert [row["time"] for row in extended.metrics] == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_a_sweep_cell_or_a_comparison_run_is_extended_as_a_copy(tmp_path, monkeypatch, capsys):
    from jaxfl.sweep import run_sweep

    monkeypatch.chdir(tmp_path)
    small = {key: value for key, value in SMALL.items() if key not in ("progress", "checkpoint_every")}
    sweep = run_sweep({**small, "max_updates": 2}, {"algorithm": ["fedavg"]}, "sweep", progress=False)
    (cell,) = sweep.cells
    name = os.path.basename(cell.run_dir)
    before = _files(cell.run_dir)
    with pytest.raises(ResumeError, match=f"it is a cell of the sweep sweep .* extend a copy: cp -r sweep/runs/{name} "
                                          f"{name}-extended && jaxfl run --resume {name}-extended --max-updates 4$"):
        resume_experiment(cell.run_dir, overrides={"max_updates": 4})
    assert _files(cell.run_dir) == before
    shutil.copytree(cell.run_dir, f"{name}-extended")  # the copy the error names
    assert resume_experiment(f"{name}-extended", overrides={"max_updates": 4}).summary["global_updates"] == 4
    flags = ["--model", "mlp", "--clients", "4", "--local-steps", "6", "--batch-size", "16", "--max-updates", "2",
             "--no-progress", "--no-stop-at-target", "--output-dir", "comparison"]
    assert cli.main(["run", "--algorithm", "fedavg,fedbuff", *flags]) == 0
    run = os.path.join("comparison", next(n for n in sorted(os.listdir("comparison")) if n.startswith("fedbuff")))
    with pytest.raises(ResumeError, match="it is one of the runs of the comparison comparison/comparison.csv"):
        resume_experiment(run, overrides={"max_updates": 4})


def test_every_budget_spent_at_the_stop_must_be_raised(tmp_path):
    # both budgets are spent at update 5 (3 clients a FedBuff update); summary.json names the first
    base = {**SMALL, "algorithm": "fedbuff", "buffer_size": 3, "max_updates": 5, "max_client_updates": 15,
            "output_dir": str(tmp_path)}
    run = run_experiment(config_from_mapping(base))
    assert run.summary["stop_reason"] == "update budget" and run.summary["accounting"]["aggregated"] == 15
    with pytest.raises(ResumeError, match=r"its max_client_updates=15 is spent where it stopped \(15 client updates "
                                          r"aggregated; stop: update budget\).* raise max_client_updates"):
        resume_experiment(run.run_dir, overrides={"max_updates": 10})  # was "extended" with nothing trained
    extended = resume_experiment(run.run_dir, overrides={"max_updates": 10, "max_client_updates": 30})
    assert extended.summary["global_updates"] == 10


def test_a_budget_a_run_did_not_have_may_be_added_beyond_where_it_stopped(tmp_path):
    base = {**SMALL, "algorithm": "fedbuff", "max_updates": None, "max_client_steps": 36, "output_dir": str(tmp_path)}
    run = run_experiment(config_from_mapping(base))
    assert run.summary["stop_reason"] == "client-step budget"
    reached = run.summary["global_updates"]
    with pytest.raises(ResumeError, match="its max_client_steps=36 is spent where it stopped"):
        resume_experiment(run.run_dir, overrides={"max_updates": 20})
    with pytest.raises(ResumeError, match=f"with max_updates={reached}: the run has reached {reached} updates already"):
        resume_experiment(run.run_dir, overrides={"max_updates": reached, "max_client_steps": 72})
    extended = resume_experiment(run.run_dir, overrides={"max_updates": reached + 1, "max_client_steps": 72})
    assert extended.summary["global_updates"] == reached + 1 and extended.summary["stop_reason"] == "update budget"


def _with_config_json_edited(tmp_path, max_updates: int) -> str:
    """A finished 4-update run whose config.json was edited by hand to ``max_updates``."""
    run = run_experiment(config_from_mapping({**SMALL, "algorithm": "fedbuff", "max_updates": 4,
                                              "output_dir": str(tmp_path)})).run_dir
    path = os.path.join(run, "config.json")
    written = json.loads(open(path).read())
    written["config"]["budget"]["max_updates"] = max_updates
    open(path, "w").write(json.dumps(written))
    return run


def test_a_budget_raised_by_editing_config_json_is_refused_as_an_edit(tmp_path):
    run = _with_config_json_edited(tmp_path, 8)
    os.remove(os.path.join(run, "summary.json"))  # as if cut short
    with pytest.raises(ResumeError, match=r"config.json differs from the config ckpt-000004 was written with: "
                                          r"max_updates: 8 \(ckpt-000004 has 4\)"):
        resume_experiment(run)


def test_a_new_run_of_the_config_an_extended_run_was_made_with_is_no_rerun(tmp_path):
    config = config_from_mapping({**SMALL, "algorithm": "fedbuff", "max_updates": 3, "output_dir": str(tmp_path)})
    resume_experiment(run_experiment(config).run_dir, overrides={"max_updates": 5})
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        run_experiment(config)
    assert not [w for w in said if "holds a finished run of this config" in str(w.message)]


def test_a_finished_timing_only_run_names_the_command_that_runs_it_further(tmp_path, capsys):
    flags = ["--algorithm", "fedbuff", "--clients", "4", "--max-updates", "3", "--timing-only", "--no-progress",
             "--output-dir", str(tmp_path), "--run-name", "t"]
    assert cli.main(["run", *flags]) == 0
    capsys.readouterr()
    assert cli.main(["run", "--resume", str(tmp_path / "t")]) == 0
    assert f"run it again with a larger budget: jaxfl run --config {tmp_path}/t/config.json --max-updates N" \
        in capsys.readouterr().out


@pytest.mark.parametrize("grid", [{}, {"eval_interval": 0.7, "max_updates": None, "max_time": 8.0}])
def test_a_run_stopped_at_its_target_goes_on_past_it_as_a_run_that_never_stopped(tmp_path, grid):
    base = {**SMALL, "algorithm": "fedbuff", "target_accuracy": 0.5, "max_updates": 12, **grid}
    never = run_experiment(config_from_mapping({**base, "stop_at_target": False, "output_dir": str(tmp_path / "a")}))
    stopped = run_experiment(config_from_mapping({**base, "stop_at_target": True, "output_dir": str(tmp_path / "b")}))
    assert stopped.summary["stop_reason"] == "target reached"
    assert stopped.summary["global_updates"] < never.summary["global_updates"]
    extended = resume_experiment(stopped.run_dir, overrides={"stop_at_target": False})
    # the stop at the target changes nothing before it, nor what the engine trains: bit for bit
    assert events_without_wall_time(extended.run_dir) == events_without_wall_time(never.run_dir)
    assert metrics_without_wall_time(extended.run_dir) == metrics_without_wall_time(never.run_dir)
    for ours, theirs in zip(jax.tree.leaves(extended.params), jax.tree.leaves(never.params)):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert extended.summary["time_to_target"] == never.summary["time_to_target"] == stopped.summary["time_to_target"]
    assert extended.summary["extensions"][0]["to"] == {"stop_at_target": False}


def test_jaxfl_run_resume_of_a_run_at_its_target_names_no_stop_at_target(tmp_path, capsys):
    flags = ["--algorithm", "fedbuff", "--model", "mlp", "--clients", "4", "--local-steps", "6", "--batch-size", "16",
             "--no-progress", "--target-accuracy", "0.5", "--max-updates", "12", "--output-dir", str(tmp_path),
             "--run-name", "g"]
    assert cli.main(["run", *flags]) == 0
    run_dir = str(tmp_path / "g")
    capsys.readouterr()
    assert cli.main(["run", "--resume", run_dir]) == 0
    assert f"to take it past its target: jaxfl run --resume {run_dir} --no-stop-at-target" in capsys.readouterr().out
    assert cli.main(["run", "--resume", run_dir, "--no-stop-at-target", "--no-progress"]) == 0
    assert "fedbuff: extended from update " in capsys.readouterr().out
    assert json.loads(open(os.path.join(run_dir, "summary.json")).read())["global_updates"] == 12


def test_an_extension_made_by_another_process_while_this_one_waited_is_not_recorded_over(tmp_path, monkeypatch):
    from jaxfl import resume

    run = run_experiment(config_from_mapping({**SMALL, "algorithm": "fedbuff", "max_updates": 4,
                                              "output_dir": str(tmp_path)})).run_dir
    path = os.path.join(run, "config.json")
    holding = resume.holding_lock

    @contextlib.contextmanager
    def after_another_extension(folder, *args, **kwargs):
        # what a process that extended the run to 400 while this one waited for the lock leaves
        written = json.loads(open(path).read())
        written["config"]["budget"]["max_updates"] = 400
        written["extensions"] = [{"from": {"max_updates": 4}, "to": {"max_updates": 400}, "update": 4,
                                  "virtual_time": 1.0}]
        open(path, "w").write(json.dumps(written))
        with holding(folder, *args, **kwargs):
            yield

    monkeypatch.setattr(resume, "holding_lock", after_another_extension)
    with pytest.raises(ResumeError, match=r"taken on by another process .* now says max_updates=400\): run the command "
                                          "again"):
        resume_experiment(run, overrides={"max_updates": 6})  # it recorded 400 → 6, and config.json said 6
    assert json.loads(open(path).read())["config"]["budget"]["max_updates"] == 400


def test_a_hand_edited_budget_is_refused_also_with_the_budget_s_flag(tmp_path):
    run = _with_config_json_edited(tmp_path, 6)
    with pytest.raises(ResumeError, match="config.json differs from the config ckpt-000004 was written with"):
        resume_experiment(run, overrides={"max_updates": 8})  # was taken on, recording 6 → 8


def test_a_run_in_use_is_resumed_later_with_the_budget_asked_for(tmp_path):
    import subprocess
    import sys

    run = run_experiment(config_from_mapping({**SMALL, "algorithm": "fedbuff", "max_updates": 4,
                                              "output_dir": str(tmp_path)})).run_dir
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; h = open(sys.argv[1], 'a+'); "
                               "fcntl.flock(h, fcntl.LOCK_EX); h.write('12345'); h.flush(); print('held', flush=True); "
                               "time.sleep(60)", os.path.join(run, ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InUse, match=f"and then jaxfl run --resume {run} --max-updates 8$"):
            resume_experiment(run, overrides={"max_updates": 8})
    finally:
        holder.kill()
        holder.wait()


def test_a_finished_run_without_checkpoints_names_the_command_that_runs_it_further(tmp_path, capsys):
    flags = ["--algorithm", "fedbuff", "--model", "mlp", "--clients", "4", "--local-steps", "6", "--batch-size", "16",
             "--max-updates", "2", "--no-stop-at-target", "--no-progress", "--checkpoint-every", "none",
             "--no-final-checkpoint", "--output-dir", str(tmp_path), "--run-name", "n"]
    assert cli.main(["run", *flags]) == 0
    capsys.readouterr()
    assert cli.main(["run", "--resume", str(tmp_path / "n")]) == 0
    assert f"run it again with a larger budget: jaxfl run --config {tmp_path}/n/config.json --max-updates N" \
        in capsys.readouterr().out
