"""One cell of a parallel sweep (``jaxfl sweep --jobs N``, :func:`jaxfl.sweep.run_sweep`) in a process
of its own, pinned to its share of the cores before jax starts its backend:

    python -m jaxfl._sweep_worker CORES STATE RUN_DIR CONFIG_JSON [SPEEDS_NPY]

``CORES``: comma-separated core numbers (empty: leave the affinity alone); ``STATE``: the cell's
:func:`~jaxfl.sweep.cell_state` (``new``, ``restart`` or ``resumable``, as
:func:`~jaxfl.sweep.run_cell` takes it); ``CONFIG_JSON``: the cell's config (``RunConfig.to_dict()``);
``SPEEDS_NPY``: the sweep's given seconds per step (``time_per_step``), where it has some.
Exit status 0 when the run ended (a numerical error too: its ``summary.json`` says so), 130 when
interrupted, 143 when stopped by SIGTERM (at an event boundary, with a checkpoint there), 2 on a
bad setting or resource (one line, as ``jaxfl run`` gives it), 1 on any other error (its traceback).
A line starting with :data:`NOTE` on stdout is for the sweep to repeat (a checkpoint that did not
read back, so the cell started again), and so is one starting with :data:`RELAYED_WARNING` (a
:class:`jaxfl.resume.ResumeWarning`: a checkpoint skipped, other devices or ``XLA_FLAGS`` than the run's). The environment variable :data:`SWEEP_PID` names the sweep's
process: a worker that finds another parent (its sweep died as it started) ends at once.
"""
from __future__ import annotations

import json
import os
import signal
import sys

NOTE = "jaxfl-sweep-note: "
RELAYED_WARNING = "jaxfl-sweep-warning: "  # a note of the cell's run, for the sweep to repeat (this output is a log)
SWEEP_PID = "JAXFL_SWEEP_PID"


def main(argv: list[str]) -> int:
    """Run (or resume) the cell; returns the exit status (see the module docstring)."""
    cores, state, run_dir, config_json, *speeds_file = argv
    interrupted = []

    def on_sigint(signum, frame):
        # Python's own handler raises KeyboardInterrupt wherever the main thread is; where that is a
        # garbage collector's callback (jax's, as jax imports), Python prints "Exception ignored" and
        # goes on, and a worker whose sweep had died went on to train its cell to the end, unwatched
        interrupted.append(signum)
        raise KeyboardInterrupt

    # The sweep stops its workers with SIGINT (and Linux sends one when the sweep dies): a sweep
    # started as a shell script's background job has SIGINT ignored, and would hand that on.
    signal.signal(signal.SIGINT, on_sigint)
    try:
        if _end_with_the_sweep():
            return 130
        if cores and hasattr(os, "sched_setaffinity"):  # before any jax computation starts XLA's threads
            os.sched_setaffinity(0, {int(core) for core in cores.split(",")})
        import warnings

        from jaxfl import stopping
        from jaxfl.config import ConfigError, config_from_mapping
        from jaxfl.execution import ResourceError
        from jaxfl.sweep import run_cell

        if interrupted:  # one lost in a gc callback as jax imported: nothing started
            return 130
        # from here on the command's handler, which also keeps a stop request where its interrupt is lost
        # the same way (the run stops at its next event, with a checkpoint), and which a save defers
        signal.signal(signal.SIGINT, stopping._on_sigint)
    except KeyboardInterrupt:
        return 130

    shown = warnings.showwarning

    def relayed(message, category, *where, **options):  # to the sweep as well as to this cell's log
        # a run's notes (a resume's, the data's, the settings'), as a sweep of --jobs 1 says them: the sweep's
        # own check of the cells had them muted, and they stayed in each cell's log
        if issubclass(category, UserWarning):  # (ResumeWarning among them)
            print(f"{RELAYED_WARNING}{' '.join(str(message).split())}", flush=True)
        # a message's later lines indented: none of them reads as one of the lines above to the sweep
        shown(str(message).replace("\n", "\n    "), category, *where, **options)

    try:
        warnings.showwarning = relayed
        speeds = None
        if speeds_file:
            import numpy as np

            speeds = np.load(speeds_file[0], allow_pickle=False)
        with stopping.stop_on_sigterm():  # the sweep asks its workers to stop with SIGTERM
            run_cell(config_from_mapping(json.loads(config_json)), run_dir, state,
                     lambda line: print(f"{NOTE}{line}", flush=True), speeds)
    except KeyboardInterrupt as interrupt:
        return stopping.SIGTERM_STATUS if getattr(interrupt, "reason", None) == "SIGTERM" else 130
    except (ConfigError, ValueError, FileNotFoundError, ImportError, ResourceError) as error:  # as jaxfl run says it
        print(f"jaxfl: error: {error}", file=sys.stderr)
        return 2
    return 0


def _end_with_the_sweep() -> bool:
    """Ask Linux for a SIGINT when the sweep's process ends, even killed with SIGKILL, so that no cell
    goes on writing its run folder unwatched (a later sweep would start it a second time); True if
    the sweep has ended already. Elsewhere (a Mac) the worker watches its standard input instead, a
    pipe from the sweep that ends with the sweep's process, and its parent (:func:`_watch_the_sweep`)."""
    if not sys.platform.startswith("linux"):
        return _watch_the_sweep()
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGINT))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return _watch_the_sweep()
    return _adopted()


def _adopted() -> bool:
    """Whether the sweep that started this worker has died: the worker has another parent now. Not only
    init: the nearest "subreaper" above it where there is one (systemd --user in a desktop session, a
    process manager's supervisor)."""
    sweep = os.environ.get(SWEEP_PID, "")
    return os.getppid() != int(sweep) if sweep.isdigit() else os.getppid() == 1


def _watch_the_sweep() -> bool:
    """Where Linux's parent-death signal is missing: a thread watches the worker's standard input, a
    pipe the sweep holds open and never writes, and its parent process, and sends this process a SIGINT
    when the pipe ends (the sweep's process ended, even killed: its end of the pipe closed with it) or
    the worker has another parent (the sweep gone while a process it started holds the pipe open). True
    if the sweep has ended already."""
    if _adopted():
        return True
    if not os.environ.get(SWEEP_PID):  # not started by a sweep: nothing to watch
        return False
    import threading
    import time

    ended = []

    def read_to_the_end() -> None:
        try:
            while sys.stdin.buffer.read(65536):
                pass
        except (OSError, ValueError, AttributeError):  # no standard input to read: the parent alone tells
            return
        ended.append(True)

    def watch() -> None:
        reading = threading.Thread(target=read_to_the_end, name="jaxfl-sweep-pipe", daemon=True)
        if sys.stdin is not None and not sys.stdin.isatty():
            reading.start()
        while not ended and not _adopted():
            reading.join(0.5) if reading.is_alive() else time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, name="jaxfl-sweep-watch", daemon=True).start()
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
