"""Resume refuses what would not continue the same run, and survives damaged checkpoints: an edited
config.json, flags that change the run, a dangling ``latest``, a deleted ``checkpoints/``, a foreign
config.json, a corrupt state.pkl and corrupt orbax data each get a one-line message (and a fallback
to the previous checkpoint where one reads back), from Python and from ``jaxfl run --resume``."""
import builtins
import dataclasses
import json
import os
import pathlib
import pickle
import shutil

import pytest

from jaxfl import checkpoint, cli, experiment
from jaxfl.config import RunConfig
from jaxfl.experiment import resume_experiment, run_experiment
from jaxfl.resume import ResumeError, ResumeWarning, RunFinished, candidates
from jaxfl.testing import assert_same_run, events_without_wall_time, metrics_without_wall_time
from conftest import Interrupted

FLAGS = dict(algorithm="fedbuff", dataset="mnist10k", model="mlp", clients=4, local_steps=2, batch_size=16,
             buffer_size=2, max_updates=3, checkpoint_every=1, stop_at_target=False, progress=False)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """An uninterrupted run with checkpoints after updates 2 and 3 (the two kept)."""
    output = tmp_path_factory.mktemp("runs")
    result = run_experiment(RunConfig(**FLAGS, output_dir=str(output), run_name="full"))
    assert sorted(n for n in os.listdir(os.path.join(result.run_dir, "checkpoints")) if n.startswith("ckpt-")) == \
        ["ckpt-000002", "ckpt-000003"]
    return result


def copy_run(finished, tmp_path, name="run") -> str:
    return shutil.copytree(finished.run_dir, str(tmp_path / name))


def logs(run_dir: str) -> dict:
    """The bytes of the files a resume would cut back and regrow."""
    return {name: pathlib.Path(run_dir, name).read_bytes() for name in ("events.csv", "metrics.csv")}


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the run's data and model are built: refusals come before any work."""
    def prepare(*args, **kwargs):
        raise AssertionError("resume started work before refusing")

    monkeypatch.setattr(experiment, "_prepare", prepare)


