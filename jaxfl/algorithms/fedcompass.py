"""FedCompass (Li et al., ICLR 2024): a computing-power-aware semi-asynchronous scheduler.

Paper: Algorithms 1–3 (Appendix A) and the +M, +N variants; the authors' code (APPFL) where it
differs, as switches. The server measures each client's time per step S_i and hands out Q_i ∈ [Q_min, Q_max] local steps so
that the clients of an *arrival group* finish together at the group's expected time T_a; a group
waits at most until T_max = creation + λ·(T_a − creation). Server loop (paper)::

    warm-up: every client trains Q_min steps from w_0           # switch: Q_max (code)
    on ARRIVAL of Δ_i (time now):
        S_i ← (now − T_start_i) / Q_i                       # speed estimate (switch: EMA 0.9)
        if i has no group (first response):                # single update, FedAsync-like
            w ← w − st(τ_g − τ_i)·p_i·Δ_i ; τ_g += 1 ; ASSIGNGROUP(i) ; dispatch(i)
        else if now > T_max of its group g (late):
            Δ̄ ← Δ̄ + st(τ_g − τ_i)·p_i·Δ_i ; ASSIGNGROUP(i) ; dispatch(i) ; delete g once all arrived
        else (on time):
            Δ̄^g ← Δ̄^g + st(τ_g − τ_i)·p_i·Δ_i ; if all of g arrived: GROUPAGGREGATE(g)
    on TIMER at T_max of g: GROUPAGGREGATE(g)
    GROUPAGGREGATE(g): w ← w − Δ̄^g − Δ̄ ; Δ̄ ← 0 ; τ_g += 1 ;
                       for i in g's arrived clients, fastest first: ASSIGNGROUP(i) ; dispatch(i)
    ASSIGNGROUP(i): JOINGROUP(i) or else CREATEGROUP(i)        # see the methods below

Aggregation variants (``aggregation``): ``"plain"`` (FedCompass: no renormalisation, server
optimiser sgd(1)); ``"momentum"`` (+M: the engine's momentum server optimiser is applied at group
aggregations only; single updates skip it); ``"normalized"`` (+N: each buffered update is divided
by its Q_i and the aggregate multiplied by Q_eff = Σ p_i Q_i / Σ p_i over the aggregation — FedNova
with τ_eff weighted by p_i, which the shared :class:`~jaxfl.algorithms.wrappers.StepNormalization`
hook applies on device from a :class:`~jaxfl.algorithms.wrappers.NormalizeSteps` payload).

Where the authors' reference code differs from the paper, :class:`CompassOptions` names a switch;
the default is the paper, :data:`REFERENCE_CODE` is the code's combination.

Event order at equal times: arrivals before timers, so a client arriving exactly at T_max is on
time (the paper marks a client late only if now > T_max). Dispatches leave at once (the paper's
``dispatch`` inside the handlers), in fastest-first order inside a group aggregation.
"""
from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from typing import Callable

from jaxfl.algorithms.base import Algorithm, Options, register, staleness_function
from jaxfl.algorithms.wrappers import NormalizeSteps, StepNormalization
from jaxfl.scheduler.simulation import DispatchRecord, Policy, Simulation
from jaxfl.scheduler.staleness import StalenessWeights

AGGREGATIONS = ("plain", "momentum", "normalized")
WARMUPS = ("q_min", "q_max")


@dataclasses.dataclass(frozen=True)
class CompassOptions:
    """Switches for the places where the FedCompass reference code differs from the paper."""

    speed_estimate: str = "latest"  # "ema": S ← 0.1·S_old + 0.9·S_new (both code generations)
    staleness_at: str = "buffer"  # "aggregation": st computed when the buffer is applied (new repo)
    create_rule: str = "t_a"  # "t_max": CREATEGROUP lines up with T_max instead of T_a (§10 9a)
    create_far_groups: str = "clamp"  # "skip": skip candidate groups with q > Q_max (§10 9b)
    join_max_factor: float = 1.0  # 1.2: legacy JOINGROUP accepts up to floor(1.2·Q_max) (§10 9c)
    fastest_over: str = "pending"  # "all": fastest client of a group over CL ∪ ACL (§10 9d)
    lr_decay: bool = False  # True: client lr × 0.995^floor(total steps / Q_max) (legacy, §10 9e)
    empty_timer: str = "apply"  # "skip": a timer on a group with no arrivals does nothing (§10 9g)
    warmup: str = "q_min"  # "q_max": the warm-up round trains Q_max steps (code; first S_i = time / Q_max)

    def validate(self) -> None:
        for name, allowed in SWITCH_CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"compass_{name}={getattr(self, name)!r} is not allowed: one of {', '.join(allowed)}")
        if not self.join_max_factor >= 1.0:
            raise ValueError(f"compass_join_max_factor={self.join_max_factor} is not allowed: a number >= 1")


