"""The algorithm zoo: one file per algorithm, each registered under its name (plain Python here;
device hooks import jax only when the engine builds them).

The contract is in :mod:`jaxfl.algorithms.base` (:class:`Algorithm`, :class:`Options`,
:class:`DeviceHook`, :func:`register`); :func:`build` turns a validated
:class:`jaxfl.config.RunConfig` into the algorithm, whose ``policy()`` runs on the virtual clock and
whose ``hooks()`` the engine calls.

>>> from jaxfl.config import RunConfig, validate
>>> build_policy(validate(RunConfig(algorithm="fedbuff", buffer_size=3))).buffer_size
3
>>> names()[:4]
('fedavg', 'fedavgm', 'fedasync', 'fedbuff')
"""
from __future__ import annotations

# Registration order is the order of `names()` (the CLI's help and the comparison tables).
from jaxfl.algorithms.base import (KINDS, Algorithm, DeviceHook, Options, get, names, register, staleness_function,
                                   unregister)
from jaxfl.algorithms.fedavg import FedAvg, FedAvgAlgorithm, FedAvgM
from jaxfl.algorithms.fedasync import FedAsync, FedAsyncAlgorithm
from jaxfl.algorithms.fedbuff import FedBuff, FedBuffAlgorithm
from jaxfl.algorithms.fedcompass import (CompassOptions, FedCompass, FedCompassAlgorithm, FedCompassConfig,
                                         FedCompassM, FedCompassN)
from jaxfl.algorithms.fedat import FedAT, FedATAlgorithm, FedATConfig
from jaxfl.algorithms.port import PORT, Port, PortConfig, PortOptions
from jaxfl.algorithms.ccfedavg import CCFedAvg, CCFedAvgAlgorithm, CCFedAvgConfig
from jaxfl.algorithms.fedasmu import FedASMU, FedASMUAlgorithm, FedASMUConfig
from jaxfl.algorithms.fedopt import FedAdagrad, FedAdam, FedYogi
from jaxfl.algorithms.wrappers import ClientSGD, StepNormalization, with_client_sgd, with_step_normalization
from jaxfl.scheduler.simulation import PluginError, Policy


def build(config, client_samples=None) -> Algorithm:
    """The algorithm of a validated config, built with its resolved options; ``client_samples``
    (each client's sample count n_i) fixes the per-client local steps of a ``local_epochs`` run
    (:meth:`Algorithm.local_steps`)."""
    algorithm = get(config.algorithm)(config, config.algorithm_options)
    if client_samples is not None:
        algorithm.client_samples = client_samples
    return algorithm


def build_policy(config) -> Policy:
    """The policy for ``config.algorithm`` with the config's hyperparameters."""
    return build(config).policy()


def device_hooks(algorithm: Algorithm) -> tuple[DeviceHook, ...]:
    """A built algorithm's device hooks, with FedNova composed on when its run sets ``fednova``; every
    FedNova normalisation uses the run's client SGD (:class:`~jaxfl.algorithms.wrappers.ClientSGD`)."""
    sgd = ClientSGD.of_run(algorithm.run)
    made = algorithm.hooks()
    if isinstance(made, DeviceHook) or not isinstance(made, (tuple, list)) or \
            not all(isinstance(hook, DeviceHook) for hook in made):
        shown = f"a {type(made).__name__}" if not isinstance(made, (tuple, list)) else \
            f"a {type(made).__name__} holding {', '.join(sorted({type(hook).__name__ for hook in made}))}"
        raise PluginError(f"{type(algorithm).__name__}.hooks() returned {shown}: it must return a tuple of "
                          "DeviceHook instances (() for none; one hook as (hook,))")
    hooks = with_client_sgd(made, sgd)
    return with_step_normalization(hooks, sgd) if algorithm.run.fednova else hooks


__all__ = ["KINDS", "PORT", "Algorithm", "CCFedAvg", "CCFedAvgAlgorithm", "CCFedAvgConfig", "CompassOptions",
           "DeviceHook", "FedASMU", "FedASMUAlgorithm", "FedASMUConfig", "FedAT", "FedATAlgorithm", "FedATConfig",
           "FedAdagrad", "FedAdam", "FedAsync", "FedAsyncAlgorithm", "FedAvg", "FedAvgAlgorithm", "FedAvgM",
           "FedBuff", "FedBuffAlgorithm", "FedCompass", "FedCompassAlgorithm", "FedCompassConfig", "FedCompassM",
           "FedCompassN", "FedYogi", "Options", "PluginError", "Port", "PortConfig", "PortOptions",
           "StepNormalization", "build", "build_policy", "device_hooks", "get", "names", "register",
           "staleness_function", "unregister", "with_step_normalization"]
