"""Run one experiment from a :class:`~jaxfl.config.RunConfig` and write its run directory.

A run directory holds:
- ``config.json``: the resolved config, the engine's execution plan and library versions;
- ``client_samples.npy``: every client's training-sample count (``config.json`` holds its digest;
  ``jaxfl.runlog.read_client_samples`` reads it);
- the event log, one row per event (virtual time, event, client, dispatch, model version,
  staleness, steps, detail, and on aggregation rows the wall time since the start): ``events.csv``,
  or Parquet parts under ``events/`` once it passes 200,000 rows (:mod:`jaxfl.runlog`;
  ``jaxfl.load_run`` reads either);
- ``metrics.csv``: held-out accuracy, balanced accuracy and loss of the global model over virtual
  time (also handed to the run's :mod:`jaxfl.loggers`);
- ``class_accuracy.csv``: each class's held-out accuracy (recall), one row per evaluation;
- ``summary.json``: final/best accuracy, time to target, updates, client steps executed and
  padded, dispatch accounting, wall time and where it went, stop reason.
- ``client_time_per_step.npy``: the clients' seconds per step, when the run was given them
  (``run_experiment(config, time_per_step=...)``).

>>> from jaxfl.config import RunConfig
>>> result = run_experiment(RunConfig(algorithm="fedavg", model="logreg", clients=4, local_steps=5,
...                                   max_updates=2, progress=False))
>>> result.summary["global_updates"]
2
"""
from __future__ import annotations

import contextlib
import contextvars
import csv
import dataclasses
import functools
import gc
import hashlib
import json
import math
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
import time
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfl._user_warnings import warn_user
from jaxfl import checkpoint, cluster, resume, stopping
from jaxfl._devices import place_read_only, without_device_count_flag
from jaxfl.loggers import check_loggers, logger_names, logger_offsets, open_loggers
from jaxfl.algorithms import build, device_hooks, get as get_algorithm
from jaxfl.algorithms.base import check_picklable
from jaxfl.compilation_cache import process_compilations
from jaxfl.config import (user_path, FIELDS_ADDED, MAX_GRID_POINTS, SECTION_OF, USER_PREFIX, ConfigError, DataConfig, RunConfig,
                          _count_budgets, check_output_folder, checkpoint_min_interval, config_from_mapping, fail,
                          validate)
from jaxfl.data import DATASET_PREFIXES, DATASETS, Dataset, as_dataset, build_federation, load_dataset
from jaxfl.data.datasets import known_classes, known_input, npz_num_classes
from jaxfl.data.synthetic import parse_synthetic_name
from jaxfl.data.augment import AUGMENTED, dataset_family, make_augment, make_preprocess
from jaxfl.engine import Engine, ExecutionPlan, NumericalError
from jaxfl.kernels.aggregation import make_server_optimizer
from jaxfl.kernels.client import FederatedArrays, make_client_trainer, scale_uint8
from jaxfl.kernels.cpu_ops import cpu_friendly
from jaxfl.models import (MODELS, build_model, check_model_input, check_model_object, count_params,
                          is_model_reference, load_model_reference, make_model)
from jaxfl.models.adapter import ModelModeError, as_adapter
from jaxfl.models.init import pytorch_default_init
from jaxfl.runlog import (CLASS_ACCURACY_NAME, METRIC_FIELDS, METRICS_NAME, EventLog, csv_header, existing_fields, finished_summary, last_tenth_mean, log_sizes,
                          write_client_samples, written_atomically)
from jaxfl.scheduler.faults import ClientFaults, FaultConfig
from jaxfl.scheduler.simulation import EVENT_LOG_FIELDS, NO_EVENTS_LEFT, Simulation, TimingBackend
from jaxfl.scheduler.speeds import ClientSpeeds, NegativeTimeError, SpeedConfig, round_unit_scale
from jaxfl.user_inputs import UserInputs, match_init_params

MODEL_STREAM = 12  # fold_in(key(seed), MODEL_STREAM) initialises the global model
PYTORCH_INIT_STREAM = 1  # fold_in(that key, 1) redraws it PyTorch's way (weight_init="pytorch")
EVAL_BATCH = 1000
EVAL_BATCHES_PER_CALL = 256  # full held-out batches evaluated per device call
# On a CPU, a held-out batch whose im2col patches (the largest array of a forward pass with narrow
# convolutions, see cpu_ops.largest_patches_bytes) stay within EVAL_PATCH_BYTES runs in the cache.
# Measured (2026-11-29, AMD EPYC VM, 10,000 images; benchmarks/narrow_convolutions.py --evaluation):
# LeNet-5 (78 kB of patches an image) 0.45 s at batch 1000, 0.25 s at 50-100 and 0.30 s at 160 on
# both cores; CC-FedAvg's CNN (235 kB) 0.82 s at 1000, 0.40-0.46 s at 50 and 0.48 s at 80. Below
# EVAL_MIN_BATCH it was slower again (0.39-0.52 s at 16 and 26).
EVAL_PATCH_BYTES = 8 * 2**20
EVAL_MIN_BATCH = 50

# The engines of runs that did not finish (an exception left them wired to their callbacks). A
# finished run cuts its callbacks (:func:`_disconnect`), so its engine holds no reference cycle and
# is freed, compiled programs and device buffers with it, as soon as its result is dropped. A run
# that raised did not: its engine, simulation and recorder stay in cycles, which Python's full
# collection alone frees, and runs too seldom for what the engine holds (before the cut, a loop of
# runs kept every earlier run's programs, 60 MB and 570 memory maps a run of the PORT quick sweep,
# until XLA could map no more code: the kernel allows 65,530 maps).
_UNFINISHED_ENGINES: weakref.WeakSet = weakref.WeakSet()


def _release_earlier_runs() -> None:
    """Free what runs of this process that raised left for the cycle collector (see
    ``_UNFINISHED_ENGINES``), before a run builds its own engine: one full collection (a tenth of a
    second or so), only when such an engine is still there."""
    if len(_UNFINISHED_ENGINES):
        gc.collect()


def _keeps_checkpoints(config: RunConfig) -> bool:
    """Whether a run writes checkpoints at all: every ``checkpoint_every`` updates, or a final one."""
    return config.checkpoint_every is not None or config.final_checkpoint


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a time limit's SIGINT) during a run, or a stop it was asked for
    (:func:`jaxfl.stopping.request_stop`, SIGTERM under ``jaxfl run``): a ``KeyboardInterrupt`` that
    says which run folder it left and whether a resume goes on from it.

    ``run_dir``: the run's folder (its logs are closed, so they hold every row written until the
    interrupt); ``checkpoint``: the newest complete checkpoint folder, which
    ``resume_experiment(run_dir)`` (``jaxfl run --resume RUN_DIR``) goes on from, cutting the logs
    back to it; None when the run wrote none (a timing-only run writes none). ``reason``: who asked
    for a requested stop (``"SIGTERM"``; the run stopped between two events and its checkpoint is
    of that point), None for Ctrl-C. ``given_again``: what the run took as Python objects
    (``"data"``, ``"model"``...), which its resume must be given again (the message says so instead
    of a command line).

    >>> print(RunInterrupted("runs/fedbuff-1", "runs/fedbuff-1/checkpoints/ckpt-000040"))
    runs/fedbuff-1 keeps its logs and checkpoints up to update 40: jaxfl run --resume runs/fedbuff-1 \
(resume_experiment) goes on from there

    A cluster's process other than 0 (``follower``) saw the newest checkpoint finished when it was
    interrupted; process 0, which writes them, may have finished a later one before it stopped:

    >>> print(RunInterrupted("runs/fedbuff-1", "runs/fedbuff-1/checkpoints/ckpt-000040", follower=True))
    runs/fedbuff-1 keeps its logs and checkpoints up to update 40 or a later one that process 0 names: \
jaxfl run --resume runs/fedbuff-1 (resume_experiment) goes on from there
    """

    def __init__(self, run_dir: str, checkpoint: str | None, timing_only: bool = False, reason: str | None = None,
                 given_again: tuple[str, ...] = (), keeps_checkpoints: bool = True, follower: bool = False,
                 registered: str | None = None):
        super().__init__(run_dir, checkpoint, timing_only, reason)
        self.run_dir, self.checkpoint, self.timing_only, self.reason = run_dir, checkpoint, timing_only, reason
        self.given_again = given_again  # what the run took as Python objects: a resume needs them again
        # an algorithm registered by the script or notebook that ran it, by name alone: no command imports it
        self.registered = registered
        self.keeps_checkpoints = keeps_checkpoints  # False: checkpoint_every None and final_checkpoint off
        # a cluster process other than 0, which writes the checkpoints: the newest it saw may be
        # followed by the one process 0 was still finishing when both were interrupted
        self.follower = follower

    def __str__(self) -> str:
        if self.timing_only:
            if not _schedule_logged(self.run_dir):  # stopped before its event log had a row on the disk
                return (f"{self.run_dir} holds no schedule yet (it stopped before its first events were written); "
                        f"a timing-only run keeps no checkpoints: run it again")
            return (f"{self.run_dir} holds the schedule logged until it stopped; a timing-only run keeps no "
                    f"checkpoints: run it again to have all of it")
        if self.checkpoint is None and not self.keeps_checkpoints:
            return (f"{self.run_dir} holds the logs until it stopped; this run keeps no checkpoints "
                    f"(checkpoint_every=None, final_checkpoint=False): nothing to resume from; start the run again")
        if self.checkpoint is None and self.follower:  # process 0 may have finished one as it stopped
            return (f"{self.run_dir} holds the logs until it stopped and no checkpoint this process saw finished; "
                    f"process 0 names the one it may have finished as it stopped (jaxfl run --resume "
                    f"{shlex.quote(self.run_dir)} goes on from it), else start the run again")
        if self.checkpoint is None:
            return (f"{self.run_dir} holds the logs until it stopped but no checkpoint yet (checkpoint_every, "
                    f"checkpoint_min_interval_s): nothing to resume from; start the run again")
        update = f"{self.update} or a later one that process 0 names" if self.follower else self.update
        if self.given_again or self.registered:  # objects, or an algorithm, no command line can pass: only Python
            given = "".join(f", {name}=..." for name in self.given_again)
            needs = ([f"with the algorithm {self.registered!r} registered again (jaxfl run --resume cannot import "
                      f"an algorithm registered by name in a script or notebook)"] if self.registered else []) + \
                (["given the same objects again"] if self.given_again else [])
            return (f"{self.run_dir} keeps its logs and checkpoints up to update {update}: "
                    f"resume_experiment({self.run_dir!r}{given}) goes on from there, {' and '.join(needs)}")
        return (f"{self.run_dir} keeps its logs and checkpoints up to update {update}: jaxfl run --resume "
                f"{shlex.quote(self.run_dir)} (resume_experiment) goes on from there")

    @property
    def update(self) -> int | None:
        """The global update of :attr:`checkpoint` (None without one)."""
        return None if self.checkpoint is None else int(os.path.basename(self.checkpoint).rpartition("-")[2])


def _schedule_logged(run_dir: str) -> bool:
    """Whether ``run_dir``'s event log holds a row on the disk: a CSV line past its header, or a
    Parquet part (:mod:`jaxfl.runlog`)."""
    from jaxfl.runlog import CSV_NAME, PARQUET_DIR

    try:
        with open(os.path.join(run_dir, CSV_NAME), "rb") as handle:
            if len(handle.readlines(2 * 1024)) > 1:
                return True
    except OSError:
        pass
    folder = os.path.join(run_dir, PARQUET_DIR)
    return os.path.isdir(folder) and any(name.endswith(".parquet") for name in os.listdir(folder))


@dataclasses.dataclass
class RunResult:
    """What a run returns in Python: its directory, summary, metrics rows and final parameters, and
    its finished simulation (schedule, records, accounting) and engine, disconnected from the run's
    logs and evaluation; dropping the result frees the engine's programs and device buffers."""

    run_dir: str
    summary: dict
    metrics: list[dict]
    params: Any
    simulation: Simulation
    engine: Engine


def make_client_optimizer(name: str, learning_rate: float, momentum: float = 0.0,
                          weight_decay: float = 0.0) -> optax.GradientTransformation:
    """The client optimiser, re-initialised at every dispatch (FedCompass MNIST: Adam, 3e-3).

    PyTorch's semantics, as the seed papers' code uses them: ``sgd`` adds ``weight_decay``·w to the
    gradient before the momentum buffer (``torch.optim.SGD``; PORT's CIFAR-10: lr 0.1, momentum 0.9,
    wd 1e-4), ``adam`` adds it to the gradient too (L2, ``torch.optim.Adam(weight_decay=)``), and
    ``adamw`` decays the weights by lr·``weight_decay``·w apart from the gradient (decoupled,
    ``torch.optim.AdamW``). ``momentum`` is SGD's (config validation refuses it for the others).

    >>> import jax.numpy as jnp
    >>> sgd = make_client_optimizer("sgd", 0.1, momentum=0.9, weight_decay=0.5)
    >>> w, g = jnp.array([2.0]), jnp.array([1.0])
    >>> state = sgd.init(w)
    >>> first, state = sgd.update(g, state, w)    # −0.1 · (1 + 0.5·2)
    >>> second, _ = sgd.update(g, state, w)       # −0.1 · (0.9 · 2 + 2)
    >>> [round(float(u[0]), 6) for u in (first, second)]
    [-0.2, -0.38]
    """
    if name == "sgd":
        step = optax.sgd(learning_rate, momentum=momentum or None)
    elif name == "adam":
        step = optax.adam(learning_rate)
    else:
        return optax.adamw(learning_rate, weight_decay=weight_decay)
    return optax.chain(optax.add_decayed_weights(weight_decay), step) if weight_decay else step


def _refuse_adam_on_float16(config: RunConfig, user: UserInputs, params) -> None:
    """The built-in Adam on float16 parameters: its ε = 1e-8 is 0 in float16, so a weight whose gradient is 0
    (a dead unit) steps by 0/0 = NaN at once, and the run stopped at update 0 advising a lower client_lr."""
    if user.client_optimizer is not None or config.client_optimizer not in ("adam", "adamw"):
        return
    narrow = [jax.tree_util.keystr(path) for path, leaf in jax.tree_util.tree_leaves_with_path(params["params"])
              if getattr(leaf, "dtype", None) == jnp.float16]
    if narrow:
        raise ConfigError(f"client_optimizer={config.client_optimizer!r} is not allowed with the model's float16 "
                          f"parameters (params{narrow[0]} and {len(narrow) - 1} more): Adam's eps=1e-8 is 0 in "
                          "float16, so a zero gradient steps by 0/0 = NaN; keep the parameters in float32 or "
                          "bfloat16 (a flax module's param_dtype; float16 compute, dtype=, is fine), use sgd, "
                          "or pass client_optimizer=optax.adam(lr, eps=1e-4)")


