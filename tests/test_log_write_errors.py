"""A disk that fills up while a run writes its logs (not a checkpoint): one line naming the run, what
it keeps and how to go on (it was an OSError traceback and exit status 1), and the resume that goes on
from the newest checkpoint ends with the logs of a run that was never stopped.

The disk is made "full" for real, with a file-size limit (RLIMIT_FSIZE: a write past it fails with
EFBIG, as one on a full disk fails with ENOSPC), set by a logger once the first checkpoint is written
and lifted again before the resume."""
import os
import resource
import signal

import pytest

import jaxfl
from jaxfl import checkpoint
from jaxfl.testing import events_without_wall_time, metrics_without_wall_time

CONFIG = dict(algorithm="fedasync", model="logreg", clients=3, local_steps=1, batch_size=8, stop_at_target=False,
              progress=False, max_updates=60, checkpoint_every=20, run_name="r")


class FileSizeLimitAt:
    """At version ``step``'s metrics row: every file write past the run's largest log so far fails."""

    def __init__(self, run_dir, step):
        self.run_dir, self.step, self.set = run_dir, step, False

    def log(self, row, step):
        if step == self.step:
            largest = max(os.path.getsize(os.path.join(self.run_dir, name)) for name in os.listdir(self.run_dir)
                          if name.endswith(".csv"))
            resource.setrlimit(resource.RLIMIT_FSIZE, (largest + 1, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            self.set = True

    def close(self):
        pass


@pytest.fixture
def lifted_afterwards():
    """The soft file-size limit and SIGXFSZ's handler as they were, whatever the test did."""
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    yield
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    signal.signal(signal.SIGXFSZ, handler)


def test_a_full_disk_while_the_logs_are_written_is_one_line_and_the_run_resumes(tmp_path, lifted_afterwards):
    run = tmp_path / "out" / "r"
    limit = FileSizeLimitAt(str(run), step=30)  # after checkpoint 20, before checkpoint 40
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    with pytest.raises(checkpoint.LogWriteError) as failed:
        jaxfl.run_experiment(jaxfl.RunConfig(**CONFIG, output_dir=str(tmp_path / "out")), loggers=[limit])
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)  # "free space"
    assert limit.set
    assert str(failed.value) == (f"could not write the run's logs in {run}: File too large; once there is space: "
                                 f"{run} keeps its logs and checkpoints up to update 20: jaxfl run --resume {run} "
                                 f"(resume_experiment) goes on from there")
    assert isinstance(failed.value, checkpoint.DiskWriteError)  # the CLI's exit status 74, as for a checkpoint
    assert not (run / "summary.json").exists()
    resumed = jaxfl.resume_experiment(str(run), progress=False)
    full = jaxfl.run_experiment(jaxfl.RunConfig(**CONFIG, output_dir=str(tmp_path / "full")))
    assert resumed.summary["global_updates"] == full.summary["global_updates"] == 60
    assert events_without_wall_time(run) == events_without_wall_time(full.run_dir)
    assert metrics_without_wall_time(run) == metrics_without_wall_time(full.run_dir)
    assert (run / "class_accuracy.csv").read_bytes() == (tmp_path / "full" / "r" / "class_accuracy.csv").read_bytes()


def test_an_error_of_the_disk_that_is_not_a_full_one_is_raised_as_it_is(tmp_path):
    # a file the run may not write is not "free space and resume": the OSError goes out unchanged
    config = jaxfl.RunConfig(**CONFIG, output_dir=str(tmp_path / "out"))

    class ALoggerDeniedItsFile:
        def log(self, row, step):
            if step == 5:
                raise PermissionError(13, "Permission denied", str(tmp_path / "out" / "r" / "events.csv"))

        def close(self):
            pass

    with pytest.raises(PermissionError) as failed:
        jaxfl.run_experiment(config, loggers=[ALoggerDeniedItsFile()])
    assert not isinstance(failed.value, checkpoint.DiskWriteError)


def test_a_full_disk_as_a_sweep_writes_its_table_is_one_line_and_the_same_command_goes_on(tmp_path, monkeypatch,
                                                                                          capsys):
    # the table written after a cell finished: a 59-line chained traceback (the table written again on the
    # way out failed too), status 1, and results.csv.tmp left behind
    import errno

    from jaxfl import cli, runlog

    written = runlog.write_csv
    calls = []

    def full_after_the_first_cell(path, rows, columns):
        calls.append(len(rows))
        if rows:
            open(path + ".tmp", "w").close()  # begun, as a write that fails half way
            raise OSError(errno.ENOSPC, "No space left on device", path + ".tmp")
        return written(path, rows, columns)

    monkeypatch.setattr(runlog, "write_csv", full_after_the_first_cell)
    out = tmp_path / "sweep"
    command = ["sweep", "--out", str(out), "--algorithm", "fedavg,fedasync", "--clients", "3", "--timing-only",
               "--max-updates", "3", "--no-progress"]
    with pytest.raises(SystemExit) as exited:
        cli.main(command)
    assert exited.value.code == 74
    said = capsys.readouterr().err
    assert "Traceback" not in said and said.count("jaxfl: error:") == 1
    assert f"jaxfl: error: could not write the sweep's results table in {out}: No space left on device;" in said
    assert "run the same jaxfl sweep command again" in said
    assert not (out / "results.csv.tmp").exists()
    monkeypatch.setattr(runlog, "write_csv", written)  # space again
    assert cli.main(command) == 0  # the finished cell skipped, the other run: both in the table
    assert (out / "results.csv").read_text().count("\n") == 3


def test_an_os_error_no_step_names_is_one_line_of_the_command(tmp_path, monkeypatch, capsys):
    # a resume whose metrics.csv could not be opened (chattr +i): a 38-line PermissionError traceback, status 1
    from jaxfl import cli, experiment

    run = jaxfl.run_experiment(jaxfl.RunConfig(**{**CONFIG, "max_updates": 4, "checkpoint_every": 2},
                                               output_dir=str(tmp_path / "out")))
    os.remove(os.path.join(run.run_dir, "summary.json"))  # cut short, as if interrupted after its last checkpoint

    # raised as jaxfl's own code raises it: its frame a file of jaxfl's (one of the user's keeps its traceback)
    source = "def not_permitted(path, *args, **kwargs):\n    raise PermissionError(1, 'Operation not permitted', path)\n"
    scope = {}
    exec(compile(source, os.path.join(os.path.dirname(experiment.__file__), "experiment.py"), "exec"), scope)
    monkeypatch.setattr(experiment, "_open_table", scope["not_permitted"])
    assert cli.main(["run", "--resume", run.run_dir, "--no-progress"]) == 74
    said = capsys.readouterr().err
    assert "Traceback" not in said
    assert "jaxfl: error: Operation not permitted: " in said and "run the same command again" in said


def test_a_full_disk_before_the_run_has_its_config_leaves_no_folder(tmp_path, monkeypatch):
    # the folder kept a .lock and a half-written client_samples.npy.tmp, the message said it "holds the logs
    # until it stopped", and the same command again ran into a -2 folder beside it
    import errno

    from jaxfl import experiment

    written = experiment._write_run_config

    def full(run_dir, *args, **kwargs):
        open(os.path.join(run_dir, "config.json.tmp"), "w").close()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(experiment, "_write_run_config", full)
    config = jaxfl.RunConfig(**{**CONFIG, "max_updates": 2}, output_dir=str(tmp_path / "out"))
    with pytest.raises(checkpoint.LogWriteError, match="No space left on device; nothing of the run was kept "
                                                       r"\(its folder is removed\): free space and start it again"):
        jaxfl.run_experiment(config)
    assert os.listdir(tmp_path / "out") == []
    monkeypatch.setattr(experiment, "_write_run_config", written)
    assert jaxfl.run_experiment(config).run_dir == str(tmp_path / "out" / "r")


def test_an_os_error_of_the_users_own_code_keeps_its_traceback(tmp_path, monkeypatch, capsys):
    # a model file's factory that opened a folder, on resume: one line "Is a directory" and status 74 hid
    # where in the user's code it came from
    from jaxfl import cli, experiment

    mine = tmp_path / "mine.py"
    mine.write_text("def opens():\n    open(__file__.rpartition('/')[0])\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("mine_os_error", mine)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = jaxfl.run_experiment(jaxfl.RunConfig(**{**CONFIG, "max_updates": 4, "checkpoint_every": 2},
                                               output_dir=str(tmp_path / "out")))
    os.remove(os.path.join(run.run_dir, "summary.json"))

    def users_code(*args, **kwargs):
        module.opens()

    monkeypatch.setattr(experiment, "_open_table", users_code)
    with pytest.raises(IsADirectoryError):
        cli.main(["run", "--resume", run.run_dir, "--no-progress"])
