"""Metrics loggers: each evaluation of a run handed, as it happens, to TensorBoard, a CSV file,
Weights & Biases or your own code (the callbacks of Apple's pfl, "pfl: simulation framework for
accelerating research in private federated learning", 2024, play the same part).

A logger is any object with ``log(row, step)`` and ``close()`` (:class:`MetricsLogger`); give a list
to ``run_experiment(config, loggers=[...])``, or names on the command line (``jaxfl run --log-to
tensorboard,csv``; names are built into the run directory: ``RUN_DIR/tensorboard/``,
``RUN_DIR/log.csv``, W&B's run under ``RUN_DIR``). ``row`` is the metrics row just written to
``metrics.csv`` (``time`` in virtual seconds, ``version``, ``accuracy``, ``balanced_accuracy``, ``loss``,
``client_steps``, ``wall_time``) plus ``client_updates`` (client updates aggregated so far); ``step`` is the global
version. A ``log`` that returns True stops the run after the current event, with stop reason
``"stopped by NAME"`` (the logger's ``name`` attribute, else its class name): early stopping on
any rule (in a run of several processes, :mod:`jaxfl.cluster`, the loggers run on process 0 and
its request stops every process at the same event). A logger may also have ``start(run_dir, config)``, called once the run directory exists
(``config`` is the resolved config as a dict).

>>> import jaxfl, tempfile
>>> class StopAtLoss:
...     name = "loss rule"
...     def log(self, row, step):
...         return row["loss"] < 10.0  # any loss stops it: a demonstration
...     def close(self):
...         pass
>>> result = jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedavg", clients=3, model="logreg",
...     local_steps=2, max_updates=3, eval_at_start=False, progress=False, output_dir=tempfile.mkdtemp()),
...     loggers=[StopAtLoss()])
>>> result.summary["stop_reason"], result.summary["global_updates"]
('stopped by loss rule', 1)
"""
from __future__ import annotations

import contextlib
import csv
import importlib
import importlib.util
import json
import math
import numbers
import os
import secrets
import time
from typing import Any, Protocol, runtime_checkable

from jaxfl._user_warnings import warn_user

LOGGER_NAMES = ("tensorboard", "csv", "wandb")
# TensorBoard event writers, lightest first; torch's needs the tensorboard package as well.
_TENSORBOARD_WRITERS = (("tensorboardX", "SummaryWriter"), ("torch.utils.tensorboard", "SummaryWriter"))
_TENSORBOARD_INSTALL = "pip install tensorboardX (or pip install 'jaxfl[tensorboard]')"


@runtime_checkable
class MetricsLogger(Protocol):
    """What a run hands its metrics to: ``log(row, step)`` for each evaluation (return True to stop
    the run), ``close()`` at the end (also after an error).

    >>> isinstance(CSVLogger("/tmp/jaxfl-doc-log.csv"), MetricsLogger)
    True
    """

    def log(self, row: dict, step: int) -> bool | None: ...

    def close(self) -> None: ...


class CSVLogger:
    """Rows as CSV at ``path``, one per evaluation, flushed as they come; the header is the first
    row's keys (later rows with other keys are refused rather than written misaligned).

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "log.csv")
    >>> logger = CSVLogger(path)
    >>> logger.log({"version": 1, "accuracy": 0.5}, step=1); logger.close()
    >>> open(path).read().splitlines()
    ['version,accuracy', '1,0.5']
    """

    name = "csv"

    def __init__(self, path: str, append: bool = False, offset: int | None = None):
        """``append``: continue the file at ``path`` (a resumed run's); ``offset``: cut it back to that
        many bytes first (what :meth:`position` said at the checkpoint the run resumes from), so
        that rows written after it, which the resumed run writes again, are not doubled."""
        self.path = path
        if append and offset is not None and os.path.isfile(path) and os.path.getsize(path) >= offset:
            with open(path, "r+b") as handle:
                handle.truncate(offset)
        self.append = append and os.path.isfile(path) and os.path.getsize(path) > 0
        self._handle = None
        self._writer = None

    def position(self) -> int:
        """The file's length in bytes with every row so far on the disk (a checkpoint records it)."""
        if self._handle is not None:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            return self._handle.tell()
        return os.path.getsize(self.path) if self.append and os.path.isfile(self.path) else 0

    def log(self, row: dict, step: int) -> None:
        if self._writer is None:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._handle = open(self.path, "a" if self.append else "w", newline="")
            self._writer = csv.DictWriter(self._handle, list(row))
            if not self.append:
                self._writer.writeheader()
        self._writer.writerow(row)
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = self._writer = None


