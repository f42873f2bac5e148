"""jaxfl sweep and jaxfl report: a 2×2 grid of tiny runs, resumed and reported; the report's
arithmetic on a hand-made results table."""
import argparse
import csv
import json
import math
import os
import re
import shutil
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import sharing_compilations
from jaxfl import checkpoint, cli
from jaxfl.config import ConfigError
from jaxfl.report import (_whole_seconds, computation_curve, format_markdown, group_columns, make_report, read_results,
                          summarise)
from jaxfl.sweep import KEY_SETTINGS, SUMMARY_COLUMNS, cell_state, expand, run_sweep

# Every cell: MLP on the embedded MNIST, 3 clients, 2 local steps, 2 global updates (a time to the
# low target, no stop there), a checkpoint after each update (so that a cell can be cut back to the
# middle of its run).
BASE = {"dataset": "mnist10k", "model": "mlp", "clients": 3, "local_steps": 2, "batch_size": 16,
        "max_updates": 2, "target_accuracy": 0.3, "stop_at_target": False, "checkpoint_every": 1, "buffer_size": 2}
GRID = {"algorithm": ["fedavg", "fedbuff"], "seed": [0, 1]}
FLAGS = ["--algorithm", "fedavg,fedbuff", "--seed", "0,1", "--dataset", "mnist10k", "--model", "mlp",
         "--clients", "3", "--local-steps", "2", "--batch-size", "16", "--max-updates", "2",
         "--target-accuracy", "0.3", "--no-stop-at-target", "--checkpoint-every", "1", "--buffer-size", "2", "--no-progress"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("sweep"))
    return run_sweep(BASE, GRID, folder, progress=False)


def _run_dirs(folder):
    return sorted(os.listdir(os.path.join(folder, "runs")))


def test_one_row_per_cell_with_swept_key_and_summary_columns(sweep):
    assert sweep.ran == [0, 1, 2, 3] and sweep.skipped == sweep.resumed == sweep.restarted == []
    assert [(row["algorithm"], row["seed"]) for row in sweep.rows] == [
        ("fedavg", 0), ("fedavg", 1), ("fedbuff", 0), ("fedbuff", 1)]
    with open(sweep.table, newline="") as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == ["cell", *KEY_SETTINGS, *SUMMARY_COLUMNS, "run_dir"]
    assert len(table) == 4 and [row["cell"] for row in table] == ["0", "1", "2", "3"]
    parquet = pq.read_table(sweep.parquet)
    assert parquet.num_rows == 4 and parquet.column_names == list(table[0])
    assert parquet.column("global_updates").to_pylist() == [2, 2, 2, 2]
    for row in sweep.rows:
        with open(os.path.join(sweep.sweep_dir, row["run_dir"], "summary.json")) as handle:
            summary = json.load(handle)
        assert row["best_accuracy"] == summary["best_accuracy"]
        # 2 updates: 3 evaluations, whose last tenth is the last one
        assert row["last_tenth_accuracy"] == summary["last_tenth_accuracy"] == pytest.approx(summary["final_accuracy"])
        assert row["client_updates"] == summary["accounting"]["aggregated"]
        assert row["stop_reason"] == "update budget"
    assert len(_run_dirs(sweep.sweep_dir)) == 4
    with open(os.path.join(sweep.sweep_dir, "sweep.json")) as handle:
        definition = json.load(handle)
    assert definition["grid"] == GRID and len(definition["cells"]) == 4
    assert sweep.notes == ["buffer_size applies only to the cells that read it (algorithm=fedbuff)"]


def test_rerunning_skips_finished_cells_and_the_cli_names_the_same_cells(sweep, capsys):
    again = run_sweep(BASE, GRID, sweep.sweep_dir, progress=False)
    assert again.ran == [] and again.skipped == [0, 1, 2, 3]
    assert again.rows == sweep.rows
    # the command line's flags make the same four cells (the same run directories): nothing runs
    assert cli.main(["sweep", *FLAGS, "--out", sweep.sweep_dir]) == 0
    assert "4 cells: 0 run, 0 resumed, 0 restarted, 4 already finished" in capsys.readouterr().out
    assert len(_run_dirs(sweep.sweep_dir)) == 4


def test_an_interrupted_cell_resumes_and_one_without_checkpoint_restarts(sweep, tmp_path):
    folder = str(tmp_path / "copy")
    shutil.copytree(sweep.sweep_dir, folder)
    interrupted = os.path.join(folder, sweep.rows[2]["run_dir"])  # fedbuff seed 0
    # cut it back to its checkpoint after the first update: no summary, newest checkpoint at version 1
    os.remove(os.path.join(interrupted, "summary.json"))
    checkpoints = os.path.join(interrupted, "checkpoints")
    kept = sorted(name for name in os.listdir(checkpoints) if name.startswith("ckpt-"))
    assert kept == ["ckpt-000001", "ckpt-000002"]
    shutil.rmtree(os.path.join(checkpoints, "ckpt-000002"))
    with open(os.path.join(checkpoints, "latest"), "w") as handle:
        handle.write("ckpt-000001\n")
    assert cell_state(interrupted) == "resumable"
    early = os.path.join(folder, sweep.rows[1]["run_dir"])  # fedavg seed 1: killed before any checkpoint
    os.remove(os.path.join(early, "summary.json"))
    shutil.rmtree(os.path.join(early, "checkpoints"))
    assert cell_state(early) == "restart"

    again = run_sweep(BASE, GRID, folder, progress=False)
    assert (again.ran, again.resumed, again.restarted, again.skipped) == ([], [2], [1], [0, 3])
    assert _run_dirs(folder) == _run_dirs(sweep.sweep_dir)  # no second directory for either cell
    with open(os.path.join(interrupted, "summary.json")) as handle:
        assert json.load(handle)["resumes"] == 1
    for before, after in zip(sweep.rows, again.rows):  # the same runs as uninterrupted ones
        for column in ("global_updates", "client_updates", "best_accuracy", "final_accuracy", "time_to_target",
                       "stop_reason", "run_dir"):
            assert after[column] == before[column], column


def test_a_sweep_cut_short_keeps_the_table_of_its_finished_cells(sweep, tmp_path):
    folder = str(tmp_path / "cut")
    shutil.copytree(sweep.sweep_dir, folder)
    for row in sweep.rows[2:]:  # fedbuff's two cells never ran
        shutil.rmtree(os.path.join(folder, row["run_dir"]))

    def interrupt(line):  # Ctrl-C (or a time limit) right after the first cell of this call finishes
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(BASE, GRID, folder, progress=False, echo=interrupt)
    assert [row["cell"] for row in read_results(folder)] == [0, 1, 2]  # the finished ones, reportable
    again = run_sweep(BASE, GRID, folder, progress=False)
    assert (again.ran, again.skipped) == ([3], [0, 1, 2])
    assert [row["run_dir"] for row in read_results(folder)] == [row["run_dir"] for row in sweep.rows]


def test_each_row_names_the_jaxfl_that_made_it_and_a_report_of_runs_by_two_says_so(sweep, tmp_path):
    # a sweep folder reused after an upgrade reused its finished cells: nothing told which code made which row
    from jaxfl.experiment import jaxfl_source, library_versions
    from jaxfl.report import make_report

    source = jaxfl_source()
    made_by = library_versions()["jaxfl"] + (f"+g{source['commit'][:9]}" + ".modified" * source["modified"]
                                            if source else "")
    assert [row["jaxfl_code"] for row in sweep.rows] == [made_by] * 4
    assert [row["jaxfl_code"] for row in read_results(sweep.sweep_dir)] == [made_by] * 4  # not read as a number
    assert "versions of jaxfl" not in make_report(sweep.sweep_dir, figures=False, out=str(tmp_path / "one")).markdown
    folder = str(tmp_path / "upgraded")
    shutil.copytree(sweep.sweep_dir, folder)
    older = os.path.join(folder, sweep.rows[0]["run_dir"], "summary.json")
    with open(older) as handle:
        summary = json.load(handle)
    for stretch in summary["device_history"]:
        stretch.update(jaxfl_commit="1234567890abcdef", jaxfl_modified=False)
    with open(older, "w") as handle:
        json.dump(summary, handle)
    again = run_sweep(BASE, GRID, folder, progress=False)  # every cell finished: reused, the table written anew
    assert again.skipped == [0, 1, 2, 3]
    older_code = library_versions()["jaxfl"] + "+g123456789"
    assert [row["jaxfl_code"] for row in read_results(folder)] == [older_code] + [made_by] * 3
    markdown = make_report(folder, figures=False, out=str(tmp_path / "two")).markdown
    assert f"The runs were made by 2 versions of jaxfl (the jaxfl_code column of their results): {older_code} " \
           f"(1 run), {made_by} (3 runs)." in markdown


def _tables_as_announced(folder):
    """An echo for run_sweep and the cells of the results table on disk each time it announced a
    finished cell: what a `jaxfl report` in another shell, or after a SIGKILL, would have read."""
    seen = []

    def echo(line):
        if "best accuracy" in line:
            seen.append((int(line.split()[1]), [row["cell"] for row in read_results(folder)]))

    return echo, seen


def test_the_table_holds_every_cell_announced_finished_while_the_sweep_runs(sweep, tmp_path):
    # it was written only when the sweep ended: a sweep killed outright (SIGKILL, a lost machine) after
    # hours of cells left no table, and a report on a sweep still running had nothing to read
    folder = str(tmp_path / "running")
    shutil.copytree(sweep.sweep_dir, folder)
    os.remove(os.path.join(folder, "results.csv"))
    for row in sweep.rows[2:]:
        shutil.rmtree(os.path.join(folder, row["run_dir"]))
    echo, seen = _tables_as_announced(folder)
    run_sweep(BASE, GRID, folder, progress=False, echo=echo)
    assert seen == [(2, [0, 1, 2]), (3, [0, 1, 2, 3])]


def test_a_report_of_a_sweep_not_finished_says_which_cells_it_covers(sweep, tmp_path):
    folder = str(tmp_path / "partial")
    shutil.copytree(sweep.sweep_dir, folder)
    complete = make_report(folder, figures=False, out=str(tmp_path / "complete"))
    assert "This report covers" not in complete.markdown
    _write_results(folder, sweep.rows[:3])  # the table as it stood while the fourth cell ran
    os.remove(os.path.join(folder, sweep.rows[3]["run_dir"], "summary.json"))  # (not yet written then)
    report = make_report(folder, figures=False, out=str(tmp_path / "report"))
    note = (f"This report covers 3 of the 4 cells of {folder}: the others have not finished (the sweep is still "
            "running, or was stopped; the same jaxfl sweep command goes on with them). Means, ratios and figures "
            "are over the finished runs only.")
    assert report.markdown.startswith(note + "\n\n## Time to first reach")
    with open(report.markdown_path) as handle:
        assert handle.read().startswith(note)
    _write_results(folder, [])
    with pytest.raises(ValueError, match=r"holds no finished run yet: nothing to report"):
        make_report(folder, figures=False, out=str(tmp_path / "none"))
    os.remove(os.path.join(folder, "results.csv"))  # a sweep begun by a jaxfl that wrote it only at its end
    with pytest.raises(FileNotFoundError, match=r"holds no results.csv yet: .*the same jaxfl sweep command again"):
        make_report(folder, figures=False, out=str(tmp_path / "none"))
    assert not os.path.exists(tmp_path / "none")


