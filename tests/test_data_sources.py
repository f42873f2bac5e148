"""Dataset loaders beyond IDX: scikit-learn digits, .npz files, the synthetic federation, user arrays."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

from jaxfl.data import (
    DATASETS,
    build_federation,
    dataset_from_arrays,
    generate_synthetic,
    load_dataset,
)
from jaxfl.data.synthetic import SYNTHETIC_CLASSES, SYNTHETIC_DIM, parse_synthetic_name


# --------------------------------------------------------------------------- digits (scikit-learn)


def test_digits_loads_as_uint8_images_stratified():
    pytest.importorskip("sklearn")
    ds = load_dataset("digits")
    assert ds.train_x.shape == (1437, 8, 8, 1) and ds.test_x.shape == (360, 8, 8, 1)
    assert ds.train_x.dtype == np.uint8 and ds.train_x.max() == 255 and ds.kind == "image"
    assert ds.num_classes == 10 and set(np.unique(ds.test_y)) == set(range(10))
    assert load_dataset("digits") is ds and not ds.train_x.flags.writeable


def test_digits_without_sklearn_names_the_extra(monkeypatch):
    from jaxfl.data import datasets

    datasets._load_digits.cache_clear()
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    try:
        with pytest.raises(ImportError, match=r"pip install jaxfl\[sklearn\]"):
            load_dataset("digits")
    finally:
        datasets._load_digits.cache_clear()


# --------------------------------------------------------------------------- npz


def test_npz_images_with_writer_ids(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "toy.npz"
    np.savez(path, x_train=rng.integers(0, 256, (12, 5, 5), dtype=np.uint8), y_train=np.arange(12) % 3,
             x_test=rng.integers(0, 256, (4, 5, 5), dtype=np.uint8), y_test=np.arange(4) % 3,
             client_train=np.repeat([10, 20, 30], 4))
    ds = load_dataset("npz", data_dir=path)
    assert ds.train_x.shape == (12, 5, 5, 1) and ds.num_classes == 3 and ds.kind == "image"
    fd = build_federation(ds, 3, "natural")
    assert fd.counts.tolist() == [4, 4, 4]
    np.testing.assert_array_equal(fd.client(1)[1], np.arange(4, 8) % 3)
    # A folder holding one .npz works too; the explicit num_classes wins over the labels seen.
    folder = tmp_path / "one"
    folder.mkdir()
    np.savez(folder / "d.npz", x_train=np.zeros((3, 4), np.float64), y_train=[0, 1, 0], x_test=np.zeros((1, 4)),
             y_test=[1], num_classes=5)
    features = load_dataset("npz", data_dir=folder)
    assert features.kind == "features" and features.train_x.dtype == np.float32 and features.num_classes == 5


def test_npz_tokens_and_errors(tmp_path):
    path = tmp_path / "text.npz"
    np.savez(path, x_train=np.array([[3, 4, 0], [5, 0, 0]], np.int64), y_train=[0, 1],
             x_test=np.array([[6, 2, 0]], np.int64), y_test=[1])
    ds = load_dataset("npz", data_dir=path)
    assert ds.kind == "tokens" and ds.vocab_size == 7 and ds.input_shape == (3,)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x_train=np.zeros((2, 3), np.uint8), y_train=[0, 1])
    with pytest.raises(ValueError, match=r"missing arrays \['x_test', 'y_test'\]"):
        load_dataset("npz", data_dir=bad)
    with pytest.raises(ValueError, match="needs data_dir"):
        load_dataset("npz")
    with pytest.raises(FileNotFoundError, match="no file"):
        load_dataset("npz", data_dir=tmp_path / "nope.npz")
    misspelt = tmp_path / "misspelt.npz"  # clients_train for client_train: the writers' split would be lost
    np.savez(misspelt, x_train=np.zeros((2, 3)), y_train=[0, 1], x_test=np.zeros((1, 3)), y_test=[1],
             clients_train=[0, 1], x_val=np.array([object()], dtype=object))
    with pytest.warns(UserWarning, match=r"arrays \['clients_train', 'x_val'\] are not read; jaxfl reads"):
        assert load_dataset("npz", data_dir=misspelt).train_groups is None  # the unread object array is never loaded


def test_a_damaged_npz_file_is_named_as_such_not_a_traceback(tmp_path, capsys):
    # zipfile's BadZipFile is no ValueError or OSError: a file starting as a zip, or one with a flipped
    # byte, ended `jaxfl run` in a traceback (since a comparison's search reads the file, from there too)
    from jaxfl.cli import main

    (tmp_path / "head.npz").write_bytes(b"PK\x03\x04garbage")
    np.savez(tmp_path / "ok.npz", x_train=np.zeros((4, 3), np.float32), y_train=[0, 1, 0, 1],
             x_test=np.zeros((2, 3), np.float32), y_test=[0, 1])
    flipped = bytearray((tmp_path / "ok.npz").read_bytes())
    flipped[200] ^= 0xFF  # inside x_train's bytes: its CRC no longer matches
    (tmp_path / "flipped.npz").write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match=r"head.npz is not a .npz archive of numeric arrays .*not a zip file"):
        load_dataset("npz", data_dir=tmp_path / "head.npz")
    with pytest.raises(ValueError, match=r"flipped.npz is damaged: numpy could not read its arrays \(Bad CRC-32"):
        load_dataset("npz", data_dir=tmp_path / "flipped.npz")
    with pytest.raises(SystemExit):
        main(["run", "--algorithm", "fedavg,fedasync", "--dataset", "npz", "--data-dir", str(tmp_path / "flipped.npz"),
              "--model", "logreg", "--clients", "2", "--max-updates", "1", "--output-dir", str(tmp_path / "runs")])
    assert "flipped.npz is damaged" in capsys.readouterr().err and not (tmp_path / "runs").exists()


def test_dataset_from_arrays_checks():
    with pytest.raises(ValueError, match="y_train holds label 5, but num_classes=3 allows labels 0..2: set "
                                         "num_classes to at least 6"):
        dataset_from_arrays("x", np.zeros((2, 3), np.float32), [0, 5], np.zeros((1, 3)), [0], num_classes=3)
    with pytest.raises(ValueError, match=r"train samples have shape \(3,\) but test samples \(4,\)"):
        dataset_from_arrays("x", np.zeros((2, 3)), [0, 1], np.zeros((1, 4)), [0])
    with pytest.raises(ValueError, match="same number of samples"):
        dataset_from_arrays("x", np.zeros((2, 3)), [0], np.zeros((1, 3)), [0])
    with pytest.raises(ValueError, match=r"x_train has shape \(2,\), no feature axis: .*\(N, 1\)"):
        dataset_from_arrays("x", np.zeros(2), [0, 1], np.zeros(1), [0])
    mine = np.zeros((2, 3), np.float32)
    dataset_from_arrays("x", mine, [0, 1], np.zeros((1, 3)), [0])
    with pytest.warns(UserWarning, match=r"y_test holds label\(s\) 7 above y_train's largest, 2: counted as 8 "):
        assert dataset_from_arrays("x", np.zeros((3, 3)), [0, 1, 2], np.zeros((2, 3)), [0, 7]).num_classes == 8
    with warnings.catch_warnings():  # the classes set: what the user means, said
        warnings.simplefilter("error")
        assert dataset_from_arrays("x", np.zeros((3, 3)), [0, 1, 2], np.zeros((2, 3)), [0, 7],
                                   num_classes=8).num_classes == 8
    assert mine.flags.writeable, "the caller's array keeps its flags"


def test_unknown_names_and_options():
    with pytest.raises(ValueError, match=r"'cifar100'.*tfds:cifar10"):
        load_dataset("cifar100")
    with pytest.raises(ValueError, match=r"takes no options.*\['num_clients'\]"):
        load_dataset("mnist10k", num_clients=3)
    assert {"digits", "npz", "array_record", "synthetic", "synthetic_iid"} <= set(DATASETS)


# --------------------------------------------------------------------------- synthetic


def test_synthetic_generators_are_the_known_optimum():
    fed = generate_synthetic(20, alpha=0.5, beta=0.5, seed=3, keep_models=True)
    assert fed.x.shape[1] == SYNTHETIC_DIM and fed.x.dtype == np.float32
    assert fed.y.max() < SYNTHETIC_CLASSES
    # Each client's own generating model labels its data perfectly (the per-client optimum).
    np.testing.assert_array_equal(fed.true_logits().argmax(axis=1), fed.y)
    iid = generate_synthetic(20, iid=True, seed=3, keep_models=True)
    # IID: one shared (W, b) is a global model with accuracy 1 on every client.
    np.testing.assert_array_equal(iid.weights[0], iid.weights[-1])
    np.testing.assert_array_equal((iid.x @ iid.weights[0] + iid.biases[0]).argmax(axis=1), iid.y)


def test_synthetic_heterogeneity_grows_with_alpha_beta():
    def label_skew(alpha, beta):
        fed = generate_synthetic(200, alpha=alpha, beta=beta, samples_per_client=40, seed=0)
        hist = np.zeros((200, SYNTHETIC_CLASSES))
        np.add.at(hist, (fed.client, fed.y), 1)
        mix = hist / hist.sum(axis=1, keepdims=True)
        return np.abs(mix - hist.sum(0) / hist.sum()).sum(axis=1).mean()

    assert label_skew(0.0, 0.0) < label_skew(1.0, 1.0)


def test_synthetic_dataset_holds_out_a_fifth_per_client_and_is_deterministic():
    a = load_dataset("synthetic:0.5,0.5", num_clients=50, samples_per_client=10)
    b = load_dataset("synthetic:0.5,0.5", num_clients=50, samples_per_client=10)
    np.testing.assert_array_equal(a.train_x, b.train_x)
    assert a.kind == "features" and a.input_shape == (SYNTHETIC_DIM,)
    assert len(a.test_y) == pytest.approx(0.2 * (len(a.train_y) + len(a.test_y)), rel=0.25)
    fd = build_federation(a, 50, "natural")
    assert fd.num_clients == 50 and fd.counts.min() >= 1
    other = load_dataset("synthetic:0.5,0.5", num_clients=50, samples_per_client=10, seed=1)
    assert not np.array_equal(other.train_x[:5], a.train_x[:5])


def test_synthetic_names_and_errors():
    assert parse_synthetic_name("synthetic") == {"alpha": 1.0, "beta": 1.0, "iid": False}
    assert parse_synthetic_name("synthetic_iid")["iid"]
    with pytest.raises(ValueError, match="synthetic:ALPHA,BETA"):
        load_dataset("synthetic:1", num_clients=3)
    with pytest.raises(ValueError, match="alpha=-1.0"):
        load_dataset("synthetic:-1,0", num_clients=3)
    with pytest.raises(ValueError, match="need num_clients"):
        load_dataset("synthetic")
