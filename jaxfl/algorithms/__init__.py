"""One scheduling policy per algorithm (plain Python; never imports jax).

``build_policy(config)`` turns a validated :class:`jaxfl.config.RunConfig` into the policy; the
engine applies the server optimiser the config names (FedAvgM = FedAvg + momentum 0.9).

>>> from jaxfl.config import RunConfig
>>> build_policy(RunConfig(algorithm="fedbuff", buffer_size=3)).buffer_size
3
"""
from __future__ import annotations

import dataclasses

from jaxfl.algorithms.fedasync import FedAsync
from jaxfl.algorithms.fedat import FedAT
from jaxfl.algorithms.fedavg import FedAvg
from jaxfl.algorithms.fedbuff import FedBuff
from jaxfl.algorithms.fedcompass import (PAPER, REFERENCE_CODE, REFERENCE_CODE_LATEST_TIME_FACTOR,
                                         CompassOptions, FedCompass)
from jaxfl.config import RunConfig
from jaxfl.scheduler.simulation import Policy
from jaxfl.scheduler.staleness import make_staleness

SYNCHRONOUS = ("fedavg", "fedavgm")
ASYNCHRONOUS = ("fedasync", "fedbuff")
SEMI_ASYNCHRONOUS = ("fedcompass", "fedcompass_m", "fedcompass_n", "fedat")
COMPASS_AGGREGATION = {"fedcompass": "plain", "fedcompass_m": "momentum", "fedcompass_n": "normalized"}


def staleness_function(config: RunConfig):
    """The config's st(s); the constant form uses only ``staleness_alpha``."""
    params = {"alpha": config.staleness_alpha}
    if config.staleness != "constant":
        params["a"] = config.staleness_a
    return make_staleness(config.staleness, **params)


def compass_settings(config: RunConfig) -> tuple[int, int, float, CompassOptions]:
    """(Q_min, Q_max, λ, switches) for FedCompass: the preset's values unless a field sets one.

    Defaults follow the paper's Table 9: Q_max = the baselines' local steps, Q_min = 0.2·Q_max.
    """
    q_max = config.compass_q_max or config.local_steps
    q_min = config.compass_q_min or min(q_max, max(1, round(0.2 * q_max)))
    reference = config.compass_preset == "reference_code"
    preset = REFERENCE_CODE if reference else PAPER
    latest = config.compass_lambda or (REFERENCE_CODE_LATEST_TIME_FACTOR if reference else 1.2)
    overrides = {field.name: getattr(config, f"compass_{field.name}") for field in dataclasses.fields(CompassOptions)
                 if getattr(config, f"compass_{field.name}") is not None}
    return q_min, q_max, latest, dataclasses.replace(preset, **overrides)


def build_policy(config: RunConfig) -> Policy:
    """The policy for ``config.algorithm`` with the config's hyperparameters."""
    if config.algorithm in SYNCHRONOUS:
        return FedAvg(config.local_steps, config.clients_per_round, seed=config.seed)
    if config.algorithm == "fedasync":
        return FedAsync(config.local_steps, staleness_function(config), rule=config.rule)
    if config.algorithm == "fedbuff":
        return FedBuff(config.local_steps, config.buffer_size, staleness_function(config), rule=config.rule)
    if config.algorithm in COMPASS_AGGREGATION:
        q_min, q_max, latest, options = compass_settings(config)
        return FedCompass(q_min, q_max, staleness_function(config), latest_time_factor=latest,
                          aggregation=COMPASS_AGGREGATION[config.algorithm], options=options)
    if config.algorithm == "fedat":
        return FedAT(config.local_steps, config.fedat_tier_ratio, config.fedat_profiling)
    raise ValueError(f"unknown algorithm {config.algorithm!r}; "
                     f"allowed: {', '.join(SYNCHRONOUS + ASYNCHRONOUS + SEMI_ASYNCHRONOUS)}")


__all__ = ["ASYNCHRONOUS", "SEMI_ASYNCHRONOUS", "SYNCHRONOUS", "CompassOptions", "FedAT", "FedAsync", "FedAvg",
           "FedBuff", "FedCompass", "build_policy", "compass_settings", "staleness_function"]
