"""One validated configuration for a run (plain Python; no jax).

Every field has a default chosen from the seed papers (FedCompass MNIST settings, spec §5.4, §6)
scaled to the embedded data set. :func:`validate` checks types, ranges, names and combinations
before any work is done and raises :class:`ConfigError` naming the field, the value and what is
allowed.

>>> config = RunConfig(algorithm="fedavg", clients=5)
>>> validate(config).clients
5
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

ALGORITHM_NAMES = ("fedavg", "fedavgm", "fedasync", "fedbuff", "fedcompass", "fedcompass_m", "fedcompass_n",
                   "fedat", "port", "ccfedavg", "fedasmu", "fedadam", "fedyogi", "fedadagrad")
# FedOpt (Reddi et al. 2021) named algorithms: FedAvg + this server optimiser.
FEDOPT_ALGORITHMS = {"fedadam": "adam", "fedyogi": "yogi", "fedadagrad": "adagrad"}
# server_lr when not set: FedAvg's 1 for sgd; for the adaptive optimisers the FedOpt paper's best
# CIFAR-10 server rates as we read them (10^-2 Adam/Yogi, 10^-1 Adagrad; τ = eps = 1e-3) — verify.
DEFAULT_SERVER_LR = {"sgd": 1.0, "adam": 1e-2, "yogi": 1e-2, "adagrad": 1e-1}
PORT_SWITCHES = {  # field → allowed values, the paper's first (jaxfl.algorithms.port.PortOptions)
    "port_cosine": ("own", "current"),
    "port_bound_rule": ("strict", "exceeds"),
    "port_replace": ("all", "step2"),
}
PORT_PRESETS = ("paper", "plato")
CC_STRATEGIES = ("cc", "strategy1", "strategy2", "cc_c", "dropout", "fednova")
CC_BUDGETS = ("levels", "two_group")
CC_SCHEDULES = ("adhoc", "round_robin")
CC_NOVA_STEPS = ("ceil", "floor")
FEDASMU_SLOTS = ("first", "middle", "second_last", "adaptive")
# Algorithms whose aggregations are pseudo-gradients Σ c_i Δ_i ("delta" mode): FedNova applies.
DELTA_MODE_ALGORITHMS = ("fedavg", "fedavgm", "fedasync", "fedbuff", "fedcompass", "fedcompass_m", "ccfedavg",
                         "fedadam", "fedyogi", "fedadagrad")
COMPASS_SWITCHES = {  # field → allowed values, the paper's first (jaxfl.algorithms.fedcompass)
    "compass_speed_estimate": ("latest", "ema"),
    "compass_staleness_at": ("buffer", "aggregation"),
    "compass_create_rule": ("t_a", "t_max"),
    "compass_create_far_groups": ("clamp", "skip"),
    "compass_fastest_over": ("pending", "all"),
    "compass_empty_timer": ("apply", "skip"),
}
COMPASS_PRESETS = ("paper", "reference_code")
NONFINITE_POLICIES = ("stop", "skip")
FEDAT_PROFILING = ("round", "oracle")
DATASET_NAMES = ("mnist10k", "fashion_mnist", "mnist", "digits", "npz", "array_record", "synthetic",
                 "synthetic_iid")  # jaxfl.data.load_dataset
DATASET_PREFIXES = ("tfds:", "synthetic:")  # tfds:cifar10, synthetic:0.5,0.5
MODEL_NAMES = ("cnn", "mlp", "logreg", "lenet5", "ccfedavg_cnn", "ccfedavg_mlp", "fedasmu_cnn", "resnet18",
               "resnet18_gn", "textcnn", "lstm")  # jaxfl.models.MODELS (register_model extends it)
PARTITION_NAMES = ("iid", "dirichlet", "dirichlet_client", "class", "dual_dirichlet", "label_shards", "gamma_mix",
                   "natural")  # jaxfl.data.PARTITIONS
CLIENT_SIZES = ("equal", "lognormal", "powerlaw")
HETEROGENEITY_NAMES = ("homo", "normal", "exp", "pareto", "zipf")
CLIENT_WEIGHTS = ("samples", "uniform")
CLIENT_OPTIMIZERS = ("adam", "sgd", "adamw")
SERVER_OPTIMIZER_NAMES = ("sgd", "adam", "yogi", "adagrad")
STALENESS_NAMES = ("constant", "polynomial", "hinge", "exponential")
RULES = ("fedcompass", "paper")
# FedCompass's MNIST target is 90%; Fashion-MNIST is harder (a centrally trained CNN gets ~91%).
# CIFAR-10: FedCompass's class-partition target. Other datasets: DEFAULT_TARGET_OTHER.
DEFAULT_TARGETS = {"mnist10k": 0.9, "mnist": 0.9, "fashion_mnist": 0.8, "digits": 0.9, "tfds:mnist": 0.9,
                   "tfds:fashion_mnist": 0.8, "tfds:cifar10": 0.6}
DEFAULT_TARGET_OTHER = 0.7
NEGATIVE_POLICIES = ("redraw", "clip", "error")
AUGMENTATIONS = ("auto", "none", "crop_flip")  # auto: crop_flip for CIFAR-10/100 (jaxfl.data.augment.AUGMENTED)


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field, the value and what is allowed."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run. Field names are also the CLI flags (``--local-steps``)."""

    algorithm: str = "fedbuff"
    dataset: str = "mnist10k"
    data_dir: str | None = None
    model: str = "cnn"
    clients: int = 10
    partition: str = "iid"
    dirichlet_alpha: float = 0.5
    client_sizes: str = "equal"  # iid / dirichlet_client partition sizes: equal, lognormal or powerlaw
    size_skew: float = 1.0  # sigma (lognormal) or tail index (powerlaw) of those client sizes
    shards_per_client: int = 2  # label_shards (McMahan et al.)
    gamma: float = 0.1  # gamma_mix: the IID fraction (CC-FedAvg; 0.1 = "90% non-IID")
    client_weights: str = "samples"  # p_i: relative sample size (paper) or uniform 1/m
    # client speeds (spec fedcompass.md §6)
    heterogeneity: str = "exp"
    speed_mean: float = 0.15  # μ seconds per local step (MNIST, batch 64)
    jitter: float = 0.05  # per-round t_i^(k) ~ N(t_i, (jitter·t_i)^2)
    speed_change_prob: float = 0.0
    speed_cap: float = 30.0  # pareto/zipf idle-time cap (PORT)
    negative_times: str = "redraw"
    latency: float = 0.0  # seconds per model transfer
    bandwidth: float = math.inf  # bytes per second
    # local training
    local_steps: int = 50  # Q
    batch_size: int = 64
    client_optimizer: str = "adam"
    client_lr: float = 0.003
    augment: str = "auto"  # on-device training augmentation: auto (crop+flip for CIFAR) | none | crop_flip
    normalize: bool = False  # (x - mean) / std with the dataset's statistics (FedCompass MNIST: ToTensor only)
    # server
    server_optimizer: str = "sgd"
    server_lr: float | None = None  # None: 1 for sgd (FedAvg), DEFAULT_SERVER_LR for adam/yogi/adagrad
    server_momentum: float | None = None  # None: 0.9 for fedavgm, 0 otherwise
    clients_per_round: int | None = None  # synchronous methods; None: all clients
    buffer_size: int = 3  # FedBuff K
    # FedCompass (spec fedcompass.md §2, §10): None = 0.2·Q_max and Q_max = local_steps (Table 9)
    compass_q_min: int | None = None
    compass_q_max: int | None = None
    compass_lambda: float | None = None  # latest time factor λ: 1.2 (paper), 1.5 (legacy code)
    compass_preset: str = "paper"  # defaults of the switches below: the paper or the reference code
    compass_speed_estimate: str | None = None  # latest sample (paper) | ema (code: 0.9 on newest)
    compass_staleness_at: str | None = None  # buffer time (paper) | aggregation time (new repo)
    compass_create_rule: str | None = None  # CREATEGROUP lines up with T_a (paper) | T_max (code)
    compass_create_far_groups: str | None = None  # clamp q to Q_max (paper) | skip groups (code)
    compass_join_max_factor: float | None = None  # JOINGROUP accepts q ≤ factor·Q_max: 1 | 1.2 (legacy)
    compass_fastest_over: str | None = None  # fastest client of a group: pending (paper) | all (code)
    compass_lr_decay: bool | None = None  # legacy client lr × 0.995^floor(steps/Q_max)
    compass_empty_timer: str | None = None  # timer on a group with no arrivals: apply (paper) | skip
    fedat_tier_ratio: float = 2.0  # υ: clients within this speed ratio share a tier
    fedat_profiling: str = "round"  # round: a FedAvg round measures speeds | oracle: true speeds
    rule: str = "fedcompass"  # update-rule form of FedAsync/FedBuff: authors' framework or original paper
    staleness: str = "polynomial"
    staleness_alpha: float = 0.9
    staleness_a: float = 0.5
    # PLATO's client-speed model (PORT spec §5.2): pareto/zipf idle time s_i per epoch
    speed_reference_time: float = 10.0  # t_i = μ(1 + s_i/ref): PLATO's avg_training_time per epoch (LeNet: 10 s)
    speed_legacy_seed: int | None = None  # idle times from NumPy's RandomState(seed) as PLATO (1: spec table)
    # PORT (spec port.md §2, §8); the switches default to the preset's value (None)
    port_min_clients: int | None = None  # K; None: ceil(P/4), the paper's K = 5 of 20 in flight (MNIST)
    port_staleness_bound: float = 10.0  # Ω, the paper's sweet spot; inf: no bound
    port_alpha: float = 3.0  # α, staleness weight (paper's tuned α:β = 3:1)
    port_beta: float = 1.0  # β, interference (cosine) weight; 0 switches the cosine term off
    port_clients_in_flight: int | None = None  # P; None: every client [ours; PLATO: 20 of 100]
    port_preset: str = "paper"  # paper | plato: every PLATO-code behaviour below at once
    port_cosine: str | None = None  # own: u_k = w_k − w_start (paper) | current: w_k − w_τ (PLATO)
    port_cosine_skip_staleness: int | None = None  # cos forced to 1 when S ≤ this: -1, never (paper) | 1 (PLATO)
    port_cosine_skip_rounds: int | None = None  # cos forced to 1 in the first aggregations: 1 (paper) | 2 (PLATO)
    port_bound_rule: str | None = None  # strict: aggregated S < Ω (paper) | exceeds: wait while S > Ω (PLATO)
    port_replace: str | None = None  # all: keep P in flight (paper) | step2: replace only the K (PLATO)
    # CC-FedAvg (spec ccfedavg.md §2–§4)
    cc_strategy: str = "cc"  # cc (Strategy 3) | strategy1 | strategy2 | cc_c | dropout | fednova
    cc_budget: str = "levels"  # levels: p_i = (1/2)^floor(β i / N) | two_group: the (r, W) model
    cc_budget_beta: int = 4  # β budget levels (4 in every main table of the paper)
    cc_insufficient_fraction: float = 0.75  # r of two_group (β = 4 levels give r ≈ 0.75)
    cc_window: int = 4  # W of two_group: an insufficient client's p = 1/W
    cc_schedule: str = "adhoc"  # adhoc: Bernoulli(p_i) each round (paper default) | round_robin: t mod 1/p_i = 0
    cc_switch_round: int = 100  # τ of CC-FedAvg(c): Strategy 3 before, Strategy 2 from this round
    cc_total_rounds: int | None = None  # T of FedAvg(dropout)'s quota p_i·T; None: max_updates or 400 (paper)
    cc_nova_steps: str = "ceil"  # fednova baseline steps: ceil(p_i K) (paper) | floor (code)
    # FedASMU (spec fedasmu.md §2–§5); [ours] = not given by the paper
    fedasmu_epochs: int = 5  # 𝓛 local "epochs" of local_steps/𝓛 steps each [ours]
    fedasmu_slot: str = "middle"  # fetch after epoch: first | middle | second_last (H1–H3) | adaptive
    fedasmu_staleness_bound: int = 99  # τ: uploads with s > τ are dropped
    fedasmu_trigger_period: float = 5.0  # 𝒯 seconds between triggers (appendix: one device every 5 s)
    fedasmu_trigger_batch: int = 1  # m' devices per trigger (appendix: 1; Table 5: 10)
    fedasmu_max_concurrency: int | None = None  # devices training at once; None: ceil(0.1 m) (paper)
    fedasmu_fetch: bool = True  # fetch and mix a fresh global model (False: FedASMU-FA)
    fedasmu_dynamic: bool = True  # learn (λ, σ, ι) and (γ, ν) (False: FedASMU-DA, frozen)
    fedasmu_mu_alpha: float = 1.0  # μ_α [ours]
    fedasmu_mu_beta: float = 1.0  # μ_β [ours]
    fedasmu_alpha_min: float = 0.01  # α clipped to [α_min, 1] [ours]
    fedasmu_lr_lambda: float = 1e-4  # η_λ (Table 5, LeNet/FMNIST)
    fedasmu_lr_sigma: float = 1e-4  # η_σ
    fedasmu_lr_iota: float = 1e-4  # η_ι
    fedasmu_lr_gamma: float = 1e-4  # η_γ
    fedasmu_lr_nu: float = 1e-4  # η_ν
    fedasmu_lambda0: float = 1.0  # initial λ [ours]
    fedasmu_sigma0: float = 0.5  # initial σ [ours: FedAsync's polynomial a = 0.5]
    fedasmu_iota0: float = 0.0  # initial ι [ours]
    fedasmu_gamma0: float = 1.0  # initial γ [ours]
    fedasmu_nu0: float = 0.0  # initial ν [ours]
    # options several seeds compare against
    prox_mu: float = 0.0  # FedProx μ: local objective + μ/2 ‖w − w_start‖² (0: off)
    fednova: bool = False  # FedNova: normalise delta-mode aggregations by local steps
    # faults and robustness (issue 5)
    crash_prob: float = 0.0  # per dispatch: the client crashes mid-round and never returns
    delay_prob: float = 0.0  # per dispatch: the update returns delay_factor × later
    delay_factor: float = 10.0
    dropout_prob: float = 0.0  # per dispatch: the client goes offline for Exp(dropout_mean) s
    dropout_mean: float = 60.0
    round_timeout: float | None = None  # rounds (FedAvg, FedAT tiers, CC-FedAvg) close after this; PORT, FedASMU: per dispatch
    on_nonfinite: str = "stop"  # a NaN/Inf update stops the run, or is skipped and counted
    checkpoint_every: int | None = 25  # global updates between checkpoints (None: only at the end)
    memory_limit_mb: float | None = None  # memory one training call may use (None: what is free)
    # budget and evaluation
    max_time: float = 3000.0  # virtual seconds
    max_updates: int | None = None
    target_accuracy: float | None = None  # None: DEFAULT_TARGETS[dataset]
    stop_at_target: bool = True
    eval_every: int = 1  # evaluate every this many global updates ...
    eval_interval: float | None = None  # ... or on a grid of this many virtual seconds
    seed: int = 0
    # engine
    batching: bool = True  # defer dispatches and train the in-flight work together
    clients_per_call: int | None = None  # None: chosen per backend
    steps_per_call: int | None = None  # None: chosen per backend
    output_dir: str = "runs"
    run_name: str | None = None
    progress: bool = True

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def momentum(self) -> float:
        """The server momentum in force: 0.9 for FedAvgM (spec §5.4) unless set."""
        if self.server_momentum is not None:
            return self.server_momentum
        return 0.9 if self.algorithm in ("fedavgm", "fedcompass_m") else 0.0


