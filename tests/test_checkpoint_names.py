"""Checkpoints past a million global updates: their folders (ckpt-1000002) were ordered as text,
before ckpt-999999, so each run pruned its newest checkpoint as it wrote it, the final one too, and
a resume went back to update 999,999 (found 2026-12-05). The run here is named as if it were
999,990 updates further on: only the folder names move, as they would in a run that long."""
import os

import pytest

import jaxfl
from jaxfl import checkpoint
from jaxfl.config import RunConfig
from jaxfl.experiment import RunInterrupted, resume_experiment, run_experiment
from jaxfl.testing import events_without_wall_time, metrics_without_wall_time

SHIFT = 999_990
CONFIG = dict(algorithm="fedbuff", model="logreg", clients=4, local_steps=2, batch_size=16, buffer_size=2,
              max_updates=30, checkpoint_every=3, checkpoint_min_interval_s=0, stop_at_target=False, progress=False)


@pytest.fixture
def named_past_a_million(monkeypatch):
    save = checkpoint._save
    monkeypatch.setattr(checkpoint, "_save", lambda run_dir, number, *args, **kwargs:
                        save(run_dir, number + SHIFT, *args, **kwargs))


def test_a_run_past_a_million_updates_keeps_its_newest_checkpoints(tmp_path, named_past_a_million):
    result = run_experiment(RunConfig(**CONFIG, output_dir=str(tmp_path)))
    root = os.path.join(result.run_dir, "checkpoints")
    assert sorted(name for name in os.listdir(root) if name.startswith("ckpt-")) == ["ckpt-1000017", "ckpt-1000020"]
    assert os.path.basename(checkpoint.latest(result.run_dir)) == "ckpt-1000020"


def test_a_run_past_a_million_updates_resumes_from_its_newest_checkpoint(tmp_path, named_past_a_million):
    whole = run_experiment(RunConfig(**CONFIG, output_dir=str(tmp_path / "whole")))
    class StopAfter20:  # asks for a stop (a checkpoint at the next event, then RunInterrupted)
        name = "stop-after-20"

        def log(self, row, step):
            if step == 20:
                jaxfl.request_stop("a test")

        def close(self):
            pass

    with pytest.raises(RunInterrupted) as caught:
        run_experiment(RunConfig(**CONFIG, output_dir=str(tmp_path / "cut")), loggers=[StopAfter20()])
    assert checkpoint.checkpoint_order(os.path.basename(caught.value.checkpoint))[0] > 1_000_000
    resumed = resume_experiment(caught.value.run_dir, progress=False)
    assert events_without_wall_time(resumed.run_dir) == events_without_wall_time(whole.run_dir)
    assert metrics_without_wall_time(resumed.run_dir) == metrics_without_wall_time(whole.run_dir)


def test_a_full_disk_at_the_latest_pointer_names_the_checkpoint_it_did_write(tmp_path, monkeypatch):
    """The checkpoint's folder was complete and in place when writing `latest` failed, and the run said
    "it has no checkpoint yet; start the run again" (found 2026-12-05); a resume goes on from it."""
    import builtins
    import errno

    from jaxfl.checkpoint import CheckpointWriteError

    real_open = builtins.open

    def full_at_latest(path, *args, **kwargs):
        if str(path).endswith("latest.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_open(path, *args, **kwargs)

    config = RunConfig(**{**CONFIG, "max_updates": 10}, output_dir=str(tmp_path / "cut"))
    monkeypatch.setattr(checkpoint, "open", full_at_latest, raising=False)
    with pytest.raises(CheckpointWriteError, match=r"could not write checkpoint 3 .*logs and checkpoints kept up to "
                                                   r"update 3; free space and resume"):
        run_experiment(config)
    monkeypatch.undo()
    (run,) = os.listdir(tmp_path / "cut")
    assert not os.path.exists(tmp_path / "cut" / run / "checkpoints" / "latest.tmp")
    resumed = resume_experiment(str(tmp_path / "cut" / run), progress=False)
    whole = run_experiment(RunConfig(**{**CONFIG, "max_updates": 10}, output_dir=str(tmp_path / "whole")))
    assert events_without_wall_time(resumed.run_dir) == events_without_wall_time(whole.run_dir)
