"""The client axis sharded over several devices: a CPU with 4 host devices (a fresh process, since the
device count is fixed when jax starts) gives the single-device result.

Not bit for bit: the aggregation sums one weighted sum per training call, so calls of 4 clients
and calls of 1 add the same float32 terms in another order (last-bit differences, 1.5e-8 here,
even for an MLP), and a vmapped pair is a grouped convolution. With SGD clients, 3 rounds of a
CNN stay within 1e-6 of each other; with Adam, whose step is ±lr where a gradient is near zero,
the same last-bit differences grow to ~1e-3, so the test uses SGD to see the arithmetic.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxfl.execution import ExecutionPlan, default_steps_per_call, step_chunks

SCRIPT = textwrap.dedent("""
    import dataclasses, json, sys
    import jax, numpy as np
    import jaxfl
    from jaxfl import RunConfig, run_experiment
    from jaxfl.testing import events_without_wall_time

    base = RunConfig(algorithm=sys.argv[2], dataset="mnist10k", model="cnn", clients=8, local_steps=3,
                     batch_size=8, max_updates=3, buffer_size=4, client_optimizer="sgd", client_lr=0.05,
                     eval_at_start=False, eval_every=3, progress=False, output_dir=sys.argv[1])  # the final model's
    out = {"devices": len(jax.devices())}
    for name, devices, per_call in (("four", 4, 4), ("one", 1, 1), ("four_pairs", 4, 8), ("one_pairs", 1, 2),
                                    ("one_eight", 1, 8)):
        result = run_experiment(dataclasses.replace(base, devices=devices, clients_per_call=per_call, run_name=name))
        leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(result.params)]
        np.savez(f"{sys.argv[1]}/{name}.npz", *leaves)
        out[name] = {"params": f"{sys.argv[1]}/{name}.npz",
                     "events": events_without_wall_time(result.run_dir),
                     "accuracy": [row["accuracy"] for row in result.metrics],
                     "compilations": result.summary["compilations"],
                     "executed": result.engine.stats.executed_steps, "useful": result.engine.stats.useful_steps,
                     "train_calls": result.engine.stats.train_calls,
                     "metric_fetches": result.engine.stats.metric_fetches,
                     "versions_placed": result.engine.stats.versions_placed,
                     "mesh": len(result.engine.mesh.devices.flat),
                     "summary_devices": {key: result.summary[key] for key in ("backend", "devices", "processes")},
                     # where each device's copy of the training samples lives
                     "sample_buffers": [shard.data.unsafe_buffer_pointer()
                                        for shard in result.engine._all_devices.training_data.x.addressable_shards],
                     "home_samples": result.engine.data.x.unsafe_buffer_pointer(),
                     "samples_on_devices": sorted(str(shard.device)
                                                  for shard in result.engine._all_devices.training_data.x.addressable_shards)}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def four_device_runs(tmp_path_factory):
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "4", "JAX_PLATFORMS": "cpu"}
    folder = tmp_path_factory.mktemp("devices")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), "fedavg"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _params(run):
    with np.load(run["params"]) as saved:
        return [saved[name] for name in saved.files]