def tensorboard_writer_class():
    """The installed TensorBoard ``SummaryWriter`` (tensorboardX's, else torch's), or ImportError
    saying what to install.

    >>> try:
    ...     writer = tensorboard_writer_class()
    ... except ImportError as error:
    ...     assert "tensorboardX" in str(error)
    """
    for module_name, attribute in _TENSORBOARD_WRITERS:
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except ImportError:  # torch.utils.tensorboard raises it when tensorboard is missing
            continue
    raise ImportError(f"TensorBoardLogger needs a TensorBoard event writer and none is installed: "
                      f"{_TENSORBOARD_INSTALL}")


class TensorBoardLogger:
    """Every numeric value of each row as a TensorBoard scalar (tag = the column name) at
    ``step`` = the global version, in event files under ``log_dir``; ``tensorboard --logdir``
    shows them. Writes with tensorboardX (or torch's writer); which is installed is checked here,
    before the run starts.

    >>> try:
    ...     import tempfile
    ...     logger = TensorBoardLogger(tempfile.mkdtemp())
    ...     logger.log({"accuracy": 0.5, "time": 12.0}, step=1); logger.close()
    ... except ImportError as error:  # no event writer installed
    ...     assert "pip install tensorboardX" in str(error)
    """

    name = "tensorboard"

    def __init__(self, log_dir: str, purge_step: int | None = None):
        """``purge_step``: a resumed run's first step after its checkpoint; TensorBoard drops the
        points the interrupted run wrote from that step on (the resumed run writes them again)."""
        self.log_dir = log_dir
        self.purge_step = purge_step
        self._writer_class = tensorboard_writer_class()
        self._writer = None

    def log(self, row: dict, step: int) -> None:
        if self._writer is None:
            # an event file is named by the second it was opened in: a resumed run's writer opened within
            # the interrupted one's second took its name and truncated it. The nanoseconds keep each
            # file its own and in order (TensorBoard reads a folder's files in name order).
            self._writer = self._writer_class(self.log_dir, filename_suffix=f".{time.time_ns():020d}",
                                              **({} if self.purge_step is None else {"purge_step": self.purge_step}))
        for key, value in row.items():
            if key != "version" and isinstance(value, numbers.Real) and not isinstance(value, bool) \
                    and math.isfinite(value):
                self._writer.add_scalar(key, float(value), step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


WANDB_RUN = "wandb-run.json"  # WandbLogger's W&B run id and last step, in the run directory


_environment_id_taken_by: str | None = None  # the run directory that took WANDB_RUN_ID in this process


def _take_environment_id(run_dir: str) -> str | None:
    """``WANDB_RUN_ID`` for the first run directory of this process that asks (again for that one), else None."""
    global _environment_id_taken_by
    wanted = os.environ.get("WANDB_RUN_ID")
    if not wanted or _environment_id_taken_by not in (None, run_dir):
        return None
    _environment_id_taken_by = run_dir
    return wanted


def _records_id(run_dir: str, run_id) -> bool:
    """Whether ``run_dir`` still holds a W&B run record of ``run_id`` (a folder copied, not moved, from it)."""
    try:
        with open(os.path.join(run_dir, WANDB_RUN)) as handle:
            return json.load(handle).get("id") == run_id
    except (OSError, ValueError, AttributeError):
        return False


class WandbLogger:
    """Rows to a Weights & Biases run (``wandb.init(**init_options)``, started when the run
    directory exists, with the run's config and ``dir`` = the run directory unless given).

    One jaxfl run is one W&B run, also across resumes and extensions: the first start keeps the W&B
    run's id in ``RUN_DIR/wandb-run.json``, and a later start in that directory passes it back with
    ``resume="allow"`` (W&B's way to continue a run), unless ``init_options`` name an ``id`` (yours:
    every run this object starts goes there). ``WANDB_RUN_ID`` names the W&B run of the first run of
    the process that has none yet. A moved folder keeps its W&B run; a copy (``cp -r``, its original
    still there) starts one of its own, said in a warning. The
    rows an interrupted process had logged past its checkpoint, which the resumed run computes again
    (the same values: resumes are bit-identical), are not sent twice: the file keeps the last step
    sent. The ``time`` column (virtual seconds) is logged with every row, for charts against time.

    >>> try:
    ...     import wandb
    ... except ImportError:
    ...     try:
    ...         WandbLogger(project="jaxfl")
    ...     except ImportError as error:
    ...         assert "pip install wandb" in str(error)
    """

    name = "wandb"

    def __init__(self, **init_options: Any):
        try:
            import wandb
        except ImportError as error:
            raise ImportError("WandbLogger needs the wandb package, which is not installed: pip install wandb") \
                from error
        self._wandb = wandb
        self.init_options = init_options
        self._run = None
        self._record: str | None = None  # RUN_DIR/wandb-run.json, once started in a run directory
        self._last_step: int | None = None  # the last step sent to this W&B run (by any process of the run)
        self._sent_before: int | None = None  # the last step sent before this process (an interrupted one's)
        self._run_dir: str | None = None  # the run directory the record belongs to (its real path)

    def start(self, run_dir: str, config: dict) -> None:
        self._record = os.path.join(run_dir, WANDB_RUN)
        kept = self._read_record()
        here = os.path.realpath(run_dir)
        if kept.get("run_dir") not in (None, here) and _records_id(kept["run_dir"], kept.get("id")):
            # a copy (cp -r, the way to extend a sweep's cell apart): its original goes on in the W&B run
            # the record names, so the copy takes one of its own (a moved folder keeps its W&B run)
            warn_user(f"{run_dir} is a copy of run {kept['run_dir']}, whose W&B run ({kept['id']}) it leaves to "
                      f"it: its own W&B run starts here, without the rows before this resume (those are in "
                      f"{kept['run_dir']}'s W&B run and in this folder's metrics.csv)")
            kept = {}
        # an id given here; the run's own; else W&B's WANDB_RUN_ID (a job's) for the first run of this process
        # that has no W&B run yet (a comparison's next runs would all go into it); else a new one
        run_id = self.init_options.get("id") or kept.get("id") or _take_environment_id(here) or secrets.token_hex(6)
        # this object may have logged another run before: only this run's record says what was sent
        self._sent_before = self._last_step = kept.get("last_step") if kept.get("id") == run_id else None
        self._run_dir = here
        options = {"dir": run_dir, "name": os.path.basename(run_dir), "config": config, "id": run_id,
                   "resume": "allow", **self.init_options}
        self._run = self._wandb.init(**options)
        self._write_record()

    def log(self, row: dict, step: int) -> None:
        if self._run is None:
            self._run = self._wandb.init(**self.init_options)
        if self._sent_before is not None and step <= self._sent_before:
            return  # sent by the interrupted process (on an eval_interval grid: a repeated evaluation of that model)
        self._run.log(row, step=step)
        if self._record is not None and step != self._last_step:
            self._last_step = step
            self._write_record()

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None

    def _read_record(self) -> dict:
        try:
            with open(self._record) as handle:
                kept = json.load(handle)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            raise ValueError(f"{self._record} is not allowed: the W&B run record WandbLogger writes ({{\"id\": ..., "
                             f"\"last_step\": ...}}), which could not be read ({error}); remove it to start a new "
                             "W&B run for this run directory") from None
        last = kept.get("last_step") if isinstance(kept, dict) else None
        if not isinstance(kept, dict) or not isinstance(kept.get("id"), str) \
                or not (last is None or isinstance(last, int) and not isinstance(last, bool)):
            raise ValueError(f"{self._record} is not allowed: the W&B run record WandbLogger writes, with a string "
                             f"\"id\" and an integer or null \"last_step\"; remove it to start a new W&B run for "
                             "this run directory")
        return kept

    def _write_record(self) -> None:
        # replaced whole: an interrupt never leaves half a record
        from jaxfl.runlog import written_atomically

        with written_atomically(self._record, ".partial") as partial, open(partial, "w") as handle:
            json.dump({"id": self._run.id, "last_step": self._last_step, "run_dir": self._run_dir}, handle)


def check_loggers(loggers) -> list:
    """The loggers of ``run_experiment(loggers=...)`` checked before any work: each a name of
    :data:`LOGGER_NAMES` (whose package must be installed) or an object with ``log`` and ``close``.

    >>> check_loggers(["csv"])
    ['csv']
    >>> check_loggers(["excel"])
    Traceback (most recent call last):
    ValueError: loggers=['excel'] is not allowed: each a logger object (with log(row, step) and close()) or one of tensorboard, csv, wandb
    """
    if loggers is None:
        return []
    if isinstance(loggers, str) or not isinstance(loggers, (list, tuple)):
        raise ValueError(f"loggers={loggers!r} is not allowed: a list of logger objects or names "
                         f"({', '.join(LOGGER_NAMES)})")
    for logger in loggers:
        if isinstance(logger, str):
            if logger not in LOGGER_NAMES:
                raise ValueError(f"loggers={list(loggers)!r} is not allowed: each a logger object (with log(row, "
                                 f"step) and close()) or one of {', '.join(LOGGER_NAMES)}")
            if logger == "tensorboard":
                tensorboard_writer_class()
            elif logger == "wandb" and importlib.util.find_spec("wandb") is None:
                raise ImportError("--log-to wandb needs the wandb package, which is not installed: pip install wandb")
        elif not (callable(getattr(logger, "log", None)) and callable(getattr(logger, "close", None))):
            raise ValueError(f"logger {logger!r} is not allowed: it needs log(row, step) and close() methods "
                             "(jaxfl.loggers.MetricsLogger)")
    return list(loggers)


def parse_log_to(text: str) -> list[str]:
    """``--log-to tensorboard,csv`` → ``["tensorboard", "csv"]``, each name checked.

    >>> parse_log_to("tensorboard, csv")
    ['tensorboard', 'csv']
    """
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in LOGGER_NAMES]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(f"--log-to={text!r} is not allowed: a comma-separated list of distinct names from "
                         f"{', '.join(LOGGER_NAMES)}")
    return names


