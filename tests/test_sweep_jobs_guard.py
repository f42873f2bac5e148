"""An interrupted sweep cell goes on with the --jobs its own run began under, whatever other grids
ran in the same folder since with other jobs (it was the last call's jobs that decided)."""
import json
import os

import pytest

from jaxfl.config import ConfigError
from jaxfl.sweep import _check_jobs, _check_grid, _expand, _write_definition

BASE = {"dataset": "mnist10k", "model": "mlp", "clients": 3, "local_steps": 2, "batch_size": 16, "max_updates": 2}
WIDE = {"algorithm": ["fedavg", "fedbuff"], "seed": [0, 1]}
NARROW = {"algorithm": ["fedbuff"], "seed": [1]}  # not cell 0 of WIDE

# jobs=2 takes a core each
pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else False,
                                reason="jobs=2 needs 2 cores")


def call(folder, grid, jobs, resumable=()):
    """What run_sweep records of a call: the cells' states (``resumable``: run folders with a
    checkpoint), the jobs check, then sweep.json."""
    grid = _check_grid(grid)
    cells, _ = _expand(BASE, grid, folder)
    states = {cell.index: "resumable" if os.path.basename(cell.run_dir) in resumable else "new" for cell in cells}
    _check_jobs(jobs, folder, cells, states)
    _write_definition(folder, BASE, grid, None, cells, jobs, states)
    return cells


def test_each_interrupted_cell_goes_on_with_its_own_jobs(tmp_path):
    folder = str(tmp_path)
    cell0 = call(folder, WIDE, 1)[0]  # interrupted after cell 0 checkpointed (jobs 1)
    name0 = os.path.basename(cell0.run_dir)
    narrow = call(folder, NARROW, 2, resumable=(name0,))  # a narrower grid with jobs 2, interrupted too
    name_narrow = os.path.basename(narrow[0].run_dir)
    interrupted = (name0, name_narrow)
    with open(os.path.join(folder, "sweep.json")) as handle:
        definition = json.load(handle)
    assert definition["run_jobs"][os.path.relpath(cell0.run_dir, folder)] == 1  # kept though not in this grid
    assert definition["cells"][0]["jobs"] == 2
    # cell 0 began under jobs 1 (not the last call's 2), the narrow grid's cell under 2
    with pytest.raises(ConfigError, match=r"jobs=1 is not allowed here: cell 3 .*it ran with jobs=2.*--jobs 2"):
        call(folder, WIDE, 1, resumable=interrupted)
    with pytest.raises(ConfigError, match=r"jobs=2 is not allowed here: cell 0 .*it ran with jobs=1.*--jobs 1"):
        call(folder, WIDE, 2, resumable=interrupted)
    call(folder, WIDE, 1, resumable=(name0,))  # the narrow cell finished meanwhile: jobs 1 goes on
    call(folder, WIDE, 1, resumable=(name0,))  # and keeps cell 0's record


def test_a_cell_started_again_takes_the_new_jobs(tmp_path):
    folder = str(tmp_path)
    cell0 = call(folder, WIDE, 2)[0]
    call(folder, WIDE, 1)  # cell 0 had no checkpoint: started again under jobs 1
    call(folder, WIDE, 1, resumable=(os.path.basename(cell0.run_dir),))


def test_a_sweep_recorded_before_runs_kept_their_jobs_uses_its_last_jobs(tmp_path):
    folder = str(tmp_path)
    cell0 = call(folder, WIDE, 2)[0]
    path = os.path.join(folder, "sweep.json")
    with open(path) as handle:
        definition = json.load(handle)
    for cell in definition["cells"]:
        del cell["jobs"]
    del definition["run_jobs"]
    with open(path, "w") as handle:
        json.dump(definition, handle)
    with pytest.raises(ConfigError, match=r"continue with --jobs 2"):
        call(folder, WIDE, 1, resumable=(os.path.basename(cell0.run_dir),))
