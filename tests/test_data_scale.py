"""Million-client data: federations of 10^5..10^6 clients are built without per-client Python objects.

The build path (partition -> :class:`FlatPartition` -> :class:`FederatedData`) holds a few flat
int64 arrays of O(samples + clients); these tests check its invariants at scale and bound the
memory allocated while building, which per-client index arrays (~100 bytes each) would exceed.
Asserts use counts and bytes, never timings; each test runs in a few seconds on two cores.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxfl.data import (
    FederatedData,
    FlatPartition,
    build_federation,
    dataset_from_arrays,
    load_dataset,
    partition_iid,
)
from tests.test_storage import stored_bytes_during


def check_federation(fd: FederatedData, num_clients: int, num_samples: int) -> None:
    """Offsets/counts consistent, every sample held once, weights summing to 1, only flat arrays."""
    assert fd.num_clients == num_clients
    assert fd.counts.dtype == np.int64 and fd.offsets.dtype == np.int64
    assert fd.counts.shape == fd.offsets.shape == (num_clients,)
    assert int(fd.counts.sum()) == num_samples == len(fd.x) == len(fd.y)
    assert fd.counts.min() >= 1
    assert fd.offsets[0] == 0
    np.testing.assert_array_equal(fd.offsets[1:], np.cumsum(fd.counts)[:-1])
    assert fd.offsets[-1] + fd.counts[-1] == len(fd.y)
    for kind in ("samples", "uniform"):
        weights = fd.weights(kind)
        assert weights.shape == (num_clients,) and np.all(weights > 0)
        assert weights.sum() == pytest.approx(1.0, abs=1e-9)
    for field in dataclasses.fields(fd):
        value = getattr(fd, field.name)
        assert isinstance(value, (np.ndarray, int)), f"{field.name} is a {type(value).__name__}, not a flat array"
        assert not isinstance(value, np.ndarray) or value.dtype != object
    assert set(vars(fd)) == {field.name for field in dataclasses.fields(fd)}, "no extra (per-client) attributes"


@pytest.fixture(scope="module")
def synthetic_100k():
    # ~4 samples per client (min 2): 10^5 generated clients, ~0.35 M training samples.
    return load_dataset("synthetic", num_clients=100_000, samples_per_client=4)


def test_hundred_thousand_client_synthetic_federation(synthetic_100k):
    dataset = synthetic_100k
    fd, peak = stored_bytes_during(lambda: build_federation(dataset, 100_000, "natural"))
    check_federation(fd, 100_000, len(dataset.train_y))
    # Client i is generated client i, and the grouped natural split shares the dataset's arrays.
    np.testing.assert_array_equal(fd.counts, np.bincount(dataset.train_groups, minlength=100_000))
    assert np.shares_memory(fd.x, dataset.train_x) and not fd.x.flags.writeable
    # No sample copy, no per-client objects: a few int64 arrays over the samples and clients.
    assert peak <= 24 * len(dataset.train_y) + 48 * 100_000, f"peak {peak / 1e6:.1f} MB"


def test_iid_partition_of_a_hundred_thousand_clients(synthetic_100k):
    dataset = synthetic_100k
    num_samples = len(dataset.train_y)
    raw = dataset.train_x.nbytes + dataset.train_y.nbytes
    fd, peak = stored_bytes_during(lambda: build_federation(dataset, 100_000, "iid", seed=3))
    check_federation(fd, 100_000, num_samples)
    assert fd.counts.max() - fd.counts.min() <= 1
    # One copy of the samples plus O(samples + clients) int64 index arrays; 10^5 per-client index
    # arrays would add ~10 MB of Python objects on top.
    assert peak <= raw + 40 * num_samples + 48 * 100_000, f"peak {peak / 1e6:.1f} MB for {raw / 1e6:.1f} MB"
    # Same seed, same split (the golden runs rely on it); another seed, another split.
    again = build_federation(dataset, 100_000, "iid", seed=3)
    np.testing.assert_array_equal(again.y, fd.y)
    np.testing.assert_array_equal(again.x, fd.x)
    assert not np.array_equal(build_federation(dataset, 100_000, "iid", seed=4).y, fd.y)


def test_million_client_iid_partition_is_flat():
    num_samples, num_clients = 2_500_000, 1_000_000
    labels = np.zeros(num_samples, np.int32)
    part, peak = stored_bytes_during(lambda: partition_iid(labels, num_clients, np.random.default_rng(0)))
    assert isinstance(part, FlatPartition) and len(part) == num_clients
    assert part.counts.sum() == num_samples and set(np.unique(part.counts).tolist()) == {2, 3}
    # Every index exactly once, ascending within each client (keys client * N + index increase).
    assert np.all(np.bincount(part.indices, minlength=num_samples) == 1)
    owner = np.repeat(np.arange(num_clients, dtype=np.int64), part.counts)
    assert np.all(np.diff(owner * num_samples + part.indices) > 0)
    np.testing.assert_array_equal(part[7], part.indices[part.offsets[7]:part.offsets[7] + part.counts[7]])
    # Permutation, owners, sort keys: a handful of int64 arrays; 10^6 index arrays would be >= 100 MB.
    assert peak <= 48 * num_samples + 48 * num_clients, f"peak {peak / 1e6:.1f} MB"


def test_million_client_federation_of_a_large_dataset():
    num_samples, num_clients = 3_000_000, 1_000_000
    rng = np.random.default_rng(0)
    x = rng.standard_normal((num_samples, 1), dtype=np.float32)  # features: small samples, many of them
    y = rng.integers(0, 10, num_samples)
    dataset = dataset_from_arrays("big", x, y, x[:10], y[:10], num_classes=10)
    fd = build_federation(dataset, num_clients, "iid", seed=0)
    check_federation(fd, num_clients, num_samples)
    hist = fd.class_histogram()
    assert hist.shape == (num_clients, 10)
    np.testing.assert_array_equal(hist.sum(axis=1), fd.counts)
    np.testing.assert_array_equal(hist.sum(axis=0), np.bincount(y, minlength=10))
    shards = build_federation(dataset, num_clients, "label_shards", seed=0, shards_per_client=2)
    check_federation(shards, num_clients, num_samples)
    # Shards are cut from the label-sorted order: only the <= 9 shards across a class boundary mix
    # two labels, so at most 9 clients hold more than 2 classes.
    assert ((shards.class_histogram() > 0).sum(axis=1) > 2).sum() <= 9


def test_more_clients_than_samples_fails_before_partitioning():
    dataset = load_dataset("mnist10k")
    with pytest.raises(ValueError, match=r"num_clients=100000 must be between 1 and the number of samples \(8000\)"):
        build_federation(dataset, 100_000, "iid")
    with pytest.raises(ValueError, match=r"5000 clients x shards_per_client=2 = 10000 shards exceeds the 8000"):
        build_federation(dataset, 5_000, "label_shards", shards_per_client=2)
