"""Models with non-trainable state (BatchNorm) train through ``jaxfl run``: only the trainable
parameters go through the Δ/staleness arithmetic, and the running statistics of a new global model
are the plain unweighted mean of the aggregated clients' (FedCompass spec §2.6); on-device CIFAR
augmentation is switched on by the config."""
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfl.config
from jaxfl.engine import TRAIN_STREAM
from jaxfl.experiment import make_client_optimizer, make_transforms, prepare, resume_experiment, run_experiment
from jaxfl.kernels import ClientView, FederatedArrays, make_client_trainer
from jaxfl.models import MODEL_INPUTS, MODELS, register_model
from jaxfl.models.adapter import ModelAdapter
from jaxfl.testing import assert_same_run
from conftest import Interrupted, replace


class TinyBN(nn.Module):
    """Conv → BatchNorm → ReLU → Dense: the smallest model with running statistics."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(4, (3, 3), strides=(2, 2))(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        return nn.Dense(self.num_classes)(nn.relu(x).reshape((x.shape[0], -1)))


@pytest.fixture
def bn_config(small_config, monkeypatch):
    monkeypatch.setattr(jaxfl.config, "MODEL_NAMES", jaxfl.config.MODEL_NAMES)
    register_model("tiny_bn", TinyBN, overwrite=True)
    yield replace(small_config, model="tiny_bn", client_optimizer="sgd", client_lr=0.05, local_steps=3)
    MODELS.pop("tiny_bn", None)
    MODEL_INPUTS.pop("tiny_bn", None)


def leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def train_alone(config, record, start):
    """One dispatch trained on its own with the engine's key: (final trainable params, final buffers)."""
    config, _, federation, model, _ = prepare(config)
    trainer = make_client_trainer(model, make_client_optimizer(config.client_optimizer, config.client_lr),
                                  config.batch_size)
    data = FederatedArrays(jnp.asarray(federation.x), jnp.asarray(federation.y))
    root = jax.random.fold_in(jax.random.key(config.seed), TRAIN_STREAM)
    key = jax.random.fold_in(jax.random.fold_in(root, record.client), record.client_round)
    view = ClientView(jnp.int32(federation.offsets[record.client]), jnp.int32(federation.counts[record.client]))
    state = trainer.init(start, jnp.int32(record.steps), key)
    for _ in range(record.steps):
        state = trainer.step(state, data, view)
    return state.params["params"], state.params["state"]


def test_kernel_trains_params_and_carries_buffers(bn_config):
    _, _, federation, model, variables = prepare(bn_config)
    assert sorted(variables) == ["params", "state"] and "batch_stats" in variables["state"]
    trainer = make_client_trainer(model, make_client_optimizer("sgd", 0.05), 16)
    assert trainer.adapter
    data = FederatedArrays(jnp.asarray(federation.x), jnp.asarray(federation.y))
    view = ClientView(jnp.int32(0), jnp.int32(federation.counts[0]))
    state = trainer.init(variables, jnp.int32(3), jax.random.key(0))
    # the optimiser sees the trainable parameters only
    optimizer = make_client_optimizer("adam", 0.05)
    adam = make_client_trainer(model, optimizer, 16).init(variables, 3, jax.random.key(0))
    assert jax.tree.structure(adam.opt_state) == jax.tree.structure(optimizer.init(variables["params"]))
    for _ in range(4):  # the 4th step is masked: nothing may change
        state = trainer.step(state, data, view)
    delta, metrics = trainer.finish(variables, state)
    assert int(metrics["steps"]) == 3 and bool(metrics["finite"])
    assert all(np.all(leaf == 0) for leaf in leaves(delta["state"]))  # buffers are not a delta
    assert any(np.any(leaf != 0) for leaf in leaves(delta["params"]))
    moved = [np.abs(a - b).max() for a, b in zip(leaves(state.params["state"]), leaves(variables["state"]))]
    assert min(moved) > 0  # running mean and variance were updated in training mode
    # evaluation uses the running statistics: same input, same output, whatever the batch
    x = jnp.asarray(federation.x[:8], jnp.float32) / 255.0
    np.testing.assert_allclose(model.predict(state.params, x)[:2], model.predict(state.params, x[:2]), atol=1e-5)


