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
    python benchmarks/minibatch_sampling.py --quick --json out.json   # smoke size (CI): max_count 600, K 2, B 8

``--quick`` is the smoke size (CI): max_count 600, K 2, B 8, 3 timed calls after 1 warm-up (flags
given with it keep their values). ``--json PATH`` writes the table's rows with
``_report.run_header``'s machine, device, jax version and date.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.kernels.client import ClientView, minibatch_indices
from jaxfl.kernels.permutation import DEFAULT_ROUNDS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import check_at_least, run_header, write_json  # noqa: E402  (benchmarks/_report.py)

QUICK = {"max_counts": [600], "clients": 2, "batch_size": 8, "steps_per_call": 1, "repeats": 3, "warmup": 1}
DEFAULTS = {"max_counts": [600, 6000, 60000], "clients": 8, "batch_size": 64, "steps_per_call": 1, "repeats": 50,
            "warmup": 3}


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
    parser.add_argument("--max-counts", type=int, nargs="+", help="the largest client's samples, one table row "
                        "each (default 600 6000 60000; --quick: 600)")
    parser.add_argument("--clients", type=int, help="K, vmapped (default 8; --quick: 2)")
    parser.add_argument("--batch-size", type=int, help="B (default 64; --quick: 8)")
    parser.add_argument("--steps-per-call", type=int, help="S consecutive steps a call (default 1)")
    parser.add_argument("--repeats", type=int, help="timed calls per side (default 50; --quick: 3)")
    parser.add_argument("--warmup", type=int, help="untimed calls per side first (default 3; --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="smoke size (CI): max_count 600, K 2, B 8, 3 calls")
    parser.add_argument("--json", help="also write the rows, the machine, device, jax version and date here")
    args = parser.parse_args()
    check_at_least(parser, args, {"max_counts": 1, "clients": 1, "batch_size": 1, "steps_per_call": 1,
                                  "repeats": 1, "warmup": 0})
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    header = run_header("minibatch_sampling", quick=args.quick, clients=args.clients, batch_size=args.batch_size,
                        steps_per_call=args.steps_per_call, repeats=args.repeats, warmup=args.warmup,
                        feistel_rounds=DEFAULT_ROUNDS)
    rows = []
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
        rows.append({"max_count": max_count, "argsort_ms_per_call": round(argsort_ms, 4),
                     "feistel_ms_per_call": round(feistel_ms, 4), "argsort_over_feistel": round(argsort_ms / feistel_ms, 3),
                     "calls_timed": len(times["feistel"])})
        write_json(args.json, {**header, "rows": rows})  # after each row: a run cut short keeps it


if __name__ == "__main__":
    main()
