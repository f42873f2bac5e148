"""TFDS data through ``tfds.data_source``: array_record files read without TensorFlow.

``tensorflow_datasets`` is an optional dependency (``pip install jaxfl[tfds]``), imported only
inside these loaders so ``import jaxfl`` never pulls it (or TensorFlow) in. Nothing is
downloaded: prepare a set once where there is a network (``tfds build cifar10 --file_format
array_record`` or ``tfds.builder(name, file_format="array_record").download_and_prepare()``) and
point ``data_dir`` at the folder.

Which features: the builder's ``supervised_keys`` (e.g. ``("image", "label")``), else ``image``
or ``text`` plus ``label``. Images become uint8 ``(N, H, W, C)``; texts are tokenised with
:mod:`jaxfl.data.text` (vocabulary from the training split). Held out: the ``test`` split, else
``validation``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

import numpy as np

from jaxfl.data.datasets import Dataset, dataset_from_arrays
from jaxfl.data.text import build_vocab, encode_texts

__all__ = ["load_tfds", "load_array_record", "TEXT_MAX_LEN", "TEXT_VOCAB_SIZE"]

TEXT_MAX_LEN = 256  # words kept per text
TEXT_VOCAB_SIZE = 20_000  # ids, padding and unknown included
_READ_CHUNK = 4096
_HELD_OUT_SPLITS = ("test", "validation")


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:
        raise ImportError("TFDS datasets need tensorflow-datasets (no TensorFlow required): "
                          "pip install jaxfl[tfds]") from error
    return tfds


def _read_all(source) -> list[dict]:
    """Every record of a data source, read in chunks (``__getitems__`` batches the file reads)."""
    records: list[dict] = []
    batched = hasattr(source, "__getitems__")
    for start in range(0, len(source), _READ_CHUNK):
        keys = list(range(start, min(start + _READ_CHUNK, len(source))))
        if batched:
            try:
                records.extend(source.__getitems__(keys))
                continue
            except TypeError:  # tfds.testing.mock_data's source has no batched read
                batched = False
        records.extend(source[k] for k in keys)
    return records


def _feature_keys(info) -> tuple[str, str]:
    features = info.features
    if info.supervised_keys and len(info.supervised_keys) == 2 and all(isinstance(k, str)
                                                                       for k in info.supervised_keys):
        return tuple(info.supervised_keys)
    for key in ("image", "text"):
        if key in features and "label" in features:
            return key, "label"
    raise ValueError(f"TFDS dataset {info.full_name!r}: no (image|text, label) pair among features "
                     f"{list(features.keys())}; jaxfl reads classification sets only")


def _to_dataset(name: str, info, train, test, max_len: int, vocab_size: int) -> Dataset:
    x_key, y_key = _feature_keys(info)
    train_records, test_records = _read_all(train), _read_all(test)
    if not train_records:
        raise ValueError(f"TFDS dataset {name!r}: the train split is empty")
    num_classes = getattr(info.features[y_key], "num_classes", None)
    y_train = np.array([r[y_key] for r in train_records], np.int64)
    y_test = np.array([r[y_key] for r in test_records], np.int64)
    first = train_records[0][x_key]
    if isinstance(first, (bytes, str)) or (isinstance(first, np.ndarray) and first.dtype.kind in "SUO"):
        vocab = build_vocab((r[x_key] for r in train_records), vocab_size)
        x_train = encode_texts([r[x_key] for r in train_records], vocab, max_len)
        x_test = encode_texts([r[x_key] for r in test_records], vocab, max_len)
        return dataset_from_arrays(name, x_train, y_train, x_test, y_test, num_classes=num_classes,
                                   vocab_size=vocab_size, source=name)
    x_train = np.stack([np.asarray(r[x_key]) for r in train_records])
    x_test = np.stack([np.asarray(r[x_key]) for r in test_records]) if test_records else \
        np.zeros((0,) + x_train.shape[1:], x_train.dtype)
    if x_train.dtype != np.uint8 or x_train.ndim not in (3, 4):
        raise ValueError(f"TFDS dataset {name!r}: feature {x_key!r} is {x_train.dtype} {x_train.shape[1:]}; "
                         "expected uint8 images or text")
    return dataset_from_arrays(name, x_train, y_train, x_test, y_test, num_classes=num_classes, source=name)


def _held_out_source(open_split, name: str):
    errors = []
    for split in _HELD_OUT_SPLITS:
        try:
            return open_split(split)
        except Exception as error:  # TFDS raises several types for a missing split
            errors.append(f"{split}: {error}")
    raise ValueError(f"TFDS dataset {name!r} has no held-out split ({' / '.join(_HELD_OUT_SPLITS)}): "
                     + "; ".join(errors))


def _default_data_dirs(tfds) -> list[str]:
    """The folders TFDS looks in when no data_dir is given: its default (``TFDS_DATA_DIR``, else
    ``~/tensorflow_datasets``) and any registered with ``tfds.core.add_data_dir``."""
    try:
        from tensorflow_datasets.core.utils import file_utils

        return [os.fspath(path) for path in file_utils.list_data_dirs()]
    except Exception:  # another TFDS version: its documented default
        return [os.path.expanduser(os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets"))]


def _shown(path: str) -> str:
    """``path`` with the home folder written ``~``, as TFDS's documentation names its default.

    >>> _shown(os.path.join(os.path.expanduser("~"), "tensorflow_datasets"))
    '~/tensorflow_datasets'
    """
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if home not in ("", "~") and (path + os.sep).startswith(home + os.sep) else path


def _not_in_default_data_dir(tfds, name: str) -> str | None:
    """Why ``name`` is not prepared where TFDS looks without a data_dir, in the words an explicit
    data_dir gets (the folder does not exist, or holds no ``name`` folder); None if a folder is there
    (TFDS's own error then says what else is wrong).

    >>> import tensorflow_datasets as tfds  # doctest: +SKIP
    >>> _not_in_default_data_dir(tfds, "cifar10")  # doctest: +SKIP
    "TFDS's default data_dir ~/tensorflow_datasets does not exist"
    """
    folders = _default_data_dirs(tfds)
    if any(os.path.isdir(os.path.join(folder, *name.split("/"))) for folder in folders):
        return None
    where = (f"TFDS's default data_dir {_shown(folders[0])}" if len(folders) == 1 else
             f"TFDS's data_dirs {', '.join(_shown(folder) for folder in folders)}")
    if not any(os.path.isdir(folder) for folder in folders):
        return f"{where} {'does' if len(folders) == 1 else 'do'} not exist"
    return f"no folder {name} in {where} (TFDS keeps it in data_dir/{name}/VERSION)"


@contextlib.contextmanager
def _absl_held_unless_it_fails():
    """Hold what TFDS logs through absl (``WARNING:absl:Variant folder ... has no dataset_info.json``)
    while a split opens: dropped if the open fails, since the error then says what is missing in one
    line, and passed on as logged if it succeeds.

    >>> with _absl_held_unless_it_fails():
    ...     logging.getLogger("absl").warning("passed on after the block")
    """
    logger = logging.getLogger("absl")
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        held.append(record)
        return False

    logger.addFilter(hold)
    try:
        yield
    finally:
        logger.removeFilter(hold)
    for record in held:  # reached only when the block succeeded
        logger.handle(record)


@functools.lru_cache(maxsize=8)
def load_tfds(name: str, data_dir: str | None = None, max_len: int = TEXT_MAX_LEN,
              vocab_size: int = TEXT_VOCAB_SIZE) -> Dataset:
    """Load TFDS set ``name`` (``"cifar10"``, ``"emnist/balanced"``, ``"imdb_reviews"``) from ``data_dir``.

    Example:
        >>> import tensorflow_datasets as tfds  # doctest: +SKIP
        >>> with tfds.testing.mock_data(num_examples=20):  # doctest: +SKIP
        ...     ds = load_tfds("cifar10")
        >>> ds.input_shape, ds.name  # doctest: +SKIP
        ((32, 32, 3), 'tfds:cifar10')
    """
    tfds = _import_tfds()
    if not name:
        raise ValueError("empty TFDS name; use e.g. 'tfds:cifar10'")

    def open_split(split):
        return tfds.data_source(name, split=split, data_dir=data_dir, download=False)

    hint = (f"jaxfl never downloads: run `tfds build {name.split('/')[0]} --file_format array_record` where there "
            "is a network and pass its folder as data_dir")
    if data_dir is not None:
        # TFDS keeps NAME[/CONFIG] in data_dir/NAME[/CONFIG]/VERSION; without that folder its own message
        # talks of a dataset "already prepared ... in the TFRECORD format" that is not there
        folder = os.path.join(data_dir, *name.split("/"))
        if not os.path.isdir(data_dir):
            what = "is not a folder" if os.path.exists(data_dir) else "does not exist"
            raise FileNotFoundError(f"TFDS dataset {name!r} is not prepared: data_dir {data_dir} {what}; {hint}")
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"TFDS dataset {name!r} is not prepared in {data_dir}: no folder {folder} "
                                    f"(TFDS keeps it in data_dir/{name}/VERSION); {hint}")
    try:
        with _absl_held_unless_it_fails():
            train = open_split("train")
    except Exception as error:
        missing = None if data_dir is not None else _not_in_default_data_dir(tfds, name)
        if missing:  # as an explicit data_dir's: not TFDS's "splits is empty" and an absl warning
            raise FileNotFoundError(f"TFDS dataset {name!r} is not prepared: {missing}; {hint}") from error
        where = data_dir or "TFDS's default data_dir (~/tensorflow_datasets)"
        said = " ".join(f"{type(error).__name__}: {error}".split())  # one line: TFDS's messages span several
        raise FileNotFoundError(f"TFDS dataset {name!r} is not prepared in {where} ({said}); {hint}") from error
    test = _held_out_source(open_split, name)
    return _to_dataset(f"tfds:{name}", train.dataset_info, train, test, max_len, vocab_size)


@functools.lru_cache(maxsize=8)
def load_array_record(folder: str, max_len: int = TEXT_MAX_LEN, vocab_size: int = TEXT_VOCAB_SIZE) -> Dataset:
    """Load a dataset folder written by TFDS in array_record format (the version folder).

    Example:
        >>> ds = load_array_record("/data/tensorflow_datasets/cifar10/3.0.2")  # doctest: +SKIP
        >>> ds.train_x.shape  # doctest: +SKIP
        (50000, 32, 32, 3)
    """
    tfds = _import_tfds()
    if not os.path.isfile(os.path.join(folder, "dataset_info.json")):
        raise FileNotFoundError(f"dataset 'array_record': {folder} holds no dataset_info.json; pass the TFDS "
                                "version folder, e.g. ~/tensorflow_datasets/cifar10/3.0.2")
    builder = tfds.builder_from_directory(folder)
    if "array_record" not in str(builder.info.file_format).lower():
        raise ValueError(f"dataset 'array_record': {folder} is stored as {builder.info.file_format}, which needs "
                         "TensorFlow to read; rebuild it with file_format='array_record'")

    def open_split(split):
        if split not in builder.info.splits:
            raise KeyError(f"no split {split!r} (has {list(builder.info.splits)})")
        return builder.as_data_source(split=split)

    name = f"array_record:{builder.info.name}"
    return _to_dataset(name, builder.info, open_split("train"), _held_out_source(open_split, name), max_len,
                       vocab_size)
