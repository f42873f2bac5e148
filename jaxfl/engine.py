"""The engine: joins the scheduler (which decides) and the kernels (which compute).

It keeps the federation's samples and the global model versions on device and implements the
simulation's :class:`~jaxfl.scheduler.simulation.Backend`. The central idea: a
dispatch is not trained when it is made. The engine keeps the *pending* dispatches and, the first
time an aggregation needs some of their results, trains those in vmapped calls with the ones that
arrive next (:meth:`Engine._next_arrivals`); a client's
result depends only on (start model, its data, its step count, its key), so this equals training
each on its own (``batching=False``: one call per dispatch, made when an aggregation needs it) up
to floating-point reassociation.

Calls are shaped so that jit compiles once per bucket: the clients of a call are padded to a power
of two per device (padding entries take zero steps) and the step loop runs in unrolled chunks of
``steps_per_call`` steps, the remainder in power-of-two chunks (one-step calls on a CPU:
``step_chunks``), so a call whose clients share a step count computes no masked step. In a rolled
loop each device runs only the steps its own rows need, so a device holding only padding rows
computes nothing; a CPU call of one client in unrolled chunks runs on the first device alone. Padding is counted as the devices compute it (``device_steps_computed``). Where a
call is one chunk (a rolled loop, or local steps that fit the chunk) and no hook pauses it, its steps
and the rows' deltas run as one program: one dispatch and one pass over the models fewer, the
same arithmetic (bit for bit on a CPU: tests/test_engine.py).

Devices: the client axis of every training call is sharded over the plan's local devices (a 1-D
``Mesh`` named ``clients``; ``shard_map`` runs each device's clients, vmapped, with the samples
replicated). On a CPU every core is a device (:mod:`jaxfl._devices`) training one client. A
client's arithmetic is the same on whichever device trains it, so on one backend results do not
depend on the number of devices. Everything outside a training call (global versions, trained
updates, aggregation, hooks) lives on the first device. A call does not wait for the one before:
its start models are gathered on the devices from the global versions (each copied to the mesh
once), its rows come back to the first device by device-to-device copies (packed as one flat array
per kind, since jax's copies cost per leaf), and its metrics are fetched, with the other calls',
when the aggregation first reads them.

Algorithms extend it through device hooks (:class:`jaxfl.algorithms.DeviceHook`), never by name:
a hook may replace an aggregation's coefficients from the updates themselves, add a term to the
pseudo-gradient, make the whole update, act after it, or change the training state of dispatches
that pause at ``fetch_step`` until the simulation answers their fetch (a generic pause inside one
training path: the call trains every row to its pause step, the hooks act, the call trains on).
Hook state lives in ``state[hook.name]`` (one pytree per hook, created by the hook's ``init``) and
is checkpointed with the rest. State with a row per client (the hook's ``init_per_client``) lives in
one :class:`~jaxfl.client_state.ClientState`, on the device while it fits and otherwise in host RAM
or a memmap under ``RUN_DIR/client_state/`` (``client_state``); hooks gather and scatter only the
rows of the clients at hand (``client_rows``/``set_client_rows``). ``previous_params`` is the
global model before the last update.
The methods a hook may call form the hook API: ``params``, ``previous_params``, ``num_clients``,
``trainable``, ``delta``, ``start_model``, ``stack``, ``combine``, ``results_sum``,
``mean_buffers``, ``jit``, ``client_metrics``/``set_client_metrics``, ``trainer``, ``data``,
``views``, ``compiled_steps``, ``train_detached``, ``record_row``, ``client_rows``,
``set_client_rows``.

Non-trainable model state (BatchNorm running statistics; a trainer built from a ``ModelAdapter``
whose model is ``{"params", "state"}``) never goes through the Δ/staleness arithmetic: the kernel's
delta for it is zero, and every aggregation sets the global ``"state"`` to the plain unweighted mean
of the aggregated clients' final buffers (as the FedCompass authors' code does, Li et al., ICLR 2024: a single update copies the
client's, a group aggregation averages them). Hooks that make the whole update do the same with
:meth:`Engine.mean_buffers`; weighting hooks see the trainable parameters only
(:meth:`Engine.trainable`).

>>> # see jaxfl.experiment.run_experiment for the full wiring
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import heapq
import math
import operator
import time
import weakref
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxfl._user_warnings import warn_user
from jaxfl._devices import place_read_only
from jaxfl.algorithms.base import DeviceHook
from jaxfl.config import STEP_LOOPS
from jaxfl.client_state import ClientState
from jaxfl.execution import (ACTIVATION_FACTOR, ESTIMATE_MARGIN, MEMORY_HEADROOM, EngineStats,  # noqa: F401
                             ExecutionPlan, ONE_STEP_REMAINDERS, ResourceError, bucket_size,
                             free_device_memory, step_chunks)
from jaxfl.kernels.aggregation import apply_server_update, weighted_sum
from jaxfl.kernels.tree import tree_add, tree_bytes, tree_scale
from jaxfl.kernels.client import BUFFERS, ClientTrainer, ClientView, FederatedArrays
from jaxfl.kernels.cpu_ops import count_primitive
from jaxfl.scheduler.simulation import Aggregation, DispatchRecord, NumericalError  # noqa: F401 (re-exported)
from jaxfl.scheduler.simulation import PluginError

PyTree = Any
TRAIN_STREAM = 11  # fold_in(root key, TRAIN_STREAM) → per-(client, client_round) training keys
# Aggregated or dropped dispatches whose client metrics stay readable (FedASMU reads its reward just after
# the aggregation; the scheduler keeps as many finished records): every dispatch's were kept, 0.5 KB of
# memory an update and a checkpoint that grew with the run (1.1 MB to 3.0 MB over 60,000 updates)
KEPT_RELEASED_METRICS = 10_000
# Engine.between_events looks ahead (Simulation.foresee) only where its copy is cheap: at most this many
# client updates left (a copy's run of 16,384 FedBuff updates: ~0.3 s of the 2-core development CPU) and
# this many dispatches live (pickled: FedCompass's 10^4 live records ~0.2 s, 10^5 2.4 s)
FORESIGHT_UPDATES = 1 << 14
FORESIGHT_RECORDS = 1 << 15
_ARRIVAL_ORDER = operator.attrgetter("arrival_time", "id")  # which pending dispatches arrive next


class _DevicePiece(NamedTuple):
    """One device's rows of a packed training call (:class:`_PackedResults`), left on that device."""

    start: int  # its first row in the call
    count: int
    deltas: jax.Array  # (count, P) on the device
    buffers: jax.Array | None  # (count, Q) or None


@dataclasses.dataclass
class _TrainedBatch:
    deltas: PyTree  # stacked on the padded client axis K, on the home device (None while in ``pieces``)
    size: int  # padded K; the arrays are freed once no unconsumed result refers to the batch
    buffers: PyTree = None  # stateful models: the clients' final non-trainable state, stacked on K
    # Several devices of one process: each device's rows where they were trained, packed, summed
    # there (:meth:`Engine.results_sum`) for as long as the batch is held, so that a run sums the
    # same way whether or not it copied them for a row or a checkpoint, and a resumed run (its
    # batches split back to their devices) as the run it continues.
    pieces: list[_DevicePiece] | None = None


@dataclasses.dataclass
class _Calls:
    """The training calls of one mesh: its shardings, the samples as its calls read them, the jitted
    programs and their compiled shapes. An engine has one for all its devices and, where there are
    several (one process), one for the home device alone, which a call of one client takes."""

    mesh: Mesh
    training_data: FederatedArrays | None = None
    packing: "_PackedResults | None" = None
    flat_versions: bool = False  # start models on the mesh as one flat vector each (Engine._mesh_versions)
    one: jax.Array | None = None  # float32 1, replicated on the mesh (_times_one)
    train_root: jax.Array | None = None  # the run's training key's bits, replicated on the mesh (init's argument)
    init: Callable | None = None
    run_steps: Callable | None = None
    finish: Callable | None = None
    run_and_finish: Callable | None = None
    executables: dict = dataclasses.field(default_factory=dict)  # (padded, chunk steps) → (executable, bytes)
    finishing_executables: dict = dataclasses.field(default_factory=dict)  # the same, for one-chunk calls

    def __post_init__(self):
        self.by_client = NamedSharding(self.mesh, PartitionSpec("clients"))
        self.by_column = NamedSharding(self.mesh, PartitionSpec(None, "clients"))  # rows of per-client numbers
        self.replicated = NamedSharding(self.mesh, PartitionSpec())


def _times_one(tree: PyTree, one: jax.Array) -> PyTree:
    """``tree``'s floating-point leaves times ``one`` (a float32 1 given as an argument: exact, and
    XLA cannot fold it away). A program of pure data movement (gathering start models, flattening a
    model) counts no flops, and XLA:CPU runs a program it estimates under 1,000 flops on the calling
    thread (PJRT's ``cheap_computation_``): there the Python thread waited for the program's inputs
    and copied the models itself. With one multiply per value the program is dispatched like the
    others and runs on XLA's threads, in the same single pass over the values."""
    return jax.tree.map(lambda leaf: leaf * one.astype(leaf.dtype) if jnp.issubdtype(leaf.dtype, jnp.floating)
                        else leaf, tree)


class PausedCall(NamedTuple):
    """A training call stopped at its rows' pause steps, handed to :meth:`DeviceHook.on_pause`.

    ``states`` are the stacked local states (axis ``K``, padded); ``records`` the ``K`` dispatches
    (padding rows repeat the first); ``active`` marks the rows that pause with a newer model;
    ``fetched`` is the stacked fetched global model (a row's own start model where not active);
    ``views`` the rows' data views.
    """

    states: Any
    records: list
    active: np.ndarray
    fetched: Any
    views: ClientView


def choose_step_loop(trainer, params: PyTree, data: FederatedArrays, platform: str, state=None, step=None) -> str:
    """How the engine runs a call's local steps on ``platform``: ``"unrolled"`` step chunks, or one
    ``"rolled"`` loop per call: rolled on a CPU when the step (``trainer.step``, as it is traced: after
    ``cpu_friendly``'s rewrite) has no convolution (measured on the 2-core CPU: an MLP's step runs as
    fast rolled, and its 6-step chunk compiles in 2.6 s instead of 7.3 s; LeNet-5's, all matrix
    products, 1.1-1.3x faster rolled); unrolled for XLA's convolutions, which XLA:CPU runs ~15x
    slower inside a loop, and on accelerators. ``state``: the trainer's local state for ``params``
    as shapes (``jax.eval_shape`` of ``trainer.init``), and ``step`` its step traced
    (:func:`traced_step`), where the caller has them already.

    >>> import optax
    >>> from jaxfl.kernels import make_client_trainer
    >>> from jaxfl.models import as_adapter, make_model
    >>> trainer = make_client_trainer(as_adapter(make_model("mlp", 10)), optax.sgd(0.1), batch_size=2)
    >>> data = FederatedArrays(jnp.zeros((4, 28, 28, 1), jnp.uint8), jnp.zeros(4, jnp.int32))
    >>> params = as_adapter(make_model("mlp", 10)).init_variables(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    >>> choose_step_loop(trainer, params, data, "cpu"), choose_step_loop(trainer, params, data, "gpu")
    ('rolled', 'unrolled')
    """
    if platform != "cpu":
        return "unrolled"
    if step is None:
        if state is None:
            state = jax.eval_shape(trainer.init, params, 0, jax.random.key(0))
        step, _ = traced_step(trainer, state, data)
    return "unrolled" if count_primitive(step.jaxpr, "conv_general_dilated") else "rolled"


def traced_step(trainer, state, data: FederatedArrays):
    """One client's local step (``trainer.step``) traced on ``state`` (shapes): its closed jaxpr and
    the state it returns (shapes), which must be ``state``'s, leaf by leaf: the steps run in XLA
    loops, whose carry keeps its type. A step that changes a leaf (an optax state whose int32 count
    becomes a float) is a ``ValueError`` naming it, here, before a run writes anything; XLA's own
    refusal came at the first training call, after the run's folder was made.

    >>> import optax
    >>> from jaxfl.kernels import make_client_trainer
    >>> from jaxfl.models import as_adapter, make_model
    >>> model = as_adapter(make_model("logreg", 10))
    >>> params = model.init_variables(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    >>> drifting = optax.GradientTransformation(lambda p: jnp.zeros((), jnp.int32),
    ...                                         lambda u, s, p=None: (u, s + 0.5))
    >>> data = FederatedArrays(jnp.zeros((4, 28, 28, 1), jnp.uint8), jnp.zeros(4, jnp.int32))
    >>> trainer = make_client_trainer(model, drifting, batch_size=2)
    >>> traced_step(trainer, jax.eval_shape(trainer.init, params, 0, jax.random.key(0)), data)
    Traceback (most recent call last):
    ...
    ValueError: a client's local step turns its state.opt_state from () int32 into () float32: ...
    """
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    step, after = jax.make_jaxpr(trainer.step, return_shape=True)(state, data, ClientView(scalar, scalar))
    before_leaves, before_tree = jax.tree_util.tree_flatten_with_path(state)
    after_leaves, after_tree = jax.tree_util.tree_flatten_with_path(after)
    describe = lambda leaf: f"{tuple(leaf.shape)} {np.dtype(leaf.dtype).name}"  # noqa: E731
    advice = ("the client optimiser's state and the model's must keep their shapes and dtypes from step to step "
              "(the steps run in XLA loops); an optax state that changes them is not one jaxfl can train with")
    if before_tree != after_tree:
        raise ValueError(f"a client's local step returns a state of another structure than it was given: {advice}")
    for (path, before), (_, leaf) in zip(before_leaves, after_leaves):
        if before.shape != leaf.shape or before.dtype != leaf.dtype:
            raise ValueError(f"a client's local step turns its state{jax.tree_util.keystr(path)} from "
                             f"{describe(before)} into {describe(leaf)}: {advice}")
    return step, after


