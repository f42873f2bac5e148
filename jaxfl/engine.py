"""The engine: joins the scheduler (which decides) and the kernels (which compute).

It keeps the federation's samples and the global model versions on device and implements the
simulation's :class:`~jaxfl.scheduler.simulation.Backend`. The central idea (DESIGN.md): a
dispatch is not trained when it is made. The engine keeps the *pending* dispatches and trains all
of them in vmapped calls the first time an aggregation needs one of their results; a client's
result depends only on (start model, its data, its step count, its key), so this equals training
each at dispatch (``batching=False``) up to floating-point reassociation.

Calls are shaped so that jit compiles once per bucket: the clients of a call are padded to a power
of two (padding entries take zero steps) and the step loop runs in chunks of ``steps_per_call``
steps (a fully unrolled ``lax.scan``; steps past a client's count are masked). Padding is counted.

>>> # see jaxfl.experiment.run_experiment for the full wiring
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfl.kernels.aggregation import apply_server_update, tree_add, tree_scale, weighted_sum
from jaxfl.kernels.client import ClientTrainer, ClientView, FederatedArrays
from jaxfl.scheduler.simulation import Aggregation, DispatchRecord

PyTree = Any
TRAIN_STREAM = 11  # fold_in(root key, TRAIN_STREAM) → per-(client, client_round) training keys


class NumericalError(RuntimeError):
    """A client produced a NaN/Inf loss or update."""


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
class _TrainedBatch:
    deltas: PyTree  # stacked on the padded client axis K
    size: int  # padded K; the arrays are freed once no unconsumed result refers to the batch


@dataclasses.dataclass
class EngineStats:
    train_calls: int = 0  # jitted step-chunk calls
    batches: int = 0  # trainings of a set of pending dispatches (one per chunk of clients)
    clients_trained: int = 0
    useful_steps: int = 0  # Σ requested local steps of trained dispatches
    aggregated_steps: int = 0  # Σ local steps of the updates aggregated so far
    executed_steps: int = 0  # steps computed, padding (masked steps, padded clients) included
    traces: dict = dataclasses.field(default_factory=dict)  # function name → times jit traced it

    @property
    def padding_waste(self) -> float:
        """Masked-out steps ÷ executed steps."""
        return 0.0 if self.executed_steps == 0 else 1.0 - self.useful_steps / self.executed_steps

    @property
    def mean_clients_per_batch(self) -> float:
        return 0.0 if self.batches == 0 else self.clients_trained / self.batches


def _next_power_of_two(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


class Engine:
    """Numerical backend of a :class:`~jaxfl.scheduler.simulation.Simulation`.

    ``evaluate(params) -> dict`` (accuracy, loss) is called on global versions; ``on_version``
    receives ``(aggregation_time, version, params)`` after each global update so the runner can
    evaluate and decide to stop (it returns True to stop).
    """

    def __init__(self, trainer: ClientTrainer, init_params: PyTree, data: FederatedArrays,
                 offsets: np.ndarray, counts: np.ndarray, server_optimizer: optax.GradientTransformation,
                 seed: int, plan: ExecutionPlan, batching: bool = True,
                 on_version: Callable[[float, int, PyTree], bool] | None = None,
                 keep_start_versions: bool = False):
        self.trainer = trainer
        self.data = data
        self.offsets = np.asarray(offsets, dtype=np.int32)
        self.counts = np.asarray(counts, dtype=np.int32)
        self.server_optimizer = server_optimizer
        self.plan = plan
        self.batching = batching
        # FedAsync's mixing rule needs each update's start model at aggregation time; otherwise a
        # version is dropped as soon as every dispatch from it has been trained.
        self.keep_start_versions = keep_start_versions
        self.on_version = on_version or (lambda t, v, p: False)
        self.stats = EngineStats()
        self.params = init_params
        self.server_state = server_optimizer.init(init_params)
        self.version = 0
        self._versions: dict[int, PyTree] = {0: init_params}
        self._version_users: dict[int, int] = {}  # dispatches still needing a version's params
        self._pending: list[DispatchRecord] = []
        self._results: dict[int, tuple[_TrainedBatch, int]] = {}
        self._client_metrics: dict[int, dict] = {}
        self._tier_models: dict[int, PyTree] = {}  # FedAT's latest model of each tier
        self._train_root = jax.random.fold_in(jax.random.key(seed), TRAIN_STREAM)
        self._build_functions()

    # ----------------------------------------------------------------- jitted pieces
    def _count_trace(self, name: str) -> None:
        self.stats.traces[name] = self.stats.traces.get(name, 0) + 1

    def _build_functions(self) -> None:
        trainer, steps_per_call = self.trainer, self.plan.steps_per_call

        def init(stacked_params, num_steps, clients, rounds, lr_scales):
            self._count_trace("init")
            keys = jax.vmap(lambda c, r: jax.random.fold_in(jax.random.fold_in(self._train_root, c), r))(
                clients, rounds)
            return jax.vmap(trainer.init)(stacked_params, num_steps, keys, lr_scales)

        def run_steps(states, data, views):
            self._count_trace("run_steps")
            batched_step = jax.vmap(trainer.step, in_axes=(0, None, 0))

            def body(carry, _):
                return batched_step(carry, data, views), None

            # Fully unrolled: XLA:CPU's convolutions inside a rolled loop are ~15× slower.
            states, _ = jax.lax.scan(body, states, None, length=steps_per_call, unroll=True)
            return states

        def finish(stacked_params, states):
            self._count_trace("finish")
            return jax.vmap(trainer.finish)(stacked_params, states)

        def server_step(params, server_state, pseudo_gradient):
            self._count_trace("server_step")
            return apply_server_update(self.server_optimizer, params, server_state, pseudo_gradient)

        self._init = jax.jit(init)
        self._run_steps = jax.jit(run_steps, donate_argnums=0)
        self._finish = jax.jit(finish)
        self._server_step = jax.jit(server_step)
        self._weighted_sum = jax.jit(weighted_sum)

    # ----------------------------------------------------------------- Backend API
    def on_dispatch(self, record: DispatchRecord) -> None:
        self._version_users[record.version] = self._version_users.get(record.version, 0) + 1
        self._pending.append(record)
        if not self.batching:
            self._train_pending()

    def on_aggregate(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> bool:
        if any(record.id not in self._results for record in records):
            self._train_pending()
        self._check_finite(aggregation, records)
        self.stats.aggregated_steps += sum(record.steps for record in records)
        if aggregation.mode == "tier":
            self.params = self._tier_update(aggregation, records)
            for record in records:
                self._release(record)
            self.version = aggregation.version
            self._versions[self.version] = self.params
            self._forget_unused_versions()
            return bool(self.on_version(aggregation.time, self.version, self.params))
        pseudo_gradient = self._combine(aggregation, records)
        if aggregation.server_optimizer:
            self.params, self.server_state = self._server_step(self.params, self.server_state,
                                                               pseudo_gradient)
        else:
            self.params = jax.tree.map(jnp.subtract, self.params, pseudo_gradient)
        for record in records:
            self._release(record)
        self.version = aggregation.version
        self._versions[self.version] = self.params
        self._forget_unused_versions()
        return bool(self.on_version(aggregation.time, self.version, self.params))

    def on_drop(self, record: DispatchRecord) -> None:
        if record.id in self._results:
            self._release(record)
        else:
            self._pending.remove(record)
            self._version_users[record.version] -= 1
        self._forget_unused_versions()

    # ----------------------------------------------------------------- training
    def client_metrics(self, dispatch_id: int) -> dict | None:
        """Loss, steps and finiteness of a trained dispatch (None if not trained)."""
        return self._client_metrics.get(dispatch_id)

    def flush(self) -> None:
        """Train every pending dispatch now (used by tests and to account work at the end)."""
        self._train_pending()

    def _train_pending(self) -> None:
        pending, self._pending = self._pending, []
        # Similar step counts share a call, so masked padding steps stay few.
        pending.sort(key=lambda r: (r.steps, r.id))
        size = self.plan.clients_per_call
        for start in range(0, len(pending), size):
            self._train_batch(pending[start:start + size])

    def _train_batch(self, records: list[DispatchRecord]) -> None:
        count = len(records)
        padded = min(_next_power_of_two(count), _next_power_of_two(self.plan.clients_per_call))
        padded = max(padded, count)
        filler = [records[0]] * (padded - count)
        members = records + filler
        steps = np.array([r.steps for r in records] + [0] * len(filler), dtype=np.int32)
        clients = np.array([r.client for r in members], dtype=np.int32)
        rounds = np.array([r.client_round for r in members], dtype=np.int32)
        lr_scales = np.array([r.lr_scale for r in members], dtype=np.float32)
        stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves),
                               *[self._versions[r.version] for r in members])
        views = ClientView(jnp.asarray(self.offsets[clients]), jnp.asarray(self.counts[clients]))
        states = self._init(stacked, jnp.asarray(steps), jnp.asarray(clients), jnp.asarray(rounds),
                            jnp.asarray(lr_scales))
        calls = math.ceil(int(steps.max(initial=0)) / self.plan.steps_per_call)
        for _ in range(calls):
            states = self._run_steps(states, self.data, views)
        deltas, metrics = self._finish(stacked, states)
        metrics = jax.device_get(metrics)
        batch = _TrainedBatch(deltas=deltas, size=padded)
        for index, record in enumerate(records):
            self._results[record.id] = (batch, index)
            self._client_metrics[record.id] = {key: value[index].item() for key, value in metrics.items()}
        if not self.keep_start_versions:  # trained: the start model is no longer needed
            for record in records:
                self._version_users[record.version] -= 1
        self._forget_unused_versions()
        self.stats.train_calls += calls
        self.stats.batches += 1
        self.stats.clients_trained += count
        self.stats.useful_steps += int(steps.sum())
        self.stats.executed_steps += calls * self.plan.steps_per_call * padded

    # ----------------------------------------------------------------- aggregation
    def _check_finite(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> None:
        for record in records:
            if not self._client_metrics[record.id]["finite"]:
                raise NumericalError(
                    f"client {record.client} returned a non-finite loss or update at virtual time "
                    f"{aggregation.time:.3f} s (dispatch {record.id}, trained from version "
                    f"{record.version}, {record.steps} steps); lower client_lr or check the data")

    def _combine(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> PyTree:
        coefficients = dict(aggregation.contributions)
        by_batch: dict[int, tuple[_TrainedBatch, np.ndarray]] = {}
        for record in records:
            batch, index = self._results[record.id]
            entry = by_batch.setdefault(id(batch), (batch, np.zeros(batch.size, np.float32)))
            entry[1][index] = coefficients[record.id]
        total = jax.tree.map(jnp.zeros_like, self.params)  # an empty aggregation moves nothing
        for batch, weights in by_batch.values():
            total = tree_add(total, self._weighted_sum(batch.deltas, jnp.asarray(weights)))
        if aggregation.mode == "mix":
            # Σ c_i (w − w_i) = Σ c_i Δ_i + Σ c_i (w − start_i)
            if not self.keep_start_versions:
                raise ValueError("a 'mix' aggregation needs the engine built with keep_start_versions=True")
            for record in records:
                drift = jax.tree.map(jnp.subtract, self.params, self._versions[record.version])
                total = tree_add(total, tree_scale(drift, coefficients[record.id]))
        return total

    def _tier_update(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> PyTree:
        """FedAT: store the tier's client-average model, return Σ_k a_k · tier model_k.

        The tier model is Σ c_i (start_i − Δ_i) with Σ c_i = 1. A tier that has no model yet
        contributes the current global model (the model the tiers were formed from).
        """
        if not self.keep_start_versions:
            raise ValueError("a 'tier' aggregation needs the engine built with keep_start_versions=True")
        coefficients = dict(aggregation.contributions)
        average_delta = self._combine(dataclasses.replace(aggregation, mode="delta"), records)
        tier_model = tree_scale(average_delta, -1.0)
        for record in records:
            tier_model = tree_add(tier_model, tree_scale(self._versions[record.version], coefficients[record.id]))
        for tier, _ in aggregation.tier_weights:
            self._tier_models.setdefault(tier, self.params)
        self._tier_models[aggregation.tier] = tier_model
        combined = jax.tree.map(jnp.zeros_like, self.params)
        for tier, weight in aggregation.tier_weights:
            combined = tree_add(combined, tree_scale(self._tier_models[tier], weight))
        return combined

    def _release(self, record: DispatchRecord) -> None:
        self._results.pop(record.id)
        if self.keep_start_versions:
            self._version_users[record.version] -= 1

    def _forget_unused_versions(self) -> None:
        """Drop global versions no dispatch needs any more (the current one is always kept)."""
        self._version_users = {v: n for v, n in self._version_users.items() if n > 0}
        for version in list(self._versions):
            if version != self.version and version not in self._version_users:
                del self._versions[version]
