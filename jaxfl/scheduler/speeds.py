"""Client-speed models: how long each client's local round takes in virtual seconds.

Three sources are covered:

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
  ``RandomState(1).pareto(a, C)``, capped): the exact idle times of PORT's PLATO runs (Su & Li, IEEE IWQoS 2022).
- FedASMU (Liu et al., AAAI 2024, experimental setup): "the training time of the slowest device is
  5× the fastest; each device's training time is independently and randomly sampled within this
  range", and 110×–440× in its severe-heterogeneity study. ``uniform`` draws ``t_i`` once per
  client from U[a, R·a] with R = ``ratio``, stretched so that the fastest client takes exactly
  ``a`` and the slowest ``R·a`` (the paper states the gap between its devices; the others stay
  uniform in between); a speed change re-draws from U[a, R·a]. The paper names neither the
  distribution (uniform is its plain reading), nor a base time, nor a communication spread.
  [ours]: ``a = 2μ/(1 + R)``, so
  that the mean time per step is μ as in ``normal`` and ``exp`` (changing R alone spreads the
  clients without slowing the federation down); communication (``latency``, ``bandwidth``) stays
  the same for every device, the paper stating heterogeneity for training time only (its
  50×/100× lower-bandwidth runs are ``bandwidth`` settings).

  The sentence has two readings when clients hold different amounts of data. Per step (the
  default, ``speed_unit="step"``; every committed FedASMU result): R spreads the time per step, and
  a round of E epochs takes E·⌈n_i/B⌉ of those steps, so with FedASMU's Dir(0.5) client sizes
  (111–1,453 images) 5-epoch rounds span about 24× at R = 5. Per round (``speed_unit="round"``,
  runs with ``local_epochs`` only; a round time κ_i·t_epoch·E, κ_i the device's slowness): a
  client's round of E epochs takes the time of E·S̄ steps at its time per step, whatever its data
  size, S̄ the clients' mean steps per epoch (E·S̄ = mean_i S_i, S_i = E·⌈n_i/B⌉ the client's steps
  per dispatch), so R spreads round times exactly as it spreads times per step and the
  federation's mean round time is on average (over the draws of t_i) the per-step reading's.
  :class:`ClientSpeeds` takes it as a per-client ``compute_scale`` S̄·E/S_i
  (:func:`round_unit_scale`) multiplying the compute part of every round (never communication):
  a partial round (PORT's urgent pull, FedASMU's fetch step) scales with it, in proportion to its
  steps.

Determinism: the base times come from one stream; each client's jitter and speed changes come
from that client's own stream. Client ``i``'s ``k``-th round therefore depends only on
``(config, seed, i, k)``, never on how rounds of different clients interleave, so two
algorithms compared under one seed see identical client speeds. The per-client streams are
:class:`ClientStreams`: exactly ``default_rng(SeedSequence([seed, stream, client]))``, kept as
arrays so that 10^6 clients cost tens of MB rather than a Generator object each.

Pure Python + numpy; never imports jax.
"""

from __future__ import annotations

import array
import ctypes
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
    "ClientStreams",
    "check_time_per_step",
    "round_unit_scale",
]

