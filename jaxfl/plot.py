"""Plots of finished runs (matplotlib).

Every figure is drawn on a :class:`matplotlib.figure.Figure` and written to a file, never through
pyplot: a comparison run in a Jupyter notebook leaves the notebook's backend and its inline
figures as they were.

>>> # plot_accuracy(["runs/fedavg-...", "runs/fedbuff-..."], "accuracy.png")
"""
from __future__ import annotations

import json
import os
import re
import textwrap

import numpy as np

from jaxfl import runlog

GANTT_MAX_CLIENTS = 60  # above this many clients one row per client is unreadable: aggregated views


def read_metrics(run_dir: str) -> list[dict]:
    """The rows of a run's ``metrics.csv`` with numbers parsed (columns: :func:`jaxfl.runlog.read_metrics`).

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> _ = open(f"{run_dir}/metrics.csv", "w").write("time,accuracy\\n0.0,0.1\\n")
    >>> read_metrics(run_dir)
    [{'time': 0.0, 'accuracy': 0.1}]
    """
    columns = runlog.read_metrics(run_dir)  # a damaged file: one ValueError naming it; a killed run's cut row left out
    return [{key: float(value) for key, value in zip(columns, values)} for values in zip(*columns.values())]



def percent(fraction: float) -> str:
    """A target accuracy as a percentage with the digits it has (not rounded to a whole percent,
    where 0.995 would read as 100%).

    >>> percent(0.9), percent(0.875), percent(0.995)
    ('90%', '87.5%', '99.5%')
    """
    return f"{100 * fraction:.4g}%"


def significant(x: float, digits: int = 3, percent: bool = False) -> str:
    """``x`` with one decimal from 1 up to 10^7, else ``digits`` significant figures: a large
    federation's 0.01 % utilisation or 0.027 virtual s were "0.0", and a time of 1e25 s 26 digits.

    >>> significant(1234.56), significant(0.02712), significant(0.0001, percent=True), significant(0.5, percent=True)
    ('1234.6', '0.0271', '0.01%', '50.0%')
    >>> significant(1e25), significant(0.9996), significant(0.96), significant(9999999.96)
    ('1e+25', '1.0', '0.96', '1e+07')
    """
    value = 100 * x if percent else x
    suffix = "%" if percent else ""
    # by the digits shown: 0.9996 reads "1.0" (not "1"), 9,999,999.96 "1e+07" (not "10000000.0")
    if value == 0 or 1 <= abs(float(f"{value:.{digits}g}")) and abs(round(value, 1)) < 1e7:
        return f"{value:.1f}{suffix}"
    return f"{value:.{digits}g}{suffix}"


def save_figure(figure, path: str, dpi: int = 120) -> str:
    """Write ``figure`` to ``path`` (ending in ``.png``) as a PNG at ``dpi``, atomically, and return
    the path. Without the alpha channel (the figures are opaque) and with Pillow's optimised
    compression: a report's busy staleness panels came to 92 KB, 80 KB so. Another suffix, or a
    folder that does not exist, is refused naming the path given.

    >>> save_figure(None, "timeline.jpg")
    Traceback (most recent call last):
    ...
    ValueError: path='timeline.jpg' is not allowed: the figure is written as a PNG; give a path ending in .png
    """
    import io

    from PIL import Image  # matplotlib's own dependency

    path = os.path.expanduser(os.fspath(path))
    if not path.lower().endswith(".png"):  # PNG bytes went into a .jpg file
        raise ValueError(f"path={path!r} is not allowed: the figure is written as a PNG; give a path ending in .png")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):  # the error named the temporary file (path.tmp.png)
        raise FileNotFoundError(f"cannot write {path!r}: its folder {folder!r} does not exist")
    drawn = io.BytesIO()
    figure.savefig(drawn, format="png", dpi=dpi)
    with runlog.written_atomically(path, ".tmp.png") as temporary:  # a full disk left half a PNG beside it
        Image.open(drawn).convert("RGB").save(temporary, "PNG", optimize=True)
    return path

def plot_accuracy(run_dirs: list[str], path: str) -> str:
    """Write :func:`accuracy_figure` of the runs to ``path`` (PNG) and return the path.

    >>> # plot_accuracy(["runs/fedavg-mnist10k-exp-c10-s0", "runs/fedbuff-mnist10k-exp-c10-s0"], "accuracy.png")
    """
    return save_figure(accuracy_figure(run_dirs), path)


