"""What every benchmark's JSON starts with, and how it is written (imported by the scripts beside it).

    from _report import run_header, write_json
    header = run_header("million_clients", quick=args.quick)
    write_json("out.json", {**header, "rows": rows})

Bad input is refused before any work, by ``parser.error`` naming the flag, its value and what is
allowed (exit status 2): ``check_at_least`` for counts, ``check_data_dir`` for a folder of IDX
files, ``validated`` for a jaxfl config built from the flags.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys

# Each run of a benchmark compiles its programs as a first run does: a run from Python reads back what
# an earlier run of the process compiled (jaxfl.compilation_cache.process_compilations), which would
# make a script's later sides and repeats compile less than its first and their compile figures
# incomparable with each other and with the earlier figures. A cache configured for jax
# (JAX_COMPILATION_CACHE_DIR, as the test suite sets it) is still used as it is.
os.environ.setdefault("JAXFL_COMPILATION_CACHE", "off")


def run_header(benchmark: str, **extra) -> dict:
    """The benchmark's name, its command, the UTC date, the machine, the jax backend and device, and ``extra``."""
    import jax  # here, not above: a script may set jax's flags after importing this module

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


def check_at_least(parser, args, minimums: dict) -> None:
    """``parser.error`` for the first of ``minimums`` (an argument's dest: its least allowed value)
    whose value, or one of whose values (a list), is below it; an unset value (None) passes."""
    for dest, minimum in minimums.items():
        value = getattr(args, dest)
        if value is None:
            continue
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if any(item < minimum for item in values):
            flag = "--" + dest.replace("_", "-")
            each = "each value " if isinstance(value, (list, tuple)) else ""
            parser.error(f"{flag} {' '.join(f'{item:g}' if isinstance(item, float) else str(item) for item in values)}"
                         f" is not allowed: {each}at least {minimum:g}")


def check_above(parser, args, bounds: dict) -> None:
    """``parser.error`` for the first of ``bounds`` (dest: the value it must exceed) that does not
    exceed it; an unset value (None) passes."""
    for dest, bound in bounds.items():
        value = getattr(args, dest)
        if value is not None and not value > bound:
            parser.error(f"--{dest.replace('_', '-')} {value:g} is not allowed: more than {bound:g}")


IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def check_data_dir(parser, flag: str, folder: str) -> None:
    """``parser.error`` unless ``folder`` is a folder holding the four (Fashion-)MNIST IDX files
    (``.gz`` or not)."""
    if not os.path.isdir(folder):
        parser.error(f"{flag} {folder} is not allowed: {'a file' if os.path.exists(folder) else 'no such folder'}; "
                     f"a folder holding the Fashion-MNIST IDX files ({IDX_STEMS[0]}[.gz] and the other three)")
    missing = [stem for stem in IDX_STEMS
               if not any(os.path.isfile(os.path.join(folder, stem + end)) for end in (".gz", ""))]
    if missing:
        parser.error(f"{flag} {folder} is not allowed: it lacks {', '.join(stem + '[.gz]' for stem in missing)}; "
                     f"a folder holding the four Fashion-MNIST IDX files")


def validated(parser, config, flags: dict | None = None):
    """``jaxfl.config.validate(config)``, or ``parser.error`` with its ConfigError, led by the flag
    that sets the field it names (``flags``: config field -> flag) where there is one."""
    from jaxfl.config import ConfigError, validate

    try:
        return validate(config)
    except ConfigError as error:
        message = str(error)
        field = message.split("=", 1)[0].split()[-1] if "=" in message.split(" ", 1)[0] else None
        flag = (flags or {}).get(field)
        parser.error(f"{flag}: {message}" if flag else message)
