"""Client-speed models: how long each client's local round takes in virtual seconds.

Two sources are covered:

- FedCompass §5.1 / App. E.1 / G.2: a base time per step ``t_i`` drawn once per run from
  ``homo`` (all μ), ``normal`` N(μ, (0.3μ)²) or ``exp`` (mean μ); each round multiplies the step
  count by a jittered ``t_i^(k) ~ N(t_i, (0.05 t_i)²)`` (one draw per round); optionally the
  client re-draws ``t_i`` with probability ``speed_change_prob`` at each round.
- PORT / PLATO (§5.2): an idle time ``s_i = min(pareto(a) or zipf(s), cap)`` per client. PLATO's
  reproducible mode reports ``T = E·(avg_training_time + s_i)`` for E epochs. We express it per
  step as ``t_i = μ·(1 + s_i / reference_time)``: with ``n`` steps per epoch, ``mean = μ`` and
  ``reference_time = n·μ``, an epoch takes ``n·t_i = n·μ + s_i``, i.e. PLATO's formula with
  ``avg_training_time = n·μ``. To reproduce PLATO exactly set ``reference_time`` to its
  ``avg_training_time`` (10 s for the LeNet tasks, 20 s for CIFAR-10),
  ``mean = avg_training_time / steps_per_epoch`` and ``jitter = 0`` (PLATO's reproducible mode
  has no jitter). PLATO draws with NumPy's legacy ``RandomState(1)``; our streams differ, so
  ``legacy_seed=1`` draws the idle times as PLATO does (client i gets the i-th draw of
  ``RandomState(1).pareto(a, C)``, capped): the exact idle-time table of the PORT spec §5.2.

Determinism: the base times come from one stream; each client's jitter and speed changes come
from that client's own stream. Client ``i``'s ``k``-th round therefore depends only on
``(config, seed, i, k)``, never on how rounds of different clients interleave, so two
algorithms compared under one seed see identical client speeds.

Pure Python + numpy; never imports jax.
"""

from __future__ import annotations

import dataclasses
import math
import operator

import numpy as np

__all__ = [
    "SPEED_MODELS",
    "NEGATIVE_POLICIES",
    "STREAM_BASE_TIMES",
    "STREAM_CLIENT_ROUNDS",
    "SpeedConfig",
    "ClientSpeeds",
]

SPEED_MODELS = ("homo", "normal", "exp", "pareto", "zipf")
NEGATIVE_POLICIES = ("redraw", "clip", "error")

# Stream ids mixed into SeedSequence([seed, stream, ...]). Large, module-specific values so that
# other modules deriving their own streams from the same run seed (partitions, client keys) do
# not collide with these by picking small integers.
STREAM_BASE_TIMES = 0x5EED_0001
STREAM_CLIENT_ROUNDS = 0x5EED_0002

# A redraw loop only fails to end if almost all mass is non-positive, which validation rules out
# for the built-in models; the cap turns a pathological config into an error instead of a hang.
_MAX_REDRAWS = 10_000