PAPER = CompassOptions()
# Every code-only behaviour at once (with λ = 1.5, the legacy MPI runner's default, §10 9f).
REFERENCE_CODE = CompassOptions(speed_estimate="ema", staleness_at="aggregation", create_rule="t_max",
                                create_far_groups="skip", join_max_factor=1.2, fastest_over="all",
                                lr_decay=True, empty_timer="skip", warmup="q_max")
REFERENCE_CODE_LATEST_TIME_FACTOR = 1.5


@dataclasses.dataclass
class ClientState:
    """C[i] of the paper's Table 4 (τ_i is the version of the client's current dispatch)."""

    group: int | None = None
    steps: int = 0  # Q_i assigned for the current round
    speed: float | None = None  # S_i, estimated seconds per step
    start: float = 0.0  # T_start of the current round
    total_steps: int = 0  # steps of all finished rounds (for the legacy lr decay)


@dataclasses.dataclass
class GroupState:
    """G[g] of Table 4: pending (CL) and arrived (ACL) clients, T_a, T_max and the group buffer."""

    pending: set[int]
    arrived: list[int]
    expected: float  # T_a
    latest: float  # T_max
    buffer: list[DispatchRecord]
    timer: object = None
    # (S_i, client) for the members CREATEGROUP looks at (see FedCompass._fastest), a min-heap with
    # stale entries (members gone, speeds re-measured) dropped when they surface; None in groups
    # restored from checkpoints older than it (rebuilt on first use).
    speeds: list | None = None

    @property
    def aggregated(self) -> bool:
        return self.expected == 0.0 and self.latest == 0.0