SPEED_MODELS = ("homo", "normal", "exp", "pareto", "zipf", "uniform")
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
        mean: μ, seconds per local step (FedCompass Table 7: 0.15 for MNIST at batch 64): the mean
            of ``homo``, ``normal``, ``exp`` and ``uniform``; for ``pareto`` and ``zipf`` the t_i of an
            idle time of 0, which their idle times add to (``reference_time``): Pareto's fastest client
            is near it, Zipf's (idle times 1, 2, ...) at μ·(1 + 1/reference_time).
        normal_std_ratio: ``normal`` draws N(μ, (ratio·μ)²).
        jitter: per-round t_i^(k) ~ N(t_i, (jitter·t_i)²); 0 disables.
        pareto_shape, zipf_s, cap: idle time s_i = min(pareto(shape) | zipf(s), cap).
            PORT §V uses Pareto a=1 with cap 30; PORT Fig. 2 uses Zipf 1.7 with cap 60 (set
            ``cap=60.0`` yourself: one ``cap`` field serves both models).
        reference_time: pareto/zipf map t_i = μ·(1 + s_i / reference_time).
        ratio: ``uniform`` draws t_i ~ U[a, ratio·a] with a = 2μ/(1 + ratio) (mean μ), the fastest
            client at a and the slowest at ratio·a: the slowest-to-fastest ratio R (FedASMU: 5,
            and 110 to 440 in its severe study).
        legacy_seed: pareto/zipf idle times from ``np.random.RandomState(legacy_seed)`` as PLATO
            draws them (None: the run's own stream); later speed changes use the client streams.
        speed_change_prob: per-round probability of re-drawing t_i (FedCompass App. G.2: 0.1).
        negative: non-positive draws are ``redraw``-n, ``clip``-ped to min_time_ratio·μ (which
            then floors every draw, keeping the map monotone; with given times, min_time_ratio
            times the fastest of them) or raise (``error``).
        min_time_ratio: the ``clip`` floor as a fraction of μ (of the fastest given time).
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
    ratio: float = 5.0
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
        _check(self, "ratio", lambda v: math.isfinite(v) and v >= 1, "a finite slowest/fastest ratio >= 1")
        if self.legacy_seed is not None and not (isinstance(self.legacy_seed, (int, np.integer))
                                                 and not isinstance(self.legacy_seed, bool)
                                                 and 0 <= self.legacy_seed < 2**32):
            raise ValueError(f"SpeedConfig.legacy_seed={self.legacy_seed!r}; must be None or an integer in [0, 2^32)")
        # A model-specific field set away from its default for a model that never reads it is a
        # mistake (legacy_seed=1 with model="exp" would silently draw the run's own stream instead).
        for field, models in _MODEL_FIELDS.items():
            if self.model not in models and getattr(self, field) != _FIELD_DEFAULTS[field]:
                raise ValueError(
                    f"SpeedConfig.{field}={getattr(self, field)!r} is not allowed with model={self.model!r}: read only "
                    f"by model {' or '.join(models)}; leave it at its default {_FIELD_DEFAULTS[field]!r}")
        _check(self, "speed_change_prob", lambda v: 0 <= v <= 1, "a probability in [0, 1]")
        _check(self, "min_time_ratio", lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
        _check(self, "latency", lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
        _check(self, "bandwidth", lambda v: v > 0, "a number > 0 in bytes/s (inf means free)")


# The fields only some models read (the others apply to every model: mean, jitter, speed changes,
# the negative-time policy, communication).
_MODEL_FIELDS = {
    "normal_std_ratio": ("normal",),
    "pareto_shape": ("pareto",),
    "zipf_s": ("zipf",),
    "cap": ("pareto", "zipf"),
    "reference_time": ("pareto", "zipf"),
    "legacy_seed": ("pareto", "zipf"),
    "ratio": ("uniform",),
}
_FIELD_DEFAULTS = {field.name: field.default for field in dataclasses.fields(SpeedConfig)}


def _check(config: SpeedConfig, field: str, ok, allowed: str) -> None:
    value = getattr(config, field)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"SpeedConfig.{field}={value!r}; must be {allowed}")
    # NaN fails every comparison, so `ok` rejects it without a separate test.
    if not ok(float(value)):
        raise ValueError(f"SpeedConfig.{field}={value!r}; must be {allowed}")


# -- per-client streams ---------------------------------------------------------------------------

# numpy.random.SeedSequence's hashing constants (numpy/random/bit_generator.pyx) and PCG64's LCG
# multiplier (numpy/random/src/pcg64/pcg64.h): _pcg64_initial_states replays both for a whole
# array of clients at once; tests/test_speeds_scale.py checks it against numpy itself.
_MASK32 = 0xFFFF_FFFF
_SS_INIT_A, _SS_MULT_A = 0x43B0_D7E5, 0x931E_8875
_SS_INIT_B, _SS_MULT_B = 0x8B51_F9DD, 0x58F3_8DED
_SS_MIX_MULT_L, _SS_MIX_MULT_R = 0xCA01_F9DD, 0x4973_F715
_SS_POOL_SIZE = 4
_PCG_MULT_HI, _PCG_MULT_LO = 2549297995355413924, 4865540595714422341
_SEED_BLOCK = 1 << 16
_ROW_BYTES = 32  # one client's PCG64 state and increment: four uint64
# Standard normals a client's jitter draws take from its stream at once from its third round on (when
# the stream gives nothing else: no speed changes), the values after the first kept for its next
# rounds. The same values in the same order as one draw per round (numpy's array draw runs the
# scalar one in a loop); loading and saving the stream for each round was two thirds of a draw.
# Memory: 8·(NORMALS_AHEAD − 1) bytes per client that drew thrice (56 MB at 10^6 clients), and
# 8 MB per 10^6 clients once any has.
NORMALS_AHEAD = 8
_AHEAD_KEPT = NORMALS_AHEAD - 1
# Clients drawing their first round at once (a first wave) from which ClientSpeeds.round_durations
# computes their first standard normals as arrays: from a few more the tables' one-off ~0.05 s is repaid.
_BULK_FIRST_DRAWS = 1 << 15


def _uint32_words(value: int) -> list[int]:
    """``value``'s 32-bit words, lowest first, as SeedSequence splits an entropy integer."""
    words = [value & _MASK32]
    value >>= 32
    while value:
        words.append(value & _MASK32)
        value >>= 32
    return words


def _mulhi64(a: np.ndarray, b: np.uint64) -> np.ndarray:
    """High 64 bits of the 128-bit products ``a * b`` (uint64), from 32-bit halves."""
    low = np.uint64(_MASK32)
    a0, a1, b0, b1 = a & low, a >> np.uint64(32), b & low, b >> np.uint64(32)
    p01, p10 = a0 * b1, a1 * b0
    carry = ((a0 * b0) >> np.uint64(32)) + (p01 & low) + (p10 & low)
    return a1 * b1 + (p01 >> np.uint64(32)) + (p10 >> np.uint64(32)) + (carry >> np.uint64(32))


def _pcg64_initial_states(seed: int, stream: int, clients: np.ndarray) -> np.ndarray:
    """(n, 4) uint64 rows ``[state_lo, state_hi, inc_lo, inc_hi]``: the 128-bit state and increment of
    ``np.random.PCG64(np.random.SeedSequence([seed, stream, client]))`` for each client, computed
    for all clients together (one SeedSequence costs ~10 µs; this ~0.1 µs per client).

    Example:
        >>> row = _pcg64_initial_states(3, 9, np.array([5]))[0]
        >>> state = np.random.PCG64(np.random.SeedSequence([3, 9, 5])).state["state"]
        >>> (int(row[1]) << 64 | int(row[0])) == state["state"], (int(row[3]) << 64 | int(row[2])) == state["inc"]
        (True, True)
    """
    clients = np.asarray(clients, dtype=np.uint64)
    if clients.size and int(clients.max()) > _MASK32:
        raise ValueError("client ids must be < 2^32 (each one is a single SeedSequence word)")
    entropy = [np.array([w], dtype=np.uint32) for w in _uint32_words(seed) + _uint32_words(stream)]
    entropy.append(clients.astype(np.uint32))
    hash_const = _SS_INIT_A

    def hashmix(value):
        nonlocal hash_const
        value = value ^ np.uint32(hash_const)
        hash_const = hash_const * _SS_MULT_A & _MASK32
        value = value * np.uint32(hash_const)
        return value ^ (value >> np.uint32(16))

    def mix(x, y):
        result = np.uint32(_SS_MIX_MULT_L) * x - np.uint32(_SS_MIX_MULT_R) * y
        return result ^ (result >> np.uint32(16))

    # SeedSequence.mix_entropy, word for word; uint32 array arithmetic wraps as the C code does.
    zero = np.zeros(1, dtype=np.uint32)
    pool = [hashmix(entropy[i] if i < len(entropy) else zero) for i in range(_SS_POOL_SIZE)]
    for src in range(_SS_POOL_SIZE):
        for dst in range(_SS_POOL_SIZE):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for word in entropy[_SS_POOL_SIZE:]:
        for dst in range(_SS_POOL_SIZE):
            pool[dst] = mix(pool[dst], hashmix(word))
    # SeedSequence.generate_state(4, np.uint64): eight 32-bit words paired little-endian.
    hash_const = _SS_INIT_B
    out32 = []
    for i in range(8):
        value = pool[i % _SS_POOL_SIZE] ^ np.uint32(hash_const)
        hash_const = hash_const * _SS_MULT_B & _MASK32
        value = value * np.uint32(hash_const)
        out32.append(value ^ (value >> np.uint32(16)))
    shape = (clients.size,)
    seed_hi, seed_lo, seq_hi, seq_lo = (
        np.broadcast_to(out32[2 * j].astype(np.uint64) | (out32[2 * j + 1].astype(np.uint64) << np.uint64(32)), shape)
        for j in range(4)
    )
    # pcg_setseq_128_srandom_r: inc = seq << 1 | 1; state = ((0 * M + inc) + seed) * M + inc.
    inc_hi = (seq_hi << np.uint64(1)) | (seq_lo >> np.uint64(63))
    inc_lo = (seq_lo << np.uint64(1)) | np.uint64(1)
    lo = inc_lo + seed_lo
    hi = inc_hi + seed_hi + (lo < inc_lo).astype(np.uint64)
    mult_hi, mult_lo = np.uint64(_PCG_MULT_HI), np.uint64(_PCG_MULT_LO)
    hi = _mulhi64(lo, mult_lo) + lo * mult_hi + hi * mult_lo
    lo = lo * mult_lo
    state_lo = lo + inc_lo
    state_hi = hi + inc_hi + (state_lo < lo).astype(np.uint64)
    return np.stack([state_lo, state_hi, inc_lo, inc_hi], axis=1)


def _pcg64_step(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One PCG64 step of each (n, 4) row of :func:`_pcg64_initial_states`: the new state's low and
    high words and the 64-bit output, as numpy's ``next_uint64`` (state = state·M + inc, then the
    XSL-RR output of the new state).

    Example:
        >>> row = _pcg64_initial_states(3, 9, np.array([5]))
        >>> int(_pcg64_step(row)[2][0]) == np.random.PCG64(np.random.SeedSequence([3, 9, 5])).random_raw()
        True
    """
    lo, hi, inc_lo, inc_hi = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
    mult_hi, mult_lo = np.uint64(_PCG_MULT_HI), np.uint64(_PCG_MULT_LO)
    product_hi = _mulhi64(lo, mult_lo) + lo * mult_hi + hi * mult_lo
    product_lo = lo * mult_lo
    state_lo = product_lo + inc_lo
    state_hi = product_hi + inc_hi + (state_lo < product_lo).astype(np.uint64)
    rotation = state_hi >> np.uint64(58)
    folded = state_hi ^ state_lo
    output = (folded >> rotation) | (folded << ((np.uint64(64) - rotation) & np.uint64(63)))
    return state_lo, state_hi, output


_PCG_MULT = _PCG_MULT_HI << 64 | _PCG_MULT_LO
_ZIGGURAT: list = []  # [(wi, ki)] once measured, [None] where it could not be


def _ziggurat_tables() -> tuple[np.ndarray, np.ndarray] | None:
    """(wi, ki): the two tables of the fast path of numpy's ``standard_normal`` (its ziggurat: from
    a 64-bit output r, idx = r & 0xff, a sign bit, rabs = the next 52 bits; x = ±rabs·wi[idx], returned
    at once, after one output, iff rabs < ki[idx]), measured from numpy's own scalar draw: for each
    idx, PCG64 set to output rabs = 1 gives wi[idx], and a bisection on rabs of whether the draw took
    one output gives ki[idx]. None where the measured tables do not reproduce numpy's draws (checked
    on fresh streams), so that callers draw one at a time instead. Measured once (~0.05 s)."""
    if _ZIGGURAT:
        return _ZIGGURAT[0]
    tables = None
    try:
        bit_generator = np.random.PCG64(0)
        rng = np.random.Generator(bit_generator)
        inverse = pow(_PCG_MULT, -1, 1 << 128)

        def one_output(output: int) -> tuple[float, bool]:  # the draw from a state whose next output is `output`
            # with inc = 1 and a next state whose high word is 0, the output is the state's low word
            previous = (output - 1) * inverse % (1 << 128)
            bit_generator.state = {"bit_generator": "PCG64", "state": {"state": previous, "inc": 1},
                                   "has_uint32": 0, "uinteger": 0}
            value = rng.standard_normal()
            return value, bit_generator.state["state"]["state"] == output

        wi, ki = np.zeros(256), np.zeros(256, dtype=np.uint64)
        for idx in range(256):
            value, fast = one_output(1 << 9 | idx)
            if not fast:  # never on the fast path here (rabs = 0 aside): always drawn one at a time
                continue
            wi[idx] = value
            low, high = 1, 1 << 52  # fast at low; slow at high (there is no such rabs) unless shown
            if one_output((high - 1) << 9 | idx)[1]:
                ki[idx] = high
                continue
            high -= 1
            while high - low > 1:
                middle = (low + high) // 2
                if one_output(middle << 9 | idx)[1]:
                    low = middle
                else:
                    high = middle
            ki[idx] = high
        rows = _pcg64_initial_states(0, 1, np.arange(256))
        values, fast, _, _ = _first_normals(rows, wi, ki)
        for client in np.flatnonzero(fast).tolist():
            own = np.random.default_rng(np.random.SeedSequence([0, 1, client]))
            if own.standard_normal() != values[client]:
                raise ValueError("the measured ziggurat does not reproduce numpy's draws")
        tables = (wi, ki)
    except (ValueError, TypeError, KeyError, OverflowError):
        tables = None
    _ZIGGURAT.append(tables)
    return tables


def _first_normals(rows: np.ndarray, wi: np.ndarray, ki: np.ndarray):
    """Each row's next ``standard_normal()`` where numpy's fast path gives it from one output:
    (values, fast, new state low words, new state high words); rows where ``fast`` is False must be
    drawn by numpy itself (their values here are not theirs)."""
    state_lo, state_hi, output = _pcg64_step(rows)
    idx = (output & np.uint64(0xFF)).astype(np.intp)
    output = output >> np.uint64(8)
    negative = (output & np.uint64(1)).astype(bool)
    magnitude = (output >> np.uint64(1)) & np.uint64(0x000F_FFFF_FFFF_FFFF)
    values = magnitude.astype(np.float64) * wi[idx]
    values = np.where(negative, -values, values)
    return values, magnitude < ki[idx], state_lo, state_hi


def _live_state(bit_generator: np.random.PCG64) -> np.ndarray | None:
    """A writable (4,) uint64 view of ``bit_generator``'s own 128-bit state and increment, laid out
    as :func:`_pcg64_initial_states` rows, or None where numpy's memory layout is not that one.

    Swapping a client's state through this view costs ~0.3 µs; through ``bit_generator.state``
    (dicts of 128-bit Python ints) ~3 µs, most of a draw's budget at 10^6 clients. The layout is
    numpy's internal ``pcg64_state`` struct, so it is probed both ways before use and anything
    unexpected (another numpy, an emulated 128-bit type, big-endian) falls back to the dicts.
    """
    try:
        address = bit_generator.ctypes.state_address
        pointer = ctypes.c_void_p.from_address(address).value
        # The struct's first field points at the PCG state, which lives in the same Python object:
        # a pointer far away means the struct is not what we think, and must not be followed.
        if pointer is None or abs(pointer - address) > 4096:
            return None
        live = np.ctypeslib.as_array((ctypes.c_uint64 * 4).from_address(pointer))
        probe = {"state": 0x0123_4567_89AB_CDEF_FEDC_BA98_7654_3210, "inc": 0x1357_9BDF_2468_ACE0_0ECA_8642_FDB9_7531}
        bit_generator.state = {"bit_generator": "PCG64", "state": probe, "has_uint32": 0, "uinteger": 0}
        words = [probe["state"] & 2**64 - 1, probe["state"] >> 64, probe["inc"] & 2**64 - 1, probe["inc"] >> 64]
        if live.tolist() != words:
            return None
        live[:] = [5, 6, 7, 9]
        if bit_generator.state["state"] != {"state": 6 << 64 | 5, "inc": 9 << 64 | 7}:
            return None
        return live
    except (AttributeError, TypeError, ValueError, OverflowError):
        return None


class ClientStreams:
    """One PCG64 stream per client, bit-identical to ``np.random.default_rng(SeedSequence([seed,
    stream, client]))``, held as a (C, 4) uint64 table instead of C Generator objects.

    A Generator object costs ~1.1 KB and ~16 µs to build; this costs 32 bytes and ~0.1 µs per
    client, all built at once. To draw for a client, :meth:`load` copies its state into one
    shared Generator, the caller draws exactly as from that client's own Generator, and
    :meth:`save` copies the advanced state back. numpy's Generator caches nothing between draws
    and PCG64's only cache (a spare 32-bit half, ``has_uint32``) is filled by 32-bit integer
    draws alone, so the streams are exact for every draw except ``integers`` of 32 bits or less
    (and ``random(dtype=np.float32)``), which callers must not use.

    Pickles (checkpoints) and :meth:`state_dict` hold only the clients that have drawn; the rest
    are recomputed from the seed.

    Example:
        >>> streams = ClientStreams(seed=4, stream=9, num_clients=3)
        >>> rng = streams.load(2); x = rng.normal(); streams.save(2)
        >>> rng = streams.load(2); y = rng.random(); streams.save(2)
        >>> own = np.random.default_rng(np.random.SeedSequence([4, 9, 2]))
        >>> (x, y) == (own.normal(), own.random())
        True
    """

    def __init__(self, seed: int, stream: int, num_clients: int):
        seed, stream, num_clients = operator.index(seed), operator.index(stream), operator.index(num_clients)
        if seed < 0 or stream < 0:
            raise ValueError(f"seed={seed}, stream={stream}; both must be >= 0 (numpy SeedSequence entropy)")
        if not 0 <= num_clients <= 2**32:
            raise ValueError(f"num_clients={num_clients}; must be in [0, 2^32]")
        self.seed = seed
        self.stream = stream
        self.num_clients = num_clients
        self._reset()
        self._attach()

    def load(self, client: int) -> np.random.Generator:
        """The shared Generator, now in ``client``'s state; call :meth:`save` after drawing.

        ``client`` must be in ``[0, C)``; callers check it (a negative id would index from the end).
        """
        live = self._live_bytes
        if live is not None:
            # bytes through memoryviews: a third of the cost of numpy's row assignment
            start = client * _ROW_BYTES
            live[:] = self._table_bytes[start:start + _ROW_BYTES]
        else:
            row = self._table[client]
            self._bit_generator.state = {
                "bit_generator": "PCG64",
                "state": {"state": int(row[1]) << 64 | int(row[0]), "inc": int(row[3]) << 64 | int(row[2])},
                "has_uint32": 0,
                "uinteger": 0,
            }
        return self._rng

    def save(self, client: int) -> None:
        """Keep the shared Generator's state as ``client``'s (after :meth:`load` and the draws)."""
        live = self._live_bytes
        if live is not None:
            start = client * _ROW_BYTES
            self._table_bytes[start:start + _ROW_BYTES] = live
        else:
            state = self._bit_generator.state["state"]
            self._table[client] = [state["state"] & 2**64 - 1, state["state"] >> 64,
                                   state["inc"] & 2**64 - 1, state["inc"] >> 64]
        self._touched_bytes[client] = 1  # the bytearray under _touched: a third of numpy's cost per scalar

    def state_dict(self) -> dict:
        """JSON-able: the 128-bit PCG state of each client that has drawn (the others are implied).

        Example:
            >>> streams = ClientStreams(0, 1, num_clients=5)
            >>> _ = streams.load(3).random(); streams.save(3)
            >>> state = streams.state_dict(); state["clients"]
            [3]
            >>> fresh = ClientStreams(0, 1, num_clients=5); fresh.load_state_dict(state)
            >>> fresh.load(3).random() == streams.load(3).random()
            True
        """
        clients = np.flatnonzero(self._touched)
        rows = self._table[clients]
        return {
            "seed": self.seed,
            "stream": self.stream,
            "num_clients": self.num_clients,
            "clients": clients.tolist(),
            "state": [hi << 64 | lo for lo, hi in zip(rows[:, 0].tolist(), rows[:, 1].tolist())],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output of streams with the same seed, stream and size."""
        for key in ("seed", "stream", "num_clients"):
            if state[key] != getattr(self, key):
                raise ValueError(f"state_dict {key}={state[key]!r} does not match these streams "
                                 f"({key}={getattr(self, key)!r})")
        clients = np.asarray(state["clients"], dtype=np.int64).reshape(-1)
        values = [int(v) for v in state["state"]]
        if len(values) != clients.size or (clients.size and not (
                0 <= clients.min() and clients.max() < self.num_clients)):
            raise ValueError(f"state_dict clients must be ids in [0, {self.num_clients}), one state each")
        if any(not 0 <= v < 2**128 for v in values):
            raise ValueError("state_dict states must be 128-bit unsigned integers")
        self._reset()
        self._table[clients, 0] = [v & 2**64 - 1 for v in values]
        self._table[clients, 1] = [v >> 64 for v in values]
        self._touched[clients] = True

    def __getstate__(self) -> dict:
        # The live views and the ctypes objects behind them cannot be pickled, and the untouched rows
        # are a pure function of the seed: keep only what a restore cannot recompute.
        clients = np.flatnonzero(self._touched)
        return {"seed": self.seed, "stream": self.stream, "num_clients": self.num_clients,
                "clients": clients, "rows": self._table[clients]}

    def __setstate__(self, state: dict) -> None:
        self.seed, self.stream, self.num_clients = state["seed"], state["stream"], state["num_clients"]
        self._reset()
        self._table[state["clients"]] = state["rows"]
        self._touched[state["clients"]] = True
        self._attach()

    def __repr__(self) -> str:
        return (f"ClientStreams(seed={self.seed}, stream={self.stream:#x}, num_clients={self.num_clients}, "
                f"drawn={int(self._touched.sum())})")

    def _reset(self) -> None:
        table = np.empty((self.num_clients, 4), dtype=np.uint64)
        # In blocks, so the dozens of temporaries stay in cache and peak memory stays near the table's.
        for start in range(0, self.num_clients, _SEED_BLOCK):
            stop = min(start + _SEED_BLOCK, self.num_clients)
            table[start:stop] = _pcg64_initial_states(self.seed, self.stream, np.arange(start, stop))
        self._table = table
        self._table_bytes = memoryview(table).cast("B")
        self._touched_bytes = bytearray(self.num_clients)
        self._touched = np.frombuffer(self._touched_bytes, dtype=bool)

    def _attach(self) -> None:
        # Its own seed never matters: every draw starts from a loaded client state.
        self._bit_generator = np.random.PCG64(0)
        self._rng = np.random.Generator(self._bit_generator)
        self._live = _live_state(self._bit_generator)
        self._live_bytes = None if self._live is None else memoryview(self._live).cast("B")