def accuracy_figure(run_dirs: list[str], figsize: tuple[float, float] = (7, 4.5)):
    """Held-out accuracy against virtual time, one line per run, the target as a dashed line and a
    dot where each run first reached it (its time to target, also in the legend), as a
    :class:`matplotlib.figure.Figure` (a notebook shows it inline; ``.savefig`` writes it).
    ``run_dirs``: a list of run directories, or one.

    >>> # accuracy_figure(comparison.run_dirs)          # the last line of a notebook cell
    """
    from matplotlib.figure import Figure

    from jaxfl.report import LINESTYLES, method_style  # a report's styles: distinct past ten runs, as its figures

    if isinstance(run_dirs, (str, os.PathLike)):  # one run given as itself: its characters were taken as runs ('/')
        run_dirs = [run_dirs]
    run_dirs = [os.path.expanduser(os.fspath(run_dir)) for run_dir in run_dirs]
    if not run_dirs:
        raise ValueError("run_dirs=[] is not allowed: give the run directories to plot (a list of one or more)")
    figure = Figure(figsize=figsize)
    axes = figure.subplots()
    summaries = []
    for run_dir in run_dirs:  # all checked before drawing: one error naming the run
        path = os.path.join(run_dir, "summary.json")
        if not os.path.isfile(path):
            raise ValueError(f"run {run_dir!r} has no summary.json (not a run directory, or a run still going or "
                             "interrupted): its accuracy plot comes when it has finished (jaxfl run --resume RUN_DIR)")
        summaries.append(runlog.read_json(path))
        if summaries[-1].get("timing_only"):
            raise ValueError(f"run {run_dir!r} is a timing-only run: it evaluates no model, so it has no accuracy to "
                             "plot; its schedule is jaxfl.plot.timeline_figure(run_dir) (jaxfl timeline RUN_DIR)")
    title, differing = _settings_of(run_dirs)
    targets, evaluated = [], 0
    # a colour per algorithm, in the order the runs name them; its further runs (seeds, speeds) in its colour
    # with the next dashes: by the run's place, two seeds of one algorithm had unrelated colours. Past as
    # many runs of one algorithm as there are dashes, by the run's place (45 styles) again
    algorithms, repeats = list(dict.fromkeys(summary["algorithm"] for summary in summaries)), {}
    by_algorithm = max(sum(s["algorithm"] == name for s in summaries) for name in algorithms) <= len(LINESTYLES)
    for number, (run_dir, summary) in enumerate(zip(run_dirs, summaries)):
        rows = read_metrics(run_dir)
        evaluated += bool(rows)
        target, reached = summary["target_accuracy"], summary.get("time_to_target")
        if target is not None and target not in targets:
            targets.append(target)
        # runs of other settings (speeds, seeds, ...) side by side: each line says its own; a run that
        # ended before its first evaluation (eval_at_start off) has nothing to draw, and says so
        label = ", ".join([summary["algorithm"], *differing[number]]) + \
            (" (no evaluation)" if not rows else f" ({significant(reached)} s)" if reached is not None
             else " (not reached)" if target is not None else "")
        # the global model is constant between versions: draw steps, not interpolation
        kind = algorithms.index(summary["algorithm"])
        repeats[kind] = repeats.get(kind, -1) + 1
        # (method_style's nine colours, then its dashes)
        style = method_style(kind + 9 * repeats[kind] if by_algorithm else number)
        # one evaluation (a run stopped before its first aggregation) is a point: a line of it is invisible
        line, = axes.plot([r["time"] for r in rows], [r["accuracy"] for r in rows], drawstyle="steps-post",
                          label=label, color=style["color"], linestyle=style["linestyle"],
                          marker="o" if len(rows) == 1 else None)
        if reached is not None:
            axes.plot([reached], [target], marker="o", color=line.get_color(), zorder=3)
    if not evaluated:  # an empty frame said as such, not a plot that looks like one whose lines failed to draw
        axes.text(0.5, 0.5, "no run made an evaluation\n(each ended before its first: eval_at_start off)",
                  transform=axes.transAxes, ha="center", va="center", color="grey")
    for number, target in enumerate(targets):  # one line per target the runs were given
        axes.axhline(target, linestyle=("--", ":", "-.")[number % 3], color="grey", linewidth=1,
                     label=f"target {percent(target)}")
    if run_dirs:
        axes.set_title(title, fontsize=9)
    axes.set_xlabel("virtual time (s)")
    axes.set_ylabel("held-out accuracy")
    axes.legend(title="algorithm (time to target)" if targets else None)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return _shown_inline(figure)


def _recorded_config(run_dir: str) -> dict:
    """A run's config.json config, flat (sections merged, algorithm options as ``space.option``) and
    read as it ran (:func:`jaxfl.config.as_recorded`); empty where the file is missing."""
    from jaxfl.config import FIELDS_ADDED, as_recorded
    from jaxfl.user_inputs import recorded_speeds_sha256

    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        return {}
    record = runlog.read_json(path)
    config = as_recorded(record.get("config", {}))
    options = config.pop("algorithm_options", None) or {}
    # a field added since an older run wrote its file holds the value that run had: not a difference
    flat = {key: value for key, value in FIELDS_ADDED.items() if "." not in key}
    flat.update({key: value for section in config.values() if isinstance(section, dict) for key, value in section.items()})
    flat.update({key: value for key, value in config.items() if not isinstance(value, dict)})
    for space, values in options.items():
        if isinstance(values, dict):
            flat.update({f"{space}.{name}": value for name, value in values.items()})
        else:
            flat[space] = values
    speeds = recorded_speeds_sha256(record)
    if speeds is not None:  # given times (time_per_step): the drawing settings drew none of them
        flat.update(heterogeneity="given", time_per_step=f"sha256 {speeds[:8]}")
    return flat


