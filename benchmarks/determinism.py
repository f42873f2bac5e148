"""Does the same run, started twice in fresh processes, give the same model bit for bit? jaxfl's
schedule and sampling are deterministic; on a GPU the arithmetic may not be: XLA:GPU's autotuner
picks each convolution's and matrix product's kernel by timing it at compile time (two processes
can pick differently, and kernels differ in summation order), and some GPU kernels sum with
atomics. ``--xla_gpu_deterministic_ops=true`` (XLA's flag) excludes the non-deterministic kernels
and turns autotuning off, at a cost in step time this script measures, and perhaps a gain in
compile time (autotuning is part of XLA:GPU's 7-17 s per training program on the first H200
lease, 2026-12-04). A resumed run compiles again, so this also decides whether a GPU run resumes
bit for bit.

Each variant (``--flags``: the XLA flags added to the environment's; by default none, the
deterministic flag, and autotuning alone turned off) runs the same ``jaxfl`` experiment ``--runs``
times, each in a process of its own without a compilation cache (a cached program would repeat its
kernel choice), one variant after the other: whether
its final models are bit-identical, the largest difference of any parameter between them, the
final accuracies, and the median compile, training and wall seconds (``summary.json``'s). A
variant whose programs do not compile under its flags is reported with the error's last line.

    python benchmarks/determinism.py                  # FedAvg, mnist10k, CNN, 8 clients a call, 2 steps, 3 updates
    python benchmarks/determinism.py --quick          # logreg, 2 updates: a smoke run (CPU is fine)
    python benchmarks/determinism.py --flags '' ' --xla_gpu_enable_triton_gemm=false'   # other variants

``--json PATH`` is rewritten after each variant (a run cut at a time limit keeps the variants it
finished), with
``_report.run_header``'s machine, device, jax version and date.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import check_at_least, run_header, validated, write_json  # noqa: E402  (benchmarks/_report.py)

DETERMINISTIC = "--xla_gpu_deterministic_ops=true"
# autotuning alone off: XLA's default kernels, with atomics where XLA uses them (whether the kernel
# choice is the source, where the deterministic flag refuses a model's ops, e.g. a max-pool's gradient)
NO_AUTOTUNING = "--xla_gpu_autotune_level=0"

# One run in a fresh process: the final model to a .npz, the summary's figures as one JSON line.
CHILD = """
import hashlib, json, sys
import numpy as np
import jax
from jaxfl import RunConfig, run_experiment
config, out = json.loads(sys.argv[1]), sys.argv[2]
result = run_experiment(RunConfig(**config))
leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(result.params)]
np.savez(out, *leaves)
digest = hashlib.sha256(b"".join(leaf.tobytes() for leaf in leaves)).hexdigest()
summary = result.summary
print("RESULT " + json.dumps({"sha256": digest, "final_accuracy": summary.get("final_accuracy"),
                              "compile_s": summary.get("compile_wall_s"), "training_s": summary.get("training_wall_s"),
                              "wall_s": summary.get("wall_time_s")}))
"""


def run_once(config: dict, flags: str, out: str) -> dict:
    """One run of ``config`` in a fresh process with ``flags`` added to XLA_FLAGS, no compilation cache."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("JAX_COMPILATION_CACHE_DIR", "JAXFL_COMPILATION_CACHE")}
    env["XLA_FLAGS"] = " ".join(part for part in (os.environ.get("XLA_FLAGS", ""), flags) if part)
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config), out], capture_output=True, text=True,
                          env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = [line for line in (done.stdout + done.stderr).strip().splitlines() if line.strip()]
        return {"error": tail[-1] if tail else f"exit status {done.returncode}"}
    return json.loads(lines[-1][len("RESULT "):])