def cli_refusal(capsys, *args) -> str:
    """``jaxfl run --resume ...`` exits 2 with one line on stderr (no traceback); returns that line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--resume", *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxfl: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def edit_config(run_dir: str, **changes) -> None:
    path = os.path.join(run_dir, "config.json")
    with open(path) as handle:
        written = json.load(handle)
    for section, values in changes.items():
        (written["config"][section] if section != "config" else written["config"]).update(values)
    with open(path, "w") as handle:
        json.dump(written, handle)


def test_an_edited_config_json_is_refused_naming_each_field(finished, tmp_path, capsys, no_work):
    run = copy_run(finished, tmp_path)
    edit_config(run, config={"algorithm": "fedasync"}, data={"clients": 6}, client={"client_lr": 0.01})
    before = logs(run)
    with pytest.raises(ResumeError) as caught:
        resume_experiment(run, progress=False)
    message = str(caught.value)
    assert "config.json differs from the config ckpt-000003 was written with" in message
    for difference in ("algorithm: 'fedasync' (ckpt-000003 has 'fedbuff')", "clients: 6 (ckpt-000003 has 4)",
                       "client_lr: 0.01 (ckpt-000003 has 0.003)"):
        assert difference in message
    # the three fields alone: the run recorded FedBuff's rule as paper (written since 2026-12-06), which the
    # edited fedasync config reads as it is (an unset one it read as rule fedcompass, FedAsync's old default)
    assert "rule" not in message and message.count("(ckpt-000003 has") == 3
    assert "clients: 6" in cli_refusal(capsys, run)
    assert logs(run) == before


def test_flags_that_would_change_the_run_are_refused_and_equal_ones_accepted(finished, tmp_path, capsys, no_work):
    run = copy_run(finished, tmp_path)
    before = logs(run)
    err = cli_refusal(capsys, run, "--clients", "6", "--local-steps", "2", "--client-lr", "0.01", "--no-progress")
    assert "--clients 6 (the run has 4)" in err and "--client-lr 0.01 (the run has 0.003)" in err
    assert "--local-steps" not in err  # the run's own value: accepted
    err = cli_refusal(capsys, run, "--algorithm", "fedasync", "--port.alpha", "5")
    assert "--algorithm fedasync (the run has 'fedbuff')" in err and "--port.alpha 5" in err
    toml = tmp_path / "more.toml"
    toml.write_text("[client]\nlocal_steps = 5\nbatch_size = 16\n")
    err = cli_refusal(capsys, run, "--config", str(toml))
    assert f"local_steps=5 (in {toml}) (the run has 2)" in err and "batch_size" not in err
    with pytest.raises(ResumeError, match=r"only progress, checkpoint_min_interval_s, devices may differ.*: clients=6 \(the run has 4\); start a new run"):
        resume_experiment(run, overrides={"progress": True, "clients": 6, "local_steps": 2})
    assert logs(run) == before


def test_a_dangling_latest_pointer_is_an_error_or_falls_back_to_an_existing_checkpoint(finished, tmp_path, capsys,
                                                                                        no_work):
    run = copy_run(finished, tmp_path)
    root = os.path.join(run, "checkpoints")
    shutil.rmtree(os.path.join(root, "ckpt-000003"))
    with pytest.warns(ResumeWarning, match="latest names ckpt-000003, which does not exist; trying ckpt-000002"):
        assert [os.path.basename(f) for f in candidates(run)] == ["ckpt-000002"]
    shutil.rmtree(os.path.join(root, "ckpt-000002"))
    before = logs(run)
    with pytest.raises(ResumeError, match="latest names ckpt-000003, which does not exist, and no other checkpoint"):
        resume_experiment(run, progress=False)
    assert "nothing to resume from" in cli_refusal(capsys, run)
    assert logs(run) == before and not os.path.exists(os.path.join(root, "ckpt-000004"))  # no silent restart


def test_a_deleted_checkpoints_folder_is_an_error_not_a_restart(finished, tmp_path, capsys, no_work):
    run = copy_run(finished, tmp_path)
    shutil.rmtree(os.path.join(run, "checkpoints"))
    os.remove(os.path.join(run, "summary.json"))  # a run that has not finished
    before = logs(run)
    with pytest.raises(ResumeError, match="it has no checkpoints/ folder"):
        resume_experiment(run, progress=False)
    assert "no checkpoints/ folder" in cli_refusal(capsys, run)
    assert logs(run) == before and not os.path.exists(os.path.join(run, "checkpoints"))
    finished_run = copy_run(finished, tmp_path, "finished")  # finished, then its checkpoints deleted
    shutil.rmtree(os.path.join(finished_run, "checkpoints"))
    with pytest.raises(ResumeError, match="it has finished and has no checkpoints/ folder to run again from "
                                          r"\(deleted, or the run stopped before its first checkpoint\)"):
        resume_experiment(finished_run, progress=False)
    assert cli.main(["run", "--resume", finished_run]) == 0 and "has already finished" in capsys.readouterr().out


def test_a_finished_run_without_checkpoints_says_it_has_finished(tmp_path, capsys):
    """A run that wrote no checkpoint (none asked for, or stopped before its first) and finished was
    said to be "killed before its first checkpoint ... start the run again", exit 2."""
    result = run_experiment(RunConfig(**{**FLAGS, "checkpoint_every": None}, final_checkpoint=False,
                                      output_dir=str(tmp_path), run_name="none"))
    assert not os.path.exists(os.path.join(result.run_dir, "checkpoints"))
    before = logs(result.run_dir)
    with pytest.raises(ResumeError, match="it has finished and has no checkpoints/ folder to run again from .it "
                                          "asked for none"):
        resume_experiment(result.run_dir, progress=False)  # from Python: run again from its newest checkpoint
    with pytest.raises(RunFinished, match=r"has already finished \(3 updates, stop: update budget\)"):
        resume_experiment(result.run_dir, progress=False, again_if_finished=False)
    assert cli.main(["run", "--resume", result.run_dir]) == 0
    assert "has already finished" in capsys.readouterr().out
    assert logs(result.run_dir) == before


def test_an_int_given_for_a_float_field_in_python_resumes(tmp_path, crash_after_saves):
    """RunConfig(max_time=1000) ran, and its checkpoints stored 1000, but config.json reads back as
    1000.0: the resume was refused as an edited config.json naming no field."""
    config = RunConfig(**{**FLAGS, "max_updates": 4}, max_time=1000, client_lr=1, output_dir=str(tmp_path),
                       run_name="ints")
    disarm = crash_after_saves(1)
    with pytest.raises(Interrupted):
        run_experiment(config)
    disarm()
    resumed = resume_experiment(str(tmp_path / "ints"), progress=False)
    whole = run_experiment(dataclasses.replace(config, run_name="whole"))
    assert_same_run(resumed, whole)


@pytest.mark.parametrize("text, says", [
    ('[1, 2', "config.json is not valid JSON"),
    ('{"algorithm": "fedbuff", "clients": 4}', "config.json was not written by jaxfl run"),
    ('{"config": {"clientz": 3}}', "does not hold a valid run config: ConfigError: unknown config field 'clientz'"),
    (None, "its config.json is missing"),  # its checkpoints keep the settings: the message names one
])
def test_a_foreign_config_json_is_a_one_line_error(finished, tmp_path, capsys, no_work, text, says):
    run = copy_run(finished, tmp_path)
    if text is None:
        os.remove(os.path.join(run, "config.json"))
    else:
        (tmp_path / "run" / "config.json").write_text(text)
    with pytest.raises(ResumeError, match=says):
        resume_experiment(run, progress=False)
    assert says in cli_refusal(capsys, run)


def test_a_corrupt_state_pkl_falls_back_to_the_previous_checkpoint(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    with open(os.path.join(run, "checkpoints", "ckpt-000003", "state.pkl"), "wb") as handle:
        handle.write(b"garbage\n")
    os.remove(os.path.join(run, "summary.json"))  # as if cut off after its last checkpoint (a finished run is left as it is)
    capsys.readouterr()
    # flags equal to the run's are accepted with --resume
    assert cli.main(["run", "--resume", run, "--clients", "4", "--algorithm", "fedbuff", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("jaxfl: warning: "), err
    assert "resuming from ckpt-000002 (global update 2) because ckpt-000003: state.pkl unreadable" in err
    assert events_without_wall_time(run) == events_without_wall_time(finished.run_dir)
    assert metrics_without_wall_time(run) == metrics_without_wall_time(finished.run_dir)
    with open(os.path.join(run, "summary.json")) as handle:
        assert json.load(handle)["resumes"] == 1


def test_corrupt_orbax_data_falls_back_and_the_run_equals_an_uninterrupted_one(finished, tmp_path):
    run = copy_run(finished, tmp_path)
    data = os.path.join(run, "checkpoints", "ckpt-000003", "device", "ocdbt.process_0", "d")
    for name in os.listdir(data):
        with open(os.path.join(data, name), "wb") as handle:
            handle.write(b"not tensorstore data")
    with pytest.warns(ResumeWarning, match=r"resuming from ckpt-000002 \(global update 2\) because "
                                           r"ckpt-000003: device data unreadable"):
        resumed = resume_experiment(run, progress=False)
    assert resumed.summary["resumes"] == 1
    assert_same_run(finished, resumed, "resumed past corrupt orbax data vs uninterrupted")


def test_a_cut_orbax_file_is_named_before_orbax_reads_and_an_older_checkpoint_without_sizes_restores(
        finished, tmp_path, monkeypatch):
    run = copy_run(finished, tmp_path)
    data = os.path.join(run, "checkpoints", "ckpt-000003", "device", "ocdbt.process_0", "d")
    cut = sorted(os.listdir(data))[0]
    size = os.path.getsize(os.path.join(data, cut))
    os.truncate(os.path.join(data, cut), size - 1)
    # an older jaxfl's checkpoint has no sizes: restored unchecked
    os.remove(os.path.join(run, "checkpoints", "ckpt-000002", checkpoint.DEVICE_SIZES))
    monkeypatch.setattr(checkpoint, "ABANDONED_READS", False)
    with pytest.raises(checkpoint.DeviceFilesDamaged, match=rf"ckpt-000003 is damaged: ocdbt.process_0/d/{cut} is"):
        checkpoint.final_params(run, finished.params)
    with pytest.warns(ResumeWarning, match=rf"because ckpt-000003: device data unreadable \(ocdbt.process_0/d/{cut} "
                                           rf"is {size - 1} bytes, written with {size}\)"):
        resumed = resume_experiment(run, progress=False)
    assert not checkpoint.ABANDONED_READS  # orbax did not start a restore of the damaged checkpoint
    assert_same_run(finished, resumed, "resumed past a cut orbax file vs uninterrupted")


def test_no_readable_checkpoint_is_a_one_line_error(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    shutil.rmtree(os.path.join(run, "checkpoints", "ckpt-000003", "device"))
    with open(os.path.join(run, "checkpoints", "ckpt-000002", "state.pkl"), "wb") as handle:
        handle.write(b"x")
    os.remove(os.path.join(run, "summary.json"))  # unfinished (the command line leaves a finished run as it is)
    before = logs(run)
    with pytest.raises(ResumeError) as caught:
        resume_experiment(run, progress=False)
    message = str(caught.value)
    assert "no checkpoint reads back: ckpt-000003: device data unreadable" in message
    assert "ckpt-000002: state.pkl unreadable" in message and "\n" not in message
    assert "no checkpoint reads back" in cli_refusal(capsys, run)
    assert logs(run) == before


def test_a_resume_past_truncated_orbax_data_is_one_line_without_the_abandoned_reads(finished, tmp_path):
    # orbax's reads of the other arrays, never awaited once one failed, printed 130 lines of "Exception
    # ignored in: <coroutine ...>" and tensorstore specs at exit around the command's one line
    import subprocess
    import sys

    run = copy_run(finished, tmp_path)
    os.remove(os.path.join(run, "summary.json"))
    for name in ("ckpt-000002", "ckpt-000003"):
        data = os.path.join(run, "checkpoints", name, "device", "ocdbt.process_0", "d")
        for part in os.listdir(data):
            path = os.path.join(data, part)
            os.truncate(path, os.path.getsize(path) // 2)
    done = subprocess.run([sys.executable, "-m", "jaxfl", "run", "--resume", run, "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    # the sizes written with the checkpoint name the cut file before orbax reads anything (its reads of
    # truncated data went on failing after the restore did and printed now and then past every filter)
    said = done.stderr.strip()
    assert said.startswith("jaxfl: error: cannot resume") and "\n" not in said, done.stderr[-3000:]
    assert "no checkpoint reads back: ckpt-000003: device data unreadable (ocdbt.process_0/d/" in said, said
    assert "bytes, written with" in said


def test_a_resume_reads_the_runs_config_json_once(finished, tmp_path, monkeypatch):
    run = copy_run(finished, tmp_path)
    path, opened, real_open = os.path.abspath(os.path.join(run, "config.json")), [], builtins.open

    def counting_open(file, *args, **kwargs):  # the real open, counting the opens of config.json
        if isinstance(file, (str, os.PathLike)) and os.path.abspath(file) == path:
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    assert resume_experiment(run, progress=False).summary["resumes"] == 1
    assert len(opened) == 1


def test_a_checkpoint_without_the_simulations_step_count_resumes_to_the_same_run(tmp_path):
    """Older checkpoints' simulations hold no client-step count (it is the engine's): the client-step
    budget still stops the resumed run where the uninterrupted one stopped."""
    config = RunConfig(**{**FLAGS, "max_updates": 6, "max_client_steps": 12}, output_dir=str(tmp_path))
    full = run_experiment(config)
    assert full.summary["stop_reason"] == "client-step budget" and full.summary["global_updates"] == 3
    run = shutil.copytree(full.run_dir, str(tmp_path / "old"))
    shutil.rmtree(os.path.join(run, "checkpoints", "ckpt-000003"))  # resume from update 2
    state_path = os.path.join(run, "checkpoints", "ckpt-000002", "state.pkl")
    with open(state_path, "rb") as handle:
        state = pickle.load(handle)
    state["simulation"].__dict__.pop("aggregated_steps", None)  # as a checkpoint from before the budgets
    with open(state_path, "wb") as handle:
        pickle.dump(state, handle)
    os.remove(state_path + ".sha256")  # older checkpoints have no digest of state.pkl either
    with pytest.warns(ResumeWarning, match="trying ckpt-000002"):
        resumed = resume_experiment(run, progress=False)
    assert_same_run(full, resumed, "resumed from a checkpoint without the simulation's step count")


def _checkpoint_names(run_dir: str) -> list[str]:
    return sorted(os.listdir(os.path.join(run_dir, "checkpoints")))


def test_logs_shorter_than_the_newest_checkpoint_fall_back_to_one_they_reach(finished, tmp_path):
    # the logs are flushed, not synced, between checkpoints: a machine's crash can keep a checkpoint and
    # lose the end of metrics.csv. Cutting the file back to the checkpoint's offset then padded it with
    # zero bytes (a corrupt table that load_run could not read) instead of resuming from a checkpoint
    # the logs reach
    run = copy_run(finished, tmp_path)
    path = os.path.join(run, "metrics.csv")
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.truncate(size - 5)
    with pytest.warns(ResumeWarning, match=rf"resuming from ckpt-000002 \(global update 2\) because ckpt-000003: "
                                           rf"metrics.csv holds {size - 5} bytes, fewer than the \d+ it had when "
                                           rf"ckpt-000003 was written; moved into .*checkpoints/skipped"):
        resumed = resume_experiment(run, progress=False)
    assert_same_run(finished, resumed, "resumed from the checkpoint the logs reach vs uninterrupted")
    assert b"\0" not in pathlib.Path(path).read_bytes()
    assert _checkpoint_names(run) == ["ckpt-000002", "ckpt-000003", "latest", "skipped"]
    assert os.listdir(os.path.join(run, "checkpoints", "skipped")) == ["ckpt-000003"]


def test_a_missing_log_is_a_one_line_error_that_cuts_no_other_log(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    os.remove(os.path.join(run, "metrics.csv"))
    os.remove(os.path.join(run, "summary.json"))  # unfinished (the command line leaves a finished run as it is)
    events = pathlib.Path(run, "events.csv").read_bytes()
    with pytest.raises(ResumeError) as caught:
        resume_experiment(run, progress=False)
    assert str(caught.value).endswith("no checkpoint reads back: ckpt-000003: metrics.csv is missing; "
                                      "ckpt-000002: metrics.csv is missing; restore the run's logs named above "
                                      "(a copy of the folder?), or start the run again: the command that started "
                                      "it, without --resume, starts a new run beside this one")
    assert "metrics.csv is missing" in cli_refusal(capsys, run)
    assert pathlib.Path(run, "events.csv").read_bytes() == events  # not cut back
    assert _checkpoint_names(run) == ["ckpt-000002", "ckpt-000003", "latest"]


def test_a_checkpoint_skipped_as_unreadable_is_set_aside_not_named_by_the_next_interrupt(finished, tmp_path):
    # it stayed the newest: the next interrupt named it as the run's checkpoint, every resume warned
    # about it again, and it counted among the two checkpoints a run keeps, so a good one was pruned
    import jaxfl

    run = copy_run(finished, tmp_path)
    with open(os.path.join(run, "checkpoints", "ckpt-000003", "state.pkl"), "wb") as handle:
        handle.write(b"garbage\n")

    jaxfl.request_stop("a test")  # taken at the resumed run's first event: before update 3
    with pytest.warns(ResumeWarning, match=r"ckpt-000003: state.pkl unreadable .*; moved into"):
        with pytest.raises(jaxfl.RunInterrupted) as caught:
            resume_experiment(run, progress=False)
    assert os.path.basename(caught.value.checkpoint) == "ckpt-000002"
    assert candidates(run, warn=False) == [caught.value.checkpoint]
    with open(os.path.join(run, "checkpoints", "skipped", "ckpt-000003", "state.pkl"), "rb") as handle:
        assert handle.read() == b"garbage\n"  # kept for a look, out of the resume's way
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeWarning)
        resumed = resume_experiment(run, progress=False)
    assert_same_run(finished, resumed, "resumed twice past a corrupt checkpoint vs uninterrupted")


def test_a_run_naming_relative_paths_resumes_only_from_the_folder_it_was_started_in(tmp_path, monkeypatch, capsys):
    # from elsewhere the same relative path names another file or none: an algorithm file was reported
    # as "algorithm=... is not allowed: one of fedavg, ..." with its cause cut off at 200 characters
    import numpy as np

    started, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    started.mkdir()
    elsewhere.mkdir()
    rng = np.random.default_rng(0)
    np.savez(started / "d.npz", x_train=rng.random((40, 6), np.float32), y_train=np.arange(40) % 2,
             x_test=rng.random((10, 6), np.float32), y_test=np.arange(10) % 2)
    monkeypatch.chdir(started)
    import jaxfl

    jaxfl.request_stop("a test")  # stopped at its first event, with a checkpoint
    with pytest.raises(experiment.RunInterrupted) as caught:
        run_experiment(RunConfig(**{**FLAGS, "dataset": "npz", "model": "logreg"}, data_dir="d.npz",
                                 output_dir=str(tmp_path / "runs")))
    run = caught.value.run_dir
    monkeypatch.chdir(elsewhere)
    with pytest.raises(ResumeError, match=rf"cannot resume .* from here: it was started in '{started}' and its "
                                          rf"config names data_dir='d.npz' relative to that folder; resume it from "
                                          rf"there \(cd {started}\)"):
        resume_experiment(run, progress=False)
    assert "it was started in" in cli_refusal(capsys, run)
    monkeypatch.chdir(started)
    assert resume_experiment(run, progress=False).summary["global_updates"] == FLAGS["max_updates"]


def test_a_misspelt_override_or_data_for_a_named_dataset_is_refused_as_such(finished, tmp_path, no_work):
    # they were refused as changes ("these would change it: max_updatez=20") and as an edited
    # config.json ("config.json differs ... data_fingerprint ... restore config.json")
    import numpy as np

    run = copy_run(finished, tmp_path)
    with pytest.raises(ResumeError, match=r"cannot resume with max_updatez=20: unknown config field 'max_updatez' "
                                          r"\(did you mean .*max_updates"):
        resume_experiment(run, overrides={"max_updatez": 20})
    arrays = (np.zeros((8, 28, 28), np.float32), np.zeros(8, np.int32), np.zeros((2, 28, 28), np.float32),
              np.zeros(2, np.int32))
    with pytest.raises(ResumeError, match=r"with data=: it was made on dataset 'mnist10k', loaded by name, not on "
                                          r"data passed in Python; resume it without data="):
        resume_experiment(run, data=arrays)


def test_a_checkpoint_whose_removal_was_cut_short_is_skipped_as_incomplete(finished, tmp_path, recwarn):
    # the older of three checkpoints is removed after the newest is written; a kill inside that removal
    # left ckpt-000001 with some of its files, which a resume took for an older jaxfl's checkpoint
    # without config.json ("config.json is trusted as it is") before failing on its state.pkl
    run = copy_run(finished, tmp_path)
    os.remove(os.path.join(run, "metrics.csv"))
    os.remove(os.path.join(run, "summary.json"))
    half = os.path.join(run, "checkpoints", "ckpt-000001")
    shutil.copytree(os.path.join(run, "checkpoints", "ckpt-000002", "device"), os.path.join(half, "device"))
    with pytest.raises(ResumeError, match="ckpt-000001: incomplete \\(no state.pkl\\)"):
        resume_experiment(run, progress=False)
    assert not [w for w in recwarn if "trusted" in str(w.message)]


def test_a_checkpoint_is_renamed_out_of_the_checkpoint_names_before_it_is_deleted(tmp_path, monkeypatch):
    from jaxfl import checkpoint

    folder = tmp_path / "ckpt-000001"
    (folder / "device").mkdir(parents=True)
    (folder / "state.pkl").write_bytes(b"state")
    real_rmtree = shutil.rmtree

    def killed_inside(path, *args, **kwargs):  # a kill once the removal has begun
        if os.path.exists(os.path.join(path, "state.pkl")):
            os.remove(os.path.join(path, "state.pkl"))
            raise KeyboardInterrupt
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_inside)
    with pytest.raises(KeyboardInterrupt):
        checkpoint._remove(str(tmp_path), "ckpt-000001")
    assert sorted(os.listdir(tmp_path)) == ["removing-ckpt-000001"]  # no partial ckpt-… for a resume to try


def test_the_next_checkpoint_removes_what_a_cut_short_removal_left(finished, tmp_path):
    run = copy_run(finished, tmp_path)
    os.remove(os.path.join(run, "summary.json"))
    shutil.copytree(os.path.join(run, "checkpoints", "ckpt-000002"), os.path.join(run, "checkpoints",
                                                                                  "removing-ckpt-000001"))
    resume_experiment(run, progress=False)  # its final checkpoint is written again
    assert _checkpoint_names(run) == ["ckpt-000002", "ckpt-000003", "latest"]


def test_a_setting_an_earlier_jaxfl_took_and_this_one_refuses_is_named_with_what_to_do(finished, tmp_path, capsys,
                                                                                     no_work):
    # e.g. an evaluation grid longer than the budget, refused since it evaluated the initial model alone
    run = copy_run(finished, tmp_path)
    edit_config(run, budget={"max_time": 50.0, "eval_interval": 100.0})
    os.remove(os.path.join(run, "summary.json"))
    with pytest.raises(ResumeError, match=r"eval_interval=100.0 is not allowed: at most max_time \(50\).*; an earlier "
                                          r"jaxfl may have taken this setting, which this one refuses: start the run "
                                          r"again with it changed"):
        resume_experiment(run, progress=False)


def test_process_0_records_the_sizes_of_its_own_orbax_files_where_several_processes_write(tmp_path):
    # another host's files may show process 0 a size a shared file system has not caught up with: a
    # good checkpoint would then read as damaged
    for path in ("_METADATA", "d/abc", "ocdbt.process_0/d/x", "ocdbt.process_1/d/y", "ocdbt.process_12/manifest.ocdbt",
                 "array_metadatas/process_0", "array_metadatas/process_1"):
        os.makedirs(os.path.dirname(tmp_path / path), exist_ok=True)
        (tmp_path / path).write_bytes(b"x" * len(path))
    everything = checkpoint._device_sizes(str(tmp_path))
    own = checkpoint._device_sizes(str(tmp_path), own_only=True)
    assert len(everything) == 7 and everything["ocdbt.process_1/d/y"] == len("ocdbt.process_1/d/y")
    assert sorted(own) == ["_METADATA", "array_metadatas/process_0", "d/abc", "ocdbt.process_0/d/x"]



def test_an_unreadable_sizes_file_leaves_the_checkpoint_to_orbax(finished, tmp_path):
    # written after the orbax data, a power loss may leave it empty where the data is whole: that good
    # checkpoint was skipped as "device data unreadable (JSONDecodeError ...)"
    run = copy_run(finished, tmp_path)
    sizes = os.path.join(run, "checkpoints", "ckpt-000003", checkpoint.DEVICE_SIZES)
    with open(sizes) as handle:
        name = sorted(json.load(handle))[0]
    for nonsense in ({name: -1}, {name: True}, {"../state.pkl": 1}, {"/etc/hostname": 1}, [1]):
        with open(sizes, "w") as handle:
            json.dump(nonsense, handle)
        checkpoint._check_device_sizes(os.path.dirname(sizes))  # no record of the files: nothing to compare
    open(sizes, "w").close()
    import jax
    import numpy as np

    restored = jax.tree.leaves(checkpoint.final_params(run, finished.params))
    assert all(np.array_equal(x, y) for x, y in zip(restored, jax.tree.leaves(finished.params), strict=True))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeWarning)  # not "resuming from ckpt-000002 because ..."
        assert resume_experiment(run, progress=False).summary["resumes"] == 1
