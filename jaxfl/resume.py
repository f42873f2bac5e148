"""Safe resume: continue a run only from what it really was, or say in one line why not.

Each checkpoint stores the run's resolved config (every field that shapes the run) and the SHA-256
of its canonical JSON, in its ``config.json``. Resuming

- reads ``config.json`` (a missing, unparsable or foreign one is a :class:`ResumeError`);
- refuses values given with the resume (flags, a config file, ``overrides=``) that would change the
  run, naming each with the run's value; only the fields of :data:`MAY_DIFFER` (``progress``, ``checkpoint_min_interval_s``, ``devices``) may
  differ, and identical values pass; the :data:`BUDGETS` may be raised (:func:`budget_changes`,
  :func:`check_extension`), which takes a run that stopped on one further;
- takes the newest checkpoint that reads back completely (its pickled state *and* its orbax device
  data), warning with :class:`ResumeWarning` about each one skipped; none at all, or none readable,
  is a :class:`ResumeError` (never a silent restart);
- refuses a checkpoint written under a config other than ``config.json`` (an edited file), naming
  each field that differs with both values; this and a run without checkpoints are found before
  the data is loaded.

>>> record = config_record(validate(RunConfig(algorithm="fedbuff", clients=4)))
>>> record["algorithm"], record["clients"], "progress" in record
('fedbuff', 4, False)
>>> differences(record, {**record, "clients": 6})
['clients: 6 (the checkpoint has 4)']
"""
from __future__ import annotations

import contextlib
import gc
import contextvars
import dataclasses
import errno
import hashlib
import json
import math
import os
import shlex
import time
import warnings
from typing import Any, Mapping

from jaxfl._user_warnings import warn_user
from jaxfl import algorithms, checkpoint
from jaxfl.config import (FIELDS, FIELDS_ADDED, FIELDS_ADDED_BEFORE_NAMES, READING_A_RECORD, SECTION_OF, ConfigError, RunConfig, as_recorded,
                          config_from_mapping, split_algorithm_options, user_path, validate,  # noqa: F401 -- validate: the docstring examples use it
                          without_settings_refused_since)

# Fields that do not change what a run computes or writes, so a resume may set them afresh. ``devices``
# changes only how the client axis is sharded (results equal within the tolerance README states for
# device counts): a run started on 4 devices resumes on a machine with 1 (``--devices 1``).
MAY_DIFFER = ("progress", "checkpoint_min_interval_s", "devices")
# The budgets a resume may raise (``jaxfl run --resume RUN --max-updates 600``): a run stops where one is
# spent, and nothing before that point depends on them (the engine reads them to train ahead no more
# than the budget can use, and trains what each aggregation needs either way), so a run taken on from
# its stop under a larger budget is the run the larger budget would have made from the start.
BUDGETS = ("max_time", "max_updates", "max_client_updates", "max_client_steps")
# ... and the stop at the target accuracy may be turned off (``--no-stop-at-target``): a run that
# stopped there goes on as a run that never stopped would have (which reached its target at the same
# point: the stop changes nothing before it)
STOP_AT_TARGET = "stop_at_target"
EXTENDABLE = (*BUDGETS, STOP_AT_TARGET)
# the stop reason each budget ends a run with (jaxfl.scheduler.simulation.STOP_REASONS)
_BUDGET_OF_REASON = {"time budget": "max_time", "update budget": "max_updates",
                     "client-update budget": "max_client_updates", "client-step budget": "max_client_steps"}
# What a checkpoint's state.pkl holds (jaxfl.experiment._Checkpointer.save): a pickle that loads but
# lacks one of these is not a checkpoint this jaxfl can continue.
_STATE_KEYS = ("simulation", "engine", "recorder", "offsets", "resumes", "wall_time")


class ResumeError(ValueError):
    """A run cannot be resumed as asked; the message says why and what to do, in one line."""


class RunFinished(ResumeError):
    """``jaxfl run --resume`` of a run that has finished (its ``summary.json`` is written): there is
    nothing to resume, and the run is left as it is."""


def finished_run(run_dir: str) -> RunFinished | None:
    """A :class:`RunFinished` saying how ``run_dir`` ended, if it has finished; None if it has not.

    >>> finished_run("/nonexistent") is None
    True
    """
    from jaxfl.runlog import finished_summary

    summary = finished_summary(run_dir)
    if summary is None:  # none, or a damaged one: the resume writes it anew
        return None
    try:
        how = f" ({summary['global_updates']} updates, stop: {summary['stop_reason']})"
    except (KeyError, TypeError):
        how = ""
    budget = _BUDGET_OF_REASON.get(summary.get("stop_reason")) if isinstance(summary.get("stop_reason"), str) else None
    further = ""
    if summary.get("stop_reason") == "target reached":
        further = (f"; to take it past its target: jaxfl run --resume {shlex.quote(run_dir)} --no-stop-at-target (with "
                   "a larger budget if it has none left)")
    elif budget is not None and (summary.get("timing_only") or not os.path.isdir(os.path.join(run_dir, "checkpoints"))):
        # no checkpoint to go on from (a timing-only run runs again in seconds)
        further = f"; to take it further, run it again with a larger budget: {run_again(run_dir, {})} {_flag(budget)} N"
    elif budget is not None:
        further = (f"; to take it further, raise the budget it stopped on: jaxfl run --resume {shlex.quote(run_dir)} "
                   f"{_flag(budget)} N")
    return RunFinished(f"{run_dir} has already finished{how}: nothing to resume, the run is left as it is "
                       f"(its summary.json, logs and checkpoints are unchanged){further}")


class InUse(ValueError):
    """A run or sweep directory that another process is writing (it holds the folder's ``.lock``):
    refused in one line naming that process, before this one writes anything there."""


LOCK = ".lock"  # in a run directory (a run or resume writing it) and a sweep directory (a sweep running it)


def _in_use(folder: str, holder: str, what: str, again: str) -> InUse:
    # ``again``: what to run then, the folder appended (or put where it holds "{folder}")
    then = again.format(folder=shlex.quote(folder)) if "{folder}" in again else f"{again} {shlex.quote(folder)}"
    return InUse(f"{folder} is in use by process {holder or '(unknown)'}, which is writing this {what}: two "
                 f"processes at once would corrupt it; wait for that one to end (or stop it) and then {then}")


_HELD: set[str] = set()  # the folders whose lock this process holds (check_not_in_use skips them)


def _resume_command() -> str:
    """What to run once a run folder is free (``{folder}`` its place): a resume, with the budgets the
    resume in progress changes (:func:`raising_budgets`), so that the extension asked for is not lost."""
    raising = _RAISING.get()
    return "jaxfl run --resume {folder}" + (f" {_flags(raising)}" if raising else "")


