"""Federated storage: every client's samples stored once, flat, grouped by client.

Memory is the selected samples' bytes plus 16 bytes per client (``nbytes``): a 10^4-client
Dirichlet split of Fashion-MNIST holds 47.44 MB for 47.28 MB of images and labels (+0.3%), and
10^5 synthetic clients cost 1.6 MB of offsets/counts on top of their samples
(``tests/test_storage.py``).

A Dirichlet split can give one client 5 samples and another 5,000; padding every client to the
largest would multiply memory by up to ``C * max_count / N``. Instead the samples of client 0,
then client 1, ... sit in one ``(N, H, W, C)`` array, and ``offsets``/``counts`` say where each
client's block is. Kernels draw a client's batch indices as ``offset + randint(count)``.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxfl.data.datasets import Dataset
from jaxfl.data.partition import FlatPartition, make_partition

__all__ = ["FederatedData", "build_federation", "PARTITION_STREAM"]

# Second word of the SeedSequence used for partitioning: each purpose (partition, speeds,
# scheduler, training keys) owns one stream of the run seed, so adding a random draw
# elsewhere never changes which samples a client holds.
PARTITION_STREAM = 1


@dataclasses.dataclass(frozen=True)
class FederatedData:
    """All clients' samples, stored once and grouped by client (arrays are read-only).

    Example:
        >>> import numpy as np
        >>> x = np.arange(5, dtype=np.uint8).reshape(5, 1, 1, 1)
        >>> y = np.array([0, 1, 0, 1, 1], np.int32)
        >>> fd = FederatedData.from_partition(x, y, [np.array([4, 1]), np.array([0, 2, 3])], num_classes=2)
        >>> fd.counts.tolist(), fd.offsets.tolist(), fd.client(0)[1].tolist()
        ([2, 3], [0, 2], [1, 1])
    """

    x: np.ndarray  # (N, H, W, C) uint8, client 0's block, then client 1's, ...
    y: np.ndarray  # (N,) int32
    offsets: np.ndarray  # (C,) int64 start of each client's block
    counts: np.ndarray  # (C,) int64 samples per client
    num_classes: int

    def __post_init__(self):
        # Direct construction must keep the same invariants as from_partition, since kernels
        # index x with offsets/counts without bounds checks on device.
        counts, offsets = np.asarray(self.counts), np.asarray(self.offsets)
        if counts.ndim != 1 or offsets.shape != counts.shape or counts.size == 0:
            raise ValueError(f"offsets {offsets.shape} and counts {counts.shape} must be equal non-empty (C,) arrays")
        empty = np.flatnonzero(counts < 1)
        if empty.size:
            raise ValueError(f"client {int(empty[0])} has {int(counts[empty[0]])} samples; each client needs >= 1 sample")
        expected_offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        if not np.array_equal(offsets, expected_offsets):
            raise ValueError("offsets must be the exclusive cumulative sum of counts (blocks contiguous, in client order)")
        if len(self.x) != len(self.y) or len(self.y) != int(counts.sum()):
            raise ValueError(f"x has {len(self.x)} and y {len(self.y)} samples but counts sum to {int(counts.sum())}")

    @classmethod
    def from_partition(
        cls,
        x: np.ndarray,
        y: np.ndarray,
        client_indices: FlatPartition | Sequence[np.ndarray],
        num_classes: int,
    ) -> "FederatedData":
        """Gather ``x[client_indices[i]]`` for each client into one flat, client-grouped copy.

        ``client_indices`` is a :class:`~jaxfl.data.partition.FlatPartition` (what partitioners
        return: one gather, no per-client work) or any sequence of index arrays. Indices may
        repeat across clients (overlapping samplers); each listed sample is copied. When the
        partition is the identity (every sample, in order, as a grouped natural split is) and
        ``x``/``y`` are read-only (a :class:`~jaxfl.data.datasets.Dataset`'s arrays), they are
        shared instead of copied: at 10^6 clients the copy would double the memory.

        Example:
            >>> import numpy as np
            >>> x = np.zeros((4, 2, 2, 1), np.uint8); y = np.array([0, 1, 2, 3], np.int32)
            >>> fd = FederatedData.from_partition(x, y, [np.array([0, 1]), np.array([2, 3])], 4)
            >>> fd.num_clients, fd.x.shape
            (2, (4, 2, 2, 1))
        """
        x, y = np.asarray(x), np.asarray(y)
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
        if len(client_indices) == 0:
            raise ValueError("client_indices is empty; need at least one client")
        part = FlatPartition.from_parts(client_indices)
        counts, flat = part.counts, part.indices
        empty = np.flatnonzero(counts == 0)
        if empty.size:
            raise ValueError(f"client {int(empty[0])} has 0 samples; each client needs >= 1 sample")
        low, high = int(flat.min()), int(flat.max())
        if low < 0 or high >= len(x):
            raise ValueError(f"client indices must lie in [0, {len(x)}), got range [{low}, {high}]")
        identity = len(flat) == len(x) and low == 0 and bool(np.all(np.diff(flat) == 1))
        if identity and not x.flags.writeable and not y.flags.writeable and y.dtype == np.int32:
            fx, fy = x.view(), y.view()
        else:
            fx, fy = x[flat], y[flat].astype(np.int32)
        for arr in (fx, fy):
            arr.setflags(write=False)
        return cls(fx, fy, part.offsets, counts, int(num_classes))  # the partition's arrays are read-only

    @property
    def num_clients(self) -> int:
        """Number of clients ``C``.

        Example:
            >>> build_federation(load_dataset("mnist10k"), 4).num_clients  # doctest: +SKIP
            4
        """
        return int(len(self.counts))

    @property
    def max_count(self) -> int:
        """Samples held by the largest client.

        Example:
            >>> build_federation(load_dataset("mnist10k"), 3).max_count  # doctest: +SKIP
            2667
        """
        return int(self.counts.max())

    @property
    def nbytes(self) -> int:
        """Bytes held: samples, labels, offsets and counts (no per-client padding).

        Example:
            >>> fd.nbytes - fd.x.nbytes - fd.y.nbytes == 16 * fd.num_clients  # doctest: +SKIP
            True
        """
        return int(self.x.nbytes + self.y.nbytes + self.offsets.nbytes + self.counts.nbytes)

    def client(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Views ``(x_i, y_i)`` of client ``i``'s block (no copy).

        Example:
            >>> xi, yi = fd.client(0)  # doctest: +SKIP
            >>> len(yi) == fd.counts[0]  # doctest: +SKIP
            True
        """
        if not -self.num_clients <= i < self.num_clients:
            raise IndexError(f"client {i} out of range for {self.num_clients} clients")
        i = i % self.num_clients
        start, stop = int(self.offsets[i]), int(self.offsets[i] + self.counts[i])
        return self.x[start:stop], self.y[start:stop]

    def class_histogram(self) -> np.ndarray:
        """``(C, num_classes)`` int64 counts of each label per client.

        Example:
            >>> fd.class_histogram().sum() == len(fd.y)  # doctest: +SKIP
            True
        """
        if self.y.size and (int(self.y.min()) < 0 or int(self.y.max()) >= self.num_classes):
            raise ValueError(f"labels must lie in [0, {self.num_classes}), "
                             f"got [{int(self.y.min())}, {int(self.y.max())}]")
        client_of = np.repeat(np.arange(self.num_clients, dtype=np.int64), self.counts)
        # One bincount over (client, label) cells: O(N + C K), no scatter-add per sample.
        cells = np.bincount(client_of * self.num_classes + self.y, minlength=self.num_clients * self.num_classes)
        return cells.reshape(self.num_clients, self.num_classes)

    def weights(self, kind: str = "samples") -> np.ndarray:
        """``(C,)`` float64 aggregation weights summing to 1: ``n_i / N`` (``"samples"``) or ``1/C`` (``"uniform"``).

        Example:
            >>> fd.weights("uniform")  # doctest: +SKIP
            array([0.5, 0.5])
        """
        if kind == "samples":
            return self.counts.astype(np.float64) / float(self.counts.sum())
        if kind == "uniform":
            return np.full(self.num_clients, 1.0 / self.num_clients)
        raise ValueError(f"unknown weights kind {kind!r}; expected 'samples' or 'uniform'")


def build_federation(
    dataset: Dataset,
    num_clients: int,
    partition: str = "iid",
    seed: int = 0,
    **partition_kwargs,
) -> FederatedData:
    """Partition ``dataset``'s training set over clients and store it flat.

    The partition draws from ``SeedSequence([seed, PARTITION_STREAM])`` only. ``"natural"`` reads
    the dataset's per-sample client ids (``dataset.train_groups``).

    Every client must hold >= 1 sample (kernels draw ``offset + randint(count)``). More clients
    than samples is refused by the partitioner before it draws anything; ``class`` and
    ``dual_dirichlet`` (and ``dirichlet`` with ``min_samples=0``) can leave a client empty by
    chance, which is refused here, after the split and before any sample is copied. The build
    is O(samples + clients) numpy work with no per-client Python object, so 10^6 clients cost
    a few flat arrays (``tests/test_data_scale.py``).

    Example:
        >>> from jaxfl.data import load_dataset
        >>> fd = build_federation(load_dataset("mnist10k"), 10, "dirichlet", seed=0, alpha=0.5)
        >>> fd.num_clients, int(fd.counts.sum())
        (10, 8000)
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, PARTITION_STREAM]))
    if partition == "natural":
        partition_kwargs = {"groups": dataset.train_groups, **partition_kwargs}
    parts = make_partition(partition, dataset.train_y, num_clients, rng, **partition_kwargs)
    empty = np.flatnonzero(parts.counts == 0)
    if empty.size:
        raise ValueError(f"partition {partition!r} with seed {seed} left {empty.size} of {num_clients} clients "
                         f"without samples (first: client {int(empty[0])}); every client needs >= 1 sample: use "
                         "fewer clients, another seed or another partition")
    return FederatedData.from_partition(dataset.train_x, dataset.train_y, parts, dataset.num_classes)
