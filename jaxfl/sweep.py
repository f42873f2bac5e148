"""Grids of runs: every combination of a few settings over seeds, resumable, in one tidy table.

A sweep is a base config (any fields) and a grid: field → list of values (algorithms, clients,
heterogeneity, partition, seeds, an algorithm's option such as ``port.staleness_bound``...). Every
combination is one *cell*, one run. :func:`run_sweep` validates every cell before the first run,
runs them one after another (compiling the programs they share once), and writes into the sweep
folder::

    sweep.json        the sweep: base, grid, size, each cell's swept values and run directory, and the
                      --jobs each run began under (an interrupted cell goes on with its own)
    runs/NAME/        one run directory per cell (named as jaxfl run names it: settings + config hash)
    results.csv       one row per finished cell: its swept and key settings and its summary figures
    results.parquet   the same table (where pyarrow is installed)

The table is written again after every cell that finishes, so ``jaxfl report SWEEP_DIR`` reports on a
sweep still running, or on one killed outright (SIGKILL, a lost machine), over the cells finished so far.

Calling it again with the same sweep skips finished cells (their run directory has a
``summary.json``), continues an interrupted one from its newest checkpoint, and restarts one that
was interrupted before its first checkpoint. A run directory is named by its settings, so a grid
extended in the same folder (another seed, another algorithm) reuses the cells already finished. ``jaxfl sweep`` is the command line;
:func:`jaxfl.report.make_report` turns the folder into the papers' tables and figures.

A field that a cell never reads (``buffer_size`` for FedAvg, ``dirichlet_alpha`` with the ``iid``
partition, an option of another algorithm) is left out of that cell, and cells that become equal
are run once; a field that no cell reads is an error, as ``jaxfl run`` refuses it. Two values of
one axis that a run reads alike (``client_lr = [1, 1.0]``) are an error, and so are two cells that
read different values yet come to the same config, so one run name (FedAdam's ``server_optimizer``
``sgd`` and ``adam``: it sets adam itself): either would run once and be counted twice.

>>> import tempfile
>>> base = {"model": "logreg", "local_steps": 2, "batch_size": 16, "max_updates": 1}
>>> result = run_sweep(base, {"algorithm": ["fedavg", "fedbuff"], "clients": [3]}, tempfile.mkdtemp(),
...                    progress=False)
>>> [(row["algorithm"], row["clients"], row["global_updates"]) for row in result.rows]
[('fedavg', 3, 1), ('fedbuff', 3, 1)]
>>> len(result.ran), len(result.skipped)
(2, 0)
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import shutil
import sys
import warnings
from typing import NamedTuple

from jaxfl._user_warnings import warn_user
from jaxfl import algorithms
from jaxfl.config import (user_path, ALGORITHM_FIELDS, FIELDS, SERVER_FIELDS_READ_BY, TIMING_ONLY_UNREAD, ConfigError, RunConfig,
                          _only_read_when, config_from_mapping, flat_once, load_config_file, option_namespaces,
                          reads_field, split_algorithm_options, validate)
from jaxfl.user_inputs import TIME_PER_STEP_FILE, UserInputs, recorded_speeds_sha256

# Where and how each run is written belongs to the sweep, not to a cell.
SWEEP_OWNED = ("output_dir", "run_name", "progress")
# Settings every results row carries, swept or not (the papers' tables are keyed by them).
# A run that trains by epochs has local_epochs and no local_steps: its steps differ from client to client.
KEY_SETTINGS = ("algorithm", "dataset", "model", "partition", "clients", "heterogeneity", "local_steps", "local_epochs",
                "seed")
# The summary figures of each row (summary.json; client_updates = updates aggregated, FedBuff's unit).
SUMMARY_COLUMNS = ("target_accuracy", "time_to_target", "best_accuracy", "final_accuracy", "last_tenth_accuracy",
                   "global_updates",
                   "client_updates", "client_steps_executed", "client_steps_aggregated", "client_steps_arrived",
                   "virtual_time",
                   "client_utilisation",
                   "mean_staleness", "stop_reason", "wall_time_s",
                   "jaxfl_code")  # the jaxfl that trained the run (runlog.jaxfl_code): a folder may mix versions


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the grid: its position, the swept values it reads, its validated config and the
    run directory that holds (or will hold) it."""

    index: int
    values: dict
    config: RunConfig
    run_dir: str

    def label(self) -> str:
        """The swept values as ``name=value`` pairs (how progress lines and errors name the cell).

        >>> Cell(0, {"algorithm": "fedavg", "seed": 1}, RunConfig(), "runs/x").label()
        'algorithm=fedavg seed=1'
        """
        return " ".join(f"{name}={value}" for name, value in self.values.items()) or "the base config"


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """What :func:`run_sweep` did and wrote: the cells, the results rows (one per cell, in cell order),
    the table paths, and the cell indices it ran fresh, resumed from a checkpoint, restarted (an
    interrupted run without a checkpoint) or skipped as finished."""

    sweep_dir: str
    cells: list
    rows: list
    table: str
    parquet: str | None  # None where pyarrow is not installed
    ran: list
    resumed: list
    restarted: list
    skipped: list
    notes: list
    jobs: int = 1  # cells run at once (``jobs``), each in a process of its own where more than 1
    peak_running: int = 0  # the most cells that ran at once in this call


def _flat(values: dict, where: str) -> dict:
    """A config-file mapping as flat names: section tables merged, algorithm options as ``space.option``."""
    values = dict(values)
    if "algorithm" in values and isinstance(values["algorithm"], dict) or "algorithm_options" in values:
        raise ConfigError(f"{where}: an [algorithm] table or algorithm_options does not fit a sweep (each cell's "
                          "algorithm differs); give options in their namespace, as [port] or port.staleness_bound")
    fields, options = split_algorithm_options(values)
    for name, value in fields.items():
        if name not in FIELDS:  # the nearest names, a misspelt [clinet] table as a section (as --config says)
            from jaxfl.config import PLUGIN_IMPORT_FAILURES, unknown_name

            failed = "" if isinstance(value, dict) else \
                "".join(f"; if it holds a plug-in's options: {why}" for why in PLUGIN_IMPORT_FAILURES.values())
            raise ConfigError(f"{unknown_name(name, value, where)}{failed}")
        if name in SWEEP_OWNED:
            raise ConfigError(f"{where}: {name} is set by the sweep (runs go to SWEEP_DIR/runs/, progress is one bar "
                              "for the whole grid); leave it out")
    from jaxfl import algorithms

    spaces = option_namespaces()
    flat = dict(fields)
    for space, given in options.items():
        named = algorithms.get(spaces[space][0]).Options.field_name  # an alias (compass.lambda) as its field
        for key, value in given.items():
            if f"{space}.{named(key)}" in flat:
                raise ConfigError(f"{where}: {space}.{named(key)} is given twice (as {space}.{key} too); give it once")
            flat[f"{space}.{named(key)}"] = value
    return flat


def load_sweep_file(path: str, size: str | None = None) -> tuple[dict, dict]:
    """Read a TOML (or JSON) sweep file into ``(base, grid)``: the file's settings as in a ``--config``
    file (sections as tables, options under ``[port]``...), its ``[grid]`` table of lists, and, with
    ``size``, the ``[sizes.NAME]`` table's settings over the base and its ``[sizes.NAME.grid]`` lists
    over the grid's (a ``quick`` and a ``full`` size of one study, say).

    >>> import tempfile
    >>> path = tempfile.mktemp(suffix=".toml")
    >>> _ = open(path, "w").write('''
    ... [client]
    ... local_steps = 5
    ... [grid]
    ... algorithm = ["fedavg", "fedbuff"]
    ... seed = [0, 1, 2]
    ... [sizes.quick]
    ... max_updates = 3
    ... [sizes.quick.grid]
    ... seed = [0]
    ... ''')
    >>> load_sweep_file(path, size="quick")
    ({'local_steps': 5, 'max_updates': 3}, {'algorithm': ['fedavg', 'fedbuff'], 'seed': [0]})
    """
    values = load_config_file(path)
    grid = values.pop("grid", {})
    sizes = values.pop("sizes", {})
    if not isinstance(grid, dict) or not isinstance(sizes, dict):
        raise ConfigError(f"sweep file {path!r}: [grid] and [sizes.NAME] must be tables")
    for name, table in sizes.items():  # [sizes] quick = 3 is not a size
        if not isinstance(table, dict) or not isinstance(table.get("grid", {}), dict):
            entry = f"[sizes] {name} = {table!r}" if not isinstance(table, dict) else \
                f"[sizes.{name}] grid = {table['grid']!r}"
            raise ConfigError(f"sweep file {path!r}: {entry} is not allowed: each size is a table of overrides, "
                              f"[sizes.{name}] with settings under it (max_updates = 3) and its own "
                              f"[sizes.{name}.grid] table of lists")

    def once(table: dict, where: str) -> dict:  # _flat, refusing a setting spelled twice (clients and [data] clients)
        return flat_once(table, where, lambda entry: _flat(entry, where))

    base = once(values, f"sweep file {path!r}")
    # the axes by the names the flags and the base give them: a hyphenated axis kept its values over a
    # flag's, and [grid.port] tables were refused; one setting spelled twice is refused, as in the base
    grid = once(grid, f"sweep file {path!r} [grid]")
    def flat_names(table: dict) -> set:  # a hyphenated key as the flags name it
        return {key.replace("-", "_") for key in table}

    swept = flat_names(grid)
    both = [name for name in base if name.replace("-", "_") in swept]
    if both:  # the grid's values replace the base's: a setting there would be silently read by no cell
        raise ConfigError(f"sweep file {path!r}: {', '.join(both)} is set in the base settings and swept in [grid]; "
                          "every cell takes the grid's values: give it in one place (one value: drop it from "
                          "[grid], or choose it in a [sizes.NAME] table)")
    # every size checked, not only the chosen one: a misspelt key in [sizes.full] surfaces today
    tables = {name: (once({key: value for key, value in table.items() if key != "grid"},
                          f"sweep file {path!r} [sizes.{name}]"),
                     once(table.get("grid", {}), f"sweep file {path!r} [sizes.{name}.grid]"))
              for name, table in sizes.items()}
    if size is not None:
        if size not in sizes:
            allowed = ", ".join(sizes) if sizes else "none: the file has no [sizes.NAME] tables"
            raise ConfigError(f"size={size!r} is not allowed: sizes in {path!r}: {allowed}")
        settings, size_grid = tables[size]
        # a size's one value of a swept setting overrides the axis, as a one-value flag does
        chosen = flat_names(settings)
        grid = {key: values for key, values in grid.items() if key.replace("-", "_") not in chosen}
        base.update(settings)
        grid = {**grid, **size_grid}
    return base, grid


