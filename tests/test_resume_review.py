"""Resume and interruption safety found in review: --log-to csv after a resume (no doubled rows, the
logger kept), one run folder resumed by two processes at once, a corrupt state.pkl, a finished run
resumed again, SIGTERM before the first event, a refused flag spelled as typed, a checkpoint that
cannot be written (disk full), Ctrl-C during a save, an interrupted comparison."""
import contextlib
import csv
import re
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import jaxfl
from jaxfl import checkpoint, cli
from jaxfl.resume import ResumeError, ResumeWarning
from jaxfl.testing import events_without_wall_time, metrics_without_wall_time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(algorithm="fedavg", model="logreg", clients=3, local_steps=2, batch_size=8, stop_at_target=False,
            progress=False)


class CtrlC:
    """A Ctrl-C at the n-th metrics row (after the loggers before it have logged that row)."""

    def __init__(self, at):
        self.at, self.seen = at, 0

    def log(self, row, step):
        self.seen += 1
        if self.seen == self.at:
            raise KeyboardInterrupt

    def close(self):
        pass


def rows(path) -> list[dict]:
    with open(path, newline="") as handle:
        return [{k: v for k, v in row.items() if k != "wall_time"} for row in csv.DictReader(handle)]


def test_log_to_csv_is_cut_back_on_resume_and_kept_by_a_resume_without_log_to(tmp_path, capsys):
    full = jaxfl.run_experiment(jaxfl.RunConfig(**TINY, max_updates=6, checkpoint_every=2, output_dir=str(tmp_path),
                                                run_name="full"), loggers=["csv"])
    with pytest.raises(jaxfl.RunInterrupted) as cut:  # at version 3's row: checkpoint 2, log.csv has row 3
        jaxfl.run_experiment(jaxfl.RunConfig(**TINY, max_updates=6, checkpoint_every=2, output_dir=str(tmp_path),
                                             run_name="cut"), loggers=["csv", CtrlC(4)])
    run = cut.value.run_dir
    assert cut.value.update == 2 and [r["version"] for r in rows(os.path.join(run, "log.csv"))] == ["0", "1", "2", "3"]
    assert json.loads(pathlib.Path(run, "config.json").read_text())["log_to"] == ["csv"]
    assert cli.main(["run", "--resume", run, "--no-progress"]) == 0  # no --log-to: the run's csv logger goes on
    logged = rows(os.path.join(run, "log.csv"))
    assert [r["version"] for r in logged] == [r["version"] for r in rows(os.path.join(run, "metrics.csv"))] == \
        [str(v) for v in range(7)]  # once each (version 3 was logged twice)
    assert logged == rows(os.path.join(full.run_dir, "log.csv"))


def test_a_refused_boolean_flag_is_spelled_as_typed(tmp_path, capsys):
    run = jaxfl.run_experiment(jaxfl.RunConfig(**TINY, max_updates=1, output_dir=str(tmp_path))).run_dir
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--resume", run, "--no-final-checkpoint"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1
    assert "--no-final-checkpoint (the run has True)" in err and "--final-checkpoint False" not in err, err


def test_a_corrupt_state_pkl_with_valid_pickle_bytes_is_found_by_its_sha256(tmp_path):
    full = jaxfl.run_experiment(jaxfl.RunConfig(**TINY, max_updates=3, checkpoint_every=1, output_dir=str(tmp_path),
                                                run_name="full"))
    run = tmp_path / "run"
    import shutil

    shutil.copytree(full.run_dir, run)
    os.remove(run / "summary.json")  # as if killed after its last checkpoint
    state = run / "checkpoints" / "ckpt-000003" / "state.pkl"
    data = bytearray(state.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 50] = bytes(50)
    state.write_bytes(bytes(data))
    with pytest.warns(ResumeWarning, match="ckpt-000003: state.pkl unreadable .*SHA-256"):
        resumed = jaxfl.resume_experiment(str(run), progress=False)
    assert resumed.summary["global_updates"] == 3
    assert (run / "checkpoints" / "skipped" / "ckpt-000003").is_dir()
    assert events_without_wall_time(run) == events_without_wall_time(full.run_dir)
    assert metrics_without_wall_time(run) == metrics_without_wall_time(full.run_dir)