def test_ctrl_c_on_jaxfl_sweep_says_what_is_kept_and_the_same_command_goes_on(tmp_path, capsys):
    # it printed an 80-line KeyboardInterrupt traceback through jax's dispatch
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path / "cut"
    # 60 updates, a checkpoint every 10 (after every update it was 120 saves): the Ctrl-C, 20 ms after the
    # first checkpoint, lands with 50 updates to go, also when the programs come from the compilation cache
    flags = [*FLAGS, "--algorithm", "fedbuff", "--max-updates", "60", "--checkpoint-every", "10",
             "--out", str(folder)]  # the later flags win
    command = [sys.executable, "-m", "jaxfl.cli", "sweep", *flags]
    running = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=os.path.dirname(os.path.dirname(__file__)), env=sharing_compilations())
    deadline = time.time() + 300
    while time.time() < deadline and running.poll() is None:  # mid-run: after the first cell's first checkpoint
        if any(os.path.isfile(os.path.join(path, "checkpoints", "latest"))
               for path in (folder / "runs").glob("*")):
            break
        time.sleep(0.02)
    running.send_signal(signal.SIGINT)
    out, err = running.communicate(timeout=300)
    assert running.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    cell = next((folder / "runs").glob("*"))
    newest = checkpoint.latest(str(cell))
    assert (f"jaxfl: interrupted: 0 finished cells in {folder / 'results.csv'}; the same command goes on "
            f"(finished cells are skipped, the interrupted one, {cell}, resumes from its checkpoint of update "
            f"{int(newest[-6:])})") in err
    assert "cells:" not in out  # no closing line claiming the sweep ran
    # the same command goes on; run in this process, it needs no jax import and no compilation of its own
    capsys.readouterr()
    assert cli.main(["sweep", *flags]) == 0
    assert "2 cells: 1 run, 1 resumed, 0 restarted, 0 already finished" in capsys.readouterr().out
    assert [row["global_updates"] for row in read_results(str(folder))] == [60, 60]


def test_jobs_values_are_checked_before_any_run(tmp_path):
    from jaxfl._devices import usable_cores

    folder = str(tmp_path / "jobs")
    for jobs, allowed in ((0, "an integer >= 1"), (True, "an integer >= 1"), (1.5, "an integer >= 1"),
                          (usable_cores() + 1, f"at most {usable_cores()} cells can run at once")):
        with pytest.raises(ConfigError, match=rf"jobs={jobs!r} is not allowed: .*{allowed}"):
            run_sweep(BASE, GRID, folder, progress=False, jobs=jobs)
    assert not os.path.exists(os.path.join(folder, "runs"))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two cells at once need two cores")
def test_a_parallel_sweep_runs_its_cells_at_once_each_on_its_share_of_the_cores(sweep, tmp_path):
    from jaxfl.testing import events_without_wall_time

    folder = str(tmp_path / "parallel")
    echo, seen = _tables_as_announced(folder)
    # two of the serial sweep's cells (seed 0 of each algorithm): two at once is all two jobs run; each
    # cell is a worker process of its own (a jax import and a build), so four cost twice as much
    grid = {"algorithm": GRID["algorithm"], "seed": [0]}
    result = run_sweep(BASE, grid, folder, progress=False, jobs=2, echo=echo)
    assert result.ran == [0, 1] and result.jobs == 2 and result.peak_running == 2
    # each cell is in the table when it is announced (in the order the cells finish)
    assert sorted(cell for cell, _ in seen) == [0, 1] and seen[-1][1] == [0, 1]
    assert all(cell in table for cell, table in seen)
    assert not os.path.exists(os.path.join(folder, "logs"))  # kept only for a cell that failed
    cores = len(os.sched_getaffinity(0)) // 2
    serial_rows = [row for row in sweep.rows if row["seed"] == 0]
    assert len(result.rows) == len(serial_rows) == 2
    for row, serial in zip(result.rows, serial_rows):
        assert row["run_dir"] == serial["run_dir"]  # the same cells, named by their settings
        with open(os.path.join(folder, row["run_dir"], "config.json")) as handle:
            assert json.load(handle)["execution_plan"]["devices"] == cores  # one device per core of its share
        # the schedule does not read the model: the same event log; the arithmetic of another device
        # count: the same accuracy up to float32 reassociation
        assert events_without_wall_time(os.path.join(folder, row["run_dir"])) == \
            events_without_wall_time(os.path.join(sweep.sweep_dir, serial["run_dir"]))
        assert row["global_updates"] == serial["global_updates"] and row["stop_reason"] == serial["stop_reason"]
        assert row["best_accuracy"] == pytest.approx(serial["best_accuracy"], abs=0.01)
    with open(os.path.join(folder, "sweep.json")) as handle:
        assert json.load(handle)["jobs"] == 2
    again = run_sweep(BASE, grid, folder, progress=False, jobs=1)  # finished cells: any jobs goes on
    assert again.skipped == [0, 1] and again.peak_running == 0
    # the same jobs, the same share of the cores: the same run, bit for bit
    from jaxfl.testing import metrics_without_wall_time

    repeat = run_sweep(BASE, {"algorithm": ["fedbuff"], "seed": [0]}, str(tmp_path / "repeat"), progress=False, jobs=2)
    first = next(row for row in result.rows if row["algorithm"] == "fedbuff" and row["seed"] == 0)
    assert repeat.rows[0]["run_dir"] == first["run_dir"]
    for same in (events_without_wall_time, metrics_without_wall_time):
        assert same(os.path.join(repeat.sweep_dir, first["run_dir"])) == same(os.path.join(folder, first["run_dir"]))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two cells at once need two cores")
def test_a_cell_failing_in_a_parallel_sweep_names_itself_and_keeps_its_output(tmp_path):
    from jaxfl.sweep import CellFailed

    folder = str(tmp_path / "failing")
    base = {**BASE, "memory_limit_mb": 0.01}  # found only when the engine is built, inside the cell's process
    # cells 0 and 1 start together and both fail: the sweep names the first it sees end
    with pytest.raises(CellFailed, match=r"sweep cell ([01]) \(algorithm=fedavg seed=\1\) failed \(exit status 2; its "
                                         r"output in .*cell-\1.log\):\njaxfl: error: one client per device needs") as failed:
        run_sweep(base, GRID, folder, progress=False, jobs=2)
    assert os.path.isfile(str(failed.value).split("its output in ")[1].split("):")[0])
    assert read_results(folder) == []  # no finished cell


def _bytes_under(folder) -> int:
    """The bytes of the files under ``folder`` now. A worker renames a checkpoint's temporary folder
    while this walks the tree (rglob raised FileNotFoundError on one): what vanished counts none."""
    total = 0
    for root, _, files in os.walk(folder):  # os.walk skips a folder that vanished
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def _newest_checkpoints(folder) -> dict[str, int]:
    """The update of each run's newest checkpoint under ``folder``/runs (runs without one left out)."""
    newest = {}
    for path in (folder / "runs").glob("*"):
        latest = checkpoint.latest(str(path))
        if latest is not None:
            newest[path.name] = int(os.path.basename(latest)[len("ckpt-"):])
    return newest


def _workers_of(folder) -> list[int]:
    """Process ids of the sweep workers running cells of ``folder`` (read from /proc, which any Linux has)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                words = handle.read().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"jaxfl._sweep_worker" in words and any(str(folder).encode() in word for word in words):
            found.append(int(entry))
    return found


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two cells at once need two cores")
def test_ctrl_c_on_a_parallel_sweep_stops_every_cell_and_the_same_jobs_go_on(tmp_path, capsys):
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path / "cut"
    # four cells, two jobs: a cell waits for a share another frees, and the same command goes on with
    # interrupted cells and cells never started
    flags = [*FLAGS, "--max-updates", "60", "--jobs", "2", "--out", str(folder)]  # the later flags win
    root = os.path.dirname(os.path.dirname(__file__))
    command = [sys.executable, "-m", "jaxfl.cli", "sweep", *flags]
    running = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root,
                               env=sharing_compilations())
    deadline = time.time() + 300
    while time.time() < deadline and running.poll() is None:  # mid-run: after both first cells checkpointed
        if sum(os.path.isfile(os.path.join(path, "checkpoints", "latest")) for path in (folder / "runs").glob("*")) >= 2:
            break
        time.sleep(0.02)
    running.send_signal(signal.SIGINT)  # to the sweep alone, as a time limit sends it: it stops its workers
    out, err = running.communicate(timeout=300)
    assert running.returncode == 130, err
    assert "Traceback" not in err
    assert ("the same command goes on (finished cells are skipped, the interrupted ones resume from their newest "
            "checkpoints)") in err
    assert _workers_of(folder) == []  # none left running
    # cut mid-run: a cell that finished in the seconds its sweep gave it to stop would leave nothing to resume
    assert any(not (path / "summary.json").exists() for path in (folder / "runs").glob("*"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as other_jobs:  # the refusal needs no process of its own
        cli.main(["sweep", *flags[:-4], "--jobs", "1", "--out", str(folder)])
    other_jobs_err = capsys.readouterr().err
    assert other_jobs.value.code == 2 and "jobs=1 is not allowed here" in other_jobs_err
    assert "continue with --jobs 2" in other_jobs_err
    # launched as a shell script's background job (`jaxfl sweep ... &`), which starts with SIGINT
    # ignored and hands that on to its workers: they must still stop with their sweep
    killed = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root,
                              env=sharing_compilations(), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    written = lambda: _bytes_under(folder / "runs")  # noqa: E731
    before, deadline = written(), time.time() + 300
    while time.time() < deadline and not (_workers_of(folder) and written() > before):  # the workers are training
        time.sleep(0.05)
    assert time.time() < deadline, "the relaunched sweep's workers never trained: nothing was killed below"
    at_kill = _newest_checkpoints(folder)
    killed.kill()  # SIGKILL: the sweep cannot stop its workers; Linux tells them (PR_SET_PDEATHSIG)
    killed.wait()
    deadline = time.time() + 120  # a worker in the middle of an XLA compilation answers after it
    while time.time() < deadline and _workers_of(folder):
        time.sleep(0.1)
    assert _workers_of(folder) == []
    # each worker stopped at its next event boundary, with a checkpoint there (a cell in its last
    # updates may finish them): none went on to finish its cell alone, a checkpoint after each of its
    # 60 updates. Counted in updates, not seconds, which a loaded machine stretches: one for the event
    # in progress, one for a checkpoint written between the reading above and the kill
    gone_on = {name: (at_kill.get(name, 0), update) for name, update in _newest_checkpoints(folder).items()
               if update > at_kill.get(name, 0) + 2}
    assert gone_on == {}
    capsys.readouterr()
    assert cli.main(["sweep", *flags]) == 0  # the same command, from this process: its cells in workers as before
    assert [row["global_updates"] for row in read_results(str(folder))] == [60, 60, 60, 60]
    assert re.search(r"\b[1-4] resumed", capsys.readouterr().out)  # ("0 resumed" is printed too)


# a worker (jaxfl imported: jax's own gc callback in place) whose first garbage collection in a moment (WHEN) runs the SIGINT handler inside the collector's
# callback, as a SIGINT landing in jax's gc callback does: Python drops the handler's KeyboardInterrupt there
# ("Exception ignored") and goes on
SIGINT_IN_A_GC_CALLBACK = """
import gc, os, signal, sys, threading
fired = []

def sigint_inside(phase, info):
    # in the main thread (where the handler runs) and with the handler under test in place
    if phase == "start" and not fired and threading.current_thread() is threading.main_thread() and \
            getattr(signal.getsignal(signal.SIGINT), "__name__", "") == HANDLER and (WHEN):
        fired.append(True)
        print("SIGINT in a gc callback", flush=True)
        signal.raise_signal(signal.SIGINT)  # its handler runs here, in the callback

from jaxfl._sweep_worker import main
PRELUDE
gc.callbacks.append(sigint_inside)
sys.exit(main(sys.argv[1:]))
"""
# a collection in the run's own thread after each checkpoint: the run raises the collector's threshold, and
# a tiny run makes too few objects to reach it
COLLECTING_AFTER_EACH_SAVE = """
from jaxfl import checkpoint
save = checkpoint.save