@contextlib.contextmanager
def holding_lock(folder: str, what: str = "run directory", again: str | None = None):
    """Hold an exclusive ``flock`` on ``folder/.lock`` (which records this process's id) while inside:
    two processes writing one run (or sweep) directory would interleave their rows and checkpoints.
    Another process holding it is an :class:`InUse` naming its id. The lock goes with the process
    (also when it is killed); the empty ``.lock`` file stays. On a file system without locks (``flock``
    says ENOLCK or ENOTSUP: some NFS and SMB mounts, exFAT) a warning says so and the block runs unguarded.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with holding_lock(folder):
    ...     int(open(os.path.join(folder, LOCK)).read()) == os.getpid()
    True
    """
    fcntl = _fcntl()

    again = _resume_command() if again is None else again
    path = os.path.join(folder, LOCK)
    handle = open(path, "a+")
    no_locks = None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:  # BlockingIOError: held by another process (its id is written just after it took it)
        if _held_elsewhere(error):
            holder = ""
            for _ in range(20):
                handle.seek(0)
                holder = handle.read().strip()
                if holder:
                    break
                time.sleep(0.01)
            handle.close()
            raise _in_use(folder, holder, what, again) from None
        no_locks = error.strerror or str(error)
    if no_locks is not None:
        # a folder on a file system without locks (some NFS and SMB mounts, exFAT): said, not taken for a
        # lock another process holds, and the work goes on without the guard (outside the except: the
        # error is no part of the work's own). Once a process, and without the folder's path: a sweep's
        # cells (each a run folder, each a process with --jobs N) would say it once each
        handle.close()
        if no_locks not in _SAID_NO_LOCKS:
            _SAID_NO_LOCKS.add(no_locks)
            warn_user(f"could not lock the run and sweep folders on this file system ({no_locks}): it may not "
                      f"support locks, so a second process writing the same folder at once would not be refused")
        yield
        return
    held = os.path.realpath(folder)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        _HELD.add(held)
        yield
    finally:
        _HELD.discard(held)
        try:
            handle.seek(0)
            handle.truncate()
        except OSError:
            pass
        handle.close()  # releases the lock


def _fcntl():
    """The POSIX file locks run folders take (``fcntl``), or an ImportError that says what to do where
    there are none (native Windows)."""
    try:
        import fcntl
    except ImportError:
        raise ImportError("jaxfl locks its run and sweep folders with POSIX file locks (fcntl), which native "
                          "Windows lacks: run jaxfl under WSL2 (Linux on Windows), or on Linux or macOS") from None
    return fcntl


_SAID_NO_LOCKS: set[str] = set()  # the errors of file systems without locks said in this process


def _held_elsewhere(error: OSError) -> bool:
    """Whether ``flock``'s error says another process holds the lock (not that the file system has none).

    >>> _held_elsewhere(BlockingIOError(errno.EWOULDBLOCK, "busy")), _held_elsewhere(OSError(errno.ENOLCK, "no locks"))
    (True, False)
    """
    return error.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES)


def check_not_in_use(folder: str) -> None:
    """:class:`InUse` if another process holds ``folder/.lock`` (:func:`holding_lock`). A probe: it
    writes nothing, and a lock this process holds is not "another" (flock would say it is).

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with holding_lock(folder):
    ...     check_not_in_use(folder)   # held by this process: no error
    """
    holder = in_use_by(folder)
    if holder is not None:
        raise _in_use(folder, holder, "run directory", _resume_command())


def in_use_by(folder: str) -> str | None:
    """The id of the other process that holds ``folder/.lock`` (``""`` where the lock does not say),
    or None where none does (:func:`check_not_in_use`'s probe).

    >>> import tempfile
    >>> in_use_by(tempfile.mkdtemp()) is None
    True
    """
    fcntl = _fcntl()

    path = os.path.join(folder, LOCK)
    if os.path.realpath(folder) in _HELD or not os.path.isfile(path):
        return None
    try:
        handle = open(path)
    except OSError:  # unreadable: no way to tell; the resume's own lock decides
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            return handle.read().strip() if _held_elsewhere(error) else None  # no locks there: no way to tell
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


class ResumeWarning(UserWarning):
    """A resume went on, but not from the newest checkpoint (the message names the one skipped and why)."""


def config_record(config: RunConfig) -> dict[str, Any]:
    """The values that define a run, flat (``clients``, ``port.staleness_bound``) and JSON-typed.

    Every config field but :data:`MAY_DIFFER`, and the algorithm's resolved options under its
    namespace; this is what a checkpoint stores and what a resume compares. ``config`` is validated
    (:func:`~jaxfl.config.validate` resolves the defaults recorded: server_lr, target_accuracy, the
    options), as a run holds it: validating it again here would repeat its warnings.

    >>> config_record(validate(RunConfig(algorithm="port")))["port.staleness_bound"]
    10.0
    """
    if not dataclasses.is_dataclass(config.algorithm_options):
        raise TypeError("config_record takes a validated config (jaxfl.config.validate(config)): this one's "
                        f"algorithm options are unresolved ({config.algorithm_options!r})")
    values = {name: getattr(config, name) for name in FIELDS if name not in ("algorithm_options", *MAY_DIFFER)}
    options = config.algorithm_options
    space = algorithms.get(config.algorithm).option_namespace()
    values.update({f"{space}.{field.name}": getattr(options, field.name) for field in dataclasses.fields(options)})
    return json.loads(canonical_json(values))


def canonical_json(record: Mapping[str, Any]) -> str:
    """One text per config: sorted keys, no spaces, non-JSON values as their ``str``.

    >>> canonical_json({"b": 1, "a": float("inf")})
    '{"a":Infinity,"b":1}'
    """
    return json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)


def digest(record: Mapping[str, Any]) -> str:
    """SHA-256 of :func:`canonical_json` of a config record.

    >>> len(digest(config_record(validate(RunConfig()))))
    64
    """
    return hashlib.sha256(canonical_json(record).encode()).hexdigest()


def checkpoint_config(config: RunConfig) -> dict[str, Any]:
    """What each checkpoint stores about its config (``config.json`` in its folder): the record and
    its SHA-256, which also tells a damaged file from an edited run config. ``config`` is validated.

    >>> stored = checkpoint_config(validate(RunConfig(clients=4)))
    >>> stored["config"]["clients"], stored["config_sha256"] == digest(stored["config"])
    (4, True)
    """
    record = config_record(config)
    return {"config": record, "config_sha256": digest(record)}


def _show(value: Any) -> str:
    return repr(value) if not (isinstance(value, float) and math.isinf(value)) else ("inf" if value > 0 else "-inf")


