"""CC-FedAvg (Zhang et al., IEEE IoT Journal 2024): computationally customised FedAvg.

Paper: Sec. III-B and Algorithm 1 (the method), Sec. VI (budgets, schedules and baselines); the
authors' code (benjiachong/ccfedavg) where the paper is silent. Every client i has a compute budget p_i, the fraction of rounds in which it trains;
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
  (nobody trained: the model stays, and the round is a version all the same, as every round is);
- ``"strategy2"``: a skipping client sends its last trained *model* x^i_last (update x^i_last − x_t);
- ``"cc_c"``: CC-FedAvg(c), Strategy 3 before round ``switch_round`` (τ = 100), Strategy 2 after;
- ``"dropout"``: FedAvg(dropout), client i trains in every round while p_i·T ≥ t, then leaves for
  good; the mean runs over the active clients; once every client has left, the run stops (``sim.stop``);
- ``"fednova"``: every selected client trains every round with ⌈p_i K⌉ steps (paper; ⌊p_i K⌋ ≥ 1 in
  the code) and the aggregate is FedNova-normalised (the payload asks for
  :class:`~jaxfl.algorithms.wrappers.StepNormalization`).

FedAvg (full) is the ``fedavg`` algorithm (every p_i = 1 here gives the same parameters).
A skipping client is not dispatched: it costs no training compute, its banked update is added on
device (the :class:`UpdateBanks` hook over :mod:`jaxfl.kernels.ccfedavg`; the banks are per-client
tables that the engine keeps on the device, in host RAM or in a memmap, :mod:`jaxfl.client_state`),
and the round lasts as
long as its slowest *training* client. A round in which nobody trains ends after one transfer time.

``diagnostic=True`` adds :class:`EstimateDiagnostic`: the estimating clients are also trained, on
the side, to log how far each estimate is from the update it replaces (the paper's Fig. 2).

Faults (as :class:`~jaxfl.algorithms.fedavg.FedAvg`): with ``round_timeout`` a round closes at its
deadline with the updates that arrived (a client that did not return counts as absent, not as a
skipper); a later arrival is dropped ("arrived after round deadline"); a client still out with a
closed round's dispatch is not selected.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Sequence

import numpy as np

from jaxfl.algorithms.base import Algorithm, DeviceHook, Options, register
from jaxfl.algorithms.fedavg import SELECTION_STREAM
from jaxfl.algorithms.wrappers import StepNormalization
from jaxfl.scheduler.clock import ARRIVALS_FIRST
from jaxfl.scheduler.pool import IdleClients
from jaxfl.scheduler.simulation import DispatchRecord, Policy, Simulation, local_steps_of

SCHEDULE_STREAM = 22  # SeedSequence([seed, SCHEDULE_STREAM]) draws the ad-hoc train/skip flags
STRATEGIES = ("cc", "strategy1", "strategy2", "cc_c", "dropout", "fednova")
SCHEDULES = ("adhoc", "round_robin")
BUDGETS = ("levels", "two_group")
NOVA_STEPS = ("ceil", "floor")
BANK_KINDS = ("delta", "model")  # D_i, the last trained update; x_i, the last trained model
ESTIMATING_STRATEGIES = ("cc", "strategy2", "cc_c")  # skipping clients send an estimate, not nothing


class BankedUpdates(NamedTuple):
    """Payload of a CC-FedAvg round: banked updates of the skipping clients, (client, c) pairs, of
    bank ``kind`` ("delta": c·D_i; "model": c·(w − x_i)); the banks this round's updates are written
    to (``store``); whether the aggregate is FedNova-normalised (the FedNova baseline); and, with the
    estimate diagnostic on, the (client, client_round, steps, lr_scale) of the skipping clients to train
    anyway (``diagnose``; their next dispatch's round and learning-rate scale, so the minibatches and
    step sizes they would use now)."""

    bank: tuple[tuple[int, float], ...]
    kind: str = "delta"
    store: tuple[str, ...] = ()
    normalize_steps: bool = False
    diagnose: tuple[tuple[int, int, int, float], ...] = ()

    def check(self, sim, contributions) -> None:
        if self.kind not in BANK_KINDS or not set(self.store) <= set(BANK_KINDS):
            raise ValueError(f"bank kind {self.kind!r} / store {self.store} must name {' or '.join(BANK_KINDS)} banks")
        for client, coefficient in self.bank:
            if not 0 <= client < sim.num_clients or not math.isfinite(coefficient):
                raise ValueError(f"bank contribution ({client}, {coefficient}) needs a client in range and a finite c")
        banked = {client for client, _ in self.bank}
        for client, client_round, steps, lr_scale in self.diagnose:
            if client not in banked or client_round < 0 or steps < 1 or not lr_scale > 0:
                raise ValueError(f"diagnosed client ({client}, round {client_round}, {steps} steps) must be a banked "
                                 "client with a round >= 0, steps >= 1 and a positive learning-rate scale")


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
    priorities = ARRIVALS_FIRST  # an update arriving exactly at the round's deadline is on time

    def __init__(self, local_steps: int, budgets: Sequence[float], schedule: str = "adhoc", strategy: str = "cc",
                 switch_round: int = 100, total_rounds: int = 400, clients_per_round: int | None = None,
                 nova_steps: str = "ceil", seed: int = 0, round_timeout: float | None = None,
                 diagnostic: bool = False):
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
        self.diagnostic = diagnostic  # ask the device for the skipping clients' true updates (EstimateDiagnostic)
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
        # the clients not out with a dispatch (possibly of a closed round), built at the first round
        self._idle: IdleClients | None = None
        self._budget_array: np.ndarray | None = None  # the budgets as an array (built at the first round)
        self.history: list[tuple[int, list[int], list[int]]] = []  # (round, selected, trained clients)
        self.gradient_steps = 0  # Σ steps of the dispatches made (trained clients only)
        self.skipped = 0  # banked updates re-sent instead of training

    def __setstate__(self, state: dict) -> None:
        state.setdefault("_idle", None)  # checkpoints from before it kept a set of the busy clients, _busy
        state.setdefault("_budget_array", None)
        self.__dict__.update(state)

    def _idle_clients(self, sim: Simulation) -> IdleClients:
        if self._idle is None:  # the first round, or a checkpoint's busy set from before IdleClients
            self._idle = IdleClients(sim.num_clients, self.__dict__.pop("_busy", ()))
        return self._idle

    # ------------------------------------------------------------------ schedule
    def train_flags(self, t: int) -> np.ndarray:
        """This round's schedule for every client (drawn for all N, selected or not, §3.2)."""
        if self._budget_array is None:  # once, not a list of 10^6 floats converted every round
            self._budget_array = np.asarray(self.budgets)
        p = self._budget_array
        if self.schedule == "adhoc":
            return self._flags.random(len(p)) < p
        periods = np.maximum(np.rint(1.0 / p).astype(np.int64), 1)
        return t % periods == 0  # phases aligned at t = 0, as in the code

    def steps_for(self, client: int) -> int:
        local_steps = local_steps_of(self.local_steps, client)
        if self.strategy != "fednova":
            return local_steps
        steps = self.budgets[client] * local_steps
        return max(1, math.ceil(steps - 1e-9) if self.nova_steps == "ceil" else math.floor(steps + 1e-9))

    # ------------------------------------------------------------------ server loop
    def start(self, sim: Simulation) -> None:
        if len(self.budgets) != sim.num_clients:
            raise ValueError(f"{len(self.budgets)} compute budgets for {sim.num_clients} clients")
        self.has_history = [False] * sim.num_clients
        self._start_round(sim)

    def _start_round(self, sim: Simulation) -> None:
        t = self.round
        idle = self._idle_clients(sim)
        if not len(idle):
            self._open = False
            return  # everyone is out with a closed round: start when one comes back
        cohort = self.clients_per_round or sim.num_clients
        # FedAvg's selection: the draws of rng.choice(sorted idle clients, cohort, replace=False), sorted
        selected = idle.in_order() if cohort >= len(idle) else idle.sample(self._selection, cohort)
        flags = self.train_flags(t)
        if self.strategy == "dropout" and float(self._budget_array.max()) * self.total_rounds < t:
            self._open = False  # nobody trains again: the rounds to come would change nothing, at no cost of time
            sim.stop(f"every client's FedAvg(dropout) quota p_i·T is used up (T = {self.total_rounds} rounds, "
                     f"largest p_i {float(self._budget_array.max()):g}): no client trains in round {t} or after")
            return
        if self.strategy == "dropout":
            selected = [i for i in selected if self.budgets[i] * self.total_rounds >= t]  # quota in absolute rounds
            training = selected
        elif self.strategy == "fednova":
            training = selected
        else:
            training = [i for i in selected if flags[i] or not self.has_history[i]]
        self.selected = selected
        trained = set(training)
        self.skipping = [i for i in selected if i not in trained] if self.strategy != "strategy1" else []
        self._round = [sim.dispatch(i, self.steps_for(i), detail=f"round {t}").id for i in training]
        for client in training:
            idle.remove(client)
        self._arrived = []
        self._open = True
        self._opened += 1
        self.gradient_steps += sum(self.steps_for(i) for i in training)
        self.history.append((t, selected, list(training)))
        if not self._round:  # nobody trains: the estimates (or skip bits) take one transfer, the slowest's
            transfer = max((sim.speeds.comm_time(client) / 2 for client in selected), default=0.0) \
                if getattr(sim.speeds, "comm_varies", False) else sim.speeds.comm_time() / 2
            sim.set_timer(sim.now + transfer, {"round": self._opened})
        elif self.round_timeout is not None:
            self._timer = sim.set_timer(sim.now + self.round_timeout, {"round": self._opened})

    def on_arrival(self, sim: Simulation, record: DispatchRecord) -> None:
        self._idle_clients(sim).add(record.client)
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
            later = None if payload.get("rounding") else sim.due_by_rounding(
                sim.records.live[d] for d in self._round if d in sim.records.live)
            if later is not None:  # on time in exact arithmetic, rounded past the deadline: waited for
                self._timer = sim.set_timer(later, {"round": self._opened, "rounding": True})
                return
            self._aggregate(sim)

    def _aggregate(self, sim: Simulation) -> None:
        records = sim.screen([sim.records[d] for d in sorted(self._arrived)])  # p_i over the finite updates
        weights = sim.client_weights
        members = [r.client for r in records] + self.skipping  # the denominator's clients
        total = float(sum(weights[i] for i in members)) or 1.0
        contributions = [(r.id, weights[r.client] / total) for r in records]
        bank = [(i, weights[i] / total) for i in self.skipping]
        kind = "model" if self.strategy == "strategy2" or (self.strategy == "cc_c" and self.round >= self.switch_round) \
            else "delta"
        store = stored_banks(self.strategy)
        self.skipped += len(bank)
        diagnose = tuple((i, int(sim.client_rounds[i]), self.steps_for(i), sim.next_lr_scale(i))
                         for i in self.skipping) \
            if self.diagnostic else ()
        if contributions or bank:
            sim.aggregate(contributions, payload=BankedUpdates(tuple(bank), kind, store, self.strategy == "fednova",
                                                               diagnose))
        elif not self._round:
            # nobody was to train (Strategy 1's skipping clients, FedAvg(dropout)'s spent quotas): still one
            # of the paper's T rounds, with the global model unchanged, so a version as every round is
            sim.aggregate([], server_optimizer=False)
        # else every update of the round came after its deadline: no round of the paper's, and nothing changes
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


