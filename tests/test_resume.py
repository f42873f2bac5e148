"""Kill a run at a random event, resume it, and get exactly the uninterrupted run."""
import csv
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import jaxfl.experiment as experiment
from jaxfl.algorithms import names
from jaxfl import checkpoint
from jaxfl.experiment import resume_experiment, run_experiment
from tests.conftest import replace


class Interrupted(Exception):
    pass


def without_wall_time(path):
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    return [{k: v for k, v in row.items() if k != "wall_time"} for row in rows]


def assert_same_run(a, b):
    with open(os.path.join(a.run_dir, "events.csv")) as x, open(os.path.join(b.run_dir, "events.csv")) as y:
        assert x.read() == y.read()
    assert without_wall_time(os.path.join(a.run_dir, "metrics.csv")) == \
        without_wall_time(os.path.join(b.run_dir, "metrics.csv"))
    for p, q in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_array_equal(np.asarray(p), np.asarray(q))
    ignore = {"wall_time_s", "resumes", "compilations"}  # per process: a resumed run compiles again
    assert {k: v for k, v in a.summary.items() if k not in ignore} == \
        {k: v for k, v in b.summary.items() if k not in ignore}


@pytest.mark.parametrize("algorithm", names())
def test_interrupt_at_a_random_event_and_resume(small_config, algorithm, monkeypatch):
    config = replace(small_config, algorithm=algorithm, clients=4, local_steps=6, max_updates=10,
                     checkpoint_every=2, heterogeneity="exp", stop_at_target=False)
    full = run_experiment(replace(config, run_name="full"))
    with open(os.path.join(full.run_dir, "events.csv")) as handle:  # every arrival is a popped event
        arrivals = sum(row["event"] == "arrival" for row in csv.DictReader(handle))
    kill_at = int(np.random.default_rng(sum(map(ord, algorithm))).integers(arrivals // 3, arrivals - 1))
    seen = {"events": 0}
    original = experiment._Checkpointer.after_event

    def crashing(self, simulation):
        original(self, simulation)
        seen["events"] += 1
        if seen["events"] == kill_at:
            raise Interrupted

    monkeypatch.setattr(experiment._Checkpointer, "after_event", crashing)
    with pytest.raises(Interrupted):
        run_experiment(replace(config, run_name="killed"))
    monkeypatch.setattr(experiment._Checkpointer, "after_event", original)
    resumed = resume_experiment(os.path.join(config.output_dir, "killed"), progress=False)
    assert resumed.summary["resumes"] == 1
    assert_same_run(full, resumed)


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
    assert (a / "events.csv").read_text() == (b / "events.csv").read_text()
    assert without_wall_time(a / "metrics.csv") == without_wall_time(b / "metrics.csv")
    import json

    from jaxfl.experiment import prepare
    from jaxfl.config import config_from_mapping

    config = config_from_mapping(json.loads((a / "config.json").read_text())["config"])
    template = prepare(config)[4]
    for p, q in zip(jax.tree.leaves(checkpoint.final_params(str(a), template)),
                    jax.tree.leaves(checkpoint.final_params(str(b), template))):
        np.testing.assert_array_equal(np.asarray(p), np.asarray(q))
    assert json.loads((b / "summary.json").read_text())["resumes"] == 1