def differences(stored: Mapping[str, Any], current: Mapping[str, Any], holder: str = "the checkpoint") -> list[str]:
    """``name: current value (holder has stored value)`` for each field whose values differ.

    >>> differences({"clients": 4, "algorithm": "fedbuff"}, {"clients": 4, "algorithm": "fedasync"})
    ["algorithm: 'fedasync' (the checkpoint has 'fedbuff')"]
    """
    def shown(values: Mapping[str, Any], name: str) -> str:
        return _show(values[name]) if name in values else "no such field"

    return [f"{name}: {shown(current, name)} ({holder} has {shown(stored, name)})"
            for name in sorted(set(stored) | set(current))
            if name not in stored or name not in current or stored[name] != current[name]]


def read_record(run_dir: str) -> dict:
    """A run directory's ``config.json`` as written (``config``, ``user_inputs``, ``versions``...),
    unvalidated: :class:`ResumeError` (one line) if the folder or the file is missing, unparsable,
    or not written by ``jaxfl run``.

    >>> read_record("/nonexistent")
    Traceback (most recent call last):
    jaxfl.resume.ResumeError: cannot resume '/nonexistent': no such directory
    """
    if not os.path.isdir(run_dir):
        what = "it is a file, not a run's folder" if os.path.exists(run_dir) else "no such directory"
        raise ResumeError(f"cannot resume {run_dir!r}: {what}")
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        root = os.path.join(run_dir, "checkpoints")
        kept = sorted((name for name in os.listdir(root) if name.startswith("ckpt-")
                       and os.path.isfile(os.path.join(root, name, "config.json"))),
                      key=checkpoint.checkpoint_order) if os.path.isdir(root) else []
        if kept:  # a run directory that lost the file: its checkpoints keep the settings
            again = shlex.quote(os.path.join(root, kept[-1], "config.json"))
            raise ResumeError(f"cannot resume {run_dir!r}: its config.json is missing (deleted?), and a resume "
                              f"checks the run's data, inputs and versions against it; each checkpoint keeps the "
                              f"run's settings: jaxfl run --config {again} starts the run again")
        from jaxfl.runlog import runs_inside

        raise ResumeError(f"cannot resume {run_dir!r}: it has no config.json, so it is not a run directory of jaxfl "
                          f"run{runs_inside(run_dir)}")
    try:
        with open(path, "rb") as handle:
            written = json.loads(handle.read())
    except (ValueError, UnicodeDecodeError) as error:
        raise ResumeError(f"cannot resume {run_dir!r}: config.json is not valid JSON ({_first_line(error)})") from None
    if not isinstance(written, dict) or not isinstance(written.get("config"), dict):
        raise ResumeError(f"cannot resume {run_dir!r}: config.json was not written by jaxfl run (it has no "
                          f"'config' mapping of the run's fields)")
    return written


def recorded_config(written: Mapping[str, Any]) -> RunConfig:
    """The config a run recorded (``config.json``'s ``config``, as :func:`read_record` returns it) as
    it ran: unset fields whose algorithm's default changed since read as the default it ran under,
    and settings it held unread, refused since, left out. Not validated; raises
    :class:`~jaxfl.config.ConfigError` for a value no config takes.

    >>> recorded_config({"algorithm": "fedasync", "server": {"rule": None}}).rule
    'fedcompass'
    """
    return config_from_mapping(without_settings_refused_since(as_recorded(written))[0])


def read_run(run_dir: str, may_differ: Mapping[str, Any] | None = None) -> tuple[RunConfig, dict]:
    """``(config, user_inputs)`` of a run directory from one read of its ``config.json``
    (:func:`read_record`): the validated config, and the record of what the run took besides it
    (:mod:`jaxfl.user_inputs`; empty if nothing). ``may_differ``'s values (:data:`MAY_DIFFER`
    fields only, e.g. ``{"progress": False}``) replace the recorded ones before the validation.

    >>> read_run("/nonexistent")
    Traceback (most recent call last):
    jaxfl.resume.ResumeError: cannot resume '/nonexistent': no such directory
    """
    return read_run_and_record(run_dir, may_differ)[:2]


def read_run_and_record(run_dir: str, may_differ: Mapping[str, Any] | None = None) -> tuple[RunConfig, dict, dict]:
    """:func:`read_run`'s ``(config, user_inputs)`` and the whole ``config.json`` it read them from
    (its ``log_to``: the loggers the run was started with), from one read of the file."""
    written = read_record(run_dir)
    # a setting the run held unread, refused since: it changed nothing, so the run goes on without it
    values, _ = without_settings_refused_since(as_recorded(written["config"]))
    for name, value in (may_differ or {}).items():  # in the recorded section that holds it (given twice else)
        values = with_recorded(values, name, value)
    other = sorted(set(may_differ or {}) - set(MAY_DIFFER))
    if other:
        raise ValueError(f"read_run: may_differ={other} names fields a resume keeps; only {', '.join(MAY_DIFFER)}")
    elsewhere = _started_elsewhere(written)
    relative = _relative_paths(written["config"])
    if elsewhere and relative:  # the same relative path here may name another file, or none
        raise ResumeError(f"cannot resume {run_dir!r} from here: it was started in {elsewhere!r} and its config "
                          f"names {', '.join(relative)} relative to that folder; resume it from there "
                          f"(cd {shlex.quote(elsewhere)})")
    algorithm = values.get("algorithm")
    if isinstance(algorithm, str) and ":" in algorithm:  # a plug-in by reference: its import, not the config, fails
        from jaxfl import algorithms

        try:
            algorithms.get(algorithm.strip())
        except KeyError as error:
            there = (f"; it was started in {elsewhere!r}, where a module it names may be importable alone: resume it "
                     f"from there (cd {shlex.quote(elsewhere)})" if elsewhere else "")
            raise ResumeError(f"cannot resume {run_dir!r}: {error.args[0] if error.args else error}{there}") from None
    if isinstance(algorithm, str) and ":" not in algorithm:
        from jaxfl import algorithms

        if algorithm not in algorithms.names():  # registered by the script or notebook that started the run
            raise ResumeError(f"cannot resume {run_dir!r}: its algorithm {algorithm!r} is not registered in this "
                              "process (a class registered in the script or notebook that started the run is "
                              "recorded by its name alone): define or import it and register it "
                              "(jaxfl.algorithms.register) before resuming in Python, or run such an algorithm as "
                              "path/to/file.py:Class or module:Class, which a resume imports itself")
    try:
        # the run's own record, which a resume cannot change: its unread fields are said without the advice
        # to leave them out (that would make the config differ from its checkpoints')
        reading = READING_A_RECORD.set(True)
        try:
            return config_from_mapping(values), written.get("user_inputs", {}), written
        finally:
            READING_A_RECORD.reset(reading)
    except (ConfigError, TypeError, ValueError) as error:
        text = str(error).strip().splitlines()  # whole: a reference's cause comes after the list of names
        if may_differ and _valid(without_settings_refused_since(as_recorded(written["config"]))[0]):  # the value given for the resume is the bad one
            raise ResumeError(f"cannot resume {run_dir!r}: {text[0] if text else repr(error)} (given for the resume; "
                              "the run's own config.json is valid)") from None
        where = (f" (it was started in {elsewhere!r}: a module it names may be importable from there alone)"
                 if elsewhere else "")
        # a setting an earlier jaxfl took and this one refuses (it was ignored, or computed something
        # else): the run cannot go on under it
        older = ("; an earlier jaxfl may have taken this setting, which this one refuses: start the run again "
                 "with it changed" if isinstance(error, ConfigError) and not where else "")
        raise ResumeError(f"cannot resume {run_dir!r}: config.json does not hold a valid run config: "
                          f"{type(error).__name__}: {text[0] if text else ''}{where}{older}") from None


