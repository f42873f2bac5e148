"""FedBuff (Nguyen et al. 2022): buffered asynchronous aggregation.

``concurrency`` clients train at once (default ``min(clients, 1000)``, the paper's 1,000 in flight);
each client that reports is answered and a replacement drawn uniformly from the idle clients.

``rule="paper"`` (default, the original FedBuff)::

        b ← b + st(τ_g − τ_i) · Δ_i ;  once K are in: w ← w − η_g · b / K

with η_g the server learning rate (the engine's server optimiser, sgd(η_g)). The step does not
shrink as the federation grows, so FedBuff behaves the same at 10 and at 10^6 clients.

``rule="fedcompass"`` (the FedCompass authors' framework, APPFL's form; Li et al., ICLR 2024)::

    on arrival of Δ_i trained from version τ_i:
        b ← b + st(τ_g − τ_i) · p_i · Δ_i      # staleness taken when the update is buffered
        reply to client i with the current w
        if K updates are buffered: w ← w − b ; τ_g ← τ_g + 1 ; b ← 0   # no 1/K, no server lr

With p_i ≈ 1/C that step vanishes in large federations (at 10^4 clients the model does not move).

``rule="plato"`` (FedBuff as the PORT paper ran it, in PLATO; Su & Li, IWQoS 2022, Section V)::

    once K models w_i are in:  w ← (1/K) · Σ w_i      # equal weights, no staleness, no server lr

a plain average of the clients' final models, each trained from the version it was sent. It is
not the original's delta step: w − (1/K)·Σ Δ_i adds a stale client's progress to the current
model, where the average pulls the model back towards the stale one.

The default staleness function st(s) = α·(s+1)^(−a) has α = 0.9 (FedCompass App. E.2, for every
asynchronous method), so under ``rule="paper"`` a fresh update weighs 0.9/K, not the original's
1/K: ``staleness_alpha=1`` gives the original FedBuff's optional 1/√(1+s) scaling exactly.
A buffer may hold two updates from the same client.
"""
from __future__ import annotations

from typing import Callable

from jaxfl._user_warnings import warn_user
from jaxfl.algorithms.base import Algorithm, note_data_share_steps, register, staleness_function
from jaxfl.scheduler.pool import DEFAULT_CONCURRENCY, InFlightLimit
from jaxfl.scheduler.simulation import DispatchRecord, Policy, Simulation
from jaxfl.scheduler.staleness import StalenessWeights

RULES = ("paper", "fedcompass", "plato")
# client updates' worth of the start's wave, all trained from the initial model, from which it is said
# to push the model far with sign-like (adam) clients: at 1,000 in flight K = 10 (a sum of 17) and
# K = 3 (32) diverged, K = 30 (9) learned (an MLP at 10^5 clients, 2026-12-05 and 07)
FIRST_WAVE_NOTE_WEIGHT = 12


class FedBuff(InFlightLimit, Policy):
    """Buffered asynchronous aggregation; see the module docstring for its three rules (RULES)."""

    name = "fedbuff"

    def __init__(self, local_steps: int, buffer_size: int, staleness: Callable[[int], float],
                 rule: str = "paper", concurrency: int | None = None, seed: int = 0):
        if rule not in RULES:
            raise ValueError(f"unknown FedBuff rule {rule!r}; allowed: {', '.join(RULES)}")
        if buffer_size < 1:
            raise ValueError(f"FedBuff buffer_size must be >= 1, got {buffer_size}")
        self.local_steps = local_steps
        self.buffer_size = buffer_size
        self.staleness = staleness
        self.rule = rule
        self.concurrency = concurrency
        self.seed = seed
        self.buffer: list[tuple[int, float]] = []
        self.needs_start_models = rule == "plato"  # a model average ("mix" mode)
        self._staleness_weights = StalenessWeights(staleness)

    def __setstate__(self, state: dict) -> None:
        # a fresh memo: a pickle keeps none of its values, and older checkpoints have no memo
        state["_staleness_weights"] = StalenessWeights(state["staleness"])
        self.__dict__.update(state)

    def start(self, sim: Simulation) -> None:
        self.start_in_flight(sim)

    def summary(self) -> dict:
        return {"concurrency": self.concurrency, "rule": self.rule}

    def on_arrival(self, sim: Simulation, record: DispatchRecord) -> None:
        if self.rule == "plato":
            weight = 1.0 / self.buffer_size
        else:
            weight = self._staleness_weights[sim.version - record.version]  # st(τ_g − τ_i)
            if self.rule == "fedcompass":
                weight *= sim.client_weights[record.client]
            else:
                weight /= self.buffer_size
        self.buffer.append((record.id, weight))
        sim.reply(record.client)
        if len(self.buffer) >= self.buffer_size:
            kept = {r.id for r in sim.screen([sim.records[d] for d, _ in self.buffer])}
            if len(kept) < len(self.buffer):  # a NaN/Inf update dropped: the buffer waits for K finite ones
                self.buffer = [(d, w) for d, w in self.buffer if d in kept]
                return
            if self.rule == "plato":
                sim.aggregate(self.buffer, mode="mix", server_optimizer=False)
            else:
                sim.aggregate(self.buffer)
            self.buffer = []


