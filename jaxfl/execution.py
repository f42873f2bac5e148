"""How the engine shapes its training calls and what it counts: the execution plan per backend,
the memory figures its guard reads, and the statistics a run reports.

>>> ExecutionPlan.for_backend("cpu")
ExecutionPlan(clients_per_call=1, steps_per_call=5)
>>> EngineStats(useful_steps=6, executed_steps=8).padding_waste
0.25
>>> [bucket_size(n) for n in (0, 1, 3, 4, 5)]
[1, 1, 4, 4, 8]
"""
from __future__ import annotations

import dataclasses

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


def free_device_memory() -> int | None:
    """Bytes free on the default device: the accelerator's allocator limit, or MemAvailable on CPU."""
    device = jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # some backends do not implement memory_stats
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class ResourceError(MemoryError):
    """One client's training does not fit in memory; the message names the setting to lower."""


@dataclasses.dataclass(frozen=True)
class ExecutionPlan:
    """How the engine shapes its calls on this backend (chosen from measurements, DESIGN.md)."""

    clients_per_call: int
    steps_per_call: int

    @staticmethod
    def for_backend(backend: str, clients_per_call: int | None = None,
                    steps_per_call: int | None = None) -> "ExecutionPlan":
        """Defaults per backend.

        CPU (2-core dev machine, MNIST CNN, batch 64; ``benchmarks/client_batching.py``): one
        client per call and 5 unrolled steps per call — XLA:CPU runs convolutions inside a rolled
        loop ~15× slower, and a vmapped batch of clients (a grouped convolution) costs ~1.5× more
        per client than one client. GPU/TPU: vmap up to 256 clients per call, 10 steps per call.
        """
        if backend == "cpu":
            default_clients, default_steps = 1, 5
        else:
            default_clients, default_steps = 256, 10
        return ExecutionPlan(clients_per_call or default_clients, steps_per_call or default_steps)


@dataclasses.dataclass
class EngineStats:
    """What the engine did: calls, batches, clients, and steps requested, aggregated and executed."""

    train_calls: int = 0  # jitted step-chunk calls
    batches: int = 0  # trainings of a set of pending dispatches (one per chunk of clients)
    clients_trained: int = 0
    useful_steps: int = 0  # Σ requested local steps of trained dispatches
    aggregated_steps: int = 0  # Σ local steps of the updates aggregated so far
    executed_steps: int = 0  # steps computed, padding (masked steps, padded clients) included
    peak_versions_kept: int = 0  # global models held at once (the current one and those in-flight work started from)
    peak_updates_held: int = 0  # trained updates held at once, waiting for their aggregation
    traces: dict = dataclasses.field(default_factory=dict)  # function name → times jit traced it

    @property
    def padding_waste(self) -> float:
        """Masked-out steps ÷ executed steps."""
        return 0.0 if self.executed_steps == 0 else 1.0 - self.useful_steps / self.executed_steps

    @property
    def mean_clients_per_batch(self) -> float:
        return 0.0 if self.batches == 0 else self.clients_trained / self.batches
