"""What the default checkpoints cost a run: the same run without periodic checkpoints, with one
exactly every 25 global updates (jaxfl's default before 2026-11-28), and with the default (every 25
updates, at least ``checkpoint_min_interval_s`` = 60 wall seconds apart).

The workload is the cheapest per update, so the one checkpoints weigh on most: FedAsync (one client
update per aggregation, its FedCompass-authors rule) on the embedded mnist10k, 20 IID clients, the MLP, 50 local steps of batch
64 (jaxfl's defaults otherwise), 500 updates, five evaluations. The three sides alternate
(``--repeats`` rounds), each a fresh run in one process; the table gives medians:

- ``wall``: the run's wall time (``summary["wall_time_s"]``);
- ``checkpoint``: the seconds spent writing checkpoints (``checkpoint_wall_s``), and per save
  (``checkpoints_written``: the final one included);
- ``overhead``: wall ÷ the wall of the run without periodic checkpoints, less 1;
- ``MB``: the bytes of the run's last checkpoint (its folder, orbax's device arrays and the rest).

Every side ends with the same model (the table's final accuracy).

    python benchmarks/checkpoint_overhead.py                 # 3 rounds
    python benchmarks/checkpoint_overhead.py --repeats 1 --updates 100 --json out.json
    python benchmarks/checkpoint_overhead.py --quick         # smoke size (CI): logreg, 25 updates, 1 round

The JSON holds the runs, the table (``table``: its rows) and ``_report.run_header``'s machine,
device, jax version, date and command.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from _report import check_at_least, run_header, validated, write_json  # benchmarks/_report.py

SIDES = {"none": dict(checkpoint_every=None), "every 25": dict(checkpoint_min_interval_s=0),
         "default": dict()}


QUICK = {"repeats": 1, "updates": 25, "model": "logreg"}
DEFAULTS = {"repeats": 3, "updates": 500, "model": "mlp"}


def side_config(side: str, args, output_dir: str):
    from jaxfl.config import RunConfig

    # rule fedcompass: FedAsync's default until 2026-12-02, under which the figures in
    # benchmarks/README.md were measured (the rule changes the arithmetic of an update, not its cost)
    return RunConfig(algorithm="fedasync", rule="fedcompass", dataset="mnist10k", model=args.model, clients=20,
                     max_updates=args.updates, eval_every=max(1, args.updates // 5), stop_at_target=False,
                     max_time=float("inf"), progress=False, output_dir=output_dir, seed=0, **SIDES[side])


def run_side(side: str, args, output_dir: str) -> dict:
    from jaxfl import checkpoint
    from jaxfl.experiment import run_experiment

    result = run_experiment(side_config(side, args, output_dir))
    summary, folder = result.summary, checkpoint.latest(result.run_dir)  # every side writes a final one
    size = sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder) for name in names)
    return {"side": side, "wall_s": summary["wall_time_s"], "checkpoint_s": summary["checkpoint_wall_s"],
            "saves": summary["checkpoints_written"], "checkpoint_mb": size / 1e6,
            "final_accuracy": summary["final_accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, help="rounds of the three sides (default 3; --quick: 1)")
    parser.add_argument("--updates", type=int, help="global updates a run (default 500; --quick: 25)")
    parser.add_argument("--model", help="jaxfl's model name (default mlp; --quick: logreg)")
    parser.add_argument("--quick", action="store_true", help="smoke size (CI): logreg, 25 updates, 1 round")
    parser.add_argument("--json", default=None, help="write the runs, the table's figures, the machine, device, "
                        "jax version and date here")
    args = parser.parse_args()
    # at least 25 updates: the "every 25" side saves once before the end
    check_at_least(parser, args, {"repeats": 1, "updates": 25})
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    validated(parser, side_config("default", args, "unused"), {"model": "--model"})
    header = run_header("checkpoint_overhead", quick=args.quick, model=args.model, updates=args.updates,
                        repeats=args.repeats, load_average_before=os.getloadavg())
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.repeats):
            for side in SIDES:
                started = time.perf_counter()
                runs.append(run_side(side, args, os.path.join(scratch, f"{side}-{round_}")))
                print(f"round {round_ + 1} {side:>8}: wall {runs[-1]['wall_s']:.2f} s "
                      f"({time.perf_counter() - started:.1f} s with set-up), "
                      f"checkpoints {runs[-1]['checkpoint_s']:.2f} s", flush=True)
    median = lambda side, key: statistics.median(r[key] for r in runs if r["side"] == side)  # noqa: E731
    base = median("none", "wall_s")
    rows = [{"side": side, "wall_s": median(side, "wall_s"), "checkpoint_s": median(side, "checkpoint_s"),
             "saves": median(side, "saves"), "checkpoint_mb": median(side, "checkpoint_mb"),
             "per_save_s": median(side, "checkpoint_s") / median(side, "saves"),
             "overhead": median(side, "wall_s") / base - 1,
             "final_accuracy": sorted({r["final_accuracy"] for r in runs if r["side"] == side})} for side in SIDES]
    print(f"\nFedAsync, mnist10k, {args.model}, 20 clients, {args.updates} updates; medians of {args.repeats}\n")
    print("| periodic checkpoints | wall s | saves | checkpoint s (per save) | MB | overhead | final accuracy |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for row in rows:
        print(f"| {row['side']} | {row['wall_s']:.2f} | {row['saves']:g} | {row['checkpoint_s']:.2f} ({row['per_save_s']:.3f}) | "
              f"{row['checkpoint_mb']:.1f} | {100 * row['overhead']:+.1f}% | {', '.join(f'{a:.4f}' for a in row['final_accuracy'])} |")
    write_json(args.json, {**header, "runs": runs, "table": rows, "load_average": os.getloadavg()}, indent=1)


if __name__ == "__main__":
    main()
