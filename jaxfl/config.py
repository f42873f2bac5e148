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
                   "fedat")
COMPASS_SWITCHES = {  # field → allowed values, the paper's first (jaxfl.algorithms.fedcompass)
    "compass_speed_estimate": ("latest", "ema"),
    "compass_staleness_at": ("buffer", "aggregation"),
    "compass_create_rule": ("t_a", "t_max"),
    "compass_create_far_groups": ("clamp", "skip"),
    "compass_fastest_over": ("pending", "all"),
    "compass_empty_timer": ("apply", "skip"),
}
COMPASS_PRESETS = ("paper", "reference_code")
FEDAT_PROFILING = ("round", "oracle")
DATASET_NAMES = ("mnist10k", "fashion_mnist", "mnist")
MODEL_NAMES = ("cnn", "mlp")
PARTITION_NAMES = ("iid", "dirichlet")
HETEROGENEITY_NAMES = ("homo", "normal", "exp", "pareto", "zipf")
CLIENT_WEIGHTS = ("samples", "uniform")
CLIENT_OPTIMIZERS = ("adam", "sgd", "adamw")
SERVER_OPTIMIZER_NAMES = ("sgd", "adam", "yogi", "adagrad")
STALENESS_NAMES = ("constant", "polynomial", "hinge", "exponential")
RULES = ("fedcompass", "paper")
# FedCompass's MNIST target is 90%; Fashion-MNIST is harder (a centrally trained CNN gets ~91%).
DEFAULT_TARGETS = {"mnist10k": 0.9, "mnist": 0.9, "fashion_mnist": 0.8}
NEGATIVE_POLICIES = ("redraw", "clip", "error")


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
    # server
    server_optimizer: str = "sgd"
    server_lr: float = 1.0
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
    choices = {"algorithm": ALGORITHM_NAMES, "dataset": DATASET_NAMES, "model": MODEL_NAMES,
               "partition": PARTITION_NAMES, "heterogeneity": HETEROGENEITY_NAMES,
               "client_weights": CLIENT_WEIGHTS, "client_optimizer": CLIENT_OPTIMIZERS,
               "server_optimizer": SERVER_OPTIMIZER_NAMES, "staleness": STALENESS_NAMES,
               "rule": RULES, "negative_times": NEGATIVE_POLICIES, "compass_preset": COMPASS_PRESETS,
               "fedat_profiling": FEDAT_PROFILING}
    for name, allowed in COMPASS_SWITCHES.items():
        if getattr(config, name) is not None and getattr(config, name) not in allowed:
            _fail(name, getattr(config, name), f"one of {', '.join(allowed)} (or null for the preset's)")
    for name, allowed in choices.items():
        if getattr(config, name) not in allowed:
            _fail(name, getattr(config, name), f"one of {', '.join(allowed)}")
    positive_ints = ("clients", "local_steps", "batch_size", "buffer_size", "eval_every", "compass_q_min",
                     "compass_q_max",
                     "max_updates", "clients_per_round", "clients_per_call", "steps_per_call")
    for name in positive_ints:
        value = getattr(config, name)
        if value is not None and value < 1:
            _fail(name, value, "an integer >= 1")
    if config.seed < 0:
        _fail("seed", config.seed, "an integer >= 0")
    positive_finite = ("speed_mean", "client_lr", "server_lr", "dirichlet_alpha", "speed_cap")
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
    if not (config.fedat_tier_ratio >= 1 and math.isfinite(config.fedat_tier_ratio)):
        _fail("fedat_tier_ratio", config.fedat_tier_ratio, "a finite speed ratio >= 1")
    if config.run_name is not None and (not config.run_name or os.sep in config.run_name
                                        or config.run_name in (".", "..")):
        _fail("run_name", config.run_name, "a plain folder name without path separators")
    if config.target_accuracy is None:
        config = dataclasses.replace(config, target_accuracy=DEFAULT_TARGETS[config.dataset])
    return config


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
