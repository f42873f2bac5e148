"""FedASMU (Liu et al., AAAI 2024): asynchronous FL with dynamic staleness-aware model updates.

Spec: ``shared/specs/fedasmu.md`` §1–§5, §10. Versions are counted from 1 in the formulas (the
aggregation index t, as Algorithm 1 loops t from 1); s = t − o + 1 is 1 for a fresh upload::

    TRIGGER (every 𝒯 seconds, also at 0):
        start min(m', C_max − running, idle) idle devices chosen uniformly; each trains Q steps from w_o
    device i (Algorithm 2), "local epoch" = Q/𝓛 steps:
        after l* epochs it requests the newest global (request latency + one more model download)
        if the server's version g > o:  β = clip(μ_β φ/(1+μ_β φ), 0, 1),
                                         φ = (γ_i/√g)(1 − ν_i/√(g−o+1))
            w ← (1 − β) w + β w_g ; (γ_i, ν_i) −= η ∂F_i(w; ζ)/∂(γ_i, ν_i)     # Formulas 7–9
        trains the remaining epochs and uploads
    on UPLOAD of u from device i, trained from version o (Algorithm 1):
        s = t − o + 1 ; if s > τ: drop u                    # staleness bound, version unchanged
        (λ_i, σ_i, ι_i) −= η ∂F/∂(λ_i, σ_i, ι_i)             # Formula 3, hypergradient on the record
                                                              # of i's previous aggregation
        α = clip(μ_α ξ/(1+μ_α ξ), α_min, 1),  ξ = λ_i/(√t s^σ_i) + ι_i     # Formula 2 [recon]
        w ← (1 − α) w + α u ; t ← t + 1                     # Formula 1

The numbers (α, β, both hypergradients with ``jax.grad``) are engine kernels
(:mod:`jaxfl.kernels.fedasmu`: ``weighting="fedasmu"`` and fresh-model fetches); this policy only
schedules. Readings taken where the spec is garbled or silent (§10), each a config switch:

- Formula 2: ξ = λ/(√t s^σ) + ι (the appendix's form, not the main text's √(t·s·σ));
- t counted from 1 (no division by zero at the first aggregation);
- hypergradient of (λ, σ, ι): ĝ = (w_o − u)/(η_i Q) applied to the record (Δ_p = u_p − w_{t_p}, t_p,
  s_p) of the device's previous aggregation; no update on a device's first upload;
- clips: α ∈ [α_min, 1], β ∈ [0, 1], λ, ι ≥ 0; gradients pass the clips straight through;
- the fetch happens after l* epochs (the text), not before epoch l* (Algorithm 2), l* ∈ [1, 𝓛−1];
  it is always charged one request latency plus one model download, even without a newer model;
- scheduling: the appendix reading (one device every 5 s, at most ⌈0.1 m⌉ running) by default; the
  Table 5 reading is ``trigger_batch=10, trigger_period=10``;
- μ_α, μ_β and the initial coefficients are not given by the paper: μ_α = μ_β = 1, (λ, σ, ι) =
  (1, 0.5, 0), (γ, ν) = (1, 0) (so the server starts as FedAsync's polynomial rule, a = 0.5, with an
  extra 1/√t decay and the squash).

Faults: with ``round_timeout`` a device still out that long after its start is presumed lost and
frees its concurrency slot (the server cannot tell a crash from a straggler); if it uploads later,
the upload is dropped ("arrived after round deadline") and the device is idle again.

Slot selection: the paper's LSTM meta-model + per-device Q-learning is under-specified (LSTM size,
inputs and pre-training data, ε, ρ, the Q learning rate and discount are not given; the printed
Q-update has typos). Implemented: fixed slots H1/H2/H3 (``first``, ``middle``, ``second_last``) and
``adaptive``, a per-device tabular Q-learning over {l*−1, l*, l*+1} started from the middle slot
(the meta-model replaced by H2), with the reward R = loss before − loss after the mix on the
minibatch ζ. A learned selector plugs in as a :class:`SlotSelector` (``choose``/``feedback``).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxfl.scheduler.simulation import IN_FLIGHT, DispatchRecord, Policy, Simulation

TRIGGER_STREAM = 23  # SeedSequence([seed, TRIGGER_STREAM]) picks the idle devices a trigger starts
EXPLORATION_STREAM = 24  # SeedSequence([seed, EXPLORATION_STREAM]): ε-greedy slot exploration
SLOT_RULES = ("first", "middle", "second_last", "adaptive")


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """Server-side hyperparameters (spec §2, Table 5 LeNet/FMNIST learning rates)."""

    mu_alpha: float = 1.0  # μ_α: not given by the paper [ours]
    alpha_min: float = 0.01  # α ≥ α_min > 0 (the convergence proof's assumption) [ours]
    lr_lambda: float = 1e-4  # η_λ (Table 5)
    lr_sigma: float = 1e-4  # η_σ
    lr_iota: float = 1e-4  # η_ι
    lambda0: float = 1.0  # initial (λ, σ, ι): not given [ours]
    sigma0: float = 0.5
    iota0: float = 0.0


@dataclasses.dataclass(frozen=True)
class DeviceOptions:
    """Device-side hyperparameters (spec §3)."""

    mu_beta: float = 1.0  # μ_β: not given [ours]
    lr_gamma: float = 1e-4  # η_γ (Table 5)
    lr_nu: float = 1e-4  # η_ν
    gamma0: float = 1.0  # initial (γ, ν): not given [ours]
    nu0: float = 0.0


def initial_alpha(options: ServerOptions, t: int, s: int) -> float:
    """α with the initial (λ, σ, ι), t and s 1-based (what a numbers-free backend is told).

    >>> initial_alpha(ServerOptions(), t=4, s=4)   # ξ = 1/(√4 · 4^0.5) = 0.25 → 0.25/1.25
    0.2
    """
    xi = options.lambda0 / (math.sqrt(t) * s ** options.sigma0) + options.iota0
    x = options.mu_alpha * xi
    alpha = x / (1.0 + x) if x >= 0 else x
    return float(min(max(alpha, options.alpha_min), 1.0))


class SlotSelector:
    """Chooses the local epoch l* ∈ [1, 𝓛 − 1] after which a device fetches the fresh global.

    The hook for a learned selector (the paper's LSTM meta-model + Q-learning): ``choose`` is called
    at each dispatch, ``feedback`` after each upload whose mix happened, with the reward
    R = loss before − loss after the mix. Keep state in plain Python/NumPy (checkpoints pickle it).
    """

    def choose(self, client: int, epochs: int) -> int:
        raise NotImplementedError

    def feedback(self, client: int, slot: int, reward: float) -> None:
        pass


class FixedSlot(SlotSelector):
    """H1 (after the first epoch), H2 (the middle one) or H3 (the second-to-last one)."""

    def __init__(self, rule: str = "middle"):
        if rule not in ("first", "middle", "second_last"):
            raise ValueError(f"fixed slot rule {rule!r} is not one of first, middle, second_last")
        self.rule = rule

    def choose(self, client: int, epochs: int) -> int:
        slot = {"first": 1, "middle": epochs // 2, "second_last": epochs - 1}[self.rule]
        return int(min(max(slot, 1), max(epochs - 1, 1)))


class QLearningSlot(SlotSelector):
    """Per-device tabular Q-learning over the actions {−1, 0, +1} on the slot (spec §3.4, typos fixed).

    H[i, l, a] ← H[i, l, a] + φ (R + ψ max_a' H[i, l', a'] − H[i, l, a]) with l' the new slot;
    ε-greedy. φ, ψ and ε are not given by the paper [ours: 0.5, 0.5, 0.1]; the start slot is the
    middle one (H2) in place of the LSTM meta-model.
    """

    def __init__(self, num_clients: int, epochs: int, seed: int, epsilon: float = 0.1, learning_rate: float = 0.5,
                 discount: float = 0.5):
        self.epochs = epochs
        self.epsilon, self.learning_rate, self.discount = epsilon, learning_rate, discount
        self.table = np.zeros((num_clients, epochs + 1, 3))
        self.slot = np.full(num_clients, FixedSlot("middle").choose(0, epochs), dtype=np.int64)
        self.last = np.full((num_clients, 2), -1, dtype=np.int64)  # (previous slot, action index) per device
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, EXPLORATION_STREAM]))

    def _clamp(self, slot: int) -> int:
        return int(min(max(slot, 1), max(self.epochs - 1, 1)))

    def choose(self, client: int, epochs: int) -> int:
        current = int(self.slot[client])
        if self.last[client, 0] < 0:  # first participation: the meta-model's (here: H2's) slot
            self.last[client] = (current, 1)
            return current
        if self._rng.random() < self.epsilon:
            action = int(self._rng.integers(3))
        else:
            action = int(np.argmax(self.table[client, current]))
        new = self._clamp(current + action - 1)
        self.last[client] = (current, action)
        self.slot[client] = new
        return new

    def feedback(self, client: int, slot: int, reward: float) -> None:
        previous, action = (int(x) for x in self.last[client])
        if previous < 0 or not math.isfinite(reward):
            return
        target = reward + self.discount * float(np.max(self.table[client, slot]))
        self.table[client, previous, action] += self.learning_rate * (target - self.table[client, previous, action])


class FedASMU(Policy):
    """FedASMU's trigger scheduler and upload handler; see the module docstring."""

    name = "fedasmu"
    needs_start_models = True  # Formula 1 mixes models ("mix" mode)

    def __init__(self, local_steps: int, client_lr: float, epochs: int = 5, slot: str = "middle",
                 staleness_bound: int = 99, trigger_period: float = 5.0, trigger_batch: int = 1,
                 max_concurrency: int | None = None, fetch: bool = True, dynamic: bool = True,
                 server: ServerOptions = ServerOptions(), device: DeviceOptions = DeviceOptions(), seed: int = 0,
                 round_timeout: float | None = None):
        if slot not in SLOT_RULES:
            raise ValueError(f"fedasmu_slot={slot!r} is not allowed: one of {', '.join(SLOT_RULES)}")
        if epochs < 2:
            raise ValueError(f"fedasmu_epochs={epochs} is not allowed: an integer >= 2 (the fetch sits between epochs)")
        if not (trigger_period > 0 and math.isfinite(trigger_period)):
            raise ValueError(f"fedasmu_trigger_period={trigger_period} is not allowed: finite seconds > 0")
        if round_timeout is not None and not round_timeout > 0:
            raise ValueError(f"round_timeout={round_timeout!r} is not allowed: virtual seconds > 0, or None")
        self.round_timeout = round_timeout
        self.local_steps = local_steps
        self.client_lr = float(client_lr)
        self.epochs = epochs
        self.slot_rule = slot
        self.staleness_bound = staleness_bound
        self.trigger_period = float(trigger_period)
        self.trigger_batch = trigger_batch
        self.max_concurrency = max_concurrency
        self.fetch = fetch
        self.dynamic = dynamic
        if not dynamic:  # FedASMU-DA: the coefficients stay at their initial values
            server = dataclasses.replace(server, lr_lambda=0.0, lr_sigma=0.0, lr_iota=0.0)
            device = dataclasses.replace(device, lr_gamma=0.0, lr_nu=0.0)
        self.server = server
        self.device = device
        self.seed = seed
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, TRIGGER_STREAM]))
        self.selector: SlotSelector | None = None
        self.idle: list[int] = []
        self.running: dict[int, tuple[int, int]] = {}  # dispatch id → (client, slot)
        self.lost: dict[int, int] = {}  # dispatch id → client: out past the deadline, slot freed
        self.stats = {"triggered": 0, "fetches": 0, "dropped_stale": 0, "rewards": 0}

    # ------------------------------------------------------------------ scheduling
    def start(self, sim: Simulation) -> None:
        self.cap = self.max_concurrency or max(1, math.ceil(0.1 * sim.num_clients))
        self.idle = list(range(sim.num_clients))
        if self.selector is None:
            self.selector = (QLearningSlot(sim.num_clients, self.epochs, self.seed) if self.slot_rule == "adaptive"
                             else FixedSlot(self.slot_rule))
        self._trigger(sim)

    def on_timer(self, sim: Simulation, payload) -> None:
        if payload == "trigger":
            self._trigger(sim)
        elif "deadline" in payload:
            if payload["deadline"] in self.running:
                self.lost[payload["deadline"]] = self.running.pop(payload["deadline"])[0]
        else:
            record = sim.records[payload["fetch"]]
            if record.status == IN_FLIGHT:
                self.stats["fetches"] += 1
                sim.fetch(record, tuple(dataclasses.asdict(self.device).items()))

    def _trigger(self, sim: Simulation) -> None:
        count = min(self.trigger_batch, self.cap - len(self.running), len(self.idle))
        if count > 0:
            chosen = self._rng.choice(sorted(self.idle), size=count, replace=False)
            for client in sorted(int(c) for c in chosen):
                self._dispatch(sim, client)
        sim.set_timer(sim.now + self.trigger_period, "trigger")

    def _dispatch(self, sim: Simulation, client: int) -> None:
        steps = self.local_steps
        slot = self.selector.choose(client, self.epochs)
        fetch_step = round(slot * steps / self.epochs) if self.fetch else None
        if fetch_step is not None and not 0 < fetch_step < steps:
            fetch_step = None  # too few steps to fetch between two of them
        transfer = sim.speeds.comm_time() / 2
        config = getattr(sim.speeds, "config", None)  # ClientSpeeds: config.latency; ScriptedSpeeds: .latency
        latency = float(config.latency if config is not None else getattr(sim.speeds, "latency", 0.0))
        extra = latency + transfer if fetch_step is not None else 0.0  # the request + one more download
        record = sim.dispatch(client, steps, detail=f"slot {slot}", extra_time=extra, fetch_step=fetch_step)
        self.idle.remove(client)
        self.running[record.id] = (client, slot)
        self.stats["triggered"] += 1
        if self.round_timeout is not None:
            sim.set_timer(record.start_time + self.round_timeout, {"deadline": record.id})
        compute = record.arrival_time - record.start_time - extra - sim.speeds.comm_time()
        if fetch_step is not None and math.isfinite(compute):  # a crashing client never asks
            # (under a delay/dropout fault the request moves with the slower compute, proportionally)
            request = record.start_time + transfer + fetch_step * compute / steps + latency
            sim.set_timer(request, {"fetch": record.id})

    # ------------------------------------------------------------------ uploads
    def on_arrival(self, sim: Simulation, record: DispatchRecord) -> None:
        if record.id in self.lost:  # presumed lost at its deadline: too late now
            self.idle.append(self.lost.pop(record.id))
            sim.drop(record, "arrived after round deadline")
            return
        client, slot = self.running.pop(record.id)
        self.idle.append(client)
        t = sim.version + 1  # 1-based index of the aggregation this upload would make
        s = sim.version - record.version + 1
        if s > self.staleness_bound:
            self.stats["dropped_stale"] += 1
            sim.drop(record, "staleness bound")
            return
        options = tuple(dataclasses.asdict(self.server).items())
        sim.aggregate([(record.id, initial_alpha(self.server, t, s))], mode="mix", server_optimizer=False,
                      weighting="fedasmu", weighting_args=[(client, t, s, self.client_lr * max(record.steps, 1))],
                      weighting_options=options)
        metrics_of = getattr(sim.backend, "client_metrics", None)
        metrics = metrics_of(record.id) if metrics_of is not None else None
        if metrics and "loss_before_mix" in metrics:
            self.stats["rewards"] += 1
            self.selector.feedback(client, slot, metrics["loss_before_mix"] - metrics["loss_after_mix"])

    def summary(self) -> dict:
        """Run statistics for the run summary."""
        return {"max_concurrency": getattr(self, "cap", self.max_concurrency), "slot_rule": self.slot_rule,
                **self.stats}
