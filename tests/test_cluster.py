"""A run over two processes (jax.distributed on one machine, CPU collectives through gloo) gives the
single-process result on as many devices: the same event log and the same model.

Each process runs the same scheduler; the client axis of every training call spans both processes'
devices, and each process gathers the trained updates. Parameters are compared to 1e-6 (SGD
clients): the arithmetic per client is the same, but it is not promised bit for bit across a
gather through gloo.
"""
import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from jaxfl import checkpoint
from jaxfl.experiment import prepare
from jaxfl.resume import read_run_config
from jaxfl.testing import events_without_wall_time

SCRIPT = textwrap.dedent("""
    import json, sys
    folder, algorithm, process, processes, port, mode = sys.argv[1:3] + [int(a) for a in sys.argv[3:5]] + sys.argv[5:]
    import jaxfl
    from jaxfl.cluster import init_cluster
    if processes > 1:
        init_cluster(f"127.0.0.1:{port}", num_processes=processes, process_id=process)
    import jax, numpy as np
    from jaxfl import RunConfig, run_experiment
    from jaxfl.experiment import resume_experiment
    from jaxfl.testing import _interrupt_after, _Interrupted
    config = RunConfig(algorithm=algorithm, dataset="mnist10k", model="cnn", clients=6, local_steps=3, batch_size=8,
                       max_updates=3, buffer_size=2, client_optimizer="sgd", client_lr=0.05, progress=False,
                       checkpoint_every=1, output_dir=f"{folder}/runs-{processes}", run_name=algorithm)
    if mode == "interrupted":  # every process stops at the same event, the first after checkpoint 1
        with _interrupt_after(1):
            try:
                run_experiment(config)
            except _Interrupted:
                sys.exit(0)
        sys.exit("the run was not interrupted")
    result = resume_experiment(f"{folder}/runs-{processes}/{algorithm}") if mode == "resume" else run_experiment(config)
    if process == 0:
        np.savez(f"{folder}/{algorithm}-{processes}.npz", *[np.asarray(leaf) for leaf in jax.tree.leaves(result.params)])
        print("RESULT", json.dumps({"run_dir": result.run_dir, "mesh": int(result.engine.mesh.size),
                          "processes": jax.process_count(), "summary": result.summary}))
""")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(folder, algorithm, processes, mode="run"):
    """Run the script in ``processes`` processes (2 CPU devices in all); process 0's output, or None."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(2 // processes)}
    port = str(_free_port())
    commands = [[sys.executable, "-c", SCRIPT, str(folder), algorithm, str(index), str(processes), port, mode]
                for index in range(processes)]
    running = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for command in commands]
    outputs = [process.communicate(timeout=600) for process in running]
    for process, (_, stderr) in zip(running, outputs):
        assert process.returncode == 0, stderr[-3000:]
    # (gloo writes to stdout too)
    lines = [line for line in outputs[0][0].splitlines() if line.startswith("RESULT ")]
    return {**json.loads(lines[-1][len("RESULT "):]), "stderr": outputs[0][1]} if lines else None


@pytest.mark.parametrize("algorithm, interrupted", [("fedavg", False), ("fedbuff", True)])
def test_two_processes_give_the_single_process_result(tmp_path, algorithm, interrupted):
    if interrupted:  # two processes cut short after their first checkpoint, then resumed by two processes
        _run(tmp_path, algorithm, processes=2, mode="interrupted")
        run_dir = tmp_path / "runs-2" / algorithm
        assert not (run_dir / "summary.json").exists() and checkpoint.latest(str(run_dir)).endswith("ckpt-000001")
        two = _run(tmp_path, algorithm, processes=2, mode="resume")
    else:
        two = _run(tmp_path, algorithm, processes=2)
    one = _run(tmp_path, algorithm, processes=1)
    assert two["processes"] == 2 and two["mesh"] == 2 and one["processes"] == 1 and one["mesh"] == 2
    assert two["summary"]["resumes"] == int(interrupted) and one["summary"]["resumes"] == 0
    assert events_without_wall_time(two["run_dir"]) == events_without_wall_time(one["run_dir"])
    with np.load(tmp_path / f"{algorithm}-2.npz") as a, np.load(tmp_path / f"{algorithm}-1.npz") as b:
        two_params, one_params = [a[name] for name in a.files], [b[name] for name in b.files]
    for x, y in zip(two_params, one_params, strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
    assert two["summary"]["global_updates"] == one["summary"]["global_updates"] == 3
    # Checkpoints are written as in one process (the two newest kept), and the final one, written by
    # both processes through orbax, reads back in this single process as the run's model, bit for bit.
    for run in (two, one):
        root = os.path.join(run["run_dir"], "checkpoints")
        assert sorted(n for n in os.listdir(root) if n.startswith("ckpt-")) == ["ckpt-000002", "ckpt-000003"]
        assert checkpoint.latest(run["run_dir"]).endswith("ckpt-000003")
    template = prepare(read_run_config(two["run_dir"]))[4]
    for x, y in zip(jax.tree.leaves(checkpoint.final_params(two["run_dir"], template)), two_params, strict=True):
        assert np.array_equal(np.asarray(x), y)
    assert "checkpoint" not in two["stderr"].lower(), two["stderr"][-2000:]
    # Only process 0 keeps a run directory; the other process's scratch folder is gone.
    assert sorted(os.listdir(tmp_path / "runs-2")) == [algorithm]


def test_cluster_arguments_are_checked_before_joining():
    from jaxfl.cluster import init_cluster

    with pytest.raises((ValueError, RuntimeError), match="process_id=3 must be below num_processes=2|before anything"):
        init_cluster("127.0.0.1:1", num_processes=2, process_id=3)
