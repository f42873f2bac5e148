"""The papers' tables and figures from a sweep folder (``jaxfl report SWEEP_DIR``).

From the sweep's ``results.csv`` (:mod:`jaxfl.sweep`), grouped by the settings the sweep varied
other than the algorithm and the seed (clients, heterogeneity, partition...):

- **time to first reach the target accuracy, relative to a reference algorithm** (FedAvg unless
  chosen), as in FedCompass (Li et al., ICLR 2024, Table 2): each method's mean virtual time to
  target over the seeds that reached it, and its ratio to the reference's, both means taken over
  the seeds where both reached it (a method that is 2× slower in every seed it reaches does not look
  faster for having missed the seed where everyone is slow); "–" where a method missed the target
  in at least half of its runs, "n/a" where the reference did, "no ratio" where the reference
  reached it at 0 s (its initial model: a ratio against 0 s is undefined; a time of 0 s shows as
  "reached at start");
- the same **seed by seed** where the sweep ran several seeds: each seed's time over the reference's
  in that seed (the reference's row: its own times), since where seeds differ more than methods
  (a split that is near IID in one seed and skewed in the next) a ratio of means hides what holds
  in every seed; in ``report.csv`` a ``relative_time_seed{S}`` column per seed;
- **best held-out accuracy**, mean ± std over the seeds (numpy's std, ddof 0);
- **final held-out accuracy** (at the end of the budget, as CC-FedAvg's Table II and FedASMU's
  report it), mean ± std, with the **computation** spent (local steps of the updates that reached the server) relative
  to the reference's, and seed by seed its difference to the reference's in the same seed;
- **accuracy over the last tenth of the evaluations** (the mean of each run's last tenth of
  evaluations, e.g. its last 40 of 401, then mean ± std over the seeds), where the results have
  it: the end of the budget without one evaluation's swing, to tell a method that ends lower from
  one that ended on a dip; seed by seed as the final accuracy.

A setting that only some algorithms read (FedBuff's buffer_size, PORT's ``port.min_clients``,
FedAdam's server_tau) names a method variant; a setting every algorithm of the sweep reads
(clients_per_round of FedAvg and CC-FedAvg) is a group like the clients or the heterogeneity, so
each group has its reference, and so is a swept target accuracy. A method in a group without the
reference shows its own time in brackets.
Groups come in the grid's order, each setting's numbers ascending (:func:`group_order`), also where
the grid was run in parts.

Both are printed and written to ``report.md`` (markdown) and ``report.csv`` (one row per group and
method, with the absolute times), beside the figures (PNG): accuracy against virtual time per method
with its min–max band over the seeds (one figure per group; a run that ended, at its target or
its budget, counts with its last accuracy to the figure's end) and the same against the computation
spent (``accuracy_vs_steps``: the local steps of the updates delivered), time-to-target bars,
staleness histograms per group and method (one figure, a row of panels a group), and the client
timeline of one run per group and method (its lowest seed, named in the title;
``timeline-METHOD-GROUP.png``, ``timeline-METHOD.png`` for a report of one group). From results tables
whose runs are gone (seeds run on other machines, committed CSVs), ``figures="table"`` draws the
figures the table alone makes: the time-to-target bars and, with ``grid``, the heat maps.
Timing-only runs (``timing_only``: the schedule without training) evaluate no model: their rows get
a table of the schedule's figures instead (virtual time, updates, utilisation, mean staleness...,
mean ± std over seeds: :func:`summarise_timing`), and of the figures the staleness histograms and
the client timelines.

A method is an algorithm, or an algorithm with the values of its own swept settings
(``fedbuff buffer_size=5``) where the sweep varies one of them. A design-space sweep (PORT's K × Ω,
40 methods) draws unreadable figures of one panel; ``panels="port.min_clients"`` splits the accuracy
and time-to-target figures into one panel per value of that setting, the methods that do not read
it (FedAvg, FedBuff...) drawn in every panel for reference; ``grid=("port.min_clients",
"port.staleness_bound")`` adds the relative times as a K × Ω table per group (:func:`design_grid`)
and its heat maps.

>>> rows = [{"algorithm": "fedavg", "clients": 10, "seed": 0, "time_to_target": 100.0, "best_accuracy": 0.90},
...         {"algorithm": "fedbuff", "clients": 10, "seed": 0, "time_to_target": 25.0, "best_accuracy": 0.92}]
>>> [(line["method"], line["relative_time"]) for line in summarise(rows)]
[('fedavg', 1.0), ('fedbuff', 0.25)]
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import shlex
import shutil
import tempfile
import textwrap
import warnings
from typing import Callable, Sequence

import numpy as np

from jaxfl.config import ALGORITHM_FIELDS, user_path
from jaxfl.plot import percent, save_figure
from jaxfl.plot import significant as _significant
from jaxfl.runlog import diverged as _diverged
from jaxfl.runlog import read_events, read_json, run_last_tenth_accuracy, write_csv
from jaxfl.sweep import SUMMARY_COLUMNS, _read_definition

MISSING = "–"
_ABSENT = "·"  # a design grid's cell of a method the sweep did not run
_NO_RATIO = "no ratio"  # a design grid's cell where the reference reached the target at 0 s
NOT_SETTINGS = ("cell", "run_dir", "algorithm", "seed", *SUMMARY_COLUMNS)


@dataclasses.dataclass(frozen=True)
class Report:
    """What :func:`make_report` wrote: the markdown text and its path, the CSV table's path and its
    rows (:func:`summarise`, then :func:`summarise_timing`'s of timing-only runs), the figures' paths, and with ``grid`` the :class:`DesignGrid` and its
    tables' markdown (also at the end of ``markdown``)."""

    markdown: str
    markdown_path: str
    table: str
    rows: list
    figures: list
    grid: DesignGrid | None = None
    grid_markdown: str | None = None


# The accuracies whose seed-by-seed differences to the reference the report tables (several seeds).
SEED_BY_SEED_ACCURACIES = ("final_accuracy", "last_tenth_accuracy")


def _number(text: str):
    """A results.csv cell as Python: '' → None, integers, floats, 'True'/'False', else the text."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def results_path(source: str) -> str:
    """The results table a report source names: ``SOURCE/results.csv`` for a sweep folder, or
    ``SOURCE`` itself for a CSV file (a sweep's ``results.csv`` kept apart from its folder, e.g. the
    tables committed under ``benchmarks/reproduction/results/``).

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> _ = open(f"{folder}/results.csv", "w").write("algorithm,seed\\nfedavg,0\\n")
    >>> results_path(folder) == results_path(f"{folder}/results.csv") == f"{folder}/results.csv"
    True
    """
    if os.path.isdir(source):
        path = os.path.join(source, "results.csv")
        if not os.path.isfile(path):
            if os.path.isfile(os.path.join(source, "sweep.json")):  # begun by a jaxfl that wrote it only at the end
                raise FileNotFoundError(f"sweep_dir={source!r} holds no results.csv yet: its sweep has not written "
                                        "one; the same jaxfl sweep command again writes it (finished cells are not "
                                        "rerun) and goes on with the rest")
            comparison = os.path.join(source, "comparison.csv")
            parent = os.path.dirname(os.path.abspath(source))
            hint = f"; its comparison's table is one: jaxfl report {shlex.quote(comparison)}" \
                if os.path.isfile(comparison) else \
                f"; it is the runs folder of the sweep {parent}: jaxfl report {shlex.quote(parent)}" \
                if os.path.isfile(os.path.join(parent, "sweep.json")) else \
                "; it is a run directory: jaxfl report reads a sweep folder or a results CSV" \
                if os.path.isfile(os.path.join(source, "config.json")) else ""
            raise FileNotFoundError(f"sweep_dir={source!r} holds no results.csv (not a folder written by jaxfl "
                                    f"sweep){hint}")
        return path
    if not os.path.isfile(source):
        raise FileNotFoundError(f"sweep_dir={source!r} does not exist: a folder written by jaxfl sweep, or its "
                                "results.csv (a CSV file)")
    if not source.lower().endswith(".csv"):
        raise ValueError(f"sweep_dir={source!r} is not allowed: a folder written by jaxfl sweep, or a results "
                         "table ending in .csv")
    return source


def coverage_note(sources: Sequence[str], rows_per_source: Sequence[int]) -> str | None:
    """A line for a report over fewer runs than its sweeps have cells (a sweep still running, or
    stopped), naming each such folder with its finished and total cells from ``sweep.json``; None
    where every source is complete, or is a results CSV (no grid to compare with).

    >>> import json, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> cells = [{"cell": i, "run_dir": f"runs/{i}"} for i in range(72)]
    >>> _ = open(f"{folder}/sweep.json", "w").write(json.dumps({"cells": cells}))
    >>> coverage_note([folder], [25]).startswith(f"This report covers 25 of the 72 cells of {folder}")
    True
    """
    from jaxfl.runlog import finished_summary

    partial, behind = [], []
    for source, rows in zip(sources, rows_per_source):
        definition = os.path.join(source, "sweep.json") if os.path.isdir(source) else None
        if definition is None or not os.path.isfile(definition):
            continue
        cells = _read_definition(definition).get("cells", ())
        if rows < len(cells):
            partial.append(f"{rows} of the {len(cells)} cells of {source}")
            finished = sum(finished_summary(os.path.join(source, str(cell.get("run_dir", "")))) is not None
                           for cell in cells if cell.get("run_dir"))
            if finished > rows:  # rows lost from the table (cut at a line end), not cells still to run
                behind.append(f"{source}'s results.csv lists {rows} runs, but {finished} of its cells have "
                              f"finished: the table was cut or is behind")
    if not partial:
        return None
    if behind:
        return (f"This report covers {', and '.join(partial)}: {'; '.join(behind)} (a sweep still running adds "
                "each cell as it finishes: report again then); the same jaxfl sweep command writes it again from "
                "the finished runs (they are not rerun). Means, ratios and figures are over the runs the table "
                "lists only.")
    return (f"This report covers {', and '.join(partial)}: the others have not finished (the sweep is still "
            "running, or was stopped; the same jaxfl sweep command goes on with them). Means, ratios and "
            "figures are over the finished runs only.")


def code_note(rows: list[dict]) -> str | None:
    """A note where the runs of a report were made by more than one jaxfl (their ``jaxfl_code``
    column: a sweep folder reused across an upgrade, or folders made months apart), naming each code
    and how many runs it trained; None where one made them all, or the table does not say.

    >>> rows = [{"jaxfl_code": "0.2.0+gaaaaaaaaa"}, {"jaxfl_code": "0.2.0+gaaaaaaaaa → 0.2.0+gbbbbbbbbb"}]
    >>> print(code_note(rows))
    The runs were made by 2 versions of jaxfl (the jaxfl_code column of their results): 0.2.0+gaaaaaaaaa (2 runs), 0.2.0+gbbbbbbbbb (1 run). A difference between methods or seeds may be the code's as well as the settings'.
    >>> code_note(rows[:1]) is None
    True
    """
    counts: dict[str, int] = {}
    unknown = 0
    for row in rows:
        codes = [code for code in dict.fromkeys(str(row.get("jaxfl_code") or "").split(" → ")) if code]
        unknown += not codes
        for code in codes:
            counts[code] = counts.get(code, 0) + 1
    if len(counts) + bool(unknown) < 2 or not counts:
        return None
    listed = ", ".join(f"{code} ({count} run{'s' * (count != 1)})" for code, count in counts.items())
    if unknown:  # a table from before the column (a committed results CSV), beside runs that say
        listed += f"; {unknown} run{'s' * (unknown != 1)} {'record' if unknown != 1 else 'records'} none (made before " \
                  "the column)"
    versions = f"{len(counts)} version{'s' * (len(counts) != 1)}" + (" and more" if unknown else "")
    return (f"The runs were made by {versions} of jaxfl (the jaxfl_code column of their results): {listed}. "
            "A difference between methods or seeds may be the code's as well as the settings'.")


def _base_folder(source: str) -> str:
    """The folder a source's ``run_dir`` column is relative to: the sweep folder, or the CSV's own."""
    return source if os.path.isdir(source) else os.path.dirname(os.path.abspath(source))


def canonical_setting(name: str) -> str:
    """A results column or method setting by its option's field name: ``compass.lambda`` is
    ``compass.latest_time_factor`` (a sweep of before 2026-12-05 kept a grid axis as the file spelled
    it; one part of a grid from then and one from now are one method).

    >>> canonical_setting("compass.lambda"), canonical_setting("clients")
    ('compass.latest_time_factor', 'clients')
    """
    space, dot, option = name.partition(".")
    if not dot:
        return name
    from jaxfl import algorithms
    from jaxfl.config import option_namespaces

    owners = option_namespaces().get(space)
    if not owners:
        return name
    return f"{space}.{algorithms.get(owners[0]).Options.field_name(option)}"


def _canonical_method(name: str) -> str:
    """A method's name (``fedcompass compass.lambda=1.2``) with its settings by field name."""
    return " ".join(canonical_setting(setting) + equals + value if equals else setting
                    for setting, equals, value in (part.partition("=") for part in name.split(" ")))


def read_results(sweep_dir: str) -> list[dict]:
    """The rows of ``SWEEP_DIR/results.csv`` (or of a results CSV file: :func:`results_path`),
    numbers parsed, empty cells as None.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> _ = open(f"{folder}/results.csv", "w").write("algorithm,seed,time_to_target\\nfedavg,0,\\n")
    >>> read_results(folder)
    [{'algorithm': 'fedavg', 'seed': 0, 'time_to_target': None}]
    """
    path = results_path(sweep_dir)
    with open(path, newline="") as handle:
        text = handle.read()
    # a sweep writes the table whole (atomically): a last line without its end, or a row short of
    # the header's columns, is damage done after, not a sweep still running
    advice = ("the same jaxfl sweep command writes it again from the finished runs (they are not rerun)"
              if os.path.isdir(sweep_dir) else "restore it from a copy, or take the sweep folder's results.csv")
    if text and not text.endswith("\n") and os.path.isdir(sweep_dir):  # a CSV of the user's may end without one
        raise ValueError(f"{path} is damaged: its last line is cut short (no line end); {advice}")
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    for number, row in enumerate(rows, start=2):
        if None in row or None in row.values():  # more columns than the header, or fewer
            raise ValueError(f"{path} is damaged: line {number} does not hold one value per column of its "
                             f"header; {advice}")
    parsed = [{canonical_setting(key): _number(value) for key, value in row.items()} for row in rows]
    for number, row in enumerate(parsed, start=2):
        for column in NUMBER_COLUMNS:
            value = row.get(column)
            if value is not None and (isinstance(value, (str, bool)) or math.isnan(value)):
                raise ValueError(f"{path}, line {number}: {column}={value!r} is not allowed: a number, or empty "
                                 f"(not reached, or not measured)")
    return parsed


def _run_target_accuracy(run_dir: str) -> float | None:
    """The target accuracy a run folder's ``summary.json`` records (None: no target, or no readable summary)."""
    from jaxfl.runlog import finished_summary

    target = (finished_summary(run_dir) or {}).get("target_accuracy")
    return float(target) if isinstance(target, (int, float)) and not isinstance(target, bool) else None


# The summary columns the tables compute with (jaxfl.sweep.SUMMARY_COLUMNS but the stop reason and the code).
NUMBER_COLUMNS = tuple(name for name in SUMMARY_COLUMNS if name not in ("stop_reason", "jaxfl_code"))


def read_results_of(sweep_dirs: Sequence[str]) -> list[dict]:
    """The rows of several sweep folders' ``results.csv`` (or results CSV files) as one table: the
    same grid split over machines or sessions (seeds on a GPU, the rest on a CPU), or a grid extended
    into a folder of its own. Each row's ``run_dir`` becomes the path of its run (so figures find it
    in its own folder); a row written before ``last_tenth_accuracy`` was a column gets it from its
    run's ``metrics.csv`` where the run folder is there; a column one folder lacks is empty in its
    rows; a run found in two folders (the same settings and seed) is an error naming both, as is a
    folder given twice, and so are folders whose runs differ in a setting the rows do not carry (a
    base setting of ``sweep.json`` such as the learning rate, or the rows' target accuracy:
    :func:`_check_same_settings`), which one table would count as seeds of one method.

    >>> import tempfile
    >>> first, second = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> _ = open(f"{first}/results.csv", "w").write("cell,algorithm,seed,run_dir,best_accuracy\\n0,fedavg,0,runs/a,0.5\\n")
    >>> _ = open(f"{second}/results.csv", "w").write("cell,algorithm,seed,run_dir,best_accuracy\\n0,fedavg,1,runs/a,0.6\\n")
    >>> [(row["seed"], row["best_accuracy"]) for row in read_results_of([first, second])]
    [(0, 0.5), (1, 0.6)]
    """
    folders = [os.path.normpath(folder) for folder in sweep_dirs]
    if not folders:
        raise ValueError("sweep_dirs=[] is not allowed: at least one folder written by jaxfl sweep")
    tables = [os.path.abspath(results_path(folder)) for folder in folders]  # each checked before any is read
    repeated = sorted({folder for folder, table in zip(folders, tables) if tables.count(table) > 1})
    if repeated:
        raise ValueError(f"sweep_dirs names the results of {repeated[0]!r} more than once: give each folder "
                         "(or its results.csv) once")
    found = []  # (row, its folder)
    for folder, table in zip(folders, tables):
        base = os.path.abspath(_base_folder(folder))
        for row in read_results(table):
            if row.get("run_dir") is not None:  # absolute: os.path.join(any folder, it) is it
                row["run_dir"] = os.path.join(base, str(row["run_dir"])) if row.get("cell") is not None else \
                    _located_run_dir(base, str(row["run_dir"]))
                if row.get("last_tenth_accuracy") is None:
                    row["last_tenth_accuracy"] = run_last_tenth_accuracy(row["run_dir"])
                if "target_accuracy" not in row:  # a comparison's table has no such column: its run says it
                    row["target_accuracy"] = _run_target_accuracy(row["run_dir"])
            found.append((row, folder))
    if len(folders) > 1:
        _check_same_settings(folders, found)
    columns = list(dict.fromkeys(name for row, _ in found for name in row))
    settings = [name for name in columns if name not in ("cell", "run_dir", *SUMMARY_COLUMNS)]
    rows, origin = [], {}
    for row, folder in found:
        row = {name: row.get(name) for name in columns}
        # the target is a summary column and a sweepable setting: runs at two targets are two runs
        key = (*(row[name] for name in settings), row.get("target_accuracy"))
        if key in origin:
            named = ", ".join(f"{name}={value}" for name, value in zip([*settings, "target_accuracy"], key)
                              if value is not None)
            if origin[key] != folder:
                raise ValueError(f"the run {named} is in both {origin[key]!r} and {folder!r}: give each run once "
                                 "(each part of a grid in a folder of its own)")
            # a table joined by hand, or a file appended twice: one run counted as two seeds
            raise ValueError(f"the run {named} has two rows in {results_path(folder)!r}: give each run once "
                             "(a table joined from parts: report the parts' folders or files together instead, "
                             "jaxfl report A B)")
        origin[key] = folder
        rows.append(row)
    return rows


# Settings of how a run is executed or stored, not of what it computes: the same grid's seeds run on
# a GPU (with --data-dir, other devices) and on a CPU differ in these and are still one table.
EXECUTION_SETTINGS = ("data_dir", "devices", "memory_limit_mb", "batching", "clients_per_call", "steps_per_call",
                      "cpu_friendly_layers", "checkpoint_every", "checkpoint_min_interval_s", "final_checkpoint",
                      "output_dir", "run_name", "progress")


def _fixed_settings(folder: str, rows: list[dict]) -> dict[str, object]:
    """The settings a folder's runs share that its rows do not tell apart, for comparing folders
    before their rows become one table: the base settings of its ``sweep.json`` (not in its grid:
    set by the sweep file or a flag) that its results table has no column for, less
    :data:`EXECUTION_SETTINGS`, and the target accuracy of its rows (a summary column, so not among
    the settings a run is keyed by; one value, or a tuple of a folder's several). A results CSV has
    no ``sweep.json``: its target accuracy alone. A setting a folder's base leaves out is not known
    for it (it may be the default, or one its algorithms do not read), so it is compared between the
    folders that set it.

    >>> import json, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> _ = open(f"{folder}/sweep.json", "w").write(json.dumps({"base": {"client_lr": 0.01, "seed": 1}}))
    >>> _fixed_settings(folder, [{"algorithm": "fedavg", "seed": 1, "target_accuracy": 0.8}])  # the rows carry the seed
    {'client_lr': 0.01, 'target_accuracy': 0.8}
    """
    found: dict[str, object] = {}
    definition = os.path.join(folder, "sweep.json") if os.path.isdir(folder) else None
    if definition is not None and os.path.isfile(definition):
        swept = _read_definition(definition)
        carried = {name for row in rows for name in row}
        grid = swept.get("grid", {})
        for name, value in swept.get("base", {}).items():  # a sweep.json without base: its rows alone
            if name not in carried and name not in grid and name not in NOT_SETTINGS \
                    and name not in EXECUTION_SETTINGS:
                found[name] = value
    targets = sorted({row["target_accuracy"] for row in rows if row.get("target_accuracy") is not None})
    if targets:
        found["target_accuracy"] = targets[0] if len(targets) == 1 else tuple(targets)
    return found


def _run_settings(run_dir: str) -> dict[str, object] | None:
    """What a run computed with, from its ``config.json``: its fields and options as a sweep names
    them (options as ``space.option``), less those it never reads (another algorithm's fields, a
    speed model's setting under another speed model: :func:`jaxfl.sweep._unread`); every field,
    those left at their defaults too. None where the run folder or its config is gone or unreadable,
    or was written by a jaxfl whose fields this one does not know.

    >>> import tempfile
    >>> from jaxfl.config import RunConfig
    >>> folder = tempfile.mkdtemp()
    >>> _ = open(f"{folder}/config.json", "w").write(json.dumps({"config": RunConfig(algorithm="fedavg").to_dict()}))
    >>> settings = _run_settings(folder)  # FedAvg reads no buffer size, and no other algorithm's options
    >>> settings["client_lr"], "buffer_size" in settings, "compass.q_min" in settings
    (0.003, False, False)
    """
    from jaxfl import algorithms
    from jaxfl.config import as_recorded, split_algorithm_options
    from jaxfl.sweep import _unread

    try:
        with open(os.path.join(run_dir, "config.json")) as handle:
            written = as_recorded(json.load(handle)["config"])
        fields, _ = split_algorithm_options(written)
        options = fields.pop("algorithm_options", None) or {}
        space = algorithms.get(fields["algorithm"]).option_namespace()
        flat = {**fields, **{f"{space}.{name}": value for name, value in options.items()}}
        unread = set(_unread(flat))
    except (OSError, ValueError, KeyError, TypeError):  # ConfigError is a ValueError
        return None
    return {name: value for name, value in flat.items() if name not in unread}


def _runs_differ(folders: list[str], found: list[tuple[dict, str]], already: set[str]) -> list[str]:
    """The settings in which the folders' runs of one algorithm differ, read from each folder's
    first run of that algorithm whose folder is there (:func:`_run_settings`): every setting, so
    that one left at its default in one sweep and set in another's base is caught too, less those
    the rows carry (they tell the runs apart), :data:`EXECUTION_SETTINGS` and ``already`` (found by
    :func:`_fixed_settings`). A setting one run's jaxfl did not have is compared where both have it."""
    carried = {name for row, _ in found for name in row}
    first: dict[tuple[str, str], dict] = {}  # (algorithm, folder) -> settings
    for row, folder in found:
        key = (str(row.get("algorithm")), folder)
        if key not in first and row.get("run_dir") is not None:
            settings = _run_settings(str(row["run_dir"]))
            if settings is not None:
                first[key] = settings
    differ = []
    for algorithm in dict.fromkeys(algorithm for algorithm, _ in first):
        runs = {folder: settings for (name, folder), settings in first.items() if name == algorithm}
        if len(runs) < 2:
            continue
        names = dict.fromkeys(name for settings in runs.values() for name in settings)
        for name in names:
            if name in carried or name in already or name in EXECUTION_SETTINGS or name in NOT_SETTINGS:
                continue
            known = {folder: settings[name] for folder, settings in runs.items() if name in settings}
            if len({json.dumps(value, default=str) for value in known.values()}) > 1:
                differ.append(f"{name} of the {algorithm} runs " +
                              ", ".join(f"{value} in {folder}" for folder, value in known.items()))
    return differ


def _check_same_settings(folders: list[str], found: list[tuple[dict, str]]) -> None:
    """Refuse folders whose runs differ in a setting their rows do not carry (:func:`_fixed_settings`,
    then the runs' own configs where their folders are there: :func:`_runs_differ`): one table of
    them would make a run at learning rate 0.01 another seed of the same method at 0.003, and
    average a time to 80% with a time to 85%. Parts of one grid (seeds on another machine, further
    values of an axis) share every such setting."""
    rows_of: dict[str, list[dict]] = {folder: [] for folder in folders}
    for row, folder in found:
        rows_of[folder].append(row)
    fixed = {folder: _fixed_settings(folder, rows) for folder, rows in rows_of.items()}
    names = dict.fromkeys(name for settings in fixed.values() for name in settings)
    differ = []
    for name in names:
        known = {folder: settings[name] for folder, settings in fixed.items() if name in settings}
        if len({json.dumps(value, default=str) for value in known.values()}) > 1:
            differ.append(f"{name} " + ", ".join(f"{value} in {folder}" for folder, value in known.items()))
    differ += _runs_differ(folders, found, {text.split(" ", 1)[0] for text in differ})
    if differ:
        raise ValueError(f"the folders' runs differ in settings their rows do not tell apart: {'; '.join(differ)}; "
                         "one table would count them as seeds of one method and average their times: report each "
                         "on its own (jaxfl report FOLDER), or rerun one with the other's settings (a setting "
                         "to compare belongs in one sweep's grid)")


# Algorithm-specific fields that name a group of runs, not a method variant: a federation's clients
# in flight, as its size (a FedBuff sweep over concurrency 100 and 1,000: a table each).
GROUP_FIELDS = ("concurrency",)


def _method_columns(rows: list[dict]) -> list[str]:
    """Swept settings that belong to algorithms (an option ``space.name`` or a field such as
    buffer_size) and name a method variant rather than a group: those some of the sweep's algorithms
    do not read (empty in their rows). A setting every run reads in a sweep of several algorithms
    (clients_per_round of FedAvg against CC-FedAvg: the papers' participation columns) is a group, so
    that every group holds the reference algorithm.

    >>> rows = [{"algorithm": a, "clients_per_round": m, "buffer_size": b}
    ...         for a, b in [("fedavg", None), ("fedbuff", 5), ("fedbuff", 10)] for m in (10, 20)]
    >>> _method_columns(rows)
    ['buffer_size']
    """
    several_algorithms = len({row.get("algorithm") for row in rows}) > 1
    return [name for name in rows[0] if name not in NOT_SETTINGS and name not in GROUP_FIELDS
            and len({row.get(name) for row in rows}) > 1
            and (("." in name or name in ALGORITHM_FIELDS)
                 and not (several_algorithms and all(row.get(name) is not None for row in rows))
                 or several_algorithms and _read_by_some_algorithms_only(rows, name))]


def _read_by_some_algorithms_only(rows: list[dict], name: str) -> bool:
    """Whether the sweep left ``name`` empty in every row of some algorithms and set it in every row
    of the others: a setting their algorithm decides they read (FedAdam's server_tau beside FedAvg),
    not their partition or data (dirichlet_alpha, empty in a sweep's IID rows of every algorithm).

    >>> rows = [{"algorithm": "fedavg", "server_tau": None}] + [{"algorithm": "fedadam", "server_tau": t}
    ...                                                          for t in (0.001, 0.01)]
    >>> _read_by_some_algorithms_only(rows, "server_tau"), _read_by_some_algorithms_only(rows[1:], "server_tau")
    (True, False)
    """
    empty: dict[object, set[bool]] = {}
    for row in rows:
        empty.setdefault(row.get("algorithm"), set()).add(row.get(name) is None)
    return all(len(kinds) == 1 for kinds in empty.values()) and {True, False} <= set().union(*empty.values())


def group_columns(rows: list[dict]) -> list[str]:
    """The settings the rows vary other than the algorithm, its own settings and the seed (the
    groups of the tables), in the table's column order.

    >>> group_columns([{"algorithm": "a", "clients": 5, "seed": 0, "partition": "iid"},
    ...                {"algorithm": "a", "clients": 10, "seed": 0, "partition": "iid"}])
    ['clients']
    """
    method = set(_method_columns(rows))
    columns = [name for name in rows[0] if name not in NOT_SETTINGS and name not in method
               and len({str(row.get(name)) for row in rows}) > 1]
    # the target is a summary column, and a setting a sweep may vary: runs at two targets are two
    # groups, not two seeds of one method (unless the groups' other settings, e.g. the dataset, decide it)
    targets: dict[tuple, set] = {}
    for row in rows:
        targets.setdefault(tuple(str(row.get(name)) for name in columns), set()).add(row.get("target_accuracy"))
    return columns + (["target_accuracy"] if any(len(values) > 1 for values in targets.values()) else [])


def method_name(row: dict, method_columns: list[str]) -> str:
    """The algorithm, with the values of its own swept settings where it reads them.

    >>> method_name({"algorithm": "fedbuff", "buffer_size": 5}, ["buffer_size"])
    'fedbuff buffer_size=5'
    """
    own = [f"{name}={row[name]}" for name in method_columns if row.get(name) is not None]
    return " ".join([str(row["algorithm"]), *own])


@dataclasses.dataclass(frozen=True)
class _Grouping:
    """The results rows grouped once for the tables and the figures: ``cells[group values][method]``
    the runs, groups and methods in order of appearance."""

    columns: list[str]  # group_columns(rows): what a group's values are of
    methods: list[str]
    cells: dict[tuple, dict[str, list[dict]]]
    method_columns: list[str]  # the swept settings that name a method variant

    def runs_by_method(self) -> dict[str, list[dict]]:
        """Every group's runs of each method together."""
        return {name: [run for cell in self.cells.values() for run in cell.get(name, [])] for name in self.methods}


def _grouping(rows: list[dict]) -> _Grouping:
    if not rows:
        raise ValueError("the results table has no rows")
    columns, method_columns = group_columns(rows), _method_columns(rows)
    cells: dict[tuple, dict[str, list[dict]]] = {}
    methods: dict[str, None] = {}
    for row in rows:
        name = method_name(row, method_columns)
        methods[name] = None
        cells.setdefault(tuple(row.get(column) for column in columns), {}).setdefault(name, []).append(row)
    cells = {key: cells[key] for key in group_order(list(cells))}
    return _Grouping(columns, list(methods), cells, method_columns)


def group_order(keys: list[tuple]) -> list[tuple]:
    """The groups (tuples of the group columns' values, in order of appearance) in the order of the
    grid they came from, each column's numbers ascending: a grid run in parts (participations 10, 20,
    40, 80 first, then 30 and 60 into a folder of their own) reads as one. The column whose value
    changes least often from one group to the next in order of appearance sorts first (a grid's
    outermost axis), the one that changes most often last; text keeps its order of appearance.

    >>> group_order([(30,), (60,), (10,), (20,)])
    [(10,), (20,), (30,), (60,)]
    >>> group_order([("class", 5, "homo"), ("dual", 5, "homo"), ("class", 5, "exp"), ("dual", 5, "exp"),
    ...              ("class", 2, "homo"), ("dual", 2, "homo")])[:3]  # clients outermost, then speeds
    [('class', 2, 'homo'), ('dual', 2, 'homo'), ('class', 5, 'homo')]
    """
    if len(keys) < 2 or not keys[0]:
        return list(keys)
    width = len(keys[0])
    ranks = []
    for column in range(width):
        ranks.append({value: rank for rank, value in enumerate(_ordered([key[column] for key in keys]))})
    changes = [sum(before[column] != after[column] for before, after in zip(keys, keys[1:])) for column in range(width)]
    outermost_first = sorted(range(width), key=lambda column: changes[column])  # stable: ties in column order
    return sorted(keys, key=lambda key: tuple(ranks[column][key[column]] for column in outermost_first))


def _line_cells(lines: list[dict], groups: list[str]) -> tuple[list[tuple], list[str], dict[tuple, dict]]:
    """The summary lines as table cells: the groups' values and the methods, in order of appearance,
    and each ``(group values, method)``'s line."""
    found = {(tuple(line.get(name) for name in groups), line["method"]): line for line in lines}
    return list(dict.fromkeys(key for key, _ in found)), list(dict.fromkeys(method for _, method in found)), found


def _group_label(key: tuple, columns: list[str]) -> str:
    return ", ".join(f"{name}={value if value is not None else MISSING}" for name, value in zip(columns, key)) or "all"


def summarise(rows: list[dict], reference: str = "fedavg") -> list[dict]:
    """One row per group and method: runs, runs that reached the target, the mean (and std) virtual
    time to target over those (None: missed in at least half of the runs), the mean relative to the
    reference method's in the same group, both over the seeds where both reached the target (None
    where either mean is None), and the best accuracy's
    mean and std over the runs; with several seeds in a group, ``times_by_seed``: ``(seed, time,
    time relative to the reference's in that seed)`` per seed (time ``...``: no run of that seed;
    relative None where either missed), else None.
    Groups: :func:`group_columns`; methods in order of appearance.

    >>> rows = [{"algorithm": "fedavg", "seed": s, "time_to_target": t, "best_accuracy": 0.9}
    ...         for s, t in [(0, 100.0), (1, 60.0)]]
    >>> rows += [{"algorithm": "fedbuff", "seed": s, "time_to_target": t, "best_accuracy": a}
    ...          for s, t, a in [(0, 20.0, 0.91), (1, None, 0.85)]]  # missed in half its runs: "–"
    >>> [(r["method"], r["runs"], r["reached"], r["time_to_target_mean"], r["relative_time"]) for r in summarise(rows)]
    [('fedavg', 2, 2, 80.0, 1.0), ('fedbuff', 2, 1, None, None)]
    """
    return _summarise(_grouping(rows), reference)


def _summarise(grouping: _Grouping, reference: str) -> list[dict]:
    if reference not in grouping.methods:
        raise ValueError(f"reference={reference!r} is not allowed: one of the sweep's methods "
                         f"({', '.join(grouping.methods)})")
    groups = grouping.columns
    lines = []
    for key, by_method in grouping.cells.items():
        times = {}
        for name, runs in by_method.items():
            reached = [run["time_to_target"] for run in runs if run.get("time_to_target") is not None]
            # the papers' rule: a method that misses the target in at least half its runs has no time
            times[name] = (float(np.mean(reached)), float(np.std(reached)), len(reached)) \
                if 2 * len(reached) > len(runs) else (None, None, len(reached))
        base = times.get(reference, (None,))[0]
        seeds = sorted({run.get("seed") for runs in by_method.values() for run in runs}, key=_seed_order)
        reference_value = {column: {run.get("seed"): run.get(column) for run in by_method.get(reference, [])}
                           for column in ("time_to_target", *SEED_BY_SEED_ACCURACIES)}
        # the computation the clients spent; a table from before it was counted has the engine's steps,
        # which also hold work trained ahead for clients still out at the end (more with larger calls)
        counted = "client_steps_arrived" if all(run.get("client_steps_arrived") is not None
                                                for runs in by_method.values() for run in runs) \
            else "client_steps_executed"
        steps = {name: _mean_of(runs, counted)[0] for name, runs in by_method.items()}
        base_steps = steps.get(reference)
        for name, runs in by_method.items():
            mean, spread, reached = times[name]
            best, final = _mean_of(runs, "best_accuracy"), _mean_of(runs, "final_accuracy")
            tail = _mean_of(runs, "last_tenth_accuracy")
            # a reference that reached the target at 0 s (its initial model did) gives no ratio: against 0 s
            # it is undefined (reference_at_start), not a miss of the reference's (reference_reached)
            relative = None if mean is None or base is None or base == 0 else \
                _paired_ratio(runs, by_method[reference], mean / base)
            # none where the reference executed no step (a ratio against 0 steps is undefined)
            steps_compared = steps[name] is not None and bool(base_steps)
            relative_steps = _paired_ratio(runs, by_method[reference], steps[name] / base_steps, counted) \
                if steps_compared else None
            common = _common_seeds(runs, by_method[reference], counted) if steps_compared else set()
            lines.append({**dict(zip(groups, key)), "method": name, "algorithm": runs[0]["algorithm"],
                          "runs": len(runs), "reached": reached, "time_to_target_mean": mean,
                          "time_to_target_std": spread,
                          "relative_time": relative,
                          "best_accuracy_mean": best[0], "best_accuracy_std": best[1],
                          "final_accuracy_mean": final[0], "final_accuracy_std": final[1],
                          # over the runs that have it (sweeps before it was a column have not)
                          "last_tenth_accuracy_mean": tail[0], "last_tenth_accuracy_std": tail[1],
                          "last_tenth_accuracy_runs": sum(run.get("last_tenth_accuracy") is not None for run in runs),
                          "client_steps_mean": steps[name], "client_steps_counted": counted,
                          "stopped_at_target": sum(run.get("stop_reason") == "target reached" for run in runs),
                          # stopped on NaN/Inf: their accuracies are the last evaluation's before it
                          "diverged": sum(_diverged(run) for run in runs),
                          "diverged_by_seed": [run.get("seed") for run in runs if _diverged(run)],
                          "relative_steps": relative_steps,
                          "reference_steps_zero": base_steps == 0,
                          # the ratio is paired seed by seed: none of the reference's seeds counted here
                          "steps_no_common_seed": steps_compared and not common,
                          # the reference ran none in the seeds both counted (it did in others): no ratio against 0
                          "reference_steps_zero_in_common": bool(common) and relative_steps is None,
                          "reference_reached": base is not None,
                          "reference_in_group": reference in by_method,
                          "reference_at_start": base == 0,
                          "times_by_seed": _by_seed(runs, seeds, reference_value["time_to_target"], "time_to_target",
                                                    _ratio) if len(seeds) > 1 else None,
                          **{f"{column}_by_seed": _by_seed(runs, seeds, reference_value[column], column, _difference)
                             if len(seeds) > 1 else None for column in SEED_BY_SEED_ACCURACIES}})
    return lines


def _paired_ratio(runs: list[dict], reference_runs: list[dict], unpaired: float,
                  column: str = "time_to_target") -> float | None:
    """Mean time to target (or another ``column``: the computation spent) of ``runs`` over the
    reference's, both over the seeds where both have it (None if there is no such seed); ``unpaired``
    (the ratio of each one's own mean) where a seed does not name one run of each.

    >>> method = [{"seed": 0, "time_to_target": 60.0}, {"seed": 1, "time_to_target": None},
    ...           {"seed": 2, "time_to_target": 20.0}]
    >>> reference = [{"seed": s, "time_to_target": t} for s, t in [(0, 30.0), (1, 90.0), (2, 10.0)]]
    >>> _paired_ratio(method, reference, unpaired=40.0 / 43.3)  # seeds 0 and 2: 80 s against 40 s, not 0.92
    2.0
    """
    own, base = ({run.get("seed"): run.get(column) for run in group} for group in (runs, reference_runs))
    if len(own) != len(runs) or len(base) != len(reference_runs):
        return unpaired
    common = [seed for seed, time in own.items() if time is not None and base.get(seed) is not None]
    denominator = sum(base[seed] for seed in common)
    if not common or denominator == 0:  # none in common, or the reference at 0 s in all of them: no ratio
        return None
    return sum(own[seed] for seed in common) / denominator


def _common_seeds(runs: list[dict], reference_runs: list[dict], column: str) -> set:
    """The seeds where both groups have ``column``."""
    return ({run.get("seed") for run in runs if run.get(column) is not None}
            & {run.get("seed") for run in reference_runs if run.get(column) is not None})


def _seed_order(seed) -> tuple:
    return (seed is None, seed if isinstance(seed, (int, float)) else str(seed))


def _by_seed(runs: list[dict], seeds: list, reference_value: dict, column: str,
             compare: Callable[[float, float], float | None]) -> list[tuple]:
    """``(seed, the run's column, compare(it, the reference's in the same seed))`` for each seed of the
    group, in order; value ``...`` where the method has no run of that seed, the comparison None where
    either value is missing. Times compare as a ratio, accuracies as a difference.

    >>> _by_seed([{"seed": 0, "final_accuracy": 0.70}, {"seed": 1, "final_accuracy": 0.80}], [0, 1, 2],
    ...          {0: 0.75, 1: None}, "final_accuracy", _difference)
    [(0, 0.7, -0.05), (1, 0.8, None), (2, Ellipsis, None)]
    """
    own = {run.get("seed"): run.get(column) for run in runs}
    rows = []
    for seed in seeds:
        value, base = own.get(seed, ...), reference_value.get(seed)
        rows.append((seed, value, compare(value, base) if value not in (None, ...) and base is not None else None))
    return rows


def _ratio(time: float, base: float | None) -> float | None:
    """``time / base``; None where there is no reference time or it is 0 s (reached at the start:
    a ratio against it is undefined)."""
    return None if base is None or base == 0 else time / base


def _difference(value: float, base: float) -> float:
    return round(value - base, 6)


def _mean_of(runs: list[dict], column: str) -> tuple[float | None, float | None]:
    """The mean and std (ddof 0) of a summary column over the runs that have it; (None, None) if none."""
    values = [run[column] for run in runs if run.get(column) is not None]
    return (float(np.mean(values)), float(np.std(values))) if values else (None, None)


def format_markdown(lines: list[dict], groups: list[str], reference: str, target: str | None) -> str:
    """The paper-style tables as markdown, methods down, groups across: time to target relative to the
    reference, best accuracy, and (where the lines have it) the final accuracy with the computation
    spent relative to the reference's. ``target`` None: no run had one, which the first section says
    in place of a table of misses.

    >>> print(format_markdown([{"method": "fedavg", "runs": 2, "reached": 2, "time_to_target_mean": 80.0,
    ...                         "relative_time": 1.0, "best_accuracy_mean": 0.9, "best_accuracy_std": 0.0,
    ...                         "reference_reached": True}], [], "fedavg", "90%"))
    ## Time to first reach 90% held-out accuracy, relative to fedavg
    <BLANKLINE>
    | method | all |
    |---|---|
    | fedavg | 1.00 (80.0 s) |
    <BLANKLINE>
    Mean virtual time to the target over the seeds where both the method and fedavg reached it, divided by fedavg's over the same seeds (in brackets: the method's mean over every seed that reached it); – = missed the target in at least half of its runs; n/a = no ratio: fedavg missed it in at least half of its runs, or reached it in none of the seeds the method did.
    <BLANKLINE>
    ## Best held-out accuracy, mean ± std over seeds
    <BLANKLINE>
    | method | all |
    |---|---|
    | fedavg | 0.9000 ± 0.0000 |
    <BLANKLINE>
    ± std, here and below: the standard deviation over the seeds, the population's (ddof 0, numpy's np.std: divided by the number of seeds n, not n − 1).
    """
    keys, methods, found = _line_cells(lines, groups)
    header = "| method | " + " | ".join(_group_label(key, groups) for key in keys) + " |"
    rule = "|---|" + "---|" * len(keys)

    def relative(line):
        if line is None:
            return ""
        return relative_time(line) + partly_reached(line) + diverged(line)  # a diverged run misses it from there

    def relative_time(line):
        mean = line["time_to_target_mean"]
        if mean is None:
            return MISSING
        when = "reached at start" if mean == 0 else f"{_significant(mean)} s"
        if line["relative_time"] is not None:
            return f"{_ratio_text(line['relative_time'])} ({when})"
        if line.get("reference_at_start"):  # no ratio against 0 s
            return when if mean == 0 else f"no ratio ({when})"
        if not line.get("reference_in_group", True):
            return f"({when})"
        return f"n/a ({when})"

    def diverged(line) -> str:
        return f" [{line['diverged']} of {line['runs']} diverged]" if line.get("diverged") else ""

    def partly_reached(line) -> str:  # a time over the runs that reached it reads as every run's without it
        return f" [{line['reached']} of {line['runs']} reached]" if _partly_reached(line) else ""

    def accuracy(line):
        if line is not None and line["best_accuracy_mean"] is None and line.get("diverged"):
            return f"–{diverged(line)}"  # only a diverged model's evaluations: no best accuracy, said so
        if line is None or line["best_accuracy_mean"] is None:
            return ""
        return f"{line['best_accuracy_mean']:.4f} ± {line['best_accuracy_std']:.4f}{diverged(line)}"

    def final_and_computation(line):
        if line is None or line.get("final_accuracy_mean") is None:
            return ""
        shown = f"{line['final_accuracy_mean']:.4f} ± {line['final_accuracy_std']:.4f}{diverged(line)}"
        if line.get("relative_steps") is None:
            if line.get("client_steps_mean") is None or not line.get("reference_in_group", True):
                return shown
            steps = f"{line['client_steps_mean']:,.0f} steps"
            if line["method"] == reference:
                return f"{shown} ({steps})" if line.get("reference_steps_zero") else shown
            if line.get("steps_no_common_seed"):  # the ratio is paired seed by seed
                return f"{shown} ({steps}, no seed counted by both it and {reference})"
            # against 0 steps (the reference's in all, or in the seeds in common); none where it has no count
            return f"{shown} ({steps}, no ratio)" if line.get("reference_steps_zero") or \
                line.get("reference_steps_zero_in_common") else shown
        return f"{shown} ({_ratio_text(line['relative_steps'])}×)"

    def last_tenth(line):
        if line is None:
            return ""
        if line.get("last_tenth_accuracy_mean") is None:
            return "n/a"
        shown = f"{line['last_tenth_accuracy_mean']:.4f} ± {line['last_tenth_accuracy_std']:.4f}"
        counted = line.get("last_tenth_accuracy_runs")
        shown = shown if counted in (None, line["runs"]) else f"{shown} ({counted} of {line['runs']} runs)"
        return shown + diverged(line)  # a diverged run's last evaluations are its diverged model's

    def table(cell) -> list[str]:
        return [header, rule] + [f"| {method} | " + " | ".join(cell(found.get((key, method))) for key in keys) + " |"
                                 for method in methods]

    seed_lists = {tuple(seed for seed, _, _ in line["times_by_seed"]) for line in lines if line.get("times_by_seed")}
    named = len(seed_lists) == 1  # every group ran the same seeds: the heading names them once
    def reference_by_seed(column: str) -> dict[int, dict]:
        """Per line (by id), its group's reference's ``column`` (``times_by_seed``...) seed by seed."""
        return {id(line): {seed: value for seed, value, _ in (found.get((key, reference)) or {}).get(column) or ()}
                for (key, _), line in found.items()}

    # each line's reference times seed by seed (a 0 s one gives no ratio: not the same as a miss)
    reference_times = reference_by_seed("times_by_seed")
    shown_kinds: set[str] = set()  # the kinds of cell the seed-by-seed tables show: their notes explain only those

    def by_seed(line):
        if line is None or line.get("times_by_seed") is None:
            return ""
        cells = []
        for seed, time, relative in line["times_by_seed"]:
            if time is ...:
                shown, kind = "·", "no run"
            elif time is None:
                shown, kind = MISSING, "missed"
            elif time == 0 and (relative is None or line["method"] == reference):
                shown, kind = "at start", "at start"
            elif line["method"] == reference:
                shown, kind = f"{_whole_seconds(time)} s", "value"
            elif relative is None and reference_times[id(line)].get(seed) == 0:
                shown, kind = f"no ratio ({_whole_seconds(time)} s)", "at start"
            elif relative is None and reference_times[id(line)].get(seed, ...) is ...:
                shown, kind = f"({_whole_seconds(time)} s)", "own"  # the reference has no run of this seed
            elif relative is None:
                shown, kind = "n/a", "n/a"
            else:
                shown, kind = _ratio_text(relative), "value"
            shown_kinds.add(kind)
            cells.append(shown if named else f"{seed}: {shown}")
        return " / ".join(cells)

    def legend(entries: dict[str, str]) -> str:
        """The notes of the kinds of cell the last seed-by-seed table showed (then forgets them)."""
        text = "".join(f" {note}" for kind, note in entries.items() if kind in shown_kinds)
        shown_kinds.clear()
        return text

    start_note = (f" Reached at start = the initial model reached it (0 s); no ratio = {reference} did (a ratio "
                  "against 0 s is undefined), the method's own time in brackets."
                  if any(line.get("reference_at_start") or line.get("time_to_target_mean") == 0 for line in lines)
                  else "")
    if any(not line.get("reference_in_group", True) and line["time_to_target_mean"] is not None for line in lines):
        start_note += f" (12.0 s) alone = {reference} has no run in that group: the method's own time."
    if any(partly_reached(line) for line in lines):
        start_note += (" [k of n reached] = the method reached the target in k of its n runs (more than half): its "
                       "times are over those k, and its ratio over the seeds where the reference reached it too.")
    if any(line.get("diverged") for line in lines):
        start_note += (" [k of n diverged] = k of the method's n runs stopped on a non-finite model: each one "
                       "reached the target only if it did before it diverged.")
    parts = [f"## Time to first reach {target} held-out accuracy, relative to {reference}", "",
             *table(relative), "",
             f"Mean virtual time to the target over the seeds where both the method and {reference} reached "
             f"it, divided by {reference}'s over the same seeds (in brackets: the method's mean over every "
             f"seed that reached it); {MISSING} = missed the target in at least half of its runs; "
             f"n/a = no ratio: {reference} missed it in at least half of its runs, or reached it in none of the "
             f"seeds the method did.{start_note}", ""]
    if seed_lists:
        order = f" (seed {' / '.join(str(seed) for seed in next(iter(seed_lists)))})" if named else ""
        seed_table = table(by_seed)  # (fills shown_kinds)
        parts += [f"## Time to first reach {target} held-out accuracy, seed by seed{order}", "",
                  *seed_table, "",
                  f"Each seed's time divided by {reference}'s in the same seed ({reference}'s row: its own "
                  "times)." + legend({
                      "missed": f"{MISSING} = missed the target.",
                      "n/a": f"n/a = {reference} missed it in that seed.",
                      "own": f"(12 s) = {reference} has no run of that seed: the method's own time.",
                      "no run": "· = no run of that seed.",
                      "at start": f"At start = reached by the initial model (0 s); no ratio = {reference} was, in "
                                  "that seed (a ratio against 0 s is undefined)."}), ""]
    if target is None:  # (a table of "–", read as misses, where nothing was missed)
        parts = ["## Time to the target", "", "No run had a target accuracy, so there are no times to it to compare "
                 "(give the runs one: target_accuracy, --target-accuracy).", ""]

    def accuracy_by_seed(column):
        references = reference_by_seed(f"{column}_by_seed")

        def cell(line):
            if line is None or line.get(f"{column}_by_seed") is None:
                return ""
            cells = []
            for seed, value, difference in line[f"{column}_by_seed"]:
                if value is ...:
                    shown, kind = "·", "no run"
                elif line["method"] == reference:
                    shown, kind = ("n/a", "n/a") if value is None else (f"{value:.4f}", "value")
                elif difference is None and value is not None and references[id(line)].get(seed, ...) is ...:
                    shown, kind = f"({value:.4f})", "own"  # the reference has no run of this seed
                else:
                    shown, kind = ("n/a", "n/a") if difference is None else (f"{difference:+.3f}", "value")
                shown_kinds.add(kind)
                cells.append(shown if named else f"{seed}: {shown}")
            return " / ".join(cells)
        return cell

    def seed_by_seed(column, what) -> list[str]:
        if not seed_lists or not any(line.get(f"{column}_mean") is not None for line in lines):
            return []
        order = f" (seed {' / '.join(str(seed) for seed in next(iter(seed_lists)))})" if named else ""
        rows = table(accuracy_by_seed(column))  # (fills shown_kinds)
        return ["", f"## {what}, seed by seed: difference to {reference}{order}", "", *rows, "",
                f"Each seed's value minus {reference}'s in the same seed ({reference}'s row: its own values)."
                + legend({"n/a": "n/a = not in the results (a run, or the reference's, from before the column).",
                          "own": f"(0.9000) = {reference} has no run of that seed: the method's own value.",
                          "no run": "· = no run of that seed."})]

    diverged_runs = [", ".join([line["method"], *(f"{group}={line.get(group)}" for group in groups), f"seed {seed}"])
                     for line in lines for seed in line.get("diverged_by_seed") or ()]
    diverged_note = ("" if not diverged_runs else
                     f" [k of n diverged]: k of the method's n runs stopped on a non-finite model (a numerical "
                     f"error, NaN or Inf): each one's best accuracy leaves out the evaluations of its diverged model "
                     f"(NaN/Inf outputs for most held-out samples) and its final accuracy is its last evaluation's, "
                     f"in the mean all the same "
                     f"({'; '.join(diverged_runs)}).")
    # methods of one group with other numbers of runs (a seed missing for one, a table trimmed): said, as
    # each mean is over the method's own runs, not the seeds they share
    counts: dict = {}
    for line in lines:
        counts.setdefault(tuple(line.get(group) for group in groups), []).append(f"{line['method']} {line['runs']}")
    uneven = [", ".join(group) for group in counts.values()
              if len({entry.rsplit(" ", 1)[1] for entry in group}) > 1]
    uneven_note = ("" if not uneven else
                   f" The methods have other numbers of runs ({'; '.join(uneven)}): each mean is over the "
                   f"method's own runs, not the seeds they share (the seed-by-seed tables pair them).")
    parts += ["## Best held-out accuracy, mean ± std over seeds", "", *table(accuracy), "",
              STD_NOTE + diverged_note + uneven_note]
    if any(line.get("final_accuracy_mean") is not None for line in lines):
        # CC-FedAvg's and FedASMU's tables: the accuracy at the end of the budget and what it cost
        parts += ["", f"## Final held-out accuracy, mean ± std over seeds, and computation relative to {reference}",
                  "", *table(final_and_computation), "",
                  f"In brackets: the local steps of the client updates that reached the server, aggregated or "
                  f"dropped, summed over the seeds where both the method and {reference} ran, divided by "
                  f"{reference}'s (as the time ratio pairs them); work a client skips (an update it sends "
                  "again from a store) counts none."
                  + (" Groups from a sweep that did not count them give the steps the engine executed instead, "
                     "which also hold work trained ahead for clients still out at the end."
                     if any(line.get("client_steps_counted") == "client_steps_executed" for line in lines) else "")
                  + (f" Where {reference} executed none (its initial model reached the target) in every seed, "
                     "or in those both ran, the steps themselves: no ratio against 0."
                     if any(line.get("reference_steps_zero") or line.get("reference_steps_zero_in_common")
                            for line in lines) else "")
                  + (" Runs that stopped at the target end there: their final accuracy is the one that reached it, "
                     "their computation what reaching it cost." if any(line.get("stopped_at_target") for line in lines)
                     else "")]
        parts += seed_by_seed("final_accuracy", "Final held-out accuracy")
    if any(line.get("last_tenth_accuracy_mean") is not None for line in lines):
        parts += ["", "## Held-out accuracy over the last tenth of the evaluations, mean ± std over seeds", "",
                  *table(last_tenth), "",
                  "Each run's mean accuracy over its last tenth of evaluations (a run of 401 evaluations: its last "
                  "40), then the mean over its seeds: the end of the budget without the swing of one evaluation. "
                  "In brackets: the runs that have it, where some do not; n/a: none does (results written before it "
                  "was a column, with no run folder to compute it from)."]
        parts += seed_by_seed("last_tenth_accuracy", "Held-out accuracy over the last tenth of the evaluations")
    return "\n".join(parts)


STD_NOTE = ("± std, here and below: the standard deviation over the seeds, the population's (ddof 0, numpy's "
            "np.std: divided by the number of seeds n, not n − 1).")


def _target_text(rows: list[dict]) -> str | None:
    """The runs' target as the tables name it; None where no run had one (a table without the column
    whose runs have times to it had one)."""
    targets = sorted({row.get("target_accuracy") for row in rows if row.get("target_accuracy") is not None})
    if not targets and all(row.get("time_to_target") is None for row in rows):
        return None
    return "the target" if len(targets) != 1 else percent(targets[0])


@dataclasses.dataclass(frozen=True)
class DesignGrid:
    """The relative times to target of a design-space sweep laid out as a grid: ``rows`` × ``columns``
    (two swept settings of one algorithm, e.g. PORT's K × Ω), one grid per group, and in each cell
    one ratio per ``variant`` (the values of the method's other swept settings, e.g. urgent pull off
    and on). ``cells[group][(row, column)]`` holds those ratios in the variants' order: a float, None
    where the method missed the target in at least half of its runs, ``...`` where the reference did
    (n/a), or "·" where the sweep has no such method."""

    rows_setting: str
    columns_setting: str
    rows: list
    columns: list
    variants: list[str]
    groups: list[tuple]
    cells: dict[tuple, dict[tuple, list]]


def _ordered(values: list) -> list:
    """Numbers ascending (inf last), anything else in order of appearance."""
    values = list(dict.fromkeys(values))
    numeric = all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values)
    return sorted(values) if numeric else values