def save_then_collect(*args, **kwargs):
    saved = save(*args, **kwargs)
    gc.collect()
    return saved

checkpoint.save = save_then_collect
"""


@pytest.mark.parametrize("moment", ["importing", "running"])
def test_a_worker_stops_on_a_sigint_lost_in_a_garbage_collector_callback(tmp_path, moment):
    """A sweep killed with SIGKILL leaves its workers Linux's SIGINT; one that landed in jax's gc callback as
    the worker imported jax was lost, and the worker trained its cell to the end, unwatched (a relaunched
    sweep would have run it a second time). Lost while importing, the worker ends before its run starts;
    lost during the run, the run stops at its next event with a checkpoint there (the command's stop request)."""
    import subprocess

    from jaxfl.config import config_from_mapping

    run_dir = tmp_path / "run"
    when = {"importing": "not hasattr(sys.modules.get('jaxfl.sweep'), 'run_cell')",  # main()'s first imports
            "running": f"os.path.isdir({str(run_dir / 'checkpoints' / 'ckpt-000002')!r})"}[moment]
    config = config_from_mapping({**BASE, "max_updates": 40, "output_dir": str(tmp_path), "run_name": "run"})
    handler = {"importing": "on_sigint", "running": "_on_sigint"}[moment]  # the worker's, then the command's
    script = SIGINT_IN_A_GC_CALLBACK.replace("WHEN", when).replace("HANDLER", repr(handler)).replace(
        "PRELUDE", COLLECTING_AFTER_EACH_SAVE if moment == "running" else "")
    worker = subprocess.run([sys.executable, "-c", script, "", "new",
                             str(run_dir), json.dumps(config.to_dict())], capture_output=True, text=True,
                            timeout=300, env=sharing_compilations())
    assert worker.stdout.startswith("SIGINT in a gc callback"), worker.stdout + worker.stderr
    assert "Exception ignored" in worker.stderr  # where the KeyboardInterrupt went
    assert worker.returncode == 130, worker.stdout + worker.stderr
    assert not (run_dir / "summary.json").exists()
    if moment == "importing":
        assert not run_dir.exists()
    else:  # stopped at the next event boundary (of update 2 or 3), with a checkpoint there, not at update 40
        assert int(os.path.basename(checkpoint.latest(str(run_dir)))[len("ckpt-"):]) in (2, 3)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and subreapers are Linux's")
def test_a_worker_whose_sweep_died_as_it_started_ends_also_under_a_subreaper():
    """A worker asks Linux for a SIGINT at its sweep's death only once it runs (after importing jax):
    a sweep killed before then left it adopted. By init, in a plain shell; by the nearest subreaper,
    where there is one (systemd --user in a desktop session), which a check for init missed."""
    import subprocess

    from jaxfl._sweep_worker import SWEEP_PID

    worker = ("import time; time.sleep(1.5); from jaxfl._sweep_worker import _end_with_the_sweep; "
              "print('ended' if _end_with_the_sweep() else 'went on', flush=True)")
    sweep = (f"import os, subprocess, sys; subprocess.Popen([sys.executable, '-c', {worker!r}], "
             f"env=dict(os.environ, {SWEEP_PID}=str(os.getpid()))); os._exit(0)")  # dies as its worker starts
    subreaper = ("import ctypes, os, subprocess, sys; ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER\n"
                 f"subprocess.run([sys.executable, '-c', {sweep!r}]); os.wait()  # the adopted worker")
    done = subprocess.run([sys.executable, "-c", subreaper], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ended", done.stderr


def test_parallel_cells_not_pinned_outside_linux_are_said_to_share_every_core(tmp_path, monkeypatch):
    from jaxfl.sweep import _check_jobs

    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    with pytest.warns(UserWarning, match=r"jobs=2: the cells are not pinned to cores on this system \(CPU affinity "
                                         r"is Linux's\): each of the 2 processes has 1 device\(s\), and they share"):
        _check_jobs(2, str(tmp_path), [], {})


@pytest.mark.parametrize("pipe", ["ended", "closed", "held"])
def test_a_worker_without_linux_s_parent_death_signal_ends_with_its_sweep(tmp_path, pipe):
    """On a Mac (no PR_SET_PDEATHSIG) the workers of a sweep killed outright went on training their cells
    unwatched; a worker there watches its standard input, a pipe that ends with the sweep (``ended``: the
    pipe alone, its parent still there; ``closed``: with the sweep), and its parent (``held``: another
    process the sweep started holds the pipe open after the sweep's death)."""
    import subprocess

    from jaxfl._sweep_worker import SWEEP_PID

    worker = ("import sys, time\nfrom jaxfl import _sweep_worker\nsys.platform = 'darwin'\n"
              "assert not _sweep_worker._end_with_the_sweep()\nprint('watching', flush=True)\n"
              "try:\n    time.sleep(120)\n    print('went on', flush=True)\n"
              "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n")
    said, holder = tmp_path / "worker.out", tmp_path / "holder.pid"
    sweep = (f"import os, subprocess, sys, time\nout = open({str(said)!r}, 'w')\n"
             f"worker = subprocess.Popen([sys.executable, '-c', {worker!r}], stdin=subprocess.PIPE, stdout=out, "
             f"stderr=subprocess.STDOUT, env=dict(os.environ, {SWEEP_PID}=str(os.getpid())))\n"
             + (f"held = subprocess.Popen(['sleep', '60'], pass_fds=[worker.stdin.fileno()])\n"
                f"open({str(holder)!r}, 'w').write(str(held.pid))\n" if pipe == "held" else "")
             + f"while 'watching' not in open({str(said)!r}).read():\n    time.sleep(0.1)\n"
             + ("worker.stdin.close()\nworker.wait(60)\n" if pipe == "ended" else
                "os.kill(os.getpid(), 9)  # the sweep killed outright"))
    try:
        subprocess.run([sys.executable, "-c", sweep], timeout=120, env=sharing_compilations())
        for _ in range(300):
            if "interrupted" in said.read_text() or "went on" in said.read_text():
                break
            time.sleep(0.1)
        assert said.read_text().split() == ["watching", "interrupted"]
    finally:
        if holder.exists():
            os.kill(int(holder.read_text()), 9)


def test_a_sweep_on_given_speeds_runs_every_cell_on_them_and_its_folder_keeps_one_set(sweep, tmp_path, capsys):
    from jaxfl.experiment import run_experiment
    from jaxfl.testing import events_without_wall_time

    speeds = np.array([0.05, 0.4, 3.0])  # far from the exponential draws of the drawn sweep's seed 0
    np.save(tmp_path / "speeds.npy", speeds)
    folder = str(tmp_path / "given")
    grid = {"algorithm": GRID["algorithm"], "seed": [0]}
    result = run_sweep(BASE, grid, folder, progress=False, time_per_step=speeds)
    drawn = [row for row in sweep.rows if row["seed"] == 0]
    with open(os.path.join(folder, "sweep.json")) as handle:
        recorded = json.load(handle)["time_per_step"]
    assert recorded["file"] == "client_time_per_step.npy"
    assert np.array_equal(np.load(os.path.join(folder, recorded["file"])), speeds)
    for row, other in zip(result.rows, drawn):
        run_dir = os.path.join(folder, row["run_dir"])
        assert np.array_equal(np.load(os.path.join(run_dir, "client_time_per_step.npy")), speeds)
        assert row["virtual_time"] != other["virtual_time"]  # the given speeds, not the draws
        assert other["heterogeneity"] == "exp"  # as each summary says, with which speeds
        assert row["heterogeneity"] == f"given:{recorded['sha256'][:8]}"
        # a cell is the run jaxfl run makes of its config on these speeds, bit for bit
        alone = run_experiment(_cell_config(result, row, str(tmp_path / "alone")), time_per_step=speeds)
        assert alone.summary["virtual_time"] == row["virtual_time"]
        assert alone.summary["final_accuracy"] == row["final_accuracy"]
        assert events_without_wall_time(alone.run_dir) == events_without_wall_time(run_dir)
    # an interrupted cell resumes on them (cut back to its checkpoint after the first update)
    cut = os.path.join(folder, result.rows[1]["run_dir"])
    os.remove(os.path.join(cut, "summary.json"))
    shutil.rmtree(os.path.join(cut, "checkpoints", "ckpt-000002"))
    with open(os.path.join(cut, "checkpoints", "latest"), "w") as handle:
        handle.write("ckpt-000001\n")
    again = run_sweep(BASE, grid, folder, progress=False, time_per_step=speeds.tolist())
    assert (again.resumed, again.skipped) == ([1], [0])
    assert [row["virtual_time"] for row in again.rows] == [row["virtual_time"] for row in result.rows]
    # a folder holds the runs of one set of speeds: other ones, or none, are refused before any run
    before = _run_dirs(folder)
    with pytest.raises(ConfigError, match=r"sweep cell 0 \(algorithm=fedavg seed=0\): its run .* was made on given speeds "
                                          r"per step .*none are given now: give the same ones again"):
        run_sweep(BASE, grid, folder, progress=False)
    with pytest.raises(ConfigError, match="was made on other given speeds per step \\(or network"):
        run_sweep(BASE, grid, folder, progress=False, time_per_step=speeds * 2)
    with pytest.raises(ConfigError, match=r"\(a run of an earlier grid in this sweep folder\) was made on given"):
        run_sweep(BASE, {"algorithm": ["fedbuff"], "seed": [1]}, folder, progress=False)
    with pytest.raises(ConfigError, match="was made on drawn speeds, and time_per_step is given now"):
        run_sweep(BASE, GRID, sweep.sweep_dir, progress=False, time_per_step=speeds)
    assert _run_dirs(folder) == before
    # sweeps of two device fleets: one report tells their runs apart by the speeds
    fleet = run_sweep(BASE, {"algorithm": ["fedbuff"], "seed": [0]}, str(tmp_path / "fleet"), progress=False,
                      time_per_step=speeds[::-1])
    report = make_report([folder, fleet.sweep_dir], out=str(tmp_path / "fleets"), figures=False)
    assert fleet.rows[0]["heterogeneity"] != result.rows[0]["heterogeneity"]
    assert all(f"heterogeneity={row['heterogeneity']}" in report.markdown for row in (fleet.rows[0], result.rows[0]))
    # speeds that do not fit a cell name it, before the folder is made
    with pytest.raises(ValueError, match=r"sweep cell 1 \(clients=4\): time_per_step has shape \(3,\); expected \(4,\)"):
        run_sweep(BASE, {"clients": [3, 4]}, str(tmp_path / "misfit"), progress=False, time_per_step=speeds)
    assert not os.path.exists(tmp_path / "misfit")
    # the command line, its cells in workers (--jobs 2) reading the sweep's copy: the same schedules
    capsys.readouterr()
    flags = [*FLAGS, "--algorithm", "fedavg,fedbuff", "--seed", "0", "--jobs", "2"]  # the later flags win
    assert cli.main(["sweep", *flags, "--time-per-step", str(tmp_path / "speeds.npy"),
                     "--out", str(tmp_path / "workers")]) == 0
    in_workers = {os.path.basename(row["run_dir"]): row["virtual_time"] for row in read_results(str(tmp_path / "workers"))}
    assert in_workers == {os.path.basename(row["run_dir"]): row["virtual_time"] for row in result.rows}
    with pytest.raises(SystemExit) as refused:
        cli.main(["sweep", *flags, "--out", str(tmp_path / "workers")])
    assert refused.value.code == 2
    assert "none are given now: give the same ones again (jaxfl sweep --time-per-step FILE" in capsys.readouterr().err


def _cell_config(result, row, output_dir: str):
    """The config of ``row``'s cell of ``result``, written under ``output_dir`` instead."""
    import dataclasses

    cell = next(cell for cell in result.cells if cell.run_dir.endswith(row["run_dir"]))
    return dataclasses.replace(cell.config, output_dir=output_dir)


def test_bad_grid_values_fail_before_any_run(tmp_path, capsys):
    folder = str(tmp_path / "bad")
    with pytest.raises(ConfigError, match=r"sweep cell 1 \(algorithm=fedavg clients=0\): .*clients"):
        run_sweep(BASE, {"algorithm": ["fedavg"], "clients": [3, 0]}, folder, progress=False)
    with pytest.raises(ConfigError, match="grid seed=0 is not allowed: a list of values"):
        run_sweep(BASE, {"seed": 0}, folder, progress=False)
    with pytest.raises(ConfigError, match="unknown config field 'client'"):
        run_sweep(BASE, {"client": [3, 4]}, folder, progress=False)
    with pytest.raises(ConfigError, match=r"buffer_size=2 is not allowed: no cell of this sweep reads it"):
        run_sweep(BASE, {"algorithm": ["fedavg", "fedavgm"]}, folder, progress=False)
    with pytest.raises(ConfigError, match="output_dir is set by the sweep"):
        run_sweep({**BASE, "output_dir": "elsewhere"}, GRID, folder, progress=False)
    assert not os.path.exists(folder)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["sweep", "--clients", "3,x", "--out", folder])
    assert exit_.value.code == 2 and "--clients='x' is not an integer" in capsys.readouterr().err
    assert not os.path.exists(folder)


def test_cells_leave_out_fields_they_do_not_read_and_equal_cells_run_once():
    cells, notes = expand({"model": "mlp", "partition": "iid"},
                          {"algorithm": ["fedavg", "fedbuff"], "buffer_size": [2, 3],
                           "partition": ["iid", "dirichlet"], "dirichlet_alpha": [0.1, 1.0]}, "sweeps/x")
    labels = [cell.label() for cell in cells]
    assert labels == ["algorithm=fedavg partition=iid",
                      "algorithm=fedavg partition=dirichlet dirichlet_alpha=0.1",
                      "algorithm=fedavg partition=dirichlet dirichlet_alpha=1.0",
                      "algorithm=fedbuff buffer_size=2 partition=iid",
                      "algorithm=fedbuff buffer_size=2 partition=dirichlet dirichlet_alpha=0.1",
                      "algorithm=fedbuff buffer_size=2 partition=dirichlet dirichlet_alpha=1.0",
                      "algorithm=fedbuff buffer_size=3 partition=iid",
                      "algorithm=fedbuff buffer_size=3 partition=dirichlet dirichlet_alpha=0.1",
                      "algorithm=fedbuff buffer_size=3 partition=dirichlet dirichlet_alpha=1.0"]
    assert [cell.config.buffer_size for cell in cells[3:6]] == [2, 2, 2]
    assert len({cell.run_dir for cell in cells}) == 9
    assert notes == ["buffer_size applies only to the cells that read it (algorithm=fedbuff)",
                     "dirichlet_alpha applies only to the cells that read it (partition=dirichlet)"]
    # a field decided by the algorithm and a setting: the note names the swept axis that decides it
    _, notes = expand({"model": "mlp", "staleness_a": 0.3}, {"algorithm": ["fedavg", "fedasync"]}, "sweeps/x")
    assert notes == ["staleness_a applies only to the cells that read it (algorithm=fedasync)"]


def test_sweep_file_sizes_and_flags_over_it(tmp_path):
    path = tmp_path / "study.toml"
    path.write_text('model = "mlp"\n[client]\nlocal_steps = 5\n[grid]\nalgorithm = ["fedavg", "fedbuff"]\n'
                    'seed = [0, 1, 2]\n[sizes.quick]\nmax_updates = 3\n[sizes.quick.grid]\nseed = [0]\n')
    args = cli.build_parser().parse_args(["sweep", str(path), "--size", "quick", "--out", "x", "--clients", "4,8"])
    base, grid = cli._sweep_values(args)
    assert base == {"model": "mlp", "local_steps": 5, "max_updates": 3}
    assert grid == {"algorithm": ["fedavg", "fedbuff"], "seed": [0], "clients": [4, 8]}
    args = cli.build_parser().parse_args(["sweep", str(path), "--size", "full", "--out", "x"])
    with pytest.raises(ConfigError, match="size='full' is not allowed: sizes in .*: quick"):
        cli._sweep_values(args)


def test_an_option_s_alias_is_its_field_in_a_sweep(tmp_path):
    """--compass.lambda (jaxfl run takes it) was refused by jaxfl sweep, and a sweep file's
    "compass.lambda" axis stayed beside a --compass.latest-time-factor flag, which it outvoted."""
    def values(path, *flags):
        return cli._sweep_values(cli.build_parser().parse_args(["sweep", *([str(path)] if path else []),
                                                                 "--out", "x", *flags]))

    assert values(None, "--algorithm", "fedcompass", "--compass.lambda", "1.5,2.5") == (
        {"algorithm": "fedcompass"}, {"compass.latest_time_factor": [1.5, 2.5]})
    path = tmp_path / "study.toml"
    path.write_text('algorithm = "fedcompass"\n[grid]\n"compass.lambda" = [1.5, 2.5]\n')
    assert values(path, "--compass.latest-time-factor", "3.0") == (
        {"algorithm": "fedcompass", "compass.latest_time_factor": 3.0}, {})
    path.write_text('algorithm = "fedcompass"\n[compass]\nlambda = 1.5\nlatest_time_factor = 2.5\n')
    with pytest.raises(ConfigError, match=r"gives compass.latest_time_factor twice: \[compass\] lambda = 1.5 and "
                                          r"\[compass\] latest_time_factor = 2.5"):
        values(path)


def test_cutting_a_sweep_file_s_algorithms_leaves_out_the_settings_only_the_others_read(tmp_path, capsys):
    path = tmp_path / "study.toml"
    path.write_text('model = "mlp"\nbuffer_size = 3\n[compass]\nlatest_time_factor = 1.5\n'
                    '[grid]\nalgorithm = ["fedavg", "fedbuff", "fedcompass"]\n')

    def values(*flags):
        return cli._sweep_values(cli.build_parser().parse_args(["sweep", str(path), "--out", "x", *flags]))

    assert values() == ({"model": "mlp", "buffer_size": 3, "compass.latest_time_factor": 1.5},
                        {"algorithm": ["fedavg", "fedbuff", "fedcompass"]})
    assert capsys.readouterr().err == ""
    base, grid = values("--algorithm", "fedcompass")
    assert (base, grid) == ({"model": "mlp", "compass.latest_time_factor": 1.5, "algorithm": "fedcompass"}, {})
    assert "buffer_size from the sweep file: no cell of the grid the flags left reads it; left out" in capsys.readouterr().err
    # the cell is the one the whole file's grid runs, so a cut sweep reuses the whole one's runs
    whole, _ = expand(*values(), "sweeps/x")
    cut, _ = expand(base, grid, "sweeps/x")
    assert cut[0].run_dir == whole[2].run_dir and cut[0].config == whole[2].config
    base, grid = values("--algorithm", "fedavg,fedavgm")
    assert (base, grid) == ({"model": "mlp"}, {"algorithm": ["fedavg", "fedavgm"]})
    assert "buffer_size, compass.latest_time_factor from the sweep file" in capsys.readouterr().err
    # a setting the user typed, or one the file's own grid never reads, is still a mistake
    with pytest.raises(ConfigError, match=r"buffer_size=4 is not allowed: no cell of this sweep reads it"):
        expand(*values("--algorithm", "fedavg", "--buffer-size", "4"), "sweeps/x")
    path.write_text('model = "mlp"\nbuffer_size = 3\n[grid]\nalgorithm = ["fedavg", "fedavgm"]\n')
    with pytest.raises(ConfigError, match=r"buffer_size=3 is not allowed: no cell of this sweep reads it"):
        expand(*values("--algorithm", "fedavg"), "sweeps/x")
    # so is an axis of the file's grid that only the cut-away methods read (FedASMU's ablations)
    path.write_text('model = "mlp"\n[grid]\nalgorithm = ["fedavg", "fedasmu"]\n"fedasmu.fetch" = [true, false]\n')
    whole, _ = expand(*values(), "sweeps/x")
    base, grid = values("--algorithm", "fedavg")
    assert (base, grid) == ({"model": "mlp", "algorithm": "fedavg"}, {})
    assert "fedasmu.fetch from the sweep file: no cell of the grid the flags left reads it" in capsys.readouterr().err
    cut, _ = expand(base, grid, "sweeps/x")
    assert [cell.run_dir for cell in cut] == [whole[0].run_dir]
    assert values("--algorithm", "fedavg,fedasmu")[1] == {"fedasmu.fetch": [True, False],
                                                         "algorithm": ["fedavg", "fedasmu"]}
    with pytest.raises(ConfigError, match=r"fedasmu.fetch=\[True, False\] is not allowed: no cell of this sweep"):
        expand(*values("--algorithm", "fedavg", "--fedasmu.fetch", "true,false"), "sweeps/x")


def test_sweep_flag_of_a_boolean_algorithm_option_is_a_bool_axis(capsys):
    args = cli.build_parser().parse_args(["sweep", "--out", "x", "--algorithm", "port",
                                          "--port.urgent-pull", "true,False"])
    base, grid = cli._sweep_values(args)
    assert grid["port.urgent_pull"] == [True, False]
    args = cli.build_parser().parse_args(["sweep", "--out", "x", "--port.urgent-pull", "false"])
    assert cli._sweep_values(args)[0]["port.urgent_pull"] is False
    args = cli.build_parser().parse_args(["sweep", "--out", "x", "--port.urgent-pull", "yes"])
    with pytest.raises(argparse.ArgumentTypeError, match="--port.urgent-pull='yes' is not true or false"):
        cli._sweep_values(args)


def _write_results(folder, rows):
    """A results.csv of hand-made rows: their columns in order, with a cell index, a target of 80%
    and a run directory unless a row gives its own."""
    columns = list(dict.fromkeys(["cell", *(name for row in rows for name in row), "target_accuracy", "run_dir"]))
    with open(os.path.join(folder, "results.csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        for index, row in enumerate(rows):
            writer.writerow({"cell": index, "target_accuracy": 0.8, "run_dir": f"runs/{index}", **row})


def test_report_relative_times_and_dash_rules_by_hand(tmp_path):
    # clients=5: fedavg reaches in every seed (mean 100 s); fedbuff in 2 of 3 (mean 40 s; against
    # fedavg's 90 s in the same two seeds: 0.44, not 0.40);
    # fedasync in 1 of 3 (missed in at least half: "–"). clients=10: the reference misses in 2 of
    # 3 ("–", so fedbuff's mean 60 s has no ratio: "n/a"), fedasync never reaches.
    times = {(5, "fedavg"): [100, 80, 120], (5, "fedbuff"): [30, 50, None], (5, "fedasync"): [10, None, None],
             (10, "fedavg"): [200, None, None], (10, "fedbuff"): [50, 70, 60], (10, "fedasync"): [None] * 3}
    best = {"fedavg": [0.90, 0.92, 0.94], "fedbuff": [0.85, 0.85, 0.88], "fedasync": [0.70, 0.80, 0.90]}
    rows = [{"algorithm": algorithm, "clients": clients, "seed": seed, "time_to_target": spread[seed],
             "best_accuracy": best[algorithm][seed]}
            for (clients, algorithm), spread in times.items() for seed in range(3)]
    _write_results(str(tmp_path), rows)
    report = make_report(str(tmp_path), figures=False)
    found = {(line["clients"], line["method"]): line for line in report.rows}
    assert found[5, "fedbuff"]["relative_time"] == pytest.approx(80 / 180)
    assert found[5, "fedbuff"]["time_to_target_mean"] == 40.0 and found[5, "fedbuff"]["reached"] == 2
    assert found[5, "fedasync"]["time_to_target_mean"] is None and found[5, "fedasync"]["relative_time"] is None
    assert found[10, "fedavg"]["time_to_target_mean"] is None
    assert found[10, "fedbuff"]["time_to_target_mean"] == 60.0 and found[10, "fedbuff"]["relative_time"] is None
    assert found[5, "fedavg"]["best_accuracy_mean"] == pytest.approx(0.92)
    assert found[5, "fedavg"]["best_accuracy_std"] == pytest.approx(math.sqrt(0.0008 / 3))
    lines = report.markdown.splitlines()
    assert "| method | clients=5 | clients=10 |" in lines
    assert "| fedavg | 1.00 (100.0 s) | – |" in lines
    assert "| fedbuff | 0.44 (40.0 s) [2 of 3 reached] | n/a (60.0 s) |" in lines  # its 40 s: of 2 seeds
    assert "| fedasync | – | – |" in lines
    assert "| fedavg | 0.9200 ± 0.0163 | 0.9200 ± 0.0163 |" in lines
    assert "Time to first reach 80% held-out accuracy, relative to fedavg" in report.markdown
    # seed by seed: each seed's time over the reference's in that seed, the reference's own times
    assert "## Time to first reach 80% held-out accuracy, seed by seed (seed 0 / 1 / 2)" in lines
    assert "| fedavg | 100 s / 80 s / 120 s | 200 s / – / – |" in lines
    assert "| fedbuff | 0.30 / 0.62 / – | 0.25 / n/a / n/a |" in lines
    assert "| fedasync | 0.10 / – / – | – / – / – |" in lines
    with open(report.table, newline="") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == 6
    assert [(row["relative_time_seed0"], row["relative_time_seed1"], row["relative_time_seed2"])
            for row in table if row["method"] == "fedbuff"] == [("0.3", "0.625", ""), ("0.25", "", "")]
    relative = make_report(str(tmp_path), reference="fedbuff", out=str(tmp_path / "vs-fedbuff"), figures=False)
    assert "| fedavg | 2.25 (100.0 s) | – |" in relative.markdown.splitlines()  # seeds 0 and 1: 180 s / 80 s
    with pytest.raises(ValueError, match=r"reference='fedprox' is not allowed: one of the sweep's methods "
                                         r"\(fedavg, fedbuff, fedasync\)"):
        make_report(str(tmp_path), reference="fedprox", out=str(tmp_path / "never"))
    assert not os.path.exists(tmp_path / "never")


def test_relative_times_compare_the_seeds_both_reached(tmp_path):
    # a method 2-2.5x slower than the reference in each seed it reaches, missing the one seed where
    # everything is slow: the ratio of each one's own mean (425 s / 467 s = 0.91) would call it
    # faster; over the seeds both reached it is 850 s / 400 s
    times = {"fedavg": [300.0, 1000.0, 100.0], "fedbuff": [600.0, None, 250.0]}
    _write_results(str(tmp_path), [{"algorithm": algorithm, "seed": seed, "time_to_target": spread[seed],
                                    "best_accuracy": 0.9} for algorithm, spread in times.items() for seed in range(3)])
    report = make_report(str(tmp_path), figures=False)
    found = {line["method"]: line for line in report.rows}
    assert found["fedbuff"]["relative_time"] == pytest.approx(850 / 400)
    assert found["fedbuff"]["time_to_target_mean"] == pytest.approx(425.0)
    assert "| fedbuff | 2.12 (425.0 s) [2 of 3 reached] |" in report.markdown.splitlines()
    assert "over the seeds where both the method and fedavg reached it" in report.markdown


def test_the_seed_by_seed_table_names_each_seed_where_groups_ran_different_ones(tmp_path):
    # clients=5 ran seeds 0 and 1 (fedbuff only seed 1: "·" for seed 0), clients=10 seeds 1 and 2;
    # a sweep of one seed has no such table
    runs = [(5, "fedavg", 0, 100.0), (5, "fedavg", 1, 50.0), (5, "fedbuff", 1, 25.0),
            (10, "fedavg", 1, 80.0), (10, "fedavg", 2, 40.0), (10, "fedbuff", 1, 20.0), (10, "fedbuff", 2, None)]
    rows = [{"algorithm": algorithm, "clients": clients, "seed": seed, "time_to_target": time, "best_accuracy": 0.9}
            for clients, algorithm, seed, time in runs]
    _write_results(str(tmp_path), rows)
    lines = make_report(str(tmp_path), figures=False).markdown.splitlines()
    assert "## Time to first reach 80% held-out accuracy, seed by seed" in lines
    assert "| fedavg | 0: 100 s / 1: 50 s | 1: 80 s / 2: 40 s |" in lines
    assert "| fedbuff | 0: · / 1: 0.50 | 1: 0.25 / 2: – |" in lines
    os.makedirs(tmp_path / "one-seed")
    _write_results(str(tmp_path / "one-seed"), [row for row in rows if row["seed"] == 1])
    assert "seed by seed" not in make_report(str(tmp_path / "one-seed"), figures=False).markdown


def test_a_setting_every_algorithm_reads_is_a_group_with_its_reference(tmp_path):
    # CC-FedAvg's Table II: participation (clients_per_round, read by FedAvg and CC-FedAvg alike) is a
    # column, the strategies (cc.strategy, CC-FedAvg's own) are methods; each participation has its
    # FedAvg reference, and the final accuracy comes with the computation spent relative to it
    runs = [("fedavg", None, 10, [100, 120], [0.80, 0.82], 800), ("fedavg", None, 20, [50, 70], [0.83, 0.83], 1600),
            ("ccfedavg", "cc", 10, [110, 130], [0.78, 0.80], 380), ("ccfedavg", "cc", 20, [90, None], [0.81, 0.83], 760),
            ("ccfedavg", "strategy1", 10, [None, None], [0.40, 0.50], 380),
            ("ccfedavg", "strategy1", 20, [300, 330], [0.79, 0.77], 760)]
    _write_results(str(tmp_path), [
        {"algorithm": algorithm, "seed": seed, "cc.strategy": strategy, "clients_per_round": per_round,
         "target_accuracy": 0.75, "time_to_target": times[seed], "best_accuracy": finals[seed] + 0.01,
         "final_accuracy": finals[seed], "client_steps_executed": steps + seed * 20}
        for algorithm, strategy, per_round, times, finals, steps in runs for seed in (0, 1)])
    rows = read_results(str(tmp_path))
    assert group_columns(rows) == ["clients_per_round"]
    report = make_report(str(tmp_path), figures=False)
    found = {(line["clients_per_round"], line["method"]): line for line in report.rows}
    assert sorted(found) == sorted((m, name) for m in (10, 20) for name in
                                   ("fedavg", "ccfedavg cc.strategy=cc", "ccfedavg cc.strategy=strategy1"))
    assert found[10, "ccfedavg cc.strategy=cc"]["relative_time"] == pytest.approx(120 / 110)
    assert found[20, "ccfedavg cc.strategy=strategy1"]["relative_time"] == pytest.approx(315 / 60)
    assert found[20, "ccfedavg cc.strategy=cc"]["relative_steps"] == pytest.approx(770 / 1610)
    assert found[10, "fedavg"]["final_accuracy_mean"] == pytest.approx(0.81)
    lines = report.markdown.splitlines()
    assert "| method | clients_per_round=10 | clients_per_round=20 |" in lines
    assert "| ccfedavg cc.strategy=strategy1 | – | 5.25 (315.0 s) |" in lines
    assert "## Final held-out accuracy, mean ± std over seeds, and computation relative to fedavg" in lines
    assert "| fedavg | 0.8100 ± 0.0100 (1.00×) | 0.8300 ± 0.0000 (1.00×) |" in lines
    assert "| ccfedavg cc.strategy=strategy1 | 0.4500 ± 0.0500 (0.48×) | 0.7800 ± 0.0100 (0.48×) |" in lines
    assert "stopped at the target" not in report.markdown  # these ran their whole budget
    # the final accuracy seed by seed, as a difference to FedAvg's in the same seed
    assert "## Final held-out accuracy, seed by seed: difference to fedavg (seed 0 / 1)" in lines
    assert "| fedavg | 0.8000 / 0.8200 | 0.8300 / 0.8300 |" in lines
    assert "| ccfedavg cc.strategy=strategy1 | -0.400 / -0.320 | -0.040 / -0.060 |" in lines
    with open(report.table, newline="") as handle:
        table = {(row["clients_per_round"], row["method"]): row for row in csv.DictReader(handle)}
    assert float(table["20", "ccfedavg cc.strategy=strategy1"]["final_accuracy_seed1"]) == pytest.approx(0.77)
    assert "last tenth" not in report.markdown  # no run has it, and there are no run folders to compute it from
    stopped = [{**row, "stop_reason": "target reached"} for row in rows]
    assert "Runs that stopped at the target end there: their final accuracy is the one that reached it" in \
        format_markdown(summarise(stopped), ["clients_per_round"], "fedavg", "75%")
    # a single algorithm's sweep over the same setting compares its variants: one method each
    alone = [row for row in rows if row["algorithm"] == "fedavg"]
    assert group_columns(alone) == []
    assert [line["method"] for line in summarise(alone, reference="fedavg clients_per_round=10")] == [
        "fedavg clients_per_round=10", "fedavg clients_per_round=20"]


def _strip_last_tenth_accuracy(folder):
    """The results.csv of ``folder`` as a sweep wrote it before last_tenth_accuracy was a column."""
    path = os.path.join(folder, "results.csv")
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, [name for name in rows[0] if name != "last_tenth_accuracy"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def test_the_last_tenth_accuracy_comes_from_the_metrics_of_runs_from_before_it_was_a_column(sweep, tmp_path):
    old = str(tmp_path / "old")
    shutil.copytree(sweep.sweep_dir, old)
    for row in sweep.rows:
        path = os.path.join(old, row["run_dir"], "summary.json")
        with open(path) as handle:
            summary = json.load(handle)
        del summary["last_tenth_accuracy"], summary["log_bytes"]  # neither was written then
        with open(path, "w") as handle:
            json.dump(summary, handle)
    _strip_last_tenth_accuracy(old)
    # fedavg seed 0 evaluated 20 times: its last tenth is the last two, 0.7 and 0.9
    with open(os.path.join(old, sweep.rows[0]["run_dir"], "metrics.csv"), "w") as handle:
        handle.write("time,version,accuracy\n" + "".join(f"{t}.0,{t},{a}\n" for t, a in enumerate([0.5] * 18 + [0.7, 0.9])))
    finals = {(row["algorithm"], row["seed"]): row["final_accuracy"] for row in sweep.rows}

    report = make_report(old, figures=False)
    found = {line["method"]: line for line in report.rows}
    assert found["fedavg"]["last_tenth_accuracy_mean"] == pytest.approx((0.8 + finals["fedavg", 1]) / 2)
    assert found["fedbuff"]["last_tenth_accuracy_mean"] == pytest.approx((finals["fedbuff", 0] + finals["fedbuff", 1]) / 2)
    assert "## Held-out accuracy over the last tenth of the evaluations, mean ± std over seeds" in report.markdown
    assert "## Held-out accuracy over the last tenth of the evaluations, seed by seed: difference to fedavg (seed 0 / 1)" \
        in report.markdown
    assert f"| fedavg | 0.8000 / {finals['fedavg', 1]:.4f} |" in report.markdown.splitlines()

    # the same sweep call again trains nothing and writes the column from the runs' metrics
    again = run_sweep(BASE, GRID, old, progress=False)
    assert again.ran == [] and again.skipped == [0, 1, 2, 3]
    assert read_results(old)[0]["last_tenth_accuracy"] == pytest.approx(0.8)

    # a row with neither the column nor its run folder: left out of the mean, and the table says so
    _strip_last_tenth_accuracy(old)
    shutil.rmtree(os.path.join(old, sweep.rows[3]["run_dir"]))
    lines = make_report(old, out=str(tmp_path / "partial"), figures=False).markdown.splitlines()
    header = next(line for line in lines if line.startswith("## Held-out accuracy over the last tenth"))
    table = lines[lines.index(header):]
    assert f"| fedbuff | {finals['fedbuff', 0]:.4f} ± 0.0000 (1 of 2 runs) |" in table
    assert any(line.startswith("| fedavg | 0.") and "runs)" not in line for line in table)
    # neither fedbuff run has it: "n/a", not an empty cell
    shutil.rmtree(os.path.join(old, sweep.rows[2]["run_dir"]))
    lines = make_report(old, out=str(tmp_path / "none"), figures=False).markdown.splitlines()
    table = lines[lines.index(header):]
    assert "| fedbuff | n/a |" in table and "n/a: none does" in "\n".join(table)


def test_report_writes_the_figures(sweep, tmp_path, capsys):
    out = str(tmp_path / "report")
    assert cli.main(["report", sweep.sweep_dir, "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "| fedbuff |" in printed and "figures:" in printed
    names = sorted(os.listdir(out))
    assert names == ["accuracy.png", "accuracy_vs_steps.png", "report.csv", "report.md", "staleness.png",
                     "time_to_target.png", "timeline-fedavg.png", "timeline-fedbuff.png"]
    for name in names:
        if name.endswith(".png"):
            with open(os.path.join(out, name), "rb") as handle:
                assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert len(read_results(sweep.sweep_dir)) == 4


def test_the_computation_curve_counts_the_steps_delivered_by_each_evaluation(sweep, tmp_path):
    # by hand: two arrivals by t = 10 (5 + 3 steps, one of them later dropped as stale: still
    # computed), a dispatch (not computation yet), a pulled partial update of 2 steps at t = 12
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text("time,version,accuracy\n0.0,0,0.1\n10.0,1,0.4\n11.0,1,0.4\n12.0,2,0.6\n")
    (run_dir / "events.csv").write_text(
        "time,event,client,dispatch,version,staleness,steps,detail,wall_time\n"
        "0.0,dispatch,0,0,0,,5,,\n0.0,dispatch,1,1,0,,3,,\n4.0,arrival,1,1,0,0,3,,\n"
        "10.0,arrival,0,0,0,0,5,,\n10.0,drop,0,0,0,1,5,staler than max_staleness,\n"
        "10.0,dispatch,1,2,1,,5,,\n12.0,arrival,1,2,1,1,2,pulled: 2 of 5 steps,\n")
    steps, accuracy = computation_curve(str(run_dir))
    assert steps.tolist() == [0.0, 8.0, 8.0, 10.0] and accuracy.tolist() == [0.1, 0.4, 0.4, 0.6]
    # real runs: never decreasing; a synchronous run's last evaluation has every executed step
    for row in sweep.rows:
        steps, _ = computation_curve(os.path.join(sweep.sweep_dir, row["run_dir"]))
        assert steps[0] == 0 and (np.diff(steps) >= 0).all()
        if row["algorithm"] == "fedavg":
            assert steps[-1] == row["client_steps_executed"] == 3 * 2 * 2


def test_a_timing_only_sweep_s_report_draws_no_empty_accuracy_figures(tmp_path):
    result = run_sweep({"timing_only": True, "clients": 50, "max_updates": 20, "buffer_size": 3},
                       {"algorithm": ["fedavg", "fedbuff"]}, str(tmp_path / "sweep"), progress=False)
    assert [row["best_accuracy"] for row in result.rows] == [None, None]
    report = make_report(result.sweep_dir)
    assert sorted(os.path.basename(path) for path in report.figures) == [
        "staleness.png", "timeline-fedavg.png", "timeline-fedbuff.png"]  # no time to a target they never had


def test_the_example_sweep_file_expands_at_both_sizes():
    from jaxfl.sweep import load_sweep_file

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                        "sweep_quickstart.toml")
    full, notes = expand(*load_sweep_file(path), "sweeps/full")
    quick, _ = expand(*load_sweep_file(path, "quick"), "sweeps/quick")
    assert (len(full), len(quick)) == (4 * 2 * 4, 3 * 1 * 2)
    assert "speed_reference_time applies only to the cells that read it (heterogeneity=pareto)" in notes
    assert {cell.config.target_accuracy for cell in full} == {0.85}


def test_without_pyarrow_the_results_are_csv_alone(tmp_path, monkeypatch):
    import jaxfl.runlog
    from jaxfl.sweep import write_results

    rows = [{"cell": 0, "algorithm": "fedavg", "best_accuracy": 0.5}, {"cell": 1, "algorithm": "fedbuff",
                                                                        "best_accuracy": None}]
    monkeypatch.setattr(jaxfl.runlog, "_pyarrow", lambda: None)  # a Python without pyarrow (a bare GPU machine)
    table, parquet = write_results(rows, str(tmp_path))
    assert parquet is None and not (tmp_path / "results.parquet").exists()
    assert [row["algorithm"] for row in read_results(str(tmp_path))] == ["fedavg", "fedbuff"]
    monkeypatch.undo()
    assert write_results(rows, str(tmp_path))[1] == str(tmp_path / "results.parquet")


def test_a_report_of_several_folders_is_one_table_with_every_run_s_figures(sweep, tmp_path, capsys):
    # seed 2 run apart (another machine, another session) into a folder of its own: one report of both
    # folders has three seeds a method, and its figures find each run in its folder
    more = str(tmp_path / "more")
    run_sweep({**BASE, "checkpoint_every": None}, {"algorithm": ["fedavg", "fedbuff"], "seed": [2]}, more,
              progress=False)
    out = str(tmp_path / "both")
    assert cli.main(["report", sweep.sweep_dir, more, "--out", out]) == 0
    with open(os.path.join(out, "report.csv"), newline="") as handle:
        lines = list(csv.DictReader(handle))
    assert [(line["method"], line["runs"]) for line in lines] == [("fedavg", "3"), ("fedbuff", "3")]
    alone = make_report(sweep.sweep_dir, out=str(tmp_path / "alone"), figures=False)
    assert [line["runs"] for line in alone.rows] == [2, 2]
    assert "timeline-fedbuff.png" in os.listdir(out) and "figures:" in capsys.readouterr().out
    # the same runs twice (a folder copied, or given twice) would count them twice: refused, naming both
    copy = str(tmp_path / "copy")
    shutil.copytree(more, copy)
    with pytest.raises(SystemExit) as exited:
        cli.main(["report", sweep.sweep_dir, more, copy, "--out", str(tmp_path / "never")])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "the run algorithm=fedavg" in error and "seed=2" in error
    assert f"is in both {more!r} and {copy!r}: give each run once" in error
    with pytest.raises(ValueError, match=r"names the results of .* more than once: give each folder \(or its results.csv\) once"):
        make_report([more, more + "/"], out=str(tmp_path / "never"))
    with pytest.raises(ValueError, match="more than once"):  # a folder and its own results.csv: the same runs
        make_report([more, os.path.join(more, "results.csv")], out=str(tmp_path / "never"))
    assert not os.path.exists(tmp_path / "never")


def test_a_grid_run_in_parts_reports_its_groups_in_the_grid_s_order(tmp_path):
    # CC-FedAvg's participations 10, 20 in one folder, then 30 and 60 in another (given first):
    # the columns ascend, and the partition (the axis that changes fastest) stays innermost
    def part(folder, participations):
        os.makedirs(folder)
        _write_results(folder, [{"algorithm": algorithm, "clients_per_round": m, "partition": partition, "seed": 0,
                                 "time_to_target": 10.0, "best_accuracy": 0.9}
                                for m in participations for partition in ("shards", "iid")
                                for algorithm in ("fedavg", "ccfedavg")])
    part(str(tmp_path / "more"), [30, 60])
    part(str(tmp_path / "main"), [10, 20])
    report = make_report([str(tmp_path / "more"), str(tmp_path / "main")], out=str(tmp_path / "out"), figures=False)
    assert list(dict.fromkeys((line["clients_per_round"], line["partition"]) for line in report.rows)) == [
        (10, "shards"), (10, "iid"), (20, "shards"), (20, "iid"), (30, "shards"), (30, "iid"), (60, "shards"),
        (60, "iid")]
    header = report.markdown.splitlines()[[line.startswith("| method") for line in report.markdown.splitlines()].index(True)]
    assert header.startswith("| method | clients_per_round=10, partition=shards | clients_per_round=10, partition=iid |")


def test_a_results_table_holding_a_run_twice_is_refused_not_counted_as_two_seeds(sweep, tmp_path, capsys):
    # a table joined from parts by hand counted its repeated run twice: 4 runs of a 2-seed method
    with open(os.path.join(sweep.sweep_dir, "results.csv")) as handle:
        lines = handle.read().splitlines()
    joined = tmp_path / "joined.csv"
    joined.write_text("\n".join([*lines, lines[-1]]) + "\n")
    with pytest.raises(SystemExit) as exited:
        cli.main(["report", str(joined), "--no-figures", "--out", str(tmp_path / "never")])
    assert exited.value.code == 2 and not os.path.exists(tmp_path / "never")
    assert f"has two rows in {str(joined)!r}: give each run once" in capsys.readouterr().err


def test_a_seed_the_reference_has_no_run_of_shows_the_method_s_own_figure_not_a_miss(sweep, tmp_path):
    # "n/a = fedavg did" stood beside a seed fedavg had no run of, when a new seed is reported beside an old reference
    with open(os.path.join(sweep.sweep_dir, "results.csv")) as handle:
        rows = list(csv.DictReader(handle))
    kept = [row for row in rows if not (row["algorithm"] == "fedavg" and row["seed"] == "1")]
    table = tmp_path / "noref.csv"
    with open(table, "w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(kept)
    markdown = make_report(str(table), out=str(tmp_path / "r"), figures=False).markdown
    fedbuff = {row["seed"]: row for row in kept if row["algorithm"] == "fedbuff"}
    seed_rows = [line for line in markdown.splitlines() if line.startswith("| fedbuff | ") and " / " in line]
    assert seed_rows[0].endswith(f"/ ({_whole_seconds(float(fedbuff['1']['time_to_target']))} s) |")  # time to target
    assert seed_rows[1].endswith(f"/ ({float(fedbuff['1']['final_accuracy']):.4f}) |")  # final accuracy
    assert all(not line.endswith("/ n/a |") for line in seed_rows)
    assert "has no run of that seed: the method's own" in markdown
    # where every seed has its reference, the notes do not explain cells the tables do not show
    full = make_report(sweep.sweep_dir, out=str(tmp_path / "full"), figures=False).markdown
    seed_notes = [line for line in full.splitlines() if line.startswith("Each seed's")]
    assert seed_notes and not any("has no run of that seed" in line or "· = no run" in line for line in seed_notes)


def test_a_results_csv_file_stands_for_its_sweep_folder(sweep, tmp_path, capsys):
    # a results table kept apart from its runs (committed, mailed): the tables from it alone
    kept = tmp_path / "kept"
    kept.mkdir()
    table = str(kept / "seeds01.csv")
    shutil.copy(os.path.join(sweep.sweep_dir, "results.csv"), table)
    from_folder = make_report(sweep.sweep_dir, out=str(tmp_path / "from-folder"), figures=False)
    assert cli.main(["report", table, "--no-figures"]) == 0  # default out: beside the file, named after it
    assert "| fedbuff |" in capsys.readouterr().out
    with open(kept / "seeds01-report" / "report.md") as handle:
        assert handle.read() == from_folder.markdown + "\n"
    # its runs are not beside it: the figures are refused before anything is written, naming the way out
    with pytest.raises(SystemExit) as exited:
        cli.main(["report", table, "--out", str(tmp_path / "never")])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "is missing: the figures need the runs (jaxfl report --no-figures" in error
    assert not os.path.exists(tmp_path / "never")
    # --table-figures: the tables and the one figure the table alone makes, the bars of time to target
    assert cli.main(["report", table, "--table-figures", "--out", str(tmp_path / "bars")]) == 0
    assert "figures:\n  " + str(tmp_path / "bars" / "time_to_target.png") in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path / "bars")) == ["report.csv", "report.md", "time_to_target.png"]
    with open(tmp_path / "bars" / "report.md") as handle:
        assert handle.read() == from_folder.markdown + "\n"
    with pytest.raises(ValueError, match=r"figures='tables' is not allowed: True \(every figure\), False \(none\) "
                                         r"or 'table'"):
        make_report(table, out=str(tmp_path / "never"), figures="tables")
    with pytest.raises(SystemExit) as exited:
        cli.main(["report", table, "--no-figures", "--table-figures"])
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "never")
    # the results.csv in its sweep folder finds the runs there: figures too, default out SWEEP_DIR/report
    figures = make_report(os.path.join(sweep.sweep_dir, "results.csv"), out=str(tmp_path / "beside")).figures
    assert os.path.basename(figures[-1]) == "timeline-fedbuff.png"
    # what is neither a sweep folder nor a CSV file: named, with what is allowed
    (kept / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"notes.txt' is not allowed: a folder written by jaxfl sweep, or a results "
                                         r"table ending in .csv"):
        make_report(str(kept / "notes.txt"), figures=False)
    with pytest.raises(FileNotFoundError, match=r"gone.csv' does not exist"):
        make_report([sweep.sweep_dir, str(kept / "gone.csv")], out=str(tmp_path / "never"), figures=False)
    assert not os.path.exists(tmp_path / "never")


def test_report_panels_split_the_figures_by_a_method_setting(tmp_path, capsys):
    # fedbuff at two buffer sizes beside fedavg (which reads no buffer): one panel per buffer size,
    # fedavg in both
    folder = str(tmp_path / "sweep")
    run_sweep({**BASE, "checkpoint_every": None}, {"algorithm": ["fedavg", "fedbuff"], "buffer_size": [1, 2]}, folder,
              progress=False)
    with pytest.raises(SystemExit) as exited:
        cli.main(["report", folder, "--panels", "port.min_clients", "--out", str(tmp_path / "never")])
    assert exited.value.code == 2
    assert "panels='port.min_clients' is not allowed: one of the swept settings of a method (buffer_size)" \
        in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "never")
    plain = make_report(folder, out=str(tmp_path / "plain"))
    split = make_report(folder, out=str(tmp_path / "split"), panels="buffer_size")
    import matplotlib.image

    for name in ("accuracy.png", "time_to_target.png"):
        one = matplotlib.image.imread(os.path.join(tmp_path / "plain", name))
        two = matplotlib.image.imread(os.path.join(tmp_path / "split", name))
        assert two.shape[1] > 1.2 * one.shape[1]  # two panels across instead of one
    assert len(split.figures) == len(plain.figures)


def _drawn_figure(monkeypatch, draw):
    """The one matplotlib figure ``draw()`` saves through the report's ``_save`` (still written to disk)."""
    from jaxfl import report

    saved = []
    original = report._save
    monkeypatch.setattr(report, "_save", lambda figure, path: saved.append(figure) or original(figure, path))
    draw()
    (figure,) = saved
    return figure


def test_panelled_figures_stay_readable_width_and_share_one_legend(tmp_path, monkeypatch):
    # PORT's full grid: five panels (K) of nine methods over two speed models. The figure was 36
    # inches wide with a legend in each panel over its bars, and the methods that missed the target
    # everywhere were in no legend
    from matplotlib.figure import Figure

    from jaxfl import report

    lines, methods = [], ["fedavg", "fedasync"] + [f"port k={k} b={b}" for k in (1, 5, 10, 15, 20) for b in range(7)]
    for speeds in ("pareto", "zipf"):
        for method in methods:
            reached = None if method == "fedasync" else 1000.0
            lines.append({"heterogeneity": speeds, "method": method, "time_to_target_mean": reached,
                          "time_to_target_std": None})
    panels = {method: (None if not method.startswith("port") else int(method.split()[1][2:])) for method in methods}
    figure = _drawn_figure(monkeypatch, lambda: report.plot_time_to_target(
        lines, ["heterogeneity"], str(tmp_path / "t.png"), panels=panels, panel_column="k"))
    assert isinstance(figure, Figure) and figure.get_figwidth() <= 16.0
    assert [axes.get_legend() for axes in figure.axes] == [None] * len(figure.axes)  # none inside a panel
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == ["fedavg", "fedasync"] + [f"port b={b}" for b in range(7)]


def test_many_groups_of_time_to_target_bars_wrap_into_rows_with_every_group_once(tmp_path, monkeypatch):
    # FedCompass's cpu grid: twelve settings (m × speeds × partition) of eight methods made one row of
    # 96 bars, a figure 70 inches wide
    from jaxfl import report

    methods = ["fedavg", "fedavgm", "fedasync", "fedbuff", "fedat", "fedcompass", "fedcompass_m", "fedcompass_n"]
    settings = [(m, speeds, partition) for m in (5, 10) for speeds in ("homo", "normal", "exp")
                for partition in ("class", "dual_dirichlet")]
    lines = [{"clients": m, "heterogeneity": speeds, "partition": partition, "method": method,
              "time_to_target_mean": None if method == "fedasync" else 100.0 * number, "time_to_target_std": None}
             for number, (m, speeds, partition) in enumerate(settings, 1) for method in methods]
    figure = _drawn_figure(monkeypatch, lambda: report.plot_time_to_target(
        lines, ["clients", "heterogeneity", "partition"], str(tmp_path / "t.png")))
    rows = [axes for axes in figure.axes if axes.axison]
    assert len(rows) == 4 and figure.get_figwidth() <= 12.0  # 24 bars a row: three settings of eight methods
    ticks = [tick.get_text() for axes in rows for tick in axes.get_xticklabels()]
    assert ticks == [f"clients={m}\nheterogeneity={speeds}\npartition={partition}" for m, speeds, partition in settings]
    heights = sorted(round(patch.get_height()) for axes in rows for patch in axes.patches if patch.get_height() > 0)
    assert heights == sorted(100 * number for number in range(1, 13) for _ in range(7))  # fedasync missed: no bar
    assert sum(text.get_text().strip() == "missed" for axes in rows for text in axes.texts) == 12
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == methods


def test_staleness_panels_of_a_design_space_keep_whole_updates_and_readable_titles(tmp_path, monkeypatch):
    # PORT's full grid: a synchronous cell's one bar at 0 was drawn on ticks -0.4 ... 0.4, and 43
    # names like "port port.min_clients=10 port.staleness_bound=inf port.urgent_pull=True: 3 runs,
    # mean 1.02" ran into the neighbouring panels' titles
    from jaxfl import report

    histograms = {"fedavg": {"0": 40}, "fedasync": {"3": 5, "17": 30, "40": 2},
                  "port port.min_clients=10 port.staleness_bound=inf port.urgent_pull=True": {"0": 9, "1": 20, "4": 1},
                  "port port.min_clients=20 port.staleness_bound=1 port.urgent_pull=False": {}}
    runs_by_method = {}
    for number, (method, histogram) in enumerate(histograms.items()):
        os.makedirs(tmp_path / "runs" / str(number))
        with open(tmp_path / "runs" / str(number) / "summary.json", "w") as handle:
            json.dump({"timeline": {"staleness_histogram": histogram}}, handle)
        runs_by_method[method] = [{"cell": number, "run_dir": f"runs/{number}"}]
    figure = _drawn_figure(monkeypatch, lambda: report.plot_staleness(
        runs_by_method, str(tmp_path), str(tmp_path / "staleness.png")))
    panels = [axes for axes in figure.axes if axes.axison]
    titles = [axes.get_title() for axes in panels]
    assert titles[:2] == ["fedavg: 1 run, mean 0.00", "fedasync: 1 run, mean 16.35"]  # (3·5 + 17·30 + 40·2) / 37
    assert titles[2] == "port min_clients=10 staleness_bound=inf\nurgent_pull=True: 1 run, mean 0.80"  # (20 + 4) / 30
    assert titles[3].replace("\n", " ") == "port min_clients=20 staleness_bound=1 urgent_pull=False: no aggregated updates"
    assert all(len(line) <= 48 for title in titles for line in title.splitlines())
    for axes, histogram in zip(panels, histograms.values()):
        ticks = [tick for tick in axes.get_xticks() if axes.get_xlim()[0] <= tick <= axes.get_xlim()[1]]
        assert ticks == [round(tick) for tick in ticks] and ticks[0] == 0 and len(ticks) >= 2  # whole updates only
        assert axes.get_xlim()[1] >= max([1, *map(int, histogram)])
        assert sorted((round(bar.get_x() + bar.get_width() / 2), round(bar.get_height())) for bar in axes.patches) == \
            sorted((int(staleness), number) for staleness, number in histogram.items())


def test_a_sweep_over_other_values_in_the_same_folder_names_the_runs_its_table_leaves_out(tmp_path):
    folder = str(tmp_path / "sweep")
    base = {**{name: value for name, value in BASE.items() if name != "buffer_size"}, "checkpoint_every": None,
            "algorithm": "fedavg"}
    run_sweep({**base, "seed": 0}, {"clients": [2, 3]}, folder, progress=False)
    said = []
    other = run_sweep({**base, "seed": 1}, {"clients": [2, 3]}, folder, progress=False, echo=said.append)
    note = ("2 finished run(s) of the sweep this folder held before are not cells of this grid, so this sweep's "
            "results table leaves them out")
    assert any(note in line and "the two sweeps differ in seed: 0 there, 1 here" in line and "--seed 0,1" in line
               for line in said)
    assert any(note in text for text in other.notes) and len(other.rows) == 2
    both = run_sweep(base, {"seed": [0, 1], "clients": [2, 3]}, folder, progress=False, echo=said.append)
    assert len(both.skipped) == 4 and not both.ran and not any("finished run(s)" in text for text in both.notes)
    assert sorted((row["seed"], row["clients"]) for row in read_results(folder)) == [(0, 2), (0, 3), (1, 2), (1, 3)]
    # without a bar or an echo (a notebook's progress=False) the note is a warning, not nothing
    with pytest.warns(UserWarning, match=r"3 finished run\(s\) of the sweep this folder held before"):
        run_sweep({**base, "seed": 0}, {"clients": [2]}, folder, progress=False)
    # a setting the earlier grid swept: its values are named too (a note named only max_updates, 2026-12-05)
    run_sweep({**base, "seed": 0}, {"seed": [0, 1], "clients": [2, 3]}, folder, progress=False)
    with pytest.warns(UserWarning, match=r"the two sweeps differ in clients: \[2, 3\] there, 2 here; seed: \[0, 1\] "
                                         r"there, 4 here; one grid over the values of both \(e.g. --clients 2,3 "
                                         r"--seed 0,1,4\) reports them together; it also runs the combinations of "
                                         r"those settings that neither sweep ran"):
        run_sweep({**base, "seed": 4, "clients": 2}, {}, folder, progress=False)
    # one setting apart, the grid over both is the two sweeps' runs and no more
    assert not any("neither sweep ran" in line for line in said)


def test_report_grid_lays_a_design_space_out_as_rows_by_columns_by_hand(tmp_path):
    # PORT-like: k × b, urgent pull off and on, two speed models, two seeds; fedavg's times 100 and
    # 300 s in the two seeds, so a ratio is paired by seed (k=1, b=3, off: (50 + 90) / 400)
    fedavg = {"pareto": [100.0, 300.0], "zipf": [100.0, 100.0]}
    port = {(1, 3.0, False): [50.0, 90.0], (1, 3.0, True): [None, None], (1, math.inf, False): [100.0, None],
            (5, 3.0, False): [40.0, 120.0], (5, math.inf, False): [100.0, 300.0], (5, math.inf, True): [20.0, 60.0]}
    rows = []
    for speeds in ("pareto", "zipf"):
        rows += [{"algorithm": "fedavg", "heterogeneity": speeds, "port.k": None, "port.b": None, "port.pull": None,
                  "seed": seed, "time_to_target": fedavg[speeds][seed], "best_accuracy": 0.9} for seed in (0, 1)]
        rows += [{"algorithm": "port", "heterogeneity": speeds, "port.k": k, "port.b": b, "port.pull": pull,
                  "seed": seed, "time_to_target": times[seed], "best_accuracy": 0.9}
                 for (k, b, pull), times in port.items() for seed in (0, 1)]
    _write_results(str(tmp_path), rows)
    report = make_report(str(tmp_path), figures=False, grid=("port.k", "port.b"))
    pareto = report.markdown.split("## Time to first reach 80% held-out accuracy relative to fedavg: "
                                   "port.k × port.b (heterogeneity=pareto)\n\n")[1].split("\n\n")[0]
    assert pareto.splitlines() == [
        "| port.k \\ port.b | 3.0 | inf |",
        "|---:|---|---|",
        "| 1 | 0.35 / – | – / · |",  # (50 + 90) / 400; missed in one of two seeds: "–"; pull on not run: "·"
        "| 5 | 0.40 / · | 1.00 / 0.20 |"]
    assert "| 1 | 0.70 / – | – / · |" in report.markdown.split("(heterogeneity=zipf)")[1]  # its own reference
    assert "Each cell: port.pull=False / port.pull=True." in report.markdown
    assert report.markdown.endswith(report.grid_markdown) and report.grid.rows == [1, 5]
    assert report.grid.columns == [3.0, math.inf] and report.grid.variants == ["port.pull=False", "port.pull=True"]
    # every number of the grids is the method's ratio of the first table
    lines = {(line["heterogeneity"], line["method"]): line["relative_time"] for line in report.rows}
    assert lines["pareto", "port port.k=5 port.b=inf port.pull=True"] == pytest.approx(0.2)
    assert lines["zipf", "port port.k=1 port.b=3.0 port.pull=False"] == pytest.approx(140 / 200)


def test_report_grid_of_a_real_port_sweep_and_its_bad_settings(tmp_path, capsys):
    folder = str(tmp_path / "sweep")
    base = {name: value for name, value in BASE.items() if name != "buffer_size"}
    run_sweep({**base, "checkpoint_every": None},
              {"algorithm": ["fedavg", "port"], "port.min_clients": [1, 2], "port.staleness_bound": [1, "inf"]},
              folder, progress=False)
    for grid, message in [("port.min_clients", "grid='port.min_clients' is not allowed: two different swept settings"),
                          ("port.min_clients,clients", "grid setting 'clients' is not allowed: one of the swept "
                                                       "settings of a method (port.min_clients, port.staleness_bound)")]:
        with pytest.raises(SystemExit) as exited:
            cli.main(["report", folder, "--grid", grid, "--out", str(tmp_path / "never")])
        assert exited.value.code == 2 and message in capsys.readouterr().err
        assert not os.path.exists(tmp_path / "never")  # refused before anything is written
    assert cli.main(["report", folder, "--grid", "port.min_clients,port.staleness_bound",
                     "--out", str(tmp_path / "report")]) == 0
    printed = capsys.readouterr().out
    table = printed.split("port.min_clients × port.staleness_bound\n\n")[1].split("\n\n")[0].splitlines()
    assert table[0] == "| port.min_clients \\ port.staleness_bound | 1 | inf |"
    assert [row.split(" | ")[0] for row in table[2:]] == ["| 1", "| 2"]
    assert "time_to_target_grid.png" in printed
    import matplotlib.image

    image = matplotlib.image.imread(os.path.join(tmp_path / "report", "time_to_target_grid.png"))
    assert image.shape[0] > 200 and image.shape[1] > 200
    # the heat map from the results table alone, its runs gone (seeds run on other machines)
    table = str(tmp_path / "port.csv")
    shutil.copy(os.path.join(folder, "results.csv"), table)
    from_table = make_report(table, out=str(tmp_path / "from-table"), figures="table",
                             grid=("port.min_clients", "port.staleness_bound"))
    assert [os.path.basename(path) for path in from_table.figures] == ["time_to_target.png", "time_to_target_grid.png"]
    assert from_table.markdown == open(tmp_path / "report" / "report.md").read().rstrip("\n")


def test_parallel_workers_share_the_sweeps_compilation_cache_on_its_terms(tmp_path, monkeypatch):
    import jax

    from jaxfl.comparison import shared_compilations
    from jaxfl.sweep import _worker_environment

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_cpu_enable_fast_math=false")
    monkeypatch.setenv("JAXFL_CPU_DEVICES", "8")
    with shared_compilations() as cache:  # jaxfl's own cache: small programs are worth caching
        env = _worker_environment(2, cache)
    assert (env["JAX_COMPILATION_CACHE_DIR"], env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"],
            env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]) == (
        cache, str(jax.config.jax_persistent_cache_min_compile_time_secs), "0")  # the tests' (tests/conftest.py)
    assert env["JAX_NUM_CPU_DEVICES"] == "2" and "JAXFL_CPU_DEVICES" not in env  # the share decides
    assert env["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"  # other flags kept
    assert "JAX_COMPILATION_CACHE_MAX_SIZE" not in env  # the tests' cache is not bounded
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes", "jax_compilation_cache_max_size")
    before = {name: getattr(jax.config, name) for name in names}
    try:  # a cache the user configured is used on the user's terms
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 3.5)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 4096)
        jax.config.update("jax_compilation_cache_max_size", 1 << 20)  # a bound the user set for jax
        with shared_compilations() as cache:
            env = _worker_environment(1, cache)
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
    assert (env["JAX_COMPILATION_CACHE_DIR"], env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"],
            env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]) == (str(tmp_path), "3.5", "4096")
    assert env["JAX_COMPILATION_CACHE_MAX_SIZE"] == str(1 << 20)  # the workers keep the folder under it too