# The per-client columns a given trace may hold beside the seconds per step, in the units of
# SpeedConfig's latency and bandwidth: seconds of latency per model transfer, bytes per second.
NETWORK_COLUMNS = ("latency", "bandwidth")


def check_time_per_step(time_per_step, num_clients: int, speed_change_prob: float = 0.0,
                        legacy_seed: int | None = None) -> np.ndarray:
    """``time_per_step`` as a fresh (C,) float64 array, or ValueError naming the first bad entry;
    also refused with the settings that would re-draw the given times (``speed_change_prob > 0``,
    a ``speed_legacy_seed``).

    A trace of each client's network too is a mapping (or a structured array) of columns:
    ``time_per_step``, and ``latency`` (seconds per model transfer, finite and >= 0) and/or
    ``bandwidth`` (bytes per second, > 0, inf for no limit), one value per client. It comes back
    as a (C,) structured array of float64 fields in that order (:func:`given_times` and
    :func:`given_network` read it).

    Example:
        >>> check_time_per_step([0.1, 0.2], 2)
        array([0.1, 0.2])
        >>> check_time_per_step([0.1, -1.0], 2)
        Traceback (most recent call last):
        ...
        ValueError: time_per_step[1]=-1.0 is not allowed: seconds per step must be finite and > 0
        >>> trace = check_time_per_step({"time_per_step": [0.1, 0.2], "bandwidth": [1e6, 2.5e5]}, 2)
        >>> trace.dtype.names, given_network(trace)["bandwidth"]
        (('time_per_step', 'bandwidth'), array([1000000.,  250000.]))
    """
    network = {}
    columns = _trace_columns(time_per_step)
    if columns is not None:
        unknown = [name for name in columns if name not in ("time_per_step", *NETWORK_COLUMNS)]
        if unknown:
            raise ValueError(f"time_per_step's column {unknown[0]!r} is not allowed: a trace's columns (a mapping's "
                             "keys, a structured array's fields) are time_per_step (seconds per step), latency "
                             "(seconds per model transfer) and bandwidth (bytes per second), one value per client, in "
                             "those units (a CSV's columns named in other units are converted when it is read)")
        if "time_per_step" not in columns:
            raise ValueError(f"time_per_step as a table of columns ({', '.join(map(repr, columns))}) needs a column "
                             "'time_per_step': seconds per step, one per client")
        time_per_step = columns["time_per_step"]
        network = {name: _network_column(columns[name], name, num_clients)
                   for name in NETWORK_COLUMNS if name in columns}
    times = _checked_times(time_per_step, num_clients)
    if speed_change_prob > 0:
        raise ValueError(f"speed_change_prob={speed_change_prob} is not allowed with time_per_step: a speed change "
                         "re-draws t_i from the heterogeneity model, which the given times replace (set it to 0)")
    if legacy_seed is not None:
        raise ValueError(f"speed_legacy_seed={legacy_seed} is not allowed with time_per_step: it seeds drawn idle "
                         "times, and the times are given, not drawn (set it to None)")
    return trace_array(times, network)


