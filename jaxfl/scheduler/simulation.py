"""The discrete-event simulation of a federation on a virtual clock (plain Python, no jax).

A :class:`Policy` (one per algorithm, in :mod:`jaxfl.algorithms`) reacts to events: it dispatches
clients (which model version, how many local steps) and asks for aggregations (which updates, with
which coefficients). The :class:`Simulation` owns the clock, the client speeds, the global version
counter and the record of every dispatch; it never touches parameters. Numerical work goes to a
:class:`Backend` (the engine), which may train a dispatch whenever it likes before the first
aggregation that uses it — that freedom is what lets the engine batch the in-flight work.

Event semantics (documented because they decide results at equal times; these are the queue's
events, and the event log's rows are what came of them: a reply writes a ``dispatch`` row, and the
rows are listed in README, "The event log"):
- ``arrival``: a client's update reaches the server at ``start + round_duration``.
- ``reply``: the server sends a model to a client. Replies are events at the *same* instant with a
  lower priority than arrivals, so all updates that reach the server at one instant are processed
  before any reply leaves with the newest model. With continuous (jittered) times ties have
  probability zero and this equals replying at once; with exactly equal times (no jitter) it makes
  FedBuff with a full buffer behave exactly like FedAvg.
- ``timer``: a policy's own deadline (FedCompass's ``T_max``), processed first at its instant.
- ``pull``: the server asks an in-flight client to stop early and upload what it has
  (:meth:`Simulation.recall`, PORT's urgent pull); its arrival moves to the end of the block of
  steps it is training, and the arrival row says ``pulled: STEPS of PLANNED steps``.

Example (a policy that trains each client once and aggregates each arrival)::

    class Once(Policy):
        def start(self, sim):
            for client in range(sim.num_clients):
                sim.dispatch(client, steps=5)
        def on_arrival(self, sim, record):
            sim.aggregate([(record.id, sim.client_weights[record.client])])
"""
from __future__ import annotations

import array
import collections
import contextlib
import dataclasses
import gc
import inspect
import json
import math
import operator
import pickle
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence

import numpy as np

from jaxfl.scheduler.clock import DEFAULT_PRIORITIES, Event, EventQueue
from jaxfl.scheduler.faults import ClientFaults, fault_detail
from jaxfl.scheduler.speeds import ClientSpeeds

if TYPE_CHECKING:  # runlog imports this module
    from jaxfl.runlog import EventLog

IN_FLIGHT, ARRIVED, AGGREGATED, DROPPED = "in_flight", "arrived", "aggregated", "dropped"
AGGREGATION_MODES = ("delta", "mix")
NONFINITE_POLICIES = ("stop", "skip")
# Finished (aggregated or dropped) dispatch records kept for inspection after a run; beyond this the
# oldest are let go so that memory follows what is in flight, not how long the run is. 100,000 kept
# cost FedAsync a sixth of its events/s on long runs (every full collection walks them all): 97k
# against 113k at 10^4 clients and 10^6 updates, timing-only.
KEEP_FINISHED_RECORDS = 10_000
CRASHED = "client crashed"  # a crashed dispatch's drop reason (its record is kept: DispatchRecords.crashed)
# Simulator-internal events (the policy never sees a crash): after everything else at an instant.
_INTERNAL_PRIORITIES = {"crash": 9}
# Allocations between young-generation garbage collections while the simulation runs (Python's
# default is 700). Every dispatch leaves long-lived objects (its record, its queued event), so at the
# default the collector rescans them over and over: a third of a 10^5-client timeline's time. Only
# how often the collector runs changes, not what it frees; the threshold is restored when run() returns.
# It stays well above the event log's buffer (EventLog.buffer_rows, 65,536 row tuples, freed at each
# spill), which alone filled the young generation at 50,000: every row tuple was scanned once before
# its spill, 7 collections in a 10^4-client FedCompass run of 20,000 updates (~6 % of its CPU time
# in them and more in the caches they flush: 200,000 gave it 4-11 % more events/s, FedBuff ~6 %,
# FedAsync the same; one collection left in the run).
_RUN_GC_THRESHOLD = 200_000
# Clients whose round durations Simulation.dispatch_many draws in one call (ClientSpeeds.round_durations
# draws a first wave of 32,768 or more as arrays): at most this many, in blocks of equal size.
_DRAW_BLOCK = 1 << 16


class NumericalError(RuntimeError):
    """A run stopped on NaN/Inf: a client's loss or update, the global model, or an aggregation's
    weights (the message names what, when and where). ``run_dir``: the run's folder, where
    ``run_experiment`` raised it (its logs, and ``summary.json`` with ``stop_reason`` "numerical
    error: ..."); None where the error did not come from a run."""

    run_dir: str | None = None
# wall_time: wall-clock seconds since the run started, on aggregation rows only (empty elsewhere);
# the one column that differs between two runs of the same config and seed.
EVENT_LOG_FIELDS = ("time", "event", "client", "dispatch", "version", "staleness", "steps", "detail", "wall_time")
# Why a run stopped (Simulation.stop_reason); a stop asked for by the backend (the target accuracy, a
# metrics callback) is the string the backend returned.
STOP_REASONS = {"max_time": "time budget", "max_updates": "update budget",
                "max_client_updates": "client-update budget", "max_client_steps": "client-step budget"}
NO_EVENTS_LEFT = "no events left"  # the queue ran dry; with crashes, the stop reason goes on to count them


NONFINITE_DROP = "non-finite update"  # the drop reason of on_nonfinite="skip"


def same_instant_limit(num_clients: int) -> int:
    """Events at one virtual instant after which a run stops as stalled: 20 per client, at least
    10^6 (every client's dispatch, arrival and reply at one instant, many times over).

    >>> same_instant_limit(10), same_instant_limit(10**6)
    (1000000, 20000000)
    """
    return max(10**6, 20 * num_clients)


# A relative gap this small between a deadline and an arrival is float rounding (10^-12: thousands of
# ulps of either, far below any time a speed model draws apart): see Simulation.due_by_rounding.
DEADLINE_ROUNDING = 1e-12


def nonfinite_streak_limit(num_clients: int) -> int:
    """Non-finite updates in a row, none finite aggregated between them, after which a run with
    ``on_nonfinite="skip"`` stops as diverged: every client's update, up to 1,000, at least 100;
    and updates dropped in a row for any other reason (a round's deadline), after which a run stops
    as stalled.
    Skipping leaves the global model unchanged, so clients keep training from the model that made
    them diverge; a streak this long is a run that cannot recover, not a few clients' bad data.

    >>> nonfinite_streak_limit(10), nonfinite_streak_limit(500), nonfinite_streak_limit(10**6)
    (100, 500, 1000)
    """
    return max(100, min(num_clients, 1000))


@dataclasses.dataclass(slots=True)  # slots: a third less memory and faster access per record
class DispatchRecord:
    """One dispatch: ``client`` trains ``steps`` local steps from global ``version``.

    ``client_round`` counts this client's dispatches (0, 1, ...); with the run seed and client id
    it fixes the training key, so its random draws never depend on how dispatches are batched.
    """

    id: int
    client: int
    version: int
    steps: int
    client_round: int
    start_time: float
    arrival_time: float
    status: str = IN_FLIGHT
    aggregated_in: int | None = None  # the version its aggregation produced
    drop_reason: str | None = None
    lr_scale: float = 1.0  # multiplies the client's optimiser updates (FedCompass legacy lr decay)
    # FedASMU: at local step ``fetch_step`` the client mixes in the newest global model, which it
    # requested at a policy timer (Simulation.fetch); ``fetch_version`` is the version it got (None:
    # not fetched yet, or no newer model), ``fetched`` whether the request has been answered.
    fetch_step: int | None = None
    fetch_version: int | None = None
    fetched: bool = False
    # Seconds per local step in this round (None: no steps), so that a recall can tell how far the
    # client got; ``planned_steps`` is the count asked for at dispatch once a recall cut ``steps``.
    step_time: float | None = None
    planned_steps: int | None = None


class DispatchRecords:
    """The simulation's dispatch records by id: every unfinished one (in flight or arrived), and
    finished ones (aggregated or dropped) up to ``keep_finished``, the oldest forgotten first.

    Memory so stays bounded by what is in flight however long a run goes (10^5 clients × 100
    synchronous rounds are 10^7 dispatches); the event log keeps every dispatch. Iteration yields
    the kept records in dispatch order; ``len`` counts every dispatch ever made.

    >>> records = DispatchRecords(keep_finished=1)
    >>> for i in range(3):
    ...     records.add(DispatchRecord(i, client=i, version=0, steps=1, client_round=0, start_time=0.0, arrival_time=1.0))
    >>> records.finish(records[0]); records.finish(records[1])
    >>> [r.id for r in records], len(records), 1 in records, 0 in records
    ([1, 2], 3, True, False)
    """

    def __init__(self, keep_finished: int | None = None):
        if keep_finished is not None and keep_finished < 0:
            raise ValueError(f"keep_finished={keep_finished} is not allowed: >= 0, or None to keep every record")
        self.keep_finished = keep_finished
        self.live: dict[int, DispatchRecord] = {}
        # In order of finishing. An OrderedDict: evicting a plain dict's first key is O(n) once many
        # keys were deleted from its front (iteration skips their dummies).
        self.finished: collections.OrderedDict[int, DispatchRecord] = collections.OrderedDict()
        self.count = 0
        self.forgotten = 0
        # Crashed dispatches, never let go: the server cannot tell that a client crashed, so its policy
        # may still hold the id and look it up any time later (PORT's in-flight set, FedASMU's running
        # and lost ones raised KeyError once 10,000 later records had finished). At most one a client:
        # a crashed client is never dispatched again.
        self.crashed: dict[int, DispatchRecord] = {}

    def __setstate__(self, state: dict) -> None:
        if "crashed" not in state:  # a checkpoint from before crashed records were kept: its finished ones move
            finished = state["finished"]
            state["crashed"] = {d: r for d, r in finished.items() if r.drop_reason == CRASHED}
            for dispatch_id in state["crashed"]:
                del finished[dispatch_id]
        self.__dict__.update(state)

    def add(self, record: DispatchRecord) -> None:
        if record.id != self.count:
            raise ValueError(f"dispatch ids must be consecutive: expected {self.count}, got {record.id}")
        self.live[record.id] = record
        self.count += 1

    def finish(self, record: DispatchRecord) -> None:
        """Move an aggregated or dropped record out of the live set."""
        self.finish_many((record,))

    def finish_many(self, records: Iterable[DispatchRecord]) -> None:
        """:meth:`finish` of each record in turn, in one call (an aggregation finishes all its updates).

        >>> records = DispatchRecords(keep_finished=1)
        >>> for i in range(2):
        ...     records.add(DispatchRecord(i, client=i, version=0, steps=1, client_round=0, start_time=0.0, arrival_time=1.0))
        >>> records.finish_many([records[0], records[1]]); [r.id for r in records], records.forgotten
        ([1], 1)
        """
        live, finished, keep = self.live, self.finished, self.keep_finished
        for record in records:
            if live.pop(record.id, None) is None:
                continue
            if record.drop_reason == CRASHED:
                self.crashed[record.id] = record
                continue
            if keep == 0:
                self.forgotten += 1
                continue
            finished[record.id] = record
            if keep is not None and len(finished) > keep:
                finished.popitem(last=False)
                self.forgotten += 1

    def __getitem__(self, dispatch_id: int) -> DispatchRecord:
        try:
            return self.live[dispatch_id]
        except KeyError:
            record = self.finished.get(dispatch_id) or self.crashed.get(dispatch_id)
        if record is None:
            if 0 <= dispatch_id < self.count:
                raise KeyError(f"dispatch {dispatch_id} finished long ago and its record was let go "
                               f"(the simulation keeps the last {self.keep_finished} finished records; "
                               "the event log has every dispatch)")
            raise KeyError(f"no dispatch {dispatch_id}: {self.count} dispatches so far")
        return record

    def __contains__(self, dispatch_id: int) -> bool:
        return dispatch_id in self.live or dispatch_id in self.finished or dispatch_id in self.crashed

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return iter(sorted([*self.live.values(), *self.finished.values(), *self.crashed.values()], key=lambda r: r.id))


