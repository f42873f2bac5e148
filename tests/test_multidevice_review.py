"""Several devices and several processes, as a user runs them: problems found by running the
cluster path and fixed (each test fails without its fix).

- A checkpoint written while trained updates wait for aggregation named each held batch by its
  Python ``id()``, which differs between processes: a two-process run's orbax save failed ("params
  are missing") and both processes then waited for each other until killed.
"""
import json
import os
import socket
import subprocess
import sys

import pytest

SMALL = ["--algorithm", "fedbuff", "--clients", "10", "--model", "logreg", "--local-steps", "2", "--batch-size", "8",
         "--max-updates", "3", "--no-progress"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _env(devices: int, **extra) -> dict:
    return {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(devices), **extra}


def test_held_batches_are_named_alike_in_every_process(tmp_path):
    """The checkpoint tree's batch names come from the run's own order, not the objects' addresses."""
    script = (
        "import json, sys\n"
        "from jaxfl import RunConfig, run_experiment\n"
        "r = run_experiment(RunConfig(algorithm='fedbuff', model='logreg', clients=10, local_steps=2, batch_size=8,\n"
        "    max_updates=3, progress=False, output_dir=sys.argv[1], run_name='x', final_checkpoint=False,\n"
        "    checkpoint_every=None))\n"
        "tree, meta = r.engine.checkpoint_state()\n"
        "print(json.dumps({'names': sorted(tree['batches']), 'sizes': meta['batch_sizes'],\n"
        "                  'placement': sorted({key for key, _ in meta['placement'].values()})}))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=_env(2), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads(done.stdout.strip().splitlines()[-1])
    assert saved["names"], "the run should end with trained updates held (two devices, 10 clients, K=3)"
    assert saved["names"] == [str(index) for index in range(len(saved["names"]))]
    assert sorted(saved["sizes"]) == saved["placement"] == saved["names"]


def test_two_processes_checkpoint_held_updates_from_the_command_line(tmp_path):
    """The README's two-process command (small): the final checkpoint holds trained updates that
    wait for aggregation; both processes finish, and process 0's run directory has it."""
    port = str(_free_port())
    out = str(tmp_path / "runs")
    command = ["-m", "jaxfl", "run", *SMALL, "--output-dir", out, "--run-name", "big",
               "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id"]
    running = [subprocess.Popen([sys.executable, *command, str(index)], env=_env(1), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for index in range(2)]
    try:
        outputs = [process.communicate(timeout=240) for process in running]
    except subprocess.TimeoutExpired:
        for process in running:
            process.kill()
        pytest.fail("the two processes did not end (one waits for the other)")
    for process, (_, stderr) in zip(running, outputs):
        assert process.returncode == 0, stderr[-3000:]
        assert "Save failed" not in stderr
    assert os.listdir(out) == ["big"]
    assert sorted(os.listdir(os.path.join(out, "big", "checkpoints"))) == ["ckpt-000003", "latest"]
    with open(os.path.join(out, "big", "summary.json")) as handle:
        assert json.load(handle)["global_updates"] == 3
