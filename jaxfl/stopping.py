"""Stopping a run between two events, with a checkpoint there: what a cluster's time limit asks for.

SLURM at a job's time limit, Kubernetes, ``timeout`` and a plain ``kill`` send SIGTERM, then SIGKILL
a while later (SLURM's ``KillWait``, 30 s by default). ``jaxfl run`` and ``jaxfl sweep`` take SIGTERM
as a request (:func:`stop_on_sigterm`): the run in progress stops at the next event boundary, writes
a checkpoint there, and the command ends with one line saying how to resume and status 143 (a
shell's status for a command ended by SIGTERM). Nothing trained before the signal is lost, and
``jaxfl run --resume RUN_DIR`` (or the same ``jaxfl sweep`` command) goes on bit-identically. A
signal that comes after the run's last event lets it finish (its final checkpoint and summary, a
matter of seconds): the run is whole, and a next run of the same process (a comparison's, a sweep's
next cell) stops at its first event instead.

A timing-only run stops at an event boundary too, its event log closed there (it keeps no
checkpoint). Where no run can stop at an event boundary (loading data, between the cells of a sweep,
a run over several processes, which would have to agree on the event), SIGTERM ends the process at
once, as it would without jaxfl's handler: nothing is lost there that a resume needs.

Code that calls :func:`jaxfl.run_experiment` itself can ask for the same stop with
:func:`request_stop` (from a logger, another thread or its own signal handler).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

__all__ = ["StopRequested", "request_stop", "stop_on_sigterm", "stop_requested", "take_stop_request"]

SIGTERM_STATUS = 128 + signal.SIGTERM  # 143: a shell's status for a command ended by SIGTERM


class StopRequested(KeyboardInterrupt):
    """A stop asked for by :func:`request_stop` (or SIGTERM under :func:`stop_on_sigterm`) that
    ended something other than a single run (a parallel sweep); ``reason`` says who asked.

    >>> str(StopRequested("SIGTERM"))
    'stopped by SIGTERM'
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"stopped by {self.reason}"


class _State:
    requested: str | None = None  # why a stop was asked for, until the stop is done
    accepting = 0  # loops of this process that check for a request between their steps
    last_words = None  # () -> str | None: what SIGTERM leaves behind where it ends the process at once
    scratch: tuple = ()  # folders a process ended at once by SIGTERM removes first (removed_on_sigterm)


_state = _State()
_lock = threading.Lock()


def request_stop(reason: str = "request_stop()") -> None:
    """Ask the run in progress in this process (:func:`jaxfl.run_experiment`, a sweep's cell) to stop
    at its next event boundary: it writes a checkpoint there (unless the run keeps none) and raises
    :class:`jaxfl.experiment.RunInterrupted`, whose ``reason`` is ``reason`` and which
    :func:`jaxfl.resume_experiment` goes on from. A request made while no run is in progress is kept
    for the next one, which then stops at its first event.

    >>> request_stop("my time limit"); stop_requested()
    'my time limit'
    >>> take_stop_request(), stop_requested()
    ('my time limit', None)
    """
    with _lock:
        _state.requested = reason


def stop_requested() -> str | None:
    """The reason of the stop asked for and not yet done, or None."""
    return _state.requested


def take_stop_request() -> str | None:
    """The reason of the stop asked for, forgotten as it is taken (the loop that takes it does the
    stop; the next run starts afresh), or None."""
    with _lock:
        reason, _state.requested = _state.requested, None
    return reason


@contextlib.contextmanager
def accepting_stop_requests():
    """Inside it a loop checks :func:`stop_requested` between its steps, so SIGTERM under
    :func:`stop_on_sigterm` becomes a request instead of ending the process at once."""
    with _lock:
        _state.accepting += 1
    try:
        yield
    finally:
        with _lock:
            _state.accepting -= 1


def _on_sigterm(signum, frame) -> None:
    if _state.accepting:
        request_stop("SIGTERM")  # a second SIGTERM (a whole job's processes, then the sweep's forward) asks again
        return
    # no loop would see the request: end the process as SIGTERM's default action does, saying
    # first what it leaves (a run folder without its first event), as an interrupt would
    said = None
    try:
        said = _state.last_words() if _state.last_words is not None else None
    except Exception:  # noqa: BLE001 - the process ends regardless
        pass
    if said:
        sys.stderr.write(f"jaxfl: stopped by SIGTERM: {said}\n")
        sys.stderr.flush()
    remove_scratch()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def removed_on_sigterm(folder: str):
    """Inside it, SIGTERM that ends the process at once (no ``finally`` runs then) first removes
    ``folder``: a cluster process's scratch folder, which a time-limited job would leave in /tmp.

    >>> with removed_on_sigterm("/tmp/jaxfl-process1-x"):
    ...     _state.scratch
    ('/tmp/jaxfl-process1-x',)
    """
    _state.scratch = _state.scratch + (folder,)
    try:
        yield
    finally:
        _state.scratch = tuple(item for item in _state.scratch if item != folder)


def remove_scratch() -> None:
    """Remove the folders :func:`removed_on_sigterm` holds (a process about to end without its ``finally``)."""
    import shutil

    for folder in _state.scratch:
        shutil.rmtree(folder, ignore_errors=True)


def _on_sigint(signum, frame) -> None:
    # Python's own handler raises KeyboardInterrupt wherever the main thread is; where that is a
    # garbage collector's callback (jax's, during compilation), Python prints "Exception ignored"
    # and goes on, and the Ctrl-C was lost (the run went on to its end, status 0). The request kept
    # here stops the run at its next event boundary, or the next run at its first, in that case;
    # the command clears it where the KeyboardInterrupt did end it.
    request_stop("SIGINT")
    raise KeyboardInterrupt


@contextlib.contextmanager
def said_on_sigterm(last_words):
    """Inside it, SIGTERM under :func:`stop_on_sigterm` that ends the process at once (no run
    accepting a stop yet) first writes ``jaxfl: stopped by SIGTERM: <last_words()>`` to stderr,
    when ``last_words()`` returns a text (what a run folder made so far keeps), followed by the words
    of an enclosing ``said_on_sigterm`` (a sweep around its cell's run).

    >>> with said_on_sigterm(lambda: "runs/x has no checkpoint yet"):
    ...     _state.last_words()
    'runs/x has no checkpoint yet'
    """
    previous = _state.last_words

    def said() -> str | None:  # a run's words, then the command's around it (a sweep's: how the sweep goes on)
        return "; ".join(words for words in (last_words(), previous() if previous else None) if words) or None

    _state.last_words = said
    try:
        yield
    finally:
        _state.last_words = previous


@contextlib.contextmanager
def stop_on_sigterm():
    """Inside it, SIGTERM stops the run in progress at its next event boundary with a checkpoint
    (:func:`request_stop`); where no run is in progress, SIGTERM ends the process at once. The
    handler before it comes back at the end. Only the main thread can install a handler: elsewhere
    it changes nothing.

    >>> with stop_on_sigterm():
    ...     signal.getsignal(signal.SIGTERM) is _on_sigterm
    True
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    # SIGINT too, where it is Python's own (not where a caller or the shell set another handler,
    # or ignores it, as a shell does for a command started with & in a script)
    previous_sigint = signal.getsignal(signal.SIGINT)
    own_sigint = previous_sigint is signal.default_int_handler
    if own_sigint:
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if own_sigint:
            signal.signal(signal.SIGINT, previous_sigint)
        if _state.requested == "SIGINT":  # the KeyboardInterrupt ended what it interrupted: nothing to keep
            take_stop_request()