@dataclasses.dataclass(frozen=True)
class SpeedConfig:
    """How client speeds are simulated; see the module docstring for the models.

    Fields (times in virtual seconds):
        model: base distribution of ``t_i``, one of :data:`SPEED_MODELS`.
        mean: μ, seconds per local step (FedCompass Table 7: 0.15 for MNIST at batch 64).
        normal_std_ratio: ``normal`` draws N(μ, (ratio·μ)²).
        jitter: per-round t_i^(k) ~ N(t_i, (jitter·t_i)²); 0 disables.
        pareto_shape, zipf_s, cap: idle time s_i = min(pareto(shape) | zipf(s), cap).
            PORT §V uses Pareto a=1 with cap 30; PORT Fig. 2 uses Zipf 1.7 with cap 60 (set
            ``cap=60.0`` yourself: one ``cap`` field serves both models).
        reference_time: pareto/zipf map t_i = μ·(1 + s_i / reference_time).
        legacy_seed: pareto/zipf idle times from ``np.random.RandomState(legacy_seed)`` as PLATO
            draws them (None: the run's own stream); later speed changes use the client streams.
        speed_change_prob: per-round probability of re-drawing t_i (FedCompass App. G.2: 0.1).
        negative: non-positive draws are ``redraw``-n, ``clip``-ped to min_time_ratio·μ (which
            then floors every draw, keeping the map monotone) or raise (``error``).
        min_time_ratio: the ``clip`` floor as a fraction of μ.
        latency, bandwidth: one transfer takes latency + model_bytes / bandwidth.

    Invalid values raise ValueError at construction (via :meth:`validate`).

    Example:
        >>> SpeedConfig(model="exp", mean=0.15).jitter
        0.05
    """

    model: str = "homo"
    mean: float = 0.15
    normal_std_ratio: float = 0.3
    jitter: float = 0.05
    pareto_shape: float = 1.0
    zipf_s: float = 1.7
    cap: float = 30.0
    reference_time: float = 10.0
    speed_change_prob: float = 0.0
    negative: str = "redraw"
    min_time_ratio: float = 0.01
    latency: float = 0.0
    bandwidth: float = float("inf")
    legacy_seed: int | None = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the field, its value and what is allowed, if any is invalid.

        Example:
            >>> SpeedConfig(model="normal").validate()  # fine, returns None
        """
        if self.model not in SPEED_MODELS:
            raise ValueError(f"SpeedConfig.model={self.model!r}; allowed: {SPEED_MODELS}")
        if self.negative not in NEGATIVE_POLICIES:
            raise ValueError(f"SpeedConfig.negative={self.negative!r}; allowed: {NEGATIVE_POLICIES}")
        _check(self, "mean", lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
        _check(self, "normal_std_ratio", lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
        _check(self, "jitter", lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
        _check(self, "pareto_shape", lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
        # numpy's zipf needs s > 1 (the distribution is not normalisable otherwise).
        _check(self, "zipf_s", lambda v: math.isfinite(v) and v > 1, "a finite number > 1")
        _check(self, "cap", lambda v: v > 0, "a number > 0 (inf means no cap)")
        _check(self, "reference_time", lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
        if self.legacy_seed is not None and not (isinstance(self.legacy_seed, (int, np.integer))
                                                 and 0 <= self.legacy_seed < 2**32):
            raise ValueError(f"SpeedConfig.legacy_seed={self.legacy_seed!r}; must be None or an integer in [0, 2^32)")
        _check(self, "speed_change_prob", lambda v: 0 <= v <= 1, "a probability in [0, 1]")
        _check(self, "min_time_ratio", lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
        _check(self, "latency", lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
        _check(self, "bandwidth", lambda v: v > 0, "a number > 0 in bytes/s (inf means free)")


def _check(config: SpeedConfig, field: str, ok, allowed: str) -> None:
    value = getattr(config, field)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"SpeedConfig.{field}={value!r}; must be {allowed}")
    # NaN fails every comparison, so `ok` rejects it without a separate test.
    if not ok(float(value)):
        raise ValueError(f"SpeedConfig.{field}={value!r}; must be {allowed}")


class ClientSpeeds:
    """Per-client virtual durations of local rounds, reproducible per (seed, client, round).

    Args:
        config: the speed model.
        num_clients: C, the number of clients (ids 0..C-1).
        seed: non-negative run seed; streams are derived from it by purpose.
        model_bytes: size of one model transfer, for the bandwidth term.

    Attributes:
        base_time_per_step: (C,) float64, read-only view of the current ``t_i``.
        rounds_done: (C,) int64, read-only view of how many rounds each client has drawn.
        negative_draws: number of non-positive draws met (each one redrawn, clipped or raised);
            surfaced in run summaries so a model that often goes negative is visible.
        speed_changes: number of times some client re-drew its ``t_i``.

    Example:
        >>> speeds = ClientSpeeds(SpeedConfig(model="homo", jitter=0.0), num_clients=3, seed=0)
        >>> speeds.round_duration(client=1, num_steps=10)
        1.5
    """

    def __init__(self, config: SpeedConfig, num_clients: int, seed: int, model_bytes: int = 0):
        config.validate()
        num_clients = operator.index(num_clients)
        seed = operator.index(seed)
        model_bytes = operator.index(model_bytes)
        if num_clients < 1:
            raise ValueError(f"num_clients={num_clients}; must be >= 1")
        if seed < 0:
            raise ValueError(f"seed={seed}; must be >= 0 (numpy SeedSequence entropy)")
        if model_bytes < 0:
            raise ValueError(f"model_bytes={model_bytes}; must be >= 0")
        self.config = config
        self.num_clients = num_clients
        self.seed = seed
        self.model_bytes = model_bytes
        self.negative_draws = 0
        self.speed_changes = 0
        self._rounds_done = np.zeros(num_clients, dtype=np.int64)
        # Per-client generators are created on first use: building 20,000 of them up front
        # would cost more than most runs' scheduling.
        self._client_rngs: dict[int, np.random.Generator] = {}
        base_rng = np.random.default_rng(np.random.SeedSequence([seed, STREAM_BASE_TIMES]))
        legacy = config.legacy_seed is not None and config.model in ("pareto", "zipf")  # PLATO's RandomState
        base = self._draw_base(np.random.RandomState(config.legacy_seed) if legacy else base_rng, num_clients)
        for client in np.flatnonzero(base <= self._floor()):
            base[client] = self._fix_nonpositive(
                float(base[client]), int(client), lambda: float(self._draw_base(base_rng, 1)[0])
            )
        self._base = base

    @property
    def base_time_per_step(self) -> np.ndarray:
        """(C,) float64 read-only view of each client's current base time per step ``t_i``.

        Example:
            >>> ClientSpeeds(SpeedConfig(), 2, seed=0).base_time_per_step
            array([0.15, 0.15])
        """
        view = self._base.view()
        view.flags.writeable = False
        return view

    @property
    def rounds_done(self) -> np.ndarray:
        """(C,) int64 read-only view: rounds drawn so far per client.

        Example:
            >>> ClientSpeeds(SpeedConfig(), 2, seed=0).rounds_done
            array([0, 0])
        """
        view = self._rounds_done.view()
        view.flags.writeable = False
        return view

    def transfer_time(self) -> float:
        """Seconds for one model transfer (one direction): ``latency + model_bytes / bandwidth``.

        Example:
            >>> ClientSpeeds(SpeedConfig(latency=0.5, bandwidth=1e6), 1, 0, model_bytes=2_000_000).transfer_time()
            2.5
        """
        return float(self.config.latency + self.model_bytes / self.config.bandwidth)

    def comm_time(self) -> float:
        """Communication seconds per round: download plus upload, ``2 · transfer_time()``.

        Example:
            >>> ClientSpeeds(SpeedConfig(latency=0.5, bandwidth=1e6), 1, 0, model_bytes=2_000_000).comm_time()
            5.0
        """
        return 2.0 * self.transfer_time()

    def round_duration(self, client: int, num_steps: int) -> float:
        """Virtual seconds of ``client``'s next round of ``num_steps`` local steps.

        Each call is one round: it first applies a speed change if one is drawn, then one jitter
        draw ``t_i^(k)`` covers all steps, and adds :meth:`comm_time`. The same random numbers
        are consumed whatever ``num_steps`` is (0 included), so a client's k-th round speed does
        not depend on its step counts.

        Example:
            >>> speeds = ClientSpeeds(SpeedConfig(model="exp"), num_clients=4, seed=7)
            >>> speeds.round_duration(2, 10) > 0
            True
        """
        client = operator.index(client)
        num_steps = operator.index(num_steps)
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client={client} out of range [0, {self.num_clients})")
        if num_steps < 0:
            raise ValueError(f"num_steps={num_steps}; must be >= 0")
        rng = self._client_rng(client)
        config = self.config
        # `speed_change_prob == 0` skips the uniform draw altogether; determinism only needs the
        # draws to be a function of (config, seed, client, round), and config includes the prob.
        if config.speed_change_prob > 0 and rng.random() < config.speed_change_prob:
            self._base[client] = self._fix_nonpositive(
                float(self._draw_base(rng, 1)[0]), client, lambda: float(self._draw_base(rng, 1)[0])
            )
            self.speed_changes += 1
        base_time = float(self._base[client])
        if config.jitter > 0:
            jitter_std = config.jitter * base_time
            step_time = self._fix_nonpositive(
                float(rng.normal(base_time, jitter_std)), client, lambda: float(rng.normal(base_time, jitter_std))
            )
        else:
            step_time = base_time
        self._rounds_done[client] += 1
        return num_steps * step_time + self.comm_time()

    def state_dict(self) -> dict:
        """JSON-able snapshot: config, current ``t_i``, counters and every generator's state.

        Example:
            >>> a = ClientSpeeds(SpeedConfig(model="normal"), 3, seed=1)
            >>> b = ClientSpeeds(SpeedConfig(model="normal"), 3, seed=1)
            >>> _ = a.round_duration(0, 5); b.load_state_dict(a.state_dict())
            >>> a.round_duration(0, 5) == b.round_duration(0, 5)
            True
        """
        return {
            "config": dataclasses.asdict(self.config),
            "num_clients": self.num_clients,
            "seed": self.seed,
            "model_bytes": self.model_bytes,
            "base_time_per_step": [float(t) for t in self._base],
            "rounds_done": [int(r) for r in self._rounds_done],
            "negative_draws": self.negative_draws,
            "speed_changes": self.speed_changes,
            "client_rng_states": {
                str(client): rng.bit_generator.state for client, rng in sorted(self._client_rngs.items())
            },
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output; the next rounds continue the saved sequence.

        The config, client count, seed and model size must match this object's: resuming under a
        different speed model would silently splice two experiments.

        Example:
            >>> speeds = ClientSpeeds(SpeedConfig(), 2, seed=0)
            >>> speeds.load_state_dict(speeds.state_dict())
        """
        expected = {
            "config": dataclasses.asdict(self.config),
            "num_clients": self.num_clients,
            "seed": self.seed,
            "model_bytes": self.model_bytes,
        }
        for key, value in expected.items():
            if state[key] != value:
                raise ValueError(
                    f"state_dict {key}={state[key]!r} does not match this ClientSpeeds ({key}={value!r})"
                )
        base = np.asarray(state["base_time_per_step"], dtype=np.float64)
        rounds = np.asarray(state["rounds_done"], dtype=np.int64)
        if base.shape != (self.num_clients,) or rounds.shape != (self.num_clients,):
            raise ValueError(f"state_dict arrays must have shape ({self.num_clients},)")
        rngs = {}
        for client, rng_state in state["client_rng_states"].items():
            rng = np.random.default_rng(self._client_seed(int(client)))
            rng.bit_generator.state = rng_state
            rngs[int(client)] = rng
        self._base = base.copy()
        self._rounds_done = rounds.copy()
        self.negative_draws = int(state["negative_draws"])
        self.speed_changes = int(state["speed_changes"])
        self._client_rngs = rngs

    def __repr__(self) -> str:
        return (
            f"ClientSpeeds(model={self.config.model!r}, num_clients={self.num_clients}, "
            f"seed={self.seed}, negative_draws={self.negative_draws})"
        )

    # -- internals ------------------------------------------------------------------------------

    def _client_seed(self, client: int) -> np.random.SeedSequence:
        return np.random.SeedSequence([self.seed, STREAM_CLIENT_ROUNDS, client])

    def _client_rng(self, client: int) -> np.random.Generator:
        rng = self._client_rngs.get(client)
        if rng is None:
            rng = self._client_rngs[client] = np.random.default_rng(self._client_seed(client))
        return rng

    def _draw_base(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` float64 draws of ``t_i`` from the configured base distribution."""
        config = self.config
        mean = config.mean
        if config.model == "homo":
            return np.full(size, mean, dtype=np.float64)
        if config.model == "normal":
            return rng.normal(mean, config.normal_std_ratio * mean, size).astype(np.float64)
        if config.model == "exp":
            return rng.exponential(mean, size).astype(np.float64)
        if config.model == "pareto":
            idle = rng.pareto(config.pareto_shape, size)
        else:  # zipf
            idle = rng.zipf(config.zipf_s, size).astype(np.float64)
        idle = np.minimum(idle, config.cap)
        return mean * (1.0 + idle / config.reference_time)

    def _floor(self) -> float:
        """Smallest value that may pass through :meth:`_fix_nonpositive` unchanged."""
        return self.config.min_time_ratio * self.config.mean if self.config.negative == "clip" else 0.0

    def _fix_nonpositive(self, value: float, client: int, redraw) -> float:
        """Apply the ``negative`` policy to one draw.

        Non-positive draws are counted, then redrawn, raised or floored. Under ``clip`` positive
        draws below ``min_time_ratio·μ`` are floored too (without counting), so the map from draw
        to time stays monotone: a draw of -0.001 must not end up slower than one of +0.0001.
        """
        policy = self.config.negative
        attempts = 0
        while value <= 0:
            self.negative_draws += 1
            if policy == "error":
                raise ValueError(
                    f"non-positive time per step {value!r} drawn for client {client} "
                    f"(model={self.config.model!r}); set SpeedConfig.negative to 'redraw' or 'clip'"
                )
            if policy == "clip":
                break
            attempts += 1
            if attempts > _MAX_REDRAWS:
                raise ValueError(
                    f"client {client}: {_MAX_REDRAWS} consecutive non-positive draws; "
                    "the speed distribution has almost no positive mass"
                )
            value = redraw()
        return max(value, self._floor())


class ScriptedSpeeds:
    """Exact per-round times per step, for worked examples and replaying measured traces.

    ``time_per_step(client, round) -> seconds`` gives client ``client``'s time per step in its
    ``round``-th round (0 = first); communication is added as in :class:`ClientSpeeds`. No random
    draws, so ``negative_draws`` stays 0 and a non-positive time is an error.

    Example:
        >>> speeds = ScriptedSpeeds(lambda client, round: [6.0, 12.0][client], num_clients=2)
        >>> speeds.round_duration(1, 20)
        240.0
    """

    def __init__(self, time_per_step, num_clients: int, latency: float = 0.0):
        self.time_per_step = time_per_step
        self.num_clients = operator.index(num_clients)
        self.latency = float(latency)
        self.negative_draws = 0
        self.speed_changes = 0
        self._rounds_done = np.zeros(self.num_clients, dtype=np.int64)

    @property
    def base_time_per_step(self) -> np.ndarray:
        """Each client's time per step in its next round."""
        return np.array([self.time_per_step(c, int(self._rounds_done[c])) for c in range(self.num_clients)])

    def comm_time(self) -> float:
        return 2 * self.latency

    def round_duration(self, client: int, num_steps: int) -> float:
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client={client} out of range [0, {self.num_clients})")
        step_time = float(self.time_per_step(client, int(self._rounds_done[client])))
        if not step_time > 0:
            raise ValueError(f"time per step {step_time} for client {client} must be > 0")
        self._rounds_done[client] += 1
        return num_steps * step_time + self.comm_time()
