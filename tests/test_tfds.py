"""TFDS through tfds.data_source without TensorFlow: tfds.testing.mock_data for named sets, and
array_record folders built locally by a tiny TFDS builder (nothing is downloaded)."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets", reason="pip install jaxfl[tfds] (or .[dev]) for the TFDS tests")

from jaxfl.data import build_federation, load_dataset  # noqa: E402
from jaxfl.data.tfds_source import load_array_record, load_tfds  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_cache():
    # Loaders cache by name; a mocked set must never be served to another test.
    load_tfds.cache_clear()
    load_array_record.cache_clear()
    yield
    load_tfds.cache_clear()
    load_array_record.cache_clear()


@pytest.mark.parametrize("name, shape, classes", [("cifar10", (32, 32, 3), 10), ("mnist", (28, 28, 1), 10),
                                                  ("emnist/balanced", (28, 28, 1), 47),
                                                  ("fashion_mnist", (28, 28, 1), 10)])
def test_mocked_image_sets(name, shape, classes):
    with tfds.testing.mock_data(num_examples=30):
        ds = load_dataset(f"tfds:{name}")
    assert ds.name == f"tfds:{name}" and ds.kind == "image"
    assert ds.train_x.shape == (30,) + shape and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (30,) + shape and ds.num_classes == classes
    assert ds.train_y.dtype == np.int32 and ds.train_y.max() < classes
    fd = build_federation(ds, 3, "iid")
    assert fd.counts.sum() == 30


def test_mocked_text_set_is_tokenised():
    with tfds.testing.mock_data(num_examples=12):
        ds = load_dataset("tfds:imdb_reviews", max_len=16, vocab_size=40)
    assert ds.kind == "tokens" and ds.input_shape == (16,) and ds.vocab_size == 40
    assert ds.train_x.dtype == np.int32 and 0 <= ds.train_x.min() and ds.train_x.max() < 40
    assert ds.num_classes == 2


def _png(array: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array).save(buffer, format="PNG")
    return buffer.getvalue()


def _build_tiny(data_dir, png: bool):
    """A 3-class image set written by TFDS itself as array_record (PNG-encoded like real MNIST/CIFAR)."""
    channels = 1 if png else 3
    image = tfds.features.Image(shape=(8, 8, 1)) if png else tfds.features.Tensor(shape=(8, 8, 3), dtype=np.uint8)

    # Unregistered, so the test can build it more than once; readers find it from its files.
    class TinyDigits(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")
        name = "tiny_digits_png" if png else "tiny_digits_tensor"

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, supervised_keys=("image", "label"),
                                         features=tfds.features.FeaturesDict(
                                             {"image": image, "label": tfds.features.ClassLabel(num_classes=3)}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(24, 0), "test": self._generate_examples(6, 1)}

        def _generate_examples(self, count, seed):
            rng = np.random.default_rng(seed)
            for i in range(count):
                pixels = np.full((8, 8, channels), 40 * (i % 3), np.uint8) + rng.integers(0, 9, (8, 8, channels),
                                                                                           dtype=np.uint8)
                yield i, {"image": _png(pixels) if png else pixels, "label": i % 3}

    builder = TinyDigits(data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare()
    return builder


@pytest.mark.parametrize("png", [True, False])
def test_local_array_record_folder(tmp_path, png):
    builder = _build_tiny(tmp_path, png)
    ds = load_dataset("array_record", data_dir=builder.data_dir)
    channels = 1 if png else 3
    assert ds.train_x.shape == (24, 8, 8, channels) and ds.test_x.shape == (6, 8, 8, channels)
    assert ds.num_classes == 3 and sorted(np.bincount(ds.train_y).tolist()) == [8, 8, 8]
    # Pixels survive the round trip: class k images sit around 40 k.
    means = [ds.train_x[ds.train_y == k].mean() for k in range(3)]
    assert means[0] < means[1] < means[2]
    # The same folder by TFDS name and data_dir.
    by_name = load_dataset(f"tfds:{builder.name}", data_dir=tmp_path)
    np.testing.assert_array_equal(np.sort(by_name.train_y), np.sort(ds.train_y))


def test_array_record_read_without_tensorflow(tmp_path):
    builder = _build_tiny(tmp_path, png=True)
    code = ("import sys; from jaxfl.data import load_dataset; "
            f"ds = load_dataset('array_record', data_dir={str(builder.data_dir)!r}); "
            "assert ds.train_x.shape == (24, 8, 8, 1); "
            "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_missing_sets_and_folders_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"(?s)not prepared in .*never downloads.*tfds build cifar10"):
        load_dataset("tfds:cifar10", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="no dataset_info.json"):
        load_dataset("array_record", data_dir=tmp_path)
    with pytest.raises(ValueError, match="needs data_dir"):
        load_dataset("array_record")


def test_without_tfds_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r"pip install jaxfl\[tfds\]"):
        load_dataset("tfds:cifar10")