def recorded(settings: Mapping[str, Any], name: str) -> Any:
    """Field ``name`` of a recorded config (``config.json``'s ``config``): in the section that holds it,
    or at the top (a run recorded flat, before the sections); None where it is in neither.

    >>> recorded({"budget": {"max_updates": 5}}, "max_updates"), recorded({"max_updates": 5}, "max_updates")
    (5, 5)
    """
    section = settings.get(SECTION_OF.get(name))
    return section[name] if isinstance(section, dict) and name in section else settings.get(name)


def with_recorded(settings: Mapping[str, Any], name: str, value: Any) -> dict:
    """A copy of a recorded config with field ``name`` set to ``value`` where :func:`recorded` reads it
    (at the top where its section does not hold it).

    >>> with_recorded({"budget": {"max_updates": 5, "max_time": 9.0}}, "max_updates", 8)
    {'budget': {'max_updates': 8, 'max_time': 9.0}}
    """
    settings, section = dict(settings), SECTION_OF.get(name)
    if isinstance(settings.get(section), dict) and name in settings[section]:
        settings[section] = {**settings[section], name: value}
    else:
        settings[name] = value
    return settings


def _valid(values: dict) -> bool:
    try:
        config_from_mapping(values)
    except (ConfigError, TypeError, ValueError):
        return False
    return True


def _started_elsewhere(written: dict) -> str | None:
    """The folder a run was started in (``config.json``'s ``working_directory``) where that is not
    this process's working directory; None where it is, or was not recorded (an older jaxfl)."""
    started = written.get("working_directory")
    if not isinstance(started, str) or os.path.realpath(started) == os.path.realpath(os.getcwd()):
        return None
    return started


def _relative_paths(config: dict) -> list[str]:
    """The settings of a config record that name files by relative paths (``data_dir``, a
    ``file.py:Class`` algorithm or model), as ``name='value'``.

    >>> _relative_paths({"algorithm": "examples/x.py:C", "data": {"data_dir": "/abs/d.npz", "model": "m:f"}})
    ["algorithm='examples/x.py:C'"]
    """
    found = []
    for section in (config, *(value for value in config.values() if isinstance(value, dict))):
        for name in ("data_dir", "algorithm", "model"):
            value = section.get(name)
            if not isinstance(value, str) or not value:
                continue
            path = value if name == "data_dir" else value.rpartition(":")[0] if ".py:" in value else None
            if path and not os.path.isabs(path):
                found.append(f"{name}={value!r}")
    return found


def refuse_changes(config: RunConfig, overrides: Mapping[str, Any], spelling=None) -> None:
    """Raise :class:`ResumeError` naming every value in ``overrides`` that would change ``config`` (validated).

    ``overrides`` uses config-file names (``clients``, ``client.local_steps`` tables, ``port.alpha``);
    values equal to the run's and :data:`MAY_DIFFER` fields pass. ``spelling(name, value)`` writes a
    refused value as the user gave it (the CLI: ``--local-steps 6``; by default ``local_steps=6``).

    >>> run = validate(RunConfig(algorithm="fedbuff", clients=4))
    >>> refuse_changes(run, {"clients": 4})  # the same: accepted
    >>> refuse_changes(run, {"clients": 6, "progress": False})
    Traceback (most recent call last):
    jaxfl.resume.ResumeError: a resumed run keeps the config it was started with (only progress, checkpoint_min_interval_s, devices may differ), but these would change it: clients=6 (the run has 4); start a new run to change them
    """
    spelling = spelling or (lambda name, value: f"{name}={_show(value)}")
    fields, options = split_algorithm_options(dict(overrides))
    table = fields.pop("algorithm_options", None) or {}
    space = _namespace(fields.get("algorithm", config.algorithm))
    flat = {**fields, **{f"{space}.{key}": value for key, value in table.items()},
            **{f"{name}.{key}": value for name, given in options.items() for key, value in given.items()}}
    record = config_record(config)
    refused = []
    for name, value in flat.items():
        if name.replace("-", "_") in MAY_DIFFER:
            continue
        try:  # one value at a time, so each refusal names the value that changes the run
            with warnings.catch_warnings():  # the run's own warnings, given when its config was validated
                warnings.simplefilter("ignore")
                changed = config_record(config_from_mapping({name: value}, base=config)) != record
        except ConfigError as error:  # invalid on top of the run's config: certainly not the run's value
            if str(error).startswith("unknown "):  # a misspelt name: it would change nothing, it is no field
                raise ResumeError(f"cannot resume with {spelling(name, value)}: {_first_line(error).partition(': ')[2]}") \
                    from None
            changed = True
        if changed:
            key = name.replace("-", "_")
            has = f" (the run has {_show(record[key])})" if key in record else ""
            refused.append(f"{spelling(name, value)}{has}")
    if refused:
        raise ResumeError(f"a resumed run keeps the config it was started with (only {', '.join(MAY_DIFFER)} may "
                          f"differ), but these would change it: {'; '.join(refused)}; start a new run to change them")


def _unbounded(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isinf(value))


def _at_least(new: Any, old: Any) -> bool:
    """Whether budget ``new`` lets a run go at least as far as ``old`` (None and inf: no budget)."""
    return _unbounded(new) or (not _unbounded(old) and new >= old)


def _budget_text(value: Any) -> str:
    return "none (no budget)" if value is None else _show(value)