def _check_grid(grid: dict) -> dict:
    """The grid with flat names, each axis a non-empty list of distinct values: distinct as the run
    reads them (:func:`_as_read`), so ``client_lr = [1, 1.0]`` is refused, naming both spellings.

    >>> _check_grid({"client_lr": [1, 1.0]})
    Traceback (most recent call last):
    ...
    jaxfl.config.ConfigError: grid client_lr=[1, 1.0] is not allowed: 1 and 1.0 are the same client_lr (one value spelled twice); give each value once
    """
    if not isinstance(grid, dict):  # (None raised a bare AttributeError)
        raise ConfigError(f"grid={grid!r} is not allowed: a mapping of setting → list of values ({{}} for one cell)")
    checked = {}
    for key, values in grid.items():
        name = key.replace("-", "_")
        if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
            raise ConfigError(f"grid {name}={values!r} is not allowed: a list of values (for one value, set it in "
                              "the base settings)")
        if not values:
            raise ConfigError(f"grid {name}=[] is not allowed: at least one value")
        from jaxfl.config import _plain_number

        # NumPy's scalars (list(np.arange(1, 3))) as the numbers they hold: sweep.json wrote them as strings
        values = [_plain_number(value) for value in values]
        if len({json.dumps(value, sort_keys=True, default=str) for value in values}) != len(values):
            raise ConfigError(f"grid {name}={list(values)!r} is not allowed: a value appears twice")
        flat = _flat({name: values[0]}, f"grid {name}")
        flat_name = next(iter(flat))
        seen = {}
        for value in values:
            read = json.dumps(_as_read(flat_name, value), sort_keys=True, default=str)
            if read in seen:
                raise ConfigError(f"grid {name}={list(values)!r} is not allowed: {seen[read]!r} and {value!r} are the "
                                  f"same {name} (one value spelled twice); give each value once")
            seen[read] = value
        checked[flat_name] = list(values)
    return checked


def _as_read(name: str, value):
    """``value`` of the flat setting ``name`` as a run reads it (an int where a float is wanted as
    the float, 'inf' as infinity, ...: :func:`jaxfl.config._coerce`); as given where that fails
    (validation names a bad value)."""
    from jaxfl.config import _coerce

    try:
        if name in FIELDS:
            return _coerce(value, FIELDS[name].type)
        space, option = name.split(".", 1)
        options = algorithms.get(option_namespaces()[space][0]).Options
        field = {field.name: field for field in dataclasses.fields(options)}[options.field_name(option)]
        return _coerce(value, field.type)
    except Exception:  # an unknown namespace or option: validation says so, naming the cell
        return value


def _unread(values: dict) -> list[str]:
    """The names in a cell's flat mapping that its run never reads: another algorithm's options and
    fields, and data/speed/fault settings its partition, dataset or speed model ignores."""
    fields, options = split_algorithm_options(values)
    try:
        cls = algorithms.get(fields.get("algorithm", RunConfig.algorithm))
    except KeyError:
        return []  # validation names the bad algorithm
    # an algorithm field at its default is still not read: leaving it out makes such cells equal
    unread = [name for name in ALGORITHM_FIELDS if name in fields and
              not reads_field(cls, name, lambda given: fields.get(given) is not None)]
    # unvalidated: only reads the partition, dataset and speed/fault names to decide what is read
    settings = RunConfig(**{name: value for name, value in fields.items() if name in FIELDS})
    if cls.server_optimizer is not None:  # FedAdam's adam: what validate() will set, and what reads server_tau
        settings = dataclasses.replace(settings, server_optimizer=cls.server_optimizer)
    unread += [name for name, (read, _) in _only_read_when(settings).items() if not read and name in fields]
    if fields.get("fednova") and not cls.supports_fednova(settings):  # FedNova normalises only where it can
        unread.append("fednova")
    own = cls.option_namespace()
    unread += [f"{space}.{key}" for space, given in options.items() if space != own for key in given]
    return unread


def read_by_no_cell(base: dict, grid: dict) -> list[str]:
    """The settings of ``base`` and the axes of ``grid`` (flat names, :func:`_flat`) that no cell of
    the grid reads, sorted: what :func:`expand` refuses. The command line uses it to leave out a
    sweep file's settings and axes that its own grid reads but a flag's narrower grid does not
    (``--algorithm fedavg`` on a file that sets FedBuff's ``buffer_size`` or sweeps FedASMU's
    ``fedasmu.fetch``).

    >>> read_by_no_cell({"model": "mlp", "buffer_size": 5},
    ...                 {"algorithm": ["fedavg", "fedavgm"], "fedasmu.fetch": [True, False]})
    ['buffer_size', 'fedasmu.fetch']
    """
    grid = _check_grid(grid)
    base = {name: value for name, value in base.items() if name not in grid}
    read = set()
    for combination in itertools.product(*grid.values()):
        values = {**base, **dict(zip(grid, combination))}
        read |= values.keys() - set(_unread(values))
    return sorted((base.keys() | grid.keys()) - read)


def expand(base: dict, grid: dict, sweep_dir: str) -> tuple[list[Cell], list[str]]:
    """Every combination of the grid over the base, validated, as :class:`Cell` s (in the grid's order,
    the last axis fastest), and notes on fields left out of the cells that do not read them.

    A bad value fails here, before any run, naming the cell and the field.

    >>> cells, notes = expand({"model": "logreg", "buffer_size": 5},
    ...                       {"algorithm": ["fedavg", "fedbuff"], "seed": [0, 1]}, "sweeps/x")
    >>> [cell.label() for cell in cells], cells[3].config.buffer_size
    (['algorithm=fedavg seed=0', 'algorithm=fedavg seed=1', 'algorithm=fedbuff seed=0', 'algorithm=fedbuff seed=1'], 5)
    >>> notes
    ['buffer_size applies only to the cells that read it (algorithm=fedbuff)']
    """
    return _expand(_flat(base, "sweep base") if base else {}, _check_grid(grid), sweep_dir)


def _expand(base: dict, grid: dict, sweep_dir: str) -> tuple[list[Cell], list[str]]:
    """:func:`expand` of a flat ``base`` (:func:`_flat`) and a checked ``grid`` (:func:`_check_grid`)."""
    base = {name: value for name, value in base.items() if name not in grid}  # an axis replaces the base's value
    axes = list(grid)
    cells, seen, dropped, applies, named, notes = [], set(), set(), {}, {}, []
    from jaxfl.experiment import run_name

    for combination in itertools.product(*(grid[name] for name in axes)):
        swept = dict(zip(axes, combination))
        values = {**base, **swept}
        unread = set(_unread(values))
        dropped |= unread
        for name in values.keys() - unread:  # under which settings each field is read, for the notes
            deciding = _DECIDING.get(name, ("algorithm",))  # data/speed settings, else the algorithm
            applies.setdefault(name, set()).add(" ".join(f"{axis}={swept[axis]}" for axis in axes if axis in deciding))
        kept = {name: value for name, value in values.items() if name not in unread}
        key = json.dumps(kept, sort_keys=True, default=str)
        if key in seen:  # equal once the unread fields are left out: one run
            continue
        seen.add(key)
        shown = {name: value for name, value in swept.items() if name not in unread}
        try:
            config = config_from_mapping({**kept, "progress": False})
        except ConfigError as error:
            where = " ".join(f"{name}={value}" for name, value in swept.items()) or "the base config"
            raise ConfigError(f"sweep cell {len(cells)} ({where}): {error}") from None
        config = dataclasses.replace(config, output_dir=os.path.join(sweep_dir, "runs"), run_name=run_name(config))
        earlier = _run_at_an_earlier_default(config)
        if earlier is not None:
            field, before, now, folder = earlier
            if getattr(config, field) == before:  # the run it is: its cell goes on there (or reports it)
                config = dataclasses.replace(config, run_name=folder)
            else:
                where = " ".join(f"{name}={value}" for name, value in shown.items()) or "the base config"
                notes.append(f"cell {len(cells)} ({where}) runs {config.algorithm}'s {field} at its default now, "
                             f"{now!r}; runs/{folder} is the same run at its earlier default, {before!r}: "
                             f"{field}={before} in the grid reports that run")
        if config.run_name in named:  # equal configs: one run folder, one run, counted once
            raise _same_run(cells[named[config.run_name]], len(cells), shown, config.run_name)
        named[config.run_name] = len(cells)
        cells.append(Cell(len(cells), shown, config, os.path.join(sweep_dir, "runs", config.run_name)))
    never = sorted(dropped - applies.keys())
    if never:
        from jaxfl.config import TIMING_ONLY_UNREAD

        given = {**base, **grid}
        why = "jaxfl run --help says which algorithm, dataset, partition or speed model does"
        if cells and all(cell.config.timing_only for cell in cells) and \
                set(never) <= {*TIMING_ONLY_UNREAD, "eval_every", "checkpoint_every"}:
            why = "every cell is timing-only: no training, evaluation or checkpoint"
        raise ConfigError(f"{', '.join(f'{name}={given[name]!r}' for name in never)} is not allowed: no cell of "
                          f"this sweep reads {'it' if len(never) == 1 else 'them'} ({why}); leave it out")
    by_cells: dict[str, list[str]] = {}  # the fields read by the same cells: one note (FedASMU's 12 options)
    for name in sorted(dropped):
        by_cells.setdefault("; ".join(sorted(label for label in applies[name] if label)), []).append(name)  # "": no axis
    for where, names in by_cells.items():
        notes.append(f"{', '.join(names)} appl{'y' if len(names) > 1 else 'ies'} only to the cells that read "
                     f"{'them' if len(names) > 1 else 'it'}" + (f" ({where})" if where else ""))
    return cells, notes