def _setting_parts(flat: dict) -> dict[str, str]:
    """The data, model, split, speeds, local work and seed of a run (its :func:`_recorded_config`),
    each as the title shows it (empty where there is no config)."""
    if not flat:
        return {}
    partition = flat.get("partition", "?")
    if partition in ("dirichlet", "dirichlet_client"):
        partition += f" α={flat.get('dirichlet_alpha')}"
    local = (f"{flat.get('local_steps', '?')} local steps" if flat.get("local_epochs") is None
             else f"{flat['local_epochs']:g} local epochs")
    return {"dataset": f"{flat.get('dataset', '?')}", "model": f"{flat.get('model', '?')}",
            "clients": f"{flat.get('clients', '?')} clients", "partition": f"{partition} split",
            "heterogeneity": f"{flat.get('heterogeneity', '?')} speeds", "local": local,
            "seed": f"seed {flat.get('seed', '?')}"}


# config fields that change no curve: never what tells two runs apart in a legend
_NOT_A_SETTING = ("output_dir", "run_name", "progress", "client_state", "checkpoint_min_interval_s", "checkpoint_every",
                  "final_checkpoint", "devices", "memory_limit_mb", "clients_per_call", "steps_per_call", "batching",
                  "cpu_friendly_layers")


def _settings_of(run_dirs: list[str]) -> tuple[str, list[list[str]]]:
    """The settings every run shares, as a title, and per run those in which the runs differ (for
    its label), so that runs of two speed models plotted together are told apart. Runs of one
    algorithm that differ in none of those (two learning rates, two update rules) get the other
    fields they differ in as ``name=value``.

    >>> _settings_of([])
    ('', [])
    """
    flats = [_recorded_config(run_dir) for run_dir in run_dirs]
    parts = [_setting_parts(flat) for flat in flats]
    names = list(dict.fromkeys(name for part in parts for name in part))
    shared = [name for name in names if len({part.get(name) for part in parts}) == 1]
    title = ", ".join(parts[0][name] for name in shared if name in parts[0]) if parts else ""
    differing = [[part.get(name, "?") for name in names if name not in shared] for part in parts]
    alike: dict[tuple, list[int]] = {}
    for number, flat in enumerate(flats):
        alike.setdefault((flat.get("algorithm"), *differing[number]), []).append(number)
    for numbers in alike.values():
        if len(numbers) < 2:
            continue
        fields = dict.fromkeys(name for number in numbers for name in flats[number])
        told = [name for name in fields if name not in _NOT_A_SETTING
                and len({json.dumps(flats[number].get(name), default=str) for number in numbers}) > 1]
        for number in numbers:
            differing[number] += [f"{name}={flats[number].get(name)}" for name in told]
    return title, differing


def read_events(run_dir: str) -> dict[str, np.ndarray]:
    """A run's event log as numpy columns, from ``events.csv`` or Parquet ``events/`` (see
    :func:`jaxfl.runlog.read_events`: missing integers are -1, missing strings None).

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> with runlog.EventLog(run_dir) as log:
    ...     log.write({"time": 0.0, "event": "dispatch", "client": 2, "dispatch": 0, "version": 0,
    ...                "staleness": None, "steps": 5, "detail": None})
    >>> read_events(run_dir)["client"]
    array([2])
    """
    return runlog.read_events(run_dir)


def busy_intervals(events) -> dict[int, list[tuple[float, float, str]]]:
    """Per client: (start, end, label) of every dispatch that arrived, from an event log — a list
    of row dicts (as ``csv.DictReader`` gives them) or the columns of :func:`read_events`.

    The label is the dispatch's ``detail`` (FedCompass group, FedAT tier) or empty. Dispatches
    still in flight at the end of the run, and crashed ones, are left out.

    >>> busy_intervals([{"event": "dispatch", "dispatch": "0", "client": "2", "time": "0.0", "detail": ""},
    ...                 {"event": "arrival", "dispatch": "0", "client": "2", "time": "1.5", "detail": ""}])
    {2: [(0.0, 1.5, '')]}
    >>> busy_intervals({"time": np.array([0.0, 1.5]), "event": np.array(["dispatch", "arrival"], object),
    ...                 "client": np.array([2, 2]), "dispatch": np.array([0, 0]),
    ...                 "detail": np.array(["group 1", None], object)})
    {2: [(0.0, 1.5, 'group 1')]}
    """
    if isinstance(events, dict):
        return _busy_intervals_columns(events)
    from jaxfl.scheduler.faults import split_fault_seconds

    starts: dict[str, tuple[float, str]] = {}
    intervals: dict[int, list[tuple[float, float, str]]] = {}
    for row in events:
        if row["event"] == "dispatch":
            # "dropout 61.5 s" labels the interval "dropout", as the columns' reader does
            starts[row["dispatch"]] = (float(row["time"]), split_fault_seconds(row.get("detail") or "")[0])
        elif row["event"] == "arrival" and row["dispatch"] in starts:
            start, label = starts.pop(row["dispatch"])
            intervals.setdefault(int(row["client"]), []).append((start, float(row["time"]), label))
    return intervals


