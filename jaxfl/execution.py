"""How the engine shapes its training calls and what it counts: the execution plan per backend,
the memory figures its guard reads, and the statistics a run reports.

>>> ExecutionPlan.for_backend("cpu", local_steps=6, devices=1)
ExecutionPlan(clients_per_call=1, steps_per_call=6, devices=1)
>>> step_chunks(13, 10)
[10, 2, 1]
>>> EngineStats(useful_steps=6, executed_steps=8).padding_waste
0.25
>>> [bucket_size(n) for n in (0, 1, 3, 4, 5)]
[1, 1, 4, 4, 8]
"""
from __future__ import annotations

import dataclasses
import sys

import jax

def bucket_size(count: int) -> int:
    """The power of two a stack of ``count`` clients or updates is padded to, so that jit compiles
    once per bucket rather than once per size (at least 1)."""
    return 1 << (max(count, 1) - 1).bit_length()


# Activations of one training step, per sample, as a multiple of the sample's float32 size: a
# deliberately generous estimate (the MNIST CNN needs ~20×); the guard splits calls, it never
# changes results.
ACTIVATION_FACTOR = 64
MEMORY_HEADROOM = 0.8  # use at most this fraction of the free memory for one call
# XLA's memory figure for a call of one client against the per-client estimate above: 0.76 (an MLP),
# 3.8-4.0 (the MNIST CNN) and 2.4 (ResNet-18) on XLA:CPU, at 1 and 8 clients (2026-12-04). Where
# the estimate times this margin fits the budget, one client per device fits with room to spare, and
# the run's start compiles no program only to check that.
ESTIMATE_MARGIN = 16


def free_device_memory() -> int | None:
    """Bytes free on the default device: the accelerator's allocator limit, or MemAvailable on CPU."""
    device = jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # some backends do not implement memory_stats
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    return available_host_memory()


def available_host_memory() -> int | None:
    """Bytes of RAM available to new allocations: Linux's MemAvailable; on a Mac, which does not say,
    the RAM installed (``hw.memsize``), the most there could be; None where unknown (taken as room).

    >>> available_host_memory() is None or available_host_memory() > 0
    True
    """
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        if sys.platform == "darwin":
            from jaxfl._devices import _sysctl_int

            return _sysctl_int("hw.memsize", wide=True)
        return None
    return None


class ResourceError(MemoryError):
    """One client's training does not fit in memory; the message names the setting to lower."""


# Longest step chunk unrolled into one call, by backend (none listed: 10 steps everywhere). Clients
# that share a step count run it in full chunks: on the 2-core CPU (the cross-device benchmark's
# call, 2 clients of batch 10, example CNN, 2026-11-30, benchmarks/README.md) six one-step calls
# cost 12 % more CPU time per step than one six-step call, the calls' own overhead, and the
# benchmark's rounds 1.22x the time.
MAX_UNROLLED_STEPS: dict[str, int] = {}
DEFAULT_MAX_UNROLLED_STEPS = 10
# Backends that run a call's remainder (its steps past the full chunks: step counts that vary, as
# FedCompass's, PORT's, FedASMU's and local_epochs' do) as one-step calls, not power-of-two chunks.
# CPU: compiling an unrolled chunk of L steps costs 3.9, 4.3, 6.0 and 10.1 CPU s for L = 1, 2, 4, 8
# (example CNN, 2026-11-30) and power-of-two remainders compile each length below the chunk, so a
# run compiles at most two chunk shapes, the full one and one step.
ONE_STEP_REMAINDERS = frozenset({"cpu"})
# Clients each device trains per call by default. CPU: one, the client axis sharded one client per
# host device (a core). Measured on 2 cores, the cross-device benchmark (benchmarks/cpu_speed.py):
# 2.3 s per round this way, 2.6 s with one device, 3.0–4.4 s with 8–50 clients vmapped per call
# (without the CPU-friendly layers a vmapped batch is a grouped convolution at ~2× the cost per
# client). GPU/TPU: 256, where vmapped small batches fill the device (not yet measured).
CLIENTS_PER_DEVICE = {"cpu": 1}
DEFAULT_CLIENTS_PER_DEVICE = 256