def test_a_row_of_a_run_by_epochs_has_its_epochs_and_no_step_count(tmp_path):
    """local_steps is not read when local_epochs is set (each client's steps follow its data): the
    row says so instead of showing the unused default."""
    from jaxfl.sweep import result_row

    cells, _ = expand({"model": "mlp", "clients": 3}, {"local_epochs": [None, 2.0]}, str(tmp_path))
    rows = []
    for cell in cells:
        os.makedirs(cell.run_dir)
        with open(os.path.join(cell.run_dir, "summary.json"), "w") as handle:
            json.dump({"last_tenth_accuracy": None}, handle)
        rows.append(result_row(cell, ["local_epochs"], str(tmp_path)))
    assert [(row["local_steps"], row["local_epochs"]) for row in rows] == [(50, None), (None, 2.0)]


def test_a_mixed_timing_only_sweep_s_notes_name_the_cells_that_read_each_setting():
    """eval_every with a timing_only axis: the note said it applied "only to the cells that read it",
    without naming them, unlike every other note."""
    _, notes = expand({"dataset": "synthetic_iid", "partition": "natural", "model": "logreg", "max_updates": 3,
                       "eval_every": 2, "final_checkpoint": False}, {"timing_only": [True, False]}, "sweeps/x")
    assert notes == ["eval_every, final_checkpoint apply only to the cells that read them (timing_only=False)"]


