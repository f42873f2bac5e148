"""Data layer: IDX loading, datasets, partitioners and flat federated storage (numpy only).

Example:
    >>> from jaxfl.data import load_dataset, build_federation
    >>> fd = build_federation(load_dataset("mnist10k"), num_clients=10, partition="dirichlet", alpha=0.5)
    >>> fd.num_clients
    10
"""

from jaxfl.data.datasets import DATASETS, FASHION_MNIST_DIR, MNIST10K_NUM_TEST, MNIST10K_SPLIT_SEED, Dataset, load_dataset
from jaxfl.data.federated import PARTITION_STREAM, FederatedData, build_federation
from jaxfl.data.idx import parse_idx, read_idx
from jaxfl.data.partition import DIRICHLET_MAX_TRIES, PARTITIONS, make_partition, partition_dirichlet, partition_iid

__all__ = [
    "DATASETS",
    "DIRICHLET_MAX_TRIES",
    "FASHION_MNIST_DIR",
    "MNIST10K_NUM_TEST",
    "MNIST10K_SPLIT_SEED",
    "PARTITIONS",
    "PARTITION_STREAM",
    "Dataset",
    "FederatedData",
    "build_federation",
    "load_dataset",
    "make_partition",
    "parse_idx",
    "partition_dirichlet",
    "partition_iid",
    "read_idx",
]
