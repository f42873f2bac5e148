"""Run one experiment from a :class:`~jaxfl.config.RunConfig` and write its run directory.

A run directory holds:
- ``config.json``: the resolved config, the engine's execution plan and library versions;
- ``events.csv``: one row per event (virtual time, event, client, dispatch, model version,
  staleness, steps, detail);
- ``metrics.csv``: held-out accuracy and loss of the global model over virtual time;
- ``summary.json``: final/best accuracy, time to target, updates, client steps executed and
  padded, dispatch accounting, wall time, stop reason.

>>> from jaxfl.config import RunConfig
>>> result = run_experiment(RunConfig(algorithm="fedavg", clients=4, local_steps=5,
...                                   max_updates=2, progress=False, output_dir="/tmp/jaxfl-doc"))
>>> result.summary["global_updates"]
2
"""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import platform
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfl.algorithms import build_policy
from jaxfl.config import RunConfig, validate
from jaxfl.data import build_federation, load_dataset
from jaxfl.engine import Engine, ExecutionPlan, NumericalError
from jaxfl.kernels.aggregation import make_server_optimizer
from jaxfl.kernels.client import FederatedArrays, make_client_trainer, scale_uint8
from jaxfl.models import count_params, make_model
from jaxfl.scheduler.simulation import EVENT_LOG_FIELDS, Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig

MODEL_STREAM = 12  # fold_in(key(seed), MODEL_STREAM) initialises the global model
EVAL_BATCH = 1000
METRIC_FIELDS = ("time", "version", "accuracy", "loss", "client_steps", "wall_time")


@dataclasses.dataclass
class RunResult:
    """What a run returns in Python: its directory, summary, metrics rows and final parameters."""

    run_dir: str
    summary: dict
    metrics: list[dict]
    params: Any
    simulation: Simulation
    engine: Engine


def make_client_optimizer(name: str, learning_rate: float) -> optax.GradientTransformation:
    """The client optimiser, re-initialised at every dispatch (FedCompass MNIST: Adam, 3e-3)."""
    return {"adam": optax.adam, "sgd": optax.sgd, "adamw": optax.adamw}[name](learning_rate)


def make_evaluator(apply_fn, x: np.ndarray, y: np.ndarray, batch_size: int = EVAL_BATCH):
    """``evaluate(params) -> {"accuracy", "loss"}`` on a held-out set, in fixed-size batches.

    Batches run from a Python loop (XLA:CPU convolutions inside a rolled loop are slow); the last
    batch is padded and masked so one compilation serves all.
    """
    count = len(y)
    padded = math.ceil(count / batch_size) * batch_size
    pad = padded - count
    x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
    y = np.concatenate([y, np.zeros(pad, y.dtype)])
    mask = np.arange(padded) < count
    batches = [(jnp.asarray(x[i:i + batch_size]), jnp.asarray(y[i:i + batch_size]),
                jnp.asarray(mask[i:i + batch_size])) for i in range(0, padded, batch_size)]

    @jax.jit
    def batch_stats(params, xb, yb, mb):
        logits = apply_fn(params, scale_uint8(xb))
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, yb)
        correct = (jnp.argmax(logits, axis=-1) == yb) & mb
        return jnp.sum(correct), jnp.sum(jnp.where(mb, losses, 0.0))

    def evaluate(params) -> dict:
        totals = [batch_stats(params, xb, yb, mb) for xb, yb, mb in batches]
        correct = sum(int(c) for c, _ in totals)
        loss = sum(float(l) for _, l in totals)
        return {"accuracy": correct / count, "loss": loss / count}

    return evaluate


def _run_dir(config: RunConfig) -> str:
    name = config.run_name or (f"{config.algorithm}-{config.dataset}-{config.heterogeneity}"
                               f"-c{config.clients}-s{config.seed}")
    path = os.path.join(config.output_dir, name)
    suffix = 2
    while os.path.exists(path):
        path = os.path.join(config.output_dir, f"{name}-{suffix}")
        suffix += 1
    return path


def _write_json(path: str, payload: dict) -> None:
    """Atomic write: a reader never sees half a file."""
    temporary = path + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(payload, handle, indent=2, default=str)
        handle.write("\n")
    os.replace(temporary, path)