@dataclasses.dataclass(slots=True)  # not frozen: a frozen dataclass costs 4x to build, once per update
class Aggregation:
    """A global update producing ``version`` at ``time``.

    ``mode="delta"``: pseudo-gradient g = Σ c_i Δ_i, with Δ_i = start_i − final_i.
    ``mode="mix"``: g = Σ c_i (w − w_i), w_i = start_i − Δ_i the client's final model, i.e.
    w ← (1 − Σc_i) w + Σ c_i w_i (FedAsync's original mixing).
    Then w ← server_optimizer(w, g) if ``server_optimizer`` else w ← w − g.

    ``payload`` is the policy's typed message to its algorithm's device hooks (a NamedTuple the
    hooks define, e.g. the parts of a weighting that need no parameters); the engine never reads it.
    The simulation calls its ``check(sim, contributions)``, if it has one, before the update.
    Read-only by convention: a hook that needs another one makes a copy (``dataclasses.replace``).
    """

    time: float
    version: int
    contributions: tuple[tuple[int, float], ...]
    mode: str = "delta"
    server_optimizer: bool = True
    payload: Any = None


class Backend(Protocol):
    """The numerical side, implemented by :class:`jaxfl.engine.Engine`.

    Optional: ``on_fetch(record)`` (a pausing dispatch got its fresh model),
    ``on_recall(record)`` (a dispatch was recalled: it now trains fewer ``record.steps``) and
    ``on_attach(simulation)`` (called when the simulation is built or re-attached: the engine reads
    :meth:`Simulation.updates_left` and ``max_time`` from it, to train ahead only what may be used) and
    ``between_events(simulation)`` (called before the first event and after each: where
    :meth:`Simulation.foresee` may be called). Read only when a run sets ``max_client_steps``:
    ``aggregated_steps``, the local steps of the updates aggregated so far (the backend counts them
    anyway, as its record of the work). :class:`TimingBackend` trains nothing."""

    def on_dispatch(self, record: DispatchRecord) -> None: ...

    def on_aggregate(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> str | bool | None:
        """Apply the aggregation; return a reason (``"target reached"``, ``"stopped by CALLBACK"``)
        to stop the run after this event, or a false value to go on (True: ``"stopped by the backend"``)."""

    def on_drop(self, record: DispatchRecord) -> None: ...

    def nonfinite(self, records: Sequence[DispatchRecord]) -> list[DispatchRecord]:
        """The records whose update or loss is NaN/Inf (training them first if needed)."""


def local_steps_of(local_steps, client: int) -> int:
    """A client's local steps from a policy's ``local_steps``: one count for all clients, or one per
    client (a sequence indexed by client, from ``local_epochs``).

    >>> local_steps_of(5, 3), local_steps_of((7, 1), 1)
    (5, 1)
    """
    if type(local_steps) is int:
        return local_steps
    if isinstance(local_steps, (int, np.integer, float)):
        return _step_count(local_steps, "local_steps")
    return _step_count(local_steps[client], "local_steps")


def _step_count(steps, label: str = "steps") -> int:
    """``steps`` as an int: an integer of any kind, or a float holding one; anything else (2.7, a
    string, True) is refused by name rather than cut to an int (2.7 would train 2 steps, silently)."""
    if isinstance(steps, (int, np.integer)) and not isinstance(steps, (bool, np.bool_)):
        return int(steps)
    if isinstance(steps, (float, np.floating)) and float(steps).is_integer():
        return int(steps)
    raise ValueError(f"{label}={steps!r} ({type(steps).__name__}) is not a step count: an integer >= 0")


def _zero_time_round(client: int) -> ValueError:
    """The error of a dispatch whose round would take no virtual time (:meth:`Simulation.dispatch`)."""
    return ValueError(
        f"dispatch of client {client} with 0 steps takes no virtual time (no communication time, no "
        "extra_time): its arrival would come at this same instant, and a policy that dispatches again on "
        "each arrival would loop forever without the clock moving. Dispatch at least 1 step, or give the "
        "round time (extra_time, or a latency/bandwidth in the run's config)")


def _signature_mismatch(cls: type, base: type, names: Sequence[str]) -> str | None:
    """Which of ``names`` that ``cls`` defines itself cannot be called as ``base`` calls it (another
    count of positional parameters, or a keyword-only one without default): the error's words, or
    None. Checked when the class is defined, so that a hook written ``on_arrival(self, record)``
    fails at once, not at its first call after the first training round."""
    import inspect

    for name in names:
        function, expected = cls.__dict__.get(name), getattr(base, name)
        if not inspect.isfunction(function):
            continue
        try:
            signature, base_signature = inspect.signature(function), inspect.signature(expected)
        except (TypeError, ValueError):
            continue
        count = len(base_signature.parameters)  # the base's are all positional, self included
        parameters = list(signature.parameters.values())
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in positional if p.default is p.empty]
        varargs = any(p.kind == p.VAR_POSITIONAL for p in parameters)
        keyword_only = [p.name for p in parameters if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
        if len(required) <= count and (varargs or count <= len(positional)) and not keyword_only:
            continue
        wanted = f"{name}({', '.join(base_signature.parameters)})"
        given = name + str(signature.replace(parameters=[p.replace(annotation=p.empty) for p in parameters],
                                             return_annotation=signature.empty))
        return (f"{cls.__name__}.{given} does not match how {base.__name__} hooks are called, {wanted}: "
                f"it takes {len(positional)} positional parameters, {count} are passed"
                f"{' (and keyword-only ' + ', '.join(keyword_only) + ' is required)' if keyword_only else ''}; "
                f"define it as def {wanted}")
    return None


class PluginError(TypeError, ValueError):
    """A user's algorithm, policy or hook that does not follow the plug-in API (a ``policy()`` that
    returns no Policy, a ``hooks()`` that returns no tuple of hooks...), found before it runs. A
    TypeError, and a ValueError so that ``jaxfl run`` reports it in one line as it reports bad input."""


def _comm_time(speeds, client: int) -> float:
    """``client``'s communication seconds a round: its own where a trace gives each client's network
    (``speeds.comm_varies``), else the one time every client has (a speed model of one's own may
    take no client)."""
    return speeds.comm_time(client) if getattr(speeds, "comm_varies", False) else speeds.comm_time()


class _NoLocalSteps(PluginError, AttributeError):
    """A policy whose default ``on_reply`` needs ``self.local_steps``, which it never set: an
    AttributeError, as a missing attribute is, and a plug-in error, which ``jaxfl run`` says in one line."""


def _misspelt_hook(cls: type, base: type, names: Sequence[str]) -> str | None:
    """A method ``cls`` defines itself whose name is a near miss of one of ``names`` that neither it nor
    a class between it and ``base`` defines (``on_arival`` for ``on_arrival``, ``weight`` for
    ``weigh``): the error's words, or None. Such a method is never called, and the base's default
    runs in its place, silently or as an error deep in the run."""
    import difflib

    for name, value in cls.__dict__.items():
        if name in names or name.startswith("__") or not inspect.isfunction(value):
            continue
        for wanted in difflib.get_close_matches(name, names, n=1, cutoff=0.8):
            if getattr(cls, wanted) is getattr(base, wanted):  # the hook itself is not defined anywhere
                return (f"{cls.__name__}.{name} looks like a misspelt {wanted}, which {base.__name__} calls; "
                        f"{cls.__name__} does not define {wanted}, so {name} would never be called: rename it "
                        f"{wanted} (or give a helper method a name further from {', '.join(names)})")
    return None


class Policy:
    """Base class of a scheduling policy (one algorithm's server logic).

    Subclasses override :meth:`start` and :meth:`on_arrival`, and :meth:`on_timer` if they set
    timers. The default :meth:`on_reply` re-dispatches the client with ``self.local_steps`` (one
    count, or one per client: :func:`local_steps_of`): a policy that uses it must set
    ``self.local_steps`` (there is no default, so that a count kept under another name cannot
    silently train one step), or override :meth:`on_reply`.
    """

    name = "policy"
    local_steps = None  # the default on_reply's steps: set it (one count, or one per client)
    priorities = DEFAULT_PRIORITIES
    needs_start_models = False  # True if it aggregates in "mix" mode (the engine keeps start models)
    HOOKS = ("start", "on_arrival", "on_reply", "on_timer", "on_crash")  # what the simulation calls

    def __init_subclass__(cls, **kwargs) -> None:
        """A hook overridden with another signature than the base's is refused when the class is
        defined (TypeError naming it), not at its first call deep into a run."""
        super().__init_subclass__(**kwargs)
        problem = _signature_mismatch(cls, Policy, Policy.HOOKS) or _misspelt_hook(cls, Policy, Policy.HOOKS)
        if problem is not None:
            raise TypeError(problem)

    def start(self, sim: "Simulation") -> None:
        """Called once, at virtual time 0 before any event, to set the run going: dispatch the first
        clients (:meth:`Simulation.dispatch`, :meth:`Simulation.dispatch_many`) and set any timers
        (:meth:`Simulation.set_timer`). A policy that dispatches nothing here has no events, and
        the run ends at once ("no events left"). Must be overridden.

        Example (every client trains ``self.local_steps`` steps)::

            def start(self, sim):
                sim.dispatch_many(range(sim.num_clients), self.local_steps)
        """
        raise NotImplementedError(f"{type(self).__name__} must implement start()")

    def on_arrival(self, sim: "Simulation", record: DispatchRecord) -> None:
        """Called when a dispatch's update reaches the server (at ``record.arrival_time``, which is
        ``sim.now``): ``record`` is its :class:`DispatchRecord` (``client``, ``version`` it started
        from, ``steps``...), now arrived. Decide what to do with it: aggregate it (alone, or later
        with others: :meth:`Simulation.aggregate`, after :meth:`Simulation.screen` where weights
        depend on which updates are kept), and send the client back to work
        (:meth:`Simulation.reply`, which calls :meth:`on_reply` after every arrival of this
        instant, or :meth:`Simulation.dispatch`). Must be overridden.

        Example (FedAsync-like: aggregate each update at once, then reply)::

            def on_arrival(self, sim, record):
                sim.aggregate([(record.id, 0.5)])
                sim.reply(record.client)
        """
        raise NotImplementedError(f"{type(self).__name__} must implement on_arrival()")

    def on_reply(self, sim: "Simulation", client: int, payload) -> None:
        """Called for each :meth:`Simulation.reply` of ``sim.reply(client, payload)``, at the same
        virtual instant but after every arrival of that instant, so the client gets the newest
        model. The default dispatches ``client`` again for ``self.local_steps`` steps
        (:func:`local_steps_of`) and ignores ``payload``; it raises if the policy did not set
        ``self.local_steps``. Override it to choose the steps, learning rate or detail per reply
        (``payload`` is what the policy passed to :meth:`Simulation.reply`).

        Example (halve the steps of a client replied to with ``payload="slow"``)::

            def on_reply(self, sim, client, payload):
                steps = local_steps_of(self.local_steps, client)
                sim.dispatch(client, steps // 2 if payload == "slow" else steps)
        """
        if self.local_steps is None:
            raise _NoLocalSteps(
                f"{type(self).__name__}.on_reply: the default on_reply re-dispatches client {client} for "
                f"self.local_steps steps, and {type(self).__name__} sets no self.local_steps: define "
                "self.local_steps (e.g. self.local_steps = run.local_steps in __init__) or override on_reply")
        sim.dispatch(client, local_steps_of(self.local_steps, client))

    def on_timer(self, sim: "Simulation", payload) -> None:
        """Called when a timer set with ``sim.set_timer(time, payload)`` fires (at ``time``, which is
        ``sim.now``; timers come first among the events of an instant). ``payload`` is the value
        given to :meth:`Simulation.set_timer` (picklable: checkpoints pickle it). A timer
        cancelled with :meth:`Simulation.cancel` never fires. The default raises: a policy that
        sets timers must override it (FedCompass's ``T_max`` deadlines, FedAvg's ``round_timeout``,
        FedASMU's trigger period).

        Example (a round deadline: aggregate what arrived, then start the next round)::

            def start(self, sim):
                self.deadline = sim.set_timer(sim.now + 10.0, "round over")
            def on_timer(self, sim, payload):
                self.close_round(sim)
                self.deadline = sim.set_timer(sim.now + 10.0, "round over")
        """
        raise ValueError(f"{type(self).__name__} received a timer but defines no on_timer()")

    def on_crash(self, sim: "Simulation", record: DispatchRecord) -> None:
        """``record``'s client crashed at ``sim.now`` and is gone for good (its update was dropped as
        "client crashed"). Called only in runs that simulate faults (``crash_prob`` > 0). The
        default does nothing: a policy that waits for its clients stops
        waiting at its own deadline (``round_timeout``, T_max), as before the hook existed. A policy
        that keeps a number of clients in flight (:class:`~jaxfl.scheduler.pool.InFlightLimit`,
        FedBuff's and FedAsync's) dispatches a replacement here, as their servers do when a
        connection drops, so that crashes do not drain its concurrency.

        Example (refill the slot with the next client that never trained)::

            def on_crash(self, sim, record):
                sim.dispatch(self.fresh.pop(), self.local_steps)
        """


class Simulation:
    """Run a policy on the virtual clock until a budget is spent or the backend asks to stop.

    ``client_weights`` are the p_i (sum 1). Budgets, in the units papers report (any may be None):

    - ``max_time``: virtual seconds; events after it are left in flight;
    - ``max_updates``: global updates (model versions);
    - ``max_client_updates``: client updates aggregated (FedBuff's and APPFL's budget);
    - ``max_client_steps``: local steps in the aggregated client updates (the metrics'
      ``client_steps``).

    The budgets in versions, client updates and client-steps are checked after every event, so the
    run stops right after the aggregation that reaches or first passes one: it never runs another
    event, and it overshoots a client budget by less than that one aggregation's contribution
    (FedAvg with 10 clients and ``max_client_updates=15`` stops after 2 rounds, 20 updates).
    ``stop_reason`` names what stopped the run (:data:`STOP_REASONS`, ``"no events left"``, or the
    reason the backend or the policy (:meth:`stop`) gave). ``log`` receives the event-log rows (fields ``EVENT_LOG_FIELDS``): an
    :class:`~jaxfl.runlog.EventLog` (or any object with its ``row_writer``), or a function taking
    one dict per row; ``wall_clock() -> seconds`` fills the aggregation rows' ``wall_time``.

    ``client_lr_decay`` = d scales the learning rate of a client's k-th dispatch (k = 0, 1, ... its
    ``client_round``) by d^k, on top of the policy's ``lr_scale``: each device decays its own
    learning rate over its own local rounds, so in a synchronous run with every client in every
    round it is the usual per-round decay, and in an asynchronous one a client's rate does not fall
    because other clients were fast.
    """

    def __init__(self, policy: Policy, speeds: ClientSpeeds, client_weights: Sequence[float],
                 backend: Backend, max_time: float = math.inf, max_updates: int | None = None,
                 log: EventLog | Callable[[dict], None] | None = None, faults: ClientFaults | None = None,
                 on_nonfinite: str = "stop", after_event: Callable[["Simulation"], None] | None = None,
                 keep_finished_records: int | None = KEEP_FINISHED_RECORDS,
                 max_client_updates: int | None = None, max_client_steps: int | None = None,
                 wall_clock: Callable[[], float] | None = None, client_lr_decay: float = 1.0):
        weights = np.asarray(client_weights, dtype=np.float64)
        if weights.ndim != 1 or len(weights) < 1:
            raise ValueError(f"client_weights must be a non-empty 1-D sequence, got shape {weights.shape}")
        self.set_budgets(max_time, max_updates, max_client_updates, max_client_steps)
        if on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"on_nonfinite={on_nonfinite!r} is not allowed: one of {', '.join(NONFINITE_POLICIES)}")
        if not 0 < client_lr_decay <= 1:
            raise ValueError(f"client_lr_decay={client_lr_decay!r} is not allowed: a factor in (0, 1]")
        self.policy = policy
        self.speeds = speeds
        self.client_lr_decay = float(client_lr_decay)
        self.client_weights = weights
        self.num_clients = len(weights)
        self.backend = backend
        self.queue = EventQueue({**_INTERNAL_PRIORITIES, **policy.priorities})
        self.faults = faults
        self.on_nonfinite = on_nonfinite
        self.after_event = after_event  # called between events (never inside one): checkpoints
        self._started = False
        self.version = 0
        self.records = DispatchRecords(keep_finished_records)
        # Kept as counters, not recounted from the records (which forget finished dispatches).
        self._counts = {IN_FLIGHT: 0, ARRIVED: 0, AGGREGATED: 0, DROPPED: 0}
        self._drop_reasons: dict[str, int] = {}
        # The timeline's statistics, gathered as it runs (the event log may be too big to re-read):
        # seconds each client spent training or transferring on dispatches that ended (a fault's
        # offline or late seconds left out), and the staleness of aggregated updates.
        # Per-client columns are array.array: as compact as numpy's, a fraction of its cost per scalar.
        self.busy_time = array.array("d", [0.0]) * self.num_clients
        # Seconds a delay or dropout added to each dispatch in flight, by id (empty without faults):
        # offline or late, not training. Counted as the round's first seconds, so that the
        # utilisation leaves them out alike live and from the event log (whose dispatch row names
        # them), a round still in flight at the end included. Kept beside the records, not in them:
        # a field more in each of 10^6 records would cost every run, faults or not.
        self.fault_seconds: dict[int, float] = {}
        # When each dispatch in flight whose crash is drawn would arrive without it, by id: an urgent
        # pull (recall) that makes it upload before the crash's time averts the crash.
        self.crash_free_arrival: dict[int, float] = {}
        self.staleness_counts: dict[int, int] = {}
        # Local steps of the dispatches that have arrived (aggregated or not): the computation the
        # federation spent, whatever the engine trained ahead for clients still out; None in a
        # simulation restored from a checkpoint written before it was counted
        self.arrived_steps: int | None = 0
        self.events_processed = 0
        self.client_rounds = array.array("q", [0]) * self.num_clients
        # The dispatch each client is training (its id + 1; 0: none): a client trains one model at a
        # time, and a dispatch to a client still training is refused (a plug-in's "every client each
        # round" had one device train two models at once, utilisation 138 %)
        self.training = array.array("q", [0]) * self.num_clients
        self.crashed_clients: set[int] = set()  # gone for good: a dispatch to one crashes at once
        self.stop_reason: str | None = None
        self._bind_log(log)
        self.wall_clock = wall_clock
        self._stop_requested: str | None = None  # the backend's reason
        # Non-finite updates dropped since the last finite one aggregated (on_nonfinite="skip"): a
        # long streak means every client diverges from the unchanged global model, so the run stops
        # rather than retrain the same failure until its budget (:func:`nonfinite_streak_limit`).
        self.nonfinite_streak = 0
        # Updates trained from the current model and dropped for any other reason (a round's deadline)
        # since the last one aggregated: a long streak is a run that makes no progress, e.g. a
        # round_timeout shorter than every client's round, which ran to its budget with 0 updates
        # (forever under max_time inf)
        self.drop_streak = 0
        self._tell_backend()

    def __setstate__(self, state: dict) -> None:
        """Checkpoints written before the client budgets existed restore with those off."""
        state.setdefault("max_client_updates", None)
        state.setdefault("max_client_steps", None)
        state.setdefault("wall_clock", None)
        state.setdefault("client_lr_decay", 1.0)
        if "training" not in state:  # checkpoints from before the clients in training were kept
            training = array.array("q", [0]) * len(state["busy_time"])
            for record in state["records"].live.values():
                if record.status == IN_FLIGHT:
                    training[record.client] = record.id + 1
            state["training"] = training
            state["crashed_clients"] = {record.client for record in state["records"].crashed.values()}
        state.pop("aggregated_steps", None)  # a copy of the backend's count that earlier checkpoints kept
        if state.get("_stop_requested") is False:
            state["_stop_requested"] = None
        state.setdefault("nonfinite_streak", 0)
        state.setdefault("drop_streak", 0)
        state.setdefault("fault_seconds", {})  # rounds in flight then: their faults' seconds count as busy
        state.setdefault("crash_free_arrival", {})  # their crashes then: a recall gets no answer, as before
        state.setdefault("arrived_steps", None)  # not counted then: unknown
        for name, code, dtype in (("busy_time", "d", np.float64), ("client_rounds", "q", np.int64)):
            if isinstance(state.get(name), np.ndarray):  # checkpoints from before the array.array columns
                state[name] = array.array(code, state[name].astype(dtype).tobytes())
        self.__dict__.update(state)
        self._bind_log(self._log)  # attach() binds the run's log

    @property
    def aggregated_steps(self) -> int:
        """Local steps in the aggregated updates (the client-step budget's unit), as the backend counts them."""
        return self.backend.aggregated_steps

    @property
    def client_updates_aggregated(self) -> int:
        """Client updates aggregated so far (the client-update budget's unit)."""
        return self._counts[AGGREGATED]

    def updates_left(self, in_progress: int = 1) -> float:
        """About how many more client updates the run's budgets let it aggregate (``math.inf``
        where no budget counts them): an aggregation in progress counts as still to come. The update
        budget counts versions, so it is turned into client updates by those aggregated per version
        so far (before any, by the ``in_progress`` updates of the aggregation being made). A backend
        that trains ahead reads it, so that the end of a run does not leave trained updates unused.

        Example (FedBuff, K = 10, ``max_updates=300``, after 20 versions of 10 updates each)::

            sim.updates_left()  # → 2800.0: (300 - 20) versions × 10 client updates
        """
        aggregated, left = self._counts[AGGREGATED], math.inf
        if self.max_updates is not None:
            per_version = aggregated / self.version if aggregated else float(max(in_progress, 1))
            left = (self.max_updates - self.version) * per_version
        if self.max_client_updates is not None:
            left = min(left, self.max_client_updates - aggregated)
        if self.max_client_steps is not None:
            if aggregated:
                steps = self.aggregated_steps
                left = min(left, (self.max_client_steps - steps) * aggregated / max(steps, 1))
            else:  # none aggregated yet: by the steps of the updates in flight (once, at a run's first aggregation)
                steps = [record.steps for record in self.records.live.values()]
                if steps and sum(steps):
                    left = min(left, self.max_client_steps * len(steps) / sum(steps))
        return max(left, 0.0)

    # ----------------------------------------------------------------- policy-facing API
    @property
    def now(self) -> float:
        """The virtual clock (the time of the event being handled)."""
        return self.queue._now  # the queue's field rather than its property: policies read it often

    def staleness(self, record: DispatchRecord) -> int:
        """τ_g − τ_i: global updates since the record's model version."""
        return self.version - record.version

    def dispatch(self, client: int, steps: int, lr_scale: float = 1.0, detail: str | None = None,
                 extra_time: float = 0.0, fetch_step: int | None = None) -> DispatchRecord:
        """Send the current global model to ``client`` for ``steps`` local steps.

        ``detail`` is written to the event log (e.g. FedCompass's ``group 3``, FedAT's ``tier 1``).
        ``extra_time`` lengthens the round (FedASMU's extra fetch of a fresh model); ``fetch_step``
        marks a dispatch that mixes in a fresh global at that step (see :meth:`fetch`). The record's
        ``lr_scale`` is ``lr_scale`` times ``client_lr_decay`` to the client's round. A 0-step
        dispatch (a pure model transfer) is allowed only where its round takes virtual time
        (communication time or ``extra_time``): one that takes none raises ValueError, as it would
        arrive at this same instant and a policy re-dispatching on arrival would never move the clock.
        A client trains one model at a time: one still training (in flight) is refused (ValueError);
        one that crashed is gone for good, and a dispatch to it crashes at once (the server cannot
        tell, and learns it as it learns of any crash: ``Policy.on_crash``).
        """
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client {client} out of range [0, {self.num_clients})")
        if self.training[client]:
            raise self._still_training(client)
        if type(steps) is not int:
            steps = _step_count(steps)
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        if not extra_time >= 0:
            raise ValueError(f"extra_time must be >= 0, got {extra_time}")
        speeds = self.speeds
        speed_duration = speeds.round_duration(client, steps)
        step_time = (speed_duration - _comm_time(speeds, client)) / steps if steps > 0 else None
        duration = speed_duration + float(extra_time)
        if steps == 0 and not duration > 0:
            raise _zero_time_round(client)
        if self.faults is not None:
            return self._dispatch_with_faults(client, steps, lr_scale, detail, fetch_step, duration, step_time)
        # _add_record's work, inline: its call was a twentieth of a dispatch
        queue, records, version = self.queue, self.records, self.version
        now, dispatch_id, client_round = queue._now, records.count, self.client_rounds[client]
        decay = self.client_lr_decay
        record = DispatchRecord(dispatch_id, client, version, steps, client_round, now, now + duration, IN_FLIGHT,
                                None, None, float(lr_scale) if decay == 1.0 else float(lr_scale) * decay ** client_round,
                                None if fetch_step is None else int(fetch_step), None, False, step_time)
        self.client_rounds[client] = client_round + 1
        records.live[dispatch_id] = record
        records.count = dispatch_id + 1
        self.training[client] = dispatch_id + 1
        self._counts[IN_FLIGHT] += 1
        queue.push(record.arrival_time, "arrival", client, dispatch_id)
        self._emit((now, "dispatch", client, dispatch_id, version, None, steps, detail, None))
        self.backend.on_dispatch(record)
        return record

    def _dispatch_with_faults(self, client: int, steps: int, lr_scale: float, detail: str | None,
                              fetch_step: int | None, duration: float, step_time: float | None) -> DispatchRecord:
        """:meth:`dispatch`'s rest where faults are simulated: the client's fault draw may delay its
        arrival, or put its crash on the queue instead."""
        if client in self.crashed_clients:  # gone for good: the dispatch fails at once, nothing is drawn
            record = self._add_record(client, steps, duration, step_time, lr_scale, fetch_step)
            record.arrival_time = math.inf
            self.queue.push(record.start_time, "crash", client, record.id)
            self._emit((record.start_time, "dispatch", client, record.id, record.version, None, steps,
                        f"{detail}; crash (crashed before)" if detail else "crash (crashed before)", None))
            self.backend.on_dispatch(record)
            return record
        fault = self.faults.draw(client, duration)
        if fault is not None and fault.kind in ("delay", "dropout"):
            duration += fault.extra_time
        record = self._add_record(client, steps, duration, step_time, lr_scale, fetch_step)
        now = record.start_time
        if fault is not None and fault.kind == "crash":
            self.crash_free_arrival[record.id] = record.arrival_time
            record.arrival_time = math.inf
            self.queue.push(now + fault.fraction * duration, "crash", client, record.id)
        else:
            self.queue.push(record.arrival_time, "arrival", client, record.id)
        if fault is not None and fault.kind is not None:
            if fault.kind != "crash":
                self.fault_seconds[record.id] = fault.extra_time
            words = fault_detail(fault.kind, fault.extra_time)  # with the seconds: the log's utilisation
            detail = f"{detail}; {words}" if detail else words
        self._emit((now, "dispatch", client, record.id, record.version, None, steps, detail, None))
        self.backend.on_dispatch(record)
        return record

    def _add_record(self, client: int, steps: int, duration: float, step_time: float | None, lr_scale: float,
                    fetch_step: int | None = None) -> DispatchRecord:
        """The in-flight record of ``client``'s next round, from now for ``duration`` seconds, added to
        the records and counts (:meth:`dispatch` and :meth:`dispatch_many`)."""
        now = self.queue._now  # the clock's own field: the property costs a call per dispatch
        records = self.records
        client_round = self.client_rounds[client]
        decay = self.client_lr_decay  # next_lr_scale, inline: x · 1.0^k is x, so no power without a decay
        lr_scale = float(lr_scale) if decay == 1.0 else float(lr_scale) * decay ** client_round
        # positional, in DispatchRecord's field order: keywords cost a third of a dispatch's Python
        dispatch_id = records.count
        record = DispatchRecord(dispatch_id, client, self.version, steps, client_round, now, now + duration,
                                IN_FLIGHT, None, None, lr_scale,
                                None if fetch_step is None else int(fetch_step), None, False, step_time)
        self.client_rounds[client] = client_round + 1
        records.live[dispatch_id] = record  # records.add, inline: the id is the next one by construction
        records.count = dispatch_id + 1
        self.training[client] = dispatch_id + 1
        self._counts[IN_FLIGHT] += 1
        return record

    def dispatch_many(self, clients: Iterable[int], steps: int, lr_scale: float = 1.0,
                      detail: str | None = None) -> None:
        """``dispatch(client, steps, lr_scale, detail)`` for each of ``clients`` in turn — the same
        records, speed and fault draws, events and log rows in the same order — in one loop: a
        policy that starts every client at once (FedCompass's warm-up, 10^6 dispatches at 10^6
        clients) spends half the time. The arrival events go on the queue with one ``heapify``
        (:meth:`EventQueue.push_many`). A policy's start runs with collections paused (see
        :meth:`run`), where many clients start at once.

        Example (every client of a simulation trains 5 steps)::

            sim.dispatch_many(range(sim.num_clients), 5)
        """
        steps = steps if type(steps) is int else _step_count(steps)
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        if self.faults is not None:  # a fault may put a crash on the queue instead of the arrival
            for client in clients:
                self.dispatch(client, steps, lr_scale, detail)
            return
        clients = [client if type(client) is int else operator.index(client) for client in clients]
        num_clients, training = self.num_clients, self.training
        speeds = self.speeds
        comm_varies = getattr(speeds, "comm_varies", False)  # a trace's own transfer time for each client
        comm_seconds = None if comm_varies else speeds.comm_time()
        if steps == 0 and clients:  # a round of no steps and no communication would take no time
            free = next((client for client in clients
                         if not (speeds.comm_time(client) if comm_varies else comm_seconds) > 0), None)
            if free is not None:
                raise _zero_time_round(free)
        for position, client in enumerate(clients):  # all checked before anything is drawn or dispatched
            if not 0 <= client < num_clients or training[client]:
                error = ValueError(f"client {client} out of range [0, {num_clients})") \
                    if not 0 <= client < num_clients else self._still_training(client, clients[:position])
                for earlier in clients[:position]:  # none is left marked as training
                    training[earlier] = 0
                raise error
            training[client] = -1  # a client twice in the list is refused, as one in flight is
        # a first wave's draws in bulk (ClientSpeeds.round_durations), where the speed model has them,
        # in equal blocks of at most _DRAW_BLOCK clients: 10^6 durations at once were 90 MB more peak memory
        round_durations = getattr(speeds, "round_durations", None)
        block_size = -(-len(clients) // -(-len(clients) // _DRAW_BLOCK)) if clients else 1

        def durations():
            for start in range(0, len(clients), block_size):
                block = clients[start:start + block_size]
                if round_durations is not None:
                    yield from round_durations(block, steps)
                else:
                    yield from (speeds.round_duration(client, steps) for client in block)

        emit, on_dispatch = self._emit, self.backend.on_dispatch
        now, arrivals = self.queue._now, []
        # _add_record's work, in the loop: a call per client was a tenth of a 10^6-client warm-up
        records, client_rounds, counts = self.records, self.client_rounds, self._counts
        live, version, decay, scale = records.live, self.version, self.client_lr_decay, float(lr_scale)
        try:
            for client, duration in zip(clients, durations()):
                step_time = ((duration - (speeds.comm_time(client) if comm_varies else comm_seconds)) / steps
                             if steps > 0 else None)
                client_round = client_rounds[client]
                dispatch_id = records.count
                record = DispatchRecord(dispatch_id, client, version, steps, client_round, now,
                                        now + (duration + 0.0),  # + 0.0: dispatch's extra_time
                                        IN_FLIGHT, None, None, scale if decay == 1.0 else scale * decay ** client_round,
                                        None, None, False, step_time)
                client_rounds[client] = client_round + 1
                live[dispatch_id] = record
                records.count = dispatch_id + 1
                training[client] = dispatch_id + 1
                counts[IN_FLIGHT] += 1
                arrivals.append((record.arrival_time, "arrival", client, dispatch_id))
                emit((now, "dispatch", client, dispatch_id, version, None, steps, detail, None))
                on_dispatch(record)
        except BaseException:  # (a draw that raised) the clients not dispatched are not in training
            for client in clients:
                if training[client] == -1:
                    training[client] = 0
            raise
        finally:
            self.queue.push_many(arrivals)

    def next_lr_scale(self, client: int, lr_scale: float = 1.0, client_round: int | None = None) -> float:
        """The learning-rate scale of ``client``'s next dispatch: ``lr_scale`` times ``client_lr_decay``
        to the client's round (its k-th dispatch trains at lr · decay^k; ``client_round``: k when
        the caller has it already).

        Example (decay 0.5, a client that has trained twice)::

            sim.next_lr_scale(client)  # → 0.25
        """
        if client_round is None:
            client_round = int(self.client_rounds[client])
        return float(lr_scale) * self.client_lr_decay ** client_round

    def recall(self, record: DispatchRecord, block_steps: int = 1, reason: str = "urgent pull") -> int | None:
        """Ask an in-flight dispatch to stop after the block of ``block_steps`` local steps it is
        training now and upload that partial update; returns the steps it will upload (None: it
        does not answer, because it has crashed or crashes before that upload would arrive). A
        client whose crash is drawn for later than that upload is alive when asked: it uploads,
        and its crash does not happen.

        The client trains on to the end of its current block (the first one if it is still
        downloading the model), then uploads: its arrival moves to ``start + download + done ·
        step time + the rest of its round after training`` (upload, any fault delay). A dispatch in
        its last block already arrives when planned. The backend's ``on_recall(record)``, if it has
        one, learns that ``record.steps`` shrank (the engine re-trains an update it trained early).
        PORT's urgent pull (Su & Li, IEEE IWQoS 2022, §IV-B push-pull).

        Example (one client at 2 s per step, 10 steps, recalled at 5 s, after its third step)::

            sim.recall(record)  # at now = 5.0 → 3; record.steps == 3, record.arrival_time == 6.0
        """
        if record.status == DROPPED:  # it crashed already; the server cannot tell and asks in vain
            self._write("pull", self.now, record.client, record.id, record.version, self.staleness(record),
                        None, f"{reason}: no answer")
            return None
        if record.status != IN_FLIGHT:
            raise ValueError(f"dispatch {record.id} is {record.status}; only an in-flight (or crashed) dispatch "
                             "can be recalled")
        if record.fetch_step is not None and not record.fetched:
            raise ValueError(f"dispatch {record.id} pauses for a fetch at step {record.fetch_step}; "
                             "it cannot be recalled before the fetch")
        if not (isinstance(block_steps, int) and block_steps >= 1):
            raise ValueError(f"block_steps={block_steps!r} is not allowed: an integer >= 1")
        event = self.queue.find("arrival", record.id)
        crash = None
        planned_arrival = record.arrival_time
        if event is None:  # a crash is scheduled instead of the arrival
            crash = self.queue.find("crash", record.id)
            planned_arrival = self.crash_free_arrival.get(record.id)
            if crash is None or planned_arrival is None:
                self._write("pull", self.now, record.client, record.id, record.version, self.staleness(record),
                            None, f"{reason}: no answer")
                return None
        planned = record.steps
        step_time = getattr(record, "step_time", None)
        done = planned
        if step_time is not None and step_time > 0:
            training_start = record.start_time + _comm_time(self.speeds, record.client) / 2
            blocks = max(1, math.ceil((self.now - training_start) / (block_steps * step_time)))
            done = min(planned, blocks * block_steps)
        if done >= planned and crash is None:
            self._write("pull", self.now, record.client, record.id, record.version, self.staleness(record),
                        planned, f"{reason}: in its last block, uploads at {record.arrival_time:.6g}")
            return planned
        if done < planned:
            after_training = planned_arrival - (training_start + planned * step_time)
            arrival = max(self.now, training_start + done * step_time + after_training)
        if crash is not None:
            # a crash at the instant of the upload comes after it (crashes follow every other event)
            if done >= planned or arrival > crash.time:
                self._write("pull", self.now, record.client, record.id, record.version, self.staleness(record),
                            None, f"{reason}: no answer")
                return None
            self.queue.cancel(crash)
            del self.crash_free_arrival[record.id]
        else:
            self.queue.cancel(event)
        self.queue.push(arrival, "arrival", record.client, record.id)
        record.planned_steps, record.steps, record.arrival_time = planned, done, arrival
        on_recall = getattr(self.backend, "on_recall", None)
        if on_recall is not None:
            on_recall(record)
        self._write("pull", self.now, record.client, record.id, record.version, self.staleness(record), done,
                    f"{reason}: {done} of {planned} steps, uploads at {arrival:.6g}")
        return done

    def reply(self, client: int, payload=None) -> None:
        """Schedule a reply to ``client`` at this instant, after every arrival of the instant."""
        queue = self.queue
        queue.push(queue._now, "reply", client, payload)

    def stop(self, reason: str) -> None:
        """End the run after the event being handled, with ``reason`` as its ``stop_reason``: for a
        policy that has nothing left to schedule before any budget is spent (FedAvg(dropout) once
        every client's quota is used up), where the run would otherwise wait for ``max_time`` or,
        with rounds that take no time, never end. A stop already asked for keeps its reason.

        Example (in a policy's ``start`` or handler)::

            if not any(self.can_train(client) for client in range(sim.num_clients)):
                sim.stop("every client's quota is used up")
        """
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"stop reason {reason!r} is not allowed: a non-empty string saying why the run ends")
        if not self._stop_requested:
            self._stop_requested = reason

    def due_by_rounding(self, records: Iterable[DispatchRecord], deadline: float | None = None) -> float | None:
        """The latest arrival time among the in-flight ``records`` that come after ``deadline`` (by
        default now) by float rounding alone, within a relative 10^-12 of it; None if none does.

        A deadline ``now + timeout`` and an arrival ``now + steps · t_i`` are rounded apart: 0.1 s × 3
        steps is 0.30000000000000004, after a 0.3 s deadline, and every update of such a round was
        dropped as late. A policy whose deadline means "an update arriving exactly at it is on time"
        sets its timer again at this time once, so that those arrivals come first::

            def on_timer(self, sim, payload):
                later = sim.due_by_rounding(self.round_records) if payload != "rounding" else None
                if later is not None:
                    sim.set_timer(later, "rounding")  # the round waits for them
                    return
                self.close_round(sim)
        """
        deadline = self.queue._now if deadline is None else deadline
        limit = deadline + abs(deadline) * DEADLINE_ROUNDING
        later = [r.arrival_time for r in records if r.status == IN_FLIGHT and deadline < r.arrival_time <= limit]
        return max(later) if later else None

    def set_timer(self, time: float, payload=None) -> Event:
        """Schedule a policy timer at virtual ``time`` (a Python or NumPy float64 or integer). ``payload``
        comes back to :meth:`Policy.on_timer`; it must be picklable (checkpoints pickle it). The timer's row
        in the event log shows it in its ``detail`` column: a string as it is, anything else as JSON where
        JSON can write it, else as ``str()``."""
        if not isinstance(time, (float, int, np.integer)):
            # a float32 (a jax or NumPy scalar) was taken as it is: its 24 bits moved the timer and every
            # event after it (4.9338111877 for 4.9338111803)
            raise PluginError(f"{type(self.policy).__name__}: set_timer's time {time!r} ({type(time).__name__}) is "
                              "not a number of virtual seconds the clock takes: a Python float or int (float(x) of a "
                              "NumPy or jax float64 value; a float32's 24 bits would move the timer)")
        return self.queue.push(time, "timer", -1, payload)

    def cancel(self, event: Event) -> None:
        """Cancel a pending timer: ``event`` is what :meth:`set_timer` returned; it will not fire,
        and :meth:`Policy.on_timer` is not called for it. Use it when the thing the timer guards
        happened first (a round whose clients all arrived before its deadline). Cancelling an
        event that already fired or was cancelled raises ValueError (:meth:`EventQueue.cancel`):
        it would hide a policy bug.

        Example (FedAvg's round deadline, dropped when the last client arrives)::

            self._timer = sim.set_timer(sim.now + self.round_timeout, self._rounds)  # in start_round
            ...
            if len(self._arrived) == len(self._round):  # in on_arrival: nobody left to wait for
                sim.cancel(self._timer)
        """
        self.queue.cancel(event)

    def screen(self, records: Sequence[DispatchRecord]) -> list[DispatchRecord]:
        """The arrived ``records`` whose updates are finite, in order, before a policy weighs them.

        A NaN/Inf update stops the run (``on_nonfinite="stop"``, :class:`NumericalError` naming it)
        or is dropped as "non-finite update" (``"skip"``); a policy that screens before it computes
        its coefficients weighs the rest as if the dropped update had never arrived (FedAvg's p_i
        renormalised over the others, FedBuff's buffer waiting for one more). Training pending work
        first, as the aggregation would. :meth:`aggregate` screens too, as a last resort: there a
        dropped update's term is left out and the others keep their coefficients.

        >>> kept = sim.screen(arrived)  # doctest: +SKIP
        >>> sim.aggregate([(r.id, w / total(kept)) for r in kept])  # doctest: +SKIP
        """
        bad = self.backend.nonfinite(records) if records else None
        if not bad:
            return records if type(records) is list else list(records)
        self._stop_or_drop(bad)
        dropped = {record.id for record in bad}
        return [record for record in records if record.id not in dropped]

    def aggregate(self, contributions: Iterable[tuple[int, float]], mode: str = "delta",
                  server_optimizer: bool = True, payload: Any = None) -> int:
        """Apply a global update from arrived dispatches; returns the new global version.

        ``payload`` goes to the algorithm's device hooks unread (see :class:`Aggregation`); a payload
        with a ``check(sim, contributions)`` method has it called first, to refuse an inconsistent one.
        Screen the records first (:meth:`screen`) where a dropped NaN/Inf update should change the
        others' weights. Where this last-resort screen drops every update (and there is no payload),
        no version is made and the current one is returned.
        """
        try:
            if type(contributions) is list and len(contributions) == 1:  # FedAsync's: no comprehension's frame
                ((dispatch_id, coefficient),) = contributions
                contributions = ((int(dispatch_id), float(coefficient)),)
            else:
                contributions = tuple([(int(d), float(c)) for d, c in contributions])
        except (TypeError, ValueError) as error:  # e.g. (record, weight): the record where its id belongs
            raise PluginError(f"aggregate() takes (dispatch id, coefficient) pairs, e.g. [(record.id, weight)]; "
                              f"got {contributions!r:.300} ({error})") from None
        if payload is not None:
            check = getattr(payload, "check", None)
            if check is not None:
                check(self, contributions)
        if mode != "delta":
            if mode not in AGGREGATION_MODES:
                raise ValueError(f"aggregation mode {mode!r} not in {AGGREGATION_MODES}")
            if not self.policy.needs_start_models:  # else the engine failed, naming an argument no user sets
                raise PluginError(f"{type(self.policy).__name__} aggregates with mode='mix', which needs the model "
                                  f"each dispatch started from: set needs_start_models = True on "
                                  f"{type(self.policy).__name__} (a class attribute) so that the engine keeps them")
        # Each record looked up once, for the checks, the screen and the bookkeeping below.
        live, lookup = self.records.live, self.records.__getitem__
        if len(contributions) == 1:  # FedAsync's every arrival: the checks below without their loops
            ((dispatch_id, coefficient),) = contributions
            record = live.get(dispatch_id) or lookup(dispatch_id)
            records = [record]
            if record.status != ARRIVED or not math.isfinite(coefficient):
                self._check_contributions(records, contributions)
        else:
            records = [live.get(dispatch_id) or lookup(dispatch_id) for dispatch_id, _ in contributions]
            self._check_contributions(records, contributions)
        if len(records) > 1 and len({record.id for record in records}) < len(records):
            seen = set()
            for dispatch_id, _ in contributions:
                if dispatch_id in seen:
                    raise ValueError(f"dispatch {dispatch_id} appears twice in one aggregation")
                seen.add(dispatch_id)
        bad = self.backend.nonfinite(records) if records else None
        if bad:
            contributions, records = self._screen_nonfinite(bad, contributions, records)
            if not records and payload is None:
                # every update was dropped: as if none had arrived, no version (which would have moved the
                # model by the server optimiser's momentum alone), as the policies that screen first make none
                return self.version
        if records:
            self.nonfinite_streak = self.drop_streak = 0
        self.version = version = self.version + 1
        aggregation = Aggregation(self.queue._now, version, contributions, mode, server_optimizer, payload)
        counts = self.staleness_counts
        for record in records:
            staleness = version - 1 - record.version
            counts[staleness] = counts.get(staleness, 0) + 1
            record.status = AGGREGATED
            record.aggregated_in = version
        self._counts[ARRIVED] -= len(records)
        self._counts[AGGREGATED] += len(records)
        try:
            stop = self.backend.on_aggregate(aggregation, records)
        except NumericalError:
            # the backend could not apply it (a device hook's weights overflowed on a diverging run's
            # updates, or a hook's own check refused it): this aggregation did not happen, and the run's
            # summary counts it so (the engine weighs first and counts last; what a hook keeps of its own
            # is as the hook left it)
            for record in records:
                staleness = version - 1 - record.version
                counts[staleness] -= 1
                if not counts[staleness]:
                    del counts[staleness]
                record.status, record.aggregated_in = ARRIVED, None
            self._counts[ARRIVED] += len(records)
            self._counts[AGGREGATED] -= len(records)
            self.version = version - 1
            raise
        if stop:
            self.stop(stop if isinstance(stop, str) else "stopped by the backend")
        # written after the update, so that the wall time includes training and applying it
        self._emit((aggregation.time, "aggregate", -1, None, version, None, None, f"{len(contributions)} updates",
                    None if self.wall_clock is None else round(self.wall_clock(), 3)))
        self.records.finish_many(records)
        return version

    @staticmethod
    def _check_contributions(records: list[DispatchRecord], contributions: tuple[tuple[int, float], ...]) -> None:
        """Refuse an update that has not arrived (or was aggregated or dropped) and a coefficient that is not finite."""
        for record, (dispatch_id, coefficient) in zip(records, contributions):
            if record.status != ARRIVED:
                raise ValueError(f"dispatch {dispatch_id} (client {record.client}) is {record.status}, "
                                 "only arrived updates can be aggregated")
            if not math.isfinite(coefficient):
                raise ValueError(f"aggregation coefficient for dispatch {dispatch_id} is {coefficient}")

    def _stop_or_drop(self, bad: list[DispatchRecord]) -> None:
        """Stop on a NaN/Inf update, naming it, or (``on_nonfinite="skip"``) drop each."""
        if self.on_nonfinite == "stop":
            first = bad[0]
            raise NumericalError(
                f"client {first.client} returned a non-finite loss or update at virtual time {self.now:.3f} s "
                f"(dispatch {first.id}, trained from version {first.version}, {first.steps} steps, global "
                f"version {self.version}); lower client_lr"
                + (" (or server_lr, where the server does more than average the updates: the model it "
                   "trained from is the server's step, which a large one makes diverge)"
                   if first.version > 0 else "")
                + ", check the data, or set on_nonfinite='skip'")
        for record in bad:
            self.drop(record, NONFINITE_DROP)
        self.nonfinite_streak += len(bad)
        limit = nonfinite_streak_limit(self.num_clients)
        if self.nonfinite_streak >= limit:
            self.stop(
                f"diverged: the last {self.nonfinite_streak} updates were all non-finite and dropped "
                f"(on_nonfinite='skip' stops after {limit} in a row); lower client_lr or check the data")

    def _screen_nonfinite(self, bad: list[DispatchRecord], contributions: tuple[tuple[int, float], ...],
                          records: list[DispatchRecord]) -> tuple[tuple, list]:
        """Stop on a NaN/Inf update, or drop it and go on with the other contributions and their records."""
        self._stop_or_drop(bad)
        dropped = {record.id for record in bad}
        kept = [index for index, (dispatch_id, _) in enumerate(contributions) if dispatch_id not in dropped]
        return tuple(contributions[i] for i in kept), [records[i] for i in kept]

    def fetch(self, record: DispatchRecord) -> int | None:
        """Answer an in-flight client's request for the newest global model, now.

        A dispatch made with ``fetch_step`` pauses its training there until this answer; the
        client gets the current version only if it is newer than the one it started from, and the
        algorithm's device hook (``on_pause``) uses it. Returns that version (None: no newer model,
        the client trains on unchanged).
        """
        if record.status != IN_FLIGHT or record.fetched:
            raise ValueError(f"dispatch {record.id} is {record.status} (fetched={record.fetched}); "
                             "only an in-flight dispatch can fetch, once")
        record.fetched = True
        record.fetch_version = self.version if self.version > record.version else None
        on_fetch = getattr(self.backend, "on_fetch", None)
        if on_fetch is not None:
            on_fetch(record)
        self._write("fetch", self.now, record.client, record.id, self.version, self.staleness(record),
                    record.fetch_step, "fresh model" if record.fetch_version is not None else "no newer model")
        return record.fetch_version

    def drop(self, record: DispatchRecord, reason: str) -> None:
        """Discard an arrived update (counted by reason in the accounting)."""
        if record.status != ARRIVED:
            raise ValueError(f"dispatch {record.id} is {record.status}, only arrived updates can be dropped")
        self._mark_dropped(record, reason, ARRIVED)
        self.backend.on_drop(record)
        self._write("drop", self.now, record.client, record.id, record.version, self.staleness(record),
                    record.steps, reason)
        self.records.finish(record)
        # only an update trained from the model in force shows that nothing can move it: a round's
        # stragglers (dropped during the next round, before it aggregates) and stale updates are not
        # (1,000 late clients of one 10^4-client FedAvg round stopped a run that was learning);
        # non-finite updates have their own streak and stop (diverged)
        if reason != NONFINITE_DROP and record.version == self.version:
            self.drop_streak += 1
            limit = nonfinite_streak_limit(self.num_clients)
            if self.drop_streak >= limit:
                self.stop(
                    f"stalled: the last {self.drop_streak} updates were all dropped (the last for "
                    f"'{reason}') and none aggregated between them, so the model no longer changes; "
                    + ("raise round_timeout above the clients' round times" if "deadline" in reason else
                       "loosen the setting that drops them"))

    def _mark_dropped(self, record: DispatchRecord, reason: str, was: str) -> None:
        record.status = DROPPED
        record.drop_reason = reason
        self._counts[was] -= 1
        self._counts[DROPPED] += 1
        self._drop_reasons[reason] = self._drop_reasons.get(reason, 0) + 1

    # ----------------------------------------------------------------- the loop
    def run(self) -> str:
        """Process events until a budget is spent or the backend asks to stop; returns the reason.

        A simulation restored from a checkpoint (see :meth:`__getstate__`) continues where it was.
        """
        pause = None
        with _fewer_collections():
            try:
                if not self._started:
                    self._started = True
                    # A start may build long-lived objects for every client (FedCompass's warm-up: 10^6
                    # records, events and client states), none in a cycle: collected as they are made,
                    # and rescanned by every collection after, they cost more than building them.
                    with collections_paused(freeze=True) as pause:
                        self.policy.start(self)
                return self._run()
            finally:
                # also where the start raised (the pause froze on its way out): not gc.get_freeze_count(),
                # which walks every frozen object
                if pause is not None and pause.froze:
                    gc.unfreeze()

    def _run(self) -> str:
        queue, max_time, budget_spent, handle = self.queue, self.max_time, self.budget_spent, self._handle
        # Most runs have a version budget alone: checked here rather than through budget_spent().
        max_updates = self.max_updates if self.max_updates is not None else math.inf
        versions_only = self.max_client_updates is None and self.max_client_steps is None
        # a policy that keeps scheduling at one instant (a round of nobody, ended by a timer of no delay,
        # over and over) would never reach max_time: far more events at one instant than any round of
        # every client can make is a loop, stopped and named
        instant, at_instant, instant_limit = -math.inf, 0, same_instant_limit(self.num_clients)
        # a backend's look between events (an engine that trains ahead: Simulation.foresee), before the first too
        between_events = getattr(self.backend, "between_events", None)
        if between_events is not None:
            between_events(self)
        while True:
            if self._stop_requested:
                self.stop_reason = self._stop_requested
                break
            if self.version >= max_updates:
                self.stop_reason = STOP_REASONS["max_updates"]
                break
            if not versions_only:
                spent = budget_spent()
                if spent is not None:
                    self.stop_reason = STOP_REASONS[spent]
                    break
            event = queue.pop_due(max_time)
            if event is None:
                self.stop_reason = "time budget" if queue else self._no_events_left()
                break
            self.events_processed += 1
            handle(event)
            if between_events is not None:
                between_events(self)
            if self.after_event is not None:
                self.after_event(self)
            if event.time != instant:
                instant, at_instant = event.time, 1
            else:
                at_instant += 1
                if at_instant >= instant_limit:
                    self.stop(
                        f"stalled: {at_instant:,} events at virtual time {instant:.6g} s without the clock moving "
                        f"(the last a {event.kind!r}), far more than one round of every client makes: "
                        + self._stall_cause(event, instant))
        return self.stop_reason

    def _still_training(self, client: int, listed_before=()) -> ValueError:
        """The refusal of a dispatch to ``client`` while it trains another (or appears earlier in the
        same ``dispatch_many`` list, ``listed_before``)."""
        if client in listed_before:
            return ValueError(f"client {client} is listed twice in one dispatch_many: a client trains one model at "
                              "a time; list each client once")
        record = self.records[self.training[client] - 1]
        return ValueError(f"client {client} is still training dispatch {record.id} (sent at {record.start_time:.6g} s, "
                          f"arriving at {record.arrival_time:.6g} s): a client trains one model at a time; dispatch "
                          "it again once it has arrived (on_arrival), or choose a client that is not in flight")

    def _no_events_left(self) -> str:
        """The stop reason of a run whose queue ran dry: "no events left", and where clients crashed,
        how many (a run whose every client crashed would otherwise read like one whose policy stopped
        dispatching): "no events left: all 6 clients crashed", "no events left: 2 of 6 clients crashed"."""
        crashed = len(self.crashed_clients)
        if not crashed:
            return NO_EVENTS_LEFT
        if crashed == self.num_clients:
            return f"{NO_EVENTS_LEFT}: all {crashed:,} clients crashed"
        return f"{NO_EVENTS_LEFT}: {crashed:,} of {self.num_clients:,} clients crashed"

    def _stall_cause(self, event: Event, instant: float) -> str:
        """Why the clock stopped moving, for the "stalled" stop reason: a round shorter than the float64
        clock's resolution at this time (1e-12 s a step at 5·10^6 s arrives at the instant it left), or
        else the policy."""
        records = self.records
        record = None
        if event.kind == "arrival" and event.payload in records:  # aggregated since, it may be kept as finished
            record = records[event.payload]
        if record is not None and record.steps > 0 and record.arrival_time == record.start_time:
            return (f"client {record.client}'s round of {record.steps} step(s) is shorter than the clock's "
                    f"resolution there ({math.ulp(instant):.3g} s, the float64 step at {instant:.6g} s), so it "
                    "arrives at the instant it left: its time per step is too small beside the virtual time "
                    "reached (times per step within about 10^12 of each other, or a smaller max_time)")
        return (f"the policy {type(self.policy).__name__} keeps scheduling at one instant (a timer of no delay "
                "that sets itself again?)")

    def set_budgets(self, max_time: float, max_updates: int | None, max_client_updates: int | None,
                    max_client_steps: int | None) -> None:
        """The run's budgets from here on (checked as the constructor checks them): a simulation restored
        from a checkpoint goes on under larger ones than it was made with where the run was extended
        (``jaxfl run --resume RUN --max-updates N``), as if it had been made with them (nothing before a
        budget's end depends on it)."""
        if not (max_time > 0):
            raise ValueError(f"max_time must be > 0 virtual seconds, got {max_time}")
        for name, value in (("max_updates", max_updates), ("max_client_updates", max_client_updates),
                            ("max_client_steps", max_client_steps)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        self.max_time, self.max_updates = float(max_time), max_updates
        self.max_client_updates, self.max_client_steps = max_client_updates, max_client_steps

    @property
    def budgets(self) -> tuple:
        """``(max_time, max_updates, max_client_updates, max_client_steps)``, as :meth:`set_budgets` takes them."""
        return self.max_time, self.max_updates, self.max_client_updates, self.max_client_steps

    def budget_spent(self) -> str | None:
        """The first of ``max_updates``, ``max_client_updates``, ``max_client_steps`` that is spent, or None."""
        if self.max_updates is not None and self.version >= self.max_updates:
            return "max_updates"
        if self.max_client_updates is not None and self._counts[AGGREGATED] >= self.max_client_updates:
            return "max_client_updates"
        if self.max_client_steps is not None and self.aggregated_steps >= self.max_client_steps:
            return "max_client_steps"
        return None

    def foresee(self, max_events: int) -> frozenset[int] | None:
        """The ids of the dispatches this run aggregates from now to the end of its budgets, made or yet to
        be made, found by running a copy of the simulation to that end with nothing trained (as a
        timing-only run); None where the copy does not end within ``max_events`` events, or fails.

        Exact where the schedule does not depend on model values and every update is finite: a
        timing-only run's event log equals the training run's. A stop for reasons the copy cannot see
        (a target accuracy reached) ends the run sooner. A backend that trains ahead reads it near a
        run's end, so that nothing it trains ahead goes unused there. Call it between events only (from
        a backend's ``between_events``): a copy made inside one would miss the rest of its handler. The
        simulation itself is left as it was (the copy has its own clock, records, policy and random
        streams), and the copy writes no log.

        Example (FedAsync, every client in flight, 3 updates left)::

            sim.foresee(max_events=1_000)  # → frozenset({0, 4, 9}): the 3 updates the run still aggregates
        """
        watcher = _Foresight(self.aggregated_steps, max_events)
        try:
            copy = pickle.loads(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))
            copy.attach(watcher, after_event=watcher.count_event)
            copy.run()
        except Exception:  # _PastForesight, or anything the copy met: no foresight, which only costs speed
            return None
        return frozenset(watcher.aggregated)

    def __getstate__(self) -> dict:
        """Everything but the backend and the log writer: clock, queue, records, policy (groups,
        buffers, RNGs), speeds and faults — one pickle keeps their shared references."""
        state = dict(self.__dict__)
        for transient in ("backend", "_log", "after_event", "wall_clock"):
            state[transient] = None
        state.pop("_emit", None)  # rebound by attach()
        return state

    def attach(self, backend: Backend, log: EventLog | Callable[[dict], None] | None = None,
               after_event: Callable[["Simulation"], None] | None = None,
               wall_clock: Callable[[], float] | None = None) -> "Simulation":
        """Reconnect a restored simulation to a backend, a log writer and a wall clock."""
        self.backend, self.after_event = backend, after_event
        self._bind_log(log)
        self.wall_clock = wall_clock
        self._tell_backend()
        return self

    def _tell_backend(self) -> None:
        on_attach = getattr(self.backend, "on_attach", None)
        if on_attach is not None:
            on_attach(self)

    def _bind_log(self, log) -> None:
        """``log``: an object with ``row_writer(fields)`` (an :class:`~jaxfl.runlog.EventLog`), which
        takes each row as a tuple (no dict per row: a third of a timing-only event's cost); a
        function taking one dict per row; or None."""
        self._log = log
        if log is None:
            self._emit = _ignore_row
        elif callable(getattr(log, "row_writer", None)):
            self._emit = log.row_writer(EVENT_LOG_FIELDS)
        elif callable(log):
            self._emit = lambda values: log(dict(zip(EVENT_LOG_FIELDS, values)))
        else:
            raise TypeError(f"log={log!r} is not allowed: a function taking one dict per row, an object with "
                            "row_writer(fields) (jaxfl.runlog.EventLog), or None")

    def _handle(self, event: Event) -> None:
        kind = event.kind
        if kind == "arrival":
            record = self.records.live.get(event.payload) or self.records[event.payload]
            record.status = ARRIVED
            self.training[record.client] = 0
            busy_from = record.start_time
            if self.fault_seconds:  # a fault's offline or late seconds are not busy
                busy_from += self.fault_seconds.pop(record.id, 0.0)
            self.busy_time[record.client] += record.arrival_time - busy_from
            counts = self._counts
            counts[IN_FLIGHT] -= 1
            counts[ARRIVED] += 1
            if self.arrived_steps is not None:
                self.arrived_steps += record.steps
            planned = getattr(record, "planned_steps", None)
            self._emit((event.time, "arrival", record.client, record.id, record.version, self.version - record.version,
                        record.steps, None if planned is None else f"pulled: {record.steps} of {planned} steps",
                        None))
            self.policy.on_arrival(self, record)
        elif kind == "reply":
            self.policy.on_reply(self, event.client, event.payload)
        elif kind == "timer":
            self._write("timer", event.time, -1, None, self.version, None, None, _timer_detail(event.payload))
            self.policy.on_timer(self, event.payload)
        elif kind == "crash":  # the client stops for good
            record = self.records[event.payload]
            self.crash_free_arrival.pop(record.id, None)
            self.training[record.client] = 0
            self.crashed_clients.add(record.client)
            self._mark_dropped(record, CRASHED, IN_FLIGHT)
            self.busy_time[record.client] += event.time - record.start_time
            self._write("crash", event.time, record.client, record.id, record.version, None, record.steps)
            self.backend.on_drop(record)
            self.records.finish(record)
            # told after the crash is booked, so that a replacement's dispatch row follows the crash row
            self.policy.on_crash(self, record)
        else:
            raise ValueError(f"unknown event kind {event.kind!r}")

    # ----------------------------------------------------------------- accounting and logs
    def accounting(self) -> dict:
        """Every dispatch is aggregated, dropped (by reason), arrived-but-unused or in flight.

        Kept as running counters (O(1), whatever the number of dispatches), checked against the
        records still live."""
        counts = {"dispatched": self.records.count, "aggregated": self._counts[AGGREGATED],
                  "dropped": self._counts[DROPPED], "arrived_unaggregated": self._counts[ARRIVED],
                  "in_flight": self._counts[IN_FLIGHT], "dropped_by_reason": dict(self._drop_reasons)}
        total = (counts["aggregated"] + counts["dropped"] + counts["arrived_unaggregated"]
                 + counts["in_flight"])
        live = len(self.records.live)
        if total != counts["dispatched"] or live != counts["arrived_unaggregated"] + counts["in_flight"]:
            raise RuntimeError(f"accounting invariant violated: {counts} with {live} live records")
        return counts

    def timeline(self, end_time: float | None = None) -> dict:
        """How the federation spent its time up to ``end_time`` (default: now), for the run summary.

        - ``staleness_histogram``: aggregated updates per staleness τ_g − τ_i at aggregation;
        - ``utilisation``: the fraction of the time clients spent training or transferring (mean over
          clients; min, median and max of the per-client fractions): a dispatch's seconds offline
          (dropout) or late (delay) are left out, counted as its first ones;
        - ``idle_client_seconds``: the time clients were not training or transferring, summed over clients;
        - ``aggregations_per_virtual_hour``: global updates per 3,600 virtual seconds;
        - ``events``: events processed from the queue.

        A dispatch still in flight counts as busy up to ``end_time``, after its fault's seconds. So
        :func:`jaxfl.runlog.timeline_stats` gives the same utilisation from the event log alone.

        >>> sim.timeline()["utilisation"]["mean"]  # doctest: +SKIP
        0.4382
        """
        end = self.now if end_time is None else float(end_time)
        busy = np.array(self.busy_time, dtype=np.float64)
        fault_seconds = self.fault_seconds
        for record in self.records.live.values():
            trains_from = record.start_time + fault_seconds.get(record.id, 0.0)
            if record.status == IN_FLIGHT and trains_from < end:
                busy[record.client] += min(record.arrival_time, end) - trains_from
        # a run of no virtual time (its initial model at the target) has no fraction to give: None, as
        # runlog.timeline_stats and aggregations_per_virtual_hour say it
        fraction = busy / end if end > 0 else None
        return {
            "staleness_histogram": {str(s): n for s, n in sorted(self.staleness_counts.items())},
            "utilisation": {name: None if fraction is None else round(float(statistic(fraction)), 6)
                            for name, statistic in (("mean", np.mean), ("min", np.min), ("median", np.median),
                                                    ("max", np.max))},
            "idle_client_seconds": round(float(max(end * self.num_clients - busy.sum(), 0.0)), 3),
            "aggregations_per_virtual_hour": round(self.version * 3600.0 / end, 3) if end > 0 else None,
            "events": self.events_processed,
        }

    def _write(self, event, time, client, dispatch, version, staleness, steps, detail=None, wall_time=None):
        self._emit((time, event, client, dispatch, version, staleness, steps, detail, wall_time))


