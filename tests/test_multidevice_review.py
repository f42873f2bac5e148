"""Several devices and several processes, as a user runs them: problems found by running the
cluster path and fixed (each test fails without its fix).

- A checkpoint written while trained updates wait for aggregation named each held batch by its
  Python ``id()``, which differs between processes: a two-process run's orbax save failed ("params
  are missing") and both processes then waited for each other until killed.
- Joining a cluster whose coordinator never answers blocked for 300 s, deaf to Ctrl-C and SIGTERM,
  then aborted with a C++ stack trace; bad addresses and ``--cluster`` outside a cluster were
  tracebacks or jax's bare messages.
- Processes with unequal device counts failed with a numpy reshape error.
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


def _two_processes(flags: list, devices: tuple, timeout: float):
    """``jaxfl run SMALL FLAGS`` as processes 0 and 1 of a two-process cluster on this machine, with
    ``devices`` CPU devices each: the processes and their (stdout, stderr)."""
    command = ["-m", "jaxfl", "run", *SMALL, *flags, "--coordinator-address", f"127.0.0.1:{_free_port()}",
               "--num-processes", "2", "--process-id"]
    running = [subprocess.Popen([sys.executable, *command, str(index)], env=_env(devices[index]),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for index in range(2)]
    try:
        return running, [process.communicate(timeout=timeout) for process in running]
    except subprocess.TimeoutExpired:
        for process in running:
            process.kill()
        pytest.fail("the two processes did not end (one waits for the other)")


def test_held_batches_are_named_alike_in_every_process(tmp_path):
    """The checkpoint tree's batch names come from the run's own order, not the objects' addresses."""
    script = (
        "import json, sys\n"
        "from jaxfl import RunConfig, run_experiment\n"
        "class Stop:\n"  # not the update budget: near its end the engine trains nothing ahead
        "    def log(self, row, step): return step >= 3\n"
        "    def close(self): pass\n"
        "r = run_experiment(RunConfig(algorithm='fedbuff', model='logreg', clients=10, local_steps=2, batch_size=8,\n"
        "    max_updates=30, eval_every=1, progress=False, output_dir=sys.argv[1], run_name='x',\n"
        "    final_checkpoint=False, checkpoint_every=None), loggers=[Stop()])\n"
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
    out = str(tmp_path / "runs")
    running, outputs = _two_processes(["--output-dir", out, "--run-name", "big"], devices=(1, 1), timeout=240)
    for process, (_, stderr) in zip(running, outputs):
        assert process.returncode == 0, stderr[-3000:]
        assert "Save failed" not in stderr
    assert os.listdir(out) == ["big"]
    assert sorted(os.listdir(os.path.join(out, "big", "checkpoints"))) == ["ckpt-000003", "latest"]
    with open(os.path.join(out, "big", "summary.json")) as handle:
        summary = json.load(handle)
    assert summary["global_updates"] == 3 and summary["processes"] == 2 and summary["devices"] == 2
    for stdout, _ in outputs:  # every process names the run's directory, not process 1 its deleted scratch
        assert stdout.strip().splitlines()[-1].endswith(f"→ {os.path.join(out, 'big')}"), stdout


def test_a_bad_setting_in_a_cluster_run_is_named_before_joining(tmp_path):
    """Validating the config starts no jax backend, so it comes first: before, --devices 0 was named
    only after the join (300 s by default, when the other processes never come)."""
    port = _free_port()  # nothing listens there: a join would wait
    done = subprocess.run([sys.executable, "-m", "jaxfl", "run", *SMALL, "--devices", "0", "--output-dir",
                           str(tmp_path / "runs"), "--coordinator-address", f"127.0.0.1:{port}", "--num-processes",
                           "2", "--process-id", "1"], env=_env(1, JAXFL_CLUSTER_TIMEOUT_S="60"), capture_output=True,
                          text=True, timeout=50)
    assert done.returncode == 2 and "devices=0 is not allowed" in done.stderr
    assert not os.path.exists(tmp_path / "runs")


# Joining a cluster: jax's connect blocked in C++ (deaf to Ctrl-C and SIGTERM) for 300 s when the
# coordinator was unreachable or a process missing, then aborted with a C++ stack trace (status 134);
# a malformed address was an IndexError traceback, ``--cluster`` outside a cluster jax's bare
# "coordinator_address should be defined.".

def test_an_unreachable_coordinator_ends_with_a_clear_error_within_the_timeout(tmp_path):
    port = _free_port()  # nothing listens there
    command = [sys.executable, "-m", "jaxfl", "run", *SMALL, "--output-dir", str(tmp_path / "runs"),
               "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "1"]
    done = subprocess.run(command, env=_env(1, JAXFL_CLUSTER_TIMEOUT_S="2"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert (f"process 1 waited 2 s for all 2 processes to join the coordinator at 127.0.0.1:{port}"
            in done.stderr), done.stderr[-3000:]
    assert "Check failure" not in done.stderr and not os.path.exists(tmp_path / "runs")
    assert "usage:" not in done.stderr  # the command was well-formed: no usage banner above the line


@pytest.mark.parametrize("arguments, message", [
    (("nonsense", 2, 1), "coordinator address 'nonsense' is not HOST:PORT"),
    (("127.0.0.1:99999", 2, 1), "coordinator address '127.0.0.1:99999' is not HOST:PORT"),
    (("127.0.0.1:1234", 0, None), "num_processes=0 is not allowed: an integer, 1 or more"),
    (("127.0.0.1:1234", 2, -1), "process_id=-1 is not allowed: an integer, 0 or more"),
    (("127.0.0.1:1234", 2, 1.5), "process_id=1.5 is not allowed"),
    (("127.0.0.1:1234", 2, 2), "process_id=2 must be below num_processes=2"),
])
def test_cluster_arguments_that_cannot_work_are_refused_by_name_first(arguments, message):
    from jaxfl.cluster import init_cluster

    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        init_cluster(*arguments)


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf"])
def test_a_bad_join_timeout_is_refused_by_name(monkeypatch, value):
    from jaxfl.cluster import init_cluster, join_timeout

    monkeypatch.setenv("JAXFL_CLUSTER_TIMEOUT_S", value)
    with pytest.raises(ValueError, match=f"JAXFL_CLUSTER_TIMEOUT_S='{value}' is not allowed"):
        init_cluster("127.0.0.1:1234", 2, 1)
    monkeypatch.delenv("JAXFL_CLUSTER_TIMEOUT_S")
    assert join_timeout() == 300 and join_timeout(7) == 7


def test_cluster_flag_outside_a_cluster_says_which_flags_to_give(tmp_path):
    env = {key: value for key, value in _env(1).items()
           if not key.startswith(("SLURM_", "OMPI_", "JAX_COORDINATOR", "PMI_"))}
    done = subprocess.run([sys.executable, "-m", "jaxfl", "run", *SMALL, "--output-dir", str(tmp_path / "runs"),
                           "--cluster"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    # one line, as every refusal (it came under the usage of the top-level command, jaxfl [-h] ...)
    assert done.stderr.strip().splitlines()[-1].startswith(
        "jaxfl: error: the cluster to join is not fully given (jax: coordinator_address should be defined.) and no "
        "cluster was found in the environment (SLURM, Open MPI...) to complete it: give the coordinator address"), \
        done.stderr
    assert "usage:" not in done.stderr and "--coordinator-address" in done.stderr
    malformed = subprocess.run([sys.executable, "-m", "jaxfl", "run", *SMALL, "--output-dir", str(tmp_path / "runs"),
                                "--coordinator-address", "nonsense", "--num-processes", "2", "--process-id", "1"],
                               env=env, capture_output=True, text=True, timeout=120)
    assert malformed.returncode == 2 and "usage:" not in malformed.stderr
    assert "jaxfl: error: coordinator address 'nonsense' is not HOST:PORT" in malformed.stderr


def test_processes_with_unequal_device_counts_are_refused_with_the_counts(tmp_path):
    """A process with 1 CPU device and one with 2 ended with numpy's "cannot reshape array of size 3
    into shape (2,1)"; now both name each process's devices, before writing anything."""
    out = tmp_path / "runs"
    running, outputs = _two_processes(["--output-dir", str(out)], devices=(1, 2), timeout=180)
    for process, (_, stderr) in zip(running, outputs):
        assert process.returncode == 2, stderr[-3000:]
        assert "the 2 processes have 1, 2 cpu devices" in stderr, stderr[-3000:]
    assert not out.exists()


def test_a_run_started_on_two_devices_resumes_on_one(tmp_path):
    """A checkpoint does not depend on the device count, so a run started with ``--devices 2`` is
    resumed with ``--devices 1`` on a machine of one device, and its summary says which devices trained
    which updates. Before, the resume refused both ways:
    without the flag the recorded 2 devices did not exist, with it the config would change."""
    script = (
        "import sys\n"
        "import jaxfl.experiment as experiment\n"
        "from jaxfl import RunConfig, run_experiment\n"
        "original = experiment._Checkpointer.save\n"
        "def crashing(self, simulation):\n"
        "    original(self, simulation)\n"
        "    raise SystemExit(3)\n"
        "experiment._Checkpointer.save = crashing\n"
        "run_experiment(RunConfig(algorithm='fedbuff', model='logreg', clients=10, local_steps=2, batch_size=8,\n"
        "    max_updates=6, checkpoint_every=2, progress=False, output_dir=sys.argv[1], run_name='r', devices=2))\n")
    started = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=_env(2), capture_output=True,
                             text=True, timeout=300)
    assert started.returncode == 3, started.stderr[-3000:]
    run = str(tmp_path / "r")
    assert not os.path.exists(os.path.join(run, "summary.json"))
    as_recorded = subprocess.run([sys.executable, "-m", "jaxfl", "run", "--resume", run, "--no-progress"],
                                 env=_env(1), capture_output=True, text=True, timeout=300)
    assert as_recorded.returncode == 2 and "pass a number from 1 to 1" in as_recorded.stderr
    resumed = subprocess.run([sys.executable, "-m", "jaxfl", "run", "--resume", run, "--devices", "1", "--no-progress"],
                             env=_env(1), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # said, since the rest is equal to an uninterrupted run only to rounding (it was silent; the same
    # under taskset or JAXFL_CPU_DEVICES, where no flag shows the change)
    assert (f"{run} resumes on 1 cpu device; its updates up to 2 were trained on 2 cpu devices: the sums of each "
            "call's updates go in another order") in " ".join(resumed.stderr.split()), resumed.stderr[-3000:]
    with open(os.path.join(run, "summary.json")) as handle:
        summary = json.load(handle)
    assert summary["global_updates"] == 6
    # what trained each stretch: the summary said 1 device alone, as if the whole run had
    devices = [{name: stretch[name] for name in ("from_update", "backend", "devices", "processes")}
               for stretch in summary["device_history"]]
    assert summary["devices"] == 1 and devices == [
        {"from_update": 0, "backend": "cpu", "devices": 2, "processes": 1},
        {"from_update": 2, "backend": "cpu", "devices": 1, "processes": 1}]
