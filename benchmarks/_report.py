"""What every benchmark's JSON starts with, and how it is written (imported by the scripts beside it).

    from _report import run_header, write_json
    header = run_header("million_clients", quick=args.quick)
    write_json("out.json", {**header, "rows": rows})
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys

import jax


def run_header(benchmark: str, **extra) -> dict:
    """The benchmark's name, its command, the UTC date, the machine, the jax backend and device, and ``extra``."""
    device = jax.devices()[0]
    return {"benchmark": benchmark, "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.node(), "processor": platform.processor(), "cores": os.cpu_count(),
            "backend": jax.default_backend(), "device": device.device_kind, "devices": jax.device_count(),
            "jax": jax.__version__, **extra}


def write_json(path: str | None, payload: dict, indent: int = 2) -> None:
    """Write ``payload`` to ``path`` (nothing when None) through a temporary file renamed over it, so
    that a run cut short by a time limit leaves the last whole file, never half of one."""
    if not path:
        return
    with open(path + ".tmp", "w") as handle:
        json.dump(payload, handle, indent=indent)
    os.replace(path + ".tmp", path)


def outside_training_share(summary: dict) -> float | None:
    """A run's wall time outside training calls (to their results), compiling and evaluating (the
    scheduler, the aggregations, writing the logs, setting the run up), over its wall time less
    compiling and evaluating; None where the summary lacks the figures."""
    train, compile_s = summary.get("training_wall_s"), summary.get("compile_wall_s") or 0.0
    rest = summary["wall_time_s"] - compile_s - summary["evaluation_wall_s"]
    return round(1 - train / rest, 3) if train is not None and rest > 0 else None