def design_grid(lines: list[dict], grouping: _Grouping, rows_setting: str, columns_setting: str) -> DesignGrid:
    """:class:`DesignGrid` of the summary ``lines`` (:func:`summarise`) for two of the sweep's
    swept method settings, over the methods that read both (PORT's Fig. 2 and 6: time to target
    over K and Ω).

    >>> rows = [{"algorithm": "fedavg", "port.k": None, "port.b": None, "seed": 0, "time_to_target": 100.0,
    ...          "best_accuracy": 0.9}]
    >>> rows += [{"algorithm": "port", "port.k": k, "port.b": b, "seed": 0, "time_to_target": t, "best_accuracy": 0.9}
    ...          for k, b, t in [(1, 3, 50.0), (1, float("inf"), None), (5, 3, 40.0), (5, float("inf"), 60.0)]]
    >>> grid = design_grid(summarise(rows), _grouping(rows), "port.k", "port.b")
    >>> grid.rows, grid.columns, grid.cells[()][(1, 3)], grid.cells[()][(1, float("inf"))]
    ([1, 5], [3, inf], [0.5], [None])
    """
    settings = {name: runs[0] for name, runs in grouping.runs_by_method().items()}
    in_grid = [name for name in grouping.methods
               if settings[name].get(rows_setting) is not None and settings[name].get(columns_setting) is not None]
    others = [column for column in grouping.method_columns if column not in (rows_setting, columns_setting)]
    several_algorithms = len({settings[name]["algorithm"] for name in in_grid}) > 1

    def variant(name):
        own = [f"{column}={settings[name][column]}" for column in others if settings[name].get(column) is not None]
        return " ".join(([str(settings[name]["algorithm"])] if several_algorithms else []) + own) or "all"

    variants = list(dict.fromkeys(variant(name) for name in in_grid))
    cells: dict[tuple, dict[tuple, list]] = {}
    for line in lines:
        if line["method"] not in in_grid:
            continue
        group = tuple(line.get(column) for column in grouping.columns)
        setting = settings[line["method"]]
        ratios = cells.setdefault(group, {}).setdefault((setting[rows_setting], setting[columns_setting]),
                                                         [_ABSENT] * len(variants))
        ratios[variants.index(variant(line["method"]))] = (
            None if line["time_to_target_mean"] is None
            else line["relative_time"] if line["relative_time"] is not None
            else _NO_RATIO if line.get("reference_at_start") else ...)
    return DesignGrid(rows_setting, columns_setting,
                      _ordered([settings[name][rows_setting] for name in in_grid]),
                      _ordered([settings[name][columns_setting] for name in in_grid]),
                      variants, list(cells), cells)


