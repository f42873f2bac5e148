"""jaxfl: a JAX-native vectorised federated-learning simulator on a virtual clock.

Three rooms: pure-JAX kernels written for one client (:mod:`jaxfl.kernels`), a
plain-Python scheduler with one policy per algorithm (:mod:`jaxfl.scheduler`,
:mod:`jaxfl.algorithms`), and the engine that joins them and batches the in-flight work
(:mod:`jaxfl.engine`).

>>> import jaxfl
>>> result = jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedbuff", model="logreg", clients=4,
...                                                local_steps=5, max_updates=3, progress=False))
>>> result.summary["global_updates"]
3
"""
from jaxfl import _startup

_startup.quiet_interrupts_while_starting()  # first: the imports below take seconds

from jaxfl._devices import use_every_cpu_core
from jaxfl.compilation_cache import use_compilation_cache

use_every_cpu_core()  # before anything initialises jax's backends

from jaxfl.config import (BudgetConfig, ClientConfig, ConfigError, DataConfig, EngineConfig, FaultsConfig, RunConfig,
                          ServerConfig, SpeedsConfig, config_from_mapping, validate)
from jaxfl.experiment import RunInterrupted, RunResult, resume_experiment, run_experiment
from jaxfl.resume import ResumeError
from jaxfl.runlog import Run, load_run
from jaxfl.scheduler.simulation import NumericalError
from jaxfl.stopping import request_stop

__version__ = "0.2.0"
__all__ = ["BudgetConfig", "ClientConfig", "ConfigError", "DataConfig", "EngineConfig", "FaultsConfig", "RunConfig",
           "NumericalError", "ResumeError", "Run", "RunInterrupted", "RunResult", "ServerConfig", "SpeedsConfig", "config_from_mapping",
           "load_run", "request_stop", "resume_experiment", "run_experiment", "use_compilation_cache", "validate"]

# The modules the README calls as jaxfl.NAME (jaxfl.presets.preset_config, jaxfl.plot.timeline_figure, ...)
# after a plain `import jaxfl`, imported when first named: `import jaxfl` stays as quick as it was.
_SUBMODULES = frozenset({"algorithms", "checkpoint", "cluster", "comparison", "data", "loggers", "models", "plot",
                         "presets", "report", "scheduler", "sweep", "testing", "user_inputs"})


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"jaxfl.{name}")
    raise AttributeError(f"module 'jaxfl' has no attribute {name!r}")