# what a finished run's summary.json says it reached of each budget (the unit each counts)
_REACHED = {"max_updates": (lambda summary: summary["global_updates"], "updates"),
            "max_client_updates": (lambda summary: summary["accounting"]["aggregated"], "client updates aggregated"),
            "max_client_steps": (lambda summary: summary["client_steps_aggregated"], "client-steps aggregated"),
            "max_time": (lambda summary: summary["virtual_time"], "virtual s")}


def budget_changes(config: RunConfig, overrides: Mapping[str, Any], spelling=None) -> tuple[dict, dict]:
    """``(changed, rest)``: the :data:`BUDGETS` of ``overrides`` whose values differ from the run's
    ``config`` (validated), and ``stop_at_target`` turned off, as ``{name: (run's value, new value)}``,
    and the other overrides (for :func:`refuse_changes`); :func:`check_extension` says whether the
    new values take the run further.

    >>> run = validate(RunConfig(algorithm="fedbuff", clients=4, max_updates=30))
    >>> budget_changes(run, {"max-updates": 60, "clients": 4})
    ({'max_updates': (30, 60)}, {'clients': 4})
    >>> budget_changes(run, {"max_updates": 0})
    Traceback (most recent call last):
    jaxfl.resume.ResumeError: cannot resume with max_updates=0: max_updates=0 is not allowed: an integer >= 1
    """
    spelling = spelling or (lambda name, value: f"{name}={_show(value)}")
    fields, options = split_algorithm_options(dict(overrides))
    changed = {}
    if config.stop_at_target and fields.get(STOP_AT_TARGET) is False:  # turned off (turned on: refuse_changes)
        fields.pop(STOP_AT_TARGET)
        changed[STOP_AT_TARGET] = (True, False)
    for name in BUDGETS:
        if name not in fields:
            continue
        given = fields.pop(name)
        try:
            with warnings.catch_warnings():  # the run's own warnings, given when its config was validated
                warnings.simplefilter("ignore")
                value = getattr(config_from_mapping({name: given}, base=config), name)
        except ConfigError as error:
            raise ResumeError(f"cannot resume with {spelling(name, given)}: {_first_line(error).partition(': ')[2]}") \
                from None
        old = getattr(config, name)
        if value != old and not (_unbounded(value) and _unbounded(old)):
            changed[name] = (old, value)
    return changed, {**fields, **options}


def check_extension(run_dir: str, config: RunConfig, changed: Mapping[str, tuple], spelling=None) -> None:
    """Before any work: :class:`ResumeError` unless the budgets ``changed`` (from :func:`budget_changes`)
    take the run in ``run_dir`` further, as a run made with them from the start would have gone. A
    finished run must have stopped on a budget, or on its target accuracy with ``stop_at_target``
    turned off, and each budget must then lie beyond what the run
    reached (its summary's updates, client updates, client-steps and virtual time): one it had spent
    would stop it where it is, one below it would have stopped it earlier. An unfinished run (its
    progress is its newest checkpoint's) takes raised budgets only. A timing-only run keeps no
    checkpoint to go on from, and a sweep's cell or a comparison's run is extended as a copy.

    >>> check_extension("/nonexistent-run", validate(RunConfig(timing_only=True, max_updates=5)),
    ...                 {"max_updates": (5, 10)})
    Traceback (most recent call last):
    jaxfl.resume.ResumeError: cannot extend '/nonexistent-run': a timing-only run keeps no checkpoint to go on from (it runs again in a fraction of a training run's time); run its config again with the larger budget: jaxfl run --config /nonexistent-run/config.json --max-updates 10
    """
    from jaxfl.runlog import finished_summary

    spelling = spelling or (lambda name, value: f"{name}={_show(value)}")
    flags = _flags(changed)
    held = _held_by_a_table(run_dir)
    if held is not None:
        held, copy = held
        raise ResumeError(f"cannot extend {run_dir!r} where it is: it is {held}, which would go on naming it with "
                          "results that are no longer the run's; extend a copy: cp -r "
                          f"{shlex.quote(run_dir)} {shlex.quote(copy)} && jaxfl run --resume {shlex.quote(copy)} {flags}")
    if config.timing_only:
        raise ResumeError(f"cannot extend {run_dir!r}: a timing-only run keeps no checkpoint to go on from (it runs "
                          "again in a fraction of a training run's time); run its config again with the larger "
                          f"budget: {run_again(run_dir, changed)}")
    summary = finished_summary(run_dir)
    if summary is None:  # unfinished: it goes on from its newest checkpoint, which may be past a lower budget
        for name, (old, new) in changed.items():
            if name in BUDGETS and not _at_least(new, old):
                raise ResumeError(f"cannot resume {run_dir!r} with {spelling(name, new)}: the run has not finished, "
                                  f"and its budget of {_budget_text(old)} may only be raised (it may be past a lower "
                                  "one); start a new run for a shorter one")
        return
    reason = str(summary.get("stop_reason"))
    if reason == "target reached" and STOP_AT_TARGET not in changed:
        raise ResumeError(f"cannot extend {run_dir!r}: it stopped on reaching its target accuracy, so it would stop "
                          f"there again: take it past its target with {_flag_of(STOP_AT_TARGET, False)} (and a larger "
                          "budget if it has none left)")
    if reason not in _BUDGET_OF_REASON and reason != "target reached":
        raise ResumeError(f"cannot extend {run_dir!r}: it stopped on {reason!r}, not on a budget, so it would stop "
                          "there again under a larger one; start a new run to change its settings")
    for name in BUDGETS:
        new = changed[name][1] if name in changed else getattr(config, name)
        reached, unit = _REACHED[name]
        try:
            reached = reached(summary)
        except (KeyError, TypeError):  # a summary of an older jaxfl without the count: not checked
            continue
        if _unbounded(new) or not isinstance(reached, (int, float)) or new > reached:
            continue
        if name in changed:
            raise ResumeError(f"cannot extend {run_dir!r} with {spelling(name, new)}: the run has reached "
                              f"{_show(reached)} {unit} already, so it would stop where it is (or, made with it "
                              f"from the start, earlier): give more than {_show(reached)}")
        raise ResumeError(f"cannot extend {run_dir!r}: its {name}={_budget_text(new)} is spent where it stopped "
                          f"({_show(reached)} {unit}; stop: {reason}), so it would stop there again: raise {name} "
                          f"({_flag(name)}) above {_show(reached)} as well")


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _flag_of(name: str, value: Any) -> str:
    """``--max-updates 600``, ``--max-updates none``, ``--no-stop-at-target``: as the command line takes it."""
    if isinstance(value, bool):
        return _flag(name) if value else f"--no-{name.replace('_', '-')}"
    return f"{_flag(name)} {_show(value) if value is not None else 'none'}"