def _busy_intervals_columns(events: dict[str, np.ndarray]) -> dict[int, list[tuple[float, float, str]]]:
    spans = runlog.dispatch_intervals(events)
    arrived = spans["arrived"]
    client, start, end, label = (spans[key][arrived] for key in ("client", "start", "end", "label"))
    order = np.lexsort((start, client))  # arrival order per client, like the row-by-row reader
    intervals: dict[int, list[tuple[float, float, str]]] = {}
    for c, a, b, text in zip(client[order].tolist(), start[order].tolist(), end[order].tolist(), label[order]):
        intervals.setdefault(c, []).append((a, b, text or ""))
    return intervals


def _run_title(run_dir: str) -> tuple[str, int | None]:
    """``(algorithm name, configured number of clients)`` from summary.json, else config.json."""
    algorithm, clients = os.path.basename(os.path.normpath(run_dir)), None
    path = os.path.join(run_dir, "config.json")
    if os.path.isfile(path):
        config = runlog.read_json(path).get("config", {})
        algorithm = config.get("algorithm", algorithm)
        # sections (config["data"]["clients"]) since jaxfl 0.2, flat before
        clients = config.get("clients", config.get("data", {}).get("clients"))
    path = os.path.join(run_dir, "summary.json")
    if os.path.isfile(path):
        summary = runlog.read_json(path)
        algorithm, clients = summary.get("algorithm", algorithm), summary.get("clients", clients)
    return algorithm, clients


def busy_profile(events: dict[str, np.ndarray], edges: np.ndarray, _kinds=None,
                 horizon: float | None = None) -> dict[str, np.ndarray]:
    """Clients in flight over virtual time, per bin of ``edges``: the time-weighted ``mean`` and
    the ``min`` and ``max`` the count takes in the bin (a dispatch is in flight from its start to
    its arrival or crash; one still in flight counts until the run's end, ``horizon``, or the last
    edge if that is earlier or no horizon is given: after a run's end nothing is in flight).

    >>> events = {"time": np.array([0.0, 0.0, 1.0, 3.0]),
    ...           "event": np.array(["dispatch", "dispatch", "arrival", "arrival"], object),
    ...           "client": np.array([0, 1, 0, 1]), "dispatch": np.array([0, 1, 0, 1]),
    ...           "detail": np.full(4, None, object)}
    >>> profile = busy_profile(events, np.array([0.0, 2.0, 4.0]))
    >>> profile["mean"].tolist(), profile["min"].tolist(), profile["max"].tolist()
    ([1.5, 0.5], [1.0, 0.0], [2.0, 1.0])
    """
    until = float(edges[-1]) if horizon is None else min(float(edges[-1]), horizon)
    spans = runlog.dispatch_intervals(events, horizon=until, labels=False, _kinds=_kinds)
    starts, ends = np.sort(spans["start"]), np.sort(spans["end"])
    times = np.sort(np.concatenate([starts, ends]))
    times = times[np.append(times[1:] != times[:-1], True)] if len(times) else times
    # the count after every change at an instant (an arrival and the reply's dispatch at once
    # leave no spurious peak or dip)
    level = (np.searchsorted(starts, times, side="right") - np.searchsorted(ends, times, side="right")).astype(float)
    # the mean: the exact integral of the step function between edges
    area = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))]) if len(times) else np.zeros(0)

    def integral(at):
        index = np.searchsorted(times, at, side="right") - 1
        inside = index >= 0
        value = np.zeros(len(at))
        value[inside] = area[index[inside]] + level[index[inside]] * (at[inside] - times[index[inside]])
        return value

    mean = np.diff(integral(edges)) / np.diff(edges)
    entry = np.searchsorted(times, edges[:-1], side="right") - 1
    entering = np.where(entry >= 0, level[np.maximum(entry, 0)] if len(level) else 0.0, 0.0)
    low, high = entering.copy(), entering.copy()
    inside = (times > edges[0]) & (times < edges[-1])
    bins = np.searchsorted(edges, times[inside], side="left") - 1  # a change at an edge opens the next bin
    np.minimum.at(low, bins, level[inside])
    np.maximum.at(high, bins, level[inside])
    return {"mean": mean, "min": low, "max": high}