def test_resuming_a_finished_run_says_so_and_leaves_it_untouched(tmp_path, capsys):
    run = jaxfl.run_experiment(jaxfl.RunConfig(**TINY, max_updates=2, output_dir=str(tmp_path))).run_dir
    before = {name: pathlib.Path(run, name).read_bytes() for name in ("summary.json", "events.csv", "metrics.csv")}
    capsys.readouterr()
    assert cli.main(["run", "--resume", run, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "has already finished (2 updates, stop: update budget)" in out, out
    assert "resumed" not in out
    assert before == {name: pathlib.Path(run, name).read_bytes() for name in before}


def test_sigterm_before_the_first_event_says_what_the_run_folder_keeps(tmp_path):
    script = textwrap.dedent("""
        import os, signal, sys
        import jaxfl
        from jaxfl import stopping

        class Term:  # SIGTERM at the evaluation of version 0, before the first event
            def log(self, row, step):
                os.kill(os.getpid(), signal.SIGTERM)
            def close(self):
                pass

        with stopping.stop_on_sigterm():
            jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedavg", model="logreg", clients=3, local_steps=2,
                max_updates=3, progress=False, output_dir=sys.argv[1], run_name="r"), loggers=[Term()])
        """)
    ended = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                           timeout=300, cwd=REPO)
    assert ended.returncode == -signal.SIGTERM, ended.stderr[-2000:]
    run = tmp_path / "r"
    assert ended.stderr.strip().splitlines()[-1] == (
        f"jaxfl: stopped by SIGTERM: {run} holds the logs until it stopped but no checkpoint yet "
        f"(checkpoint_every, checkpoint_min_interval_s): nothing to resume from; start the run again")


@contextlib.contextmanager
def _held(folder):
    """Another process holding ``folder``'s lock (as a run, a resume or a sweep of it does) while inside."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom jaxfl.resume import holding_lock\n"
                               "with holding_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(600)\n",
                               str(folder)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_a_run_directory_is_resumed_by_one_process_at_a_time(tmp_path, capsys):
    full = jaxfl.run_experiment(jaxfl.RunConfig(**TINY, max_updates=3, checkpoint_every=1, output_dir=str(tmp_path),
                                                run_name="full"))
    run = tmp_path / "run"
    import shutil

    shutil.copytree(full.run_dir, run)
    os.remove(run / "summary.json")
    before = {name: (run / name).read_bytes() for name in ("events.csv", "metrics.csv")}
    with _held(run) as holder:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            cli.main(["run", "--resume", str(run), "--no-progress"])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"{run} is in use by process {holder.pid}, which is writing this run directory" in err, err
        with pytest.raises(jaxfl.resume.InUse, match=f"in use by process {holder.pid}"):
            jaxfl.resume_experiment(str(run), progress=False)
        assert before == {name: (run / name).read_bytes() for name in before}
        assert "skipped" not in os.listdir(run / "checkpoints")
    # once that process is gone the lock is free: the resume goes on, and the .lock file disturbs no reader
    assert cli.main(["run", "--resume", str(run), "--no-progress"]) == 0
    assert events_without_wall_time(run) == events_without_wall_time(full.run_dir)
    from jaxfl.runlog import load_run

    assert load_run(str(run)).summary["resumes"] == 1


def test_a_running_run_holds_its_folder_against_a_resume(tmp_path, capsys):
    running = subprocess.Popen([sys.executable, "-m", "jaxfl", "run", "--algorithm", "fedasync", "--model", "logreg",
                                "--clients", "3", "--local-steps", "2", "--max-updates", "100000",
                                "--checkpoint-every", "1", "--no-stop-at-target", "--no-progress", "--output-dir",
                                str(tmp_path), "--run-name", "r"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, cwd=REPO)
    run = tmp_path / "r"
    try:
        deadline = time.time() + 300
        while time.time() < deadline and running.poll() is None and not checkpoint.latest(str(run)):
            time.sleep(0.05)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            cli.main(["run", "--resume", str(run), "--no-progress"])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and f"is in use by process {running.pid}" in err, err
    finally:
        running.send_signal(signal.SIGINT)
        running.communicate(timeout=300)
    assert running.returncode == 130


def test_a_sweep_directory_is_run_by_one_sweep_at_a_time(tmp_path, capsys):
    folder = tmp_path / "sweep"
    folder.mkdir()
    flags = ["sweep", "--algorithm", "fedavg", "--model", "logreg", "--clients", "3", "--local-steps", "2",
             "--max-updates", "2", "--checkpoint-every", "1", "--seed", "0", "--no-progress", "--out", str(folder)]
    with _held(folder) as holder:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            cli.main(flags)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and err.count("\n") == 1, err
        assert f"{folder} is in use by process {holder.pid}, which is writing this sweep directory" in err, err
        assert err.rstrip().endswith(f"and then run the same jaxfl sweep command again (--out {folder})"), err
        assert os.listdir(folder) == [".lock"]
    # a cell that another sweep of --jobs 1 runs now looked interrupted under --jobs 1: the second sweep was
    # told "jobs=2 is not allowed here: cell 0 was interrupted ... continue with --jobs 1", which is refused too
    assert cli.main(flags) == 0
    (run,) = (folder / "runs").iterdir()
    os.remove(run / "summary.json")
    with _held(folder) as holder:
        capsys.readouterr()
        with pytest.raises(SystemExit):
            cli.main([*flags, "--jobs", "2"])
        err = capsys.readouterr().err
        assert f"{folder} is in use by process {holder.pid}" in err and "not allowed" not in err, err


FULL_DISK_SCRIPT = textwrap.dedent("""
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as a full disk's does
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
    from jaxfl import cli
    sys.exit(cli.main(sys.argv[2:]))
    """)
MLP = ["--algorithm", "fedavg", "--model", "mlp", "--clients", "3", "--local-steps", "2", "--batch-size", "8",
       "--no-stop-at-target", "--no-progress"]


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_leaves_no_tmp_folder(tmp_path):
    # a file-size limit below the MLP's kernel (about 480 kB) makes orbax's write fail in the kernel, as a full
    # disk does (no root needed): it printed orbax's threads' tracebacks and exited 2, the bad-input status
    ended = subprocess.run([sys.executable, "-c", FULL_DISK_SCRIPT, "200000", "run", *MLP, "--max-updates", "4",
                            "--checkpoint-every", "2", "--output-dir", str(tmp_path), "--run-name", "r"],
                           capture_output=True, text=True, timeout=600, cwd=REPO)
    run = tmp_path / "r"
    lines = [line for line in ended.stderr.splitlines() if not line.startswith(("  ", "/")) and "warn" not in line]
    assert ended.returncode == 74, ended.stderr[-3000:]
    assert "Traceback" not in ended.stderr and "ERROR:absl" not in ended.stderr, ended.stderr[-3000:]
    assert lines[-1] == (f"jaxfl: error: could not write checkpoint 2 to {run}: File too large; it has no checkpoint "
                         f"yet; free space and start the run again"), ended.stderr[-3000:]
    assert os.listdir(run / "checkpoints") == []  # no tmp-000002 left behind
    assert not (run / "summary.json").exists()


@pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="mounts a small tmpfs (root only)")
def test_a_full_disk_keeps_the_checkpoints_before_it_and_the_run_resumes(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        class FillTheDisk:  # at version 3's row, after checkpoint 2: the disk fills up (a few kB left for the logs)
            def log(self, row, step):
                if step == 3:
                    with open(disk / "filler", "wb") as handle:
                        try:
                            while True:
                                handle.write(bytes(1 << 16))
                                handle.flush()
                        except OSError:
                            pass
                    os.truncate(disk / "filler", os.path.getsize(disk / "filler") - (1 << 15))

            def close(self):
                pass

        config = dict(TINY, model="mlp", max_updates=6, checkpoint_every=2, run_name="r")
        with pytest.raises(checkpoint.CheckpointWriteError) as failed:
            jaxfl.run_experiment(jaxfl.RunConfig(**config, output_dir=str(disk)), loggers=[FillTheDisk()])
        run = disk / "r"
        assert str(failed.value) == (f"could not write checkpoint 4 to {run}: No space left on device; logs and "
                                     f"checkpoints kept up to update 2; free space and resume with `jaxfl run "
                                     f"--resume {run}`")
        assert sorted(n for n in os.listdir(run / "checkpoints") if n != "arrays") == ["ckpt-000002", "latest"]
        os.remove(disk / "filler")
        resumed = jaxfl.resume_experiment(str(run), progress=False)
        full = jaxfl.run_experiment(jaxfl.RunConfig(**config, output_dir=str(tmp_path / "full")))
        assert resumed.summary["global_updates"] == 6
        assert events_without_wall_time(run) == events_without_wall_time(full.run_dir)
        assert metrics_without_wall_time(run) == metrics_without_wall_time(full.run_dir)
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_ctrl_c_while_a_checkpoint_is_written_waits_for_it_and_says_one_line(tmp_path):
    running = subprocess.Popen([sys.executable, "-m", "jaxfl", "run", *MLP, "--clients", "10", "--max-updates", "100000",
                                "--checkpoint-every", "1", "--output-dir", str(tmp_path), "--run-name", "r"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    root = tmp_path / "r" / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and running.poll() is None:  # Ctrl-C twice while a save is under way
        if root.is_dir() and any(name.startswith("tmp-") for name in os.listdir(root)) and \
                checkpoint.latest(str(tmp_path / "r")):
            break
        time.sleep(0.002)
    running.send_signal(signal.SIGINT)
    time.sleep(0.02)
    running.send_signal(signal.SIGINT)
    _, err = running.communicate(timeout=300)
    assert running.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "ERROR:absl" not in err and "Exception ignored" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith(f"jaxfl: interrupted: {tmp_path / 'r'} keeps its logs and "
                                                   "checkpoints up to update "), err[-3000:]
    assert not [name for name in os.listdir(root) if name.startswith("tmp-")]  # the save was finished, not cut


def test_an_interrupted_comparison_says_what_it_keeps_and_the_same_command_finishes_it(tmp_path, capsys):
    command = [sys.executable, "-m", "jaxfl", "run", "--algorithm", "fedavg,fedbuff,fedasync", "--model", "logreg",
               "--clients", "3", "--local-steps", "2", "--batch-size", "8", "--max-updates", "100", "--eval-every",
               "50", "--checkpoint-every", "5", "--no-stop-at-target", "--no-progress", "--output-dir", str(tmp_path)]
    running = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.time() + 300
    fedbuff = None
    while time.time() < deadline and running.poll() is None:  # Ctrl-C in fedbuff's run, after a checkpoint
        fedbuff = next((tmp_path / name for name in os.listdir(tmp_path) if name.startswith("fedbuff")), None)
        if fedbuff is not None and checkpoint.latest(str(fedbuff)):
            break
        time.sleep(0.01)
    running.send_signal(signal.SIGINT)
    out, err = running.communicate(timeout=300)
    assert running.returncode == 130, err[-3000:]
    fedavg = next(tmp_path / name for name in os.listdir(tmp_path) if name.startswith("fedavg"))
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"jaxfl: interrupted: comparison fedavg,fedbuff,fedasync cut short, comparison.csv not "
                           f"written; finished: fedavg ({fedavg}); interrupted: fedbuff: {fedbuff} keeps its logs "
                           f"and checkpoints up to update "), line
    assert line.endswith(f"; not run: fedasync; jaxfl run --algorithm fedavg,fedbuff,fedasync {' '.join(command[6:])} "
                         f"goes on (finished runs reused, the interrupted one resumed from its checkpoint) and writes "
                         f"the comparison"), line
    assert not (tmp_path / "comparison.csv").exists()
    capsys.readouterr()
    assert cli.main(command[3:]) == 0  # the same command, in this process (the Ctrl-C needed one of its own)
    again = capsys.readouterr().out
    reused = [line for line in again.splitlines() if line.startswith("fedavg:")]
    assert len(reused) == 1 and reused[0].endswith(f"→ {fedavg} (reused: it had finished)")  # one line a run
    assert f"fedbuff: resuming {fedbuff}" in again
    assert (tmp_path / "comparison.csv").exists()
    assert sorted(name.split("-")[0] for name in os.listdir(tmp_path) if (tmp_path / name).is_dir()) == \
        ["fedasync", "fedavg", "fedbuff"]  # no run trained again into a -2 folder
    assert json.loads((fedbuff / "summary.json").read_text())["resumes"] == 1


def test_a_comparison_folder_copied_elsewhere_still_holds_its_runs(tmp_path, capsys):
    """Where a run folder lies is no setting of the run: the same comparison with the copy as its
    --output-dir reuses the finished runs and resumes the cut one, as in the folder it was made in."""
    import shutil

    flags = ["run", "--algorithm", "fedavg,fedbuff", "--model", "logreg", "--clients", "3", "--local-steps", "2",
             "--batch-size", "8", "--max-updates", "4", "--checkpoint-every", "1", "--no-stop-at-target",
             "--no-progress"]
    assert cli.main([*flags, "--output-dir", str(tmp_path / "made")]) == 0
    shutil.copytree(tmp_path / "made", tmp_path / "copy")
    fedbuff = next((tmp_path / "copy").glob("fedbuff-*"))
    (fedbuff / "summary.json").unlink()  # cut back to its checkpoint after update 3
    shutil.rmtree(fedbuff / "checkpoints" / "ckpt-000004")
    (fedbuff / "checkpoints" / "latest").write_text("ckpt-000003\n")
    capsys.readouterr()
    assert cli.main([*flags, "--output-dir", str(tmp_path / "copy")]) == 0
    out = capsys.readouterr().out
    fedavg = next((tmp_path / "copy").glob("fedavg-*"))
    assert any(line.startswith("fedavg:") and line.endswith(f"→ {fedavg} (reused: it had finished)")
               for line in out.splitlines()), out
    assert f"fedbuff: resuming {fedbuff}" in out
    assert sorted(path.name for path in (tmp_path / "copy").iterdir() if path.is_dir()) == \
        sorted(path.name for path in (tmp_path / "made").iterdir() if path.is_dir())  # no run trained again
    made = next((tmp_path / "made").glob("fedbuff-*"))
    assert metrics_without_wall_time(str(fedbuff)) == metrics_without_wall_time(str(made))


def test_the_same_single_run_command_after_a_ctrl_c_names_the_run_it_cut(tmp_path, capsys):
    """One ``jaxfl run`` starts a new run each time (a comparison goes on with the earlier one): the
    same command after an interruption says which run it cut and how to finish it, rather than
    training afresh beside it without a word."""
    settings = dict(TINY, max_updates=4, checkpoint_every=1, output_dir=str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        jaxfl.run_experiment(jaxfl.RunConfig(**settings), loggers=[CtrlC(at=3)])
    cut = str(next(tmp_path.iterdir()))
    update = int(os.path.basename(checkpoint.latest(cut))[len("ckpt-"):])
    capsys.readouterr()
    assert cli.main(["run", "--algorithm", "fedavg", "--model", "logreg", "--clients", "3", "--local-steps", "2",
                     "--batch-size", "8", "--max-updates", "4", "--checkpoint-every", "1", "--no-stop-at-target",
                     "--no-progress", "--output-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"jaxfl: note: {cut} is an interrupted run of this config (checkpoints up to update {update}): " \
           f"jaxfl run --resume {cut} finishes it; this command starts a new run" in err, err
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(cut), os.path.basename(cut) + "-2"])
    assert checkpoint.latest(cut) is not None and not os.path.exists(os.path.join(cut, "summary.json"))


def test_the_interrupted_command_ends_without_the_interpreters_shutdown(monkeypatch, capsys):
    """As the command (no argv given), an interrupt ends the process with os._exit after its line: a
    Ctrl-C during XLA's compilation made the shutdown crash (status -11). A caller's main([...]) gets
    the status back instead."""
    ended = []

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_main", interrupted)
    monkeypatch.setattr(cli.os, "_exit", ended.append)
    assert cli.main(["run"]) == 130 and ended == []
    cli.main()
    assert ended == [130]
    assert capsys.readouterr().err == "jaxfl: interrupted\njaxfl: interrupted\n"


def test_a_sweep_interrupted_before_its_first_cell_says_nothing_was_written(tmp_path, monkeypatch, capsys):
    import jaxfl.sweep

    def checks_interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(jaxfl.sweep, "run_sweep", checks_interrupted)
    out = tmp_path / "never"
    assert cli.main(["sweep", "--algorithm", "fedavg,fedbuff", "--model", "logreg", "--clients", "3", "--max-updates",
                     "2", "--out", str(out), "--no-progress"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "jaxfl: interrupted before the sweep's first cell: nothing written; the same command starts the sweep"
    assert not out.exists()


def test_resuming_a_run_of_an_algorithm_registered_in_its_script_says_to_register_it_first(tmp_path):
    from jaxfl.algorithms import FedAvgAlgorithm, register, unregister
    from jaxfl.resume import ResumeError, read_run

    @register
    class InScript(FedAvgAlgorithm):
        name = "in_script_test"

    try:
        run = jaxfl.run_experiment(jaxfl.RunConfig(**{**TINY, "algorithm": "in_script_test"}, max_updates=1,
                                                   output_dir=str(tmp_path))).run_dir
    finally:
        unregister("in_script_test")
    with pytest.raises(ResumeError, match=r"its algorithm 'in_script_test' is not registered in this process .* "
                                          r"register it \(jaxfl.algorithms.register\) before resuming"):
        read_run(run)
    register(InScript)
    try:
        assert read_run(run)[0].algorithm == "in_script_test"
    finally:
        unregister("in_script_test")


def test_a_ctrl_c_lost_inside_a_garbage_collector_callback_still_stops_the_next_run(tmp_path):
    """Python drops a KeyboardInterrupt raised in a gc callback ("Exception ignored", jax's during a
    compilation) and goes on: the command's SIGINT handler also asks for a stop, which the run keeps
    (stopping at its first event, here) and the command clears where the interrupt did end it."""
    from jaxfl import stopping
    from jaxfl.experiment import RunInterrupted

    with stopping.stop_on_sigterm():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            pass  # what Python does with one raised in a gc callback
        assert stopping.stop_requested() == "SIGINT"
        with pytest.raises(RunInterrupted) as stopped:
            jaxfl.run_experiment(jaxfl.RunConfig(**TINY, max_updates=3, output_dir=str(tmp_path)))
        assert stopped.value.reason == "SIGINT"
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            pass
    assert stopping.stop_requested() is None and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_closed_loop_tracebacks_of_two_threads_at_once_are_all_filtered():
    """After a full disk, two tensorstore threads printed their "Event loop is closed" tracebacks line
    by line interleaved; one shared buffer took the second header for the first's last line and let
    four tracebacks through before jaxfl's one-line error."""
    import io

    out = io.StringIO()
    stream = checkpoint._WithoutClosedLoopTracebacks(out)
    lines = ["Traceback (most recent call last):\n", '  File ".../base_events.py", line 806, in call_soon_threadsafe\n',
             "    self._check_closed()\n", "RuntimeError: Event loop is closed\n"]
    for line in lines:  # thread 1 and thread 2, a line each in turn
        stream._take(line, 1)
        stream._take(line, 2)
    stream._take("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: kept\n", 3)
    stream.write("jaxfl: error: could not write checkpoint\n")
    stream.release()
    assert out.getvalue() == ("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: kept\n"
                              "jaxfl: error: could not write checkpoint\n")


def test_resume_of_a_run_still_going_before_its_first_checkpoint_is_refused_as_in_use(tmp_path):
    """It said the run had no checkpoints/ folder and to "start the run again": a duplicate of a live run."""
    from jaxfl.resume import InUse, candidates, holding_lock

    run = tmp_path / "run"
    run.mkdir()
    with _held(run) as holder:  # as the run holds it from its start
        with pytest.raises(InUse, match=rf"is in use by process {holder.pid}, which is writing this run directory"):
            candidates(str(run))
        assert (run / ".lock").read_text().strip() == str(holder.pid)  # probed, not written
    with pytest.raises(ResumeError, match="it has no checkpoints/ folder"):
        candidates(str(run))
    with holding_lock(str(run)):  # this process's own lock (a run asking for its newest checkpoint at a stop)
        with pytest.raises(ResumeError, match="it has no checkpoints/ folder"):
            candidates(str(run))


def test_a_run_that_lost_its_config_json_names_the_checkpoints_that_keep_its_settings(tmp_path, capsys):
    """It said the folder "is not a run directory"; a checkpoint's config.json reruns the run."""
    config = dict(TINY, model="mlp", max_updates=4, checkpoint_every=2, run_name="r")
    first = jaxfl.run_experiment(jaxfl.RunConfig(**config, output_dir=str(tmp_path / "a")))
    os.remove(os.path.join(first.run_dir, "config.json"))
    kept = os.path.join(first.run_dir, "checkpoints", "ckpt-000004", "config.json")
    with pytest.raises(ResumeError, match=re.escape(f"its config.json is missing (deleted?), and a resume checks the "
                                                    f"run's data, inputs and versions against it; each checkpoint "
                                                    f"keeps the run's settings: jaxfl run --config {kept} starts")):
        jaxfl.resume_experiment(first.run_dir, progress=False)
    assert cli.main(["run", "--config", kept, "--output-dir", str(tmp_path / "b")]) == 0
    assert events_without_wall_time(str(tmp_path / "b" / "r")) == events_without_wall_time(first.run_dir)


def test_ctrl_c_while_the_jaxfl_command_imports_is_one_line_and_status_130(tmp_path):
    """A Ctrl-C in the seconds the command spends importing jax and jaxfl printed an import traceback
    of 16 lines; a script or notebook importing jaxfl keeps Python's KeyboardInterrupt."""
    code = ("import os, signal, sys\nsys.argv[0] = os.path.join('bin', sys.argv[1])\nimport jaxfl\n"
            "os.kill(os.getpid(), signal.SIGINT)\nprint('went on')\n")
    command = subprocess.run([sys.executable, "-c", code, "jaxfl"], capture_output=True, text=True, cwd=REPO,
                             timeout=300)
    assert command.returncode == 130 and command.stderr == "jaxfl: interrupted while starting: nothing written\n"
    script = subprocess.run([sys.executable, "-c", code, "my_script.py"], capture_output=True, text=True, cwd=REPO,
                            timeout=300)
    assert script.returncode == -signal.SIGINT and script.stderr.strip().endswith("KeyboardInterrupt")


def test_ctrl_c_lost_in_a_garbage_collector_callback_while_the_command_imports_still_ends_it():
    """Raised in a gc callback (jax's, as jax imports), the startup handler's exit was dropped by Python
    ("Exception ignored") and the command went on to do its work."""
    code = ("import gc, os, signal, sys\nsys.argv[0] = os.path.join('bin', 'jaxfl')\nfired = []\n"
            "def sigint_inside(phase, info):\n"
            "    if phase == 'start' and not fired and signal.getsignal(signal.SIGINT).__name__ == 'interrupted':\n"
            "        fired.append(True)\n"
            "        signal.raise_signal(signal.SIGINT)  # its handler runs here, in the callback\n"
            "gc.callbacks.append(sigint_inside)\n"
            "from jaxfl import cli\nsys.exit(cli.main(['--help']))\n")
    command = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    # one line, not Python's "Exception ignored in: <function sigint_inside ...>" report of the lost exit too
    assert command.returncode == 130 and command.stdout == "", command.stdout + command.stderr
    assert command.stderr == "jaxfl: interrupted while starting: nothing written\n"


class SlowThenCtrlC(CtrlC):
    """Waits ``seconds`` at the first metrics row, then a Ctrl-C at the ``at``-th."""

    def __init__(self, at, seconds):
        super().__init__(at)
        self.seconds = seconds

    def log(self, row, step):
        if self.seen == 0:
            time.sleep(self.seconds)
        super().log(row, step)


def all_rows(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_resumed_run_s_metrics_keep_the_run_s_wall_clock(tmp_path):
    """metrics.csv's wall_time began again at 0 in the resumed process, while events.csv and
    summary.json went on from the checkpoint's time: version 9's row said 34 s, its aggregation 66 s."""
    settings = dict(TINY, max_updates=6, checkpoint_every=2, checkpoint_min_interval_s=0, output_dir=str(tmp_path),
                    run_name="cut")
    with pytest.raises(jaxfl.RunInterrupted):
        jaxfl.run_experiment(jaxfl.RunConfig(**settings), loggers=[SlowThenCtrlC(at=4, seconds=3)])
    resumed = jaxfl.resume_experiment(str(tmp_path / "cut"), progress=False)
    metrics = all_rows(os.path.join(resumed.run_dir, "metrics.csv"))
    walls = [float(row["wall_time"]) for row in metrics]
    assert walls == sorted(walls) and walls[-1] >= 3 and walls[-1] <= resumed.summary["wall_time_s"]
    aggregated = {int(row["version"]): float(row["wall_time"]) for row in all_rows(os.path.join(resumed.run_dir, "events.csv"))
                  if row["event"] == "aggregate"}
    # a version's metrics row is written just before its aggregate row: the same clock, within a second
    # (the bug put it the first process's 3 s and more behind)
    assert all(abs(float(row["wall_time"]) - aggregated[int(row["version"])]) < 1.0
               for row in metrics if int(row["version"]) > 0)
    assert resumed.summary["first_update_wall_s"] >= 3  # version 1 came after the wait, in the first process


@pytest.mark.parametrize("flag", [["--devices", "0"], ["--checkpoint-min-interval-s", "-5"]])
def test_a_bad_value_given_for_a_resume_is_named_as_given_not_as_config_json_s(tmp_path, capsys, flag):
    """It read "config.json does not hold a valid run config ... an earlier jaxfl may have taken this
    setting": the wrong file and the wrong advice (found 2026-12-05)."""
    from jaxfl import cli

    assert cli.main(["run", "--algorithm", "fedavg", "--model", "logreg", "--clients", "3", "--local-steps", "1",
                     "--max-updates", "1", "--no-progress", "--output-dir", str(tmp_path)]) == 0
    (run,) = os.listdir(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["run", "--resume", str(tmp_path / run), *flag])
    error = capsys.readouterr().err
    assert "(given for the resume; the run's own config.json is valid)" in error and "earlier jaxfl" not in error


def test_a_kill_inside_a_checkpoint_s_second_save_leaves_the_one_before_to_every_reader(tmp_path):
    # The final checkpoint saves the last update's number again: its old folder is removed, then the
    # new one renamed in. A kill between the two left `latest` naming a missing folder; `jaxfl run
    # --resume` took the one before, but a sweep restarted the cell from update 0 (deleting the run),
    # a comparison trained it again in a -2 folder and final_params found no checkpoint.
    from jaxfl.sweep import cell_state

    result = jaxfl.run_experiment(jaxfl.RunConfig(**{**TINY, "max_updates": 3, "checkpoint_every": 1},
                                                  output_dir=str(tmp_path), run_name="cut"))
    root = os.path.join(result.run_dir, "checkpoints")
    assert open(os.path.join(root, "latest")).read().strip() == "ckpt-000003"
    os.rename(os.path.join(root, "ckpt-000003"), os.path.join(root, "tmp-000003"))  # as the kill left it
    os.remove(os.path.join(result.run_dir, "summary.json"))
    assert checkpoint.latest(result.run_dir) == os.path.join(root, "ckpt-000002")
    assert cell_state(result.run_dir) == "resumable"
    assert checkpoint.final_params(result.run_dir, result.params) is not None
    # a kill between a rename and the pointer's update: the newer folder is the newest checkpoint
    os.rename(os.path.join(root, "tmp-000003"), os.path.join(root, "ckpt-000003"))
    with open(os.path.join(root, "latest"), "w") as handle:
        handle.write("ckpt-000002\n")
    assert checkpoint.latest(result.run_dir) == os.path.join(root, "ckpt-000003")


def test_a_folder_of_runs_given_for_a_run_names_what_it_holds(tmp_path, capsys):
    """load_run, --resume and jaxfl report of a comparison's --output-dir or a sweep folder said only
    that it was not a run (or sweep) folder; now each names the runs or the table inside."""
    import jaxfl
    from jaxfl.resume import ResumeError
    from jaxfl.sweep import run_sweep

    out = tmp_path / "cmp"
    assert cli.main(["run", "--algorithm", "fedavg,fedbuff", "--model", "logreg", "--clients", "3", "--local-steps",
                     "2", "--max-updates", "1", "--no-progress", "--output-dir", str(out)]) == 0
    runs = sorted(name for name in os.listdir(out) if (out / name).is_dir())
    with pytest.raises(FileNotFoundError, match=rf"it holds run directories \({runs[0]}, {runs[1]}\): give one of "
                                                rf"them; its comparison's table is {out / 'comparison.csv'}"):
        jaxfl.load_run(str(out))
    with pytest.raises(ResumeError, match=r"not a run directory of jaxfl run; it holds run directories"):
        jaxfl.resume_experiment(str(out))
    with pytest.raises(SystemExit):
        cli.main(["report", str(out), "--no-figures"])
    assert f"its comparison's table is one: jaxfl report {out / 'comparison.csv'}" in capsys.readouterr().err
    sweep = run_sweep({"model": "logreg", "clients": 3, "local_steps": 2, "max_updates": 1}, {"seed": [0]},
                      str(tmp_path / "sweep"), progress=False)
    with pytest.raises(FileNotFoundError, match=rf"it is a sweep folder, whose runs are in "
                                                rf"{tmp_path / 'sweep' / 'runs'}"):
        jaxfl.load_run(sweep.sweep_dir)


def test_jaxfl_run_resume_ends_with_the_line_a_run_ends_with(tmp_path, capsys):
    # "fedbuff: resumed, 6 updates, stop: update budget": no accuracy and no time to target
    import dataclasses

    import jaxfl
    from jaxfl.testing import _Interrupted, _interrupt_after

    config = jaxfl.RunConfig(algorithm="fedbuff", model="logreg", clients=4, local_steps=2, batch_size=8,
                             max_updates=6, buffer_size=2, checkpoint_every=1, progress=False,
                             output_dir=str(tmp_path), run_name="cut")
    with _interrupt_after(4), pytest.raises(_Interrupted):
        jaxfl.run_experiment(dataclasses.replace(config))
    assert cli.main(["run", "--resume", str(tmp_path / "cut"), "--no-progress"]) == 0
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"fedbuff: resumed, best accuracy {summary['best_accuracy']:.4f}, target 90% not reached, 6 updates, "
        f"stop: update budget → {tmp_path / 'cut'}")


def test_a_comparison_s_table_is_reported_with_its_figures_from_any_folder(tmp_path, monkeypatch, capsys):
    """comparison.csv names each run relative to where the comparison ran: jaxfl report of it joined
    that to the table's folder (cmp/cmp/fedavg-...) and refused the figures, "of cell None"."""
    from jaxfl.report import make_report

    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--algorithm", "fedavg,fedbuff", "--model", "logreg", "--clients", "3", "--local-steps",
                     "2", "--max-updates", "1", "--no-progress", "--output-dir", "cmp"]) == 0
    for where in (tmp_path, tmp_path / "elsewhere"):
        where.mkdir(exist_ok=True)
        monkeypatch.chdir(where)
        report = make_report(str(tmp_path / "cmp" / "comparison.csv"), out=str(where / "report"))
        assert any(path.endswith("timeline-fedbuff.png") for path in report.figures)
    # the runs' target (90%), which comparison.csv has no column for: it said "No run had a target accuracy"
    assert "No run had a target accuracy" not in report.markdown
    assert "Time to first reach 90% held-out accuracy" in report.markdown
    # the runs folder of a sweep, given to report: its sweep folder named
    from jaxfl.sweep import run_sweep

    sweep = run_sweep({"model": "logreg", "clients": 3, "local_steps": 2, "max_updates": 1}, {"seed": [0]},
                      str(tmp_path / "sweep"), progress=False)
    with pytest.raises(SystemExit):
        cli.main(["report", os.path.join(sweep.sweep_dir, "runs"), "--no-figures"])
    assert f"it is the runs folder of the sweep {sweep.sweep_dir}: jaxfl report {sweep.sweep_dir}" in \
        capsys.readouterr().err


