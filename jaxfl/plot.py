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
