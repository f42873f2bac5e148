"""The discrete-event simulation of a federation on a virtual clock (plain Python, no jax).

A :class:`Policy` (one per algorithm, in :mod:`jaxfl.algorithms`) reacts to events: it dispatches
clients (which model version, how many local steps) and asks for aggregations (which updates, with
which coefficients). The :class:`Simulation` owns the clock, the client speeds, the global version
counter and the record of every dispatch; it never touches parameters. Numerical work goes to a
:class:`Backend` (the engine), which may train a dispatch whenever it likes before the first
aggregation that uses it — that freedom is what lets the engine batch the in-flight work.

Event semantics (documented because they decide results at equal times):
- ``arrival``: a client's update reaches the server at ``start + round_duration``.
- ``reply``: the server sends a model to a client. Replies are events at the *same* instant with a
  lower priority than arrivals, so all updates that reach the server at one instant are processed
  before any reply leaves with the newest model. With continuous (jittered) times ties have
  probability zero and this equals replying at once; with exactly equal times (no jitter) it makes
  FedBuff with a full buffer behave exactly like FedAvg.
- ``timer``: a policy's own deadline (FedCompass's ``T_max``), processed first at its instant.

Example (a policy that trains each client once and aggregates each arrival)::

    class Once(Policy):
        def start(self, sim):
            for client in range(sim.num_clients):
                sim.dispatch(client, steps=5)
        def on_arrival(self, sim, record):
            sim.aggregate([(record.id, sim.client_weights[record.client])])
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np

from jaxfl.scheduler.clock import DEFAULT_PRIORITIES, Event, EventQueue
from jaxfl.scheduler.speeds import ClientSpeeds

IN_FLIGHT, ARRIVED, AGGREGATED, DROPPED = "in_flight", "arrived", "aggregated", "dropped"
AGGREGATION_MODES = ("delta", "mix", "tier")
EVENT_LOG_FIELDS = ("time", "event", "client", "dispatch", "version", "staleness", "steps", "detail")


@dataclasses.dataclass
class DispatchRecord:
    """One dispatch: ``client`` trains ``steps`` local steps from global ``version``.

    ``client_round`` counts this client's dispatches (0, 1, ...); with the run seed and client id
    it fixes the training key, so a result never depends on how dispatches are batched.
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


@dataclasses.dataclass(frozen=True)
class Aggregation:
    """A global update producing ``version`` at ``time``.

    ``mode="delta"``: pseudo-gradient g = Σ c_i Δ_i, with Δ_i = start_i − final_i.
    ``mode="mix"``: g = Σ c_i (w − w_i), w_i = start_i − Δ_i the client's final model, i.e.
    w ← (1 − Σc_i) w + Σ c_i w_i (FedAsync's original mixing).
    Then w ← server_optimizer(w, g) if ``server_optimizer`` else w ← w − g.
    ``mode="tier"`` (FedAT): the contributions (summing to 1) average the clients' final models
    into the model of ``tier``; then w ← Σ_k a_k · model_k over ``tier_weights`` ((k, a_k) pairs).
    """

    time: float
    version: int
    contributions: tuple[tuple[int, float], ...]
    mode: str = "delta"
    server_optimizer: bool = True
    tier: int | None = None
    tier_weights: tuple[tuple[int, float], ...] = ()


class Backend(Protocol):
    """The numerical side, implemented by :class:`jaxfl.engine.Engine`."""

    def on_dispatch(self, record: DispatchRecord) -> None: ...

    def on_aggregate(self, aggregation: Aggregation, records: Sequence[DispatchRecord]) -> bool:
        """Apply the aggregation; return True to stop the run (e.g. target accuracy reached)."""

    def on_drop(self, record: DispatchRecord) -> None: ...


class Policy:
    """Base class of a scheduling policy (one algorithm's server logic).

    Subclasses override :meth:`start` and :meth:`on_arrival`, and :meth:`on_timer` if they set
    timers. The default :meth:`on_reply` re-dispatches the client with ``self.local_steps``.
    """

    name = "policy"
    local_steps = 1
    priorities = DEFAULT_PRIORITIES
    needs_start_models = False  # True if it aggregates in "mix" mode (the engine keeps start models)

    def start(self, sim: "Simulation") -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement start()")

    def on_arrival(self, sim: "Simulation", record: DispatchRecord) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement on_arrival()")

    def on_reply(self, sim: "Simulation", client: int, payload) -> None:
        sim.dispatch(client, self.local_steps)

    def on_timer(self, sim: "Simulation", payload) -> None:
        raise ValueError(f"{type(self).__name__} received a timer but defines no on_timer()")