def _grid_cell_text(ratio) -> str:
    """One ratio of a :class:`DesignGrid` as the tables and heat maps show it."""
    if ratio is None:
        return MISSING
    if ratio is ...:
        return "n/a"
    return ratio if ratio in (_ABSENT, _NO_RATIO) else _ratio_text(ratio)


def format_grid_markdown(grid: DesignGrid, groups: list[str], reference: str, target: str) -> str:
    """The :class:`DesignGrid` as markdown tables, one per group: a row per value of
    ``grid.rows_setting``, a column per value of ``grid.columns_setting``, in each cell the variants'
    ratios joined by " / ".

    >>> grid = DesignGrid("port.k", "port.b", [1, 5], [3], ["port.pull=False", "port.pull=True"], [()],
    ...                   {(): {(1, 3): [0.5, None], (5, 3): [0.4, 0.45]}})
    >>> print(format_grid_markdown(grid, [], "fedavg", "90%"))
    ## Time to first reach 90% held-out accuracy relative to fedavg: port.k × port.b
    <BLANKLINE>
    | port.k \\ port.b | 3 |
    |---:|---|
    | 1 | 0.50 / – |
    | 5 | 0.40 / 0.45 |
    <BLANKLINE>
    Each cell: port.pull=False / port.pull=True. The ratios of the first table (mean time over the seeds where both reached the target, divided by fedavg's); – = missed the target in at least half of its runs; n/a = no ratio: fedavg missed it in at least half of its runs, or reached it in none of the seeds the method did; · = not in the sweep.
    """
    parts = []
    for group in grid.groups:
        label = _group_label(group, groups)
        heading = f"## Time to first reach {target} held-out accuracy relative to {reference}: " \
                  f"{grid.rows_setting} × {grid.columns_setting}" + (f" ({label})" if groups else "")
        table = [f"| {grid.rows_setting} \\ {grid.columns_setting} | " + " | ".join(map(str, grid.columns)) + " |",
                 "|---:|" + "---|" * len(grid.columns)]
        for row in grid.rows:
            table.append(f"| {row} | " + " | ".join(
                " / ".join(map(_grid_cell_text, grid.cells[group].get((row, column), [_ABSENT] * len(grid.variants))))
                for column in grid.columns) + " |")
        parts += [heading, "", *table, ""]
    each = f"Each cell: {' / '.join(grid.variants)}. " if len(grid.variants) > 1 else ""
    parts.append(f"{each}The ratios of the first table (mean time over the seeds where both reached the target, "
                 f"divided by {reference}'s); {MISSING} = missed the target in at least half of its runs; "
                 f"n/a = no ratio: {reference} missed it in at least half of its runs, or reached it in none of the "
                 f"seeds the method did; {_ABSENT} = not in the sweep."
                 + (f" {_NO_RATIO} = {reference} reached it at 0 s (a ratio against 0 s is undefined)."
                    if any(_NO_RATIO in ratios for cells in grid.cells.values() for ratios in cells.values()) else ""))
    return "\n".join(parts)