def largest_difference(paths: list[str]) -> float:
    """The largest absolute difference of any parameter between the first run's model and the others'."""
    first = np.load(paths[0])
    worst = 0.0
    for path in paths[1:]:
        other = np.load(path)
        for name in first.files:
            worst = max(worst, float(np.max(np.abs(first[name].astype(np.float64) - other[name].astype(np.float64)))))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="fresh processes a variant (default 2)")
    parser.add_argument("--flags", nargs="+", default=None, metavar="FLAGS",
                        help=f"each variant's XLA flags, '' for none, a variant's flags with a space before "
                             f"them (' --xla_gpu_autotune_level=0') (default: '', {DETERMINISTIC} and "
                             f"{NO_AUTOTUNING})")
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--model", default=None, help="default cnn (max-pool, convolutions, dense); --quick: logreg")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-round", type=int, default=8, help="clients a round (one call shape)")
    parser.add_argument("--local-steps", type=int, default=2)
    parser.add_argument("--updates", type=int, default=None, help="global updates (default 3; --quick: 2)")
    parser.add_argument("--quick", action="store_true", help="logreg, 2 updates")
    parser.add_argument("--json", help="also write the variants here")
    args = parser.parse_args()
    check_at_least(parser, args, {"runs": 2, "clients": 1, "per_round": 1, "local_steps": 1, "updates": 1})
    if args.per_round > args.clients:
        parser.error(f"--per-round {args.per_round} is not allowed: at most --clients ({args.clients})")
    flags = ["", DETERMINISTIC, NO_AUTOTUNING] if args.flags is None else [flag.strip() for flag in args.flags]
    model = args.model or ("logreg" if args.quick else "cnn")
    updates = args.updates or (2 if args.quick else 3)
    header = run_header("determinism", quick=args.quick, runs=args.runs)
    rows = []
    with tempfile.TemporaryDirectory(prefix="determinism-") as folder:
        config = {"algorithm": args.algorithm, "dataset": "mnist10k", "model": model, "clients": args.clients,
                  "clients_per_round": args.per_round, "local_steps": args.local_steps, "max_updates": updates,
                  "eval_every": updates, "stop_at_target": False, "final_checkpoint": False, "progress": False,
                  "output_dir": os.path.join(folder, "runs")}
        from jaxfl import RunConfig

        validated(parser, RunConfig(**config), {"algorithm": "--algorithm", "model": "--model", "clients": "--clients",
                                                "clients_per_round": "--per-round", "local_steps": "--local-steps",
                                                "max_updates": "--updates"})
        header["config"] = config | {"output_dir": None}
        for variant, flag in enumerate(flags):
            results, paths = [], []
            for run in range(args.runs):
                paths.append(os.path.join(folder, f"variant{variant}-run{run}.npz"))
                results.append(run_once(config | {"run_name": f"v{variant}-r{run}"}, flag, paths[-1]))
                if "error" in results[-1]:
                    break
            row = {"flags": flag, "runs": len(results)}
            if "error" in results[-1]:
                row["error"] = results[-1]["error"]
            else:
                row.update({"bit_identical": len({result["sha256"] for result in results}) == 1,
                            "largest_parameter_difference": largest_difference(paths),
                            "final_accuracies": [result["final_accuracy"] for result in results],
                            **{f"median_{name}": round(statistics.median(result[name] for result in results), 3)
                               for name in ("compile_s", "training_s", "wall_s") if results[0][name] is not None}})
            rows.append(row)
            shown = row.get("error") or (
                f"bit-identical {row['bit_identical']}, largest parameter difference "
                f"{row['largest_parameter_difference']:.3g}, final accuracies {row['final_accuracies']}, "
                f"compile {row.get('median_compile_s')} s, training {row.get('median_training_s')} s, "
                f"wall {row.get('median_wall_s')} s")
            print(f"flags {flag or '(none)'}: {shown}", flush=True)
            write_json(args.json, {**header, "rows": rows}, indent=1)
    print(f"\n{header['backend']} ({header['device']}), {args.algorithm}, mnist10k, {model}, {args.per_round} clients "
          f"a round, {args.local_steps} steps, {updates} updates, {args.runs} fresh processes each\n")
    print("| XLA flags | bit-identical | largest parameter difference | compile s | training s | wall s |\n"
          "|---|---|---:|---:|---:|---:|")
    for row in rows:
        if "error" in row:
            print(f"| {row['flags'] or '(none)'} | failed: {row['error']} | | | | |")
        else:
            print(f"| {row['flags'] or '(none)'} | {'yes' if row['bit_identical'] else 'no'} | "
                  f"{row['largest_parameter_difference']:.3g} | {row.get('median_compile_s')} | "
                  f"{row.get('median_training_s')} | {row.get('median_wall_s')} |")


if __name__ == "__main__":
    main()
