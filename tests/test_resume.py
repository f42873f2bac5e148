"""Kill `jaxfl run` with SIGKILL, resume it, and get exactly the uninterrupted run. (Interrupt +
resume at a random event for every algorithm is in the conformance suite, tests/test_conformance.py.)"""
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxfl import checkpoint
from jaxfl.testing import events_without_wall_time, metrics_without_wall_time


def run_cli(*args):
    return subprocess.Popen([sys.executable, "-m", "jaxfl.cli", "run", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, cwd=os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.slow
@pytest.mark.parametrize("algorithm, checkpoints_before_kill", [("fedbuff", 3), ("fedcompass", 5)])
def test_sigkill_and_resume_from_the_command_line(tmp_path, algorithm, checkpoints_before_kill):
    flags = ["--algorithm", algorithm, "--model", "mlp", "--clients", "5", "--local-steps", "6",
             "--batch-size", "16", "--max-updates", "16", "--checkpoint-every", "1", "--no-progress",
             "--no-stop-at-target", "--output-dir", str(tmp_path)]
    full = run_cli(*flags, "--run-name", "full")
    assert full.wait(timeout=600) == 0, full.stderr.read()
    killed = run_cli(*flags, "--run-name", "killed")
    root = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 600
    while time.time() < deadline:  # kill soon after the n-th checkpoint, i.e. somewhere mid-run
        if root.exists() and len([n for n in os.listdir(root) if n.startswith("ckpt-")]) >= 1 and \
                checkpoint.latest(str(tmp_path / "killed")) and \
                int(checkpoint.latest(str(tmp_path / "killed"))[-6:]) >= checkpoints_before_kill:
            break
        time.sleep(0.05)
    time.sleep(0.3)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert not (tmp_path / "killed" / "summary.json").exists()  # it really died mid-run
    resumed = run_cli("--resume", str(tmp_path / "killed"), "--no-progress")
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()
    a, b = tmp_path / "full", tmp_path / "killed"
    assert events_without_wall_time(a) == events_without_wall_time(b)
    assert metrics_without_wall_time(a) == metrics_without_wall_time(b)
    import json

    from jaxfl.experiment import prepare
    from jaxfl.config import config_from_mapping

    config = config_from_mapping(json.loads((a / "config.json").read_text())["config"])
    template = prepare(config)[4]
    for p, q in zip(jax.tree.leaves(checkpoint.final_params(str(a), template)),
                    jax.tree.leaves(checkpoint.final_params(str(b), template))):
        np.testing.assert_array_equal(np.asarray(p), np.asarray(q))
    assert json.loads((b / "summary.json").read_text())["resumes"] == 1