def _write_csv(lines: list[dict], path: str) -> str:
    """One row per line; the seed-by-seed times become a ``relative_time_seed{S}`` column per seed, and
    the seed-by-seed accuracies a ``final_accuracy_seed{S}`` and ``last_tenth_accuracy_seed{S}`` each."""
    rows = []
    for line in lines:
        row = {name: value for name, value in line.items() if not name.endswith("_by_seed")}
        for seed, _, relative in line.get("times_by_seed") or ():
            row[f"relative_time_seed{seed}"] = relative
        for column in SEED_BY_SEED_ACCURACIES:
            for seed, value, _ in line.get(f"{column}_by_seed") or ():
                row[f"{column}_seed{seed}"] = None if value is ... else value
        if "diverged_by_seed" in line:  # the seeds of the runs that stopped on a non-finite model
            row["diverged_seeds"] = " ".join(str(seed) for seed in line["diverged_by_seed"]) or None
        rows.append(row)
    return write_csv(path, rows, dict.fromkeys(name for row in rows for name in row))


FIGURE_CHOICES = (True, False, "table")


def make_report(sweep_dir: str | Sequence[str], reference: str | None = None, out: str | None = None,
                figures: bool | str = True, panels: str | None = None, grid: Sequence[str] | None = None) -> Report:
    """Write ``report.md``, ``report.csv`` and (with ``figures``) the PNG figures of the sweep in
    ``sweep_dir`` into ``out`` (default ``SWEEP_DIR/report``); see the module docstring. ``reference``:
    the method times to target are relative to (None: fedavg; a report of timing-only runs alone
    has no such times, and uses it for nothing). Rows of timing-only runs (:func:`is_timing_only`)
    get a table of their timing figures instead (:func:`summarise_timing`: virtual time, updates,
    utilisation, staleness..., mean ± std over seeds; also in ``report.csv``, marked ``timing_only``)
    and of the figures only the staleness histograms and the client timelines.
    ``sweep_dir`` may be a list of folders: their results as one table (:func:`read_results_of`),
    written by default into the first folder's ``report``. A results CSV file may stand for a
    folder (its runs then relative to the file's folder); the default ``out`` for a first source
    ``x/NAME.csv`` is ``x/NAME-report`` (``x/report`` for ``x/results.csv``). The figures need the
    run folders; from results tables alone, ``figures=False`` (the tables) or ``figures="table"`` (the
    tables and the figures the table alone makes: the time-to-target bars and, with ``grid``, the
    heat maps; for results CSVs whose runs are gone, e.g. seeds run on other machines).
    ``panels``: a swept setting of a method (``"port.min_clients"``) whose values split the accuracy
    and time-to-target figures into panels. ``grid``: two swept settings of a method (``("port.min_clients",
    "port.staleness_bound")``): the time-to-target ratios also as a rows × columns table per group
    (:func:`design_grid`) and, with ``figures``, heat maps (``time_to_target_grid.png``). A figure
    an earlier report left in ``out`` under a name this report writes (:func:`figure_files`) and
    this one does not draw (``figures=False``, ``"table"``) is removed, not left beside the new tables.

    >>> # make_report("sweeps/x").markdown  (jaxfl report sweeps/x prints it)
    >>> # make_report("sweeps/port-full", panels="port.min_clients")  (one panel per K)
    >>> # make_report(["sweeps/port-seed0", "sweeps/port-seeds1-2"])  (one table of both folders)
    >>> # make_report("sweeps/port-full", grid=("port.min_clients", "port.staleness_bound"))  (K × Ω)
    """
    if not any(figures is choice for choice in FIGURE_CHOICES):
        raise ValueError(f"figures={figures!r} is not allowed: True (every figure), False (none) or 'table' "
                         "(those the results table alone makes)")
    folders = [sweep_dir] if isinstance(sweep_dir, (str, os.PathLike)) else list(sweep_dir)
    folders = [user_path(folder) for folder in folders]
    for folder in folders:  # a CSV that is not a jaxfl results table: its missing columns, not a KeyError
        _check_columns(results_path(folder), figures is True)
    rows = read_results_of(folders)
    # an option named by its alias, as a sweep of before 2026-12-05 named its column
    reference = None if reference is None else _canonical_method(reference)
    panels = None if panels is None else canonical_setting(panels)
    grid = None if grid is None else [canonical_setting(str(name)) for name in grid]
    if not rows:
        raise ValueError(f"sweep_dir={' '.join(map(str, folders))!r} holds no finished run yet: nothing to report "
                         "(a sweep adds each cell to its results.csv as the cell finishes)")
    coverage = "\n\n".join(note for note in (coverage_note(folders, [len(read_results(folder)) for folder in folders]),
                                              code_note(rows)) if note) or None
    sweep_dir = _base_folder(folders[0])
    grouping = _grouping(rows)
    timed = [is_timing_only(row) for row in rows]
    timing_rows = [row for row, timing in zip(rows, timed) if timing]
    trained_rows = [row for row, timing in zip(rows, timed) if not timing]
    # the accuracy tables and figures are of the runs that evaluated a model (timing-only runs did not)
    trained = _grouping(trained_rows) if trained_rows else None
    chosen = "fedavg" if reference is None else reference
    if trained is not None:
        if reference is None and chosen not in trained.methods:  # not a value the user gave: say it is the default
            raise ValueError(f"the default reference, {chosen}, is not a method of this sweep (its methods: "
                             f"{', '.join(trained.methods)}): choose the one times to target are relative to, "
                             f"e.g. --reference {shlex.quote(trained.methods[0])} (reference= in make_report)")
        lines = _summarise(trained, chosen)  # a bad reference fails before anything is written
    else:
        lines = []
        if reference is not None and reference not in grouping.methods:
            raise ValueError(f"reference={reference!r} is not allowed: one of the sweep's methods "
                             f"({', '.join(grouping.methods)})")
    only_timing = "the runs are timing-only (they evaluate no model): there is no accuracy or time to target to"
    if panels is not None:
        if trained is None:
            raise ValueError(f"panels={panels!r} is not allowed: {only_timing} split into panels")
        if panels not in trained.method_columns:
            raise ValueError(f"panels={panels!r} is not allowed: one of the swept settings of a method "
                             f"({_method_settings_text(trained)})")
    if grid is not None:
        if trained is None:
            raise ValueError(f"grid={','.join(map(str, grid))!r} is not allowed: {only_timing} lay out as a grid")
        _check_grid(list(grid), trained)
    if figures is True:  # every run folder there, or one error before anything is written
        for row in rows:
            _run_dir(sweep_dir, row)
    given = out is not None
    out = user_path(out) if given else _default_out(folders[0])
    made = _missing_folders(out)
    writable = os.path.dirname(made[0]) if made else out
    if os.path.isdir(writable) and not os.access(writable, os.W_OK | os.X_OK):
        where = f"out={out!r}" if given else f"the default out, {out!r},"
        raise ValueError(f"{where} is not allowed: the folder {writable!r} cannot be written (permissions, or a "
                         "read-only file system); give a folder you can write (--out DIR; out= in make_report)")
    try:
        os.makedirs(out, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"out={out!r} is not allowed: it, or a folder above it, is a file; give a folder (one "
                         "that does not exist yet is made)") from None
    # Everything is written into a hidden folder inside ``out`` first and moved in only once the last
    # figure is drawn: a report that fails half-way (a run that does not read back, Ctrl-C) leaves an
    # earlier report in ``out`` whole, not new tables beside old figures.
    staging = tempfile.mkdtemp(prefix=".report-partial-", dir=out)
    try:
        report = _write_report(rows, sweep_dir, staging, trained, trained_rows, lines, chosen, grid, panels,
                               figures, coverage, timing_rows)
        report = _publish(report, staging, out)
    except BaseException:  # no half-written new folder, no half-replaced old one
        shutil.rmtree(made[0] if made else staging, ignore_errors=True)
        raise
    os.rmdir(staging)
    # an earlier report's figures in the same folder (a report with figures, then --no-figures) would
    # be read as this one's: those of the names this report writes go; any other file stays
    _remove_undrawn_figures(out, figure_files(trained, _grouping(timing_rows) if timing_rows else None),
                            report.figures)
    return report


