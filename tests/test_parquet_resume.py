"""A Parquet event log that a crash left short of the newest checkpoint (a part lost or cut short:
its parts were not put on the disk with the checkpoint) made the run impossible to resume: "the
event log holds 131 rows, fewer than the checkpoint's 152", where an older checkpoint the log
does reach would do, as it does for a CSV log (found 2026-12-05). The run switches to Parquet
after 40 rows and writes parts of 4 rows, so that its log is several parts."""
import functools
import os

import numpy as np
import pytest

from jaxfl import runlog
from jaxfl.config import RunConfig
from jaxfl.experiment import resume_experiment, run_experiment
from jaxfl.resume import ResumeWarning
from jaxfl.runlog import parquet_rows
from jaxfl.runlog import read_events
from jaxfl.testing import metrics_without_wall_time

pytest.importorskip("pyarrow")
CONFIG = dict(algorithm="fedbuff", model="logreg", clients=4, local_steps=2, batch_size=16, buffer_size=2,
              max_updates=30, checkpoint_every=3, checkpoint_min_interval_s=0, stop_at_target=False, progress=False)


@pytest.fixture
def small_parquet_parts(monkeypatch):
    init = runlog.EventLog.__init__

    @functools.wraps(init)
    def small(self, *args, **kwargs):
        kwargs.update(switch_rows=40, part_rows=4, buffer_rows=4)
        init(self, *args, **kwargs)

    monkeypatch.setattr(runlog.EventLog, "__init__", small)


def _parts(run_dir):
    folder = os.path.join(run_dir, "events")
    return sorted((name for name in os.listdir(folder) if name.endswith(".parquet")),
                  key=lambda name: int(name[5:-8]))


@pytest.mark.parametrize("damage", ["lost", "cut short"])
def test_a_parquet_log_short_of_the_newest_checkpoint_resumes_from_one_it_reaches(tmp_path, small_parquet_parts,
                                                                                    damage):
    whole = run_experiment(RunConfig(**CONFIG, output_dir=str(tmp_path / "whole")))
    crashed = run_experiment(RunConfig(**CONFIG, output_dir=str(tmp_path / "crashed")))
    assert os.path.isdir(os.path.join(crashed.run_dir, "events"))  # switched to Parquet
    # the crash: the summary never written, the log's last part gone or cut short
    os.remove(os.path.join(crashed.run_dir, "summary.json"))
    last = os.path.join(crashed.run_dir, "events", _parts(crashed.run_dir)[-1])
    if damage == "lost":
        os.remove(last)
    else:
        with open(last, "r+b") as handle:
            handle.truncate(os.path.getsize(last) // 2)
    assert parquet_rows(crashed.run_dir) < parquet_rows(whole.run_dir)
    with pytest.warns(ResumeWarning, match=r"the event log \(events/\) holds \d+ rows, fewer than"):
        resumed = resume_experiment(crashed.run_dir, progress=False)
    ours, theirs = read_events(resumed.run_dir), read_events(whole.run_dir)
    assert set(ours) == set(theirs)
    assert all(np.array_equal(ours[name], theirs[name]) for name in ours if name != "wall_time")
    assert metrics_without_wall_time(resumed.run_dir) == metrics_without_wall_time(whole.run_dir)