def _run_at_an_earlier_default(config: RunConfig) -> tuple[str, object, object, str] | None:
    """``(field, default before, default now, folder)`` where ``config``'s output folder holds a run of
    this very config but for one field its algorithm recorded unset before that field's default
    changed (:attr:`jaxfl.algorithms.base.Algorithm.changed_defaults`; FedAsync's ``rule``): such a
    run's folder has the old name, the hash of the field unset, which no validated config hashes to
    now. ``config`` is a cell's: validated, with its run name; None where its own folder exists."""
    from jaxfl.experiment import names_before_default_changes
    from jaxfl.resume import ResumeError, config_record, read_record, recorded_config

    if os.path.exists(os.path.join(config.output_dir, config.run_name)):
        return None
    for field, folder in names_before_default_changes(config).items():
        before, now = algorithms.get(config.algorithm).changed_defaults[field]
        try:
            recorded = read_record(os.path.join(config.output_dir, folder))["config"]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the run's own notes came when it ran
                ran = validate(recorded_config(recorded))
        except (ResumeError, ConfigError, ValueError, KeyError, TypeError):
            continue
        where = {"output_dir": config.output_dir, "run_name": config.run_name}
        if config_record(dataclasses.replace(ran, **where)) == config_record(dataclasses.replace(config, **{field: before})):
            return field, before, now, folder
    return None


def _same_run(earlier: Cell, index: int, values: dict, name: str) -> ConfigError:
    """The error for a cell whose validated config is an earlier cell's (one run name: settings and
    config hash) though its swept values differ: they would run into one folder and be counted
    twice. Cells equal once the settings they do not read are left out never get here (run once)."""
    differ = [axis for axis in dict.fromkeys([*earlier.values, *values]) if earlier.values.get(axis) != values.get(axis)]
    pairs = ", ".join(f"{axis}={earlier.values.get(axis)!r} and {values.get(axis)!r}" for axis in differ)
    label = " ".join(f"{axis}={value}" for axis, value in values.items()) or "the base config"
    return ConfigError(f"sweep cells {earlier.index} ({earlier.label()}) and {index} ({label}) are not allowed "
                       f"together: they are one run ({name}), counted twice: {pairs} give the same config (one "
                       "value spelled two ways, a value the algorithm sets itself, or a setting that changes no "
                       "result); keep one of the values, or sweep the rest in a grid of their own")


# The settings that decide whether a data/speed/fault field is read (for the notes only).
_DECIDING = {"dirichlet_alpha": ("partition",), "dirichlet_min_samples": ("partition",), "dirichlet_balance": ("partition",), "client_sizes": ("partition",), "size_skew": ("partition", "client_sizes"),
             "shards_per_client": ("partition",), "gamma": ("partition",), "data_dir": ("dataset",),
             "speed_cap": ("heterogeneity",), "negative_times": ("heterogeneity", "jitter"), "speed_reference_time": ("heterogeneity",),
             "speed_ratio": ("heterogeneity",), "speed_legacy_seed": ("heterogeneity",),
             "speed_unit": ("local_epochs",), "delay_factor": ("delay_prob",),
             "dropout_mean": ("dropout_prob",), "eval_every": ("eval_interval", "timing_only"),
             "checkpoint_every": ("timing_only",), "staleness_a": ("staleness", "algorithm"),
             **{name: ("timing_only",) for name in TIMING_ONLY_UNREAD},
             "clients_per_call": ("timing_only", "batching"), "steps_per_call": ("timing_only", "step_loop"),
             "checkpoint_min_interval_s": ("timing_only", "checkpoint_every"),
             **{name: ("algorithm", "server_optimizer") for name in SERVER_FIELDS_READ_BY}}



def cell_state(run_dir: str) -> str:
    """Where a cell stands: ``finished`` (its run directory has a ``summary.json``, written when a
    run ends, also by a numerical error), ``resumable`` (interrupted after a checkpoint),
    ``restart`` (interrupted before its first checkpoint: it starts again) or ``new``.

    >>> cell_state("/no/such/run")
    'new'
    """
    from jaxfl import checkpoint

    if not os.path.isdir(run_dir):
        return "new"
    from jaxfl.runlog import finished_summary

    if finished_summary(run_dir) is not None:  # a damaged one is rebuilt by resuming the run
        return "finished"
    return "resumable" if checkpoint.latest(run_dir) is not None else "restart"


def _prepare_all(cells: list[Cell]) -> None:
    """Build every distinct data set, split and model once, before the first run: what only the
    data can tell (a model that does not fit its images, too few samples for the clients) fails
    here, not after hours of other cells."""
    from jaxfl.experiment import check_buildable

    done = set()
    for cell in cells:
        config = cell.config
        key = json.dumps([dataclasses.asdict(config.data), config.seed, config.timing_only], default=str)
        if key in done:
            continue
        done.add(key)
        try:
            check_buildable(config)
        except (ConfigError, ValueError, FileNotFoundError, ImportError) as error:
            raise type(error)(f"sweep cell {cell.index} ({cell.label()}): {error}") from None


def _mean_staleness(summary: dict) -> float | None:
    histogram = summary.get("timeline", {}).get("staleness_histogram") or {}
    total = sum(histogram.values())
    return sum(int(s) * n for s, n in histogram.items()) / total if total else None