def test_a_run_whose_module_plug_in_does_not_import_here_names_the_folder_to_resume_from(tmp_path, monkeypatch):
    """It read "config.json does not hold a valid run config", the import failure in brackets after
    the list of built-in algorithms (a review's module:Class run resumed from another folder)."""
    from jaxfl.resume import ResumeError

    started = tmp_path / "started"
    started.mkdir()
    result = jaxfl.run_experiment(jaxfl.RunConfig(**TINY, max_updates=2, output_dir=str(tmp_path / "runs")))
    record_path = os.path.join(result.run_dir, "config.json")
    record = json.load(open(record_path))
    record["config"]["algorithm"] = "plugin_module_only_there:Mine"  # as if run as a module beside `started`
    record["working_directory"] = str(started)
    json.dump(record, open(record_path, "w"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ResumeError) as refused:
        jaxfl.resume_experiment(result.run_dir)
    assert str(refused.value) == (
        f"cannot resume {result.run_dir!r}: algorithm reference 'plugin_module_only_there:Mine' could not be imported: "
        f"No module named 'plugin_module_only_there'; it was started in {str(started)!r}, where a module it names may "
        f"be importable alone: resume it from there (cd {started})")


@pytest.mark.parametrize("cut_at, timing_only", [(1, False), (2, False), (1, True), (2, True)])
def test_a_ctrl_c_just_after_a_comparison_run_returned_counts_that_run_finished(tmp_path, capsys, monkeypatch, cut_at,
                                                                                timing_only):
    """A Ctrl-C while a finished run's result was freed and its line printed (outside the guarded run)
    ended the comparison with a bare "jaxfl: interrupted" (the review's 1 in 6 demos); now that run is
    named finished and the rest not run (not "cut before its folder was made": a later run may hold a
    folder of its own from before, to be reused), or, after the last, the table unwritten."""
    flags = ["run", "--algorithm", "fedavg,fedbuff", "--model", "logreg", "--clients", "3", "--local-steps", "2",
             "--batch-size", "8", "--max-updates", "2", "--buffer-size", "2", "--no-progress",
             "--output-dir", str(tmp_path)] + (["--timing-only"] if timing_only else [])
    lines = []
    original = cli._run_line

    def cut_after(*args, **kwargs):
        lines.append(original(*args, **kwargs))
        if len(lines) == cut_at:
            raise KeyboardInterrupt
        return lines[-1]

    monkeypatch.setattr(cli, "_run_line", cut_after)
    assert cli.main(flags) == 130
    said = capsys.readouterr().err.strip().splitlines()[-1]
    fedavg = next(tmp_path.glob("fedavg-*"))
    finished = f"finished: fedavg ({fedavg})" + ("" if cut_at == 1 else f", fedbuff ({next(tmp_path.glob('fedbuff-*'))})")
    where, left = ("between two runs", "fedbuff") if cut_at == 1 else ("after its last run", "none")
    if timing_only:  # they write no comparison.csv: none is promised
        assert said == (f"jaxfl: interrupted: comparison fedavg,fedbuff of timing-only runs cut short {where}; "
                        f"{finished}; not run: {left}; jaxfl {' '.join(flags)} goes on (finished runs reused)"), said
    else:
        assert said == (f"jaxfl: interrupted: comparison fedavg,fedbuff cut short {where}, comparison.csv not written; "
                        f"{finished}; not run: {left}; jaxfl {' '.join(flags)} goes on (finished runs reused) and "
                        "writes the comparison"), said
    assert bool(list(tmp_path.glob("fedbuff-*"))) == (cut_at == 2)


def test_a_sweep_never_removes_a_run_folder_another_process_is_writing(tmp_path, capsys):
    # a `jaxfl run` into SWEEP/runs of a cell's config, before its first checkpoint, looks like a cell cut
    # before one: the sweep removed the folder under the run and trained there, and the two processes'
    # files mixed (a summary of one, a metrics.csv of the other: "metrics.csv is damaged" in the report)
    flags = ["sweep", "--out", str(tmp_path), "--algorithm", "fedavg", "--model", "logreg", "--clients", "3",
             "--local-steps", "2", "--batch-size", "8", "--max-updates", "3", "--no-stop-at-target", "--no-progress"]
    assert cli.main(flags) == 0
    (run,) = (tmp_path / "runs").iterdir()
    os.remove(run / "summary.json")  # as the other run has it: begun, no checkpoint yet
    import shutil

    shutil.rmtree(run / "checkpoints")
    before = {name: (run / name).read_bytes() for name in ("events.csv", "metrics.csv")}
    with _held(run) as holder:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            cli.main(flags)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "Traceback" not in err, err
        assert f"{run} is in use by process {holder.pid}, which is writing a run of this cell's config there" in err
        assert "run the same jaxfl sweep command again" in err
        assert before == {name: (run / name).read_bytes() for name in before}
    assert cli.main(flags) == 0  # free again: the cell is trained afresh
    assert "restart" in capsys.readouterr().out
    os.remove(run / "summary.json")  # past its first checkpoint: the resume's refusal said to resume it by hand
    with _held(run) as holder:
        with pytest.raises(SystemExit):
            cli.main(flags)
        err = capsys.readouterr().err
        assert f"{run} is in use by process {holder.pid}, which is writing a run of this cell's config there: the " \
               "sweep would resume it; wait for that run to end (or stop it) and run the same jaxfl sweep" in err, err
        assert "jaxfl run --resume" not in err


def test_a_run_of_the_config_another_process_is_writing_is_named_as_running_not_interrupted(tmp_path, capsys):
    # the same command in a second terminal: it was told the first run "is an interrupted run of this
    # config: jaxfl run --resume ... finishes it" (a resume the lock then refuses), or, before the first
    # checkpoint, nothing; two comparisons trained every run twice without a word
    flags = ["--algorithm", "fedavg", "--model", "logreg", "--clients", "3", "--local-steps", "2", "--batch-size", "8",
             "--max-updates", "3", "--checkpoint-every", "1", "--no-stop-at-target", "--no-progress",
             "--output-dir", str(tmp_path)]
    assert cli.main(["run", *flags]) == 0
    (run,) = tmp_path.iterdir()
    os.remove(run / "summary.json")  # cut after its checkpoints, as a run still going has it
    with _held(run) as holder:
        capsys.readouterr()
        assert cli.main(["run", *flags]) == 0
        err = capsys.readouterr().err
        assert (f"jaxfl: note: {run} is a run of this config that process {holder.pid} is writing now: this command "
                "starts a new run beside it, to the same results") in err
        assert "interrupted run" not in err
        import shutil

        shutil.rmtree(f"{run}-2")  # the run just made, which the comparison would reuse
        # past the run's first checkpoint the comparison said "resuming" and then advised resuming it by hand;
        # before it, it trained the run again without a word
        for folder in (run / "checkpoints", None):
            assert cli.main(["run", *flags[:1], "fedavg,fedbuff", *flags[2:]]) == 0
            printed = capsys.readouterr()
            assert (f"jaxfl: note: {run} is a run of this config that process {holder.pid} is writing now: this "
                    "comparison trains fedavg again beside it") in printed.err
            assert "resuming" not in printed.out
            shutil.rmtree(f"{run}-2")
            if folder is not None:
                shutil.rmtree(folder)


def test_a_folder_on_a_file_system_without_locks_runs_with_a_warning_not_as_in_use(tmp_path, monkeypatch):
    """flock's "no locks here" (ENOLCK: an NFS mount without its lock daemon; ENOTSUP: exFAT, some SMB
    mounts) was read as a lock another process holds: every run there was refused as "in use by
    process (unknown)". It is said, and the run goes on without the guard."""
    import errno
    import fcntl

    from jaxfl.resume import in_use_by

    def no_locks(handle, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    from jaxfl import resume

    monkeypatch.setattr(fcntl, "flock", no_locks)
    monkeypatch.setattr(resume, "_SAID_NO_LOCKS", set())
    with pytest.warns(UserWarning, match=r"could not lock the run and sweep folders on this file system \(No locks "
                                         r"available\): it may not support locks, so a second process writing"):
        result = jaxfl.run_experiment(jaxfl.RunConfig(**TINY, max_updates=2, output_dir=str(tmp_path)))
    assert result.summary["global_updates"] == 2
    assert in_use_by(result.run_dir) is None  # no way to tell: not "in use"
    with warnings.catch_warnings():  # said once a process (a sweep's cells would each say it)
        warnings.simplefilter("error")
        jaxfl.run_experiment(jaxfl.RunConfig(**TINY, max_updates=1, output_dir=str(tmp_path / "again")))
    try:  # an error of the work inside is its own, not chained to the lock's
        with resume.holding_lock(str(tmp_path)):
            raise RuntimeError("the work's own")
    except RuntimeError as error:
        assert error.__context__ is None


def test_native_windows_is_told_to_use_wsl_before_a_run_starts(tmp_path, monkeypatch):
    """Without fcntl (native Windows) the command said only "No module named 'fcntl'"."""
    monkeypatch.setitem(sys.modules, "fcntl", None)
    with pytest.raises(ImportError, match=r"POSIX file locks \(fcntl\), which native Windows lacks: run jaxfl under "
                                          r"WSL2"):
        jaxfl.run_experiment(jaxfl.RunConfig(**TINY, max_updates=1, output_dir=str(tmp_path)))
    assert not any((tmp_path).rglob("*.csv"))  # before any work
