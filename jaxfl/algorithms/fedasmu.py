"""FedASMU (Liu et al., AAAI 2024): asynchronous FL with dynamic staleness-aware model updates.

Paper: Formulas 1–9, Algorithms 1–2 and the appendix. Versions are counted from 1 in the formulas (the
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

The numbers (α, β, both hypergradients with ``jax.grad``) are pure-JAX kernels
(:mod:`jaxfl.kernels.fedasmu`) run by this file's device hooks: :class:`LearnedAlpha` replaces an
upload's coefficient (payload :class:`Upload`), :class:`FreshModelMix` mixes the fetched model into
a paused training call (the engine's generic pause at ``fetch_step``); this policy only schedules. Readings taken where the paper is garbled or silent, each a config switch:

- Formula 2: ξ = λ/(√t s^σ) + ι (the appendix's form, not the main text's √(t·s·σ));
- t counted from 1 (no division by zero at the first aggregation);
- hypergradient of (λ, σ, ι): ĝ = (w_o − u)/(η_i Q) applied to the record (Δ_p = u_p − w_{t_p}, t_p,
  s_p) of the device's previous aggregation; no update on a device's first upload;
- clips: α ∈ [α_min, 1], β ∈ [0, 1], λ, ι ≥ 0; gradients pass the clips straight through;
- the fetch happens after l* epochs (the text), not before epoch l* (Algorithm 2), l* ∈ [1, 𝓛−1];
  it is always charged one request latency plus one model download, even without a newer model;
- scheduling: the appendix reading (one device every 5 s, at most ⌈0.1 m⌉ running) by default; the
  Table 5 reading is ``trigger_batch=10, trigger_period=10``;
- μ_α, μ_β and the initial coefficients are not given by the paper: (λ, σ, ι) = (1, 0.5, 0),
  (γ, ν) = (1, 0), μ_β = 1 and μ_α = 16 (so the server starts as FedAsync's polynomial rule, a = 0.5,
  scaled by 16, with an extra 1/√t decay and the squash; μ_α = 1, the untuned start, leaves α near
  α_min after a few thousand versions and was 6–9× slower to a target).

Faults: with ``round_timeout`` a device still out that long after its start is presumed lost and
frees its concurrency slot (the server cannot tell a crash from a straggler); if it uploads later,
the upload is dropped ("arrived after round deadline") and the device is idle again.

Slot selection (the paper's "intelligent time slot selection", Formulas 5–6), ``slot``:

- ``learned`` (default, the paper's method): at a device's first participation the server's LSTM
  meta-model (:mod:`jaxfl.kernels.fedasmu_slot`, flax + optax) samples the slot, one binary
  "request after epoch l" decision per epoch, and is trained by REINFORCE with a moving-average
  baseline (Formula 5); afterwards the device's tabular Q-learning moves the slot by −1/0/+1
  (Formula 6). The reward is R = loss before − loss after the mix on the minibatch ζ. The paper
  does not give the LSTM's inputs, size or pre-training data, ε, ρ, the Q learning rate or discount,
  and its printed Q-update has typos: our readings are in :class:`LearnedSlot` and
  :class:`QLearningSlot`. Its state (LSTM parameters, optimiser state, baseline, Q-tables, pending
  contexts, RNGs) lives in the pickled policy, so a resumed run continues it bit for bit.
- ``first``, ``middle``, ``second_last``: the paper's fixed heuristics H1–H3 of its ablation.
- ``adaptive``: the Q-learning alone, started from the middle slot (H2) instead of the meta-model.

Because ``learned`` and ``adaptive`` read losses, they cannot run timing-only (refused, naming a
fixed slot). Another selector plugs in as a :class:`SlotSelector` (``choose``/``feedback``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from jaxfl._user_warnings import warn_user
from jaxfl.algorithms.base import Algorithm, DeviceHook, Options, register
from jaxfl.scheduler.pool import IdleClients
from jaxfl.scheduler.simulation import IN_FLIGHT, DispatchRecord, Policy, Simulation, _comm_time, local_steps_of

TRIGGER_STREAM = 23  # SeedSequence([seed, TRIGGER_STREAM]) picks the idle devices a trigger starts
EXPLORATION_STREAM = 24  # SeedSequence([seed, EXPLORATION_STREAM]): ε-greedy slot exploration
META_STREAM = 0x5107  # SeedSequence([seed, META_STREAM]): the slot meta-model's initialisation and samples
SLOT_RULES = ("learned", "first", "middle", "second_last", "adaptive")


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """Server-side hyperparameters (Formulas 1–3; Table 5's LeNet/FMNIST learning rates)."""

    mu_alpha: float = 16.0  # μ_α: not given by the paper [ours: tuned, see FedASMUConfig]
    alpha_min: float = 0.01  # α ≥ α_min > 0 (the convergence proof's assumption) [ours]
    lr_lambda: float = 1e-4  # η_λ (Table 5)
    lr_sigma: float = 1e-4  # η_σ, learning rate of the staleness exponent σ
    lr_iota: float = 1e-4  # η_ι, learning rate of the weight floor ι
    lambda0: float = 1.0  # initial (λ, σ, ι): not given [ours]
    sigma0: float = 0.5
    iota0: float = 0.0


@dataclasses.dataclass(frozen=True)
class DeviceOptions:
    """Device-side hyperparameters (Formulas 7–9)."""

    mu_beta: float = 1.0  # μ_β: not given [ours]
    lr_gamma: float = 1e-4  # η_γ (Table 5)
    lr_nu: float = 1e-4  # η_ν, learning rate of the device's ν
    gamma0: float = 1.0  # initial (γ, ν): not given [ours]
    nu0: float = 0.0


class Upload(NamedTuple):
    """Payload of a FedASMU aggregation: the upload's client, 1-based t and s, and the sum of its step
    sizes η_i·d^k·K (``lr_scale`` d^k of ``client_lr_decay``; ĝ = Δ/(η_i d^k K): normalised
    by the steps actually taken)."""

    client: int
    t: int
    s: int
    step_size: float


def options_in_force(server: ServerOptions, device: DeviceOptions, dynamic: bool) -> tuple[ServerOptions,
                                                                                         DeviceOptions]:
    """The options the run uses: FedASMU-DA (``dynamic=False``) keeps every coefficient at its
    initial value, i.e. all five hypergradient learning rates are 0.

    >>> options_in_force(ServerOptions(), DeviceOptions(), dynamic=False)[1].lr_gamma
    0.0
    """
    if dynamic:
        return server, device
    return (dataclasses.replace(server, lr_lambda=0.0, lr_sigma=0.0, lr_iota=0.0),
            dataclasses.replace(device, lr_gamma=0.0, lr_nu=0.0))


def initial_alpha(options: ServerOptions, t: int, s: int) -> float:
    """α with the initial (λ, σ, ι), t and s 1-based (what a numbers-free backend is told).

    >>> initial_alpha(ServerOptions(mu_alpha=1.0), t=4, s=4)   # ξ = 1/(√4 · 4^0.5) = 0.25 → 0.25/1.25
    0.2
    >>> initial_alpha(ServerOptions(), t=100, s=1)   # μ_α = 16: 16 · 1/√100 = 1.6 → 1.6/2.6
    0.6153846153846154
    """
    xi = options.lambda0 / (math.sqrt(t) * s ** options.sigma0) + options.iota0
    x = options.mu_alpha * xi
    alpha = x / (1.0 + x) if x >= 0 else x
    return float(min(max(alpha, options.alpha_min), 1.0))


class SlotContext(NamedTuple):
    """What the server knows when it dispatches a device: the global version, the devices already
    training and the concurrency cap, and the device's p_i · m (1 for equal data sizes)."""

    version: int
    in_flight: int
    capacity: int
    relative_weight: float


class SlotSelector:
    """Chooses the local epoch l* ∈ [1, 𝓛 − 1] after which a device fetches the fresh global.

    ``choose`` is called at each dispatch (with the :class:`SlotContext` of the dispatch),
    ``feedback`` after each upload whose mix happened, with the reward R = loss before − loss after
    the mix. Keep state in plain Python/NumPy (checkpoints pickle it, so a resumed run continues it).
    """

    def choose(self, client: int, epochs: int, context: SlotContext | None = None) -> int:
        raise NotImplementedError

    def feedback(self, client: int, slot: int, reward: float) -> None:
        pass


FIXED_SLOTS = ("first", "middle", "second_last")


class FixedSlot(SlotSelector):
    """H1 (after the first epoch), H2 (the middle one) or H3 (the second-to-last one)."""

    def __init__(self, rule: str = "middle"):
        if rule not in FIXED_SLOTS:
            raise ValueError(f"fixed slot rule {rule!r} is not one of first, middle, second_last")
        self.rule = rule

    def choose(self, client: int, epochs: int, context: SlotContext | None = None) -> int:
        slot = {"first": 1, "middle": epochs // 2, "second_last": epochs - 1}[self.rule]
        return int(min(max(slot, 1), max(epochs - 1, 1)))


class QLearningSlot(SlotSelector):
    """Per-device tabular Q-learning over the actions {−1, 0, +1} on the slot (the paper's RL time-slot selection, typos fixed).

    H[i, l, a] ← H[i, l, a] + φ (R + ψ max_a' H[i, l', a'] − H[i, l, a]) with l' the new slot;
    ε-greedy. φ, ψ and ε are not given by the paper [ours: 0.5, 0.5, 0.1]; the start slot is the
    middle one (H2) in place of the LSTM meta-model. Nor is how the greedy choice breaks a tie [ours:
    ``np.argmax``'s, the first action]: a slot a device has not left from yet (its row all zeros)
    moves it one slot earlier, and since most rewards are negative (the mix raises the local loss),
    the actions not yet tried win after it, so a device explores −1, stay, +1 in that order, a lean
    towards early slots while its table fills. Every FedASMU figure of jaxfl's reproduction ran so.
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

    def choose(self, client: int, epochs: int, context: SlotContext | None = None) -> int:
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


class LearnedSlot(QLearningSlot):
    """The paper's intelligent slot selection: the server's LSTM meta-model picks a device's slot at
    its first participation and learns by REINFORCE with a moving-average baseline (Formula 5); from
    then on the device's Q-learning moves the slot by −1, 0 or +1 (Formula 6, :class:`QLearningSlot`).

    Reward R = loss before − loss after the mix (on the minibatch ζ), for every mix; the baseline
    b ← (1 − ρ) b + ρ R follows every reward, and the advantage is R − b with b before that reward.
    As in the paper's Algorithm 2 a first participation's reward trains the meta-model and a later
    one the Q-table. Readings [ours] where the paper is silent: the meta-model's context (one vector,
    read at every decision epoch) is log(1 + t)/10 for the global version t, the fraction of the
    concurrency cap already training, p_i · m, the baseline b, and the server's previous meta-model
    slot that was rewarded (÷ 𝓛) and its reward; 16 LSTM units; no pre-training; the meta-model
    samples its decisions (no extra ε); a first participation whose fetch brings no newer model
    gives no update. The model and its random draws are seeded (stream ``META_STREAM``).

    >>> selector = LearnedSlot(num_clients=3, epochs=5, seed=0)
    >>> slot = selector.choose(0, 5, SlotContext(version=0, in_flight=0, capacity=1, relative_weight=1.0))
    >>> 1 <= slot <= 4, selector.meta_choices
    (True, 1)
    """

    features = 6

    def __init__(self, num_clients: int, epochs: int, seed: int, learning_rate: float = 1e-3,
                 baseline_rate: float = 0.1, hidden: int = 16):
        super().__init__(num_clients, epochs, seed)
        self.meta_learning_rate, self.baseline_rate, self.hidden = float(learning_rate), float(baseline_rate), hidden
        self._meta_rng = np.random.default_rng(np.random.SeedSequence([seed, META_STREAM]))
        self.params, self.opt_state = self._model().init(int(self._meta_rng.integers(2**31)))
        self.baseline = 0.0
        self.previous_meta = (0.0, 0.0)  # the server's last rewarded meta-model slot ÷ 𝓛 and its reward
        self.pending: dict[int, np.ndarray] = {}  # client → context of its meta-model slot, until rewarded
        self.meta_choices = self.meta_updates = 0

    def _model(self):
        from jaxfl.kernels.fedasmu_slot import make_slot_meta_model

        return make_slot_meta_model(self.epochs, self.features, self.hidden, self.meta_learning_rate)

    def context_features(self, context: SlotContext | None) -> np.ndarray:
        """The meta-model's input for one dispatch (see the class docstring).

        >>> LearnedSlot(3, 5, seed=0).context_features(SlotContext(0, 1, 2, 1.0)).tolist()
        [0.0, 0.5, 1.0, 0.0, 0.0, 0.0]
        """
        context = context or SlotContext(0, 0, 1, 1.0)
        return np.array([math.log1p(context.version) / 10, context.in_flight / max(context.capacity, 1),
                         context.relative_weight, self.baseline, *self.previous_meta], np.float32)

    def slot_probabilities(self, context: SlotContext | None = None) -> np.ndarray:
        """The meta-model's P(l* = k), k = 1 … 𝓛−1, for a dispatch in ``context``.

        >>> probabilities = LearnedSlot(3, 5, seed=0).slot_probabilities()   # slots 1, 2, 3, 4
        >>> len(probabilities), round(float(probabilities.sum()), 5)
        (4, 1.0)
        """
        return self._model().slot_probabilities(self.params, self.context_features(context))

    def choose(self, client: int, epochs: int, context: SlotContext | None = None) -> int:
        self.pending.pop(client, None)  # its previous run brought no reward: nothing to learn from
        if self.last[client, 0] >= 0:
            return super().choose(client, epochs, context)
        features = self.context_features(context)
        fire = self._meta_rng.random(self.epochs - 2) < self._model().decision_probabilities(self.params, features)
        slot = int(np.argmax(fire)) + 1 if fire.any() else self.epochs - 1  # the first f_l = 1, else 𝓛 − 1
        self.slot[client], self.last[client] = slot, (slot, 1)
        self.pending[client] = features
        self.meta_choices += 1
        return slot

    def feedback(self, client: int, slot: int, reward: float) -> None:
        if not math.isfinite(reward):
            return
        advantage = reward - self.baseline
        self.baseline = (1 - self.baseline_rate) * self.baseline + self.baseline_rate * reward
        features = self.pending.pop(client, None)
        if features is None:
            super().feedback(client, slot, reward)
            return
        self.params, self.opt_state = self._model().reinforce(self.params, self.opt_state, features, slot, advantage)
        self.previous_meta = (slot / self.epochs, float(reward))
        self.meta_updates += 1

    def stats(self) -> dict:
        """Counts for the run summary: meta-model slots chosen and REINFORCE steps, and the baseline."""
        return {"meta_choices": self.meta_choices, "meta_updates": self.meta_updates,
                "reward_baseline": float(self.baseline)}


class FedASMU(Policy):
    """FedASMU's trigger scheduler and upload handler; see the module docstring."""

    name = "fedasmu"
    needs_start_models = True  # Formula 1 mixes models ("mix" mode)

    def __init__(self, local_steps: int, client_lr: float, epochs: int = 5, slot: str = "learned",
                 staleness_bound: int = 99, trigger_period: float = 5.0, trigger_batch: int = 1,
                 max_concurrency: int | None = None, fetch: bool = True, dynamic: bool = True,
                 server: ServerOptions = ServerOptions(), device: DeviceOptions = DeviceOptions(), seed: int = 0,
                 round_timeout: float | None = None, rl_lr: float = 1e-3, rl_baseline_rate: float = 0.1,
                 rl_hidden: int = 16):
        if slot not in SLOT_RULES:
            raise ValueError(f"fedasmu_slot={slot!r} is not allowed: one of {', '.join(SLOT_RULES)}")
        if epochs < 2:
            raise ValueError(f"fedasmu_epochs={epochs} is not allowed: an integer >= 2 (the fetch sits between epochs)")
        if slot == "learned" and epochs < 3:
            raise ValueError(f"fedasmu_epochs={epochs} is not allowed with slot 'learned': an integer >= 3 "
                             "(with 2 epochs the only slot is 1)")
        self.rl_options = {"learning_rate": rl_lr, "baseline_rate": rl_baseline_rate, "hidden": rl_hidden}
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
        self.server, self.device = options_in_force(server, device, dynamic)
        self.seed = seed
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, TRIGGER_STREAM]))
        self.selector: SlotSelector | None = None
        self.idle: IdleClients | None = None
        self.running: dict[int, tuple[int, int]] = {}  # dispatch id → (client, slot)
        self.lost: dict[int, int] = {}  # dispatch id → client: out past the deadline, slot freed
        self.stats = {"triggered": 0, "fetches": 0, "dropped_stale": 0, "rewards": 0}

    def __setstate__(self, state: dict) -> None:
        # checkpoints from before IdleClients kept the idle clients as a list; every client is idle,
        # running or lost, so the three together number the clients
        idle = state.get("idle")
        if isinstance(idle, list):
            busy = [*(client for client, _ in state.get("running", {}).values()), *state.get("lost", {}).values()]
            state["idle"] = IdleClients(len(idle) + len(busy), busy)
        self.__dict__.update(state)

    # ------------------------------------------------------------------ scheduling
    def start(self, sim: Simulation) -> None:
        self.cap = self.max_concurrency or max(1, math.ceil(0.1 * sim.num_clients))
        self.idle = IdleClients(sim.num_clients)
        if self.selector is None:
            if self.slot_rule == "learned":
                self.selector = LearnedSlot(sim.num_clients, self.epochs, self.seed, **self.rl_options)
            elif self.slot_rule == "adaptive":
                self.selector = QLearningSlot(sim.num_clients, self.epochs, self.seed)
            else:
                self.selector = FixedSlot(self.slot_rule)
        self._trigger(sim)

    def on_timer(self, sim: Simulation, payload) -> None:
        if payload == "trigger":
            self._trigger(sim)
        elif "deadline" in payload:
            dispatch = payload["deadline"]
            # an update arriving at this very instant is on time: its arrival comes after the timers
            # of the instant (triggers first: the order FedASMU's schedules were made with); so is one
            # later only by float rounding (Simulation.due_by_rounding)
            if dispatch in self.running and not sim.records[dispatch].arrival_time <= sim.now \
                    and sim.due_by_rounding([sim.records[dispatch]]) is None:
                self.lost[dispatch] = self.running.pop(dispatch)[0]
        else:
            record = sim.records[payload["fetch"]]
            if record.status == IN_FLIGHT:
                self.stats["fetches"] += 1
                sim.fetch(record)

    def _trigger(self, sim: Simulation) -> None:
        count = min(self.trigger_batch, self.cap - len(self.running), len(self.idle))
        if count > 0:
            for client in self.idle.sample(self._rng, count):
                self._dispatch(sim, client)
        if not self._stuck(sim):  # else the timer alone moved the clock on for ever (max_time inf)
            sim.set_timer(sim.now + self.trigger_period, "trigger")

    def _stuck(self, sim: Simulation) -> bool:
        """Whether no trigger can dispatch again: no idle client, or the cap held by clients that never
        report (a crash is for good), and no client in flight that will report or be given up at
        its deadline. Then the run ends (no events left) instead of triggering nobody."""
        if len(self.idle) and self.cap > len(self.running):
            return False
        if self.running and self.round_timeout is not None:  # their deadlines free the cap
            return False
        return not any(math.isfinite(sim.records[record_id].arrival_time) for record_id in (*self.running, *self.lost))

    def _dispatch(self, sim: Simulation, client: int) -> None:
        steps = local_steps_of(self.local_steps, client)
        context = SlotContext(sim.version, len(self.running), self.cap,
                              float(sim.client_weights[client] * sim.num_clients))
        slot = self.selector.choose(client, self.epochs, context)
        fetch_step = round(slot * steps / self.epochs) if self.fetch else None
        if fetch_step is not None and not 0 < fetch_step < steps:
            fetch_step = None  # too few steps to fetch between two of them (local_epochs: a small client)
            self.stats["fetches_skipped"] = self.stats.get("fetches_skipped", 0) + 1
        transfer = _comm_time(sim.speeds, client) / 2
        latency_of = getattr(sim.speeds, "latency_of", None)  # the request's: the config's, or the client's in a trace
        latency = float(latency_of(client) if latency_of is not None else getattr(sim.speeds, "latency", 0.0))
        extra = latency + transfer if fetch_step is not None else 0.0  # the request + one more download
        record = sim.dispatch(client, steps, detail=f"slot {slot}", extra_time=extra, fetch_step=fetch_step)
        self.idle.remove(client)
        self.running[record.id] = (client, slot)
        self.stats["triggered"] += 1
        if self.round_timeout is not None:
            sim.set_timer(record.start_time + self.round_timeout, {"deadline": record.id})
        compute = record.arrival_time - record.start_time - extra - _comm_time(sim.speeds, client)
        if fetch_step is not None and math.isfinite(compute):  # a crashing client never asks
            # (under a delay/dropout fault the request moves with the slower compute, proportionally)
            request = record.start_time + transfer + fetch_step * compute / steps + latency
            sim.set_timer(request, {"fetch": record.id})

    # ------------------------------------------------------------------ uploads
    def on_arrival(self, sim: Simulation, record: DispatchRecord) -> None:
        if record.id in self.lost:  # presumed lost at its deadline: too late now
            self.idle.add(self.lost.pop(record.id))
            sim.drop(record, "arrived after round deadline")
            return
        client, slot = self.running.pop(record.id)
        self.idle.add(client)
        t = sim.version + 1  # 1-based index of the aggregation this upload would make
        s = sim.version - record.version + 1
        if s > self.staleness_bound:
            self.stats["dropped_stale"] += 1
            sim.drop(record, "staleness bound")
            return
        if not sim.screen([record]):  # a NaN/Inf update dropped: no new version, no reward
            return
        sim.aggregate([(record.id, initial_alpha(self.server, t, s))], mode="mix", server_optimizer=False,
                      payload=Upload(client, t, s, self.client_lr * record.lr_scale * max(record.steps, 1)))
        metrics_of = getattr(sim.backend, "client_metrics", None)
        metrics = metrics_of(record.id) if metrics_of is not None else None
        if metrics and "loss_before_mix" in metrics:
            self.stats["rewards"] += 1
            self.selector.feedback(client, slot, metrics["loss_before_mix"] - metrics["loss_after_mix"])

    def summary(self) -> dict:
        """Run statistics for the run summary."""
        selector_stats = getattr(self.selector, "stats", None)
        return {"max_concurrency": getattr(self, "cap", self.max_concurrency), "slot_rule": self.slot_rule,
                **self.stats, **(selector_stats() if callable(selector_stats) else {})}