def test_fedavg_round_weights_params_but_averages_buffers_plainly(bn_config):
    # Unequal client sizes: sample weights differ from 1/m, so a weighted buffer mean would differ.
    config = replace(bn_config, algorithm="fedavg", clients=3, client_sizes="lognormal", size_skew=1.0,
                     max_updates=1)
    result = run_experiment(config)
    _, _, federation, _, start = prepare(config)
    records = [r for r in result.simulation.records if r.status == "aggregated"]
    assert len(records) == 3
    weights = federation.counts / federation.counts.sum()
    assert np.ptp(weights) > 0.05
    trained = {r.client: train_alone(config, r, start) for r in records}
    expected_params = jax.tree.map(lambda *ps: sum(w * p for w, p in zip(weights, ps)),
                                   *[trained[c][0] for c in range(3)])
    expected_buffers = jax.tree.map(lambda *bs: sum(bs) / 3, *[trained[c][1] for c in range(3)])
    for a, b in zip(leaves(expected_params), leaves(result.params["params"])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(leaves(expected_buffers), leaves(result.params["state"])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    weighted = jax.tree.map(lambda *bs: sum(w * b for w, b in zip(weights, bs)), *[trained[c][1] for c in range(3)])
    assert any(np.abs(a - b).max() > 1e-4 for a, b in zip(leaves(weighted), leaves(result.params["state"])))


def test_single_update_copies_the_clients_buffers(bn_config):
    """FedAsync (paper rule): parameters mix with α_t, buffers are the arriving client's."""
    config = replace(bn_config, algorithm="fedasync", rule="paper", clients=2, heterogeneity="normal",
                     jitter=0.0, max_updates=3, staleness_alpha=0.6, staleness_a=0.5)
    result = run_experiment(config)
    _, _, _, _, start = prepare(config)
    versions, w = {0: start}, start
    for record in sorted((r for r in result.simulation.records if r.status == "aggregated"),
                         key=lambda r: r.aggregated_in):
        params, buffers = train_alone(config, record, versions[record.version])
        alpha = 0.6 * (record.aggregated_in - record.version) ** -0.5
        w = {"params": jax.tree.map(lambda a, b: (1 - alpha) * a + alpha * b, w["params"], params), "state": buffers}
        versions[record.aggregated_in] = w
    for a, b in zip(leaves(w), leaves(result.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["fedbuff", "fedcompass", "fedat", "port"])
def test_batched_equals_one_at_a_time_and_resume_with_buffers(bn_config, algorithm, crash_after_saves):
    config = replace(bn_config, algorithm=algorithm, max_updates=6, checkpoint_every=2, stop_at_target=False)
    single = run_experiment(replace(config, batching=False, run_name="single"))
    batched = run_experiment(replace(config, clients_per_call=4, run_name="batched"))
    for a, b in zip(leaves(single.params), leaves(batched.params)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    assert single.summary["global_updates"] == 6
    # interrupted after the second checkpoint, resumed: the very same run, buffers included
    disarm = crash_after_saves(2)
    with pytest.raises(Interrupted):
        run_experiment(replace(config, clients_per_call=4, run_name="killed"))
    disarm()
    resumed = resume_experiment(os.path.join(config.output_dir, "killed"), progress=False)
    assert_same_run(batched, resumed)


def test_resnet18_batchnorm_trains_through_run(tmp_path):
    """The spec's CIFAR ResNet-18 (BatchNorm) runs end to end; its buffers reach the global model."""
    import tensorflow_datasets as tfds

    from jaxfl.data.tfds_source import load_tfds

    config = jaxfl.config.RunConfig(
        algorithm="fedavg", dataset="tfds:cifar10", model="resnet18", clients=2, local_steps=1, batch_size=4,
        max_updates=1, steps_per_call=1, client_optimizer="sgd", client_lr=0.01, progress=False,
        output_dir=str(tmp_path), checkpoint_every=None)
    try:
        with tfds.testing.mock_data(num_examples=16):
            _, dataset, _, model, variables = prepare(config)
            result = run_experiment(config)
    finally:
        load_tfds.cache_clear()
    assert result.summary["global_updates"] == 1 and result.summary["final_accuracy"] is not None
    assert sorted(result.params) == ["params", "state"]
    moved = [np.abs(a - b).max() for a, b in zip(leaves(result.params["state"]), leaves(variables["state"]))]
    assert min(moved) > 0
    import json
    with open(os.path.join(result.run_dir, "config.json")) as handle:
        assert json.load(handle)["model_parameters"] == 11_173_962
    # CIFAR trains with crop + flip by default, MNIST without
    assert make_transforms(config, dataset)[1] is not None


def test_augmentation_is_wired_into_runs(small_config):
    # the MLP: the transforms act on the images whatever model reads them (a CNN doubled the test's time)
    config = replace(small_config, algorithm="fedavg", max_updates=1, client_optimizer="sgd", client_lr=0.05,
                     local_steps=2)
    _, dataset, *_ = prepare(config)
    assert make_transforms(config, dataset)[1] is None  # auto: digits are not mirrored
    assert make_transforms(replace(config, augment="crop_flip"), dataset)[1] is not None
    plain = run_experiment(replace(config, run_name="plain"))
    augmented = run_experiment(replace(config, augment="crop_flip", run_name="aug"))
    again = run_experiment(replace(config, augment="crop_flip", run_name="again"))
    assert any(np.abs(a - b).max() > 1e-6 for a, b in zip(leaves(plain.params), leaves(augmented.params)))
    for a, b in zip(leaves(augmented.params), leaves(again.params)):
        np.testing.assert_array_equal(a, b)


def test_adapter_nnx_model_with_batchstat_trains_in_the_kernel():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.dense = nnx.Linear(4, 3, rngs=rngs)
            self.norm = nnx.BatchNorm(3, rngs=rngs)

        def __call__(self, x):
            return self.norm(self.dense(x))

    adapter = ModelAdapter.from_nnx(Net)
    variables = adapter.init_variables(jax.random.key(0), jnp.zeros((1, 4)))
    assert sorted(variables) == ["params", "state"]
    trainer = make_client_trainer(adapter, make_client_optimizer("sgd", 0.1), 4, preprocess=lambda x: x)
    data = FederatedArrays(jax.random.normal(jax.random.key(1), (8, 4)), jnp.arange(8) % 3)
    state = trainer.init(variables, jnp.int32(2), jax.random.key(2))
    for _ in range(2):
        state = trainer.step(state, data, ClientView(jnp.int32(0), jnp.int32(8)))
    delta, metrics = trainer.finish(variables, state)
    assert int(metrics["steps"]) == 2
    assert all(np.all(leaf == 0) for leaf in leaves(delta["state"]))
    assert any(np.abs(a - b).max() > 0 for a, b in zip(leaves(state.params["state"]), leaves(variables["state"])))


def test_register_an_nnx_model_and_run_it_by_name(small_config, monkeypatch):
    from flax import nnx

    class NnxNet(nnx.Module):
        def __init__(self, num_classes, rngs):
            self.hidden = nnx.Linear(784, 32, rngs=rngs)
            self.norm = nnx.BatchNorm(32, rngs=rngs)
            self.out = nnx.Linear(32, num_classes, rngs=rngs)

        def __call__(self, x):
            return self.out(nnx.relu(self.norm(self.hidden(x.reshape((x.shape[0], -1))))))

    monkeypatch.setattr(jaxfl.config, "MODEL_NAMES", jaxfl.config.MODEL_NAMES)
    try:
        register_model("nnx_net", NnxNet)
        config = replace(small_config, model="nnx_net", max_updates=3, stop_at_target=False)
        result = run_experiment(config)
        again = run_experiment(replace(config, run_name="again"))
    finally:
        MODELS.pop("nnx_net", None)
        MODEL_INPUTS.pop("nnx_net", None)
    assert sorted(result.params) == ["params", "state"] and result.summary["global_updates"] == 3
    assert result.metrics[-1]["accuracy"] > result.metrics[0]["accuracy"]
    for a, b in zip(leaves(result.params), leaves(again.params)):
        np.testing.assert_array_equal(a, b)


def test_packed_results_of_a_model_with_buffers_come_back_bit_for_bit():
    """A call's results packed for the copy between devices (one flat array per kind: deltas,
    metric columns, BatchNorm buffers) unpack to the same leaves bit for bit, and the metric columns
    to the same metrics: NaN, -0.0, step counts past 2^24 and both booleans included."""
    import optax

    from jaxfl.engine import BUFFERS, _MetricColumns, _PackedResults, _TrainerShapes

    adapter = ModelAdapter.from_linen(TinyBN())
    params = adapter.init_variables(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    trainer = make_client_trainer(adapter, optax.sgd(0.1), batch_size=4)
    buffers_of = lambda state: state.params[BUFFERS]
    shapes = _TrainerShapes.of(trainer, params)
    columns = _MetricColumns.for_trainer(shapes)
    packing = _PackedResults.for_trainer(shapes, buffers_of, columns)
    assert columns is not None and packing is not None and jax.tree.leaves(packing.buffers)
    rng = np.random.default_rng(0)

    def filled(shapes, rows=3):
        def leaf(shape):
            values = rng.standard_normal((rows,) + shape.shape).astype(np.float32)
            values.flat[0], values.flat[-1] = np.nan, -0.0
            return jnp.asarray(values)
        return jax.tree.map(leaf, shapes)

    metrics = {"loss": jnp.array([0.5, np.nan, -0.0], jnp.float32), "steps": jnp.array([0, 7, 2**24 + 1], jnp.int32),
               "finite": jnp.array([True, False, True])}
    # the metrics as one int32 array on the devices, unpacked on the host
    packed_metrics = jax.jit(columns.pack)(metrics)
    assert packed_metrics.shape == (3, 3) and packed_metrics.dtype == jnp.int32
    unpacked = columns.unpack(np.asarray(packed_metrics))
    assert jax.tree.structure(unpacked) == jax.tree.structure(metrics)
    for a, b in zip(jax.tree.leaves(metrics), jax.tree.leaves(unpacked)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), b.view(np.uint8))
    results = (filled(packing.deltas), packed_metrics, filled(packing.buffers))
    back = jax.jit(lambda r: packing.unpack(packing.pack(r)))(results)
    assert jax.tree.structure(back) == jax.tree.structure(results)
    for a, b in zip(jax.tree.leaves(results), jax.tree.leaves(back)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    # mixed dtypes among the deltas: no packing (a flat array of one dtype would convert them)
    mixed = jax.tree.map(lambda leaf: leaf.astype(jnp.bfloat16) if leaf.ndim == 1 else leaf, params)
    assert _PackedResults.for_trainer(_TrainerShapes.of(trainer, mixed), buffers_of, columns) is None
    # a metric that is not a bool, int32 or float32 scalar: kept as it is, and no packing
    wide = trainer._replace(finish=lambda start, state: (lambda delta, metrics: (
        delta, {**metrics, "norms": jnp.zeros(2)}))(*trainer.finish(start, state)))
    wide_shapes = _TrainerShapes.of(wide, params)
    assert _MetricColumns.for_trainer(wide_shapes) is None
    assert _PackedResults.for_trainer(wide_shapes, buffers_of, None) is None
