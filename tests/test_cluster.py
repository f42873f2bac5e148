"""A run over two processes (jax.distributed on one machine, CPU collectives through gloo) gives the
single-process result on as many devices: the same event log and the same model, also when it is
cut short after a checkpoint and resumed by two processes (``jaxfl run --resume`` with the cluster
flags), also past a corrupt newest checkpoint, which every process skips alike, and its
checkpoints read back in one process; a metrics logger that stops the run (it runs
on process 0) stops both processes at the event where it stops one.

Each process runs the same scheduler; the client axis of every training call spans both processes'
devices, and each process gathers the trained updates. Parameters are compared to 1e-6 (SGD
clients): the arithmetic per client is the same, but it is not promised bit for bit across a
gather through gloo.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from conftest import sharing_compilations
from jaxfl import checkpoint
from jaxfl.experiment import prepare, resume_experiment
from jaxfl.resume import read_run
from jaxfl.testing import events_without_wall_time

SCRIPT = textwrap.dedent("""
    import json, sys
    folder, algorithm, process, processes, port, mode = sys.argv[1:3] + [int(a) for a in sys.argv[3:5]] + sys.argv[5:]
    run_dir = f"{folder}/runs-{processes}/{algorithm}"
    if mode == "resume":  # from the command line, with the cluster flags
        from jaxfl import cli
        sys.exit(cli.main(["run", "--resume", run_dir, "--no-progress", "--coordinator-address", f"127.0.0.1:{port}",
                           "--num-processes", str(processes), "--process-id", str(process)]))
    if mode == "cli-long":  # the command, until a process is lost
        from jaxfl import cli
        if process == 1:  # busy for 10 s after the first checkpoint, outside any collective, when the other is lost
            import time
            from jaxfl import checkpoint, experiment
            after_event, busy = experiment._Checkpointer.after_event, []
            def busy_after_the_first_checkpoint(self, simulation):
                done = after_event(self, simulation)
                if not busy and checkpoint.latest(run_dir):
                    busy.append(time.sleep(10))
                return done
            experiment._Checkpointer.after_event = busy_after_the_first_checkpoint
        sys.exit(cli.main(["run", "--algorithm", algorithm, "--dataset", "mnist10k", "--model", "logreg", "--clients", "6",
                           "--local-steps", "3", "--batch-size", "8", "--buffer-size", "2", "--max-updates", "1000000",
                           "--client-optimizer", "sgd", "--client-lr", "0.05", "--no-progress", "--checkpoint-every",
                           "50", "--output-dir", f"{folder}/runs-{processes}", "--run-name", algorithm,
                           "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", str(processes),
                           "--process-id", str(process)]))
    import jaxfl
    from jaxfl.cluster import init_cluster
    if processes > 1:  # (small-slips: among them another process count on process 1, which jax alone lets pass)
        given = processes + 1 if mode == "small-slips" and process == 1 else processes
        init_cluster(f"127.0.0.1:{port}", num_processes=given, process_id=process)
    import dataclasses, jax, numpy as np
    from jaxfl import RunConfig, run_experiment
    from jaxfl.testing import _interrupt_after, _Interrupted
    config = RunConfig(algorithm=algorithm, dataset="mnist10k", model="mlp", clients=6, local_steps=3, batch_size=8,
                       max_updates=3, buffer_size=2, client_optimizer="sgd", client_lr=0.05, progress=False,
                       checkpoint_every=1, output_dir=f"{folder}/runs-{processes}", run_name=algorithm)
    if mode.startswith("small"):  # a logistic regression: quicker to compile
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, model="logreg"))
    if mode == "small-long":  # runs until it is stopped
        config = dataclasses.replace(config, budget=dataclasses.replace(config.budget, max_updates=10**6),
                                     checkpoint_every=None)
    if mode == "small-slips" and process == 1:  # a copy-paste slip: another learning rate on one host
        config = dataclasses.replace(config, client=dataclasses.replace(config.client, client_lr=0.5))
    if mode == "small-slips" and process == 1:  # and JAX_ENABLE_X64 in that host's environment
        jax.config.update("jax_enable_x64", True)
    if mode == "small-no-data" and process == 1:  # its copy of the data missing on this host
        import jaxfl.experiment
        def missing(*args, **kwargs):
            raise FileNotFoundError("dataset 'npz': no file at /host1/data.npz")
        jaxfl.experiment.load_dataset = missing
    if mode == "small-elsewhere" and process == 1:  # a folder of its own (a node-local disk): never process 0's
        config = dataclasses.replace(config, output_dir=f"{folder}/elsewhere")
    if mode == "small-timing":
        config = dataclasses.replace(config, timing_only=True, checkpoint_every=25)
    if mode == "small-poor-host" and process == 1:  # by its own free memory it would keep the banks in a memmap
        import jaxfl.client_state
        jaxfl.client_state.free_device_memory = lambda: 0
        jaxfl.client_state.available_host_memory = lambda: 0
    if mode == "small-tight-host" and process == 1:  # by its own free memory it would split every call to one
        import inspect, jaxfl.engine                    # client per device, which process 0 would not
        def tight():
            frame = inspect.currentframe()  # the engine asking: the nearest caller that has call_bytes
            while not hasattr(frame.f_locals.get("self"), "call_bytes"):
                frame = frame.f_back
            engine = frame.f_locals["self"]
            return int(engine.call_bytes(engine.plan.devices) / jaxfl.engine.MEMORY_HEADROOM) + 2**20
        jaxfl.engine.free_device_memory = tight
    if mode == "small-tight-host":  # every process asks for calls of 6 clients
        config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, clients_per_call=6))
    if mode == "small-own-clock":  # checkpoints spaced by wall time, and process 1's clock never says "due"
        from jaxfl import experiment
        config = dataclasses.replace(config, checkpoint_min_interval_s=1e-6)
        if process == 1:
            after_event = experiment._Checkpointer.after_event
            def never_due(self, simulation):
                self._last_save = float("inf")
                return after_event(self, simulation)
            experiment._Checkpointer.after_event = never_due
    if mode == "small-ctrl-c":  # Ctrl-C reaching every process at the same event (a terminal's, to its group)
        import jaxfl.testing
        from jaxfl.experiment import RunInterrupted
        jaxfl.testing._Interrupted = KeyboardInterrupt
        with _interrupt_after(8):
            try:
                run_experiment(config)
            except RunInterrupted as interrupt:
                print(f"INTERRUPTED {interrupt}", file=sys.stderr)
                sys.exit(0)
        sys.exit("the run was not interrupted")
    if mode in ("interrupted", "small-interrupted"):  # every process stops at the same event: the first
        # after checkpoint 1, or (small) after checkpoint 2
        with _interrupt_after(1 if mode == "interrupted" else 8):
            try:
                run_experiment(config)
            except _Interrupted:
                sys.exit(0)
        sys.exit("the run was not interrupted")
    loggers = []
    if mode == "small-logger":  # every process is given it; process 0's stops the run after version 2
        class StopAtVersion:
            name = "version rule"
            def log(self, row, step):
                return step >= 2
            def close(self):
                pass
        loggers = [StopAtVersion()]
    speeds = None
    if mode == "small-speeds":  # each host its own copy of the speeds file, and process 1's is another one
        speeds = [0.1 + 0.01 * client + 0.05 * process for client in range(6)]
    optimizer = None
    if mode == "small-own-clock":  # an optax object given in Python on every process: its probe is each process's own
        import optax
        optimizer = optax.adam(1e-3)
        config = dataclasses.replace(config, client=dataclasses.replace(config.client, client_optimizer="adam",
                                                                       client_lr=0.003))
    result = run_experiment(config, loggers=loggers, time_per_step=speeds, client_optimizer=optimizer)
    print("RUN_DIR", result.run_dir, file=sys.stderr)  # what each process names as the run
    if mode == "small-timing":
        sys.exit(0)
    if process == 0:
        np.savez(f"{folder}/{algorithm}-{processes}.npz", *[np.asarray(leaf) for leaf in jax.tree.leaves(result.params)])
        print("RESULT", json.dumps({"run_dir": result.run_dir, "mesh": int(result.engine.mesh.size),
                                    "processes": jax.process_count()}))