def binned_quantiles(times: np.ndarray, values: np.ndarray, edges: np.ndarray,
                     quantiles=(0.1, 0.5, 0.9)) -> np.ndarray:
    """Quantiles of ``values`` per time bin (rows: quantiles, columns: bins; NaN for an empty bin),
    in one sort instead of a loop over bins.

    >>> binned_quantiles(np.array([0.5, 0.6, 0.7, 1.5]), np.array([1, 2, 3, 7]), np.array([0.0, 1.0, 2.0, 3.0]),
    ...                  quantiles=(0.5,))
    array([[ 2.,  7., nan]])
    """
    keep = (times >= edges[0]) & (times <= edges[-1])
    bins = np.clip(np.searchsorted(edges, times[keep], side="right") - 1, 0, len(edges) - 2)
    values = values[keep]
    if np.issubdtype(values.dtype, np.integer) and len(values) and values.min() >= 0 \
            and (int(values.max()) + 1) * len(edges) < 2**62:
        # staleness: sort one integer key (bin, value), several times faster than a lexsort
        span = int(values.max()) + 1
        ordered = (np.sort(bins * span + values) % span).astype(np.float64)
    else:
        ordered = values[np.lexsort((values, bins))].astype(np.float64)
    counts = np.bincount(bins, minlength=len(edges) - 1)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    result = np.full((len(quantiles), len(counts)), np.nan)
    filled = counts > 0
    for row, q in enumerate(quantiles):  # nearest rank below, as np.quantile(method="lower")
        result[row, filled] = ordered[first[filled] + np.floor(q * (counts[filled] - 1)).astype(np.int64)]
    return result


def plot_timeline(run_dir: str, path: str, max_time: float | None = None, max_clients: int = GANTT_MAX_CLIENTS,
                  bins: int = 400, title: str | None = None) -> str:
    """Write :func:`timeline_figure` of a run to ``path`` (PNG) and return the path.

    From the command line: ``jaxfl timeline RUN_DIR``.

    >>> # plot_timeline("runs/fedbuff-mnist10k-exp-c10-s0", "timeline.png")
    """
    return save_figure(timeline_figure(run_dir, max_time, max_clients, bins, title), path)


def timeline_figure(run_dir: str, max_time: float | None = None, max_clients: int = GANTT_MAX_CLIENTS,
                    bins: int = 400, title: str | None = None):
    """A run's schedule over virtual time, from its event log (CSV or Parquet), as a
    :class:`matplotlib.figure.Figure` (a notebook shows it inline; ``.savefig`` writes it).

    The time axis runs to ``max_time`` if given, else to the run's end: its summary's
    ``virtual_time`` (:func:`run_end`), not the last logged event — the time after it, until the
    budget ran out, counts in the figures as it does in the summary (utilisation, idle time,
    aggregations per virtual hour).

    Up to ``max_clients`` clients: a Gantt chart with one row per configured client (one that never
    trained is an empty row), each dispatch's interval from its start to its arrival, to its crash
    (marked ×) or, still in flight, to the run's end; an arrival the algorithm dropped (a round's
    deadline passed, a staleness bound) marked ○; a fault's offline or late seconds hatched
    grey; the global aggregations as vertical lines. Bars are coloured by FedCompass group / FedAT
    tier / CCFedAvg round when the log names them, with a legend up to :data:`GANTT_LEGEND_LABELS`
    labels. More clients, or more in view than a Gantt chart can show apart (over
    :data:`GANTT_MAX_AGGREGATIONS` aggregations or :data:`GANTT_MAX_DISPATCHES_PER_CLIENT` dispatches
    a client: a small federation's long run drew a wall of bars and lines; ``max_time`` zooms into
    its start): aggregated views over ``bins`` time bins — clients in flight
    (time-weighted mean per bin, with the bin's min–max; the axis runs to the peak in flight, or to
    the federation's size where the peak reaches half of it: :func:`in_flight_axis_top`),
    aggregations per bin, and the staleness of arriving updates (median and 10–90 % band).

    ``title``: what the heading calls the run (default: its algorithm), e.g. the group and seed of
    the one run a sweep's report draws for several.

    >>> # timeline_figure(result.run_dir, max_time=60)   # the last line of a notebook cell
    >>> # timeline_figure(run_dir, title="fedbuff, concurrency=100, seed 0 (1 of 2 runs)")
    """
    if max_time is not None and not (isinstance(max_time, (int, float, np.integer, np.floating))
                                     and not isinstance(max_time, bool)
                                     and 0 < max_time < float("inf")):
        raise ValueError(f"max_time={max_time!r} is not allowed: a finite number of virtual seconds > 0, or None "
                         "for the run's end")
    for name, value in (("bins", bins), ("max_clients", max_clients)):  # bins=0 failed in an IndexError
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} is not allowed: an integer >= 1")
    run_dir = os.path.expanduser(os.fspath(run_dir))
    events = read_events(run_dir)
    if not len(events["time"]):  # an axis of nothing, titled with the folder's name, said nothing
        raise ValueError(f"run_dir={run_dir!r} has an empty event log: the run wrote no event yet (it stopped "
                         "before its first, or the log was emptied); nothing to draw")
    algorithm, configured = _run_title(run_dir)
    algorithm = algorithm if title is None else title
    kinds = runlog._Kinds(events)  # each event kind's mask computed once for every panel
    clients = configured or len(np.unique(events["client"][kinds("dispatch")]))
    horizon = run_end(run_dir, events)
    if clients > max_clients or _too_dense_for_gantt(events, kinds, clients, max_time or horizon):
        return _shown_inline(_plot_aggregated(events, kinds, algorithm, clients, max_time, bins, horizon))
    return _shown_inline(_plot_gantt(events, algorithm, max_time, horizon, configured))