def trace_array(times: np.ndarray, network: dict[str, np.ndarray]) -> np.ndarray:
    """The seconds per step alone where ``network`` is empty, else a structured array of them and
    the ``network`` columns (:data:`NETWORK_COLUMNS` order), float64 fields.

    >>> trace_array(np.array([0.1]), {"bandwidth": np.array([1e6])}).dtype.names
    ('time_per_step', 'bandwidth')
    """
    if not network:
        return times
    names = [name for name in NETWORK_COLUMNS if name in network]
    trace = np.empty(len(times), dtype=[("time_per_step", "<f8"), *((name, "<f8") for name in names)])
    trace["time_per_step"] = times
    for name in names:
        trace[name] = network[name]
    return trace


def given_times(given: np.ndarray) -> np.ndarray:
    """The seconds per step of a checked ``time_per_step`` (:func:`check_time_per_step`): the array
    itself, or a trace's ``time_per_step`` column.

    >>> given_times(check_time_per_step({"time_per_step": [0.1], "latency": [0.5]}, 1))
    array([0.1])
    """
    return np.ascontiguousarray(given["time_per_step"]) if given.dtype.names else given


def given_network(given: np.ndarray) -> dict[str, np.ndarray]:
    """The per-client network columns (``latency``, ``bandwidth``) of a checked ``time_per_step``,
    by name; empty for seconds per step alone.

    >>> given_network(check_time_per_step([0.1, 0.2], 2))
    {}
    """
    names = given.dtype.names or ()
    return {name: np.ascontiguousarray(given[name]) for name in NETWORK_COLUMNS if name in names}


def _trace_columns(time_per_step) -> dict | None:
    """A trace given as columns (a mapping, a structured array, or a pandas DataFrame: anything with
    ``columns`` whose items have ``to_numpy``), by name; None for an array of times."""
    from collections.abc import Mapping

    if isinstance(time_per_step, Mapping):
        return {str(name): values for name, values in time_per_step.items()}
    columns = getattr(time_per_step, "columns", None)
    if columns is not None and not isinstance(time_per_step, np.ndarray) and callable(getattr(time_per_step, "__getitem__", None)):
        try:
            return {str(name): time_per_step[name].to_numpy() for name in columns}
        except (AttributeError, KeyError, TypeError):
            return None
    if isinstance(time_per_step, np.ndarray) and time_per_step.dtype.names:
        return {name: time_per_step[name] for name in time_per_step.dtype.names}
    return None


# What a network value may be: as time_per_step, bounded so that a round's time stays finite
NETWORK_ALLOWED = {"latency": "seconds of latency per model transfer, finite, from 0 to 1e30",
                   "bandwidth": "bytes per second, from 1e-30 (inf for no limit)"}


def _network_value_allowed(name: str, value: float) -> bool:
    """Whether ``value`` is a ``latency`` or ``bandwidth`` :data:`NETWORK_ALLOWED` allows.

    >>> _network_value_allowed("latency", 1e308), _network_value_allowed("bandwidth", float("inf"))
    (False, True)
    """
    if name == "latency":
        return math.isfinite(value) and 0 <= value <= 1e30
    return value >= 1e-30  # NaN fails too


