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
aggregations only; single updates skip it); a server optimiser or learning rate a user sets
(``server_optimizer``, ``server_lr``) likewise applies to group aggregations only: a first
response's single update is w − st·p_i·Δ_i as written above, whatever the server's settings;
``"normalized"`` (+N: each buffered update is divided
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

from jaxfl.algorithms.base import Algorithm, Options, note_data_share_steps, register, staleness_function
from jaxfl.algorithms.wrappers import NormalizeSteps, StepNormalization
from jaxfl.scheduler.clock import ARRIVALS_FIRST
from jaxfl.scheduler.simulation import DEADLINE_ROUNDING, DispatchRecord, Policy, Simulation
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
    lr_decay: bool = False  # True: lr × 0.995^floor((Q_min + steps assigned after the warm-up) / Q_max) (§10 9e)
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
    total_steps: int = 0  # steps of all finished rounds, the warm-up's included (for the legacy lr decay)


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
    detail: str = ""  # "group N", its dispatches' log detail (built once, not once per dispatch)

    @property
    def aggregated(self) -> bool:
        return self.expected == 0.0 and self.latest == 0.0


class FedCompass(Policy):
    """The FedCompass server; see the module docstring for the loop and the switches."""

    name = "fedcompass"
    # Arrivals before timers at equal times (a client arriving exactly at T_max is on time).
    priorities = ARRIVALS_FIRST

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
        # (T_exp, group id) for CREATEGROUP, sorted: T_exp = T_ref + S_fastest·Q_max of every open group
        # with members, as of the last CREATEGROUP; the groups changed since (a member joined or
        # arrived, or the group is new) are in _create_dirty and re-entered by the next one (see
        # _create_choice). _create_keys: each indexed group's T_exp.
        self._create_index: list[tuple[float, int]] = []
        self._create_keys: dict[int, float] = {}
        self._create_dirty: set[int] = set()
        self._staleness_weights = StalenessWeights(staleness)
        self._weights_list: list[float] | None = None  # p_i as Python floats (_client_weights)
        self._read_switches()

    def _read_switches(self) -> None:
        """The switches the event handlers test, read once (not an attribute chain and a string
        comparison per arrival)."""
        options = self.options
        self._ema = options.speed_estimate == "ema"
        self._weigh_at_buffer = options.staleness_at == "buffer"
        self._fastest_over_all = options.fastest_over == "all"
        self._create_at_t_max = options.create_rule == "t_max"
        self._skip_far_groups = options.create_far_groups == "skip"
        self._join_upper = math.floor(options.join_max_factor * self.q_max)
        self._lr_decay = options.lr_decay
        self._warmup_steps = self.q_max if options.warmup == "q_max" else self.q_min

    def __getstate__(self) -> dict:
        """Everything but the p_i list, which the simulation holds already (10^6 floats at 10^6 clients)."""
        state = dict(self.__dict__)
        state.pop("_weights_list", None)
        return state

    def __setstate__(self, state: dict) -> None:
        """Policies pickled before the T_a and T_exp indexes and the st(s) memo rebuild them."""
        self.__dict__.update(state)
        self._staleness_weights = StalenessWeights(self.staleness)
        self._weights_list = None
        if "_by_expected" not in state:
            self._by_expected = sorted((group.expected, group_id) for group_id, group in self.groups.items()
                                       if not group.aggregated)
        if "_create_index" not in state:  # every group re-entered at the next CREATEGROUP
            self._create_index, self._create_keys, self._create_dirty = [], {}, set(self.groups)
        for group_id, group in self.groups.items():
            if not group.detail:  # a group pickled before the field
                group.detail = f"group {group_id}"
        self._read_switches()

    # ------------------------------------------------------------------ server loop (Alg. 1)
    def start(self, sim: Simulation) -> None:
        warmup_steps = self._warmup_steps
        # warm-up: everybody gets Q_min (paper) or Q_max (code), no group, T_start = now, and the
        # lr scale 0.995^0 = 1 of the legacy decay: _dispatch for each client, in one bulk call
        now = sim.now
        self.clients = [ClientState(None, warmup_steps, None, now) for _ in range(sim.num_clients)]
        sim.dispatch_many(range(sim.num_clients), warmup_steps)

    def on_arrival(self, sim: Simulation, record: DispatchRecord) -> None:
        client, now, steps = record.client, sim.queue._now, record.steps  # the clock's field: no property call
        state = self.clients[client]
        sample = (now - state.start) / steps  # S_i; T_start = dispatch time: idle waiting not counted
        state.speed = sample if state.speed is None or not self._ema else 0.1 * state.speed + 0.9 * sample
        state.total_steps += steps
        group_id = state.group
        if group_id is None:  # first response: immediate single update
            # +M skips momentum here and +N leaves it unnormalised (the authors' code)
            if sim.screen([record]):  # a NaN/Inf update dropped: no version
                sim.aggregate([(record.id, self._weight(sim, record))], server_optimizer=False)
            self._reassign(sim, client, now)
            return
        group = self.groups[group_id]
        group.pending.remove(client)
        group.arrived.append(client)
        if self._fastest_over_all and group.speeds is not None:  # still a member, re-measured
            heapq.heappush(group.speeds, (state.speed, client))
        if self._weigh_at_buffer:  # the paper: staleness when the update is buffered (_weight, inline)
            self._buffered_weight[record.id] = (self._staleness_weights[sim.version - record.version]
                                                * self._client_weights(sim)[client])
        if now > group.latest:  # late: its group was aggregated at T_max without it
            self.general_buffer.append(record)
            self._reassign(sim, client, now)
            if not group.pending:
                self._delete(sim, group_id)
        else:
            group.buffer.append(record)
            if group.pending:
                self._create_dirty.add(group_id)  # its members, or its fastest one's speed, changed
            else:
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
            self._screen_buffers(sim, group)  # a group whose arrivals were all NaN is a group without arrivals
        if group.buffer or self.options.empty_timer == "apply":
            # The paper applies the general buffer (and counts a version) even if nobody of the
            # group arrived; the code's "skip" leaves the general buffer for the next aggregation.
            # With both buffers empty the mean update is zero, which leaves plain FedCompass's model
            # as it was; FedCompass+M's step (v ← β·v + 0, w ← w − v) and a FedOpt optimiser's still
            # move it, as the paper's rule reads for a group aggregation: "skip" is the way without.
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
        clients, reassign, now = self.clients, self._reassign, sim.now
        for _, client in sorted([(clients[c].speed, c) for c in arrived]):  # fastest first
            reassign(sim, client, now)
        if not group.pending:
            self._delete(sim, group_id)
        # otherwise the group lives on until its late clients arrive (they go to the general buffer)

    def _screen_buffers(self, sim: Simulation, group: GroupState) -> None:
        """Leave the finite updates in the group's and the general buffer (a NaN/Inf one is dropped
        under on_nonfinite="skip"), so that the aggregation weighs them as if no other had arrived."""
        buffered = group.buffer + self.general_buffer
        kept = {record.id for record in sim.screen(buffered)}
        if len(kept) < len(buffered):
            for record in buffered:
                if record.id not in kept:
                    self._buffered_weight.pop(record.id, None)
            group.buffer = [r for r in group.buffer if r.id in kept]
            self.general_buffer = [r for r in self.general_buffer if r.id in kept]

    def _contributions(self, sim: Simulation, records: list[DispatchRecord]) -> list[tuple[int, float]]:
        """(dispatch id, st·p_i) of each record: the weight fixed when it was buffered, or else now."""
        buffered, contributions = self._buffered_weight, []
        for record in records:
            weight = buffered.pop(record.id, None)
            contributions.append((record.id, self._weight(sim, record) if weight is None else weight))
        return contributions

    def _weight(self, sim: Simulation, record: DispatchRecord) -> float:
        weight = self._staleness_weights[sim.version - record.version]  # st(τ_g − τ_i)
        return weight * self._client_weights(sim)[record.client]

    def _client_weights(self, sim: Simulation) -> list[float]:
        """The p_i as a list of Python floats (the same values as ``float(sim.client_weights[i])``), made
        at first use: a NumPy element read and its float() cost as much as the rest of a weight."""
        weights = self._weights_list
        if weights is None:
            weights = self._weights_list = sim.client_weights.tolist()
        return weights

    # ------------------------------------------------------------------ ASSIGNGROUP (Alg. 2)
    def _reassign(self, sim: Simulation, client: int, now: float) -> None:
        """ASSIGNGROUP(i) — JOINGROUP, or else CREATEGROUP — then dispatch(i): Q_i steps, T_start = now."""
        state = self.clients[client]
        choice = self._join_choice(client, now) if self._by_expected else None  # no open group: none to join
        if choice is None:
            group = self._create(sim, client)
        else:  # JOINGROUP
            group_id, state.steps = choice
            state.group = group_id
            group = self.groups[group_id]
            group.pending.add(client)
            if group.speeds is not None:
                heapq.heappush(group.speeds, (state.speed, client))
            self._create_dirty.add(group_id)
        state.start = now
        # the legacy lr decay (APPFL's SchedulerCompass, 2023-12): 0.995^floor(n / Q_max), where n
        # starts at Q_min at the first arrival (the warm-up round is not counted) and adds each
        # round's Q_i as it is assigned, this one included; positional: keywords cost a tenth of the call
        lr_scale = 0.995 ** math.floor((state.total_steps - self._warmup_steps + self.q_min + state.steps)
                                       / self.q_max) if self._lr_decay else 1.0
        sim.dispatch(client, state.steps, lr_scale, group.detail)

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
        index, floor = self._by_expected, math.floor
        end = _first_beyond(index, now, speed, self._join_upper)
        if end == 0:
            return None
        best_q = floor((index[end - 1][0] * _ROUNDING_SLACK - now) / speed)
        if best_q < self.q_min:
            return None
        best_group, position = index[end - 1][1], end - 2
        while position >= 0 and floor((index[position][0] * _ROUNDING_SLACK - now) / speed) == best_q:
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
            q = floor((expected * _ROUNDING_SLACK - now) / speed)
            if q_min <= q <= upper and q >= best_q:
                best_group, best_q = group_id, q
        return None if best_group is None else (best_group, best_q)

    def _create(self, sim: Simulation, client: int) -> GroupState:
        """CREATEGROUP: a new group for the client, with the q of :meth:`_create_choice` clamped to [Q_min, Q_max]."""
        now, speed = sim.now, self.clients[client].speed
        q = self._create_choice(client, now)
        if 0 <= q < self.q_min:
            q = self.q_min
        elif q < 0 or q > self.q_max:
            q = self.q_max
        group_id, self._next_group = self._next_group, self._next_group + 1
        latest = now + self.latest_time_factor * q * speed
        # positional, in GroupState's field order (pending, arrived, T_a, T_max, buffer, timer, speeds, detail):
        # one group per CREATEGROUP, nearly one per event in the first wave of a large federation
        group = self.groups[group_id] = GroupState({client}, [], now + q * speed, latest, [],
                                                   sim.set_timer(latest, group_id), [(speed, client)],
                                                   f"group {group_id}")
        if not group.aggregated:
            bisect.insort(self._by_expected, (group.expected, group_id))
        self._create_dirty.add(group_id)
        self.clients[client].group, self.clients[client].steps = group_id, q
        return group

    def _create_choice(self, client: int, now: float) -> int:
        """CREATEGROUP's q before clamping, −1 if no group counts: the largest
        q = floor((T_exp − now) / S_i),  T_exp = T_ref + S_fastest·Q_max,
        over the open groups with members and now < T_ref (T_ref = T_a, or T_max with
        ``create_rule="t_max"``), skipping those with q > Q_max if ``create_far_groups="skip"``.

        Exactly the scan's q (:meth:`_create_choice_scan`, kept as the reference and for speeds that
        are not finite and positive): q never falls as T_exp grows, so it is the q of the largest T_exp
        (with "skip", the largest below the first entry past Q_max) in the index of the groups sorted
        by T_exp. S_fastest moves with every join and arrival, so the index is brought up to date
        here, for the groups changed since the last call only (amortised O(log groups) per change,
        not O(groups) per call); a group whose T_ref has passed leaves it for good (the clock only
        moves on), when the walk down from the top meets it."""
        speed = self.clients[client].speed
        if not 0.0 < speed < math.inf:
            return self._create_choice_scan(client, now)
        if self._create_dirty:
            self._reindex_changed_groups(now)
        index, keys, groups, at_t_max = self._create_index, self._create_keys, self.groups, self._create_at_t_max
        position = (_first_beyond(index, now, speed, self.q_max) if self._skip_far_groups else len(index)) - 1
        while position >= 0:
            expected_next, group_id = index[position]
            group = groups[group_id]
            if now < (group.latest if at_t_max else group.expected):
                return math.floor((expected_next * _ROUNDING_SLACK - now) / speed)
            del index[position], keys[group_id]
            position -= 1
        return -1

    def _create_choice_scan(self, client: int, now: float) -> int:
        """CREATEGROUP's q by the paper's scan over every open group (what :meth:`_create_choice` equals)."""
        speed = self.clients[client].speed
        q = -1
        for group_id, group in self.groups.items():
            reference = group.expected if self.options.create_rule == "t_a" else group.latest
            if group.aggregated or not now < reference:
                continue
            if not group.pending and (self.options.fastest_over == "pending" or not group.arrived):
                continue  # no members
            fastest = self._fastest(group_id, group)
            expected_next = reference + fastest * self.q_max  # T_exp
            candidate = math.floor((expected_next * _ROUNDING_SLACK - now) / speed)
            if self.options.create_far_groups == "skip" and candidate > self.q_max:
                continue
            q = max(q, candidate)
        return q

    def _reindex_changed_groups(self, now: float) -> None:
        """Re-enter the groups changed since the last CREATEGROUP in the T_exp index, with their T_exp
        now; those aggregated, deleted, past T_ref or without members leave it (a group that gains a
        member is changed again)."""
        index, keys, groups, at_t_max = self._create_index, self._create_keys, self.groups, self._create_at_t_max
        pending_only = not self._fastest_over_all
        for group_id in self._create_dirty:
            old = keys.pop(group_id, None)
            if old is not None:
                _remove_sorted(index, (old, group_id))
            group = groups.get(group_id)
            if group is None or group.aggregated:
                continue
            reference = group.latest if at_t_max else group.expected
            if not now < reference or (not group.pending and (pending_only or not group.arrived)):
                continue
            expected_next = keys[group_id] = reference + self._fastest(group_id, group) * self.q_max
            bisect.insort(index, (expected_next, group_id))
        self._create_dirty.clear()

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
    def _unindex(self, group_id: int, group: GroupState) -> None:
        """Take a group out of the T_a and T_exp indexes (it is being aggregated or deleted)."""
        expected_next = self._create_keys.pop(group_id, None)
        if expected_next is not None:
            _remove_sorted(self._create_index, (expected_next, group_id))
        if not group.aggregated:
            _remove_sorted(self._by_expected, (group.expected, group_id))

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


# q = floor((T − now) / S_i) counts whole steps, but S_i is measured as (arrival − start) / steps and T
# is a sum of such products, each rounded: identical clients got 49.999999999999993 for 50 steps, so
# Q_max − 1 (2 % less work, then idle until their group's creator arrived; 53 of 264 (speed, Q, now)
# tried). The rounding is of the clock's size, so T is taken a relative 10^-12 later (thousands of
# ulps of T, as Simulation.due_by_rounding's deadlines): floor((T·(1 + 10^-12) − now) / S_i), as in
# exact arithmetic, far below any difference of speeds a model draws. (A slack relative to the
# quotient fell short once the clock reached thousands of seconds: 4 % of such joiners at 10^4 s.)
_ROUNDING_SLACK = 1.0 + DEADLINE_ROUNDING


def _first_beyond(index: list[tuple[float, int]], now: float, speed: float, upper: int) -> int:
    """The position of the first entry (t, id) of the sorted ``index`` with floor((t − now) / speed) > upper:
    bisected where exact arithmetic puts it, then stepped to where the rounded q puts it (a step or none).

    >>> _first_beyond([(1.0, 0), (2.0, 1), (3.0, 2)], now=0.0, speed=1.0, upper=2)
    2
    """
    floor, size = math.floor, len(index)
    end = bisect.bisect_left(index, (now + (upper + 1) * speed,))
    while end < size and floor((index[end][0] * _ROUNDING_SLACK - now) / speed) <= upper:
        end += 1
    while end > 0 and floor((index[end - 1][0] * _ROUNDING_SLACK - now) / speed) > upper:
        end -= 1
    return end


def _remove_sorted(index: list, entry: tuple) -> None:
    """Remove ``entry`` from the sorted list ``index`` if it is there (a bisection, not a scan).

    >>> index = [(1.0, 3), (2.0, 1)]; _remove_sorted(index, (2.0, 1)); index
    [(1.0, 3)]
    """
    position = bisect.bisect_left(index, entry)
    if position < len(index) and index[position] == entry:
        del index[position]


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
    preset: str = "paper"  # defaults of the switches below: paper | reference_code (the authors' code)
    speed_estimate: str | None = None  # latest (paper: the latest sample) | ema (code: 0.9 on newest)
    staleness_at: str | None = None  # buffer (paper: at buffer time) | aggregation (new repo: at aggregation time)
    create_rule: str | None = None  # CREATEGROUP lines up with T_a: t_a (paper) | T_max: t_max (code)
    create_far_groups: str | None = None  # clamp (paper: q to Q_max) | skip (code: skip those groups)
    join_max_factor: float | None = None  # JOINGROUP accepts q ≤ factor·Q_max: 1 | 1.2 (legacy)
    fastest_over: str | None = None  # fastest client of a group among: pending (paper) | all (code)
    lr_decay: bool | None = None  # legacy client lr × 0.995^floor((Q_min + steps assigned since the warm-up)/Q_max)
    empty_timer: str | None = None  # timer on a group with no arrivals: apply (paper; with server momentum or a FedOpt optimiser its step moves the model) | skip
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

    @property
    def most_local_steps(self) -> int:
        """⌊join_max_factor · Q_max⌋: JOINGROUP assigns up to that (Q_max, or 1.2·Q_max in the legacy
        code); CREATEGROUP and the warm-up at most Q_max, which may exceed ``local_steps``."""
        _, q_max = self.options.step_range(self.run.local_steps)
        return max(q_max, math.floor(self.options.join_max_factor * q_max))

    @classmethod
    def validate(cls, run, options) -> None:
        note_data_share_steps(run, cls.name)  # Alg. 3: Δ̄^g += st·p_i·Δ_i, w ← w − (Δ̄^g + Δ̄)

    @classmethod
    def unread_settings(cls, run, options=None) -> dict[str, tuple[str | None, str]]:
        """``local_steps`` is Q_max only while ``compass.q_max`` is unset (Table 9: Q = Q_max); with
        it set, the run never reads ``local_steps`` (a run given both trained 1–10 steps, named q7).

        >>> from types import SimpleNamespace
        >>> FedCompassAlgorithm.unread_settings(SimpleNamespace(local_steps=7), FedCompassConfig(q_max=10))["local_steps"][0]
        'compass.q_max unset'
        >>> FedCompassAlgorithm.unread_settings(SimpleNamespace(local_steps=10), FedCompassConfig(q_max=10))
        {}
        """
        q_max = getattr(options, "q_max", None) if options is not None else None
        if q_max is None or getattr(run, "local_steps", None) == q_max:  # equal: the same Q_max either way
            return {}
        return {"local_steps": ("compass.q_max unset", f"{cls.name}'s compass.q_max unset: Q_max is compass.q_max "
                                                       f"({options.q_max}) here, the local steps it assigns lie in "
                                                       "[Q_min, Q_max]")}

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

    @classmethod
    def validate(cls, run, options) -> None:
        from jaxfl.config import fail

        super().validate(run, options)
        if run.server_optimizer != "sgd":  # another optimiser would drop the momentum that makes it +M
            fail("server_optimizer", run.server_optimizer, "sgd for fedcompass_m (FedCompass+M is SGD with momentum)")


@register
class FedCompassN(FedCompassAlgorithm):
    """FedCompass+N: group aggregations normalised by local steps (FedNova with τ_eff weighted by p_i)."""

    name = "fedcompass_n"
    aggregation = "normalized"
    delta_updates = False  # already normalised: the FedNova option would apply twice
    summary = "FedCompass with step-normalised group aggregations"

    def hooks(self):
        # Δ_i / Q_i as the authors' code divides, also for momentum SGD clients: FedNova's ‖a_i‖₁ at
        # momentum 0.9 (6.0·Q_i at 20 steps, 9.1·Q_i at 100) weighted a short round's update 42% more
        return (StepNormalization(by_steps=True),)