""")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(folder, algorithm, processes, mode="run", timeout=600, fails=False) -> dict:
    """Run the script in ``processes`` processes (2 CPU devices in all): process 0's stdout, stderr and
    result (its ``RESULT`` line; gloo writes to stdout too). Processes that have not ended after
    ``timeout`` seconds (waiting for each other) are killed and the test fails."""
    # the tests' compilation cache: the processes of a later test load the programs an earlier one compiled
    env = sharing_compilations(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(2 // processes))
    port = str(_free_port())
    commands = [[sys.executable, "-c", SCRIPT, str(folder), algorithm, str(index), str(processes), port, mode]
                for index in range(processes)]
    running = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for command in commands]
    try:
        outputs = [process.communicate(timeout=timeout) for process in running]
    except subprocess.TimeoutExpired:
        for process in running:
            process.kill()
        pytest.fail(f"the {processes} processes did not end within {timeout} s (one waits for the others)")
    for process, (_, stderr) in zip(running, outputs):
        assert (process.returncode != 0) == fails, stderr[-3000:]
    stdout, stderr = outputs[0]
    results = [json.loads(line[len("RESULT "):]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    return {**(results[-1] if results else {}), "stdout": stdout, "stderr": stderr,
            "stderrs": [error for _, error in outputs]}


def _summary(run_dir) -> dict:
    with open(os.path.join(run_dir, "summary.json")) as handle:
        return json.load(handle)


def _array_bytes(run_dir) -> int:
    """Bytes of array data in a run's last checkpoint (orbax's per-process data folders)."""
    device = os.path.join(checkpoint.latest(str(run_dir)), "device")
    return sum(os.path.getsize(os.path.join(folder, name))
               for part in os.listdir(device) if part.startswith("ocdbt.process_")
               for folder, _, names in os.walk(os.path.join(device, part)) for name in names)


@pytest.mark.parametrize("algorithm, interrupted", [("fedavg", False), ("fedbuff", True)])
def test_two_processes_give_the_single_process_result(tmp_path, algorithm, interrupted):
    run_dir = str(tmp_path / "runs-2" / algorithm)
    if interrupted:  # two processes cut short after their first checkpoint, then resumed by two processes
        _run(tmp_path, algorithm, processes=2, mode="interrupted")
        assert not os.path.exists(os.path.join(run_dir, "summary.json"))
        assert checkpoint.latest(run_dir).endswith("ckpt-000001")
        alone = shutil.copytree(run_dir, tmp_path / "resumed-alone")
        two = _run(tmp_path, algorithm, processes=2, mode="resume")
        assert re.search(rf"{algorithm}: resumed, best accuracy 0\.\d{{4}}, target \d+% (not reached|[\d.]+ virtual s), 3 "
                         rf"updates, stop: update budget → {re.escape(run_dir)}", two["stdout"]), two["stdout"]
    else:
        two = _run(tmp_path, algorithm, processes=2)
        assert two["run_dir"] == run_dir and two["processes"] == 2 and two["mesh"] == 2
    one = _run(tmp_path, algorithm, processes=1)
    assert one["processes"] == 1 and one["mesh"] == 2
    assert _summary(run_dir)["resumes"] == int(interrupted) and _summary(one["run_dir"])["resumes"] == 0
    assert _summary(run_dir)["global_updates"] == _summary(one["run_dir"])["global_updates"] == 3
    assert events_without_wall_time(run_dir) == events_without_wall_time(one["run_dir"])
    # Checkpoints are written as in one process (the two newest kept), and the final one, written by
    # both processes through orbax, reads back in this single process as the run's model.
    for folder in (run_dir, one["run_dir"]):
        root = os.path.join(folder, "checkpoints")
        assert sorted(n for n in os.listdir(root) if n.startswith("ckpt-")) == ["ckpt-000002", "ckpt-000003"]
        assert checkpoint.latest(folder).endswith("ckpt-000003")
    # the two processes hold the same arrays, and orbax writes them once between them, not twice (2x). Not
    # byte for byte: one process packs the small leaves into one array per shape, two write each leaf's
    # shards, which orbax chunks and compresses otherwise (FedBuff's 4.6-5.0 % more, 2026-12-06)
    assert _array_bytes(run_dir) < 1.25 * _array_bytes(one["run_dir"])
    # process 0 records the sizes of its own orbax files only (another host's may show it a stale size)
    with open(os.path.join(checkpoint.latest(run_dir), checkpoint.DEVICE_SIZES)) as handle:
        recorded = json.load(handle)
    assert any(path.startswith("ocdbt.process_0") for path in recorded)
    assert not any("process_1" in path for path in recorded), sorted(recorded)
    template = prepare(read_run(run_dir)[0])[4]
    two_params = [np.asarray(leaf) for leaf in jax.tree.leaves(checkpoint.final_params(run_dir, template))]
    with np.load(tmp_path / f"{algorithm}-1.npz") as saved:
        one_params = [saved[name] for name in saved.files]
    for x, y in zip(two_params, one_params, strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
    if not interrupted:  # the checkpoint holds process 0's model bit for bit
        with np.load(tmp_path / f"{algorithm}-2.npz") as saved:
            assert all(np.array_equal(x, saved[name]) for x, name in zip(two_params, saved.files, strict=True))
    assert "checkpoint" not in two["stderr"].lower(), two["stderr"][-2000:]
    if interrupted:  # the checkpoint of two processes also resumes in one (this one)
        resumed = resume_experiment(str(alone), progress=False)
        assert events_without_wall_time(resumed.run_dir) == events_without_wall_time(one["run_dir"])
        for x, y in zip(jax.tree.leaves(resumed.params), one_params, strict=True):
            np.testing.assert_allclose(np.asarray(x), y, rtol=0, atol=1e-6)
    # Only process 0 keeps a run directory; the other process's scratch folder is gone.
    assert sorted(os.listdir(tmp_path / "runs-2")) == [algorithm]


def test_ctrl_c_on_every_process_leaves_the_newest_checkpoint_to_process_0_s_line(tmp_path):
    """Ctrl-C to both processes: process 1 said "up to update 60" where process 0, which writes the
    checkpoints and finished one more before it stopped, said 80 (the resume went on from 80)."""
    two = _run(tmp_path, "fedbuff", processes=2, mode="small-ctrl-c")
    run_dir = tmp_path / "runs-2" / "fedbuff"
    lines = [[line for line in error.splitlines() if line.startswith("INTERRUPTED ")] for error in two["stderrs"]]
    assert [len(found) for found in lines] == [1, 1], two["stderrs"]
    newest = int(os.path.basename(checkpoint.latest(str(run_dir))).rpartition("-")[2])
    assert lines[0][0] == (f"INTERRUPTED {run_dir} keeps its logs and checkpoints up to update {newest}: jaxfl run "
                           f"--resume {run_dir} (resume_experiment) goes on from there")
    # process 1 names the newest it found finished (here often the one before process 0's), and says so
    seen = re.fullmatch(f"INTERRUPTED {run_dir} keeps its logs and checkpoints up to update ([0-9]+) or a later one "
                        f"that process 0 names: jaxfl run --resume {run_dir} \\(resume_experiment\\) goes on from there",
                        lines[1][0])
    assert seen and 1 <= int(seen[1]) <= newest, lines[1][0]


def test_two_processes_skip_a_corrupt_newest_checkpoint_alike_and_end_as_one_process(tmp_path):
    run_dir = str(tmp_path / "runs-2" / "fedbuff")
    _run(tmp_path, "fedbuff", processes=2, mode="small-interrupted")
    newest = checkpoint.latest(run_dir)
    assert newest.endswith("ckpt-000002")
    damaged = 0
    for folder, _, names in os.walk(os.path.join(newest, "device")):  # the arrays' data, as a bad disk would leave it
        if os.path.basename(folder) == "d":
            for name in names:
                path = os.path.join(folder, name)
                with open(path, "r+b") as handle:
                    handle.write(b"\xff" * os.path.getsize(path))
                damaged += 1
    assert damaged
    two = _run(tmp_path, "fedbuff", processes=2, mode="resume", timeout=180)
    for stderr in two["stderrs"]:  # every process skipped it, for the same one
        assert "resuming from ckpt-000001 (global update 1) because ckpt-000002: device data unreadable" in stderr
    one = _run(tmp_path, "fedbuff", processes=1, mode="small")
    assert _summary(run_dir)["resumes"] == 1 and _summary(run_dir)["global_updates"] == 3
    assert events_without_wall_time(run_dir) == events_without_wall_time(one["run_dir"])
    template = prepare(read_run(run_dir)[0])[4]
    two_params = [np.asarray(leaf) for leaf in jax.tree.leaves(checkpoint.final_params(run_dir, template))]
    with np.load(tmp_path / "fedbuff-1.npz") as saved:
        for x, name in zip(two_params, saved.files, strict=True):
            np.testing.assert_allclose(x, saved[name], rtol=0, atol=1e-6)


def test_a_logger_that_stops_the_run_stops_every_process_at_the_same_event(tmp_path):
    two = _run(tmp_path, "fedavg", processes=2, mode="small-logger", timeout=180)
    one = _run(tmp_path, "fedavg", processes=1, mode="small-logger")
    for run_dir in (two["run_dir"], one["run_dir"]):
        summary = _summary(run_dir)
        assert (summary["stop_reason"], summary["global_updates"]) == ("stopped by version rule", 2)
    assert events_without_wall_time(two["run_dir"]) == events_without_wall_time(one["run_dir"])
    with np.load(tmp_path / "fedavg-2.npz") as two_params, np.load(tmp_path / "fedavg-1.npz") as one_params:
        for name in one_params.files:
            np.testing.assert_allclose(two_params[name], one_params[name], rtol=0, atol=1e-6)


def test_cluster_arguments_are_checked_before_joining():
    from jaxfl.cluster import init_cluster

    with pytest.raises((ValueError, RuntimeError), match="process_id=3 must be below num_processes=2|before anything"):
        init_cluster("127.0.0.1:1", num_processes=2, process_id=3)


def test_processes_given_other_settings_are_refused_on_every_process_before_training(tmp_path):
    """One process with another learning rate trained its share of the clients its own way, and the
    mixed model was written under process 0's config, exit 0 on both (other mismatches hung); another
    process count on one process was taken as process 0's without a word. Three slips on process 1 at
    once (one comparison of every setting finds them all): each is named."""
    two = _run(tmp_path, "fedbuff", processes=2, mode="small-slips", timeout=300, fails=True)
    first, second = (error.strip().splitlines()[-1] for error in two["stderrs"])
    assert "ConfigError: process 1 of this run was given other settings than process 0's: every process runs the " \
           "same command" in first
    assert "ConfigError: process 1 was given other settings than process 0 (" in second
    for differs in ("client_lr: 0.5 here, 0.05 on process 0", "num_processes: 3 here, 2 on process 0",
                    "jax_enable_x64: True here, False on process 0"):
        assert differs in second, second
    assert second.count(" on process 0") == 3, second  # those three and no other
    assert not os.path.exists(tmp_path / "runs-2")  # nothing trained, nothing written


def test_processes_that_read_other_inputs_or_none_are_refused_within_seconds(tmp_path):
    """Other speeds files on two hosts trained a mix under process 0's name (exit 0 on both), as a data
    file that differs between hosts did; a data file missing on one host left the others waiting at
    their next exchange until jax's shutdown barrier aborted every process 300 s later."""
    two = _run(tmp_path, "fedbuff", processes=2, mode="small-speeds", timeout=300, fails=True)
    assert "time_per_step.sha256: " in two["stderrs"][1].strip().splitlines()[-1]
    assert not os.path.exists(tmp_path / "runs-2" / "fedbuff")  # no run folder: nothing trained
    two = _run(tmp_path, "fedbuff", processes=2, mode="small-no-data", timeout=120, fails=True)
    first, second = (error.strip().splitlines()[-1] for error in two["stderrs"])
    assert "process 1 of this cluster run could not build the run's data or model (its own output says why)" in first
    assert "dataset 'npz': no file at /host1/data.npz" in second