def _publish(report: "Report", staging: str, out: str) -> "Report":
    """Move the files ``report`` wrote into ``staging`` into ``out`` (each by one rename, on the same
    file system) and return the report with their new paths."""
    moved = lambda path: os.path.join(out, os.path.relpath(path, staging))
    for name in os.listdir(staging):
        os.replace(os.path.join(staging, name), os.path.join(out, name))
    return dataclasses.replace(report, markdown_path=moved(report.markdown_path), table=moved(report.table),
                               figures=[moved(path) for path in report.figures])


def _missing_folders(path: str) -> list[str]:
    """The folders of ``path`` that do not exist yet, outermost first (what ``os.makedirs`` makes).

    >>> _missing_folders("/")
    []
    """
    missing, probe = [], os.path.abspath(path)
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        missing.insert(0, probe)
        probe = os.path.dirname(probe)
    return missing


def _write_report(rows, sweep_dir, out, trained, trained_rows, lines, chosen, grid, panels, figures, coverage,
                  timing_rows) -> "Report":
    """:func:`make_report` once every check passed and ``out`` exists: the tables and figures."""
    parts = []
    design = grid_markdown = None
    if trained is not None:
        target = _target_text(trained_rows)
        parts.append(format_markdown(lines, trained.columns, chosen, target))
        if grid is not None:
            design = design_grid(lines, trained, *grid)
            grid_markdown = format_grid_markdown(design, trained.columns, chosen, target or "the target")
            parts.append(grid_markdown)
    timing_lines = []
    timing = _grouping(timing_rows) if timing_rows else None
    if timing is not None:
        timing_lines = summarise_timing(timing)
        parts.append(format_timing_markdown(timing_lines, timing.columns, mixed=trained is not None))
    markdown = "\n\n".join(([coverage] if coverage else []) + parts)
    markdown_path = os.path.join(out, "report.md")  # out: make_report's staging folder, moved in whole
    with open(markdown_path, "w") as handle:
        handle.write(markdown + "\n")
    table = _write_csv(lines + timing_lines, os.path.join(out, "report.csv"))
    drawn = (_figures(trained, timing, lines, sweep_dir, out, panels) if figures is True
             else [_time_to_target_figure(trained, lines, out, panels)] if figures == "table" and trained is not None
             else [])
    if figures and grid is not None:
        drawn.append(plot_design_grid(design, trained.columns, chosen, os.path.join(out, "time_to_target_grid.png")))
    return Report(markdown, markdown_path, table, lines + timing_lines, drawn, design, grid_markdown)


# The columns a results table needs for the report's tables (jaxfl sweep's results.csv has them all).
REPORT_COLUMNS = ("algorithm", "time_to_target", "best_accuracy")


def _check_columns(table: str, figures: bool) -> None:
    """Refuse a CSV file without the columns of a jaxfl results table (naming those it lacks), and,
    where the figures are drawn, one without the ``run_dir`` column that finds the runs."""
    with open(table, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, [])
        if next(reader, None) is None:  # no runs yet (a sweep's table before its first cell): said later
            return
    missing = [name for name in REPORT_COLUMNS if name not in header]
    if missing:
        raise ValueError(f"{table!r} is not allowed: a results table of jaxfl sweep (results.csv), with the columns "
                         f"{', '.join(REPORT_COLUMNS)}; it has no {', '.join(missing)} column"
                         f"{'s' if len(missing) > 1 else ''} (its columns: {', '.join(header) or 'none'})")
    if figures and "run_dir" not in header:
        raise ValueError(f"{table!r} has no run_dir column: the figures need the runs (jaxfl report --no-figures, "
                         "or make_report(..., figures=False), writes the tables alone; --table-figures, "
                         "figures='table', adds the figures the table alone makes)")


def is_timing_only(row: dict) -> bool:
    """Whether a results row is of a timing-only run (``timing_only=True``: the schedule without
    training, so no accuracy): its ``timing_only`` column where the sweep swept it, else its run's
    summary.json where the run folder is there (``row["run_dir"]`` as :func:`read_results_of` gives
    it), else a row without any accuracy (results.csv has no column that says so).

    >>> is_timing_only({"algorithm": "fedavg", "best_accuracy": None, "final_accuracy": None, "time_to_target": None})
    True
    >>> is_timing_only({"algorithm": "fedavg", "best_accuracy": 0.9, "time_to_target": None})
    False
    """
    if row.get("timing_only") is not None:
        return bool(row["timing_only"])
    if row.get("run_dir") is not None:
        summary = os.path.join(str(row["run_dir"]), "summary.json")
        if os.path.isfile(summary):
            return bool(read_json(summary).get("timing_only"))
    return all(row.get(name) is None for name in ("best_accuracy", "final_accuracy", "last_tenth_accuracy",
                                                  "time_to_target"))


# The figures of a timing-only run's results row (jaxfl.sweep.SUMMARY_COLUMNS), as the timing table names
# and shows them: what the schedule did, the simulator's own seconds last.
def _whole_seconds(time: float) -> str:
    """A seed's time to target in the seed-by-seed table: whole seconds from 10 s, else as
    :func:`_significant` (a time of 0.3 s read "0 s", as if reached at the start).

    >>> _whole_seconds(149.4), _whole_seconds(0.3), _whole_seconds(9.99), _whole_seconds(9.9), _whole_seconds(1e25)
    ('149', '0.3', '10', '9.9', '1e+25')
    """
    return f"{time:.0f}" if 9.95 <= time and round(time) < 1e7 else _significant(time)