def _flags(changed: Mapping[str, tuple]) -> str:
    return " ".join(_flag_of(name, new) for name, (_, new) in changed.items())


def run_again(run_dir: str, changed: Mapping[str, tuple]) -> str:
    """The command that runs ``run_dir``'s config again with the ``changed`` budgets (where a run
    keeps no checkpoint to extend).

    >>> run_again("runs/a", {"max_updates": (300, 600)})
    'jaxfl run --config runs/a/config.json --max-updates 600'
    """
    return f"jaxfl run --config {shlex.quote(os.path.join(run_dir, 'config.json'))} {_flags(changed)}".rstrip()


# The budgets being changed by the resume in progress (:func:`raising_budgets`), ``{name: (old, new)}``:
# a checkpoint written under the old ones is that run's, not one of an edited config.json.
_RAISING: contextvars.ContextVar[dict] = contextvars.ContextVar("jaxfl_raising_budgets", default={})


@contextlib.contextmanager
def raising_budgets(changed: Mapping[str, tuple]):
    """While the resume that changes budgets (``changed``: ``{name: (old, new)}``, from
    :func:`budget_changes`) checks and loads its checkpoint, which was written under the old ones
    (:func:`check_config`, :func:`load_checkpoint`), and records them (:func:`budgets_taken_on`)."""
    token = _RAISING.set(dict(changed))
    try:
        yield
    finally:
        _RAISING.reset(token)


def _budget_history(run_dir: str) -> tuple[dict, dict]:
    """``(had, now)``: for each extendable field, every value the run's checkpoints may have been
    written under (``config.json``'s ``extensions``, and the old value of the change in progress), and
    the value it goes on under (the newest extension's, or the change in progress's)."""
    had, now = {}, {}
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError, KeyError):
        with open(os.path.join(run_dir, "config.json")) as handle:
            for extension in json.load(handle).get("extensions") or []:
                for name, value in extension["from"].items():
                    had.setdefault(name, []).append(value)
                for name, value in extension["to"].items():
                    had.setdefault(name, []).append(value)
                    now[name] = value
    for name, (old, new) in _RAISING.get().items():
        had.setdefault(name, []).append(old)
        now[name] = new
    return had, now


def budgets_taken_on(recorded: Mapping[str, Any]) -> None:
    """Under the run directory's lock, before the extension in progress is recorded: a
    :class:`ResumeError` if ``config.json``'s values (``recorded``) are no longer those the resume
    checked (another process extended the run while this one waited for it)."""
    moved = {name: recorded.get(name) for name, (old, _) in _RAISING.get().items() if recorded.get(name) != old}
    if moved:
        raise ResumeError("the run was taken on by another process while this resume waited for it (its config.json "
                          f"now says {', '.join(f'{name}={_show(value)}' for name, value in moved.items())}): run the "
                          "command again to check it against the run as it is now")


def _held_by_a_table(run_dir: str) -> tuple[str, str] | None:
    """``(what, copy)`` where ``run_dir`` is among the results of a sweep (a cell: ``SWEEP/runs/RUN``,
    with ``SWEEP/sweep.json``) or of a comparison (listed in the ``comparison.csv`` beside it: ``jaxfl
    run --algorithm a,b``), with a folder for a copy that neither reads; None for a run of its own."""
    import csv

    def shown(path: str) -> str:  # as short as the user's own paths
        relative = os.path.relpath(path)
        return path if relative.startswith(os.pardir) else relative

    absolute = os.path.abspath(run_dir)
    name, parent = os.path.basename(absolute), os.path.dirname(absolute)
    sweep = os.path.dirname(parent)
    if os.path.basename(parent) == "runs" and os.path.isfile(os.path.join(sweep, "sweep.json")):
        # beside the sweep folder: a copy in its runs/ would be taken for a run of an earlier grid
        return (f"a cell of the sweep {shown(sweep)} (its results.csv and report)",
                shown(os.path.join(os.path.dirname(sweep), f"{name}-extended")))
    table = os.path.join(parent, "comparison.csv")
    try:
        with open(table, newline="") as handle:
            listed = {os.path.basename(os.path.normpath(row.get("run_dir") or "")) for row in csv.DictReader(handle)}
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    if name in listed:  # beside it: the comparison run again reuses its runs by name, and -extended is none
        return (f"one of the runs of the comparison {shown(table)} (and its plot)",
                shown(os.path.join(parent, f"{name}-extended")))
    return None


def extension_record(raised: Mapping[str, tuple], at: Mapping[str, Any]) -> dict:
    """The entry a run's ``config.json`` and ``summary.json`` keep (``extensions``) for each time its
    budgets were raised: the budgets before and after, and where the run was taken on from (``at``:
    the checkpoint's update and virtual time).

    >>> extension_record({"max_updates": (30, 60)}, {"update": 30, "virtual_time": 12.5})
    {'from': {'max_updates': 30}, 'to': {'max_updates': 60}, 'update': 30, 'virtual_time': 12.5}
    """
    return {"from": {name: old for name, (old, _) in raised.items()},
            "to": {name: new for name, (_, new) in raised.items()}, **at}


def _namespace(algorithm: str) -> str:
    try:
        return algorithms.get(algorithm).option_namespace()
    except KeyError:
        return "algorithm_options"


def _first_line(error: BaseException) -> str:
    """``Type: first line`` of ``error``, at most 200 characters; tensorstore's pointer to its details
    (a bound method's repr, not the details) left out.

    >>> _first_line(Exception("Encountered error while reading array index: (slice(0, 2, 1),). See full "
    ...                       "TensorStore details: <bound method pybind11_detail_function_record_v1_system...>"))
    'Exception: Encountered error while reading array index: (slice(0, 2, 1),)'
    """
    text = str(error).strip().splitlines()
    line = text[0].split(". See full TensorStore details:")[0] if text else ""
    line = f"{type(error).__name__}: {line}" if line else type(error).__name__
    return line if len(line) <= 200 else line[:197] + "..."


def _why_no_checkpoints(run_dir: str) -> str:
    """Why a run folder has no checkpoints: its config keeps none, or they were deleted or never written."""
    try:
        with open(os.path.join(run_dir, "config.json")) as file:
            config = json.load(file)["config"]
        if "checkpoint_every" in config and config["checkpoint_every"] is None and config.get("final_checkpoint") is False:
            return "the run keeps none: checkpoint_every=None, final_checkpoint=False"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return "deleted, or the run was killed before its first checkpoint"


