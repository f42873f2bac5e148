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

Extensions (for algorithms whose coefficients or updates need the parameters themselves; the
kernels live in ``jaxfl/kernels/{port,ccfedavg,fedasmu,fednova}.py``, the engine only dispatches):

- ``Aggregation.weighting`` names a kernel that replaces the aggregation's coefficients before the
  usual combine: ``"port"`` (cosine of each update with the last global step, PORT Eq. 1–3),
  ``"fedasmu"`` (learned per-client (λ, σ, ι) with a hypergradient step, FedASMU Formulas 1–3),
  ``"fednova"`` (c_i · τ_eff / τ_i; also applied to every delta-mode aggregation when the engine is
  built with ``normalize_steps=True``). The coefficients applied are in ``last_weights``.
- Update banks (CC-FedAvg): ``Aggregation.bank`` adds banked updates of clients that did not train
  (``bank_kind`` "delta": the client's last trained update, "model": its last trained model), and
  ``bank_store`` writes this aggregation's updates into the banks. Banks are ``(C, ...)`` arrays.
- Fresh-model fetches (FedASMU): a dispatch with ``fetch_step`` waits (untrained) until the
  simulation answers its fetch (``on_fetch``); it then trains to ``fetch_step``, mixes in the
  fetched global with the device kernel (learned (γ, ν)) and trains on.

Non-trainable model state (BatchNorm running statistics; a trainer built from a ``ModelAdapter``
whose model is ``{"params", "state"}``) never goes through the Δ/staleness arithmetic: the kernel's
delta for it is zero, and every aggregation sets the global ``"state"`` to the plain unweighted mean
of the aggregated clients' final buffers (FedCompass spec §2.6: a single update copies the client's,
a group aggregation averages them). FedAT's tier models get the mean of their clients' buffers and
the global model combines them with the tier weights, as it combines parameters. PORT's and FedASMU's
coefficients see the trainable parameters only.

All extension state lives on device in ``extensions`` (a dict of pytrees) plus ``previous_params``
(the global before the last update); runs that use no extension never touch it.

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

from jaxfl.kernels import ccfedavg as bank_kernels
from jaxfl.kernels import fedasmu as asmu_kernels
from jaxfl.kernels import port as port_kernels
from jaxfl.kernels.aggregation import apply_server_update, tree_add, tree_scale, weighted_sum
from jaxfl.kernels.fednova import fednova_coefficients
from jaxfl.kernels.client import BUFFERS, ClientTrainer, ClientView, FederatedArrays
from jaxfl.scheduler.simulation import Aggregation, DispatchRecord, NumericalError  # noqa: F401 (re-export)

PyTree = Any
TRAIN_STREAM = 11  # fold_in(root key, TRAIN_STREAM) → per-(client, client_round) training keys
# Activations of one training step, per sample, as a multiple of the sample's float32 size: a
# deliberately generous estimate (the MNIST CNN needs ~20×); the guard splits calls, it never
# changes results.
ACTIVATION_FACTOR = 64
MEMORY_HEADROOM = 0.8  # use at most this fraction of the free memory for one call
WEIGHTINGS = ("port", "fedasmu", "fednova")  # Aggregation.weighting kernels (see "Extensions")
# Device-side mixing options when a fetch names none (FedASMU's policy always sends its own).
FETCH_DEFAULTS = {"mu_beta": 1.0, "lr_gamma": 0.0, "lr_nu": 0.0, "gamma0": 1.0, "nu0": 0.0}


def tree_bytes(tree: PyTree) -> int:
    """Bytes of every array (or ShapeDtypeStruct) leaf."""
    def itemsize(dtype) -> int:
        try:
            return np.dtype(dtype).itemsize
        except TypeError:  # extended dtypes such as PRNG keys
            return 8

    return int(sum(np.prod(leaf.shape) * itemsize(leaf.dtype) for leaf in jax.tree.leaves(tree)))


