"""Data layer: loaders, partitioners, flat federated storage and partition reports (numpy only).

``jaxfl.data.augment`` (pure JAX, on-device normalisation and augmentation) is the one module here
that imports jax; it is not imported by this package's ``__init__``.

Example:
    >>> from jaxfl.data import load_dataset, build_federation
    >>> fd = build_federation(load_dataset("mnist10k"), num_clients=10, partition="dirichlet", alpha=0.5)
    >>> fd.num_clients
    10
"""

from jaxfl.data.datasets import (
    DATA_FORMS,
    DATASET_PREFIXES,
    DATASETS,
    DIGITS_NUM_TEST,
    FASHION_MNIST_DIR,
    MNIST10K_NUM_TEST,
    MNIST10K_SPLIT_SEED,
    Dataset,
    as_dataset,
    dataset_from_arrays,
    load_dataset,
)
from jaxfl.data.federated import PARTITION_STREAM, FederatedData, build_federation
from jaxfl.data.idx import parse_idx, read_idx
from jaxfl.data.partition import (
    CLASS_PARTITION_TABLE,
    DIRICHLET_MAX_TRIES,
    IID_SIZES,
    PARTITIONS,
    FlatPartition,
    client_sizes,
    make_partition,
    partition_class,
    partition_dirichlet,
    partition_dirichlet_client,
    partition_dual_dirichlet,
    partition_gamma_mix,
    partition_iid,
    partition_label_shards,
    partition_natural,
)
from jaxfl.data.report import PartitionReport, partition_report, plot_class_heatmap
from jaxfl.data.synthetic import SyntheticFederation, generate_synthetic

__all__ = [
    "CLASS_PARTITION_TABLE",
    "DATA_FORMS",
    "DATASETS",
    "DATASET_PREFIXES",
    "DIGITS_NUM_TEST",
    "DIRICHLET_MAX_TRIES",
    "FASHION_MNIST_DIR",
    "IID_SIZES",
    "MNIST10K_NUM_TEST",
    "MNIST10K_SPLIT_SEED",
    "PARTITIONS",
    "PARTITION_STREAM",
    "Dataset",
    "FederatedData",
    "FlatPartition",
    "PartitionReport",
    "SyntheticFederation",
    "as_dataset",
    "build_federation",
    "client_sizes",
    "dataset_from_arrays",
    "generate_synthetic",
    "load_dataset",
    "make_partition",
    "parse_idx",
    "partition_class",
    "partition_dirichlet",
    "partition_dirichlet_client",
    "partition_dual_dirichlet",
    "partition_gamma_mix",
    "partition_iid",
    "partition_label_shards",
    "partition_natural",
    "partition_report",
    "plot_class_heatmap",
    "read_idx",
]
