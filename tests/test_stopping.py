"""A stop asked for (SIGTERM, a cluster's time limit; ``jaxfl.request_stop``) ends a run between two
events with a checkpoint of that point, and the resume gives the uninterrupted run exactly: through
the API, ``jaxfl run`` and a parallel ``jaxfl sweep``. Where no run can stop at an event, SIGTERM
ends the process at once, as without jaxfl."""
import dataclasses
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

import jaxfl
from jaxfl import checkpoint, cli, stopping
from jaxfl.testing import events_without_wall_time, metrics_without_wall_time

ROOT = os.path.dirname(os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def no_request_left():
    yield
    assert stopping.stop_requested() is None, "a test left a stop request for the runs after it"


class StopAt:
    """A logger that asks for a stop at its n-th metrics row (from inside an event: the run stops
    after that event)."""

    def __init__(self, at):
        self.at, self.seen = at, 0

    def log(self, row, step):
        self.seen += 1
        if self.seen == self.at:
            jaxfl.request_stop("the test's time limit")

    def close(self):
        pass


def test_a_requested_stop_checkpoints_between_events_and_the_resume_is_the_whole_run(tmp_path):
    # no periodic checkpoint before the stop: the one the resume starts from is the stop's own
    config = jaxfl.RunConfig(algorithm="fedbuff", model="logreg", clients=5, local_steps=3, buffer_size=2,
                             max_updates=8, checkpoint_every=100, stop_at_target=False, progress=False,
                             output_dir=str(tmp_path))
    whole = jaxfl.run_experiment(config)
    with pytest.raises(jaxfl.RunInterrupted) as stopped:
        jaxfl.run_experiment(config, loggers=[StopAt(4)])  # at version 3's evaluation
    assert stopped.value.reason == "the test's time limit"
    assert stopped.value.update == 3 and stopped.value.checkpoint == checkpoint.latest(stopped.value.run_dir)
    assert not os.path.exists(os.path.join(stopped.value.run_dir, "summary.json"))  # cut mid-run
    assert stopping.stop_requested() is None  # done: the next run is not stopped by it
    resumed = jaxfl.resume_experiment(stopped.value.run_dir)
    assert resumed.summary["global_updates"] == 8 and resumed.summary["resumes"] == 1
    assert events_without_wall_time(whole.run_dir) == events_without_wall_time(resumed.run_dir)
    assert metrics_without_wall_time(whole.run_dir) == metrics_without_wall_time(resumed.run_dir)
    for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_run_that_keeps_no_checkpoints_stops_and_says_so(tmp_path):
    config = jaxfl.RunConfig(algorithm="fedavg", model="logreg", clients=3, local_steps=2, max_updates=6,
                             checkpoint_every=None, final_checkpoint=False, progress=False, output_dir=str(tmp_path))
    with pytest.raises(jaxfl.RunInterrupted) as stopped:
        jaxfl.run_experiment(config, loggers=[StopAt(2)])
    # it keeps none by its settings: not "no checkpoint yet", nor "deleted" on resume
    assert stopped.value.checkpoint is None and str(stopped.value).endswith(
        "holds the logs until it stopped; this run keeps no checkpoints (checkpoint_every=None, "
        "final_checkpoint=False): nothing to resume from; start the run again")
    assert not os.path.exists(os.path.join(stopped.value.run_dir, "checkpoints"))
    with pytest.raises(jaxfl.ResumeError, match=r"has no checkpoints/ folder \(the run keeps none: checkpoint_every="
                                                r"None, final_checkpoint=False\); nothing to resume from"):
        jaxfl.resume_experiment(stopped.value.run_dir)


class StopWhenClosed:
    """A logger that asks for a stop when the run closes it: after the run's last event."""

    def log(self, row, step):
        pass

    def close(self):
        jaxfl.request_stop("late")


def test_a_stop_asked_for_after_the_last_event_lets_the_run_finish_and_stops_the_next_one(tmp_path):
    config = jaxfl.RunConfig(algorithm="fedavg", model="logreg", clients=3, local_steps=2, max_updates=3,
                             progress=False, output_dir=str(tmp_path))
    finished = jaxfl.run_experiment(config, loggers=[StopWhenClosed()])
    assert finished.summary["global_updates"] == 3  # whole: its final checkpoint and summary written
    assert os.path.isfile(os.path.join(finished.run_dir, "summary.json")) and stopping.stop_requested() == "late"
    with pytest.raises(jaxfl.RunInterrupted) as stopped:  # the next run of the process (a comparison's, a sweep's)
        jaxfl.run_experiment(config)
    assert stopped.value.reason == "late" and stopped.value.update == 0  # at its first event
    assert stopping.stop_requested() is None


SIGNALLED = textwrap.dedent("""
    import os, signal, sys
    from jaxfl import stopping
    with stopping.stop_on_sigterm():
        if sys.argv[1] == "accepting":
            with stopping.accepting_stop_requests():
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)  # a second one (the job's, then the sweep's) asks again
        else:
            os.kill(os.getpid(), signal.SIGTERM)
    print("requested:", stopping.stop_requested())
""")


@pytest.mark.parametrize("loop", ["accepting", "none"])
def test_sigterm_is_a_request_only_where_a_run_checks_for_one(loop):
    done = subprocess.run([sys.executable, "-c", SIGNALLED, loop], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    if loop == "accepting":
        assert done.returncode == 0 and done.stdout.strip() == "requested: SIGTERM", done.stderr
    else:  # nothing would see the request: the process ends as SIGTERM's default action ends it
        assert done.returncode == -signal.SIGTERM and done.stdout == ""


FLAGS = ["--algorithm", "fedbuff", "--model", "mlp", "--clients", "5", "--local-steps", "6", "--batch-size", "16",
         "--buffer-size", "2", "--max-updates", "40", "--checkpoint-every", "1000", "--no-progress",
         "--no-stop-at-target"]


def _metrics_rows(run_dir) -> int:
    path = os.path.join(run_dir, "metrics.csv")
    return max(0, sum(1 for _ in open(path)) - 1) if os.path.isfile(path) else 0


def test_sigterm_on_jaxfl_run_checkpoints_where_it_stops_and_the_resume_is_the_whole_run(tmp_path):
    # the signalled run needs a process of its own; the whole run and the resume are the same command in
    # this one (no jax import, no compilation of their own)
    flags = [*FLAGS, "--output-dir", str(tmp_path)]
    assert cli.main(["run", *flags, "--run-name", "whole"]) == 0
    cut = tmp_path / "cut"
    running = subprocess.Popen([sys.executable, "-m", "jaxfl", "run", *flags, "--run-name", "cut"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.time() + 300
    while time.time() < deadline and running.poll() is None and _metrics_rows(cut) < 4:  # mid-run
        time.sleep(0.02)
    running.send_signal(signal.SIGTERM)
    out, err = running.communicate(timeout=300)
    assert running.returncode == 143, err
    assert "Traceback" not in err
    assert not (cut / "summary.json").exists()  # stopped mid-run, not after it
    newest = checkpoint.latest(str(cut))  # checkpoint_every 1000: the stop's own checkpoint
    assert newest is not None and int(newest[-6:]) >= 3
    assert err.strip().splitlines()[-1] == (
        f"jaxfl: stopped by SIGTERM: {cut} keeps its logs and checkpoints up to update {int(newest[-6:])}: "
        f"jaxfl run --resume {cut} (resume_experiment) goes on from there")
    assert cli.main(["run", "--resume", str(cut), "--no-progress"]) == 0
    assert events_without_wall_time(tmp_path / "whole") == events_without_wall_time(cut)
    assert metrics_without_wall_time(tmp_path / "whole") == metrics_without_wall_time(cut)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two cells at once need two cores")
def test_sigterm_on_a_parallel_sweep_checkpoints_every_running_cell_and_the_sweep_goes_on(tmp_path, capsys):
    from jaxfl.report import read_results

    folder = tmp_path / "sweep"
    command = [sys.executable, "-m", "jaxfl", "sweep", *FLAGS, "--algorithm", "fedavg,fedbuff", "--model", "logreg",
               "--max-updates", "60", "--jobs", "2", "--out", str(folder)]  # the later flags win
    running = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.time() + 300
    while time.time() < deadline and running.poll() is None:  # both cells mid-run
        runs = list((folder / "runs").glob("*")) if (folder / "runs").is_dir() else []
        if len(runs) == 2 and all(_metrics_rows(run) >= 3 for run in runs):
            break
        time.sleep(0.02)
    running.send_signal(signal.SIGTERM)  # to the sweep alone, as `kill` sends it: it asks its workers
    out, err = running.communicate(timeout=300)
    assert running.returncode == 143, err
    assert "Traceback" not in err
    assert re.match(r"jaxfl: stopped by SIGTERM: [01] finished cells? in ", err.strip().splitlines()[-1])
    runs = sorted((folder / "runs").glob("*"))
    # FedBuff's 60 logistic-regression updates take a second or so: a cell past its last event when
    # the signal came finishes (its final checkpoint and summary) rather than leave a whole run unsaved
    cut = [run for run in runs if not (run / "summary.json").exists()]
    assert len(runs) == 2 and cut, "no cell was stopped mid-run"
    assert all(checkpoint.latest(str(run)) is not None for run in cut)  # each stopped worker's own checkpoint
    capsys.readouterr()
    assert cli.main(command[3:]) == 0  # the same command goes on, from this process (its cells in workers)
    assert f"{len(cut)} resumed" in capsys.readouterr().out
    assert [row["global_updates"] for row in read_results(str(folder))] == [60, 60]


def test_sigterm_on_a_sweep_of_one_job_stops_its_cell_with_a_checkpoint_and_names_it(tmp_path, capsys):
    from jaxfl.report import read_results

    folder = tmp_path / "sweep"
    command = [sys.executable, "-m", "jaxfl", "sweep", *FLAGS, "--algorithm", "fedavg,fedbuff", "--model", "logreg",
               "--max-updates", "60", "--out", str(folder)]
    running = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.time() + 300
    while time.time() < deadline and running.poll() is None:  # the first cell mid-run
        runs = list((folder / "runs").glob("*")) if (folder / "runs").is_dir() else []
        if runs and _metrics_rows(runs[0]) >= 3:
            break
        time.sleep(0.02)
    running.send_signal(signal.SIGTERM)
    out, err = running.communicate(timeout=300)
    assert running.returncode == 143, err
    (run,) = (folder / "runs").glob("*")
    newest = checkpoint.latest(str(run))
    assert newest is not None and not (run / "summary.json").exists()
    assert err.strip().splitlines()[-1] == (
        f"jaxfl: stopped by SIGTERM: 0 finished cells in {folder / 'results.csv'}; the same command goes on (finished "
        f"cells are skipped, the interrupted one, {run}, resumes from its checkpoint of update {int(newest[-6:])})")
    capsys.readouterr()
    assert cli.main(command[3:]) == 0  # the same command goes on, in this process
    assert "1 run, 1 resumed" in capsys.readouterr().out
    assert [row["global_updates"] for row in read_results(str(folder))] == [60, 60]


def test_a_requested_stop_ends_a_timing_only_run_between_events_with_its_schedule_kept(tmp_path):
    from jaxfl.runlog import read_events

    config = jaxfl.RunConfig(algorithm="fedbuff", model="logreg", clients=50, concurrency=10, buffer_size=2,
                             max_updates=1000, timing_only=True, progress=False, output_dir=str(tmp_path))
    jaxfl.request_stop("the test's time limit")  # kept for the next run: it stops after its first event
    with pytest.raises(jaxfl.RunInterrupted) as stopped:
        jaxfl.run_experiment(config)
    assert stopped.value.reason == "the test's time limit" and stopped.value.timing_only
    assert stopped.value.checkpoint is None and stopping.stop_requested() is None
    assert not os.path.exists(os.path.join(stopped.value.run_dir, "summary.json"))
    events = read_events(stopped.value.run_dir)  # the first wave of dispatches and the first arrival
    assert list(events["event"]) == ["dispatch"] * 10 + ["arrival"]


def test_sigterm_on_a_timing_only_run_keeps_the_schedule_it_logged(tmp_path):
    # SIGTERM had ended such a run at once: its buffered event-log rows were lost, and the line it
    # printed said the folder held the schedule
    from jaxfl.runlog import read_events

    running = subprocess.Popen([sys.executable, "-m", "jaxfl", "run", "--timing-only", "--algorithm", "fedbuff",
                                "--model", "logreg", "--clients", "200", "--concurrency", "50", "--buffer-size", "5",
                                "--max-updates", "100000000", "--max-time", "inf", "--no-progress",
                                "--output-dir", str(tmp_path), "--run-name", "cut"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    cut = tmp_path / "cut"
    deadline = time.time() + 300
    while time.time() < deadline and running.poll() is None and not (cut / "config.json").exists():
        time.sleep(0.02)
    time.sleep(1.0)  # config.json is written just before the first event: now in the event loop
    running.send_signal(signal.SIGTERM)
    out, err = running.communicate(timeout=300)
    assert running.returncode == 143, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"jaxfl: stopped by SIGTERM: {cut} holds the schedule logged until it stopped; a timing-only run keeps no "
        "checkpoints: run it again to have all of it")
    assert not (cut / "summary.json").exists()
    assert list(read_events(str(cut))["event"]).count("aggregate") > 100


def test_a_run_of_an_algorithm_registered_by_name_is_said_to_resume_in_python(tmp_path):
    # its interrupt named `jaxfl run --resume RUN`, which refuses such a run (no command imports it)
    from jaxfl.algorithms import register, unregister
    from jaxfl.algorithms.fedbuff import FedBuffAlgorithm

    class ScriptFedBuff(FedBuffAlgorithm):
        name = "script_fedbuff_stop_check"

    register(ScriptFedBuff)
    try:
        config = jaxfl.RunConfig(algorithm="script_fedbuff_stop_check", model="logreg", clients=5, local_steps=3,
                                 buffer_size=2, max_updates=8, stop_at_target=False, progress=False,
                                 output_dir=str(tmp_path))
        with pytest.raises(jaxfl.RunInterrupted) as stopped:
            jaxfl.run_experiment(config, loggers=[StopAt(4)])
        run_dir = stopped.value.run_dir
        assert str(stopped.value) == (
            f"{run_dir} keeps its logs and checkpoints up to update 3: resume_experiment({run_dir!r}) goes on from "
            "there, with the algorithm 'script_fedbuff_stop_check' registered again (jaxfl run --resume cannot "
            "import an algorithm registered by name in a script or notebook)")
        assert jaxfl.resume_experiment(run_dir).summary["global_updates"] == 8
    finally:
        unregister("script_fedbuff_stop_check")
    # a built-in's interrupt names the command
    with pytest.raises(jaxfl.RunInterrupted) as stopped:
        jaxfl.run_experiment(dataclasses.replace(config, algorithm="fedbuff"), loggers=[StopAt(4)])
    assert "jaxfl run --resume" in str(stopped.value)


def test_a_timing_only_run_stopped_before_its_first_rows_says_it_holds_no_schedule(tmp_path):
    from jaxfl.experiment import RunInterrupted

    (tmp_path / "config.json").write_text("{}")
    assert str(RunInterrupted(str(tmp_path), None, timing_only=True)) == (
        f"{tmp_path} holds no schedule yet (it stopped before its first events were written); a timing-only run "
        "keeps no checkpoints: run it again")
    (tmp_path / "events.csv").write_text("time,event\n0.0,dispatch\n")
    assert "holds the schedule logged until it stopped" in str(RunInterrupted(str(tmp_path), None, timing_only=True))


def test_a_stopped_timing_only_sweep_or_comparison_says_its_cut_run_starts_again(tmp_path, capsys):
    # they said the cut cell "resumes from its newest checkpoint" and that the comparison would write
    # its comparison.csv: a timing-only run keeps no checkpoints, and its comparison writes no table
    flags = ["--timing-only", "--model", "logreg", "--clients", "50", "--concurrency", "10", "--max-updates", "50",
             "--no-progress"]
    jaxfl.request_stop("the test")
    assert cli.main(["sweep", *flags, "--algorithm", "fedbuff", "--seed", "0,1", "--out", str(tmp_path / "s")]) == 130
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(r"\(finished cells are skipped, the interrupted one, .*, starts again: a timing-only run keeps no "
                     r"checkpoints\)$", said), said
    jaxfl.request_stop("the test")
    assert cli.main(["run", *flags, "--algorithm", "fedavg,fedbuff", "--output-dir", str(tmp_path / "c")]) == 130
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.startswith("jaxfl: stopped by the test: comparison fedavg,fedbuff of timing-only runs cut short; "
                           "finished: none; interrupted: fedavg: "), said
    assert said.endswith("goes on (finished runs reused, the interrupted one started again)"), said


def test_a_stopped_sweep_of_timing_only_and_training_cells_names_the_cut_cell_s_own_way_on(tmp_path, capsys):
    # the grid's timing-only cells made every cut cell "start again", a training one with a checkpoint too
    (tmp_path / "mixed.toml").write_text('algorithm = "fedbuff"\nmodel = "logreg"\nclients = 20\nconcurrency = 5\n'
                                         'max_updates = 50\nstop_at_target = false\n[grid]\n'
                                         'timing_only = [false, true]\n')
    jaxfl.request_stop("the test")  # the first cell, the training one, stops at its first event
    assert cli.main(["sweep", str(tmp_path / "mixed.toml"), "--no-progress", "--out", str(tmp_path / "s")]) == 130
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(r"the interrupted one, .*, resumes from its checkpoint of update 0\)$", said), said