class Simulation:
    """Run a policy on the virtual clock until the time or update budget is spent.

    ``client_weights`` are the p_i (sum 1). ``max_time`` is in virtual seconds; events after it
    are left in flight. ``log`` receives one dict per event-log row (fields ``EVENT_LOG_FIELDS``).
    """

    def __init__(self, policy: Policy, speeds: ClientSpeeds, client_weights: Sequence[float],
                 backend: Backend, max_time: float = math.inf, max_updates: int | None = None,
                 log: Callable[[dict], None] | None = None):
        weights = np.asarray(client_weights, dtype=np.float64)
        if weights.ndim != 1 or len(weights) < 1:
            raise ValueError(f"client_weights must be a non-empty 1-D sequence, got shape {weights.shape}")
        if not (max_time > 0):
            raise ValueError(f"max_time must be > 0 virtual seconds, got {max_time}")
        if max_updates is not None and max_updates < 1:
            raise ValueError(f"max_updates must be >= 1 or None, got {max_updates}")
        self.policy = policy
        self.speeds = speeds
        self.client_weights = weights
        self.num_clients = len(weights)
        self.backend = backend
        self.max_time = float(max_time)
        self.max_updates = max_updates
        self.queue = EventQueue(policy.priorities)
        self.version = 0
        self.records: list[DispatchRecord] = []
        self.client_rounds = np.zeros(self.num_clients, dtype=np.int64)
        self.stop_reason: str | None = None
        self._log = log or (lambda row: None)
        self._stop_requested = False

    # ----------------------------------------------------------------- policy-facing API
    @property
    def now(self) -> float:
        return self.queue.now

    def staleness(self, record: DispatchRecord) -> int:
        """τ_g − τ_i: global updates since the record's model version."""
        return self.version - record.version

    def dispatch(self, client: int, steps: int, lr_scale: float = 1.0, detail: str | None = None) -> DispatchRecord:
        """Send the current global model to ``client`` for ``steps`` local steps.

        ``detail`` is written to the event log (e.g. FedCompass's ``group 3``, FedAT's ``tier 1``).
        """
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client {client} out of range [0, {self.num_clients})")
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        duration = self.speeds.round_duration(client, int(steps))
        record = DispatchRecord(id=len(self.records), client=client, version=self.version,
                                steps=int(steps), client_round=int(self.client_rounds[client]),
                                start_time=self.now, arrival_time=self.now + duration,
                                lr_scale=float(lr_scale))
        self.client_rounds[client] += 1
        self.records.append(record)
        self.queue.push(record.arrival_time, "arrival", client, record.id)
        self._write("dispatch", record.start_time, client, record.id, record.version, None, record.steps, detail)
        self.backend.on_dispatch(record)
        return record

    def reply(self, client: int, payload=None) -> None:
        """Schedule a reply to ``client`` at this instant, after every arrival of the instant."""
        self.queue.push(self.now, "reply", client, payload)

    def set_timer(self, time: float, payload=None) -> Event:
        """Schedule a policy timer (``payload`` must be JSON-able)."""
        return self.queue.push(time, "timer", -1, payload)

    def cancel(self, event: Event) -> None:
        self.queue.cancel(event)

    def aggregate(self, contributions: Iterable[tuple[int, float]], mode: str = "delta",
                  server_optimizer: bool = True, tier: int | None = None,
                  tier_weights: Iterable[tuple[int, float]] = ()) -> int:
        """Apply a global update from arrived dispatches; returns the new global version."""
        contributions = tuple((int(d), float(c)) for d, c in contributions)
        if mode not in AGGREGATION_MODES:
            raise ValueError(f"aggregation mode {mode!r} not in {AGGREGATION_MODES}")
        seen = set()
        for dispatch_id, coefficient in contributions:
            record = self.records[dispatch_id]
            if record.status != ARRIVED:
                raise ValueError(f"dispatch {dispatch_id} (client {record.client}) is {record.status}, "
                                 "only arrived updates can be aggregated")
            if dispatch_id in seen:
                raise ValueError(f"dispatch {dispatch_id} appears twice in one aggregation")
            if not math.isfinite(coefficient):
                raise ValueError(f"aggregation coefficient for dispatch {dispatch_id} is {coefficient}")
            seen.add(dispatch_id)
        tier_weights = tuple((int(k), float(a)) for k, a in tier_weights)
        if mode == "tier" and (tier is None or tier not in dict(tier_weights)):
            raise ValueError(f"a 'tier' aggregation needs its tier ({tier}) among tier_weights {tier_weights}")
        self.version += 1
        aggregation = Aggregation(self.now, self.version, contributions, mode, server_optimizer, tier,
                                  tier_weights)
        records = [self.records[d] for d, _ in contributions]
        for record in records:
            record.status = AGGREGATED
            record.aggregated_in = self.version
        self._write("aggregate", self.now, -1, None, self.version, None, None,
                    f"{len(contributions)} updates")
        if self.backend.on_aggregate(aggregation, records):
            self._stop_requested = True
        return self.version

    def drop(self, record: DispatchRecord, reason: str) -> None:
        """Discard an arrived update (counted by reason in the accounting)."""
        if record.status != ARRIVED:
            raise ValueError(f"dispatch {record.id} is {record.status}, only arrived updates can be dropped")
        record.status = DROPPED
        record.drop_reason = reason
        self.backend.on_drop(record)
        self._write("drop", self.now, record.client, record.id, record.version, self.staleness(record),
                    record.steps, reason)

    # ----------------------------------------------------------------- the loop
    def run(self) -> str:
        """Process events until a budget is spent or the backend asks to stop; returns the reason."""
        self.policy.start(self)
        while True:
            if self._stop_requested:
                self.stop_reason = "target reached"
                break
            if self.max_updates is not None and self.version >= self.max_updates:
                self.stop_reason = "update budget"
                break
            event = self.queue.peek()
            if event is None:
                self.stop_reason = "no events left"
                break
            if event.time > self.max_time:
                self.stop_reason = "time budget"
                break
            self.queue.pop()
            self._handle(event)
        return self.stop_reason

    def _handle(self, event: Event) -> None:
        if event.kind == "arrival":
            record = self.records[event.payload]
            record.status = ARRIVED
            self._write("arrival", event.time, record.client, record.id, record.version,
                        self.staleness(record), record.steps)
            self.policy.on_arrival(self, record)
        elif event.kind == "reply":
            self.policy.on_reply(self, event.client, event.payload)
        elif event.kind == "timer":
            self._write("timer", event.time, -1, None, self.version, None, None, None)
            self.policy.on_timer(self, event.payload)
        else:
            raise ValueError(f"unknown event kind {event.kind!r}")

    # ----------------------------------------------------------------- accounting and logs
    def accounting(self) -> dict:
        """Every dispatch is aggregated, dropped (by reason), arrived-but-unused or in flight."""
        counts = {"dispatched": len(self.records), "aggregated": 0, "dropped": 0,
                  "arrived_unaggregated": 0, "in_flight": 0, "dropped_by_reason": {}}
        for record in self.records:
            if record.status == AGGREGATED:
                counts["aggregated"] += 1
            elif record.status == DROPPED:
                counts["dropped"] += 1
                reasons = counts["dropped_by_reason"]
                reasons[record.drop_reason] = reasons.get(record.drop_reason, 0) + 1
            elif record.status == ARRIVED:
                counts["arrived_unaggregated"] += 1
            else:
                counts["in_flight"] += 1
        total = (counts["aggregated"] + counts["dropped"] + counts["arrived_unaggregated"]
                 + counts["in_flight"])
        if total != counts["dispatched"]:
            raise RuntimeError(f"accounting invariant violated: {counts}")
        return counts

    def _write(self, event, time, client, dispatch, version, staleness, steps, detail=None):
        self._log({"time": time, "event": event, "client": client, "dispatch": dispatch,
                   "version": version, "staleness": staleness, "steps": steps, "detail": detail})
