"""One scheduling policy per algorithm (plain Python; never imports jax).

``build_policy(config)`` turns a validated :class:`jaxfl.config.RunConfig` into the policy; the
engine applies the server optimiser the config names (FedAvgM = FedAvg + momentum 0.9).

>>> from jaxfl.config import RunConfig
>>> build_policy(RunConfig(algorithm="fedbuff", buffer_size=3)).buffer_size
3
"""
from __future__ import annotations

from jaxfl.algorithms.fedasync import FedAsync
from jaxfl.algorithms.fedavg import FedAvg
from jaxfl.algorithms.fedbuff import FedBuff
from jaxfl.config import RunConfig
from jaxfl.scheduler.simulation import Policy
from jaxfl.scheduler.staleness import make_staleness

SYNCHRONOUS = ("fedavg", "fedavgm")
ASYNCHRONOUS = ("fedasync", "fedbuff")


def staleness_function(config: RunConfig):
    """The config's st(s); the constant form uses only ``staleness_alpha``."""
    params = {"alpha": config.staleness_alpha}
    if config.staleness != "constant":
        params["a"] = config.staleness_a
    return make_staleness(config.staleness, **params)


def build_policy(config: RunConfig) -> Policy:
    """The policy for ``config.algorithm`` with the config's hyperparameters."""
    if config.algorithm in SYNCHRONOUS:
        return FedAvg(config.local_steps, config.clients_per_round, seed=config.seed)
    if config.algorithm == "fedasync":
        return FedAsync(config.local_steps, staleness_function(config), rule=config.rule)
    if config.algorithm == "fedbuff":
        return FedBuff(config.local_steps, config.buffer_size, staleness_function(config), rule=config.rule)
    raise ValueError(f"unknown algorithm {config.algorithm!r}; allowed: {', '.join(SYNCHRONOUS + ASYNCHRONOUS)}")


__all__ = ["ASYNCHRONOUS", "SYNCHRONOUS", "FedAsync", "FedAvg", "FedBuff", "build_policy",
           "staleness_function"]