def _ratio_text(ratio: float) -> str:
    """A ratio with two decimals from 0.1 up to 10^4, two significant figures below, three above (a
    method 300× sooner than the reference read "0.00", as if it took no time).

    >>> _ratio_text(0.7712), _ratio_text(0.00347), _ratio_text(0.0999), _ratio_text(9999.996), _ratio_text(123456.0)
    ('0.77', '0.0035', '0.10', '1e+04', '1.23e+05')
    """
    if ratio == 0 or 0.1 <= abs(float(f"{ratio:.2g}")) and abs(round(ratio, 2)) < 1e4:  # 0.0999: "0.10", as 0.1
        return f"{ratio:.2f}"
    return f"{ratio:.2g}" if abs(ratio) < 0.1 else f"{ratio:.3g}"


TIMING_COLUMNS = {"virtual_time": ("virtual time (s)", lambda x: _significant(x)),
                  "global_updates": ("global updates", lambda x: f"{x:.1f}".removesuffix(".0")),
                  "client_updates": ("client updates", lambda x: f"{x:.1f}".removesuffix(".0")),
                  "client_steps_aggregated": ("client steps aggregated", lambda x: f"{x:.1f}".removesuffix(".0")),
                  "client_utilisation": ("client utilisation", lambda x: _significant(x, percent=True)),
                  "mean_staleness": ("mean staleness", lambda x: f"{x:.2f}"),
                  "wall_time_s": ("wall time (s)", lambda x: f"{x:.3f}")}


def summarise_timing(grouping: _Grouping) -> list[dict]:
    """One line per group and method of timing-only runs: the runs, the mean and std (ddof 0) over
    them of each of :data:`TIMING_COLUMNS` they have, and their stop reasons.

    >>> rows = [{"algorithm": "fedbuff", "seed": s, "virtual_time": t, "global_updates": 5, "stop_reason": "update budget"}
    ...         for s, t in [(0, 10.0), (1, 20.0)]]
    >>> line = summarise_timing(_grouping(rows))[0]
    >>> line["method"], line["runs"], line["virtual_time_mean"], line["virtual_time_std"], line["stop_reasons"]
    ('fedbuff', 2, 15.0, 5.0, 'update budget')
    """
    lines = []
    for key, by_method in grouping.cells.items():
        for name, runs in by_method.items():
            line = {**dict(zip(grouping.columns, key)), "method": name, "algorithm": runs[0]["algorithm"],
                    "runs": len(runs), "timing_only": True}
            # a table from before client_steps_aggregated was a column held them as client_steps_executed
            runs = [run if run.get("client_steps_aggregated") is not None else
                    {**run, "client_steps_aggregated": run.get("client_steps_executed")} for run in runs]
            for column in TIMING_COLUMNS:
                line[f"{column}_mean"], line[f"{column}_std"] = _mean_of(runs, column)
            line["stop_reasons"] = ", ".join(dict.fromkeys(str(run["stop_reason"]) for run in runs
                                                           if run.get("stop_reason") is not None))
            lines.append(line)
    return lines


def format_timing_markdown(lines: list[dict], groups: list[str], mixed: bool = False) -> str:
    """The timing-only runs' table as markdown (:func:`summarise_timing`'s lines): methods down, the
    timing figures the results have across, mean ± std over seeds; one table per group.

    >>> print(format_timing_markdown([{"method": "fedbuff", "runs": 2, "virtual_time_mean": 15.0, "virtual_time_std": 5.0,
    ...                                "stop_reasons": "update budget"}], []))
    ## Timing-only runs: the schedule, mean ± std over seeds
    <BLANKLINE>
    | method | runs | virtual time (s) | stop |
    |---|---|---|---|
    | fedbuff | 2 | 15.0 ± 5.0 | update budget |
    <BLANKLINE>
    Timing-only runs simulate the schedule without training (timing_only): they evaluate no model, so they have no accuracy, no time to target and no comparison with a reference method. Virtual time: the simulated seconds the run lasted; utilisation: the mean fraction of the time clients trained; staleness: global updates between a client's dispatch and the aggregation of its update; wall time: the simulator's own seconds. ± std: the standard deviation over the seeds, the population's (ddof 0, numpy's np.std: divided by the number of seeds n, not n − 1).
    """
    shown = [column for column in TIMING_COLUMNS if any(line.get(f"{column}_mean") is not None for line in lines)]
    keys, methods, found = _line_cells(lines, groups)
    header = ["| method | runs | " + " | ".join(TIMING_COLUMNS[column][0] for column in shown) + " | stop |",
              "|---|---|" + "---|" * len(shown) + "---|"]

    def cell(line, column):
        mean, spread = line.get(f"{column}_mean"), line.get(f"{column}_std")
        if mean is None:
            return ""
        show = TIMING_COLUMNS[column][1]
        return f"{show(mean)} ± {show(spread)}"

    heading = "## Timing-only runs: the schedule, mean ± std over seeds"
    if mixed:
        heading += " (the tables above are of the other runs)"
    parts = [heading, ""]
    for key in keys:
        if groups:
            parts += [f"### {_group_label(key, groups)}", ""]
        parts += header + [f"| {method} | {found[key, method]['runs']} | "
                           + " | ".join(cell(found[key, method], column) for column in shown)
                           + f" | {found[key, method].get('stop_reasons', '')} |"
                           for method in methods if (key, method) in found] + [""]
    parts.append("Timing-only runs simulate the schedule without training (timing_only): they evaluate no model, so "
                 "they have no accuracy, no time to target and no comparison with a reference method. Virtual time: "
                 "the simulated seconds the run lasted; utilisation: the mean fraction of the time clients trained; "
                 "staleness: global updates between a client's dispatch and the aggregation of its update; wall "
                 "time: the simulator's own seconds. ± std: the standard deviation over the seeds, the population's "
                 "(ddof 0, numpy's np.std: divided by the number of seeds n, not n − 1).")
    return "\n".join(parts)


def _method_settings_text(grouping: _Grouping) -> str:
    """The sweep's swept method settings, as a refusal of ``panels`` or ``grid`` names what is allowed."""
    return ", ".join(grouping.method_columns) or "none: this sweep varies no setting of a method"


def _check_grid(grid: list[str], grouping: _Grouping) -> None:
    """A ``grid`` names two different swept settings of a method that some method reads together."""
    allowed = _method_settings_text(grouping)
    if len(grid) != 2 or grid[0] == grid[1]:
        raise ValueError(f"grid={','.join(map(str, grid))!r} is not allowed: two different swept settings of a "
                         f"method, rows first, e.g. port.min_clients,port.staleness_bound (this sweep's: {allowed})")
    for setting in grid:
        if setting not in grouping.method_columns:
            raise ValueError(f"grid setting {setting!r} is not allowed: one of the swept settings of a method ({allowed})")
    runs = grouping.runs_by_method().values()
    if not any(group[0].get(grid[0]) is not None and group[0].get(grid[1]) is not None for group in runs):
        raise ValueError(f"grid={','.join(grid)!r} is not allowed: no method of this sweep reads both settings")


def _default_out(source: str) -> str:
    """``SWEEP_DIR/report``; for a CSV file ``x/NAME.csv``, ``x/NAME-report`` (``x/report`` for results.csv).

    >>> _default_out("results/ccfedavg-full-seed0.csv")
    'results/ccfedavg-full-seed0-report'
    """
    if os.path.isdir(source):
        return os.path.join(source, "report")
    folder, name = os.path.split(source)
    stem = os.path.splitext(name)[0]
    return os.path.join(folder, "report" if stem == "results" else f"{stem}-report")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.," else "_" for c in text.replace(", ", "_").replace("=", ""))


def _located_run_dir(base: str, run_dir: str) -> str:
    """A comparison's row's ``run_dir`` as a path: relative to the table's folder where that is a
    folder, else the run of that name beside the table. A comparison writes its runs beside its
    ``comparison.csv`` and names them relative to where it ran (``cmp/fedavg-...``), which is not
    where a report reads it from, nor where the folder is after it was copied or moved.

    >>> _located_run_dir("/no/cmp", "cmp/fedavg-1") == os.path.join("/no/cmp", "fedavg-1")
    True
    """
    joined = os.path.join(base, run_dir)
    if os.path.isdir(joined):
        return joined
    return os.path.join(base, os.path.basename(os.path.normpath(run_dir)))


def _run_dir(sweep_dir: str, row: dict) -> str:
    path = os.path.join(sweep_dir, str(row["run_dir"]))
    if not os.path.isdir(path):
        whose = f"of cell {row['cell']} " if row.get("cell") is not None else f"of {row.get('algorithm')} "
        raise FileNotFoundError(f"run directory {path!r} {whose}is missing: the figures need the "
                                "runs (jaxfl report --no-figures, or make_report(..., figures=False), writes the "
                                "tables alone; --table-figures, figures='table', adds the figures the table alone "
                                "makes)")
    return path


def _figures(trained: _Grouping | None, timing: _Grouping | None, lines: list[dict], sweep_dir: str, out: str,
             panels: str | None = None) -> list[str]:
    """Every figure: the accuracy bands and time-to-target bars of the runs that evaluated a model
    (``trained``; None where every run is timing-only), the staleness histograms and timelines of all,
    in the groups of the tables (:func:`figure_groups`; ``timing``: the timing-only runs' grouping)."""
    paths = []
    if trained is not None:
        groups, by_group = trained.columns, trained.cells
        # a method's colour and dashes the same in every figure (the staleness panels' too)
        styles = method_styles(list(dict.fromkeys([*trained.methods, *(timing.methods if timing else [])])))
        paths += [plot_accuracy_bands(runs_by_method, sweep_dir, os.path.join(out, _band_file(name, key, trained)),
                      title=_group_label(key, groups), panels=panels, x=x, styles=styles)
                  for key, runs_by_method in by_group.items()
                  if any(run.get("best_accuracy") is not None for runs in runs_by_method.values() for run in runs)
                  for name, x in (("accuracy", "time"), ("accuracy_vs_steps", "steps"))]
        if any(run.get("target_accuracy") is not None for runs in trained.runs_by_method().values() for run in runs):
            paths.append(_time_to_target_figure(trained, lines, out, panels))  # (an empty chart without targets)
    groups = figure_groups(trained, timing)
    paths.append(plot_staleness_by_group(groups, sweep_dir, os.path.join(out, "staleness.png"),
                                         styles if trained is not None else None))
    from jaxfl.experiment import _schedule_logged
    from jaxfl.plot import plot_timeline

    for label, runs_by_method in groups.items():
        for name, runs in runs_by_method.items():
            # one run per group and method, its lowest seed (a timeline of every run would be a
            # figure a cell, where the seeds differ by their draws only) of those with a schedule to draw
            # (a run whose initial model reached the target wrote no event); the title names the run drawn
            ordered = sorted(runs, key=lambda row: (row.get("seed") or 0, row.get("cell") or 0))
            run = next((row for row in ordered if _schedule_logged(_run_dir(sweep_dir, row))), None)
            if run is None:
                continue
            seed = f", seed {run['seed']}" if run.get("seed") is not None else ""
            title = ", ".join([_legend_label(name), *([label] if label else [])]) + seed + \
                (f" (1 of {len(runs)} runs)" if len(runs) > 1 else "")
            paths.append(plot_timeline(_run_dir(sweep_dir, run), os.path.join(out, _timeline_file(name, label)),
                                       title=title))
    return paths


BAND_FIGURES = ("accuracy", "accuracy_vs_steps")


def _band_file(name: str, key: tuple, grouping: _Grouping) -> str:
    """An accuracy figure's file: ``accuracy.png``, or ``accuracy-GROUP.png`` in a report of several groups."""
    return f"{name}.png" if len(grouping.cells) == 1 else f"{name}-{_slug(_group_label(key, grouping.columns))}.png"


def _timeline_file(method: str, label: str) -> str:
    """A timeline's file: ``timeline-METHOD.png``, or ``timeline-METHOD-GROUP.png`` (:func:`figure_groups`)."""
    return f"timeline-{_slug(method)}" + (f"-{_slug(label)}" if label else "") + ".png"


def figure_files(trained: _Grouping | None, timing: _Grouping | None) -> list[str]:
    """The file names of every figure a report of these runs can write (:func:`_figures`, and the
    grid's heat maps), drawn or not: those a report that draws fewer removes from its folder, so that
    ``report.md`` is not read beside an earlier report's figures (other runs, other settings).

    >>> rows = [{"algorithm": "fedavg", "clients": m, "seed": 0, "best_accuracy": 0.9} for m in (5, 10)]
    >>> figure_files(_grouping(rows), None)[:3]
    ['accuracy-clients5.png', 'accuracy_vs_steps-clients5.png', 'accuracy-clients10.png']
    """
    files = []
    if trained is not None:
        files += [_band_file(name, key, trained) for key in trained.cells for name in BAND_FIGURES]
        files.append("time_to_target.png")
    files += ["time_to_target_grid.png", "staleness.png"]
    files += [_timeline_file(name, label) for label, runs_by_method in figure_groups(trained, timing).items()
              for name in runs_by_method]
    return files


def _remove_undrawn_figures(out: str, files: list[str], drawn: list[str]) -> list[str]:
    """Remove from ``out`` the figures of ``files`` this report did not draw (an earlier report's,
    left by ``--no-figures`` or ``--table-figures``), and return their names; a file of another name
    (one this report never writes) stays.

    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> for name in ("accuracy.png", "time_to_target.png", "mine.png"):
    ...     _ = open(os.path.join(out, name), "w").write("")
    >>> _remove_undrawn_figures(out, ["accuracy.png", "time_to_target.png"], [os.path.join(out, "time_to_target.png")])
    ['accuracy.png']
    >>> sorted(os.listdir(out))
    ['mine.png', 'time_to_target.png']
    """
    kept = {os.path.abspath(path) for path in drawn}
    removed = []
    for name in files:
        path = os.path.join(out, name)
        if os.path.abspath(path) not in kept and os.path.isfile(path):
            os.remove(path)
            removed.append(name)
    return removed


def figure_groups(trained: _Grouping | None, timing: _Grouping | None) -> dict[str, dict[str, list[dict]]]:
    """The groups the staleness histograms and the timelines are drawn in: those of the tables, the
    trained runs' (:func:`summarise`) then the timing-only runs' (:func:`summarise_timing`), each as
    its label (the group's settings, "trained" or "timing-only" first where a report has both kinds;
    "" for a report of one group) and its runs by method. A figure of several groups' runs together
    (a FedBuff staleness of concurrency 100 and 1,000 as one histogram) matched no table.

    >>> rows = [{"algorithm": "fedbuff", "concurrency": c, "seed": s} for c in (100, 1000) for s in (0, 1)]
    >>> {label: {name: len(runs) for name, runs in by_method.items()}
    ...  for label, by_method in figure_groups(None, _grouping(rows)).items()}
    {'concurrency=100': {'fedbuff': 2}, 'concurrency=1000': {'fedbuff': 2}}
    >>> list(figure_groups(None, _grouping(rows[:2])))
    ['']
    """
    kinds = [(kind, grouping) for kind, grouping in (("trained", trained), ("timing-only", timing))
             if grouping is not None]
    single = len(kinds) == 1 and len(kinds[0][1].cells) == 1
    groups: dict[str, dict[str, list[dict]]] = {}
    for kind, grouping in kinds:
        for key, runs_by_method in grouping.cells.items():
            parts = ([kind] if len(kinds) > 1 else []) + ([_group_label(key, grouping.columns)] if grouping.columns else [])
            groups["" if single else ", ".join(parts)] = runs_by_method
    return groups


