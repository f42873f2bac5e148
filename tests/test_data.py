"""Tests for jaxfl.data: IDX reading, datasets, partitions, flat federated storage."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxfl.data import (
    DATASETS,
    FASHION_MNIST_DIR,
    FederatedData,
    build_federation,
    load_dataset,
    make_partition,
    partition_dirichlet,
    partition_iid,
    read_idx,
)


# --------------------------------------------------------------------------- IDX


def _idx_bytes(arr: np.ndarray, code: int) -> bytes:
    header = bytes([0, 0, code, arr.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_raw_and_gzip(tmp_path, gz):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = _idx_bytes(arr, 0x08)
    # Name says nothing about compression on purpose: detection is by magic bytes.
    path = tmp_path / "images.idx"
    path.write_bytes(gzip.compress(raw) if gz else raw)
    out = read_idx(path)
    assert out.dtype == np.uint8 and out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out, arr)


def test_read_idx_big_endian_int32_to_native(tmp_path):
    arr = np.array([1, -2, 70000], dtype=np.int32)
    path = tmp_path / "x.gz"
    path.write_bytes(_idx_bytes(arr, 0x0C))  # raw despite the .gz name
    out = read_idx(path)
    assert out.dtype == np.dtype(np.int32) and out.dtype.isnative
    np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize(
    "raw, match",
    [
        (b"\x12\x34\x08\x01" + (1).to_bytes(4, "big") + b"\x00", "magic number 12340801"),
        (b"\x00\x00\x07\x01" + (1).to_bytes(4, "big") + b"\x00", "dtype code 0x07"),
        (b"\x00\x00\x08\x01" + (5).to_bytes(4, "big") + b"\x00\x00", "size mismatch"),
        (b"\x00\x00", "only 2 bytes"),
    ],
)
def test_read_idx_bad_files_name_file_and_problem(tmp_path, raw, match):
    path = tmp_path / "bad-file"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=match) as info:
        read_idx(path)
    assert "bad-file" in str(info.value)


# --------------------------------------------------------------------------- datasets


def test_mnist10k_shapes_and_stratified_split():
    ds = load_dataset("mnist10k")
    assert ds.train_x.shape == (8000, 28, 28, 1) and ds.test_x.shape == (2000, 28, 28, 1)
    assert ds.train_x.dtype == np.uint8 and ds.train_y.dtype == np.int32
    assert ds.input_shape == (28, 28, 1) and ds.num_classes == 10
    assert set(np.unique(ds.train_y)) == set(range(10)) == set(np.unique(ds.test_y))
    full = np.bincount(np.concatenate([ds.train_y, ds.test_y]), minlength=10)
    # Stratified: each class's held-out share is 20% up to rounding.
    np.testing.assert_allclose(np.bincount(ds.test_y, minlength=10), full * 0.2, atol=1)
    # Train and test are disjoint: no image appears on both sides (MNIST has no duplicates).
    train_keys = {r.tobytes() for r in ds.train_x.reshape(8000, -1)}
    assert not any(r.tobytes() in train_keys for r in ds.test_x.reshape(2000, -1))


def test_mnist10k_split_identical_across_processes():
    ds = load_dataset("mnist10k")
    code = (
        "import hashlib; from jaxfl.data import load_dataset; d = load_dataset('mnist10k');"
        "print(hashlib.sha256(d.test_y.tobytes() + d.test_x.tobytes()).hexdigest())"
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    import hashlib

    assert out.stdout.strip() == hashlib.sha256(ds.test_y.tobytes() + ds.test_x.tobytes()).hexdigest()


def test_datasets_cached_and_read_only():
    a, b = load_dataset("mnist10k"), load_dataset("mnist10k")
    assert a is b
    with pytest.raises(ValueError, match="read-only"):
        a.train_x[0, 0, 0, 0] = 1


def test_unknown_dataset_lists_choices():
    with pytest.raises(ValueError, match=r"'cifar'.*mnist10k"):
        load_dataset("cifar")
    assert "mnist10k" in DATASETS


def test_mnist_requires_data_dir(tmp_path):
    with pytest.raises(ValueError, match="data_dir"):
        load_dataset("mnist")
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_dataset("mnist", data_dir=tmp_path)


def test_fashion_mnist_missing_folder_message(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist") as info:
        load_dataset("fashion_mnist", data_dir=tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(info.value)


def test_mnist_layout_from_data_dir(tmp_path):
    # A tiny hand-made MNIST folder: train gzipped, t10k raw.
    rng = np.random.default_rng(0)
    for prefix, n, gz in (("train", 6, True), ("t10k", 4, False)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = np.arange(n, dtype=np.uint8) % 10
        for stem, arr in ((f"{prefix}-images-idx3-ubyte", x), (f"{prefix}-labels-idx1-ubyte", y)):
            raw = _idx_bytes(arr, 0x08)
            (tmp_path / (stem + (".gz" if gz else ""))).write_bytes(gzip.compress(raw) if gz else raw)
    ds = load_dataset("mnist", data_dir=str(tmp_path))
    assert ds.train_x.shape == (6, 28, 28, 1) and ds.test_x.shape == (4, 28, 28, 1)
    assert ds.train_y.dtype == np.int32 and ds.test_y.tolist() == [0, 1, 2, 3]


@pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_DIR),
    reason=f"{FASHION_MNIST_DIR} absent: apt-get install dataset-fashion-mnist",
)
def test_fashion_mnist_loads():
    ds = load_dataset("fashion_mnist")
    assert ds.train_x.shape == (60000, 28, 28, 1) and ds.test_x.shape == (10000, 28, 28, 1)
    assert ds.train_y.dtype == np.int32 and set(np.unique(ds.train_y)) == set(range(10))


# --------------------------------------------------------------------------- partitions

LABELS = np.repeat(np.arange(10), [50, 80, 120, 60, 90, 100, 70, 110, 40, 280])  # N = 1000, unbalanced


def _check_partition(parts, n, num_clients):
    assert len(parts) == num_clients
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0), "sorted, no duplicates within a client"
    flat = np.concatenate(parts)
    assert len(flat) == n
    np.testing.assert_array_equal(np.sort(flat), np.arange(n))


@pytest.mark.parametrize("num_clients", [1, 3, 7, 1000])
def test_iid_invariants(num_clients):
    parts = partition_iid(LABELS, num_clients, np.random.default_rng(0))
    _check_partition(parts, len(LABELS), num_clients)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("alpha", [0.05, 0.5, 5.0])
@pytest.mark.parametrize("num_clients", [2, 10, 30])
def test_dirichlet_invariants(alpha, num_clients):
    parts = partition_dirichlet(LABELS, num_clients, alpha, np.random.default_rng(1), min_samples=2)
    _check_partition(parts, len(LABELS), num_clients)
    assert min(len(p) for p in parts) >= 2


@pytest.mark.parametrize("name, kw", [("iid", {}), ("dirichlet", {"alpha": 0.3}), ("dirichlet", {"alpha": 0.3, "balance": True})])
def test_partition_deterministic_for_seed(name, kw):
    a = make_partition(name, LABELS, 8, np.random.default_rng(42), **kw)
    b = make_partition(name, LABELS, 8, np.random.default_rng(42), **kw)
    c = make_partition(name, LABELS, 8, np.random.default_rng(43), **kw)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def _client_class_props(parts, labels):
    hist = np.stack([np.bincount(labels[p], minlength=10) for p in parts])
    return hist / hist.sum(axis=1, keepdims=True)


def test_dirichlet_large_alpha_near_iid():
    labels = np.repeat(np.arange(10), 1000)
    parts = partition_dirichlet(labels, 5, 1000.0, np.random.default_rng(0))
    props = _client_class_props(parts, labels)
    np.testing.assert_allclose(props, 0.1, atol=0.02)
    sizes = np.array([len(p) for p in parts])
    np.testing.assert_allclose(sizes, 2000, rtol=0.05)


def test_dirichlet_small_alpha_skewed():
    labels = np.repeat(np.arange(10), 1000)
    parts = partition_dirichlet(labels, 10, 0.05, np.random.default_rng(0))
    props = _client_class_props(parts, labels)
    # Near-IID would put ~10% of each client in its top class; Dir(0.05) concentrates it.
    assert np.median(props.max(axis=1)) > 0.5


def test_dirichlet_balance_caps_client_size():
    labels = np.repeat(np.arange(10), 1000)
    plain = partition_dirichlet(labels, 10, 0.1, np.random.default_rng(3))
    balanced = partition_dirichlet(labels, 10, 0.1, np.random.default_rng(3), balance=True)
    _check_partition(balanced, len(labels), 10)
    assert max(len(p) for p in balanced) <= max(len(p) for p in plain)


def test_dirichlet_impossible_min_samples_errors():
    labels = np.repeat(np.arange(2), 5)
    with pytest.raises(ValueError, match="infeasible"):
        partition_dirichlet(labels, 5, 1.0, np.random.default_rng(0), min_samples=3)
    with pytest.raises(ValueError, match="1000 tries"):
        # Feasible on paper (5 x 2 = 10) but Dir(1e-3) almost never spreads 2 classes over 5 clients evenly.
        partition_dirichlet(labels, 5, 1e-3, np.random.default_rng(0), min_samples=2)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda r: partition_iid(LABELS, 0, r), "num_clients=0"),
        (lambda r: partition_iid(LABELS, 1001, r), "num_clients=1001.*1000"),
        (lambda r: partition_dirichlet(LABELS, 4, 0.0, r), "alpha=0.0"),
        (lambda r: partition_dirichlet(LABELS, 4, -1.0, r), "alpha=-1.0"),
        (lambda r: partition_dirichlet(LABELS, 4, float("nan"), r), "alpha=nan"),
        (lambda r: partition_dirichlet(LABELS, 4, float("inf"), r), "alpha=inf"),
        (lambda r: make_partition("shards", LABELS, 4, r), r"'shards'.*dirichlet.*iid"),
    ],
)
def test_partition_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call(np.random.default_rng(0))


# --------------------------------------------------------------------------- federated storage


def test_federated_round_trip_and_memory():
    ds = load_dataset("mnist10k")
    parts = partition_dirichlet(ds.train_y, 12, 0.3, np.random.default_rng(0))
    fd = FederatedData.from_partition(ds.train_x, ds.train_y, parts, ds.num_classes)
    assert fd.num_clients == 12 and fd.max_count == max(len(p) for p in parts)
    for i, p in enumerate(parts):
        xi, yi = fd.client(i)
        np.testing.assert_array_equal(xi, ds.train_x[p])
        np.testing.assert_array_equal(yi, ds.train_y[p])
        assert np.shares_memory(xi, fd.x), "client(i) is a view, not a copy"
    hist = fd.class_histogram()
    assert hist.shape == (12, 10) and hist.dtype == np.int64
    np.testing.assert_array_equal(hist.sum(axis=1), fd.counts)
    np.testing.assert_array_equal(hist.sum(axis=0), np.bincount(ds.train_y, minlength=10))
    # Flat, unpadded: exactly the bytes of the selected samples.
    assert fd.x.nbytes == sum(len(p) for p in parts) * 28 * 28 * 1
    assert fd.offsets.dtype == np.int64 and fd.counts.dtype == np.int64
    np.testing.assert_array_equal(fd.offsets, np.concatenate([[0], np.cumsum(fd.counts)[:-1]]))


def test_federated_weights():
    x = np.zeros((6, 1, 1, 1), np.uint8)
    y = np.zeros(6, np.int32)
    fd = FederatedData.from_partition(x, y, [np.array([0]), np.array([1, 2]), np.array([3, 4, 5])], 2)
    np.testing.assert_allclose(fd.weights(), [1 / 6, 2 / 6, 3 / 6])
    np.testing.assert_allclose(fd.weights("uniform"), [1 / 3] * 3)
    assert fd.weights().dtype == np.float64 and fd.weights().sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="'median'"):
        fd.weights("median")


def test_federated_empty_client_rejected():
    x = np.zeros((3, 1, 1, 1), np.uint8)
    y = np.zeros(3, np.int32)
    with pytest.raises(ValueError, match="client 1 has 0 samples.*>= 1 sample"):
        FederatedData.from_partition(x, y, [np.array([0, 1, 2]), np.array([], np.int64)], 1)


def test_build_federation_deterministic_and_seed_dependent():
    ds = load_dataset("mnist10k")
    a = build_federation(ds, 10, "dirichlet", seed=7, alpha=0.5)
    b = build_federation(ds, 10, "dirichlet", seed=7, alpha=0.5)
    c = build_federation(ds, 10, "dirichlet", seed=8, alpha=0.5)
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_array_equal(a.y, b.y)
    assert not np.array_equal(a.counts, c.counts)
    iid = build_federation(ds, 10)
    assert iid.counts.tolist() == [800] * 10 and not iid.x.flags.writeable


def test_data_layer_is_numpy_only():
    # Scan imports in the source rather than sys.modules: jaxfl/__init__ may legitimately import jax.
    import ast
    import pathlib

    import jaxfl.data

    for path in pathlib.Path(jaxfl.data.__file__).parent.glob("*.py"):
        if path.name == "augment.py":  # the one on-device (JAX) module, by design
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in {"jax", "jaxlib", "flax", "tensorflow"}, f"{path.name} imports {name}"