def _slots(epochs: int, slot: str) -> list[int]:
    """The slots (epochs l* after which a client fetches) a slot rule may pick: a fixed one, or 1 … 𝓛−1."""
    return [FixedSlot(slot).choose(0, epochs)] if slot in FIXED_SLOTS else list(range(1, epochs))


def _slots_fetching(steps: int, epochs: int, slot: str) -> list[int]:
    """Those of :func:`_slots` whose fetch lies strictly inside a dispatch of ``steps`` local steps,
    where :meth:`FedASMU._dispatch` places it (step round(l*·steps/𝓛)); at the others it is skipped.

    >>> _slots_fetching(10, 5, "first"), _slots_fetching(2, 5, "first"), _slots_fetching(2, 5, "learned")
    ([1], [], [2, 3])
    """
    return [chosen for chosen in _slots(epochs, slot) if 0 < round(chosen * steps / epochs) < steps]


class LearnedAlpha(DeviceHook):
    """Server side (Formulas 1–3): the upload's α from the client's learned (λ, σ, ι), after their
    hypergradient step. Per-client state (``init_per_client``, one table ``"server"``; on the device
    while it fits, else in host RAM or a memmap): the coefficients ``(3,)``, the record (t_p, s_p,
    seen) of the client's previous aggregation ``(3,)`` and its Δ_p (model-shaped). An upload reads
    and writes its client's row only."""

    name = "fedasmu_server"

    def __init__(self, options: ServerOptions):
        self.options = options

    def init_per_client(self, params):
        import jax
        import jax.numpy as jnp

        o = self.options
        trainable = params["params"] if isinstance(params, dict) and "state" in params else params
        return {"server": {"coefficients": jnp.asarray([o.lambda0, o.sigma0, o.iota0], jnp.float32),
                           "record": jnp.zeros(3, jnp.float32),
                           "previous_delta": jax.tree.map(jnp.zeros_like, trainable)}}

    def tables_from_state(self, state):
        # jaxfl before jaxfl.client_state kept this hook's state as the one table's columns, stacked
        # over the clients: coefficients (C, 3), record (C, 3), previous_delta (a C-stacked model)
        return {"server": dict(state)}

    def weigh(self, ctx, aggregation, records):
        payload = aggregation.payload
        if not isinstance(payload, Upload):
            return None
        if len(records) != 1:
            raise ValueError(f"FedASMU mixes one upload at a time, got {len(records)}")
        import jax

        from jaxfl.kernels import fedasmu as kernels

        def server_update(rows, delta, start, current, t, s, step_size, learning_rates, mu_alpha, alpha_min):
            row = jax.tree.map(lambda leaf: leaf[0], rows)  # the uploading client's row
            coefficients, alpha, record, previous_delta, gradient = kernels.server_update(
                row["coefficients"], row["record"], row["previous_delta"], delta, start, current, t, s, step_size,
                learning_rates, mu_alpha, alpha_min)
            row = {"coefficients": coefficients, "record": record, "previous_delta": previous_delta}
            return jax.tree.map(lambda leaf: leaf[None], row), alpha, gradient

        (record,) = records
        o = self.options
        # host numbers go to the program as NumPy values: jnp.float32(x) is an eager conversion per call
        learning_rates = np.array([o.lr_lambda, o.lr_sigma, o.lr_iota], np.float32)
        client = [payload.client]
        rows, alpha, _ = ctx.jit("fedasmu_server", server_update)(
            ctx.client_rows(self.name, "server", client), ctx.trainable(ctx.delta(record)),
            ctx.trainable(ctx.start_model(record)), ctx.trainable(ctx.params), np.float32(payload.t),
            np.float32(payload.s), np.float32(payload.step_size), learning_rates, np.float32(o.mu_alpha),
            np.float32(o.alpha_min))
        ctx.set_client_rows(self.name, "server", client, rows)
        alpha = float(alpha)
        ctx.set_client_metrics(record.id, {"alpha": alpha})
        return [alpha]


