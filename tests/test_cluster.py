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

import numpy as np
import pytest

from jaxfl.testing import events_without_wall_time

SCRIPT = textwrap.dedent("""
    import json, sys
    folder, algorithm, process, processes, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    import jaxfl
    from jaxfl.cluster import init_cluster
    if processes > 1:
        init_cluster(f"127.0.0.1:{port}", num_processes=processes, process_id=process)
    import jax, numpy as np
    from jaxfl import RunConfig, run_experiment
    config = RunConfig(algorithm=algorithm, dataset="mnist10k", model="cnn", clients=6, local_steps=3, batch_size=8,
                       max_updates=3, buffer_size=2, client_optimizer="sgd", client_lr=0.05, progress=False,
                       output_dir=f"{folder}/runs-{processes}", run_name=algorithm)
    result = run_experiment(config)
    if process == 0:
        np.savez(f"{folder}/{algorithm}-{processes}.npz", *[np.asarray(leaf) for leaf in jax.tree.leaves(result.params)])
        print(json.dumps({"run_dir": result.run_dir, "mesh": int(result.engine.mesh.size),
                          "processes": jax.process_count(), "summary": result.summary}))
""")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(folder, algorithm, processes):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(2 // processes)}
    port = str(_free_port())
    commands = [[sys.executable, "-c", SCRIPT, str(folder), algorithm, str(index), str(processes), port]
                for index in range(processes)]
    running = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for command in commands]
    outputs = [process.communicate(timeout=600) for process in running]
    for process, (_, stderr) in zip(running, outputs):
        assert process.returncode == 0, stderr[-3000:]
    return {**json.loads(outputs[0][0].strip().splitlines()[-1]), "stderr": outputs[0][1]}


@pytest.mark.parametrize("algorithm", ["fedavg", "fedbuff"])
def test_two_processes_give_the_single_process_result(tmp_path, algorithm):
    two = _run(tmp_path, algorithm, processes=2)
    one = _run(tmp_path, algorithm, processes=1)
    assert two["processes"] == 2 and two["mesh"] == 2 and one["processes"] == 1 and one["mesh"] == 2
    assert events_without_wall_time(two["run_dir"]) == events_without_wall_time(one["run_dir"])
    with np.load(tmp_path / f"{algorithm}-2.npz") as a, np.load(tmp_path / f"{algorithm}-1.npz") as b:
        for name in a.files:
            np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-6)
    assert two["summary"]["global_updates"] == one["summary"]["global_updates"] == 3
    # No checkpoint is written in such a run, and process 0 says so instead of dropping them silently.
    assert "no checkpoints are written" in two["stderr"] and "no checkpoints" not in one["stderr"]
    # Only process 0 keeps a run directory; the other process's scratch folder is gone.
    assert sorted(os.listdir(tmp_path / "runs-2")) == [algorithm]


def test_cluster_arguments_are_checked_before_joining():
    from jaxfl.cluster import init_cluster

    with pytest.raises((ValueError, RuntimeError), match="process_id=3 must be below num_processes=2|before anything"):
        init_cluster("127.0.0.1:1", num_processes=2, process_id=3)