def _cell_value(value):
    """A config value as a table cell: tuples and other containers as JSON text."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value, default=str)


def result_row(cell: Cell, grid_axes: list[str], sweep_dir: str) -> dict:
    """One results row: the cell index, :data:`KEY_SETTINGS`, the other swept settings (empty where
    the cell does not read them), :data:`SUMMARY_COLUMNS` from its summary.json and its run directory
    relative to the sweep folder."""
    from jaxfl.runlog import read_json, run_jaxfl_code

    summary = read_json(os.path.join(cell.run_dir, "summary.json"))
    row = {"cell": cell.index}
    for name in (*KEY_SETTINGS, *(axis for axis in grid_axes if axis not in KEY_SETTINGS)):
        if name in grid_axes and name not in cell.values:
            row[name] = None  # swept, but this cell's run does not read it
        elif name == "local_steps" and cell.config.local_epochs is not None:
            row[name] = None  # not read: local_epochs decides each client's steps
        elif name == "heterogeneity" and summary.get("heterogeneity") == "given":
            # the sweep's time_per_step replaced the (unread) speed model, as the summary says; which
            # speeds, so that a report of sweeps on two device fleets tells their runs apart
            row[name] = f"given:{_given_speeds_sha256(cell.run_dir)[:8]}"
        elif name in FIELDS:
            row[name] = _cell_value(getattr(cell.config, name))
        else:  # an algorithm option, space.option
            row[name] = _cell_value(cell.values[name])
    row.update({
        "target_accuracy": summary.get("target_accuracy"), "time_to_target": summary.get("time_to_target"),
        "best_accuracy": summary.get("best_accuracy"), "final_accuracy": summary.get("final_accuracy"),
        "last_tenth_accuracy": _last_tenth_accuracy(summary, cell.run_dir),
        "global_updates": summary.get("global_updates"),
        "client_updates": summary.get("accounting", {}).get("aggregated"),
        # a timing-only run executes nothing: empty (its schedule's steps are the aggregated ones)
        "client_steps_executed": summary.get("client_steps_executed"),
        "client_steps_aggregated": summary.get("client_steps_aggregated"),
        # what the clients computed (aggregated or dropped): the report's computation column
        "client_steps_arrived": _arrived_steps(summary, cell.run_dir),
        "virtual_time": summary.get("virtual_time"),
        "client_utilisation": summary.get("timeline", {}).get("utilisation", {}).get("mean"),
        "mean_staleness": _mean_staleness(summary), "stop_reason": summary.get("stop_reason"),
        "wall_time_s": summary.get("wall_time_s"),
        "jaxfl_code": run_jaxfl_code(cell.run_dir, summary),
        "run_dir": os.path.relpath(cell.run_dir, sweep_dir),
    })
    return row


# results.parquet's types of the columns every sweep writes, whatever their values: a column empty in
# every row (no run reached the target; a timing-only sweep's accuracies) was typed null, and the tables
# of two sweeps did not concatenate (pyarrow: "Unsupported cast from double to null")
RESULT_TYPES = {"cell": "int64", "algorithm": "string", "dataset": "string", "model": "string",
                "partition": "string", "clients": "int64", "heterogeneity": "string", "local_steps": "int64",
                "local_epochs": "float64", "seed": "int64",
                **dict.fromkeys(("target_accuracy", "time_to_target", "best_accuracy", "final_accuracy",
                                 "last_tenth_accuracy", "virtual_time", "client_utilisation", "mean_staleness",
                                 "wall_time_s"), "float64"),
                **dict.fromkeys(("global_updates", "client_updates", "client_steps_executed",
                                 "client_steps_aggregated", "client_steps_arrived"), "int64"),
                "stop_reason": "string", "jaxfl_code": "string", "run_dir": "string"}


def _typed_column(pa, name: str, column):
    """``column`` (inferred from its values) in the type :data:`RESULT_TYPES` (or, for another swept
    setting, its config field) gives ``name``, where it is empty in every row (pyarrow's null type) or
    holds whole numbers of a float column; otherwise as inferred (a value that does not fit)."""
    declared = RESULT_TYPES.get(name)
    if declared is None and name in FIELDS:
        annotation = str(FIELDS[name].type)
        declared = next((kind for prefix, kind in (("bool", "bool_"), ("int", "int64"), ("float", "float64"),
                                                   ("str", "string")) if annotation.startswith(prefix)), None)
    if declared is None or not (pa.types.is_null(column.type)
                                or declared == "float64" and pa.types.is_integer(column.type)):
        return column
    try:
        return column.cast(getattr(pa, declared)())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return column


def _given_speeds_sha256(run_dir: str) -> str:
    """The SHA-256 of the given speeds a run recorded (``config.json``'s ``user_inputs``), or ``?``."""
    from jaxfl.resume import ResumeError, read_record

    try:
        return recorded_speeds_sha256(read_record(run_dir)) or "?"
    except (ResumeError, AttributeError):
        return "?"


def _arrived_steps(summary: dict, run_dir: str) -> int | None:
    """The summary's ``client_steps_arrived``, or, for a run finished before summaries had it, the
    local steps of the arrivals in its event log (None where the log does not read back)."""
    if summary.get("client_steps_arrived") is not None:
        return summary["client_steps_arrived"]
    import numpy as np

    from jaxfl.runlog import read_events

    try:
        events = read_events(run_dir)
    except (OSError, ValueError):
        return None
    arrived = events["event"] == "arrival"
    return int(np.maximum(events["steps"][arrived], 0).sum())


def _last_tenth_accuracy(summary: dict, run_dir: str) -> float | None:
    """The summary's ``last_tenth_accuracy``, or, for a run finished before summaries had it, the
    same figure from its ``metrics.csv`` (so the same sweep call again fills the column in)."""
    if "last_tenth_accuracy" in summary:
        return summary["last_tenth_accuracy"]
    from jaxfl.runlog import run_last_tenth_accuracy

    return run_last_tenth_accuracy(run_dir)


def write_results(rows: list[dict], sweep_dir: str) -> tuple[str, str | None]:
    """Write the rows as ``results.csv`` and, where pyarrow is installed, ``results.parquet`` (each
    atomically); returns their paths (None: no Parquet). Without pyarrow a sweep still ends with its
    table instead of losing it to an ImportError at the end (a GPU lease with a bare Python)."""
    from jaxfl.checkpoint import DISK_FULL_ERRNOS, DiskWriteError

    try:
        return _write_results(rows, sweep_dir)
    except OSError as error:  # a full disk: one line and the way on, as a cell's checkpoint says it
        if error.errno not in DISK_FULL_ERRNOS:
            raise
        for name in ("results.csv.tmp", "results.parquet.tmp"):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(sweep_dir, name))
        raise DiskWriteError(f"could not write the sweep's results table in {sweep_dir}: "
                             f"{os.strerror(error.errno)}; the finished cells' runs are kept") from None


def _write_results(rows: list[dict], sweep_dir: str) -> tuple[str, str | None]:
    from jaxfl.runlog import _pyarrow, write_csv, written_atomically

    columns = list(rows[0]) if rows else ["cell"]
    table = write_csv(os.path.join(sweep_dir, "results.csv"), rows, columns)
    modules = _pyarrow()
    if modules is None:
        return table, None
    pa, pq = modules
    parquet = os.path.join(sweep_dir, "results.parquet")
    arrays = {}
    for name in columns:
        values = [row[name] for row in rows]
        kinds = {type(value) for value in values if value is not None}
        if kinds == {int, float}:  # a swept number given as 1 and 0.5: one float column
            values = [None if value is None else float(value) for value in values]
        elif len(kinds) > 1:
            values = [None if value is None else str(value) for value in values]
        arrays[name] = _typed_column(pa, name, pa.array(values))
    with written_atomically(parquet) as temporary:
        pq.write_table(pa.table(arrays), temporary)
    return table, parquet


def _write_definition(sweep_dir: str, base: dict, grid: dict, size: str | None, cells: list[Cell],
                      jobs: int = 1, states: dict | None = None, speeds=None) -> None:
    """``sweep.json``: the sweep's arguments, its cells, and ``run_jobs``, the ``jobs`` each run
    folder of the sweep's folder began under (:func:`_run_jobs`): a cell this call starts
    (``states``: new or restart) under ``jobs``; every other run keeps what it began under, also
    the runs of an earlier, wider grid that this one leaves out; ``time_per_step``: the given
    speeds' file and SHA-256 (None: drawn)."""
    from jaxfl.experiment import _write_json

    run_jobs = _run_jobs(sweep_dir)
    for cell in cells:
        if states is None or states[cell.index] in ("new", "restart"):
            run_jobs[os.path.relpath(cell.run_dir, sweep_dir)] = jobs
    _write_json(os.path.join(sweep_dir, "sweep.json"), {
        "base": {name: _cell_value(value) for name, value in base.items()},
        "grid": {name: [_cell_value(value) for value in values] for name, values in grid.items()},
        "size": size,
        "jobs": jobs,  # this call's: what each run began under is run_jobs
        "cells": [{"cell": cell.index, "values": {n: _cell_value(v) for n, v in cell.values.items()},
                   "run_dir": os.path.relpath(cell.run_dir, sweep_dir), "jobs": run_jobs.get(
                       os.path.relpath(cell.run_dir, sweep_dir), jobs)} for cell in cells],
        "run_jobs": dict(sorted(run_jobs.items())),
        "time_per_step": None if speeds is None else {"file": TIME_PER_STEP_FILE, "sha256": _sha256(speeds)},
    })


def _read_definition(path: str) -> dict:
    """A sweep folder's ``sweep.json``; a damaged one is a ``ValueError`` naming it and what to do."""
    from jaxfl.runlog import read_json

    advice = ("restore it from a copy, or remove it: the sweep writes it again and finds its runs by their names "
              "(a remove forgets the --jobs each unfinished cell began with)")
    definition = read_json(path, advice)
    cells, jobs = definition.get("cells", []), definition.get("run_jobs", {})
    if not (isinstance(cells, list) and all(isinstance(cell, dict) and isinstance(cell.get("run_dir"), str)
                                            for cell in cells)
            and isinstance(jobs, dict) and all(type(count) is int and count >= 1 for count in jobs.values())
            and (type(definition.get("jobs", 1)) is int)):
        raise ValueError(f"{path} is damaged: its cells are not a list of objects that name their run_dir, or its "
                         f"run_jobs not an object of whole numbers >= 1; {advice}")
    return definition


def _run_jobs(sweep_dir: str) -> dict[str, int]:
    """The ``jobs`` each run folder of a sweep began under (its share of the cores, so its device
    count and arithmetic), by its path relative to ``sweep_dir``, from ``sweep.json``. Every call of
    a sweep may run another grid over the same folder with other ``jobs``, so this is kept by run,
    not by call. A sweep written before it was kept gives each of its cells the ``jobs`` of its
    last call, as far as it can tell.

    >>> _run_jobs("/no/such/sweep")
    {}
    """
    path = os.path.join(sweep_dir, "sweep.json")
    if not os.path.exists(path):
        return {}
    definition = _read_definition(path)
    if "run_jobs" in definition:
        return {run: int(jobs) for run, jobs in definition["run_jobs"].items()}
    return {cell["run_dir"]: definition.get("jobs", 1) for cell in definition.get("cells", [])}


def job_cores(jobs) -> list[list[int]]:
    """The cores of each of ``jobs`` cells run at once: this process's usable cores split into
    ``jobs`` equal shares (each cell's device count, and so its arithmetic, is the same whichever
    share it gets; a remainder core is left idle). One share of every core for ``jobs=1``.

    >>> len(job_cores(1))
    1
    """
    from jaxfl._devices import usable_cores

    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"jobs={jobs!r} is not allowed: an integer >= 1 (cells run at once)")
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no pinning, only the device count
        cores = list(range(usable_cores()))
    if jobs > len(cores):
        raise ConfigError(f"jobs={jobs} is not allowed: this process may use {len(cores)} core(s), so at most "
                          f"{len(cores)} cells can run at once (each on a core of its own)")
    share = len(cores) // jobs
    return [cores[job * share:(job + 1) * share] for job in range(jobs)]


def _check_importable_by_name(name: str, jobs: int) -> None:
    """Refuse, before any work, an algorithm registered in this process only (``@register`` in a
    notebook or script): a worker process of ``jobs`` > 1 knows jaxfl's algorithms and imports
    ``module:Class`` references, and every cell of it failed after the set-up."""
    cls = algorithms.get(name)
    if ":" in name or cls.__module__.split(".")[0] == "jaxfl":
        return
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    references = [] if cls.__module__ == "__main__" else [f"'{cls.__module__}:{cls.__qualname__}'"]
    if path:
        references.append(f"'{path}:{cls.__qualname__}'")
    named = f"name it {' or '.join(references)}, " if references else "define it in a .py file and name it " \
        f"'path/to/file.py:{cls.__qualname__}', "
    raise ConfigError(f"algorithm={name!r} is not allowed with jobs={jobs}: it is registered in this process only "
                      f"({cls.__module__}.{cls.__qualname__}), and the cells run in worker processes, which import "
                      f"algorithms by reference; {named}or run with jobs=1")


GPU_MEMORY_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
GPU_PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
JAX_GPU_MEMORY_FRACTION = 0.75  # the share of a GPU's memory one jax process takes unless told otherwise
GPU_MEMORY_LEFT = 0.9  # of a GPU's memory, what processes may reserve: each also holds a CUDA context


class _Shares(NamedTuple):
    """What each of a sweep's ``jobs`` workers gets: its host cores, and on a GPU its share of the
    GPU's memory (``XLA_PYTHON_CLIENT_MEM_FRACTION``; None on a CPU)."""
    cores: list[list[int]]
    gpu_memory_fraction: float | None = None