def free_device_memory() -> int | None:
    """Bytes free on the default device: the accelerator's allocator limit, or MemAvailable on CPU."""
    device = jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # some backends do not implement memory_stats
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class ResourceError(MemoryError):
    """One client's training does not fit in memory; the message names the setting to lower."""


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
    buffers: PyTree = None  # stateful models: the clients' final non-trainable state, stacked on K


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
                 keep_start_versions: bool = False, memory_limit: int | None = None,
                 sample_bytes: int = 0, normalize_steps: bool = False):
        self.trainer = trainer
        # BatchNorm-style buffers ride along in the model dict; see the module docstring.
        self.stateful = bool(trainer.adapter) and isinstance(init_params, dict) and BUFFERS in init_params
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
        # Extensions (module docstring): FedNova option, on-device banks/coefficients, fetches.
        self.normalize_steps = normalize_steps
        self.extensions: dict[str, PyTree] = {}
        self.previous_params = init_params
        self.last_weights: dict[int, float] = {}
        self._fetches: dict[int, int] = {}  # dispatch id → fetched version (pinned until trained)
        self._fetch_options: dict[str, float] = dict(FETCH_DEFAULTS)
        self._build_functions()
        # Resource guard: bytes one client of a call needs (its start model, training state,
        # gradients and delta, plus activations), and the budget a call may use.
        state = jax.eval_shape(trainer.init, init_params, 0, jax.random.key(0))
        self.bytes_per_client = (3 * tree_bytes(init_params) + tree_bytes(state)
                                 + trainer.batch_size * max(sample_bytes, 1) * 4 * ACTIVATION_FACTOR)
        self.memory_limit = memory_limit
        self.split_calls = 0  # calls the guard split to fit
        self._executables: dict[int, tuple] = {}  # padded clients per call → (executable, bytes)

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
        self._build_extension_functions()

    # ----------------------------------------------------------------- Backend API
    def on_dispatch(self, record: DispatchRecord) -> None:
        self._version_users[record.version] = self._version_users.get(record.version, 0) + 1
        self._pending.append(record)
        if not self.batching:
            self._train_pending()

    def on_aggregate(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> bool:
        if any(record.id not in self._results for record in records):
            self._train_pending()
        self.stats.aggregated_steps += sum(record.steps for record in records)
        aggregation = self._weigh(aggregation, records)  # extensions: on-device coefficients
        if aggregation.mode == "tier":
            self.params = self._tier_update(aggregation, records)
        else:
            buffers = self._mean_buffers(records)
            pseudo_gradient = self._combine(aggregation, records)
            self._after_combine(aggregation, records)  # extensions: update banks, keep w_{τ−1}
            if aggregation.server_optimizer:
                self.params, self.server_state = self._server_step(self.params, self.server_state,
                                                                   pseudo_gradient)
            else:
                self.params = jax.tree.map(jnp.subtract, self.params, pseudo_gradient)
            if buffers is not None:
                self.params = {**self.params, BUFFERS: buffers}
        for record in records:
            self._release(record)
        self.version = aggregation.version
        self._versions[self.version] = self.params
        self._forget_unused_versions()
        return bool(self.on_version(aggregation.time, self.version, self.params))

    def nonfinite(self, records: Sequence[DispatchRecord]) -> list[DispatchRecord]:
        """The records whose loss or update is NaN/Inf (training pending work first)."""
        if any(record.id not in self._results for record in records):
            self._train_pending()
        return [record for record in records if not self._client_metrics[record.id]["finite"]]

    def on_drop(self, record: DispatchRecord) -> None:
        if record.id in self._results:
            self._release(record)
        else:
            self._pending.remove(record)
            self._version_users[record.version] -= 1
        if record.id in self._fetches:  # a fetched model pinned for training that will not happen
            self._version_users[self._fetches.pop(record.id)] -= 1
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
        # A dispatch that fetches a fresh model mid-training waits for its fetch (FedASMU).
        self._pending = [r for r in pending if r.fetch_step is not None and not r.fetched]
        if self._pending:
            waiting = {r.id for r in self._pending}
            pending = [r for r in pending if r.id not in waiting]
        # Similar step counts share a call, so masked padding steps stay few (mixing dispatches last).
        pending.sort(key=lambda r: (r.id in self._fetches, r.steps, r.id))
        size = self._clients_that_fit(min(self.plan.clients_per_call, max(len(pending), 1))) if pending else 1
        for start in range(0, len(pending), size):
            self._train_batch(pending[start:start + size])

    def _clients_that_fit(self, wanted: int) -> int:
        """How many clients one call may hold: the bucket for ``wanted``, halved while XLA's memory
        figure for it exceeds the budget (measured: 128 vmapped MNIST-CNN clients need > 24 GB on
        XLA:CPU, far beyond any per-client estimate, because of grouped-convolution temporaries)."""
        padded = min(_next_power_of_two(wanted), _next_power_of_two(self.plan.clients_per_call))
        free = self.memory_limit if self.memory_limit is not None else free_device_memory()
        if free is None:
            return padded
        budget = int(free * MEMORY_HEADROOM)
        while self.call_bytes(padded) > budget:
            if padded == 1:
                raise ResourceError(
                    f"one client's training needs about {self.call_bytes(1) / 2**20:.1f} MiB but only "
                    f"{budget / 2**20:.1f} MiB may be used; lower batch_size or use a smaller model")
            padded //= 2
            self.split_calls += 1
        return padded

    def call_bytes(self, padded: int) -> int:
        """Memory one training call of ``padded`` clients allocates: XLA's figure for the compiled
        step chunk (temporaries and outputs) plus the stacked start models and deltas; the
        per-client estimate where the backend reports no figure."""
        _, measured = self._compiled_steps(padded)
        if measured is None:
            return padded * self.bytes_per_client
        return measured + 2 * padded * tree_bytes(self.params)

    def _compiled_steps(self, padded: int):
        """(executable of one step chunk for ``padded`` clients, its XLA memory figure), compiled
        once per bucket from shapes alone and then called directly (no second compilation)."""
        if padded not in self._executables:
            stacked = lambda tree: jax.tree.map(
                lambda leaf: jax.ShapeDtypeStruct((padded,) + leaf.shape, leaf.dtype), tree)
            vector = lambda dtype: jax.ShapeDtypeStruct((padded,), dtype)
            keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), padded))
            states = jax.eval_shape(jax.vmap(self.trainer.init), stacked(self.params), vector(jnp.int32), keys,
                                    vector(jnp.float32))
            views = ClientView(vector(jnp.int32), vector(jnp.int32))
            compiled = self._run_steps.lower(states, self.data, views).compile()
            try:
                stats = compiled.memory_analysis()
                measured = None if stats is None else int(stats.temp_size_in_bytes + 2 * stats.output_size_in_bytes)
            except Exception:  # a backend without memory analysis
                measured = None
            self._executables[padded] = (compiled, measured)
        return self._executables[padded]

    def _train_batch(self, records: list[DispatchRecord]) -> None:
        if any(record.id in self._fetches for record in records):
            return self._train_fetch_batch(records)
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
        run_steps, _ = self._compiled_steps(padded)
        for _ in range(calls):
            states = run_steps(states, self.data, views)
        deltas, metrics = self._finish(stacked, states)
        metrics = jax.device_get(metrics)
        batch = _TrainedBatch(deltas=deltas, size=padded, buffers=self._final_buffers(states))
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
    def _results_sum(self, records: Sequence[DispatchRecord], coefficients: dict, field: str = "deltas") -> PyTree:
        """Σ c_i · (record i's ``field`` in its trained batch), one weighted sum per batch; None if no records."""
        by_batch: dict[int, tuple[_TrainedBatch, np.ndarray]] = {}
        for record in records:
            batch, index = self._results[record.id]
            entry = by_batch.setdefault(id(batch), (batch, np.zeros(batch.size, np.float32)))
            entry[1][index] += coefficients[record.id]
        total = None
        for batch, weights in by_batch.values():
            part = self._weighted_sum(getattr(batch, field), jnp.asarray(weights))
            total = part if total is None else tree_add(total, part)
        return total

    def _final_buffers(self, states) -> PyTree:
        return states.params[BUFFERS] if self.stateful else None

    def _mean_buffers(self, records: Sequence[DispatchRecord]) -> PyTree:
        """Plain unweighted mean of the aggregated clients' final buffers (None: stateless or no records)."""
        if not self.stateful or not records:
            return None
        return self._results_sum(records, {record.id: 1.0 / len(records) for record in records}, "buffers")

    def _trainable(self, tree: PyTree) -> PyTree:
        """The trainable part of a model (or of a stack of models): what PORT and FedASMU measure."""
        return tree["params"] if self.stateful else tree

    def _combine(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> PyTree:
        coefficients = dict(aggregation.contributions)
        total = jax.tree.map(jnp.zeros_like, self.params)  # an empty aggregation moves nothing
        summed = self._results_sum(records, coefficients)
        if summed is not None:
            total = tree_add(total, summed)
        if aggregation.bank:  # extensions: banked updates of clients that did not train
            total = tree_add(total, self._bank_term(aggregation))
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
        buffers = self._mean_buffers(records)
        if buffers is not None:
            tier_model = {**tier_model, BUFFERS: buffers}
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

    # ----------------------------------------------------------------- extensions
    @property
    def num_clients(self) -> int:
        return len(self.offsets)

    def _build_extension_functions(self) -> None:
        """Jitted kernels of the extensions (traced on first use only)."""
        trainer = self.trainer

        def port(deltas, starts, current, previous, staleness_part, interference_scale, force, valid, definition):
            self._count_trace("port_weights")
            last_step = jax.tree.map(jnp.subtract, current, previous)
            return port_kernels.port_coefficients(deltas, starts, current, last_step, staleness_part,
                                                  interference_scale, force, valid, definition)

        def bank_store(bank, clients, values, valid):
            self._count_trace("bank_store")
            return bank_kernels.store(bank, clients, values, valid)

        def fedasmu_server(state, client, delta, start, current, t, s, step_size, learning_rates, mu_alpha,
                           alpha_min):
            self._count_trace("fedasmu_server")
            row = lambda tree: jax.tree.map(lambda rows: rows[client], tree)
            coefficients, alpha, record, previous_delta, gradient = asmu_kernels.server_update(
                state["coefficients"][client], state["record"][client], row(state["previous_delta"]), delta, start,
                current, t, s, step_size, learning_rates, mu_alpha, alpha_min)
            state = {"coefficients": state["coefficients"].at[client].set(coefficients),
                     "record": state["record"].at[client].set(record),
                     "previous_delta": jax.tree.map(lambda rows, new: rows.at[client].set(new),
                                                    state["previous_delta"], previous_delta)}
            return state, alpha, gradient

        def device_mix(states, fresh, coefficients, o, g, active, data, views, mu_beta, learning_rates):
            self._count_trace("device_mix")

            def one(state, fresh_i, coefficients_i, o_i, g_i, active_i, view):
                return asmu_kernels.device_mix(trainer.batch_loss, state, fresh_i, coefficients_i, o_i, g_i, active_i,
                                               data, view, mu_beta, learning_rates)

            return jax.vmap(one)(states, fresh, coefficients, o, g, active, views)

        self._port = jax.jit(port, static_argnames="definition")
        self._bank_store = jax.jit(bank_store, donate_argnums=0)
        self._bank_delta_sum = jax.jit(bank_kernels.bank_delta_sum)
        self._bank_model_sum = jax.jit(bank_kernels.bank_model_sum)
        self._fedasmu_server = jax.jit(fedasmu_server, donate_argnums=0)
        self._device_mix = jax.jit(device_mix)

    def _result_delta(self, record: DispatchRecord) -> PyTree:
        batch, index = self._results[record.id]
        return jax.tree.map(lambda leaf: leaf[index], batch.deltas)

    @staticmethod
    def _stack(trees: list, padded: int) -> PyTree:
        """Stack pytrees on a new leading axis, padded to ``padded`` entries with the first one."""
        trees = list(trees) + [trees[0]] * (padded - len(trees))
        return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)

    def _weigh(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> Aggregation:
        """Replace the coefficients by an extension kernel's (``Aggregation.weighting``, FedNova option)."""
        name = aggregation.weighting
        if name is None and self.normalize_steps and aggregation.mode == "delta":
            name = "fednova"
        if name is None or not records:
            return aggregation
        if name not in WEIGHTINGS:
            raise ValueError(f"unknown aggregation weighting {name!r}; allowed: {', '.join(WEIGHTINGS)}")
        coefficients = getattr(self, f"_weigh_{name}")(aggregation, records)
        contributions = tuple((record.id, float(c)) for record, c in zip(records, coefficients))
        self.last_weights = dict(contributions)
        return dataclasses.replace(aggregation, contributions=contributions)

    def _weigh_fednova(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> list[float]:
        coefficients = dict(aggregation.contributions)
        return fednova_coefficients([coefficients[r.id] for r in records], [r.steps for r in records])

    def _weigh_port(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> list[float]:
        """weighting_args per update: (d_k·s_k, d_k·β, force cos = 1); option ``cosine``: own | current."""
        definition = str(dict(aggregation.weighting_options).get("cosine", "own"))
        args = np.asarray(aggregation.weighting_args, np.float32).reshape(len(records), 3)
        count, padded = len(records), _next_power_of_two(len(records))
        pad = lambda column, fill: jnp.asarray(np.concatenate([column, np.full(padded - count, fill, column.dtype)]))
        deltas = self._trainable(self._stack([self._result_delta(r) for r in records], padded))
        starts = self._trainable(self._stack([self._versions[r.version] for r in records], padded)) \
            if definition == "current" else deltas
        weights, cosines = self._port(deltas, starts, self._trainable(self.params),
                                      self._trainable(self.previous_params), pad(args[:, 0], 0.0),
                                      pad(args[:, 1], 0.0), pad(args[:, 2] > 0, True),
                                      jnp.asarray(np.arange(padded) < count), definition=definition)
        weights, cosines = jax.device_get((weights, cosines))
        for record, value in zip(records, cosines[:count]):
            self._client_metrics[record.id]["port_cosine"] = float(value)
        return weights[:count].tolist()

    def _weigh_fedasmu(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> list[float]:
        """weighting_args: (client, t, s, η·K) with 1-based t; options: μ_α, α_min, η_λ/σ/ι, λ0/σ0/ι0."""
        if len(records) != 1:
            raise ValueError(f"a 'fedasmu' weighting mixes one upload at a time, got {len(records)}")
        (record,) = records
        client, t, s, step_size = aggregation.weighting_args[0]
        options = dict(aggregation.weighting_options)
        state = self.extensions.get("fedasmu_server")
        if state is None:
            initial = jnp.asarray([options["lambda0"], options["sigma0"], options["iota0"]], jnp.float32)
            state = {"coefficients": jnp.tile(initial, (self.num_clients, 1)),
                     "record": jnp.zeros((self.num_clients, 3), jnp.float32),
                     "previous_delta": bank_kernels.init_bank(self._trainable(self.params), self.num_clients)}
        learning_rates = jnp.asarray([options["lr_lambda"], options["lr_sigma"], options["lr_iota"]], jnp.float32)
        state, alpha, _ = self._fedasmu_server(
            state, jnp.int32(client), self._trainable(self._result_delta(record)),
            self._trainable(self._versions[record.version]), self._trainable(self.params),
            jnp.float32(t), jnp.float32(s), jnp.float32(step_size), learning_rates, jnp.float32(options["mu_alpha"]),
            jnp.float32(options["alpha_min"]))
        self.extensions["fedasmu_server"] = state
        alpha = float(alpha)
        self._client_metrics[record.id]["alpha"] = alpha
        return [alpha]

    def _bank(self, kind: str) -> PyTree:
        key = f"bank_{kind}"
        if key not in self.extensions:
            self.extensions[key] = bank_kernels.init_bank(self.params, self.num_clients)
        return self.extensions[key]

    def _bank_term(self, aggregation: Aggregation) -> PyTree:
        """The pseudo-gradient part of the banked updates: Σ c_i D_i or Σ c_i (w − x_i)."""
        weights = np.zeros(self.num_clients, np.float32)
        for client, coefficient in aggregation.bank:
            weights[client] += coefficient
        if aggregation.bank_kind == "delta":
            return self._bank_delta_sum(self._bank("delta"), jnp.asarray(weights))
        return self._bank_model_sum(self._bank("model"), jnp.asarray(weights), self.params)

    def _after_combine(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> None:
        """Keep w_τ as the coming w_{τ−1} and write the aggregated updates into the named banks."""
        self.previous_params = self.params
        if not aggregation.bank_store or not records:
            return
        newest = {record.client: record for record in sorted(records, key=lambda r: r.id)}
        chosen = list(newest.values())
        count, padded = len(chosen), _next_power_of_two(len(chosen))
        deltas = self._stack([self._result_delta(r) for r in chosen], padded)
        clients = jnp.asarray(np.array([r.client for r in chosen] + [0] * (padded - count), np.int32))
        valid = jnp.asarray(np.arange(padded) < count)
        for kind in aggregation.bank_store:
            values = deltas if kind == "delta" else jax.tree.map(
                jnp.subtract, self._stack([self._versions[r.version] for r in chosen], padded), deltas)
            self.extensions[f"bank_{kind}"] = self._bank_store(self._bank(kind), clients, values, valid)

    def on_fetch(self, record: DispatchRecord, options=()) -> None:
        """The simulation answered ``record``'s fetch: pin the fetched version until it is trained."""
        self._fetch_options.update(dict(options))
        if record.fetch_version is not None:
            self._version_users[record.fetch_version] = self._version_users.get(record.fetch_version, 0) + 1
            self._fetches[record.id] = record.fetch_version
        if not self.batching:
            self._train_pending()

    def _train_fetch_batch(self, records: list[DispatchRecord]) -> None:
        """FedASMU: dispatches that mix in their fetched global model at ``fetch_step``.

        Phase A trains every row to its fetch step (other rows: their whole count), the device kernel
        mixes the fetched model in and steps (γ, ν), phase B trains the remaining steps. The local
        state (optimiser state, key, step counter) carries across, so the minibatches are the ones
        the client draws without a mix, and the result does not depend on batching.
        """
        count = len(records)
        padded = max(min(_next_power_of_two(count), _next_power_of_two(self.plan.clients_per_call)), count)
        members = records + [records[0]] * (padded - count)
        steps = np.array([r.steps for r in records] + [0] * (padded - count), dtype=np.int32)
        mixing = np.array([index < count and r.id in self._fetches for index, r in enumerate(members)])
        first = np.where(mixing, np.minimum([r.fetch_step or 0 for r in members], steps), steps).astype(np.int32)
        clients = np.array([r.client for r in members], dtype=np.int32)
        if len(set(clients[mixing].tolist())) != int(mixing.sum()):
            raise ValueError("two mixing dispatches of one client in one call: their (γ, ν) updates would collide")
        rounds = np.array([r.client_round for r in members], dtype=np.int32)
        lr_scales = np.array([r.lr_scale for r in members], dtype=np.float32)
        stacked = self._stack([self._versions[r.version] for r in members], padded)
        fresh = self._stack([self._versions[self._fetches[r.id]] if mixing[i] else self._versions[r.version]
                             for i, r in enumerate(members)], padded)
        views = ClientView(jnp.asarray(self.offsets[clients]), jnp.asarray(self.counts[clients]))
        states = self._init(stacked, jnp.asarray(first), jnp.asarray(clients), jnp.asarray(rounds),
                            jnp.asarray(lr_scales))
        per_call = self.plan.steps_per_call
        calls_a = math.ceil(int(first.max(initial=0)) / per_call)
        for _ in range(calls_a):
            states = self._run_steps(states, self.data, views)
        states = states._replace(step=jnp.minimum(states.step, states.num_steps), num_steps=jnp.asarray(steps))
        options = self._fetch_options
        if "fedasmu_device" not in self.extensions:
            initial = jnp.asarray([options["gamma0"], options["nu0"]], jnp.float32)
            self.extensions["fedasmu_device"] = jnp.tile(initial, (self.num_clients, 1))
        device = self.extensions["fedasmu_device"]
        o = np.array([r.version + 1 for r in members], np.float32)  # 1-based versions (kernels/fedasmu.py)
        g = np.array([self._fetches[r.id] + 1 if mixing[i] else r.version + 2 for i, r in enumerate(members)],
                     np.float32)
        learning_rates = jnp.asarray([options["lr_gamma"], options["lr_nu"]], jnp.float32)
        states, coefficients, diagnostics = self._device_mix(
            states, fresh, device[jnp.asarray(clients)], jnp.asarray(o), jnp.asarray(g), jnp.asarray(mixing),
            self.data, views, jnp.float32(options["mu_beta"]), learning_rates)
        rows = np.flatnonzero(mixing)
        self.extensions["fedasmu_device"] = device.at[jnp.asarray(clients[rows])].set(coefficients[jnp.asarray(rows)])
        done = np.minimum(first, calls_a * per_call)
        calls_b = math.ceil(int((steps - done).max(initial=0)) / per_call)
        for _ in range(calls_b):
            states = self._run_steps(states, self.data, views)
        deltas, metrics = self._finish(stacked, states)
        metrics, diagnostics = jax.device_get((metrics, diagnostics))
        batch = _TrainedBatch(deltas=deltas, size=padded, buffers=self._final_buffers(states))
        for index, record in enumerate(records):
            self._results[record.id] = (batch, index)
            self._client_metrics[record.id] = {key: value[index].item() for key, value in metrics.items()}
            if mixing[index]:
                self._client_metrics[record.id].update({key: float(value[index]) for key, value in diagnostics.items()})
                self._version_users[self._fetches.pop(record.id)] -= 1
            if not self.keep_start_versions:
                self._version_users[record.version] -= 1
        self._forget_unused_versions()
        self.stats.train_calls += calls_a + calls_b
        self.stats.batches += 1
        self.stats.clients_trained += count
        self.stats.useful_steps += int(steps.sum())
        self.stats.executed_steps += (calls_a + calls_b) * per_call * padded

    # ----------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> tuple[dict, dict]:
        """(device tree for orbax, plain metadata) holding everything needed to continue exactly:
        the global model and server state, kept versions, trained-but-unaggregated results, tier
        models, pending dispatch ids and counters."""
        batches, placement = {}, {}
        for dispatch_id, (batch, index) in self._results.items():
            key = str(id(batch))
            batches.setdefault(key, batch)
            placement[dispatch_id] = (key, index)
        tree = {"params": self.params, "server_state": self.server_state,
                "versions": {str(v): p for v, p in self._versions.items()},
                "batches": {k: b.deltas for k, b in batches.items()},
                "batch_buffers": {k: b.buffers for k, b in batches.items() if b.buffers is not None},
                "tier_models": {str(t): p for t, p in self._tier_models.items()},
                "extensions": self.extensions, "previous_params": self.previous_params}
        meta = {"extension_keys": sorted(self.extensions), "fetches": dict(self._fetches),
                "fetch_options": dict(self._fetch_options),
                "version": self.version, "version_users": dict(self._version_users),
                "version_keys": [str(v) for v in self._versions],
                "batch_sizes": {k: b.size for k, b in batches.items()}, "placement": placement,
                "client_metrics": dict(self._client_metrics), "pending": [r.id for r in self._pending],
                "stats": dataclasses.asdict(self.stats), "split_calls": self.split_calls,
                "tier_model_keys": [str(t) for t in self._tier_models]}
        return tree, meta

    def checkpoint_target(self, meta: dict) -> dict:
        """Shapes and dtypes of :meth:`checkpoint_state`'s tree, for restoring it with orbax."""
        shapes = lambda tree: jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), tree)
        params = shapes(self.params)
        stacked = lambda size: jax.tree.map(lambda leaf: jax.ShapeDtypeStruct((size,) + leaf.shape, leaf.dtype), params)
        return {"params": params, "server_state": shapes(self.server_state),
                "versions": {k: params for k in meta["version_keys"]},
                "batches": {k: stacked(size) for k, size in meta["batch_sizes"].items()},
                "batch_buffers": {k: stacked(size)[BUFFERS] for k, size in meta["batch_sizes"].items()}
                if self.stateful else {},
                "tier_models": {k: params for k in meta.get("tier_model_keys", [])},
                "extensions": self._extension_target(meta.get("extension_keys", [])), "previous_params": params}

    def _extension_target(self, keys) -> dict:
        """Shapes of the extension state named ``keys`` (banks and FedASMU coefficients)."""
        params = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), self.params)
        bank = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct((self.num_clients,) + leaf.shape, leaf.dtype), params)
        trainable_bank = self._trainable(bank)
        table = lambda width: jax.ShapeDtypeStruct((self.num_clients, width), jnp.float32)
        shapes = {"bank_delta": bank, "bank_model": bank, "fedasmu_device": table(2),
                  "fedasmu_server": {"coefficients": table(3), "record": table(3), "previous_delta": trainable_bank}}
        return {key: shapes[key] for key in keys}

    def restore(self, tree: dict, meta: dict, records: Sequence[DispatchRecord]) -> None:
        """Continue from a checkpoint written by :meth:`checkpoint_state` (``records`` = the
        restored simulation's records)."""
        self.params, self.server_state = tree["params"], tree["server_state"]
        self.version = meta["version"]
        self._versions = {int(v): p for v, p in tree["versions"].items()}
        self._version_users = {int(v): n for v, n in meta["version_users"].items()}
        buffers = tree.get("batch_buffers", {})
        batches = {k: _TrainedBatch(deltas=tree["batches"][k], size=size, buffers=buffers.get(k))
                   for k, size in meta["batch_sizes"].items()}
        self._results = {int(d): (batches[k], i) for d, (k, i) in meta["placement"].items()}
        self._client_metrics = {int(d): m for d, m in meta["client_metrics"].items()}
        self._pending = [records[d] for d in meta["pending"]]
        self._tier_models = {int(t): p for t, p in tree["tier_models"].items()}
        self.stats = EngineStats(**meta["stats"])
        self.extensions = dict(tree.get("extensions", {}))
        self.previous_params = tree.get("previous_params", self.params)
        self._fetches = {int(d): v for d, v in meta.get("fetches", {}).items()}
        self._fetch_options = {**FETCH_DEFAULTS, **meta.get("fetch_options", {})}
        self.split_calls = meta["split_calls"]