FIELDS = {field.name: field for field in dataclasses.fields(RunConfig)}


def _fail(name: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{name}={value!r} is not allowed: {allowed}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_type(name: str, value: Any) -> None:
    annotation = FIELDS[name].type
    optional = "None" in annotation
    if value is None:
        if not optional:
            _fail(name, value, "a value is required")
        return
    if annotation.startswith("bool"):
        ok = isinstance(value, bool)
        expected = "true or false"
    elif annotation.startswith("int"):
        ok = _is_int(value)
        expected = "an integer"
    elif annotation.startswith("float"):
        ok = _is_number(value) and not math.isnan(value)
        expected = "a number"
    else:
        ok = isinstance(value, str)
        expected = "a string"
    if not ok:
        _fail(name, value, f"expected {expected}{' or null' if optional else ''}")


def validate(config: RunConfig) -> RunConfig:
    """Check every field and combination; return the config with defaults resolved, or raise ConfigError."""
    for name in FIELDS:
        _check_type(name, getattr(config, name))
    config = _resolve_server_optimizer(config)
    if not (config.dataset in DATASET_NAMES or config.dataset.startswith(DATASET_PREFIXES)):
        _fail("dataset", config.dataset, f"one of {', '.join(DATASET_NAMES)}, or tfds:NAME (e.g. tfds:cifar10) "
                                         "or synthetic:ALPHA,BETA")
    choices = {"algorithm": ALGORITHM_NAMES, "model": MODEL_NAMES, "client_sizes": CLIENT_SIZES,
               "partition": PARTITION_NAMES, "heterogeneity": HETEROGENEITY_NAMES,
               "client_weights": CLIENT_WEIGHTS, "client_optimizer": CLIENT_OPTIMIZERS,
               "server_optimizer": SERVER_OPTIMIZER_NAMES, "staleness": STALENESS_NAMES,
               "rule": RULES, "negative_times": NEGATIVE_POLICIES, "compass_preset": COMPASS_PRESETS,
               "fedat_profiling": FEDAT_PROFILING, "augment": AUGMENTATIONS}
    for name, allowed in COMPASS_SWITCHES.items():
        if getattr(config, name) is not None and getattr(config, name) not in allowed:
            _fail(name, getattr(config, name), f"one of {', '.join(allowed)} (or null for the preset's)")
    for name, allowed in choices.items():
        if getattr(config, name) not in allowed:
            _fail(name, getattr(config, name), f"one of {', '.join(allowed)}")
    positive_ints = ("clients", "local_steps", "batch_size", "buffer_size", "eval_every", "compass_q_min",
                     "compass_q_max",
                     "max_updates", "clients_per_round", "clients_per_call", "steps_per_call", "shards_per_client")
    for name in positive_ints:
        value = getattr(config, name)
        if value is not None and value < 1:
            _fail(name, value, "an integer >= 1")
    if config.seed < 0:
        _fail("seed", config.seed, "an integer >= 0")
    positive_finite = ("speed_mean", "client_lr", "server_lr", "dirichlet_alpha", "speed_cap", "size_skew")
    for name in positive_finite:
        value = getattr(config, name)
        if not (value > 0 and math.isfinite(value)):
            _fail(name, value, "a finite number > 0")
    for name in ("jitter", "latency", "staleness_a"):
        value = getattr(config, name)
        if not (value >= 0 and math.isfinite(value)):
            _fail(name, value, "a finite number >= 0")
    if not (config.staleness_alpha > 0 and math.isfinite(config.staleness_alpha)):
        _fail("staleness_alpha", config.staleness_alpha, "a finite number > 0")
    if not config.bandwidth > 0:
        _fail("bandwidth", config.bandwidth, "a number > 0 bytes/s (inf for no bandwidth limit)")
    if not 0 <= config.gamma <= 1:
        _fail("gamma", config.gamma, "an IID fraction in [0, 1]")
    if not 0 <= config.speed_change_prob <= 1:
        _fail("speed_change_prob", config.speed_change_prob, "a probability in [0, 1]")
    if config.target_accuracy is not None and not 0 <= config.target_accuracy <= 1:
        _fail("target_accuracy", config.target_accuracy, "an accuracy in [0, 1]")
    if config.server_momentum is not None and not 0 <= config.server_momentum < 1:
        _fail("server_momentum", config.server_momentum, "a number in [0, 1)")
    if not config.max_time > 0:
        _fail("max_time", config.max_time, "virtual seconds > 0 (inf for no time budget)")
    if math.isinf(config.max_time) and config.max_updates is None and not config.stop_at_target:
        _fail("max_time", config.max_time, "a finite time budget, or set max_updates or stop_at_target")
    if config.eval_interval is not None and not (config.eval_interval > 0 and math.isfinite(config.eval_interval)):
        _fail("eval_interval", config.eval_interval, "a finite number of virtual seconds > 0, or null")
    if config.clients_per_round is not None and config.clients_per_round > config.clients:
        _fail("clients_per_round", config.clients_per_round,
              f"at most the number of clients ({config.clients})")
    if config.buffer_size > config.clients and config.algorithm == "fedbuff":
        _fail("buffer_size", config.buffer_size,
              f"at most the number of clients ({config.clients}); a larger buffer never fills")
    if config.algorithm == "fedavgm" and config.server_optimizer != "sgd":
        _fail("server_optimizer", config.server_optimizer, "sgd for fedavgm (FedAvgM is SGD with momentum)")
    q_max = config.compass_q_max or config.local_steps
    if config.compass_q_min is not None and config.compass_q_min > q_max:
        _fail("compass_q_min", config.compass_q_min, f"at most compass_q_max ({q_max})")
    if config.compass_lambda is not None and not (config.compass_lambda >= 1 and math.isfinite(config.compass_lambda)):
        _fail("compass_lambda", config.compass_lambda, "a finite latest-time factor >= 1")
    if config.compass_join_max_factor is not None and not (
            config.compass_join_max_factor >= 1 and math.isfinite(config.compass_join_max_factor)):
        _fail("compass_join_max_factor", config.compass_join_max_factor, "a finite number >= 1")
    for name in ("crash_prob", "delay_prob", "dropout_prob"):
        if not 0 <= getattr(config, name) <= 1:
            _fail(name, getattr(config, name), "a probability in [0, 1]")
    if config.crash_prob + config.delay_prob + config.dropout_prob > 1:
        _fail("crash_prob", config.crash_prob, "crash_prob + delay_prob + dropout_prob at most 1")
    if not (config.delay_factor >= 1 and math.isfinite(config.delay_factor)):
        _fail("delay_factor", config.delay_factor, "a finite factor >= 1")
    if not (config.dropout_mean > 0 and math.isfinite(config.dropout_mean)):
        _fail("dropout_mean", config.dropout_mean, "finite virtual seconds > 0")
    if config.round_timeout is not None and not (config.round_timeout > 0 and math.isfinite(config.round_timeout)):
        _fail("round_timeout", config.round_timeout, "finite virtual seconds > 0, or null")
    if config.crash_prob > 0 and config.algorithm in ("fedavg", "fedavgm", "fedat") and config.round_timeout is None:
        _fail("round_timeout", config.round_timeout,
              f"a deadline in virtual seconds: {config.algorithm} waits for every client of a round, "
              "and with crash_prob > 0 a crashed client would stall it forever")
    if config.on_nonfinite not in NONFINITE_POLICIES:
        _fail("on_nonfinite", config.on_nonfinite, f"one of {', '.join(NONFINITE_POLICIES)}")
    if config.checkpoint_every is not None and config.checkpoint_every < 1:
        _fail("checkpoint_every", config.checkpoint_every, "an integer >= 1, or null for a checkpoint at the end only")
    if config.memory_limit_mb is not None and not (config.memory_limit_mb > 0 and math.isfinite(config.memory_limit_mb)):
        _fail("memory_limit_mb", config.memory_limit_mb, "finite MiB > 0, or null for the free memory")
    if not (config.fedat_tier_ratio >= 1 and math.isfinite(config.fedat_tier_ratio)):
        _fail("fedat_tier_ratio", config.fedat_tier_ratio, "a finite speed ratio >= 1")
    _validate_issue6(config)
    if config.run_name is not None and (not config.run_name or os.sep in config.run_name
                                        or config.run_name in (".", "..")):
        _fail("run_name", config.run_name, "a plain folder name without path separators")
    if config.target_accuracy is None:
        config = dataclasses.replace(config, target_accuracy=DEFAULT_TARGETS.get(config.dataset,
                                                                                  DEFAULT_TARGET_OTHER))
    return config


def _resolve_server_optimizer(config: RunConfig) -> RunConfig:
    """FedOpt names set the server optimiser; an unset server_lr takes the optimiser's default."""
    optimizer = FEDOPT_ALGORITHMS.get(config.algorithm)
    if optimizer is not None:
        if config.server_optimizer not in ("sgd", optimizer):  # sgd is the field's default
            _fail("server_optimizer", config.server_optimizer, f"{optimizer} for {config.algorithm} (or leave it unset)")
        config = dataclasses.replace(config, server_optimizer=optimizer)
    if config.server_lr is None:
        config = dataclasses.replace(config, server_lr=DEFAULT_SERVER_LR.get(config.server_optimizer, 1.0))
    return config


def _validate_issue6(config: RunConfig) -> None:
    """PORT, CC-FedAvg, FedASMU, FedProx, FedNova and the PLATO speed model."""
    for name, allowed in {**PORT_SWITCHES, "port_preset": PORT_PRESETS}.items():
        value = getattr(config, name)
        if value is not None and value not in allowed:
            suffix = "" if name == "port_preset" else " (or null for the preset's)"
            _fail(name, value, f"one of {', '.join(allowed)}{suffix}")
    for name, allowed in (("cc_strategy", CC_STRATEGIES), ("cc_budget", CC_BUDGETS), ("cc_schedule", CC_SCHEDULES),
                          ("cc_nova_steps", CC_NOVA_STEPS), ("fedasmu_slot", FEDASMU_SLOTS)):
        if getattr(config, name) not in allowed:
            _fail(name, getattr(config, name), f"one of {', '.join(allowed)}")
    for name in ("port_min_clients", "port_clients_in_flight", "cc_budget_beta", "cc_window", "cc_total_rounds",
                 "fedasmu_staleness_bound", "fedasmu_trigger_batch", "fedasmu_max_concurrency"):
        value = getattr(config, name)
        if value is not None and value < 1:
            _fail(name, value, "an integer >= 1")
    for name in ("port_min_clients", "port_clients_in_flight", "fedasmu_max_concurrency"):
        value = getattr(config, name)
        if value is not None and value > config.clients:
            _fail(name, value, f"at most the number of clients ({config.clients})")
    if config.port_min_clients is not None and config.port_min_clients > (config.port_clients_in_flight or config.clients):
        _fail("port_min_clients", config.port_min_clients,
              f"at most the clients in flight ({config.port_clients_in_flight or config.clients}); K never arrive")
    if not config.port_staleness_bound > 0:
        _fail("port_staleness_bound", config.port_staleness_bound, "a number of versions > 0 (inf for no bound)")
    for name in ("port_alpha", "port_beta"):
        if not (getattr(config, name) >= 0 and math.isfinite(getattr(config, name))):
            _fail(name, getattr(config, name), "a finite weight >= 0")
    if config.port_alpha + config.port_beta == 0:
        _fail("port_alpha", config.port_alpha, "a weight > 0 when port_beta is 0 (the weights would all vanish)")
    for name in ("port_cosine_skip_staleness", "port_cosine_skip_rounds"):
        value = getattr(config, name)
        if value is not None and value < -1:
            _fail(name, value, "an integer >= -1, or null for the preset's")
    if not 0 <= config.cc_insufficient_fraction <= 1:
        _fail("cc_insufficient_fraction", config.cc_insufficient_fraction, "a fraction r in [0, 1]")
    if config.cc_switch_round < 0:
        _fail("cc_switch_round", config.cc_switch_round, "a round index >= 0")
    if config.fedasmu_epochs < 2:
        _fail("fedasmu_epochs", config.fedasmu_epochs, "an integer >= 2 (the fetch sits between two epochs)")
    positive = ("fedasmu_trigger_period", "fedasmu_mu_alpha", "fedasmu_mu_beta", "speed_reference_time")
    non_negative = ("fedasmu_lr_lambda", "fedasmu_lr_sigma", "fedasmu_lr_iota", "fedasmu_lr_gamma", "fedasmu_lr_nu",
                    "fedasmu_lambda0", "fedasmu_iota0", "fedasmu_gamma0", "prox_mu")
    for name in positive:
        if not (getattr(config, name) > 0 and math.isfinite(getattr(config, name))):
            _fail(name, getattr(config, name), "a finite number > 0")
    for name in non_negative:
        if not (getattr(config, name) >= 0 and math.isfinite(getattr(config, name))):
            _fail(name, getattr(config, name), "a finite number >= 0")
    for name in ("fedasmu_sigma0", "fedasmu_nu0"):
        if not math.isfinite(getattr(config, name)):
            _fail(name, getattr(config, name), "a finite number")
    if not 0 < config.fedasmu_alpha_min <= 1:
        _fail("fedasmu_alpha_min", config.fedasmu_alpha_min, "a number in (0, 1]")
    if config.speed_legacy_seed is not None and not 0 <= config.speed_legacy_seed < 2 ** 32:
        _fail("speed_legacy_seed", config.speed_legacy_seed, "an integer in [0, 2^32) (NumPy RandomState), or null")
    if config.fednova and (config.algorithm not in DELTA_MODE_ALGORITHMS
                           or (config.algorithm == "fedasync" and config.rule == "paper")):
        note = "; fedcompass_n is already normalised" if config.algorithm == "fedcompass_n" else ""
        _fail("fednova", config.fednova, f"false for {config.algorithm}: FedNova normalises delta-mode aggregations "
                                         f"({', '.join(DELTA_MODE_ALGORITHMS)}; fedasync with rule fedcompass){note}")
    if config.algorithm == "fedasmu" and config.server_optimizer != "sgd":
        _fail("server_optimizer", config.server_optimizer, "sgd for fedasmu (its learned α mixes models directly)")
    if config.algorithm in (*FEDOPT_ALGORITHMS, "port", "ccfedavg", "fedasmu") and config.crash_prob > 0 \
            and config.round_timeout is None:
        _fail("round_timeout", config.round_timeout,
              f"a deadline in virtual seconds: {config.algorithm} waits for clients (rounds, K arrivals, stale "
              "clients or concurrency slots), and with crash_prob > 0 a crashed client would stall it forever")


def config_from_mapping(values: dict[str, Any], base: RunConfig | None = None) -> RunConfig:
    """A validated RunConfig from a mapping of field names (e.g. a parsed JSON/TOML file).

    >>> config_from_mapping({"algorithm": "fedasync", "local-steps": 20}).local_steps
    20
    """
    base = base or RunConfig()
    normalised = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in FIELDS:
            close = [f for f in FIELDS if f.startswith(name[:4])]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"unknown config field {key!r}{hint}; allowed: {', '.join(FIELDS)}")
        if FIELDS[name].type.startswith("float") and _is_int(value):
            value = float(value)
        if isinstance(value, str) and FIELDS[name].type.startswith("float") and value in ("inf", "infinity"):
            value = math.inf
        normalised[name] = value
    return validate(dataclasses.replace(base, **normalised))


def load_config_file(path: str) -> dict[str, Any]:
    """Read a JSON (``.json``) or TOML (``.toml``) config file into a mapping of field names."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        if path.endswith(".toml"):
            import tomllib

            values = tomllib.loads(raw.decode())
        elif path.endswith(".json"):
            values = json.loads(raw)
        else:
            raise ConfigError(f"config file {path!r} must end in .json or .toml")
    except (ValueError, UnicodeDecodeError) as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"config file {path!r} could not be parsed: {error}") from error
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of field names to values")
    return values
