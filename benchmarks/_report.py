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
