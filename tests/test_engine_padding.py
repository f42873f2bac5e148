"""Steps the devices of a training call compute, counted (not timed).

The client axis of a call is sharded over the devices; a rolled step loop runs on each device for its
own rows' largest step count, so a device holding only zero-step padding rows (a call of one client
on two devices) computes nothing, and the engine counts as computed what the devices run. A row's
``LocalState.step`` counts the loop's iterations on its device (masked or not), so the states that
come out of a call say how many steps each device ran. Runs in a fresh process with 2 host devices
(the device count is fixed when jax starts)."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxfl._devices import without_device_count_flag
from jaxfl.engine import device_steps_computed

SCRIPT = textwrap.dedent("""
    import dataclasses, json, sys
    import jax, numpy as np
    from jaxfl import RunConfig, run_experiment
    from jaxfl.engine import Engine
    from jaxfl.testing import events_without_wall_time

    calls = []
    original = Engine._run_chunks

    def recording(self, mesh_calls, states, views, steps):
        states, computed = original(self, mesh_calls, states, views, steps)
        calls.append({"run": RUN[0], "steps": np.asarray(steps).tolist(), "computed": computed,
                      "loop": self.step_loop, "devices": mesh_calls.mesh.size,
                      "ran": np.asarray(self._on_home(states, mesh_calls).step).tolist()})
        return states, computed

    Engine._run_chunks = recording
    RUN = [None]
    # A call that is one chunk (here every call: a rolled loop) runs its steps and finish in one
    # program whose states stay inside it; the "separate" runs train in the programs one by one
    # (init, the step loop, finish), where the loop's states come out to be read.
    separate = property(lambda self: False, lambda self, value: None)
    common = dict(dataset="mnist10k", model="mlp", batch_size=16, stop_at_target=False, progress=False,
                  client_optimizer="sgd", client_lr=0.05, output_dir=sys.argv[1], checkpoint_every=None,
                  eval_at_start=False)  # (the final model's evaluation alone: no test reads the metrics)
    configs = {
        # FedAT, 7 steps each: calls of 1 or 2 clients on 2 devices
        "fedat": dict(algorithm="fedat", clients=12, local_steps=7, speed_mean=0.05, max_updates=40, eval_every=40),
        # FedAvg, local_epochs on a skewed partition: every client its own step count
        "epochs": dict(algorithm="fedavg", clients=8, local_epochs=0.5, partition="dirichlet_client",
                       dirichlet_alpha=0.3, client_sizes="lognormal", max_updates=3, eval_every=3),
    }
    out = {"devices": len(jax.devices()), "runs": {}}
    # "unpacked": the rows' results leave the devices leaf by leaf instead of packed (_PackedResults)
    import jaxfl.engine as engine_module
    packing = engine_module._PackedResults.for_trainer
    for name, config in configs.items():
        for devices, mode in ((2, "separate"), (2, "one"), (1, "one"), (2, "unpacked")):
            label = f"{name}-{devices}" + ("" if mode == "one" else f"-{mode}")
            RUN[0] = label
            if mode == "separate":
                Engine.one_chunk_calls = separate
            if mode == "unpacked":
                engine_module._PackedResults.for_trainer = classmethod(lambda cls, *args: None)
            try:
                result = run_experiment(RunConfig(**common, **config, devices=devices, run_name=label))
            finally:
                if mode == "separate":
                    del Engine.one_chunk_calls
                engine_module._PackedResults.for_trainer = packing
            np.savez(f"{sys.argv[1]}/{label}.npz", *[np.asarray(leaf) for leaf in jax.tree.leaves(result.params)])
            out["runs"][label] = {"executed": result.engine.stats.executed_steps,
                                  "useful": result.engine.stats.useful_steps,
                                  "summary_computed": result.summary["steps_computed_with_padding"],
                                  "padding_waste": result.summary["padding_waste"],
                                  "compilations": result.summary["compilations"],
                                  "packed": result.engine._all_devices.packing is not None,
                                  "events": events_without_wall_time(result.run_dir),
                                  "params": f"{sys.argv[1]}/{label}.npz"}
    out["calls"] = calls
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def two_device_runs(tmp_path_factory):
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "2", "JAX_PLATFORMS": "cpu"}
    # the device count is JAX_NUM_CPU_DEVICES's alone; other XLA flags (the suite's: see conftest.py) stay
    env["XLA_FLAGS"] = without_device_count_flag(env.get("XLA_FLAGS", ""))
    env.pop("JAXFL_CPU_DEVICES", None)
    folder = tmp_path_factory.mktemp("padding")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(folder)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _own_maxima(steps, devices):
    return np.asarray(steps).reshape(devices, -1).max(axis=1)