def _time_to_target_figure(grouping: _Grouping, lines: list[dict], out: str, panels: str | None) -> str:
    """The time-to-target bars: drawn from the report's lines alone, so also without the run folders."""
    return plot_time_to_target(lines, grouping.columns, os.path.join(out, "time_to_target.png"),
                               panels=None if panels is None else
                               {name: runs[0].get(panels) for name, runs in grouping.runs_by_method().items()},
                               panel_column=panels, styles=method_styles(grouping.methods))


def split_into_panels(value_of: dict[str, object], column: str) -> dict[object, dict[str, str]]:
    """The panels of a figure split by a method's setting ``column``: for each of its values (in order
    of appearance), the methods drawn there, each with its label less ``column=value``; methods that
    do not read ``column`` (value None) are in every panel, under their own name.

    >>> split_into_panels({"fedavg": None, "port port.k=1 port.b=3": 1, "port port.k=5 port.b=3": 5}, "port.k")
    {1: {'fedavg': 'fedavg', 'port port.k=1 port.b=3': 'port port.b=3'}, 5: {'fedavg': 'fedavg', 'port port.k=5 port.b=3': 'port port.b=3'}}
    """
    shared = {name: name for name, value in value_of.items() if value is None}
    panels: dict[object, dict[str, str]] = {}
    for name, value in value_of.items():
        if value is not None:
            own = " ".join(token for token in name.split(" ") if token != f"{column}={value}")
            panels.setdefault(value, dict(shared))[name] = own
    return panels


def _legend_label(method: str) -> str:
    """A method's name for a figure: its settings without its own algorithm's namespace.

    >>> _legend_label("port port.min_clients=5 port.urgent_pull=False")
    'port min_clients=5 urgent_pull=False'
    """
    algorithm, *settings = method.split(" ")
    prefix = f"{algorithm}."
    return " ".join([algorithm, *(setting[len(prefix):] if setting.startswith(prefix) else setting
                                  for setting in settings)])


def _split_for_figure(value_of: dict[str, object], column: str) -> dict[object, dict[str, str]]:
    """:func:`split_into_panels` with figure labels (:func:`_legend_label`)."""
    return {value: {name: _legend_label(label) for name, label in labels.items()}
            for value, labels in split_into_panels(value_of, column).items()}


