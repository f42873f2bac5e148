"""Does a sweep finish sooner with several cells at once (``jaxfl sweep --jobs N``)? The same grid
(one cell per seed) run by ``jaxfl sweep`` once per ``--jobs`` value, one after the other, each into
a fresh folder with an empty compilation cache of its own (every side compiles its programs once),
as a user would type it; wall time of the whole command, cells a minute, and each side's speed-up
against the first. The sides' results tables are compared cell by cell: a cell's final accuracy
must not depend on how many cells ran beside it (on a CPU a worker's share of the cores is its
device count, so equal to float32 reassociation; on a GPU every cell runs on all the GPUs).

On a CPU ``--jobs`` splits the cores (it pays where a run leaves cores idle: README, "Sweeps"); on a
GPU the cells share the GPU, each with its share of the GPU's memory and of the host's cores, so
that one cell's host work (the scheduler, compiling, logging: 93 % of a FedBuff run's wall time on
the first H200 lease, 2026-12-04) overlaps the others' training.

    python benchmarks/sweep_jobs.py                         # FedBuff, mnist10k, MLP: 8 cells, --jobs 1 4
    python benchmarks/sweep_jobs.py --jobs 1 2 --cells 4    # the development CPU's two cores
    python benchmarks/sweep_jobs.py --quick                 # smoke size: 2 logreg cells of 5 updates, --jobs 1 2

It prints a line per side as it goes and a markdown table at the end; ``--json PATH`` is rewritten
after each side (a run cut at a time limit keeps the sides it finished), with
``_report.run_header``'s machine, device, jax version and date. ``--keep DIR`` keeps the sweep
folders there (default: a temporary folder, removed).
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import check_at_least, run_header, write_json  # noqa: E402  (benchmarks/_report.py)


def sweep_command(args, jobs: int, out: str) -> list[str]:
    """``jaxfl sweep`` of ``args.cells`` seeds at ``jobs``, every cell doing the same fixed work
    (no stop at the target)."""
    return [sys.executable, "-m", "jaxfl", "sweep", "--algorithm", args.algorithm, "--dataset", args.dataset,
            "--model", args.model, "--clients", str(args.clients), "--concurrency", str(args.concurrency),
            "--max-updates", str(args.updates), "--eval-every", str(args.updates), "--no-stop-at-target",
            "--seed", ",".join(str(seed) for seed in range(args.cells)), "--jobs", str(jobs), "--no-progress",
            "--out", out]


def final_accuracies(sweep_dir: str) -> dict[str, float]:
    """seed → final accuracy, from the sweep's results table."""
    with open(os.path.join(sweep_dir, "results.csv"), newline="") as handle:
        return {row["seed"]: float(row["final_accuracy"]) for row in csv.DictReader(handle)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, nargs="+", default=None, metavar="N",
                        help="the --jobs of each side, the first the reference (default: 1 4; --quick: 1 2)")
    parser.add_argument("--cells", type=int, default=None,
                        help="cells of the grid, one per seed (default 8; --quick: 2)")
    parser.add_argument("--algorithm", default="fedbuff")
    parser.add_argument("--dataset", default="mnist10k", help="embedded, so that nothing needs carrying")
    parser.add_argument("--model", default=None, help="default mlp; --quick: logreg")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=20, help="clients in flight")
    parser.add_argument("--updates", type=int, default=None, help="global updates a cell (default 100; --quick: 5)")
    parser.add_argument("--quick", action="store_true", help="2 logreg cells of 5 updates, --jobs 1 2")
    parser.add_argument("--keep", metavar="DIR", help="keep the sweep folders in DIR (default: removed)")
    parser.add_argument("--json", help="also write the sides here")
    args = parser.parse_args()
    args.jobs = args.jobs or ([1, 2] if args.quick else [1, 4])
    args.cells = args.cells or (2 if args.quick else 8)
    args.updates = args.updates or (5 if args.quick else 100)
    args.model = args.model or ("logreg" if args.quick else "mlp")
    check_at_least(parser, args, {"jobs": 1, "cells": 1, "clients": 1, "concurrency": 1, "updates": 1})
    if args.keep and os.path.exists(args.keep):
        parser.error(f"--keep {args.keep} is not allowed: it exists already (the sides' folders go there)")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if max(args.jobs) > cores:
        parser.error(f"--jobs {' '.join(map(str, args.jobs))} is not allowed: each value at most {cores} (this "
                     f"process's cores: a cell process takes one at least)")
    header = run_header("sweep_jobs", quick=args.quick, cells=args.cells, updates=args.updates,
                        workload={"algorithm": args.algorithm, "dataset": args.dataset, "model": args.model,
                                  "clients": args.clients, "concurrency": args.concurrency})
    root = args.keep or tempfile.mkdtemp(prefix="sweep_jobs-")
    # each side its own empty compilation cache (jaxfl's command keeps one across commands otherwise)
    env = {name: value for name, value in os.environ.items() if name != "JAX_COMPILATION_CACHE_DIR"}
    rows, reference = [], None
    try:
        for jobs in args.jobs:
            out = os.path.join(root, f"jobs{jobs}-{len(rows)}")
            started = time.perf_counter()
            done = subprocess.run(sweep_command(args, jobs, out), capture_output=True, text=True,
                                  env={**env, "JAXFL_COMPILATION_CACHE": out + "-xla-cache"})
            wall = time.perf_counter() - started
            if done.returncode != 0:
                sys.exit(f"sweep_jobs: the sweep with --jobs {jobs} failed (exit status {done.returncode}):\n"
                         + "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:]))
            accuracies = final_accuracies(out)
            reference = reference or (wall, accuracies)
            row = {"jobs": jobs, "wall_s": round(wall, 2), "cells_per_min": round(60 * args.cells / wall, 2),
                   "speedup": round(reference[0] / wall, 3),
                   "max_accuracy_difference": round(max(abs(accuracies[seed] - reference[1][seed])
                                                        for seed in accuracies), 4)}
            rows.append(row)
            print(f"--jobs {jobs}: {row['wall_s']:.1f} s for {args.cells} cells, {row['cells_per_min']:.2f} cells/min, "
                  f"speed-up {row['speedup']:.3f}, final accuracies differ from the first side's by at most "
                  f"{row['max_accuracy_difference']:.4f}", flush=True)
            write_json(args.json, {**header, "rows": rows}, indent=1)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n{header['backend']} ({header['device']}), {cores} cores; {args.cells} cells of {args.algorithm}, "
          f"{args.dataset}, {args.model}, {args.clients} clients, {args.concurrency} in flight, "
          f"{args.updates} updates\n")
    print("| jobs | wall s | cells/min | speed-up | max final-accuracy difference |\n|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['jobs']} | {row['wall_s']:.1f} | {row['cells_per_min']:.2f} | {row['speedup']:.3f} | "
              f"{row['max_accuracy_difference']:.4f} |")


if __name__ == "__main__":
    main()
