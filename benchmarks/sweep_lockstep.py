"""Would a sweep gain from training several cells in lockstep? One engine flush of 2K queued
dispatches (two simulations' in-flight clients trained together) against two flushes of K (each
simulation on its own, as ``jaxfl sweep`` runs its cells), with the engine's own execution plan for
this machine. Alternating, medians of ``--repeats``, compilation excluded (one warm-up each).

A speed-up near 1 means lockstep does not pay here: on a CPU the plan trains one client per core
per call, so 2K clients are simply twice as many calls and the only saving is one flush's overhead.

    python benchmarks/sweep_lockstep.py                      # mlp K 4 and 16, cnn K 4
    python benchmarks/sweep_lockstep.py --quick              # seconds-long smoke size
    python benchmarks/sweep_lockstep.py --clients 16 64      # mlp and cnn at each K (the first GPU lease's sizes)
    python benchmarks/sweep_lockstep.py --clients 16 --models cnn   # the CNN alone (gpu_extra.sh)

It prints a line per row as it goes and a markdown table of the rows at the end; ``--json PATH``
is rewritten after each row (a run cut at a time limit keeps the rows it finished), with
``_report.run_header``'s machine, device, jax version and date.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_batching import MODELS, Setup, time_flush  # noqa: E402  (the same engine set-up and timer)
from _report import check_at_least, run_header, write_json  # noqa: E402  (benchmarks/_report.py)

from jaxfl.engine import Engine  # noqa: E402
from jaxfl.execution import ExecutionPlan  # noqa: E402
from jaxfl.kernels import make_client_trainer, make_server_optimizer  # noqa: E402

MODELS.setdefault("mlp", {"shape": (28, 28, 1), "data": "random MNIST-shaped"})  # timing does not read the pixels


def measure(model: str, clients: int, steps: int, batch_size: int, repeats: int) -> dict:
    setup = Setup(model, 2 * clients, batch_size, "adam", 0.003)
    plan = ExecutionPlan.for_backend(jax.default_backend(), None, None, local_steps=steps)
    engine = Engine(make_client_trainer(setup.model, setup.optimizer, batch_size), setup.params, setup.data,
                    setup.offsets, setup.counts, make_server_optimizer(), seed=0, plan=plan,
                    sample_bytes=setup.sample_bytes)

    def separate(index):
        return time_flush(engine, clients, steps, 2 * index) + time_flush(engine, clients, steps, 2 * index + 1)

    def together(index):
        return time_flush(engine, 2 * clients, steps, index)

    separate(10_000), together(10_001)  # compile both shapes
    apart, joint = [], []
    for index in range(repeats):
        apart.append(separate(2 * index))
        joint.append(together(2 * index + 1))
    row = {"model": model, "K": clients, "steps": steps, "batch": batch_size, "plan": repr(plan),
           "two_flushes_of_K_s": round(statistics.median(apart), 4),
           "one_flush_of_2K_s": round(statistics.median(joint), 4)}
    row["lockstep_speedup"] = round(row["two_flushes_of_K_s"] / row["one_flush_of_2K_s"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="timed pairs of flushes, medians (--quick: 1)")
    parser.add_argument("--quick", action="store_true", help="mlp, K 2, 2 steps, 1 repeat")
    parser.add_argument("--clients", type=int, nargs="+", metavar="K",
                        help="K of each simulation: the mlp (batch 16) and the cnn (batch 64) at each "
                             "(default: mlp 4 and 16, cnn 4)")
    parser.add_argument("--models", nargs="+", choices=("mlp", "cnn"), default=["mlp", "cnn"],
                        help="with --clients: the models measured at each K (default both)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    check_at_least(parser, args, {"clients": 1, "repeats": 1})
    if args.quick:
        cases = [("mlp", 2, 2, 16)]
    elif args.clients:
        cases = [(model, clients, 10, batch) for model, batch in (("mlp", 16), ("cnn", 64)) for clients in args.clients
                 if model in args.models]
    else:
        cases = [("mlp", 4, 10, 16), ("mlp", 16, 10, 16), ("cnn", 4, 10, 64)]
    repeats = 1 if args.quick else args.repeats
    header = run_header("sweep_lockstep", quick=args.quick, repeats=repeats)
    rows = []
    for model, clients, steps, batch in cases:
        rows.append(measure(model, clients, steps, batch, repeats))
        row = rows[-1]
        print(f"{model} K {clients}: two flushes of K {row['two_flushes_of_K_s']:.4f} s, one flush of 2K "
              f"{row['one_flush_of_2K_s']:.4f} s, lockstep speed-up {row['lockstep_speedup']:.3f} ({row['plan']})",
              flush=True)
        # after each row: a run cut at a time limit keeps the rows it finished
        write_json(args.json, {**header, "rows": rows}, indent=1)
    print(f"\n{jax.default_backend()} ({jax.devices()[0].device_kind}), medians of {repeats}\n")
    print("| model | K | steps | batch | two flushes of K s | one flush of 2K s | lockstep speed-up |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['model']} | {row['K']} | {row['steps']} | {row['batch']} | {row['two_flushes_of_K_s']:.4f} | "
              f"{row['one_flush_of_2K_s']:.4f} | {row['lockstep_speedup']:.3f} |")


if __name__ == "__main__":
    main()