def device_steps_computed(steps: np.ndarray, devices: int, lengths: Sequence[int | None]) -> int:
    """Steps the ``devices`` of a call compute for its rows' ``steps`` (the client axis sharded in
    contiguous blocks): run as one rolled loop (``lengths == [None]``), each device loops its own
    rows' largest count; run as unrolled chunks of ``lengths``, every device runs every chunk. Every
    row of a device steps (masked or not) while the device loops.

    >>> device_steps_computed(np.array([3, 4, 0, 0]), 2, [None])  # the padding device computes nothing
    8
    >>> device_steps_computed(np.array([3, 4, 0, 0]), 2, [4])
    16
    """
    steps = np.asarray(steps)
    if len(steps) == 0 or not lengths:
        return 0
    if list(lengths) == [None]:
        return int(steps.reshape(devices, -1).max(axis=1).sum()) * (len(steps) // devices)
    return int(sum(lengths)) * len(steps)


class _TrainerShapes(NamedTuple):
    """A trainer's local state, delta and metrics for one client of a model like ``params``, as
    shapes and dtypes, traced once per engine (``jax.eval_shape``) for everything that sizes or
    packs a call's results (:func:`choose_step_loop`, :class:`_MetricColumns`, :class:`_PackedResults`,
    the memory guard)."""

    state: Any
    deltas: PyTree
    metrics: PyTree

    @classmethod
    def of(cls, trainer: ClientTrainer, params: PyTree) -> "_TrainerShapes":
        state = jax.eval_shape(trainer.init, params, 0, jax.random.key(0))
        deltas, metrics = jax.eval_shape(trainer.finish, params, state)
        return cls(state, deltas, metrics)


class _MetricColumns:
    """A training call's metrics (a tree of per-row bool, int32 and float32 scalars: loss, steps,
    finite) as one ``(K, M)`` int32 array, the float32 ones by their bits: one device buffer a call
    for the host to fetch instead of one per metric (jax's fetch costs per leaf: 0.25–0.3 ms each on
    the 2-core CPU with the devices busy). Exact for every value; unpacked on the host."""

    def __init__(self, metrics: PyTree):
        leaves, self.structure = jax.tree.flatten(metrics)
        self.dtypes = [np.dtype(leaf.dtype) for leaf in leaves]

    @classmethod
    def for_trainer(cls, shapes: "_TrainerShapes") -> "_MetricColumns | None":
        """The columns of a trainer's metrics (``shapes.metrics``), or None where a metric is not a
        bool, int32 or float32 scalar (a user's trainer may return others: kept as they are)."""
        metrics = shapes.metrics
        plain = all(leaf.shape == () and leaf.dtype in (jnp.bool_, jnp.int32, jnp.float32)
                    for leaf in jax.tree.leaves(metrics))
        return cls(metrics) if plain and jax.tree.leaves(metrics) else None

    def pack(self, metrics: PyTree) -> jax.Array:
        """In a program: the rows' metrics, stacked ``(K, …)``, as ``(K, M)`` int32."""
        as_int = lambda leaf: jax.lax.bitcast_convert_type(leaf, jnp.int32) if leaf.dtype == jnp.float32 \
            else leaf.astype(jnp.int32)
        return jnp.stack([as_int(leaf) for leaf in jax.tree.leaves(metrics)], axis=1)

    def unpack(self, columns: np.ndarray) -> PyTree:
        """On the host: the fetched ``(K, M)`` int32 array as the metrics' tree of ``(K,)`` arrays."""
        columns = np.ascontiguousarray(columns.T)
        return jax.tree.unflatten(self.structure, [
            row.view(np.float32) if dtype == np.float32 else row.astype(dtype)
            for row, dtype in zip(columns, self.dtypes)])


class _PackedResults:
    """A training call's results (deltas, metrics, buffers: stacked on the row axis) as one flat
    array per kind: ``(K, P)`` deltas, the ``(K, M)`` metric columns (:class:`_MetricColumns`),
    ``(K, Q)`` buffers or None. On a mesh of several devices the rows come to the first device by one
    copy per device of each leaf, and jax's cost is per leaf (a dozen leaves for a small CNN). Pure
    data movement: the values come back bit for bit. Usable where every delta (and buffer) leaf has
    one dtype and the metrics are in columns."""

    def __init__(self, deltas, buffers):
        self.deltas, self.buffers = deltas, buffers

    @classmethod
    def for_trainer(cls, shapes: "_TrainerShapes", buffers_of: Callable,
                    metric_columns: _MetricColumns | None) -> "_PackedResults | None":
        """The packing of a trainer's results (``shapes``), or None where it does not apply."""
        deltas, buffers = shapes.deltas, buffers_of(shapes.state)
        one_dtype = lambda tree: tree is None or len({leaf.dtype for leaf in jax.tree.leaves(tree)}) <= 1
        if not (jax.tree.leaves(deltas) and one_dtype(deltas) and one_dtype(buffers) and metric_columns):
            return None
        return cls(deltas, buffers)

    @staticmethod
    def _flat(tree):
        return jnp.concatenate([leaf.reshape(leaf.shape[0], -1) for leaf in jax.tree.leaves(tree)], axis=1)

    @staticmethod
    def _unflat(flat, like):
        leaves, structure = jax.tree.flatten(like)
        ends = np.cumsum([int(np.prod(leaf.shape)) for leaf in leaves])
        parts = jnp.split(flat, ends[:-1], axis=1)
        return jax.tree.unflatten(structure, [part.reshape((flat.shape[0],) + leaf.shape)
                                              for part, leaf in zip(parts, leaves)])

    def pack(self, results: tuple) -> tuple:
        deltas, columns, buffers = results
        return self._flat(deltas), columns, None if buffers is None else self._flat(buffers)

    def unpack(self, packed: tuple) -> tuple:
        flat, columns, buffers = packed
        return self._unflat(flat, self.deltas), columns, None if buffers is None else self._unflat(buffers, self.buffers)


# Seconds jax spent tracing, lowering and compiling in this process (jax.monitoring's compile
# events), read around the calls jit compiles on first use (a training call's init and finish), so
# that compile_wall_s holds them and training_wall_s does not.
_COMPILE_EVENTS = "/jax/core/compile/"
_compile_seconds = [0.0]
_listening: list[bool] = []


def _on_duration(event: str, seconds: float, **_) -> None:
    if event.startswith(_COMPILE_EVENTS):
        _compile_seconds[0] += seconds


def compile_seconds_so_far() -> float:
    """jax's trace, lowering and compile seconds in this process since the first call of this function."""
    if not _listening:
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _listening.append(True)
    return _compile_seconds[0]


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
                 sample_bytes: int = 0, hooks: Sequence = (), client_state: str = "auto",
                 local_steps: int | None = None, step_loop: str | None = None):
        self.trainer = trainer
        # BatchNorm-style buffers ride along in the model dict; see the module docstring.
        self.stateful = bool(trainer.adapter) and isinstance(init_params, dict) and BUFFERS in init_params
        # Several processes (jax.distributed, jaxfl.cluster): the mesh spans every process's devices
        # and each process, running the same deterministic scheduler, keeps its own copy of
        # everything outside the training calls on its first local device.
        self.processes = jax.process_count()
        devices = jax.devices() if self.processes > 1 else jax.local_devices()[:plan.devices]
        self.mesh = Mesh(np.array(devices), ("clients",))
        self.home = jax.local_devices()[0]  # where everything outside a training call lives
        self._all_devices = _Calls(self.mesh)  # its training data placed below
        # Checkpoints of several processes: one array made of every process's copy on its home device
        # (orbax saves global arrays only, and writes a replicated one once).
        self._homes = None if self.processes == 1 else NamedSharding(
            Mesh(np.array([jax.local_devices(process_index=index)[0] for index in range(self.processes)]),
                 ("processes",)), PartitionSpec())
        # For hooks and evaluation on the first device, and for training calls, which read every
        # client's samples on every device (the same arrays where there is one device).
        self.data, self._all_devices.training_data = self._place_data(data)
        self.offsets = np.asarray(offsets, dtype=np.int32)
        self.counts = np.asarray(counts, dtype=np.int32)
        self.server_optimizer = server_optimizer
        self.plan = plan
        self.batching = batching
        # The dispatches the run still aggregates, found near its end by Simulation.foresee (None until
        # then), where the run allows it (foresight_allowed: a schedule that no model value moves); kept in
        # checkpoints, so that a resume trains as the run would have; _foresight_below: the updates left
        # under which to look (halved after a look that found nothing); _foresight_budgets: the budgets of
        # the last look (an extended run looks afresh).
        self.foresight_allowed = False
        self._foresight: frozenset[int] | None = None
        self._foresight_budgets: tuple | None = None
        self._foresight_below = math.inf
        # A model-mixing rule needs each update's start model at aggregation time; otherwise a
        # version is dropped as soon as every dispatch from it has been trained.
        self.keep_start_versions = keep_start_versions
        self.on_version = on_version or (lambda t, v, p: False)
        self.stats = EngineStats()
        # Committed to the first device, so that every jitted function sees its arguments placed the
        # same way at every call (a mix of committed and uncommitted arrays compiles twice). On one
        # device (an accelerator's plan) the training calls' results, and so every aggregated model,
        # carry the calls' one-device mesh in their type: the first model is placed the same way, or
        # the server step compiled twice (for version 0, then for the rest).
        init_params = jax.device_put(init_params, self._model_placement())
        self.params = init_params
        self.server_state = server_optimizer.init(init_params)
        self.version = 0
        self._versions: dict[int, PyTree] = {0: init_params}
        self._replicas: dict[int, tuple] = {}  # version → (its params, their copy replicated on the mesh)
        self._version_users: dict[int, int] = {}  # dispatches still needing a version's params
        self._pending: dict[int, DispatchRecord] = {}  # dispatch id → record, in dispatch order
        self._results: dict[int, tuple[_TrainedBatch, int]] = {}
        self._simulation: Callable[[], Any] = lambda: None  # a weak reference, set by on_attach
        self._fetched_metrics: dict[int, dict] = {}  # dispatch id → metrics (see _client_metrics)
        self._released_metrics: collections.deque[int] = collections.deque(maxlen=KEPT_RELEASED_METRICS)
        self._unfetched: list[tuple[list[int], Any]] = []  # (dispatch ids, their metrics still on device: columns or a tree)
        self._train_root = jax.random.fold_in(jax.random.key(seed), TRAIN_STREAM)
        # Device hooks (module docstring): their state, the model before the last update, fetches.
        self.hooks = tuple(hooks)
        names = [hook.name for hook in self.hooks]
        if len(set(names)) != len(names):
            raise ValueError(f"device hooks need distinct names, got {names}")
        self.previous_params = init_params
        self.last_weights: dict[int, float] = {}
        self._fetches: dict[int, int] = {}  # dispatch id → fetched version (pinned until trained)
        self._jitted: dict[str, Callable] = {}
        # Rows of per-aggregation figures hooks compute (record_row); written as RUN_DIR/NAME.csv.
        self.tables: dict[str, list[dict]] = {}
        self._param_shapes = jax.eval_shape(lambda tree: tree, init_params)
        self._shapes = _TrainerShapes.of(trainer, init_params)  # traced once: the loop, the packings, the memory guard
        if step_loop is not None and step_loop not in STEP_LOOPS:
            raise ValueError(f"step_loop={step_loop!r}: use one of {', '.join(STEP_LOOPS)}, or None to let the engine choose")
        # ``step_loop`` given: the user's (or a benchmark's) choice, e.g. a rolled loop on an
        # accelerator, which compiles one step where an unrolled chunk compiles steps_per_call
        step, _ = traced_step(self.trainer, self._shapes.state, self.data)  # on every backend: checks the state
        self.step_loop = step_loop or choose_step_loop(self.trainer, init_params, self.data, self.home.platform,
                                                       self._shapes.state, step)
        # Whether a call that is one chunk runs its steps and ``finish`` in one program (and the
        # memory guard measures that program): where calls are one chunk, a rolled loop or
        # ``local_steps`` within the chunk, and no hook pauses a call (a pausing call runs in parts).
        pauses = any(type(hook).on_pause is not DeviceHook.on_pause for hook in self.hooks)
        self.one_chunk_calls = not pauses and (self.step_loop == "rolled" or (
            local_steps is not None and local_steps <= plan.steps_per_call))
        # On a CPU a call of one client in unrolled chunks (a convolutional model) runs on the home
        # device alone: on the mesh it is padded with a row per other device, which the chunks compute
        # in full on cores that the real row's convolutions would otherwise use (a CNN FedAsync run
        # whose fast client trains alone: 1.4-1.6x the training time on two devices). A rolled loop
        # skips padding rows, and an accelerator's padding devices take nothing from the home device.
        self._home_only = _Calls(Mesh(np.array([self.home]), ("clients",)), self.data) \
            if self.mesh.size > 1 and self.processes == 1 and self.home.platform == "cpu" \
            and self.step_loop == "unrolled" else None
        self._build_functions()
        # (a Python number is a JAX leaf without a shape: a checkpoint of it failed after the training)
        self.state: dict[str, PyTree] = {hook.name: _as_arrays(hook.init(init_params, self.num_clients))
                                         for hook in self.hooks}
        self._declared_states = {hook.name: _shapes(self.state[hook.name]) for hook in self.hooks
                                 if hook.fixed_state_shape and self.state[hook.name] is not None}
        # Per-client tables (``client_state``: auto, device, host or memmap), placed once for the run.
        self.client_state = ClientState({hook.name: hook.init_per_client(init_params) for hook in self.hooks},
                                        self.num_clients, client_state, device=self.home)
        # what checkpoints assume stays, after the hooks' init (which may set attributes of its own)
        self._hook_attributes = [_attributes(hook) for hook in self.hooks]
        # Resource guard: bytes one client of a call needs (its start model, training state,
        # gradients and delta, plus activations), and the budget a call may use.
        self.bytes_per_client = (3 * tree_bytes(init_params) + tree_bytes(self._shapes.state)
                                 + trainer.batch_size * max(sample_bytes, 1) * 4 * ACTIVATION_FACTOR)
        self.memory_limit = memory_limit
        self.split_calls = 0  # calls the guard split to fit

    # ----------------------------------------------------------------- jitted pieces
    def _model_placement(self):
        """Where a global model lives: the home device, as the mesh's replicated sharding where the
        training mesh is that one device (the type the calls' results and aggregations carry)."""
        if self._all_devices.mesh.size == 1 and self.processes == 1:
            return self._all_devices.replicated
        return self.home

    def _count_trace(self, name: str) -> None:
        self.stats.traces[name] = self.stats.traces.get(name, 0) + 1

    def _build_functions(self) -> None:
        # The traced functions reach the engine through a weak proxy: a closure over ``self`` kept
        # behind ``self._init`` etc. would put every engine in a reference cycle, which only
        # Python's full collection frees, so a dropped run would keep its compiled programs and
        # device buffers until then (a loop of runs exhausted the process's memory maps).
        for calls in (self._all_devices, self._home_only):
            if calls is not None:
                self._build_calls(calls)
        engine = weakref.proxy(self)
        self._gather = jax.jit(lambda tree: tree, out_shardings=self._all_devices.replicated)  # several processes
        concatenate = lambda pieces: jax.tree.map(lambda *rows: jnp.concatenate(rows), *pieces)
        self._concatenate = jax.jit(concatenate)
        packing = self._all_devices.packing
        if packing is not None:  # the rows concatenated and unpacked in one program
            self._concatenate_results = jax.jit(lambda pieces: packing.unpack(concatenate(pieces)))

            def devices_total(partial_sums, one, field):
                """The devices' partial sums (flat, on the home device, in the mesh's order) added, as
                one model (``field``: its deltas' or its buffers' tree). ``one``: see :func:`_times_one`
                (a sum of one partial is pure data movement)."""
                engine._count_trace("devices_total")
                total = _times_one(partial_sums[0], one)
                for partial in partial_sums[1:]:
                    total = total + partial
                like = packing.deltas if field == "deltas" else packing.buffers
                return jax.tree.map(lambda leaf: leaf[0], packing._unflat(total[None], like))

            self._devices_total = jax.jit(devices_total, static_argnums=2)

        def server_step(params, server_state, pseudo_gradient):
            engine._count_trace("server_step")
            return apply_server_update(engine.server_optimizer, params, server_state, pseudo_gradient)

        self._server_step = jax.jit(server_step)

        # Updates without a server optimiser (w − Δ) and a mix's drift c·(w − start): one compiled
        # program each, not an eager op (a compilation, then a dispatch) per leaf. Each is the same
        # elementwise arithmetic as the eager ops (nothing to reassociate or contract).
        def subtract(params, pseudo_gradient):
            engine._count_trace("subtract")
            return jax.tree.map(jnp.subtract, params, pseudo_gradient)

        def drift(params, start, coefficient):
            engine._count_trace("mix_drift")
            return tree_scale(jax.tree.map(jnp.subtract, params, start), coefficient)

        def row(stacked, index, one):
            engine._count_trace("delta_row")
            return _times_one(jax.tree.map(lambda leaf: leaf[index], stacked), one)

        def flat_version(params, one):
            engine._count_trace("flat_version")
            return _times_one(jnp.concatenate([leaf.reshape(-1) for leaf in jax.tree.leaves(params)]), one)

        # one dispatch for a trained update's row of its call's stack, not an eager gather per leaf
        self._row = jax.jit(row)
        self._flat_version = jax.jit(flat_version)
        self._one = jnp.ones((), jnp.float32, device=self.home)
        self._subtract = jax.jit(subtract)
        self._drift = jax.jit(drift)
        self._tree_add = jax.jit(tree_add)
        self._weighted_sum = jax.jit(weighted_sum)
        self._add_weighted_sum = jax.jit(lambda total, stacked, weights: tree_add(total, weighted_sum(stacked, weights)),
                                         donate_argnums=0)

    def _build_calls(self, calls: _Calls) -> None:
        """The training programs of ``calls``' mesh (sharded by client with ``shard_map``)."""
        engine = weakref.proxy(self)
        trainer = self.trainer
        mesh = calls.mesh

        # check_vma=False on every shard_map below: a scan inside a client's step whose carry starts from
        # constants (nn.RNN, the LSTM's cells) is not typed as varying over the clients, and the check
        # refused the scan, so no recurrent model trained; nothing here communicates across devices.
        by_client, whole = PartitionSpec("clients"), PartitionSpec()

        # Several devices of one process, a model of one dtype: each version goes to the other devices
        # as one flat vector (one copy, not one per leaf: jax's cost of placing a tree is per leaf,
        # 2-3 ms of host time for a 1.2 M-parameter CNN's eight leaves on two CPU devices, against
        # 0.2 ms for one vector), unflattened inside the programs that read it.
        flat_versions = calls.flat_versions = mesh.size > 1 and engine.processes == 1 and \
            len({leaf.dtype for leaf in jax.tree.leaves(engine._param_shapes)}) == 1
        # No closure below may hold ``calls``: its jitted programs are stored on it, and the cycle kept a
        # finished run's samples on the device and its executables (23 MB a cell of a one-process sweep)
        # until a full garbage collection, which a sweep of small cells may never reach.

        def starts(versions, which):
            """Row i's start model, versions[which[i]] (the versions replicated on every device)."""
            if flat_versions:
                return _PackedResults._unflat(jnp.stack(versions)[which], engine._param_shapes)
            return jax.tree.map(lambda *leaves: jnp.stack(leaves)[which], *versions)

        def init_states(start, num_steps, clients, rounds, lr_scales, root):
            keys = jax.vmap(lambda c, r: jax.random.fold_in(jax.random.fold_in(root, c), r))(clients, rounds)
            return jax.vmap(trainer.init)(start, num_steps, keys, lr_scales)

        def local_init(versions, rows, one, root_data):
            which, num_steps, clients, rounds, scales, offsets, counts = rows
            root = jax.random.wrap_key_data(root_data, impl=root_impl)
            states = init_states(_times_one(starts(versions, which), one), num_steps, clients, rounds,
                                 jax.lax.bitcast_convert_type(scales, jnp.float32), root)
            return states, ClientView(offsets, counts), which

        def init(versions, rows, one, root_data):
            """The call's local states from its rows' numbers, packed as one int32 array (one transfer
            instead of one per number: :meth:`Engine._init_call`); also their data views and version
            indices, placed by client. ``one``: see :func:`_times_one`. ``root_data``: the run's
            training key (its bits), an argument rather than a constant of the program, so that runs
            of other seeds share the compiled program (in a process, and through jax's persistent
            compilation cache across processes)."""
            engine._count_trace("init")
            return jax.shard_map(local_init, mesh=mesh, in_specs=(whole, PartitionSpec(None, "clients"), whole, whole),
                                 out_specs=by_client, check_vma=False)(versions, rows, one, root_data)

        def device_steps(states, data, views, count, length):
            batched_step = jax.vmap(trainer.step, in_axes=(0, None, 0))
            if length is None:
                # Rolled: one loop, one executable for every count, and each device loops only as many
                # steps as its own rows still need (``count``, the call's largest, bounds it), so a
                # device holding only padding (or finished) rows computes nothing.
                own = jnp.clip(jnp.max(states.num_steps - states.step), 0, count)
                return jax.lax.fori_loop(0, own, lambda _, carry: batched_step(carry, data, views), states)
            # Unrolled chunks run on every device: skipping a chunk on a device whose rows are done
            # takes a `lax.cond`, and XLA:CPU runs the convolutions inside one 3x slower (example CNN,
            # batch 32: 62-65 against 18-24 ms per step for chunks of 1, 2 and 4, 2026-11-30).
            if length == 1:  # a one-step `lax.scan` stays a loop even with unroll=True: 20× slower (measured)
                return batched_step(states, data, views)
            # Fully unrolled (XLA:CPU's convolutions inside a rolled loop are ~15× slower), but traced
            # once: a Python loop would trace the step `length` times.
            states, _ = jax.lax.scan(lambda carry, _: (batched_step(carry, data, views), None), states, None,
                                     length=length, unroll=True)
            return states

        def run_steps(states, data, views, count, length):
            engine._count_trace("run_steps")
            return jax.shard_map(lambda s, d, v, n: device_steps(s, d, v, n, length), mesh=mesh,
                                 in_specs=(by_client, whole, by_client, whole),
                                 out_specs=by_client, check_vma=False)(states, data, views, count)

        columns = engine._metric_columns = _MetricColumns.for_trainer(engine._shapes)

        def finish_states(start, states):
            deltas, metrics = jax.vmap(trainer.finish)(start, states)
            # A non-finite update is kept as zeros (the run stops on it or drops it): the weighted
            # sums of its batch-mates give it a zero weight, and 0 · NaN would be NaN.
            rows_finite = metrics["finite"]
            finite = lambda leaf: jnp.where(rows_finite.reshape((-1,) + (1,) * (leaf.ndim - 1)), leaf, 0)
            if columns is not None:
                metrics = columns.pack(metrics)
            return jax.tree.map(finite, deltas), metrics, jax.tree.map(finite, engine._final_buffers(states))

        # Several devices of one process: a call's results leave the devices packed (_PackedResults)
        packing = calls.packing = _PackedResults.for_trainer(engine._shapes, engine._final_buffers, columns) \
            if mesh.size > 1 and engine.processes == 1 else None
        packed = packing.pack if packing is not None else (lambda results: results)

        def local_finish(versions, which, states):
            return packed(finish_states(starts(versions, which), states))

        def finish(versions, which, states):
            engine._count_trace("finish")
            return jax.shard_map(local_finish, mesh=mesh, in_specs=(whole, by_client, by_client),
                                 out_specs=by_client, check_vma=False)(versions, which, states)

        def run_and_finish(states, data, views, count, length):
            """A call that starts from fresh states (a row's ``params`` is its start model) and ends in
            one chunk: its steps and ``finish`` in one program, one dispatch and one pass over the
            models fewer than ``run_steps`` then ``finish``."""
            engine._count_trace("run_and_finish")
            local = lambda s, d, v, n: packed(finish_states(s.params, device_steps(s, d, v, n, length)))
            return jax.shard_map(local, mesh=mesh, in_specs=(by_client, whole, by_client, whole),
                                 out_specs=by_client, check_vma=False)(states, data, views, count)

        # The rows' numbers arrive as a NumPy array and jit's C++ dispatch places them: jax.device_put's
        # Python path cost more than the call itself (0.8 of 2.5 ms of host time a FedBuff call, one device).
        calls.one = engine._to_mesh(jnp.ones((), jnp.float32, device=engine.home), calls.replicated)
        root_impl = jax.random.key_impl(engine._train_root)
        calls.train_root = engine._to_mesh(jax.device_put(jax.random.key_data(engine._train_root), engine.home),
                                           calls.replicated)
        calls.init = jax.jit(init, in_shardings=(calls.replicated, calls.by_column, calls.replicated,
                                                 calls.replicated))
        calls.run_steps = jax.jit(run_steps, static_argnums=4, donate_argnums=0)
        calls.finish = jax.jit(finish)
        calls.run_and_finish = jax.jit(run_and_finish, static_argnums=4)

    # ----------------------------------------------------------------- Backend API
    def on_attach(self, simulation) -> None:
        """Read the run's budgets from ``simulation`` (its ``updates_left()`` and ``max_time``) when
        training ahead. A weak reference: a finished run's simulation is re-attached to its engine."""
        self._simulation = weakref.ref(simulation)

    def between_events(self, simulation) -> None:
        """Between two events (and before the first), near the run's end: the dispatches it still
        aggregates, from a copy of the simulation run to the end (:meth:`~jaxfl.scheduler.simulation.
        Simulation.foresee`), so that a call trains ahead only those (:meth:`_next_arrivals`; the rate
        that guides it before missed the dispatches made later that overtake those trained: executed ÷
        aggregated 1.47 in a 30-update FedAsync run with 500 clients in flight, calls of 64). Looked for
        once the budgets leave at most twice as many updates as there are dispatches live (or clients
        in a call), where the copy is cheap: at most ``FORESIGHT_UPDATES`` updates left and
        ``FORESIGHT_RECORDS`` dispatches live (which it pickles). A time budget's updates left are
        those at the rate so far. The copy takes every update as finite: after a NaN update is skipped,
        what it found may train some ahead in vain (the run's results are the same either way); a
        checkpoint keeps it, so that a resume trains in the same calls."""
        if not self.foresight_allowed or not self.batching or simulation._stop_requested:
            # (a stop asked for in this event, a target reached: a copy would stop at once and find nothing,
            # which a checkpoint would keep for a resume that goes on past the target)
            return
        if self._foresight_budgets is not None and simulation.budgets != self._foresight_budgets:
            # an extended run: its end moved, whether the last look found it or ran out of events
            self._foresight, self._foresight_budgets, self._foresight_below = None, None, math.inf
        if self._foresight is not None:
            return
        live = len(simulation.records.live)
        if live > FORESIGHT_RECORDS or (simulation.max_client_steps is not None and simulation.events_processed
                                        and not simulation.client_updates_aggregated):
            # (until the first aggregation a client-step budget's updates_left sums every live dispatch's
            # steps: looked at before the first event only, not at every event of a first round of 10^4)
            return
        left = simulation.updates_left()
        done, now = simulation.client_updates_aggregated, simulation.now
        if simulation.max_time != math.inf and done and now > 0:
            left = min(left, (simulation.max_time - now) * done / now)
        if left <= min(2 * max(live, self.plan.clients_per_call), FORESIGHT_UPDATES, self._foresight_below):
            self._foresight = simulation.foresee(16 * (math.ceil(left) + live) + 1024)
            self._foresight_budgets = simulation.budgets
            if self._foresight is None:  # not within so many events: again at half as many updates left
                self._foresight_below = left / 2

    def _foresight_kept(self) -> list[int] | None:
        """What a checkpoint keeps of the look ahead: its ids from the oldest live dispatch on (the
        earlier ones are finished), in order."""
        simulation = self._simulation()
        if self._foresight is None or simulation is None:
            return None
        oldest = next(iter(simulation.records.live), simulation.records.count)  # live: in dispatch order
        return sorted(i for i in self._foresight if i >= oldest)

    def on_dispatch(self, record: DispatchRecord) -> None:
        # Never trained here, batching or not: a dispatch whose update the run never aggregates
        # (cut off by a budget, dropped, still in flight at the end) costs no computation.
        self._version_users[record.version] = self._version_users.get(record.version, 0) + 1
        self._pending[record.id] = record

    def on_aggregate(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> bool:
        self._train_needed(records)
        # the weights first: where they overflow (NumericalError) the aggregation is undone, and nothing
        # of the engine's may have counted it yet
        aggregation = self._weigh(aggregation, records)
        before = self.params, self.previous_params, self.server_state
        try:
            self._update_params(aggregation, records)
        except NumericalError:
            # a hook's apply or after_update that says the aggregation cannot be made: the simulation
            # undoes it, and the engine's model, the one before, its server state and its counts stay
            # as they were (a hook may have set ctx.params before it raised)
            self.params, self.previous_params, self.server_state = before
            raise
        self.stats.aggregated_steps += sum(record.steps for record in records)
        for record in records:
            self._release(record)
        self.version = aggregation.version
        self._versions[self.version] = self.params
        self._forget_unused_versions()
        return self.on_version(aggregation.time, self.version, self.params) or None

    def _update_params(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> None:
        """The new global model from a weighed aggregation: a hook's replacement, or the generic update
        (the server step on the combined pseudo-gradient) with the hooks' ``after_update`` before it."""
        replaced, before = None, self.params
        for hook in self.hooks:
            replaced = hook.apply(self, aggregation, records)
            if replaced is not None:
                # checked here, not at the next training call's XLA argument check, blamed on the policy
                problem = _unlike(replaced, self.params)
                if problem is not None:
                    raise PluginError(f"device hook {hook.name!r} ({type(hook).__name__}).apply returned new "
                                      f"parameters unlike the model's: {problem}")
                break
            if self.params is not before:  # the generic update would then be applied on top of it
                raise PluginError(f"device hook {hook.name!r} ({type(hook).__name__}).apply set ctx.params and "
                                  "returned None: return the new parameters instead (None means: no replacement, "
                                  "apply the generic update)")
        if replaced is not None:
            self.previous_params = self.params  # as the generic update does: a hook's apply kept the one before
            self.params = replaced
        else:
            buffers = self.mean_buffers(records)
            pseudo_gradient = self._combine(aggregation, records)
            self.previous_params = self.params  # w_τ becomes the coming w_{τ−1}
            for hook in self.hooks:
                hook.after_update(self, aggregation, records)
            if aggregation.server_optimizer:
                self.params, self.server_state = self._server_step(self.params, self.server_state,
                                                                   pseudo_gradient)
                self.stats.server_steps += 1
            else:
                self.params = self._subtract(self.params, pseudo_gradient)
            if buffers is not None:
                self.params = {**self.params, BUFFERS: buffers}

    def nonfinite(self, records: Sequence[DispatchRecord]) -> list[DispatchRecord]:
        """The records whose loss or update is NaN/Inf (training pending work first). Where the global
        model itself is no longer finite, an aggregation made it so, and every client trained from it
        returns NaN: that stops the run naming what updates the model (NumericalError), rather than
        blaming, or dropping, the clients one by one."""
        self._train_needed(records)
        bad = [record for record in records if not self._client_metrics[record.id]["finite"]]
        if bad and not self.params_finite():
            raise self.nonfinite_model_error(f"client {bad[0].client}'s update from it, dispatch {bad[0].id}, is "
                                             "non-finite as a result")
        return bad

    def nonfinite_model_error(self, seen: str) -> NumericalError:
        """The error of a global model that holds NaN/Inf (``seen``: how it showed), naming what updates it."""
        updates = [f"hook {hook.name!r} ({type(hook).__name__})" for hook in self.hooks
                   if any(name in type(hook).__dict__ for name in ("apply", "extra_pseudo_gradient", "after_update"))]
        return NumericalError(
            f"the global model (version {self.version}) holds NaN/Inf: an aggregation made it so, not a client "
            f"({seen}). What updates the model: the server update (its optimiser and learning rate)"
            f"{', ' + ', '.join(updates) if updates else ''}; check what they compute, or lower the server "
            "learning rate")

    def params_finite(self) -> bool:
        """Whether every leaf of the global model is finite."""
        return bool(_all_finite(self.params))

    def on_drop(self, record: DispatchRecord) -> None:
        if record.id in self._results:
            self._release(record)
        else:
            del self._pending[record.id]
            self._version_users[record.version] -= 1
        if record.id in self._fetches:  # a fetched model pinned for training that will not happen
            self._version_users[self._fetches.pop(record.id)] -= 1
        self._forget_unused_versions()

    # ----------------------------------------------------------------- training
    @property
    def _client_metrics(self) -> dict[int, dict]:
        """Trained dispatches' metrics by id. A training call leaves its metrics on the device and
        they are fetched together when first read (the aggregation's finiteness check), so that the
        calls of a round queue back to back instead of each waiting for the previous one's metrics.
        The wait counts as training time."""
        if self._unfetched:
            started = time.perf_counter()
            unfetched, self._unfetched = self._unfetched, []
            self.stats.metric_fetches += 1
            values = jax.device_get([metrics for _, metrics in unfetched])
            if self._metric_columns is not None:  # a call's columns, or each device's of them
                values = [self._metric_columns.unpack(np.concatenate(columns) if isinstance(columns, list) else columns)
                          for columns in values]
            for (ids, _), metrics in zip(unfetched, values):
                for index, dispatch_id in enumerate(ids):
                    self._fetched_metrics.setdefault(dispatch_id, {}).update(
                        {key: value[index].item() for key, value in metrics.items()})
            self.stats.train_seconds += time.perf_counter() - started
        return self._fetched_metrics

    def client_metrics(self, dispatch_id: int) -> dict | None:
        """Loss, steps and finiteness of a trained dispatch (None if not trained)."""
        return self._client_metrics.get(dispatch_id)

    def flush(self) -> None:
        """Train every pending dispatch now (used by tests and to account work at the end)."""
        self._train_pending()

    def _train_needed(self, records: Sequence[DispatchRecord]) -> None:
        """Train what ``records`` need, and with them the pending dispatches that arrive next
        (:meth:`_next_arrivals`): the work that will be needed soonest, never the whole backlog.
        With a thousand clients in flight the backlog is a thousand dispatches of which a handful
        arrive before the next aggregation; training it all would execute far more client-steps
        than the run uses."""
        needed = [record for record in records if record.id not in self._results]
        if needed:  # without batching, _train_ready trains exactly these, one call each
            # updates trained earlier that the next aggregations will use (not these records')
            current = {record.id for record in records}
            self._train_pending(needed, ahead=[i for i in self._results if i not in current],
                                aggregating=len(records))

    def _train_pending(self, needed: Sequence[DispatchRecord] | None = None, ahead: Sequence[int] = (),
                       aggregating: int = 0) -> None:
        started = time.perf_counter()  # training time, compilation (the guard's too) included
        try:
            self._train_ready(needed, ahead, aggregating)
        finally:  # the calls are queued; waiting for them counts when their metrics are read
            self.stats.train_seconds += time.perf_counter() - started

    def _next_arrivals(self, ready: list[DispatchRecord], wanted: set[int], size: int,
                       ahead: Sequence[int], aggregating: int) -> list[DispatchRecord]:
        """The pending dispatches to train beside the ``wanted`` ones (of the ``aggregating`` updates
        of the aggregation in progress): those of ``ready`` among the next ``size`` arrivals,
        counting the ``ahead`` ones (ids trained before and not used yet), as many as fill the last
        call. A call's worth of the next arrivals trained ahead is enough; filling every call with
        untrained ones kept more on the device for as long as their clients took (FedAsync, 1,000 of
        5,000 clients in flight, calls of 256: 4,240 trained rows held, 11 GB of host memory for an
        MLP). And no more than the run's budgets can still aggregate, nor any
        arriving after ``max_time`` or the budget's end at the rate updates came so far: those are
        passed by new dispatches and never used (executed ÷ aggregated 4.16 at 300 updates there)."""
        room = (-len(wanted)) % size
        if not room:
            return []
        simulation = self._simulation()
        if simulation is None:
            return heapq.nsmallest(room, (r for r in ready if r.id not in wanted), key=_ARRIVAL_ORDER)
        foresight = self._foresight
        if foresight is not None:  # near the end: exactly those the run still aggregates
            used = lambda r: r.id in foresight  # noqa: E731
        else:
            left, last = simulation.updates_left(aggregating), simulation.max_time
            if left != math.inf:
                room = min(room, max(0, math.ceil(left) - aggregating - len(ahead)))
                # the rate so far, this aggregation's updates counted (an accelerating run's end comes sooner;
                # at the first aggregation, the one call of a run's start trained the earliest of every client
                # in flight, of which those passed by the clients dispatched again were never used)
                done, now = simulation.client_updates_aggregated + aggregating, simulation.now
                if done and now > 0:
                    last = min(last, now + left * now / done)
            used = lambda r: r.arrival_time <= last  # noqa: E731
        if not room:
            return []
        # the earliest untrained, picked (not every pending dispatch sorted: 10^5 in flight spent 11 s
        # of 43 sorting), then those of them that come before the size-th arrival counting the
        # trained ones (an id breaks ties, as in the arrival order)
        untrained = heapq.nsmallest(size, (r for r in ready if r.id not in wanted and used(r)), key=_ARRIVAL_ORDER)
        live = simulation.records.live
        trained = [(live[i].arrival_time, i) for i in ahead if i in live]
        if len(trained) + len(untrained) > size:
            cut = sorted(trained + [(r.arrival_time, r.id) for r in untrained])[size - 1]
            untrained = [r for r in untrained if (r.arrival_time, r.id) <= cut]
        return untrained[:room]

    def _train_ready(self, needed: Sequence[DispatchRecord] | None, ahead: Sequence[int] = (),
                     aggregating: int = 0) -> None:
        """Train the pending dispatches (``needed`` given: those and the next arrivals, see :meth:`_next_arrivals`)."""
        # A dispatch that pauses for a fetch waits (untrained) until the simulation answers it.
        ready = [r for r in self._pending.values() if r.fetch_step is None or r.fetched]
        if not ready:
            return
        size = self._clients_that_fit(len(ready) if self.batching else 1)  # the memory guard checks either way
        if not self.batching:
            size = 1
        if needed is not None:
            wanted = {record.id for record in needed}
            later = self._next_arrivals(ready, wanted, size, ahead, aggregating)
            ready = [r for r in ready if r.id in wanted] + later
        for record in ready:
            del self._pending[record.id]
        # Similar step counts share a call, so masked padding steps stay few (pausing dispatches last).
        ready.sort(key=lambda r: (r.id in self._fetches, r.steps, r.id))
        for start in range(0, len(ready), size):
            self._train_batch(ready[start:start + size])

    def _clients_that_fit(self, wanted: int) -> int:
        """How many clients one call may hold: the plan's call size for ``wanted``, halved per device
        while XLA's memory figure for it exceeds the budget (measured: 128 vmapped MNIST-CNN clients
        need > 24 GB on XLA:CPU, far beyond any per-client estimate, because of grouped-convolution
        temporaries)."""
        padded = self.plan.call_size(min(wanted, self.plan.clients_per_call))
        free = self.memory_limit if self.memory_limit is not None else self._free_memory()
        if free is None:
            return padded
        budget = int(free * MEMORY_HEADROOM)
        devices = self.plan.devices
        if padded == devices and devices * self.bytes_per_client * ESTIMATE_MARGIN <= budget:
            # one client per device fits by the estimate, as check_memory trusts it: XLA's figure would
            # compile a program of one client on every device that a one-client call (first device
            # alone) never runs (14 s of a 29 s CNN run on 2 CPU devices)
            return padded
        while self.call_bytes(padded) > budget:
            if padded == devices:
                raise ResourceError(
                    f"one client per device needs about {self.call_bytes(devices) / 2**20:.1f} MiB but only "
                    f"{budget / 2**20:.1f} MiB may be used ({MEMORY_HEADROOM:.0%} of "
                    f"{'memory_limit_mb' if self.memory_limit is not None else 'the free device memory'}); "
                    f"lower batch_size or use a smaller model"
                    f"{', or raise memory_limit_mb' if self.memory_limit is not None else ''}")
            padded = max(devices, padded // 2 // devices * devices)
            self.split_calls += 1
        return padded

    def check_memory(self) -> None:
        """Raise :class:`ResourceError` now if not even one client per device fits the memory
        budget, so that a run fails before it writes anything rather than at its first training
        call. The check compiles the smallest call to read XLA's memory figure for it, which is
        skipped where the per-client estimate fits ``ESTIMATE_MARGIN`` times over (XLA's figure was
        0.8-4x the estimate for the models measured): a program the run may never call costs an
        accelerator 7-17 s to compile (a FedBuff CNN run on an H200 compiled it beside its three
        call shapes). Otherwise it is checked where a budget is set (``memory_limit``) or the device
        is an accelerator; on a CPU without a limit only where the estimate alone passes the
        budget, else at the first call."""
        free = self.memory_limit if self.memory_limit is not None else self._free_memory()
        if free is None:
            return
        budget, estimate = free * MEMORY_HEADROOM, self.plan.devices * self.bytes_per_client
        if estimate * ESTIMATE_MARGIN <= budget:
            return
        if self.memory_limit is not None or self.home.platform != "cpu" or estimate > budget:
            self._clients_that_fit(self.plan.devices)

    @staticmethod
    def _free_memory() -> int | None:
        """The free memory the budget reads: in a cluster run the least of every process's, since the
        clients of a training call span the processes, which must split it alike (each by its own
        figure, a host with less free memory split its calls while the others did not, and the
        processes' collectives no longer matched)."""
        if jax.process_count() == 1:
            return free_device_memory()
        from jaxfl.cluster import least_bytes

        return least_bytes(free_device_memory())

    def call_bytes(self, padded: int) -> int:
        """Memory one training call of ``padded`` clients allocates, where the budget is measured:
        XLA's figure for the compiled step chunk the calls run (temporaries and outputs) plus the
        stacked start models and deltas; the per-client estimate where the backend reports no
        figure. A CPU's devices share the host's memory, so there the figure counts every device."""
        _, measured = self.compiled_steps(padded, self._chunk(), finish=self.one_chunk_calls)
        if measured is None:
            return padded * self.bytes_per_client
        on_host = self.home.platform == "cpu"
        return measured * (self.plan.devices if on_host else 1) + 2 * padded * tree_bytes(self.params)

    def compiled_steps(self, padded: int, length: int | None, finish: bool = False, calls: _Calls | None = None):
        """(executable of one ``length``-step chunk for ``padded`` clients, its XLA memory figure
        per device), compiled once per shape from abstract values and then called directly. With
        ``finish``: the executable of a whole call that is that one chunk, its steps and
        ``finish`` (fresh states in, the rows' deltas, metrics and buffers out). ``calls``: the
        mesh's (default: all the engine's devices)."""
        calls = calls or self._all_devices
        shape = (padded, length)
        executables = calls.finishing_executables if finish else calls.executables
        if shape not in executables:
            by_client, replicated = calls.by_client, calls.replicated
            stacked = lambda tree: jax.tree.map(
                lambda leaf: jax.ShapeDtypeStruct((padded,) + leaf.shape, leaf.dtype), tree)
            vector = lambda dtype: jax.ShapeDtypeStruct((padded,), dtype)
            keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), padded))
            states = jax.eval_shape(jax.vmap(self.trainer.init), stacked(self.params), vector(jnp.int32), keys,
                                    vector(jnp.float32))
            place = lambda tree, sharding: jax.tree.map(
                lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding), tree)
            views = ClientView(vector(jnp.int32), vector(jnp.int32))
            started = time.perf_counter()
            count = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
            function = calls.run_and_finish if finish else calls.run_steps
            compiled = function.lower(place(states, by_client), place(calls.training_data, replicated),
                                      place(views, by_client), count, length).compile()
            self.stats.compile_seconds += time.perf_counter() - started
            try:
                stats = compiled.memory_analysis()
                measured = None if stats is None else int(stats.temp_size_in_bytes + 2 * stats.output_size_in_bytes)
            except Exception:  # a backend without memory analysis
                measured = None
            executables[shape] = (compiled, measured)
        return executables[shape]

    def _chunk(self) -> int | None:
        """The step chunk calls are compiled for (None: one rolled loop of any length)."""
        return None if self.step_loop == "rolled" else self.plan.steps_per_call

    def _step_chunks(self, steps: np.ndarray) -> list[tuple[int, int | None]]:
        """(count, length) of each program a call of rows taking ``steps`` runs: one rolled loop of
        the largest count, or unrolled chunks (:func:`step_chunks` of the largest)."""
        longest = int(steps.max(initial=0))
        if self.step_loop == "rolled":
            return [(longest, None)] if longest else []
        return [(length, length) for length in step_chunks(longest, self.plan.steps_per_call,
                                                           self.home.platform in ONE_STEP_REMAINDERS)]

    def _run_chunks(self, calls: _Calls, states, views, steps: np.ndarray) -> tuple[Any, int]:
        """Run each row's ``steps`` (the padded call's rows, in order) in one rolled loop or compiled
        unrolled chunks (:meth:`_step_chunks`). Returns the states and the steps the devices compute
        (:func:`device_steps_computed`)."""
        padded = len(steps)
        chunks = self._step_chunks(steps)
        for count, length in chunks:
            run_steps, _ = self.compiled_steps(padded, length, calls=calls)
            states = run_steps(states, calls.training_data, views, np.int32(count))
            self.stats.train_calls += 1
        return states, device_steps_computed(steps, calls.mesh.size, [length for _, length in chunks])

    def _place_data(self, data: FederatedArrays) -> tuple[FederatedArrays, FederatedArrays]:
        """``(data on the home device, data replicated on the mesh)``. Host (NumPy) samples on CPU
        devices are aliased, not copied, by every device (:func:`jaxfl._devices.place_read_only`):
        at 10^6 clients one copy of 4 GB instead of one per device plus the host's."""
        if self.processes > 1:
            home = jax.device_put(data, self.home)
            return home, self._to_mesh(home, self._all_devices.replicated)
        devices = list(self.mesh.devices.flat)  # the home device first
        placed = [place_read_only(leaf, devices) for leaf in data]
        home = type(data)(*(copies[0] for copies in placed))
        if self.mesh.size == 1:
            return home, home
        replicated = self._all_devices.replicated
        return home, type(data)(*(jax.make_array_from_single_device_arrays(copies[0].shape, replicated, copies)
                                  for copies in placed))

    def _to_mesh(self, tree: PyTree, sharding: NamedSharding) -> PyTree:
        """Place a tree held on the home device on the mesh. With several processes every process
        holds the same tree and contributes the slices of its own devices."""
        if self.processes == 1:
            return jax.device_put(tree, sharding)

        def place(leaf):
            slices = [jax.device_put(leaf[index], device)
                      for device, index in sharding.addressable_devices_indices_map(leaf.shape).items()]
            return jax.make_array_from_single_device_arrays(leaf.shape, sharding, slices)

        return jax.tree.map(place, tree)

    def _on_home(self, tree: PyTree, calls: _Calls) -> PyTree:
        """Bring a training call's result, sharded by client, to the home device.

        One process: each device's rows are copied to the home device and concatenated there, all
        queued without waiting for the call (``jax.device_put`` of the sharded array would fetch it
        to host memory first, a blocking round trip per call) and without a collective (XLA:CPU's
        collectives wait for every device at a rendezvous, which can stall while many calls are
        queued). Several processes: the rows of the others' devices are gathered with a collective
        and this process takes its copy, waiting for it."""
        if calls.mesh.size == 1:
            return tree
        if self.processes > 1:
            return jax.tree.map(lambda leaf: jax.device_put(leaf.addressable_data(0), self.home), self._gather(tree))
        leaves, structure = jax.tree.flatten(tree)
        if not leaves:
            return tree
        return jax.tree.unflatten(structure, self._concatenate(self._pieces_on_home(leaves)))

    def _pieces_on_home(self, leaves: list) -> list:
        """Each device's rows of ``leaves`` (arrays sharded by client), in row order, copied to the
        home device without waiting."""
        shards = [_shards_in_row_order(leaf) for leaf in leaves]
        return [self._copied_home([leaf_shards[position].data for leaf_shards in shards], shard.device)
                for position, shard in enumerate(shards[0])]  # each device's rows, in row order

    def _copied_home(self, arrays, device):
        """``arrays`` (held on ``device``) on the home device: copied there, without waiting, unless there."""
        return arrays if device == self.home else jax.device_put(arrays, self.home)

    def _trained_batch(self, results: tuple, calls: _Calls, padded: int) -> tuple[_TrainedBatch, Any]:
        """A training call's (deltas, metrics, buffers) as a :class:`_TrainedBatch` and its metrics.
        Where the programs pack them (several devices of one process) each device's rows stay on it
        (:class:`_DevicePiece`) and the metrics are its columns, one array per device: copying the
        rows to the home device and concatenating them there cost more of the home device's time
        than the weighted sums they feed (the cross-device FedBuff run, 2 devices, 2026-12-01).
        Otherwise all of it on the home device (:meth:`_on_home`)."""
        if calls.packing is None:
            deltas, metrics, buffers = self._on_home(results, calls)
            return _TrainedBatch(deltas=deltas, size=padded, buffers=buffers), metrics
        flat, columns, buffers = (None if leaf is None else _shards_in_row_order(leaf) for leaf in results)
        pieces = [_DevicePiece(shard.index[0].start or 0, shard.data.shape[0], shard.data,
                               None if buffers is None else buffers[position].data)
                  for position, shard in enumerate(flat)]
        return _TrainedBatch(deltas=None, size=padded, pieces=pieces), [shard.data for shard in columns]

    def _home_stacks(self, batch: _TrainedBatch) -> tuple[PyTree, PyTree]:
        """``batch``'s (deltas, buffers) stacked on the home device: a copy of its devices' rows,
        unpacked, for a checkpoint or :meth:`train_detached` (the batch keeps its pieces)."""
        if batch.pieces is None:
            return batch.deltas, batch.buffers
        pieces = [(piece.deltas, None, piece.buffers) for piece in batch.pieces]
        home = [self._copied_home(piece, piece[0].device) for piece in pieces]
        deltas, _, buffers = self._concatenate_results(home)
        return deltas, buffers

    def _back_on_devices(self, batch: _TrainedBatch) -> _TrainedBatch:
        """A restored batch (stacked on the home device) split back into its devices' rows, as the
        call that trained it left them, where this engine's calls leave them so."""
        devices = list(self.mesh.devices.flat)
        if self._all_devices.packing is None or batch.pieces is not None or batch.size % len(devices):
            return batch
        count = batch.size // len(devices)
        flat = lambda tree: None if tree is None else _PackedResults._flat(tree)
        deltas, buffers = flat(batch.deltas), flat(batch.buffers)
        rows = lambda stack, index: None if stack is None else \
            jax.device_put(stack[index * count:(index + 1) * count], devices[index])
        pieces = [_DevicePiece(index * count, count, rows(deltas, index), rows(buffers, index))
                  for index in range(len(devices))]
        return _TrainedBatch(deltas=None, size=batch.size, pieces=pieces)

    def _mesh_versions(self, versions: Sequence[int], calls: _Calls) -> tuple:
        """The given global versions replicated on every device of ``calls``' mesh, copied there once
        per version (not once per call) and dropped with the version."""
        if calls.mesh.size == 1:
            return tuple(self._versions[v] for v in versions)
        for version in versions:
            params = self._versions[version]
            if self._replicas.get(version, (None,))[0] is not params:  # new, or replaced since copied
                self._replicas[version] = (params, self._version_on_mesh(params, calls))
                self.stats.versions_placed += 1
        return tuple(self._replicas[v][1] for v in versions)

    def _version_on_mesh(self, params: PyTree, calls: _Calls):
        """A model held on the home device as the programs of ``calls`` read a start version: as it is
        on one device; replicated on a mesh, as one flat vector where ``calls.flat_versions``."""
        if calls.mesh.size == 1:
            return params
        return self._flat_on_mesh(params, calls) if calls.flat_versions else self._to_mesh(params, calls.replicated)

    def _flat_on_mesh(self, params: PyTree, calls: _Calls) -> jax.Array:
        """``params`` (on the home device) as one flat vector replicated on ``calls``' mesh: flattened
        on the home device, copied once to each other device, the copies made one array."""
        flat = self._flat_version(params, self._one)
        copies = [flat if device == self.home else jax.device_put(flat, device) for device in calls.mesh.devices.flat]
        return jax.make_array_from_single_device_arrays(flat.shape, calls.replicated, copies)

    def _start_rows(self, versions: Sequence[int], calls: _Calls) -> tuple[tuple, np.ndarray]:
        """(the distinct versions on the mesh, padded to a power of two, and each row's index among
        them): the start models of a call, gathered on the devices instead of stacked and sent."""
        distinct = list(dict.fromkeys(versions))
        which = np.array([distinct.index(v) for v in versions], dtype=np.int32)
        distinct += [distinct[0]] * (bucket_size(len(distinct)) - len(distinct))
        return self._mesh_versions(distinct, calls), which

    def _train_batch(self, records: list[DispatchRecord]) -> None:
        """Train ``records`` in one padded, vmapped call: every row to its pause step (its whole
        count if it does not pause), the hooks' ``on_pause`` for the pausing rows, then the rest.
        A paused row's local state (optimiser state, key, step counter) carries across the pause,
        so it draws the minibatches it would draw without one, and no result depends on batching."""
        count = len(records)
        calls = self._home_only if count == 1 and self._home_only is not None else self._all_devices
        padded = self.plan.call_size(count) if calls is self._all_devices else 1
        members = records + [records[0]] * (padded - count)
        steps = np.array([r.steps for r in records] + [0] * (padded - count), dtype=np.int32)
        pausing = np.array([index < count and r.id in self._fetches for index, r in enumerate(members)])
        first = np.where(pausing, np.minimum([r.fetch_step or 0 for r in members], steps), steps).astype(np.int32)
        clients = np.array([r.client for r in members], dtype=np.int32)
        rounds = np.array([r.client_round for r in members], dtype=np.int32)
        lr_scales = np.array([r.lr_scale for r in members], dtype=np.float32)
        versions, which = self._start_rows([r.version for r in members], calls)
        if not pausing.any():
            results, executed = self._train_call(calls, versions, which, steps, clients, rounds, lr_scales)
            self.stats.steps_in_sequence += int(steps.max(initial=0))
        else:
            results, executed = self._train_pausing(calls, members, pausing, versions, which, first, steps, clients,
                                                    rounds, lr_scales)
            self.stats.steps_in_sequence += int(first.max(initial=0)) + int((steps - first).max(initial=0))
        batch, metrics = self._trained_batch(results, calls, padded)
        self._unfetched.append(([record.id for record in records], metrics))
        for index, record in enumerate(records):
            self._results[record.id] = (batch, index)
            if pausing[index]:
                self._version_users[self._fetches.pop(record.id)] -= 1
            if not self.keep_start_versions:  # trained: the start model is no longer needed
                self._version_users[record.version] -= 1
        self._forget_unused_versions()
        # Trained updates only accumulate here: the one place their peak can rise.
        held = sum(batch.size for batch in self._held_batches())
        self.stats.peak_updates_held = max(self.stats.peak_updates_held, held)
        self.stats.batches += 1
        self.stats.clients_trained += count
        self.stats.useful_steps += int(steps.sum())
        self.stats.executed_steps += executed

    def _train_pausing(self, calls: _Calls, members: list, pausing: np.ndarray, versions: tuple, which: np.ndarray,
                       first: np.ndarray, steps: np.ndarray, clients: np.ndarray, rounds: np.ndarray,
                       lr_scales: np.ndarray) -> tuple[tuple, int]:
        """Train a padded call some of whose rows pause: every row to its pause step (``first``;
        its whole count if it does not pause), the hooks' ``on_pause``, then the rest. Returns the
        rows' ``finish`` outputs, placed by client, and the steps the devices computed."""
        padded = len(members)
        states, views, which, executed = self._start_call(calls, versions, which, first, clients, rounds, lr_scales)
        states = self._on_home(states, calls)
        states = states._replace(step=jnp.minimum(states.step, states.num_steps), num_steps=jnp.asarray(steps))
        fetched = self.stack([self._versions[self._fetches[r.id]] if pausing[i] else self._versions[r.version]
                              for i, r in enumerate(members)], padded)
        paused = PausedCall(states, members, pausing, fetched, self.views(clients))
        for hook in self.hooks:
            states = hook.on_pause(self, paused)
            paused = paused._replace(states=states)
        states, more = self._run_chunks(calls, self._to_mesh(states, calls.by_client), views, steps - first)
        return self._finish(calls, versions, which, states), executed + more

    def _init_call(self, calls: _Calls, versions: tuple, which: np.ndarray, steps: np.ndarray, clients: np.ndarray,
                   rounds: np.ndarray, lr_scales: np.ndarray) -> tuple[Any, ClientView, jax.Array]:
        """Begin a padded training call: each row's local state from its start model
        (``versions[which[row]]``, already on the devices), to run for its ``steps``. The rows' numbers
        (int32 version index, steps, client, round; float32 lr scale; data offsets and counts) go to
        the devices as one int32 array (the lr scale's bits), placed by client: one leaf to transfer,
        not seven (jax's per-leaf cost is most of a transfer this small). Returns the states, placed
        by client, the rows' placed data views and their placed version indices (for ``_finish``)."""
        rows = np.stack([which, steps, clients, rounds, np.asarray(lr_scales, np.float32).view(np.int32),
                         self.offsets[clients], self.counts[clients]]).astype(np.int32, copy=False)
        compiled_before = compile_seconds_so_far()
        started = calls.init(versions, rows if self.processes == 1 else self._to_mesh(rows, calls.by_column),
                             calls.one, calls.train_root)
        self.stats.compile_seconds += compile_seconds_so_far() - compiled_before  # its first call of a shape
        return started

    def _finish(self, calls: _Calls, versions: tuple, which, states) -> tuple:
        """``calls.finish`` of a call's states: the rows' deltas, metrics and buffers (its compilation,
        on the first call of a shape, counted as such)."""
        compiled_before = compile_seconds_so_far()
        finished = calls.finish(versions, which, states)
        self.stats.compile_seconds += compile_seconds_so_far() - compiled_before
        return finished

    def _start_call(self, calls: _Calls, versions: tuple, which: np.ndarray, steps: np.ndarray, clients: np.ndarray,
                    rounds: np.ndarray, lr_scales: np.ndarray) -> tuple[Any, ClientView, jax.Array, int]:
        """:meth:`_init_call`, then the rows' ``steps`` (:meth:`_run_chunks`). Returns the states,
        still placed by client, the views, the placed version indices and the steps the devices
        computed."""
        states, views, which = self._init_call(calls, versions, which, steps, clients, rounds, lr_scales)
        states, computed = self._run_chunks(calls, states, views, steps)
        return states, views, which, computed

    def _train_call(self, calls: _Calls, versions: tuple, which: np.ndarray, steps: np.ndarray, clients: np.ndarray,
                    rounds: np.ndarray, lr_scales: np.ndarray) -> tuple[tuple, int]:
        """Train a padded call's rows from their start models for their ``steps``, without a pause.
        Returns their ``finish`` outputs (deltas, metrics, buffers), placed by client, and the steps
        the devices computed. A call that is one chunk (``one_chunk_calls``) runs its steps and
        ``finish`` in one program (:meth:`compiled_steps` with ``finish``)."""
        chunks = self._step_chunks(steps)
        if not (self.one_chunk_calls and len(chunks) == 1):
            states, _, which, computed = self._start_call(calls, versions, which, steps, clients, rounds, lr_scales)
            return self._finish(calls, versions, which, states), computed
        (count, length), = chunks
        states, views, _ = self._init_call(calls, versions, which, steps, clients, rounds, lr_scales)
        run_and_finish, _ = self.compiled_steps(len(steps), length, finish=True, calls=calls)
        results = run_and_finish(states, calls.training_data, views, np.int32(count))
        self.stats.train_calls += 1
        return results, device_steps_computed(steps, calls.mesh.size, [length])

    # ----------------------------------------------------------------- aggregation
    def results_sum(self, records: Sequence[DispatchRecord], coefficients: dict, field: str = "deltas") -> PyTree:
        """Σ c_i · (record i's ``field`` in its trained batch), one weighted sum per batch; None if no records.

        ``coefficients`` maps dispatch id → c_i; ``field`` is ``"deltas"`` or ``"buffers"``. A batch
        whose rows stay on their devices (:class:`_DevicePiece`) is summed there, one running sum per
        device; those partial sums come to the home device once, added in the mesh's order."""
        by_batch: dict[int, tuple[_TrainedBatch, np.ndarray]] = {}
        for record in records:
            batch, index = self._results[record.id]
            entry = by_batch.setdefault(id(batch), (batch, np.zeros(batch.size, np.float32)))
            entry[1][index] += coefficients[record.id]
        total, on_devices = None, {}
        for batch, weights in by_batch.values():  # one dispatch per batch, the running sum updated in place
            if batch.pieces is None:
                stacked = getattr(batch, field)
                total = self._weighted_sum(stacked, weights) if total is None else \
                    self._add_weighted_sum(total, stacked, weights)
                continue
            rows = lambda piece: weights[piece.start:piece.start + piece.count]
            # a device holding only padding, or rows another aggregation takes, would add zeros
            for piece in [piece for piece in batch.pieces if rows(piece).any()] or batch.pieces[:1]:
                flat = getattr(piece, field)
                device = flat.device
                on_devices[device] = self._weighted_sum(flat, rows(piece)) if device not in on_devices else \
                    self._add_weighted_sum(on_devices[device], flat, rows(piece))
        if on_devices:
            order = [device for device in self.mesh.devices.flat if device in on_devices]
            summed = self._devices_total([jax.device_put(on_devices[device], self.home) for device in order],
                                         self._one, field)
            total = summed if total is None else self._tree_add(total, summed)
        return total

    def _final_buffers(self, states) -> PyTree:
        return states.params[BUFFERS] if self.stateful else None

    def mean_buffers(self, records: Sequence[DispatchRecord]) -> PyTree:
        """Plain unweighted mean of the aggregated clients' final buffers (None: stateless or no records)."""
        if not self.stateful or not records:
            return None
        return self.results_sum(records, {record.id: 1.0 / len(records) for record in records}, "buffers")

    def trainable(self, tree: PyTree) -> PyTree:
        """The trainable part of a model (or of a stack of models): what weighting hooks measure."""
        return tree["params"] if self.stateful else tree

    def combine(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> PyTree:
        """Σ c_i Δ_i over the aggregated updates (zeros when there are none). The update adds the
        hooks' extra terms and, in ``mix`` mode, the drift Σ c_i (w − start_i) to it (``_combine``)."""
        summed = self.results_sum(records, dict(aggregation.contributions))
        # an empty aggregation moves nothing
        return _zeros_like_tree(self.params) if summed is None else summed

    def _combine(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> PyTree:
        """The generic update's pseudo-gradient: :meth:`combine`, the hooks' extra terms, the mix drift."""
        total = self.combine(aggregation, records)
        for hook in self.hooks:
            extra = hook.extra_pseudo_gradient(self, aggregation, records)
            if extra is not None:
                problem = _unlike(extra, total, dtypes=False)  # a scalar per leaf broadcast silently
                if problem is not None:
                    raise PluginError(f"device hook {hook.name!r} ({type(hook).__name__}).extra_pseudo_gradient "
                                      f"returned a term unlike the pseudo-gradient: {problem}")
                total = self._tree_add(total, extra)
        if aggregation.mode == "mix":
            # Σ c_i (w − w_i) = Σ c_i Δ_i + Σ c_i (w − start_i)
            if not self.keep_start_versions:
                raise PluginError("a 'mix' aggregation needs the models dispatches started from, which the engine "
                                  "keeps only for a policy with needs_start_models = True (a class attribute)")
            coefficients = dict(aggregation.contributions)
            for record in records:
                drift = self._drift(self.params, self._versions[record.version], float(coefficients[record.id]))
                total = self._tree_add(total, drift)
        return total

    def _weigh(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> Aggregation:
        """Let each hook replace the coefficients in turn (e.g. cosine weights, then step normalisation)."""
        if not records:
            return aggregation
        changed = False
        for hook in self.hooks:
            coefficients = hook.weigh(self, aggregation, records)
            if coefficients is not None:
                if isinstance(coefficients, Mapping):  # zip would read its keys (dispatch ids) as coefficients
                    raise ValueError(f"device hook {hook.name!r} ({type(hook).__name__}).weigh returned a "
                                     f"{type(coefficients).__name__}: it must return one coefficient per record, "
                                     "in the records' order (a list or an array), or None")
                try:
                    count = len(coefficients)
                except TypeError:  # a scalar, a 0-d array: no length
                    count = None
                if count != len(records):  # zip would cut them short, failing later as a KeyError
                    given = f"{count} coefficients" if count is not None else f"{type(coefficients).__name__} " \
                        f"{coefficients!r}, not a sequence of coefficients,"
                    raise ValueError(f"device hook {hook.name!r} ({type(hook).__name__}).weigh returned {given} for "
                                     f"{len(records)} records (dispatches "
                                     f"{', '.join(str(record.id) for record in records[:8])}"
                                     f"{', ...' if len(records) > 8 else ''}): "
                                     "it must return one coefficient per record, in their order, or None")
                if np.ndim(coefficients) != 1:  # an (n, 1) array: float() of a row was a bare TypeError
                    raise ValueError(f"device hook {hook.name!r} ({type(hook).__name__}).weigh returned coefficients "
                                     f"of shape {np.shape(coefficients)}: it must return one number per record "
                                     "(a list, or a 1-d array)")
                contributions = tuple((record.id, float(c)) for record, c in zip(records, coefficients))
                bad = [(d, c) for d, c in contributions if not math.isfinite(c)]
                if bad:  # the global model would turn NaN, and the next client trained from it be blamed
                    # a numerical error (the run stops with its summary, a sweep goes on), not bad input: the
                    # updates weighed are finite (screened before), and a built-in hook's float32 arithmetic
                    # overflows on finite but huge ones (FedASMU's inner products) as a run diverges
                    raise NumericalError(
                        f"device hook {hook.name!r} ({type(hook).__name__}).weigh returned non-finite coefficients "
                        f"for aggregation {aggregation.version} ("
                        f"{', '.join(f'dispatch {d}: {c}' for d, c in bad[:8])}{', ...' if len(bad) > 8 else ''}) "
                        "from finite updates: every coefficient must be a finite number. Updates so large that its "
                        "float32 arithmetic overflows come from a diverging run (lower the learning rate)"
                        + ("" if type(hook).__module__.startswith("jaxfl.") else
                           "; a hook of your own may compute NaN (check its weigh)"))
                aggregation = dataclasses.replace(aggregation, contributions=contributions)
                changed = True
        if changed:
            self.last_weights = dict(aggregation.contributions)
        return aggregation

    def _release(self, record: DispatchRecord) -> None:
        self._results.pop(record.id)
        if self.keep_start_versions:
            self._version_users[record.version] -= 1
        released, metrics = self._released_metrics, self._fetched_metrics
        released.append(record.id)
        if len(metrics) > 2 * KEPT_RELEASED_METRICS + len(self._results) + len(self._pending):
            # amortised: the unreleased dispatches' and the last KEPT_RELEASED_METRICS released ones' stay
            keep = {*self._results, *self._pending, *released}
            self._fetched_metrics = {d: values for d, values in metrics.items() if d in keep}

    def _forget_unused_versions(self) -> None:
        """Drop global versions no dispatch needs any more (the current one is always kept)."""
        self._version_users = {v: n for v, n in self._version_users.items() if n > 0}
        for version in list(self._versions):
            if version != self.version and version not in self._version_users:
                del self._versions[version]
                self._replicas.pop(version, None)
        self.stats.peak_versions_kept = max(self.stats.peak_versions_kept, len(self._versions))

    def _held_batches(self) -> list:
        return list({id(batch): batch for batch, _ in self._results.values()}.values())

    def memory(self) -> dict:
        """Device bytes by what holds them, from the engine's own accounting (not the allocator's):
        the federation's samples, the global model, the kept versions, the trained updates waiting
        for aggregation (their padded batches), the hooks' state, and the peaks of the model state.

        The model state is what grows with the work in flight; nothing here grows with the number
        of clients except the samples, a hook's own state and the per-client tables while they are
        placed on the device (``hook_state_bytes`` counts them then; ``client_state_bytes`` is their
        size wherever they are, ``client_state_placement`` where, ``peak_client_rows_bytes`` the
        most bytes of their rows one gather put on the device).

        >>> # engine.memory()["peak_model_state_bytes"]
        """
        model = tree_bytes(self.params)
        held = sum(batch.size for batch in self._held_batches())
        hooks = sum(tree_bytes(state) for state in self.state.values() if state is not None) \
            + self.client_state.device_bytes
        fixed = tree_bytes(self.server_state) + tree_bytes(self.previous_params) + hooks
        return {"model_bytes": model, "data_bytes": tree_bytes(self.data),
                "versions_kept": len(self._versions), "updates_held": held, "hook_state_bytes": hooks,
                "client_state_placement": self.client_state.placement if self.client_state.keys else None,
                "client_state_bytes": self.client_state.nbytes,
                "peak_client_rows_bytes": self.client_state.peak_rows_bytes,
                "model_state_bytes": fixed + (len(self._versions) + held) * model,
                "peak_versions_kept": self.stats.peak_versions_kept, "peak_updates_held": self.stats.peak_updates_held,
                "peak_model_state_bytes": fixed + (self.stats.peak_versions_kept + self.stats.peak_updates_held) * model}

    # ----------------------------------------------------------------- hook API
    @property
    def num_clients(self) -> int:
        return len(self.offsets)

    def jit(self, name: str, function: Callable, **jit_options) -> Callable:
        """``jax.jit(function)`` built once per name; its traces are counted under ``name``."""
        if name not in self._jitted:
            engine = weakref.proxy(self)  # no cycle through the cache (see _build_functions)

            def counted(*args, **kwargs):
                engine._count_trace(name)
                return function(*args, **kwargs)

            self._jitted[name] = jax.jit(counted, **jit_options)
        return self._jitted[name]

    def delta(self, record: DispatchRecord) -> PyTree:
        """Δ = start − final of a trained dispatch."""
        batch, index = self._results[record.id]
        if batch.pieces is None:
            return self._row(batch.deltas, np.int32(index), np.float32(1))  # _times_one
        piece, = (piece for piece in batch.pieces if piece.start <= index < piece.start + piece.count)
        row = self._row(piece.deltas, np.int32(index - piece.start), np.float32(1))  # (P,) on its device, then one copy
        return self._devices_total([jax.device_put(row, self.home)], self._one, "deltas")  # a sum of one: unpacked

    def start_model(self, record: DispatchRecord) -> PyTree:
        """The global model a dispatch started from (kept while ``keep_start_versions``: a policy
        with ``needs_start_models = True``)."""
        if record.version not in self._versions:  # a bare KeyError of the version number
            raise PluginError("ctx.start_model() needs the models dispatches started from, which the engine keeps "
                              "only for a policy with needs_start_models = True: set it on the algorithm's policy "
                              "(a class attribute)")
        return self._versions[record.version]

    @staticmethod
    def stack(trees: list, padded: int) -> PyTree:
        """Stack pytrees on a new leading axis, padded to ``padded`` entries with the first one (one
        compiled program per padded size, instead of an eager stack per leaf)."""
        return _stack_trees(tuple(trees) + (trees[0],) * (padded - len(trees)))

    def views(self, clients: np.ndarray) -> ClientView:
        """The data views of a stack of clients."""
        return ClientView(jnp.asarray(self.offsets[clients]), jnp.asarray(self.counts[clients]))

    def client_rows(self, hook: str, table: str, clients) -> PyTree:
        """The rows of ``clients`` of a hook's per-client ``table`` (``init_per_client``), stacked on
        a leading axis on the device, wherever the table is placed."""
        return self.client_state.rows(hook, table, clients)

    def set_client_rows(self, hook: str, table: str, clients, values: PyTree, valid=None) -> None:
        """Write stacked ``values`` into the rows of ``clients`` of a hook's per-client ``table``
        (rows where ``valid`` is False are skipped; valid clients must not repeat)."""
        self.client_state.set_rows(hook, table, clients, values, valid)

    def record_row(self, table: str, row: dict) -> None:
        """Add a row of figures a hook computed (e.g. per aggregation) to ``table``: checkpointed with
        the run and written as ``RUN_DIR/TABLE.csv`` when it ends."""
        self.tables.setdefault(table, []).append(dict(row))

    def train_detached(self, params: PyTree, clients: Sequence[int], client_rounds: Sequence[int],
                       steps: Sequence[int], lr_scales: Sequence[float] | None = None) -> PyTree:
        """The updates Δ = params − final that ``clients`` would compute from ``params`` as dispatches
        (client, client_round) with those steps (the same keys, minibatches and kernels as a real
        dispatch), stacked on a leading axis of ``len(clients)``. Trained outside the run: nothing is
        kept, aggregated or counted as its work (the step-chunk calls count in ``train_calls``), so a
        diagnostic may ask for updates that the run never computes (CC-FedAvg's estimating clients)."""
        count = len(clients)
        lr_scales = [1.0] * count if lr_scales is None else list(lr_scales)
        size = self._clients_that_fit(count)
        parts = []
        versions = (self._version_on_mesh(params, self._all_devices),)  # once, not per chunk
        for start in range(0, count, size):
            chunk = slice(start, start + size)
            members = len(clients[chunk])
            padded = self.plan.call_size(members)
            pad = lambda values, fill, dtype: np.array(list(values[chunk]) + [fill] * (padded - members), dtype=dtype)
            client_ids = pad(clients, clients[start], np.int32)
            results, _ = self._train_call(self._all_devices, versions, np.zeros(padded, np.int32),
                                          pad(steps, 0, np.int32), client_ids, pad(client_rounds, 0, np.int32),
                                          pad(lr_scales, 1.0, np.float32))
            deltas, _ = self._home_stacks(self._trained_batch(results, self._all_devices, padded)[0])
            parts.append(jax.tree.map(lambda leaf: leaf[:members], deltas))
        return parts[0] if len(parts) == 1 else jax.tree.map(lambda *leaves: jnp.concatenate(leaves), *parts)

    @property
    def aggregated_steps(self) -> int:
        """Local steps in the updates aggregated so far: the simulation's client-step budget reads it."""
        return self.stats.aggregated_steps

    def set_client_metrics(self, dispatch_id: int, values: dict) -> None:
        """Add diagnostics of a dispatch (e.g. a weight a hook computed) to its client metrics."""
        self._client_metrics.setdefault(dispatch_id, {}).update(values)

    def on_fetch(self, record: DispatchRecord) -> None:
        """The simulation answered ``record``'s fetch: pin the fetched version until it is trained."""
        if record.fetch_version is not None:
            self._version_users[record.fetch_version] = self._version_users.get(record.fetch_version, 0) + 1
            self._fetches[record.id] = record.fetch_version

    def on_recall(self, record: DispatchRecord) -> None:
        """The simulation cut ``record.steps`` (an urgent pull): an update already trained to the
        planned count is discarded and the dispatch trained again, to its new count, when needed."""
        if record.id not in self._results:
            return  # still pending: it will be trained to the new count
        if not self.keep_start_versions and record.version not in self._versions:
            raise RuntimeError(f"dispatch {record.id} was recalled after its start model (version "
                               f"{record.version}) was let go; a recalling policy must set needs_start_models")
        self._results.pop(record.id)
        self._client_metrics.pop(record.id, None)
        if not self.keep_start_versions:  # pinned again until it is re-trained
            self._version_users[record.version] = self._version_users.get(record.version, 0) + 1
        self._pending[record.id] = record

    # ----------------------------------------------------------------- checkpoints
    def _warn_of_changed_hook_attributes(self) -> None:

        for position, hook in enumerate(self.hooks):
            before = self._hook_attributes[position]
            if before is None:  # warned already
                continue
            changed = _changed_attributes(before, _attributes(hook))
            if changed:
                self._hook_attributes[position] = None
                warn_user(f"device hook {hook.name!r} ({type(hook).__name__}) changed its attribute"
                          f"{'s' if len(changed) > 1 else ''} {', '.join(changed)} during the run: a hook's own "
                          "attributes are not checkpointed, so a resumed run starts them afresh and parts from "
                          "this one; keep state that must last in ctx.state[self.name] (made by the hook's init)", HookStateWarning)

    def checkpoint_state(self) -> tuple[dict, dict]:
        """(device tree for orbax, plain metadata) holding everything needed to continue exactly:
        the global model and server state, kept versions, trained-but-unaggregated results, the
        hooks' state (per-client tables too while on the device; on the host they are written as
        files, :meth:`save_client_state_files`), pending dispatch ids and counters. A hook's own
        Python attributes are not among them: one that changed since the run started is warned of
        (:class:`HookStateWarning`), once."""
        self._warn_of_changed_hook_attributes()
        batches, placement, live = {}, {}, {}
        # Batches are named by their order of first use here, not by id(): every process of a cluster
        # run saves the same tree, which orbax requires (ids differ between processes, and the save
        # of a tree whose names differ fails, leaving the processes waiting for one another).
        keys: dict[int, str] = {}
        for dispatch_id, (batch, index) in self._results.items():
            key = keys.setdefault(id(batch), str(len(keys)))
            batches.setdefault(key, batch)
            placement[dispatch_id] = (key, index)
            live.setdefault(key, set()).add(index)
        # Only the rows still waiting for aggregation are stored (in FedAsync about half a batch's
        # rows are consumed before it is freed); a restore puts them back at their rows of a batch of
        # zeros, which the later weighted sums give zero weights: they add zeros there, as the
        # consumed rows did (of another sign at most, which shows only in a sum of zeros).
        rows = {k: sorted(indices) for k, indices in live.items()}
        stacks = {k: self._home_stacks(batch) for k, batch in batches.items()}
        # (picked on the host, where orbax copies them anyway: a gather on the device would compile
        # once per shape and number of rows)
        kept = lambda tree, k: tree if len(rows[k]) == batches[k].size else \
            jax.tree.map(lambda leaf: np.asarray(leaf)[rows[k]], tree)
        tree = {"params": self.params, "server_state": self.server_state,
                "versions": {str(v): p for v, p in self._versions.items()},
                "batches": {k: kept(stacks[k][0], k) for k in batches},
                "batch_buffers": {k: kept(stacks[k][1], k) for k in batches if stacks[k][1] is not None},
                "hooks": {name: state for name, state in self._checked_hook_states().items()
                          if state is not None and not (isinstance(state, dict) and not state)},
                "previous_params": self.previous_params}
        if self.client_state.placement == "device" and self.client_state.keys:
            tree["client_state"] = self.client_state.arrays()
        meta = {"fetches": dict(self._fetches), "version": self.version, "version_users": dict(self._version_users),
                "client_state_placement": self.client_state.placement if self.client_state.keys else None,
                "peak_client_rows_bytes": self.client_state.peak_rows_bytes,
                "version_keys": [str(v) for v in self._versions],
                "batch_sizes": {k: b.size for k, b in batches.items()}, "batch_rows": rows, "placement": placement,
                "client_metrics": dict(self._client_metrics), "pending": list(self._pending),
                "tables": {name: list(rows) for name, rows in self.tables.items()},
                "stats": dataclasses.asdict(self.stats), "split_calls": self.split_calls,
                "foresight": self._foresight_kept(), "foresight_budgets": self._foresight_budgets,
                "foresight_below": self._foresight_below,
                "hook_shapes": {name: _shapes(state) for name, state in tree["hooks"].items()}}
        if self.processes > 1:  # no copy: each process's own arrays are its part of the global one
            tree = jax.tree.map(lambda leaf: jax.make_array_from_single_device_arrays(
                np.shape(leaf), self._homes, [jax.device_put(leaf, self.home)]), tree)
        return tree, meta

    def _checked_hook_states(self) -> dict[str, PyTree]:
        """The hooks' state as arrays, each fixed-shape hook's checked against what its ``init`` made:
        a checkpoint restores it into those shapes and dtypes, so state that drifted (an int32 counter
        become float32, a growing list) saved and then failed every resume, naming no hook."""
        states = {}
        for hook in self.hooks:
            state = self.state.get(hook.name)
            if state is not None:
                state = _as_arrays(state)
                declared = self._declared_states.get(hook.name)
                problem = None if declared is None else _unlike(state, declared, what="its init's")
                if problem is not None:
                    raise PluginError(f"device hook {hook.name!r} ({type(hook).__name__}): the state it keeps is unlike "
                                      f"the state its init made, which a checkpoint restores into: {problem}; keep "
                                      "init's shapes and dtypes, or set fixed_state_shape = False on the hook for "
                                      "state that grows")
            states[hook.name] = state
        return states

    def checkpoint_target(self, meta: dict) -> dict:
        """Shapes and dtypes of :meth:`checkpoint_state`'s tree, for restoring it with orbax.

        A hook's state has the shapes of ``jax.eval_shape`` of its ``init``; a hook whose state grows
        (``fixed_state_shape = False``, e.g. a dict of tier models) is restored as it was saved.
        Each array is restored whole on this process's first device (with several processes, on
        each one's): a checkpoint reads back whatever number of processes wrote it."""
        params = _shapes(self.params)
        stacked = lambda size: jax.tree.map(lambda leaf: jax.ShapeDtypeStruct((size,) + leaf.shape, leaf.dtype), params)
        stored = {k: len(meta["batch_rows"][k]) if "batch_rows" in meta else size  # older checkpoints: whole
                  for k, size in meta["batch_sizes"].items()}
        target = {"params": params, "server_state": _shapes(self.server_state),
                  "versions": {k: params for k in meta["version_keys"]},
                  "batches": {k: stacked(size) for k, size in stored.items()},
                  "batch_buffers": {k: stacked(size)[BUFFERS] for k, size in stored.items()}
                  if self.stateful else {},
                  "hooks": self._hook_targets(meta), "previous_params": params,
                  **({"client_state": self.client_state.targets()}
                     if meta.get("client_state_placement") == "device" else {})}
        placement = self._homes if self.processes > 1 else jax.sharding.SingleDeviceSharding(self.home)
        return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=placement), target)

    def save_client_state_files(self, folder: str) -> None:
        """Write the per-client tables into a checkpoint ``folder`` as ``.npy`` files when they live
        on the host (a device placement goes into the orbax tree instead)."""
        if self.client_state.keys and self.client_state.placement != "device":
            self.client_state.save_files(folder)

    def read_client_state_files(self, folder: str, meta: dict) -> dict | None:
        """The per-client tables a checkpoint holds as files (memory-mapped), or None."""
        if meta.get("client_state_placement") in (None, "device"):
            return None
        return ClientState.read_files(folder, self.client_state.targets())

    def _tables_in_hook_state(self, meta: dict) -> list:
        """The hooks whose per-client tables a checkpoint holds in their device state, as jaxfl did
        before :mod:`jaxfl.client_state` (a hook with tables now has no device state of its own)."""
        saved = meta.get("hook_shapes", {})
        return [hook for hook in self.hooks if hook.keeps_per_client_state() and hook.name in saved]

    def move_tables_from_hook_state(self, tree: dict, meta: dict) -> None:
        """Move the per-client tables of a restored checkpoint ``tree`` written before
        :mod:`jaxfl.client_state` from the hooks' state into ``tree["client_state"]`` (each hook's
        ``tables_from_state``), checked against the tables' shapes; ``ValueError`` naming the hook
        if one cannot say where its old state goes."""
        targets = self.client_state.targets()
        for hook in self._tables_in_hook_state(meta):
            tables = hook.tables_from_state(tree["hooks"].pop(hook.name))
            if tables is None or _unlike(tables, targets[hook.name]) is not None:
                raise ValueError(f"keeps hook {hook.name!r}'s per-client tables in the hook's state, as jaxfl did "
                                 "before jaxfl.client_state, in a layout this jaxfl cannot move into that store")
            tree.setdefault("client_state", {})[hook.name] = tables

    def _hook_targets(self, meta: dict) -> dict:
        saved = meta.get("hook_shapes", {})
        old_layout = self._tables_in_hook_state(meta)
        targets = {}
        for hook in self.hooks:
            if hook.name not in saved:
                continue
            if hook.fixed_state_shape and hook not in old_layout:
                targets[hook.name] = jax.eval_shape(lambda p, hook=hook: hook.init(p, self.num_clients), self.params)
            else:
                targets[hook.name] = saved[hook.name]
        return targets

    def restore(self, tree: dict, meta: dict, records: Sequence[DispatchRecord]) -> None:
        """Continue from a checkpoint written by :meth:`checkpoint_state` (``records`` = the
        restored simulation's records)."""
        if self.processes > 1:  # each process's part is its own copy, on its home device
            tree = jax.tree.map(lambda leaf: leaf.addressable_data(0), tree)
        self.params, self.server_state = tree["params"], tree["server_state"]
        self.version = meta["version"]
        self._versions = {int(v): p for v, p in tree["versions"].items()}
        self._replicas = {}
        self._version_users = {int(v): n for v, n in meta["version_users"].items()}
        buffers = tree.get("batch_buffers", {})

        def whole(stored, k, size):  # the stored rows back at their places in a batch of zeros
            rows = meta.get("batch_rows", {}).get(k)
            if stored is None or rows is None or len(rows) == size:
                return stored
            at_rows = lambda leaf: jnp.zeros((size,) + leaf.shape[1:], leaf.dtype).at[np.asarray(rows)].set(leaf)
            return jax.tree.map(at_rows, stored)

        batches = {k: self._back_on_devices(_TrainedBatch(deltas=whole(tree["batches"][k], k, size), size=size,
                                                          buffers=whole(buffers.get(k), k, size)))
                   for k, size in meta["batch_sizes"].items()}
        self._results = {int(d): (batches[k], i) for d, (k, i) in meta["placement"].items()}
        self._fetched_metrics, self._unfetched = {int(d): m for d, m in meta["client_metrics"].items()}, []
        self.tables = {name: list(rows) for name, rows in meta.get("tables", {}).items()}
        self._pending = {d: records[d] for d in meta["pending"]}
        self.stats = EngineStats(**meta["stats"])
        self.state.update(tree.get("hooks", {}))
        if self.client_state.keys:  # saved in any placement, restored into this run's
            if "client_state" not in tree:
                raise ValueError("the checkpoint holds no per-client state for hooks "
                                 f"{sorted({hook for hook, _ in self.client_state.keys})} (written by an older jaxfl?)")
            self.client_state.load(tree["client_state"])
        self.client_state.peak_rows_bytes = meta.get("peak_client_rows_bytes", 0)
        self.previous_params = tree.get("previous_params", self.params)
        self._fetches = {int(d): v for d, v in meta.get("fetches", {}).items()}
        self.split_calls = meta["split_calls"]
        # as the run had it (checkpoints older than the look ahead: none found yet)
        kept = meta.get("foresight")
        self._foresight = None if kept is None else frozenset(kept)
        self._foresight_budgets = meta.get("foresight_budgets")
        self._foresight_below = meta.get("foresight_below", math.inf)


@jax.jit
def _all_finite(tree: PyTree) -> jax.Array:
    """Whether every value of ``tree`` is finite (a bool scalar)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]))


def _shards_in_row_order(leaf: jax.Array) -> list:
    """The device shards of an array sharded by client (its row axis), first rows first."""
    return sorted(leaf.addressable_shards, key=lambda shard: shard.index[0].start or 0)


def _shapes(tree: PyTree) -> PyTree:
    return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), tree)


def _as_arrays(tree: PyTree) -> PyTree:
    """``tree`` with Python numbers as JAX arrays (arrays, NumPy's too, unchanged: a hook may update
    its NumPy state in place)."""
    return None if tree is None else jax.tree.map(lambda leaf: leaf if hasattr(leaf, "shape") else
                                                  jnp.asarray(leaf), tree)


class HookStateWarning(UserWarning):
    """A device hook changed its own Python attributes during a run: checkpoints do not hold them,
    so a resumed run starts them afresh and parts from the uninterrupted one."""


def _attributes(hook) -> dict:
    """A hook's attributes as they are now: the objects, and copies of the containers (whose entries
    may be rebound in place)."""
    return {name: (value, copy.copy(value) if isinstance(value, (list, dict, set)) else None)
            for name, value in vars(hook).items()}


_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _same(a, b) -> bool:
    """The same object, or equal plain values (an init run again sets ``self.n = n`` anew); never an
    array's ambiguous truth value."""
    return a is b or (type(a) is type(b) and type(a) in _PLAIN and a == b)