def gpu_memory_fraction(jobs: int, environ=None, sweep_holds: bool = False) -> float:
    """Each of ``jobs`` processes' share of a GPU's memory (``XLA_PYTHON_CLIENT_MEM_FRACTION``), so
    that together they reserve what one jax process would: ``environ``'s fraction, else jax's
    default 0.75, split ``jobs`` ways. Where the sweep's own process already reserved that share
    (``sweep_holds``: jax preallocated it when the process first ran on the GPU), the workers split
    what is left below 0.9 of the memory; too little left is refused, naming the setting that frees it.

    >>> gpu_memory_fraction(4, {})
    0.1875
    >>> gpu_memory_fraction(2, {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"})
    0.25
    >>> gpu_memory_fraction(3, {}, sweep_holds=True)
    0.05
    """
    environ = os.environ if environ is None else environ
    text = environ.get(GPU_MEMORY_FRACTION, str(JAX_GPU_MEMORY_FRACTION))
    try:
        total = float(text)
    except ValueError:
        total = math.nan
    if not 0 < total <= 1:
        raise ConfigError(f"{GPU_MEMORY_FRACTION}={text!r} is not allowed: a fraction of the GPU's memory in (0, 1]")
    if not sweep_holds:
        return round(total / jobs, 4)
    left = GPU_MEMORY_LEFT - total
    if left < 0.01 * jobs:
        raise ConfigError(f"jobs={jobs} is not allowed here: this process holds {total:g} of the GPU's memory (jax "
                          f"reserved it when the process first ran on the GPU), which leaves the {jobs} cell "
                          f"processes {max(left, 0):.2g} of it; start Python with {GPU_PREALLOCATE}=false (jaxfl "
                          f"sweep does), or a smaller {GPU_MEMORY_FRACTION}, or run with jobs=1")
    return round(left / jobs, 4)


_STARTED_WITHOUT_PREALLOCATING = []  # [True] once _jobs_backend has started this process's backend


def _jobs_backend() -> tuple[str, bool]:
    """jax's default backend for a sweep of ``jobs`` > 1, and whether this process holds a GPU's
    preallocated memory: a backend not yet started is started without reserving any (the cell
    processes, not the sweep, use the devices; jax reserves 0.75 of a GPU's memory at the start).
    The setting is the user's again afterwards, so a later call (``run_sweep`` checks twice)
    remembers that this process started it so."""
    import jax

    try:
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:  # another jax layout: asking for the backend starts it as it is configured
        backends_are_initialized = lambda: True  # noqa: E731
    if backends_are_initialized():
        backend = jax.default_backend()
        holds = backend == "gpu" and not _STARTED_WITHOUT_PREALLOCATING \
            and os.environ.get(GPU_PREALLOCATE, "true").lower() not in ("false", "0") \
            and os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").lower() != "platform"
        return backend, holds
    before = os.environ.get(GPU_PREALLOCATE)
    os.environ[GPU_PREALLOCATE] = "false"
    try:
        backend = jax.default_backend()
        _STARTED_WITHOUT_PREALLOCATING.append(True)
        return backend, False
    finally:  # the cell processes get the user's setting back (_worker_environment copies os.environ)
        if before is None:
            os.environ.pop(GPU_PREALLOCATE, None)
        else:
            os.environ[GPU_PREALLOCATE] = before


def _check_jobs(jobs: int, sweep_dir: str, cells: list[Cell], states: dict) -> _Shares:
    """:func:`job_cores` (and on a GPU :func:`gpu_memory_fraction`), after checking that ``jobs`` > 1
    runs on a CPU or a GPU backend, and, on a CPU, that no interrupted cell would go on with another
    share of the cores than it began with (its device count, so its arithmetic, would change mid-run;
    on a GPU every cell runs on all the process's GPUs, whatever ``jobs``)."""
    shares = _Shares(job_cores(jobs))
    backend = "cpu"
    if jobs > 1:
        backend, sweep_holds = _jobs_backend()
        if backend not in ("cpu", "gpu"):
            raise ConfigError(f"jobs={jobs} is not allowed on the {backend} backend: its devices take one process "
                              f"at a time; run with jobs=1, or one sweep per device")
        if backend == "gpu":
            shares = shares._replace(gpu_memory_fraction=gpu_memory_fraction(jobs, sweep_holds=sweep_holds))
        for name in dict.fromkeys(cell.config.algorithm for cell in cells if states[cell.index] != "finished"):
            _check_importable_by_name(name, jobs)
        if backend == "cpu" and not hasattr(os, "sched_setaffinity"):
            warn_user(f"jobs={jobs}: the cells are not pinned to cores on this system (CPU affinity is Linux's): "
                      f"each of the {jobs} processes has {len(shares.cores[0])} device(s), and they share every core")
    # a cell's devices against those its process will have, before any cell runs (it was refused only
    # as it started, after the cells before it had run and the table was written)
    import jax

    have = len(shares.cores[0]) if jobs > 1 and backend == "cpu" else jax.local_device_count()
    for cell in cells:
        asked = cell.config.devices
        if states[cell.index] != "finished" and asked is not None and not 1 <= asked <= have:
            where = f"each of jobs={jobs} cells runs on {have} of the {backend} devices" if jobs > 1 and \
                backend == "cpu" else f"this process has {have} {jax.default_backend()} device{'s' * (have != 1)}"
            raise ConfigError(f"sweep cell {cell.index} ({cell.label()}): devices={asked} is not allowed: {where}; "
                              f"a number from 1 to {have}, or leave devices unset")
    # each interrupted cell against the jobs its own run began under: another grid over the same
    # folder may have run since with other jobs
    run_jobs = _run_jobs(sweep_dir)
    for cell in cells if backend == "cpu" else ():
        before = run_jobs.get(os.path.relpath(cell.run_dir, sweep_dir), 1)
        if states[cell.index] == "resumable" and before != jobs:
            raise ConfigError(f"jobs={jobs} is not allowed here: cell {cell.index} ({cell.label()}) was "
                              f"interrupted while it ran with jobs={before}, and a run goes on with the devices it "
                              f"began with; continue with --jobs {before} (then change it)")
    return shares


def _earlier_runs_left_out(sweep_dir: str, base: dict, grid: dict, cells: list[Cell]) -> str | None:
    """A note when the folder holds finished runs of an earlier sweep (its ``sweep.json``) that are
    not cells of this grid: this sweep's table will not list them (their runs stay), and the note
    names the settings in which the two sweeps differ, so that one grid over both takes them in."""
    path = os.path.join(sweep_dir, "sweep.json")
    if not os.path.exists(path):
        return None
    before = _read_definition(path)
    from jaxfl.experiment import names_before_default_changes

    current = {os.path.abspath(cell.run_dir) for cell in cells}
    # runs of a cell at a default since changed: _expand's note on that cell names them
    current |= {os.path.abspath(os.path.join(sweep_dir, "runs", name))
                for cell in cells for name in names_before_default_changes(cell.config).values()}
    left = [entry for entry in before.get("cells", [])
            if os.path.abspath(os.path.join(sweep_dir, entry["run_dir"])) not in current
            and cell_state(os.path.join(sweep_dir, entry["run_dir"])) == "finished"]
    if not left:
        return None
    old_base, new_base = before.get("base", {}), {name: _cell_value(value) for name, value in base.items()}
    old_grid, new_grid = before.get("grid", {}), {name: [_cell_value(v) for v in values] for name, values in grid.items()}

    def values(name, base_values, grid_values) -> list:  # a setting's values in one sweep: its axis, or its one value
        return list(grid_values[name]) if name in grid_values else [base_values.get(name)]

    differ = {name: (values(name, old_base, old_grid), values(name, new_base, new_grid))
              for name in dict.fromkeys([*old_base, *new_base, *old_grid, *new_grid])}
    # a setting swept in both grids is not why runs were left out unless its values differ (seeds 0,1 then 4)
    differ = {name: pair for name, pair in differ.items()
              if json.dumps(pair[0], default=str) != json.dumps(pair[1], default=str)}

    def shown(values: list) -> str:  # unset: the default of the jaxfl that ran it, which a flag cannot name
        return "unset" if values == [None] else repr(values[0]) if len(values) == 1 else repr(values)

    hint = "; ".join(f"{name}: {shown(there)} there, {shown(here)} here" for name, (there, here) in differ.items())
    both = {name: list(dict.fromkeys(json.dumps(v, default=str) for v in [*there, *here]))
            for name, (there, here) in differ.items() if None not in there and None not in here}
    example = "" if not both else " (e.g. " + " ".join(
        f"--{name.replace('_', '-')} {','.join(json.loads(v) if isinstance(json.loads(v), str) else v for v in joined)}"
        for name, joined in both.items()) + ")"
    return (f"{len(left)} finished run(s) of the sweep this folder held before are not cells of this grid, so this "
            f"sweep's results table leaves them out (their runs stay in {os.path.join(sweep_dir, 'runs')})"
            + (f"; the two sweeps differ in {hint}" if hint else "")
            + f"; one grid over the values of both{example} reports them together"
            # over two or more differing settings that grid is their cross product: more runs than either sweep
            + ("; it also runs the combinations of those settings that neither sweep ran" if len(differ) > 1 else ""))


def _sha256(speeds) -> str:
    return UserInputs(time_per_step=speeds).speeds_sha256()  # as a run's config.json records them


def _check_speeds(time_per_step, cells: list[Cell]):
    """The given speeds checked against every cell (its client count, its drawing settings left at
    their defaults), as a float64 array; None where none are given. A bad one names the cell."""
    if time_per_step is None:
        return None
    speeds = None
    for cell in cells:
        try:
            speeds = UserInputs(time_per_step=time_per_step).check(cell.config).time_per_step
        except ValueError as error:
            raise ValueError(f"sweep cell {cell.index} ({cell.label()}): {error}") from None
    return speeds