CSV_LOG = "log.csv"  # --log-to csv's file in the run directory


def open_loggers(loggers, run_dir: str, config: dict, resumed: bool = False, offsets: dict | None = None,
                 version: int | None = None) -> list:
    """Build the named loggers in ``run_dir`` and call each logger's ``start(run_dir, config)``.
    A resumed run (``resumed``) continues ``log.csv`` cut back to ``offsets["log.csv"]`` (its length at
    the checkpoint, :func:`logger_offsets`) and has TensorBoard drop the steps after ``version``, the
    step (model version) of the last metrics row the checkpoint holds, so that no row is doubled: on an
    ``eval_interval`` grid a version's rows come after the checkpoint of that version.

    >>> import tempfile
    >>> [type(logger).__name__ for logger in open_loggers(["csv"], tempfile.mkdtemp(), {})]
    ['CSVLogger']
    """
    built = []
    offsets = offsets or {}
    try:
        for logger in loggers:
            if logger == "csv":
                logger = CSVLogger(os.path.join(run_dir, CSV_LOG), append=resumed,
                                   offset=offsets.get(CSV_LOG) if resumed else None)
            elif logger == "tensorboard":
                logger = TensorBoardLogger(os.path.join(run_dir, "tensorboard"),
                                           purge_step=version + 1 if resumed and version is not None else None)
            elif logger == "wandb":
                logger = WandbLogger()
            start = getattr(logger, "start", None)
            if callable(start):
                start(run_dir, config)
            built.append(logger)
    except BaseException:
        # a later logger's start failed: the ones already started hold files (log.csv) open
        for logger in built:
            with contextlib.suppress(Exception):
                logger.close()
        raise
    return built


def logger_offsets(loggers, run_dir: str) -> dict:
    """What a checkpoint records of the built-in file loggers: ``{"log.csv": bytes}`` for the run's
    ``log.csv`` (its rows on the disk), which :func:`open_loggers` cuts back to on resume."""
    path = os.path.abspath(os.path.join(run_dir, CSV_LOG))
    return {CSV_LOG: logger.position() for logger in loggers
            if isinstance(logger, CSVLogger) and os.path.abspath(logger.path) == path}


def logger_names(loggers) -> list[str]:
    """The names among ``loggers`` (``--log-to``'s), which ``config.json`` records for a resume.

    >>> logger_names(["csv", CSVLogger("/tmp/x.csv")])
    ['csv']
    """
    return [logger for logger in loggers or () if isinstance(logger, str)]


__all__ = ["LOGGER_NAMES", "CSVLogger", "MetricsLogger", "TensorBoardLogger", "WandbLogger", "check_loggers",
           "logger_names", "logger_offsets", "open_loggers", "parse_log_to", "tensorboard_writer_class"]