class FreshModelMix(DeviceHook):
    """Device side (Formulas 7–9): in a paused training call, mix each pausing row's fetched global
    into its local model with β from the client's (γ, ν), and step (γ, ν) on the next minibatch.
    State: per-client (γ, ν) ``(C, 2)``."""

    name = "fedasmu_device"

    def __init__(self, options: DeviceOptions):
        self.options = options

    def init(self, params, num_clients):
        import jax.numpy as jnp

        initial = jnp.asarray([self.options.gamma0, self.options.nu0], jnp.float32)
        return jnp.tile(initial, (num_clients, 1))

    def on_pause(self, ctx, paused):
        import jax

        from jaxfl.kernels import fedasmu as kernels
        from jaxfl.kernels.tree import set_rows

        trainer = ctx.trainer

        def device_mix(states, fresh, table, clients, o, g, active, data, views, mu_beta, learning_rates):
            def one(state, fresh_i, coefficients_i, o_i, g_i, active_i, view):
                return kernels.device_mix(trainer.batch_loss, state, fresh_i, coefficients_i, o_i, g_i, active_i,
                                          data, view, mu_beta, learning_rates)

            states, coefficients, diagnostics = jax.vmap(one)(states, fresh, table[clients], o, g, active, views)
            # the mixing rows' (γ, ν) written back here, not by eager gathers and a scatter per pause
            return states, set_rows(table, clients, coefficients, active), diagnostics

        members, active = paused.records, paused.active
        clients = np.array([r.client for r in members], np.int32)
        if len(set(clients[active].tolist())) != int(active.sum()):
            raise ValueError("two mixing dispatches of one client in one call: their (γ, ν) updates would collide")
        o = np.array([r.version + 1 for r in members], np.float32)  # 1-based versions (kernels/fedasmu.py)
        g = np.array([r.fetch_version + 1 if active[i] else r.version + 2 for i, r in enumerate(members)], np.float32)
        table = ctx.state[self.name]
        learning_rates = np.array([self.options.lr_gamma, self.options.lr_nu], np.float32)
        states, ctx.state[self.name], diagnostics = ctx.jit("device_mix", device_mix)(
            paused.states, paused.fetched, table, clients, o, g, np.asarray(active), ctx.data, paused.views,
            np.float32(self.options.mu_beta), learning_rates)
        rows = np.flatnonzero(active)
        diagnostics = jax.device_get(diagnostics)
        for index in rows:
            ctx.set_client_metrics(members[index].id, {key: float(value[index]) for key, value in diagnostics.items()})
        return states


