"""FedOpt (Reddi et al., "Adaptive Federated Optimization", ICLR 2021): FedAvg rounds with an adaptive server optimiser.

The server treats the average update Δ = Σ p_i Δ_i as a pseudo-gradient and applies Algorithm 2's
FedAdam, FedYogi or FedAdagrad to it (:mod:`jaxfl.kernels.fedopt`: τ = 10⁻³ outside the root, v
starting at τ², β1 = 0.9, β2 = 0.99, no bias correction). Unset ``server_lr`` takes the paper's best
CIFAR-10 rates (10⁻² Adam/Yogi, 10⁻¹ Adagrad; :data:`jaxfl.config.DEFAULT_SERVER_LR`).
"""
from __future__ import annotations

from jaxfl.algorithms.base import register
from jaxfl.algorithms.fedavg import FedAvgAlgorithm


@register
class FedAdam(FedAvgAlgorithm):
    """FedAvg + server Adam."""

    name = "fedadam"
    server_optimizer = "adam"
    waits_for_clients = "clients (rounds, K arrivals, stale clients or concurrency slots)"
    summary = "FedAvg rounds with a server Adam (Reddi et al. 2021)"


@register
class FedYogi(FedAdam):
    """FedAvg + server Yogi."""

    name = "fedyogi"
    server_optimizer = "yogi"
    summary = "FedAvg rounds with a server Yogi (Reddi et al. 2021)"


@register
class FedAdagrad(FedAdam):
    """FedAvg + server Adagrad."""

    name = "fedadagrad"
    server_optimizer = "adagrad"
    summary = "FedAvg rounds with a server Adagrad (Reddi et al. 2021)"
