"""Every CPU core as a jax device, so that the engine can train one client per core in parallel.

XLA:CPU runs one small training step on one core, and vmapping clients on a CPU makes their
convolutions grouped ones that cost about twice as much per client; one client per host device,
the client axis sharded over the devices, keeps every core busy instead (``jaxfl.execution``).
jax exposes one CPU device unless told otherwise before its backends start, so importing jaxfl
asks for one per core, unless the user already chose (``JAX_NUM_CPU_DEVICES``, ``XLA_FLAGS``'s
``--xla_force_host_platform_device_count``, or ``jax_num_cpu_devices`` set in code), or jax's
backends are already running, or ``JAXFL_CPU_DEVICES=1`` says not to. Accelerators are untouched.
"""
from __future__ import annotations

import os

import jax

__all__ = ["backends_started", "use_every_cpu_core", "usable_cores"]


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def backends_started() -> bool:
    """Whether jax's backends are running (after which device settings no longer take effect)."""
    try:
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:  # a jax without it: only the environment tells
        return False
    return backends_are_initialized()


def use_every_cpu_core() -> int | None:
    """Ask jax for one CPU device per usable core; returns the number asked for, or None where it
    left the setting alone (see the module docstring for when).

    >>> import jaxfl, jax
    >>> len(jax.devices("cpu")) >= 1
    True
    """
    wanted = os.environ.get("JAXFL_CPU_DEVICES")
    if ("JAX_NUM_CPU_DEVICES" in os.environ or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
            or backends_started() or getattr(jax.config, "jax_num_cpu_devices", 0) != -1):
        return None
    count = int(wanted) if wanted else usable_cores()
    jax.config.update("jax_num_cpu_devices", count)
    return count