@register
class FedBuffAlgorithm(Algorithm):
    """FedBuff (Nguyen et al. 2022): aggregate once K updates are buffered."""

    name = "fedbuff"
    kind = "asynchronous"
    reads = frozenset({"clients_per_round", "buffer_size", "rule", "staleness", "staleness_alpha", "staleness_a"})
    # unset, the rule is the paper's, as it always was: written into the config, so that a run made in
    # Python (rule unset) and one made by `jaxfl demo` or `--rule paper` have one name and reuse each other
    changed_defaults = {"rule": ("paper", "paper")}
    uses_concurrency = True
    per_client_steps = True
    summary = "aggregate every K buffered updates (Nguyen et al. 2022)"

    @classmethod
    def supports_fednova(cls, run) -> bool:
        """Under the rules paper and fedcompass (pseudo-gradients); the rule plato averages models,
        where ``fednova=True`` was accepted and changed nothing.

        >>> from types import SimpleNamespace
        >>> [FedBuffAlgorithm.supports_fednova(SimpleNamespace(rule=r)) for r in (None, "fedcompass", "plato")]
        [True, True, False]
        """
        return (run.rule or "paper") != "plato"

    @classmethod
    def validate(cls, run, options) -> None:
        if (run.rule or "paper") == "fedcompass":
            note_data_share_steps(run, "fedbuff's rule fedcompass")
        if (run.rule or "paper") == "paper":
            note_first_wave(run)

    @classmethod
    def unread_settings(cls, run, options=None) -> dict[str, tuple[str | None, str]]:
        """Under ``rule="paper"`` (the default) an update is weighed st(s)/K: no p_i. Under ``"plato"``
        the K models are averaged with equal weights: no p_i, no staleness function, no server optimiser.

        >>> from types import SimpleNamespace
        >>> FedBuffAlgorithm.unread_settings(SimpleNamespace(rule=None))["client_weights"][0]
        'rule fedcompass'
        >>> sorted(FedBuffAlgorithm.unread_settings(SimpleNamespace(rule="plato")))[:3]
        ['client_weights', 'server_lr', 'server_momentum']
        """
        rule = run.rule or "paper"
        if rule == "fedcompass":
            return {}
        if rule == "paper":
            return {"client_weights": ("rule fedcompass", "fedbuff's rule fedcompass: rule paper, fedbuff's default, "
                                                          "weighs each update by staleness and 1/buffer_size alone")}
        average = "fedbuff's rule plato averages the K models with equal weights 1/K"
        server = ("rule paper or fedcompass", f"fedbuff's rules paper and fedcompass: {average}, without a server "
                                              "optimiser")
        staleness = ("rule paper or fedcompass", f"fedbuff's rules paper and fedcompass: {average}, whatever "
                                                 "their staleness")
        return {"client_weights": ("rule fedcompass", f"fedbuff's rule fedcompass: {average}"),
                "server_optimizer": server, "server_lr": server, "server_momentum": server,
                "staleness": staleness, "staleness_alpha": staleness, "staleness_a": staleness}

    def policy(self) -> FedBuff:
        run = self.run
        return FedBuff(self.local_steps, run.buffer_size, staleness_function(run), rule=run.rule or "paper",
                       concurrency=run.concurrency or run.clients_per_round, seed=run.seed)


