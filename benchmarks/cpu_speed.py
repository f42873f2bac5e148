"""jaxfl with engine defaults against a plain sequential PyTorch loop of the same FedAvg work, side by
side on this machine's CPU (issue 17, target 1).

Workloads (Fashion-MNIST, PyTorch's MNIST example CNN of 1.2 M parameters, plain SGD at lr 0.1,
server lr 1, the same as ``benchmarks/torch_loop.py``):

- ``cross_device``: 1,000 clients × 60 images (IID), 50 clients per round, one epoch = 6 steps of
  batch 10 (target: jaxfl ≥ 1.0× the loop's samples/s);
- ``cross_silo``: 10 clients × 6,000 images, all 10 per round, 50 steps of batch 64 (target ≥ 0.6×).

jaxfl runs ``jaxfl.run_experiment`` with no engine option set: the execution plan it chooses is
printed. Its round time is the wall time between the evaluations at global versions R and 2R (the
first R rounds warm up: compilation) less the evaluation at 2R, timed as the run makes it. Over the same
rounds it prints the host's share: the main Python thread's CPU time (the scheduler, the engine's
bookkeeping, its dispatches and transfers) over the wall time (target ≤ 5 %), and the load average
beside it (the machines are shared: other jobs slow both sides). The PyTorch
loop runs in a subprocess (``--torch-python``: a Python with torch, by default
``benchmarks/.venv-torch/bin/python``; see torch_loop.py for installing it); the two sides
alternate ``--repeats`` times, so that the shared machine's noise hits both, and the table gives
each side's median and the ratio of the medians. Where no torch is found the jaxfl side still runs
and the baseline column says why it is missing.

    python benchmarks/cpu_speed.py                              # both workloads, full size
    python benchmarks/cpu_speed.py --workloads cross_device --repeats 3 --json out.json
    python benchmarks/cpu_speed.py --quick                      # seconds-long smoke size (CI)
    python benchmarks/cpu_speed.py --data-dir /path/to/fashion-mnist   # the IDX files (.gz) elsewhere

Both sides read Fashion-MNIST from ``--data-dir`` (default: jaxfl's folder,
``/usr/share/datasets/fashion-mnist``, Debian's ``dataset-fashion-mnist``); a folder without its four
IDX files is refused before anything runs.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax

from jaxfl import RunConfig, run_experiment
from jaxfl.execution import ExecutionPlan
from jaxfl.data.datasets import FASHION_MNIST_DIR
from _report import check_at_least, check_data_dir, outside_training_share, run_header, write_json  # benchmarks/

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TORCH_PYTHON = os.path.join(HERE, ".venv-torch", "bin", "python")
WORKLOADS = {
    "cross_device": dict(clients=1000, clients_per_round=50, local_steps=6, batch_size=10, rounds=5),
    "cross_silo": dict(clients=10, clients_per_round=10, local_steps=50, batch_size=64, rounds=2),
}
QUICK = {
    "cross_device": dict(clients=1000, clients_per_round=4, local_steps=6, batch_size=10, rounds=1),
    "cross_silo": dict(clients=10, clients_per_round=10, local_steps=2, batch_size=64, rounds=1),
}


def workload_config(name: str, size: dict, output_dir: str, run_name: str, data_dir: str | None = None) -> RunConfig:
    rounds = size["rounds"]
    return RunConfig(algorithm="fedavg", dataset="fashion_mnist", data_dir=data_dir, model="cnn_example",
                     clients=size["clients"],
                     partition="iid", clients_per_round=size["clients_per_round"], local_steps=size["local_steps"],
                     batch_size=size["batch_size"], client_optimizer="sgd", client_lr=0.1, server_lr=1.0,
                     heterogeneity="homo", max_updates=2 * rounds, eval_every=rounds,
                     stop_at_target=False, max_time=float("inf"), progress=False, output_dir=output_dir,
                     run_name=run_name)


def _process_time() -> float:
    """The process's CPU time, every thread's (``os.times()`` counts in 10 ms ticks: too coarse for
    the quick sizes)."""
    return time.process_time()


def _now() -> tuple[float, float, float]:
    """The wall clock, the main Python thread's CPU time (the scheduler, the engine's bookkeeping and
    its dispatching: the host's work) and the whole process's CPU time (the devices' work as well)."""
    return time.perf_counter(), time.thread_time(), _process_time()


class _Clocks:
    """A metrics logger that notes :func:`_now` at each evaluated version, and what the evaluation just
    before it took: the run's own evaluator is timed as the run calls it (:meth:`timing_evaluations`),
    so that a window between two versions can leave out the evaluation inside it exactly."""

    def __init__(self):
        self.at: dict[int, tuple[float, float, float]] = {}
        self.evaluation_at: dict[int, tuple[float, float, float]] = {}
        self._last_evaluation = (0.0, 0.0, 0.0)

    def log(self, row: dict, step: int | None = None) -> None:
        self.at[row["version"]] = _now()
        self.evaluation_at[row["version"]] = self._last_evaluation

    def close(self) -> None:
        pass

    @contextlib.contextmanager
    def timing_evaluations(self):
        """Within the block, the evaluator a run builds (``jaxfl.experiment.held_out_evaluator``) notes
        each evaluation's wall, thread and process time for the :meth:`log` that follows it."""
        import jaxfl.experiment as experiment

        build = experiment.held_out_evaluator

        def timed_evaluator(*args, **options):
            evaluate = build(*args, **options)

            def timed(params):
                before = _now()
                stats = evaluate(params)
                self._last_evaluation = tuple(after - start for after, start in zip(_now(), before))
                return stats

            timed.batch_size = evaluate.batch_size
            return timed

        experiment.held_out_evaluator = timed_evaluator
        try:
            yield
        finally:
            experiment.held_out_evaluator = build


def time_jaxfl(name: str, size: dict, output_dir: str, repeat: int, data_dir: str | None = None) -> dict:
    # (version 0 is outside the measured window: not evaluated)
    config = dataclasses.replace(workload_config(name, size, output_dir, f"{name}-{repeat}", data_dir),
                                 eval_at_start=False)
    clocks = _Clocks()
    with clocks.timing_evaluations():
        result = run_experiment(config, loggers=[clocks])
    rows = {row["version"]: row for row in result.metrics}
    rounds = size["rounds"]
    # The measured rounds: versions R to 2R, less the evaluation at 2R (the one inside the window), as
    # the run made it. Re-timed apart, with another evaluator, it once took longer than the window.
    evaluation, evaluation_host, evaluation_process = clocks.evaluation_at[2 * rounds]
    (wall_0, host_0, process_0), (wall_1, host_1, process_1) = clocks.at[rounds], clocks.at[2 * rounds]
    window = wall_1 - wall_0 - evaluation
    seconds = window / rounds
    samples = size["clients_per_round"] * size["local_steps"] * size["batch_size"]
    stats = result.engine.stats
    summary = result.summary
    return {"seconds_per_round": seconds, "samples_per_second": samples / seconds,
            "evaluation_seconds": evaluation, "accuracy": rows[2 * rounds]["accuracy"],
            "padding_waste": summary["padding_waste"], "compilations": summary["compilations"],
            "train_calls": stats.train_calls, "plan": dataclasses.asdict(result.engine.plan),
            "run_wall_s": summary["wall_time_s"], "compile_wall_s": summary["compile_wall_s"],
            "training_wall_s": summary["training_wall_s"],
            # the host's share: the main Python thread's CPU time (the scheduler, the engine's
            # bookkeeping, dispatching and transfers) over the wall time of the measured rounds
            "host_share": round((host_1 - host_0 - evaluation_host) / window, 4),
            # cores kept busy by the process in the measured rounds (other jobs on a shared machine lower it)
            "cores_busy": round((process_1 - process_0 - evaluation_process) / window / (os.cpu_count() or 1), 3),
            # the rate least moved by other jobs: samples trained per second of the process's CPU time
            "samples_per_cpu_second": round(samples * rounds / (process_1 - process_0 - evaluation_process), 1),
            # the same as the CPU time of one client step (one batch), in milliseconds
            "cpu_ms_per_step": round((process_1 - process_0 - evaluation_process) * 1e3 / (
                size["clients_per_round"] * size["local_steps"] * rounds), 4),
            "outside_training_share": outside_training_share(summary),
            "load_average": round(os.getloadavg()[0], 2)}


def time_torch(name: str, size: dict, torch_python: str | None, quick: bool, threads: int | None = None,
               data_dir: str | None = None) -> dict:
    if torch_python is None:
        return {"skipped": "no Python with torch: create benchmarks/.venv-torch (see torch_loop.py) or pass --torch-python"}
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "torch.json")
        command = [torch_python, os.path.join(HERE, "torch_loop.py"), "--workload", name,
                   "--rounds", str(size["rounds"]), "--json", out] + (["--quick"] if quick else []) \
            + ([] if threads is None else ["--threads", str(threads)]) \
            + ([] if data_dir is None else ["--data-dir", data_dir])
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            return {"skipped": f"torch_loop.py failed: {done.stderr.strip().splitlines()[-1:]}"}
        with open(out) as handle:
            return json.load(handle)