def _network_column(values, name: str, num_clients: int) -> np.ndarray:
    """One network column of a trace as float64, or ValueError naming its first bad value."""
    from collections.abc import Mapping

    unit = NETWORK_ALLOWED[name].partition(",")[0]
    if isinstance(values, Mapping):  # pandas' DataFrame.to_dict() gives {column: {row: value}}
        raise ValueError(f"time_per_step's {name} column is a mapping ({type(values).__name__}); give its values in "
                         "client order, a list or an array (a DataFrame's to_dict('list'), or the DataFrame itself)")
    kind = np.asarray(values).dtype
    if kind == np.bool_ or not (kind == object or np.issubdtype(kind, np.integer) or np.issubdtype(kind, np.floating)):
        raise ValueError(f"time_per_step's {name} column must hold {unit}, one per client: real numbers, got an array "
                         f"of {kind}")
    missing = [index for index, value in enumerate(np.asarray(values, dtype=object).ravel()) if value is None]
    if missing:
        raise ValueError(f"time_per_step's {name}[{missing[0]}]=None is not allowed: {NETWORK_ALLOWED[name]}")
    try:
        column = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"time_per_step's {name} column must hold {unit}, one per client") from None
    if column.shape != (num_clients,):
        raise ValueError(f"time_per_step's {name} column has shape {column.shape}; expected ({num_clients},): one "
                         "value per client")
    bad = [index for index, value in enumerate(column.tolist()) if not _network_value_allowed(name, value)]
    if bad:
        raise ValueError(f"time_per_step's {name}[{bad[0]}]={float(column[bad[0]])!r} is not allowed: "
                         f"{NETWORK_ALLOWED[name]}")
    return column


def _checked_times(time_per_step, num_clients: int) -> np.ndarray:
    """The seconds per step as a fresh (C,) float64 array, or ValueError naming the first bad entry."""
    kind = np.asarray(time_per_step).dtype
    if kind != object and (not (np.issubdtype(kind, np.integer) or np.issubdtype(kind, np.floating))
                           or kind == np.bool_):
        # numpy would read "0.1" strings, True as 1 s and complex numbers (with a warning) as seconds
        raise ValueError(f"time_per_step must be an array of seconds per step, one per client: real numbers, "
                         f"got an array of {kind}")
    try:
        times = np.array(time_per_step, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"time_per_step must be an array of seconds per step, one per client; got "
                         f"{type(time_per_step).__name__}") from None
    if times.shape != (num_clients,):
        raise ValueError(f"time_per_step has shape {times.shape}; expected ({num_clients},): one time per client")
    bad = np.flatnonzero(~(np.isfinite(times) & (times > 0)))
    if bad.size:
        raise ValueError(f"time_per_step[{bad[0]}]={float(times[bad[0]])!r} is not allowed: seconds per step must be "
                         "finite and > 0")
    # as speed_mean: a rate of 1/1e-320 per second is inf, and the summary's aggregations per hour with it
    bad = np.flatnonzero((times < 1e-30) | (times > 1e30))
    if bad.size:
        raise ValueError(f"time_per_step[{bad[0]}]={float(times[bad[0]])!r} is not allowed: seconds per step from "
                         "1e-30 to 1e30 (times beyond them overflow to inf or 0 as the steps add up)")
    return times


def round_unit_scale(steps_per_round) -> np.ndarray:
    """The ``compute_scale`` of :class:`ClientSpeeds` that makes a client's round take the same
    number of steps' time whatever its data size (``speed_unit="round"``): ``mean(S) / S_i``, S_i
    the client's steps per dispatch (E·⌈n_i/B⌉ with E local epochs). A round of S_i steps then takes
    the time of mean(S) = E·S̄ steps (S̄ the mean steps per epoch) at the client's time per step,
    and a partial round of k steps that of k·mean(S)/S_i.

    Example:
        >>> round_unit_scale([10, 30, 20])
        array([2.        , 0.66666667, 1.        ])
    """
    steps = np.asarray(steps_per_round)
    if steps.ndim != 1 or steps.size == 0 or not np.issubdtype(steps.dtype, np.integer) or np.any(steps < 1):
        raise ValueError(f"steps_per_round must be a non-empty 1-D sequence of integers >= 1 (a client's steps "
                         f"per dispatch); got {np.asarray(steps_per_round)!r:.200}")
    steps = steps.astype(np.float64)
    return steps.mean() / steps


def _checked_scale(compute_scale, num_clients: int) -> array.array:
    scale = np.asarray(compute_scale, dtype=np.float64)
    if scale.shape != (num_clients,):
        raise ValueError(f"compute_scale has shape {scale.shape}; must be ({num_clients},), one factor per client")
    if not np.all(np.isfinite(scale) & (scale > 0)):
        raise ValueError("compute_scale must hold finite factors > 0")
    return array.array("d", scale.tobytes())


