"""CC-FedAvg (Zhang et al., IEEE IoT Journal 2024): computationally customised FedAvg.

Spec: ``shared/specs/ccfedavg.md`` §2 (Algorithm 1), §3 (budgets and schedules), §4 (baselines),
§8 (pitfalls). Every client i has a compute budget p_i, the fraction of rounds in which it trains;
in the other rounds it re-sends its last trained update instead of training (Algorithm 1)::

    for t = 0, 1, ...:
        S_t ← the selected clients (all, or a seeded sample as in FedAvg)
        for i ∈ S_t:
            train_i ← schedule_i(t) or i has no stored update  # ad-hoc: Bernoulli(p_i) drawn for all
                                                              # N every round; round-robin: t mod 1/p_i = 0
            if train_i: Δ_i ← K local steps from x_t ; D_i ← Δ_i   # costs K gradient steps
            else:       Δ_i ← D_i                                # Strategy 3: costs no compute
        x_{t+1} ← x_t + Σ_{i∈S_t} p'_i Δ_i,  p'_i = n_i / Σ_{j∈S_t} n_j   # over ALL of S_t

(With equal data sizes or ``client_weights="uniform"`` p'_i = 1/|S_t|, the paper's unweighted mean;
with unequal sizes this weights by data, as jaxfl's FedAvg does [choice].) ``strategy`` selects the
method or a baseline of §4, all under the same budgets and schedule:

- ``"cc"``: CC-FedAvg (Strategy 3), the loop above;
- ``"strategy1"``: skipping clients are dropped, the mean runs over the clients that trained
  (nobody trained: the model stays);
- ``"strategy2"``: a skipping client sends its last trained *model* x^i_last (update x^i_last − x_t);
- ``"cc_c"``: CC-FedAvg(c), Strategy 3 before round ``switch_round`` (τ = 100), Strategy 2 after;
- ``"dropout"``: FedAvg(dropout), client i trains in every round while p_i·T ≥ t, then leaves for
  good; the mean runs over the active clients;
- ``"fednova"``: every selected client trains every round with ⌈p_i K⌉ steps (paper; ⌊p_i K⌋ ≥ 1 in
  the code) and the aggregate is FedNova-normalised (``weighting="fednova"``).

FedAvg (full) is the ``fedavg`` algorithm (every p_i = 1 here gives the same parameters).
A skipping client is not dispatched: it costs no training compute, its banked update is added on
device (engine update banks, :mod:`jaxfl.kernels.ccfedavg`), and the round lasts as long as its
slowest *training* client. A round in which nobody trains ends after one transfer time.

Faults (as :class:`~jaxfl.algorithms.fedavg.FedAvg`): with ``round_timeout`` a round closes at its
deadline with the updates that arrived (a client that did not return counts as absent, not as a
skipper); a later arrival is dropped ("arrived after round deadline"); a client still out with a
closed round's dispatch is not selected.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from jaxfl.algorithms.fedavg import SELECTION_STREAM
from jaxfl.scheduler.simulation import DispatchRecord, Policy, Simulation

SCHEDULE_STREAM = 22  # SeedSequence([seed, SCHEDULE_STREAM]) draws the ad-hoc train/skip flags
STRATEGIES = ("cc", "strategy1", "strategy2", "cc_c", "dropout", "fednova")
SCHEDULES = ("adhoc", "round_robin")
BUDGETS = ("levels", "two_group")
NOVA_STEPS = ("ceil", "floor")


def level_budgets(num_clients: int, beta: int) -> list[float]:
    """p_i = (1/2)^⌊β i / N⌋ with 0-based i: β equal groups with p ∈ {1, 1/2, ..., (1/2)^(β−1)} (§3.1).

    >>> level_budgets(8, 4)
    [1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.125, 0.125]
    """
    if beta < 1:
        raise ValueError(f"cc_budget_beta={beta} is not allowed: an integer >= 1")
    return [0.5 ** math.floor(beta * i / num_clients) for i in range(num_clients)]


def two_group_budgets(num_clients: int, fraction: float, window: int) -> list[float]:
    """The (r, W) model (§3.3): the last round(r·N) clients have p = 1/W, the others p = 1.

    >>> two_group_budgets(4, 0.5, 4)
    [1.0, 1.0, 0.25, 0.25]
    """
    if not 0 <= fraction <= 1 or window < 1:
        raise ValueError(f"two-group budgets need r in [0, 1] and W >= 1, got r={fraction}, W={window}")
    insufficient = round(fraction * num_clients)
    return [1.0] * (num_clients - insufficient) + [1.0 / window] * insufficient


class CCFedAvg(Policy):
    """CC-FedAvg and its baselines; see the module docstring."""

    name = "ccfedavg"

    def __init__(self, local_steps: int, budgets: Sequence[float], schedule: str = "adhoc", strategy: str = "cc",
                 switch_round: int = 100, total_rounds: int = 400, clients_per_round: int | None = None,
                 nova_steps: str = "ceil", seed: int = 0, round_timeout: float | None = None):
        if round_timeout is not None and not round_timeout > 0:
            raise ValueError(f"round_timeout={round_timeout!r} is not allowed: virtual seconds > 0, or None")
        for name, value, allowed in (("cc_schedule", schedule, SCHEDULES), ("cc_strategy", strategy, STRATEGIES),
                                     ("cc_nova_steps", nova_steps, NOVA_STEPS)):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not allowed: one of {', '.join(allowed)}")
        budgets = [float(p) for p in budgets]
        if not budgets or not all(0 < p <= 1 for p in budgets):
            raise ValueError(f"compute budgets p_i must lie in (0, 1], got {budgets}")
        self.local_steps = local_steps
        self.budgets = budgets
        self.schedule = schedule
        self.strategy = strategy
        self.switch_round = switch_round
        self.total_rounds = total_rounds
        self.clients_per_round = clients_per_round
        self.nova_steps = nova_steps
        self.round_timeout = round_timeout
        # Strategy 2 needs the clients' last models (start − Δ), hence their start versions.
        self.needs_start_models = strategy in ("strategy2", "cc_c")
        self._selection = np.random.default_rng(np.random.SeedSequence([seed, SELECTION_STREAM]))
        self._flags = np.random.default_rng(np.random.SeedSequence([seed, SCHEDULE_STREAM]))
        self.round = 0
        self.has_history: list[bool] = []
        self.selected: list[int] = []
        self.skipping: list[int] = []
        self._round: list[int] = []  # dispatch ids of the clients training this round
        self._arrived: list[int] = []  # those of them that arrived
        self._open = False  # a round is running
        self._opened = 0  # rounds opened (timer payloads name the round they belong to)
        self._timer = None
        self._busy: set[int] = set()  # clients out with a dispatch (possibly of a closed round)
        self.history: list[tuple[int, list[int], list[int]]] = []  # (round, selected, trained clients)
        self.gradient_steps = 0  # Σ steps of the dispatches made (trained clients only)
        self.skipped = 0  # banked updates re-sent instead of training

    # ------------------------------------------------------------------ schedule
    def train_flags(self, t: int) -> np.ndarray:
        """This round's schedule for every client (drawn for all N, selected or not, §3.2)."""
        p = np.asarray(self.budgets)
        if self.schedule == "adhoc":
            return self._flags.random(len(p)) < p
        periods = np.maximum(np.rint(1.0 / p).astype(np.int64), 1)
        return t % periods == 0  # phases aligned at t = 0, as in the code

    def steps_for(self, client: int) -> int:
        if self.strategy != "fednova":
            return self.local_steps
        steps = self.budgets[client] * self.local_steps
        return max(1, math.ceil(steps - 1e-9) if self.nova_steps == "ceil" else math.floor(steps + 1e-9))

    # ------------------------------------------------------------------ server loop
    def start(self, sim: Simulation) -> None:
        if len(self.budgets) != sim.num_clients:
            raise ValueError(f"{len(self.budgets)} compute budgets for {sim.num_clients} clients")
        self.has_history = [False] * sim.num_clients
        self._start_round(sim)

    def _start_round(self, sim: Simulation) -> None:
        t = self.round
        idle = [c for c in range(sim.num_clients) if c not in self._busy]
        if not idle:
            self._open = False
            return  # everyone is out with a closed round: start when one comes back
        cohort = self.clients_per_round or sim.num_clients
        if cohort >= len(idle):
            selected = idle
        else:  # the same draws as FedAvg's selection
            selected = [int(c) for c in np.sort(self._selection.choice(idle, size=cohort, replace=False))]
        flags = self.train_flags(t)
        if self.strategy == "dropout":
            selected = [i for i in selected if self.budgets[i] * self.total_rounds >= t]  # quota in absolute rounds
            training = selected
        elif self.strategy == "fednova":
            training = selected
        else:
            training = [i for i in selected if flags[i] or not self.has_history[i]]
        self.selected = selected
        self.skipping = [i for i in selected if i not in set(training)] if self.strategy != "strategy1" else []
        self._round = [sim.dispatch(i, self.steps_for(i), detail=f"round {t}").id for i in training]
        self._busy.update(training)
        self._arrived = []
        self._open = True
        self._opened += 1
        self.gradient_steps += sum(self.steps_for(i) for i in training)
        self.history.append((t, selected, list(training)))
        if not self._round:  # nobody trains: the estimates (or skip bits) take one transfer
            sim.set_timer(sim.now + sim.speeds.comm_time() / 2, {"round": self._opened})
        elif self.round_timeout is not None:
            self._timer = sim.set_timer(sim.now + self.round_timeout, {"round": self._opened})

    def on_arrival(self, sim: Simulation, record: DispatchRecord) -> None:
        self._busy.discard(record.client)
        if record.id not in self._round:  # its round closed at the deadline without it
            sim.drop(record, "arrived after round deadline")
            if not self._open:
                self._start_round(sim)
            return
        self._arrived.append(record.id)
        if len(self._arrived) == len(self._round):
            if self._timer is not None:
                sim.cancel(self._timer)
                self._timer = None
            self._aggregate(sim)

    def on_timer(self, sim: Simulation, payload) -> None:
        if self._open and payload["round"] == self._opened:  # an empty round ends, or the deadline
            self._timer = None
            self._aggregate(sim)

    def _aggregate(self, sim: Simulation) -> None:
        records = [sim.records[d] for d in sorted(self._arrived)]
        weights = sim.client_weights
        members = [r.client for r in records] + self.skipping  # the denominator's clients
        total = float(sum(weights[i] for i in members)) or 1.0
        contributions = [(r.id, weights[r.client] / total) for r in records]
        bank = [(i, weights[i] / total) for i in self.skipping]
        kind = "model" if self.strategy == "strategy2" or (self.strategy == "cc_c" and self.round >= self.switch_round) \
            else "delta"
        store = {"cc": ("delta",), "strategy2": ("model",), "cc_c": ("delta", "model")}.get(self.strategy, ())
        self.skipped += len(bank)
        sim.aggregate(contributions, bank=bank, bank_kind=kind, bank_store=store,
                      weighting="fednova" if self.strategy == "fednova" else None)
        for record in records:
            self.has_history[record.client] = True
        self._round, self._arrived, self._open = [], [], False
        self.round += 1
        self._start_round(sim)

    def summary(self) -> dict:
        """Run statistics for the run summary: compute spent and saved."""
        dispatched = sum(len(trained) for _, _, trained in self.history)
        return {"strategy": self.strategy, "schedule": self.schedule, "rounds_started": len(self.history),
                "trained_updates": dispatched, "banked_updates": self.skipped,
                "gradient_steps_dispatched": self.gradient_steps,
                "mean_budget": round(float(np.mean(self.budgets)), 6)}
