"""One validated configuration for a run (plain Python; no jax).

Every field has a default chosen from the papers jaxfl reproduces (the MNIST settings of FedCompass, Li et al.,
ICLR 2024: Appendix E and Tables 9, 12–13) scaled to the embedded data set. :func:`validate` checks types, ranges, names and combinations
before any work is done and raises :class:`ConfigError` naming the field, the value and what is
allowed.

>>> config = RunConfig(algorithm="fedavg", clients=5)
>>> validate(config).clients
5
"""
from __future__ import annotations

import contextvars
import dataclasses
import json
import math
import os
import re
import shlex
import warnings
import typing
from typing import Any, Callable, Mapping

from jaxfl._user_warnings import warn_user
from jaxfl import algorithms

FLOAT32_TINY = 1.1754943508222875e-38  # float32's smallest normal number (np.finfo(np.float32).tiny)
FLOAT32_MAX = 3.4028234663852886e+38  # float32's largest finite number
# server_lr when not set: FedAvg's 1 for sgd; for the adaptive optimisers the best CIFAR-10 server
# rates of Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (appendix tables of best
# hyperparameters: log10 η = -2 FedAdam/FedYogi, -1 FedAdagrad; the authors' repository,
# google-research/federated optimization/docs/hyperparameters.md, keeps -1 for FedAdagrad on every
# image task). optax_* take the rate of the optimiser they compare with.
DEFAULT_SERVER_LR = {"sgd": 1.0, "adam": 1e-2, "yogi": 1e-2, "adagrad": 1e-1,
                     "optax_adam": 1e-2, "optax_yogi": 1e-2, "optax_adagrad": 1e-1}
NONFINITE_POLICIES = ("stop", "skip")
DATASET_NAMES = ("mnist10k", "fashion_mnist", "mnist", "digits", "npz", "array_record", "synthetic",
                 "synthetic_iid")  # jaxfl.data.load_dataset
DATASET_PREFIXES = ("tfds:", "synthetic:")  # tfds:cifar10, synthetic:0.5,0.5
MODEL_NAMES = ("cnn", "cnn_example", "mlp", "logreg", "lenet5", "ccfedavg_cnn", "ccfedavg_mlp", "fedasmu_cnn", "resnet18",
               "resnet18_gn", "resnet20", "vgg11", "vgg16", "alexnet", "textcnn",
               "lstm")  # jaxfl.models.MODELS (register_model extends it)
# ``--model``'s help in ``jaxfl run`` and ``jaxfl sweep``, listing the built-in models from MODEL_NAMES
# (tests/test_cli_help.py checks it names every model of jaxfl.models.MODELS).
MODEL_HELP = (f"{', '.join(MODEL_NAMES)}, or module:object (also path/to/file.py:object) naming your own: a Flax "
              "linen or nnx module class, an nnx factory rngs -> Module, or a factory (num_classes=...) -> Module")
PARTITION_NAMES = ("iid", "dirichlet", "dirichlet_client", "class", "dual_dirichlet", "label_shards", "gamma_mix",
                   "natural")  # jaxfl.data.PARTITIONS
CLIENT_SIZES = ("equal", "lognormal", "powerlaw")
HETEROGENEITY_NAMES = ("homo", "normal", "exp", "pareto", "zipf", "uniform")
CLIENT_WEIGHTS = ("samples", "uniform")
CLIENT_OPTIMIZERS = ("adam", "sgd", "adamw")
SERVER_OPTIMIZER_NAMES = ("sgd", "adam", "yogi", "adagrad", "optax_adam", "optax_yogi", "optax_adagrad")
STALENESS_NAMES = ("constant", "polynomial", "hinge", "exponential")
RULES = ("fedcompass", "paper", "plato")
# FedCompass's MNIST target is 90%; Fashion-MNIST is harder (a centrally trained CNN gets ~91%).
# CIFAR-10: FedCompass's class-partition target. Other datasets have none unless target_accuracy is set.
DEFAULT_TARGETS = {"mnist10k": 0.9, "mnist": 0.9, "fashion_mnist": 0.8, "digits": 0.9, "tfds:mnist": 0.9,
                   "tfds:fashion_mnist": 0.8, "tfds:cifar10": 0.6}
NEGATIVE_POLICIES = ("redraw", "clip", "error")
SPEED_UNITS = ("step", "round")  # jaxfl.scheduler.speeds: what a drawn time per step is the time of
AUGMENTATIONS = ("auto", "none", "crop_flip")  # auto: crop_flip for CIFAR-10/100 (jaxfl.data.augment.AUGMENTED)
CLIENT_STATE_PLACEMENTS = ("auto", "device", "host", "memmap")  # jaxfl.client_state
STEP_LOOPS = ("rolled", "unrolled")  # jaxfl.engine.choose_step_loop
WEIGHT_INITS = ("flax", "pytorch")  # jaxfl.models.init
# config.json's name for a model or optimiser given to run_experiment as a Python object
# (``<user: module.Name>``): the run records it honestly and resuming it needs the object again.
USER_PREFIX = "<user: "


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field, the value and what is allowed."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The data set, the model and how the samples split over the clients."""

    dataset: str = "mnist10k"  # mnist10k (embedded), fashion_mnist, mnist, digits, npz, array_record, tfds:NAME, synthetic
    data_dir: str | None = None  # folder of mnist / array_record / tfds data, or the .npz file (or a folder of one)
    model: str = dataclasses.field(default="cnn", metadata={"help": MODEL_HELP})  # a jaxfl.models name, or module:object
    weight_init: str = "flax"  # the model's initial weights: flax (its layers' defaults) | pytorch (PyTorch's, as the papers' code: U(±1/√fan_in) weights and biases)
    clients: int = 10  # number of clients m
    partition: str = "iid"  # iid, dirichlet, dirichlet_client, class, dual_dirichlet, label_shards, gamma_mix, natural
    dirichlet_alpha: float = 0.5  # concentration of the Dirichlet label split
    dirichlet_min_samples: int = 1  # dirichlet: the split is drawn again until every client holds this many (NIID-Bench's code: 10)
    dirichlet_balance: bool = False  # dirichlet: a client holding N/C samples takes no more of the classes after (NIID-Bench's code)
    client_sizes: str = "equal"  # iid / dirichlet_client partition sizes: equal, lognormal or powerlaw
    size_skew: float = 1.0  # sigma (lognormal) or tail index (powerlaw) of those client sizes
    shards_per_client: int = 2  # label_shards: shards of label-sorted samples per client (McMahan et al.)
    gamma: float = 0.1  # gamma_mix: the IID fraction (CC-FedAvg; 0.1 = "90% non-IID")
    client_weights: str = "samples"  # p_i: samples (relative sample size, the papers') or uniform (1/m)
    augment: str = "auto"  # on-device training augmentation: auto (crop+flip for CIFAR) | none | crop_flip
    normalize: bool = False  # (x - mean) / std per channel, by the training split's statistics (FedCompass MNIST: off)
    normalize_mean: tuple[float, ...] | None = None  # with normalize: by this mean instead of the split's: a number or one per channel
    normalize_std: tuple[float, ...] | None = None  # with normalize: by this std instead (given together with normalize_mean)
    num_classes: int | None = None  # classes (logits of the model); unset: the dataset's (npz and arrays: largest label + 1)
    data_fingerprint: str | None = None  # SHA-256 of the data; set by runs on data= or npz files, checked on resume


@dataclasses.dataclass(frozen=True)
class SpeedsConfig:
    """Client speeds and communication on the virtual clock."""

    heterogeneity: str = "exp"  # time per step drawn once per client: homo, normal, exp, pareto, zipf or uniform
    speed_mean: float = 0.15  # μ seconds per local step (MNIST, batch 64)
    jitter: float = 0.05  # per-round t_i^(k) ~ N(t_i, (jitter·t_i)^2)
    speed_change_prob: float = 0.0  # probability of re-drawing t_i each round
    speed_cap: float = 30.0  # pareto/zipf idle-time cap (PORT's Pareto runs; its Zipf runs, Fig. 2: 60)
    negative_times: str = "redraw"  # a negative time drawn (normal speeds, or any model's jitter): redraw, clip or error
    latency: float = 0.0  # virtual seconds of latency per model transfer
    bandwidth: float = math.inf  # bytes per second of a model transfer (inf: no limit)
    speed_reference_time: float = 10.0  # t_i = μ(1 + s_i/ref): PLATO's avg_training_time per epoch (LeNet: 10 s)
    speed_ratio: float = 5.0  # uniform: slowest/fastest time per step R, t_i ~ U[a, R·a] spanning it, mean μ (FedASMU: 5; 110–440)
    speed_legacy_seed: int | None = None  # pareto/zipf idle times from NumPy's RandomState(seed) as PLATO draws them (1: PORT's runs)
    speed_unit: str = "step"  # unit of the time per step t_i: step (a round of S_i steps takes S_i·t_i) or round (needs local_epochs: every client's E-epoch round takes E·S̄ steps' time at its t_i whatever its data size, S̄ the clients' mean steps per epoch, so speed_ratio spreads round times; FedASMU's per-round reading)


