"""Minibatch index sampling per step: argsort of ``max_count`` scores vs a Feistel permutation.

Both sides compute what ``jaxfl.kernels.client.minibatch_indices`` returns (global indices and mask,
``(K, B)``) for K clients in one jitted, vmapped call, with the clients' counts spread over
[0.55, 1] · ``max_count`` (the largest client has ``max_count``):

* argsort: the kernel before the Feistel sampler, ``max_count`` uniform scores argsorted per step, O(max_count log
  max_count) per client-step;
* feistel: :func:`jaxfl.kernels.permutation.permute` of the step's B positions, O(B) per
  client-step whatever ``max_count`` is.

``--steps-per-call S`` > 1 draws S consecutive steps in one call (a ``lax.scan``, as the engine's
step loop does), which takes the per-call dispatch overhead out of the comparison. The two sides
alternate call by call after a warm-up; the table gives the median time per call and the ratio.

    python benchmarks/minibatch_sampling.py                       # max_count 600 6000 60000, K 8, B 64
    python benchmarks/minibatch_sampling.py --steps-per-call 10 --repeats 30
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.kernels.client import ClientView, minibatch_indices
from jaxfl.kernels.permutation import DEFAULT_ROUNDS


def argsort_indices(key, step, offset, count, batch_size: int, max_count: int):
    """The baseline: minibatch_indices of jaxfl/kernels/client.py before the Feistel sampler (argsort per step)."""
    count = jnp.maximum(count, 1)
    batches_per_epoch = (count + batch_size - 1) // batch_size
    epoch = step // batches_per_epoch
    batch_in_epoch = step % batches_per_epoch
    scores = jax.random.uniform(jax.random.fold_in(key, epoch), (max_count,))
    scores = jnp.where(jnp.arange(max_count) < count, scores, 2.0)
    permutation = jnp.argsort(scores)
    positions = batch_in_epoch * batch_size + jnp.arange(batch_size)
    valid = positions < count
    local = permutation[jnp.minimum(positions, max_count - 1)]
    local = jnp.where(valid, local, 0)
    return offset + local, valid.astype(jnp.float32)


def feistel_indices(key, step, offset, count, batch_size: int):
    """The kernel's sampler: the epoch's Feistel permutation evaluated at the step's B positions only."""
    return minibatch_indices(key, step, ClientView(offset, count), batch_size)


def build(sampler, steps_per_call: int):
    """jit(vmap over clients) of ``steps_per_call`` consecutive steps from ``first_step``."""

    def one_client(key, first_step, offset, count):
        def body(carry, step):
            return carry, sampler(key, step, offset, count)

        steps = first_step + jnp.arange(steps_per_call, dtype=jnp.int32)
        return jax.lax.scan(body, None, steps)[1]

    return jax.jit(jax.vmap(one_client, in_axes=(0, None, 0, 0)))


def time_call(fn, args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-counts", type=int, nargs="+", default=[600, 6000, 60000])
    parser.add_argument("--clients", type=int, default=8, help="K, vmapped")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps-per-call", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per side")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    K, B, S = args.clients, args.batch_size, args.steps_per_call
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax {jax.__version__}; "
          f"K={K} clients vmapped, B={B}, {S} step(s) per call, {DEFAULT_ROUNDS} Feistel rounds, "
          f"median of {args.repeats} calls")
    print(f"{'max_count':>9} {'argsort ms/call':>16} {'feistel ms/call':>16} {'argsort/feistel':>16}")
    keys = jax.random.split(jax.random.key(0), K)
    for max_count in args.max_counts:
        counts = np.round(np.linspace(0.55, 1.0, K) * max_count).astype(np.int32)
        counts = jnp.asarray(np.maximum(counts, 1))
        offsets = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(counts)[:-1]]).astype(jnp.int32)
        sides = {
            "argsort": build(lambda *a, m=max_count: argsort_indices(*a, B, m), S),
            "feistel": build(lambda *a: feistel_indices(*a, B), S),
        }
        # Sanity: each client's batch is distinct samples of its own slice on both sides.
        for fn in sides.values():
            indices, mask = (np.asarray(a) for a in fn(keys, jnp.int32(0), offsets, counts))
            for k in range(K):
                for step in range(S):
                    picked = indices[k, step][mask[k, step] > 0]
                    assert len(set(picked.tolist())) == picked.size
                    assert ((picked >= int(offsets[k])) & (picked < int(offsets[k] + counts[k]))).all()
        times = {name: [] for name in sides}
        for call in range(args.warmup + args.repeats):
            for name, fn in sides.items():
                elapsed = time_call(fn, (keys, jnp.int32(call * S), offsets, counts))
                if call >= args.warmup:
                    times[name].append(elapsed)
        argsort_ms, feistel_ms = (1e3 * statistics.median(times[name]) for name in sides)
        print(f"{max_count:>9} {argsort_ms:>16.3f} {feistel_ms:>16.3f} {argsort_ms / feistel_ms:>16.1f}", flush=True)


if __name__ == "__main__":
    main()
