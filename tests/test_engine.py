"""The engine: runs are deterministic; bucket sizes change no result; one compilation per bucket; a
hand-computed reference for FedAsync's mixing rule. (Batched = one-at-a-time for every algorithm is in
the conformance suite, tests/test_conformance.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.config import ConfigError
from jaxfl.experiment import make_client_optimizer, prepare, run_experiment
from jaxfl.engine import TRAIN_STREAM, Engine
from jaxfl.testing import events_without_wall_time
from jaxfl.kernels import ClientView, FederatedArrays, local_train, make_client_trainer
from tests.conftest import replace

def leaves(params):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(params)]


def test_same_seed_same_run_bit_for_bit(small_config):
    config = replace(small_config, algorithm="fedasync", heterogeneity="normal", max_updates=6)
    first = run_experiment(replace(config, run_name="a"))
    second = run_experiment(replace(config, run_name="b"))
    assert events_without_wall_time(first.run_dir) == events_without_wall_time(second.run_dir)
    for a, b in zip(leaves(first.params), leaves(second.params)):
        np.testing.assert_array_equal(a, b)
    other_seed = run_experiment(replace(config, seed=1, run_name="c"))
    assert events_without_wall_time(first.run_dir) != events_without_wall_time(other_seed.run_dir)


def test_bucket_sizes_do_not_change_results(small_config):
    config = replace(small_config, algorithm="fedavg", max_updates=2, clients=6, client_optimizer="sgd",
                     client_lr=0.05)
    results = [run_experiment(replace(config, clients_per_call=k, steps_per_call=s, run_name=f"k{k}s{s}"))
               for k, s in ((1, 4), (2, 3), (8, 1))]
    for other in results[1:]:
        for a, b in zip(leaves(results[0].params), leaves(other.params)):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("model", ["cnn", "mlp"])
def test_a_call_as_one_program_changes_no_bit(small_config, model, monkeypatch):
    """A call that is one chunk (a CNN's unrolled chunk of all its local steps, an MLP's rolled loop)
    runs its steps and finish in one program; the programs run one by one (init, steps, finish) give
    the same updates bit for bit, and the same event log, with two compilations more."""
    from jaxfl.engine import Engine

    config = replace(small_config, algorithm="fedbuff", model=model, clients=6, local_steps=3, max_updates=3,
                     client_optimizer="sgd", client_lr=0.05, devices=1)
    one = run_experiment(replace(config, run_name="one"))
    monkeypatch.setattr(Engine, "one_chunk_calls", property(lambda self: False, lambda self, value: None),
                        raising=False)
    separate = run_experiment(replace(config, run_name="separate"))
    assert one.engine.plan.steps_per_call == 3
    assert one.summary["compilations"] == {"init": 1, "run_and_finish": 1, "server_step": 1}
    assert separate.summary["compilations"] == {"init": 1, "run_steps": 1, "finish": 1, "server_step": 1}
    assert one.engine.stats.train_calls == separate.engine.stats.train_calls
    assert events_without_wall_time(one.run_dir) == events_without_wall_time(separate.run_dir)
    for a, b in zip(leaves(one.params), leaves(separate.params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_calls_metrics_come_back_as_one_array_and_exactly(small_config, monkeypatch):
    """A call's metrics (loss, steps, finite) leave the device as one (K, 3) int32 array, not a leaf
    each (the host's fetch costs per leaf), and unpack to exactly the values the leaves give: the
    same client metrics and event log as without the columns."""
    from jaxfl import engine as engine_module

    config = replace(small_config, algorithm="fedbuff", clients=6, local_steps=3, max_updates=3,
                     client_optimizer="sgd", client_lr=0.05, devices=1)
    fetched = []
    trained_batch = engine_module.Engine._trained_batch

    def noting(self, results, calls, padded):
        batch, metrics = trained_batch(self, results, calls, padded)
        fetched.append(jax.tree.leaves(metrics))
        return batch, metrics

    monkeypatch.setattr(engine_module.Engine, "_trained_batch", noting)
    columns = run_experiment(replace(config, run_name="columns"))
    assert fetched and all(len(leaves) == 1 and leaves[0].dtype == jnp.int32 and leaves[0].shape[1] == 3
                           for leaves in fetched)
    calls = len(fetched)
    monkeypatch.setattr(engine_module._MetricColumns, "for_trainer", classmethod(lambda cls, *args: None))
    separate = run_experiment(replace(config, run_name="separate"))
    assert all(len(leaves) == 3 for leaves in fetched[calls:])
    assert events_without_wall_time(columns.run_dir) == events_without_wall_time(separate.run_dir)
    ids = sorted(columns.engine._fetched_metrics)
    assert ids and ids == sorted(separate.engine._fetched_metrics)
    for dispatch_id in ids:
        a, b = columns.engine.client_metrics(dispatch_id), separate.engine.client_metrics(dispatch_id)
        assert a == b and {type(value) for value in a.values()} == {type(value) for value in b.values()}


@pytest.mark.parametrize("model, loop, chunks", [("mlp", "rolled", 1), ("cnn", "unrolled", 2), ("lenet5", "rolled", 1)])
def test_one_compilation_per_bucket_and_padding_counted(small_config, model, loop, chunks):
    # 6 clients, 8 per call (one device): every round is one padded call of 8. A dense model's 4
    # steps run as one rolled loop; a CNN's (unrolled on CPU) as a 3-step and a 1-step chunk, each
    # shape compiled once over the 4 rounds; LeNet-5's (every convolution a matrix product on CPU) as
    # one rolled loop too. A call that is one program (the rolled loop) runs its steps and finish
    # in it: one dispatch and one compilation fewer.
    # (SGD, as in test_step_loop_given_overrides_the_engines_choice: one set of programs for both tests,
    # compiled by the first and read back from the cache by the other)
    config = replace(small_config, algorithm="fedavg", model=model, clients=6, clients_per_call=8, steps_per_call=3,
                     local_steps=4, max_updates=4, devices=1, client_optimizer="sgd", client_lr=0.05)
    result = run_experiment(config)
    assert result.summary["step_loop"] == loop
    programs = {"run_and_finish": 1} if chunks == 1 else {"run_steps": chunks, "finish": 1}
    assert result.summary["compilations"] == {"init": 1, **programs, "server_step": 1}
    stats = result.engine.stats
    # per round: 4 steps (no masked step) × 8 padded clients = 32 computed, 6 × 4 = 24 useful.
    # The 5th round is dispatched but never needed, so the deferred engine never trains it.
    assert stats.executed_steps == 4 * 32
    assert stats.useful_steps == 4 * 24
    assert stats.train_calls == 4 * chunks
    assert result.summary["padding_waste"] == pytest.approx(0.25)
    assert result.summary["accounting"]["in_flight"] == 6
    # where the time went: compilation (the memory guard's included) lies inside the training time
    summary = result.summary
    assert 0 < summary["compile_wall_s"] and 0 <= summary["training_wall_s"]
    assert summary["compile_wall_s"] + summary["training_wall_s"] <= summary["wall_time_s"]


def test_the_first_calls_of_init_and_finish_count_as_compilation(small_config, monkeypatch):
    """init and finish compile on their first call (jit), not ahead of time as the step programs do,
    and their compilation counted as training (3.8 of a 4.9 s CNN run's training_wall_s). Here each of
    their XLA compiles reads as 1000 s on the engine's compile clock (jax.monitoring's events)."""
    compiles = []

    def on_duration(event, seconds, fun_name="", **_):
        if event == "/jax/core/compile/backend_compile_duration" and fun_name in ("jit(init)", "jit(finish)"):
            compiles.append(fun_name)

    monkeypatch.setattr("jaxfl.engine.compile_seconds_so_far", lambda: 1000.0 * len(compiles))
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:  # a CNN unrolls its 4 steps in chunks of 3 and 1 on a CPU: init, two step programs, finish
        result = run_experiment(replace(small_config, algorithm="fedavg", model="cnn", clients=6, clients_per_call=8,
                                        steps_per_call=3, local_steps=4, max_updates=2, devices=1,
                                        client_optimizer="sgd", client_lr=0.05))
    finally:
        jax.monitoring.unregister_event_duration_listener(on_duration)
    # (the model's own initialiser is a jit(init) too, compiled before the engine exists)
    assert compiles.count("jit(init)") >= 1 and compiles.count("jit(finish)") == 1
    assert result.summary["compile_wall_s"] >= 2000.0


def test_on_one_device_the_server_step_compiles_once(small_config, monkeypatch):
    # One device, calls of several sizes (an accelerator's plan): the first model was committed to the
    # device and the aggregated ones carried the calls' one-device mesh in their type, so the server
    # step compiled for version 0 and again for the rest (an H200 run of FedBuff compiled 2, 2026-12-04);
    # the initialiser compiles once per call size and number of start versions (a power of two).
    config = replace(small_config, model="logreg", clients=200, concurrency=40, buffer_size=8, local_steps=2,
                     clients_per_call=256, devices=1, max_updates=12, server_optimizer="adam", server_lr=0.01)
    start_rows, init_shapes = Engine._start_rows, set()

    def recording(engine, versions, calls):
        distinct, which = start_rows(engine, versions, calls)
        init_shapes.add((len(versions), len(distinct)))
        return distinct, which

    monkeypatch.setattr(Engine, "_start_rows", recording)
    result = run_experiment(config)
    compilations = result.summary["compilations"]
    shapes = compilations["run_and_finish"]
    assert shapes >= 2 and result.summary["mean_clients_per_batch"] > 1  # calls of several sizes
    assert compilations["server_step"] == 1 and compilations["init"] == len(init_shapes) >= shapes


@pytest.mark.parametrize("model, chosen, forced", [("cnn", "unrolled", "rolled"), ("mlp", "rolled", "unrolled")])
def test_step_loop_given_overrides_the_engines_choice(small_config, model, chosen, forced):
    # step_loop (RunConfig, --step-loop) forces the loop the engine would not take on this backend
    # (a rolled CNN compiles one step instead of a chunk: the accelerators' compile-time question);
    # the programs differ, so the model agrees to float32 reassociation, and the schedule is the same.
    # SGD clients: Adam's g/√v magnifies reassociation on near-zero gradients (on jax 0.12, 1.9e-3 apart
    # on the CNN's last bias after three rounds; README, "Reproducibility and recovery")
    config = replace(small_config, algorithm="fedavg", model=model, clients=6, clients_per_call=8, steps_per_call=3,
                     local_steps=4, max_updates=3, devices=1, client_optimizer="sgd", client_lr=0.05)
    default = run_experiment(replace(config, run_name="default"))
    # (a rolled loop reads no steps_per_call: refused with it since 2026-12-05)
    given = run_experiment(replace(config, run_name="given", step_loop=forced,
                                   steps_per_call=None if forced == "rolled" else config.steps_per_call))
    assert default.summary["step_loop"] == chosen and given.summary["step_loop"] == forced
    programs = {"run_and_finish": 1} if forced == "rolled" else {"run_steps": 2, "finish": 1}
    assert given.summary["compilations"] == {"init": 1, **programs, "server_step": 1}
    assert given.engine.stats.executed_steps == default.engine.stats.executed_steps == 3 * 32
    for a, b in zip(jax.tree.leaves(default.engine.params), jax.tree.leaves(given.engine.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-4)
    assert given.summary["final_accuracy"] == pytest.approx(default.summary["final_accuracy"], abs=0.01)


def test_an_unknown_step_loop_is_refused_before_any_work(small_config, tmp_path):
    with pytest.raises(ConfigError, match="step_loop.*'scan'.*rolled, unrolled"):
        run_experiment(replace(small_config, step_loop="scan", output_dir=str(tmp_path / "runs")))
    assert not (tmp_path / "runs").exists()


def test_a_call_of_one_convolutional_client_runs_on_the_home_device_alone(small_config, monkeypatch):
    """On a CPU of two devices a CNN's calls (unrolled step chunks) of one client run on the home
    device alone, not padded with a row the second device computes in full; calls of more keep
    both devices. A dense model's rolled loop skips padding rows, so it keeps one mesh."""
    from jaxfl import engine as engine_module

    if len(jax.devices()) < 2:
        pytest.skip("needs two CPU devices")
    meshes = []
    train_call = engine_module.Engine._train_call

    def noting(self, calls, versions, which, steps, *rest):
        meshes.append((calls.mesh.size, int((steps > 0).sum()), len(steps)))
        return train_call(self, calls, versions, which, steps, *rest)

    monkeypatch.setattr(engine_module.Engine, "_train_call", noting)
    # FedAsync, exponential speeds, seed 2: one client 190x faster than the mean returns alone (calls of one)
    config = replace(small_config, algorithm="fedasync", model="cnn", clients=5, local_steps=2, batch_size=8,
                     heterogeneity="exp", speed_mean=0.15, seed=2, max_updates=8, devices=2,
                     client_optimizer="sgd", client_lr=0.05)
    two = run_experiment(replace(config, run_name="two"))
    assert two.engine.step_loop == "unrolled" and two.engine._home_only is not None
    lone = [(mesh, padded) for mesh, real, padded in meshes if real == 1]
    assert lone and set(lone) == {(1, 1)}, meshes
    assert {mesh for mesh, real, _ in meshes if real > 1} <= {2}
    # no padding row computed for them: computed = executed where every other call is full
    if all(real in (1, padded) for _, real, padded in meshes):
        assert two.summary["steps_computed_with_padding"] == two.engine.stats.useful_steps
    # the same schedule as one device, the model to float32 reassociation (a different program)
    one = run_experiment(replace(config, run_name="one", devices=1))
    assert events_without_wall_time(two.run_dir) == events_without_wall_time(one.run_dir)
    for a, b in zip(jax.tree.leaves(two.params), jax.tree.leaves(one.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)
    meshes.clear()
    dense = run_experiment(replace(config, run_name="dense", model="mlp"))
    assert dense.engine._home_only is None and {mesh for mesh, _, _ in meshes} == {2}


def test_updates_trained_on_two_devices_are_summed_on_their_devices(small_config, monkeypatch):
    """On two devices each call's updates stay on the device that trained them: the aggregations'
    weighted sums run there, a running sum per device, and only those sums reach the home device (no
    call's rows are copied there and concatenated, as they were before). A checkpoint copies the held
    rows; a resumed run splits them back onto their devices, and so sums as the run it continues, bit
    for bit. The schedule equals one device's, the model to float32 reassociation."""
    from jaxfl import engine as engine_module
    from jaxfl.testing import check_algorithm

    if len(jax.devices()) < 2:
        pytest.skip("needs two CPU devices")
    placed, copied, restored = [], [], []
    trained_batch, home_stacks = engine_module.Engine._trained_batch, engine_module.Engine._home_stacks
    back_on_devices = engine_module.Engine._back_on_devices

    def noting_batch(self, results, calls, padded):
        batch, metrics = trained_batch(self, results, calls, padded)
        placed.append(None if batch.pieces is None else [(piece.start, piece.count, piece.deltas.device)
                                                         for piece in batch.pieces])
        return batch, metrics

    def noting_restore(self, batch):
        batch = back_on_devices(self, batch)
        restored.append(None if batch.pieces is None else [piece.deltas.device for piece in batch.pieces])
        return batch

    monkeypatch.setattr(engine_module.Engine, "_trained_batch", noting_batch)
    monkeypatch.setattr(engine_module.Engine, "_home_stacks",
                        lambda self, batch: copied.append(batch.pieces is not None) or home_stacks(self, batch))
    monkeypatch.setattr(engine_module.Engine, "_back_on_devices", noting_restore)
    config = replace(small_config, algorithm="fedbuff", model="mlp", clients=8, local_steps=2, max_updates=4,
                     client_optimizer="sgd", client_lr=0.05, devices=2, checkpoint_every=None)
    two = run_experiment(replace(config, run_name="two"))
    devices = jax.devices()[:2]
    halves = lambda count: [(0, count, devices[0]), (count, count, devices[1])]  # each device's rows, in order
    assert placed and all(pieces == halves(pieces[0][1]) for pieces in placed), placed
    assert not copied  # summed where they were trained
    assert two.summary["compilations"]["devices_total"] <= 2  # the devices' sums added: one or both devices
    one = run_experiment(replace(config, run_name="one", devices=1))
    assert events_without_wall_time(two.run_dir) == events_without_wall_time(one.run_dir)
    for a, b in zip(jax.tree.leaves(two.params), jax.tree.leaves(one.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    # interrupted at an event where updates are held, checkpointed, resumed: the same run bit for bit
    check_algorithm("fedbuff", checks=("resume",), model="mlp", devices=2)
    assert any(copied) and restored and all(pieces == list(devices) for pieces in restored), (copied, restored)


def test_global_models_reach_two_devices_as_one_flat_vector_and_data_movement_runs_off_the_python_thread(small_config, monkeypatch):
    """On two devices each global version used by a call goes to the devices once, as one flat
    vector (one copy, not one per leaf), holding the model's values bit for bit. The programs that
    flatten a version, start a call's rows from it, take one trained row or add one device's partial
    sum are pure data movement, which XLA:CPU would run on the calling Python thread (programs it
    estimates under 1,000 flops): their exact multiply by a float32 one keeps their estimate above
    that, so they are dispatched like the rest."""
    from jaxfl import engine as engine_module

    if len(jax.devices()) < 2:
        pytest.skip("needs two CPU devices")
    placed = []
    flat_on_mesh = engine_module.Engine._flat_on_mesh

    def noting(self, params, calls):
        flat = flat_on_mesh(self, params, calls)
        placed.append((params, flat))
        return flat

    monkeypatch.setattr(engine_module.Engine, "_flat_on_mesh", noting)
    config = replace(small_config, algorithm="fedbuff", model="mlp", clients=8, local_steps=2, max_updates=4,
                     client_optimizer="sgd", client_lr=0.05, devices=2, checkpoint_every=None)
    result = run_experiment(config)
    engine = result.engine
    assert len(placed) == engine.stats.versions_placed > 0
    for params, flat in placed:
        assert flat.ndim == 1 and flat.sharding == engine._all_devices.replicated
        assert {shard.device for shard in flat.addressable_shards} == set(jax.devices()[:2])
        expected = np.concatenate([np.asarray(leaf).ravel() for leaf in jax.tree.leaves(params)])
        for shard in flat.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), expected)
    calls = engine._all_devices
    rows = np.zeros((7, 2), np.int32)
    rows[1] = 2  # two steps; client 0, round 0, version index 0
    rows[4] = np.float32(1).view(np.int32)
    flops = lambda compiled: (lambda cost: (cost[0] if isinstance(cost, list) else cost)["flops"])(
        compiled.cost_analysis())
    assert flops(calls.init.lower((placed[0][1],), rows, calls.one, calls.train_root).compile()) >= 1000
    assert flops(jax.jit(lambda tree, one: engine._flat_version(tree, one)).lower(
        engine.params, engine._one).compile()) >= 1000
    # a trained update's row (PORT's, CC-FedAvg's, FedASMU's reads), and its sum of one device's part
    stacked = jax.tree.map(lambda leaf: jnp.stack([leaf, leaf]), engine.params)
    assert flops(engine._row.lower(stacked, np.int32(1), np.float32(1)).compile()) >= 1000
    flat = engine._flat_version(engine.params, engine._one)
    assert flops(engine._devices_total.lower([flat], engine._one, "deltas").compile()) >= 1000


def _trainer_by_hand(config):
    """(train(record, start) -> the record's Δ recomputed with local_train, the initial params): a
    dispatch's local training as the engine does it, for hand-computed aggregation references."""
    config, dataset, federation, model, params = prepare(config)
    trainer = make_client_trainer(model, make_client_optimizer(config.client_optimizer, config.client_lr),
                                  config.batch_size)
    data = FederatedArrays(jnp.asarray(federation.x), jnp.asarray(federation.y))
    root = jax.random.fold_in(jax.random.key(config.seed), TRAIN_STREAM)

    def train(record, start):
        key = jax.random.fold_in(jax.random.fold_in(root, record.client), record.client_round)
        view = ClientView(jnp.int32(federation.offsets[record.client]), jnp.int32(federation.counts[record.client]))
        delta, _ = local_train(trainer, start, data, view, jnp.int32(record.steps), key, max_steps=record.steps)
        return delta

    return train, params


def test_fedasync_mixing_matches_hand_computed_reference(small_config):
    """Two clients, homogeneous speeds without jitter but different speed draws are not needed:
    client order is fixed by the event log. Recompute every update with local_train directly."""
    config = replace(small_config, algorithm="fedasync", rule="paper", clients=2, heterogeneity="normal",
                     jitter=0.0, max_updates=3, staleness="polynomial", staleness_alpha=0.6, staleness_a=0.5)
    result = run_experiment(config)
    train, params = _trainer_by_hand(config)
    versions = {0: params}
    w = params
    for record in sorted((r for r in result.simulation.records if r.status == "aggregated"),
                         key=lambda r: r.aggregated_in):
        start = versions[record.version]
        delta = train(record, start)
        staleness = record.aggregated_in - 1 - record.version
        alpha_t = 0.6 * (staleness + 1) ** -0.5
        w = jax.tree.map(lambda w_, s_, d_: (1 - alpha_t) * w_ + alpha_t * (s_ - d_), w, start, delta)
        versions[record.aggregated_in] = w
    assert any(r.aggregated_in - 1 - r.version > 0 for r in result.simulation.records if r.aggregated_in)
    for a, b in zip(leaves(w), leaves(result.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_fedbuff_plato_averages_the_buffered_models_as_the_port_paper_ran_it(small_config):
    """FedBuff's rule plato (PORT's baseline, PLATO): once K models are in, w ← (1/K)·Σ w_i, each w_i
    trained from the version it was sent; no staleness weight, no server learning rate."""
    # SGD: Adam's step turns float rounding in a near-zero gradient into a step of the learning rate
    config = replace(small_config, algorithm="fedbuff", rule="plato", buffer_size=2, clients=3,
                     heterogeneity="exp", max_updates=4, client_optimizer="sgd", client_lr=0.05)
    result = run_experiment(config)
    train, params = _trainer_by_hand(config)
    versions = {0: params}
    aggregated = [r for r in result.simulation.records if r.status == "aggregated"]
    for version in range(1, 5):
        models = []
        for record in sorted((r for r in aggregated if r.aggregated_in == version), key=lambda r: r.id):
            start = versions[record.version]
            delta = train(record, start)
            models.append(jax.tree.map(jnp.subtract, start, delta))
        assert len(models) == 2
        versions[version] = jax.tree.map(lambda a, b: (a + b) / 2, *models)
    assert any(r.aggregated_in - 1 - r.version > 0 for r in aggregated), "a stale model was averaged"
    for a, b in zip(leaves(versions[4]), leaves(result.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_stacking_start_models_and_empty_aggregations_are_compiled_programs():
    """``Engine.stack`` (FedASMU's paused rows) and an empty aggregation's zeros run as one compiled
    program per shape instead of an eager op per leaf: the same values, and a second call of the same
    shape compiles nothing."""
    from jaxfl import engine as engine_module
    trees = [{"w": jnp.full((3, 2), float(i)), "b": jnp.arange(2.0) + i} for i in range(3)]
    stacked = engine_module.Engine.stack(trees, 4)
    assert stacked["w"].shape == (4, 3, 2)
    np.testing.assert_array_equal(stacked["b"], np.array([[0, 1], [1, 2], [2, 3], [0, 1]], np.float32))  # padded with the first
    compiled = engine_module._stack_trees._cache_size()
    engine_module.Engine.stack([{"w": t["w"] + 1, "b": t["b"]} for t in trees], 4)
    assert engine_module._stack_trees._cache_size() == compiled
    zeros = engine_module._zeros_like_tree(trees[0])
    assert jax.tree.map(lambda leaf: (leaf.shape, float(jnp.abs(leaf).sum())), zeros) == {"w": ((3, 2), 0.0), "b": ((2,), 0.0)}
    compiled = engine_module._zeros_like_tree._cache_size()
    engine_module._zeros_like_tree(trees[1])
    assert engine_module._zeros_like_tree._cache_size() == compiled


def test_steps_in_sequence_count_each_calls_longest_step_count(small_config):
    """summary["steps_in_sequence"] sums each training call's longest step count: what the training
    time goes with where a vmapped step costs what one client's does. FedAvg, 4 clients of 3 steps a
    round: one call of 4 is 3 steps in sequence, four calls of 1 are 12."""
    from jaxfl.config import RunConfig

    config = replace(small_config, algorithm="fedavg", clients=4, local_steps=3, max_updates=2, devices=1,
                     buffer_size=RunConfig().buffer_size)
    together = run_experiment(replace(config, clients_per_call=4, run_name="together"))
    alone = run_experiment(replace(config, clients_per_call=1, run_name="alone"))
    assert together.summary["train_calls"] == 2 and alone.summary["train_calls"] == 8
    assert together.summary["steps_in_sequence"] == 2 * 3
    assert alone.summary["steps_in_sequence"] == alone.summary["client_steps_executed"] == 2 * 4 * 3
