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

from jaxfl import checkpoint, cli
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
    # the killed run needs a process of its own; the uninterrupted run and the resume are the same
    # command in this one (no jax import, no compilation of their own)
    assert cli.main(["run", *flags, "--run-name", "full"]) == 0
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
    assert cli.main(["run", "--resume", str(tmp_path / "killed"), "--no-progress"]) == 0
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


def test_ctrl_c_on_jaxfl_run_names_the_run_folder_and_its_resume(tmp_path):
    # it printed an 80-line KeyboardInterrupt traceback through jax's dispatch, naming nothing
    flags = ["--algorithm", "fedbuff", "--model", "mlp", "--clients", "5", "--local-steps", "6", "--batch-size", "16",
             "--max-updates", "40", "--checkpoint-every", "5", "--no-progress", "--no-stop-at-target",
             "--output-dir", str(tmp_path)]
    assert cli.main(["run", *flags, "--run-name", "full"]) == 0  # in this process: only the Ctrl-C needs its own
    cut = tmp_path / "cut"
    running = subprocess.Popen([sys.executable, "-m", "jaxfl", "run", *flags, "--run-name", "cut"],  # python -m jaxfl
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=os.path.dirname(os.path.dirname(__file__)))
    deadline = time.time() + 600
    while time.time() < deadline and running.poll() is None:  # mid-run: after its first checkpoint (update 5)
        newest = checkpoint.latest(str(cut)) if (cut / "checkpoints").exists() else None
        if newest and int(newest[-6:]) >= 5:
            break
        time.sleep(0.02)
    running.send_signal(signal.SIGINT)
    out, err = running.communicate(timeout=300)
    assert running.returncode == 130, err  # through python -m jaxfl too (it dropped main's status)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert not (cut / "summary.json").exists()  # interrupted mid-run, not after it
    newest = checkpoint.latest(str(cut))
    assert err.strip().splitlines()[-1] == (
        f"jaxfl: interrupted: {cut} keeps its logs and checkpoints up to update {int(newest[-6:])}: "
        f"jaxfl run --resume {cut} (resume_experiment) goes on from there")
    assert cli.main(["run", "--resume", str(cut), "--no-progress"]) == 0
    assert events_without_wall_time(tmp_path / "full") == events_without_wall_time(cut)
    assert metrics_without_wall_time(tmp_path / "full") == metrics_without_wall_time(cut)


def test_an_interrupted_run_says_whether_there_is_anything_to_resume(tmp_path):
    import jaxfl

    from test_resume_review import CtrlC  # a Ctrl-C at the n-th evaluation

    config = jaxfl.RunConfig(algorithm="fedavg", model="logreg", clients=3, local_steps=2, max_updates=6,
                             checkpoint_every=1, progress=False, output_dir=str(tmp_path))
    with pytest.raises(jaxfl.RunInterrupted) as before:  # at the evaluation of version 0: no checkpoint yet
        jaxfl.run_experiment(config, loggers=[CtrlC(1)])
    assert before.value.checkpoint is None and before.value.update is None and os.path.isdir(before.value.run_dir)
    assert "no checkpoint yet" in str(before.value) and "start the run again" in str(before.value)
    with pytest.raises(jaxfl.RunInterrupted) as later:  # at version 3's: versions 1 and 2 were checkpointed
        jaxfl.run_experiment(config, loggers=[CtrlC(4)])
    assert later.value.checkpoint == checkpoint.latest(later.value.run_dir)
    assert later.value.checkpoint.endswith("ckpt-000002") and later.value.update == 2
    assert "up to update 2" in str(later.value)
    resumed = jaxfl.resume_experiment(later.value.run_dir)
    assert resumed.summary["global_updates"] == 6 and resumed.summary["resumes"] == 1


def test_an_interrupted_timing_only_run_says_to_run_it_again(tmp_path, monkeypatch):
    import jaxfl
    from jaxfl.scheduler.simulation import Simulation

    def ctrl_c(self):  # Ctrl-C during the schedule
        raise KeyboardInterrupt

    monkeypatch.setattr(Simulation, "run", ctrl_c)
    with pytest.raises(jaxfl.RunInterrupted) as timing:
        jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedbuff", clients=3, timing_only=True, max_updates=5,
                                             progress=False, output_dir=str(tmp_path)))
    assert timing.value.timing_only and timing.value.checkpoint is None
    assert os.path.isfile(os.path.join(timing.value.run_dir, "config.json"))
    assert "timing-only run keeps no checkpoints: run it again" in str(timing.value)