@dataclasses.dataclass(frozen=True)
class FaultsConfig:
    """Client faults and how the run reacts to them."""

    crash_prob: float = 0.0  # per dispatch: the client crashes mid-round and never returns
    delay_prob: float = 0.0  # per dispatch: the update returns delay_factor × later
    delay_factor: float = 10.0  # how much later a delayed update returns
    dropout_prob: float = 0.0  # per dispatch: the client goes offline for Exp(dropout_mean) s
    dropout_mean: float = 60.0  # mean offline time of a dropout, virtual seconds
    round_timeout: float | None = None  # rounds (FedAvg, FedAT tiers, CC-FedAvg) close after this; PORT, FedASMU: per dispatch
    on_nonfinite: str = "stop"  # a NaN/Inf update: stop (the run stops) or skip (the rest weighed as if it never arrived, counted)


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """Local training on each client."""

    local_steps: int = 50  # Q local steps per dispatch
    batch_size: int = 64  # minibatch size B of a local step
    client_optimizer: str = "adam"  # adam, sgd or adamw (re-initialised at every dispatch); any optax one from Python
    client_lr: float = 0.003  # client learning rate
    prox_mu: float = 0.0  # FedProx μ: local objective + μ/2 ‖w − w_start‖² (0: off)
    client_momentum: float = 0.0  # sgd momentum ρ in [0, 1), PyTorch's (buffer reset at every dispatch)
    client_weight_decay: float = 0.0  # sgd/adam: L2 λw added to the gradient (PyTorch's); adamw: decoupled decay
    client_lr_decay: float = 1.0  # in (0, 1]: a client's k-th dispatch (k = 0, 1, ...) trains with lr · decay^k
    local_epochs: float | None = None  # instead of local_steps: client i makes local_epochs passes over its n_i samples, ceil(n_i / batch_size) steps each


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Aggregation options shared by several algorithms and the server optimiser."""

    server_optimizer: str = "sgd"  # on the aggregated update: sgd, FedOpt's adam, yogi, adagrad (Reddi et al.), or optax_adam, optax_yogi, optax_adagrad
    server_lr: float | None = None  # server learning rate; unset: 1 for sgd (FedAvg), 0.01 adam/yogi, 0.1 adagrad
    server_momentum: float | None = None  # server SGD momentum; unset: the algorithm's (0.9 for fedavgm and fedcompass_m), else 0
    server_tau: float = 1e-3  # FedOpt's adaptivity τ in η m/(√v + τ), v starting at τ² (optax_*: their eps)
    server_beta1: float = 0.9  # FedOpt's β1: momentum of the pseudo-gradient (adam, yogi, adagrad, optax_adam, optax_yogi)
    server_beta2: float = 0.99  # FedOpt's β2: decay of the second moment (adam, yogi, optax_adam, optax_yogi)
    clients_per_round: int | None = None  # clients sampled per round (FedAvg, FedOpt, CC-FedAvg; unset: all); FedAsync/FedBuff: the concurrency
    concurrency: int | None = None  # clients in flight (FedAsync, FedBuff; FedASMU's cap); unset: clients_per_round, else min(clients, 1000) (FedASMU: 10% of the clients)
    buffer_size: int = 3  # FedBuff's K: buffered updates per aggregation
    rule: str | None = None  # FedAsync/FedBuff update rule: paper, fedcompass (its authors' framework) or plato (PORT's); unset: paper for both
    staleness: str = "polynomial"  # st(s), s the versions made since the client's model (0: the newest): constant α, polynomial α(s+1)^-a, hinge α/(a(s-4)+1) past s = 4, exponential α·e^(-a·s)
    staleness_alpha: float = 0.9  # α of the staleness function st(s)
    staleness_a: float = 0.5  # a of the staleness function st(s) (not read by constant; the default is the polynomial's: FedAsync's hinge runs used a = 10)
    fednova: bool = False  # FedNova: normalise pseudo-gradient aggregations by local steps (momentum-corrected; sgd clients only)


@dataclasses.dataclass(frozen=True)
class BudgetConfig:
    """When a run stops and how often it is evaluated."""

    max_time: float = 3000.0  # virtual seconds (inf for none)
    max_updates: int | None = None  # budget in global updates (model versions; unset: none)
    max_client_updates: int | None = None  # client updates aggregated (FedBuff's budget); stops at the aggregation reaching it
    max_client_steps: int | None = None  # local steps in aggregated updates; stops at the aggregation reaching it
    target_accuracy: float | None = None  # held-out accuracy to reach; unset: 0.9 MNIST and digits, 0.8 Fashion-MNIST, 0.6 CIFAR-10, else no target
    stop_at_target: bool = True  # stop once the held-out accuracy reaches the target
    eval_every: int = 1  # evaluate the global model every this many global updates
    eval_interval: float | None = None  # evaluate on a grid of this many virtual seconds instead of eval_every
    eval_at_start: bool = True  # evaluate the initial model (version 0) before training


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """How the engine shapes its training calls (results agree up to float32 rounding)."""

    batching: bool = True  # defer dispatches and train the in-flight work together
    clients_per_call: int | None = None  # clients trained together in one call; unset: chosen from the backend
    steps_per_call: int | None = None  # local steps unrolled per call; unset: from local_steps (all of them up to 10, else a divisor from 5 to 10, else 10)
    step_loop: str | None = None  # how a call runs its local steps: rolled (one loop, one step compiled) | unrolled (chunks of steps_per_call); unset: rolled on a CPU for models without XLA convolutions, else unrolled
    cpu_friendly_layers: bool = True  # on CPU: convolutions as im2col matmuls, tiling max-pools as reshapes, dense kernel gradients without a transpose (2–2.7x faster steps); narrow convolutions of the held-out evaluation as im2col too
    devices: int | None = None  # local devices the client axis is sharded over (unset: all; a CPU's cores are devices)
    memory_limit_mb: float | None = None  # memory one training call may use, MiB (unset: what the device has free)
    timing_only: bool = False  # the schedule only: no training, no model on device (staleness, idle time, events/s)
    client_state: str = "auto"  # per-client algorithm state (CC-FedAvg's banks, FedASMU's coefficients): auto (device if it fits 25% of its free memory, else host RAM, else a memmap in the run dir) | device | host | memmap


SECTIONS = {"data": DataConfig, "speeds": SpeedsConfig, "faults": FaultsConfig, "client": ClientConfig,
            "server": ServerConfig, "budget": BudgetConfig, "engine": EngineConfig}
SECTION_OF = {field.name: section for section, cls in SECTIONS.items() for field in dataclasses.fields(cls)}


DEFAULT_CHECKPOINT_EVERY = 25
# A save costs 0.05-1 s (orbax writing the models and updates in flight, the scheduler's pickle): at
# the default cadence a run of cheap updates (FedAsync's MLP: 25 updates ~1.4 s) spent 15% of its
# wall time saving, so the default cadence is also kept at least this many wall seconds apart.
DEFAULT_CHECKPOINT_MIN_INTERVAL_S = 60.0


@dataclasses.dataclass(frozen=True, init=False)
class RunConfig:
    """Everything that defines a run: the algorithm and its options, seven sections, and the output.

    Sections: ``data``, ``speeds``, ``faults``, ``client``, ``server``, ``budget``, ``engine``
    (:data:`SECTIONS`). Every field of a section is also a keyword and an attribute of the
    RunConfig itself (``RunConfig(clients=5).clients`` is ``RunConfig(data=DataConfig(clients=5))
    .data.clients``), and a CLI flag (``--local-steps``); field names are unique across sections.

    >>> config = RunConfig(algorithm="fedavg", clients=5, client=ClientConfig(local_steps=20))
    >>> config.data.clients, config.local_steps
    (5, 20)
    """

    algorithm: str = "fedbuff"  # a registered name (jaxfl.algorithms.names()) or module:Class
    # The algorithm's own options: its Options dataclass, a mapping of its fields, or None for the
    # defaults; validate() resolves it to the dataclass with the preset applied.
    algorithm_options: Any = None
    data: DataConfig = DataConfig()
    speeds: SpeedsConfig = SpeedsConfig()
    faults: FaultsConfig = FaultsConfig()
    client: ClientConfig = ClientConfig()
    server: ServerConfig = ServerConfig()
    budget: BudgetConfig = BudgetConfig()
    engine: EngineConfig = EngineConfig()
    seed: int = 0  # every random stream of the run derives from it (not the fixed datasets: synthetic*, mnist10k's split)
    checkpoint_every: int | None = DEFAULT_CHECKPOINT_EVERY  # global updates between checkpoints (none: only at the end)
    checkpoint_min_interval_s: float | None = None  # wall seconds at least between checkpoints before the end (unset: 60 at the default checkpoint_every of 25, else 0: exactly every checkpoint_every updates)
    final_checkpoint: bool = True  # checkpoint the final state (the final model, resumable); off: none at the end
    output_dir: str = "runs"  # folder that receives one run directory per run
    run_name: str | None = None  # the run directory's name (unset: from the algorithm, data, model, key settings and a config hash)
    progress: bool = True  # a progress bar in virtual time

    def __init__(self, **values: Any):
        values = {name: _plain_number(value) for name, value in values.items()}
        changes: dict[str, dict[str, Any]] = {}
        for name in list(values):
            if name in SECTION_OF:
                changes.setdefault(SECTION_OF[name], {})[name] = values.pop(name)
        for field in dataclasses.fields(self):
            value = values.pop(field.name, field.default)
            if field.name in SECTIONS:
                cls = SECTIONS[field.name]
                if isinstance(value, dict):
                    value = cls(**{key: _plain_number(item) for key, item in value.items()})
                elif not isinstance(value, cls):
                    raise TypeError(f"RunConfig {field.name}= takes a {cls.__name__} or a mapping of its fields, "
                                    f"got {value!r}")
                if field.name in changes:
                    value = dataclasses.replace(value, **changes[field.name])
            object.__setattr__(self, field.name, value)
        if values:
            raise TypeError(f"RunConfig got unexpected keyword arguments {sorted(values)}; fields: "
                            f"{', '.join(FIELDS)}")
        # a folder as the shell would spell it: "~/runs" is the home's runs, not a folder named ~ (and a
        # pathlib.Path is its text, as config.json holds it)
        object.__setattr__(self, "output_dir", user_path(self.output_dir))
        if isinstance(self.data.data_dir, os.PathLike):  # its "~" is left as given: the run's name hashes it
            object.__setattr__(self, "data", dataclasses.replace(self.data, data_dir=os.fspath(self.data.data_dir)))
        # one spelling of a float field's value, as config.json, TOML and the command line give it: 3000 is
        # 3000.0, so that the run's name, config.json and checkpoints do not depend on it
        for field in dataclasses.fields(self):
            if annotation_text(field.type).startswith("float"):  # the config's own (checkpoint_min_interval_s)
                object.__setattr__(self, field.name, _float_spelling(getattr(self, field.name)))
        for name in SECTIONS:
            object.__setattr__(self, name, _float_fields_spelt(getattr(self, name)))
        # an algorithm's Options object (a mapping of its fields is coerced when it is resolved)
        if dataclasses.is_dataclass(self.algorithm_options) and not isinstance(self.algorithm_options, type):
            object.__setattr__(self, "algorithm_options", _float_fields_spelt(self.algorithm_options))

    def __getattr__(self, name: str) -> Any:
        """A section's field read as the config's own (``config.local_steps``)."""
        section = SECTION_OF.get(name)
        if section is None:
            raise AttributeError(f"RunConfig has no field {name!r}")
        return getattr(object.__getattribute__(self, section), name)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def momentum(self) -> float:
        """The server momentum in force: the algorithm's default (FedAvgM: 0.9, as in FedCompass's baselines, Li et al., ICLR 2024, Table 12) unless set."""
        if self.server_momentum is not None:
            return self.server_momentum
        return algorithms.get(self.algorithm).server_momentum


# Every leaf field by name (sections' fields and the top-level ones): the flat view the CLI, the
# validation and jaxfl 0.1's flat config files use.
FIELDS = {**{field.name: field for cls in SECTIONS.values() for field in dataclasses.fields(cls)},
          **{field.name: field for field in dataclasses.fields(RunConfig) if field.name not in SECTIONS}}

# Fields added since run names and checkpoint records took their present form (a config field, or an
# algorithm's option as ``namespace.option``), each with the value that does what runs did before it
# existed. A config holding that value is named (jaxfl.experiment.config_hash) and resumed
# (jaxfl.resume) as the configs that predate the field. The value is frozen when the field is added:
# if its default changes later, this entry keeps the old value and configs at the new default get
# names of their own. A new field goes here with its default, unless it never changes results
# (then jaxfl.experiment.NAME_LEFT_OUT). This holds from commit f8afff3 on, where FIELDS_ADDED began:
# fields added before it (client_momentum, client_weight_decay, client_lr_decay, local_epochs,
# server_tau, server_beta1, server_beta2, speed_ratio) are hashed at their defaults, and they renamed
# the runs of the jaxfl before them. tests/test_run_names.py freezes the fields that enter the hash.
FIELDS_ADDED: dict[str, Any] = {"client_state": "auto", "speed_unit": "step", "dirichlet_min_samples": 1,
                                "dirichlet_balance": False, "step_loop": None, "weight_init": "flax"}
# The fields added earlier on 2026-11-24, before FIELDS_ADDED began, each with the value that does what
# runs did before it existed: what a checkpoint written without them resumes as (their names changed
# with them; a resume compares the configs only). FedOpt's three do so only for a server optimiser that
# reads none of them: before them, adam, yogi and adagrad were optax's (optax_adam... now), which a
# resume refuses (jaxfl.resume).
FIELDS_ADDED_BEFORE_NAMES: dict[str, Any] = {
    "client_momentum": 0.0, "client_weight_decay": 0.0, "client_lr_decay": 1.0, "local_epochs": None,
    "speed_ratio": 5.0, "server_tau": 1e-3, "server_beta1": 0.9, "server_beta2": 0.99}


def checkpoint_min_interval(config: "RunConfig") -> float:
    """The wall seconds at least between two checkpoints before a run's end: the config's
    ``checkpoint_min_interval_s``, or where unset 60 at the default cadence (``checkpoint_every``
    25) and 0 at any other (a cadence asked for is kept exactly).

    >>> checkpoint_min_interval(RunConfig()), checkpoint_min_interval(RunConfig(checkpoint_every=5))
    (60.0, 0.0)
    >>> checkpoint_min_interval(RunConfig(checkpoint_every=5, checkpoint_min_interval_s=30))
    30.0
    """
    if config.checkpoint_min_interval_s is not None:
        return config.checkpoint_min_interval_s
    return DEFAULT_CHECKPOINT_MIN_INTERVAL_S if config.checkpoint_every == DEFAULT_CHECKPOINT_EVERY else 0.0


# Seeds go to jax.random.key (a signed 64-bit integer: 2^63 overflows inside JAX) and to NumPy's
# SeedSequence (any integer >= 0, also as the per-client streams' 32-bit words): the first bounds them.
SEED_LIMIT = 2 ** 63
# Evaluation grid points a run may write (eval_interval): counted up front where max_time is finite,
# and a run without max_time stops when its clock passes this many (jaxfl.experiment).
MAX_GRID_POINTS = 100_000
POWERLAW_MIN_SKEW = 0.1  # client_sizes powerlaw: Pareto weights ~ exp(E/size_skew), E ~ Exp(1) up to ~40
LOGNORMAL_MAX_SKEW = 100.0  # client_sizes lognormal: weights exp(size_skew·z), z up to ~7
# Each setting that scales an event's time (seconds, and the factors and ratios they are multiplied
# by) is at most this, and the divisors at least its inverse: a dispatch's time is a product of
# several of them with the step count and a random draw, which then stays far inside float64
# (10^30 s is 10^22 years; past ~10^300 the clock's times become inf mid-run).
TIME_SCALE_LIMIT = 1e30


def fail(name: str, value: Any, allowed: str) -> None:
    """Raise :class:`ConfigError` naming the field, the bad value and what is allowed.

    >>> fail("clients", 0, "an integer >= 1")
    Traceback (most recent call last):
    jaxfl.config.ConfigError: clients=0 is not allowed: an integer >= 1
    """
    raise ConfigError(f"{name}={value!r} is not allowed: {allowed}")


def is_object_reference(name: str) -> bool:
    """``module:object`` or ``path/to/file.py:object`` (imported when the run is prepared).

    >>> is_object_reference("my_models:MyNet"), is_object_reference("cnn")
    (True, False)
    """
    module, colon, attribute = name.rpartition(":")
    return bool(colon and module and attribute.isidentifier())


def _plain_number(value: Any) -> Any:
    """A NumPy scalar as the Python number it holds (``np.int64(4)`` -> ``4``, ``np.float32`` -> float,
    ``np.bool_`` -> bool); anything else unchanged, so a field that takes an int takes NumPy's too.

    >>> import numpy as np
    >>> _plain_number(np.int64(4)), _plain_number(np.float32(0.5)), _plain_number("x")
    (4, 0.5, 'x')
    """
    if type(value) in (list, tuple):  # normalize_mean=(np.float32(0.5),); not a NamedTuple (an optax object)
        return type(value)(_plain_number(item) for item in value)
    kind = type(value).__module__
    if kind == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        item = value.item()
        if isinstance(item, (bool, int, float)):
            return item
    return value


def user_path(path: Any) -> Any:
    """A path as the shell spells it: ``~`` and ``~user`` expanded, a ``pathlib.Path`` made text;
    anything else (a number, None) returned as given for validation to name.

    >>> import os
    >>> user_path("~/runs") == os.path.join(os.path.expanduser("~"), "runs")
    True
    >>> user_path("runs/~")
    'runs/~'
    """
    if isinstance(path, (str, os.PathLike)):
        return os.path.expanduser(os.fspath(path))
    return path


def _float_spelling(value: Any) -> Any:
    """The value of a float field as a float, as config.json, TOML and the command line give it: an
    int as the float it equals; anything else (None, a string, a wrong type, which validation
    names) unchanged.

    An int no float equals (2^53 + 1, 10^400) stays the int, for validation to judge.

    >>> _float_spelling(3000), _float_spelling(10 ** 20), _float_spelling(None), _float_spelling(True)
    (3000.0, 1e+20, None, True)
    >>> _float_spelling(2 ** 53 + 1)
    9007199254740993
    """
    if _is_int(value):
        try:
            spelt = float(value)
        except OverflowError:
            return value
        return spelt if int(spelt) == value else value
    return value


def _float_fields_spelt(values: Any) -> Any:
    """A frozen dataclass with :func:`_float_spelling` applied to its float fields; itself if none changes."""
    respelt = {field.name: _float_spelling(getattr(values, field.name)) for field in dataclasses.fields(values)
               if field.init and annotation_text(field.type).startswith("float")}
    if all(respelt[name] is getattr(values, name) for name in respelt):
        return values
    return dataclasses.replace(values, **respelt)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def annotation_text(annotation: Any) -> str:
    """A field's annotation as the text the checks read: as written where the module has
    ``from __future__ import annotations`` (every jaxfl module), else spelled from the type object
    (an algorithm's ``Options`` defined in a notebook or a script without that import).

    >>> annotation_text(int), annotation_text(float | None), annotation_text(typing.Optional[int])
    ('int', 'float | None', 'int | None')
    >>> annotation_text(tuple[float, ...]), annotation_text("str | None"), annotation_text("Optional[int]")
    ('tuple[float, ...]', 'str | None', 'int | None')
    """
    if isinstance(annotation, str):
        optional = re.fullmatch(r"(?:typing\.)?Optional\[(.+)\]", annotation.strip())
        return f"{optional.group(1)} | None" if optional else annotation
    arguments = typing.get_args(annotation)
    if type(None) in arguments:  # Optional[X] and X | None
        return " | ".join(annotation_text(a) for a in arguments if a is not type(None)) + " | None"
    if isinstance(annotation, type) and not arguments:
        return annotation.__name__
    return str(annotation).replace("typing.", "")


# The annotations an option (or a run field) may have, each optionally "| None": what check_type
# checks and the command line parses; an algorithm's Options with another is refused at register.
OPTION_TYPES = ("bool", "int", "float", "str", "tuple[float, ...]", "Any")


def check_type(name: str, value: Any, annotation: str) -> None:
    """Check ``value`` against a field's annotation (``int``, ``float``, ``bool``, ``str``, ``| None``;
    text or a type object, see :func:`annotation_text`).

    >>> check_type("cutoff.max_staleness", 4, int)
    >>> check_type("cutoff.max_staleness", "4", int)
    Traceback (most recent call last):
    jaxfl.config.ConfigError: cutoff.max_staleness='4' is not allowed: expected an integer
    """
    annotation = annotation_text(annotation)
    if annotation.startswith("Any"):
        return
    optional = "None" in annotation
    if value is None:
        if not optional:
            fail(name, value, "a value is required")
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
    elif annotation.startswith("tuple[float"):
        values = value if isinstance(value, (list, tuple)) else [value]
        ok = len(values) > 0 and all(_is_number(v) and math.isfinite(v) for v in values)
        expected = "a finite number or a non-empty list of them"
    else:
        ok = isinstance(value, str)
        expected = "a string"
        if name == "algorithm" and isinstance(value, type) and issubclass(value, algorithms.Algorithm):
            expected += f" naming it: its registered name {value.name!r} or 'module:Class'"
        elif name in ("model", "client_optimizer") and value is not None:  # an object, where a name goes
            expected += f" naming one; {'a model' if name == 'model' else 'an optax'} object goes to " \
                        f"run_experiment(config, {name}=...)"
    if not ok:
        fail(name, value, f"expected {expected}{' or null' if optional else ''}")


def validate(config: RunConfig) -> RunConfig:
    """Check every field and combination; return the config with defaults resolved, or raise ConfigError."""
    for name, field in FIELDS.items():
        check_type(name, getattr(config, name), field.type)
    try:
        algorithm = algorithms.get(config.algorithm)
    except KeyError as error:
        # the registry's own words list the registered names (they were listed twice, in a sweep's cell)
        fail("algorithm", config.algorithm, error.args[0])
    for name, (_, now) in algorithm.changed_defaults.items():  # recorded, so a run at it is named as such
        if getattr(config, name) is None:
            config = dataclasses.replace(config, **{name: now})
    config = _resolve_server_optimizer(config, algorithm)
    # A data fingerprint marks data passed in Python (run_experiment(config, data=...)), named as the user wished.
    user_data = config.data_fingerprint is not None and config.dataset.strip() != ""
    if not (user_data or config.dataset in DATASET_NAMES or config.dataset.startswith(DATASET_PREFIXES)):
        own = (f" (a file of your own arrays: dataset 'npz' with data_dir={config.dataset!r}, "
               f"--dataset npz --data-dir {shlex.quote(config.dataset)})"
               if config.dataset.lower().endswith(".npz") else "")
        fail("dataset", config.dataset, f"one of {', '.join(DATASET_NAMES)}, or tfds:NAME (e.g. tfds:cifar10) "
                                         f"or synthetic:ALPHA,BETA{own}")
    if not (config.model in MODEL_NAMES or is_object_reference(config.model) or config.model.startswith(USER_PREFIX)):
        fail("model", config.model, f"one of {', '.join(MODEL_NAMES)}, or module:object naming a Flax module class, "
                                     "an nnx factory (rngs -> Module) or a factory (num_classes=...) -> Module")
    choices = {"client_sizes": CLIENT_SIZES,
               "partition": PARTITION_NAMES, "heterogeneity": HETEROGENEITY_NAMES,
               "client_weights": CLIENT_WEIGHTS, "client_optimizer": CLIENT_OPTIMIZERS,
               "server_optimizer": SERVER_OPTIMIZER_NAMES, "staleness": STALENESS_NAMES,
               "negative_times": NEGATIVE_POLICIES, "augment": AUGMENTATIONS, "weight_init": WEIGHT_INITS,
               "client_state": CLIENT_STATE_PLACEMENTS, "speed_unit": SPEED_UNITS}
    for name, allowed in choices.items():
        if name == "client_optimizer" and config.client_optimizer.startswith(USER_PREFIX):
            continue  # an optax object given to run_experiment(client_optimizer=...)
        if getattr(config, name) not in allowed:
            fail(name, getattr(config, name), f"one of {', '.join(allowed)}")
    if config.step_loop is not None and config.step_loop not in STEP_LOOPS:
        fail("step_loop", config.step_loop, f"one of {', '.join(STEP_LOOPS)}, or null to let the engine choose")
    if config.rule is not None and config.rule not in RULES:
        fail("rule", config.rule, f"one of {', '.join(RULES)}, or null for each algorithm's default")
    positive_ints = ("clients", "local_steps", "batch_size", "buffer_size", "eval_every", "max_updates", "max_client_updates", "max_client_steps", "clients_per_round", "concurrency", "clients_per_call", "steps_per_call", "devices", "shards_per_client", "dirichlet_min_samples")
    for name in positive_ints:
        value = getattr(config, name)
        if value is not None and value < 1:
            fail(name, value, "an integer >= 1")
    for name in ("clients", "local_steps", "batch_size", "clients_per_call", "steps_per_call", "num_classes"):
        value = getattr(config, name)
        if value is not None and value >= 2 ** 31:  # past it the kernels' int32 counts and shapes overflow
            fail(name, value, "an integer below 2^31 (2,147,483,648): it becomes a 32-bit integer on the device")
    if not 0 <= config.seed < SEED_LIMIT:
        fail("seed", config.seed, "an integer in [0, 2^63 - 1] (the largest a JAX PRNG key takes)")
    positive_finite = ("speed_mean", "client_lr", "server_lr", "dirichlet_alpha", "speed_cap", "size_skew",
                       "speed_reference_time")
    for name in positive_finite:
        value = getattr(config, name)
        if not (value > 0 and math.isfinite(value)):
            fail(name, value, "a finite number > 0")
    # beyond these the drawn size weights overflow to inf (Pareto 1/size_skew, exp(size_skew·N(0, 1)))
    if config.client_sizes == "powerlaw" and config.size_skew < POWERLAW_MIN_SKEW:
        fail("size_skew", config.size_skew, f"a tail index >= {POWERLAW_MIN_SKEW:g} with client_sizes powerlaw "
                                            "(smaller draws sizes that overflow to inf)")
    if config.client_sizes == "lognormal" and config.size_skew > LOGNORMAL_MAX_SKEW:
        fail("size_skew", config.size_skew, f"a sigma in (0, {LOGNORMAL_MAX_SKEW:g}] with client_sizes lognormal "
                                            "(larger draws sizes that overflow to inf)")
    if not config.output_dir.strip():
        fail("output_dir", config.output_dir, "a folder's path (an empty one would write into the current folder; "
                                              "give . for that)")
    for name in ("jitter", "latency", "staleness_a"):
        value = getattr(config, name)
        if not (value >= 0 and math.isfinite(value)):
            fail(name, value, "a finite number >= 0")
    if not (config.speed_ratio >= 1 and math.isfinite(config.speed_ratio)):
        fail("speed_ratio", config.speed_ratio, "a finite slowest/fastest ratio >= 1")
    if not (config.staleness_alpha > 0 and math.isfinite(config.staleness_alpha)):
        fail("staleness_alpha", config.staleness_alpha, "a finite number > 0")
    if not config.bandwidth > 0:
        fail("bandwidth", config.bandwidth, "a number > 0 bytes/s (inf for no bandwidth limit)")
    if not 0 <= config.gamma <= 1:
        fail("gamma", config.gamma, "an IID fraction in [0, 1]")
    if not 0 <= config.speed_change_prob <= 1:
        fail("speed_change_prob", config.speed_change_prob, "a probability in [0, 1]")
    if config.target_accuracy is not None and not 0 <= config.target_accuracy <= 1:
        fail("target_accuracy", config.target_accuracy, "an accuracy in [0, 1]")
    if config.server_momentum is not None and not 0 <= config.server_momentum < 1:
        fail("server_momentum", config.server_momentum, "a number in [0, 1)")
    for name in ("server_beta1", "server_beta2"):
        if not 0 <= getattr(config, name) < 1:
            fail(name, getattr(config, name), "a number in [0, 1)")
    if not (config.server_tau > 0 and math.isfinite(config.server_tau)):
        fail("server_tau", config.server_tau, "a finite number > 0")
    # the device computes in float32: a τ below its smallest normal number is 0 there (a division by
    # zero: the model NaN at version 1), and a rate or pull above its largest is inf
    if config.server_tau < FLOAT32_TINY:
        fail("server_tau", config.server_tau, f"at least {FLOAT32_TINY:.4g}, float32's smallest normal number: the "
                                              "device computes in float32, where a smaller τ is 0 and √v + τ divides by zero")
    for name in ("client_lr", "server_lr", "prox_mu", "staleness_alpha", "client_weight_decay"):
        value = getattr(config, name)
        if value is not None and value > FLOAT32_MAX:
            fail(name, value, f"at most {FLOAT32_MAX:.4g}, float32's largest number: the device computes in float32, "
                              "where a larger one is inf")
    for name in ("speed_mean", "speed_reference_time", "speed_cap", "speed_ratio", "jitter", "latency",
                 "delay_factor", "dropout_mean", "round_timeout"):
        value = getattr(config, name)
        if value is not None and value > TIME_SCALE_LIMIT:
            fail(name, value, f"at most {TIME_SCALE_LIMIT:g}: an event's time multiplies it with the step count, "
                              "the other speed settings and a random draw, and larger products overflow to inf")
    for name in ("speed_mean", "speed_reference_time", "bandwidth"):  # speed_mean 1e-320: "inf/virtual h" in JSON
        if getattr(config, name) < 1 / TIME_SCALE_LIMIT:
            fail(name, getattr(config, name), f"at least {1 / TIME_SCALE_LIMIT:g}: " + (
                "rates per virtual second divide by the times it makes, and smaller values overflow them to inf"
                if name == "speed_mean" else
                "an event's time divides by it, and smaller values make times that overflow to inf"))
    if not config.max_time > 0:
        fail("max_time", config.max_time, "virtual seconds > 0 (inf for no time budget)")
    if math.isinf(config.max_time) and not _count_budgets(config) and not config.stop_at_target:
        fail("max_time", config.max_time, "a finite time budget, or set max_updates, max_client_updates, "
                                          "max_client_steps or stop_at_target")
    if config.eval_interval is not None and not (config.eval_interval > 0 and math.isfinite(config.eval_interval)):
        fail("eval_interval", config.eval_interval, "a finite number of virtual seconds > 0, or null")
    if config.eval_interval is not None and math.isfinite(config.max_time) \
            and config.max_time / config.eval_interval >= MAX_GRID_POINTS:
        ratio = config.max_time / config.eval_interval
        points = f"{math.floor(ratio) + 1:,}" if ratio < 1e12 else f"about {ratio:.3g}"
        fail("eval_interval", config.eval_interval,
             f"with max_time={config.max_time:g} it makes {points} evaluation grid points (one metrics row each); "
             f"allowed at most {MAX_GRID_POINTS:,}: an eval_interval > max_time / {MAX_GRID_POINTS:,} = "
             f"{config.max_time / MAX_GRID_POINTS:g} s, or eval_every")
    if config.eval_interval is not None and config.eval_interval > config.max_time and not config.timing_only:
        # the grid's points are k·eval_interval up to max_time: the untrained model at 0 alone, which
        # final_accuracy and best_accuracy would then report
        fail("eval_interval", config.eval_interval,
             f"at most max_time ({config.max_time:g}): the run evaluates on the grid k·eval_interval up to "
             f"max_time, and with a longer interval only the initial model at time 0")
    for name in ("clients_per_round", "concurrency"):
        if getattr(config, name) is not None and getattr(config, name) > config.clients:
            fail(name, getattr(config, name), f"at most the number of clients ({config.clients})")
    for name in ("crash_prob", "delay_prob", "dropout_prob"):
        if not 0 <= getattr(config, name) <= 1:
            fail(name, getattr(config, name), "a probability in [0, 1]")
    if config.crash_prob + config.delay_prob + config.dropout_prob > 1:
        fail("crash_prob", config.crash_prob, "crash_prob + delay_prob + dropout_prob at most 1")
    if not (config.delay_factor >= 1 and math.isfinite(config.delay_factor)):
        fail("delay_factor", config.delay_factor, "a finite factor >= 1")
    if not (config.dropout_mean > 0 and math.isfinite(config.dropout_mean)):
        fail("dropout_mean", config.dropout_mean, "finite virtual seconds > 0")
    if config.round_timeout is not None and not (config.round_timeout > 0 and math.isfinite(config.round_timeout)):
        fail("round_timeout", config.round_timeout, "finite virtual seconds > 0, or null")
    reads = getattr(algorithm, "reads", None)
    if config.crash_prob > 0 and algorithm.waits_for_clients and reads is not None and "round_timeout" not in reads:
        # a plug-in that waits and reads no deadline: without round_timeout it stalls, with it the deadline is unread
        fail("crash_prob", config.crash_prob,
             f"only 0 for {config.algorithm}: it waits for {algorithm.waits_for_clients} (its waits_for_clients) "
             "and reads no deadline (round_timeout is not among its reads), so a crashed client would stall it "
             "forever; to run it with crashes, give it one (read round_timeout and close a round at a timer that "
             "long after it opens), or set waits_for_clients = None if its on_crash stops the wait")
    if config.crash_prob > 0 and algorithm.waits_for_clients and config.round_timeout is None:
        fail("round_timeout", config.round_timeout,
             f"a deadline in virtual seconds: {config.algorithm} waits for {algorithm.waits_for_clients}, "
             "and with crash_prob > 0 a crashed client would stall it forever")
    if config.on_nonfinite not in NONFINITE_POLICIES:
        fail("on_nonfinite", config.on_nonfinite, f"one of {', '.join(NONFINITE_POLICIES)}")
    if config.checkpoint_every is not None and config.checkpoint_every < 1:
        fail("checkpoint_every", config.checkpoint_every, "an integer >= 1, or null for a checkpoint at the end only")
    if config.checkpoint_min_interval_s is not None and not config.checkpoint_min_interval_s >= 0:
        fail("checkpoint_min_interval_s", config.checkpoint_min_interval_s,
             "wall seconds >= 0 (0: a checkpoint every checkpoint_every updates exactly), or null for "
             f"{DEFAULT_CHECKPOINT_MIN_INTERVAL_S:g} at the default checkpoint_every of {DEFAULT_CHECKPOINT_EVERY}, else 0")
    if config.memory_limit_mb is not None and not (config.memory_limit_mb > 0 and math.isfinite(config.memory_limit_mb)):
        fail("memory_limit_mb", config.memory_limit_mb, "finite MiB > 0, or null for the free memory")
    if config.speed_legacy_seed is not None and not 0 <= config.speed_legacy_seed < 2 ** 32:
        fail("speed_legacy_seed", config.speed_legacy_seed, "an integer in [0, 2^32) (NumPy RandomState), or null")
    if not (config.prox_mu >= 0 and math.isfinite(config.prox_mu)):
        fail("prox_mu", config.prox_mu, "a finite number >= 0")
    # whether the algorithm reads fednova at all comes before what fednova needs of the clients' optimiser
    if config.fednova and not algorithm.supports_fednova(config):
        fail("fednova", config.fednova, f"leave it false for {config.algorithm}{_rule_text(config)}: FedNova normalises "
                                        f"aggregations of several pseudo-gradients "
                                        f"({', '.join(_fednova_algorithms(config))}); {config.algorithm} "
                                        f"mixes models, aggregates one update at a time (where FedNova's "
                                        f"normalisation is 1) or is normalised already")
    _validate_client_training(config, algorithm)
    options = resolve_options(algorithm, config.algorithm_options)
    options.validate(config)
    algorithm.validate(config, options)
    if config.timing_only:
        depends = algorithm.schedule_depends_on_model(config, options)
        if depends is not None:
            fail("timing_only", True, f"this {config.algorithm} run's schedule depends on model values "
                                      f"({depends})")
        if math.isinf(config.max_time) and not _count_budgets(config):
            fail("max_time", config.max_time, "a finite time budget, or max_updates, max_client_updates or "
                                              "max_client_steps, for a timing-only run (it has no accuracy to stop at)")
    _check_settings_are_read(config, algorithm, options)
    config = dataclasses.replace(config, algorithm_options=options)
    _check_client_state_is_read(config, algorithm)
    config = _validate_data_fields(config)
    if config.run_name is not None and (not config.run_name or os.sep in config.run_name or "/" in config.run_name
                                        or config.run_name in (".", "..") or config.run_name != config.run_name.strip()):
        # (" " made a folder named by one space, "runs/ " at the end of the run's line)
        fail("run_name", config.run_name, "a plain folder name without path separators, not starting or ending "
                                          "in a space")
    if config.run_name is not None and not _utf8(config.run_name):  # orbax's checkpoints: a traceback after training
        fail("run_name", config.run_name, "a name of UTF-8 text (it holds bytes that are not)")
    if config.run_name is not None and len(config.run_name.encode()) > MAX_RUN_NAME_BYTES:
        fail("run_name", config.run_name, f"a name of at most {MAX_RUN_NAME_BYTES} bytes (UTF-8): a folder's name "
                                          f"holds at most 255, and a rerun adds -2, -3...")
    if config.target_accuracy is None:
        config = dataclasses.replace(config, target_accuracy=DEFAULT_TARGETS.get(config.dataset))
    if config.target_accuracy is None and math.isinf(config.max_time) and not _count_budgets(config):
        fail("max_time", config.max_time, f"a finite time budget, or max_updates, max_client_updates or "
                                          f"max_client_steps: dataset {config.dataset!r} has no default target "
                                          "accuracy to stop at (or set target_accuracy)")
    return config


# Run fields that only some algorithms read: each built-in algorithm names those it reads in its
# ``reads`` class attribute; a non-default value given to one that does not is reported.
ALGORITHM_FIELDS = ("clients_per_round", "concurrency", "buffer_size", "rule", "staleness", "staleness_alpha",
                    "staleness_a", "round_timeout")


def reads_field(algorithm, name: str, given: Callable[[str], bool] = lambda name: False) -> bool:
    """Whether ``algorithm`` reads the run field ``name`` of :data:`ALGORITHM_FIELDS` when the
    fields for which ``given`` is true are set: ``concurrency`` if it keeps clients in flight
    (``uses_concurrency``), ``clients_per_round`` not then if ``concurrency`` is given too (which
    replaces it), any other if its ``reads`` names it or it declares none (a plug-in's).

    >>> fedbuff = algorithms.get("fedbuff")
    >>> reads_field(fedbuff, "clients_per_round"), reads_field(fedbuff, "clients_per_round", {"concurrency"}.__contains__)
    (True, False)
    >>> reads_field(algorithms.get("port"), "concurrency")
    False
    """
    if name == "concurrency":
        return algorithm.uses_concurrency
    if name == "clients_per_round" and algorithm.uses_concurrency and given("concurrency"):
        return False
    return algorithm.reads is None or name in algorithm.reads


DATASETS_WITHOUT_FILES = ("mnist10k", "digits")  # and synthetic*: nothing is read from data_dir


def _only_read_when(config: RunConfig, options: Any = None) -> dict[str, tuple[bool, str]]:
    """Fields read only in some settings: name → (read in this config?, what reads it). ``options``: the
    algorithm's resolved options (None: the config's own, or the defaults)."""
    partition = config.partition
    variant = _variant_unread(config, options)
    mixing = "server_optimizer" in variant  # no server optimiser: none of its fields is read
    timing = config.timing_only
    return {
        "data_dir": (not (config.dataset in DATASETS_WITHOUT_FILES or config.dataset.startswith("synthetic")),
                     "datasets fashion_mnist, mnist, npz, array_record and tfds:NAME"),
        "dirichlet_alpha": (partition in ("dirichlet", "dirichlet_client"), "partitions dirichlet and dirichlet_client"),
        "dirichlet_min_samples": (partition == "dirichlet", "partition dirichlet"),
        "dirichlet_balance": (partition == "dirichlet", "partition dirichlet"),
        "client_sizes": (partition in ("iid", "dirichlet_client"), "partitions iid and dirichlet_client"),
        "size_skew": (partition in ("iid", "dirichlet_client") and config.client_sizes != "equal",
                      "client_sizes lognormal and powerlaw (partitions iid and dirichlet_client)"),
        "shards_per_client": (partition == "label_shards", "partition label_shards"),
        "gamma": (partition == "gamma_mix", "partition gamma_mix"),
        "speed_cap": (config.heterogeneity in ("pareto", "zipf"), "heterogeneity pareto and zipf"),
        # only a normal draw or a jittered round can come out non-positive
        "negative_times": (config.heterogeneity == "normal" or config.jitter > 0, "heterogeneity normal or jitter > 0"),
        "speed_reference_time": (config.heterogeneity in ("pareto", "zipf"), "heterogeneity pareto and zipf"),
        "speed_legacy_seed": (config.heterogeneity in ("pareto", "zipf"), "heterogeneity pareto and zipf"),
        "speed_ratio": (config.heterogeneity == "uniform", "heterogeneity uniform"),
        # without local_epochs every client's round has local_steps steps: no data size to undo
        "speed_unit": (config.local_epochs is not None,
                       "local_epochs set: a round of E epochs takes E·S̄ steps' time whatever the client's data "
                       "size; without it every round has local_steps steps, as speed_unit step times them"),
        # homo's time per step is the mean for every client: a change would draw the same time again
        "speed_change_prob": (config.heterogeneity != "homo", "heterogeneity normal, exp, pareto, zipf and uniform"),
        "delay_factor": (config.delay_prob > 0, "delay_prob > 0"),
        "dropout_mean": (config.dropout_prob > 0, "dropout_prob > 0"),
        "eval_every": (config.eval_interval is None and not timing,
                       TIMING_ONLY_READERS if timing else "runs without eval_interval"),
        **{name: (name not in variant, variant[name][1] if name in variant else "") for name in VARIANT_FIELDS},
        "staleness_a": (config.staleness != "constant" and "staleness_a" not in variant,
                        variant["staleness_a"][1] if "staleness_a" in variant else
                        "staleness functions other than constant"),
        **{name: (config.server_optimizer in readers and not mixing and name not in variant,
                  variant[name][1] if name in variant else
                  variant["server_optimizer"][1] if mixing else _server_readers_text(name))
           for name, readers in SERVER_FIELDS_READ_BY.items()},
        # a timing-only run trains, evaluates and checkpoints nothing; checkpoint_every none (no
        # periodic checkpoint) agrees with it: training configs replayed timing-only set it
        **{name: (not timing, TIMING_ONLY_READERS) for name in TIMING_ONLY_UNREAD},
        "checkpoint_every": (not timing or config.checkpoint_every is None, TIMING_ONLY_READERS),
        # (ran with exit 0 and changed nothing, each of these)
        "checkpoint_min_interval_s": (not timing and config.checkpoint_every is not None,
                                      TIMING_ONLY_READERS if timing else "runs with periodic checkpoints "
                                      "(checkpoint_every set)"),
        "clients_per_call": (not timing and config.batching,
                             TIMING_ONLY_READERS if timing else "runs with batching (without it a call trains one client)"),
        "steps_per_call": (not timing and config.step_loop != "rolled",
                           TIMING_ONLY_READERS if timing else "step_loop unrolled (a rolled loop compiles one step)"),
    }


# Fields a timing-only run never reads (besides eval_every and checkpoint_every, above): given, it is
# refused, and a sweep leaves them out of its timing-only cells. Training settings (client_lr, the
# optimisers, target_accuracy...) are kept: they describe the training run whose schedule a
# timing-only run replays (the same config with timing_only added, as `jaxfl demo --timing-only`).
# The engine's call shapes and devices are not: a timing-only run builds no engine (devices=3 on a
# one-device machine ran, and gave the run another name than the same schedule without it).
TIMING_ONLY_UNREAD = ("eval_interval", "eval_at_start", "checkpoint_min_interval_s", "final_checkpoint",
                      "batching", "clients_per_call", "steps_per_call", "step_loop", "cpu_friendly_layers",
                      "devices", "memory_limit_mb")
TIMING_ONLY_READERS = "runs that train; a timing-only run has no training, no evaluation, no checkpoints"

# Shared fields that an algorithm reads or not by its own settings (its rule, its options):
# Algorithm.unread_settings names those it does not read.
VARIANT_FIELDS = ("client_weights", "server_optimizer", "server_lr", "server_momentum", "staleness", "staleness_alpha",
                  "staleness_a", "local_steps")


def _variant_unread(config, options: Any = None) -> dict[str, tuple[str | None, str]]:
    """The algorithm's :meth:`~jaxfl.algorithms.Algorithm.unread_settings` for ``config`` (unvalidated
    in a sweep: an unknown algorithm or options that do not build give none)."""
    try:
        cls = algorithms.get(config.algorithm)
    except KeyError:
        return {}
    if options is None:
        options = config.algorithm_options
    if isinstance(options, dict):
        try:
            options = cls.Options(**{cls.Options.field_name(key): value for key, value in options.items()})
        except TypeError:
            options = None
    if options is not None and not isinstance(options, cls.Options):
        options = None
    return cls.unread_settings(config, options)


# Server-optimiser fields → the server optimisers that read them. Which optimiser a run uses is the
# algorithm's own where it has one (FedAdam: adam), else server_optimizer, so in a comparison these
# fields go only to the algorithms whose optimiser reads them (fields_not_read_by).
SERVER_FIELDS_READ_BY = {
    "server_momentum": ("sgd",),
    "server_tau": ("adam", "yogi", "adagrad", "optax_adam", "optax_yogi", "optax_adagrad"),
    "server_beta1": ("adam", "yogi", "adagrad", "optax_adam", "optax_yogi"),
    "server_beta2": ("adam", "yogi", "optax_adam", "optax_yogi"),
}


def _server_readers_text(name: str) -> str:
    readers = SERVER_FIELDS_READ_BY[name]
    return f"server_optimizer {readers[0]}" if len(readers) == 1 else \
        f"server optimizers {', '.join(readers[:-1])} and {readers[-1]}"


MAX_RUN_NAME_BYTES = 240


def _utf8(text: str) -> bool:
    """Whether ``text`` is UTF-8 text (a path Python read with undecodable bytes holds surrogates).

    >>> _utf8("runs/été"), _utf8("runs/bad" + chr(0xDCFF) + "name")  # a path read with the byte 0xff in it
    (True, False)
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_output_folder(flag: str, path: str, given: str | None = None) -> None:
    """Refuse (ConfigError) an output folder that cannot be made: ``path``, or the nearest of its
    parents that exists, is a file, or a folder that cannot be written; a path that is not UTF-8 text
    (checkpoints cannot be written there) or names a folder longer than the file system allows. Said
    before any work, so a run or a sweep does not fail on it after building its data, or after
    training (a missing folder is made later). ``given``: the flag's value where ``path`` is its
    folder (a file's path).

    >>> import tempfile
    >>> afile = tempfile.mkstemp()[1]
    >>> check_output_folder("--out", afile + "/sub")
    Traceback (most recent call last):
    ...
    jaxfl.config.ConfigError: --out=...sub' is not allowed: ... is a file, not a folder; give a folder (one that does not exist yet is made)
    """
    import tempfile

    shown_value = repr(given or path)
    if not _utf8(os.path.abspath(path)):  # (a relative path under a working folder that is not text too)
        raise ConfigError(f"{flag}={shown_value} is not allowed: its path holds bytes that are not UTF-8 text, and "
                          "a run's checkpoints cannot be written there; give a folder whose path is text")
    probe = os.path.abspath(path)
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    shown = repr(probe if os.path.isabs(path) else os.path.relpath(probe))
    if not os.path.isdir(probe):
        if os.path.islink(probe) and not os.path.exists(probe):
            what = f"a link to {os.readlink(probe)!r}, which does not exist"
        else:
            what = "a file" if os.path.isfile(probe) else "a device, pipe or socket"
        raise ConfigError(f"{flag}={shown_value} is not allowed: {shown} is {what}, not a folder; give "
                          f"{'a path in ' if given else ''}a folder (one that does not exist yet is made)")
    try:
        longest = os.pathconf(probe, "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    for part in os.path.relpath(os.path.abspath(path), probe).split(os.sep):
        if len(part.encode()) > longest:
            raise ConfigError(f"{flag}={shown_value} is not allowed: its folder name {part[:40]!r}... is "
                              f"{len(part.encode())} bytes, and this file system takes at most {longest}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag}={shown_value} is not allowed: the folder {shown} cannot be written "
                          "(permissions, or a read-only file system); give a folder you can write")
    try:  # what access() cannot tell: a file system that makes no folders (/proc, /sys), a full disk
        os.rmdir(tempfile.mkdtemp(prefix=".jaxfl-probe-", dir=probe))
    except OSError as error:
        raise ConfigError(f"{flag}={shown_value} is not allowed: no folder can be made in {shown} "
                          f"({error.strerror or error}); give a folder you can write") from None


def algorithms_reading(name: str) -> list[str]:
    """The registered algorithms that read the run field ``name`` (one of :data:`ALGORITHM_FIELDS`, or
    of :data:`SERVER_FIELDS_READ_BY`: those whose own server optimiser reads it, or sgd's by default).

    >>> "fedbuff" in algorithms_reading("buffer_size"), "fedavg" in algorithms_reading("buffer_size")
    (True, False)
    >>> "fedadam" in algorithms_reading("server_tau"), "fedavg" in algorithms_reading("server_tau")
    (True, False)
    """
    if name in SERVER_FIELDS_READ_BY or name in VARIANT_FIELDS:
        readers = []
        for other in algorithms.names():
            cls = algorithms.get(other)
            if name in SERVER_FIELDS_READ_BY and \
                    (cls.server_optimizer or ServerConfig.server_optimizer) not in SERVER_FIELDS_READ_BY[name]:
                continue
            if name in ALGORITHM_FIELDS and not reads_field(cls, name):
                continue  # the staleness fields: read by the asynchronous algorithms alone
            conditions, read_always = [], True
            for rule in (None, *RULES):  # the variants a run field selects (options: their defaults)
                unread = cls.unread_settings(RunConfig(algorithm=other, rule=rule))
                key = "server_optimizer" if name in SERVER_FIELDS_READ_BY and "server_optimizer" in unread else name
                if key in unread:
                    read_always = False
                    if unread[key][0] is not None and unread[key][0] not in conditions:
                        conditions.append(unread[key][0])
            if read_always:
                readers.append(other)
            elif conditions:
                readers.append(f"{other} with {' or '.join(conditions)}")
        return readers
    if name == "fednova":
        return _fednova_algorithms(RunConfig())
    return [other for other in algorithms.names() if reads_field(algorithms.get(other), name)]


def _run_of(values: dict[str, Any]) -> RunConfig:
    """A RunConfig of the run fields in ``values`` (flags given), unvalidated."""
    return RunConfig(**{name: _coerce(value, FIELDS[name].type) for name, value in values.items()
                        if name in FIELDS and name not in ("algorithm", "algorithm_options")})


def variant_unread(algorithm, values: dict[str, Any], options: dict[str, Any] | None = None) -> dict[str, tuple]:
    """:meth:`~jaxfl.algorithms.base.Algorithm.unread_settings` of ``algorithm`` under run fields
    ``values`` (e.g. flags given: its rule) and ``options`` (a mapping of its option names; None or
    invalid: their defaults): the shared fields its variant does not read, with what reads them.

    >>> variant_unread(algorithms.get("fedcompass"), {}, {"q_max": 10})["local_steps"][0]
    'compass.q_max unset'
    """
    run = _run_of(values)
    resolved = None  # the algorithm's options given (FedASMU's slot decides what it reads), else its defaults
    if options:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                resolved = resolve_options(algorithm, options)
        except (ConfigError, TypeError, ValueError):  # validation names a bad option
            resolved = None
    return algorithm.unread_settings(run, resolved)


def fields_not_read_by(algorithm, values: dict[str, Any], options: dict[str, Any] | None = None) -> list[str]:
    """The names in ``values`` (run fields, e.g. flags given) that ``algorithm`` never reads although
    they differ from the field's default: the fields of :data:`ALGORITHM_FIELDS` it does not read
    (:func:`reads_field`), the server-optimiser fields its server optimiser (its own, else ``values``'
    server_optimizer) does not read, the shared fields its variant under ``values`` and its
    ``options`` (a mapping of its option names; None: their defaults) does not read, and ``fednova``
    where it normalises nothing.

    >>> fields_not_read_by(algorithms.get("fedavg"), {"buffer_size": 5, "clients_per_round": 2})
    ['buffer_size']
    >>> [fields_not_read_by(algorithms.get(name), {"server_tau": 0.01}) for name in ("fedavg", "fedadam")]
    [['server_tau'], []]
    """
    optimizer = algorithm.server_optimizer or values.get("server_optimizer") or ServerConfig.server_optimizer

    def given(name: str) -> bool:
        if name not in values:
            return False
        value = _coerce(values[name], FIELDS[name].type)
        # a saved config.json holds server_lr resolved to its optimiser's default: not a setting
        return value != FIELDS[name].default and \
            not (name == "server_lr" and value == DEFAULT_SERVER_LR.get(optimizer, 1.0))

    variant = variant_unread(algorithm, values, options)
    server = [name for name, readers in SERVER_FIELDS_READ_BY.items()
              if given(name) and (optimizer not in readers or name in variant or "server_optimizer" in variant)]
    server += [name for name in VARIANT_FIELDS if name in variant and given(name) and name not in server]
    unread = [name for name in ALGORITHM_FIELDS if given(name) and not reads_field(algorithm, name, given)] + server
    if given("fednova") and not algorithm.supports_fednova(_run_of(values)):  # in a comparison: to those it normalises
        unread.append("fednova")
    return unread


# set while a run's recorded config is read back (a resume): what it holds is the run's, not to be left out
READING_A_RECORD: contextvars.ContextVar[bool] = contextvars.ContextVar("jaxfl_reading_a_record", default=False)


def _check_settings_are_read(config: RunConfig, algorithm, options: Any = None) -> None:
    """Nothing set is silently ignored. A data, speed, fault, evaluation or checkpoint field, or a
    shared field the algorithm's variant does not read (client_weights, the server optimiser's;
    :data:`VARIANT_FIELDS`), set (to a non-default value) where the run never reads it is an error.
    An algorithm-specific field (buffer_size, rule, ...) the algorithm does not read is a warning
    here, because one base config reused for several algorithms is the usual way to compare them in
    Python; ``jaxfl run`` refuses it for a single algorithm and passes it only to the algorithms that
    read it in a comparison."""
    for name, (read, readers) in _only_read_when(config, options).items():
        value = getattr(config, name)
        # server_lr is resolved (its optimiser's default) before this check
        at_default = value == FIELDS[name].default or \
            (name == "server_lr" and value == DEFAULT_SERVER_LR.get(config.server_optimizer, 1.0))
        if not read and not at_default:
            keep = "unset" if FIELDS[name].default is None else f"at its default {FIELDS[name].default!r}"
            own = ("; a file of your own arrays is dataset 'npz' (--dataset npz)"
                   if name == "data_dir" and str(value).lower().endswith(".npz") else "")
            fail(name, value, f"leave it {keep}, this run never reads it (read only with {readers}){own}")
    for name in fields_not_read_by(algorithm, {name: getattr(config, name) for name in ALGORITHM_FIELDS}):
        written = _written_by_another(config, name)
        warn_user(f"{name}={getattr(config, name)!r} is ignored: {config.algorithm} does not read it (read by "
                  f"{', '.join(algorithms_reading(name))}){written and '; ' + written}")
    if algorithm.reads is None:  # a plug-in's: whether it reads them is its code's business, so said, not checked
        given = [f"{name}={getattr(config, name)!r}" + (f" ({written})" if (written := _written_by_another(config, name))
                                                        else "")
                 for name in ALGORITHM_FIELDS
                 if name != "concurrency" and getattr(config, name) != FIELDS[name].default
                 # a default its own validation writes; the deadline it asks for where it waits for clients
                 and algorithm.changed_defaults.get(name, (None, object()))[1] != getattr(config, name)
                 and not (name == "round_timeout" and algorithm.waits_for_clients)]
        if given:
            fields = ", ".join(name for name in ALGORITHM_FIELDS if name != "concurrency")
            warn_user(f"{config.algorithm} declares no reads (which of the run fields {fields} it reads), "
                      f"so {', '.join(given)} {'is' if len(given) == 1 else 'are'} passed to it unchecked: whatever "
                      f"its code does not read is ignored. Set reads = frozenset({{...}}) on {algorithm.__name__} "
                      "(jaxfl.algorithms.Algorithm.reads) to have a setting it does not read reported")


def _written_by_another(config: RunConfig, name: str) -> str:
    """Where ``config``'s value of ``name`` is a default other algorithms' validation writes (FedBuff's rule
    'paper'), as a validated config of theirs reused for this one holds it: how to leave it out; "" otherwise,
    and in a resume, which compares the config as recorded."""
    value = getattr(config, name)
    writers = [other for other in algorithms.names() if other != config.algorithm
               and algorithms.get(other).changed_defaults.get(name, (None, object()))[1] == value]
    if not writers or READING_A_RECORD.get():
        return ""
    return (f"if it comes from a validated {' or '.join(writers)} config, which holds it as their default: "
            f"dataclasses.replace(config, algorithm={config.algorithm!r}, {name}=None) leaves it out")


def _check_client_state_is_read(config: RunConfig, algorithm) -> None:
    """A ``client_state`` placement is refused where no per-client state exists to place."""
    if config.client_state == "auto":
        return
    if config.timing_only:
        fail("client_state", config.client_state, "auto in a timing-only run (it keeps no model state)")
    hooks = algorithms.device_hooks(algorithm(config, config.algorithm_options))
    if not any(hook.keeps_per_client_state() for hook in hooks):
        keeping = "CC-FedAvg's strategies cc, strategy2 and cc_c, and FedASMU"
        fail("client_state", config.client_state, f"auto: this {config.algorithm} run keeps no per-client state "
                                                  f"(kept by {keeping})")


def _validate_data_fields(config: RunConfig) -> RunConfig:
    """num_classes, the explicit normalisation statistics (as tuples) and the data fingerprint."""
    if config.num_classes is not None and config.num_classes < 2:
        fail("num_classes", config.num_classes, "an integer >= 2, or null for the dataset's")
    stats = {}
    for name in ("normalize_mean", "normalize_std"):
        value = getattr(config, name)
        if value is not None:
            stats[name] = tuple(float(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
            if not config.normalize:
                fail(name, value, "null unless normalize is true (set normalize=true to normalise by it)")
    if len(stats) == 1:
        given, missing = ("normalize_mean", "normalize_std") if "normalize_mean" in stats else \
            ("normalize_std", "normalize_mean")
        fail(missing, None, f"set together with {given} (or leave both null for the training split's statistics)")
    if "normalize_std" in stats and min(stats["normalize_std"]) <= 0:
        fail("normalize_std", config.normalize_std, "standard deviations > 0")
    # the inputs are normalised in float32: a std below its smallest normal number divides by 0 there
    if "normalize_std" in stats and not all(FLOAT32_TINY <= std <= FLOAT32_MAX for std in stats["normalize_std"]):
        fail("normalize_std", config.normalize_std, f"standard deviations from {FLOAT32_TINY:.4g} to {FLOAT32_MAX:.4g}, "
                                                    "float32's smallest normal and largest numbers (the inputs are "
                                                    "normalised in float32)")
    if "normalize_mean" in stats and not all(abs(mean) <= FLOAT32_MAX for mean in stats["normalize_mean"]):
        fail("normalize_mean", config.normalize_mean, f"finite means of at most {FLOAT32_MAX:.4g} in size, float32's "
                                                      "largest number (the inputs are normalised in float32)")
    fingerprint = config.data_fingerprint
    if fingerprint is not None and (len(fingerprint) != 64 or any(c not in "0123456789abcdef" for c in fingerprint)):
        fail("data_fingerprint", fingerprint, "a SHA-256 as 64 lowercase hex digits (as a run records it), or null")
    return dataclasses.replace(config, **stats) if stats else config


def _count_budgets(config: RunConfig) -> list[str]:
    """The budgets counted in aggregations that ``config`` sets (versions, client updates, client-steps)."""
    return [name for name in ("max_updates", "max_client_updates", "max_client_steps")
            if getattr(config, name) is not None]


def _resolve_server_optimizer(config: RunConfig, algorithm) -> RunConfig:
    """FedOpt names set the server optimiser; an unset server_lr takes the optimiser's default."""
    optimizer = algorithm.server_optimizer
    if optimizer is not None:
        if config.server_optimizer not in ("sgd", optimizer):  # sgd is the field's default
            fail("server_optimizer", config.server_optimizer, f"{optimizer} for {config.algorithm} (or leave it unset)")
        config = dataclasses.replace(config, server_optimizer=optimizer)
    if config.server_lr is None:
        config = dataclasses.replace(config, server_lr=DEFAULT_SERVER_LR.get(config.server_optimizer, 1.0))
    return config


def _validate_client_training(config: RunConfig, algorithm) -> None:
    """The client optimiser's momentum, weight decay and per-dispatch decay, local epochs, and which
    client optimisers FedNova has a normaliser for."""
    if not (0 <= config.client_momentum < 1):
        fail("client_momentum", config.client_momentum, "a number in [0, 1)")
    if config.client_momentum >= 1 - 2 ** -25:  # rounds to 1 in float32, which the clients' optimizer computes in
        fail("client_momentum", config.client_momentum, f"a number in [0, 1) below 1 - 2**-25 = {1 - 2 ** -25!r}, "
                                                        "from which float32 rounds to 1: the clients' optimizer "
                                                        "computes in float32, where this is 1, a momentum that never "
                                                        "forgets")
    if not (config.client_weight_decay >= 0 and math.isfinite(config.client_weight_decay)):
        fail("client_weight_decay", config.client_weight_decay, "a finite number >= 0")
    if not 0 < config.client_lr_decay <= 1:
        fail("client_lr_decay", config.client_lr_decay, "a factor in (0, 1] (1: no decay)")
    optimizer = config.client_optimizer
    if config.client_momentum and optimizer != "sgd":
        fail("client_momentum", config.client_momentum,
             f"0 with client_optimizer {optimizer}: momentum is SGD's (adam and adamw have their own β1; an "
             "optax object given in Python carries its own)")
    if config.client_weight_decay and optimizer.startswith(USER_PREFIX):
        fail("client_weight_decay", config.client_weight_decay,
             f"0 with client_optimizer {optimizer}: put the decay in the optax object (optax.add_decayed_weights)")
    if config.local_epochs is not None:
        if not (config.local_epochs > 0 and math.isfinite(config.local_epochs)):
            fail("local_epochs", config.local_epochs, "a finite number of epochs > 0, or null for local_steps")
        if config.local_steps != FIELDS["local_steps"].default:
            fail("local_steps", config.local_steps, f"leave it at its default {FIELDS['local_steps'].default} with "
                                                    f"local_epochs={config.local_epochs:g}, which sets each client's "
                                                    "steps (local_epochs passes of ceil(n_i / batch_size)); set one of them (a preset's or config "
                                                    "file's local_epochs is unset by --local-epochs none)")
        if not algorithm.per_client_steps:
            readers = ", ".join(name for name in algorithms.names() if algorithms.get(name).per_client_steps)
            fail("local_epochs", config.local_epochs,
                 f"leave it unset for {config.algorithm}: it decides its clients' local steps itself (local_epochs is read "
                 f"by {readers})")
    if config.fednova and optimizer != "sgd":
        fail("fednova", config.fednova,
             f"leave it false with client_optimizer {optimizer}: FedNova (Wang et al., NeurIPS 2020) gives normalisers "
             "for SGD with momentum and proximal terms only; use client_optimizer sgd")
    if config.fednova and config.client_lr * (config.prox_mu + config.client_weight_decay) >= 1:
        fail("fednova", config.fednova,
             f"false with client_lr · (prox_mu + client_weight_decay) = "
             f"{config.client_lr * (config.prox_mu + config.client_weight_decay):g} >= 1: each step would "
             "overshoot the proximal pull and FedNova's normaliser is not positive")


def _rule_text(config: RunConfig) -> str:
    return f" with rule {config.rule}" if config.rule is not None else ""


def _fednova_algorithms(config: RunConfig) -> list[str]:
    return [name for name in algorithms.names() if algorithms.get(name).supports_fednova(config)]


def resolve_options(algorithm, options) -> Any:
    """An algorithm's options as its validated :class:`~jaxfl.algorithms.Options` dataclass, preset
    applied, from None (defaults), a mapping of its field names, or an instance.

    >>> from jaxfl.algorithms import get
    >>> resolve_options(get("port"), {"preset": "plato"}).cosine
    'current'
    """
    cls = algorithm.Options
    label = algorithm.option_namespace()
    if options is None:
        options = cls()
    elif isinstance(options, dict):
        known = {field.name for field in dataclasses.fields(cls)}
        values = {}
        for key, value in options.items():
            name = cls.field_name(key)
            if name not in known:
                allowed = ", ".join(sorted(known)) or "none"
                raise ConfigError(f"unknown option {key!r} of algorithm {algorithm.name!r}; allowed: {allowed}")
            values[name] = _coerce(_plain_number(value), cls.__dataclass_fields__[name].type)
        options = cls(**values)
    elif cls is algorithms.Options and type(options) is not cls:
        # (an algorithm without options of its own takes the base class, of which every algorithm's are subclasses:
        # PortConfig given to fedbuff ran FedBuff, and config.json recorded PORT's options as if they applied)
        fail("algorithm_options", options, f"none: {algorithm.name} has no options of its own ({type(options).__name__} "
                                           "is another algorithm's); leave it unset")
    elif not isinstance(options, cls):
        fail("algorithm_options", options, f"a {cls.__name__} or a mapping of its fields for {algorithm.name}")
    for field in dataclasses.fields(options):
        check_type(f"{label}.{field.name}", getattr(options, field.name), field.type)
    return options.resolved()


def _coerce(value: Any, annotation: str) -> Any:
    """JSON/TOML/CLI spellings: ints where floats are wanted, 'inf' strings, 'none' for null (TOML has none)."""
    annotation = annotation_text(annotation)
    if isinstance(value, str) and value.lower() in ("none", "null") and "None" in annotation:
        return None
    if annotation.startswith("tuple[float") and isinstance(value, list):
        return tuple(value)
    if annotation.startswith("float") and _is_int(value):
        return float(value)
    if isinstance(value, str) and annotation.startswith("float") and value in ("inf", "infinity"):
        return math.inf
    return value


def option_namespaces() -> dict[str, list[str]]:
    """Options namespace (``port``, ``compass``, …) → the registered algorithms that read it."""
    spaces: dict[str, list[str]] = {}
    for name in algorithms.names():
        cls = algorithms.get(name)
        if dataclasses.fields(cls.Options):
            spaces.setdefault(cls.option_namespace(), []).append(name)
    return spaces


def flat_once(table: dict, where: str, flatten: Callable[[dict], dict],
              splits: Callable[[str, Any], bool] = lambda key, value: isinstance(value, dict)) -> dict:
    """A config file's ``table`` flattened entry by entry with ``flatten`` (an entry: ``{key: value}``,
    or, where ``splits(key, value)``, one entry ``{key: {inner: item}}`` of a section table), refusing a
    setting the file gives twice with different values (``clients = 4`` and ``[data] clients = 5``),
    naming both spellings: which one a run took would depend on the order of the merge.

    >>> flat = lambda entry: {name: item for value in entry.values() for name, item in
    ...                       (value.items() if isinstance(value, dict) else [(next(iter(entry)), value)])}
    >>> flat_once({"seed": 1, "data": {"clients": 5}}, "x.toml", flat)
    {'seed': 1, 'clients': 5}
    >>> flat_once({"clients": 4, "data": {"clients": 5}}, "config file 'x.toml'", flat)
    Traceback (most recent call last):
    ...
    jaxfl.config.ConfigError: config file 'x.toml' gives clients twice: clients = 4 and [data] clients = 5; give it once
    """
    flat, spelled = {}, {}
    for key, value in table.items():
        if splits(key, value):
            entries = [(f"[{key}] {inner}", {key: {inner: item}}) for inner, item in value.items()]
        else:
            entries = [(f"[{key}]" if isinstance(value, dict) else key, {key: value})]
        for spelling, entry in entries:
            for setting, item in flatten(entry).items():
                if setting in flat and flat[setting] != item:
                    raise ConfigError(f"{where} gives {setting} twice: {spelled[setting]} = {flat[setting]!r} and "
                                      f"{spelling} = {item!r}; give it once")
                flat[setting] = item
                spelled.setdefault(setting, spelling)
    return flat


def split_algorithm_options(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Separate run fields from algorithm options in a flat mapping.

    Options may be spelled ``port.staleness_bound`` (a CLI/TOML namespace), ``port_staleness_bound``
    (the flat names of jaxfl 0.1, kept as aliases), a ``{"port": {...}}`` table, or an
    ``{"algorithm": {"name": "port", ...}}`` table. Returns ``(run fields, {namespace: options})``.

    >>> split_algorithm_options({"clients": 4, "port.min-clients": 2, "compass_q_min": 3})
    ({'clients': 4}, {'port': {'min_clients': 2}, 'compass': {'q_min': 3}})
    """
    spaces = option_namespaces()
    fields: dict[str, Any] = {}
    spelling: dict[str, str] = {}  # how the mapping named each field (for the refusal of one given twice)
    options: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name == "algorithm" and isinstance(value, dict):
            table = dict(value)
            if "name" in table:
                fields["algorithm"] = table.pop("name")
            fields.setdefault("algorithm_options", {}).update(table)
            continue
        if name in spaces and isinstance(value, dict):
            options.setdefault(name, {}).update({k.replace("-", "_"): v for k, v in value.items()})
            continue
        if name in SECTIONS and isinstance(value, dict):  # a [client] table: its fields
            for inner, item in value.items():
                spelled = f"[{name}] {inner}"
                inner = inner.replace("-", "_")
                if SECTION_OF.get(inner) != name:
                    allowed = ", ".join(f.name for f in dataclasses.fields(SECTIONS[name]))
                    raise ConfigError(f"unknown field {inner!r} in section [{name}]; allowed: {allowed}")
                _once(fields, spelling, inner, item, spelled)
            continue
        space, dot, rest = name.partition(".")
        if dot:
            if space not in spaces:
                failed = "".join(f"; if it is a plug-in's: {why}" for why in PLUGIN_IMPORT_FAILURES.values())
                raise ConfigError(f"unknown option namespace {space!r} in {key!r}; known: {', '.join(spaces)}{failed}")
            options.setdefault(space, {})[rest] = value
            continue
        if name not in FIELDS:
            prefix = next((p for p in spaces if name.startswith(p + "_")), None)
            if prefix is not None:  # jaxfl 0.1's flat name, e.g. port_staleness_bound
                options.setdefault(prefix, {})[name[len(prefix) + 1:]] = value
                continue
        _once(fields, spelling, name, value, key)
    return fields, options


def _once(fields: dict, spelling: dict, name: str, value: Any, spelled: str) -> None:
    """Set ``fields[name]``, refusing a field the mapping gave already (flat and in its section, or in
    two spellings): the last one given won by the mapping's order, where a file refuses it."""
    if name in fields:
        raise ConfigError(f"{name} is given twice: {spelling[name]} = {fields[name]!r} and {spelled} = {value!r}; "
                          "give it once")
    fields[name], spelling[name] = value, spelled


def unknown_name(name: str, value: Any, where: str = "") -> ConfigError:
    """The error for a name of a config mapping that is neither a field nor, for a table, a section
    or an algorithm's options table, with the nearest names (a misspelt ``[clinet]`` table listed
    the ~90 fields, not the sections).

    >>> print(unknown_name("clinet", {"local_steps": 5}))
    unknown config section [clinet] (did you mean [client]?); sections: data, speeds, faults, client, server, budget, engine, an algorithm's options ([port], [compass], ...) or [algorithm]
    >>> print(unknown_name("local_step", 5))  # doctest: +ELLIPSIS
    unknown config field 'local_step' (did you mean local_steps, local_epochs?); allowed: dataset, data_dir, ...
    """
    import difflib

    prefix = f"{where}: " if where else ""
    if isinstance(value, dict):
        spaces = [space for space in option_namespaces()]
        close = difflib.get_close_matches(name, [*SECTIONS, *spaces, "algorithm"], n=2, cutoff=0.6)
        hint = f" (did you mean {', '.join(f'[{c}]' for c in close)}?)" if close else ""
        failed = "; ".join(PLUGIN_IMPORT_FAILURES.values())
        if failed:  # the cause, first: the section is a plug-in's whose file was not found or failed to import
            return ConfigError(f"{prefix}{failed}; the unknown section [{name}]{hint} may be its options' (sections: "
                               f"{', '.join(SECTIONS)}, an algorithm's options or [algorithm])")
        return ConfigError(f"{prefix}unknown config section [{name}]{hint}; sections: {', '.join(SECTIONS)}, an "
                           f"algorithm's options ([port], [compass], ...) or [algorithm]")
    if name in ("time_per_step", "time-per-step"):  # a file of speeds: no config value, a flag or an argument
        return ConfigError(f"{prefix}time_per_step is not a config field: give the speeds file with --time-per-step "
                           "FILE (jaxfl run, jaxfl sweep) or the array as time_per_step=... (run_experiment, run_sweep)")
    close = difflib.get_close_matches(name, list(FIELDS), n=3, cutoff=0.7) or \
        [f for f in FIELDS if f.startswith(name[:4])]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return ConfigError(f"{prefix}unknown config field {name!r}{hint}; allowed: {', '.join(FIELDS)}")


def as_recorded(values: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded config (a run's ``config.json`` ``config``, nested by section, or a checkpoint's
    flat record) with each field its algorithm's default of which changed since
    (:attr:`jaxfl.algorithms.base.Algorithm.changed_defaults`) and that it holds unset (None) read as
    the default it ran under: FedAsync's runs recorded before its rule became the paper's mixing
    (2026-12-02) ran the rule fedcompass.

    >>> as_recorded({"algorithm": "fedasync", "server": {"rule": None}})["server"]["rule"]
    'fedcompass'
    >>> as_recorded({"algorithm": "fedasync", "rule": "paper"})["rule"]
    'paper'
    """
    values = dict(values)
    try:
        changed = algorithms.get(values.get("algorithm")).changed_defaults
    except Exception:  # not one jaxfl can import: the caller's own validation names it
        return values
    for name, (before, _) in changed.items():
        section = SECTION_OF.get(name)
        if isinstance(values.get(section), Mapping):
            values[section] = holder = dict(values[section])
        else:
            holder = values
        if name in holder and holder[name] is None:
            holder[name] = before
    return values


# Settings that a run could hold unread, and so changed nothing, until they were refused (2026-12-05):
# field → (the field that makes it unread, the value that does). A run recorded with one goes on, and
# runs again from its config.json, without it (:func:`without_settings_refused_since`).
REFUSED_SINCE = {"clients_per_call": ("batching", False), "steps_per_call": ("step_loop", "rolled"),
                 "checkpoint_min_interval_s": ("checkpoint_every", None)}


def without_settings_refused_since(values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A recorded config (flat, or nested by section) without the :data:`REFUSED_SINCE` settings that
    its own values leave unread, and their names.

    >>> without_settings_refused_since({"engine": {"batching": False, "clients_per_call": 2}})
    ({'engine': {'batching': False, 'clients_per_call': None}}, ['clients_per_call'])
    >>> without_settings_refused_since({"batching": True, "clients_per_call": 2})[1]
    []
    """
    values = {key: dict(value) if key in SECTIONS and isinstance(value, Mapping) else value
              for key, value in values.items()}

    def holder(name: str) -> dict:
        section = values.get(SECTION_OF.get(name))
        return section if isinstance(section, dict) and name in section else values

    dropped = []
    for name, (decider, unread_at) in REFUSED_SINCE.items():
        own, decides = holder(name), holder(decider)
        if own.get(name) is not None and decider in decides and decides[decider] == unread_at:
            own[name] = None
            dropped.append(name)
    return values, dropped


def config_from_mapping(values: dict[str, Any], base: RunConfig | None = None) -> RunConfig:
    """A validated RunConfig from a mapping of field names (e.g. a parsed JSON/TOML file).

    Algorithm options may be given in any form :func:`split_algorithm_options` reads; those of another
    algorithm than the chosen one are an error unless they equal that algorithm's defaults (a full
    dump of an old config).

    >>> config_from_mapping({"algorithm": "fedasync", "local-steps": 20}).local_steps
    20
    >>> config_from_mapping({"algorithm": "port", "port.staleness-bound": 5}).algorithm_options.staleness_bound
    5.0
    """
    base = base or RunConfig()
    fields, options = split_algorithm_options(values)
    normalised = {}
    for name, value in fields.items():
        if name not in FIELDS:
            raise unknown_name(name, value)
        if name != "algorithm_options":
            value = _coerce(value, FIELDS[name].type)
        normalised[name] = value
    config = dataclasses.replace(base, **normalised)
    try:
        algorithm = algorithms.get(config.algorithm)
    except KeyError:
        return validate(config)  # names the bad algorithm
    own = algorithm.option_namespace()
    chosen = config.algorithm_options
    if own in options:
        if isinstance(chosen, algorithm.Options):
            chosen = dataclasses.asdict(chosen)
        if chosen is None or isinstance(chosen, dict):
            chosen = {**(chosen or {}), **options.pop(own)}
    for space, given in options.items():
        owners = option_namespaces()[space]
        other = algorithms.get(owners[0]).Options
        defaults = {field.name: (field.default, field.type) for field in dataclasses.fields(other)}
        for key, value in given.items():
            name = other.field_name(key)
            if name not in defaults or _coerce(value, defaults[name][1]) != defaults[name][0]:
                raise ConfigError(f"option {space}.{key}={value!r} belongs to {', '.join(owners)}, not to "
                                  f"algorithm {config.algorithm!r}")
    return validate(dataclasses.replace(config, algorithm_options=chosen))


def to_toml(config: RunConfig) -> str:
    """The config as TOML text that :func:`load_config_file` reads back (null values as ``"none"``).

    >>> text = to_toml(validate(RunConfig(algorithm="fedat", clients=4)))
    >>> text.splitlines()[0], "[data]" in text, "clients = 4" in text
    ('algorithm = "fedat"', True, True)
    """
    def value(item: Any) -> str:
        if item is None:
            return '"none"'
        if isinstance(item, bool):
            return "true" if item else "false"
        if isinstance(item, float):
            return ("inf" if item > 0 else "-inf") if math.isinf(item) else repr(item)
        if isinstance(item, int):
            return str(item)
        if isinstance(item, (list, tuple)):
            return "[" + ", ".join(value(element) for element in item) + "]"
        return json.dumps(str(item), ensure_ascii=False)

    values = config.to_dict()
    tables = {name: values.pop(name) for name in (*SECTIONS, "algorithm_options")}
    lines = [f"{key} = {value(item)}" for key, item in values.items()]
    for name, table in tables.items():
        if isinstance(table, dict) and table:
            lines += ["", f"[{name}]"] + [f"{key} = {value(item)}" for key, item in table.items()]
    return "\n".join(lines) + "\n"


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a key given twice (json.loads keeps the last, silently).

    >>> _no_duplicate_keys([("clients", 4), ("clients", 5)])
    Traceback (most recent call last):
    jaxfl.config.ConfigError: key 'clients' is given twice (4, then 5): give each setting once
    """
    values: dict[str, Any] = {}
    for key, value in pairs:
        if key in values:
            raise ConfigError(f"key {key!r} is given twice ({values[key]!r}, then {value!r}): give each "
                              "setting once")
        values[key] = value
    return values


def load_config_text(text: str | bytes, suffix: str) -> dict[str, Any]:
    """Parse JSON (``suffix`` ``.json``) or TOML (``.toml``) text into a mapping of field names; a
    run directory's ``config.json`` gives the config it records (``jaxfl run --config RUN/config.json``
    runs it again).

    >>> load_config_text('{"config": {"clients": 5}, "versions": {"jaxfl": "0.1"}}', ".json")
    {'clients': 5}
    >>> load_config_text('{"config": {"port.min_clients": 2}, "config_sha256": "ab12"}', ".json")  # a checkpoint's
    {'port.min_clients': 2}
    """
    raw = text.encode() if isinstance(text, str) else text
    try:
        if suffix == ".toml":
            import tomllib

            values = tomllib.loads(raw.decode("utf-8-sig"))  # a BOM (Windows editors) as JSON takes it
        elif suffix == ".json":
            values = json.loads(raw, object_pairs_hook=_no_duplicate_keys)
        else:
            raise ConfigError(f"config files must end in .json or .toml, not {suffix!r}")
    except (ValueError, UnicodeDecodeError) as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"config could not be parsed as {suffix[1:].upper()}: {error}") from error
    if not isinstance(values, dict):
        raise ConfigError("a config file must hold a mapping of field names to values")
    # a run's config.json, or a checkpoint's (its flat record and hash): rerun its config
    if isinstance(values.get("config"), dict) and ("versions" in values or "config_sha256" in values):
        _say_other_jax_settings(values.get("jax"))
        return recorded_values(values["config"])
    PLUGIN_IMPORT_FAILURES.clear()  # this file's, not an earlier one's
    import_named_plugins(values)
    return values


def _say_other_jax_settings(recorded: dict | None) -> None:
    """Warn where a run's config.json, taken as a config file, was made under other jax settings than this
    process holds (:data:`jaxfl.experiment.JAX_NUMERICS`): the config alone runs again, under another name
    and with other numbers."""
    from jaxfl.experiment import jax_numerics, said_jax_settings

    current = jax_numerics()
    if recorded is None or recorded == current:  # None: recorded before jaxfl wrote them
        return
    warn_user(f"this config.json's run was made with {said_jax_settings(recorded)} and this process has "
              f"{said_jax_settings(current)}: "
              "the run made here computes other numbers, under another name (set the same jax settings in "
              "the environment, e.g. JAX_ENABLE_X64, to run it again as it was)")


def recorded_values(record: dict[str, Any]) -> dict[str, Any]:
    """The values of a run's recorded config (``config.json``'s ``config``, or a checkpoint's flat
    record) as a new run takes them: the defaults it ran under (:func:`as_recorded`), and the plug-in
    algorithms it names imported (:data:`PLUGIN_IMPORT_FAILURES` then holds this record's failures).

    >>> recorded_values({"algorithm": "fedasync", "server": {"rule": None}})["server"]["rule"]
    'fedcompass'
    """
    values = as_recorded(record)
    PLUGIN_IMPORT_FAILURES.clear()
    import_named_plugins(values)
    return values


# Plug-in algorithms a config or sweep file named that could not be imported: name → why (an options
# table of theirs is then unknown, and its error says why).
PLUGIN_IMPORT_FAILURES: dict[str, str] = {}


def import_named_plugins(values: dict[str, Any]) -> None:
    """Register the ``module:Class`` / ``file.py:Class`` algorithms a config or sweep file names (its
    ``algorithm``, an ``[algorithm]`` table's ``name``, ``[grid]``'s and ``[sizes.NAME]``'s lists)
    before its option tables are read: their namespaces (``[fsw]``, ``"fsw.power"``) exist only once
    imported. A failure is kept in :data:`PLUGIN_IMPORT_FAILURES` (validation names it where the
    algorithm is used).

    >>> import_named_plugins({"grid": {"algorithm": ["fedavg", "no_such_module:Alg"]}})
    >>> PLUGIN_IMPORT_FAILURES.pop("no_such_module:Alg")  # doctest: +ELLIPSIS
    "algorithm reference 'no_such_module:Alg' could not be imported: ..."
    """
    def names(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            for item in value:
                yield from names(item)
        elif isinstance(value, dict) and isinstance(value.get("name"), str):
            yield value["name"]

    for key, value in values.items():
        if key == "algorithm":
            for name in names(value):
                if ":" in name:
                    try:
                        algorithms.get(name.strip())
                        PLUGIN_IMPORT_FAILURES.pop(name.strip(), None)
                    except KeyError as error:
                        PLUGIN_IMPORT_FAILURES[name.strip()] = error.args[0] if error.args else str(error)
        elif isinstance(value, dict):
            import_named_plugins(value)


def load_config_file(path: str) -> dict[str, Any]:
    """Read a JSON (``.json``) or TOML (``.toml``) config file into a mapping of field names."""
    path = user_path(path)
    if os.path.isdir(path):
        raise ConfigError(f"config file {path!r} is a directory: give a .json or .toml file")
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    suffix = os.path.splitext(path)[1]
    if suffix not in (".json", ".toml"):
        raise ConfigError(f"config file {path!r} must end in .json or .toml")
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        return load_config_text(raw, suffix)
    except ConfigError as error:
        raise ConfigError(f"config file {path!r}: {error}") from error
