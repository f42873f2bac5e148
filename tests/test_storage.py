"""Federated storage at scale: a 10,000-client Dirichlet split of Fashion-MNIST and a 100,000-client
synthetic federation are stored flat (memory within a few percent of the raw data, never padded to
the largest client) and train one FedBuff buffer (K = 3 ragged clients) through the engine on CPU."""

from __future__ import annotations

import os
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfl.data import FASHION_MNIST_DIR, build_federation, load_dataset
from jaxfl.engine import Engine, ExecutionPlan
from jaxfl.kernels import FederatedArrays, make_client_trainer, make_server_optimizer
from jaxfl.models import make_model
from jaxfl.scheduler.simulation import Aggregation, DispatchRecord


def train_one_fedbuff_buffer(federation, model_name: str, steps: int = 2, lr: float = 0.05):
    """Dispatch the smallest, the median and the largest client, then aggregate them as one buffer (1/K)."""
    model = make_model(model_name, federation.num_classes)
    sample = jnp.zeros((1,) + federation.x.shape[1:], jnp.float32)
    params = model.init(jax.random.key(0), sample)
    trainer = make_client_trainer(model.apply, optax.sgd(lr), batch_size=16,
                                  preprocess=(lambda x: x.astype(jnp.float32) / 255.0) if federation.x.dtype == np.uint8
                                  else (lambda x: x))
    data = FederatedArrays(jnp.asarray(federation.x), jnp.asarray(federation.y))
    engine = Engine(trainer, params, data, federation.offsets, federation.counts, make_server_optimizer(), seed=0,
                    plan=ExecutionPlan(clients_per_call=4, steps_per_call=steps))
    order = np.argsort(federation.counts, kind="stable")
    clients = [int(order[0]), int(order[len(order) // 2]), int(order[-1])]
    records = [DispatchRecord(id=i, client=c, version=0, steps=steps, client_round=0, start_time=0.0,
                              arrival_time=1.0 + i) for i, c in enumerate(clients)]
    for record in records:
        engine.on_dispatch(record)
    aggregation = Aggregation(time=3.0, version=1, contributions=tuple((r.id, 1 / 3) for r in records))
    engine.on_aggregate(aggregation, records)
    assert engine.version == 1 and engine.stats.clients_trained == 3
    assert all(engine.client_metrics(r.id)["finite"] for r in records)
    moved = [float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(engine.params), jax.tree.leaves(params))]
    assert max(moved) > 0 and all(np.isfinite(moved))
    return federation.counts[clients]


def stored_bytes_during(build):
    """(result, peak bytes numpy allocated while ``build`` ran)."""
    tracemalloc.start()
    try:
        result = build()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST_DIR),
                    reason=f"{FASHION_MNIST_DIR} absent: apt-get install dataset-fashion-mnist")
def test_ten_thousand_client_dirichlet_split_of_fashion_mnist():
    dataset = load_dataset("fashion_mnist")
    raw = dataset.train_x.nbytes + dataset.train_y.nbytes  # 47.3 MB
    # Per-client Dirichlet (Hsu et al.) with log-normal sizes: ragged clients (1 .. ~100 samples).
    federation, peak = stored_bytes_during(lambda: build_federation(
        dataset, 10_000, "dirichlet_client", seed=0, alpha=0.5, sizes="lognormal", skew=1.0))
    assert federation.num_clients == 10_000 and int(federation.counts.sum()) == 60_000
    assert federation.counts.min() >= 1 and federation.max_count > 50 * federation.counts.min()
    # Stored once, flat: samples + labels + 16 bytes per client (offsets, counts).
    assert federation.nbytes <= 1.01 * raw
    assert federation.nbytes - raw == 16 * 10_000
    # Building it allocates one copy of the samples plus index arrays, nothing per-client-padded.
    assert peak <= 1.1 * raw, f"peak {peak / 1e6:.1f} MB for {raw / 1e6:.1f} MB of data"
    padded = federation.num_clients * federation.max_count * federation.x[0].nbytes
    assert padded > 10 * federation.x.nbytes, "padding every client to the largest would cost 10x+"
    counts = train_one_fedbuff_buffer(federation, "mlp")
    assert counts[0] < counts[-1]


def test_hundred_thousand_client_synthetic_federation():
    dataset = load_dataset("synthetic", num_clients=100_000, samples_per_client=4)
    raw = dataset.train_x.nbytes + dataset.train_y.nbytes
    federation, peak = stored_bytes_during(lambda: build_federation(dataset, 100_000, "natural"))
    assert federation.num_clients == 100_000 and int(federation.counts.sum()) == len(dataset.train_y)
    # 1.6 MB of offsets/counts on ~80 MB of samples.
    assert federation.nbytes - raw == 16 * 100_000
    assert federation.nbytes <= 1.03 * raw
    # The generated clients are already grouped, so the natural split is the identity and the
    # federation shares the dataset's (read-only) arrays: transient memory is a few flat int64
    # index arrays (~17 bytes per sample), no copy of the samples and no per-client objects.
    assert np.shares_memory(federation.x, dataset.train_x)
    assert peak <= 0.25 * raw, f"peak {peak / 1e6:.1f} MB for {raw / 1e6:.1f} MB of data"
    # Client i of the federation is generated client i.
    np.testing.assert_array_equal(np.repeat(np.arange(100_000), federation.counts)[:50],
                                  dataset.train_groups[np.argsort(dataset.train_groups, kind="stable")][:50])
    train_one_fedbuff_buffer(federation, "logreg", lr=0.1)