class TimingBackend:
    """The backend of a schedule run alone (a timing-only run, :meth:`Simulation.foresee`'s copy):
    nothing is trained and no model exists, so every update is taken as finite and aggregations only
    count the client-steps they use.

    >>> TimingBackend().aggregated_steps
    0
    """

    def __init__(self, aggregated_steps: int = 0):
        self.aggregated_steps = aggregated_steps

    def on_dispatch(self, record) -> None:
        pass

    def on_aggregate(self, aggregation, records) -> bool:
        steps = 0
        for record in records:  # a loop: a generator costs more than FedAsync's one record
            steps += record.steps
        self.aggregated_steps += steps
        return False

    def on_drop(self, record) -> None:
        pass

    def nonfinite(self, records) -> list:
        return []


class _PastForesight(Exception):
    """A copy run by :meth:`Simulation.foresee` took more events than it was given."""


class _Foresight(TimingBackend):
    """The backend of :meth:`Simulation.foresee`'s copy: notes the ids of the dispatches aggregated,
    and stops the copy past its events."""

    def __init__(self, aggregated_steps: int, max_events: int):
        super().__init__(aggregated_steps)  # the client-step budget goes on from the run's count
        self.aggregated: set[int] = set()
        self.events_left = max_events

    def count_event(self, simulation) -> None:
        self.events_left -= 1
        if self.events_left < 0:
            raise _PastForesight

    def on_aggregate(self, aggregation, records) -> bool:
        self.aggregated.update(record.id for record in records)
        return super().on_aggregate(aggregation, records)


