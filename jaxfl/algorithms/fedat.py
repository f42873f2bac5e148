"""FedAT (Chai et al., SC 2021): synchronous inside speed tiers, asynchronous across tiers.

FedCompass (Li et al., ICLR 2024), which benchmarks FedAT, gives only the tier ratio υ = 2.0 and the
cross-tier weighting of the FedAT paper; everything else is left open. What this
implementation chooses, each marked [choice]::

    profiling [choice]: round 0 is a synchronous FedAvg round of all clients (Q steps from w_0);
        it measures every client's time per step S_i and its update is kept (FedAvg rule).
        ``profiling="oracle"`` instead forms tiers at time 0 from the simulator's true S_i, what the
        round would measure without jitter: (Q_i·t_i + c_i) / Q_i with the client's communication
        c_i (its own in a network trace) and its compute factor under speed_unit "round".
    tiers: sort clients by S_i (fastest first); a tier starts at the fastest client left and
        takes every client with S_i ≤ υ · S_first; the next tier starts at the first one left out.
        Tiers are fixed for the run (the FedCompass paper notes FedAT adapts badly to speed changes).
    each tier m, independently (all its clients every round [choice]):
        clients train Q steps from the current global w
        when the tier's slowest member arrives:
            w_m ← Σ_{i∈m} p_i (w_start − Δ_i) / Σ_{i∈m} p_i        # synchronous FedAvg in the tier
            T_m ← T_m + 1
            w ← Σ_k (T_{M−1−k} / T) · w_k,  T = Σ_k T_k            # tiers k = 0..M−1, fast → slow:
                                                                  # slow tiers get the fast tiers'
                                                                  # counts, so they are not drowned out
            the tier starts its next round from the new w
    counts start at T_k = 1 and each tier's model starts as the global model the tiers were formed
        from [choice: with zero counts the first update of a tier would get weight 0].
    No proximal term and no intra-tier client sampling [choice].
    ``round_timeout`` (faults): a tier (or the profiling) round closes at its deadline with the
        members that arrived; later updates are dropped ("arrived after round deadline") and the
        client rejoins its tier's next round. A client that misses the profiling deadline is placed
        when it finally reports, in the slowest tier that starts no slower than it [choice]: its
        round is longer than the deadline, so a tier of its own would never complete a round while
        its untrained model took the largest cross-tier weight (the fastest tier's count, mirrored);
        in a tier it keeps missing the deadline (its updates dropped) until its speed changes.
    a tier none of whose members is training [choice; the paper has no faults]: its round closed at
        the deadline with no update and every member is still out (crashed, or late), so no round
        of it is open. It leaves the cross-tier average (weight 0) until a member reports and its
        next round opens, and the counts are mirrored over the tiers that remain:
            w ← Σ_{k∈L} (T_{L[|L|−1−j(k)]} / Σ_{l∈L} T_l) · w_k,  L the training tiers, fast → slow
        (with every tier training, the formula above). Kept in, a tier whose members all crashed
        took its mirror tier's growing count: 0.61 of the global model at t = 310 in an 8-client
        run with 8 % crashes, against 0.10 for the one tier still training.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from jaxfl.algorithms.base import Algorithm, DeviceHook, Options, register
from jaxfl.scheduler.clock import ARRIVALS_FIRST
from jaxfl.scheduler.simulation import DispatchRecord, Policy, Simulation, _comm_time, local_steps_of

PROFILING = ("round", "oracle")


class TierUpdate(NamedTuple):
    """Payload of a tier aggregation: the tier whose model the contributions (summing to 1) average,
    and the cross-tier weights (tier, a_k) that combine the tier models into the global model."""

    tier: int
    tier_weights: tuple[tuple[int, float], ...]

    def check(self, sim, contributions) -> None:
        if self.tier not in dict(self.tier_weights):
            raise ValueError(f"a tier update needs its tier ({self.tier}) among tier_weights {self.tier_weights}")


def form_tiers(time_per_step, ratio: float) -> list[list[int]]:
    """Group clients into tiers, fastest first: a tier holds every client within ``ratio`` of its first.

    >>> form_tiers([1.0, 5.0, 1.5, 2.5, 2.0], ratio=2.0)
    [[0, 2, 4], [3, 1]]
    """
    if not ratio >= 1.0:
        raise ValueError(f"tier ratio υ must be >= 1, got {ratio}")
    order = sorted(range(len(time_per_step)), key=lambda c: (time_per_step[c], c))
    tiers: list[list[int]] = []
    for client in order:
        if tiers and time_per_step[client] <= ratio * time_per_step[tiers[-1][0]]:
            tiers[-1].append(client)
        else:
            tiers.append([client])
    return tiers


class FedAT(Policy):
    """FedAT; see the module docstring for the loop and the choices made where the papers are silent."""

    name = "fedat"
    needs_start_models = True  # a tier model averages its clients' final models
    priorities = ARRIVALS_FIRST  # an update arriving exactly at its tier round's deadline is on time

    def __init__(self, local_steps: int, tier_ratio: float = 2.0, profiling: str = "round",
                 round_timeout: float | None = None):
        if profiling not in PROFILING:
            raise ValueError(f"unknown FedAT profiling {profiling!r}; allowed: {', '.join(PROFILING)}")
        if not tier_ratio >= 1.0:
            raise ValueError(f"fedat_tier_ratio={tier_ratio} is not allowed: a ratio >= 1")
        if round_timeout is not None and not round_timeout > 0:
            raise ValueError(f"round_timeout={round_timeout!r} is not allowed: virtual seconds > 0, or None")
        self.local_steps = local_steps
        self.tier_ratio = tier_ratio
        self.profiling = profiling
        self.round_timeout = round_timeout
        self._busy: set[int] = set()
        self._round_ids: dict[int, int] = {}  # tier → round counter (timer payloads)
        self._timers: dict[int, object] = {}
        self.tiers: list[list[int]] | None = None
        self.counts: list[int] = []
        self._speed: dict[int, float] = {}
        self._round: dict[int, list[DispatchRecord]] = {}  # tier (or -1 while profiling) → dispatches
        # the same rounds' dispatch ids: an arrival asks whether it belongs to its tier's open round,
        # which a list answers by comparing the record with each member (O(tier) per arrival)
        self._round_dispatch_ids: dict[int, set[int]] = {}
        self._arrived: dict[int, int] = {}
        self._tier_of: dict[int, int] = {}

    def __setstate__(self, state: dict) -> None:
        if "_round_dispatch_ids" not in state:  # checkpoints from before the id sets
            state["_round_dispatch_ids"] = {tier: {r.id for r in members} for tier, members in state["_round"].items()}
        self.__dict__.update(state)

    def start(self, sim: Simulation) -> None:
        if self.profiling == "oracle":
            self._speed = {c: speed for c, speed in enumerate(self._true_step_times(sim))}
            self._form_tiers(sim, list(self._speed.values()))
        else:
            self._start_round(sim, -1, range(sim.num_clients))

    def _true_step_times(self, sim: Simulation) -> list[float]:
        """Each client's time per step as a profiling round measures it, without jitter: its round of
        Q_i steps, compute and communication, divided by Q_i (t_i itself where it has no communication
        and no compute factor)."""
        speeds = sim.speeds
        scale = getattr(speeds, "compute_scale", None)
        times = []
        for client, base in enumerate(speeds.base_time_per_step.tolist()):
            steps = max(local_steps_of(self.local_steps, client), 1)
            comm = _comm_time(speeds, client)
            compute = (steps * float(scale[client])) * base if scale is not None else steps * base
            times.append((compute + comm) / steps if comm or scale is not None else base)
        return times

    def _start_round(self, sim: Simulation, tier: int, clients) -> None:
        detail = "profiling" if tier == -1 else f"tier {tier}"
        idle = [int(c) for c in clients if c not in self._busy]
        self._round[tier] = [sim.dispatch(c, local_steps_of(self.local_steps, c), detail=detail) for c in idle]
        self._round_dispatch_ids[tier] = {record.id for record in self._round[tier]}
        self._busy.update(idle)
        self._arrived[tier] = 0
        self._round_ids[tier] = self._round_ids.get(tier, 0) + 1
        if self.round_timeout is not None and idle:
            self._timers[tier] = sim.set_timer(sim.now + self.round_timeout, [tier, self._round_ids[tier]])

    def _form_tiers(self, sim: Simulation, time_per_step, tiers: list[list[int]] | None = None) -> None:
        self.tiers = tiers if tiers is not None else form_tiers(time_per_step, self.tier_ratio)
        self.counts = [1] * len(self.tiers)
        self._tier_of = {client: t for t, members in enumerate(self.tiers) for client in members}
        for tier, members in enumerate(self.tiers):
            self._start_round(sim, tier, members)

    def tier_weights(self, updating: int | None = None) -> list[tuple[int, float]]:
        """(tier, a_k) with a_k = T_{M−1−k} / T: each tier gets the update count of its mirror tier,
        among the tiers still training (``updating``, the tier aggregating now, and every tier with a
        round open); a tier with none open gets 0 (the module docstring).

        >>> policy = FedAT(10)
        >>> policy.counts, policy._round = [5, 2, 1], {0: ["open"], 1: ["open"], 2: ["open"]}
        >>> policy.tier_weights()  # slow tiers get the fast tiers' counts
        [(0, 0.125), (1, 0.25), (2, 0.625)]
        >>> policy._round[1] = []  # every member of tier 1 is out: it leaves the average
        >>> policy.tier_weights()
        [(0, 0.16666666666666666), (1, 0.0), (2, 0.8333333333333334)]
        """
        training = [k for k in range(len(self.counts)) if k == updating or self._round.get(k)]
        total = sum(self.counts[k] for k in training)
        weights = dict.fromkeys(range(len(self.counts)), 0.0)
        for position, tier in enumerate(training):
            weights[tier] = self.counts[training[-1 - position]] / total
        return list(weights.items())

    def on_arrival(self, sim: Simulation, record: DispatchRecord) -> None:
        self._speed[record.client] = (sim.now - record.start_time) / max(record.steps, 1)
        self._busy.discard(record.client)
        tier = -1 if self.tiers is None else self._tier_of.get(record.client)
        if tier is None or record.id not in self._round_dispatch_ids.get(tier, ()):  # its round closed at the deadline
            sim.drop(record, "arrived after round deadline")
            if self.tiers is None:  # profiling still open or closed empty: profile whoever is idle
                if not self._round.get(-1):
                    self._start_round(sim, -1, range(sim.num_clients))
                return
            if record.client not in self._tier_of:
                self._place_late_client(record.client)
            tier = self._tier_of[record.client]
            if not self._round.get(tier):
                self._start_round(sim, tier, self.tiers[tier])
            return
        self._arrived[tier] += 1
        if self._arrived[tier] < len(self._round[tier]):
            return  # synchronous inside the tier: wait for its slowest member
        if tier in self._timers:
            sim.cancel(self._timers.pop(tier))
        self._finish_round(sim, tier, self._round[tier])

    def on_timer(self, sim: Simulation, payload) -> None:
        tier, round_id, *rounding = payload
        self._timers.pop(tier, None)
        if self._round_ids.get(tier) == round_id:
            later = None if rounding else sim.due_by_rounding(self._round[tier])
            if later is not None:  # on time in exact arithmetic, rounded past the deadline: waited for
                self._timers[tier] = sim.set_timer(later, [tier, round_id, "rounding"])
                return
            arrived = [r for r in self._round[tier] if r.status == "arrived"]
            self._finish_round(sim, tier, arrived)

    def _place_late_client(self, client: int) -> None:
        """A client that missed the profiling deadline joins the slowest tier that starts no slower
        than it (tier 0 if it is the fastest), keeping the fast → slow order of the tiers."""
        firsts = [self._speed[members[0]] for members in self.tiers]
        tier = max([k for k, first in enumerate(firsts) if first <= self._speed[client]], default=0)
        self.tiers[tier].append(client)
        self._tier_of[client] = tier

    def _finish_round(self, sim: Simulation, tier: int, members: list[DispatchRecord]) -> None:
        self._round[tier] = []
        self._round_dispatch_ids[tier] = set()
        members = sim.screen(members)  # the tier model averages the finite updates only
        if not members:  # nobody made the deadline: no update, try again with whoever is idle
            self._start_round(sim, tier, range(sim.num_clients) if tier == -1 else self.tiers[tier])
            return
        weights = np.array([sim.client_weights[r.client] for r in members])
        total = weights.sum()  # once: a tier of 10^5 clients summed it 10^5 times
        contributions = [(r.id, w / total) for r, w in zip(members, weights)]
        if tier == -1:  # the profiling round is a FedAvg round; then tiers form from the measured S_i
            # w ← w − Σ c_i Δ_i, as the tier aggregations after it: FedAT has no server optimiser
            sim.aggregate(contributions, server_optimizer=False)
            measured = sorted(self._speed)
            tiers = form_tiers([self._speed[c] for c in measured], self.tier_ratio)
            self._form_tiers(sim, None, [[measured[i] for i in tier_] for tier_ in tiers])
            return
        self.counts[tier] += 1
        sim.aggregate(contributions, payload=TierUpdate(tier, tuple(self.tier_weights(tier))))
        self._start_round(sim, tier, self.tiers[tier])


class TierModels(DeviceHook):
    """Keeps each tier's latest model on device and makes a tier aggregation's whole update:
    tier model = Σ c_i (start_i − Δ_i) (buffers: the members' plain mean), then w = Σ_k a_k · model_k.
    A tier without a model yet contributes the global model the tiers were formed from."""

    name = "fedat_tiers"
    fixed_state_shape = False  # a model per tier, added as tiers get their first update

    def init(self, params, num_clients):
        return {}

    def apply(self, ctx, aggregation, records):
        payload = aggregation.payload
        if not isinstance(payload, TierUpdate):
            return None
        from jaxfl.execution import bucket_size
        from jaxfl.kernels.fedat import tier_update

        coefficients = dict(aggregation.contributions)
        # the members' distinct start models (one global version for a FedAT round), each passed once
        versions = list(dict.fromkeys(record.version for record in records))
        starts = tuple(ctx.start_model(next(r for r in records if r.version == v)) for v in versions)
        # padded to the federation's bucket, not the tier's: one compilation serves every tier (the
        # loop runs over the members only; the padding costs 8 bytes per client to transfer)
        padded = bucket_size(ctx.num_clients)
        which = np.zeros(padded, np.int32)
        which[:len(records)] = [versions.index(record.version) for record in records]
        member_coefficients = np.zeros(padded, np.float32)
        member_coefficients[:len(records)] = [coefficients[record.id] for record in records]
        models = dict(ctx.state[self.name])
        for tier, _ in payload.tier_weights:
            models.setdefault(str(tier), ctx.params)
        order = [tier for tier, _ in payload.tier_weights]
        # one jitted program instead of an eager op per parameter leaf per member and per tier
        tier_model, combined = ctx.jit("fedat_tier_update", tier_update)(
            ctx.combine(aggregation, records), starts, which, member_coefficients, np.int32(len(records)),
            ctx.mean_buffers(records), tuple(models[str(tier)] for tier in order), np.int32(order.index(payload.tier)),
            np.array([weight for _, weight in payload.tier_weights], np.float32), np.uint32(0))
        models[str(payload.tier)] = tier_model
        ctx.state[self.name] = models
        return combined


@dataclasses.dataclass(frozen=True)
class FedATConfig(Options):
    """FedAT's options (the papers give only υ; the rest is marked [choice] in the module docstring)."""

    namespace = "fedat"

    tier_ratio: float = 2.0  # υ: clients within this speed ratio share a tier
    profiling: str = "round"  # round: a FedAvg round measures speeds | oracle: true speeds

    def validate(self, run) -> None:
        from jaxfl.config import fail

        if self.profiling not in PROFILING:
            fail("fedat.profiling", self.profiling, f"one of {', '.join(PROFILING)}")
        if not self.tier_ratio >= 1.0:
            fail("fedat.tier_ratio", self.tier_ratio, "a speed ratio >= 1")


@register
class FedATAlgorithm(Algorithm):
    """FedAT (Chai et al. 2021): synchronous inside speed tiers, asynchronous across them."""

    name = "fedat"
    kind = "semi-asynchronous"
    reads = frozenset({"round_timeout"})
    Options = FedATConfig
    waits_for_clients = "every client of a round"
    per_client_steps = True
    delta_updates = False  # tier models are averaged as models
    summary = "synchronous inside speed tiers, weighted across tiers (Chai et al. 2021)"

    @classmethod
    def unread_settings(cls, run, options=None) -> dict[str, tuple[str | None, str]]:
        """A tier aggregation sets the model to the tiers' weighted average: no server optimiser.

        >>> from types import SimpleNamespace
        >>> sorted(FedATAlgorithm.unread_settings(SimpleNamespace(rule=None)))
        ['server_lr', 'server_momentum', 'server_optimizer']
        """
        server = (None, "algorithms with a server optimiser: fedat sets the model to its tiers' weighted average")
        return {"server_optimizer": server, "server_lr": server, "server_momentum": server}

    def policy(self) -> FedAT:
        return FedAT(self.local_steps, self.options.tier_ratio, self.options.profiling,
                     round_timeout=self.run.round_timeout)

    def hooks(self):
        return (TierModels(),)
