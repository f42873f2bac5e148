"""Image-classification datasets as raw uint8 numpy arrays.

Pixels stay uint8 here: normalisation happens on device, so the host copy and the transfer are
4x smaller than float32 and every algorithm sees exactly the same bytes. Nothing here imports
jax or tensorflow.

Layouts: images ``(N, H, W, C)`` uint8, labels ``(N,)`` int32.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import importlib.resources
import os

import numpy as np

from jaxfl.data.idx import parse_idx, read_idx

__all__ = [
    "Dataset",
    "DATASETS",
    "load_dataset",
    "FASHION_MNIST_DIR",
    "MNIST10K_SPLIT_SEED",
    "MNIST10K_NUM_TEST",
]

# Where Debian's `dataset-fashion-mnist` package puts the IDX files.
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

# The embedded MNIST test set is split once, with this fixed seed, into 8,000 training and 2,000
# held-out samples stratified by class. Changing either constant changes every mnist10k result.
MNIST10K_SPLIT_SEED = 0
MNIST10K_NUM_TEST = 2000

_EMBEDDED_PACKAGE = "jaxfl.data"
_EMBEDDED_DIR = "embedded"
_MNIST10K_IMAGES = "t10k-images-idx3-ubyte.gz"
_MNIST10K_LABELS = "t10k-labels-idx1-ubyte.gz"

DATASETS: tuple[str, ...] = ("mnist10k", "fashion_mnist", "mnist")


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A train / held-out pair of image-classification arrays (read-only).

    Example:
        >>> ds = load_dataset("mnist10k")
        >>> ds.train_x.shape, ds.test_x.shape, ds.input_shape
        ((8000, 28, 28, 1), (2000, 28, 28, 1), (28, 28, 1))
    """

    name: str
    train_x: np.ndarray  # (N, H, W, C) uint8 raw pixels
    train_y: np.ndarray  # (N,) int32
    test_x: np.ndarray  # (N_test, H, W, C) uint8
    test_y: np.ndarray  # (N_test,) int32
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """``(H, W, C)`` of one sample.

        Example:
            >>> load_dataset("mnist10k").input_shape
            (28, 28, 1)
        """
        return tuple(int(s) for s in self.train_x.shape[1:])