def test_sigterm_ends_every_process_of_a_cluster_run(tmp_path):
    """jax's preemption service took SIGTERM for itself ("SIGTERM caught") and the run trained on:
    a cluster's time limit, kill or timeout could not stop it. Now it ends each process at once."""
    import signal
    import time

    env = sharing_compilations(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    port = str(_free_port())
    running = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path), "fedbuff", str(index), "2", port,
                                 "small-long"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for index in range(2)]
    events = tmp_path / "runs-2" / "fedbuff" / "events.csv"
    deadline = time.monotonic() + 240
    while not (events.exists() and events.stat().st_size > 2000) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert events.exists(), "the run did not start"
    for process in running:
        process.send_signal(signal.SIGTERM)
    try:
        codes = [process.wait(timeout=60) for process in running]
    except subprocess.TimeoutExpired:
        for process in running:
            process.kill()
        pytest.fail("SIGTERM did not end the processes of a cluster run within 60 s")
    assert codes == [-signal.SIGTERM, -signal.SIGTERM]
    assert "SIGTERM caught" not in "".join(process.stderr.read() for process in running)


def test_a_run_folder_the_processes_do_not_share_is_refused_before_training(tmp_path):
    """A node-local --output-dir (or the same relative one from another working directory) hung every
    process without a word at the first checkpoint, which all processes write into process 0's folder."""
    two = _run(tmp_path, "fedbuff", processes=2, mode="small-elsewhere", timeout=300, fails=True)
    for error in two["stderrs"]:
        assert f"output folder {str(tmp_path / 'runs-2')!r} is not shared by every process of this run: process 1 " \
               "cannot see the file process 0 wrote into it" in error or \
               f"output folder {str(tmp_path / 'elsewhere')!r} is not shared" in error, error[-2000:]
    assert not os.path.exists(tmp_path / "runs-2")  # made for the check alone, and removed: nothing written