def stored_banks(strategy: str) -> tuple[str, ...]:
    """The banks a strategy writes (and so keeps, one row per client)."""
    return {"cc": ("delta",), "strategy2": ("model",), "cc_c": ("delta", "model")}.get(strategy, ())


class UpdateBanks(DeviceHook):
    """CC-FedAvg's per-client banks: ``"delta"`` D_i (last trained update) and ``"model"`` x^i_last
    (last trained model), each a per-client table of model-shaped rows (``init_per_client``: on the
    device while they fit, else in host RAM or a memmap). The skipping clients' banked term is added
    to the pseudo-gradient from their rows alone; after the update the trained clients' rows are
    rewritten. Only the rows of one round's clients are ever on the device, padded to a power of two
    (zero weight) so one compilation serves every round of a bucket."""

    name = "ccfedavg_banks"

    def __init__(self, kinds: Sequence[str]):
        self.kinds = tuple(kinds)

    def init_per_client(self, params):
        import jax
        import jax.numpy as jnp

        return {kind: jax.tree.map(jnp.zeros_like, params) for kind in self.kinds} or None

    def keeps_per_client_state(self) -> bool:
        return bool(self.kinds)

    def tables_from_state(self, state):
        # jaxfl before jaxfl.client_state kept the banks as this hook's state: {kind: C-stacked model}
        return dict(state)

    def extra_pseudo_gradient(self, ctx, aggregation, records):
        payload = aggregation.payload
        if not isinstance(payload, BankedUpdates) or not payload.bank:
            return None
        import jax.numpy as jnp

        from jaxfl.execution import bucket_size
        from jaxfl.kernels import ccfedavg as kernels

        weights = {}
        for client, coefficient in payload.bank:
            weights[client] = weights.get(client, 0.0) + coefficient
        clients = sorted(weights)  # ascending, as the full bank's weighted sum ran over them
        padded = bucket_size(len(clients))
        rows = ctx.client_rows(self.name, payload.kind, clients + [clients[0]] * (padded - len(clients)))
        row_weights = jnp.asarray(np.array([weights[c] for c in clients] + [0.0] * (padded - len(clients)),
                                           np.float32))
        if payload.kind == "delta":
            return ctx.jit("bank_delta_sum", kernels.bank_delta_sum)(rows, row_weights)
        return ctx.jit("bank_model_sum", kernels.bank_model_sum)(rows, row_weights, ctx.params)

    def after_update(self, ctx, aggregation, records):
        payload = aggregation.payload
        if not isinstance(payload, BankedUpdates) or not payload.store or not records:
            return
        from jaxfl.execution import bucket_size
        from jaxfl.kernels import ccfedavg as kernels

        newest = {record.client: record for record in sorted(records, key=lambda r: r.id)}
        chosen = list(newest.values())
        count = len(chosen)
        padded = bucket_size(count)
        pad = lambda trees: tuple(trees) + (trees[0],) * (padded - count)  # as Engine.stack pads
        deltas = pad([ctx.delta(r) for r in chosen])
        # the banked rows stacked (and the models start − Δ formed) in one jitted program, not by an
        # eager op per parameter leaf
        starts = pad([ctx.start_model(r) for r in chosen]) if "model" in payload.store else None
        rows = ctx.jit("bank_rows", kernels.bank_rows)(deltas, starts)
        clients = np.array([r.client for r in chosen] + [0] * (padded - count), np.int32)
        valid = np.arange(padded) < count
        for kind in payload.store:
            ctx.set_client_rows(self.name, kind, clients, rows[kind], valid)