def _check_speeds_of_earlier_runs(speeds, sweep_dir: str, cells: list[Cell]) -> None:
    """Refuse (ConfigError) where a finished or interrupted run in the sweep folder, of this grid or
    an earlier one, was made on other speeds than ``speeds`` (given, or None: drawn): the speeds are
    not in a run's name, so the sweep would resume a run on speeds it was not started with, or
    report runs of two sets of speeds as one grid."""
    from jaxfl.resume import ResumeError, read_record

    runs = os.path.join(sweep_dir, "runs")
    if not os.path.isdir(runs):
        return
    wanted = None if speeds is None else _sha256(speeds)
    of_cell = {os.path.normpath(cell.run_dir): cell for cell in cells}
    for name in sorted(os.listdir(runs)):
        run_dir = os.path.join(runs, name)
        if cell_state(run_dir) not in ("finished", "resumable"):
            continue  # a new folder, or one without a checkpoint: it starts again
        try:
            made = recorded_speeds_sha256(read_record(run_dir))
        except (ResumeError, ValueError, KeyError, OSError, AttributeError):
            continue  # a damaged record: its resume says so (a finished run is only read)
        if made == wanted:
            continue
        cell = of_cell.get(os.path.normpath(run_dir))
        where = (f"sweep cell {cell.index} ({cell.label()}): its run {run_dir}" if cell is not None
                 else f"{run_dir} (a run of an earlier grid in this sweep folder)") + " was made"
        if wanted is None:
            raise ConfigError(f"{where} on given speeds per step ({os.path.join(run_dir, TIME_PER_STEP_FILE)}), "
                              "and none are given now: give the same ones again (jaxfl sweep --time-per-step FILE; "
                              f"run_sweep(..., time_per_step=...)), or sweep into another folder")
        if made is None:
            raise ConfigError(f"{where} on drawn speeds, and time_per_step is given now: a sweep folder holds the "
                              "runs of one set of speeds; sweep the given ones into another folder (--out)")
        raise ConfigError(f"{where} on other given speeds per step (or network: SHA-256 {made[:12]}…, these "
                          f"{wanted[:12]}…): "
                          f"give the same ones again ({os.path.join(run_dir, TIME_PER_STEP_FILE)}), or sweep these "
                          "into another folder (--out)")


def _save_speeds(sweep_dir: str, speeds) -> str | None:
    """Write the given speeds to ``SWEEP_DIR/client_time_per_step.npy`` (what ``--jobs`` workers
    read); returns its path. Without speeds an old copy goes (no run it was for is left to go on:
    :func:`_check_speeds_of_earlier_runs`)."""
    import numpy as np

    path = os.path.join(sweep_dir, TIME_PER_STEP_FILE)
    if speeds is None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return None
    from jaxfl.runlog import written_atomically

    with written_atomically(path, ".tmp.npy") as temporary:
        np.save(temporary, speeds, allow_pickle=False)
    return path


def run_sweep(base, grid: dict, sweep_dir: str, *, size: str | None = None, progress: bool = True,
              echo=None, jobs: int = 1, time_per_step=None) -> SweepResult:
    """Run every cell of ``grid`` over ``base`` into ``sweep_dir`` (see the module docstring), or
    continue a sweep started there with the same arguments.

    ``base``: a mapping of config fields (flat names, section tables or ``[port]`` option tables, as
    in a config file) or a :class:`~jaxfl.config.RunConfig` (:func:`base_mapping`); ``grid``: field → list of values; ``size``: the name recorded in ``sweep.json`` (see
    :func:`load_sweep_file`); ``progress``: one bar for the grid (cells done of all, the current
    cell); ``echo``: a function receiving one line per finished cell (the command line prints them).
    Without either, a note (the earlier runs a new grid's table leaves out, a cell started again) is
    a :class:`UserWarning`.

    ``jobs``: cells run at once, each in a process of its own pinned to an equal share of the CPU
    cores (:func:`job_cores`), with one XLA device per core of its share. It pays where a run
    cannot keep every core busy itself: calls of one client (FedCompass or FedAsync with one client
    much faster than the rest), whose call a two-device process pads with an idle client (measured
    on 2 cores: two such cells side by side each ran as fast as one alone). A cell's arithmetic
    depends on its device count, so its results equal a ``jobs=1`` run's to float32 reassociation,
    not bit for bit, and an interrupted cell must go on with the ``jobs`` it began with (refused
    otherwise). On a GPU the cells share the process's GPUs, each with ``1/jobs`` of the memory one
    jax process would reserve (:func:`gpu_memory_fraction`; the sweep's own process reserves none)
    and its share of the host's cores, so that one cell's host work overlaps the others' training;
    every cell runs on the same devices as with ``jobs=1`` (``benchmarks/sweep_jobs.py`` measures
    what it gains). Other accelerators are refused (a TPU takes one process at a time). Algorithms
    must be importable by name (built in, ``module:Class``, ``file.py:Class``).

    Every cell is validated, and every distinct data set and model built once, before the first run
    writes a file; a bad value raises :class:`~jaxfl.config.ConfigError` naming the cell. The runs
    share their compiled programs (:func:`jaxfl.comparison.shared_compilations`). A run stopped by a
    numerical error is a finished cell (its ``stop_reason`` says so). Example: the module docstring.
    A second sweep of the same folder while this one runs is refused (:class:`jaxfl.resume.InUse`,
    naming this process): the sweep holds ``SWEEP_DIR/.lock`` to its end.

    ``time_per_step``: (clients,) seconds per local step, every cell's client speeds instead of
    draws (measured devices, another simulator's profile), as ``run_experiment(config,
    time_per_step=...)`` takes them; every cell must have that many clients and leave the drawing
    settings (``heterogeneity``...) at their defaults. A copy is kept as
    ``SWEEP_DIR/client_time_per_step.npy``. The speeds are not in a run's name, so a sweep folder
    holds runs of one set of speeds: continuing it with other speeds, or without the ones it began
    with, is refused before any run (another folder holds the other speeds' runs).
    """
    from jaxfl.experiment import shared_data
    from jaxfl.resume import _in_use, holding_lock, in_use_by

    sweep_dir = user_path(sweep_dir)
    if isinstance(base, RunConfig):
        base = base_mapping(base)
    base = _flat(dict(base), "sweep base") if base else {}
    grid = _check_grid(grid)
    cells, notes = _expand(base, grid, sweep_dir)
    earlier = _earlier_runs_left_out(sweep_dir, base, grid, cells)
    if earlier:
        notes.append(earlier)
    speeds = _check_speeds(time_per_step, cells)
    in_use = ("sweep directory", "run the same jaxfl sweep command again (--out {folder})")
    holder = in_use_by(sweep_dir)  # the checks below would take its running cells for interrupted ones
    if holder is not None:
        raise _in_use(sweep_dir, holder, *in_use)
    states = {cell.index: cell_state(cell.run_dir) for cell in cells}
    _check_speeds_of_earlier_runs(speeds, sweep_dir, cells)
    _check_sources_of_earlier_runs(cells, states)
    _check_data_of_earlier_runs(cells, states)
    shares = _check_jobs(jobs, sweep_dir, cells, states)
    # cells that run in this process take the generated data that the checks built (workers load their own)
    with shared_data() if jobs == 1 else contextlib.nullcontext():
        if any(state != "finished" for state in states.values()):
            _prepare_all([cell for cell in cells if states[cell.index] != "finished"])
        os.makedirs(os.path.join(sweep_dir, "runs"), exist_ok=True)
        # one sweep at a time in a folder: a second (the same command in another shell) is refused in one line
        with holding_lock(sweep_dir, *in_use):
            states = {cell.index: cell_state(cell.run_dir) for cell in cells}  # as they are now it is held
            _check_speeds_of_earlier_runs(speeds, sweep_dir, cells)
            _check_sources_of_earlier_runs(cells, states)
            _check_data_of_earlier_runs(cells, states)
            _say_cells_of_other_xla_flags(cells, states)
            shares = _check_jobs(jobs, sweep_dir, cells, states)
            return _run_locked(sweep_dir, base, grid, size, cells, jobs, states, shares, progress, echo, earlier,
                               notes, speeds)


def _check_sources_of_earlier_runs(cells: list[Cell], states: dict) -> None:
    """Refuse, before any work, a sweep whose finished or interrupted cells were run with another
    version of a plug-in algorithm's or a model's file: their results (or their first updates) are
    that code's, and the sweep would report them as this one's."""
    from jaxfl.experiment import algorithm_source, changed_sources, model_source
    from jaxfl.resume import ResumeError, read_record

    stale = []
    for cell in cells:
        if states[cell.index] not in ("finished", "resumable"):
            continue
        if algorithm_source(cell.config.algorithm) is None and model_source(cell.config.model) is None:
            continue  # built-ins (or objects without a file): no record to read
        try:
            changed = changed_sources(read_record(cell.run_dir), cell.config)
        except (ResumeError, ValueError, KeyError, TypeError):
            continue
        if changed:
            stale.append((cell, changed))
    if stale:
        files = sorted({file for _, changed in stale for file in changed})
        cells_were, listed = _stale_cells([cell for cell, _ in stale])
        raise ConfigError(f"{cells_were} run with an earlier version of {' and '.join(files)}, changed since: {listed}; "
                          "their results are not this code's. Sweep into another folder (--out), or remove those run "
                          "folders to run them again with the code as it is now")


def _stale_cells(cells: list[Cell]) -> tuple[str, str]:
    """``("N cells of this sweep were", "cell i (label): run_dir; ...")`` (five named, then a count) for a
    refusal of finished or interrupted cells that are not this sweep's runs.

    >>> _stale_cells([Cell(3, {"seed": 1}, RunConfig(), "runs/a")])
    ('1 cell of this sweep was', 'cell 3 (seed=1): runs/a')
    """
    listed = "; ".join(f"cell {cell.index} ({cell.label()}): {cell.run_dir}" for cell in cells[:5])
    more = f" and {len(cells) - 5} more" if len(cells) > 5 else ""
    return (f"{len(cells)} cell{'s' * (len(cells) != 1)} of this sweep {'were' if len(cells) != 1 else 'was'}",
            listed + more)


