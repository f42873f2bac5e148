"""The ``jaxfl`` command's first seconds: importing jax and jaxfl takes seconds (more on a loaded
machine), and a Ctrl-C then printed an import traceback of a dozen frames where the command promises
one line and status 130. Installed by ``jaxfl/__init__`` before its imports, only in the ``jaxfl``
command (a notebook or script importing jaxfl keeps Python's KeyboardInterrupt), and handed back to
Python's handler when :func:`jaxfl.cli.main` starts, which says what a Ctrl-C kept from there on."""
from __future__ import annotations

import os
import signal
import sys
import threading

INTERRUPTED_STATUS = 130  # a shell's status for a command ended by SIGINT
_previous = None
_interrupted = False  # a Ctrl-C came while the command started


def quiet_interrupts_while_starting() -> None:
    """In the ``jaxfl`` console command: a Ctrl-C before :func:`started` is one line and status 130."""
    global _previous
    command = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    # `python -m jaxfl`: argv[0] is "-m" while the package imports
    if command == "-m" and getattr(sys, "orig_argv", [])[1:3] == ["-m", "jaxfl"]:
        command = "jaxfl"
    if command != "jaxfl" or threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return

    def interrupted(signum, frame):
        global _interrupted
        _interrupted = True
        sys.stderr.write("jaxfl: interrupted while starting: nothing written\n")
        raise SystemExit(INTERRUPTED_STATUS)

    _previous = signal.signal(signal.SIGINT, interrupted)
    sys.unraisablehook = _quiet_lost_exit


def _quiet_lost_exit(unraisable) -> None:
    """Python's report of an exception it cannot raise (one in a garbage collector's callback), less the
    exit of a Ctrl-C while the command starts: its line is said, and :func:`started` ends the command."""
    if _interrupted and isinstance(unraisable.exc_value, SystemExit) and \
            unraisable.exc_value.code == INTERRUPTED_STATUS:
        return
    sys.__unraisablehook__(unraisable)


def started() -> None:
    """Python's own SIGINT handler again (the command's Ctrl-C handling takes over); the command ends
    here, status 130, where a Ctrl-C came while it started and its exit was lost: raised in a garbage
    collector's callback (jax's, as jax imports), which Python would report as "Exception ignored"
    (muted until here: the command's line says it) and goes on from."""
    global _previous
    if _previous is not None:
        signal.signal(signal.SIGINT, _previous)
        _previous = None
    if sys.unraisablehook is _quiet_lost_exit:
        sys.unraisablehook = sys.__unraisablehook__
    if _interrupted:  # its line said already
        raise SystemExit(INTERRUPTED_STATUS)
