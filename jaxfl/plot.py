"""Plots of finished runs (matplotlib, an optional dependency: ``pip install jaxfl[plot]``).

>>> # plot_accuracy(["runs/fedavg-...", "runs/fedbuff-..."], "accuracy.png")
"""
from __future__ import annotations

import csv
import json
import os


def read_metrics(run_dir: str) -> list[dict]:
    """The rows of a run's ``metrics.csv`` with numbers parsed."""
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as handle:
        return [{key: float(value) for key, value in row.items()} for row in csv.DictReader(handle)]


def plot_accuracy(run_dirs: list[str], path: str) -> str:
    """Held-out accuracy against virtual time, one line per run, with the target as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    target = None
    for run_dir in run_dirs:
        rows = read_metrics(run_dir)
        with open(os.path.join(run_dir, "summary.json")) as handle:
            summary = json.load(handle)
        target = summary["target_accuracy"]
        # the global model is constant between versions: draw steps, not interpolation
        axes.plot([r["time"] for r in rows], [r["accuracy"] for r in rows], drawstyle="steps-post",
                  label=summary["algorithm"])
    if target is not None:
        axes.axhline(target, linestyle="--", color="grey", linewidth=1, label=f"target {target:.0%}")
    axes.set_xlabel("virtual time (s)")
    axes.set_ylabel("held-out accuracy")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path + ".tmp.png", dpi=120)
    plt.close(figure)
    os.replace(path + ".tmp.png", path)
    return path


def read_events(run_dir: str) -> list[dict]:
    """The rows of a run's ``events.csv`` (strings, as written)."""
    with open(os.path.join(run_dir, "events.csv"), newline="") as handle:
        return list(csv.DictReader(handle))


def busy_intervals(events: list[dict]) -> dict[int, list[tuple[float, float, str]]]:
    """Per client: (start, end, label) of every dispatch that arrived, from an event log.

    The label is the dispatch's ``detail`` (FedCompass group, FedAT tier) or empty. Dispatches
    still in flight at the end of the run are left out.

    >>> busy_intervals([{"event": "dispatch", "dispatch": "0", "client": "2", "time": "0.0", "detail": ""},
    ...                 {"event": "arrival", "dispatch": "0", "client": "2", "time": "1.5", "detail": ""}])
    {2: [(0.0, 1.5, '')]}
    """
    starts: dict[str, tuple[float, str]] = {}
    intervals: dict[int, list[tuple[float, float, str]]] = {}
    for row in events:
        if row["event"] == "dispatch":
            starts[row["dispatch"]] = (float(row["time"]), row.get("detail") or "")
        elif row["event"] == "arrival" and row["dispatch"] in starts:
            start, label = starts.pop(row["dispatch"])
            intervals.setdefault(int(row["client"]), []).append((start, float(row["time"]), label))
    return intervals


def plot_timeline(run_dir: str, path: str, max_time: float | None = None) -> str:
    """Gantt chart of a run: each client's busy (training) intervals over virtual time, idle gaps
    between them, and the global aggregations as vertical lines. Bars are coloured by FedCompass
    group / FedAT tier when the log names them.

    From the command line: ``jaxfl timeline RUN_DIR``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = read_events(run_dir)
    intervals = busy_intervals(events)
    aggregations = [float(r["time"]) for r in events if r["event"] == "aggregate"]
    end = max_time if max_time is not None else max([b for spans in intervals.values() for _, b, _ in spans]
                                                       + aggregations + [1.0])
    labels = sorted({label for spans in intervals.values() for _, _, label in spans})
    palette = plt.get_cmap("tab20")
    colours = {label: palette(i % 20) for i, label in enumerate(labels)}
    clients = sorted(intervals)
    figure, axes = plt.subplots(figsize=(10, 0.35 * max(len(clients), 4) + 1.5))
    for row, client in enumerate(clients):
        spans = [(a, b - a, label) for a, b, label in intervals[client] if a < end]
        axes.broken_barh([(a, width) for a, width, _ in spans], (row - 0.4, 0.8),
                         facecolors=[colours[label] for _, _, label in spans], edgecolor="white", linewidth=0.3)
    for time in aggregations:
        if time <= end:
            axes.axvline(time, color="black", linewidth=0.5, alpha=0.4)
    axes.set_yticks(range(len(clients)), [f"client {c}" for c in clients])
    axes.set_xlim(0, end)
    axes.set_xlabel("virtual time (s); white = idle, lines = global aggregations")
    with open(os.path.join(run_dir, "summary.json")) as handle:
        axes.set_title(f"{json.load(handle)['algorithm']}: client activity")
    figure.tight_layout()
    figure.savefig(path + ".tmp.png", dpi=120)
    plt.close(figure)
    os.replace(path + ".tmp.png", path)
    return path
