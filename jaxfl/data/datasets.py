"""Classification datasets as numpy arrays, behind one loader: :func:`load_dataset`.

Pixels stay uint8 here: normalisation happens on device (``jaxfl.data.augment``), so the host copy
and the transfer are 4x smaller than float32 and every algorithm sees exactly the same bytes.
Nothing here imports jax or tensorflow; optional back-ends (TFDS, scikit-learn) are imported only
inside the loader that needs them.

Layouts (``Dataset.kind``): images ``(N, H, W, C)`` uint8 pixels, or float32 values used as they are;
features ``(N, D)`` float32 (synthetic); tokens ``(N, L)`` int32 (text, 0 = padding). Labels ``(N,)``
int32. Your own arrays become a :class:`Dataset` with :func:`as_dataset` (what
``run_experiment(config, data=...)`` calls).

Names (``DATASETS``, plus the ``tfds:`` and ``synthetic:`` prefixes):

- ``mnist10k`` (embedded), ``fashion_mnist`` (Debian), ``mnist`` (IDX folder in ``data_dir``);
- ``digits``: scikit-learn's bundled 8x8 digits (``pip install jaxfl[sklearn]``);
- ``npz``: a ``.npz`` file (``data_dir``) with ``x_train, y_train, x_test, y_test`` and optional
  ``client_train`` (per-sample client id, for the natural split) and ``num_classes``; re-read
  whenever the file changes (the cache is keyed by path, modification time and size);
- ``array_record``: a dataset folder written by TFDS (``data_dir`` = the version folder holding
  ``dataset_info.json``), read through ``tfds.data_source`` without TensorFlow;
- ``tfds:<name>[/<config>]``: any TFDS image or text classification set, e.g. ``tfds:cifar10``,
  ``tfds:emnist/balanced``, ``tfds:imdb_reviews``, from ``data_dir`` (never downloaded);
- ``synthetic``, ``synthetic_iid``, ``synthetic:A,B``: FedProx's synthetic(alpha, beta) federation
  (see ``jaxfl.data.synthetic``); needs ``num_clients``. ``synthetic:iid+parallel`` and
  ``synthetic:A,B+parallel``: another sample of the same, generated on every core.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
from collections.abc import Mapping
import hashlib
import importlib.resources
import os
import warnings
import zipfile
import zlib

import numpy as np

from jaxfl._user_warnings import warn_user
from jaxfl.data.idx import parse_idx, read_idx

__all__ = [
    "Dataset",
    "DATASETS",
    "DATASET_PREFIXES",
    "load_dataset",
    "dataset_from_arrays",
    "as_dataset",
    "DATA_FORMS",
    "FASHION_MNIST_DIR",
    "MNIST10K_SPLIT_SEED",
    "MNIST10K_NUM_TEST",
    "DIGITS_NUM_TEST",
    "known_input",
    "known_classes",
]

# Where Debian's `dataset-fashion-mnist` package puts the IDX files.
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

# The embedded MNIST test set is split once, with this fixed seed, into 8,000 training and 2,000
# held-out samples stratified by class. Changing either constant changes every mnist10k result.
MNIST10K_SPLIT_SEED = 0
MNIST10K_NUM_TEST = 2000
# scikit-learn's digits (1,797 samples) are split the same way: 1,437 train / 360 held out.
DIGITS_NUM_TEST = 360

_EMBEDDED_PACKAGE = "jaxfl.data"
_EMBEDDED_DIR = "embedded"
_MNIST10K_IMAGES = "t10k-images-idx3-ubyte.gz"
_MNIST10K_LABELS = "t10k-labels-idx1-ubyte.gz"

DATASETS: tuple[str, ...] = ("mnist10k", "fashion_mnist", "mnist", "digits", "npz", "array_record",
                             "synthetic", "synthetic_iid")
DATASET_PREFIXES: tuple[str, ...] = ("tfds:", "synthetic:")

# The sample shape, kind and number of classes that these names fix, so that a model can be checked
# against them before the data is read or generated (a synthetic federation of 10^6 clients takes a
# minute and gigabytes).
_KNOWN: dict[str, tuple[tuple[int, ...], str, int]] = {
    "mnist10k": ((28, 28, 1), "image", 10), "fashion_mnist": ((28, 28, 1), "image", 10),
    "mnist": ((28, 28, 1), "image", 10), "digits": ((8, 8, 1), "image", 10)}


def _known(name: str) -> tuple[tuple[int, ...], str, int] | None:
    """``(input_shape, kind, num_classes)`` that dataset ``name`` fixes, or None."""
    if name in _KNOWN:
        return _KNOWN[name]
    if name in ("synthetic", "synthetic_iid") or name.startswith("synthetic:"):
        from jaxfl.data.synthetic import SYNTHETIC_CLASSES, SYNTHETIC_DIM

        return (SYNTHETIC_DIM,), "features", SYNTHETIC_CLASSES
    return None


def known_input(name: str) -> tuple[tuple[int, ...], str] | None:
    """``(input_shape, kind)`` of dataset ``name``'s samples where the name alone fixes them, as
    :attr:`Dataset.input_shape` and :attr:`Dataset.kind` give them once loaded; None where only its
    data tells (``npz``, ``array_record``, ``tfds:``, a user's data).

    Example:
        >>> known_input("mnist10k"), known_input("synthetic:0.5,0.5"), known_input("npz")
        (((28, 28, 1), 'image'), ((60,), 'features'), None)
    """
    known = _known(name)
    return None if known is None else known[:2]


def known_classes(name: str) -> int | None:
    """The number of classes dataset ``name`` has where the name alone fixes it, as
    :attr:`Dataset.num_classes` gives it once loaded (before a config's ``num_classes``); None where
    only its data tells.

    Example:
        >>> known_classes("fashion_mnist"), known_classes("synthetic_iid"), known_classes("npz")
        (10, 10, None)
    """
    known = _known(name)
    return None if known is None else known[2]


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A train / held-out pair of classification arrays (read-only).

    Example:
        >>> ds = load_dataset("mnist10k")
        >>> ds.train_x.shape, ds.test_x.shape, ds.input_shape, ds.kind
        ((8000, 28, 28, 1), (2000, 28, 28, 1), (28, 28, 1), 'image')
    """

    name: str
    train_x: np.ndarray  # (N, H, W, C) uint8 raw pixels | (N, D) float32 | (N, L) int32 tokens
    train_y: np.ndarray  # (N,) int32
    test_x: np.ndarray  # (N_test, ...) like train_x
    test_y: np.ndarray  # (N_test,) int32
    num_classes: int
    train_groups: np.ndarray | None = None  # (N,) natural client/writer id per sample, if any
    vocab_size: int | None = None  # tokens: ids lie in [0, vocab_size)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample: ``(H, W, C)``, ``(D,)`` or ``(L,)``.

        Example:
            >>> load_dataset("mnist10k").input_shape
            (28, 28, 1)
        """
        return tuple(int(s) for s in self.train_x.shape[1:])

    @property
    def kind(self) -> str:
        """``"image"`` (``(N, H, W, C)``, uint8 or float), ``"tokens"`` (integer ``(N, L)``) or
        ``"features"`` (float ``(N, D)``).

        Example:
            >>> load_dataset("mnist10k").kind
            'image'
        """
        if self.train_x.ndim == 4 and (self.train_x.dtype == np.uint8 or np.issubdtype(self.train_x.dtype, np.floating)):
            return "image"
        if np.issubdtype(self.train_x.dtype, np.integer) and self.train_x.ndim == 2:
            return "tokens"
        return "features"

    @property
    def nbytes(self) -> int:
        """Bytes of the four arrays (and the group column).

        Example:
            >>> load_dataset("mnist10k").nbytes
            7880000
        """
        arrays = (self.train_x, self.train_y, self.test_x, self.test_y, self.train_groups)
        return int(sum(a.nbytes for a in arrays if a is not None))

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of the arrays' dtypes, shapes and bytes: equal content, equal fingerprint.

        A run records it for data passed in Python and for ``npz`` files, so that a resumed run can
        refuse other data.

        Example:
            >>> a = dataset_from_arrays("a", np.zeros((2, 3), np.float32), [0, 1], np.ones((1, 3)), [1])
            >>> b = dataset_from_arrays("b", np.zeros((2, 3)), [0, 1], np.ones((1, 3)), [1])
            >>> a.fingerprint == b.fingerprint, len(a.fingerprint)
            (True, 64)
        """
        digest = hashlib.sha256()
        for array in (self.train_x, self.train_y, self.test_x, self.test_y, self.train_groups):
            if array is None:
                digest.update(b"none;")
                continue
            digest.update(f"{array.dtype.str}{array.shape};".encode())
            digest.update(np.ascontiguousarray(array).data)
        return digest.hexdigest()

    @functools.cached_property
    def channel_statistics(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel ``(mean, std)`` of the training split as the model sees it.

        Channels are the last axis (an image's colour channels; each feature of ``(N, D)`` features).
        uint8 pixels are taken after scaling to [0, 1], float values as they are. The std is the
        population one (ddof 0); a constant channel gets std 1, so normalising only centres it (as
        scikit-learn's ``StandardScaler`` does with zero variance).

        Example:
            >>> x = np.array([[[[0]], [[255]]]], np.uint8)  # one 2x1 image: pixels 0 and 1 after scaling
            >>> dataset_from_arrays("s", x, [0], x, [1]).channel_statistics
            ((0.5,), (0.5,))
        """
        if self.kind == "tokens":
            raise ValueError(f"dataset {self.name!r} holds token ids: they have no mean and std to normalise by")
        channels = self.train_x.shape[-1]
        flat = self.train_x.reshape(-1, channels)
        total = np.zeros(channels)
        squares = np.zeros(channels)
        chunk = max(1, 2 ** 22 // channels)  # float64 copies of a few MB at a time, not of the whole split
        for start in range(0, len(flat), chunk):
            block = flat[start:start + chunk].astype(np.float64)
            total += block.sum(axis=0)
            squares += np.square(block).sum(axis=0)
        count = len(flat)
        mean = total / count
        std = np.sqrt(np.maximum(squares / count - np.square(mean), 0.0))
        if self.train_x.dtype == np.uint8:
            mean, std = mean / 255.0, std / 255.0
        std = np.where(std > 1e-12, std, 1.0)
        return tuple(round(float(v), 6) for v in mean), tuple(round(float(v), 6) for v in std)


def dataset_from_arrays(name: str, x_train, y_train, x_test, y_test, num_classes: int | None = None,
                        groups=None, vocab_size: int | None = None, source: str = "arrays") -> Dataset:
    """Check and normalise user arrays into a read-only :class:`Dataset`.

    - uint8 ``(N, H, W)`` or ``(N, H, W, C)``: image pixels (a channel axis is added to 3-D arrays),
      scaled to [0, 1] on device; other integer 3-D/4-D arrays with values in 0..255 are taken as
      the same pixels;
    - float ``(N, H, W)`` or ``(N, H, W, C)``: images whose values the model sees as they are (no
      division by 255), as float32; float ``(N, D)``: feature vectors;
    - other integer ``(N, L)``: token ids.

    Labels must be integers in ``[0, num_classes)``. ``num_classes`` defaults to the largest label
    + 1; labels of a single class are refused unless ``num_classes`` is given (one logit would make
    every prediction right). Messages name shapes and dtypes, never the values.

    Example:
        >>> import numpy as np
        >>> ds = dataset_from_arrays("toy", np.zeros((4, 2, 2), np.uint8), [0, 1, 0, 1],
        ...                          np.zeros((2, 2, 2), np.uint8), [1, 0])
        >>> ds.input_shape, ds.num_classes
        ((2, 2, 1), 2)
        >>> dataset_from_arrays("f", np.zeros((4, 2, 2)), [0, 1, 0, 1], np.zeros((2, 2, 2)), [1, 0]).kind
        'image'
    """
    arrays, given_dtypes = [], []
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        x, y = _as_array(x, f"x_{split}", source), _as_labels(y, f"y_{split}", source)
        given_dtypes.append(x.dtype)
        if x.ndim < 2:
            raise ValueError(f"{source}: x_{split} has shape {x.shape}, no feature axis: give samples as "
                             "(N, features) or images as (N, H, W) or (N, H, W, C) (one feature per sample: "
                             "(N, 1))")
        if 0 in x.shape[1:]:
            raise ValueError(f"{source}: x_{split} has shape {x.shape}: a sample holds no values (every axis "
                             "after the first must be at least 1)")
        if y.ndim == 2 and len(y) == len(x):
            how = "y.ravel()" if y.shape[1] == 1 else "y.argmax(axis=1), if its rows are one-hot"
            raise ValueError(f"{source}: y_{split} has shape {y.shape}: labels are one class id per sample, "
                             f"shape ({len(x)},): give {how}")
        if len(x) != len(y) or y.ndim != 1:
            raise ValueError(f"{source}: x_{split} {x.shape} and y_{split} {y.shape} must hold the same number "
                             "of samples, labels 1-D")
        if not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"{source}: y_{split} must hold integer labels, got {y.dtype}: {_label_hint(y)}")
        if y.size and y.dtype.itemsize >= 4 and (int(y.min()) < np.iinfo(np.int32).min
                                            or int(y.max()) > np.iinfo(np.int32).max):
            # int32 is what the kernels read: a wider label would wrap to another class, silently
            raise ValueError(f"{source}: labels must lie in [0, num_classes), got y_{split} in "
                             f"[{int(y.min())}, {int(y.max())}]")
        arrays.append((np.ascontiguousarray(_as_samples(x, f"x_{split}", source)), y.astype(np.int32, copy=False)))
    (train_x, train_y), (test_x, test_y) = arrays
    if train_x.dtype != test_x.dtype and np.uint8 in (train_x.dtype, test_x.dtype):
        raise ValueError(f"{source}: x_train is {train_x.dtype} but x_test {test_x.dtype}: give both as uint8 "
                         "pixels or both as floats, so that both are scaled the same way")
    if np.issubdtype(train_x.dtype, np.floating) != np.issubdtype(test_x.dtype, np.floating):
        # integers beside floats: pixels (scaled by 1/255) or token ids on one side, values as
        # they are on the other, so the held-out metrics would score inputs no client trained on
        floats = "x_train" if np.issubdtype(train_x.dtype, np.floating) else "x_test"
        raise ValueError(f"{source}: x_train is {given_dtypes[0]} but x_test {given_dtypes[1]}: give both as "
                         f"floats ({'x_test' if floats == 'x_train' else 'x_train'}.astype(np.float32)) or both as "
                         "integers (pixels or token ids), so that both are read the same way")
    if train_x.shape[1:] != test_x.shape[1:]:
        raise ValueError(f"{source}: train samples have shape {train_x.shape[1:]} but test samples {test_x.shape[1:]}")
    if len(train_y) == 0:
        raise ValueError(f"{source}: the training split is empty")
    largest = int(max(train_y.max(), test_y.max() if len(test_y) else 0))
    if num_classes is None and largest < 1:
        raise ValueError(f"{source}: every label is {largest}, a single class: set num_classes (the number of "
                         "classes the model should tell apart, >= 2)")
    inferred = num_classes is None
    num_classes = largest + 1 if num_classes is None else int(num_classes)
    for split, y in (("train", train_y), ("test", test_y)):
        if len(y) and int(y.min()) < 0:
            raise ValueError(f"{source}: y_{split} holds label {int(y.min())}: labels are class ids 0, 1, ... "
                             f"(a marker such as -1 for unlabelled samples: leave those samples out)")
        if len(y) and int(y.max()) >= num_classes:
            raise ValueError(f"{source}: y_{split} holds label {int(y.max())}, but num_classes={num_classes} allows "
                             f"labels 0..{num_classes - 1}: set num_classes to at least {int(y.max()) + 1}")
    train_counts = np.bincount(train_y, minlength=num_classes)
    test_counts = np.bincount(test_y, minlength=num_classes)
    if inferred and len(test_y) and int(test_y.max()) > int(train_y.max()):
        # a test label above every training label (a typo, or the wrong file) would add classes that
        # no client can learn and that the held-out accuracy counts as always wrong
        unseen = np.unique(test_y[test_y > train_y.max()])
        warn_user(f"{source}: y_test holds label(s) {_listed(unseen)} above y_train's largest, {int(train_y.max())}: "
                  f"counted as {largest + 1} classes (the largest label + 1), no client trains on the "
                  "classes above; set num_classes if that is not what you mean")
    elif inferred and len(test_y) and ((test_counts > 0) & (train_counts == 0)).any():
        unseen = np.flatnonzero((test_counts > 0) & (train_counts == 0))
        warn_user(f"{source}: y_test holds label(s) {_listed(unseen)}, which no training sample has: no client "
                  "trains on them, and the held-out accuracy counts them as always wrong; set num_classes if that "
                  "is what you mean")
    elif inferred and ((train_counts == 0) & (test_counts == 0)).any():
        # ids with gaps ({3, 7, 9}, or 1-based) give the model an output per id up to the largest
        unused = np.flatnonzero((train_counts == 0) & (test_counts == 0))
        used = num_classes - len(unused)
        warn_user(f"{source}: the labels take {used} distinct values, but their largest is {largest}: the model "
                  f"gets {num_classes} outputs (the largest label + 1), and label(s) {_listed(unused)} occur in "
                  f"neither split; {_NUMBERED}")
    if groups is not None:
        groups = _as_array(groups, "client_train", source)
        if groups.shape != train_y.shape or not np.issubdtype(groups.dtype, np.integer):
            raise ValueError(f"{source}: client ids must be one integer per training sample {train_y.shape}, "
                             f"got {groups.shape} {groups.dtype}")
        groups = groups.astype(np.int64, copy=False)
    if train_x.ndim == 2 and np.issubdtype(train_x.dtype, np.integer):  # token ids (int32, or uint8 as given)
        low = int(min(train_x.min(initial=0), test_x.min(initial=0)))
        high = int(max(train_x.max(initial=0), test_x.max(initial=0)))
        if vocab_size is not None and (isinstance(vocab_size, bool) or int(vocab_size) != vocab_size
                                       or vocab_size < 1):
            raise ValueError(f"{source}: vocab_size={vocab_size!r} is not allowed: an integer >= 1")
        allowed = f"[0, {int(vocab_size)})" if vocab_size is not None else "[0, vocab_size)"
        if low < 0 or (vocab_size is not None and high >= vocab_size):
            # an embedding lookup would clip or wrap such an id to another token, silently
            raise ValueError(f"{source}: token ids must lie in {allowed} (0 = padding), got [{low}, {high}]")
        vocab_size = high + 1 if vocab_size is None else int(vocab_size)
    # Read-only views: the caller's own arrays keep their flags.
    train_x, train_y, test_x, test_y, groups = (None if a is None else a.view()
                                                for a in (train_x, train_y, test_x, test_y, groups))
    for arr in (train_x, train_y, test_x, test_y, groups):
        if arr is not None:
            arr.setflags(write=False)
    return Dataset(name, train_x, train_y, test_x, test_y, num_classes, groups, vocab_size)


def _is_client_pair(part) -> bool:
    """Whether ``part`` looks like one client's ``(x, y)``: two parts, samples of at least two axes first."""
    if not isinstance(part, (tuple, list)) or len(part) != 2:
        return False
    try:
        return np.ndim(part[0]) >= 2
    except ValueError:  # ragged
        return False


def _listed(labels, shown: int = 5) -> str:
    """Some labels, as a message names them.

    >>> _listed(np.array([3, 7])), _listed(np.arange(8))
    ('3, 7', '0, 1, 2, 3, 4, ... (8 in all)')
    """
    text = ", ".join(str(int(label)) for label in labels[:shown])
    return text + (f", ... ({len(labels)} in all)" if len(labels) > shown else "")


# one class list for both splits (numbering each split alone gives a class other ids in each)
_NUMBERED = ("classes = np.unique(np.concatenate([y_train, y_test])) numbers the classes 0, 1, ... for both "
             "splits: np.searchsorted(classes, y_train), np.searchsorted(classes, y_test)")


def _label_hint(y: np.ndarray) -> str:
    """How to make class ids of labels of another dtype.

    >>> _label_hint(np.array([0.0, 1.0])), _label_hint(np.array(["cat", "dog"]))[:54] + " ..."
    ('they are whole numbers: y.astype(np.int64)', 'classes = np.unique(np.concatenate([y_train, y_test])) ...')
    """
    if y.dtype == bool:
        return "y.astype(np.int64) makes them classes 0 and 1"
    if np.issubdtype(y.dtype, np.floating) and y.size and np.isfinite(y).all() and (y == np.round(y)).all():
        return "they are whole numbers: y.astype(np.int64)"
    if np.issubdtype(y.dtype, np.floating):
        return "jaxfl trains classifiers, whose labels are class ids 0, 1, ..."
    return _NUMBERED


def _as_labels(value, label: str, source: str) -> np.ndarray:
    """Labels as an array: an empty list is no labels (not float64 ones), and strings or a pandas
    categorical (object arrays) are named with how to number them."""
    if hasattr(value, "cat") and hasattr(value.cat, "codes"):  # a pandas categorical Series
        raise ValueError(f"{source}: {label} is a categorical Series: give its class ids, {label}.cat.codes")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        array = None
    if array is not None and array.size == 0 and array.ndim == 1:
        return array.astype(np.int32)
    if array is not None and array.dtype == object and array.ndim == 1:
        raise ValueError(f"{source}: {label} must hold integer class ids, got objects "
                         f"({type(array[0]).__name__}): {_label_hint(array)}")
    return _as_array(value, label, source)


def _as_array(value, label: str, source: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:  # ragged nested lists and the like
        raise ValueError(f"{source}: {label} is not an array ({type(value).__name__}: {error})") from None
    if array.dtype == object or array.ndim == 0:
        raise ValueError(f"{source}: {label} must be a numeric array, got a {type(value).__name__} of "
                         f"shape {array.shape} and dtype {array.dtype}")
    return array


def _stored_num_classes(value, source: str) -> int:
    """A ``num_classes`` entry stored with the data (an npz array, a mapping's value): one whole number
    >= 2, else a one-line ValueError naming it (``int()`` would truncate 5.7 to 5, silently)."""
    array = np.asarray(value)
    if array.ndim == 0 and array.dtype != bool and (np.issubdtype(array.dtype, np.integer)
                                                    or np.issubdtype(array.dtype, np.floating)):
        number = array.item()
        if np.isfinite(number) and number == int(number) and int(number) >= 2:
            return int(number)
    shown = repr(array.item()) if array.ndim == 0 else f"an array of shape {array.shape}"
    raise ValueError(f"{source}: num_classes={shown} is not allowed: one integer >= 2 (the number of classes "
                     f"the model tells apart)")


def _as_samples(x: np.ndarray, label: str, source: str) -> np.ndarray:
    """Samples in one of the layouts of ``Dataset.kind``, or a one-line ValueError."""
    if x.ndim == 4 and x.shape[1] in (1, 3) and x.shape[3] > 4:
        warn_user(f"{source}: {label} of shape {x.shape} looks channels-first (PyTorch's N, C, H, W): jaxfl reads "
                  f"images as (N, H, W, C), here {x.shape[1]}x{x.shape[2]} images of {x.shape[3]} channels; "
                  f"{label}.transpose(0, 2, 3, 1) gives ({x.shape[0]}, {x.shape[2]}, {x.shape[3]}, {x.shape[1]})")
    if x.dtype.kind == "V" and (x.dtype.name == "bfloat16" or x.dtype.name.startswith("float")):  # ml_dtypes' floats
        x = x.astype(np.float32)  # exact: each is a float32 with fewer mantissa bits
    if np.issubdtype(x.dtype, np.floating):
        if x.ndim > 4:
            raise ValueError(f"{source}: float {label} of shape {x.shape}: expected (N, D) features or "
                             "(N, H, W[, C]) images")
        # in blocks of ~4M values: one mask of the whole array is a gigabyte at 10^6 synthetic clients
        rows = max(1, (1 << 22) // max(1, x[:1].size))
        if not all(np.isfinite(x[start:start + rows]).all() for start in range(0, len(x), rows)):
            bad = np.concatenate([start + np.flatnonzero(~np.isfinite(x[start:start + rows]).reshape(
                len(x[start:start + rows]), -1).all(axis=1)) for start in range(0, len(x), rows)])
            raise ValueError(f"{source}: {label} holds NaN or infinite values, in {len(bad)} of its {len(x)} "
                             f"samples (the first: {label}[{int(bad[0])}]); drop or fill them first")
        if x.dtype.itemsize > 4:
            # a float64 value past float32's range (3.4e38) is finite here and infinite after the cast
            largest = max((float(np.abs(x[start:start + rows]).max(initial=0)) for start in range(0, len(x), rows)),
                          default=0.0)
            if largest > float(np.finfo(np.float32).max):  # a float32 scalar would cast 1e39 to inf first
                raise ValueError(f"{source}: {label} holds {largest:.3g}, beyond float32's range "
                                 f"(|x| <= {float(np.finfo(np.float32).max):.3g}), which the models compute in")
        x = x.astype(np.float32, copy=False)
        return x[..., None] if x.ndim == 3 else x
    if not np.issubdtype(x.dtype, np.integer):
        raise ValueError(f"{source}: {label} dtype {x.dtype} is not uint8 images, float images or features, "
                         "or integer token ids")
    if x.ndim in (3, 4):
        low, high = int(x.min(initial=0)), int(x.max(initial=0))
        if x.dtype != np.uint8:
            if low < 0 or high > 255:
                raise ValueError(f"{source}: integer {label} of shape {x.shape} is read as image pixels and must "
                                 f"lie in 0..255, got {low}..{high} (pass floats to use other values as they are)")
            x = x.astype(np.uint8)
        if high == 1:  # masks: 0 and 1 as pixels are 0 and 1/255, near black both
            warn_user(f"{source}: integer {label} holds only 0 and 1, read as image pixels 0..255 (divided by 255); "
                      f"{label}.astype(np.float32) gives the model the values as they are")
        return x[..., None] if x.ndim == 3 else x
    if x.dtype == np.uint8 and x.ndim == 2:
        return x  # uint8 (N, L): token ids, as before
    if x.ndim != 2:
        raise ValueError(f"{source}: integer {label} of shape {x.shape}: expected (N, L) token ids or "
                         "(N, H, W[, C]) image pixels")
    low, high = int(x.min(initial=0)), int(x.max(initial=0))
    if low < 0 or high > np.iinfo(np.int32).max:  # before the int32 cast, which would wrap them
        raise ValueError(f"{source}: integer {label} of shape {x.shape} is read as token ids and must lie in "
                         f"[0, {np.iinfo(np.int32).max}] (0 = padding), got [{low}, {high}] "
                         "(pass floats for feature vectors)")
    return x.astype(np.int32, copy=False)


DATA_FORMS = ("a jaxfl.data.Dataset, a (train_x, train_y, test_x, test_y) tuple, or a mapping with "
              "train_x, train_y, test_x, test_y (or x_train, y_train, x_test, y_test) and optional "
              "client_train, num_classes")


def as_dataset(data, num_classes: int | None = None, name: str = "user") -> Dataset:
    """Your own data as a checked, read-only :class:`Dataset` (what ``run_experiment(config, data=...)`` takes).

    ``data`` is a :class:`Dataset` (checked again, keeping its name), a ``(train_x, train_y,
    test_x, test_y)`` tuple, or a mapping of those names (``x_train`` etc. as in ``npz`` files and
    Keras; ``np.load`` of an ``.npz`` works) with optional per-sample writer ids ``client_train``
    (or ``train_groups``) and ``num_classes``. Layouts as in :func:`dataset_from_arrays`; an
    explicit ``num_classes`` wins over the data's. Arrays and mappings are named ``name``.

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> ds = as_dataset((rng.random((20, 8, 8)), np.arange(20) % 3, rng.random((5, 8, 8)), np.arange(5) % 3))
        >>> ds.name, ds.kind, ds.input_shape, ds.num_classes
        ('user', 'image', (8, 8, 1), 3)
    """
    source = "data"
    groups = vocab_size = None
    if isinstance(data, Dataset):
        name, source = data.name, f"data (Dataset {data.name!r})"
        arrays = (data.train_x, data.train_y, data.test_x, data.test_y)
        groups, vocab_size = data.train_groups, data.vocab_size
        num_classes = data.num_classes if num_classes is None else num_classes
    elif isinstance(data, Mapping):
        spellings = {"train_x": "x_train", "train_y": "y_train", "test_x": "x_test", "test_y": "y_test",
                     "train_groups": "client_train"}
        keys = set(data.keys())
        unknown = sorted(str(k) for k in keys - set(spellings) - set(spellings.values()) - {"num_classes"})
        missing = [k for k in ("train_x", "train_y", "test_x", "test_y") if k not in keys and spellings[k] not in keys]
        if unknown and not missing and isinstance(data, np.lib.npyio.NpzFile):
            # an archive (np.load) may hold more than jaxfl reads, as dataset 'npz' takes it: said, not refused
            warn_user(f"data: arrays {unknown} of the archive are not read; jaxfl reads x_train, y_train, x_test, "
                      "y_test, and client_train and num_classes where present")
        elif unknown or missing:
            raise ValueError(f"data: a mapping needs train_x, train_y, test_x, test_y (or x_train, ...) and may hold "
                             f"client_train (or train_groups: a client id per training sample) and num_classes; "
                             f"missing {missing}, unknown {unknown}")
        pick = {k: data[k] if k in keys else data.get(spellings[k]) for k in spellings}
        arrays = tuple(pick[k] for k in ("train_x", "train_y", "test_x", "test_y"))
        groups = pick["train_groups"]
        if num_classes is None and "num_classes" in keys:
            num_classes = _stored_num_classes(data["num_classes"], "data")
    elif isinstance(data, (tuple, list)) and len(data) == 2 and all(_is_client_pair(part) for part in data):
        raise TypeError("data= got 2 (x, y) pairs: for Keras' load_data() form ((x_train, y_train), (x_test, "
                        "y_test)), give one tuple (x_train, y_train, x_test, y_test); for two clients' data, a mapping "
                        "with client_train ids and x_test, y_test, run with partition='natural'")
    elif isinstance(data, (tuple, list)) and data and all(_is_client_pair(part) for part in data):
        raise TypeError(f"data= got {len(data)} (x, y) pairs: for one pair per client, give the clients' samples "
                        "joined in a mapping, x_train=np.concatenate(xs), y_train=np.concatenate(ys), client_train="
                        "np.repeat(np.arange(len(xs)), [len(x) for x in xs]), with x_test and y_test, and run with "
                        "partition='natural'")
    elif isinstance(data, (tuple, list)) and len(data) == 4:
        arrays = tuple(data)
    else:
        length = f" of length {len(data)}" if isinstance(data, (tuple, list)) else ""
        raise TypeError(f"data= takes {DATA_FORMS}; got a {type(data).__name__}{length}")
    if num_classes is not None and (isinstance(num_classes, bool) or int(num_classes) != num_classes
                                    or num_classes < 2):
        raise ValueError(f"num_classes={num_classes!r} is not allowed: an integer >= 2")
    if not isinstance(data, Dataset) and isinstance(name, str) and \
            (name in DATASETS or name.startswith(DATASET_PREFIXES) or name.startswith("synthetic")):
        # a run takes a built-in name's defaults (target accuracy, augmentation) and a config naming it
        # loads the built-in data: yours would be trained and judged as that
        raise ValueError(f"name={name!r} is not allowed: it names a built-in dataset, whose defaults (target "
                         f"accuracy, augmentation) a run would take for your data; name it otherwise (e.g. "
                         f"'my_{name.replace(':', '_')}')")
    return dataset_from_arrays(name, *arrays, num_classes=num_classes, groups=groups, vocab_size=vocab_size,
                               source=source)


def load_dataset(name: str, data_dir: str | os.PathLike | None = None, **options) -> Dataset:
    """Load a dataset by name (see the module docstring); arrays are read-only, file sets cached.

    - ``"mnist10k"``: the official MNIST test set shipped inside the package (MD5-checked),
      split into 8,000 train / 2,000 held-out, stratified by class with seed
      ``MNIST10K_SPLIT_SEED``. ``data_dir`` is ignored.
    - ``"fashion_mnist"``: 60,000 / 10,000 IDX files from ``data_dir`` or ``FASHION_MNIST_DIR``.
    - ``"mnist"``: 60,000 / 10,000 IDX files (gzipped or not) from ``data_dir`` (required).
    - ``"digits"``: scikit-learn's 1,797 8x8 digits as uint8 ``(8, 8, 1)`` images (0..16 scaled to
      0..255), 1,437 / 360 stratified with seed ``MNIST10K_SPLIT_SEED``.
    - ``"npz"``, ``"array_record"``, ``"tfds:<name>"``: files in ``data_dir`` (see the module doc);
      ``npz`` takes a ``num_classes`` option (else the file's, else the largest label + 1),
      ``tfds:`` text sets ``max_len`` and ``vocab_size``.
    - ``"synthetic"`` (alpha = beta = 1), ``"synthetic:A,B"``, ``"synthetic_iid"`` (and with
      ``+parallel``: ``"synthetic:iid+parallel"``, ``"synthetic:A,B+parallel"``): options
      ``num_clients`` (required) and those of :func:`jaxfl.data.synthetic.load_synthetic`.

    Example:
        >>> ds = load_dataset("mnist10k")
        >>> ds.num_classes, ds.train_y.dtype
        (10, dtype('int32'))
        >>> int(load_dataset("synthetic:0.5,0.5", num_clients=3).train_groups.max())
        2
    """
    if not isinstance(name, str) or not (name in DATASETS or name.startswith(DATASET_PREFIXES)):
        raise ValueError(f"unknown dataset {name!r}; expected one of {DATASETS} or a name starting with "
                         f"{' / '.join(DATASET_PREFIXES)} (e.g. 'tfds:cifar10', 'synthetic:0.5,0.5')")
    if name.startswith("synthetic"):
        from jaxfl.data.synthetic import load_synthetic, parse_synthetic_name

        return load_synthetic(**parse_synthetic_name(name), **options)
    if name.startswith("tfds:") or name == "array_record":
        from jaxfl.data.tfds_source import load_array_record, load_tfds

        if name == "array_record":
            if data_dir is None:
                raise ValueError("dataset 'array_record' needs data_dir: the TFDS dataset version folder "
                                 "(holding dataset_info.json and *.array_record-* files)")
            return load_array_record(_absolute(data_dir), **options)
        return load_tfds(name[len("tfds:"):], None if data_dir is None else _absolute(data_dir), **options)
    if name == "npz":
        if data_dir is None:
            raise ValueError("dataset 'npz' needs data_dir: a .npz file (or a folder holding exactly one) with "
                             "arrays x_train, y_train, x_test, y_test [, client_train, num_classes]")
        unknown = sorted(set(options) - {"num_classes"})
        if unknown:
            raise ValueError(f"dataset 'npz' takes only the option num_classes, got {unknown}")
        return _load_npz(_absolute(data_dir), options.get("num_classes"))
    if options:
        raise ValueError(f"dataset {name!r} takes no options, got {sorted(options)}")
    if name == "mnist10k":
        return _load_cached(name, None)
    if name == "digits":
        return _load_digits()
    if name == "mnist" and data_dir is None:
        raise ValueError(
            "dataset 'mnist' needs data_dir: a folder holding train-images-idx3-ubyte[.gz], "
            "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz] "
            "(or use 'mnist10k', which ships inside the package)"
        )
    folder = FASHION_MNIST_DIR if data_dir is None else data_dir
    return _load_cached(name, _absolute(folder))


def _absolute(path) -> str:
    # Resolve before caching so "./x" and "/abs/x" share one entry.
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


# path -> ((mtime_ns, size, inode, num_classes), Dataset, its notes: message and category), of the last file read only: a
# rewritten file is read again, and a loop over many files (a notebook's generated data sets) holds one of
# them, not all (157 MB after ten of 20,000 images each, when every file stayed). A sweep's cells share
# the file, and each is told its notes (a comparison's check read it first, its notes muted).
_NPZ_CACHE: dict[str, tuple[tuple, Dataset, list[tuple[str, type[Warning]]]]] = {}


# The arrays of a dataset 'npz' archive: the four splits, then the optional ones.
NPZ_ARRAYS = ("x_train", "y_train", "x_test", "y_test", "client_train", "num_classes")


def _npz_file(path: str) -> str:
    """The .npz file ``path`` names: itself, or the one such file of a folder."""
    if os.path.isdir(path):
        found = sorted(f for f in os.listdir(path) if f.endswith(".npz"))
        if len(found) != 1:
            raise FileNotFoundError(f"dataset 'npz': {path} holds {len(found)} .npz files ({found[:5]}); "
                                    "pass the file itself as data_dir")
        path = os.path.join(path, found[0])
    if not os.path.isfile(path):
        raise FileNotFoundError(f"dataset 'npz': no file at {path}")
    return path


def npz_num_classes(data_dir: str | os.PathLike) -> int | None:
    """The ``num_classes`` a dataset ``npz`` file holds (None if it holds none); the file read as
    :func:`load_dataset` reads it, which has taken a ``num_classes`` given over it.

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "d.npz")
        >>> np.savez(path, x_train=np.zeros((4, 2)), y_train=np.arange(4) % 2, x_test=np.zeros((2, 2)),
        ...          y_test=np.arange(2), num_classes=3)
        >>> npz_num_classes(path)
        3
    """
    path = _npz_file(_absolute(data_dir))
    with np.load(path, allow_pickle=False) as archive:
        return _stored_num_classes(archive["num_classes"], path) if "num_classes" in archive.files else None


def _load_npz(path: str, num_classes: int | None = None) -> Dataset:
    path = _npz_file(path)
    stat = os.stat(path)
    stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino, num_classes)
    cached = _NPZ_CACHE.get(path)
    if cached is not None and cached[0] == stamp:
        _say_again(cached[2])
        return cached[1]
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:  # not an archive: numpy guesses pickle, or a bad zip
        raise ValueError(f"dataset 'npz': {path} is not a .npz archive of numeric arrays (np.savez writes one; "
                         f"numpy read it as {'a pickle' if 'pickle' in str(error) else repr(str(error))})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):  # a single .npy array
        raise ValueError(f"dataset 'npz': {path} holds one {type(archive).__name__} of shape "
                         f"{getattr(archive, 'shape', '?')}, not a .npz archive with arrays x_train, y_train, "
                         "x_test, y_test (np.savez(path, x_train=..., ...) writes one)")
    with archive:
        missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in archive.files]
        if missing:
            raise ValueError(f"{path}: missing arrays {missing}; found {archive.files}")
        unread = [k for k in archive.files if k not in NPZ_ARRAYS]
        try:
            arrays = {k: archive[k] for k in archive.files if k in NPZ_ARRAYS}
        except ValueError as error:  # object arrays (ragged lists) need pickle, which is never enabled
            raise ValueError(f"dataset 'npz': {path} holds an object array, which needs pickle: store numeric "
                             f"arrays of one shape each ({error})") from None
        except (zipfile.BadZipFile, zlib.error, EOFError) as error:  # a member's bytes damaged or cut short
            raise ValueError(f"dataset 'npz': {path} is damaged: numpy could not read its arrays ({error}); "
                             "write it again (np.savez)") from None
    # What reading the file says (arrays not read, channels-first images, labels only in the test set) is
    # kept with it and said to every caller: the jaxfl command's first read, its configs' check, had its
    # notes muted, and the run's read, from the cache, said nothing
    said = []
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            if unread:  # a misspelt client_train would silently lose the writers' split
                warn_user(f"{path}: arrays {unread} are not read; jaxfl reads {list(NPZ_ARRAYS[:4])}, and "
                          "client_train (each training sample's client, for partition 'natural') and num_classes "
                          "where present")
            if num_classes is None and "num_classes" in arrays:
                num_classes = _stored_num_classes(arrays["num_classes"], path)
            dataset = dataset_from_arrays(os.path.basename(path), arrays["x_train"], arrays["y_train"],
                                          arrays["x_test"], arrays["y_test"], num_classes=num_classes,
                                          groups=arrays.get("client_train"), source=path)
    finally:  # said also before the file's error, which a misspelt array's note may explain
        notes = [(str(note.message), note.category) for note in said]
        _say_again(notes)
    _NPZ_CACHE.clear()
    _NPZ_CACHE[path] = (stamp, dataset, notes)
    return dataset


def _say_again(notes: list[tuple[str, type[Warning]]]) -> None:
    for message, category in notes:
        warn_user(message, category)


@functools.lru_cache(maxsize=None)
def _load_digits() -> Dataset:
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError("dataset 'digits' needs scikit-learn: pip install jaxfl[sklearn]") from error
    bunch = load_digits()
    # 0..16 intensities to the uint8 pixel range, so every image dataset shares one preprocessing.
    x = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    y = bunch.target.astype(np.int32)
    is_test = _stratified_mask(y, DIGITS_NUM_TEST, MNIST10K_SPLIT_SEED)
    return dataset_from_arrays("digits", x[~is_test], y[~is_test], x[is_test], y[is_test], num_classes=10,
                               source="sklearn.datasets.load_digits")


def _stratified_mask(y: np.ndarray, num_test: int, seed: int) -> np.ndarray:
    """Boolean held-out mask with ``num_test`` entries, proportional per class, drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    num_classes = int(y.max()) + 1
    test_counts = _stratified_test_counts(np.bincount(y, minlength=num_classes), num_test)
    is_test = np.zeros(len(y), dtype=bool)
    for c in range(num_classes):
        members = np.flatnonzero(y == c)
        is_test[rng.choice(members, size=test_counts[c], replace=False)] = True
    return is_test


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
    install = " (or `apt-get install dataset-fashion-mnist` and no data_dir)" if name == "fashion_mnist" else ""
    if not os.path.isdir(folder) and folder != FASHION_MNIST_DIR:  # a file, or nothing: not the IDX names
        raise FileNotFoundError(f"dataset {name!r}: data_dir {folder} is not a folder ("
                                f"{'a file' if os.path.exists(folder) else 'no such path'}); pass the folder "
                                f"holding its train-images-idx3-ubyte[.gz] and the other three IDX files{install}")
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
            "pass data_dir (--data-dir) naming a folder of the four Fashion-MNIST IDX files (the release's "
            "train-images-idx3-ubyte.gz and the other three), or on Debian or Ubuntu `apt-get install "
            "dataset-fashion-mnist`"
            if name == "fashion_mnist" and folder == FASHION_MNIST_DIR
            else f"pass data_dir pointing at the {'Fashion-MNIST' if name == 'fashion_mnist' else 'MNIST'} IDX "
                 f"files{install}"
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
    is_test = _stratified_mask(y, MNIST10K_NUM_TEST, MNIST10K_SPLIT_SEED)
    # Boolean masks keep the file order within each side, so the split is easy to audit.
    return Dataset("mnist10k", x[~is_test], y[~is_test], x[is_test], y[is_test], num_classes=10)