class EstimateDiagnostic(DeviceHook):
    """How good the skipping clients' estimates are (CC-FedAvg, Zhang et al., IEEE IoT Journal 2024,
    Fig. 2): in each round, the clients that estimate (Strategy 3's D_i, Strategy 2's stale model)
    are also trained from the current model x_t as their next dispatch would be
    (:meth:`~jaxfl.engine.Engine.train_detached`), and the estimate is compared with that true update:
    one row per round and estimating client in ``ccfedavg_estimates.csv`` (version, time, client,
    estimate kind, relative L2 error ‖Δ̂ − Δ‖/‖Δ‖, cosine, both norms; trainable parameters only).
    The true updates are computed and dropped: the run's trajectory is unchanged, and its cost is the
    training that Strategy 3 saves."""

    name = "ccfedavg_diagnostic"
    table = "ccfedavg_estimates"

    def extra_pseudo_gradient(self, ctx, aggregation, records):
        payload = aggregation.payload
        if not isinstance(payload, BankedUpdates) or not payload.diagnose:
            return None
        import jax

        from jaxfl.kernels import ccfedavg as kernels

        clients, client_rounds, steps, lr_scales = (list(column) for column in zip(*payload.diagnose))
        truths = ctx.train_detached(ctx.params, clients, client_rounds, steps, lr_scales)
        rows = ctx.client_rows(UpdateBanks.name, payload.kind, clients)
        # engine sign (start − final): Strategy 3's estimate is D_i, Strategy 2's is x_t − x^i_last,
        # formed inside the jitted comparison (trainable parameters only, as the figures are)
        current = ctx.trainable(ctx.params) if payload.kind == "model" else None
        figures = jax.device_get(ctx.jit("estimation_error", kernels.banked_estimation_error)(
            ctx.trainable(rows), ctx.trainable(truths), current))
        for index, client in enumerate(clients):
            ctx.record_row(self.table, {
                "version": aggregation.version, "time": aggregation.time, "client": client,
                "client_round": client_rounds[index], "estimate": payload.kind,
                **{name: float(values[index]) for name, values in figures.items()}})
        return None