def note_first_wave(run) -> None:
    """Say, under the rule paper, when the clients in flight at the start are many per buffered update
    and the clients train with adam or adamw (jaxfl's default adam at 0.003, 50 steps, FedCompass's
    settings for 5-20 clients): every client in flight at t = 0 trains from the initial model, so the
    first in-flight ÷ K aggregations add up updates from that one model, Σ_j st(j) of them (32 at
    1,000 in flight and K = 3; fewer where faster clients' second updates come in between), times the
    server's sgd step (its learning rate, over 1 − β with momentum β), and an adam update moves every
    parameter by up to lr × steps whatever its gradient. An MLP at 10^5 clients went from held-out loss 2.3 to 387 at update 50 in silence.
    Said where that sum reaches 12 within the run's update budgets (not at 150 clients in flight
    with K = 3, whose 50 aggregations sum to 11); not in timing-only runs, which train no model, nor
    under an adaptive server optimiser, which rescales the sum; said again on a resume, which cannot
    tell whether the first wave is over.

    >>> import warnings
    >>> from types import SimpleNamespace
    >>> run = SimpleNamespace(timing_only=False, clients=100_000, concurrency=None, clients_per_round=None,
    ...                       buffer_size=3, client_optimizer="adam", client_lr=0.003, local_steps=50,
    ...                       local_epochs=None, staleness="polynomial", staleness_alpha=0.9, staleness_a=0.5,
    ...                       server_optimizer="sgd", server_lr=1.0, server_momentum=None, max_updates=None,
    ...                       max_client_updates=None, max_client_steps=None)
    >>> with warnings.catch_warnings(record=True) as said:
    ...     warnings.simplefilter("always")
    ...     note_first_wave(run)
    >>> "1,000 clients in flight" in str(said[0].message), "up to about 32 client updates" in str(said[0].message)
    (True, True)
    """
    if run.timing_only or run.client_optimizer not in ("adam", "adamw") or run.server_optimizer != "sgd":
        return
    in_flight = min(run.concurrency or run.clients_per_round or DEFAULT_CONCURRENCY, run.clients)
    aggregations = in_flight // run.buffer_size
    # a client budget stops the run at the aggregation that reaches it (rounded up)
    budgets = [run.max_updates,
               None if run.max_client_updates is None else -(-run.max_client_updates // run.buffer_size),
               None if run.max_client_steps is None or run.local_epochs is not None
               else -(-run.max_client_steps // (run.buffer_size * run.local_steps))]
    wave = min([aggregations, *(budget for budget in budgets if budget is not None)])
    staleness = staleness_function(run)
    # server momentum β carries each step on: up to 1/(1 - β) of it in all
    server_lr = (1.0 if run.server_lr is None else run.server_lr) / (1.0 - (run.server_momentum or 0.0))
    weight = server_lr * sum(staleness(version) for version in range(wave))
    if weight < FIRST_WAVE_NOTE_WEIGHT:
        return
    steps = f"{run.local_steps} steps" if run.local_epochs is None else f"{run.local_epochs:g} local epochs"
    server = "" if server_lr == 1.0 else f", times the server's step {server_lr:g}"
    warn_user(f"fedbuff: {in_flight:,} clients in flight with buffer_size {run.buffer_size}: each starts from the "
              f"initial model, so the first {wave:,} aggregations add up updates all trained from it, up to "
              f"about {weight:.0f} client updates' worth (the sum of their staleness weights{server}), and "
              f"{run.client_optimizer} at client_lr {run.client_lr:g} for {steps} moves every parameter by up to "
              "lr x steps per update, whatever its gradient: that sum can push the model far along one "
              "direction (an MLP on synthetic_iid at 10^5 clients, 1,000 in flight, K = 3: held-out loss 2.3 -> 387 "
              "at update 50, where buffer_size 30, concurrency 10 or the FedBuff paper's settings, K = 10 with sgd "
              "clients for 5 steps, learned; on mnist10k at 1,000 clients: loss 2.3 -> 11 at update 20, though "
              "accuracy rose). Consider a buffer in "
              f"proportion (buffer_size {max(1, in_flight // 30):,} or more), fewer clients in flight "
              "(concurrency) or sgd clients")