class FedCompass(Policy):
    """The FedCompass server; see the module docstring for the loop and the switches."""

    name = "fedcompass"
    # Arrivals before timers at equal times (a client arriving exactly at T_max is on time).
    priorities = {"arrival": 0, "timer": 1, "reply": 2}

    def __init__(self, q_min: int, q_max: int, staleness: Callable[[int], float],
                 latest_time_factor: float = 1.2, aggregation: str = "plain",
                 options: CompassOptions = PAPER):
        if not 1 <= q_min <= q_max:
            raise ValueError(f"FedCompass needs 1 <= q_min <= q_max, got q_min={q_min}, q_max={q_max}")
        if not latest_time_factor >= 1.0:
            raise ValueError(f"latest_time_factor (λ) must be >= 1, got {latest_time_factor}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown FedCompass aggregation {aggregation!r}; allowed: {', '.join(AGGREGATIONS)}")
        options.validate()
        self.q_min, self.q_max = q_min, q_max
        self.staleness = staleness
        self.latest_time_factor = latest_time_factor
        self.aggregation = aggregation
        self.options = options
        self.clients: list[ClientState] = []
        self.groups: dict[int, GroupState] = {}
        self.general_buffer: list[DispatchRecord] = []
        self._next_group = 0
        self._buffered_weight: dict[int, float] = {}  # dispatch id → st·p_i fixed at buffer time
        # (T_a, group id) of every group not yet aggregated, sorted: JOINGROUP bisects it instead of
        # scanning every open group (see _join_choice).
        self._by_expected: list[tuple[float, int]] = []
        self._staleness_weights = StalenessWeights(staleness)

    def __setstate__(self, state: dict) -> None:
        """Policies pickled before the T_a index and the st(s) memo rebuild them."""
        self.__dict__.update(state)
        self._staleness_weights = StalenessWeights(self.staleness)
        if "_by_expected" not in state:
            self._by_expected = sorted((group.expected, group_id) for group_id, group in self.groups.items()
                                       if not group.aggregated)

    # ------------------------------------------------------------------ server loop (Alg. 1)
    def start(self, sim: Simulation) -> None:
        warmup_steps = self.q_max if self.options.warmup == "q_max" else self.q_min
        # warm-up: everybody gets Q_min (paper) or Q_max (code), no group, T_start = now, and the
        # lr scale 0.995^0 = 1 of the legacy decay: _dispatch for each client, in one bulk call
        now = sim.now
        self.clients = [ClientState(None, warmup_steps, None, now) for _ in range(sim.num_clients)]
        sim.dispatch_many(range(sim.num_clients), warmup_steps)

    def on_arrival(self, sim: Simulation, record: DispatchRecord) -> None:
        client, now = record.client, sim.now
        state = self.clients[client]
        self._record_speed(state, now, record.steps)
        state.total_steps += record.steps
        if state.group is None:  # first response: immediate single update
            # +M skips momentum here and +N leaves it unnormalised (the authors' code)
            sim.aggregate([(record.id, self._weight(sim, record))], server_optimizer=False)
            self._assign(sim, client)
            self._dispatch(sim, client)
            return
        group_id = state.group
        group = self.groups[group_id]
        group.pending.remove(client)
        group.arrived.append(client)
        if self.options.fastest_over == "all" and group.speeds is not None:  # still a member, re-measured
            heapq.heappush(group.speeds, (state.speed, client))
        self._buffer(sim, record)
        if now > group.latest:  # late: its group was aggregated at T_max without it
            self.general_buffer.append(record)
            self._assign(sim, client)
            self._dispatch(sim, client)
            if not group.pending:
                self._delete(sim, group_id)
        else:
            group.buffer.append(record)
            if not group.pending:
                self._group_aggregate(sim, group_id)

    def on_timer(self, sim: Simulation, payload) -> None:
        group_id = int(payload)
        self.groups[group_id].timer = None
        self._group_aggregate(sim, group_id)

    # ------------------------------------------------------------------ GROUPAGGREGATE (Alg. 3)
    def _group_aggregate(self, sim: Simulation, group_id: int) -> None:
        group = self.groups.get(group_id)
        if group is None or group.aggregated:
            return
        if group.buffer or self.options.empty_timer == "apply":
            # The paper applies the general buffer (and counts a version) even if nobody of the
            # group arrived; the code's "skip" leaves the general buffer for the next aggregation.
            records = group.buffer + self.general_buffer
            payload = None
            if self.aggregation == "normalized" and records:  # an empty aggregation has no Q_eff
                payload = NormalizeSteps(tuple(r.id for r in records),
                                         tuple(float(sim.client_weights[r.client]) for r in records))
            sim.aggregate(self._contributions(sim, records), server_optimizer=True, payload=payload)
            self.general_buffer = []
        # This group must not be a JOIN/CREATE candidate while its members are reassigned (§10.5).
        self._unindex(group_id, group)
        group.expected = group.latest = 0.0
        arrived, group.arrived, group.buffer = group.arrived, [], []
        for client in sorted(arrived, key=lambda c: (self.clients[c].speed, c)):  # fastest first
            self._assign(sim, client)
            self._dispatch(sim, client)
        if not group.pending:
            self._delete(sim, group_id)
        # otherwise the group lives on until its late clients arrive (they go to the general buffer)

    def _contributions(self, sim: Simulation, records: list[DispatchRecord]) -> list[tuple[int, float]]:
        weights = [self._buffered_weight.pop(r.id, None) for r in records]
        weights = [self._weight(sim, r) if w is None else w for r, w in zip(records, weights)]
        return [(r.id, w) for r, w in zip(records, weights)]

    def _buffer(self, sim: Simulation, record: DispatchRecord) -> None:
        if self.options.staleness_at == "buffer":  # the paper: staleness when the update is buffered
            self._buffered_weight[record.id] = self._weight(sim, record)

    def _weight(self, sim: Simulation, record: DispatchRecord) -> float:
        weight = self._staleness_weights[sim.version - record.version]  # st(τ_g − τ_i)
        return weight * float(sim.client_weights[record.client])

    # ------------------------------------------------------------------ ASSIGNGROUP (Alg. 2)
    def _assign(self, sim: Simulation, client: int) -> None:
        if not self._join(client, sim.now):
            self._create(sim, client)

    def _join(self, client: int, now: float) -> bool:
        """JOINGROUP: put the client in the group :meth:`_join_choice` picks; False if there is none."""
        choice = self._join_choice(client, now)
        if choice is None:
            return False
        self._enter(client, *choice, self.clients[client].speed)
        return True

    def _join_choice(self, client: int, now: float) -> tuple[int, int] | None:
        """(group, q) for JOINGROUP: the open group giving the client the most steps
        q = floor((T_a − now) / S_i)
        within [Q_min, ⌊factor·Q_max⌋], ties to the latest-created group — found by bisecting the
        groups sorted by T_a (q never falls as T_a grows), O(log groups) rather than a scan.

        Exactly the scan's choice (:meth:`_join_choice_scan`, kept as the reference and for speeds that are
        not finite and positive): the scan goes through the groups in creation order and keeps the
        last one with the largest q; here that is the largest group id among the entries with the
        largest q ≤ the bound, which sit side by side just below the first entry past it."""
        speed = self.clients[client].speed
        if not 0.0 < speed < math.inf:
            return self._join_choice_scan(client, now)
        upper = math.floor(self.options.join_max_factor * self.q_max)
        index, floor = self._by_expected, math.floor
        size = len(index)
        # The first entry with q > upper: start from where exact arithmetic puts it, then step to
        # where the rounded q puts it (a step or none).
        end = bisect.bisect_left(index, (now + (upper + 1) * speed,))
        while end < size and floor((index[end][0] - now) / speed) <= upper:
            end += 1
        while end > 0 and floor((index[end - 1][0] - now) / speed) > upper:
            end -= 1
        if end == 0:
            return None
        best_q = floor((index[end - 1][0] - now) / speed)
        if best_q < self.q_min:
            return None
        best_group, position = index[end - 1][1], end - 2
        while position >= 0 and floor((index[position][0] - now) / speed) == best_q:
            best_group = max(best_group, index[position][1])
            position -= 1
        return best_group, best_q

    def _join_choice_scan(self, client: int, now: float) -> tuple[int, int] | None:
        """JOINGROUP's choice by the paper's scan over every open group (what :meth:`_join_choice` equals)."""
        speed = self.clients[client].speed
        upper = math.floor(self.options.join_max_factor * self.q_max)
        q_min, floor = self.q_min, math.floor
        best_group, best_q = None, -1
        for group_id, group in self.groups.items():  # creation order: ties go to the later group
            expected = group.expected
            if expected == 0.0 and group.latest == 0.0:  # group.aggregated, without a property call per group
                continue
            q = floor((expected - now) / speed)
            if q_min <= q <= upper and q >= best_q:
                best_group, best_q = group_id, q
        return None if best_group is None else (best_group, best_q)

    def _enter(self, client: int, group_id: int, steps: int, speed: float) -> None:
        self.clients[client].group, self.clients[client].steps = group_id, steps
        group = self.groups[group_id]
        group.pending.add(client)
        if group.speeds is not None:
            heapq.heappush(group.speeds, (speed, client))

    def _create(self, sim: Simulation, client: int) -> None:
        now, speed = sim.now, self.clients[client].speed
        q = -1
        for group_id, group in self.groups.items():
            reference = group.expected if self.options.create_rule == "t_a" else group.latest
            if group.aggregated or not now < reference:
                continue
            if not group.pending and (self.options.fastest_over == "pending" or not group.arrived):
                continue  # no members
            fastest = self._fastest(group_id, group)
            expected_next = reference + fastest * self.q_max  # T_exp
            candidate = math.floor((expected_next - now) / speed)
            if self.options.create_far_groups == "skip" and candidate > self.q_max:
                continue
            q = max(q, candidate)
        if 0 <= q < self.q_min:
            q = self.q_min
        elif q < 0 or q > self.q_max:
            q = self.q_max
        group_id, self._next_group = self._next_group, self._next_group + 1
        latest = now + self.latest_time_factor * q * speed
        group = self.groups[group_id] = GroupState(pending={client}, arrived=[], buffer=[], expected=now + q * speed,
                                                   latest=latest, timer=sim.set_timer(latest, group_id),
                                                   speeds=[(speed, client)])
        if not group.aggregated:
            bisect.insort(self._by_expected, (group.expected, group_id))
        self.clients[client].group, self.clients[client].steps = group_id, q

    def _fastest(self, group_id: int, group: GroupState) -> float:
        """The smallest S_i over a group's members (its pending clients, or with ``fastest_over="all"``
        its arrived ones too) in O(log) amortised rather than O(members): at 10^6 clients every
        CREATEGROUP used to scan every client in flight.

        A heap entry is current while its client is still a member with that speed. Members of a
        group not yet aggregated are exactly the clients whose ``group`` is it (pending, or arrived on
        time and not yet reassigned); a late arrival finds its group aggregated already."""
        if group.speeds is None:
            members = group.pending if self.options.fastest_over == "pending" else group.pending | set(group.arrived)
            group.speeds = [(self.clients[m].speed, m) for m in members]
            heapq.heapify(group.speeds)
        heap, clients, pending_only = group.speeds, self.clients, self.options.fastest_over == "pending"
        while True:
            speed, client = heap[0]
            state = clients[client]
            if state.speed == speed and state.group == group_id and (not pending_only or client in group.pending):
                return speed
            heapq.heappop(heap)

    # ------------------------------------------------------------------ helpers
    def _dispatch(self, sim: Simulation, client: int) -> None:
        state = self.clients[client]
        state.start = sim.now
        lr_scale = 1.0
        if self.options.lr_decay:
            lr_scale = 0.995 ** math.floor(state.total_steps / self.q_max)
        sim.dispatch(client, state.steps, lr_scale,  # positional: keywords cost a tenth of the call
                     None if state.group is None else f"group {state.group}")

    def _record_speed(self, state: ClientState, now: float, steps: int) -> None:
        sample = (now - state.start) / steps  # T_start = dispatch time: idle waiting not counted
        if state.speed is None or self.options.speed_estimate == "latest":
            state.speed = sample
        else:
            state.speed = 0.1 * state.speed + 0.9 * sample

    def _unindex(self, group_id: int, group: GroupState) -> None:
        """Take a group out of the T_a index (it is being aggregated or deleted)."""
        if group.aggregated:
            return
        index = self._by_expected
        position = bisect.bisect_left(index, (group.expected, group_id))
        if position < len(index) and index[position] == (group.expected, group_id):
            del index[position]

    def _delete(self, sim: Simulation, group_id: int) -> None:
        group = self.groups.pop(group_id)
        self._unindex(group_id, group)
        if group.timer is not None:
            sim.cancel(group.timer)

    # ------------------------------------------------------------------ introspection (tests, plots)
    def active_groups(self) -> dict[int, GroupState]:
        """Groups still waiting for their expected arrival (not yet aggregated)."""
        return {g: group for g, group in self.groups.items() if not group.aggregated}

    def check_invariants(self) -> None:
        """Every client with a group is in that group's pending list; no client is in two groups."""
        seen: dict[int, int] = {}
        for group_id, group in self.groups.items():
            for client in group.pending:
                if client in seen:
                    raise AssertionError(f"client {client} pending in groups {seen[client]} and {group_id}")
                seen[client] = group_id
        for client, state in enumerate(self.clients):
            if state.group is not None and state.group not in self.groups:
                raise AssertionError(f"client {client} is assigned to deleted group {state.group}")


