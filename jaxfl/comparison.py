"""Side-by-side runs of several algorithms: the table (CSV) and the accuracy-over-virtual-time plot.

``jaxfl run --algorithm a,b,c`` (and ``jaxfl demo``) end here: every comparison writes
``comparison.csv`` and ``comparison.png`` in the output folder and prints where they are.

>>> import jaxfl, tempfile
>>> from jaxfl.comparison import compare
>>> out = tempfile.mkdtemp()
>>> configs = [jaxfl.RunConfig(algorithm=name, model="logreg", clients=3, local_steps=2, batch_size=16,
...                            max_updates=1, progress=False, output_dir=out) for name in ("fedavg", "fedbuff")]
>>> comparison = compare(configs)
>>> [row["algorithm"] for row in comparison.rows], os.path.basename(comparison.plot)
(['fedavg', 'fedbuff'], 'comparison.png')
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import shutil
import tempfile
import typing

from jaxfl._user_warnings import warn_user
from jaxfl.plot import percent, significant
from jaxfl.runlog import diverged, read_json, run_jaxfl_code, write_csv

COLUMNS = ("algorithm", "time_to_target", "best_accuracy", "final_accuracy", "global_updates",
           "client_steps_executed", "wall_time_s", "stop_reason")  # from each run's summary.json
# and the jaxfl that made each run (runlog.jaxfl_code): a comparison reuses runs an earlier command finished
# and the mean fraction of the run each client spent training (summary.json's timeline): where a
# synchronous round waits for its slowest client, the others idle
UTILISATION = "client_utilisation"


# the stop reasons of a run that NumericalError (or RunStopped: a negative time, an evaluation grid) ended
STOPPED_REASONS = ("numerical error", "negative time", "evaluation grid")


class StoppedRun(typing.NamedTuple):
    """A run of a comparison that a numerical error stopped (its model diverged): its folder, its
    ``summary.json`` (``stop_reason`` "numerical error: ...") and the error. The comparison goes on
    with the next algorithm and lists it, as a sweep goes on with its next cell."""

    run_dir: str
    summary: dict
    error: Exception


def run_or_stopped(run, config):
    """``run(config)``'s result, or a :class:`StoppedRun` where a numerical error stopped it (said
    in a warning): one diverging algorithm (a learning rate too large for it) leaves the others to
    run and the comparison to be written."""

    from jaxfl.scheduler.simulation import NumericalError

    try:
        return run(config)
    except NumericalError as error:
        if error.run_dir is None:
            raise
        warn_user(f"{config.algorithm}: run stopped: {error}")
        return StoppedRun(error.run_dir, read_json(os.path.join(error.run_dir, "summary.json")), error)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What a comparison wrote: one row per run (:data:`COLUMNS`, ``client_utilisation``, ``jaxfl_code`` and ``run_dir``), the table's and
    the plot's paths, and the runs themselves (:class:`jaxfl.experiment.RunResult`, or :class:`StoppedRun`
    for a run that a numerical error stopped)."""

    rows: list[dict]
    table: str
    plot: str
    results: list

    @property
    def run_dirs(self) -> list[str]:
        """The run directories, in the order the algorithms ran."""
        return [row["run_dir"] for row in self.rows]