GANTT_MAX_AGGREGATIONS = 300  # lines in view: more, about 3 pixels apart, greyed the whole chart
GANTT_MAX_DISPATCHES_PER_CLIENT = 150  # bars a row in view: more are slivers of a few pixels


def _too_dense_for_gantt(events: dict[str, np.ndarray], kinds, clients: int, end: float) -> bool:
    """Whether the events up to ``end`` are more than a Gantt chart shows apart (see
    :func:`timeline_figure`).

    >>> events = {"time": np.arange(400.0)}
    >>> kinds = lambda kind: np.ones(400, bool) if kind == "aggregate" else np.zeros(400, bool)
    >>> _too_dense_for_gantt(events, kinds, 10, 1000.0), _too_dense_for_gantt(events, kinds, 10, 100.0)
    (True, False)
    """
    in_view = events["time"] <= end
    return int(np.count_nonzero(kinds("aggregate") & in_view)) > GANTT_MAX_AGGREGATIONS or \
        int(np.count_nonzero(kinds("dispatch") & in_view)) > GANTT_MAX_DISPATCHES_PER_CLIENT * max(clients, 1)


def _shown_inline(figure):
    """``figure``, displayable in the IPython session running this (a notebook): the library's
    figures are plain :class:`~matplotlib.figure.Figure` objects that pyplot does not manage, and
    IPython shows one as an image only once its inline backend has registered a PNG formatter for
    the class (on the first pyplot use or ``%matplotlib inline``); before that, the last line of a
    fresh notebook's cell showed the text ``<Figure size 700x450 with 1 Axes>``. The backend is left
    as it is."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    formatters = getattr(getattr(shell, "display_formatter", None), "formatters", {})
    png = formatters.get("image/png")
    if png is not None:
        from matplotlib.figure import Figure

        try:
            png.lookup_by_type(Figure)  # the inline backend's, or ours from an earlier figure
        except KeyError:
            from IPython.core.pylabtools import print_figure

            png.for_type(Figure, lambda shown: print_figure(shown, "png", bbox_inches="tight"))
    return figure


def run_end(run_dir: str, events: dict[str, np.ndarray] | None = None) -> float:
    """The virtual time a run ended at: its summary.json's ``virtual_time`` (the time budget, or
    the last event), else — a run still going, or stopped before writing its summary — the last
    time in its event log (``events``, read if not given). Never before the log's last time.

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> _ = open(f"{run_dir}/summary.json", "w").write('{"virtual_time": 30.0}')
    >>> run_end(run_dir, {"time": np.array([0.0, 11.3])})
    30.0
    """
    if events is None:
        events = read_events(run_dir)
    last = float(events["time"].max()) if len(events["time"]) else 0.0
    path = os.path.join(run_dir, "summary.json")
    if os.path.isfile(path):
        virtual_time = runlog.read_json(path).get("virtual_time")
        if isinstance(virtual_time, (int, float)) and np.isfinite(virtual_time):
            return max(float(virtual_time), last)
    return last


GANTT_LEGEND_LABELS = 12  # more group / tier / round labels than this: no legend (the colours repeat past 20)
_FAULT_WORDS = ("crash", "delay", "dropout")


def _colour_key(label) -> str:
    """A dispatch's label without its fault's word (``"group 2; dropout"`` → ``"group 2"``): the
    hatch and the crash marker show the fault, the colour the group, tier or round."""
    parts = [part for part in (label or "").split("; ") if part not in _FAULT_WORDS]
    return "; ".join(parts)


def _natural_key(label: str):
    """Sorts ``"group 2"`` before ``"group 10"``: digit runs compare as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", label) if part]