def _check_data_of_earlier_runs(cells: list[Cell], states: dict) -> None:
    """Refuse, before any work, a sweep whose finished or interrupted cells on an ``npz`` file were run
    on the file before it changed: a run records the SHA-256 of the file's arrays, which its name does
    not hold, so the sweep counted such cells as finished and reported the old data's results as this
    data's (a comparison, ``jaxfl run --algorithm a,b``, trains them again; an interrupted cell's resume
    was refused only when its turn came)."""
    from jaxfl.comparison import _with_file_fingerprint
    from jaxfl.resume import ResumeError, read_record, recorded_config

    stale = []
    for cell in cells:
        if states[cell.index] not in ("finished", "resumable") or cell.config.dataset != "npz" \
                or cell.config.data_fingerprint is not None:  # a fingerprint given: the run checks it
            continue
        try:
            made = read_record(cell.run_dir)["config"]
            made = recorded_config(made).data_fingerprint
        except (ResumeError, ConfigError, ValueError, KeyError, TypeError):
            continue  # a damaged record: its resume says so
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the file's own notes come with the runs that read it
                now = _with_file_fingerprint(cell.config).data_fingerprint
        except (ValueError, OSError):
            continue  # the file gone or unreadable: the cells still to run say so
        if made is not None and made != now:
            stale.append((cell, made, now))
    if stale:
        cell, made, now = stale[0]
        cells_were, listed = _stale_cells([cell for cell, _, _ in stale])
        raise ConfigError(f"{cells_were} run on the npz file {cell.config.data_dir} before it changed (its arrays' "
                          f"SHA-256 {made[:12]}… then, {now[:12]}… now): {listed}; their results are not this data's. "
                          "Sweep into another folder (--out), or remove those run folders to run them again on the "
                          "file as it is now")


def _say_cells_of_other_xla_flags(cells: list[Cell], states: dict) -> None:
    """Warn, once, where finished cells this sweep reuses were made under other ``XLA_FLAGS`` than this
    process's (see :func:`jaxfl.experiment.xla_flags`: they do not name a run); an interrupted cell's
    resume says so itself."""
    from jaxfl.experiment import said_xla_flags, same_xla_flags, xla_flags
    from jaxfl.resume import ResumeError, read_record

    current, other = xla_flags(), []
    for cell in cells:
        if states[cell.index] != "finished":
            continue
        try:
            recorded = read_record(cell.run_dir).get("xla_flags")
        except (ResumeError, ValueError, KeyError, TypeError):
            continue
        if recorded is not None and not same_xla_flags(recorded, current):
            other.append((cell, recorded))
    if other:
        cell, recorded = other[0]
        more = f" and {len(other) - 1} more" if len(other) > 1 else ""
        warn_user(f"{len(other)} finished cell{'s' * (len(other) != 1)} of this sweep, reused as "
                  f"{'they are' if len(other) != 1 else 'it is'}, {'were' if len(other) != 1 else 'was'} made "
                  f"under other XLA_FLAGS than this process has ({said_xla_flags(current)}; cell {cell.index}, "
                  f"{cell.run_dir}: {said_xla_flags(recorded)}{more}): where a flag changes XLA's arithmetic (e.g. "
                  "--xla_cpu_enable_fast_math) their numbers are not what this process would compute; sweep into "
                  "another folder (--out) to run them under these flags")


def _run_locked(sweep_dir: str, base: dict, grid: dict, size, cells: list[Cell], jobs: int, states: dict,
                shares, progress: bool, echo, earlier, notes: list, speeds=None) -> SweepResult:
    """:func:`run_sweep` once it holds the sweep directory's lock."""
    from jaxfl.comparison import shared_compilations

    speeds_file = _save_speeds(sweep_dir, speeds)
    _write_definition(sweep_dir, base, grid, size, cells, jobs, states, speeds)
    done = {"new": [], "resumable": [], "restart": [], "finished": []}
    bar = None
    if progress:
        from jaxfl.experiment import progress_bar

        bar = progress_bar(total=len(cells), initial=sum(state == "finished" for state in states.values()),
                           desc="sweep", unit="cell", leave=True)
    say = echo or (bar.write if bar is not None else (lambda line: None))
    # what the user must hear even without a bar (progress=False, as notebooks call it): a warning,
    # which a notebook shows and the command line prints as a note line
    note = echo or (bar.write if bar is not None else _warn)
    if earlier:  # now, not only with the notes at the end: the sweep may run for hours
        note(f"note: {earlier}")
    peak = [0]
    axes, finished_rows = list(grid), {}

    def write_table() -> tuple[str, str | None]:
        # rows of cells finished before are read once: a long grid rewrites its table after every cell
        for cell in cells:
            if cell.index not in finished_rows and cell_state(cell.run_dir) == "finished":
                finished_rows[cell.index] = result_row(cell, axes, sweep_dir)
        return write_results([finished_rows[index] for index in sorted(finished_rows)], sweep_dir)

    try:
        write_table()  # a continued sweep's table holds its finished cells from the start
        with shared_compilations() as cache:
            if jobs > 1:
                _run_parallel(sweep_dir, cells, states, shares, cache, done, say, note, bar, peak, write_table,
                              speeds_file)
            for cell in cells if jobs == 1 else ():
                state = states[cell.index]
                done[state].append(cell.index)
                if state == "finished":
                    continue
                peak[0] = 1
                if bar is not None:
                    bar.set_postfix_str(f"cell {cell.index}: {cell.label()}")
                try:
                    summary, ended = run_cell(cell.config, cell.run_dir, state,
                                              lambda line, index=cell.index: note(f"cell {index}: {line}"), speeds)
                except Exception as error:  # which cell, beside the error (a plug-in's bug, say)
                    error.add_note(f"in sweep cell {cell.index} ({cell.label()}): {cell.run_dir}")
                    raise
                if ended != state:
                    done[state].remove(cell.index)
                    done[ended].append(cell.index)
                write_table()  # first: a cell announced finished is in the table
                say(_finished_line(cell, summary, ended))
                if bar is not None:
                    bar.update(1)
    except BaseException:
        if bar is not None:
            bar.close()
        # also when interrupted: the table holds every finished cell, so a sweep cut short (Ctrl-C, a
        # time limit) can be reported on, and the same call again fills in the rest; where that fails
        # too (the disk still full) the error in flight is the one to say
        with contextlib.suppress(OSError):
            write_table()
        raise
    if bar is not None:
        bar.close()
    table, parquet = write_table()
    rows = [finished_rows[index] for index in sorted(finished_rows)]
    return SweepResult(sweep_dir, cells, rows, table, parquet, done["new"], done["resumable"], done["restart"],
                       done["finished"], notes, jobs, peak[0])


def _warn(line: str) -> None:
    """A sweep's note where nothing else shows it: one UserWarning, without the ``note:`` prefix."""
    warn_user(line.removeprefix("note: "))


def run_cell(config: RunConfig, run_dir: str, state: str, say, time_per_step=None) -> tuple[dict, str]:
    """Run one cell in this process as its :func:`cell_state` says: ``new``, ``restart`` (its folder
    removed first) or ``resumable`` (from its newest checkpoint; where none reads back, ``say`` is told
    and it starts again), on the given speeds ``time_per_step`` (None: drawn). Returns its summary
    (also of a run a numerical error stopped: its ``summary.json`` says so) and the state it ran as.
    What :func:`run_sweep` runs for each cell, in its own process or in a worker's (``jobs`` > 1,
    :mod:`jaxfl._sweep_worker`)."""
    from jaxfl.engine import NumericalError
    from jaxfl.experiment import resume_experiment, run_experiment
    from jaxfl.resume import ResumeError

    try:
        if state in ("resumable", "restart"):
            _refuse_a_cell_in_use(run_dir, state)
        if state == "resumable":
            try:
                return resume_experiment(run_dir, progress=False, time_per_step=time_per_step).summary, state
            except ResumeError as error:  # no checkpoint reads back: the cell starts again
                say(f"{error}; starting it again")
                state = "restart"
        if state == "restart":
            shutil.rmtree(run_dir)
        return run_experiment(config, time_per_step=time_per_step).summary, state
    except NumericalError:  # the other cells go on
        from jaxfl.runlog import read_json

        return read_json(os.path.join(run_dir, "summary.json")), state


def _refuse_a_cell_in_use(run_dir: str, state: str) -> None:
    """:class:`~jaxfl.resume.InUse` where another process writes a cell's run folder: a run of the same
    config (a ``jaxfl run`` into the sweep's runs/, a resume of the cell). Before its first checkpoint it
    looked like a cell cut before one, and the sweep removed the folder under it (the two processes mixed
    their files); after, the resume's refusal advised resuming the run by hand."""
    from jaxfl.resume import InUse, in_use_by

    holder = in_use_by(run_dir)
    if holder is not None:
        what = "remove it to train the cell afresh" if state == "restart" else "resume it"
        raise InUse(f"{run_dir} is in use by process {holder or '(unknown)'}, which is writing a run of this cell's "
                    f"config there: the sweep would {what}; wait for that run to end (or stop it) and run the same "
                    "jaxfl sweep command again (a run that finished there is reused)")


class CellFailed(RuntimeError):
    """A cell of a parallel sweep ended with an error in its own process (the message ends with the
    tail of its output; the whole of it is in ``SWEEP_DIR/logs/cell-N.log``)."""


def _finished_line(cell: Cell, summary: dict, state: str) -> str:
    """The line a sweep prints for a finished cell; for a timing-only run (which evaluates nothing)
    its schedule's figures instead of an accuracy.

    >>> cell = Cell(0, {"algorithm": "fedbuff"}, RunConfig(), "runs/x")
    >>> _finished_line(cell, {"timing_only": True, "global_updates": 5, "virtual_time": 12.34, "stop_reason":
    ...                       "update budget", "timeline": {"staleness_histogram": {"0": 3, "1": 1}}}, "new")
    'cell 0 (algorithm=fedbuff): timing only: 5 updates in 12.3 virtual s, mean staleness 0.25, stop: update budget'
    """
    from jaxfl.report import _significant  # 1e25 s as 1e+25, not 26 digits

    if summary.get("timing_only"):
        staleness = _mean_staleness(summary)
        result = (f"timing only: {summary.get('global_updates')} updates in {_significant(summary.get('virtual_time') or 0)} "
                  f"virtual s, mean staleness {'n/a' if staleness is None else f'{staleness:.2f}'}")
    else:
        reached, best = summary.get("time_to_target"), summary.get("best_accuracy")
        # none: no evaluation, or only a diverged model's (printed as 0.0000)
        result = (f"best accuracy {'none' if best is None else f'{best:.4f}'}, "
                  f"{'target not reached' if reached is None else f'target at {_significant(reached)} virtual s'}")
    return (f"cell {cell.index} ({cell.label()}): {result}, "
            f"stop: {summary['stop_reason']}" + ("" if state == "new" else f" [{state.replace('resumable', 'resumed')}]"))