def test_checkpoints_spaced_by_wall_time_follow_process_0_s_clock(tmp_path):
    """Each process decided by its own clock whether a checkpoint was due, and one entering orbax's
    collective save while the other went on aborted both (gloo: collective mismatch). The run is given
    an optax object on every process, the same input: its probe ran on process 0's CPU device, which
    process 1 cannot read, and process 1 recorded none, so such a run was refused."""
    two = _run(tmp_path, "fedbuff", processes=2, mode="small-own-clock", timeout=300)
    run_dir = two["run_dir"]
    assert _summary(run_dir)["global_updates"] == 3
    assert checkpoint.latest(run_dir).endswith("ckpt-000003")


def test_a_taken_coordinator_port_is_named_by_process_0(tmp_path):
    """Process 0 serves jax's coordinator: on a port another program listens on, it died of a
    segmentation fault after one line of gRPC's log, saying nothing of the port."""
    try:  # as jax listens: every address, IPv6 where the host has it
        taken = socket.socket(socket.AF_INET6)
        taken.bind(("::", 0))
    except OSError:
        taken = socket.socket(socket.AF_INET)
        taken.bind(("0.0.0.0", 0))
    with taken:
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "jaxfl", "run", "--dataset", "mnist10k", "--model", "logreg",
                               "--clients", "4", "--output-dir", str(tmp_path / "runs"), "--coordinator-address",
                               f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "0"],
                              env=sharing_compilations(JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"jaxfl: error: process 0 could not serve jax's coordinator on port {port} (" in done.stderr
    assert f"is port {port} free on its host?" in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("lost", [1, 0], ids=["worker", "coordinator"])
def test_a_lost_process_ends_the_others_at_once_saying_how_to_go_on(tmp_path, lost):
    """SIGKILL of one process (its host lost): the other printed jax's gloo error, then waited 70-90 s
    for the lost heartbeat and aborted with a C++ stack trace, saying nothing of the run folder. Process 0
    (the coordinator, whose scheduler the other follows) lost is the same to the one left, also where that
    one is busy outside a collective (process 1 sleeps 10 s after the first checkpoint): jax's coordination
    service, inside process 0, died with it, and process 1's jax client aborted it at once (SIGABRT)."""
    import signal
    import time

    env = sharing_compilations(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    port = str(_free_port())
    running = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path), "fedbuff", str(index), "2", port,
                                 "cli-long"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for index in range(2)]
    run_dir = tmp_path / "runs-2" / "fedbuff"
    deadline = time.monotonic() + 240
    while not (os.path.isdir(run_dir / "checkpoints") and checkpoint.latest(str(run_dir))) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert checkpoint.latest(str(run_dir)), "the run wrote no checkpoint"
    left = 1 - lost
    running[lost].send_signal(signal.SIGKILL)
    try:
        code = running[left].wait(timeout=45)
    except subprocess.TimeoutExpired:
        for process in running:
            process.kill()
        pytest.fail(f"process {left} did not end within 45 s of losing process {lost}: "
                    + running[left].stderr.read()[-3000:])
    error = running[left].stderr.read()
    assert code == 1, error[-2000:]
    assert "jaxfl: error: another process of this cluster run ended (" in error
    assert f"{run_dir} keeps its logs and checkpoints up to update" in error and "--resume" in error
    assert "(on every process, with the cluster flags)" in error
    # the coordinator's own process (jaxfl._coordination_service) ends once no process is left to serve
    deadline = time.monotonic() + 10
    while _coordinator_processes(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _coordinator_processes(port)


BARRIER_SCRIPT = textwrap.dedent("""
    import pathlib, sys, time
    folder, process, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    from jaxfl.cluster import at_a_barrier, init_cluster
    init_cluster(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    from jax._src import distributed
    if process == 0:  # as in a checkpoint's save, which orbax's barriers make the others wait at
        with at_a_barrier():
            pathlib.Path(folder, "inside").touch()
            time.sleep(120)
    else:
        distributed.global_state.client.wait_at_barrier("a save's", 110_000)
""")


def test_process_0_lost_in_a_checkpoint_s_save_leaves_no_one_waiting(tmp_path):
    """Lost inside a checkpoint's save or restore, where the others wait for it at the coordination
    service's barriers (orbax's), not in a collective that fails: the service, which outlives process 0,
    kept process 1 waiting its 60 s grace for a barrier that could not pass (then jax aborted it). Now
    process 0 says when it is in one (checkpoint.save and load_device hold ``at_a_barrier``), and the
    service stops at once: process 1 ends at once, as jax ends it, as when the service was inside process 0."""
    import signal
    import time

    port = str(_free_port())
    running = [subprocess.Popen([sys.executable, "-c", BARRIER_SCRIPT, str(tmp_path), str(index), port],
                                env=sharing_compilations(JAX_PLATFORMS="cpu"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for index in range(2)]
    deadline = time.monotonic() + 120
    while not (tmp_path / "inside").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (tmp_path / "inside").exists(), running[0].communicate(timeout=5)[1][-2000:]
    time.sleep(1)
    running[0].send_signal(signal.SIGKILL)
    try:
        code = running[1].wait(timeout=30)
    except subprocess.TimeoutExpired:
        for process in running:
            process.kill()
        pytest.fail("process 1 still waited at the barrier 30 s after process 0 was lost")
    assert code != 0
    deadline = time.monotonic() + 10
    while _coordinator_processes(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _coordinator_processes(port)


def test_a_checkpoint_s_save_and_restore_say_they_are_at_a_barrier(tmp_path, monkeypatch):
    import contextlib

    from jaxfl import cluster
    from jaxfl.experiment import run_experiment, resume_experiment
    from jaxfl import RunConfig

    held = []

    @contextlib.contextmanager
    def noted():
        held.append("in")
        yield
        held.append("out")

    monkeypatch.setattr(cluster, "at_a_barrier", noted)
    config = RunConfig(algorithm="fedbuff", dataset="digits", model="logreg", clients=4, local_steps=1, batch_size=8,
                       max_updates=2, buffer_size=2, checkpoint_every=1, progress=False, output_dir=str(tmp_path))
    run_dir = run_experiment(config).run_dir
    assert held == ["in", "out"] * 3  # updates 1 and 2, and the final one
    del held[:]
    shutil.rmtree(checkpoint.latest(run_dir))  # the last one gone: a resume restores update 1's
    resume_experiment(run_dir, progress=False)
    assert held[:2] == ["in", "out"] and len(held) >= 4


def _coordinator_processes(port: str) -> list[str]:
    """The pids of the processes serving jax's coordinator at ``port`` for a test's cluster run."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as command:
                line = command.read().decode(errors="replace")
        except OSError:
            continue
        if "_coordination_service.py" in line and f":{port}\"" in line:
            found.append(pid)
    return found


def test_per_client_state_is_placed_by_process_0_s_free_memory_on_every_process(tmp_path):
    """Each process chose --client-state auto's placement by its own free memory: processes that chose
    differently saved different arrays into one collective checkpoint (orbax refused, both hung)."""
    two = _run(tmp_path, "ccfedavg", processes=2, mode="small-poor-host", timeout=300)
    summary = _summary(two["run_dir"])
    assert summary["global_updates"] == 3 and checkpoint.latest(two["run_dir"]).endswith("ckpt-000003")
    assert summary["device_memory"]["client_state_placement"] == "device"


def test_training_calls_are_split_by_the_least_free_memory_of_every_process(tmp_path):
    """Each process's memory guard read its own free memory: a host with less split its training
    calls while the other did not, and the processes' collectives no longer matched."""
    two = _run(tmp_path, "fedavg", processes=2, mode="small-tight-host", timeout=300)
    summary = _summary(two["run_dir"])
    assert summary["global_updates"] == 3
    assert summary["calls_split_by_memory_guard"] > 0  # process 0 split its calls by process 1's memory
    one = _run(tmp_path, "fedavg", processes=1, mode="small-tight-host", timeout=300)  # no tight host: unsplit
    assert _summary(one["run_dir"])["calls_split_by_memory_guard"] == 0
    assert events_without_wall_time(two["run_dir"]) == events_without_wall_time(one["run_dir"])
    with np.load(tmp_path / "fedavg-2.npz") as two_params, np.load(tmp_path / "fedavg-1.npz") as one_params:
        for name in one_params.files:  # the same clients' arithmetic, in calls of 2 instead of 6
            np.testing.assert_allclose(two_params[name], one_params[name], rtol=0, atol=1e-6)


def test_every_process_of_a_timing_only_cluster_run_names_process_0_s_folder(tmp_path):
    # process 1 named its deleted scratch folder as the run
    two = _run(tmp_path, "fedbuff", processes=2, mode="small-timing", timeout=300)
    named = [line.split(" ", 1)[1] for error in two["stderrs"] for line in error.splitlines()
             if line.startswith("RUN_DIR ")]
    assert named == [str(tmp_path / "runs-2" / "fedbuff")] * 2
    assert os.path.exists(os.path.join(named[0], "events.csv"))


def test_only_a_collective_s_lost_connection_reads_as_a_lost_process(monkeypatch):
    # any error naming a connection (a logger's server) or gloo's collective mismatch (a divergence bug) was
    # taken for a lost process: said so, and the process ended without its traceback
    from jaxfl.cluster import lost_peer

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    lost = "UNKNOWN: Gloo all-reduce failed: [pair.cc:538] Read error [127.0.0.1]:1412: Connection reset by peer"
    assert lost_peer(ValueError(lost)) and lost_peer(jax.errors.JaxRuntimeError(lost))
    assert not lost_peer(ConnectionError("wandb: connection refused by api.wandb.ai"))
    assert not lost_peer(ValueError("Gloo AllGather failed: Is there a distributed collective mismatch in your code?"))
    monkeypatch.setattr(jax, "process_count", lambda: 1)
    assert not lost_peer(ValueError(lost))