def test_a_timing_only_sweep_over_evaluation_settings_says_why_no_cell_reads_them():
    """--eval-interval 1,2 in a timing-only sweep was refused pointing at jaxfl run --help's algorithms
    and speed models, which say nothing of it."""
    with pytest.raises(ConfigError, match=r"eval_interval=\[1.0, 2.0\] is not allowed: no cell of this sweep reads it "
                                          r"\(every cell is timing-only: no training, evaluation or checkpoint\)"):
        expand({"model": "logreg", "max_updates": 3, "timing_only": True}, {"eval_interval": [1.0, 2.0]}, "sweeps/x")


def test_cluster_flags_given_to_a_sweep_are_named_as_jaxfl_run_s(tmp_path, capsys):
    # they were "unrecognized" with a wrong hint (did you mean --num-classes for --num-processes?)
    with pytest.raises(SystemExit) as exited:
        cli.main(["sweep", "--algorithm", "fedavg", "--out", str(tmp_path / "never"), "--coordinator-address",
                  "10.0.0.1:1234", "--num-processes", "2", "--process-id", "0"])
    assert exited.value.code == 2 and not os.path.exists(tmp_path / "never")
    error = capsys.readouterr().err
    assert "--coordinator-address, --num-processes, --process-id: jaxfl sweep runs its cells in one process" in error
    assert "did you mean" not in error