def _plot_gantt(events: dict[str, np.ndarray], algorithm: str, max_time: float | None, horizon: float,
                configured: int | None = None):
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    end = max_time if max_time is not None else horizon
    if not end > 0:
        end = 1.0  # an empty log: an axis of one second
    # every dispatch: arrived, crashed (ending at the crash) or still in flight (ending at the run's end)
    spans = runlog.dispatch_intervals(events, horizon=min(end, horizon) if horizon > 0 else end)
    client, start, stop = spans["client"], spans["start"], spans["end"]
    crashed, offline = spans["crashed"], spans["offline"]
    keys = np.array([_colour_key(label) for label in spans["label"]], object)
    aggregations = events["time"][events["event"] == "aggregate"]
    palette = matplotlib.colormaps["tab20"]
    colours = {label: palette(i % 20) for i, label in enumerate(sorted(set(keys.tolist()), key=_natural_key))}
    # the legend names what has a bar: a group dispatched at the run's last instant draws none
    labels = sorted(set(keys[(start < end) & (stop > start)].tolist()), key=_natural_key)
    dispatched = set(np.unique(client).tolist())
    clients = sorted(set(range(int(configured))) | dispatched) if configured else sorted(dispatched)
    rows = {c: row for row, c in enumerate(clients)}
    figure = Figure(figsize=(10 + (2.5 if 1 < len(labels) <= GANTT_LEGEND_LABELS else 1.5),
                             0.35 * max(len(clients), 4) + 1.8))
    axes = figure.subplots()
    shown = start < end
    for c in clients:
        mine = np.flatnonzero(shown & (client == c))
        if len(mine):
            axes.broken_barh(list(zip(start[mine].tolist(), (stop[mine] - start[mine]).tolist())),
                             (rows[c] - 0.4, 0.8), facecolors=[colours[keys[i]] for i in mine],
                             edgecolor="white", linewidth=0.3)
    faulty = np.flatnonzero(shown & (offline > 0))
    for i in faulty:  # a fault's offline or late seconds: sent, not training (up to the dispatch's end)
        seconds = min(float(offline[i]), float(stop[i] - start[i]))
        axes.broken_barh([(float(start[i]), seconds)], (rows[int(client[i])] - 0.4, 0.8), facecolors="0.85",
                         edgecolor="0.5", hatch="///", linewidth=0.3)
    crashes = np.flatnonzero(crashed & (stop <= end))
    if len(crashes):
        axes.plot(stop[crashes], [rows[int(c)] for c in client[crashes]], linestyle="none", marker="x",
                  color="red", markersize=6, markeredgewidth=1.5, zorder=3)
    # arrivals the algorithm dropped (work done and not aggregated): drawn as used work was, unmarked
    dropping = (events["event"] == "drop") & (events["time"] <= end) & (events["client"] >= 0)
    drops_at, drops_of = events["time"][dropping], events["client"][dropping]
    if len(drops_at):
        axes.plot(drops_at, [rows[int(c)] for c in drops_of], linestyle="none", marker="o", markerfacecolor="none",
                  color="darkorange", markersize=6, markeredgewidth=1.5, zorder=3)
    if end > horizon > 0:  # a max_time past the run's end: the white after it is no idle client
        axes.axvline(horizon, color="grey", linestyle=":", linewidth=1)
        axes.text(horizon, 1.0, " run's end", transform=axes.get_xaxis_transform(), fontsize=8, color="grey",
                  va="bottom")
    for time in aggregations[aggregations <= end]:
        axes.axvline(time, color="black", linewidth=0.5, alpha=0.4)
    axes.set_yticks(range(len(clients)), [f"client {c}" for c in clients])
    axes.set_xlim(0, end)
    in_flight = bool(np.any(~spans["arrived"] & ~crashed & shown & (stop > start)))  # a bar, not a dispatch at the end
    notes = ["white = idle", "lines = global aggregations"]
    if in_flight:
        notes.append("a bar to the run's end = still in flight")
    if len(labels) > GANTT_LEGEND_LABELS:
        notes.append(f"{len(labels)} labels: no legend" + (", colours repeat every 20" if len(labels) > 20 else ""))
    # the notes on lines of their own: one long line ran off both sides of the figure
    axes.set_xlabel("virtual time (s)\n" + textwrap.fill("; ".join(notes), width=110))
    handles = []
    if len(labels) <= GANTT_LEGEND_LABELS:
        handles += [Patch(facecolor=colours[label], label=label or "training") for label in labels]
    if len(faulty):
        handles.append(Patch(facecolor="0.85", edgecolor="0.5", hatch="///",
                             label="dropout / delay: offline or late s"))
    if len(crashes):
        handles.append(Line2D([], [], linestyle="none", marker="x", color="red", markeredgewidth=1.5,
                              label="crashed (client stops)"))
    if len(drops_at):
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", color="darkorange",
                              markeredgewidth=1.5, label="dropped (not aggregated)"))
    handles.append(Line2D([], [], color="black", linewidth=0.5, alpha=0.6, label="global aggregation"))
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    axes.set_title(f"{algorithm}: client activity")
    figure.tight_layout()
    return figure


# Up to this fraction of the federation in flight at the peak, the clients-in-flight axis runs to the
# peak; from it on, to the whole federation (a synchronous round or a concurrency near the federation's
# size reads against all clients).
FULL_AXIS_FRACTION = 0.5