def test_four_host_devices_give_the_single_device_result(four_device_runs):
    runs = four_device_runs
    assert runs["devices"] == 4 and runs["four"]["mesh"] == 4 and runs["one"]["mesh"] == 1
    # summary.json says what trained the run
    assert runs["four"]["summary_devices"] == {"backend": "cpu", "devices": 4, "processes": 1}
    assert runs["one"]["summary_devices"]["devices"] == 1
    for sharded, single in (("four", "one"), ("four_pairs", "one_pairs")):
        for a, b in zip(_params(runs[sharded]), _params(runs[single]), strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert runs["four"]["events"] == runs["one"]["events"] == runs["four_pairs"]["events"]


def test_vmapped_convolutional_clients_agree_with_one_client_per_call_to_the_stated_tolerance(four_device_runs):
    """The README's claim: a CNN's clients vmapped 2 or 8 to a call (a grouped convolution) give the
    one-client-per-call parameters to float32 reassociation, within 1e-6 after three SGD rounds, and
    the same event log; held-out accuracy may differ in the last digits, not more."""
    runs = four_device_runs
    single = _params(runs["one"])
    for batched in ("one_pairs", "one_eight"):
        differences = [float(np.max(np.abs(a - b))) for a, b in zip(_params(runs[batched]), single, strict=True)]
        assert max(differences) <= 1e-6, (batched, max(differences))
        assert runs[batched]["events"] == runs["one"]["events"]
        assert np.allclose(runs[batched]["accuracy"], runs["one"]["accuracy"], rtol=0, atol=2e-3)


def test_sharded_calls_compile_once_per_shape_and_pad_nothing(four_device_runs):
    four = four_device_runs["four"]
    # 8 clients of 3 steps: two calls of 4 (one per device) per round, one chunk shape (the 3 steps),
    # each call that one chunk and its finish in one program; the calls' rows stay on their devices
    # and are summed there, the four partial sums added on the home device by one program; each
    # round's global model goes to the devices as one flat vector, flattened by one program
    assert four["compilations"] == {"init": 1, "run_and_finish": 1, "server_step": 1, "devices_total": 1,
                                    "flat_version": 1}
    assert four["executed"] == four["useful"] == 3 * 8 * 3


def test_a_rounds_calls_queue_without_waiting_and_each_version_is_placed_once(four_device_runs):
    """Per round of 8 clients on 4 devices: two calls, queued back to back (the host waits once, at
    the aggregation, for both calls' metrics), and the round's global version copied to the devices
    once, not once per call."""
    four, pairs = four_device_runs["four"], four_device_runs["four_pairs"]
    # (3 local steps the clients share: one 3-step chunk, one step call per training call)
    assert four["train_calls"] == 3 * 2 and four["metric_fetches"] == 3 and four["versions_placed"] == 3
    assert pairs["train_calls"] == 3 * 1 and pairs["metric_fetches"] == 3 and pairs["versions_placed"] == 3
    assert four_device_runs["one"]["versions_placed"] == 0  # one device: the versions are already there


def test_cpu_devices_share_one_host_copy_of_the_samples(four_device_runs):
    """CPU devices share the host's memory: the four devices' training samples and the home device's
    are one buffer (a million-client federation's 4 GB once, not once per device)."""
    four = four_device_runs["four"]
    assert len(four["samples_on_devices"]) == len(set(four["samples_on_devices"])) == 4
    assert set(four["sample_buffers"]) == {four["home_samples"]}


def test_place_read_only_aliases_aligned_host_arrays_and_aligns_others_once():
    import jax
    from jaxfl._devices import aligned_empty, place_read_only

    devices = jax.devices("cpu")
    aligned = aligned_empty((50, 3), np.float32)
    aligned[...] = np.arange(150, dtype=np.float32).reshape(50, 3)
    placed = place_read_only(aligned, devices)
    assert {array.unsafe_buffer_pointer() for array in placed} == {aligned.ctypes.data}  # no copy
    unaligned = np.frombuffer(bytes(4) + aligned.tobytes(), np.uint8)[4:].view(np.float32).reshape(50, 3)
    assert unaligned.ctypes.data % 64 != 0
    placed = place_read_only(unaligned, devices)
    assert len({array.unsafe_buffer_pointer() for array in placed}) == 1  # one aligned copy for every device
    assert all(np.array_equal(np.asarray(array), aligned) for array in placed)


def test_devices_beyond_the_machine_are_refused_by_count():
    with pytest.raises(ValueError, match=r"devices=4096 but this process has \d+ cpu device.*from 1 to"):
        ExecutionPlan.for_backend("cpu", devices=4096)


def test_clients_per_call_is_a_multiple_of_the_devices():
    with pytest.raises(ValueError, match="clients_per_call=3 is not a multiple of devices=2"):
        ExecutionPlan(clients_per_call=3, steps_per_call=1, devices=2)
    assert ExecutionPlan(clients_per_call=8, steps_per_call=1, devices=2).call_size(3) == 4
    assert ExecutionPlan(clients_per_call=8, steps_per_call=1, devices=2).call_size(5) == 8
    assert ExecutionPlan(clients_per_call=6, steps_per_call=1, devices=3).call_size(4) == 6


@pytest.mark.parametrize("local_steps, chunk", [(1, 1), (6, 6), (10, 10), (50, 10), (12, 6), (13, 10), (None, 10)])
def test_steps_per_call_follow_local_steps(local_steps, chunk):
    assert default_steps_per_call(local_steps, "gpu") == chunk  # accelerators: at most 10 unrolled steps


@pytest.mark.parametrize("local_steps, chunk", [(1, 1), (6, 6), (13, 10), (None, 10)])
def test_cpu_calls_unroll_the_shared_steps_and_remainders_one_step_at_a_time(local_steps, chunk):
    """On a CPU clients that share a step count run it in full chunks, as elsewhere (one-step calls
    cost 8-9 % more per step in the cross-device benchmark's call); a remainder runs as one-step
    calls, so varying step counts compile two shapes, not a chunk per power of two
    (benchmarks/README.md, 2026-11-30)."""
    assert default_steps_per_call(local_steps) == default_steps_per_call(local_steps, "cpu") == chunk
    assert ExecutionPlan.for_backend("cpu", devices=1, local_steps=local_steps).steps_per_call == chunk
    assert step_chunks(13, chunk, one_step_remainders=True) == [chunk] * (13 // chunk) + [1] * (13 % chunk)


@pytest.mark.parametrize("steps, per_call, chunks", [(6, 6, [6]), (13, 10, [10, 2, 1]), (7, 10, [4, 2, 1]),
                                                     (20, 10, [10, 10]), (0, 5, []), (1, 5, [1])])
def test_step_chunks_run_exactly_the_steps(steps, per_call, chunks):
    assert step_chunks(steps, per_call) == chunks
    assert sum(step_chunks(steps, per_call)) == steps
    ones = step_chunks(steps, per_call, one_step_remainders=True)
    assert sum(ones) == steps and set(ones) <= {per_call, 1} and ones[:steps // per_call] == [per_call] * (steps // per_call)


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_a_bad_cpu_device_count_is_refused_by_name_on_import(value):
    """``JAXFL_CPU_DEVICES=abc`` was a bare ``int()`` traceback on ``import jaxfl``, 0 an obscure jax
    backend error, and -2 silently one device."""
    from jaxfl._devices import _wanted_devices

    with pytest.raises(ValueError, match=f"JAXFL_CPU_DEVICES='{value}' is not allowed: a whole number of CPU "
                                         "devices, 1 or more"):
        _wanted_devices(value)
    assert _wanted_devices("3") == 3


def test_a_bad_cpu_device_count_stops_import_with_its_name():
    env = {key: value for key, value in os.environ.items() if key not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
    done = subprocess.run([sys.executable, "-c", "import jaxfl"], env={**env, "JAXFL_CPU_DEVICES": "abc"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "JAXFL_CPU_DEVICES='abc' is not allowed" in done.stderr.strip().splitlines()[-1]


def test_one_client_calls_on_two_devices_compile_only_the_program_they_run(tmp_path):
    """Without batching every call holds one client, which runs on the first device alone; the
    memory guard read XLA's figure for one client on every device, a program no call ran (14 s of a
    29 s CNN run on 2 CPU devices). Where the estimate fits by the margin, it is trusted as at the start."""
    script = textwrap.dedent("""
        import json, sys
        import jax
        from jaxfl import RunConfig, run_experiment

        # a CNN: its estimate is the one the guard did not trust without XLA's figure
        run = run_experiment(RunConfig(algorithm="fedbuff", dataset="mnist10k", model="cnn", clients=4,
                                       local_steps=2, batch_size=8, max_updates=3, buffer_size=2, batching=False,
                                       progress=False, output_dir=sys.argv[1]))
        print(json.dumps({"devices": len(jax.devices()), "per_batch": run.summary["mean_clients_per_batch"],
                          "compilations": run.summary["compilations"]}))
    """)
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "2", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert run["devices"] == 2 and run["per_batch"] == 1.0
    assert sum(count for name, count in run["compilations"].items() if name in ("run_and_finish", "run_steps")) == 1


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: one CPU device is one per core")
def test_jax_started_before_jaxfl_is_said_on_import():
    """`jax.devices()` before `import jaxfl` (a notebook's first cell) left jax one CPU device: runs on
    it differed from the command's (a CNN by 9e-5) under the same run names, without a word (a review)."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("JAX_NUM_CPU_DEVICES", "JAXFL_CPU_DEVICES", "XLA_FLAGS")}
    started = subprocess.run([sys.executable, "-W", "always", "-c", "import jax; jax.devices(); import jaxfl"],
                             env=env, capture_output=True, text=True, timeout=300)
    assert "jax started before jaxfl was imported (a jax call before `import jaxfl`), with 1 CPU device for this " \
           "machine's" in started.stderr, started.stderr
    told = subprocess.run([sys.executable, "-W", "always", "-c", "import jax; jax.devices(); import jaxfl"],
                          env={**env, "JAXFL_CPU_DEVICES": "4"}, capture_output=True, text=True, timeout=300)
    assert "jax started before jaxfl" in told.stderr  # asked for 4, has 1: said
    for code, extra in (("import jaxfl; import jax; jax.devices()", {}),  # jaxfl first: a device per core
                        ("import jax; jax.devices(); import jaxfl", {"JAXFL_CPU_DEVICES": "1"})):  # meant
        quiet = subprocess.run([sys.executable, "-W", "always", "-c", code], env={**env, **extra},
                               capture_output=True, text=True, timeout=300)
        assert quiet.returncode == 0 and "jax started before jaxfl" not in quiet.stderr, quiet.stderr


def test_a_mac_counts_its_performance_cores_and_other_systems_every_core(monkeypatch):
    """Without Linux's CPU affinity, every core was a device; on Apple silicon that made the slow
    efficiency cores devices that each sharded call waits for. (The sysctl itself is macOS's: here
    its reader is replaced, and on Linux it finds no such call.)"""
    from jaxfl import _devices

    assert _devices._sysctl_int("hw.perflevel0.logicalcpu") is None or sys.platform == "darwin"
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    asked = []
    monkeypatch.setattr(_devices, "_sysctl_int", lambda name: asked.append(name) or 4)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert _devices.usable_cores() == 4 and asked == ["hw.perflevel0.logicalcpu"]
    monkeypatch.setattr(_devices, "_sysctl_int", lambda name: None)  # an Intel Mac: one kind of core
    assert _devices.usable_cores() == (os.cpu_count() or 1)
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(_devices, "_sysctl_int", lambda name: 1 / 0)  # not asked
    assert _devices.usable_cores() == (os.cpu_count() or 1)


def test_a_mac_s_host_memory_is_its_installed_ram_where_linux_s_available_figure_is_missing(monkeypatch):
    """Without /proc/meminfo the figure was None, taken as room: client_state="auto" never chose host
    memory or memmap for a bank larger than the Mac's RAM."""
    import builtins

    from jaxfl import _devices, execution

    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *rest, **options: (_ for _ in ()).throw(
        FileNotFoundError(path)) if path == "/proc/meminfo" else real_open(path, *rest, **options))
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(_devices, "_sysctl_int", lambda name, wide=False: 16 << 30 if (name, wide) == ("hw.memsize", True)
                        else None)
    assert execution.available_host_memory() == 16 << 30
    monkeypatch.setattr(sys, "platform", "linux")
    assert execution.available_host_memory() is None