def _panel_grid(count: int, size: tuple[float, float], max_width: float = 16.0):
    """A figure of ``count`` panels of ``size`` inches, at most 3 across and as many as fit in
    ``max_width`` inches (a wide panel goes two or one across rather than making a figure too wide to
    read), the unused ones switched off; laid out for a legend shared below the panels (:func:`_shared_legend`)."""
    across = max(1, min(3, count, int(max_width // size[0])))
    down = math.ceil(count / across)
    figure = _figure((size[0] * across, size[1] * down + 0.6), layout="constrained")
    axes = figure.subplots(down, across, squeeze=False)
    for panel in list(axes.flat)[count:]:
        panel.axis("off")
    return figure, list(axes.flat)[:count]


def _panel_colours(split: dict[object, dict[str, str]], is_reference: Callable[[str], bool]) -> dict[str, object]:
    """One colour per label of a panelled figure, the same in every panel (its legend is shared):
    the reference methods (drawn in every panel) in greys, the others in the palette, in order of
    first appearance.

    >>> colours = _panel_colours({1: {"fedavg": "fedavg", "port k=1 b=3": "port b=3"}}, lambda name: name == "fedavg")
    >>> colours["fedavg"], len(colours)
    ('0.25', 2)
    """
    colours: dict[str, object] = {}
    references = own = 0
    for labels in split.values():
        for name, label in labels.items():
            if label in colours:
                continue
            if is_reference(name):
                colours[label], references = str(0.25 + 0.2 * (references % 3)), references + 1
            else:
                colours[label], own = _colour(own), own + 1
    return colours


def _panel_styles(split: dict[object, dict[str, str]], is_reference: Callable[[str], bool]) -> dict[str, dict]:
    """:func:`_panel_colours` with a line style and a hatch per label: the references' dashes (a
    grey each, :func:`_shared_dash`), the others :func:`method_style`'s, so a tenth label is not
    the first one's colour and line again.

    >>> styles = _panel_styles({1: {"fedavg": "fedavg", **{f"port k=1 b={b}": f"port b={b}" for b in range(10)}}},
    ...                        lambda name: name == "fedavg")
    >>> styles["fedavg"]["color"], styles["port b=0"]["linestyle"], styles["port b=9"]["linestyle"]
    ('0.25', '-', '--')
    """
    colours = _panel_colours(split, is_reference)
    styles, references, own = {}, 0, 0
    for labels in split.values():
        for name, label in labels.items():
            if label in styles:
                continue
            if is_reference(name):
                styles[label] = {"color": colours[label], "linestyle": _shared_dash(references), "hatch": ""}
                references += 1
            else:
                styles[label] = {**method_style(own), "color": colours[label]}
                own += 1
    return styles


def _shared_dash(number: int):
    """The dashes of the reference methods drawn in every panel (greys, told apart by their dashes)."""
    return (":", "-.", "--", (0, (1, 3)))[number % 4]


def _shared_legend(figure, axes: list) -> None:
    """One legend below the panels for every label drawn in any of them (each once), instead of a
    legend per panel covering its bars and lines."""
    handles: dict[str, object] = {}
    for panel in axes:
        for handle, label in zip(*panel.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        # as many columns as the longest label lets fit across (~7 px a character at 8 pt and 120 dpi)
        fit = int(figure.get_figwidth() * 120 // (7 * max(map(len, handles)) + 40))
        figure.legend(list(handles.values()), list(handles), loc="outside lower center",
                      ncol=max(1, min(4, fit, len(handles))), fontsize=8, frameon=False)


def _accuracy_curve(run_dir: str, metrics: list[dict] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A run's evaluation times and accuracies (from ``metrics``, its rows when already read)."""
    from jaxfl.plot import read_metrics

    metrics = read_metrics(run_dir) if metrics is None else metrics
    return np.array([row["time"] for row in metrics]), np.array([row["accuracy"] for row in metrics])


def computation_curve(run_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """A run's held-out accuracy against the computation spent by each evaluation: the local steps
    of every update that had reached the server by then (aggregated or not: a stale update dropped
    was still computed), from the event log's arrivals on the virtual clock — not the engine's
    count, which runs ahead when it trains in-flight clients early.

    An evaluation made at the instant its version was aggregated (one per aggregation, without
    ``eval_interval``) counts the arrivals logged up to that aggregation: where two aggregations fall
    at one virtual time (equal speeds without jitter, a round's deadline), the first version's
    evaluation does not count the arrivals logged after it. An evaluation on a time grid comes after
    every event of its instant, and counts them all.

    >>> # steps, accuracy = computation_curve("runs/ccfedavg-...")
    """
    from jaxfl.plot import read_metrics
    from jaxfl.resume import read_record, recorded

    metrics = read_metrics(run_dir)
    times, accuracy = _accuracy_curve(run_dir, metrics)
    events = read_events(run_dir)
    event_times, kinds = events["time"], events["event"]
    if not (event_times[1:] >= event_times[:-1]).all():  # (a log is written in time order: no sort to pay)
        order = np.argsort(event_times, kind="stable")  # the log's order within one instant
        events = {name: events[name][order] for name in ("time", "event", "steps", "version")}
        event_times, kinds = events["time"], events["event"]
    arrival_steps = np.where(kinds == "arrival", np.maximum(events["steps"], 0), 0)
    spent = np.concatenate([[0], np.cumsum(arrival_steps)])  # spent[i]: the arrivals among the first i events
    counted = spent[np.searchsorted(event_times, times, side="right")]
    try:
        on_a_grid = recorded(read_record(run_dir)["config"], "eval_interval") is not None
    except (OSError, ValueError, KeyError, TypeError):  # no config (a folder made by hand): one per aggregation
        on_a_grid = False
    if metrics and "version" in metrics[0] and not on_a_grid:
        made_at = np.flatnonzero(kinds == "aggregate")  # each version's aggregation, in order
        made = events["version"][made_at].astype(np.int64)
        evaluated = np.array([row["version"] for row in metrics], np.int64)
        if len(made):
            index = np.minimum(np.searchsorted(made, evaluated), len(made) - 1)
            at_its_aggregation = (made[index] == evaluated) & (event_times[made_at[index]] == times)
            counted[at_its_aggregation] = spent[made_at[index[at_its_aggregation]] + 1]
    return counted.astype(np.float64), accuracy


def accuracy_band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, min and max over runs of step-function accuracy curves ``(times, accuracies)``, on the
    union of their evaluation times; a run counts from its first evaluation (NaN where no run has
    begun) and, once it has ended, with its last accuracy to the band's end: a run that stopped at
    its target (or its budget) keeps the model it ended with, and a mean over the seeds still running
    would jump at each run's end (two seeds' 0.775 falling to the slower seed's 0.6 as the faster one
    stops at 80%) under a label that counts both.

    >>> grid, mean, low, high = accuracy_band([(np.array([0.0, 2.0]), np.array([0.1, 0.5])),
    ...                                        (np.array([0.0, 1.0, 3.0]), np.array([0.1, 0.3, 0.7]))])
    >>> grid.tolist(), mean.tolist(), low.tolist(), high.tolist()  # the first run keeps 0.5 at 3 s
    ([0.0, 1.0, 2.0, 3.0], [0.1, 0.2, 0.4, 0.6], [0.1, 0.1, 0.3, 0.5], [0.1, 0.3, 0.5, 0.7])
    """
    grid = np.unique(np.concatenate([times for times, _ in curves]))
    values = np.full((len(curves), len(grid)), np.nan)
    for row, (times, accuracy) in enumerate(curves):
        index = np.searchsorted(times, grid, side="right") - 1
        begun = index >= 0  # after its last evaluation index stays there: its last accuracy carried forward
        values[row, begun] = accuracy[index[begun]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns stay NaN, without a warning
        return grid, np.nanmean(values, axis=0), np.nanmin(values, axis=0), np.nanmax(values, axis=0)


# What the accuracy figures' mean and band are over, in their titles: every seed to the end (:func:`accuracy_band`).
BAND_CAPTION = "mean over seeds, band = min–max; a run that ended keeps its last accuracy"
ONE_SEED_CAPTION = "one seed a method; a run that ended keeps its last accuracy"


X_AXES = {"time": (_accuracy_curve, "virtual time (s)"),
          "steps": (computation_curve, "client steps computed (local steps of the updates delivered)")}


def plot_accuracy_bands(runs_by_method: dict[str, list[dict]], sweep_dir: str, path: str, title: str = "",
                        panels: str | None = None, x: str = "time", styles: dict[str, dict] | None = None) -> str:
    """Held-out accuracy against virtual time (``x="time"``) or against the computation spent
    (``x="steps"``, :func:`computation_curve`: CC-FedAvg's accuracy for its cost): per method, the
    mean over its seeds and the min–max band (:func:`accuracy_band`: a run that ended counts with its
    last accuracy), the target dashed; with ``panels`` (a method's swept setting) one panel per value
    of it (:func:`split_into_panels`). ``styles``: each method's colour and line style
    (:func:`method_styles` of the report's methods, so that a method looks the same in every group's
    figure); None: by its place in ``runs_by_method``.

    >>> # plot_accuracy_bands({"fedavg": rows_of_fedavg, ...}, "sweeps/x", "accuracy.png")
    """
    if x not in X_AXES:
        raise ValueError(f"x={x!r} is not allowed: one of {', '.join(X_AXES)}")
    curve_of, x_label = X_AXES[x]
    curves = {name: [curve for curve in (curve_of(_run_dir(sweep_dir, run)) for run in runs) if len(curve[0])]
              for name, runs in runs_by_method.items()}
    # one seed a method has no band to promise
    caption = BAND_CAPTION if max(map(len, curves.values()), default=0) > 1 else ONE_SEED_CAPTION
    # wrapped: a group's settings and the caption overrun a 7-inch figure's title on one line
    heading = textwrap.fill(f"{title}: {caption}" if title else caption, 90)
    target = next((runs[0].get("target_accuracy") for runs in runs_by_method.values()
                   if runs[0].get("target_accuracy") is not None), None)
    # more lines than a legend inside the axes leaves room for: the legend goes below, one line a label
    below = panels is None and len(runs_by_method) + (target is not None) > LEGEND_INSIDE_LABELS
    if panels is None:
        extra = 0.2 * (len(runs_by_method) + 1) if below else 0.0
        figure = _figure((7, 4.5 + extra), layout="constrained" if below else None)
        layout = [(figure.subplots(), heading, {name: _legend_label(name) for name in runs_by_method})]
    else:
        split = _split_for_figure({name: runs[0].get(panels) for name, runs in runs_by_method.items()}, panels)
        figure, axes = _panel_grid(len(split), (6, 4))
        layout = [(panel, f"{panels}={value}", labels) for panel, (value, labels) in zip(axes, split.items())]
        figure.suptitle(heading, fontsize=10)
    shared = [name for name, runs in runs_by_method.items() if panels is not None and runs[0].get(panels) is None]
    if panels is None:
        styles = styles or method_styles(list(runs_by_method))
    else:  # by label: a legend shared by the panels names each label once
        styles = _panel_styles(split, lambda name: name in shared)
    for axes, panel_title, labels in layout:
        for name, label in labels.items():
            if not curves[name]:
                continue
            grid, mean, low, high = accuracy_band(curves[name])
            count = len(curves[name])
            chosen = styles[name if panels is None else label]
            style = {"color": chosen["color"], "linestyle": chosen["linestyle"]}
            # one evaluation (a run stopped before its first aggregation) is a point: a line of it is invisible
            line, = axes.plot(grid, mean, drawstyle="steps-post", label=f"{label} ({count} seed{'s' if count > 1 else ''})",
                              marker="o" if len(grid) == 1 else None, **style)
            if count > 1:
                axes.fill_between(grid, low, high, step="post", alpha=0.2, color=line.get_color(), linewidth=0)
        if target is not None:
            axes.axhline(target, linestyle="--", color="grey", linewidth=1, label=f"target {percent(target)}")
        axes.set_title(panel_title, fontsize=9)
        axes.set_xlabel(x_label)
        axes.set_ylabel("held-out accuracy")
        axes.grid(alpha=0.3)
        if panels is None and not below:
            axes.legend(fontsize=8)
    if panels is not None or below:
        _shared_legend(figure, [axes for axes, _, _ in layout])
    return _save(figure, path)


# The most labels (methods and the target line) an accuracy figure's legend holds inside its axes,
# where it covers part of the curves; past it the legend goes below the axes.
LEGEND_INSIDE_LABELS = 6

# About how many bars one row of the time-to-target figure holds before its groups wrap (0.3 in each).
TARGET_BARS_PER_ROW = 24


def _partly_reached(line: dict) -> bool:
    """Whether a summary line's time to target is a mean over fewer runs than the method made: it reached
    the target in more than half of them (else its time is "–") but not in all (the tables' [k of n
    reached], the bars' k/n)."""
    runs = line.get("runs")
    reached = line.get("reached", runs)
    return line.get("time_to_target_mean") is not None and runs is not None and reached is not None \
        and 0 < reached < runs


def plot_time_to_target(lines: list[dict], groups: list[str], path: str, panels: dict[str, object] | None = None,
                        panel_column: str = "", styles: dict[str, dict] | None = None) -> str:
    """Bars of the mean virtual time to target (std over the seeds that reached it as error bars),
    one cluster per group, one bar per method; "–" where a method missed in at least half its runs,
    inside the frame, and "k/n" over a bar whose method reached the target in k of its n runs only. ``panels``: each method's value of the setting ``panel_column``, one panel per
    value (:func:`split_into_panels`). ``styles``: each method's colour and hatch
    (:func:`method_styles`, as in the accuracy figures); None: by its place among the lines.

    >>> # plot_time_to_target(summarise(rows), group_columns(rows), "time_to_target.png")
    """
    keys, methods, found = _line_cells(lines, groups)
    partly = any(_partly_reached(line) for line in lines)
    # a mean over two seeds or more somewhere (its std, ddof 0, is 0.0 over one seed)
    spread = any((line.get("reached") or 0) > 1 or line.get("time_to_target_std") for line in lines)
    heading = ("time to target: " + ("mean over the seeds that reached it, error bars their std (ddof 0)" if spread
                                     else "one seed a method") +
               f" (missed = missed in ≥ half{'; k/n over a bar = reached in k of its n runs' if partly else ''})")
    if panels is None:
        # a row holds about TARGET_BARS_PER_ROW bars; more groups wrap into further rows
        # (FedCompass's twelve settings × eight methods as one row was a figure 70 inches wide)
        per_row = max(1, TARGET_BARS_PER_ROW // len(methods))
        rows = [keys[start:start + per_row] for start in range(0, len(keys), per_row)]
        labels = {method: _legend_label(method) for method in methods}
        figure, axes = _panel_grid(len(rows), (max(6.0, 0.3 * len(rows[0]) * len(methods) + 1.5), 3.6), max_width=12.0)
        layout = [(panel, "", labels, row) for panel, row in zip(axes, rows)]
    else:
        split = _split_for_figure({method: panels.get(method) for method in methods}, panel_column)
        widest = max(len(labels) for labels in split.values())
        figure, axes = _panel_grid(len(split), (max(4.5, 0.22 * len(keys) * widest + 1.2), 3.6))
        layout = [(panel, f"{panel_column}={value}", labels, keys)
                  for panel, (value, labels) in zip(axes, split.items())]
    # wrapped to the figure's width: a 6-inch figure cut the one line at both ends, "–" explained in the lost part
    figure.suptitle(textwrap.fill(heading, width=int(figure.get_figwidth() * 14)), fontsize=10)
    styles = ((styles or method_styles(methods)) if panels is None else
              _panel_styles(split, lambda method: panels.get(method) is None))
    for axes, panel_title, labels, shown in layout:
        width, marked = 0.8 / len(labels), False
        for number, (method, label) in enumerate(labels.items()):
            style = styles[method if panels is None else label]
            colour = style["color"]
            # the hatch tells apart methods whose colours came round again; drawn in white over the colour
            look = {"color": colour, "hatch": style["hatch"] or None, "edgecolor": "white", "linewidth": 0}
            # an empty bar names every method in the legend, also one that missed everywhere
            axes.bar(0, 0, width, label=label, **look)
            for position, key in enumerate(shown):
                line = found.get((key, method))
                x = position + (number - (len(labels) - 1) / 2) * width
                if line is None:
                    continue
                if line["time_to_target_mean"] is None:
                    # a word, not the tables' "–": a dash in the method's colour on the axis read as a very short bar
                    axes.text(x, 0, " missed", rotation=90, ha="center", va="bottom", fontsize=7, color="0.35")
                    continue
                axes.bar(x, line["time_to_target_mean"], width, yerr=line["time_to_target_std"] or None, capsize=3,
                         **look)
                # a mean over fewer seeds than the method ran (the tables' [k of n reached]): said on its bar,
                # which otherwise reads as the mean of every run
                if _partly_reached(line):
                    top = line["time_to_target_mean"] + (line["time_to_target_std"] or 0.0)
                    axes.annotate(f"{line['reached']}/{line['runs']}", (x, top), xytext=(0, 2),
                                  textcoords="offset points", ha="center", va="bottom", fontsize=7, color=colour)
                    marked = True
        # the bars alone set the x-limits: a "–" of the first or last method in its cluster (text,
        # which autoscaling ignores) fell outside the frame; every slot of every cluster inside
        axes.set_xlim(-0.5, len(shown) - 0.5)
        axes.set_ylim(bottom=0)
        if marked:  # room above the highest bar for its k/n
            axes.set_ylim(top=axes.get_ylim()[1] * 1.08)
        axes.set_xticks(range(len(shown)), [_group_label(key, groups).replace(", ", "\n") for key in shown], fontsize=8)
        axes.set_ylabel("virtual time to target (s)")
        axes.set_title(panel_title, fontsize=9)
        axes.grid(alpha=0.3, axis="y")
    _shared_legend(figure, [axes for axes, *_ in layout])
    return _save(figure, path)


def plot_design_grid(grid: DesignGrid, groups: list[str], reference: str, path: str) -> str:
    """The :class:`DesignGrid` as heat maps, one panel per group and variant: rows × columns coloured
    by the time to target relative to the reference (green sooner, red later, yellow equal, on a log
    scale even about 1), each cell labelled with its ratio; "–" where the method missed the target in
    at least half its runs.

    >>> # plot_design_grid(design_grid(lines, grouping, "port.min_clients", "port.staleness_bound"), ...)
    """
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm

    panels = [(group, number) for group in grid.groups for number in range(len(grid.variants))]
    found = [ratio for cells in grid.cells.values() for ratios in cells.values() for ratio in ratios
             if isinstance(ratio, float) and ratio > 0]
    # a log scale even about 1: half the reference's time is as green as twice it is red
    widest = max([1.01, *found, *(1 / ratio for ratio in found)])
    norm = LogNorm(vmin=1 / widest, vmax=widest)
    colours = colormaps["RdYlGn_r"].with_extremes(bad="0.85")  # missed: grey
    figure, axes = _panel_grid(len(panels), (max(4.0, 0.75 * len(grid.columns) + 2.2), 0.45 * len(grid.rows) + 1.8))
    image = None
    for panel, (group, number) in zip(axes, panels):
        values = np.full((len(grid.rows), len(grid.columns)), np.nan)
        for (row, column), ratios in grid.cells[group].items():
            if isinstance(ratios[number], float):
                values[grid.rows.index(row), grid.columns.index(column)] = ratios[number]
        image = panel.imshow(values, cmap=colours, norm=norm, aspect="auto")
        for (row, column), ratios in grid.cells[group].items():
            panel.text(grid.columns.index(column), grid.rows.index(row), _grid_cell_text(ratios[number]),
                       ha="center", va="center", fontsize=8)
        panel.set_xticks(range(len(grid.columns)), [str(column) for column in grid.columns], fontsize=8)
        panel.set_yticks(range(len(grid.rows)), [str(row) for row in grid.rows], fontsize=8)
        panel.set_xlabel(grid.columns_setting, fontsize=8)
        panel.set_ylabel(grid.rows_setting, fontsize=8)
        title = [_group_label(group, groups) if groups else "", grid.variants[number] if len(grid.variants) > 1 else ""]
        panel.set_title("\n".join(part for part in title if part), fontsize=8)
    bar = figure.colorbar(image, ax=axes, shrink=0.8, label=f"time to target ÷ {reference}'s")
    ticks = [tick for tick in (0.1, 0.25, 0.5, 0.7, 1.0, 1.4, 2.0, 4.0, 10.0) if 1 / widest <= tick <= widest]
    bar.ax.minorticks_off()
    bar.set_ticks(ticks, labels=[f"{tick:g}" for tick in ticks])
    figure.suptitle(f"time to target relative to {reference}\n({MISSING} = missed in ≥ half the runs)", fontsize=10)
    return _save(figure, path)


def plot_staleness(runs_by_method: dict[str, list[dict]], sweep_dir: str, path: str) -> str:
    """Staleness of the aggregated updates per method (summary.json's histogram), summed over its runs
    (one group: :func:`plot_staleness_by_group` for several).

    >>> # plot_staleness({"fedbuff": rows_of_fedbuff}, "sweeps/x", "staleness.png")
    """
    return plot_staleness_by_group({"": runs_by_method}, sweep_dir, path)


# A staleness histogram draws one bar per value up to this many values, else STALENESS_BINS bins.
STALENESS_BARS = 100
STALENESS_BINS = 60


def plot_staleness_by_group(groups: dict[str, dict[str, list[dict]]], sweep_dir: str, path: str,
                            styles: dict[str, dict] | None = None) -> str:
    """Staleness of the aggregated updates (summary.json's histogram), one panel per group and method
    summed over that group's runs of the method (its seeds): each group starts a row of panels, and
    a panel's title names the group (its label, :func:`figure_groups`; none for the label "") and the
    method, with its runs and mean staleness (the mean of its runs' means, as the tables' rows). A
    staleness above :data:`STALENESS_BARS` is drawn in :data:`STALENESS_BINS` bins. ``styles``: each
    method's colour (:func:`method_styles` of the report's methods, as in its other figures); None:
    by its place among the groups' methods.

    >>> # plot_staleness_by_group({"concurrency=100": {"fedbuff": runs}, "concurrency=1000": {...}}, "sweeps/x", "staleness.png")
    """
    from matplotlib.ticker import MaxNLocator

    styles = styles or method_styles(list(dict.fromkeys(name for runs_by_method in groups.values()
                                                        for name in runs_by_method)))
    columns = min(3, max(len(runs_by_method) for runs_by_method in groups.values()))
    # each group a block of rows of its own, so a row holds one group's methods
    layout, count = [], 0  # (panel number, group label, method, runs); rows so far
    for label, runs_by_method in groups.items():
        layout += [(count * columns + number, label, name, runs)
                   for number, (name, runs) in enumerate(runs_by_method.items())]
        count += math.ceil(len(runs_by_method) / columns)
    # the lines a group's label takes above each of its panels' own
    label_lines = max(len(textwrap.wrap(label, 48)) for label in groups)
    figure = _figure((4 * columns, (2.8 + 0.2 * label_lines) * count))
    axes = figure.subplots(count, columns, squeeze=False)
    used = set()
    for number, label, name, runs in layout:
        panel = axes.flat[number]
        used.add(number)
        histogram: dict[int, int] = {}
        run_means = []  # each run's mean staleness: the tables' mean over seeds is their mean
        for run in runs:
            summary = os.path.join(_run_dir(sweep_dir, run), "summary.json")
            if not os.path.isfile(summary):  # the table lists the run: its folder was damaged or moved since
                raise FileNotFoundError(f"run directory {_run_dir(sweep_dir, run)!r} of cell {run.get('cell')} has "
                                        "no summary.json (the run did not finish there, or the file was removed): "
                                        "the staleness figure needs it (jaxfl report --no-figures, or "
                                        "make_report(..., figures=False), writes the tables alone)")
            stale = read_json(summary).get("timeline", {}).get("staleness_histogram") or {}
            for staleness, updates in stale.items():
                histogram[int(staleness)] = histogram.get(int(staleness), 0) + updates
            if sum(stale.values()):
                run_means.append(sum(int(s) * n for s, n in stale.items()) / sum(stale.values()))
        total = sum(histogram.values())
        if total:
            values, counts = np.array(list(histogram)), np.array(list(histogram.values()))
            colour = styles.get(name, {}).get("color")  # (None: matplotlib's first)
            if values.max() <= STALENESS_BARS:
                panel.bar(values, counts, width=0.8, color=colour)
            else:  # thousands of values: one bar each was invisible beside the axis (and slow): binned
                # whole versions a bin: fractional widths gave some bins one staleness value more than their
                # neighbours, a comb in the shape ("updates per 12.8 versions")
                step = math.ceil((values.max() + 1) / STALENESS_BINS)
                edges = np.arange(-0.5, values.max() + step, step)
                binned, _ = np.histogram(values, edges, weights=counts)
                panel.stairs(binned, edges, fill=True, color=colour)
                panel.set_ylabel(f"updates per {edges[1] - edges[0]:.3g} versions", fontsize=8)
            mean = sum(run_means) / len(run_means)
            # the bars pool the runs' updates; the mean is the tables' (of the runs' means), and says so
            # the mean is over the runs that aggregated something (a run at its target from the start has none)
            what = f"1 run, mean {mean:.2f}" if len(run_means) == 1 else \
                f"{len(run_means)} runs, mean of their means {mean:.2f}"
            if len(run_means) < len(runs):
                what += f" ({len(runs) - len(run_means)} more without updates)"
        else:
            what = "no aggregated updates"
        # a design-space sweep's names (PORT's) are longer than a panel is wide: wrapped, not overlapping
        title = textwrap.fill(f"{_legend_label(name)}: {what}", 48)
        panel.set_title(f"{textwrap.fill(label, 48)}\n{title}" if label else title, fontsize=9)
        # staleness counts versions; at most ~6 ticks, so that labels of large staleness (1,000s) do not overlap
        panel.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
        # a synchronous method's one bar at 0 leaves a single integer in view, where the locator falls
        # back to fractions of an update (-0.4 … 0.4): keep 0 and 1 in view
        panel.set_xlim(-0.6, max([1, *histogram]) + 0.6)
        panel.set_xlabel("staleness (global updates)", fontsize=8)
        if not panel.get_ylabel():
            panel.set_ylabel("updates", fontsize=8)
    for number, panel in enumerate(axes.flat):
        if number not in used:
            panel.axis("off")
    return _save(figure, path)


def _colour(number: int):
    """tab10 without its grey, which the reference methods of a panelled figure use."""
    import matplotlib

    return matplotlib.colormaps["tab10"]((0, 1, 2, 3, 4, 5, 6, 8, 9)[number % 9])


# After the nine colours come round again, the next nine methods are told apart by their dashes
# (lines) and hatches (bars): 45 distinct styles, PORT's full design space (40 methods) included.
LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))
HATCHES = ("", "//", "..", "xx", "\\\\")


def method_style(number: int) -> dict:
    """The colour, line style and bar hatch of a figure's ``number``-th method (from 0): the nine
    colours of :func:`_colour` solid, then dashed, dotted...; a method with its own style in every
    figure of a report (:func:`method_styles`).

    >>> first, tenth = method_style(0), method_style(9)
    >>> first["color"] == tenth["color"], first["linestyle"], tenth["linestyle"], tenth["hatch"]
    (True, '-', '--', '//')
    """
    return {"color": _colour(number), "linestyle": LINESTYLES[(number // 9) % len(LINESTYLES)],
            "hatch": HATCHES[(number // 9) % len(HATCHES)]}


def method_styles(methods: Sequence[str]) -> dict[str, dict]:
    """Each method's :func:`method_style` by its place among ``methods`` (all of a report's, in
    order): FedAsync the same orange in the accuracy figure of every group and in the bars.

    >>> styles = method_styles(["fedavg", "fedasync"] + [f"port k={k}" for k in range(9)])
    >>> len({(str(style["color"]), str(style["linestyle"])) for style in styles.values()})
    11
    """
    return {method: method_style(number) for number, method in enumerate(methods)}


def _figure(size: tuple[float, float], layout: str | None = None):
    """A figure drawn without pyplot, so a report made in a notebook leaves its backend and its
    inline figures alone (as :mod:`jaxfl.plot` does); ``layout``: matplotlib's layout engine
    (``"constrained"`` for a legend outside the panels), else laid out tightly on saving."""
    from matplotlib.figure import Figure

    return Figure(figsize=size, layout=layout)


def _save(figure, path: str) -> str:
    if figure.get_layout_engine() is None:
        figure.tight_layout()
    save_figure(figure, path)
    return path