def default_steps_per_call(local_steps: int | None, backend: str = "cpu") -> int:
    """The step chunk for clients of ``local_steps`` steps on ``backend``: all of them if they fit in
    one unrolled call of at most ``MAX_UNROLLED_STEPS`` steps, else the largest divisor of
    ``local_steps`` from half the cap to the cap (so that no call runs a remainder), else the cap.
    Remainders run as power-of-two chunks, or one-step calls on a CPU (:func:`step_chunks`).

    >>> default_steps_per_call(6), default_steps_per_call(6, "gpu"), default_steps_per_call(12, "gpu")
    (6, 6, 6)
    """
    cap = MAX_UNROLLED_STEPS.get(backend, DEFAULT_MAX_UNROLLED_STEPS)
    if local_steps is None:
        return cap
    if local_steps <= cap:
        return local_steps
    for chunk in range(cap, cap // 2 - 1, -1):
        if chunk and local_steps % chunk == 0:
            return chunk
    return cap


def step_chunks(steps: int, per_call: int, one_step_remainders: bool = False) -> list[int]:
    """The chunk lengths that run exactly ``steps`` steps: full chunks of ``per_call``, then the
    remainder as descending powers of two (at most log2(per_call) extra chunk shapes), or with
    ``one_step_remainders`` as one-step calls (one extra shape; :data:`ONE_STEP_REMAINDERS`). No
    masked step is computed for a call whose clients share a step count.

    >>> step_chunks(13, 10), step_chunks(13, 10, one_step_remainders=True), step_chunks(6, 6, True)
    ([10, 2, 1], [10, 1, 1, 1], [6])
    """
    chunks = [per_call] * (steps // per_call)
    remainder = steps % per_call
    if one_step_remainders:
        return chunks + [1] * remainder
    power = 1 << max(remainder.bit_length() - 1, 0)
    while remainder:
        if remainder >= power:
            chunks.append(power)
            remainder -= power
        power //= 2
    return chunks


def available_devices(requested: int | None = None) -> int:
    """How many devices of the default backend a run uses: ``requested``, or all of them (every
    process's, in a run of several processes, where only all of them may be asked for).

    >>> available_devices(1)
    1
    """
    if jax.process_count() > 1:
        total = jax.device_count()
        per_process = [0] * jax.process_count()
        for device in jax.devices():
            per_process[device.process_index] += 1
        if len(set(per_process)) > 1:  # the client axis is split evenly over the processes' devices
            raise ValueError(f"the {jax.process_count()} processes have {', '.join(map(str, per_process))} "
                             f"{jax.default_backend()} devices (process 0, 1, ...): every process needs as many "
                             "devices as the others (on CPUs, the same JAX_NUM_CPU_DEVICES or JAXFL_CPU_DEVICES)")
        if requested not in (None, total):
            raise ValueError(f"devices={requested} but a run of {jax.process_count()} processes uses all "
                             f"{total} of their devices; leave devices unset (resuming a run that set it: "
                             f"--devices none)")
        return total
    count = jax.local_device_count()
    if requested is None:
        return count
    if requested < 1 or requested > count:
        raise ValueError(f"devices={requested} but this process has {count} {jax.default_backend()} "
                         f"device{'s' if count != 1 else ''} ({', '.join(str(d) for d in jax.local_devices())}); "
                         f"pass a number from 1 to {count}")
    return requested


@dataclasses.dataclass(frozen=True)
class ExecutionPlan:
    """How the engine shapes its calls: clients per call (a multiple of ``devices``, over which the
    client axis is sharded), steps per unrolled chunk, and the number of local devices used."""

    clients_per_call: int
    steps_per_call: int
    devices: int = 1

    def __post_init__(self):
        if self.clients_per_call % self.devices:
            raise ValueError(f"clients_per_call={self.clients_per_call} is not a multiple of devices={self.devices}: "
                             f"every device trains the same number of clients in a call")

    @staticmethod
    def for_backend(backend: str, clients_per_call: int | None = None, steps_per_call: int | None = None,
                    devices: int | None = None, local_steps: int | None = None) -> "ExecutionPlan":
        """The defaults for ``backend``, from measurements (see ``CLIENTS_PER_DEVICE``): every local
        device, the backend's clients per device, and steps per call from ``local_steps``
        (:func:`default_steps_per_call`). A given ``clients_per_call`` is rounded up to a multiple
        of the devices."""
        devices = available_devices(devices)
        if clients_per_call is None:
            clients_per_call = devices * CLIENTS_PER_DEVICE.get(backend, DEFAULT_CLIENTS_PER_DEVICE)
        clients_per_call = -(-clients_per_call // devices) * devices
        return ExecutionPlan(clients_per_call, steps_per_call or default_steps_per_call(local_steps, backend), devices)

    def call_size(self, count: int) -> int:
        """Padded clients of a call holding ``count``: a power of two per device (so that jit
        compiles once per bucket), times the devices, at most ``clients_per_call`` unless ``count``
        is larger."""
        per_device = bucket_size(-(-min(count, self.clients_per_call) // self.devices))
        size = min(per_device * self.devices, self.clients_per_call)
        return max(size, -(-count // self.devices) * self.devices)


@dataclasses.dataclass
class EngineStats:
    """What the engine did: calls, batches, clients, and steps requested, aggregated and executed."""

    train_calls: int = 0  # jitted step-chunk calls
    batches: int = 0  # trainings of a set of pending dispatches (one per chunk of clients)
    clients_trained: int = 0
    useful_steps: int = 0  # Σ requested local steps of trained dispatches
    aggregated_steps: int = 0  # Σ local steps of the updates aggregated so far
    server_steps: int = 0  # aggregations that applied the server optimiser (not mixes, single updates, hooks' models)
    executed_steps: int = 0  # steps computed, padding (masked steps, padded clients) included
    # Steps the calls ran one after another: each call's longest (its two parts' where it pauses).
    # Where a vmapped step costs what one client's does (an accelerator the call does not fill), the
    # training time goes with this count, so one run's count over another's bounds their speed ratio.
    steps_in_sequence: int = 0
    peak_versions_kept: int = 0  # global models held at once (the current one and those in-flight work started from)
    peak_updates_held: int = 0  # trained updates held at once, waiting for their aggregation
    traces: dict = dataclasses.field(default_factory=dict)  # function name → times jit traced it
    metric_fetches: int = 0  # times the host waited for training calls (fetching their metrics together)
    versions_placed: int = 0  # global versions copied to the devices of a mesh (once per version used)
    train_seconds: float = 0.0  # wall time inside training calls (to their results), compilation included
    compile_seconds: float = 0.0  # compiling the step programs (wall time) and init, finish (jax's compile events)

    @property
    def padding_waste(self) -> float:
        """Masked-out steps ÷ executed steps."""
        return 0.0 if self.executed_steps == 0 else 1.0 - self.useful_steps / self.executed_steps

    @property
    def mean_clients_per_batch(self) -> float:
        return 0.0 if self.batches == 0 else self.clients_trained / self.batches
