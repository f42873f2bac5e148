"""FedAsync (Xie et al. 2019): every arrival is one global update.

``concurrency`` clients train at once (default ``min(clients, 1000)``); each client that reports
is answered and a replacement drawn uniformly from the idle clients.

Three update rules, chosen by ``rule``:

``"paper"`` (default; FedAsync's own mixing, no p_i)::

    α_t = st(τ_g − τ_i)            # st includes the mixing weight α: α·(s+1)^(−a)
    w ← (1 − α_t) w + α_t w_i      # w_i is the client's final model, trained from the stale w_{τ_i}

``"fedcompass"`` (the form the FedCompass authors benchmarked, Li et al., ICLR 2024)::

    on arrival of Δ_i trained from version τ_i:
        w ← w − st(τ_g − τ_i) · p_i · Δ_i ;  τ_g ← τ_g + 1
        reply to client i with w (it starts Q new steps at once)

``"plato"`` (PORT's FedAsync baseline, with PLATO's settings): the paper's mixing, the same update;
not the FedAsync of PLATO's code at the PORT paper's date, which mixed in a delta, decayed α
cumulatively and used the first buffered update alone.

The FedCompass authors' form takes steps about m times smaller (p_i ≈ 1/m of m clients), so a
large federation's model hardly moves under it (10^4 clients: accuracy +3·10^-5 in 400 updates,
where the paper's mixing reached 0.32); FedCompass with Q_min = Q_max equals FedAsync only in that
form. It was the default until 2026-12-02: runs recorded before then with ``rule`` unset ran it,
and resume and compare as such (``changed_defaults``).
"""
from __future__ import annotations

from typing import Callable

from jaxfl.algorithms.base import Algorithm, note_data_share_steps, register, staleness_function
from jaxfl.scheduler.pool import InFlightLimit
from jaxfl.scheduler.simulation import DispatchRecord, Policy, Simulation
from jaxfl.scheduler.staleness import StalenessWeights

RULES = ("paper", "fedcompass", "plato")
MIXING_RULES = ("paper", "plato")


class FedAsync(InFlightLimit, Policy):
    """Asynchronous FedAsync; see the module docstring for its three rules (RULES)."""

    name = "fedasync"

    def __init__(self, local_steps: int, staleness: Callable[[int], float], rule: str = "paper",
                 concurrency: int | None = None, seed: int = 0):
        if rule not in RULES:
            raise ValueError(f"unknown FedAsync rule {rule!r}; allowed: {', '.join(RULES)}")
        self.local_steps = local_steps
        self.staleness = staleness
        self.rule = rule
        self.needs_start_models = rule in MIXING_RULES
        self.concurrency = concurrency
        self.seed = seed
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
        weight = self._staleness_weights[sim.version - record.version]  # st(τ_g − τ_i)
        if not sim.screen([record]):  # a NaN/Inf update dropped (on_nonfinite="skip"): no new version
            sim.reply(record.client)
            return
        if self.rule == "fedcompass":
            sim.aggregate([(record.id, weight * sim.client_weights[record.client])])
        else:
            sim.aggregate([(record.id, weight)], mode="mix", server_optimizer=False)
        sim.reply(record.client)


@register
class FedAsyncAlgorithm(Algorithm):
    """FedAsync (Xie et al. 2019): one aggregation per arrival, staleness-weighted."""

    name = "fedasync"
    kind = "asynchronous"
    reads = frozenset({"clients_per_round", "rule", "staleness", "staleness_alpha", "staleness_a"})
    changed_defaults = {"rule": ("fedcompass", "paper")}
    uses_concurrency = True
    per_client_steps = True
    summary = "every arrival is aggregated, weighted by staleness (Xie et al. 2019)"

    @classmethod
    def supports_fednova(cls, run) -> bool:
        """Never: every aggregation holds one update, where FedNova's c_i τ_eff/‖a_i‖₁ is 1 (τ_eff =
        ‖a_i‖₁), and the rules paper and plato mix models. ``fednova=True`` was accepted under the
        rules fedcompass and plato and changed nothing.

        >>> FedAsyncAlgorithm.supports_fednova(None)
        False
        """
        return False

    @classmethod
    def validate(cls, run, options) -> None:
        """Under the mixing rules the staleness weight is FedAsync's mixing weight α_t in
        w ← (1 − α_t) w + α_t w_i, which Xie et al. keep in (0, 1): every staleness function is at most
        its α, so α > 1 is refused (it would move the model past the client's, not towards it)."""
        from jaxfl.config import fail

        rule = run.rule or "paper"
        if rule == "fedcompass":
            note_data_share_steps(run, "fedasync's rule fedcompass")
        if rule in MIXING_RULES and run.staleness_alpha > 1:
            fail("staleness_alpha", run.staleness_alpha,
                 f"at most 1 under fedasync's rule {rule}: it is the mixing weight α_t of w ← (1 − α_t) w + α_t w_i, "
                 "and above 1 the model overshoots the client's")

    @classmethod
    def unread_settings(cls, run, options=None) -> dict[str, tuple[str | None, str]]:
        """Under ``rule="paper"`` (and ``"plato"``, the same) an arrival is mixed, w ← (1 − α_t) w + α_t w_i: no p_i, no server optimiser.

        >>> from types import SimpleNamespace
        >>> sorted(FedAsyncAlgorithm.unread_settings(SimpleNamespace(rule="paper")))
        ['client_weights', 'server_lr', 'server_momentum', 'server_optimizer']
        """
        rule = run.rule or "paper"
        if rule not in MIXING_RULES:
            return {}
        weights = ("rule fedcompass", f"fedasync's rule fedcompass: rule {rule} mixes w ← (1 − α_t) w + α_t w_i, "
                                      "weighted by staleness alone")
        server = ("rule fedcompass", f"fedasync's rule fedcompass: rule {rule} mixes models without a server optimiser")
        return {"client_weights": weights, "server_optimizer": server, "server_lr": server, "server_momentum": server}

    def policy(self) -> FedAsync:
        run = self.run
        return FedAsync(self.local_steps, staleness_function(run), rule=run.rule or "paper",
                        concurrency=run.concurrency or run.clients_per_round, seed=run.seed)