def candidates(run_dir: str, warn: bool = True, check_lock: bool = True) -> list[str]:
    """The complete checkpoint folders of a run, newest first; :class:`ResumeError` if there are none
    (no ``checkpoints/`` folder, or a ``latest`` pointer to a deleted checkpoint and nothing else),
    :class:`InUse` first (``check_lock``) where another process is writing a run that has none yet.

    A folder is complete once renamed from ``tmp-…`` (:func:`jaxfl.checkpoint.save`), so one newer
    than ``latest`` (a crash between the rename and the pointer's update) is taken too.
    """
    root = os.path.join(os.path.abspath(run_dir), "checkpoints")
    if not os.path.isdir(root):
        if check_lock:  # a run still going, before its first checkpoint: not "start it again"
            check_not_in_use(run_dir)
        raise ResumeError(f"cannot resume {run_dir!r}: it has no checkpoints/ folder ({_why_no_checkpoints(run_dir)}); "
                          "nothing to resume from: start the run again")
    folders = sorted((n for n in os.listdir(root) if n.startswith("ckpt-") and os.path.isdir(os.path.join(root, n))),
                     key=checkpoint.checkpoint_order, reverse=True)
    pointer = os.path.join(root, "latest")
    named = None
    if os.path.isfile(pointer):
        with open(pointer) as handle:
            named = handle.read().strip()
    if named and named not in folders:
        if not folders:
            raise ResumeError(f"cannot resume {run_dir!r}: checkpoints/latest names {named}, which does not exist, "
                              f"and no other checkpoint does; nothing to resume from: start the run again")
        if warn:
            warn_user(f"{run_dir}: checkpoints/latest names {named}, which does not exist; trying {folders[0]}", ResumeWarning)
    if not folders:
        raise ResumeError(f"cannot resume {run_dir!r}: checkpoints/ holds no checkpoint; nothing to resume from: "
                          f"start the run again")
    return [os.path.join(root, name) for name in folders]


def _stored_config(folder: str) -> dict | None:
    """A checkpoint's stored config record; None if it predates stored configs; ValueError if damaged."""
    stored = checkpoint.load_config(folder)
    if stored is None:
        return None
    if not isinstance(stored, dict) or not isinstance(stored.get("config"), dict) or \
            stored.get("config_sha256") != digest(stored["config"]):
        raise ValueError("config.json does not match its SHA-256")
    return stored["config"]


def _compare(run_dir: str, folder: str, stored: dict | None, record: dict) -> None:
    """Refuse a checkpoint written under another config than the run's config.json."""
    name = os.path.basename(folder)
    if stored is None:
        warn_user(f"{run_dir}: {name} stores no config (an older jaxfl wrote it), so config.json is "
                  f"trusted as it is", ResumeWarning)
        return
    # before FedOpt's fields (2026-11-24), adam, yogi and adagrad were optax's: no value of the fields runs them
    if "server_tau" not in stored and stored.get("server_optimizer") in ("adam", "yogi", "adagrad"):
        optimizer = stored["server_optimizer"]
        raise ResumeError(f"cannot resume {run_dir!r}: {name} was written by a jaxfl before 2026-11-24, whose "
                          f"server_optimizer {optimizer!r} was optax's {optimizer}, not the FedOpt {optimizer} of "
                          f"Reddi et al. that {optimizer!r} names now, so the run cannot go on as it ran; start it again")
    # a field added since the checkpoint was written: it ran as the field's value before it existed;
    # one that may differ now (devices, stored by an older jaxfl) is not compared
    added = {**FIELDS_ADDED_BEFORE_NAMES, **FIELDS_ADDED}
    stored = {**{field: value for field, value in added.items() if field in record},
              **{name: value for name, value in as_recorded(stored).items() if name not in MAY_DIFFER}}
    if "output_dir" in stored:  # a "~/runs" written before jaxfl expanded it names the folder it holds now
        stored["output_dir"] = user_path(stored["output_dir"])
    differing = [field for field in EXTENDABLE if field in stored and field in record and stored[field] != record[field]]
    if differing:  # written before the run was extended, under the budgets it had then: it goes on under the new ones
        had, now = _budget_history(run_dir)
        for field in differing:
            if field in now and now[field] == record[field] and stored[field] in had[field]:
                stored[field] = record[field]
    if digest(stored) == digest(record):
        return
    found = differences(stored, record, holder=name)
    if not found:  # the same values spelled apart: 1 in the checkpoint, 1.0 in config.json (an int given in
        return     # Python for a float field, which reading config.json turns into a float)
    raise ResumeError(f"cannot resume {run_dir!r}: config.json differs from the config {name} was written with: "
                      f"{'; '.join(found)}; restore config.json (or start a new run to change them)")


def check_config(run_dir: str, config: RunConfig) -> None:
    """Before any work: :class:`ResumeError` if the run has no checkpoint, or if its newest checkpoint
    with a readable stored config was written under another config than ``config`` (validated).

    >>> check_config("/nonexistent-run", validate(RunConfig()))
    Traceback (most recent call last):
    jaxfl.resume.ResumeError: cannot resume '/nonexistent-run': it has no checkpoints/ folder (deleted, or the run was killed before its first checkpoint); nothing to resume from: start the run again
    """
    record = config_record(config)
    for folder in candidates(run_dir, warn=False):
        try:
            stored = _stored_config(folder)
        except (OSError, ValueError):  # damaged: load_checkpoint skips it, saying so
            continue
        if stored is not None:
            _compare(run_dir, folder, stored, record)
        return


def _agreed(name: str, failure: str | None) -> str | None:
    """This process's failure to read checkpoint ``name``, or where every process read it but
    another, that one's: with several processes all take a checkpoint or all skip it."""
    from jaxfl import cluster

    read_back = cluster.all_processes(failure is None)
    if failure is None and not all(read_back):
        failure = f"{name}: unreadable on process {read_back.index(False)}"
    return failure


def _logs_reach(run_dir: str, name: str, offsets: dict) -> str | None:
    """Why checkpoint ``name`` cannot continue the run's logs (None: it can): a CSV table or a CSV
    event log missing, or shorter than when the checkpoint was written. The logs are only flushed
    between checkpoints (synced when one is written), so a crash of the machine can take their ends
    and leave a newer checkpoint than they reach; cutting a file back to an offset past its end would
    pad it with zero bytes. A Parquet event log: the rows its readable parts hold in order."""
    from jaxfl.runlog import CSV_NAME, event_log_format, parquet_rows

    events = offsets.get("events") or {}
    if isinstance(events, int):  # a checkpoint from before EventLog.position(): the CSV's byte length
        events = {"format": "csv", "bytes": events}
    sizes = {file: offset for file, offset in offsets.items() if file != "events"}
    on_disk = event_log_format(run_dir)
    if events.get("format") == "csv" and on_disk != "parquet":  # switched since: rows
        sizes[CSV_NAME] = events["bytes"]
    elif events.get("rows") is not None and on_disk == "parquet":
        held = parquet_rows(run_dir)  # the readable parts, in order: a lost or cut part ends them
        if held < events["rows"]:
            return f"{name}: the event log (events/) holds {held} rows, fewer than the {events['rows']} it had " \
                   f"when {name} was written"
    elif events and on_disk is None:
        return f"{name}: the event log is missing (neither events.csv nor events/)"
    for file, offset in sizes.items():
        path = os.path.join(run_dir, file)
        if not os.path.isfile(path):
            return f"{name}: {file} is missing"
        size = os.path.getsize(path)
        if size < offset:
            return f"{name}: {file} holds {size} bytes, fewer than the {offset} it had when {name} was written"
    return None