def check_plotting() -> None:
    """Fail at once, not after the runs, if the plot cannot be drawn (matplotlib is a dependency
    of jaxfl, so this only fires in an environment installed without it).

    >>> check_plotting()
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise ImportError(f"a comparison writes an accuracy plot and needs matplotlib ({error}); "
                          "reinstall jaxfl (pip install -e .) or pip install matplotlib") from None


@contextlib.contextmanager
def shared_compilations():
    """Within the block, a run reuses the XLA programs an earlier run compiled (the runs of a
    comparison train the same model with the same step shapes): the process's temporary cache of
    compiled programs (:func:`jaxfl.compilation_cache.process_compilations`, removed at exit), which
    the runs of other comparisons and sweeps and single runs of the process share too (notebook 02's
    three comparisons of one model). Results are unchanged (the cache keys on the program); it saves
    about a quarter of the quickstart's CPU time. A cache the user configured
    (``jax_compilation_cache_dir``) is used as it is; with ``JAXFL_COMPILATION_CACHE=off`` the block
    still shares, in a temporary folder of its own removed afterwards.

    >>> import jax
    >>> before = jax.config.jax_compilation_cache_dir
    >>> with shared_compilations() as folder:
    ...     inside = jax.config.jax_compilation_cache_dir == folder
    >>> inside, jax.config.jax_compilation_cache_dir == before
    (True, True)
    """
    import jax

    from jaxfl.compilation_cache import compilations_in, process_compilations, turned_off

    if jax.config.jax_compilation_cache_dir:
        yield jax.config.jax_compilation_cache_dir
        return
    if not turned_off():
        with process_compilations() as folder:
            yield folder
        return
    folder = tempfile.mkdtemp(prefix="jaxfl-xla-cache-")
    try:
        with compilations_in(folder):
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def share_compilations_until_exit() -> None:
    """:func:`shared_compilations` for the rest of the process (the command line's comparisons).

    >>> # share_compilations_until_exit(); then run the configs one after another
    """
    block = shared_compilations()
    block.__enter__()
    atexit.register(block.__exit__, None, None, None)


def comparison_rows(results) -> list[dict]:
    """One row per finished run: :data:`COLUMNS` from its summary, the clients' mean utilisation,
    the jaxfl that made it (:func:`jaxfl.runlog.run_jaxfl_code`), then its ``run_dir``.

    >>> from types import SimpleNamespace
    >>> summary = dict.fromkeys(COLUMNS, 0) | {"timeline": {"utilisation": {"mean": 0.5}}}
    >>> row = comparison_rows([SimpleNamespace(run_dir="runs/x", summary=summary)])[0]
    >>> row["client_utilisation"], row["run_dir"]
    (0.5, 'runs/x')
    """
    rows = [{column: result.summary[column] for column in COLUMNS}
            | {UTILISATION: result.summary.get("timeline", {}).get("utilisation", {}).get("mean"),
               "jaxfl_code": run_jaxfl_code(result.run_dir, result.summary), "run_dir": result.run_dir}
            for result in results]
    names = [row["algorithm"] for row in rows]
    if len(set(names)) < len(names):
        # two runs of one algorithm (two buffer sizes): each row says what sets it apart, as the plot's legend does
        from jaxfl.plot import _settings_of

        for row, differing in zip(rows, _settings_of([row["run_dir"] for row in rows])[1]):
            if names.count(row["algorithm"]) > 1 and differing:
                row["algorithm"] = ", ".join([row["algorithm"], *differing])
    return rows


def format_table(rows: list[dict], target: float | None) -> str:
    """The comparison as aligned text: time to target in virtual seconds ('-' = not reached) and
    the share of the time the clients were training ("busy"); a run whose model diverged (a numerical
    error) is marked so after its name.

    >>> print(format_table([{"algorithm": "fedavg", "time_to_target": 12.5, "best_accuracy": 0.91,
    ...                      "final_accuracy": 0.905, "global_updates": 7, "client_steps_executed": 700,
    ...                      "client_utilisation": 0.4382, "wall_time_s": 3.21}], 0.9))
    Time to 90% held-out accuracy (virtual seconds; '-' = not reached):
    algorithm  to target  best acc final acc  updates client steps  busy   wall s
    fedavg          12.5    0.9100    0.9050        7          700   44%      3.2
    >>> print(format_table([{"algorithm": "fedbuff", "time_to_target": None, "best_accuracy": None,
    ...                      "final_accuracy": None, "global_updates": 30, "client_steps_executed": 0,
    ...                      "client_utilisation": None, "wall_time_s": 0.0412}], None).splitlines()[-1])
    fedbuff            -         -         -       30            0     -    0.041
    """
    names = [row["algorithm"] + (" (diverged)" if diverged(row) else "") for row in rows]
    width = max(len("algorithm"), *(len(name) for name in names))
    title = (f"Time to {percent(target)} held-out accuracy (virtual seconds; '-' = not reached):" if target is not None
             else "No target accuracy for this dataset (set --target-accuracy for a time to target):")
    lines = [title,
             f"{'algorithm':<{width}} {'to target':>10} {'best acc':>9} {'final acc':>9} {'updates':>8} "
             f"{'client steps':>12} {'busy':>5} {'wall s':>8}"]
    for name, row in zip(names, rows):
        reached = "-" if row["time_to_target"] is None else significant(row["time_to_target"])
        share = row.get(UTILISATION)  # (under 1 %: its digits, not "0%")
        busy = "-" if share is None else f"{share:.0%}" if share == 0 or f"{share:.0%}" != "0%" \
            else significant(share, 1, True)
        # a run stopped before its first evaluation has no accuracy
        best, final = ("-" if row[name] is None else f"{row[name]:.4f}" for name in ("best_accuracy", "final_accuracy"))
        lines.append(f"{name:<{width}} {reached:>10} {best:>9} "
                     f"{final:>9} {row['global_updates']:>8} {row['client_steps_executed']:>12} "
                     f"{busy:>5} {significant(row['wall_time_s'], 2):>8}")  # a timing-only run's 0.04 s read 0.0
    return "\n".join(lines)


def write_comparison(results, output_dir: str) -> Comparison:
    """Write ``comparison.csv`` (one row per run) and ``comparison.png`` (held-out accuracy over
    virtual time, one curve per algorithm, the target as a dashed line) into ``output_dir``, each
    atomically, and return what was written.

    >>> # write_comparison([run_experiment(c) for c in configs], "runs").plot  ->  'runs/comparison.png'
    """
    from jaxfl.plot import plot_accuracy

    rows = comparison_rows(results)
    _say_what_is_replaced(os.path.join(output_dir, "comparison.csv"), rows)
    # the plot first: a comparison.csv stands for a comparison written whole (an interrupt while the
    # plot is drawn leaves neither)
    plot = plot_accuracy([result.run_dir for result in results], os.path.join(output_dir, "comparison.png"))
    table = write_csv(os.path.join(output_dir, "comparison.csv"), rows, [*COLUMNS, UTILISATION, "jaxfl_code", "run_dir"])
    return Comparison(rows, table, plot, list(results))


def _say_what_is_replaced(path: str, rows: list[dict]) -> None:
    """A warning where ``path`` holds another comparison's table (other runs): the same output folder
    (``runs`` by default) keeps one comparison.csv and comparison.png, and the earlier one's went
    without a word."""
    import csv

    try:
        with open(path, newline="") as handle:
            earlier = list(csv.DictReader(handle))
    except (OSError, csv.Error, UnicodeDecodeError):
        return
    if not earlier or sorted(row.get("run_dir", "") for row in earlier) == sorted(str(row["run_dir"]) for row in rows):
        return
    # the same comparison run again, some of its runs trained again into folders of their own (an algorithm
    # defined in the notebook, objects given beside the configs): its table, not another comparison's
    earlier_configs = _run_configs([row.get("run_dir", "") for row in earlier])
    if earlier_configs is not None and earlier_configs == _run_configs([str(row["run_dir"]) for row in rows]):
        return
    names = ",".join(dict.fromkeys(str(row.get("algorithm", "?")) for row in earlier))
    warn_user(f"{path} held the comparison of {names} ({len(earlier)} run{'s' * (len(earlier) != 1)}), replaced by "
              f"this one's, with comparison.png; its runs stay in their folders (give each comparison its own "
              "--output-dir to keep both tables)")


def _run_configs(run_dirs: list[str]) -> list[str] | None:
    """The runs' recorded configs and given inputs (``config.json``'s ``config`` less where the run was
    written and what a resume may change, and ``user_inputs``), sorted, as JSON; None where a folder
    has none to read."""
    import json

    from jaxfl.resume import MAY_DIFFER, ResumeError, read_record

    configs = []
    for run_dir in run_dirs:
        try:
            record = read_record(run_dir)
        except (ResumeError, OSError):  # (a folder another user's, unreadable: no table of ours to judge)
            return None
        config = {key: value for key, value in record.get("config", {}).items()
                  if key not in ("output_dir", "run_name", *MAY_DIFFER)}
        configs.append(json.dumps([config, record.get("user_inputs")], sort_keys=True, default=str))
    return sorted(configs)


def earlier_runs(config, times=None, edited: list | None = None, objects: bool = False, running: bool = False):
    """Every ``(run_dir, state)`` of a run of this very config (the record a resume compares, less the
    ``output_dir`` it was made in: a folder copied or moved holds the same runs) and the same given
    speeds (``times``: ``time_per_step``; None: drawn ones) under its ``output_dir``, in the order of
    their folders' names: ``finished``, or ``resumable`` (a checkpoint to go on from); a run without a
    checkpoint is none. A run made with an earlier version of a plug-in's or a model's file is not
    one: appended to ``edited`` as ``(run_dir, changed files)``. A run given objects beside its config
    (``init_params=``...) is none either, unless ``objects``. With ``running``, a run that another
    process is writing now (its ``.lock``), with or without a checkpoint, is ``running`` instead.

    >>> import jaxfl, tempfile
    >>> config = jaxfl.RunConfig(algorithm="fedavg", model="logreg", clients=3, local_steps=2, max_updates=1,
    ...                          progress=False, output_dir=tempfile.mkdtemp())
    >>> run = jaxfl.run_experiment(config)
    >>> [(os.path.basename(run_dir) == os.path.basename(run.run_dir), state) for run_dir, state in earlier_runs(config)]
    [(True, 'finished')]
    """
    import re
    import warnings

    from jaxfl import algorithms, checkpoint
    from jaxfl.config import ConfigError, validate
    from jaxfl.experiment import changed_sources, names_before_default_changes, run_name
    from jaxfl.resume import ResumeError, config_record, in_use_by, read_record, recorded_config
    from jaxfl.runlog import finished_summary
    from jaxfl.user_inputs import UserInputs, recorded_speeds_sha256

    try:
        with warnings.catch_warnings():  # the run's own warnings come once, from the run
            warnings.simplefilter("ignore")
            # where the run folder lies is no setting of the run: a comparison's folder copied or moved
            # (another disk, a colleague's machine) still holds its finished runs; nor is its name, which
            # the folder matched already (a sweep's cells record theirs, and were trained again)
            config = validate(config)  # named as its run was: defaults resolved (a config from Python may leave them unset)
            if config.dataset == "npz" and config.data_fingerprint is None:
                # its runs record the SHA-256 of the file's arrays (resume checks it), and are named with it:
                # a run on the file as it is now is one of this config, one on the file before an edit another
                config = _with_file_fingerprint(config)
            wanted = {**config_record(config), "output_dir": None, "run_name": None}
            cls = algorithms.get(config.algorithm)
            names = [config.run_name or run_name(config, cls.name)]
            if config.run_name is None:  # runs recorded with the field unset, before its default changed
                names += list(names_before_default_changes(config, cls.name).values())
            # the speeds are not in the config (nor its name): a run on other speeds is another run
            speeds = UserInputs(time_per_step=times).check(config).speeds_sha256()
    except (ConfigError, OSError, ValueError, KeyError, TypeError):
        return
    if not os.path.isdir(config.output_dir):
        return
    edited = [] if edited is None else edited
    for folder in sorted(os.listdir(config.output_dir)):
        if not any(folder == name or re.fullmatch(re.escape(name) + r"-\d+", folder) for name in names):
            continue
        run_dir = os.path.join(config.output_dir, folder)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                record = read_record(run_dir)
                if {**config_record(validate(recorded_config(record["config"]))), "output_dir": None,
                        "run_name": None} != wanted or \
                        recorded_speeds_sha256(record) != speeds or (_given_objects(record) and not objects):
                    continue
                changed = changed_sources(record, config)
        except (ResumeError, ConfigError, ValueError, KeyError, TypeError):
            continue
        if changed:  # another code's results (an edited plug-in or model file): not this run
            edited.append((run_dir, changed))
            continue
        if finished_summary(run_dir) is not None:  # a damaged one is rebuilt by resuming the run
            yield run_dir, "finished"
        elif running and in_use_by(run_dir) is not None:
            yield run_dir, "running"
        elif checkpoint.latest(run_dir) is not None:
            yield run_dir, "resumable"


def an_earlier_default_note(config, times=None) -> str | None:
    """Where no run of ``config`` is found to reuse but its output folder holds the same run at one
    field's earlier default (:attr:`jaxfl.algorithms.base.Algorithm.changed_defaults`: FedAsync's
    ``rule``, ``fedcompass`` before 2026-12-02), the note that says so: a comparison run again after the
    change trained that algorithm anew beside it, saying only that the comparison's table was replaced.
    None otherwise: a config that holds the earlier value itself, or a run named by its config
    (``run_name``). ``times``: the given speeds (``time_per_step``), as :func:`earlier_runs` takes them."""
    import warnings

    from jaxfl.config import ConfigError, validate
    from jaxfl.experiment import run_name
    from jaxfl.sweep import _run_at_an_earlier_default

    try:
        with warnings.catch_warnings():  # the run's own warnings come once, from the run
            warnings.simplefilter("ignore")
            config = validate(config)
            if config.run_name is not None or not os.path.isdir(config.output_dir):
                return None
            found = _run_at_an_earlier_default(dataclasses.replace(config, run_name=run_name(config)))
    except (ConfigError, OSError, ValueError, KeyError, TypeError):
        return None
    if found is None or getattr(config, found[0]) == found[1]:
        return None
    field, before, now, folder = found
    at_before = dataclasses.replace(config, **{field: before})
    reused = any(os.path.basename(run_dir) == folder for run_dir, _ in earlier_runs(at_before, times))
    return (f"{os.path.join(config.output_dir, folder)} is this {config.algorithm} run at its {field}'s earlier "
            f"default, {before!r}: this one trains it at the default now, {now!r}"
            + (f" ({field}={before!r} reuses that run)" if reused else ""))


def _with_file_fingerprint(config):
    """``config`` (dataset ``npz``) with the ``data_fingerprint`` its run records: the SHA-256 of the file's
    arrays, read as the run reads them (once a process: :func:`jaxfl.experiment.load_data` keeps them)."""
    from jaxfl.experiment import _pin_fingerprint, load_data

    return _pin_fingerprint(config, load_data(config))


# what config.json's user_inputs records of a run made from a config alone (with given speeds, the one
# input a config-only run also takes, compared apart); anything more is an object given in Python
# (initial weights, a loss, metrics, a model or optimiser object), which no config names
_CONFIG_ONLY_INPUTS = {"model_structure_sha256", "time_per_step"}


def _given_objects(record: dict) -> list[str]:
    """The objects given to a recorded run beside its config (``init_params_sha256``, ``loss``...)."""
    inputs = record.get("user_inputs")
    return sorted(set(inputs) - _CONFIG_ONLY_INPUTS) if isinstance(inputs, dict) else []


# run_experiment's keywords that compare hands every run, of which a run given one of these objects is not
# reused: its config does not name it, so a finished run cannot be known to be of the same object
_NOT_REUSED = ("model", "client_optimizer", "init_params", "loss", "metrics")


def compare(configs, reuse: bool = False, *, data=None, time_per_step=None, model=None, client_optimizer=None,
            init_params=None, loss=None, metrics=None) -> Comparison:
    """Run each config (validated and prepared, all of them, before the first run writes anything),
    then write the table and the plot into the first config's ``output_dir``.

    The configs should differ only in the algorithm and its options, so that each run sees the
    same data split, client speeds and seed (every random stream is per purpose and per client).
    Example: the module docstring; ``jaxfl.presets.preset_configs("quickstart")`` gives the
    quickstart's configs.

    ``reuse=True`` goes on as ``jaxfl run --algorithm a,b`` does: a run of the same config that
    finished under its ``output_dir`` is read back, not trained again (its
    :class:`~jaxfl.experiment.RunResult` holds its ``run_dir``, ``summary`` and ``metrics`` rows, and
    None for the ``params``, ``simulation`` and ``engine`` of a run in this process:
    ``final_params(run_dir, prepare(config)[4])`` reads its model: :func:`jaxfl.checkpoint.final_params`
    given the run's variables as a template, which :func:`jaxfl.experiment.prepare` builds, with
    ``data=`` for a run on your own data), and one interrupted after a checkpoint is
    resumed, so a notebook run again trains only what it has not finished; a finished run that a
    numerical error stopped comes back as a :class:`StoppedRun`, as when it ran. Trained again all the
    same, with a warning saying why: a run of an algorithm defined in the notebook or script itself or
    of a model registered by name (``register_model``), whose code has no file whose edits jaxfl could
    see (a plug-in or model in a file, ``file.py:Class``, is reused unless that file changed, which a
    warning says), and a run given objects beside its config
    (``init_params=``, ``loss=``...), which its config does not name.

    ``data``, ``time_per_step``, ``model``, ``client_optimizer``, ``init_params``, ``loss`` and
    ``metrics`` are given to every run, as :func:`jaxfl.run_experiment` takes them (your own data,
    measured speeds, your own model...), and checked with every config before the first run starts.
    A run on your own data or speeds is reused as any other: its folder records their SHA-256, and
    a run on other values is another run; one resumed is given them again.

    >>> import jaxfl, tempfile
    >>> out = tempfile.mkdtemp()
    >>> configs = [jaxfl.RunConfig(algorithm=name, model="logreg", clients=3, local_steps=2, max_updates=1,
    ...                            progress=False, output_dir=out) for name in ("fedavg", "fedbuff")]
    >>> first = compare(configs, reuse=True)
    >>> again = compare(configs, reuse=True)    # nothing trained: both runs read back
    >>> again.run_dirs == first.run_dirs, again.results[0].metrics == first.results[0].metrics
    (True, True)
    >>> again.results[0].params is None    # read back from its folder, not run here
    True
    """
    from jaxfl._user_warnings import notes_said_once
    from jaxfl.experiment import check_buildable, hashing_data_once, run_experiment, shared_data

    from jaxfl.config import RunConfig

    if isinstance(configs, RunConfig):
        raise TypeError("configs=RunConfig(...) is one config: compare takes a list of them (compare([config]))")
    configs = list(configs)
    if len(configs) < 1:
        raise ValueError("compare needs at least one config")
    for number, config in enumerate(configs):
        if not isinstance(config, RunConfig):
            raise TypeError(f"configs[{number}]={config!r} is not allowed: compare takes a list of RunConfig "
                            f"(jaxfl.RunConfig(algorithm=...), one per run)")
    values = dict(data=data, time_per_step=time_per_step, model=model, client_optimizer=client_optimizer,
                  init_params=init_params, loss=loss, metrics=metrics)
    given = {name: value for name, value in values.items() if value is not None}
    check_plotting()
    # the data checked here is the runs' data; its notes, and any other, said once, not once a run
    with shared_data(), hashing_data_once(), notes_said_once():
        for config in configs:
            check_buildable(config, **given)
        with shared_compilations():
            run = _run_or_reuse if reuse else run_experiment
            results = [run_or_stopped(lambda config: run(config, **given), config) for config in configs]
    return write_comparison(results, configs[0].output_dir)


def _run_or_reuse(config, **given):
    """``config``'s finished run read back (:func:`jaxfl.load_run`), its interrupted one resumed, or a new
    run (:func:`compare` with ``reuse=True``; ``given``: its keywords beside the configs)."""
    from jaxfl.experiment import TRAINED_AGAIN_BECAUSE, resume_experiment, run_experiment, say_other_xla_flags
    from jaxfl.resume import read_record

    objects = [name for name in _NOT_REUSED if name in given]
    unknown = _unknown_code(config) if not objects else \
        f"{' and '.join(f'{name}=' for name in objects)} given, which no config names"
    if objects:  # an interrupted run of them is not resumed either: said, with how to go on with it
        for run_dir, state in earlier_runs(_as_recorded(config, given), given.get("time_per_step"), objects=True):
            if state == "resumable":
                warn_user(f"{run_dir} holds an interrupted run of this config, not resumed: "
                          f"{' and '.join(f'{name}=' for name in objects)} given, which no config names; "
                          f"jaxfl.resume_experiment({run_dir!r}, {', '.join(f'{name}=...' for name in objects)}) "
                          "goes on with it, given the same objects; this run trains it again")
    if unknown is not None:
        said = TRAINED_AGAIN_BECAUSE.set(f"not reused: {unknown}" + ("" if objects else
                                                                    ", with no file whose edits jaxfl could see"))
        try:
            return run_experiment(config, **given)
        finally:
            TRAINED_AGAIN_BECAUSE.reset(said)
    edited = []
    earlier = next(earlier_runs(_as_recorded(config, given), given.get("time_per_step"), edited=edited), None)
    if earlier is None:
        if edited:  # as the command line says it
            run_dir, changed = edited[-1]
            warn_user(f"{run_dir} was made with an earlier version of {' and '.join(changed)}: not reused; "
                      "this run trains it again with the code as it is now")
        note = an_earlier_default_note(config, given.get("time_per_step"))
        if note is not None:
            warn_user(note)
        return run_experiment(config, **given)
    run_dir, state = earlier
    if state == "finished":
        say_other_xla_flags(run_dir, read_record(run_dir).get("xla_flags"), "reuses it")
        result = _read_back(run_dir)
        reason = result.summary["stop_reason"]
        if reason.startswith(STOPPED_REASONS):  # as when it ran: a StoppedRun, said
            from jaxfl.experiment import RunStopped
            from jaxfl.scheduler.simulation import NumericalError

            nan = reason.startswith("numerical error")
            error = (NumericalError if nan else RunStopped)(reason.removeprefix("numerical error: ") if nan else reason)
            error.run_dir = run_dir
            warn_user(f"{config.algorithm}: run stopped: {error} (reused: it had finished so)")
            return StoppedRun(run_dir, result.summary, error)
        return result
    warn_user(f"{config.algorithm}: resuming {run_dir}, interrupted after a checkpoint")
    # (its speeds are read back from its folder; the data is not kept there)
    return resume_experiment(run_dir, progress=config.progress, data=given.get("data"))


def _as_recorded(config, given: dict):
    """``config`` as its run records it given ``given`` (the data's name and SHA-256, ``<user: ...>``
    names of a model or optimiser object), so that only a run of the same is found."""
    from jaxfl.experiment import _with_inputs
    from jaxfl.user_inputs import UserInputs

    objects = {name: value for name, value in given.items() if name != "data"}
    return _with_inputs(config, given.get("data"), UserInputs(**objects), None, None)[0]


def _read_back(run_dir: str):
    """A finished run's :class:`~jaxfl.experiment.RunResult` from its folder: its metrics rows as the run
    returned them (the CSV holds each value's repr), without the model, simulation and engine."""
    from jaxfl.experiment import RunResult
    from jaxfl.runlog import load_run

    run = load_run(run_dir)
    names = list(run.metrics)
    rows = [dict(zip(names, (value.item() for value in values))) for values in zip(*run.metrics.values())]
    return RunResult(run_dir, run.summary, rows, params=None, simulation=None, engine=None)


def _unknown_code(config) -> str | None:
    """Why a run of ``config`` made before may not have run this code, or None where it did: a built-in
    algorithm and model, or a plug-in's or model's file that jaxfl fingerprints. A class defined in a
    notebook or script, or a model registered by name (``register_model``), has no such file: it may
    have been edited since."""
    from jaxfl.algorithms import get
    from jaxfl.experiment import algorithm_source, model_source
    from jaxfl.models.zoo import MODELS

    try:
        cls = get(config.algorithm)
    except KeyError:
        return f"the algorithm {config.algorithm!r} is not registered"
    if not (cls.__module__.startswith("jaxfl.") or algorithm_source(config.algorithm) is not None):
        return f"the algorithm {config.algorithm!r} is defined in a notebook or script"
    if not (getattr(MODELS.get(config.model), "__module__", "").startswith("jaxfl.")
            or model_source(config.model) is not None):
        return f"the model {config.model!r} is registered by name"
    return None