def _worker_environment(devices: int, cache: str, gpu_memory_fraction: float | None = None) -> dict:
    """The environment of a ``--jobs`` worker: ``devices`` XLA CPU devices (one per core of its share,
    whatever device count the sweep's own environment asks for), the sweep's compilation cache
    ``cache`` on the sweep's terms — the thresholds :func:`~jaxfl.comparison.shared_compilations` set,
    or those of a cache the user configured — on a GPU its share of the GPU's memory, and the
    sweep's process id (:data:`jaxfl._sweep_worker.SWEEP_PID`).

    >>> import jax
    >>> from jaxfl.comparison import shared_compilations
    >>> with shared_compilations() as cache:
    ...     env = _worker_environment(1, cache)
    >>> env["JAX_NUM_CPU_DEVICES"], env["JAX_COMPILATION_CACHE_DIR"] == cache
    ('1', True)
    >>> with shared_compilations() as cache, jax.enable_x64(True):
    ...     _worker_environment(1, cache)["JAX_ENABLE_X64"]
    'true'
    """
    import jax

    from jaxfl._devices import without_device_count_flag

    env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices), JAX_COMPILATION_CACHE_DIR=cache,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(jax.config.jax_persistent_cache_min_compile_time_secs),
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=str(jax.config.jax_persistent_cache_min_entry_size_bytes))
    if jax.config.jax_compilation_cache_max_size != -1:  # a bound the user set for jax
        env["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(jax.config.jax_compilation_cache_max_size)
    if gpu_memory_fraction is not None:
        env[GPU_MEMORY_FRACTION] = str(gpu_memory_fraction)
    env.pop("JAXFL_CPU_DEVICES", None)
    if "xla_force_host_platform_device_count" in env.get("XLA_FLAGS", ""):  # the share decides the devices
        env["XLA_FLAGS"] = without_device_count_flag(env["XLA_FLAGS"])
    # the sweep's own jax settings that change a run's numbers, however they were made: a notebook's
    # jax.config.update("jax_enable_x64", True) reached the cells of --jobs 1 and not those of --jobs 2
    from jaxfl.experiment import jax_setting_text, jax_settings

    for name, value in jax_settings().items():
        if value is None:
            env.pop(name.upper(), None)
        else:
            env[name.upper()] = jax_setting_text(value)
    from jaxfl._sweep_worker import SWEEP_PID

    # a worker whose sweep died before it could ask Linux to be told ends at once (_end_with_the_sweep)
    env[SWEEP_PID] = str(os.getpid())
    return env


def _run_parallel(sweep_dir: str, cells: list[Cell], states: dict, shares: _Shares, cache: str, done: dict,
                  say, note, bar, peak: list, cell_finished=lambda: None, speeds_file: str | None = None) -> None:
    """:func:`run_sweep`'s cells, ``len(shares.cores)`` at a time, each in a ``jaxfl._sweep_worker``
    process pinned to one share of the cores (on a GPU with its share of the GPU's memory), in cell
    order as shares come free, calling ``cell_finished`` after each cell that finishes
    (:func:`run_sweep` rewrites its table). Each worker's output goes to
    ``SWEEP_DIR/logs/cell-N.log`` (kept where the cell failed). A failed cell stops the sweep: the
    others are interrupted (they resume later) and the error names the cell and ends with its log.
    Interrupted (Ctrl-C, SIGINT), the workers are interrupted too and waited for; asked to stop
    (SIGTERM, :func:`jaxfl.stopping.request_stop`), the workers are asked too (each writes a
    checkpoint at its next event boundary) and waited for, and it raises
    :class:`jaxfl.stopping.StopRequested`."""
    import signal
    import subprocess
    import sys
    import time

    from jaxfl import stopping
    from jaxfl._sweep_worker import NOTE, RELAYED_WARNING

    env = _worker_environment(len(shares.cores[0]), cache, shares.gpu_memory_fraction)
    waiting = [cell for cell in cells if states[cell.index] != "finished"]
    for cell in cells:
        if states[cell.index] == "finished":
            done["finished"].append(cell.index)
    logs = os.path.join(sweep_dir, "logs")
    free = list(range(len(shares.cores)))
    running: dict = {}  # process → (cell, state, share, log path)

    def show_running() -> None:
        if bar is not None:
            names = ", ".join(str(entry[0].index) for entry in running.values())
            bar.set_postfix_str(f"{len(running)} running: cell{'s' if len(running) > 1 else ''} {names}"
                                if running else "")

    def stop_all(asked: bool) -> None:
        if not asked:
            # a Ctrl-C at a terminal reached the workers too (one process group): a moment to end on
            # their own, so that none gets a second interrupt while it closes its logs
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and any(process.poll() is None for process in running):
                time.sleep(0.05)
        for process in running:  # asked: each stops at its next event boundary with a checkpoint (twice is harmless)
            if process.poll() is None:
                process.send_signal(signal.SIGTERM if asked else signal.SIGINT)
        deadline = time.monotonic() + 120
        for process in running:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdin.close()

    relayed: set[str] = set()  # the cells' notes said so far

    def start_and_collect() -> None:
        while waiting or running:
            while waiting and free:
                cell = waiting.pop(0)
                state, share = states[cell.index], free.pop(0)
                os.makedirs(logs, exist_ok=True)
                log = os.path.join(logs, f"cell-{cell.index}.log")
                with open(log, "w") as handle:
                    process = subprocess.Popen(
                        [sys.executable, "-m", "jaxfl._sweep_worker", ",".join(map(str, shares.cores[share])), state,
                         cell.run_dir, json.dumps(cell.config.to_dict()), *([speeds_file] if speeds_file else [])],
                        # stdin: a pipe held open and never written, which ends with this process (a worker
                        # without Linux's parent-death signal watches it: _sweep_worker._watch_the_sweep)
                        stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, env=env)
                running[process] = (cell, state, share, log)
                peak[0] = max(peak[0], len(running))
                show_running()
            time.sleep(0.05)
            reason = stopping.take_stop_request()
            if reason is not None:
                raise stopping.StopRequested(reason)
            for process in [process for process in running if process.poll() is not None]:
                cell, state, share, log = running.pop(process)
                process.stdin.close()
                free.append(share)
                free.sort()
                with open(log) as handle:
                    output = handle.read()
                if process.returncode == 130:
                    raise KeyboardInterrupt
                if process.returncode == stopping.SIGTERM_STATUS:  # a worker ended by SIGTERM alone: all stop so
                    raise stopping.StopRequested("SIGTERM")
                if process.returncode != 0 or not os.path.isfile(os.path.join(cell.run_dir, "summary.json")):
                    tail = "\n".join(output.strip().splitlines()[-15:])
                    raise CellFailed(f"sweep cell {cell.index} ({cell.label()}) failed (exit status "
                                     f"{process.returncode}; its output in {log}):\n{tail}")
                for line in output.splitlines():
                    if line.startswith(NOTE):
                        note(f"cell {cell.index}: {line[len(NOTE):]}")
                        state = "restart"
                    elif line.startswith(RELAYED_WARNING):  # a run's note, said here as with --jobs 1
                        said = line[len(RELAYED_WARNING):]
                        if said not in relayed:  # once a sweep, as the jaxfl command says a note, by its first cell
                            relayed.add(said)
                            note(f"cell {cell.index}: {said}")
                done[state].append(cell.index)
                os.remove(log)
                cell_finished()  # first: a cell announced finished is in the table
                from jaxfl.runlog import read_json

                say(_finished_line(cell, read_json(os.path.join(cell.run_dir, "summary.json")), state))
                show_running()
                if bar is not None:
                    bar.update(1)

    try:
        with stopping.accepting_stop_requests():
            start_and_collect()
    except BaseException as error:
        stop_all(asked=isinstance(error, stopping.StopRequested))
        raise
    finally:
        for indices in done.values():  # in cell order, as a sweep of one job at a time lists them
            indices.sort()
    if os.path.isdir(logs) and not os.listdir(logs):
        os.rmdir(logs)


def base_mapping(config: RunConfig) -> dict:
    """A RunConfig as a sweep's base: the flat mapping of its fields that differ from the defaults
    and its algorithm's options (as ``space.option``). Where the runs are written belongs to the
    sweep: an ``output_dir`` or ``run_name`` of its own is refused; ``progress`` is left out
    (:func:`run_sweep` has one bar for the grid).

    >>> base_mapping(RunConfig(algorithm="port", clients=5, algorithm_options={"staleness_bound": 5}))
    {'clients': 5, 'algorithm': 'port', 'port.staleness_bound': 5}
    """
    default = RunConfig()
    for name in ("output_dir", "run_name"):
        if getattr(config, name) != getattr(default, name):
            raise ConfigError(f"{name}={getattr(config, name)!r} is not allowed in a sweep's base config: the runs go "
                              "to SWEEP_DIR/runs/, named by their settings; leave it at its default")
    values = {name: getattr(config, name) for name in FIELDS
              if name not in ("algorithm_options", *SWEEP_OWNED) and getattr(config, name) != getattr(default, name)}
    options = config.algorithm_options
    if options is not None:
        space = algorithms.get(config.algorithm).option_namespace()
        cls = algorithms.get(config.algorithm).Options
        given = options if isinstance(options, dict) else {
            field.name: getattr(options, field.name) for field in dataclasses.fields(cls)
            if getattr(options, field.name) != field.default}
        values.update({f"{space}.{key}": value for key, value in given.items()})
    return values