class _Recorder:
    """Evaluates global versions, tracks the target and streams metrics rows."""

    def __init__(self, config: RunConfig, evaluate, metrics_file, progress, wall_start: float, params,
                 flush_also=()):
        self.config = config
        self.evaluate = evaluate
        self.file = metrics_file
        self.writer = csv.DictWriter(metrics_file, METRIC_FIELDS)
        self.writer.writeheader()
        self.flush_also = flush_also  # the event log is flushed with each metrics row
        self.progress = progress
        self.wall_start = wall_start
        self.rows: list[dict] = []
        self.time_to_target: float | None = None
        self.stats = None  # the engine's EngineStats, set once the engine exists
        self._previous_params = params  # the model in force between versions
        self._next_grid = 0.0

    def record(self, virtual_time: float, version: int, params) -> bool:
        stats = self.evaluate(params)
        row = {"time": virtual_time, "version": version, "accuracy": stats["accuracy"],
               "loss": stats["loss"], "client_steps": self.stats.aggregated_steps,
               "wall_time": round(time.perf_counter() - self.wall_start, 3)}
        self._write(row)
        if self.time_to_target is None and stats["accuracy"] >= self.config.target_accuracy:
            self.time_to_target = virtual_time
        if self.progress is not None:
            self.progress.set_postfix(version=version, acc=f"{stats['accuracy']:.4f}")
        return self.time_to_target is not None and self.config.stop_at_target

    def _write(self, row: dict) -> None:
        self.rows.append(row)
        self.writer.writerow(row)
        for handle in (*self.flush_also, self.file):  # so a live or interrupted run shows its progress
            handle.flush()

    def on_version(self, virtual_time: float, version: int, params) -> bool:
        if self.progress is not None:
            self.progress.update(max(0.0, min(virtual_time, self.progress.total) - self.progress.n))
        if self.config.eval_interval is None:
            if version % self.config.eval_every == 0:
                return self.record(virtual_time, version, params)
            return False
        stop = self.evaluate_grid_until(virtual_time, version - 1)
        self._previous_params = params
        return stop

    def evaluate_grid_until(self, virtual_time: float, version: int, inclusive: bool = False) -> bool:
        """Evaluate the model in force at each grid point before ``virtual_time`` (once per model)."""
        stop = False
        stats = None
        while self._next_grid < virtual_time or (inclusive and self._next_grid <= virtual_time):
            if stats is None:
                stats = self.evaluate(self._previous_params)
            row = {"time": self._next_grid, "version": version, "accuracy": stats["accuracy"],
                   "loss": stats["loss"], "client_steps": self.stats.aggregated_steps,
                   "wall_time": round(time.perf_counter() - self.wall_start, 3)}
            self._write(row)
            if self.time_to_target is None and stats["accuracy"] >= self.config.target_accuracy:
                self.time_to_target = self._next_grid
                stop = stop or self.config.stop_at_target
            self._next_grid += self.config.eval_interval
        return stop


def prepare(config: RunConfig):
    """Everything a run needs, built and checked before any file is written."""
    config = validate(config)
    dataset = load_dataset(config.dataset, config.data_dir)
    partition_kwargs = {"alpha": config.dirichlet_alpha} if config.partition == "dirichlet" else {}
    federation = build_federation(dataset, config.clients, config.partition, seed=config.seed,
                                  **partition_kwargs)
    model = make_model(config.model, dataset.num_classes)
    sample = jnp.zeros((1,) + dataset.train_x.shape[1:], jnp.float32)
    params = model.init(jax.random.fold_in(jax.random.key(config.seed), MODEL_STREAM), sample)
    width = jax.eval_shape(model.apply, params, sample).shape[-1]
    if width != dataset.num_classes:
        raise ValueError(f"model {config.model!r} outputs {width} logits but dataset "
                         f"{config.dataset!r} has {dataset.num_classes} classes")
    return config, dataset, federation, model, params


