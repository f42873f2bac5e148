"""Pure-JAX kernels, written for one client (training) or a stacked client axis (aggregation).

Import them into other JAX code; the engine vmaps the client kernel in one place.

Importing any part of jaxfl before your program first uses jax exposes each CPU core as a jax
device (``jax.device_count()`` on a 2-core CPU becomes 2), as jaxfl's engine trains on every core;
set ``JAXFL_CPU_DEVICES=1`` in the environment to keep jax's single CPU device.
"""
from jaxfl.kernels import ccfedavg, fedasmu, fedopt, port  # the algorithms' device maths, as modules
from jaxfl.kernels.aggregation import (SERVER_OPTIMIZERS, apply_server_update, make_server_optimizer, weighted_mean,
                                       weighted_sum)
from jaxfl.kernels.client import (ClientTrainer, ClientView, FederatedArrays, LocalState, local_train,
                                  make_client_trainer, minibatch_indices, scale_uint8)
from jaxfl.kernels.fednova import fednova_coefficients
from jaxfl.kernels.permutation import permute
from jaxfl.kernels.tree import stacked_zeros, tree_add, tree_bytes, tree_scale, tree_vdot
from jaxfl.scheduler.staleness import (STALENESS_FUNCTIONS, constant, exponential, hinge, make_staleness,
                                       polynomial)

__all__ = [
    "SERVER_OPTIMIZERS", "STALENESS_FUNCTIONS", "ClientTrainer", "ClientView", "FederatedArrays",
    "LocalState", "apply_server_update", "ccfedavg", "constant", "exponential", "fedasmu", "fednova_coefficients", "fedopt",
    "hinge", "local_train", "make_client_trainer", "make_server_optimizer", "make_staleness", "minibatch_indices",
    "permute", "polynomial", "port", "scale_uint8", "stacked_zeros", "tree_add", "tree_bytes", "tree_scale",
    "tree_vdot", "weighted_mean", "weighted_sum",
]