def test_each_device_loops_only_its_own_rows_steps(two_device_runs):
    """Every row's step counter after a call is its device's largest count: the device looped
    exactly that many times (a padding-only device: zero), not the call's largest count."""
    calls = [call for call in two_device_runs["calls"] if call["devices"] == 2]
    assert two_device_runs["devices"] == 2 and calls and all(call["loop"] == "rolled" for call in calls)
    padding_only = 0
    for call in calls:
        own = _own_maxima(call["steps"], 2)
        assert call["ran"] == np.repeat(own, len(call["steps"]) // 2).tolist(), call
        padding_only += int((own == 0).sum() and max(call["steps"]) > 0)
    assert padding_only > 0  # the runs hold calls of one client on two devices


def test_computed_steps_count_what_the_devices_run(two_device_runs):
    for label, run in two_device_runs["runs"].items():
        calls = [call for call in two_device_runs["calls"] if call["run"] == label]
        if label.endswith("-unpacked"):
            continue
        if not label.endswith("-separate"):
            assert not calls  # every call one program: no step loop of its own
            continue
        per_device = sum(int(_own_maxima(c["steps"], c["devices"]).sum()) * (len(c["steps"]) // c["devices"])
                         for c in calls)
        assert run["executed"] == run["summary_computed"] == per_device, label
        # the same calls, each one program, compute what the loop on its own computes
        one_program = two_device_runs["runs"][label.removesuffix("-separate")]
        assert one_program["executed"] == one_program["summary_computed"] == per_device, label
    # FedAT: all clients take 7 steps, so nothing is masked (before, each device looped the call's
    # largest count: the padding device of a one-client call too, 616 computed for 441 trained)
    assert two_device_runs["runs"]["fedat-2"]["executed"] == two_device_runs["runs"]["fedat-2"]["useful"]
    assert two_device_runs["runs"]["fedat-2"]["padding_waste"] == 0
    # ragged counts, one client per device: no masked step at all (before: each call's largest count
    # on both devices)
    epochs = two_device_runs["runs"]["epochs-2"]
    old = sum(max(c["steps"]) * len(c["steps"]) for c in two_device_runs["calls"] if c["run"] == "epochs-2-separate")
    assert epochs["useful"] == epochs["executed"] < old, (epochs["executed"], old)


def test_skipping_changes_no_result(two_device_runs):
    """Two devices give the one-device run's event log and, to float32 reassociation of the
    per-call sums (tests/test_devices.py), its model."""
    runs = two_device_runs["runs"]
    for name in ("fedat", "epochs"):
        assert runs[f"{name}-2"]["events"] == runs[f"{name}-1"]["events"]
        with np.load(runs[f"{name}-2"]["params"]) as two, np.load(runs[f"{name}-1"]["params"]) as one:
            for key in two.files:
                np.testing.assert_allclose(two[key], one[key], rtol=0, atol=1e-6)


def test_a_call_as_one_program_gives_the_programs_one_by_one_bit_for_bit(two_device_runs):
    """A call that is one chunk runs its steps and finish in one program (one dispatch and one pass
    over the models fewer); its updates are those of init, the step loop and finish run one by one,
    bit for bit: the same arithmetic, only the program boundary moves."""
    runs = two_device_runs["runs"]
    for name in ("fedat", "epochs"):
        one, separate = runs[f"{name}-2"], runs[f"{name}-2-separate"]
        assert one["compilations"]["run_and_finish"] == 1 and "run_steps" not in one["compilations"]
        assert separate["compilations"]["run_steps"] == 1 and "run_and_finish" not in separate["compilations"]
        assert one["events"] == separate["events"]
        with np.load(one["params"]) as a, np.load(separate["params"]) as b:
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.parametrize("steps, devices, lengths, computed", [
    ([3, 4, 0, 0], 2, [None], 8), ([0, 0, 5, 1], 2, [None], 10), ([2, 2, 2, 2], 4, [None], 8),
    ([3, 4, 0, 0], 2, [4], 16), ([3, 4, 0, 0], 2, [2, 1, 1], 16), ([], 2, [], 0)])
def test_device_steps_computed(steps, devices, lengths, computed):
    assert device_steps_computed(np.array(steps, dtype=np.int32), devices, lengths) == computed


def test_a_cnn_with_ragged_step_counts_compiles_the_chunk_and_one_step(small_config):
    """CPU, a convolutional model (unrolled step chunks) whose clients take different step counts
    (local_epochs on lognormal client sizes): full chunks, then the remainder as one-step calls, so
    the run compiles at most two chunk shapes and computes no masked step; power-of-two remainders
    (the other backends') would compile a chunk per power of two below the largest count."""
    from jaxfl.execution import step_chunks
    from jaxfl.experiment import run_experiment
    from tests.conftest import replace

    config = replace(small_config, algorithm="fedavg", model="cnn", clients=6, local_steps=50, local_epochs=0.05,
                     partition="dirichlet_client", dirichlet_alpha=0.3, client_sizes="lognormal", max_updates=1,
                     devices=1)
    result = run_experiment(config)
    engine = result.engine
    chunk = engine.plan.steps_per_call
    assert engine.step_loop == "unrolled" and chunk > 1
    counts = sorted({int(row["steps"]) for row in engine._fetched_metrics.values()})
    assert len(counts) >= 3, counts  # ragged indeed
    shapes = {length for _, length in engine._all_devices.executables}
    assert shapes == {length for count in counts for length in step_chunks(count, chunk, one_step_remainders=True)}
    assert shapes <= {chunk, 1} and result.summary["compilations"]["run_steps"] == len(shapes)
    assert engine.stats.executed_steps == engine.stats.useful_steps  # one client per call: nothing masked
    # power-of-two remainders' chunk shapes for these counts (each compiled once): more, and longer
    former = {length for count in counts for length in step_chunks(count, chunk)}
    assert len(former) >= 3 and sum(former) >= 7, former


def test_results_packed_on_their_devices_agree_with_leaf_by_leaf_copies(two_device_runs):
    """On two devices a call's deltas, metrics and buffers leave the programs as one flat array per
    kind and stay on the device that trained them, summed there; the unpacked results are copied leaf
    by leaf to the first device and summed there. The event logs (losses, steps) agree exactly; the
    models to float32 reassociation (the same terms, summed per device first)."""
    runs = two_device_runs["runs"]
    for name in ("fedat", "epochs"):
        packed, unpacked = runs[f"{name}-2"], runs[f"{name}-2-unpacked"]
        assert packed["packed"] and not unpacked["packed"] and not runs[f"{name}-1"]["packed"]
        assert packed["events"] == unpacked["events"]
        with np.load(packed["params"]) as a, np.load(unpacked["params"]) as b:
            for key in a.files:
                np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6)