def _set_aside(run_dir: str, skipped: list[str], taken: str) -> str:
    """Move the checkpoints newer than ``taken`` that could not be read (or that the logs do not
    reach) into ``checkpoints/skipped/``, and point ``latest`` at ``taken``: left in place, the newest
    name would be one the run cannot continue from (named by the next interrupt, warned about at
    every resume, and counted among the checkpoints a run keeps, so that a good one was pruned
    instead). The resumed run writes those updates' checkpoints again. Returns the folder."""
    root = os.path.dirname(taken)
    aside = os.path.join(root, "skipped")
    os.makedirs(aside, exist_ok=True)
    for folder in skipped:
        if checkpoint.checkpoint_order(os.path.basename(folder)) > checkpoint.checkpoint_order(os.path.basename(taken)) \
                and os.path.isdir(folder):
            target = os.path.join(aside, os.path.basename(folder))
            if os.path.exists(target):  # skipped at an earlier resume too: the newer copy is kept
                import shutil

                shutil.rmtree(target)
            os.rename(folder, target)
    from jaxfl.runlog import written_atomically

    with written_atomically(os.path.join(root, "latest")) as pointer, open(pointer, "w") as handle:
        handle.write(os.path.basename(taken) + "\n")
    return aside


def load_checkpoint(run_dir: str, config: RunConfig, engine) -> tuple[str, dict, dict]:
    """``(folder, state, device tree)`` of the newest checkpoint of ``run_dir`` that reads back
    completely, after checking that it was written under ``config`` (validated).

    Each unreadable checkpoint (a damaged ``config.json``, a corrupt or missing ``state.pkl`` or
    orbax data), and each that the run's logs no longer reach (a log missing, or shorter than when
    the checkpoint was written: a machine's crash can take the logs' unsynced ends), is skipped with
    a :class:`ResumeWarning` and, where newer than the one taken, moved into ``checkpoints/skipped/``;
    none readable, or one written under another config, is a :class:`ResumeError`. ``engine`` (a fresh :class:`~jaxfl.engine.Engine` of
    ``config``) gives the shapes the device data is restored into.

    In a run of several processes (:mod:`jaxfl.cluster`) every process calls it and all restore the
    same checkpoint: they try process 0's list of candidates in its order, and a checkpoint is taken
    only if it read back on every process (each one reads it whole from the shared run directory).
    """
    from jaxfl import cluster

    record = config_record(config)
    failures, skipped = [], []
    folders = candidates(run_dir)
    if cluster.process_count() > 1:  # the same candidates, in the same order, on every process
        root = os.path.dirname(folders[0])
        folders = [os.path.join(root, name) for name in
                   cluster.broadcast_text("\n".join(os.path.basename(folder) for folder in folders)).split("\n")]
    for folder in folders:
        name = os.path.basename(folder)
        if not os.path.isfile(os.path.join(folder, "state.pkl")):
            # not an older jaxfl's checkpoint without config.json: one whose removal was cut short
            failure = f"{name}: incomplete (no state.pkl)"
        else:
            try:
                stored = _stored_config(folder)
            except (OSError, ValueError) as error:
                failure = f"{name}: config.json unreadable ({_first_line(error)})"
            else:
                _compare(run_dir, folder, stored, record)
                failure = None
        state = tree = None
        if failure is None:
            try:
                state = checkpoint.load_state(folder)
                if not isinstance(state, dict) or any(key not in state for key in _STATE_KEYS):
                    raise ValueError("not a jaxfl checkpoint state")
            except Exception as error:  # pickle raises anything on corrupt bytes (ValueError, EOFError, ...)
                failure = f"{name}: state.pkl unreadable ({_first_line(error)})"
            else:
                failure = _logs_reach(run_dir, name, state["offsets"])
        # orbax's restore is collective: every process goes on to it for this folder, or none does
        failure = _agreed(name, failure)
        if failure is None:
            try:
                tree = checkpoint.load_device(folder, engine, state["engine"])
            except Exception as error:  # orbax/tensorstore raise many kinds on corrupt or missing data
                said = str(error) if isinstance(error, checkpoint.DeviceFilesDamaged) else _first_line(error)
                failure = f"{name}: device data unreadable ({said})"
            if failure is not None:  # the failed restore's reads, which its error held, go now while they are
                gc.collect()          # filtered quietly (checkpoint.load_device), not unfiltered at exit
            failure = _agreed(name, failure)
        if failure is not None:
            failures.append(failure)
            skipped.append(folder)
            continue
        try:  # a checkpoint of a jaxfl older than the per-client state store: its tables move there
            engine.move_tables_from_hook_state(tree, state["engine"])
        except ValueError as error:
            raise ResumeError(f"cannot resume {run_dir!r}: {name} {error}: start the run again, or resume it with "
                              "the jaxfl version that wrote it") from None
        if failures:
            aside = ""
            if cluster.process_index() == 0 and any(checkpoint.checkpoint_order(os.path.basename(old)) >
                                                     checkpoint.checkpoint_order(name) for old in skipped):
                aside = f"; moved into {_set_aside(run_dir, skipped, folder)}"
            warn_user(f"{run_dir}: resuming from {name} (global update {state['simulation'].version}) "
                      f"because {'; '.join(failures)}{aside}", ResumeWarning)
        return folder, state, tree
    raise ResumeError(f"cannot resume {run_dir!r}: no checkpoint reads back: {'; '.join(failures)}; "
                      f"{_no_checkpoint_next_step(failures)}")


def _no_checkpoint_next_step(failures: list[str]) -> str:
    """What a user can do when no checkpoint of a run reads back (the end of the ResumeError)."""
    again = ("or start the run again: the command that started it, without --resume, starts a new run "
             "beside this one")
    if any("is missing" in failure or "fewer than" in failure for failure in failures):
        return f"restore the run's logs named above (a copy of the folder?), {again}"
    return again[3:]
