"""FedAvg (McMahan et al. 2017) and FedAvgM (Hsu et al. 2019): synchronous rounds.

Server loop, as in the FedCompass authors' framework (spec fedcompass.md §4)::

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

from jaxfl.scheduler.simulation import DispatchRecord, Policy, Simulation

SELECTION_STREAM = 3  # SeedSequence([seed, SELECTION_STREAM]) draws the clients of each round


class FedAvg(Policy):
    """Synchronous FedAvg; see the module docstring for the pseudocode."""

    name = "fedavg"

    def __init__(self, local_steps: int, clients_per_round: int | None = None, seed: int = 0):
        self.local_steps = local_steps
        self.clients_per_round = clients_per_round
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, SELECTION_STREAM]))
        self._round: list[DispatchRecord] = []
        self._arrived = 0

    def start(self, sim: Simulation) -> None:
        self._start_round(sim)

    def _start_round(self, sim: Simulation) -> None:
        cohort = self.clients_per_round or sim.num_clients
        if cohort >= sim.num_clients:
            selected = range(sim.num_clients)
        else:
            selected = np.sort(self._rng.choice(sim.num_clients, size=cohort, replace=False))
        self._round = [sim.dispatch(int(client), self.local_steps) for client in selected]
        self._arrived = 0

    def on_arrival(self, sim: Simulation, record: DispatchRecord) -> None:
        self._arrived += 1
        if self._arrived < len(self._round):
            return  # the round waits for its slowest client
        weights = sim.client_weights[[r.client for r in self._round]]
        sim.aggregate([(r.id, w / weights.sum()) for r, w in zip(self._round, weights)])
        self._start_round(sim)
