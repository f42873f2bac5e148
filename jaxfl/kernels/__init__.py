"""Pure-JAX kernels, written for one client (training) or a stacked client axis (aggregation).

Import them into other JAX code; the engine vmaps the client kernel in one place.
"""
from jaxfl.kernels.aggregation import (SERVER_OPTIMIZERS, apply_server_update, make_server_optimizer,
                                       tree_add, tree_scale, weighted_mean, weighted_sum)
from jaxfl.kernels.client import (ClientTrainer, ClientView, FederatedArrays, LocalState, local_train,
                                  make_client_trainer, minibatch_indices, scale_uint8)
from jaxfl.scheduler.staleness import (STALENESS_FUNCTIONS, constant, exponential, hinge, make_staleness,
                                       polynomial)

__all__ = [
    "SERVER_OPTIMIZERS", "STALENESS_FUNCTIONS", "ClientTrainer", "ClientView", "FederatedArrays",
    "LocalState", "apply_server_update", "constant", "exponential", "hinge", "local_train",
    "make_client_trainer", "make_server_optimizer", "make_staleness", "minibatch_indices",
    "polynomial", "scale_uint8", "tree_add", "tree_scale", "weighted_mean", "weighted_sum",
]