@contextlib.contextmanager
def collections_paused(freeze: bool = False):
    """No garbage collection in the block: for building many long-lived objects at once (10^6
    dispatch records at a warm-up), which holds no cycle for the collector to find, and which it
    would otherwise rescan at every young-generation collection (four fifths of the time it takes
    to build them). ``freeze``: then ``gc.freeze()`` (every object alive, not only the block's), so
    that later collections skip them too (otherwise the first collections after the block rescan
    them all: the events after a 10^6-client warm-up ran at 16,700/s instead of 23,000/s) — unless
    objects are frozen already, by a ``gc.freeze()`` of the user's, which a ``gc.unfreeze()`` could
    not tell from these. :meth:`Simulation.run` pauses its policy's start so, and unfreezes when it
    returns if the start froze (the objects are only kept out of the collections while it runs).
    The block gets an object whose ``froze`` says whether it froze.

    >>> with collections_paused():
    ...     records = [[] for _ in range(3)]
    """
    enabled = gc.isenabled()
    gc.disable()
    pause = _Pause()
    try:
        yield pause
    finally:
        # only the outermost pause freezes (collections were on when it began): a pause nested in
        # another (a policy's own, inside the start's) would freeze first, and the outer one, finding
        # objects frozen, would take them for a user's and never unfreeze them
        if freeze and enabled and gc.get_freeze_count() == 0:
            gc.freeze()
            pause.froze = True
        if enabled:
            gc.enable()


class _Pause:
    """What :func:`collections_paused` did: ``froze`` is whether it called ``gc.freeze()``."""

    froze = False


@contextlib.contextmanager
def _fewer_collections():
    """Raise the young generation's collection threshold to :data:`_RUN_GC_THRESHOLD` for the block."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], _RUN_GC_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def _timer_detail(payload) -> str | None:
    """A timer row's ``detail``: the payload its policy set it with (a round, a tier, a dispatch's
    deadline), so that timers firing at one instant are told apart.

    >>> _timer_detail({"deadline": 17}), _timer_detail("trigger"), _timer_detail(None)
    ('{"deadline":17}', 'trigger', None)
    >>> _timer_detail({(0, 1): "tier"})  # keys JSON cannot write (it raised as the timer fired, mid-run)
    "{(0, 1): 'tier'}"
    """
    if payload is None or isinstance(payload, str):
        return payload
    try:
        return json.dumps(payload, separators=(",", ":"), default=str)
    except (TypeError, ValueError):  # a dict's tuple keys, a circular payload
        return str(payload)


def _ignore_row(values: tuple) -> None:
    """The log of a simulation given none."""