def load_dataset(name: str, data_dir: str | os.PathLike | None = None) -> Dataset:
    """Load a dataset by name; results are cached in-process and their arrays are read-only.

    - ``"mnist10k"``: the official MNIST test set shipped inside the package (MD5-checked),
      split into 8,000 train / 2,000 held-out, stratified by class with seed
      ``MNIST10K_SPLIT_SEED``. ``data_dir`` is ignored.
    - ``"fashion_mnist"``: 60,000 / 10,000 IDX files from ``data_dir`` or ``FASHION_MNIST_DIR``.
    - ``"mnist"``: 60,000 / 10,000 IDX files from ``data_dir`` (required).

    Example:
        >>> ds = load_dataset("mnist10k")
        >>> ds.num_classes, ds.train_y.dtype
        (10, dtype('int32'))
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; expected one of {DATASETS}")
    if name == "mnist10k":
        return _load_cached(name, None)
    if name == "mnist" and data_dir is None:
        raise ValueError(
            "dataset 'mnist' needs data_dir: a folder holding train-images-idx3-ubyte[.gz], "
            "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz] "
            "(or use 'mnist10k', which ships inside the package)"
        )
    folder = FASHION_MNIST_DIR if data_dir is None else data_dir
    # Resolve before caching so "./x" and "/abs/x" share one entry.
    return _load_cached(name, os.path.abspath(os.path.expanduser(os.fspath(folder))))


@functools.lru_cache(maxsize=None)
def _load_cached(name: str, folder: str | None) -> Dataset:
    if name == "mnist10k":
        ds = _load_mnist10k()
    else:
        ds = _load_idx_folder(name, folder)
    for arr in (ds.train_x, ds.train_y, ds.test_x, ds.test_y):
        # The cache hands the same arrays to every caller: forbid in-place edits.
        arr.setflags(write=False)
    return ds


def _load_idx_folder(name: str, folder: str) -> Dataset:
    stems = {
        "train_x": "train-images-idx3-ubyte",
        "train_y": "train-labels-idx1-ubyte",
        "test_x": "t10k-images-idx3-ubyte",
        "test_y": "t10k-labels-idx1-ubyte",
    }
    paths, missing = {}, []
    for key, stem in stems.items():
        found = next(
            (os.path.join(folder, f) for f in (stem + ".gz", stem) if os.path.isfile(os.path.join(folder, f))),
            None,
        )
        if found is None:
            missing.append(stem + "[.gz]")
        paths[key] = found
    if missing:
        hint = (
            "install it with `apt-get install dataset-fashion-mnist` or pass data_dir"
            if name == "fashion_mnist"
            else "pass data_dir pointing at the MNIST IDX files"
        )
        raise FileNotFoundError(f"dataset {name!r}: looked in {folder} and found no {', '.join(missing)}; {hint}")
    arrays = {key: read_idx(p) for key, p in paths.items()}
    train_x, train_y = _as_images_labels(arrays["train_x"], arrays["train_y"], paths["train_x"], paths["train_y"])
    test_x, test_y = _as_images_labels(arrays["test_x"], arrays["test_y"], paths["test_x"], paths["test_y"])
    return Dataset(name, train_x, train_y, test_x, test_y, num_classes=10)


def _as_images_labels(images: np.ndarray, labels: np.ndarray, img_src: str, lbl_src: str):
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(f"{img_src}: expected (N, H, W) uint8 images, got {images.shape} {images.dtype}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(f"{lbl_src}: expected {images.shape[0]} labels to match {img_src}, got shape {labels.shape}")
    if labels.size and labels.max() > 9:
        raise ValueError(f"{lbl_src}: label {int(labels.max())} outside 0..9")
    return images[..., None], labels.astype(np.int32)


def _embedded_bytes(filename: str) -> bytes:
    root = importlib.resources.files(_EMBEDDED_PACKAGE).joinpath(_EMBEDDED_DIR)
    return root.joinpath(filename).read_bytes()


def _expected_md5() -> dict[str, str]:
    sums = {}
    for line in _embedded_bytes("MD5SUMS").decode("ascii").splitlines():
        if line.strip():
            digest, fname = line.split(maxsplit=1)
            sums[fname.strip().lstrip("*")] = digest.lower()
    return sums


def _verified_embedded_idx(filename: str, sums: dict[str, str]) -> np.ndarray:
    raw = _embedded_bytes(filename)
    got = hashlib.md5(raw, usedforsecurity=False).hexdigest()
    want = sums.get(filename)
    if got != want:
        raise ValueError(
            f"embedded file jaxfl/data/{_EMBEDDED_DIR}/{filename} is corrupt: MD5 {got}, expected {want} "
            "(from embedded/MD5SUMS); reinstall jaxfl"
        )
    return parse_idx(gzip.decompress(raw), source=f"jaxfl/data/{_EMBEDDED_DIR}/{filename}")


def _stratified_test_counts(class_counts: np.ndarray, num_test: int) -> np.ndarray:
    # Largest-remainder rounding: proportional per class, yet exactly num_test in total
    # (plain rounding of MNIST's class sizes gives 1999 or 2001). Ties go to the lower class.
    exact = class_counts * num_test / class_counts.sum()
    counts = np.floor(exact).astype(np.int64)
    short = num_test - int(counts.sum())
    order = np.lexsort((np.arange(len(exact)), -(exact - counts)))
    counts[order[:short]] += 1
    return counts


def _load_mnist10k() -> Dataset:
    sums = _expected_md5()
    images = _verified_embedded_idx(_MNIST10K_IMAGES, sums)
    labels = _verified_embedded_idx(_MNIST10K_LABELS, sums)
    x, y = _as_images_labels(images, labels, _MNIST10K_IMAGES, _MNIST10K_LABELS)
    rng = np.random.default_rng(MNIST10K_SPLIT_SEED)
    test_counts = _stratified_test_counts(np.bincount(y, minlength=10), MNIST10K_NUM_TEST)
    is_test = np.zeros(len(y), dtype=bool)
    for c in range(10):
        members = np.flatnonzero(y == c)
        is_test[rng.choice(members, size=test_counts[c], replace=False)] = True
    # Boolean masks keep the file order within each side, so the split is easy to audit.
    return Dataset("mnist10k", x[~is_test], y[~is_test], x[is_test], y[is_test], num_classes=10)