def _same_entries(was, now) -> bool:
    """A container's entries unchanged: the same keys (set members) and the same objects under them."""
    if type(was) is not type(now) or len(was) != len(now):
        return False
    if isinstance(was, dict):
        return was.keys() == now.keys() and all(_same(was[key], now[key]) for key in was)
    if isinstance(was, list):
        return all(_same(x, y) for x, y in zip(was, now))
    return was == now  # a set: of hashable members, compared by value


def _changed_attributes(before: dict, now: dict) -> list[str]:
    """The attributes rebound, added, removed or (containers) changed in place between two
    :func:`_attributes`.

    >>> import numpy as np
    >>> class Counting:
    ...     def __init__(self): self.t, self.seen, self.ref, self.n = 0, [], {"w": np.zeros(3)}, 10**6
    >>> hook = Counting(); before = _attributes(hook)
    >>> hook.n = 10**6  # an equal plain value again: unchanged
    >>> _changed_attributes(before, _attributes(hook))
    []
    >>> hook.t += 1; hook.seen.append(3); hook.cache = {}; hook.ref["w"] = np.ones(3)
    >>> _changed_attributes(before, _attributes(hook))
    ['cache', 'ref', 'seen', 't']
    """
    changed = []
    for name in sorted(set(before) | set(now)):
        if name not in before or name not in now:
            changed.append(name)
            continue
        (was, was_contents), (is_, _) = before[name], now[name]
        if not _same(was, is_) or (was_contents is not None and not _same_entries(was_contents, is_)):
            changed.append(name)
    return changed