def _integer(name: str, value) -> int:
    """``value`` as an int (Python's or NumPy's, not a bool or a float), or a ValueError naming ``name``.

    >>> _integer("model_bytes", 1e6)
    Traceback (most recent call last):
    ValueError: model_bytes=1000000.0 is not allowed: an integer (int(1e6), not 1e6)
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not allowed: an integer, not a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name}={value!r} is not allowed: an integer (int(1e6), not 1e6)") from None


class ClientSpeeds:
    """Per-client virtual durations of local rounds, reproducible per (seed, client, round).

    Args:
        config: the speed model.
        num_clients: C, the number of clients (ids 0..C-1).
        seed: non-negative run seed; streams are derived from it by purpose.
        model_bytes: size of one model transfer, for the bandwidth term.
        time_per_step: optional (C,) positive finite seconds per step, one per client (measured
            devices, another simulator's profile): the base times ``t_i`` themselves instead of
            draws from ``config.model``. Per-round jitter and communication still apply as
            configured (``jitter=0`` replays the array exactly); speed changes, which would re-draw
            ``t_i`` from ``config.model``, and ``legacy_seed`` are refused with it. A trace with
            ``latency`` and/or ``bandwidth`` columns (:func:`check_time_per_step`) gives each client
            its own transfer time ``latency_i + model_bytes / bandwidth_i``, a column not given
            being the config's (which must then be at its default for a column given).
        compute_scale: optional (C,) finite factors > 0 multiplying the compute part of each
            client's rounds (never communication): a round of ``n`` steps computes for
            ``(n · scale_i) · t_i^(k)`` seconds. :func:`round_unit_scale` gives the factors of
            ``speed_unit="round"`` (a round's time independent of the client's data size). None
            (the default): no factor, every duration exactly as without it.

    Attributes:
        base_time_per_step: (C,) float64, read-only view of the current ``t_i``.
        rounds_done: (C,) int64, read-only view of how many rounds each client has drawn.
        compute_scale: (C,) float64 read-only view of the factors, or None.
        negative_draws: number of non-positive draws met (each one redrawn, clipped or raised);
            surfaced in run summaries so a model that often goes negative is visible.
        speed_changes: number of times some client re-drew its ``t_i``.
        given: True where ``time_per_step`` gave the base times (``config.model`` drew none).

    Example:
        >>> speeds = ClientSpeeds(SpeedConfig(model="homo", jitter=0.0), num_clients=3, seed=0)
        >>> speeds.round_duration(client=1, num_steps=10)
        1.5
        >>> measured = ClientSpeeds(SpeedConfig(jitter=0.0), 3, seed=0, time_per_step=[0.1, 0.2, 0.4])
        >>> measured.round_duration(client=2, num_steps=10)
        4.0
        >>> trace = {"time_per_step": [0.1, 0.1], "bandwidth": [1e6, 2e5]}  # bytes/s: a 1 MB model
        >>> networked = ClientSpeeds(SpeedConfig(jitter=0.0), 2, seed=0, model_bytes=1_000_000, time_per_step=trace)
        >>> networked.round_duration(client=1, num_steps=10), networked.comm_time(1)
        (11.0, 10.0)
    """

    def __init__(self, config: SpeedConfig, num_clients: int, seed: int, model_bytes: int = 0,
                 time_per_step=None, compute_scale=None):
        config.validate()
        num_clients, seed, model_bytes = (_integer(name, value) for name, value in
                                          (("num_clients", num_clients), ("seed", seed), ("model_bytes", model_bytes)))
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
        # array.array: one read per round; a checkpoint stores the column once (it never changes)
        self._scale = None if compute_scale is None else _checked_scale(compute_scale, num_clients)
        # the clients' own latency, transfer and round communication times (a trace's), or None
        self._latency = self._transfer = self._comm = None
        self._cache_constants()
        self.negative_draws = 0
        self.speed_changes = 0
        # array.array: numpy's compact layout, a fraction of its cost per scalar update (one per round)
        self._rounds_done = array.array("q", [0]) * num_clients
        self._streams = ClientStreams(seed, STREAM_CLIENT_ROUNDS, num_clients)
        self._clear_normals_ahead()
        self.given = time_per_step is not None  # the base times are the user's, not config.model's draws
        if time_per_step is not None:
            given = check_time_per_step(time_per_step, num_clients, config.speed_change_prob, config.legacy_seed)
            self._base = array.array("d", given_times(given).tobytes())
            self._floor_seconds = self._floor()  # the clip floor follows the given times, not μ
            network = given_network(given)
            if network:
                self._set_network(network)
            return
        base_rng = np.random.default_rng(np.random.SeedSequence([seed, STREAM_BASE_TIMES]))
        legacy = config.legacy_seed is not None and config.model in ("pareto", "zipf")  # PLATO's RandomState
        base = self._draw_base(np.random.RandomState(config.legacy_seed) if legacy else base_rng, num_clients)
        if config.model == "uniform" and num_clients > 1 and base.max() > base.min():
            base = self._span_ratio(base)
        for client in np.flatnonzero(base <= self._floor()):
            base[client] = self._fix_nonpositive(
                float(base[client]), int(client), lambda: float(self._draw_base(base_rng, 1)[0])
            )
        # array.array: read once per round, at a third of a numpy scalar's cost
        self._base = array.array("d", base.astype(np.float64).tobytes())

    @property
    def base_time_per_step(self) -> np.ndarray:
        """(C,) float64 read-only view of each client's current base time per step ``t_i``.

        Example:
            >>> ClientSpeeds(SpeedConfig(), 2, seed=0).base_time_per_step
            array([0.15, 0.15])
        """
        view = np.frombuffer(self._base, dtype=np.float64)
        view.flags.writeable = False
        return view

    @property
    def rounds_done(self) -> np.ndarray:
        """(C,) int64 read-only view: rounds drawn so far per client.

        Example:
            >>> ClientSpeeds(SpeedConfig(), 2, seed=0).rounds_done
            array([0, 0])
        """
        view = np.frombuffer(self._rounds_done, dtype=np.int64)
        view.flags.writeable = False
        return view

    @property
    def compute_scale(self) -> np.ndarray | None:
        """(C,) float64 read-only view of the factors on each client's compute time, or None.

        Example:
            >>> ClientSpeeds(SpeedConfig(), 2, seed=0, compute_scale=round_unit_scale([1, 3])).compute_scale
            array([2.        , 0.66666667])
        """
        if self._scale is None:
            return None
        view = np.frombuffer(self._scale, dtype=np.float64)
        view.flags.writeable = False
        return view

    @property
    def comm_varies(self) -> bool:
        """Whether clients have transfer times of their own (a trace's ``latency``/``bandwidth``
        columns); then :meth:`transfer_time`, :meth:`comm_time` and :meth:`latency_of` need the client.

        Example:
            >>> ClientSpeeds(SpeedConfig(), 2, seed=0).comm_varies
            False
        """
        return self._transfer is not None

    def latency_of(self, client: int | None = None) -> float:
        """Seconds of latency of one model transfer (or request) of ``client``: its trace's, else
        the config's ``latency``.

        Example:
            >>> ClientSpeeds(SpeedConfig(latency=0.5), 1, 0).latency_of()
            0.5
        """
        if self._latency is None:
            return float(self.config.latency)
        return self._latency[self._client_of(client, "latency_of")]

    def transfer_time(self, client: int | None = None) -> float:
        """Seconds for one model transfer (one direction) of ``client``: ``latency + model_bytes /
        bandwidth``, its own where a trace gives them (``client`` is needed then).

        Example:
            >>> ClientSpeeds(SpeedConfig(latency=0.5, bandwidth=1e6), 1, 0, model_bytes=2_000_000).transfer_time()
            2.5
        """
        if self._transfer is None:
            return float(self.config.latency + self.model_bytes / self.config.bandwidth)
        return self._transfer[self._client_of(client, "transfer_time")]

    def comm_time(self, client: int | None = None) -> float:
        """Communication seconds per round of ``client``: download plus upload, ``2 · transfer_time()``.

        Example:
            >>> ClientSpeeds(SpeedConfig(latency=0.5, bandwidth=1e6), 1, 0, model_bytes=2_000_000).comm_time()
            5.0
        """
        if self._comm is None:
            return self._comm_seconds
        return self._comm[self._client_of(client, "comm_time")]

    def _client_of(self, client, method: str) -> int:
        if client is None:
            raise ValueError(f"{method}() needs the client: the clients' transfer times differ (the trace's "
                             "latency or bandwidth column)")
        client = operator.index(client)
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client={client} out of range [0, {self.num_clients})")
        return client

    def _set_network(self, network: dict) -> None:
        """Each client's transfer time from a trace's network columns (the config's for one not given)."""
        for name in NETWORK_COLUMNS:
            default = _FIELD_DEFAULTS[name]
            if name in network and getattr(self.config, name) != default:
                raise ValueError(f"SpeedConfig.{name}={getattr(self.config, name)!r} is not allowed with a "
                                 f"time_per_step trace that has a {name} column: the trace gives each client's "
                                 f"(leave it at its default {default!r})")
        latency = network.get("latency", np.full(self.num_clients, float(self.config.latency)))
        bandwidth = network.get("bandwidth", np.full(self.num_clients, float(self.config.bandwidth)))
        # the scalar formula, elementwise: latency + model_bytes / bandwidth, and twice that a round
        transfer = latency + self.model_bytes / bandwidth
        self._latency = array.array("d", latency.astype(np.float64).tobytes()) if "latency" in network else None
        self._transfer = array.array("d", transfer.astype(np.float64).tobytes())
        self._comm = array.array("d", (2.0 * transfer).astype(np.float64).tobytes())

    def round_duration(self, client: int, num_steps: int) -> float:
        """Virtual seconds of ``client``'s next round of ``num_steps`` local steps.

        Each call is one round: it first applies a speed change if one is drawn, then one jitter
        draw ``t_i^(k)`` covers all steps, and adds :meth:`comm_time`. The same random numbers
        are consumed whatever ``num_steps`` is (0 included), so a client's k-th round speed does
        not depend on its step counts. With a ``compute_scale`` the compute part is
        ``(num_steps · scale_i) · t_i^(k)``.

        Example:
            >>> speeds = ClientSpeeds(SpeedConfig(model="exp"), num_clients=4, seed=7)
            >>> speeds.round_duration(2, 10) > 0
            True
        """
        if type(client) is not int:
            client = operator.index(client)
        if type(num_steps) is not int:
            num_steps = operator.index(num_steps)
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client={client} out of range [0, {self.num_clients})")
        if num_steps < 0:
            raise ValueError(f"num_steps={num_steps}; must be >= 0")
        if self._normals_only:  # the stream gives the jitter's standard normals alone: drawn ahead
            base_time = self._base[client]
            jitter_std = self._jitter * base_time
            left = self._ahead_left[client]
            if left:
                normal = self._ahead[self._ahead_end[client] - left]
                self._ahead_left[client] = left - 1
            else:
                normal = self._draw_normals(client)
            # Generator.normal(loc, scale) is loc + scale * standard_normal() in C, with the same
            # two double operations
            step_time = base_time + jitter_std * normal
            # _fix_nonpositive leaves draws above the floor as they are; skipping the call (and
            # its closure) for them is most of a round's cost at 10^6 clients.
            if step_time <= self._floor_seconds:
                step_time = self._fix_nonpositive(
                    step_time, client, lambda: base_time + jitter_std * self._next_normal(client)
                )
            self._rounds_done[client] += 1
            comm = self._comm_seconds if self._comm is None else self._comm[client]
            if self._scale is not None:
                return (num_steps * self._scale[client]) * step_time + comm
            return num_steps * step_time + comm
        streams = self._streams
        rng = streams.load(client)
        # Saved even when a draw raises (negative="error"), as the client's own Generator was.
        try:
            config = self.config
            # `speed_change_prob == 0` skips the uniform draw altogether; determinism only needs the
            # draws to be a function of (config, seed, client, round), and config includes the prob.
            if config.speed_change_prob > 0 and rng.random() < config.speed_change_prob:
                self._base[client] = self._fix_nonpositive(
                    float(self._draw_base(rng, 1)[0]), client, lambda: float(self._draw_base(rng, 1)[0])
                )
                self.speed_changes += 1
            base_time = self._base[client]
            if config.jitter > 0:
                jitter_std = config.jitter * base_time
                step_time = base_time + jitter_std * rng.standard_normal()
                if step_time <= self._floor_seconds:
                    step_time = self._fix_nonpositive(
                        step_time, client, lambda: base_time + jitter_std * rng.standard_normal()
                    )
            else:
                step_time = base_time
        finally:
            streams.save(client)
        self._rounds_done[client] += 1
        comm = self._comm_seconds if self._comm is None else self._comm[client]
        if self._scale is not None:
            return (num_steps * self._scale[client]) * step_time + comm
        return num_steps * step_time + comm

    def round_durations(self, clients, num_steps: int) -> list[float]:
        """:meth:`round_duration` of each of ``clients`` in turn (each one round of ``num_steps``): the
        same values, and the streams, counters and rounds left as those calls leave them.

        A first wave (many clients drawing their first round, a jittered model with no speed
        changes: FedCompass dispatching 10^6 clients at t = 0) is drawn as arrays: each fresh
        stream's one PCG64 step and numpy's ziggurat fast path, computed for all the clients at
        once (0.04 µs a client against 1.5 µs); the draws that path does not give (~1 %: numpy's
        slow path, a non-positive time) are made one at a time as before. Clients are checked
        before anything is drawn.

        Example:
            >>> speeds = ClientSpeeds(SpeedConfig(model="exp"), num_clients=4, seed=7)
            >>> one = ClientSpeeds(SpeedConfig(model="exp"), num_clients=4, seed=7)
            >>> speeds.round_durations([2, 0, 3], 10) == [one.round_duration(c, 10) for c in (2, 0, 3)]
            True
        """
        clients = list(clients)
        if clients and set(map(type, clients)) != {int}:  # in C: a tenth of a loop in Python
            clients = [operator.index(client) for client in clients]
        if type(num_steps) is not int:
            num_steps = operator.index(num_steps)
        if clients and not (0 <= min(clients) and max(clients) < self.num_clients):
            bad = next(client for client in clients if not 0 <= client < self.num_clients)
            raise ValueError(f"client={bad} out of range [0, {self.num_clients})")
        if num_steps < 0:
            raise ValueError(f"num_steps={num_steps}; must be >= 0")
        ids = np.asarray(clients, dtype=np.int64)
        table, touched = self._streams._table, self._streams._touched
        # a subclass drawing its own way (tests' references) is called round by round
        bulk = ids.size >= _BULK_FIRST_DRAWS and self._normals_only and type(self).round_duration is ClientSpeeds.round_duration
        positions = np.flatnonzero(~touched[ids]) if bulk else ids[:0]
        tables = _ziggurat_tables() if positions.size >= _BULK_FIRST_DRAWS else None
        one_at_a_time = tables is None
        if not one_at_a_time:  # a federation-sized check, so only for a first wave drawn in bulk
            seen = np.zeros(self.num_clients, dtype=bool)
            seen[ids] = True
            one_at_a_time = np.count_nonzero(seen) != ids.size  # a client twice: its second round after its first
        if one_at_a_time:
            return [self.round_duration(client, num_steps) for client in clients]
        durations = np.empty(ids.size)
        drawn = np.zeros(ids.size, dtype=bool)
        base_all, rounds = np.frombuffer(self._base, dtype=np.float64), np.frombuffer(self._rounds_done, dtype=np.int64)
        scale_all = None if self._scale is None else np.frombuffer(self._scale, dtype=np.float64)
        comm_all = None if self._comm is None else np.frombuffer(self._comm, dtype=np.float64)
        for start in range(0, positions.size, _SEED_BLOCK):  # blocks: the temporaries stay small
            block = positions[start:start + _SEED_BLOCK]
            block_clients = ids[block]
            normals, fast, state_lo, state_hi = _first_normals(table[block_clients], *tables)
            base = base_all[block_clients]
            # the scalar draw's operations, elementwise: base + (jitter·base)·z, then steps·t + comm
            step_time = base + (self._jitter * base) * normals
            done = fast & (step_time > self._floor_seconds)
            done_clients = block_clients[done]
            comm = self._comm_seconds if comm_all is None else comm_all[done_clients]
            if scale_all is None:
                durations[block[done]] = float(num_steps) * step_time[done] + comm
            else:  # as the scalar path: (steps · scale_i) · t, then + comm
                durations[block[done]] = (float(num_steps) * scale_all[done_clients]) * step_time[done] + comm
            drawn[block[done]] = True
            table[done_clients, 0], table[done_clients, 1] = state_lo[done], state_hi[done]
            touched[done_clients] = True
            rounds[done_clients] += 1
        result = durations.tolist()
        for position in np.flatnonzero(~drawn).tolist():
            result[position] = self.round_duration(clients[position], num_steps)
        return result

    def state_dict(self) -> dict:
        """JSON-able snapshot: config, current ``t_i``, counters and the state of every client stream
        that has drawn (:meth:`ClientStreams.state_dict`).

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
            "base_time_per_step": self._base.tolist(),
            "rounds_done": self._rounds_done.tolist(),
            "negative_draws": self.negative_draws,
            "speed_changes": self.speed_changes,
            "client_streams": self._streams.state_dict(),
            "normals_ahead": self._normals_ahead_state(),
            "compute_scale": None if self._scale is None else self._scale.tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output; the next rounds continue the saved sequence.

        The config, client count, seed and model size must match this object's: resuming under a
        different speed model would silently splice two experiments. The ``compute_scale`` is the
        state's (none in a state written before it existed).

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
        # a checkpoint written before a SpeedConfig field existed holds that field's default
        state = {**state, "config": {**dataclasses.asdict(SpeedConfig()), **state["config"]}}
        for key, value in expected.items():
            if state[key] != value:
                raise ValueError(
                    f"state_dict {key}={state[key]!r} does not match this ClientSpeeds ({key}={value!r})"
                )
        base = np.asarray(state["base_time_per_step"], dtype=np.float64)
        rounds = np.asarray(state["rounds_done"], dtype=np.int64)
        if base.shape != (self.num_clients,) or rounds.shape != (self.num_clients,):
            raise ValueError(f"state_dict arrays must have shape ({self.num_clients},)")
        # a state from before the normals drawn ahead has none (its streams are where its rounds are)
        ahead = self._checked_normals_ahead(state.get("normals_ahead", {"clients": [], "values": []}))
        # a state from before compute_scale existed had none
        scale = state.get("compute_scale")
        scale = None if scale is None else _checked_scale(scale, self.num_clients)
        self._streams.load_state_dict(state["client_streams"])  # checks all before changing anything
        self._set_normals_ahead(ahead)
        self._base = array.array("d", base.tobytes())
        self._rounds_done = array.array("q", rounds.tobytes())
        self.negative_draws = int(state["negative_draws"])
        self.speed_changes = int(state["speed_changes"])
        self._scale = scale

    def __repr__(self) -> str:
        return (
            f"ClientSpeeds(model={self.config.model!r}, num_clients={self.num_clients}, "
            f"seed={self.seed}, negative_draws={self.negative_draws})"
        )

    def __setstate__(self, state: dict) -> None:
        if isinstance(state.get("_rounds_done"), np.ndarray):  # pickled before it was an array.array
            state["_rounds_done"] = array.array("q", state["_rounds_done"].astype(np.int64).tobytes())
        if isinstance(state.get("_base"), np.ndarray):  # pickled before it was an array.array
            state["_base"] = array.array("d", state["_base"].astype(np.float64).tobytes())
        state.setdefault("_scale", None)  # pickled before compute_scale existed: none
        for name in ("_latency", "_transfer", "_comm"):  # pickled before traces gave them: the config's for all
            state.setdefault(name, None)
        self.__dict__.update(state)
        self._cache_constants()  # pickles from before the cache restore with it
        if "_ahead" not in state:  # pickled before normals were drawn ahead: none are
            self._clear_normals_ahead()

    # -- internals ------------------------------------------------------------------------------

    def _cache_constants(self) -> None:
        """The per-round constants, fixed by the config and the model size: computed once, not per round."""
        # the config's (a trace's own times per client are in _comm)
        self._comm_seconds = 2.0 * float(self.config.latency + self.model_bytes / self.config.bandwidth)
        self._floor_seconds = self._floor()
        self._jitter = self.config.jitter
        # a round's only draws are its jitter's standard normals (redraws of a non-positive one
        # included), so they may be drawn ahead (see NORMALS_AHEAD)
        self._normals_only = self.config.jitter > 0 and self.config.speed_change_prob == 0

    def _clear_normals_ahead(self) -> None:
        """No standard normal drawn ahead for any client (the table is made at the first block drawn)."""
        # The values kept, NORMALS_AHEAD - 1 slots per client that drew a block, in the order clients
        # first did (memory follows those clients, not the federation: a table of every client's slots
        # was written page by page by the few fast clients of a short 10^6-client run, 56 MB more);
        # per client: where its slots end in _ahead (0: none yet; made at its first block) and how
        # many of its values are left.
        self._ahead = array.array("d")
        self._ahead_end = None
        # array.array, not bytearray: a checkpoint stores per-client array.array columns once
        # (jaxfl.checkpoint), so only the few clients whose count changed are in each state.pkl
        self._ahead_left = array.array("B", bytes(self.num_clients))

    def _next_normal(self, client: int) -> float:
        """The next standard normal of ``client``'s stream: a value drawn ahead, or new ones."""
        left = self._ahead_left[client]
        if left:
            self._ahead_left[client] = left - 1
            return self._ahead[self._ahead_end[client] - left]
        return self._draw_normals(client)

    def _draw_normals(self, client: int) -> float:
        """Draw ``client``'s next standard normal from its stream, and with it (from its third round
        on) the NORMALS_AHEAD − 1 after it, kept in its slots for its next rounds. A client's first
        two rounds draw one at a time: a block costs 0.7 µs more than one draw, which pays only over
        the rounds after (a 10^6-client FedCompass run of 20,000 updates, two rounds a client at
        most, spent 4 % more after its warm-up with a block at the second round)."""
        streams = self._streams
        alone = self._rounds_done[client] < 2
        rng = streams.load(client)
        try:
            if alone:
                return rng.standard_normal()
            normals = rng.standard_normal(NORMALS_AHEAD)
        finally:
            streams.save(client)
        self._keep_ahead(client, normals[1:].tobytes())
        return float(normals[0])

    def _keep_ahead(self, client: int, values: bytes) -> None:
        """Keep ``values`` (float64 bytes, at most NORMALS_AHEAD − 1 of them) as ``client``'s next
        standard normals, in its slots (made now if it has none)."""
        if self._ahead_end is None:
            self._ahead_end = array.array("q", [0]) * self.num_clients
        end = self._ahead_end[client]
        if not end:
            self._ahead.frombytes(bytes(8 * _AHEAD_KEPT))
            end = self._ahead_end[client] = len(self._ahead)
        count = len(values) // 8
        with memoryview(self._ahead) as view:  # released before the array may grow again
            view.cast("B")[8 * (end - count):8 * end] = values
        self._ahead_left[client] = count

    def _normals_ahead_state(self) -> dict:
        """The values drawn ahead and not used yet, per client, in the order they will be used."""
        clients = np.flatnonzero(np.frombuffer(self._ahead_left, dtype=np.uint8))
        values = []
        for client in clients.tolist():
            end = self._ahead_end[client]
            values.append(self._ahead[end - self._ahead_left[client]:end].tolist())
        return {"clients": clients.tolist(), "values": values}

    def _checked_normals_ahead(self, state: dict) -> list[tuple[int, list[float]]]:
        """:meth:`_normals_ahead_state` output as (client, values) pairs, refused unless it fits these clients."""
        clients, values = list(state["clients"]), list(state["values"])
        if len(clients) != len(values) or any(
                not 0 <= client < self.num_clients or not 1 <= len(kept) <= _AHEAD_KEPT
                for client, kept in zip(clients, values)):
            raise ValueError(f"normals drawn ahead: clients must be ids in [0, {self.num_clients}), each with "
                             f"1 to {_AHEAD_KEPT} values")
        return [(int(client), [float(value) for value in kept]) for client, kept in zip(clients, values)]

    def _set_normals_ahead(self, pairs: list[tuple[int, list[float]]]) -> None:
        """Keep each client's values to be used next, in order (:meth:`_checked_normals_ahead` pairs)."""
        self._clear_normals_ahead()
        for client, kept in pairs:
            self._keep_ahead(client, array.array("d", kept).tobytes())

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
        if config.model == "uniform":
            fastest = self._uniform_fastest()
            return rng.uniform(fastest, config.ratio * fastest, size).astype(np.float64)
        if config.model == "pareto":
            idle = rng.pareto(config.pareto_shape, size)
        else:  # zipf
            idle = rng.zipf(config.zipf_s, size).astype(np.float64)
        idle = np.minimum(idle, config.cap)
        return mean * (1.0 + idle / config.reference_time)

    def _uniform_fastest(self) -> float:
        """``uniform``'s fastest client's time a = 2μ/(1+R), so that [a, R·a] has mean μ."""
        return 2.0 * self.config.mean / (1.0 + self.config.ratio)

    def _span_ratio(self, draws: np.ndarray) -> np.ndarray:
        """``uniform``'s draws stretched so that the fastest client takes exactly ``a`` and the slowest
        exactly ``R·a``: FedASMU states the gap between its fastest and slowest device (5×, and
        110×–440×), which plain draws reach only for very many clients (100 draws on [a, 440a] span
        about 140×). Given its two extremes, the other draws are independent and uniform between them,
        so the affine map leaves them independent and uniform on [a, R·a], "sampled at random in between"."""
        fastest = self._uniform_fastest()
        low, high = draws.min(), draws.max()
        spread = (draws - low) / (high - low)
        return fastest + spread * (self.config.ratio - 1.0) * fastest

    def _floor(self) -> float:
        """Smallest value that may pass through :meth:`_fix_nonpositive` unchanged: under ``clip``,
        min_time_ratio·μ, or with given times (``time_per_step``) min_time_ratio times the fastest
        given time (μ, unread then, floored given times of 1 ms at 1.5 ms: 0.01 × the default 0.15 s),
        or for ``uniform`` times min_time_ratio times its fastest client's a = 2μ/(1+R) (0.01μ raised
        that client at R = 440, and the slowest was 200× the fastest instead of 440×)."""
        if self.config.negative != "clip":
            return 0.0
        if getattr(self, "given", False):
            return self.config.min_time_ratio * min(self._base)
        if self.config.model == "uniform":  # its fastest client's time a = 2μ/(1+R): 0.0045μ at R = 440, kept
            return self.config.min_time_ratio * self._uniform_fastest()
        return self.config.min_time_ratio * self.config.mean

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
                raise NegativeTimeError(
                    f"non-positive time per step {value!r} drawn for client {client} (heterogeneity "
                    f"{self.config.model!r}); negative_times (--negative-times) is 'error': set it to 'redraw' "
                    f"or 'clip' (allowed: {', '.join(NEGATIVE_POLICIES)}), or draw fewer negative times "
                    "(a smaller jitter or spread)"
                )
            if policy == "clip":
                break
            attempts += 1
            if attempts > _MAX_REDRAWS:
                raise NegativeTimeError(
                    f"client {client}: {_MAX_REDRAWS} consecutive non-positive times per step drawn "
                    "(negative_times 'redraw'): the speed distribution has almost no positive mass; use "
                    "negative_times 'clip' (--negative-times clip) or a smaller jitter or spread"
                )
            value = redraw()
        return max(value, self._floor())


class NegativeTimeError(ValueError):
    """A drawn time per step is not positive and ``negative_times`` is ``error`` (or ``redraw`` found
    no positive draw). Drawn as the run goes, so a run stops at it with its logs and a summary, as at
    a numerical error (:mod:`jaxfl.experiment`)."""


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

    def latency_of(self, client: int | None = None) -> float:
        return self.latency

    def comm_time(self, client: int | None = None) -> float:
        return 2 * self.latency

    def round_duration(self, client: int, num_steps: int) -> float:
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client={client} out of range [0, {self.num_clients})")
        step_time = float(self.time_per_step(client, int(self._rounds_done[client])))
        if not step_time > 0:
            raise ValueError(f"time per step {step_time} for client {client} must be > 0")
        self._rounds_done[client] += 1
        return num_steps * step_time + self.comm_time()