def in_flight_axis_top(peak: int, clients: int) -> float:
    """The top of the timeline's clients-in-flight axis: 5 % above the federation's size where the peak
    in flight reaches :data:`FULL_AXIS_FRACTION` of it, else 10 % above the peak. At 10^5–10^6 clients
    with a concurrency of 1,000, an axis to the federation's size draws the count as a flat line at 0
    (0.1 % of the axis); the title and axis label name the federation's size instead.

    >>> in_flight_axis_top(100, 100), in_flight_axis_top(1_000, 1_000_000), in_flight_axis_top(0, 500)
    (105.0, 1100.0, 1.1)
    """
    if peak >= FULL_AXIS_FRACTION * clients:
        return clients * 105 / 100
    return max(peak, 1) * 11 / 10


def _plot_aggregated(events: dict[str, np.ndarray], kinds, algorithm: str, clients: int,
                     max_time: float | None, bins: int, horizon: float | None = None):
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    time = events["time"]
    if horizon is None:
        horizon = float(time.max()) if len(time) else 0.0
    # the run's end (summary.json's virtual_time), not its last event: the idle time after it counts
    end = max_time if max_time is not None else max(horizon, 1e-9)
    edges = np.linspace(0.0, end, bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    width = edges[1] - edges[0]
    profile = busy_profile(events, edges, _kinds=kinds, horizon=horizon if horizon > 0 else None)
    aggregations = np.histogram(time[kinds("aggregate")], edges)[0]
    arrivals = kinds("arrival") & (events["staleness"] >= 0)
    low, median, high = binned_quantiles(time[arrivals], events["staleness"][arrivals], edges)
    # past the run's end (a --max-time beyond it) nothing happened: the figures count up to the end
    stats = runlog.timeline_stats(events, num_clients=clients, horizon=min(end, horizon) if horizon > 0 else end,
                                  _kinds=kinds)

    figure = Figure(figsize=(10, 8))
    busy, rate, stale = figure.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.2, 2]})
    busy.fill_between(centres, profile["min"], profile["max"], step="mid", alpha=0.25, color="tab:blue",
                      linewidth=0, label="min–max in bin")
    busy.plot(centres, profile["mean"], drawstyle="steps-mid", color="tab:blue", linewidth=1,
              label="time-weighted mean in bin")
    peak = int(profile["max"].max()) if len(profile["max"]) else 0
    top = in_flight_axis_top(peak, clients)
    if top > clients:  # the federation's size is in view: drawn as a line, as for a small federation
        busy.axhline(clients, color="grey", linestyle="--", linewidth=1,
                     label=f"all {clients:,} clients" if clients != 1 else "the one client")
    if end > horizon > 0:  # a --max-time past the run's end (runs side by side on one axis)
        for axes in (busy, rate, stale):
            axes.axvline(horizon, color="grey", linestyle=":", linewidth=1)
        busy.text(horizon, 0.5, " run's end", transform=busy.get_xaxis_transform(), fontsize=8, color="grey")
    busy.set_ylabel(f"clients in flight\n(of {clients:,})")
    busy.set_ylim(0, top)
    busy.legend(loc="best", fontsize=8)  # lower right covered the in-flight sawtooth of a synchronous run
    utilisation = stats["utilisation_mean"]
    busy.set_title(f"{algorithm}: {clients:,} client{'s' * (clients != 1)}, at most {peak:,} in flight "
                   f"({100 * peak / clients:.3g}%)\n"
                   f"mean training utilisation "
                   f"{'n/a' if utilisation is None else f'{utilisation:.1%}'}, "
                   f"{round(stats['idle_client_s_total'], 3):.3g} idle client-s, "  # as summary.json rounds it
                   f"{stats['aggregations']:,} aggregations"
                   + (f" ({stats['aggregations_per_hour']:.3g}/virtual h)" if stats["aggregations_per_hour"] else ""))
    rate.bar(centres, aggregations, width=width, color="black", alpha=0.6)
    rate.set_ylabel(f"aggregations\nper {width:.3g} s")
    stale.fill_between(centres, low, high, step="mid", alpha=0.3, color="tab:orange", linewidth=0,
                       label="10–90 % of arrivals")
    stale.plot(centres, median, drawstyle="steps-mid", color="tab:orange", linewidth=1, label="median")
    stale.set_ylabel("staleness at arrival\n(global updates)")
    # all zero (a synchronous run) spanned -0.04 to 0.04: no staleness is negative, and none is fractional
    stale.set_ylim(0, max(1.0, stale.get_ylim()[1]))
    stale.yaxis.set_major_locator(MaxNLocator(integer=True))
    stale.legend(loc="upper left", fontsize=8)
    stale.set_xlim(0, end)
    stale.set_xlabel(f"virtual time (s), in {bins} bins of {width:.3g} s")
    figure.tight_layout()
    return figure
