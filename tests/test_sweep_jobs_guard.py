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


# --jobs on accelerators. This machine has no GPU: the backend is what _jobs_backend reports (on a
# GPU host it is jax's), and the rest is the code a GPU sweep runs; benchmarks/sweep_jobs.py runs it
# on a GPU (benchmarks/gpu_extra.sh).

def on_backend(monkeypatch, backend, sweep_holds=False):
    import jaxfl.sweep

    monkeypatch.setattr(jaxfl.sweep, "_jobs_backend", lambda: (backend, sweep_holds))


def test_on_a_gpu_the_cells_split_the_memory_one_process_would_take(tmp_path, monkeypatch):
    on_backend(monkeypatch, "gpu")
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    cells, _ = _expand(BASE, _check_grid(WIDE), str(tmp_path))
    shares = _check_jobs(2, str(tmp_path), cells, {cell.index: "new" for cell in cells})
    assert shares.gpu_memory_fraction == 0.375 and len(shares.cores) == 2  # jax's 0.75, two ways
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    assert _check_jobs(2, str(tmp_path), cells, {cell.index: "new" for cell in cells}).gpu_memory_fraction == 0.45
    # a CPU sweep's workers get no fraction
    on_backend(monkeypatch, "cpu")
    assert _check_jobs(2, str(tmp_path), cells, {cell.index: "new" for cell in cells}).gpu_memory_fraction is None


def test_on_a_gpu_an_interrupted_cell_goes_on_with_any_jobs(tmp_path, monkeypatch):
    # every cell runs on all the process's GPUs whatever --jobs: its arithmetic does not change
    folder = str(tmp_path)
    cell0 = call(folder, WIDE, 1)[0]
    on_backend(monkeypatch, "gpu")
    call(folder, WIDE, 2, resumable=(os.path.basename(cell0.run_dir),))
    on_backend(monkeypatch, "cpu")  # on a CPU the share of the cores is its device count: refused
    with pytest.raises(ConfigError, match=r"jobs=2 is not allowed here: cell 0 .*it ran with jobs=1"):
        call(folder, WIDE, 2, resumable=(os.path.basename(cell0.run_dir),))


@pytest.mark.parametrize("backend", ["tpu", "METAL"])
def test_a_backend_whose_devices_take_one_process_is_refused_before_any_work(tmp_path, monkeypatch, backend):
    on_backend(monkeypatch, backend)
    cells, _ = _expand(BASE, _check_grid(WIDE), str(tmp_path))
    with pytest.raises(ConfigError, match=rf"jobs=2 is not allowed on the {backend} backend: .*run with jobs=1"):
        _check_jobs(2, str(tmp_path), cells, {cell.index: "new" for cell in cells})
    assert os.listdir(tmp_path) == []
    _check_jobs(1, str(tmp_path), cells, {cell.index: "new" for cell in cells})  # one job runs anywhere


def test_gpu_memory_fractions_and_what_is_refused():
    from jaxfl.sweep import gpu_memory_fraction

    assert gpu_memory_fraction(1, {}) == 0.75
    assert gpu_memory_fraction(8, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "1"}) == 0.125
    # a sweep process that reserved jax's 0.75 itself leaves the cells 0.15 of the memory
    assert gpu_memory_fraction(2, {}, sweep_holds=True) == 0.075
    with pytest.raises(ConfigError, match=r"this process holds 0.75 of the GPU's memory.*leaves the 16 cell processes "
                                          r"0.15 of it; start Python with XLA_PYTHON_CLIENT_PREALLOCATE=false"):
        gpu_memory_fraction(16, {}, sweep_holds=True)
    for bad in ("abc", "0", "1.5", "-0.2"):
        with pytest.raises(ConfigError, match=rf"XLA_PYTHON_CLIENT_MEM_FRACTION='{bad}' is not allowed: a fraction "
                                              r"of the GPU's memory in \(0, 1\]"):
            gpu_memory_fraction(2, {"XLA_PYTHON_CLIENT_MEM_FRACTION": bad})


def test_the_workers_environment_carries_the_gpu_share(tmp_path, monkeypatch):
    from jaxfl.sweep import _worker_environment

    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")
    assert _worker_environment(2, str(tmp_path), 0.3)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.3"
    assert _worker_environment(2, str(tmp_path))["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.6"  # a CPU sweep: as it was


def test_the_sweep_starts_its_backend_without_reserving_a_gpus_memory():
    # in a fresh process (this one's backend is started): the backend is asked for with preallocation
    # off, and the setting the user had is back afterwards, for the workers' environment
    import subprocess
    import sys

    probe = ("import json, os, jax\n"
             "from jaxfl.sweep import _jobs_backend\n"
             "seen = []\n"
             "real = jax.default_backend\n"
             # a GPU as far as the sweep can tell: the backend started (the CPU's), "gpu" reported
             "jax.default_backend = lambda: seen.append(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE')) or "
             "(real(), 'gpu')[1]\n"
             "first = _jobs_backend(), os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE')\n"
             "second = _jobs_backend(), os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE')\n"
             "print(json.dumps([first, second, seen]))\n")
    for before in (None, "true"):
        env = {name: value for name, value in os.environ.items() if name != "XLA_PYTHON_CLIENT_PREALLOCATE"}
        if before is not None:
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = before
        done = subprocess.run([sys.executable, "-c", probe], env={**env, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        first, second, seen = json.loads(done.stdout)
        # the second call (run_sweep checks twice) found the backend started, with the user's setting
        # back, and must not take this process for one that reserved the GPU's memory
        assert first == [["gpu", False], before] and second == [["gpu", False], before]
        # the first call started the backend with preallocation off; the second asked as it was
        assert seen == ["false", before]