def _unlike(tree: PyTree, target: PyTree, dtypes: bool = True, what: str = "the parameters'") -> str | None:
    """Where ``tree`` differs from ``target`` in structure, a leaf's shape or (with ``dtypes``) its
    dtype, in words; None where it does not.

    >>> _unlike({"w": jnp.zeros((2, 3))}, {"w": jnp.zeros((3, 2))})
    "leaf ['w'] has shape (2, 3) and dtype float32 where the parameters' has (3, 2) and float32"
    """
    leaves, structure = jax.tree.flatten_with_path(tree)
    wanted, wanted_structure = jax.tree.flatten(target)
    if structure != wanted_structure:
        return f"its structure {structure} is not {what} {wanted_structure}"
    for (path, leaf), want in zip(leaves, wanted):
        shape = tuple(np.shape(leaf))
        dtype = np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.result_type(leaf)  # a Python number
        if shape != tuple(want.shape) or (dtypes and dtype != np.dtype(want.dtype)):
            return (f"leaf {jax.tree_util.keystr(path)} has shape {shape} and dtype {dtype} where {what} has "
                    f"{tuple(want.shape)} and {np.dtype(want.dtype)}")
    return None


@jax.jit
def _stack_trees(trees: tuple) -> PyTree:
    """Pytrees stacked on a new leading axis (a tuple of them: one program per count)."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


@jax.jit
def _zeros_like_tree(tree: PyTree) -> PyTree:
    return jax.tree.map(jnp.zeros_like, tree)
