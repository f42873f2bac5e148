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
import sys

import jax
import numpy as np

__all__ = ["aligned_empty", "backends_started", "place_read_only", "use_every_cpu_core", "usable_cores",
           "without_device_count_flag"]

# XLA:CPU uses a host array's own memory for a device buffer when it is C-contiguous and aligned to
# this many bytes (and jax is told it may alias it); otherwise it copies.
_CPU_ALIGNMENT = 64


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity (which containers and ``taskset`` narrow) on
    Linux; on a Mac its performance cores (Apple silicon's efficiency cores, a fraction as fast, would
    be devices that every sharded call waits for; not measured on a Mac: ``JAXFL_CPU_DEVICES=N``
    chooses otherwise); elsewhere every core."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        pass
    if sys.platform == "darwin":
        performance = _sysctl_int("hw.perflevel0.logicalcpu")  # (absent on an Intel Mac: one kind of core)
        if performance:
            return performance
    return os.cpu_count() or 1


def _sysctl_int(name: str, wide: bool = False) -> int | None:
    """A macOS ``sysctl`` integer (``sysctl -n NAME``; ``wide``: a 64-bit one) read without starting a
    process, or None."""
    import ctypes

    value = ctypes.c_uint64(0) if wide else ctypes.c_int(0)
    size = ctypes.c_size_t(ctypes.sizeof(value))
    try:
        failed = ctypes.CDLL(None).sysctlbyname(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0)
    except (OSError, AttributeError):  # no such call (not a BSD)
        return None
    return value.value if failed == 0 and value.value > 0 else None


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
    chosen = ("JAX_NUM_CPU_DEVICES" in os.environ or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
              or getattr(jax.config, "jax_num_cpu_devices", 0) != -1)
    if not chosen and backends_started():
        _say_started_before(wanted)
    if chosen or backends_started():
        return None
    count = _wanted_devices(wanted) if wanted else usable_cores()
    jax.config.update("jax_num_cpu_devices", count)
    return count


def _say_started_before(wanted: str | None) -> None:
    """A note where jax's backends started before jaxfl was imported (``jax.devices()`` in a notebook's
    first cell) with fewer CPU devices than cores: jaxfl can no longer ask for one per core, and its
    runs there are one-device runs, whose convolutions sum otherwise than the command's (float32's
    last digits) under the same run names, without a word. ``JAXFL_CPU_DEVICES`` naming the devices jax
    has (``wanted``) means it."""
    if jax.default_backend() != "cpu":
        return
    devices, cores = len(jax.devices("cpu")), usable_cores()
    if devices >= cores or (wanted and wanted.strip() == str(devices)):
        return
    from jaxfl._user_warnings import warn_user

    warn_user(f"jax started before jaxfl was imported (a jax call before `import jaxfl`), with {devices} CPU "
              f"device{'s' * (devices != 1)} for this machine's {cores} cores: jaxfl's runs in this process "
              f"train on {devices}, not one device per core, so they are slower and a convolutional model's "
              "results differ from the jaxfl command's in float32's last digits; import jaxfl before using jax, "
              f"or set JAXFL_CPU_DEVICES={devices} to mean it")


def without_device_count_flag(xla_flags: str) -> str:
    """``XLA_FLAGS`` without its CPU device count (``--xla_force_host_platform_device_count``), the other
    flags kept: for a child process whose device count ``JAX_NUM_CPU_DEVICES`` gives.

    >>> without_device_count_flag("--xla_force_host_platform_device_count=8 --xla_cpu_enable_fast_math=false")
    '--xla_cpu_enable_fast_math=false'
    """
    return " ".join(flag for flag in xla_flags.split() if "xla_force_host_platform_device_count" not in flag)


def _wanted_devices(wanted: str) -> int:
    """``JAXFL_CPU_DEVICES`` as a device count, or ``ValueError`` naming it (0 or a word would reach
    jax as an obscure backend error, or a bare ``int()`` traceback on ``import jaxfl``).

    >>> _wanted_devices(" 3 ")
    3
    """
    try:
        count = int(wanted.strip())
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"JAXFL_CPU_DEVICES={wanted!r} is not allowed: a whole number of CPU devices, 1 or more "
                         f"(1: one device; unset: one per usable core, {usable_cores()} here)")
    return count


def place_read_only(array, devices) -> list[jax.Array]:
    """``array`` (never written to afterwards) on each of ``devices``, one ``jax.Array`` per device.

    CPU devices share the host's memory: a NumPy array there is not copied per device but aliased,
    every device's buffer being the same host memory (one aligned copy first where the array is not
    64-byte aligned and C-contiguous). A million-client federation's 4 GB of samples then costs
    4 GB, not 4 GB more per device. Accelerators, and arrays that are already jax arrays, get
    ``jax.device_put``'s copies.

    >>> import jax, numpy as np
    >>> host = np.arange(6, dtype=np.float32)
    >>> placed = place_read_only(host, jax.devices("cpu"))
    >>> [float(p[5]) for p in placed] == [5.0] * len(jax.devices("cpu"))
    True
    """
    if not isinstance(array, np.ndarray) or any(device.platform != "cpu" for device in devices):
        return [jax.device_put(array, device) for device in devices]
    if not (array.flags.c_contiguous and array.ctypes.data % _CPU_ALIGNMENT == 0):
        aligned = aligned_empty(array.shape, array.dtype)
        aligned[...] = array
        array = aligned
    return [jax.device_put(array, device, may_alias=True) for device in devices]


def aligned_empty(shape, dtype) -> np.ndarray:
    """``np.empty(shape, dtype)`` at an address that CPU devices can alias (:func:`place_read_only`):
    data built into it (a synthetic federation's samples) reaches every CPU device without a copy.

    >>> aligned_empty((3, 5), np.float32).ctypes.data % 64
    0
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _CPU_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _CPU_ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)