def evaluation_batch_size(predict, params, input_shape: tuple[int, ...], cpu_layers: bool, kind: str = "image") -> int:
    """The held-out batch for ``predict(params, x)`` on inputs of ``input_shape`` (of a dataset of
    ``kind``: int32 token ids for ``"tokens"``, else float32): ``EVAL_BATCH``,
    or, where the evaluation runs ``cpu_friendly(predict, inference=True)`` (``cpu_layers``) and that
    builds im2col patches, as many examples as keep them within ``EVAL_PATCH_BYTES`` (at least
    ``EVAL_MIN_BATCH``): LeNet-5's evaluation is 1.8x faster at 106 images a batch than at 1,000.

    >>> from jaxfl.models import make_model
    >>> from jaxfl.models.adapter import as_adapter
    >>> model = as_adapter(make_model("lenet5", 10))
    >>> variables = model.init_variables(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    >>> evaluation_batch_size(model.predict, variables, (28, 28, 1), cpu_layers=True)
    106
    >>> evaluation_batch_size(model.predict, variables, (28, 28, 1), cpu_layers=False)  # XLA's convolutions
    1000
    """
    from jaxfl.kernels.cpu_ops import largest_patches_bytes

    if not cpu_layers:
        return EVAL_BATCH
    patches = largest_patches_bytes(predict, params, _model_sample(input_shape, kind), inference=True)
    return EVAL_BATCH if patches == 0 else int(np.clip(EVAL_PATCH_BYTES // patches, EVAL_MIN_BATCH, EVAL_BATCH))


def make_evaluator(apply_fn, x: np.ndarray, y: np.ndarray, batch_size: int = EVAL_BATCH, preprocess=scale_uint8,
                   loss=None, metrics=None, num_classes: int | None = None,
                   batches_per_call: int = EVAL_BATCHES_PER_CALL):
    """``evaluate(params) -> {"accuracy", "balanced_accuracy", "loss", "class_accuracy",
    "nonfinite_outputs", ...}`` on a held-out set, in fixed-size batches.

    ``apply_fn(params, x) -> logits`` in evaluation mode (e.g. ``ModelAdapter.predict``). ``loss``
    (per-example ``loss(logits, labels) -> (B,)``; default softmax cross-entropy) gives the ``loss``
    entry; ``metrics(logits, labels) -> {name: (B,) values}`` adds each name's held-out mean.
    ``class_accuracy`` is each class's recall (the share of its held-out samples predicted as it;
    NaN for a class with none), counted on the device per batch, one entry per class (``num_classes``,
    default the logits' width); ``balanced_accuracy`` is their mean over the classes present
    (as ``sklearn.metrics.balanced_accuracy_score``); ``nonfinite_outputs`` the share of held-out
    samples whose logits hold NaN or +Inf, or are all -Inf (a diverged model's are so for nearly all;
    -Inf for some classes is a mask a healthy model may apply).

    >>> import flax.linen as nn
    >>> model = nn.Dense(2)
    >>> x, y = np.ones((3, 4), np.float32), np.array([0, 1, 1])
    >>> evaluate = make_evaluator(model.apply, x, y, preprocess=lambda v: v,
    ...                           metrics=lambda logits, labels: {"label_one": (labels == 1).astype(float)})
    >>> stats = evaluate(model.init(jax.random.key(0), x))
    >>> round(stats["label_one"], 4), stats["balanced_accuracy"], len(stats["class_accuracy"]), evaluate.dispatches
    (0.6667, 0.5, 2, 1)

    The full batches are placed on the device once, as one array, and up to ``batches_per_call`` of
    them run in one dispatch, a ``lax.map`` that indexes each batch from that array (a million-client
    synthetic federation holds 3.6 million held-out samples: 3,600 batches, one dispatch each took
    2.1 s an evaluation). Each batch's sums are computed as alone and added up on the host in batch
    order, so the figures do not depend on ``batches_per_call`` (1: one dispatch per batch). Only the
    last batch is padded and masked (no copy of the whole set), one compilation for it.
    ``evaluate.dispatches`` is the number of device calls an evaluation makes.
    """
    if batches_per_call < 1:
        raise ValueError(f"batches_per_call must be at least 1, got {batches_per_call}")
    count = len(y)
    batch_size = min(batch_size, count)  # a small held-out set is not padded to a full batch of model work
    full = count // batch_size
    device = jax.local_devices()[0]
    x, y = np.asarray(x), np.asarray(y)

    def blocks(values: np.ndarray):  # (full, batch_size, ...) on the device: a reshaped view of the prefix
        return place_read_only(values[:full * batch_size].reshape((full, batch_size) + values.shape[1:]), [device])[0]

    x_full, y_full = blocks(x), blocks(y)
    whole = jax.device_put(np.ones(batch_size, bool), device)
    per_call = min(batches_per_call, full)  # ≥ 1: batch_size ≤ count makes full ≥ 1
    # every call maps over per_call batches (one compilation); the last call starts earlier so that it
    # ends at the last full batch, and the batches it repeats are dropped on the host
    starts = list(range(0, full - per_call + 1, per_call))
    if starts[-1] + per_call < full:
        starts.append(full - per_call)
    # the batches a call repeats from the call before it lead its rows
    first_new_rows = [max(0, previous + per_call - start) for previous, start in zip([-per_call] + starts, starts)]
    tail = None
    if count > full * batch_size:
        pad = (full + 1) * batch_size - count
        tail = (np.concatenate([x[full * batch_size:], np.zeros((pad,) + x.shape[1:], x.dtype)]),
                np.concatenate([y[full * batch_size:], np.zeros(pad, y.dtype)]),
                np.arange(batch_size) < batch_size - pad)
        tail = tuple(jax.device_put(values, device) for values in tail)

    per_example_loss = optax.softmax_cross_entropy_with_integer_labels if loss is None else loss

    def batch_stats(params, xb, yb, mb):
        logits = apply_fn(params, preprocess(xb))
        losses = per_example_loss(logits, yb)
        correct = (jnp.argmax(logits, axis=-1) == yb) & mb
        classes = logits.shape[-1] if num_classes is None else num_classes
        # the diagonal and row sums of the confusion matrix: all that per-class recall needs
        class_hits = jnp.zeros(classes, jnp.int32).at[yb].add(correct.astype(jnp.int32))
        class_counts = jnp.zeros(classes, jnp.int32).at[yb].add(mb.astype(jnp.int32))
        # summed in float32 at least: a bfloat16 model's per-example values summed in bfloat16 kept 3 digits
        extra = {} if metrics is None else {name: jnp.sum(jnp.where(mb, _at_least_float32(values), 0.0))
                                            for name, values in metrics(logits, yb).items()}
        # NaN or +Inf among a sample's logits, or all of them -Inf: -Inf alone is a model's mask of
        # impossible classes, which a healthy model may use
        broken = jnp.any(jnp.isnan(logits) | (logits == jnp.inf), axis=-1) | jnp.all(logits == -jnp.inf, axis=-1)
        nonfinite = jnp.sum(broken & mb)
        return (jnp.sum(correct), jnp.sum(jnp.where(mb, _at_least_float32(losses), 0.0)), class_hits, class_counts,
                extra, nonfinite)

    @jax.jit
    def mapped_stats(params, xs, ys, mb, first):  # batches first .. first + per_call - 1, stacked
        return jax.lax.map(lambda i: batch_stats(params, xs[i], ys[i], mb), first + jnp.arange(per_call))

    padded_stats = jax.jit(lambda params, xb, yb, mb: jax.tree.map(lambda v: v[None], batch_stats(params, xb, yb, mb)))

    def evaluate(params) -> dict:
        # committed to the held-out set's device: the initial params (uncommitted) and the engine's
        # (committed) would otherwise compile mapped_stats twice
        params = jax.device_put(params, device)
        parts = [mapped_stats(params, x_full, y_full, whole, start) for start in starts]
        if tail is not None:
            parts.append(padded_stats(params, *tail))
        parts = jax.device_get(parts)
        totals = [jax.tree.map(lambda v: v[row], part)
                  for part, first_new in zip(parts, first_new_rows + [0]) for row in range(first_new, len(part[0]))]
        # batch after batch, as the per-batch sums were always combined: the figures do not depend on the grouping
        correct = sum(int(t[0]) for t in totals)
        loss = sum(float(t[1]) for t in totals)
        recall = class_recall(sum(t[2] for t in totals), sum(t[3] for t in totals))
        extra = {name: sum(float(t[4][name]) for t in totals) / count for name in totals[0][4]}
        nonfinite = sum(int(t[5]) for t in totals)
        return {"accuracy": correct / count, "balanced_accuracy": balanced_accuracy(recall), "loss": loss / count,
                "class_accuracy": recall, "nonfinite_outputs": nonfinite / count, **extra}

    evaluate.dispatches = len(starts) + (tail is not None)
    return evaluate


def _at_least_float32(values: jax.Array) -> jax.Array:
    """``values`` as float32 where they are a narrower float (bfloat16, float16); else as they are."""
    floating = jnp.issubdtype(values.dtype, jnp.floating)
    return values.astype(jnp.float32) if floating and jnp.finfo(values.dtype).bits < 32 else values


def class_recall(hits: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per-class accuracy (recall): ``hits[k] / counts[k]`` correct predictions over samples of
    class k, NaN where a class has no samples.

    >>> class_recall(np.array([1, 0, 3]), np.array([2, 0, 4]))
    array([0.5 ,  nan, 0.75])
    """
    hits, counts = np.asarray(hits, np.float64), np.asarray(counts, np.float64)
    return np.divide(hits, counts, out=np.full(counts.shape, np.nan), where=counts > 0)


def balanced_accuracy(recall: np.ndarray) -> float:
    """Balanced accuracy: the mean per-class recall over the classes that have samples (NaN
    entries left out), as ``sklearn.metrics.balanced_accuracy_score`` (Brodersen et al., "The
    balanced accuracy and its posterior distribution", ICPR 2010).

    >>> balanced_accuracy(np.array([0.5, np.nan, 0.75]))
    0.625
    """
    present = np.asarray(recall)[~np.isnan(recall)]
    return float(np.mean(present)) if present.size else float("nan")


# why a comparison with reuse=True trains a finished run's config again (set by jaxfl.comparison around
# the run), which the note on the finished run says in place of advising reuse
TRAINED_AGAIN_BECAUSE: contextvars.ContextVar = contextvars.ContextVar("jaxfl_trained_again_because", default=None)


def _run_dir(config: RunConfig, algorithm: str, user_inputs: dict | None = None) -> str:
    """A new folder under ``output_dir`` named by :func:`run_name` (``-2``, ``-3``... when the same
    config runs again); ``algorithm`` is the registered name (not a module:Class reference).
    ``user_inputs`` (what ``config.json`` will record of them) tells a finished run of this very
    experiment from one of the same name on other speeds or initial weights, which no name tells."""
    name = config.run_name or run_name(config, algorithm)
    path = os.path.join(config.output_dir, name)
    suffix, finished = 2, None
    while os.path.exists(path):
        if finished is None and os.path.isfile(os.path.join(path, "summary.json")) and \
                _records_inputs(path, user_inputs) and not _edited_since(path, config):
            finished = path
        path = os.path.join(config.output_dir, f"{name}-{suffix}")
        suffix += 1
    from jaxfl import cluster

    if finished is None and config.run_name is None:  # named before a default was written (FedBuff's rule)
        ran_as = get_algorithm(config.algorithm).changed_defaults  # field -> (what unset ran as, ...)
        for field, earlier in names_before_default_changes(config, algorithm).items():
            if getattr(config, field) != ran_as[field][0]:  # (FedAsync's unset rule ran fedcompass: another run)
                continue
            earlier = os.path.join(config.output_dir, earlier)
            if os.path.isfile(os.path.join(earlier, "summary.json")) and _records_inputs(earlier, user_inputs) \
                    and not _edited_since(earlier, config):
                finished = earlier
                break
    if finished is not None and config.run_name is None and cluster.process_index() == 0:
        # a notebook cell run twice trained minutes again without a word
        because = TRAINED_AGAIN_BECAUSE.get()
        advice = because if because else _reuse_advice(finished, config, user_inputs)
        warn_user(f"{finished} holds a finished run of this config (its name's hash); this run trains it "
                  f"again, into {path} ({advice})")
    elif config.run_name is not None and path != os.path.join(config.output_dir, name) and cluster.process_index() == 0:
        # the name given is taken: the run went to name-2 without a word, and --resume OUT/name named the other
        taken = os.path.join(config.output_dir, name)
        warn_user(f"run_name {name!r}: {taken} exists already, so this run goes into {path} (give another "
                  "run_name to name it; the folder there stays as it is)")
    return path


def _reuse_advice(finished: str, config: RunConfig, user_inputs: dict | None) -> str:
    """How to have the ``finished`` run of ``config`` back rather than train it again: the comparison
    that reuses it given what this run was given (a run given objects beside its config is never
    reused: :func:`jaxfl.comparison.compare`)."""
    from jaxfl.comparison import _CONFIG_ONLY_INPUTS

    read = f"jaxfl.load_run({finished!r}) reads the finished one"
    inputs = user_inputs or {}
    if set(inputs) - _CONFIG_ONLY_INPUTS:
        return f"{read}; a comparison does not reuse a run given objects beside its config"
    data = not _loadable(config.dataset) and config.data_fingerprint is not None  # arrays given in Python
    keywords = "".join(f", {name}=..." for name, given in (("data", data), ("time_per_step", "time_per_step" in inputs))
                       if given)
    command = "" if data else ", and a comparison on the command line, jaxfl run --algorithm a,b" + (
        " --time-per-step FILE" if "time_per_step" in inputs else "") + ","
    return f"{read}; jaxfl.comparison.compare(configs, reuse=True{keywords}){command} reuse{'s' if data else ''} it"


def _edited_since(run_dir: str, config: RunConfig) -> bool:
    """Whether the run in ``run_dir`` was made with another version of this config's plug-in or model
    file (:func:`changed_sources`), or taken further since (``extensions``: it now holds a run of a
    larger budget): another run, not a finished run of this config."""
    try:
        with open(os.path.join(run_dir, "config.json")) as file:
            record = json.load(file)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and (bool(record.get("extensions")) or bool(changed_sources(record, config)))


# user_inputs keys added since (2026-12-05), which a run made before them does not hold
_INPUTS_ADDED = ("loss_probe", "model_settings")


def _records_inputs(run_dir: str, user_inputs: dict | None) -> bool:
    """Whether the run in ``run_dir`` recorded these ``user_inputs`` (JSON-equal, but for a key an
    older jaxfl did not record; an unreadable ``config.json`` is not taken for them)."""
    if user_inputs is None:
        return True
    try:
        with open(os.path.join(run_dir, "config.json")) as file:
            recorded = json.load(file).get("user_inputs", {})
    except (OSError, ValueError, AttributeError):
        return False
    wanted = json.loads(json.dumps(user_inputs))
    for key in _INPUTS_ADDED:
        if isinstance(recorded, dict) and key not in recorded:
            wanted.pop(key, None)
    return recorded == wanted


# Left out of a run's name: where and how the run is written, and where per-client tables live
# (client_state moves rows between the device, host RAM and a memmap and never changes a value:
# tests/test_client_state.py). Every other field changes what a run computes or writes: the engine's
# call shapes (batching, clients_per_call, steps_per_call, devices, memory_limit_mb,
# cpu_friendly_layers) the order of float32 sums, checkpoint_every and final_checkpoint the
# checkpoints a run leaves, timing_only everything. checkpoint_min_interval_s is left out: it
# spaces the checkpoints by wall time, which no two runs share.
NAME_LEFT_OUT = ("output_dir", "run_name", "progress", "client_state", "checkpoint_min_interval_s")


# The jax settings that change a run's numbers, at the values jaxfl's runs are made with by default. A
# process that differs (a notebook's jax_enable_x64: optax's Adam then corrects its bias in float64, and
# every update differs; jax_threefry_partitionable draws other initial weights from the same seed) makes
# another run of the same config and seed: the difference names the run (config_hash), is recorded in
# config.json ("jax") and must be set again to resume it.
JAX_NUMERICS = {"jax_enable_x64": False, "jax_threefry_partitionable": True, "jax_default_prng_impl": "threefry2x32",
                "jax_default_matmul_precision": None}


def jax_settings() -> dict:
    """This process's values of every setting of :data:`JAX_NUMERICS` (what a cluster's processes compare)."""
    return {name: getattr(jax.config, name) for name in JAX_NUMERICS}


def jax_numerics() -> dict:
    """This process's jax settings of :data:`JAX_NUMERICS` that differ from those values ({} at jax's
    defaults), which :func:`config_hash` names runs by.

    >>> jax_numerics()
    {}
    >>> with jax.enable_x64(True):
    ...     jax_numerics()
    {'jax_enable_x64': True}
    """
    return {name: value for name, value in jax_settings().items() if value != JAX_NUMERICS[name]}


def jax_setting_text(value) -> str | None:
    """A :data:`JAX_NUMERICS` value as its environment variable spells it (``JAX_ENABLE_X64=true``);
    None for a setting left unset.

    >>> jax_setting_text(True), jax_setting_text("threefry2x32"), jax_setting_text(None)
    ('true', 'threefry2x32', None)
    """
    if value is None:
        return None
    return str(value).lower() if isinstance(value, bool) else str(value)


def said_jax_settings(settings: dict) -> str:
    """Settings of :func:`jax_numerics` as a message says them.

    >>> said_jax_settings({"jax_enable_x64": True}), said_jax_settings({})
    ('jax_enable_x64=True', "jax's default settings")
    """
    return ", ".join(f"{name}={value!r}" for name, value in settings.items()) or "jax's default settings"


def xla_flags() -> str:
    """This process's ``XLA_FLAGS`` without the CPU device count (which the execution plan records), as
    ``config.json`` records them (``"xla_flags"``). Unlike :data:`JAX_NUMERICS` they do not name a run:
    most flags change speed or what XLA writes, not numbers, and none is known to jaxfl; a resume, or a
    comparison reusing a finished run, under other ones says so (:func:`say_other_xla_flags`).

    Example: under ``XLA_FLAGS="--xla_force_host_platform_device_count=2 --xla_cpu_enable_fast_math=true"``
    it is ``"--xla_cpu_enable_fast_math=true"``; with no ``XLA_FLAGS``, ``""``.
    """
    return without_device_count_flag(os.environ.get("XLA_FLAGS", ""))


def same_xla_flags(a: str, b: str) -> bool:
    """Whether two ``XLA_FLAGS`` set the same flags to the same values, in any order, each flag's last
    value counting (as XLA reads them; quoted values with spaces as XLA's parser takes them).

    >>> same_xla_flags("--b=1 --a=2", "--a=1 --a=2  --b=1"), same_xla_flags("--a=1", "--a=2")
    (True, False)
    """
    def flags(text):
        import shlex

        try:
            words = shlex.split(text)
        except ValueError:  # an unbalanced quote: as written
            words = text.split()
        return {word.split("=", 1)[0]: word for word in words}

    return flags(a) == flags(b)


def said_xla_flags(flags: str) -> str:
    """``XLA_FLAGS`` as a message says them.

    >>> said_xla_flags("--a=1"), said_xla_flags("")
    ("XLA_FLAGS='--a=1'", 'no XLA_FLAGS')
    """
    return f"XLA_FLAGS={flags!r}" if flags else "no XLA_FLAGS"


def say_other_xla_flags(run_dir: str, recorded: str | None, doing: str) -> None:
    """Warn where ``run_dir`` was made under other ``XLA_FLAGS`` than this process's (``recorded`` None:
    a run of a jaxfl that did not record them, not compared): a flag that changes XLA's arithmetic
    (``--xla_cpu_enable_fast_math=true`` moved a FedBuff MLP's parameters by 4e-5) makes other numbers
    under the same run name. ``doing`` says what this process does with the run ("resumes it")."""
    current = xla_flags()
    if recorded is None or same_xla_flags(recorded, current):
        return
    # a resume's, as a resume's other warnings (a --jobs sweep's worker relays those)
    category = resume.ResumeWarning if doing == "resumes it" else UserWarning
    warn_user(f"{run_dir} was made with {said_xla_flags(recorded)} and this process, which {doing}, has "
              f"{said_xla_flags(current)}: where a flag changes XLA's arithmetic (e.g. --xla_cpu_enable_fast_math) "
              "the numbers differ from the run's own; set XLA_FLAGS as it was to keep them", category)


def _refuse_other_jax_numerics(run_dir: str, recorded: dict | None) -> None:
    """A resume goes on only under the jax settings its run was made with (:data:`JAX_NUMERICS`): with
    jax_enable_x64 turned on for the resume, a FedAvgM run ended at other parameters than either mode's
    uninterrupted run."""
    current = jax_numerics()
    if recorded is None:  # recorded before jaxfl wrote its settings: not known, so not refused
        if current:
            warn_user(f"{run_dir}: its config.json does not say which jax settings it was made with (an older "
                      f"jaxfl), and this process has {said_jax_settings(current)}; "
                      "if the run was made with others, its resumed part computes other numbers")
        return
    if recorded == current:
        return
    names = sorted(set(recorded) | set(current))
    wanted = {name: recorded.get(name, JAX_NUMERICS[name]) for name in names}
    to_set = ", ".join(f"{name.upper()} unset" if value is None else f"{name.upper()}={jax_setting_text(value)}"
                       for name, value in wanted.items())
    raise resume.ResumeError(
        f"cannot resume {run_dir!r}: it was made with {said_jax_settings(recorded)} and this process has "
        f"{said_jax_settings(current)}, "
        f"which give other numbers; resume it in a process with {to_set} in the environment (or "
        "jax.config.update(...) before any jax work)")


def config_hash(config: RunConfig) -> str:
    """Six hex digits of SHA-256 over the config's canonical JSON (nested as ``config.json`` holds
    it): equal for the same experiment only, and the same in every jaxfl version since
    :data:`jaxfl.config.FIELDS_ADDED` began (commit f8afff3, 2026-11-24; README, "Run names across
    versions"), so that a sweep folder or a run directory name made by an older version is found again.

    - Fields that never change results are left out (:data:`NAME_LEFT_OUT`).
    - A field added to jaxfl since (:data:`jaxfl.config.FIELDS_ADDED`) is left out while it holds the
      value that does what runs did before it existed, and hashed at any other value. Those values
      are frozen when a field is added, never moved with a later change of its default: configs at
      a new default are hashed with it. So two configs hash alike only if every field they hold is
      equal, a left-out added field holding its frozen value in both, and no config of an older
      jaxfl changes its name by the adding of a field.

    >>> config_hash(RunConfig(output_dir="a")) == config_hash(RunConfig(output_dir="b", progress=False))
    True
    >>> config_hash(RunConfig(client_state="host")) == config_hash(RunConfig())
    True
    >>> config_hash(RunConfig(batch_size=32)) == config_hash(RunConfig())
    False
    """
    values = config.to_dict()
    if numerics := jax_numerics():  # hashed only where they differ: every earlier name stays
        values["jax"] = numerics
    options = values.get("algorithm_options")
    for name in NAME_LEFT_OUT:
        _leave_out(values, name)
    for name, before in FIELDS_ADDED.items():
        space, _, option = name.rpartition(".")
        if not space:
            if getattr(config, name) == before:
                _leave_out(values, name)
        elif isinstance(options, dict) and options.get(option, before) == before and _namespace(config) == space:
            options.pop(option, None)
    return hashlib.sha256(resume.canonical_json(values).encode()).hexdigest()[:6]


def _leave_out(values: dict, name: str) -> None:
    """Remove config field ``name`` from a nested ``RunConfig.to_dict()``."""
    section = SECTION_OF.get(name)
    (values[section] if section else values).pop(name, None)


def _namespace(config: RunConfig) -> str | None:
    """The namespace of the config's algorithm's options (None for an algorithm not registered)."""
    try:
        return get_algorithm(config.algorithm).option_namespace()
    except KeyError:
        return None


def run_name(config: RunConfig, algorithm: str | None = None) -> str:
    """The default run directory name: algorithm, dataset, model, partition (with its α for the
    Dirichlet splits), speed model, clients, local steps, client learning rate, seed, and
    :func:`config_hash`, so that two different configs never share a name.

    >>> run_name(RunConfig(algorithm="fedbuff", partition="dirichlet", dirichlet_alpha=0.3))[:-7]
    'fedbuff-mnist10k-cnn-dirichlet0.3-exp-c10-q50-lr0.003-s0'
    """
    partition = config.partition + (f"{config.dirichlet_alpha:g}" if config.partition.startswith("dirichlet") else "")
    parts = [algorithm or config.algorithm, config.dataset, config.model, partition, config.heterogeneity,
             f"c{config.clients}",
             f"q{config.local_steps}" if config.local_epochs is None else f"e{config.local_epochs:g}",
             # an optax object's learning rate is its own, not client_lr's
             "user_optimizer" if config.client_optimizer.startswith(USER_PREFIX) else f"lr{config.client_lr:g}",
             f"s{config.seed}",
             config_hash(config)]
    # Names may hold ':' and '/' (tfds:emnist/balanced, module:Class), and a Python object's label
    # '<user: module.Name>' spaces and brackets: keep the run one flat folder a shell takes unquoted.
    return re.sub(r"[^\w.,=+-]", "_", "-".join(parts).replace(USER_PREFIX, "user_").replace(">", ""))


def names_before_default_changes(config: RunConfig, algorithm: str | None = None) -> dict[str, str]:
    """Field → the run name a run of ``config`` got where its jaxfl recorded that field unset, before
    the algorithm's default for it changed (:attr:`jaxfl.algorithms.base.Algorithm.changed_defaults`;
    FedAsync's ``rule``): a name no validated config hashes to now. Only the fields ``config`` holds at
    that default, before or now. ``algorithm``: the name in the run name (:func:`run_name`).

    >>> from jaxfl.config import validate
    >>> list(names_before_default_changes(validate(RunConfig(algorithm="fedasync"))))
    ['rule']
    """
    cls = get_algorithm(config.algorithm)
    return {field: run_name(dataclasses.replace(config, **{field: None}), algorithm)
            for field, (before, now) in cls.changed_defaults.items() if getattr(config, field) in (before, now)}


def _write_json(path: str, payload: dict) -> None:
    """Atomic write: a reader never sees half a file, and a write that fails (a full disk) leaves
    neither half a file nor its temporary one."""
    with written_atomically(path) as temporary, open(temporary, "w") as handle:
        json.dump(payload, handle, indent=2, default=str)
        handle.write("\n")


# A note when batch_size is more than this many times the largest client's samples (each step computes
# the padded batch: that much more model work than the client's data needs).
BATCH_NOTE_FACTOR = 4


class RunStopped(NumericalError):
    """A run stopped mid-way by what it drew or reached (a negative time per step under
    ``negative_times='error'``, an evaluation grid past its bound), not by a NaN: handled as a
    numerical error is (the run keeps its logs and writes its summary with the reason; the CLI exits 1,
    a sweep's other cells go on). The message names the setting and what is allowed."""


class _Recorder:
    """Evaluates global versions, tracks the target and streams metrics rows."""

    def __init__(self, config: RunConfig, evaluate, metrics_file, progress, wall_start: float, params,
                 flush_also=(), extra_metrics: tuple[str, ...] = (), loggers=(), class_file=None,
                 metric_fields: tuple[str, ...] | None = None):
        self.config = config
        self._evaluate = evaluate
        self.evaluation_seconds = 0.0
        self.loggers = list(loggers)  # jaxfl.loggers.MetricsLogger: each metrics row, as it is written
        self.simulation = None  # set once the simulation exists: the client-update count, the progress
        self.file = metrics_file
        self.extra_metrics = extra_metrics  # the user's metrics(logits, labels) names: more columns
        # the header is written on opening; a resumed run keeps the columns its metrics.csv began with
        self.writer = csv.DictWriter(metrics_file, metric_fields or METRIC_FIELDS + extra_metrics,
                                     extrasaction="ignore")
        self.class_file = class_file  # class_accuracy.csv (None: a run begun before jaxfl wrote one)
        self.class_writer = None if class_file is None else csv.writer(class_file)
        self.flush_also = flush_also  # the event log is flushed with each metrics row
        self.progress = progress
        self.wall_start = wall_start
        # the run's wall clock: a resumed run's rows go on from its checkpoint's time, as its events do
        self.wall_clock = lambda: time.perf_counter() - wall_start
        self.rows: list[dict] = []
        self.unscored: list[int] = []  # the rows of a diverged model's evaluations (_diverged_evaluation)
        self.time_to_target: float | None = None
        self.stats = None  # the engine's EngineStats, set once the engine exists
        self._previous_params = params  # the model in force between versions
        self._previous_stats = None  # its evaluation, once made (a grid evaluates each model once)
        self._previous_steps: int | None = 0  # the client steps aggregated into it (None: unknown, see load_state_dict)
        self._previous_updates: int | None = 0  # and the client updates (the loggers' client_updates)
        # grid point k is k·eval_interval (a sum of intervals stopped moving near 1e-284 and drifted);
        # _legacy_grid: the point a checkpoint from before the count kept, gone on from as it was
        self._grid_index = 0
        self._legacy_grid: float | None = None
        self.grid_stop: str | None = None  # why the grid stopped the run (too many points), if it did
        self.first_update_wall: float | None = None  # wall seconds from the start to global version 1
        self._version_time: float | None = 0.0  # the virtual time the newest global version was made

    def evaluate(self, params) -> dict:
        started = time.perf_counter()
        try:
            return self._evaluate(params)
        finally:
            self.evaluation_seconds += time.perf_counter() - started

    def record(self, virtual_time: float, version: int, params) -> str | None:
        """Evaluate ``params`` as version ``version``; returns why the run should stop, or None."""
        stats = self.evaluate(params)
        stop = self._write(virtual_time, version, stats)
        if self._reaches_target(stats):
            self.time_to_target = virtual_time
        if self.progress is not None:
            self.progress.set_postfix(version=version, acc=f"{stats['accuracy']:.4f}", refresh=False)
        if self.time_to_target is not None and self.config.stop_at_target:
            stop = "target reached"
        return _decided_on_process_zero(stop)

    def _reaches_target(self, stats: dict) -> bool:
        """The first time the accuracy reaches the target (never where the run has no target). A
        diverged model's evaluation (:func:`_diverged_evaluation`) reaches none: where every logit is
        NaN the argmax scores one class's share."""
        target = self.config.target_accuracy
        return self.time_to_target is None and target is not None and stats["accuracy"] >= target \
            and not _diverged_evaluation(stats)

    @property
    def _next_grid(self) -> float:
        """The next grid point to evaluate: ``k · eval_interval``."""
        if self._legacy_grid is not None:
            return self._legacy_grid
        return self._grid_index * self.config.eval_interval if self.config.eval_interval is not None else 0.0

    def _advance_grid(self) -> None:
        if self._legacy_grid is not None:  # as the checkpoint's jaxfl did, so that it resumes bit for bit
            self._legacy_grid += self.config.eval_interval
        else:
            self._grid_index += 1

    def _grid_too_fine(self, virtual_time: float) -> str | None:
        """Why no grid point up to ``virtual_time`` is written: past :data:`MAX_GRID_POINTS` (a run
        without max_time, whose grid the validation could not count); None if they may be. The run
        stops there, as at a numerical error (:attr:`grid_stop`)."""
        interval = self.config.eval_interval
        if self._legacy_grid is None and virtual_time / interval >= MAX_GRID_POINTS:
            self.grid_stop = (f"eval_interval={interval!r} puts more than {MAX_GRID_POINTS:,} evaluation grid points "
                              f"(metrics rows) before virtual time {virtual_time:g} s; allowed at most "
                              f"{MAX_GRID_POINTS:,}: a larger eval_interval, a max_time, or eval_every")
            return f"evaluation grid: {self.grid_stop}"
        return None

    def state_dict(self) -> dict:
        return {"rows": list(self.rows), "time_to_target": self.time_to_target, "next_grid": self._next_grid,
                "grid_index": None if self._legacy_grid is not None else self._grid_index,
                "first_update_wall": self.first_update_wall, "version_time": self._version_time,
                "previous_params": jax.device_get(self._previous_params), "previous_steps": self._previous_steps,
                "previous_updates": self._previous_updates, "unscored": list(self.unscored)}

    def load_state_dict(self, state: dict) -> None:
        self.rows = list(state["rows"])
        if "unscored" in state:
            self.unscored = list(state["unscored"])
        else:  # a checkpoint from before they were kept: its rows of a NaN/Inf loss taken as a diverged model's
            self.unscored = [index for index, row in enumerate(self.rows)
                             if isinstance(row.get("loss"), float) and not math.isfinite(row["loss"])]
        self.time_to_target = state["time_to_target"]
        # a checkpoint from before the grid's count goes on adding intervals to its point, as it began
        self._grid_index = state.get("grid_index")
        self._legacy_grid = state["next_grid"] if self._grid_index is None else None
        self._grid_index = self._grid_index or 0
        self.first_update_wall = state.get("first_update_wall")
        self._version_time = state.get("version_time")  # None: a checkpoint from before it was kept
        self._previous_params = state["previous_params"]
        # a checkpoint from before the count was kept: its grid rows go on with the running count, as it began
        self._previous_steps = state.get("previous_steps")
        self._previous_updates = state.get("previous_updates")
        self._previous_stats = None

    def _write(self, virtual_time: float, version: int, stats: dict, client_steps: int | None = None,
               client_updates: int | None = None) -> str | None:
        """Write a metrics row (and the per-class accuracies) and hand it to the loggers; the first
        logger that asks to stop names the reason. ``client_steps`` and ``client_updates``: those
        aggregated into the evaluated model (None: all aggregated so far, the current model's)."""
        row = {"time": virtual_time, "version": version, "accuracy": stats["accuracy"],
               "balanced_accuracy": stats["balanced_accuracy"], "loss": stats["loss"],
               "client_steps": self.stats.aggregated_steps if client_steps is None else client_steps,
               "wall_time": round(self.wall_clock(), 3),
               **{name: stats[name] for name in self.extra_metrics}}
        self.rows.append(row)
        if _diverged_evaluation(stats):  # no result: left out of the best accuracy
            self.unscored.append(len(self.rows) - 1)
        self.writer.writerow(row)
        if self.class_writer is not None:  # NaN (a class without held-out samples) as an empty cell
            self.class_writer.writerow([virtual_time, version] + ["" if math.isnan(value) else repr(float(value))
                                                                  for value in stats["class_accuracy"]])
        for handle in (*self.flush_also, self.file, *([self.class_file] if self.class_file else [])):
            handle.flush()
        stop = None
        if self.loggers:
            if client_updates is None:
                client_updates = self.simulation.client_updates_aggregated if self.simulation else 0
            logged = {**row, "client_updates": client_updates}
            for logger in self.loggers:
                if logger.log(dict(logged), step=row["version"]) and stop is None:
                    stop = f"stopped by {logger_name(logger)}"
        return stop

    def update_progress(self, virtual_time: float) -> None:
        """Move the bar to the fraction of the budget closest to being spent (:func:`budget_fraction`)."""
        if self.progress is None or self.simulation is None:
            return
        if self.progress.total is None:
            self.progress.update(self.simulation.version - self.progress.n)
            return
        sim = self.simulation
        done = 100.0 * budget_fraction(self.config, virtual_time, sim.version, sim.client_updates_aggregated,
                                       sim.aggregated_steps)
        self.progress.update(max(0.0, done - self.progress.n))

    def on_version(self, virtual_time: float, version: int, params) -> str | None:
        if self.first_update_wall is None:
            self.first_update_wall = round(self.wall_clock(), 3)
        self._version_time = virtual_time
        self.update_progress(virtual_time)
        if self.config.eval_interval is None:
            if version % self.config.eval_every == 0:
                return self.record(virtual_time, version, params)
            return None
        stop = self.evaluate_grid_until(virtual_time, version - 1)
        self._previous_params = params
        self._previous_stats = None
        self._previous_steps = self.stats.aggregated_steps
        self._previous_updates = self.simulation.client_updates_aggregated if self.simulation else None
        return stop

    def record_final(self, version: int, params, at: float | None = None) -> None:
        """Evaluate the run's final model, version ``version``, if no row has (``eval_every`` N: the
        last versions of a run whose budget is not a multiple of N were never evaluated; on a grid of
        ``eval_interval``, a version made after the last grid point the run reached; either way its
        ``final_accuracy`` was an earlier model's). The row's time is ``at`` (a grid run: where the
        run ended), else the version's, as every ``eval_every`` row's. Nothing where the newest row
        is that version already, or where the run made no version (the initial model, evaluated at
        the start unless ``eval_at_start`` is off)."""
        if version > 0 and (not self.rows or self.rows[-1]["version"] != version):
            if at is None:
                # resumed from a checkpoint that did not keep it, with no version since: the checkpoint's time
                at = self._version_time if self._version_time is not None else self.simulation.now
            self.record(at, version, params)

    def skip_grid_point(self, virtual_time: float) -> None:
        """No evaluation at ``virtual_time`` (``eval_at_start=False``): the grid starts one interval later."""
        if self.config.eval_interval is not None:
            self._grid_index = math.floor(virtual_time / self.config.eval_interval) + 1

    def evaluate_grid_until(self, virtual_time: float, version: int, inclusive: bool = False) -> str | None:
        """Evaluate the model in force at each grid point before ``virtual_time`` (once per model)."""
        stop = self._grid_too_fine(virtual_time)
        if stop is not None:  # the same on every process: no grid point is written
            return stop
        stats = None
        while self._next_grid < virtual_time or (inclusive and self._next_grid <= virtual_time):
            if stats is None:
                stats = self._stats_in_force()
            # the steps of the model in force, not of the version whose arrival writes the row; every
            # grid point passed is written, also after a logger asked to stop at an earlier one
            asked = self._write(self._next_grid, version, stats, self._previous_steps, self._previous_updates)
            stop = stop or asked
            if self._reaches_target(stats):
                self.time_to_target = self._next_grid
                if self.config.stop_at_target:
                    stop = "target reached"
            self._advance_grid()
        return stop if stats is None else _decided_on_process_zero(stop)

    def _stats_in_force(self) -> dict:
        """The evaluation of the model in force between versions, made once however often it is asked for."""
        if self._previous_stats is None:
            self._previous_stats = self.evaluate(self._previous_params)
        return self._previous_stats

    def stop_at_grid_target(self, simulation) -> None:
        """Between two events of a run on an evaluation grid that stops at its target: evaluate the
        grid point the clock passes before the next event, and stop the simulation there once it
        reaches the target.

        Grid points are otherwise written when the next version arrives (:meth:`on_version`), when
        its aggregation has already been applied and counted; a run that reached its target at the
        grid point before it would then train, count and report one aggregation more than reaching
        the target cost. Only the decision is taken here: a grid point short of the target is
        written at the next version, as before, from the same evaluation (made once a model), so
        such rows and every run that does not stop at the target are unchanged. Called before a
        checkpoint can be written between the events, so that a resumed run makes the same decision.

        >>> from jaxfl.config import RunConfig
        >>> recorder = _Recorder.__new__(_Recorder)
        >>> recorder.config, recorder.time_to_target = RunConfig(eval_interval=5.0), None
        >>> recorder.stop_at_grid_target(None)  # no target: nothing to decide, the simulation is not read
        """
        config = self.config
        if config.eval_interval is None or config.target_accuracy is None or not config.stop_at_target \
                or self.time_to_target is not None or simulation._stop_requested:
            return
        if simulation.budget_spent() is not None:  # the loop stops before the next event: no grid point passes
            return
        upcoming = simulation.queue.peek()
        if upcoming is None or upcoming.time > config.max_time or not self._next_grid < upcoming.time:
            return  # as Simulation.run, which pops no event past max_time; the end evaluates the rest
        stats = self._stats_in_force()
        accuracy = stats["accuracy"]
        # every process evaluates the same grid points; process 0's accuracy decides for all of them
        if not _decided_on_process_zero("target reached" if self._reaches_target(stats) else None):
            return
        grid_point = self._next_grid
        self._write(grid_point, simulation.version, stats)  # the target outranks a logger's stop
        self.time_to_target = grid_point
        self._advance_grid()
        if self.progress is not None:
            self.progress.set_postfix(version=simulation.version, acc=f"{accuracy:.4f}", refresh=False)
        simulation.stop("target reached")  # as a backend's stop: checked before the next event


DIVERGED_OUTPUTS = 0.5  # the share of held-out samples with NaN/Inf logits above which a model has diverged


def _diverged_evaluation(stats: dict) -> bool:
    """Whether an evaluation is of a diverged model: NaN/Inf logits on more than
    :data:`DIVERGED_OUTPUTS` of the held-out samples (a model whose weights are NaN, or so large that
    its outputs overflow, gives them for nearly every sample; a healthy model's loss can be Inf on
    one glitched sample of the user's held-out data, and that evaluation counts).

    >>> _diverged_evaluation({"nonfinite_outputs": 1.0}), _diverged_evaluation({"nonfinite_outputs": 0.001})
    (True, False)
    """
    return stats.get("nonfinite_outputs", 0.0) > DIVERGED_OUTPUTS


def _decided_on_process_zero(stop: str | None) -> str | None:
    """Process 0's decision to stop after an evaluation, on every process of a run of several
    (:mod:`jaxfl.cluster`; collective: every process evaluates the same versions): only process 0
    has the loggers that may ask to stop, and its accuracy decides the target, so all processes stop
    at the same event, as one process would."""
    if cluster.process_count() == 1:
        return stop
    return cluster.broadcast_text(stop or "") or None


def budget_fraction(config: RunConfig, virtual_time: float, version: int, client_updates: int,
                    client_steps: int) -> float:
    """The fraction of the run's budget spent: the largest over the budgets it sets (virtual time,
    global updates, client updates, client-steps), since the one nearest its end stops the run.
    The progress bar shows it. 0 when no budget is set (a run that only stops at its target).

    >>> from jaxfl.config import RunConfig
    >>> budget_fraction(RunConfig(max_time=3000.0, max_updates=4), 25.0, 3, 9, 90)
    0.75
    """
    fractions = [virtual_time / config.max_time if math.isfinite(config.max_time) else 0.0]
    for budget, spent in ((config.max_updates, version), (config.max_client_updates, client_updates),
                          (config.max_client_steps, client_steps)):
        if budget is not None:
            fractions.append(spent / budget)
    return min(1.0, max(fractions))


def logger_name(logger) -> str:
    """How a stop reason names a metrics logger: its ``name`` attribute, else its class name."""
    return getattr(logger, "name", None) or type(logger).__name__


def build_data(config: RunConfig, dataset: Dataset | None = None):
    """``(dataset, federation)`` of a validated config: dataset options and partition parameters by name.

    ``dataset`` (your own, e.g. from :func:`jaxfl.data.as_dataset`) replaces loading ``config.dataset``.

    >>> from jaxfl.config import RunConfig
    >>> dataset, federation = build_data(RunConfig(partition="label_shards", clients=20))
    >>> federation.num_clients
    20
    """
    if dataset is None:
        dataset = load_data(config)
    return dataset, partition_data(config, dataset)


def note_pooled_synthetic_clients(config: RunConfig, dataset: Dataset | None = None) -> None:
    """Warn where a split undoes FedProx's synthetic heterogeneity: ``synthetic`` and
    ``synthetic:A,B`` draw each generated client's samples from a model of its own, and any partition
    but ``natural`` pools them and splits them anew (``jaxfl run`` and ``jaxfl partition`` say so).
    The same where your own data (``data=``, an ``npz`` file) gives client ids (``client_train``).

    >>> from jaxfl.config import RunConfig
    >>> note_pooled_synthetic_clients(RunConfig(dataset="synthetic", partition="natural"))  # nothing to say
    """
    if config.partition == "natural":
        return
    built_in_synthetic = config.dataset in ("synthetic", "synthetic_iid") or config.dataset.startswith("synthetic:")
    if built_in_synthetic and not parse_synthetic_name(config.dataset)["iid"]:
        warn_user(f"dataset {config.dataset!r} draws each generated client's samples from a model of its own "
                  f"(FedProx's heterogeneity), and partition={config.partition!r} pools them and splits them "
                  "anew, which undoes it: partition='natural' (--partition natural) keeps the generated clients")
    elif dataset is not None and dataset.train_groups is not None and not built_in_synthetic \
            and (config.dataset == "npz" or config.data_fingerprint is not None):  # synthetic_iid's: no heterogeneity
        warn_user(f"your data gives a client id per training sample (client_train), which partition="
                  f"{config.partition!r} does not read: it pools the samples and splits them anew; "
                  "partition='natural' (--partition natural) keeps your clients")


# The generated dataset of a shared_data() block, by name and number of clients; None outside one.
_shared_datasets: dict | None = None


@contextlib.contextmanager
def shared_data():
    """Within the block, runs that name the same synthetic dataset and number of clients generate it
    once: a comparison checks every run's data before the first run starts, and then each run loads it
    again, where 10^6 generated clients take 20–60 s and 4 GB each time. One dataset is kept at a time
    (dropped before another is generated), none after the block. Its arrays are read-only, so the runs
    are the same. Comparisons (:func:`jaxfl.comparison.compare`, ``jaxfl run --algorithm a,b``) and
    one-process sweeps run in such a block.

    >>> from jaxfl.config import RunConfig
    >>> config = RunConfig(dataset="synthetic_iid", clients=30, model="logreg")
    >>> with shared_data():
    ...     load_data(config) is load_data(config)
    True
    >>> load_data(config) is load_data(config)
    False
    """
    global _shared_datasets
    if _shared_datasets is not None:  # nested: the outer block's
        yield
        return
    _shared_datasets = {}
    try:
        yield
    finally:
        _shared_datasets = None


def load_data(config: RunConfig) -> Dataset:
    """The dataset a validated config names, with ``num_classes`` applied where it is set.

    >>> from jaxfl.config import RunConfig
    >>> load_data(RunConfig(num_classes=12)).num_classes
    12
    """
    options = {"num_clients": config.clients} if config.dataset.startswith("synthetic") else {}
    if config.dataset == "npz" and config.num_classes is not None:
        options["num_classes"] = config.num_classes  # before the file's labels are checked against it
    shared, key = _shared_datasets, (config.dataset, config.clients)
    if shared is not None and config.dataset.startswith("synthetic"):
        if key not in shared:
            shared.clear()  # before generating the next: two federations never share the memory
            shared[key] = load_dataset(config.dataset, config.data_dir, **options)
        dataset = shared[key]
    else:
        dataset = load_dataset(config.dataset, config.data_dir, **options)
    if config.num_classes is not None and config.num_classes != dataset.num_classes:
        labels = [y for y in (dataset.train_y, dataset.test_y) if len(y)]
        largest = max(int(y.max()) for y in labels)
        if largest >= config.num_classes:
            fail("num_classes", config.num_classes, f"at least {largest + 1}: dataset {config.dataset!r} has "
                                                    f"label {largest}")
        dataset = dataclasses.replace(dataset, num_classes=config.num_classes)
    return dataset


def partition_data(config: RunConfig, dataset: Dataset):
    """The federation: ``dataset``'s training split over ``config.clients`` by ``config.partition``.

    >>> from jaxfl.config import RunConfig
    >>> from jaxfl.data import load_dataset
    >>> partition_data(RunConfig(clients=4), load_dataset("mnist10k")).counts.tolist()
    [2000, 2000, 2000, 2000]
    """
    partition_kwargs = {
        "iid": {"sizes": config.client_sizes, "skew": config.size_skew},
        "dirichlet": {"alpha": config.dirichlet_alpha, "min_samples": config.dirichlet_min_samples,
                      "balance": config.dirichlet_balance},
        "dirichlet_client": {"alpha": config.dirichlet_alpha, "sizes": config.client_sizes, "skew": config.size_skew},
        "label_shards": {"shards_per_client": config.shards_per_client},
        "gamma_mix": {"gamma": config.gamma},
    }.get(config.partition, {})  # class, dual_dirichlet: the FedCompass paper's fixed parameters
    try:
        return build_federation(dataset, config.clients, config.partition, seed=config.seed, **partition_kwargs)
    except ValueError as error:  # the fields are valid alone (validate): the federation cannot be made of them
        # the partitioners name their argument num_clients, the run's field is clients
        said = str(error).replace("num_clients=", "clients=")
        raise ConfigError(f"partition={config.partition!r} cannot split dataset={config.dataset!r} over "
                          f"clients={config.clients} (seed {config.seed}): {said}") from None


def prepare(config: RunConfig, *, data=None, model=None, init_params=None):
    """Everything a run needs, built and checked before any file is written.

    ``data``: your own data instead of ``config.dataset`` (see :func:`run_experiment`).
    Returns ``(config, dataset, federation, model, variables)``: ``config`` validated, naming the
    data and its fingerprint where recorded; ``model`` a
    :class:`~jaxfl.models.adapter.ModelAdapter`, ``variables`` its initial
    ``{"params": ...[, "state": ...]}`` (:meth:`ModelAdapter.init_variables`); for a timing-only
    run their shapes only (``jax.ShapeDtypeStruct``), so that no model reaches a device.

    ``model`` (a model object, see :func:`jaxfl.models.build_model`) replaces ``config.model``;
    a ``module:object`` ``config.model`` is imported. ``init_params`` replace the model's
    initialisation as version 0 (:func:`jaxfl.user_inputs.match_init_params` checks them).
    """
    config, dataset = _user_data(config, data)
    return _prepare(validate(config), dataset, model, init_params)


def _refuse_without_jit(config: RunConfig) -> None:
    """A training run needs jit: refused before any work (a sweep's or a comparison's too, through
    :func:`check_buildable`, before any of their files)."""
    if jax.config.jax_disable_jit and not config.timing_only:
        raise ConfigError("jax_disable_jit is on (JAX_DISABLE_JIT=1, or jax.config.update('jax_disable_jit', "
                          "True)): jaxfl compiles its training programs ahead of time, which jax cannot do without "
                          "jit (refused before any work); turn it off for the run: unset JAX_DISABLE_JIT, or in "
                          "Python `with jax.disable_jit(False): run_experiment(...)`")


def check_buildable(config: RunConfig, *, data=None, **objects) -> None:
    """:func:`prepare` as a check before any of several runs starts (a comparison, a sweep): raises what
    ``config``'s run would raise while building its data and model, and checking what is given beside
    it (``data`` and the objects of :class:`~jaxfl.user_inputs.UserInputs`, as :func:`run_experiment`
    takes them). Its warnings are left to the run itself, which gives each once.

    >>> from jaxfl.config import RunConfig
    >>> check_buildable(RunConfig(model="no_such_model"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    jaxfl.config.ConfigError: model='no_such_model' is not allowed: one of ...
    >>> check_buildable(RunConfig(clients=3), time_per_step=[0.1, 0.2])
    Traceback (most recent call last):
    ValueError: time_per_step has shape (2,); expected (3,): one time per client
    """
    _refuse_without_jit(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config, dataset, user = _with_inputs(config, data, UserInputs(**objects), None, None)
        config = validate(config)
        user = user.check(config)
        config, dataset, federation, _, variables = _prepare(config, dataset, user.model, user.init_params)
        user.check_functions(dataset.num_classes)
        if not config.timing_only:
            user.check_optimizer(variables)
            if not get_algorithm(config.algorithm).__module__.startswith("jaxfl.") and \
                    (config.checkpoint_every is not None or config.final_checkpoint):
                # a plug-in's policy that a checkpoint cannot pickle failed at its own turn, after the runs
                # before it had trained (a plug-in's policy is cheap to build; the built-in ones the tests pickle)
                algorithm = build(config, client_samples=federation.counts)
                check_picklable(algorithm, algorithm.policy())


def _prepare(config: RunConfig, dataset: Dataset | None, model=None, init_params=None):
    """:func:`prepare` of a validated ``config`` that names its data (``dataset``: the user's, or None to load it)."""
    if model is None and config.model not in MODELS and is_model_reference(config.model):
        model = load_model_reference(config.model)  # before the data: a bad reference costs nothing
    if model is not None:
        check_model_object(model, f"model {config.model!r}")
    elif config.model not in MODELS:  # a <user: ...> name without its object
        UserInputs().label(config)
    if dataset is None and config.data_fingerprint is not None and not _loadable(config.dataset):
        raise ConfigError(f"dataset {config.dataset!r} is data that was passed in Python (SHA-256 "
                          f"{config.data_fingerprint[:12]}…), not a name to load: pass the same data again as "
                          "data= (jaxfl.run_experiment(config, data=...), "
                          "jaxfl.experiment.resume_experiment(run_dir, data=...))")
    early = None  # the model built and traced on the input the dataset's name fixes, before its data
    if dataset is None and (known := known_input(config.dataset)) is not None:
        if model is None:
            check_model_input(config.model, *known, config.dataset)
        if (classes := config.num_classes or known_classes(config.dataset)) is not None:
            adapter = _model_adapter(config, model, classes, None)
            early = (known, classes, adapter, _trace_model(config, adapter, *known, classes))
    if config.timing_only and config.dataset.startswith("synthetic") and config.partition in SIZES_ONLY_PARTITIONS \
            and dataset is None:
        dataset, federation = _synthetic_sizes_only(config)
    else:
        if dataset is None:
            dataset = load_data(config)
            if config.dataset == "npz" and config.num_classes is not None and config.data_fingerprint is None:
                _refuse_two_num_classes(config)  # (a recorded run goes on as it was made)
            if config.dataset == "npz" or config.data_fingerprint is not None:
                config = _pin_fingerprint(config, dataset)
        _check_classes_and_test_split(config, dataset)
        federation = partition_data(config, dataset)
    _check_transforms(config, dataset)
    largest = int(np.max(federation.counts)) if len(federation.counts) else 0
    if not config.timing_only and 0 < largest and config.batch_size > BATCH_NOTE_FACTOR * largest:
        # said, not changed: the steps stay those of batch_size (its local_epochs step counts too); a
        # batch a little over small clients (synthetic data's default) is no news
        warn_user(f"batch_size={config.batch_size} is larger than the largest client's {largest} samples: each "
                  f"step takes a client's whole data, padded to {config.batch_size} samples: "
                  f"{config.batch_size / largest:.3g}× the model work a step of batch_size={largest}, whose "
                  "steps take the same samples (its local_epochs step counts differ); the run keeps batch_size as given")
    if not config.timing_only:
        note_pooled_synthetic_clients(config, dataset)
    if config.target_accuracy is None and not config.timing_only:
        warn_user(f"dataset {config.dataset!r} has no default target accuracy, so this run has none: "
                  "time_to_target stays null and it does not stop at a target (set target_accuracy for one)")
    if early is not None and early[:2] == ((dataset.input_shape, dataset.kind), dataset.num_classes) \
            and dataset.vocab_size is None:
        _, _, model, abstract = early
    else:
        if model is None:
            check_model_input(config.model, dataset.input_shape, dataset.kind, config.dataset)
        model = _model_adapter(config, model, dataset.num_classes, dataset.vocab_size)
        abstract = _trace_model(config, model, dataset.input_shape, dataset.kind, dataset.num_classes)
    given = None if init_params is None else match_init_params(init_params, abstract)
    if given is not None and config.weight_init != "flax":
        raise ConfigError(f"weight_init={config.weight_init!r} is not read when init_params= is given (those are the "
                          "initial weights): leave it unset")
    if config.timing_only:
        return config, dataset, federation, model, abstract
    variables = model.init_variables(_model_key(config), _model_sample(dataset.input_shape, dataset.kind))
    if config.weight_init == "pytorch":  # (beside init_params it is refused above)
        variables = {**variables, "params": pytorch_default_init(
            variables["params"], jax.random.fold_in(_model_key(config), PYTORCH_INIT_STREAM))}
    return config, dataset, federation, model, variables if given is None else {**variables, **given}


def _refuse_two_num_classes(config: RunConfig) -> None:
    """A new run's ``num_classes`` beside another that its npz file holds: which was meant is the user's to
    say (the config's won in silence)."""
    held = npz_num_classes(config.data_dir)
    if held is not None and held != config.num_classes:
        raise ConfigError(f"num_classes={config.num_classes} is given, and {config.data_dir} holds num_classes={held}: "
                          "give one of them, or the same in both")


def _model_adapter(config: RunConfig, model, num_classes: int, vocab_size: int | None):
    """The run's model for ``num_classes`` classes: ``model`` (the user's object) or ``config.model`` built."""
    if model is None:
        return as_adapter(make_model(config.model, num_classes, vocab_size=vocab_size))
    return build_model(model, num_classes, vocab_size=vocab_size, label=f"model {config.model!r}")


def _model_key(config: RunConfig):
    return jax.random.fold_in(jax.random.key(config.seed), MODEL_STREAM)


def _model_sample(input_shape: tuple, kind: str):
    return jnp.zeros((1,) + tuple(input_shape), jnp.int32 if kind == "tokens" else jnp.float32)


def _trace_model(config: RunConfig, model, input_shape: tuple, kind: str, num_classes: int):
    """The model's variables as shapes (``jax.eval_shape``): shape errors and a wrong number of logits
    surface here without allocating or compiling."""
    sample = _model_sample(input_shape, kind)
    batch = jnp.concatenate([sample, sample])  # two samples: a model that mixes the batch's rows shows it
    try:
        abstract = jax.eval_shape(model.init_variables, _model_key(config), sample)
        shape = tuple(jax.eval_shape(model.predict, abstract, batch).shape)
    except ModelModeError:
        raise
    except (TypeError, ValueError) as error:  # layers that do not fit this input shape
        raise ValueError(f"model {config.model!r} cannot take dataset {config.dataset!r} samples of shape "
                         f"{tuple(input_shape)}: {error}") from error
    # labels are one class per sample, so the logits must be (batch, classes): a model that keeps the
    # image's axes (no flatten before its last Dense) or averages over the batch fails here, in words
    if len(shape) != 2 or shape[0] != len(batch):
        raise ValueError(f"model {config.model!r} returns logits of shape {shape} for a batch of "
                         f"{len(batch)} samples of shape {tuple(input_shape)}; it must return "
                         f"({len(batch)}, {num_classes}): one row of {num_classes} class logits per sample "
                         "(flatten the features before the last layer)")
    if shape[1] != num_classes:
        raise ValueError(f"model {config.model!r} outputs {shape[1]} logits but dataset "
                         f"{config.dataset!r} has {num_classes} classes")
    return abstract


class _ClientSizes:
    """A federation known by its clients' sample counts only: all a timing-only run needs (p_i)."""

    def __init__(self, counts: np.ndarray):
        self.counts = counts
        self.num_clients = len(counts)

    def weights(self, kind: str = "samples") -> np.ndarray:
        from jaxfl.data.federated import FederatedData

        return FederatedData.weights(self, kind)


# The partitions of a synthetic federation whose client sizes follow from its generated sizes alone
# (natural: one client per generated client; iid: their pooled samples cut anew), not from its labels.
SIZES_ONLY_PARTITIONS = ("natural", "iid")


def _synthetic_sizes_only(config: RunConfig):
    """``(dataset with no samples, client sizes)`` of the synthetic federation that
    :func:`build_data` would build for ``config`` (a partition of :data:`SIZES_ONLY_PARTITIONS`):
    what a timing-only run needs, without generating the samples."""
    from jaxfl.data import PARTITION_STREAM
    from jaxfl.data.datasets import Dataset
    from jaxfl.data.partition import iid_counts
    from jaxfl.data.synthetic import SYNTHETIC_CLASSES, SYNTHETIC_DIM, synthetic_name, synthetic_train_counts

    name = synthetic_name(**parse_synthetic_name(config.dataset))
    empty = np.zeros((0, SYNTHETIC_DIM), np.float32)
    dataset = Dataset(name, empty, np.zeros(0, np.int32), empty, np.zeros(0, np.int32), SYNTHETIC_CLASSES)
    counts = synthetic_train_counts(config.clients)
    if config.partition == "iid":  # build_federation's generator, whose first draws are the sizes
        rng = np.random.default_rng(np.random.SeedSequence([config.seed, PARTITION_STREAM]))
        counts = iid_counts(int(counts.sum()), config.clients, rng, config.client_sizes, config.size_skew)
    return dataset, _ClientSizes(counts)


def _loadable(name: str) -> bool:
    return name in DATASETS or name.startswith(DATASET_PREFIXES)


def _user_data(config: RunConfig, data) -> tuple[RunConfig, Dataset | None]:
    """``run_experiment(config, data=...)``: the checked Dataset, and the config naming it and its fingerprint
    (unchanged and None without ``data``). The data's name decides defaults, so it comes before validation."""
    if data is None:
        return config, None
    name = data.name if isinstance(data, Dataset) else "user"
    if config.data_fingerprint is not None and config.dataset != name:  # a recorded run's config
        given = f"a Dataset named {name!r}" if isinstance(data, Dataset) else "arrays, which are named 'user'"
        recorded = ("arrays (named 'user')" if config.dataset == "user" else f"a Dataset named {config.dataset!r}")
        raise ConfigError(f"this run was made on {recorded}, and data= gives {given}: pass the run's data "
                          f"as it was passed then (the name is part of the run's record)")
    if config.dataset not in (DataConfig.dataset, name):  # the default, or the name a run recorded
        raise ConfigError(f"dataset={config.dataset!r} names a dataset to load, but data= was passed too: leave "
                          f"dataset unset (the run records it as {name!r})")
    if config.data_dir is not None:
        raise ConfigError(f"data_dir={config.data_dir!r} is not read when data= is given: leave it unset")
    held = data.get("num_classes") if isinstance(data, Mapping) else None
    held = np.asarray(held).item() if held is not None and np.ndim(held) == 0 else None
    if held is not None and config.num_classes is not None and config.data_fingerprint is not None and \
            held != config.num_classes:  # a recorded run's: it goes on as it was made
        warn_user(f"data= holds num_classes={held!r}, but the run was made with num_classes={config.num_classes}: "
                  f"it goes on with {config.num_classes}")
    if held is not None and config.num_classes is not None and config.data_fingerprint is None and \
            held != config.num_classes:  # a new run given two: which one was meant is the user's to say
        raise ConfigError(f"num_classes={config.num_classes} is given, and data= holds num_classes={held!r}: give "
                          "one of them, or the same in both")
    dataset = as_dataset(data, config.num_classes, name)
    _fingerprint_once(data, dataset)
    config = dataclasses.replace(config, dataset=name)
    largest = max(int(dataset.train_y.max(initial=0)), int(dataset.test_y.max(initial=0)))
    if config.num_classes is None and config.data_fingerprint is None and dataset.num_classes != largest + 1:
        # a num_classes the data holds (a mapping's, a Dataset's) is not in its fingerprint, which covers
        # the arrays: recorded, so that the run's name says it, and its resume with the arrays alone has it
        config = dataclasses.replace(config, num_classes=dataset.num_classes)
    return _pin_fingerprint(config, dataset), dataset


# The SHA-256 of each data= object met so far in a :func:`hashing_data_once` block; None outside one.
_data_fingerprints: dict | None = None


@contextlib.contextmanager
def hashing_data_once():
    """Within the block, the SHA-256 of one ``data=`` object is computed once (:func:`_fingerprint_once`):
    a comparison's check, its search for a finished run and the run itself each convert ``data=`` (of
    188 MB, 0.2 s a hash: 9 of a 3-run comparison's 14.5 s were 1.7 s of hashing, and 0.8 of its 1.9 s
    when it reused them). One :func:`jaxfl.comparison.compare` call is such a block, and none outlives
    it: data changed in place between two calls is hashed again.

    >>> import jaxfl.experiment as experiment  # (the module's global, not this example's copy of it)
    >>> with hashing_data_once():
    ...     experiment._data_fingerprints
    {}
    >>> experiment._data_fingerprints is None
    True
    """
    global _data_fingerprints
    outer, _data_fingerprints = _data_fingerprints, {}
    try:
        yield
    finally:
        _data_fingerprints = outer


def _fingerprint_once(data, dataset: Dataset) -> None:
    """In a :func:`hashing_data_once` block, give ``dataset`` the SHA-256 of the arrays of the same ``data``
    object met before in the block rather than hash them again. The block holds the object, so its id
    names it; nothing changes its arrays while the block's call runs."""
    if _data_fingerprints is None:
        return
    held = _data_fingerprints.get(id(data))
    if held is not None and held[0] is data:
        dataset.__dict__["fingerprint"] = held[1]  # functools.cached_property's slot
    else:
        _data_fingerprints[id(data)] = (data, dataset.fingerprint)


class _OtherData(ConfigError):
    """Data whose fingerprint is not the one a config records."""


def _described(data: dict) -> str:
    """The data a config.json's ``dataset`` record (or :func:`_description`) describes, in words."""
    return (f"{data.get('train_samples')} training and {data.get('test_samples')} test samples of shape "
            f"{tuple(data.get('input_shape') or ())}, {data.get('dtype')}, {data.get('num_classes')} classes")


def _description(dataset: Dataset) -> dict:
    """What config.json records of the data beside its name, kind and normalisation (:func:`_described` says it)."""
    return {"input_shape": list(dataset.input_shape), "dtype": str(dataset.train_x.dtype),
            "num_classes": dataset.num_classes, "train_samples": len(dataset.train_y),
            "test_samples": len(dataset.test_y)}


def _pin_fingerprint(config: RunConfig, dataset: Dataset) -> RunConfig:
    """Record the data's fingerprint in the config, refusing other data than a recorded fingerprint names."""
    recorded = config.data_fingerprint
    if recorded is not None and recorded != dataset.fingerprint:
        raise _OtherData(f"data_fingerprint={recorded[:12]}… (the data this config was run on) does not match the "
                          f"data given ({dataset.fingerprint[:12]}…, dataset {config.dataset!r}): pass the same data, "
                          "or clear data_fingerprint to start a new run on this data")
    return dataclasses.replace(config, data_fingerprint=dataset.fingerprint)


def _check_classes_and_test_split(config: RunConfig, dataset: Dataset) -> None:
    if dataset.num_classes < 2:
        raise ConfigError(f"dataset {config.dataset!r} has num_classes={dataset.num_classes}: a classifier needs "
                          ">= 2 classes; set num_classes to the number of classes the model should tell apart")
    if len(dataset.test_y) == 0 and not config.timing_only:
        raise ConfigError(f"dataset {config.dataset!r} has an empty test split: a run evaluates the global model "
                          "on held-out samples, so give at least one test sample")


def _check_transforms(config: RunConfig, dataset) -> None:
    """Augmentation needs images; normalisation needs values (not token ids) and statistics that fit."""
    if config.augment == "crop_flip" and dataset.kind != "image":
        raise ValueError(f"augment='crop_flip' needs image samples but dataset {config.dataset!r} has "
                         f"{dataset.kind} samples; use augment='none' (or 'auto')")
    if config.augment == "auto" and dataset.kind == "image" and dataset_family(dataset.name) in AUGMENTED \
            and ":" not in dataset.name and not config.timing_only:
        # your arrays named "cifar10" (the built-ins: "tfds:cifar10", "array_record:cifar10"): the name alone
        # chose the augmentation
        warn_user(f"data named {dataset.name!r} is trained with random crops and flips, which augment='auto' takes "
                  f"for the CIFAR family its name gives; augment='none' trains on your images as they are "
                  f"(augment='crop_flip' keeps them without this note)")
    if config.normalize and dataset.kind == "tokens":
        raise ConfigError(f"normalize=True is not allowed: dataset {config.dataset!r} holds token ids, which have "
                          "no mean and std (set normalize=false)")
    channels = dataset.input_shape[-1]
    for name in ("normalize_mean", "normalize_std"):
        values = getattr(config, name)
        if values is not None and len(values) not in (1, channels):
            fail(name, list(values), f"one number or one per channel ({channels} for dataset {config.dataset!r}, "
                                     f"samples of shape {dataset.input_shape})")


def normalization_statistics(config: RunConfig, dataset) -> dict | None:
    """What ``normalize`` divides by: ``{"mean", "std", "source"}`` (explicit values, or the training
    split's per-channel statistics), or None when the run does not normalise.

    >>> from jaxfl.config import RunConfig, validate
    >>> from jaxfl.data import load_dataset
    >>> normalization_statistics(validate(RunConfig(normalize=True)), load_dataset("mnist10k"))
    {'mean': [0.132308], 'std': [0.310289], 'source': 'training split'}
    """
    if not config.normalize:
        return None
    if config.normalize_mean is not None:
        return {"mean": list(config.normalize_mean), "std": list(config.normalize_std), "source": "config"}
    mean, std = dataset.channel_statistics
    return {"mean": list(mean), "std": list(std), "source": "training split"}


def _cpu_layers(config: RunConfig) -> bool:
    """Whether the run's layers take their CPU forms (``cpu_friendly``): asked for, and on a CPU."""
    return config.cpu_friendly_layers and jax.default_backend() == "cpu"


def held_out_evaluator(config: RunConfig, dataset, model, params, preprocess=None, loss=None, metrics=None):
    """The ``evaluate(variables)`` that a run of ``config`` makes of ``dataset``'s held-out split:
    :func:`make_evaluator` with the run's preprocessing (:func:`make_transforms`, unless given), batch
    (:func:`evaluation_batch_size`) and, on a CPU, the im2col form for narrow convolutions only. A
    benchmark that takes the evaluations out of a run's wall time times this one.
    ``evaluate.batch_size`` is the batch asked for (what the run's ``config.json`` records).

    >>> from jaxfl.config import RunConfig
    >>> config, dataset, _, model, variables = prepare(RunConfig(model="logreg", clients=4))
    >>> evaluate = held_out_evaluator(config, dataset, model, variables)
    >>> 0 <= evaluate(variables)["accuracy"] <= 1, evaluate.batch_size > 0
    (True, True)
    """
    if preprocess is None:
        preprocess, _ = make_transforms(config, dataset)
    cpu_layers = _cpu_layers(config)
    predict = cpu_friendly(model.predict, inference=True) if cpu_layers else model.predict
    batch = evaluation_batch_size(model.predict, params, dataset.input_shape, cpu_layers, dataset.kind)
    evaluate = make_evaluator(predict, dataset.test_x, dataset.test_y, batch, preprocess=preprocess, loss=loss,
                              metrics=metrics, num_classes=dataset.num_classes)
    evaluate.batch_size = batch
    return evaluate


def make_transforms(config: RunConfig, dataset):
    """``(preprocess, augment or None)`` for the kernel: on-device scaling/normalisation, and random
    crop + flip in training when ``config.augment`` asks for it (``auto``: CIFAR-10/100 only).

    >>> from jaxfl.config import RunConfig
    >>> from jaxfl.data import load_dataset
    >>> preprocess, augment = make_transforms(RunConfig(), load_dataset("mnist10k"))
    >>> augment is None
    True
    """
    stats = normalization_statistics(config, dataset) or {"mean": None, "std": None}
    preprocess = make_preprocess(dataset, normalized=config.normalize, mean=stats["mean"], std=stats["std"])
    wanted = config.augment == "crop_flip" or (config.augment == "auto" and dataset.kind == "image"
                                               and dataset_family(dataset.name) in AUGMENTED)
    if not wanted:
        return preprocess, None
    return preprocess, make_augment(dataset, crop_padding=4, flip=True, normalized=config.normalize,
                                    mean=stats["mean"], std=stats["std"])


def _speeds_and_faults(config: RunConfig, params, time_per_step=None,
                       local_steps=None) -> tuple[ClientSpeeds, ClientFaults | None]:
    """The run's client speeds and faults. ``local_steps``: the algorithm's steps per dispatch (one
    count per client with ``local_epochs``), read under ``speed_unit="round"``, where each client's
    compute time is scaled by mean(S)/S_i (:func:`~jaxfl.scheduler.speeds.round_unit_scale`) so that
    its round takes E·S̄ steps' time whatever its data size."""
    model_bytes = sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))
    compute_scale = None
    if config.speed_unit == "round":
        if isinstance(local_steps, (int, np.integer)) or local_steps is None:
            raise ValueError("speed_unit='round' needs each client's steps per dispatch (local_epochs set and "
                             "the algorithm's local_steps one count per client)")
        compute_scale = round_unit_scale(np.asarray(local_steps, dtype=np.int64))
    speeds = ClientSpeeds(SpeedConfig(model=config.heterogeneity, mean=config.speed_mean, jitter=config.jitter,
                                      speed_change_prob=config.speed_change_prob, cap=config.speed_cap,
                                      negative=config.negative_times, latency=config.latency,
                                      bandwidth=config.bandwidth, reference_time=config.speed_reference_time,
                                      ratio=config.speed_ratio,
                                      legacy_seed=config.speed_legacy_seed),
                          config.clients, seed=config.seed, model_bytes=int(model_bytes), time_per_step=time_per_step,
                          compute_scale=compute_scale)
    fault_config = FaultConfig(crash_prob=config.crash_prob, delay_prob=config.delay_prob,
                               delay_factor=config.delay_factor, dropout_prob=config.dropout_prob,
                               dropout_mean=config.dropout_mean)
    faults = ClientFaults(fault_config, config.clients, config.seed) if fault_config.active else None
    return speeds, faults


def _expected_event_rows(config: RunConfig, policy=None) -> int | None:
    """The event-log rows a timing-only run writes if it reaches ``max_updates``: at least 2k + 1
    per global update, k the updates each aggregation takes (the policy's ``buffer_size``, FedBuff's;
    else 1): its aggregation row, and the dispatch and the arrival of each update in it. A run
    expecting more than the log's switch starts it in Parquet (:class:`~jaxfl.runlog.EventLog`'s
    ``expected_rows``). None for a training run (its log starts as CSV) or without that budget.

    >>> _expected_event_rows(RunConfig(timing_only=True, max_updates=100_000))
    300000
    """
    if not config.timing_only or config.max_updates is None:
        return None
    return (2 * getattr(policy, "buffer_size", 1) + 1) * config.max_updates


def _open_logs(run_dir: str, offsets: dict | None, metric_fields: tuple[str, ...] = METRIC_FIELDS,
               num_classes: int | None = None, expected_rows: int | None = None):
    """The event log (:class:`~jaxfl.runlog.EventLog`: CSV, Parquet parts once large or, given
    ``expected_rows`` beyond the switch, from the start), metrics.csv and, given ``num_classes``,
    class_accuracy.csv, for appending; on resume, cut back to
    the checkpoint's positions so rows written after it (and re-created by the resumed run) are
    neither lost nor doubled. The class file is None on resuming a run whose checkpoint has no
    position for it (begun by an older jaxfl)."""
    fields = EVENT_LOG_FIELDS
    if offsets is not None:
        # a finished run run again: its logs go back to the checkpoint, so its summary (and log_bytes)
        # no longer describes them; cut short now, the run is unfinished, as it then is
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(run_dir, "summary.json"))
        # a log begun by an older jaxfl (no wall_time column) keeps its columns
        fields = existing_fields(run_dir) or EVENT_LOG_FIELDS
    events = EventLog(run_dir, fields, resume=None if offsets is None else offsets["events"],
                      ignore=("wall_time",), expected_rows=expected_rows)
    handle = _open_table(os.path.join(run_dir, METRICS_NAME), metric_fields,
                         None if offsets is None else offsets[METRICS_NAME])
    classes = None
    if num_classes is not None and (offsets is None or CLASS_ACCURACY_NAME in offsets):
        classes = _open_table(os.path.join(run_dir, CLASS_ACCURACY_NAME),
                              ("time", "version", *(f"class_{k}" for k in range(num_classes))),
                              None if offsets is None else offsets[CLASS_ACCURACY_NAME])
    return events, handle, classes


def _open_table(path: str, fields, offset: int | None):
    """A CSV file for appending rows: new with its header, or cut back to ``offset`` bytes."""
    if offset is None:
        handle = open(path, "w", newline="")
        csv.writer(handle).writerow(fields)
    else:
        handle = open(path, "r+", newline="")
        handle.truncate(offset)
        handle.seek(offset)
    return handle


def run_experiment(config: RunConfig, resume_dir: str | None = None, *,
                   data=None,
                   model=None,
                   client_optimizer=None,
                   init_params=None,
                   time_per_step=None,
                   loss=None,
                   metrics=None,
                   loggers=None) -> RunResult:
    """Run ``config`` end to end and write its run directory (see the module docstring).

    With ``resume_dir``, continue that run from its newest checkpoint instead (the config is the
    one saved in the run directory); the finished run is identical to an uninterrupted one.

    Runs in a loop (a sweep, a notebook) do not accumulate: a finished run's engine (its compiled
    programs and device buffers) is freed as soon as its ``RunResult`` is dropped; keeping the
    result keeps its engine.

    ``data``: your own data instead of ``config.dataset``: a :class:`jaxfl.data.Dataset`, a
    ``(train_x, train_y, test_x, test_y)`` tuple, or a mapping of those names (see
    :func:`jaxfl.data.as_dataset`), checked before any work. The run records the dataset as
    ``"user"`` (or the Dataset's name) and the data's SHA-256 as ``data_fingerprint``; resuming
    needs the same data again (``resume_experiment(run_dir, data=...)``).

    >>> import numpy as np
    >>> from jaxfl.config import RunConfig
    >>> rng = np.random.default_rng(0)
    >>> arrays = (rng.random((40, 8, 8), np.float32), np.arange(40) % 2, rng.random((10, 8, 8), np.float32),
    ...           np.arange(10) % 2)
    >>> result = run_experiment(RunConfig(algorithm="fedavg", model="logreg", clients=2, local_steps=2,
    ...                                   max_updates=1, progress=False), data=arrays)
    >>> result.summary["dataset"], result.summary["target_accuracy"]
    ('user', None)

    Your own pieces, each optional (:class:`jaxfl.user_inputs.UserInputs` says more):
    ``model`` a Flax linen module, an nnx module class/instance or factory ``rngs -> Module``, or a
    ``ModelAdapter``; ``client_optimizer`` any ``optax.GradientTransformation`` (schedules restart at
    every dispatch, as the optimiser state does); ``init_params`` the version-0 parameters (checked
    against the model, first differing leaf named); ``time_per_step`` (clients,) seconds per local
    step replacing the drawn speeds (per-round ``jitter`` still applies: set it to 0 to replay the
    times exactly); ``loss(logits, labels) -> (B,)`` for training and evaluation;
    ``metrics(logits, labels) -> {name: (B,)}`` as extra ``metrics.csv`` columns. ``config.json``
    records them as ``<user: ...>`` names and fingerprints, the speeds as ``client_time_per_step.npy``.

    >>> import optax
    >>> from jaxfl.config import RunConfig
    >>> result = run_experiment(RunConfig(algorithm="fedavg", clients=3, local_steps=2, model="logreg",
    ...                                   max_updates=1, progress=False),
    ...                         client_optimizer=optax.sgd(0.1), time_per_step=[0.1, 0.2, 0.3])
    >>> result.summary["global_updates"]
    1

    ``loggers``: :mod:`jaxfl.loggers` objects or names (``"tensorboard"``, ``"csv"``, ``"wandb"``)
    that receive every metrics row as it is written; they do not change the run.
    """
    if not isinstance(config, RunConfig):
        given = f"a {type(config).__name__}" if config is not None else "None"
        raise TypeError(f"run_experiment takes a RunConfig, got {given}: build one with RunConfig(clients=4, ...), "
                        "or jaxfl.config.config_from_mapping({...}) from a mapping of settings")
    loggers = check_loggers(loggers)
    user = UserInputs(model=model, client_optimizer=client_optimizer, init_params=init_params,
                      time_per_step=time_per_step, loss=loss, metrics=metrics)
    recorded = None
    if resume_dir is not None:  # it continues from a checkpoint: with none to continue from it is refused here
        resume_dir = user_path(resume_dir)
        resume.candidates(resume_dir, warn=False)
        written = resume.read_record(resume_dir)
        recorded = written.get("user_inputs", {})  # the config is the one given
        _refuse_other_jax_numerics(resume_dir, written.get("jax"))
        say_other_xla_flags(resume_dir, written.get("xla_flags"), "resumes it")
    config, dataset, user = _with_inputs(config, data, user, resume_dir, recorded)
    # The one validation of the run (its warnings are given once): of the config naming the user's
    # data and objects, whose names decide defaults and which settings are read.
    return _experiment(validate(config), dataset, user, resume_dir, loggers, recorded)


def algorithm_source(name: str) -> dict | None:
    """A plug-in algorithm's file and its SHA-256 (``config.json``'s ``algorithm_source``), so that a
    resume can tell that the file was edited, and the fingerprint of its code with the user's modules
    it imports (:func:`_source_record`); None for a built-in or a class without a file (a notebook's).

    >>> algorithm_source("fedavg") is None
    True
    """
    cls = get_algorithm(name)
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    # (a class of the script being run: the script that resumes is another, or the same edited to)
    if cls.__module__.startswith("jaxfl.") or cls.__module__ == "__main__" or not path or not os.path.isfile(path):
        return None
    return _source_record(module)


def is_user_file(path: str | None) -> bool:
    """Whether ``path`` is a Python file of the user's: not jaxfl's, the standard library's or an
    installed package's (what a plug-in or a model file may import beside it; where an error raised
    in the user's code comes from, which ``jaxfl run`` names).

    >>> is_user_file(__file__), is_user_file("<stdin>")
    (False, False)
    """
    from jaxfl._user_warnings import _not_the_users

    return bool(path) and path.endswith(".py") and os.path.isfile(path) and not _not_the_users(path)


_FILE_DIGESTS: dict = {}  # bytes' SHA-256 -> (parsed code's SHA-256, imported names)


def _file_digest(path: str) -> tuple[str, str, tuple]:
    """A Python file's SHA-256, that of its parsed code (``ast.dump``: comments and layout left out)
    and the modules its import statements name, anywhere in it (``(name, level)``, relative ones by
    their dots); parsed once for the same bytes."""
    import ast

    with open(path, "rb") as handle:
        source = handle.read()
    key = hashlib.sha256(source).hexdigest()
    if key not in _FILE_DIGESTS:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):  # (a file edited since it was imported)
            code, names = hashlib.sha256(source).hexdigest(), ()
        else:
            code = hashlib.sha256(ast.dump(tree).encode()).hexdigest()
            found = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found += [(alias.name, 0) for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    found += [(base, node.level)] + [(f"{base}.{alias.name}" if base else alias.name, node.level)
                                                     for alias in node.names if alias.name != "*"]
            names = tuple(dict.fromkeys(found))
        _FILE_DIGESTS[key] = (code, names)
    return (key, *_FILE_DIGESTS[key])


def _module_file(name: str) -> str | None:
    """The file of module ``name``, loaded or findable, without importing anything new (a dotted
    name only where its parent package is loaded)."""
    import importlib.util

    loaded = sys.modules.get(name)
    if loaded is not None:
        return getattr(loaded, "__file__", None)
    if "." in name and name.rpartition(".")[0] not in sys.modules:
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    return spec.origin if spec is not None and spec.has_location else None


def _user_files(module) -> list[str]:
    """``module``'s file and those of the user's modules its code imports, transitively, wherever the
    import statement is (in a function too), with the packages (``__init__.py``) above each: not
    jaxfl's, the standard library's or an installed package's (:func:`is_user_file`)."""
    first = os.path.abspath(module.__file__)
    files = {first: None}
    queue = [(first, module.__name__, getattr(module, "__package__", None) or "")]
    while queue:
        path, name, package = queue.pop()
        for imported, level in _file_digest(path)[2]:
            if level:  # a relative import: from its module's package
                parts = package.split(".") if package else []
                if level - 1 > len(parts):
                    continue
                base = ".".join(parts[:len(parts) - (level - 1)])
                imported = f"{base}.{imported}" if imported and base else imported or base
            pieces = imported.split(".")
            for depth in range(1, len(pieces) + 1):  # the package above, then the module itself
                candidate = ".".join(pieces[:depth])
                found = _module_file(candidate)
                if not is_user_file(found) or os.path.abspath(found) in files:
                    continue
                found = os.path.abspath(found)
                files[found] = None
                queue.append((found, candidate, candidate if found.endswith("__init__.py") else
                              candidate.rpartition(".")[0]))
    return list(files)


def _source_record(module) -> dict:
    """``config.json``'s record of a user's module (a plug-in's, a model file's): its file, the
    SHA-256 of its bytes, and ``files``: for it and each module of the user's its code imports
    (:func:`_user_files`), by path relative to its folder (the same files in another folder are the
    same code), the bytes' SHA-256 and the parsed code's (``code``: comments and layout are not
    code; its form is the Python version's, which ``python`` records)."""
    files = _user_files(module)
    folder = os.path.dirname(files[0])
    digests = {os.path.relpath(path, folder): _file_digest(path) for path in files}
    return {"file": module.__file__, "sha256": digests[os.path.basename(files[0])][0],
            "files": {name: {"sha256": sha, "code": code} for name, (sha, code, _) in digests.items()},
            "python": platform.python_version()}


def _changed_files(then: dict, now: dict) -> list[str]:
    """The files of ``now`` (a :func:`_source_record`) that differ from ``then``'s, the record a run
    kept: bytes and code both (code alone under the same Python version's parser), a file added or
    gone; a record from before ``files`` compares the main file's bytes."""
    if not isinstance(then.get("files"), dict):
        return [] if then.get("sha256") == now["sha256"] else [os.path.basename(now["file"])]
    same_parser = then.get("python") == now["python"]
    changed = []
    for name in sorted(set(then["files"]) | set(now["files"])):
        old, new = then["files"].get(name), now["files"].get(name)
        if old is None or new is None:
            changed.append(name)
        elif old.get("sha256") != new["sha256"] and not (same_parser and old.get("code") == new["code"]):
            changed.append(name)
    return changed


def model_source(name: str) -> dict | None:
    """A model named by reference (``path/to/file.py:Net`` or ``module:Net``): its module's file and
    SHA-256 (``config.json``'s ``model_source``), as :func:`algorithm_source` for an algorithm; None
    for a built-in model, a registered one or a Python object (whose structure is fingerprinted).

    >>> model_source("cnn") is None
    True
    """
    import inspect

    from jaxfl.models.zoo import is_model_reference, load_model_reference

    if not is_model_reference(name):
        return None
    try:
        module = inspect.getmodule(load_model_reference(name))
    except ValueError:
        return None
    path = getattr(module, "__file__", None)
    if module is None or module.__name__.startswith("jaxfl.") or not path or not os.path.isfile(path):
        return None
    return _source_record(module)


def changed_sources(record: dict, config: RunConfig) -> list[str]:
    """The user's files (a plug-in algorithm's, a model file's) that differ from those a run recorded
    (its ``config.json``, ``record``) as ``"FILE (algorithm NAME)"``: the run's results are another
    code's. A run recorded without a file's fingerprint (before it was kept) is taken as unchanged.

    >>> changed_sources({}, RunConfig())
    []
    """
    changed = []
    for key, now, what in (("algorithm_source", algorithm_source(config.algorithm), f"algorithm {config.algorithm}"),
                           ("model_source", model_source(config.model), f"model {config.model}")):
        then = record.get(key)
        if now is None or not isinstance(then, dict):
            continue
        files = _changed_files(then, now)
        if files:
            folder = os.path.dirname(os.path.abspath(now["file"]))
            changed.append(f"{', '.join(os.path.join(folder, name) for name in files)} ({what})")
    return changed


def _check_algorithm_source(run_dir: str, config: RunConfig) -> None:
    """Warn where a resumed run's plug-in algorithm file (or model file) changed since the run began:
    the run goes on with the edited code, which nothing else would say (the data are checked)."""
    if algorithm_source(config.algorithm) is None and model_source(config.model) is None:
        return  # built-ins: config.json is not read again (a resume reads it once)
    changed = changed_sources(resume.read_record(run_dir), config)
    if changed:
        warn_user(f"{' and '.join(changed)} {'has' if len(changed) == 1 else 'have'} changed since run {run_dir} "
                  f"began: the resumed run goes on with the edited code, so its updates before and after this "
                  f"resume follow two versions of it (start the run again for one)")


def _with_inputs(config: RunConfig, data, user: UserInputs, resume_dir: str | None,
                 recorded: dict | None) -> tuple[RunConfig, Dataset | None, UserInputs]:
    """``config`` naming the user's data and objects (``<user: ...>``), the user's data checked (or None),
    and, for a resume, ``user`` checked against what the run ``recorded`` (its speeds read back)."""
    if resume_dir is not None:  # the objects the run was made with, again; its speeds from its folder
        # data passed in Python and not again: named with the objects missing, in one error
        data_missing = data is None and config.data_fingerprint is not None and not _loadable(config.dataset)
        user = user.for_resume(resume_dir, recorded, data_missing=data_missing)
    try:
        config, dataset = _user_data(config, data)
    except _OtherData:
        if resume_dir is None:
            raise
        # said with what differs ("clear data_fingerprint" is no step of a resume); config.json read again
        # only here, where the resume is refused
        given = as_dataset(data, config.num_classes, data.name if isinstance(data, Dataset) else "user")
        made_on = resume.read_record(resume_dir).get("dataset") or {}
        same = made_on and all(made_on.get(key) == value for key, value in _description(given).items())
        raise ConfigError(f"cannot resume {resume_dir!r} on this data: the run was made on "
                          f"{_described(made_on) if made_on else 'other data'}, and data= gives "
                          f"{'other values of the same sizes and shapes' if same else _described(_description(given))}"
                          f": pass the data the run was made on") from None
    return user.label(config), dataset, user


def _experiment(config: RunConfig, dataset: Dataset | None, user: UserInputs, resume_dir: str | None,
                loggers: list, recorded: dict | None) -> RunResult:
    """:func:`run_experiment` of a validated ``config`` naming its data and ``user``'s objects
    (``recorded``: a resumed run's record of them, read with its config). A resume holds the run
    directory's lock (:func:`jaxfl.resume.holding_lock`) from before any work to the run's end: a
    second process resuming it, or one running it, is refused in one line. The run reads and keeps
    its compiled programs in the process's temporary cache (:func:`jaxfl.compilation_cache.process_compilations`),
    unless a cache is configured already."""
    _refuse_without_jit(config)
    if resume_dir is not None:
        _check_algorithm_source(resume_dir, config)
    with process_compilations():
        return _experiment_cached(config, dataset, user, resume_dir, loggers, recorded)


def _experiment_cached(config: RunConfig, dataset: Dataset | None, user: UserInputs, resume_dir: str | None,
                       loggers: list, recorded: dict | None) -> RunResult:
    if jax.process_count() > 1:  # every process was given the same run, or none trains it
        cluster.check_same_run(_shared_settings(config), resume=resume_dir is not None)
        cluster.check_shared_folder(resume_dir if resume_dir is not None else config.output_dir)
    if resume_dir is None or jax.process_index() != 0:  # a new run takes it once its folder exists (_run)
        return _experiment_in(config, dataset, user, resume_dir, loggers, recorded)
    with resume.holding_lock(resume_dir):
        return _experiment_in(config, dataset, user, resume_dir, loggers, recorded)


def _shared_settings(config: RunConfig) -> dict:
    """The config every process of a cluster run must hold alike (:func:`jaxfl.cluster.check_same_run`):
    all of it but where each writes its own scratch files and the progress bar (process 0's); the
    checkpoints' layout and cadence included (collective)."""
    settings = config.to_dict()
    for name in ("output_dir", "progress"):
        _leave_out(settings, name)
    # a process with other numerics (JAX_ENABLE_X64 on one) computes otherwise; every value, so that the
    # refusal says both
    settings["jax"] = jax_settings()
    return settings


def _experiment_in(config: RunConfig, dataset: Dataset | None, user: UserInputs, resume_dir: str | None,
                   loggers: list, recorded: dict | None) -> RunResult:
    if loggers and config.timing_only:
        raise ValueError("loggers receive metrics rows, and a timing-only run evaluates nothing: drop the "
                         "loggers (--log-to) or run without timing_only")
    if resume_dir is None:  # (the jaxfl command checked it already; from Python it failed after the data were built)
        check_output_folder("output_dir", config.output_dir)
    user = user.check(config)
    given_again = (("data",) if dataset is not None else ()) + user.given_again()  # what an interrupt asks for
    registered = config.algorithm if ":" not in config.algorithm and \
        not get_algorithm(config.algorithm).__module__.startswith("jaxfl.") else None
    _release_earlier_runs()
    # the peak host memory from here on is this run's (its data and federation included), not that of
    # a larger run before it in this process (a sweep's cells, `jaxfl run --algorithm a,b`)
    _reset_peak_host_memory()
    try:
        config, dataset, federation, model, params = _prepare(config, dataset, user.model, user.init_params)
    except BaseException as error:  # a Ctrl-C reaching one process's shell too
        if jax.process_count() == 1:
            raise
        _agree_on_preparing(error)  # the others are told, not left waiting at their next collective
        raise
    if jax.process_count() > 1:
        _agree_on_preparing(None)
        # what each process read must be process 0's: a data file (its fingerprint in the prepared config),
        # the speeds file, the model's structure, the initial weights; a mix would train under process 0's name
        cluster.check_same_run({**_shared_settings(config), "user_inputs": user.record(params)},
                               resume=resume_dir is not None)
    if resume_dir is not None:
        user.check_resumed(resume_dir, recorded, params)
    user = dataclasses.replace(user, metric_names=user.check_functions(dataset.num_classes))
    if resume_dir is not None:
        user.check_resumed_metrics(resume_dir, recorded, dataset.num_classes)
    scratch = None
    output_dir = config.output_dir  # process 0's run directory goes there (the checkpoints of all processes)
    if jax.process_index() != 0:  # jaxfl.cluster: process 0 writes the run; the others a scratch folder
        scratch = tempfile.mkdtemp(prefix=f"jaxfl-process{jax.process_index()}-")
        config = dataclasses.replace(config, output_dir=scratch, progress=False)
        loggers = []  # process 0 logs the run
    located: dict = {}  # the run's folder, once it has one

    def interrupted(run_dir: str) -> RunInterrupted:  # what the run folder keeps
        return RunInterrupted(run_dir, None if config.timing_only else _newest_checkpoint(run_dir), config.timing_only,
                              given_again=given_again, keeps_checkpoints=_keeps_checkpoints(config),
                              follower=jax.process_index() != 0, registered=registered)

    def last_words() -> str | None:  # SIGTERM before the first event: what the run folder keeps, as Ctrl-C says
        return str(interrupted(located["run_dir"])) if "run_dir" in located else None

    try:
        with stopping.said_on_sigterm(last_words), \
                stopping.removed_on_sigterm(scratch) if scratch is not None else contextlib.nullcontext(), \
                contextlib.ExitStack() as accepting:  # _run enters it at the first event; it ends with the run
            result = _run(config, dataset, federation, model, params, resume_dir, user, loggers, output_dir, located,
                          accepting)
        if scratch is not None:  # the run's directory is process 0's: the scratch folder goes now
            result = dataclasses.replace(result, run_dir=located["run_dir"])
        return result
    except KeyboardInterrupt as interrupt:
        if isinstance(interrupt, RunInterrupted):
            interrupt.given_again, interrupt.registered = given_again, registered
        if isinstance(interrupt, RunInterrupted) or "run_dir" not in located:
            raise
        raise interrupted(located["run_dir"]) from None
    except OSError as error:  # a full disk while the logs are written: one line, as for a checkpoint
        if isinstance(error, checkpoint.DiskWriteError) or error.errno not in checkpoint.DISK_FULL_ERRNOS \
                or "run_dir" not in located:
            raise
        raise _log_write_error(error, interrupted(located["run_dir"])) from None
    except Exception as error:  # a collective whose peer is gone: what the run keeps, not jax's traceback
        if resume_dir is None and "run_dir" in located and jax.process_count() == 1 and \
                not located.get("events", lambda: 0)() and finished_summary(located["run_dir"]) is None:
            # an error before the run's first event (the user's loss or metrics at the first evaluation, a
            # model that fails to compile): nothing of it to keep or resume, and no folder of a config, a
            # lock and empty logs left beside the runs, which the same command again stepped around into -2
            # (a run stopped there, by a negative time drawn at its start, has its summary: it is kept)
            shutil.rmtree(located["run_dir"], ignore_errors=True)
            raise
        if not cluster.lost_peer(error) or "run_dir" not in located:
            raise
        kept = interrupted(located["run_dir"])
        raise cluster.PeerLost(f"another process of this cluster run ended ({str(error).strip().splitlines()[0]:.200}); "
                               f"{kept} (on every process, with the cluster flags)") from None
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _agree_on_preparing(error: BaseException | None) -> None:
    """In a cluster run, after each process built its data and model (``error``: why this one could not):
    a ConfigError on the processes that could, naming those that could not (collective), where they would
    wait at the next exchange until jax's shutdown barrier aborted them all minutes later."""
    built = cluster.all_processes(error is None)
    if error is None and not all(built):
        failed = ", ".join(str(index) for index, good in enumerate(built) if not good)
        raise ConfigError(f"process {failed} of this cluster run could not build the run's data or model (its own "
                          "output says why): every process reads the same data and builds the same model; nothing "
                          "was trained")


def _log_write_error(error: OSError, interrupted: RunInterrupted) -> "checkpoint.LogWriteError":
    """The one-line error of a run whose logs could not be written (``error``: the disk full, a quota,
    a file-size limit): which file, why, and what the run keeps and how it goes on, as an interrupt
    of it (``interrupted``) would say."""
    what = os.path.basename(error.filename) if error.filename else "the run's logs"
    return checkpoint.LogWriteError(f"could not write {what} in {interrupted.run_dir}: "
                                    f"{error.strerror or os.strerror(error.errno)}; once there is space: {interrupted}")


def _newest_checkpoint(run_dir: str) -> str | None:
    """The checkpoint folder a resume of ``run_dir`` would start from, or None."""
    try:
        # the run's own question (a stop, an interrupt), asked under its own lock or process 0's
        return resume.candidates(run_dir, warn=False, check_lock=False)[0]
    except resume.ResumeError:
        return None


def _run(config: RunConfig, dataset, federation, model, params, resume_dir: str | None,
         user: UserInputs = UserInputs(), loggers=(), shared_output_dir: str | None = None,
         located: dict | None = None, accepting: contextlib.ExitStack | None = None) -> RunResult:
    """Train ``config``'s run (or resume ``resume_dir``); ``located["run_dir"]`` is set to the run's
    folder as soon as it is chosen (what an interrupt names). From the first event on, a stop request
    (SIGTERM, :mod:`jaxfl.stopping`) is taken at the next event boundary, and after the last event the
    run finishes its final checkpoint and summary first: ``accepting`` (closed by the caller when
    the run has ended) holds :func:`jaxfl.stopping.accepting_stop_requests` until then."""
    located = {} if located is None else located
    if config.timing_only:
        if resume_dir is not None:
            raise ValueError("a timing-only run writes no checkpoints to resume from: run it again (it takes seconds)")
        return _run_timing_only(config, federation, params, user, located, shared_output_dir)
    wall_start = time.perf_counter()
    algorithm = build(config, client_samples=federation.counts)
    local_steps = algorithm.most_local_steps  # the most a dispatch takes: the plan's chunk, the engine's programs
    plan = ExecutionPlan.for_backend(jax.default_backend(), config.clients_per_call, config.steps_per_call,
                                     devices=config.devices, local_steps=local_steps)
    preprocess, augment = make_transforms(config, dataset)
    cpu_layers = _cpu_layers(config)
    user.check_optimizer(params)
    _refuse_adam_on_float16(config, user, params)
    trainer = make_client_trainer(model, user.client_optimizer or make_client_optimizer(
                                      config.client_optimizer, config.client_lr, config.client_momentum,
                                      config.client_weight_decay),
                                  config.batch_size, preprocess=preprocess,
                                  augment=augment, prox_mu=config.prox_mu,
                                  cpu_friendly_layers=cpu_layers, loss=user.loss)
    # FedAvgM's momentum is the algorithm's default for sgd; FedOpt's optimisers carry their own (b1)
    momentum = config.momentum if config.server_optimizer == "sgd" else 0.0
    server_optimizer = make_server_optimizer(config.server_optimizer, config.server_lr, momentum,
                                             b1=config.server_beta1, b2=config.server_beta2, tau=config.server_tau)
    policy = algorithm.policy()
    check_picklable(algorithm, policy)
    hooks = device_hooks(algorithm)
    speeds, faults = _speeds_and_faults(config, params, user.time_per_step, algorithm.local_steps)

    # Built before any file is touched: a run that cannot fit in memory fails before it writes
    # anything, and a resume restores its checkpoint into the engine's shapes and must know that the
    # checkpoint reads back before the logs are cut back to it. The recorder that receives each
    # version is attached once the logs are open.
    engine = Engine(trainer, params, FederatedArrays(federation.x, federation.y),  # the engine places them
                    federation.offsets, federation.counts, server_optimizer, seed=config.seed, plan=plan,
                    batching=config.batching, keep_start_versions=policy.needs_start_models,
                    memory_limit=None if config.memory_limit_mb is None else int(config.memory_limit_mb * 2**20),
                    sample_bytes=int(np.prod(dataset.input_shape)), hooks=hooks, client_state=config.client_state,
                    local_steps=local_steps, step_loop=config.step_loop)
    _UNFINISHED_ENGINES.add(engine)  # until _disconnect
    # near the end, what is trained ahead is what a copy of the schedule aggregates (Engine.between_events):
    # for jaxfl's own algorithms and policies (a plug-in's code may do more than schedule: count, print,
    # write, also in a staleness function it hands jaxfl's policy) whose schedule no model value moves
    engine.foresight_allowed = all(type(part).__module__.startswith("jaxfl.") for part in (algorithm, policy)) \
        and algorithm.schedule_depends_on_model(config, algorithm.options) is None
    if config.step_loop is None and engine.step_loop == "rolled" and config.steps_per_call is not None:
        warn_user(f"steps_per_call={config.steps_per_call} is not read: the step loop chosen for this model on "
                  f"{engine.home.platform} is rolled (one step compiled, the local steps looped); --step-loop "
                  "unrolled runs chunks of steps_per_call steps")
    engine.check_memory()

    # run_dir: where this process writes; shared_dir: the run's directory, where every process takes
    # part in writing and reading checkpoints (the same folder unless this is a process other than 0
    # of a run of several, which writes to a scratch folder)
    saved, extensions = None, []
    if resume_dir is None:
        user_inputs = user.record(params, dataset.num_classes)
        run_dir = _run_dir(config, algorithm.name, user_inputs)
        os.makedirs(run_dir)
        located["run_dir"] = run_dir
        try:
            if accepting is not None:  # no resume of it writes there while it runs (until the caller's end of the run)
                accepting.enter_context(resume.holding_lock(run_dir))
            user.save(run_dir)
            _write_run_config(run_dir, config, params, federation, plan, dataset=dataset,
                              user_inputs=user_inputs, log_to=logger_names(loggers))
        except BaseException as error:
            # nothing of the run yet (a full disk at its config, a Ctrl-C): no folder of a lock and a half-
            # written file left, which the same command again stepped around into a -2 folder
            shutil.rmtree(run_dir, ignore_errors=True)
            del located["run_dir"]
            if isinstance(error, OSError) and error.errno in checkpoint.DISK_FULL_ERRNOS:
                raise checkpoint.LogWriteError(
                    f"could not write the run's {os.path.basename(error.filename or 'config')} in {run_dir}: "
                    f"{error.strerror or os.strerror(error.errno)}; nothing of the run was kept (its folder is "
                    "removed): free space and start it again") from None
            raise
        shared_dir = run_dir
        if jax.process_count() > 1:  # process 0's folder name: it may end in -2, -3... (see _run_dir)
            shared_dir = os.path.join(shared_output_dir or config.output_dir,
                                      cluster.broadcast_text(os.path.basename(run_dir)))
        located["run_dir"] = shared_dir
    else:
        shared_dir = located["run_dir"] = resume_dir
        run_dir = resume_dir if jax.process_index() == 0 else _run_dir(config, algorithm.name)
        # (checked against the run's config: a process other than 0 has its scratch folder in output_dir)
        shared_config = dataclasses.replace(config, output_dir=shared_output_dir or config.output_dir)
        _, saved, device_tree = resume.load_checkpoint(shared_dir, shared_config, engine)
        if run_dir != shared_dir:
            os.makedirs(run_dir)
        else:
            extensions = list(saved.get("extensions") or [])
            held = saved["simulation"]
            if held.budgets != _budgets(config) or _past_its_target(held, config):
                # raised since the checkpoint (by this resume, or by one cut short before a checkpoint of its
                # own): before the logs are cut back to it (and a finished run's summary goes)
                extensions = _record_raised_budgets(run_dir, config, saved)
            _record_new_loggers(run_dir, loggers, held.version)
    engine.client_state.attach(os.path.join(run_dir, "client_state"))  # a memmap placement's files

    progress = _progress_bar(config, algorithm.name)
    metric_fields = METRIC_FIELDS + user.metric_names
    if saved is not None:  # a run begun by an older jaxfl (no balanced_accuracy column) keeps its columns
        metric_fields = csv_header(os.path.join(shared_dir, METRICS_NAME)) or metric_fields
    # a process other than 0 starts its scratch logs afresh (process 0 keeps the run's, cut back)
    events_file, metrics_file, class_file = _open_logs(run_dir, saved["offsets"] if saved and run_dir == shared_dir
                                                       else None, metric_fields, dataset.num_classes)
    close_errors: list[str] = []
    with contextlib.ExitStack() as closing:  # every file and logger is closed, also after an error
        # last of all: a run ending in an exception (an interrupt, a full disk) still says which logger
        # failed to close; a run that ends well says it once summary.json is written
        closing.push(lambda kind, error, trace: _warn_close_errors(close_errors, run_dir) if kind else None)
        for file in (events_file, metrics_file, class_file):
            if file is not None:
                closing.enter_context(file)
        loggers = open_loggers(loggers, run_dir, config.to_dict(), resumed=saved is not None,
                               offsets=saved.get("logger_offsets") if saved else None,
                               version=_last_logged_version(saved["recorder"]) if saved else None)
        for logger in loggers:
            closing.callback(_close_logger, logger, close_errors)
        events = events_file
        evaluate = held_out_evaluator(config, dataset, model, params, preprocess, user.loss, user.metrics)
        evaluation_batch = evaluate.batch_size
        recorder = _Recorder(config, evaluate,
                             metrics_file, progress, wall_start, params, flush_also=(events_file,),
                             extra_metrics=user.metric_names, loggers=loggers, class_file=class_file,
                             metric_fields=metric_fields)
        engine.on_version = recorder.on_version
        recorder.stats = engine.stats
        checkpoints = _Checkpointer(config, shared_dir, engine, recorder, events_file, metrics_file, saved,
                                    class_file)
        checkpoints.loggers = loggers  # log.csv's length goes into each checkpoint, to cut back to on resume
        checkpoints.extensions = extensions  # and the run's extensions, which a resume goes on with
        # the run's clock, a resumed run's going on from its checkpoint's seconds; over the number, not the
        # checkpointer, which would tie the engine to the recorder that keeps the clock
        wall_before = checkpoints.wall_before
        wall_clock = lambda: wall_before + time.perf_counter() - wall_start  # noqa: E731
        recorder.wall_clock = wall_clock
        if saved is None:
            simulation = Simulation(policy, speeds, federation.weights(config.client_weights), engine,
                                    max_time=config.max_time, max_updates=config.max_updates,
                                    log=events, faults=faults, on_nonfinite=config.on_nonfinite,
                                    after_event=checkpoints.after_event,
                                    max_client_updates=config.max_client_updates,
                                    max_client_steps=config.max_client_steps, wall_clock=wall_clock,
                                    client_lr_decay=config.client_lr_decay)
            recorder.simulation = simulation
            located["events"] = lambda: simulation.events_processed  # (a run that fails before any is not kept)
            if not config.eval_at_start:
                stop = None
                recorder.skip_grid_point(0.0)
            elif config.eval_interval is None:
                stop = recorder.record(0.0, 0, params)
            else:
                stop = recorder.evaluate_grid_until(0.0, 0, inclusive=True)
        else:
            simulation = saved["simulation"].attach(engine, events, checkpoints.after_event, wall_clock)
            simulation.set_budgets(*_budgets(config))  # raised since the checkpoint, in an extended run
            if _past_its_target(simulation, config):  # --no-stop-at-target since: it goes on from the stop
                simulation._stop_requested = None
            engine.restore(device_tree, saved["engine"], simulation.records)
            recorder.stats = engine.stats
            recorder.load_state_dict(saved["recorder"])
            recorder.simulation = simulation
            recorder.update_progress(simulation.now)
            stop = None
        error = None
        # one process alone can stop between any two events; several would have to agree on the event
        checkpoints.stoppable = jax.process_count() == 1
        if checkpoints.stoppable and accepting is not None:
            accepting.enter_context(stopping.accepting_stop_requests())
        try:
            reason = stop or simulation.run()
        except NumericalError as caught:
            error, reason = caught, f"numerical error: {caught}"
        except NegativeTimeError as caught:  # drawn as the run goes: the run stops there, as at a NaN
            error, reason = RunStopped(str(caught)), f"negative time: {caught}"
        end_time = simulation.now if reason != "time budget" else config.max_time
        # the final checkpoint's logs and evaluations end where the run stopped, before the final
        # evaluations below: a run taken on from it under a larger budget (an extension) goes on as
        # the larger budget's run, which evaluates at its own cadence, not at this stop
        stopped_at = checkpoints.positions() if error is None and config.final_checkpoint else None
        if reason == "target reached" and config.eval_interval is not None:
            # the grid point at which it was reached lies between the last event and the next one
            end_time = max(end_time, recorder.time_to_target)
        budget_spent = reason in ("time budget", "update budget", "client-update budget", "client-step budget") \
            or reason.startswith(NO_EVENTS_LEFT)
        if config.eval_interval is not None and error is None and budget_spent:
            recorder.evaluate_grid_until(end_time, simulation.version, inclusive=True)
            # a version after the last grid point the run reached: its final model, a row at the end
            recorder.record_final(simulation.version, engine.params, at=end_time)
        elif error is None and budget_spent:  # eval_every N: the final model too, whatever N
            recorder.record_final(simulation.version, engine.params)
        elif error is None and config.eval_interval is not None and reason.startswith("stopped by "):
            # a logger's stop at a grid point: written when the next version arrived, its aggregation
            # applied and counted; that final model too, a row at the end, so that final_accuracy is
            # the model the summary's updates, steps and time describe (not one version before)
            recorder.record_final(simulation.version, engine.params, at=end_time)
        if recorder.grid_stop is not None and error is None:  # the run stops as at a numerical error
            error, reason = RunStopped(recorder.grid_stop), f"evaluation grid: {recorder.grid_stop}"
        # a run that on_nonfinite='skip' stopped as diverged says so already
        if error is None and not reason.startswith("diverged") and not engine.params_finite():
            # its last aggregation made the model NaN/Inf and no client trained from it since (which
            # stops a run): the run ended on its budget with a diverged model, said as a run that stopped on it is
            error = engine.nonfinite_model_error(f"found at the end of the run, which stopped on: {reason}")
            reason = f"numerical error: {error}"
        elif error is None and not reason.startswith("diverged") and recorder.rows \
                and recorder.rows[-1]["version"] == simulation.version and len(recorder.rows) - 1 in recorder.unscored:
            # finite parameters so large that the model's outputs overflow: as diverged
            error = NumericalError(
                f"the global model (version {simulation.version}) gives NaN/Inf outputs for most held-out samples "
                f"at the end of the run, which stopped on: {reason}; its parameters are so large that its outputs "
                "overflow, as a diverging run's are: lower the learning rates (a server step or client updates "
                "too large)")
            reason = f"numerical error: {error}"
        if error is None and config.final_checkpoint:
            checkpoints.save(simulation, stopped_at)  # the final state: the run's model and a resumable point
        if progress is not None:
            if error is None:
                recorder.update_progress(end_time)
            progress.close()

    _disconnect(engine, simulation, recorder)
    _write_tables(run_dir, engine.tables)
    _warn_of_an_unused_server_optimizer(config, algorithm, engine.stats.server_steps, simulation.version)
    accuracies = [row["accuracy"] for row in recorder.rows]
    # a diverged model's evaluations (NaN/Inf outputs) are no result: its argmax scores one class's share
    unscored = set(recorder.unscored)
    scored = [row["accuracy"] for index, row in enumerate(recorder.rows) if index not in unscored]
    summary = {
        **_schedule_summary(config, algorithm, simulation, end_time, reason),
        "final_accuracy": accuracies[-1] if accuracies else None,
        # the end of the budget less one evaluation's swing (runlog.last_tenth_mean)
        "last_tenth_accuracy": last_tenth_mean(accuracies),
        "best_accuracy": max(scored) if scored else None,
        # the metrics.csv rows left out of best_accuracy and time_to_target, which that file does not mark
        "diverged_evaluations": [{"time": recorder.rows[index]["time"], "version": recorder.rows[index]["version"]}
                                 for index in sorted(unscored)],
        "final_balanced_accuracy": recorder.rows[-1].get("balanced_accuracy") if recorder.rows else None,
        "target_accuracy": config.target_accuracy, "time_to_target": recorder.time_to_target,
        "client_steps_aggregated": engine.stats.aggregated_steps,
        "client_steps_executed": engine.stats.useful_steps,
        # ≈ 1: the engine trains what aggregations use, not the backlog in flight (> 1: work trained
        # for updates the budget cut off; < 1 cannot happen)
        "executed_per_aggregated": round(engine.stats.useful_steps / engine.stats.aggregated_steps, 4)
        if engine.stats.aggregated_steps else None,
        "steps_computed_with_padding": engine.stats.executed_steps,
        # the calls' longest step counts summed: what a run's training time goes with on an
        # accelerator that a call does not fill (one client per call: every step in sequence)
        "steps_in_sequence": engine.stats.steps_in_sequence,
        "padding_waste": round(engine.stats.padding_waste, 6),
        "train_calls": engine.stats.train_calls,
        "mean_clients_per_batch": round(engine.stats.mean_clients_per_batch, 3),
        "calls_split_by_memory_guard": engine.split_calls,
        "compilations": dict(engine.stats.traces),
        "step_loop": engine.step_loop,  # unrolled chunks (convolutions on CPU, accelerators) or one rolled loop
        # where the wall time went: compiling the training programs, and training calls less their compilation
        # (the rest is the scheduler, aggregation, evaluation and writing)
        "compile_wall_s": round(engine.stats.compile_seconds, 3),
        "training_wall_s": round(engine.stats.train_seconds - engine.stats.compile_seconds, 3),
        "evaluation_wall_s": round(recorder.evaluation_seconds, 3),
        "evaluation_batch": evaluation_batch,  # held-out examples a batch (smaller on a CPU for im2col patches)
        "checkpoint_wall_s": round(checkpoints.seconds, 3),
        "checkpoints_written": checkpoints.saves,  # by this process, since its start or resume
        "resumes": checkpoints.resumes,
        "device_memory": {**engine.memory(), "backend_peak_bytes": _backend_peak_bytes()},
        # what trained it: the client axis was sharded over `devices` (every process's, in a cluster run)
        **_devices_of(engine),
        # the same, and the update from which, for every start and resume (more than one entry only
        # in a resumed run)
        "device_history": checkpoints.device_history,
        **_peak_host_memory_fields(),  # the run's peak where Linux can reset it at its start, with its scope
        "first_update_wall_s": recorder.first_update_wall,
        "wall_time_s": round(wall_clock(), 3),
        "log_bytes": log_sizes(run_dir),  # the logs as the run left them (a file cut afterwards is told)
        # each time its budgets were raised and it was taken on (jaxfl run --resume RUN --max-updates N)
        "extensions": extensions,
    }
    _write_json(os.path.join(run_dir, "summary.json"), summary)
    _warn_close_errors(close_errors, run_dir, complete=True)
    if error is not None:
        error.run_dir = run_dir  # what a caller (a comparison, a sweep) reads the run's summary from
        raise error
    return RunResult(run_dir, summary, recorder.rows, engine.params, simulation, engine)


def _last_logged_version(recorder_state: dict) -> int:
    """The step of the last metrics row a checkpoint holds (-1: none), from which a resumed run's loggers
    go on: on an ``eval_interval`` grid the rows of version V are written when version V+1 comes, after
    the checkpoint of version V, so the simulation's version would keep rows the resumed run writes again."""
    rows = recorder_state["rows"]
    return int(rows[-1]["version"]) if rows else -1


def _warn_close_errors(errors: list[str], run_dir: str, complete: bool = False) -> None:
    """One warning per logger whose ``close`` raised (:func:`_close_logger`); ``complete``: the run's
    summary is written."""
    for message in errors:
        where = f"the run's own files are complete ({run_dir})" if complete else f"the run's own files: {run_dir}"
        warn_user(f"{message}; {where}", RuntimeWarning)
    errors.clear()


def _close_logger(logger, errors: list[str]) -> None:
    """Close one logger; a ``close`` that raises (a service that cannot take the last points) is kept
    in ``errors`` for a warning once ``summary.json`` is written, not raised over the finished run."""
    try:
        logger.close()
    except Exception as caught:
        errors.append(f"logger {type(logger).__name__}'s close() raised {type(caught).__name__}: {caught}")


def _disconnect(engine: Engine, simulation: Simulation, recorder: "_Recorder") -> None:
    """Cut a finished run's callbacks (the recorder's, the checkpointer's, the wall clock: they write
    to logs that are closed now). They tie the engine, the simulation and the recorder into reference
    cycles, which only Python's full collection frees; cut, a dropped :class:`RunResult` frees the
    engine's compiled programs and device buffers at once."""
    engine.on_version = _keep_going
    simulation.attach(engine)  # no log, no after_event, no wall clock
    recorder.simulation = None
    _UNFINISHED_ENGINES.discard(engine)


def _keep_going(virtual_time: float, version: int, params) -> bool:
    """An engine's ``on_version`` once its run is over: never asks to stop."""
    return False


def _write_tables(run_dir: str, tables: dict[str, list[dict]]) -> None:
    """The hooks' tables of figures (:meth:`jaxfl.engine.Engine.record_row`) as ``RUN_DIR/NAME.csv``."""
    for name, rows in tables.items():
        fields = list(dict.fromkeys(key for row in rows for key in row))
        with open(os.path.join(run_dir, f"{name}.csv"), "w", newline="") as handle:
            writer = csv.DictWriter(handle, fields)
            writer.writeheader()
            writer.writerows(rows)


def _progress_bar(config: RunConfig, name: str):
    """A tqdm bar over the budget (:func:`budget_fraction`, in percent), or None with ``progress`` off.
    A run bounded only by its target counts global updates instead."""
    if not config.progress:
        return None
    if math.isinf(config.max_time) and not _count_budgets(config):
        return progress_bar(desc=name, unit="updates", leave=True)
    return progress_bar(total=100, desc=name, leave=True,
                        bar_format="{desc}: {percentage:3.0f}% of the budget|{bar}| [{elapsed}<{remaining}{postfix}]")


# How often a bar written to a file (a cluster job's log, nohup's) shows itself again: at tqdm's 0.1 s
# a day's run would leave 860,000 copies of its line in the log.
FILE_PROGRESS_INTERVAL_S = 30.0


def progress_bar(**options):
    """``tqdm.auto.tqdm(**options)``, refreshed at most every :data:`FILE_PROGRESS_INTERVAL_S` seconds where
    it writes to neither a terminal nor a notebook (a ``mininterval`` given wins).

    >>> import io
    >>> class Terminal(io.StringIO):
    ...     def isatty(self):
    ...         return True
    >>> to_file, to_terminal = progress_bar(total=3, file=io.StringIO()), progress_bar(total=3, file=Terminal())
    >>> to_file.mininterval, to_terminal.mininterval
    (30.0, 0.1)
    >>> to_file.close(); to_terminal.close()
    """
    from tqdm.auto import tqdm

    stream = options.get("file") or sys.stderr
    in_notebook = any(kind.__module__.startswith("tqdm.notebook") for kind in tqdm.__mro__)
    if not in_notebook and not (hasattr(stream, "isatty") and stream.isatty()):
        options.setdefault("mininterval", FILE_PROGRESS_INTERVAL_S)
    return tqdm(**options)


def _write_run_config(run_dir: str, config: RunConfig, params, federation, plan: ExecutionPlan | None,
                      dataset: Dataset | None = None, user_inputs: dict | None = None,
                      log_to: list[str] | None = None) -> None:
    """config.json: the resolved config, how it runs (no plan and no backend: timing only), versions,
    and what the data turned out to be (classes, sizes, the normalisation statistics used),
    and what the run took besides the config (``user_inputs``: names and fingerprints), and the
    named loggers (``log_to``: a resume goes on with them)."""
    described = {} if dataset is None else {"dataset": {
        "name": dataset.name, "kind": dataset.kind, **_description(dataset),
        "normalization": normalization_statistics(config, dataset)}}
    _write_json(os.path.join(run_dir, "config.json"), {
        "config": config.to_dict(), "execution_plan": None if plan is None else dataclasses.asdict(plan),
        "backend": None if config.timing_only else jax.default_backend(),
        **({"timing_only": True} if config.timing_only else {}),
        "versions": library_versions(),
        **({"jaxfl_source": code} if (code := jaxfl_source()) else {}),
        "jax": jax_numerics(),  # {} at jax's defaults; absent in a run recorded before 2026-12-05
        "xla_flags": xla_flags(),  # "" where none; absent in a run recorded before 2026-12-06
        "model_parameters": count_params(params["params"]),
        "model_state_values": count_params(params.get("state", {})), "client_samples": write_client_samples(run_dir, federation.counts),
        **described, **({"user_inputs": user_inputs} if user_inputs else {}),
        **({"log_to": log_to} if log_to else {}),
        **({"algorithm_source": source} if (source := algorithm_source(config.algorithm)) else {}),
        **({"model_source": source} if (source := model_source(config.model)) else {}),
        # what the config's relative paths (data_dir, file.py:Class) are relative to (resume checks it)
        "working_directory": os.getcwd()})


def _budgets(config: RunConfig) -> tuple:
    """The config's budgets as :meth:`Simulation.set_budgets` takes them (:attr:`Simulation.budgets`)."""
    return config.max_time, config.max_updates, config.max_client_updates, config.max_client_steps


def _past_its_target(simulation: Simulation, config: RunConfig) -> bool:
    """Whether ``simulation`` (restored) stopped on reaching its target accuracy, which the run's
    ``config`` no longer stops at (extended with ``--no-stop-at-target``)."""
    return not config.stop_at_target and simulation._stop_requested == "target reached"


# the loggers config.json recorded (its log_to), set by resume_experiment for the run it resumes: read once
_RECORDED_LOG_TO: contextvars.ContextVar[list | None] = contextvars.ContextVar("jaxfl_recorded_log_to", default=None)


def _record_new_loggers(run_dir: str, loggers: list, version: int) -> None:
    """Named loggers given to a resume that the run was not started with (``jaxfl run --resume RUN
    --log-to tensorboard``): ``config.json`` records them, so that a later resume goes on with them
    too, and a note says that they begin at the checkpoint's update (its earlier rows are in
    ``metrics.csv``). They went unsaid, and the next plain resume dropped them. Recorded ones left out
    of the loggers given are noted too: they log nothing of this resume."""
    before = _RECORDED_LOG_TO.get()  # config.json's log_to, as resume_experiment read it (None: not a resume of it)
    if before is None:
        return
    named = logger_names(loggers)
    new = [name for name in named if name not in before]
    # a built-in logger given as an object (WandbLogger(project=...)) logs as its name does
    given = set(named) | {getattr(logger, "name", None) for logger in loggers if not isinstance(logger, str)}
    left_out = [name for name in before if name not in given]
    if left_out:  # a resume given loggers without them: their logs miss this stretch
        warn_user(f"loggers {', '.join(left_out)} (--log-to), which run {run_dir} was started with, are not given "
                  f"to this resume: they log nothing from update {version} on until a resume gives them again "
                  f"(a resume given no loggers goes on with {', '.join(before + new)})")
    if not new:
        return
    path = os.path.join(run_dir, "config.json")
    with open(path) as handle:
        written = json.load(handle)
    _write_json(path, {**written, "log_to": before + new})
    warn_user(f"loggers {', '.join(new)} (--log-to) are new for run {run_dir}: they log the evaluations after "
              f"update {version}, where this resume starts (the rows up to it are in its metrics.csv); its "
              f"config.json now records {', '.join(before + new)}, which a later resume goes on with")


def _record_raised_budgets(run_dir: str, config: RunConfig, saved: dict) -> list[dict]:
    """The run's ``extensions`` (:func:`jaxfl.resume.extension_record`) as its ``config.json`` records them,
    with one more where ``config``'s budgets are larger than that file's (``jaxfl run --resume RUN --max-updates N``):
    ``config.json`` then records them (atomically), so that the run's config is the extended run's
    from here on (its resume, ``jaxfl run --config RUN/config.json``, a sweep's reuse). A finished
    run's final checkpoint from an older jaxfl holds its final evaluations, which stay in the logs:
    said as a :class:`jaxfl.resume.ResumeWarning`."""
    path = os.path.join(run_dir, "config.json")
    with open(path) as handle:
        written = json.load(handle)
    extensions = list(written.get("extensions") or [])
    settings = written["config"]
    before = {name: resume.recorded(settings, name) for name in resume.EXTENDABLE}
    resume.budgets_taken_on(before)
    raised = {name: (old, getattr(config, name)) for name, old in before.items() if old != getattr(config, name)}
    if not raised:
        return extensions
    simulation = saved["simulation"]
    summary = finished_summary(run_dir)
    stopped_here = summary is not None and summary.get("global_updates") == simulation.version
    if stopped_here and config.final_checkpoint and "before_final_evaluations" not in saved and \
            _evaluated_off_its_cadence_at(run_dir, config, simulation.version):
        warn_user(f"{run_dir}: its final checkpoint (update {simulation.version}) was written by an earlier jaxfl "
                  "after the run's final evaluation, so metrics.csv keeps that evaluation's row at the old stop "
                  "(a run made with the larger budget from the start evaluates at its cadence alone)", resume.ResumeWarning)
    # where it was taken on from: the stop as its summary said it (a time budget's end, not its last event's time)
    at = summary.get("virtual_time", simulation.now) if stopped_here else simulation.now
    extensions.append(resume.extension_record(raised, {"update": simulation.version, "virtual_time": at}))
    # the summary first: a run stopped between the two is an unfinished run of its old budgets (its
    # resume finishes it again; --max-updates N takes it on), not a finished one that says it has the new ones
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(run_dir, "summary.json"))
    for name, (_, value) in raised.items():
        settings = resume.with_recorded(settings, name, value)
    _write_json(path, {**written, "config": settings, "extensions": extensions})
    return extensions


def _evaluated_off_its_cadence_at(run_dir: str, config: RunConfig, version: int) -> bool:
    """Whether ``metrics.csv`` ends in an evaluation at update ``version`` (a finished run's stop) that
    the run's cadence would not have made: the final evaluation an older jaxfl wrote before its final
    checkpoint. Not one at an ``eval_every`` multiple or at a point of an ``eval_interval`` grid, and
    none at all where the jaxfl before 2026-11-30 evaluated no final model."""
    from jaxfl.runlog import read_metrics

    try:
        metrics = read_metrics(run_dir)
    except (OSError, ValueError):  # no readable log: said as before, where it could be
        return True
    versions = metrics["version"]
    if not len(versions) or versions[-1] != version:
        return False
    if config.eval_interval is None:
        return version % config.eval_every != 0
    points = float(metrics["time"][-1]) / config.eval_interval
    return not math.isclose(points, round(points), rel_tol=1e-9, abs_tol=1e-9)


def library_versions() -> dict[str, str | None]:
    """Versions of jaxfl and the libraries a run's numbers depend on, as recorded in config.json.

    >>> sorted(library_versions())
    ['flax', 'jax', 'jaxfl', 'jaxlib', 'numpy', 'optax', 'python']
    """
    from importlib import metadata

    import jaxfl

    def installed(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {"jaxfl": jaxfl.__version__, "jax": jax.__version__, "jaxlib": installed("jaxlib"),
            "flax": installed("flax"), "optax": optax.__version__, "numpy": np.__version__,
            "python": platform.python_version()}


def jaxfl_source() -> dict:
    """The git commit of the jaxfl that runs, where it runs from a git checkout (``pip install -e``):
    ``{"commit": SHA, "modified": bool}``, ``modified`` where files of the package differ from that
    commit; ``{}`` where jaxfl is installed from a release or git cannot tell. Recorded in
    ``config.json`` (``jaxfl_source``) and, for each stretch of a resumed run, in ``summary.json``'s
    ``device_history``: ``jaxfl.__version__`` names no commit. Read once per process, at its first run:
    a checkout changed after that (or between a notebook's import of jaxfl and its first run) is not seen.

    >>> set(jaxfl_source()) <= {"commit", "modified"}
    True
    """
    return dict(_read_jaxfl_source())


@functools.cache  # once per process, at its first run
def _read_jaxfl_source() -> dict:
    import subprocess

    package = os.path.dirname(os.path.abspath(__file__))

    def git(*arguments: str) -> str | None:
        try:
            # --no-optional-locks: git status refreshes the index under .git/index.lock otherwise, where a
            # git command of the user's own at that moment would fail
            done = subprocess.run(["git", "--no-optional-locks", "-C", package, *arguments], capture_output=True,
                                  text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):  # no git, or a repository too slow to read
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    # the package's own files tracked: not a repository of someone else's that holds an installed copy (a
    # virtual environment inside a project), nor one that vendors a copy (its commit is not jaxfl's)
    if git("ls-files", "--error-unmatch", "__init__.py") is None:
        return {}
    top = git("rev-parse", "--show-toplevel")
    try:
        with open(os.path.join(top or "", "pyproject.toml")) as handle:
            ours = re.search(r'^name\s*=\s*"jaxfl"', handle.read(), re.MULTILINE) is not None
    except OSError:
        ours = False
    if not ours:
        return {}
    commit, changes = git("rev-parse", "HEAD"), git("status", "--porcelain", "--", ".")
    if not commit or changes is None:
        return {}
    return {"commit": commit, "modified": bool(changes)}


def _warn_of_an_unused_server_optimizer(config: RunConfig, algorithm, server_steps: int, updates: int) -> None:
    """A server optimiser that changes something (not sgd at lr 1 without momentum) which no aggregation
    of the run applied: the algorithm sets the model itself (a mix, a hook's model, single updates).
    Built-in algorithms refuse such settings up front (``unread_settings``); a plug-in that does not
    declare them ran sweeps of identical cells, saying nothing."""
    # what the user set, not the algorithm's own (FedCompass+M's momentum 0.9 of a run still in its
    # single updates is no setting of theirs)
    momentum = config.server_momentum if config.server_optimizer == "sgd" else None
    if server_steps or not updates or (config.server_optimizer == "sgd" and config.server_lr == 1.0 and not momentum):
        return
    given = f"server_optimizer={config.server_optimizer!r}, server_lr={config.server_lr!r}" + \
        (f", server_momentum={momentum!r}" if momentum else "")
    warn_user(f"{given}: none of this run's {updates} aggregations applied the server optimiser ({algorithm.name} "
              "set the model itself: a mix, a hook's model or single updates), so these settings changed nothing"
              + ("" if algorithm.__module__.startswith("jaxfl.algorithms.") else
                 f"; {type(algorithm).__name__}.unread_settings can refuse them before a run"))


def _schedule_summary(config: RunConfig, algorithm, simulation: Simulation, end_time: float, reason: str) -> dict:
    """What the summary of every run, trained or timing-only, says about the run and its schedule."""
    return {"algorithm": algorithm.name, "dataset": config.dataset, "clients": config.clients,
            # given speeds (time_per_step) replace the model's draws: the config's model was not used
            "heterogeneity": "given" if getattr(simulation.speeds, "given", False) else config.heterogeneity,
            "seed": config.seed,
            "global_updates": simulation.version, "virtual_time": end_time, "stop_reason": reason,
            # the local steps of every update that reached the server, aggregated or dropped: what
            # the clients computed (client_steps_executed also holds what was trained ahead)
            "client_steps_arrived": simulation.arrived_steps,
            "negative_speed_draws": simulation.speeds.negative_draws,
            "faults": dict(simulation.faults.counts) if simulation.faults is not None else {},
            "accounting": simulation.accounting(),
            "policy": _plain(simulation.policy.summary()) if hasattr(simulation.policy, "summary") else {},
            "timeline": simulation.timeline(end_time)}


def _plain(value):
    """``value`` with its NumPy and jax arrays and scalars as Python lists and numbers, for summary.json:
    a plug-in policy's ``summary()`` holding an array was written as its elided text ("[0.6 0.33 ...]").

    >>> _plain({"rates": np.array([0.5, 0.25]), "last": np.float32(0.5), "n": (np.int64(2),)})
    {'rates': [0.5, 0.25], 'last': 0.5, 'n': [2]}
    """
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        return np.asarray(value).tolist()
    return value


def _backend_peak_bytes() -> int | None:
    """The allocator's peak on the default device where the backend reports one (GPU, TPU)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # backends without memory statistics
        return None
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


# What peak_host_memory_mb covers: "run" once _reset_peak_host_memory has started the peak afresh for
# the run in progress, "process" where it could not (the process's peak since its start, which a
# run after a larger one in the same process, a sweep's cells or `jaxfl run --algorithm a,b`, reports
# as its own). Set at each run's start: runs in threads of one process at once would reset each other's
# peak (jaxfl runs one run at a time in a process; a parallel sweep's cells are processes of their own).
_peak_scope = {"scope": "process"}

# How far VmHWM may sit above VmRSS right after a reset (other threads allocating between the two
# reads of /proc/self/status) for the reset still to count as done.
_RESET_SLACK_KB = 16 * 1024


def _memory_status() -> dict[str, int]:
    """VmHWM and VmRSS (KiB) from /proc/self/status; {} where there is none (not Linux)."""
    try:
        with open("/proc/self/status") as handle:
            return {line.split(":")[0]: int(line.split()[1]) for line in handle if line.startswith(("VmHWM", "VmRSS"))}
    except (OSError, ValueError, IndexError):
        return {}


def _reset_peak_host_memory() -> str:
    """Start the process's peak resident memory afresh at a run's start, so that the run's
    ``peak_host_memory_mb`` is its own and not the largest of the runs before it in the same process;
    returns the scope the figure will have (``"run"``, or ``"process"`` where it cannot be reset),
    also recorded for :func:`_peak_host_memory_mb`.

    Linux resets the high-water mark (VmHWM) when "5" is written to /proc/self/clear_refs (Linux 4.0
    and later); the reset counts as done when VmHWM then sits at the resident size (VmRSS), or where
    nothing above it was there to forget. Elsewhere (macOS, /proc not writable, an older kernel) the
    figure stays the process's peak.

    >>> _reset_peak_host_memory() in ("run", "process") and _peak_scope["scope"] == _reset_peak_host_memory()
    True
    """
    before = _memory_status()
    scope = "process"
    if before:
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
        except OSError:
            pass
        else:
            after = _memory_status()
            floor = max(before["VmRSS"], after["VmRSS"]) + _RESET_SLACK_KB
            # forgotten, or there was no peak above the resident size to forget
            scope = "run" if after["VmHWM"] <= floor or before["VmHWM"] <= floor else "process"
    _peak_scope["scope"] = scope
    return scope


def _peak_host_memory_mb() -> float:
    """The peak resident memory (MB) of the run in progress since :func:`_reset_peak_host_memory`
    at its start, or of the process where that could not reset it (:func:`_peak_host_memory_fields`
    says which): VmHWM on Linux, ``ru_maxrss`` elsewhere.

    >>> _ = _reset_peak_host_memory()
    >>> 0 < _peak_host_memory_mb() < 1e7
    True
    """
    status = _memory_status()
    if "VmHWM" in status:  # the high-water mark clear_refs resets, read as the kernel keeps it
        return round(status["VmHWM"] / 1024, 1)
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / 1024 / (1024 if sys.platform == "darwin" else 1), 1)  # bytes on macOS, KiB on Linux


def _peak_host_memory_fields() -> dict:
    """The summary's host-memory figures: ``peak_host_memory_mb`` (:func:`_peak_host_memory_mb`) and
    ``peak_host_memory_scope``, what it covers: ``"run"`` (since the run started, or since its resume
    in this process; what the process held already at that start is in it, as resident memory is the
    process's) or ``"process"`` (since the process started: the largest of every run it made so far).

    >>> _ = _reset_peak_host_memory()
    >>> sorted(_peak_host_memory_fields())
    ['peak_host_memory_mb', 'peak_host_memory_scope']
    """
    return {"peak_host_memory_mb": _peak_host_memory_mb(), "peak_host_memory_scope": _peak_scope["scope"]}


def _run_timing_only(config: RunConfig, federation, params, user: UserInputs = UserInputs(),
                     located: dict | None = None, shared_output_dir: str | None = None) -> RunResult:
    """The schedule alone: the scheduler, speed models, faults and the algorithm's policy on the
    virtual clock with no training and no model on a device. The event log is the one the training
    run of the same config and seed writes (for an algorithm whose schedule does not depend on model
    values, see :meth:`~jaxfl.algorithms.Algorithm.schedule_depends_on_model`), provided no update
    of that run is NaN/Inf and it does not stop at its target accuracy."""
    wall_start = time.perf_counter()
    algorithm = build(config, client_samples=federation.counts)
    policy = algorithm.policy()
    speeds, faults = _speeds_and_faults(config, params, user.time_per_step, algorithm.local_steps)
    user_inputs = user.record(params)
    run_dir = _run_dir(config, algorithm.name, user_inputs)
    os.makedirs(run_dir)
    if located is not None:  # a cluster's process other than 0 writes a scratch folder: the run is process 0's
        located["run_dir"] = run_dir if jax.process_count() == 1 else os.path.join(
            shared_output_dir or config.output_dir, cluster.broadcast_text(os.path.basename(run_dir)))
    user.save(run_dir)
    _write_run_config(run_dir, config, params, federation, plan=None, user_inputs=user_inputs)
    backend = TimingBackend()

    def stop_if_requested(simulation: Simulation) -> None:
        # SIGTERM (or request_stop) between two events: the logs closed there, as Ctrl-C leaves them
        # (SIGTERM had ended the process at once, and its event log's buffered rows with it)
        if stopping.stop_requested() is not None:
            raise RunInterrupted(run_dir, None, timing_only=True, reason=stopping.take_stop_request())

    # no evaluations: no class_accuracy.csv
    events, metrics_file, _ = _open_logs(run_dir, None, expected_rows=_expected_event_rows(config, policy))
    with events, metrics_file:
        simulation = Simulation(policy, speeds, federation.weights(config.client_weights), backend,
                                max_time=config.max_time, max_updates=config.max_updates, log=events,
                                faults=faults, on_nonfinite=config.on_nonfinite,
                                max_client_updates=config.max_client_updates,
                                max_client_steps=config.max_client_steps,
                                wall_clock=lambda: time.perf_counter() - wall_start,
                                client_lr_decay=config.client_lr_decay,
                                after_event=stop_if_requested if jax.process_count() == 1 else None)
        scheduler_start = time.perf_counter()
        error = None
        try:  # one process alone can stop between any two events (as a training run; several would have to agree)
            with stopping.accepting_stop_requests() if jax.process_count() == 1 else contextlib.nullcontext():
                reason = simulation.run()
        except NegativeTimeError as caught:  # as the training run stops: logs kept, a summary, RunStopped
            error, reason = RunStopped(str(caught)), f"negative time: {caught}"
        scheduler_seconds = time.perf_counter() - scheduler_start
    end_time = simulation.now if reason != "time budget" else config.max_time
    summary = {
        **_schedule_summary(config, algorithm, simulation, end_time, reason), "timing_only": True,
        "client_steps_aggregated": backend.aggregated_steps,
        "scheduler_seconds": round(scheduler_seconds, 3),
        "events_per_second": round(simulation.events_processed / max(scheduler_seconds, 1e-9), 1),
        **_peak_host_memory_fields(),
        "wall_time_s": round(time.perf_counter() - wall_start, 3),
        "log_bytes": log_sizes(run_dir),
    }
    _write_json(os.path.join(run_dir, "summary.json"), summary)
    if error is not None:
        error.run_dir = run_dir
        raise error
    return RunResult(run_dir, summary, [], None, simulation, None)


def resume_experiment(run_dir: str, progress: bool | None = None, overrides: dict | None = None, *,
                      data=None,
                      model=None,
                      client_optimizer=None,
                      init_params=None,
                      time_per_step=None,
                      loss=None,
                      metrics=None,
                      loggers=None,
                      spelling=None,
                      again_if_finished: bool = True) -> RunResult:
    """Continue the run in ``run_dir`` from its newest readable checkpoint (``jaxfl run --resume RUN_DIR``).

    The run keeps the config it was started with: ``overrides`` (config-file names, as flags give
    them) that would change it are refused, as is a ``config.json`` edited since the checkpoint was
    written, a run without checkpoints, or one whose checkpoints all fail to read back — each with a
    one-line :class:`jaxfl.resume.ResumeError`. Its budgets (:data:`jaxfl.resume.BUDGETS`) may be
    raised: ``overrides={"max_updates": 600}`` takes a run that stopped on its update budget of 300
    on from its final checkpoint (an extension, recorded in ``config.json`` and ``summary.json`` as
    ``extensions``), as the run with the larger budget would have gone on, and
    ``overrides={"stop_at_target": False}`` takes a run that stopped at its target past it; a budget
    the run has reached already, and a run that stopped on something else (a numerical error), are
    refused. A checkpoint that does not read back is skipped for
    the one before it with a :class:`jaxfl.resume.ResumeWarning`. A run on data passed in Python
    needs that data again as ``data=`` (refused if its fingerprint differs from the one the run recorded).

    A run made with Python objects (``run_experiment(model=..., client_optimizer=..., loss=...,
    metrics=...)``) needs them again, and is refused with the list of what is missing; the speeds
    array is read back from the run directory (``time_per_step``, if given, must equal it);
    ``init_params`` are not needed (the checkpoint holds the model) and, if given, must be the run's. ``loggers`` as in :func:`run_experiment` (they see the rows from the checkpoint on);
    None: the named loggers the run was started with (``config.json``'s ``log_to``), whose files
    (``log.csv``, TensorBoard's events) are cut back to the checkpoint and continued.
    ``spelling(name, value)`` writes a refused override as the user gave it (``jaxfl run --resume``:
    as its flag). A run that has finished (its ``summary.json`` is written) is run from its newest
    checkpoint again; with ``again_if_finished=False`` (``jaxfl run --resume``) it is a
    :class:`jaxfl.resume.RunFinished` instead, after the checks of the flags, and the run is left untouched.

    >>> resume_experiment("runs/no-such-run")
    Traceback (most recent call last):
    jaxfl.resume.ResumeError: cannot resume 'runs/no-such-run': no such directory
    """
    run_dir = user_path(run_dir)
    overrides = dict(overrides or {})
    # config.json read once and the config validated once, here, with what a resume may set afresh
    may_differ = {} if progress is None else {"progress": progress}
    for name in [name for name in overrides if name.replace("-", "_") in resume.MAY_DIFFER]:
        may_differ[name.replace("-", "_")] = overrides.pop(name)
    config, recorded, written = resume.read_run_and_record(run_dir, may_differ)
    if loggers is None:  # the loggers the run was started with (--log-to) go on logging it
        loggers = written.get("log_to") or None
    if data is not None and config.data_fingerprint is None:
        raise resume.ResumeError(f"cannot resume {run_dir!r} with data=: it was made on dataset {config.dataset!r}, "
                                 "loaded by name, not on data passed in Python; resume it without data=")
    changed, overrides = resume.budget_changes(config, overrides, spelling)
    resume.refuse_changes(config, overrides, spelling)
    if changed:  # taken on under larger budgets: a finished run goes on from its stop, not just re-finished
        resume.check_extension(run_dir, config, changed, spelling)
        with warnings.catch_warnings():  # said when the run's config was validated
            warnings.simplefilter("ignore")
            config = config_from_mapping({name: new for name, (_, new) in changed.items()}, base=config)
    # its checkpoints were written under the budgets it raises: theirs, not an edited config.json's
    with resume.raising_budgets(changed):
        _refuse_other_jax_numerics(run_dir, written.get("jax"))
        ended = resume.finished_run(run_dir)
        finished = None if again_if_finished or changed else ended
        if finished is None:  # a finished run left as it is computes nothing
            say_other_xla_flags(run_dir, written.get("xla_flags"), "resumes it")
        if config.timing_only:  # no checkpoint to resume from, by design: said so, not as a damaged run
            if finished is not None:
                raise finished
            raise resume.ResumeError(f"cannot resume {run_dir!r}: a timing-only run writes no checkpoints (it runs again "
                                     f"in a fraction of a training run's time); run its config again: jaxfl run --config "
                                     f"{os.path.join(run_dir, 'config.json')}")
        if ended is not None and not os.path.isdir(os.path.join(run_dir, "checkpoints")):
            # finished without checkpoints: not "killed before its first checkpoint"
            asked = _keeps_checkpoints(config)
            again = (f"run its config again with the larger budget: {resume.run_again(run_dir, changed)}" if changed
                     else "start the run again")
            raise finished or resume.ResumeError(
                f"cannot resume {run_dir!r}: it has finished and has no checkpoints/ folder to run again from ("
                + ("deleted, or the run stopped before its first checkpoint" if asked else
                   "it asked for none: checkpoint_every none and no final checkpoint") + f"): {again}")
        resume.check_config(run_dir, config)  # no checkpoint, or an edited config.json: say so before any work
        if finished is not None:
            raise finished
        loggers = check_loggers(loggers)
        user = UserInputs(model=model, client_optimizer=client_optimizer, init_params=init_params,
                          time_per_step=time_per_step, loss=loss, metrics=metrics)
        # the run's config names its data and objects as the recorded run did (for_resume checks the
        # objects' names against the record): it stays as validated
        config, dataset, user = _with_inputs(config, data, user, run_dir, recorded)
        recorded_log_to = _RECORDED_LOG_TO.set(list(written.get("log_to") or []))
        try:
            return _experiment(config, dataset, user, run_dir, loggers, recorded)
        finally:
            _RECORDED_LOG_TO.reset(recorded_log_to)


def _devices_of(engine: Engine) -> dict:
    """What trains a run in this process: backend, devices the client axis is sharded over, processes,
    and on a CPU the cores the process may use (XLA:CPU splits a convolution's sums over its threads:
    a CNN's steps on 1 core and on 2 differ in float32's last digits, on as many devices)."""
    import jax

    from jaxfl._devices import usable_cores

    backend = jax.default_backend()
    return {"backend": backend, "devices": int(engine.mesh.size), "processes": engine.processes,
            **({"cpu_cores": usable_cores()} if backend == "cpu" else {})}


def _say_other_devices(run_dir: str, before: dict, now: dict) -> None:
    """Warn where a run resumes on another backend or device count than trained its last stretch (the
    environment's cores, ``--devices``, ``JAXFL_CPU_DEVICES``, another machine): each call's updates are
    then summed in another order, so the run goes on equal to an uninterrupted one only to float32
    rounding. A stretch of a jaxfl that did not record its devices is not compared."""
    # (cores: recorded since 2026-12-07; a stretch without them is compared by its devices alone)
    cores = [stretch.get("cpu_cores") for stretch in (before, now)]
    other_cores = None not in cores and cores[0] != cores[1]
    if before.get("devices") is None or \
            ((before["backend"], before["devices"]) == (now["backend"], now["devices"]) and not other_cores):
        return
    if before["from_update"] >= now["from_update"]:  # a stretch that aggregated nothing (cut before its first update)
        return

    def said(stretch):
        on_cores = f" on {stretch['cpu_cores']} core{'s' * (stretch['cpu_cores'] != 1)}" if other_cores else ""
        return f"{stretch['devices']} {stretch['backend']} device{'s' * (stretch['devices'] != 1)}{on_cores}"

    updates = (f"its updates up to {now['from_update']} were" if not before["from_update"] else
               f"its updates {before['from_update'] + 1} to {now['from_update']} (the stretch before this one) were")
    if (before["backend"], before["devices"]) != (now["backend"], now["devices"]):
        order = "the sums of each call's updates go in another order, so from here the run agrees"
    else:  # the cores alone: an MLP's steps are the same bits, a convolution's sums are split over the threads
        order = ("XLA:CPU splits a convolution's sums over other threads, so from here a convolutional model's "
                 "run agrees")
    warn_user(f"{run_dir} resumes on {said(now)}; {updates} trained on {said(before)}: {order} with an "
              "uninterrupted one to float32 rounding, not bit for bit (summary.json's device_history records "
              "each stretch)", resume.ResumeWarning)


def _source_of_this_stretch() -> dict:
    """The device_history entry's record of the code: the commit where jaxfl runs from a checkout."""
    source = jaxfl_source()
    return {"jaxfl_commit": source["commit"], "jaxfl_modified": source["modified"]} if source else {}


# a device_history entry for the updates before a checkpoint of a jaxfl that did not record it
_UNKNOWN_DEVICES = {"from_update": 0, "backend": None, "devices": None, "processes": None}


class _Checkpointer:
    """Saves a checkpoint between events every ``checkpoint_every`` global updates, once at least
    ``checkpoint_min_interval_s`` wall seconds have passed since the last one (or the run's start)."""

    def __init__(self, config, run_dir, engine, recorder, events_file, metrics_file, saved, class_file=None):
        self.config, self.run_dir, self.engine, self.recorder = config, run_dir, engine, recorder
        self.events, self.metrics, self.classes = events_file, metrics_file, class_file
        self.last_version = saved["simulation"].version if saved else 0
        self.resumes = saved["resumes"] + 1 if saved else 0
        self.wall_before = saved["wall_time"] if saved else 0.0
        # what trained each stretch of the run: a resume may run on other devices (--devices, another
        # machine); a checkpoint of an older jaxfl did not say what trained the updates before it
        self.device_history = list(saved.get("device_history") or [_UNKNOWN_DEVICES]) if saved else []
        self.device_history.append({"from_update": self.last_version, **_devices_of(engine),
                                    "versions": library_versions(), **_source_of_this_stretch()})
        if saved:  # against the last stretch that aggregated updates (a stretch may end before its first)
            now = self.device_history[-1]
            before = next((stretch for stretch in reversed(self.device_history[:-1])
                           if stretch["from_update"] < now["from_update"]), self.device_history[-2])
            _say_other_devices(run_dir, before, now)
        self.seconds = 0.0  # wall seconds spent writing checkpoints in this process
        self.saves = 0  # checkpoints written by this process
        self.min_interval = checkpoint_min_interval(config)
        self._started = self._last_save = time.perf_counter()
        self._declined_at = -1  # a cluster run's cadence point at which process 0's clock said "not yet"
        # what every checkpoint stores of the config (a resume refuses an edited config.json): the
        # config does not change during a run, so it is resolved and hashed once
        self.stored_config = resume.checkpoint_config(config)
        self.stoppable = False  # True while a stop may be requested between events (one process alone)
        self._saved_after_event = -1  # simulation.events_processed at the newest checkpoint of this process
        self.loggers = []  # the run's loggers (log.csv's length is recorded with each checkpoint)
        self.extensions = []  # each time the run's budgets were raised (_record_raised_budgets)

    def stop_here(self, simulation: Simulation) -> None:
        """The stop :func:`jaxfl.stopping.request_stop` asked for: a checkpoint of this point between
        two events (unless the run keeps none: ``checkpoint_every`` and ``final_checkpoint`` off),
        then :class:`RunInterrupted`, naming it."""
        reason = stopping.take_stop_request()
        keeps = _keeps_checkpoints(self.config)
        if keeps and self._saved_after_event != simulation.events_processed:
            self.save(simulation)
        raise RunInterrupted(self.run_dir, _newest_checkpoint(self.run_dir), reason=reason, keeps_checkpoints=keeps)

    def after_event(self, simulation: Simulation) -> None:
        # first: a checkpoint written here holds the grid's decision, which a resumed run does not retake
        self.recorder.stop_at_grid_target(simulation)
        if self.stoppable and stopping.stop_requested() is not None:
            self.stop_here(simulation)
        every = self.config.checkpoint_every
        if every is None or simulation.version < max(self.last_version, self._declined_at) + every:
            return
        due = time.perf_counter() - self._last_save >= self.min_interval
        if jax.process_count() > 1 and self.min_interval > 0:
            # every process saves together (orbax's save is collective), but each has its own clock:
            # process 0's decides, once a cadence point, and one declined waits for the next point
            due = cluster.all_processes(due)[0]
            if not due:
                self._declined_at = simulation.version
        if due:
            self.save(simulation)

    def positions(self) -> dict:
        """Where the run's logs and evaluations are now: what a checkpoint taken here records, to cut
        back to on resume (``save(simulation, positions)`` records an earlier point's)."""
        # the logs on the disk up to the offsets the checkpoint records (which fsyncs itself): else a
        # machine's crash could keep the checkpoint and lose the logs' ends (resume skips it then)
        self.metrics.flush()
        os.fsync(self.metrics.fileno())
        offsets = {"events": self.events.position(sync=True), METRICS_NAME: self.metrics.tell()}
        if self.classes is not None:
            self.classes.flush()
            os.fsync(self.classes.fileno())
            offsets[CLASS_ACCURACY_NAME] = self.classes.tell()
        return {"recorder": self.recorder.state_dict(), "offsets": offsets,
                "logger_offsets": logger_offsets(self.loggers, self.run_dir)}

    def save(self, simulation: Simulation, positions: dict | None = None) -> None:
        """A checkpoint of the run now; ``positions`` (from :meth:`positions`): the logs and evaluations
        it records are those of that earlier point between the same two events (the final checkpoint's,
        before the final evaluations)."""
        started = time.perf_counter()
        extra = {**(positions or self.positions()), "resumes": self.resumes, "device_history": self.device_history,
                 "extensions": self.extensions, "wall_time": self.wall_before + time.perf_counter() - self._started}
        if positions is not None:  # what tells it from an older jaxfl's final checkpoint, whose rows end in them
            extra["before_final_evaluations"] = True
        checkpoint.save(self.run_dir, simulation.version, simulation, self.engine, extra, config=self.stored_config)
        self.last_version = simulation.version
        self._saved_after_event = simulation.events_processed
        self.saves += 1
        self._last_save = time.perf_counter()
        self.seconds += self._last_save - started