def run_experiment(config: RunConfig) -> RunResult:
    """Run ``config`` end to end and write its run directory (see the module docstring)."""
    config, dataset, federation, model, params = prepare(config)
    wall_start = time.perf_counter()
    plan = ExecutionPlan.for_backend(jax.default_backend(), config.clients_per_call, config.steps_per_call)
    trainer = make_client_trainer(model.apply, make_client_optimizer(config.client_optimizer, config.client_lr),
                                  config.batch_size, federation.max_count)
    server_optimizer = make_server_optimizer(config.server_optimizer, config.server_lr, config.momentum)
    policy = build_policy(config)
    model_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))
    speeds = ClientSpeeds(SpeedConfig(model=config.heterogeneity, mean=config.speed_mean, jitter=config.jitter,
                                      speed_change_prob=config.speed_change_prob, cap=config.speed_cap,
                                      negative=config.negative_times, latency=config.latency,
                                      bandwidth=config.bandwidth),
                          config.clients, seed=config.seed, model_bytes=int(model_bytes))

    run_dir = _run_dir(config)
    os.makedirs(run_dir)
    _write_json(os.path.join(run_dir, "config.json"), {
        "config": config.to_dict(), "execution_plan": dataclasses.asdict(plan),
        "backend": jax.default_backend(), "versions": {"jax": jax.__version__, "python": platform.python_version()},
        "model_parameters": count_params(params), "client_samples": federation.counts.tolist()})

    progress = None
    if config.progress:
        from tqdm.auto import tqdm

        total = config.max_time if math.isfinite(config.max_time) else None
        progress = tqdm(total=total, desc=config.algorithm, unit="vs", leave=True,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} virtual s "
                                   "[{elapsed}<{remaining}{postfix}]" if total else None)
    with open(os.path.join(run_dir, "events.csv"), "w", newline="") as events_file, \
            open(os.path.join(run_dir, "metrics.csv"), "w", newline="") as metrics_file:
        events = csv.DictWriter(events_file, EVENT_LOG_FIELDS)
        events.writeheader()
        recorder = _Recorder(config, make_evaluator(model.apply, dataset.test_x, dataset.test_y),
                             metrics_file, progress, wall_start, params, flush_also=(events_file,))
        engine = Engine(trainer, params, FederatedArrays(jnp.asarray(federation.x), jnp.asarray(federation.y)),
                        federation.offsets, federation.counts, server_optimizer, seed=config.seed, plan=plan,
                        batching=config.batching, on_version=recorder.on_version,
                        keep_start_versions=policy.needs_start_models)

        recorder.stats = engine.stats
        simulation = Simulation(policy, speeds, federation.weights(config.client_weights), engine,
                                max_time=config.max_time, max_updates=config.max_updates,
                                log=events.writerow)
        stop = recorder.record(0.0, 0, params) if config.eval_interval is None else \
            recorder.evaluate_grid_until(0.0, 0, inclusive=True)
        error = None
        try:
            reason = "target reached" if stop else simulation.run()
        except NumericalError as caught:
            error, reason = caught, f"numerical error: {caught}"
        end_time = simulation.now if reason != "time budget" else config.max_time
        if config.eval_interval is not None and error is None and reason in ("time budget", "update budget",
                                                                             "no events left"):
            recorder.evaluate_grid_until(end_time, simulation.version, inclusive=True)
        if progress is not None:
            progress.close()

    accounting = simulation.accounting()
    accuracies = [row["accuracy"] for row in recorder.rows]
    summary = {
        "algorithm": config.algorithm, "dataset": config.dataset, "clients": config.clients,
        "heterogeneity": config.heterogeneity, "seed": config.seed,
        "final_accuracy": accuracies[-1] if accuracies else None,
        "best_accuracy": max(accuracies) if accuracies else None,
        "target_accuracy": config.target_accuracy, "time_to_target": recorder.time_to_target,
        "global_updates": simulation.version, "virtual_time": end_time, "stop_reason": reason,
        "client_steps_aggregated": engine.stats.aggregated_steps,
        "client_steps_executed": engine.stats.useful_steps,
        "steps_computed_with_padding": engine.stats.executed_steps,
        "padding_waste": round(engine.stats.padding_waste, 6),
        "train_calls": engine.stats.train_calls,
        "mean_clients_per_batch": round(engine.stats.mean_clients_per_batch, 3),
        "compilations": dict(engine.stats.traces),
        "negative_speed_draws": speeds.negative_draws,
        "accounting": accounting,
        "wall_time_s": round(time.perf_counter() - wall_start, 3),
    }
    _write_json(os.path.join(run_dir, "summary.json"), summary)
    if error is not None:
        raise error
    return RunResult(run_dir, summary, recorder.rows, engine.params, simulation, engine)