def find_torch_python(requested: str | None) -> str | None:
    for candidate in ([requested] if requested else [DEFAULT_TORCH_PYTHON, sys.executable]):
        if candidate and os.path.exists(candidate) and subprocess.run(
                [candidate, "-c", "import torch"], capture_output=True).returncode == 0:
            return candidate
    if requested:
        raise ValueError(f"--torch-python {requested} is not allowed: it cannot import torch; a Python that can")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=sorted(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=2, help="alternations of the two sides (medians are reported)")
    parser.add_argument("--torch-python", help="a Python that can import torch (default: benchmarks/.venv-torch)")
    parser.add_argument("--torch-threads", type=int, help="the PyTorch loop's threads (default: torch_loop.py's, "
                        "every core); 1 on a loaded machine, where torch's threads busy-wait for each other")
    parser.add_argument("--data-dir", default=FASHION_MNIST_DIR, help="folder of the Fashion-MNIST IDX files, "
                        "for both sides (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke size")
    parser.add_argument("--json", help="write the rows, the machine, device, jax version and date here")
    args = parser.parse_args()
    check_at_least(parser, args, {"repeats": 1, "torch_threads": 1})
    check_data_dir(parser, "--data-dir", args.data_dir)
    if args.torch_python is not None and not os.path.exists(args.torch_python):
        parser.error(f"--torch-python {args.torch_python} is not allowed: no such file; a Python that can import torch")
    try:
        torch_python = find_torch_python(args.torch_python)
    except ValueError as error:
        parser.error(str(error))
    sizes = QUICK if args.quick else WORKLOADS
    plan = ExecutionPlan.for_backend(jax.default_backend())
    print(f"jax {jax.__version__} on {jax.default_backend()}: {plan.devices} device(s), {os.cpu_count()} cores; "
          f"torch from {torch_python or 'nowhere (baseline skipped)'}")
    rows = []
    with tempfile.TemporaryDirectory() as output_dir:
        for name in args.workloads:
            size = sizes[name]
            jaxfl_runs, torch_runs = [], []
            for repeat in range(1 if args.quick else args.repeats):
                jaxfl_runs.append(time_jaxfl(name, size, output_dir, repeat, args.data_dir))
                torch_runs.append(time_torch(name, size, torch_python, args.quick, args.torch_threads, args.data_dir))
            jaxfl_rate = statistics.median(run["samples_per_second"] for run in jaxfl_runs)
            torch_rates = [run["samples_per_second"] for run in torch_runs if "samples_per_second" in run]
            torch_rate = statistics.median(torch_rates) if torch_rates else None
            row = {"workload": name, **{k: size[k] for k in ("clients", "clients_per_round", "local_steps",
                                                             "batch_size", "rounds")},
                   "jaxfl_samples_per_second": round(jaxfl_rate, 1),
                   "torch_samples_per_second": None if torch_rate is None else round(torch_rate, 1),
                   "ratio": None if torch_rate is None else round(jaxfl_rate / torch_rate, 3),
                   "host_share": statistics.median(run["host_share"] for run in jaxfl_runs),
                   "load_average": [run["load_average"] for run in jaxfl_runs],
                   "jaxfl_runs": jaxfl_runs, "torch_runs": torch_runs}
            rows.append(row)
            print(f"{name}: jaxfl {jaxfl_rate:,.0f} samples/s (plan {jaxfl_runs[0]['plan']}, padding "
                  f"{jaxfl_runs[0]['padding_waste']:.0%}, compilations {jaxfl_runs[0]['compilations']}, "
                  f"{statistics.median(run['samples_per_cpu_second'] for run in jaxfl_runs):,.0f} per CPU-second "
                  f"({statistics.median(run['cpu_ms_per_step'] for run in jaxfl_runs):.2f} CPU-ms per client step), "
                  f"host thread busy {statistics.median(run['host_share'] for run in jaxfl_runs):.1%} and cores busy "
                  f"{statistics.median(run['cores_busy'] for run in jaxfl_runs):.0%} of the measured rounds, "
                  f"outside training calls {statistics.median(run['outside_training_share'] for run in jaxfl_runs):.1%} "
                  f"of the run less compiling and evaluating; load average {os.getloadavg()[0]:.1f}), "
                  + (f"torch {torch_rate:,.0f} samples/s ({torch_runs[0].get('threads')} threads), "
                     f"ratio {jaxfl_rate / torch_rate:.2f}×" if torch_rate else f"torch: {torch_runs[0]['skipped']}"))
    print("\n| workload | jaxfl samples/s | PyTorch loop samples/s | ratio | host share | load average |\n"
          "|---|---:|---:|---:|---:|---|")
    for row in rows:
        print(f"| {row['workload']} | {row['jaxfl_samples_per_second']:,} | "
              f"{row['torch_samples_per_second'] if row['torch_samples_per_second'] is not None else '—'} | "
              f"{row['ratio'] if row['ratio'] is not None else '—'} | {row['host_share']:.1%} | "
              f"{', '.join(f'{load:.1f}' for load in row['load_average'])} |")
    write_json(args.json, {**run_header("cpu_speed", quick=args.quick, data_dir=args.data_dir,
                                        torch_python=torch_python), "rows": rows})


if __name__ == "__main__":
    main()