@dataclasses.dataclass(frozen=True)
class FedASMUConfig(Options):
    """FedASMU's options (Liu et al., AAAI 2024, Formulas 1–9 and the experimental setup); [ours] = not given by the paper."""

    namespace = "fedasmu"

    epochs: int = 5  # 𝓛 local "epochs" of local_steps/𝓛 steps each [ours]
    slot: str = "learned"  # learned (paper: meta-model + Q-learning) | first | middle | second_last (H1–H3) | adaptive
    staleness_bound: int = 99  # τ: uploads with s > τ are dropped
    trigger_period: float = 5.0  # 𝒯 seconds between triggers (appendix: one device every 5 s)
    trigger_batch: int = 1  # m' devices per trigger (appendix: 1; Table 5: 10)
    max_concurrency: int | None = None  # devices training at once; unset: ceil(0.1 m) (paper)
    fetch: bool = True  # fetch and mix a fresh global model (False: FedASMU-FA)
    dynamic: bool = True  # learn (λ, σ, ι) and (γ, ν) (False: FedASMU-DA, frozen)
    # 16, not 1: with ξ = 1/(√t s^0.5) at the start, μ_α = 1 leaves α ≈ 0.09 after 100 versions and at
    # α_min past a few thousand, and FedASMU then reached 80% on Fashion-MNIST 6-9x later than with 16
    # (1, 4, 16, 64 tried; 16 and 64 tie; benchmarks/reproduction/README.md, "FedASMU's μ_α").
    mu_alpha: float = 16.0  # μ_α, scale of the server mixing weight α = μ_α ξ / (1 + μ_α ξ) [ours: tuned]
    mu_beta: float = 1.0  # μ_β, scale of the fresh-model mixing weight β = μ_β φ / (1 + μ_β φ) [ours]
    alpha_min: float = 0.01  # α clipped to [α_min, 1] [ours]
    lr_lambda: float = 1e-4  # η_λ, learning rate of λ (Table 5, LeNet/FMNIST)
    lr_sigma: float = 1e-4  # η_σ, learning rate of the staleness exponent σ
    lr_iota: float = 1e-4  # η_ι, learning rate of the weight floor ι
    lr_gamma: float = 1e-4  # η_γ, learning rate of the device's γ
    lr_nu: float = 1e-4  # η_ν, learning rate of the device's ν
    lambda0: float = 1.0  # initial λ, the server weight's scale [ours]
    sigma0: float = 0.5  # initial σ [ours: FedAsync's polynomial a = 0.5]
    iota0: float = 0.0  # initial ι, the server weight's additive floor [ours]
    gamma0: float = 1.0  # initial γ, the fresh-model weight's scale [ours]
    nu0: float = 0.0  # initial ν, the fresh-model weight's version-gap term [ours]
    rl_lr: float = 1e-3  # η_RL, REINFORCE learning rate of the slot meta-model (Table 5; slot learned)
    rl_baseline_rate: float = 0.1  # ρ, reward baseline b ← (1−ρ) b + ρ R (slot learned) [ours]
    rl_hidden: int = 16  # LSTM units of the slot meta-model (slot learned) [ours]

    def server_options(self) -> ServerOptions:
        return ServerOptions(self.mu_alpha, self.alpha_min, self.lr_lambda, self.lr_sigma, self.lr_iota,
                             self.lambda0, self.sigma0, self.iota0)

    def device_options(self) -> DeviceOptions:
        return DeviceOptions(self.mu_beta, self.lr_gamma, self.lr_nu, self.gamma0, self.nu0)

    def validate(self, run) -> None:
        from jaxfl.config import FLOAT32_MAX, TIME_SCALE_LIMIT, fail

        if self.slot not in SLOT_RULES:
            fail("fedasmu.slot", self.slot, f"one of {', '.join(SLOT_RULES)}")
        if self.epochs < 2:
            fail("fedasmu.epochs", self.epochs, "an integer >= 2 (the fetch sits between two epochs)")
        if self.fetch and run.local_epochs is None:
            slots = _slots(self.epochs, self.slot)
            fitting = _slots_fetching(run.local_steps, self.epochs, self.slot)
            if len(fitting) < len(slots):
                least = next(steps for steps in range(1, 4 * self.epochs)
                             if len(_slots_fetching(steps, self.epochs, self.slot)) == len(slots))
                what = (f"the fetch after epoch l* falls at step round(l*·steps/epochs), which must lie between the "
                        f"first and the last step: local_steps at least {least} with fedasmu.epochs={self.epochs} "
                        f"and slot {self.slot} (or fewer fedasmu.epochs)")
                if not fitting:
                    fail("local_steps", run.local_steps, f"{what}, or fedasmu.fetch=false (FedASMU-FA)")
                warn_user(f"fedasmu: local_steps={run.local_steps} leaves no step for the fetch at slots "
                          f"{', '.join(str(slot) for slot in slots if slot not in fitting)} "
                          f"(a dispatch given one trains without it: summary's fetches_skipped); {what}")
        if self.dynamic and str(run.client_optimizer).startswith("<user: ") and not run.timing_only \
                and any((self.lr_lambda, self.lr_sigma, self.lr_iota)):
            # ĝ = Δ/(η·steps) read η from client_lr, which an optax object replaces: every upload was
            # divided by the default client_lr, whatever rate the clients trained with
            fail("client_optimizer", run.client_optimizer,
                 "a named optimiser with FedASMU's learned weights: the server learns λ, σ, ι from "
                 "ĝ = Δ/(η·steps) and cannot read η from an optax object; give --client-optimizer sgd "
                 "--client-lr η, or set fedasmu.lr_lambda, lr_sigma and lr_iota to 0 (or fedasmu.dynamic=false)")
        # (a named optimiser: an optax object given from Python may be SGD; a timing-only run learns nothing)
        if self.dynamic and run.client_optimizer in ("adam", "adamw") and not run.timing_only \
                and any((self.lr_lambda, self.lr_sigma, self.lr_iota)):
            warn_user(f"fedasmu: client_optimizer={run.client_optimizer!r}: the server learns λ, σ, ι from "
                      "ĝ = Δ/(η·steps), an estimate of the gradient only for plain SGD steps (Formula 4), so "
                      "their steps are not the paper's; --client-optimizer sgd follows it")
        elif self.dynamic and run.client_optimizer == "sgd" and getattr(run, "client_momentum", 0.0) > 0 \
                and not run.timing_only and any((self.lr_lambda, self.lr_sigma, self.lr_iota)):
            # momentum β makes Δ ≈ η·steps/(1 − β)·g once it builds up: ĝ 4x the gradient at 0.9 and 10 steps
            warn_user(f"fedasmu: client_momentum={run.client_momentum!r}: the server learns λ, σ, ι from "
                      "ĝ = Δ/(η·steps), an estimate of the gradient only for plain SGD steps (Formula 4); "
                      "momentum enlarges Δ (about 4x at 0.9 over 10 steps), so their steps are not the "
                      "paper's; --client-momentum 0 follows it")
        for name in ("staleness_bound", "trigger_batch", "max_concurrency"):
            value = getattr(self, name)
            if value is not None and value < 1:
                fail(f"fedasmu.{name}", value, "an integer >= 1")
        if self.max_concurrency is not None and self.max_concurrency > run.clients:
            fail("fedasmu.max_concurrency", self.max_concurrency, f"at most the number of clients ({run.clients})")
        for name in ("trigger_period", "mu_alpha", "mu_beta"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                fail(f"fedasmu.{name}", getattr(self, name), "a finite number > 0")
        if self.trigger_period > TIME_SCALE_LIMIT:
            fail("fedasmu.trigger_period", self.trigger_period,
                 f"at most {TIME_SCALE_LIMIT:g} s (the trigger times are its multiples, which overflow to inf)")
        for name in ("lr_lambda", "lr_sigma", "lr_iota", "lr_gamma", "lr_nu", "lambda0", "iota0", "gamma0"):
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                fail(f"fedasmu.{name}", getattr(self, name), "a finite number >= 0")
        for name in ("sigma0", "nu0"):
            if not math.isfinite(getattr(self, name)):
                fail(f"fedasmu.{name}", getattr(self, name), "a finite number")
        for name in ("mu_alpha", "mu_beta", "lr_lambda", "lr_sigma", "lr_iota", "lr_gamma", "lr_nu", "lambda0",
                     "iota0", "gamma0", "sigma0", "nu0"):  # each reaches the device as a float32
            if abs(getattr(self, name)) > FLOAT32_MAX:
                fail(f"fedasmu.{name}", getattr(self, name), f"at most {FLOAT32_MAX:.4g} in size, float32's largest "
                                                             "number: the device computes in float32, where a larger one is inf")
        if not 0 < self.alpha_min <= 1:
            fail("fedasmu.alpha_min", self.alpha_min, "a number in (0, 1]")
        if self.slot == "learned":
            if self.epochs < 3:
                fail("fedasmu.epochs", self.epochs,
                     "an integer >= 3 with fedasmu.slot='learned' (2 epochs have one slot)")
            if not (self.rl_lr > 0 and math.isfinite(self.rl_lr)):
                fail("fedasmu.rl_lr", self.rl_lr, "a finite number > 0")
            if not 0 < self.rl_baseline_rate <= 1:
                fail("fedasmu.rl_baseline_rate", self.rl_baseline_rate, "a number in (0, 1]")
            if self.rl_hidden < 1:
                fail("fedasmu.rl_hidden", self.rl_hidden, "an integer >= 1")
        else:
            for name in ("rl_lr", "rl_baseline_rate", "rl_hidden"):
                if getattr(self, name) != getattr(FedASMUConfig, name):
                    fail(f"fedasmu.{name}", getattr(self, name),
                         f"only with fedasmu.slot='learned' (the slot meta-model); this run's slot is {self.slot!r}")
        # the ablations' switched-off parts: their settings change nothing, said (not refused: a preset's
        # values, e.g. fedasmu-cifar10's learning rates, stay valid for its -FA and -DA ablations)
        unread = {}
        if not self.fetch:
            unread.update(dict.fromkeys(("mu_beta", "lr_gamma", "lr_nu", "gamma0", "nu0"),
                                        "with fedasmu.fetch on (the fresh model's weight β(γ, ν)); this run is "
                                        "FedASMU-FA (--no-fedasmu.fetch), which mixes no fresh model"))
            unread.update(dict.fromkeys(("slot", "rl_lr", "rl_baseline_rate", "rl_hidden"),
                                        "with fedasmu.fetch on (the slot a device fetches the fresh model at); "
                                        "this run is FedASMU-FA (--no-fedasmu.fetch), which fetches none"))
        if not self.dynamic:
            for name in ("lr_lambda", "lr_sigma", "lr_iota", "lr_gamma", "lr_nu"):
                unread.setdefault(name, "with fedasmu.dynamic on (λ, σ, ι, γ, ν learned); this run is FedASMU-DA "
                                        "(--no-fedasmu.dynamic), which keeps them at their initial values")
        for name, when in unread.items():
            if getattr(self, name) != getattr(FedASMUConfig, name):
                warn_user(f"fedasmu.{name}={getattr(self, name)!r} is ignored: it is read only {when}")


@register
class FedASMUAlgorithm(Algorithm):
    """FedASMU (Liu et al. 2024): learned staleness-aware mixing on the server and on the devices."""

    name = "fedasmu"
    kind = "asynchronous"
    reads = frozenset({"round_timeout"})
    Options = FedASMUConfig
    waits_for_clients = "clients (rounds, K arrivals, stale clients or concurrency slots)"
    delta_updates = False  # Formula 1 mixes models
    uses_concurrency = True  # fedasmu.max_concurrency, else the run's concurrency, else ceil(0.1 m)
    per_client_steps = True
    summary = "learned staleness-aware mixing, fresh-model fetch mid-training (Liu et al. 2024)"

    @classmethod
    def validate(cls, run, options) -> None:
        from jaxfl.config import fail

        if run.server_optimizer != "sgd":
            fail("server_optimizer", run.server_optimizer, "sgd for fedasmu (its learned α mixes models directly)")
        # both cap the devices training at once and the policy reads fedasmu.max_concurrency first:
        # the run's concurrency would be dropped without a word
        if options.max_concurrency is not None and run.concurrency is not None:
            fail("fedasmu.max_concurrency", options.max_concurrency,
                 f"unset when concurrency={run.concurrency} is given too: both set how many devices train at "
                 f"once; give only one of them")

    @classmethod
    def unread_settings(cls, run, options=None) -> dict[str, tuple[str | None, str]]:
        """Formula 1 mixes models with the learned α (no server optimiser); the data share p_i is a
        feature of the learned slot selector only.

        >>> sorted(FedASMUAlgorithm.unread_settings(None, FedASMUConfig(slot="first")))
        ['client_weights', 'server_lr', 'server_momentum', 'server_optimizer']
        """
        server = (None, "algorithms that apply a server optimiser: fedasmu mixes models with its learned α, "
                        "without one")
        unread = {"server_optimizer": server, "server_lr": server, "server_momentum": server}
        slot = getattr(options, "slot", None) or FedASMUConfig.slot
        if slot != "learned":
            unread["client_weights"] = ("fedasmu.slot='learned'", f"fedasmu.slot='learned', a feature of its slot "
                                                                  f"meta-model; this run's slot is {slot!r}")
        elif not getattr(options, "fetch", True):
            unread["client_weights"] = ("fedasmu.fetch", "fedasmu.fetch on, a feature of the learned slot's "
                                                         "meta-model; this run is FedASMU-FA, which fetches nothing")
        return unread

    @classmethod
    def schedule_depends_on_model(cls, run, options) -> str | None:
        if not options.fetch:  # FedASMU-FA: no fetch, so no reward for the slot's learning to follow
            return None
        if options.slot == "adaptive":
            return ("fedasmu.slot='adaptive' picks each device's fetch slot by Q-learning on the loss "
                    "before and after the mix; use a fixed slot (first, middle, second_last)")
        if options.slot == "learned":
            return ("fedasmu.slot='learned' (the default) picks each device's fetch slot with a meta-model and "
                    "Q-learning trained on the loss before and after the mix; use a fixed slot (first, middle, "
                    "second_last)")
        return None

    def policy(self) -> FedASMU:
        o, run = self.options, self.run
        return FedASMU(self.local_steps, run.client_lr, o.epochs, o.slot, o.staleness_bound, o.trigger_period,
                       o.trigger_batch, o.max_concurrency or run.concurrency, o.fetch, o.dynamic, o.server_options(),
                       o.device_options(), seed=run.seed, round_timeout=run.round_timeout, rl_lr=o.rl_lr,
                       rl_baseline_rate=o.rl_baseline_rate, rl_hidden=o.rl_hidden)

    def hooks(self):
        o = self.options
        server, device = options_in_force(o.server_options(), o.device_options(), o.dynamic)
        return (LearnedAlpha(server), FreshModelMix(device))