# The options read under one strategy or budget only: what reads each (CCFedAvgConfig.validate refuses
# a value given where it is never read).
CC_OPTION_READERS = {"switch_round": "cc.strategy='cc_c' (CC-FedAvg(c)'s switch to Strategy 2)",
                     "total_rounds": "cc.strategy='dropout' (FedAvg(dropout)'s quota p_i·T)",
                     "nova_steps": "cc.strategy='fednova' (the FedNova baseline's ⌈p_i K⌉ or ⌊p_i K⌋ steps)",
                     "schedule": "cc.strategy cc, strategy1, strategy2 and cc_c (dropout and fednova train "
                                 "every selected client)",
                     "budget_beta": "cc.budget='levels' (β budget levels)",
                     "insufficient_fraction": "cc.budget='two_group' (the (r, W) model's r)",
                     "window": "cc.budget='two_group' (the (r, W) model's W)"}


@dataclasses.dataclass(frozen=True)
class CCFedAvgConfig(Options):
    """CC-FedAvg's options (Zhang et al., IEEE IoT Journal 2024, Sec. III and VI)."""

    namespace = "cc"

    strategy: str = "cc"  # cc (Strategy 3) | strategy1 | strategy2 | cc_c | dropout | fednova
    budget: str = "levels"  # levels: p_i = (1/2)^floor(β i / N) | two_group: the (r, W) model
    budget_beta: int = 4  # β budget levels (4 in every main table of the paper)
    insufficient_fraction: float = 0.75  # r of two_group (β = 4 levels give r ≈ 0.75)
    window: int = 4  # W of two_group: an insufficient client's p = 1/W
    schedule: str = "adhoc"  # adhoc: Bernoulli(p_i) each round (paper default) | round_robin: t mod 1/p_i = 0
    switch_round: int = 100  # τ of CC-FedAvg(c): Strategy 3 before, Strategy 2 from this round
    total_rounds: int | None = None  # T of FedAvg(dropout)'s quota p_i·T; unset: max_updates or 400 (paper)
    nova_steps: str = "ceil"  # fednova baseline steps: ceil(p_i K) (paper) | floor (code)
    diagnostic: bool = False  # also train the estimating clients and log each estimate's relative error and cosine per round (ccfedavg_estimates.csv; costs that training)

    def budgets(self, num_clients: int) -> list[float]:
        """p_i: β levels (paper's main tables) or the two-group (r, W) model."""
        if self.budget == "two_group":
            return two_group_budgets(num_clients, self.insufficient_fraction, self.window)
        return level_budgets(num_clients, self.budget_beta)

    def validate(self, run) -> None:
        from jaxfl.config import fail

        for name, allowed in (("strategy", STRATEGIES), ("budget", BUDGETS), ("schedule", SCHEDULES),
                              ("nova_steps", NOVA_STEPS)):
            if getattr(self, name) not in allowed:
                fail(f"cc.{name}", getattr(self, name), f"one of {', '.join(allowed)}")
        for name in ("budget_beta", "window", "total_rounds"):
            value = getattr(self, name)
            if value is not None and value < 1:
                fail(f"cc.{name}", value, "an integer >= 1")
        if not 0 <= self.insufficient_fraction <= 1:
            fail("cc.insufficient_fraction", self.insufficient_fraction, "a fraction r in [0, 1]")
        if self.switch_round < 0:
            fail("cc.switch_round", self.switch_round, "a round index >= 0")
        if getattr(run, "fednova", False) and stored_banks(self.strategy):
            # FedNova's τ_eff and 1/‖a_i‖₁ would cover the clients that trained, while the banked
            # updates (or models) re-sent by the skipping clients came from other rounds' steps and
            # were added at their raw weight: a banked 12-step update pulled 34 % harder than FedNova allows
            fail("fednova", run.fednova, f"leave it false with cc.strategy {self.strategy!r}: its skipping clients "
                                         "re-send banked updates from earlier rounds, which FedNova cannot normalise "
                                         "(it would weigh only the clients that trained); --fednova applies with "
                                         "cc.strategy strategy1 or dropout, and cc.strategy fednova is the paper's "
                                         "FedNova baseline")
        for name, read, where in (("switch_round", self.strategy == "cc_c", f"strategy is {self.strategy!r}"),
                                  ("total_rounds", self.strategy == "dropout", f"strategy is {self.strategy!r}"),
                                  ("nova_steps", self.strategy == "fednova", f"strategy is {self.strategy!r}"),
                                  ("schedule", self.strategy not in ("dropout", "fednova"),
                                   f"strategy is {self.strategy!r}"),
                                  ("budget_beta", self.budget == "levels", f"budget is {self.budget!r}"),
                                  ("insufficient_fraction", self.budget == "two_group", f"budget is {self.budget!r}"),
                                  ("window", self.budget == "two_group", f"budget is {self.budget!r}")):
            if not read and getattr(self, name) != getattr(CCFedAvgConfig, name):
                fail(f"cc.{name}", getattr(self, name), f"only with {CC_OPTION_READERS[name]}; this run's {where}")
        if self.diagnostic and self.strategy not in ESTIMATING_STRATEGIES:
            fail("cc.diagnostic", True, f"leave it false for strategy {self.strategy!r}: no client estimates its update there "
                                        f"(strategies {', '.join(ESTIMATING_STRATEGIES)} estimate)")
        if self.diagnostic and run.timing_only:
            fail("cc.diagnostic", True, "false in a timing-only run (it trains nothing to compare with)")


@register
class CCFedAvgAlgorithm(Algorithm):
    """CC-FedAvg (Zhang et al. 2024): budgeted clients re-send their last update instead of training."""

    name = "ccfedavg"
    kind = "synchronous"
    reads = frozenset({"clients_per_round", "round_timeout"})
    Options = CCFedAvgConfig
    waits_for_clients = "clients (rounds, K arrivals, stale clients or concurrency slots)"
    per_client_steps = True
    summary = "compute budgets, skipping clients re-send banked updates (Zhang et al. 2024)"

    def policy(self) -> CCFedAvg:
        o, run = self.options, self.run
        return CCFedAvg(self.local_steps, o.budgets(run.clients), o.schedule, o.strategy, o.switch_round,
                        o.total_rounds or run.max_updates or 400, run.clients_per_round, o.nova_steps,
                        seed=run.seed, round_timeout=run.round_timeout, diagnostic=o.diagnostic)

    def hooks(self):
        hooks = (UpdateBanks(stored_banks(self.options.strategy)),)
        if self.options.diagnostic:
            hooks += (EstimateDiagnostic(),)
        return hooks + ((StepNormalization(),) if self.options.strategy == "fednova" else ())