def test_a_grid_that_is_no_mapping_is_refused_before_the_folder_is_made(tmp_path):
    # run_sweep(base, None, folder) raised a bare AttributeError
    from jaxfl.config import ConfigError
    from jaxfl.sweep import run_sweep

    for grid in (None, [("seed", [0, 1])]):
        with pytest.raises(ConfigError, match=r"grid=.* is not allowed: a mapping of setting → list of values"):
            run_sweep({"clients": 4}, grid, str(tmp_path / "sweep"))
    assert not (tmp_path / "sweep").exists()


def test_a_misspelt_section_of_a_sweep_file_is_named_as_a_section(tmp_path, capsys):
    """`[clinet]` was "unknown config field 'clinet'; allowed:" and some 90 fields, where --config says
    which section was meant."""
    from jaxfl.cli import main

    (tmp_path / "sweep.toml").write_text("[clinet]\nlocal_steps = 5\n")
    with pytest.raises(SystemExit):
        main(["sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "out")])
    assert "unknown config section [clinet] (did you mean [client]?)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_comparison_in_a_sweeps_runs_folder_reuses_its_finished_cells(sweep, tmp_path, capsys):
    # a cell records its run_name (its folder's), which a comparison's config leaves unset: the records
    # differed, so the comparison trained both again into -2 folders, while its own note said it reuses them
    folder = tmp_path / "copy"
    shutil.copytree(sweep.sweep_dir, folder)
    flags = ["run", "--algorithm", "fedavg,fedbuff", "--seed", "0", "--dataset", "mnist10k", "--model", "mlp",
             "--clients", "3", "--local-steps", "2", "--batch-size", "16", "--max-updates", "2", "--target-accuracy",
             "0.3", "--no-stop-at-target", "--checkpoint-every", "1", "--buffer-size", "2", "--no-progress",
             "--output-dir", str(folder / "runs")]
    before = sorted(os.listdir(folder / "runs"))
    capsys.readouterr()
    assert cli.main(flags) == 0
    said = capsys.readouterr()
    assert [line.endswith("(reused: it had finished)") for line in said.out.splitlines()
            if line.startswith(("fedavg:", "fedbuff:"))] == [True, True], said.out
    assert "trains it again" not in said.err
    assert sorted(name for name in os.listdir(folder / "runs") if not name.startswith("comparison")) == before
