"""A million-client FedBuff training run (issue 13): what it costs, end to end, with the engine's defaults.

FedBuff (Nguyen et al., AISTATS 2022: K = 10 updates per aggregation, 1,000 clients in flight) on
FedProx's synthetic federation (``synthetic_iid``, one generated client per jaxfl client, ~20
samples each; ``--dataset synthetic:A,B`` for the non-IID variant), a small model (``logreg``,
610 parameters; ``--model mlp``, 54,410), 5 local SGD steps of batch 10 at lr 0.05, exponential
client speeds. Each run is one ``jaxfl.run_experiment`` with no engine option set, and reports:

- ``build s``: creating the federation (generating the samples, partitioning) and the model, i.e.
  the run's wall time before its own clock starts (``run_experiment`` wall less ``wall_time_s``);
- ``first update s``: from the start of the run (after the build) to the first aggregation
  (``first_update_wall_s``: placing the data, the first evaluation, compiling, training K updates);
- ``run s`` (``wall_time_s``) and its parts: compiling, training calls, evaluations, checkpoints;
- aggregations, client-steps executed ÷ aggregated (goal ≤ 1.1), events (arrivals and replies on
  the virtual clock) per wall second of the run;
- peak host RSS (``peak_host_memory_mb``) and the engine's device accounting: the samples on the
  device, the peak of model state (global versions in-flight clients started from, trained
  updates), and the backend's own peak where it reports one (GPUs);
- the held-out loss and accuracy of the initial and the final model (the model moves);
- checkpoints: the newest state.pkl's bytes, the bytes of ``checkpoints/`` at the end (the two kept
  checkpoints and the per-client columns they share under ``arrays/``), and seconds per save.

    python benchmarks/million_clients.py                          # 10^6 clients, 300 aggregations
    python benchmarks/million_clients.py --clients 100000 --concurrency 100 --updates 300
    python benchmarks/million_clients.py --models logreg mlp --updates 1000 --json out.json
    python benchmarks/million_clients.py --quick                  # 2,000 clients, 3 aggregations (CI)

Several ``--models`` run one after another, each building its own federation (the same one: same
seed). The JSON (machine, device, jax version, date, load average, command) is rewritten after
each run, so a run cut short by a time limit keeps the finished ones; ``--time-budget`` ends a run
at its first evaluation past that many seconds, with its figures.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import jax

from jaxfl import RunConfig, run_experiment
from _report import check_above, check_at_least, run_header, validated, write_json  # benchmarks/_report.py


def config_for(args, model: str, output_dir: str) -> RunConfig:
    return RunConfig(algorithm="fedbuff", dataset=args.dataset, partition="natural", clients=args.clients,
                     model=model, concurrency=args.concurrency, buffer_size=args.buffer_size,
                     local_steps=args.local_steps, batch_size=args.batch_size, client_optimizer="sgd",
                     client_lr=args.client_lr, max_updates=args.updates, max_time=float("inf"),
                     eval_every=args.eval_every, stop_at_target=False, progress=False,
                     # a save's cost is measured at a fixed cadence: no wall-time spacing
                     checkpoint_every=args.checkpoint_every, checkpoint_min_interval_s=0, seed=args.seed, output_dir=output_dir,
                     run_name=f"{model}-{args.clients}")


# the config fields the flags set, for naming the flag in a ConfigError
FLAGS = {"dataset": "--dataset", "clients": "--clients", "model": "--models", "concurrency": "--concurrency",
         "buffer_size": "--buffer-size", "local_steps": "--local-steps", "batch_size": "--batch-size",
         "client_lr": "--client-lr", "max_updates": "--updates", "eval_every": "--eval-every",
         "checkpoint_every": "--checkpoint-every", "seed": "--seed"}


class WallClockBudget:
    """A logger (``run_experiment(loggers=...)``) that stops the run at its first evaluation past a
    wall-clock deadline, so that a run under a time limit ends with its summary and metrics written."""

    name = "time_budget"

    def __init__(self, seconds: float):
        self.deadline = time.perf_counter() + seconds

    def log(self, row: dict, step: int) -> bool:
        return time.perf_counter() > self.deadline

    def close(self) -> None:
        pass


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def checkpoint_figures(run_dir: str, summary: dict, args) -> dict:
    """Bytes of the newest state.pkl and of ``checkpoints/`` at the end, and seconds per save."""
    root = os.path.join(run_dir, "checkpoints")
    with open(os.path.join(root, "latest")) as handle:
        newest = os.path.join(root, handle.read().strip())
    saves = summary["checkpoints_written"]  # every --checkpoint-every updates exactly, and the end
    return {"state_pkl_mb": round(os.path.getsize(os.path.join(newest, "state.pkl")) / 2**20, 2),
            "checkpoints_mb": round(folder_bytes(root) / 2**20, 1), "saves": saves,
            "save_s": round(summary["checkpoint_wall_s"] / saves, 3)}


def measure(args, model: str, output_dir: str) -> dict:
    config = config_for(args, model, output_dir)
    started = time.perf_counter()
    result = run_experiment(config, loggers=[WallClockBudget(args.time_budget)] if args.time_budget else [])
    total = time.perf_counter() - started
    summary, rows = result.summary, result.metrics
    memory = summary["device_memory"]
    return {
        "model": model, "clients": args.clients, "concurrency": summary["policy"]["concurrency"],
        "buffer_size": args.buffer_size, "dataset": args.dataset,
        "build_s": round(total - summary["wall_time_s"], 2),
        "first_update_s": summary["first_update_wall_s"],
        "run_s": summary["wall_time_s"], "total_s": round(total, 2),
        "compile_s": summary["compile_wall_s"], "training_s": summary["training_wall_s"],
        "evaluation_s": summary["evaluation_wall_s"], "checkpoint_s": summary["checkpoint_wall_s"],
        "aggregations": summary["global_updates"], "stop_reason": summary["stop_reason"],
        "client_steps_aggregated": summary["client_steps_aggregated"],
        "client_steps_executed": summary["client_steps_executed"],
        "executed_per_aggregated": summary["executed_per_aggregated"],
        "events": summary["timeline"]["events"],
        "events_per_s": round(summary["timeline"]["events"] / summary["wall_time_s"], 1),
        "train_calls": summary["train_calls"], "mean_clients_per_call": summary["mean_clients_per_batch"],
        "peak_host_mb": summary["peak_host_memory_mb"],
        "device_data_mb": round(memory["data_bytes"] / 2**20, 1),
        "device_peak_model_state_mb": round(memory["peak_model_state_bytes"] / 2**20, 3),
        "device_peak_versions": memory["peak_versions_kept"],
        "backend_peak_mb": None if memory["backend_peak_bytes"] is None else round(memory["backend_peak_bytes"] / 2**20, 1),
        "model_bytes": memory["model_bytes"],
        "start_loss": rows[0]["loss"], "final_loss": rows[-1]["loss"],
        "start_accuracy": rows[0]["accuracy"], "final_accuracy": rows[-1]["accuracy"],
        "evaluations": len(rows), "plan": {"devices": len(result.engine.mesh.devices.flat),
                                           "clients_per_call": result.engine.plan.clients_per_call,
                                           "steps_per_call": result.engine.plan.steps_per_call,
                                           "step_loop": summary["step_loop"]},
        **checkpoint_figures(result.run_dir, summary, args),
        "load_average_after": [round(value, 2) for value in os.getloadavg()],
    }


# (key, header, format): the table's columns
COLUMNS = (("model", "model", "{:<7}"), ("clients", "clients", "{:>9,}"), ("build_s", "build s", "{:>7.1f}"),
           ("first_update_s", "1st update s", "{:>12.1f}"), ("run_s", "run s", "{:>6.1f}"),
           ("aggregations", "aggs", "{:>5}"), ("executed_per_aggregated", "ex/agg", "{:>6.3f}"),
           ("events_per_s", "events/s", "{:>8,.0f}"), ("peak_host_mb", "host MB", "{:>7,.0f}"),
           ("device_data_mb", "data MB", "{:>7,.0f}"), ("device_peak_model_state_mb", "state MB", "{:>8.2f}"),
           ("start_loss", "loss 0", "{:>6.3f}"), ("final_loss", "loss", "{:>6.3f}"),
           ("start_accuracy", "acc 0", "{:>6.3f}"), ("final_accuracy", "acc", "{:>6.3f}"),
           ("state_pkl_mb", "pkl MB", "{:>6.2f}"), ("checkpoints_mb", "ckpts MB", "{:>8.1f}"),
           ("save_s", "save s", "{:>6.2f}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=1000, help="clients in flight (FedBuff's paper: 1,000)")
    parser.add_argument("--buffer-size", type=int, default=10, help="FedBuff's K")
    parser.add_argument("--updates", type=int, default=300, help="aggregations (max_updates)")
    parser.add_argument("--eval-every", type=int, help="evaluate every this many aggregations (default updates / 6)")
    parser.add_argument("--models", nargs="+", default=["logreg"], help="logreg (610 parameters), mlp (54,410), ...")
    parser.add_argument("--dataset", default="synthetic_iid", help="synthetic_iid, synthetic or synthetic:A,B")
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--client-lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=25, help="aggregations between checkpoints")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, help="seconds a run may take, building included: it stops at "
                        "its first evaluation past them (stop_reason 'stopped by time_budget')")
    parser.add_argument("--quick", action="store_true", help="2,000 clients, 100 in flight, 3 aggregations (CI)")
    parser.add_argument("--json", help="write the runs, machine, device, jax version, date and command here")
    args = parser.parse_args()
    check_at_least(parser, args, {"clients": 1, "concurrency": 1, "buffer_size": 1, "updates": 1, "eval_every": 1,
                                  "local_steps": 1, "batch_size": 1, "checkpoint_every": 1, "seed": 0})
    check_above(parser, args, {"client_lr": 0, "time_budget": 0})
    warnings.filterwarnings("ignore", message="dataset .* has no default target accuracy")  # none is wanted
    if args.quick:
        args.clients, args.concurrency, args.updates = 2000, 100, 3
    if args.eval_every is None:
        args.eval_every = max(1, args.updates // 6)
    for model in args.models:  # a size or name jaxfl refuses fails here, before any federation is built
        validated(parser, config_for(args, model, "unused"), FLAGS)
    device = jax.devices()[0]
    header = run_header("million_clients", quick=args.quick,
                        load_average_before=[round(v, 2) for v in os.getloadavg()],
                        settings={key: value for key, value in vars(args).items() if key not in ("json", "quick")})
    print(f"FedBuff, {args.clients:,} clients of {args.dataset}, {args.concurrency:,} in flight, K = "
          f"{args.buffer_size}, {args.local_steps} steps of batch {args.batch_size}, {args.updates} aggregations; "
          f"jax {jax.__version__} on {jax.default_backend()} ({device.device_kind}, {jax.device_count()} device(s)); "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    print("  ".join(f"{name:<7}" if key == "model" else f"{name:>{len(fmt.format(0))}}"
                    for key, name, fmt in COLUMNS), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as output_dir:
        for model in args.models:
            row = measure(args, model, output_dir)
            rows.append(row)
            print("  ".join(fmt.format(row[key]) for key, _, fmt in COLUMNS), flush=True)
            write_json(args.json, {**header, "rows": rows})
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
