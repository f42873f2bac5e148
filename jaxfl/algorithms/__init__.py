"""One scheduling policy per algorithm (plain Python; never imports jax).

``build_policy(config)`` turns a validated :class:`jaxfl.config.RunConfig` into the policy; the
engine applies the server optimiser the config names (FedAvgM = FedAvg + momentum 0.9).

>>> from jaxfl.config import RunConfig
>>> build_policy(RunConfig(algorithm="fedbuff", buffer_size=3)).buffer_size
3
"""
from __future__ import annotations

import dataclasses

from jaxfl.algorithms.ccfedavg import CCFedAvg, level_budgets, two_group_budgets
from jaxfl.algorithms.fedasmu import DeviceOptions, FedASMU, ServerOptions
from jaxfl.algorithms.fedasync import FedAsync
from jaxfl.algorithms.fedat import FedAT
from jaxfl.algorithms.fedavg import FedAvg
from jaxfl.algorithms.fedbuff import FedBuff
from jaxfl.algorithms.fedcompass import (PAPER, REFERENCE_CODE, REFERENCE_CODE_LATEST_TIME_FACTOR,
                                         CompassOptions, FedCompass)
from jaxfl.algorithms.port import PLATO as PORT_PLATO
from jaxfl.algorithms.port import PORT, PortOptions
from jaxfl.algorithms.port import PAPER as PORT_PAPER
from jaxfl.config import FEDOPT_ALGORITHMS, RunConfig
from jaxfl.scheduler.simulation import Policy
from jaxfl.scheduler.staleness import make_staleness

SYNCHRONOUS = ("fedavg", "fedavgm")
ASYNCHRONOUS = ("fedasync", "fedbuff")
SEMI_ASYNCHRONOUS = ("fedcompass", "fedcompass_m", "fedcompass_n", "fedat")
COMPASS_AGGREGATION = {"fedcompass": "plain", "fedcompass_m": "momentum", "fedcompass_n": "normalized"}
FEDOPT = tuple(FEDOPT_ALGORITHMS)  # FedAvg + FedOpt's adaptive server optimiser (set by the config)
ISSUE_6 = ("port", "ccfedavg", "fedasmu")


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


def port_options(config: RunConfig) -> PortOptions:
    """PORT's switches: the preset's values unless a ``port_*`` field sets one."""
    preset = PORT_PLATO if config.port_preset == "plato" else PORT_PAPER
    overrides = {field.name: getattr(config, f"port_{field.name}") for field in dataclasses.fields(PortOptions)
                 if getattr(config, f"port_{field.name}") is not None}
    return dataclasses.replace(preset, **overrides)


def cc_budgets(config: RunConfig) -> list[float]:
    """CC-FedAvg's p_i: β levels (paper's main tables) or the two-group (r, W) model."""
    if config.cc_budget == "two_group":
        return two_group_budgets(config.clients, config.cc_insufficient_fraction, config.cc_window)
    return level_budgets(config.clients, config.cc_budget_beta)


def build_policy(config: RunConfig) -> Policy:
    """The policy for ``config.algorithm`` with the config's hyperparameters."""
    if config.algorithm == "port":
        return PORT(config.local_steps, config.port_min_clients, config.port_staleness_bound, config.port_alpha,
                    config.port_beta, config.port_clients_in_flight, port_options(config), seed=config.seed,
                    round_timeout=config.round_timeout)
    if config.algorithm == "ccfedavg":
        return CCFedAvg(config.local_steps, cc_budgets(config), config.cc_schedule, config.cc_strategy,
                        config.cc_switch_round, config.cc_total_rounds or config.max_updates or 400,
                        config.clients_per_round, config.cc_nova_steps, seed=config.seed,
                        round_timeout=config.round_timeout)
    if config.algorithm == "fedasmu":
        server = ServerOptions(config.fedasmu_mu_alpha, config.fedasmu_alpha_min, config.fedasmu_lr_lambda,
                               config.fedasmu_lr_sigma, config.fedasmu_lr_iota, config.fedasmu_lambda0,
                               config.fedasmu_sigma0, config.fedasmu_iota0)
        device = DeviceOptions(config.fedasmu_mu_beta, config.fedasmu_lr_gamma, config.fedasmu_lr_nu,
                               config.fedasmu_gamma0, config.fedasmu_nu0)
        return FedASMU(config.local_steps, config.client_lr, config.fedasmu_epochs, config.fedasmu_slot,
                       config.fedasmu_staleness_bound, config.fedasmu_trigger_period, config.fedasmu_trigger_batch,
                       config.fedasmu_max_concurrency, config.fedasmu_fetch, config.fedasmu_dynamic, server, device,
                       seed=config.seed, round_timeout=config.round_timeout)
    if config.algorithm in SYNCHRONOUS or config.algorithm in FEDOPT:
        return FedAvg(config.local_steps, config.clients_per_round, seed=config.seed,
                      round_timeout=config.round_timeout)
    if config.algorithm == "fedasync":
        return FedAsync(config.local_steps, staleness_function(config), rule=config.rule)
    if config.algorithm == "fedbuff":
        return FedBuff(config.local_steps, config.buffer_size, staleness_function(config), rule=config.rule)
    if config.algorithm in COMPASS_AGGREGATION:
        q_min, q_max, latest, options = compass_settings(config)
        return FedCompass(q_min, q_max, staleness_function(config), latest_time_factor=latest,
                          aggregation=COMPASS_AGGREGATION[config.algorithm], options=options)
    if config.algorithm == "fedat":
        return FedAT(config.local_steps, config.fedat_tier_ratio, config.fedat_profiling,
                     round_timeout=config.round_timeout)
    raise ValueError(f"unknown algorithm {config.algorithm!r}; "
                     f"allowed: {', '.join(SYNCHRONOUS + ASYNCHRONOUS + SEMI_ASYNCHRONOUS + FEDOPT + ISSUE_6)}")


__all__ = ["ASYNCHRONOUS", "FEDOPT", "ISSUE_6", "SEMI_ASYNCHRONOUS", "SYNCHRONOUS", "CCFedAvg", "CompassOptions",
           "FedASMU", "FedAT", "FedAsync", "FedAvg", "FedBuff", "FedCompass", "PORT", "PortOptions", "build_policy",
           "cc_budgets", "compass_settings", "port_options", "staleness_function"]