SWITCH_CHOICES = {"speed_estimate": ("latest", "ema"), "staleness_at": ("buffer", "aggregation"),
                  "create_rule": ("t_a", "t_max"), "create_far_groups": ("clamp", "skip"),
                  "fastest_over": ("pending", "all"), "empty_timer": ("apply", "skip"), "warmup": WARMUPS}


@dataclasses.dataclass(frozen=True)
class FedCompassConfig(Options):
    """FedCompass's options (Algorithms 1–3 of Li et al., ICLR 2024); None: Q_max = local_steps, Q_min = 0.2·Q_max
    (Table 9), and the preset's value for λ and every reference-code switch."""

    presets = {"paper": {**dataclasses.asdict(PAPER), "latest_time_factor": 1.2},
               "reference_code": {**dataclasses.asdict(REFERENCE_CODE),
                                  "latest_time_factor": REFERENCE_CODE_LATEST_TIME_FACTOR}}
    namespace = "compass"
    aliases = {"lambda": "latest_time_factor"}

    q_min: int | None = None  # Q_min, fewest local steps a client is assigned; unset: 0.2·Q_max (Table 9)
    q_max: int | None = None  # Q_max, most local steps a client is assigned; unset: --local-steps
    latest_time_factor: float | None = None  # λ: 1.2 (paper), 1.5 (legacy code)
    preset: str = "paper"  # defaults of the switches below: the paper or the reference code
    speed_estimate: str | None = None  # latest sample (paper) | ema (code: 0.9 on newest)
    staleness_at: str | None = None  # buffer time (paper) | aggregation time (new repo)
    create_rule: str | None = None  # CREATEGROUP lines up with T_a (paper) | T_max (code)
    create_far_groups: str | None = None  # clamp q to Q_max (paper) | skip groups (code)
    join_max_factor: float | None = None  # JOINGROUP accepts q ≤ factor·Q_max: 1 | 1.2 (legacy)
    fastest_over: str | None = None  # fastest client of a group: pending (paper) | all (code)
    lr_decay: bool | None = None  # legacy client lr × 0.995^floor(steps/Q_max)
    empty_timer: str | None = None  # timer on a group with no arrivals: apply (paper) | skip
    warmup: str | None = None  # steps of the warm-up round: q_min (paper) | q_max (code; first speed = time/Q_max)

    def step_range(self, local_steps: int) -> tuple[int, int]:
        """(Q_min, Q_max): Q_max = the baselines' local steps, Q_min = 0.2·Q_max unless set (Table 9)."""
        q_max = self.q_max or local_steps
        return self.q_min or min(q_max, max(1, round(0.2 * q_max))), q_max

    def switches(self) -> CompassOptions:
        return self.pick(CompassOptions)

    def validate(self, run) -> None:
        from jaxfl.config import fail

        if self.preset not in self.presets:
            fail("compass.preset", self.preset, f"one of {', '.join(self.presets)}")
        for name, allowed in SWITCH_CHOICES.items():
            if getattr(self, name) not in allowed:
                fail(f"compass.{name}", getattr(self, name), f"one of {', '.join(allowed)}")
        for name in ("q_min", "q_max"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                fail(f"compass.{name}", getattr(self, name), "an integer >= 1")
        q_max = self.q_max or run.local_steps
        if self.q_min is not None and self.q_min > q_max:
            fail("compass.q_min", self.q_min, f"at most compass.q_max ({q_max})")
        if not (self.latest_time_factor >= 1 and math.isfinite(self.latest_time_factor)):
            fail("compass.latest_time_factor", self.latest_time_factor, "a finite latest-time factor λ >= 1")
        if not (self.join_max_factor >= 1 and math.isfinite(self.join_max_factor)):
            fail("compass.join_max_factor", self.join_max_factor, "a finite number >= 1")


@register
class FedCompassAlgorithm(Algorithm):
    """FedCompass (Li et al. 2024): arrival groups that finish together (paper's plain aggregation)."""

    name = "fedcompass"
    kind = "semi-asynchronous"
    reads = frozenset({"staleness", "staleness_alpha", "staleness_a"})
    Options = FedCompassConfig
    aggregation = "plain"
    summary = "computing-power-aware arrival groups (Li et al. 2024)"

    def policy(self) -> FedCompass:
        q_min, q_max = self.options.step_range(self.run.local_steps)
        return FedCompass(q_min, q_max, staleness_function(self.run),
                          latest_time_factor=self.options.latest_time_factor, aggregation=self.aggregation,
                          options=self.options.switches())


@register
class FedCompassM(FedCompassAlgorithm):
    """FedCompass+M: server momentum (0.9) at group aggregations."""

    name = "fedcompass_m"
    aggregation = "momentum"
    server_momentum = 0.9
    summary = "FedCompass with server momentum at group aggregations"


@register
class FedCompassN(FedCompassAlgorithm):
    """FedCompass+N: group aggregations normalised by local steps (FedNova with τ_eff weighted by p_i)."""

    name = "fedcompass_n"
    aggregation = "normalized"
    delta_updates = False  # already normalised: the FedNova option would apply twice
    summary = "FedCompass with step-normalised group aggregations"

    def hooks(self):
        return (StepNormalization(),)
