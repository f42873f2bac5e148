"""FedAvg (McMahan et al. 2017) and FedAvgM (Hsu et al. 2019): synchronous rounds.

Server loop, as in the FedCompass authors' framework (APPFL; Li et al., ICLR 2024, Section 5)::

    every round r:
        S_r = all clients (or a seeded sample of ``clients_per_round``)
        each i in S_r trains Q local steps from w_r            # in parallel on the virtual clock
        wait for the slowest: the round lasts max_i Q·t_i^(r) (+ communication)
        g = Σ_{i∈S_r} p_i Δ_i / Σ_{i∈S_r} p_i                 # = Σ p_i Δ_i with full participation
        w_{r+1} = ServerOpt(w_r, g)     # FedAvg: sgd(1) → w − g;  FedAvgM: v ← βv + g; w ← w − v

FedAvgM is this policy with a momentum server optimiser; the engine applies it.
"""
from __future__ import annotations

import numpy as np

from jaxfl.algorithms.base import Algorithm, register
from jaxfl.scheduler.clock import ARRIVALS_FIRST
from jaxfl.scheduler.pool import IdleClients
from jaxfl.scheduler.simulation import DispatchRecord, Policy, Simulation, local_steps_of

SELECTION_STREAM = 3  # SeedSequence([seed, SELECTION_STREAM]) draws the clients of each round


class FedAvg(Policy):
    """Synchronous FedAvg; see the module docstring for the pseudocode.

    ``round_timeout`` (virtual seconds, None = wait for everyone): at the deadline the round
    aggregates whatever arrived, an update arriving exactly at it included (weights renormalised
    over the arrivals), and the next round starts; an update of a closed round is dropped
    ("arrived after round deadline"). A round only takes
    clients that are not still busy with an earlier dispatch (the server does not know which of
    them crashed, so a crashed client is never selected again).
    """

    name = "fedavg"
    priorities = ARRIVALS_FIRST  # an update arriving exactly at the round's deadline is on time

    def __init__(self, local_steps: int, clients_per_round: int | None = None, seed: int = 0,
                 round_timeout: float | None = None):
        if round_timeout is not None and not round_timeout > 0:
            raise ValueError(f"round_timeout={round_timeout!r} is not allowed: virtual seconds > 0, or None")
        self.local_steps = local_steps
        self.clients_per_round = clients_per_round
        self.round_timeout = round_timeout
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, SELECTION_STREAM]))
        self._round: dict[int, DispatchRecord] = {}  # dispatch id → record, the open round
        self._arrived: list[DispatchRecord] = []
        self._idle: IdleClients | None = None  # the clients not out with a dispatch (built at the first round)
        self._rounds = 0
        self._timer = None

    def __setstate__(self, state: dict) -> None:
        state.setdefault("_idle", None)  # checkpoints from before it kept a set of the busy clients, _busy
        self.__dict__.update(state)

    def start(self, sim: Simulation) -> None:
        self._start_round(sim)

    def _idle_clients(self, sim: Simulation) -> IdleClients:
        if self._idle is None:  # the first round, or a checkpoint's busy set from before IdleClients
            self._idle = IdleClients(sim.num_clients, self.__dict__.pop("_busy", ()))
        return self._idle

    def _start_round(self, sim: Simulation) -> None:
        idle = self._idle_clients(sim)
        if not len(idle):
            return  # everyone is still busy with a closed round: start when one comes back
        cohort = self.clients_per_round or sim.num_clients
        # a sample costs O(cohort · log clients), not a scan of the federation: the draws of
        # rng.choice(sorted idle clients, cohort, replace=False), sorted
        selected = idle.in_order() if cohort >= len(idle) else idle.sample(self._rng, cohort)
        records = [sim.dispatch(client, local_steps_of(self.local_steps, client)) for client in selected]
        self._round = {r.id: r for r in records}
        for client in selected:
            idle.remove(client)
        self._arrived = []
        self._rounds += 1
        if self.round_timeout is not None:
            self._timer = sim.set_timer(sim.now + self.round_timeout, self._rounds)

    def on_arrival(self, sim: Simulation, record: DispatchRecord) -> None:
        self._idle_clients(sim).add(record.client)
        if record.id not in self._round:  # its round closed at the deadline without it
            sim.drop(record, "arrived after round deadline")
            if not self._round:
                self._start_round(sim)
            return
        self._arrived.append(record)
        if len(self._arrived) == len(self._round):  # the round waited for its slowest client
            if self._timer is not None:
                sim.cancel(self._timer)
            self._finish_round(sim)

    def on_timer(self, sim: Simulation, payload) -> None:
        self._timer = None
        if payload == self._rounds:  # the deadline
            later = sim.due_by_rounding(self._round.values())
            if later is not None:  # on time in exact arithmetic, rounded past the deadline: waited for
                self._timer = sim.set_timer(later, [self._rounds, "rounding"])
                return
            self._finish_round(sim)
        elif payload == [self._rounds, "rounding"]:
            self._finish_round(sim)

    def _finish_round(self, sim: Simulation) -> None:
        arrived = sim.screen(sorted(self._arrived, key=lambda r: r.id))  # p_i over the finite updates
        self._round, self._arrived, self._timer = {}, [], None
        if arrived:
            weights = sim.client_weights[[r.client for r in arrived]]
            total = weights.sum()  # once: a round of 10^5 clients summed it 10^5 times
            sim.aggregate([(r.id, w / total) for r, w in zip(arrived, weights)])
        self._start_round(sim)


@register
class FedAvgAlgorithm(Algorithm):
    """FedAvg (McMahan et al. 2017): synchronous rounds, Σ p_i Δ_i through the server optimiser."""

    name = "fedavg"
    kind = "synchronous"
    reads = frozenset({"clients_per_round", "round_timeout"})
    waits_for_clients = "every client of a round"
    per_client_steps = True
    summary = "synchronous rounds of the selected clients (McMahan et al. 2017)"

    def policy(self) -> FedAvg:
        return FedAvg(self.local_steps, self.run.clients_per_round, seed=self.run.seed,
                      round_timeout=self.run.round_timeout)


@register
class FedAvgM(FedAvgAlgorithm):
    """FedAvgM (Hsu et al. 2019): FedAvg with server momentum 0.9 (FedCompass's baselines, Li et al., ICLR 2024, Table 12)."""

    name = "fedavgm"
    server_momentum = 0.9
    summary = "FedAvg with server momentum (Hsu et al. 2019)"

    @classmethod
    def validate(cls, run, options) -> None:
        from jaxfl.config import fail

        if run.server_optimizer != "sgd":
            fail("server_optimizer", run.server_optimizer, "sgd for fedavgm (FedAvgM is SGD with momentum)")
