"""Bring-your-own data and models: bad inputs refused before any work, nothing silently changed."""

from __future__ import annotations

import numpy as np
import pytest

from jaxfl.data import Dataset, as_dataset


def _features(n):
    return np.random.default_rng(0).random((n, 5)).astype(np.float32)


def test_labels_beyond_int32_are_refused_not_wrapped():
    # int64 labels 2**32 + k used to become k after the int32 cast: another class, silently
    y = np.arange(20, dtype=np.int64) % 2 + 2**32
    with pytest.raises(ValueError, match=r"labels must lie in \[0, num_classes\), got y_train in \[4294967296"):
        as_dataset((_features(20), y, _features(4), np.arange(4) % 2))
    with pytest.raises(ValueError, match="y_test"):
        as_dataset((_features(20), np.arange(20) % 2, _features(4), np.arange(4, dtype=np.uint64) + 2**63))
