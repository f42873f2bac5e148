"""Runs over several processes (hosts): ``jax.distributed`` with one scheduler per process.

Every process runs the same deterministic scheduler on the same config and seed, so all of them
make the same decisions without exchanging any, but whether to stop after an evaluation: process
0's loggers and accuracy decide that, and :func:`broadcast_text` hands the decision to the others
(:mod:`jaxfl.experiment`). The engine's training calls span every process's
devices (one global ``Mesh``), each process contributing its devices' clients, and each gathers
the trained updates back to keep the same global model. Process 0 writes the run directory; the
others write nothing that stays (their logs go to a scratch folder), except their part of each
checkpoint: every process takes part in orbax's save of the device state into process 0's run
directory, which must therefore be on a filesystem every host sees at the same ``output_dir``
(:mod:`jaxfl.checkpoint`). Process 0 alone writes the scheduler's pickled state, the same on every
process. Such a run resumes with the same command plus ``--resume RUN_DIR``: every process
restores the same checkpoint, process 0's newest one that reads back on all of them
(:func:`jaxfl.resume.load_checkpoint`), and the run goes on as if never stopped. (A checkpoint
reads back whatever number of processes wrote it: one process can resume a cluster run too.)

Start one process per host (or several on one machine) with the same command plus::

    jaxfl run ... --coordinator-address HOST:PORT --num-processes N --process-id I

or, from Python, call :func:`init_cluster` before anything else uses jax. With no arguments,
``jax.distributed.initialize`` reads SLURM's (and other cluster managers') environment, so under
``srun`` the flags are not needed. On CPUs the processes exchange updates with gloo.

Joining waits at most ``JAXFL_CLUSTER_TIMEOUT_S`` seconds (300, jax's own default) for every
process to reach the coordinator, and stays interruptible meanwhile (Ctrl-C, SIGTERM); past it,
:func:`init_cluster` raises :class:`ClusterError` naming the address, rather than jax aborting the
process with a stack trace.

Process 0 runs jax's coordination service in a child process of its own
(:mod:`jaxfl._coordination_service`), which outlives a lost process 0 until the other processes have
ended, for at most ``COORDINATOR_GRACE_S`` seconds: their next collective fails, and they end with
jaxfl's line naming the run folder, instead of jax's client aborting them the moment the service
is gone. Where process 0 is lost inside a checkpoint's save or restore (:func:`at_a_barrier`), the
others wait for it at the service's barriers, which no collective ends: the service stops at once,
and jax ends them as before.

>>> import jaxfl.cluster
>>> jaxfl.cluster.process_index(), jaxfl.cluster.process_count()
(0, 1)
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time

import jax
import numpy as np

from jaxfl._devices import backends_started

__all__ = ["ClusterError", "all_processes", "broadcast_text", "init_cluster", "least_bytes", "process_count",
           "process_index"]

DEFAULT_TIMEOUT_S = 300.0  # jax.distributed.initialize's own initialization_timeout
TIMEOUT_VARIABLE = "JAXFL_CLUSTER_TIMEOUT_S"


class ClusterError(RuntimeError):
    """The processes did not come together: the message names the address and what to check."""


# how long jax's coordination service outlives a lost process 0 for the others to reach their next
# collective (and end with jaxfl's line): past it they end as jax ends them, with its own abort
COORDINATOR_GRACE_S = 60.0


class _ServiceInItsOwnProcess:
    """What jax's ``get_distributed_runtime_service`` returns, with the service in a child process
    (:mod:`jaxfl._coordination_service`): in process 0 it died with it and aborted every other process."""

    def __init__(self, *args, **kwargs):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_coordination_service.py")
        self.child = subprocess.Popen([sys.executable, "-P", script, json.dumps([args, kwargs, COORDINATOR_GRACE_S])],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      start_new_session=True)
        said = self.child.stdout.readline()
        try:
            outcome = json.loads(said)
        except ValueError:
            code = self.child.wait()
            outcome = {"error": f"the service's process ended by signal {-code}" if code < 0 else
                       f"the service's process ended with status {code}"}
        if "error" in outcome:
            self.child.wait()
            port = str(args[0]).rpartition(":")[2] if args else "?"
            free = f": is port {port} free on its host? Give every process another --coordinator-address port" \
                if "ImportError" not in outcome["error"] else ""  # (jax not importable in a new process: its path)
            raise ClusterError(f"process 0 could not serve jax's coordinator on port {port} ({outcome['error']})"
                               + free)
        global _service
        _service = self

    def say(self, line: str) -> None:
        try:
            self.child.stdin.write(f"{line}\n")
            self.child.stdin.flush()
        except (OSError, ValueError):  # it ended already
            pass

    def shutdown(self) -> None:
        global _service
        _service = None
        self.say("stop")
        try:
            self.child.stdin.close()
        except OSError:
            pass
        try:
            self.child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


_service: _ServiceInItsOwnProcess | None = None  # process 0's coordination service, while it serves


@contextlib.contextmanager
def at_a_barrier():
    """Around orbax's saves and restores of a cluster run, where the other processes wait for process 0
    at the coordination service's barriers rather than in a collective that fails when it is lost: a
    process 0 lost within them leaves a service that stops at once (and the others end as jax ends
    them, with its abort, as when the service was inside process 0), not one that kept them waiting
    ``COORDINATOR_GRACE_S`` for nothing. Nothing outside process 0 of a cluster run.

    >>> with at_a_barrier():
    ...     pass
    """
    service = _service
    if service is None:
        yield
        return
    service.say("barrier")
    try:
        yield
    finally:
        service.say("free")


def _initialize_with_the_service_apart(**arguments) -> None:
    """``jax.distributed.initialize(**arguments)``, process 0 starting jax's coordination service in a
    child process of its own rather than inside itself, where jax's private hook for it is where jax
    0.10-0.12 have it (elsewhere, inside process 0 as before)."""
    try:
        from jax._src.lib import _jax
    except ImportError:
        _jax = None
    start_here = getattr(_jax, "get_distributed_runtime_service", None)
    if start_here is None:
        jax.distributed.initialize(**arguments)
        return
    _jax.get_distributed_runtime_service = _ServiceInItsOwnProcess
    try:
        jax.distributed.initialize(**arguments)
    finally:
        _jax.get_distributed_runtime_service = start_here


def join_timeout(timeout_s: float | None = None) -> float:
    """Seconds :func:`init_cluster` waits for every process: ``timeout_s``, else
    ``JAXFL_CLUSTER_TIMEOUT_S``, else 300.

    >>> join_timeout(20)
    20.0
    """
    where, value = ("timeout_s", timeout_s) if timeout_s is not None else \
        (TIMEOUT_VARIABLE, os.environ.get(TIMEOUT_VARIABLE) or None)
    if value is None:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{where}={value!r} is not allowed: a number of seconds above 0")
    return seconds


def _check_address(address: str) -> None:
    host, colon, port = address.rpartition(":")
    if not (colon and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"coordinator address {address!r} is not HOST:PORT (process 0's host name or IP address, "
                         "and a free port from 1 to 65535 on it), e.g. 10.0.0.1:1234")


def init_cluster(coordinator_address: str | None = None, num_processes: int | None = None,
                 process_id: int | None = None, timeout_s: float | None = None) -> None:
    """Join a run of several processes (``jax.distributed.initialize``); call it before any jax
    computation. Arguments left out come from the environment (SLURM, Open MPI, JAX_COORDINATOR_ADDRESS...).
    It waits up to ``timeout_s`` (:func:`join_timeout`) for every process to join, interruptibly,
    then raises :class:`ClusterError`; arguments that cannot work raise ``ValueError`` at once.

    >>> # init_cluster("10.0.0.1:1234", num_processes=2, process_id=0)   # on the first host
    """
    for name, value, least in (("num_processes", num_processes, 1), ("process_id", process_id, 0)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                  or value < least):
            raise ValueError(f"{name}={value!r} is not allowed: an integer, {least} or more")
    if num_processes is not None and process_id is not None and process_id >= num_processes:
        raise ValueError(f"process_id={process_id} must be below num_processes={num_processes} "
                         f"(the processes are numbered 0 to {num_processes - 1})")
    timeout = join_timeout(timeout_s)
    address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if address is not None:
        _check_address(address)
    if backends_started():
        raise RuntimeError("init_cluster must run before anything uses jax (its backends have started); "
                           "call it first thing in the process")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes exchange with gloo
    # jax's preemption service takes SIGTERM for itself (it logs "SIGTERM caught" and the run goes on):
    # off, so that SIGTERM (a cluster's time limit, kill) ends every process as jaxfl says it does
    jax.config.update("jax_enable_preemption_service", False)
    # jax's connect blocks in C++, deaf to Ctrl-C and SIGTERM, and past its own timeout aborts the
    # process with a stack trace: it runs in a thread (it releases the GIL), given a minute more
    # than the wait here, which ends with a clear error instead.
    outcome: dict = {}

    def join():
        try:
            _initialize_with_the_service_apart(coordinator_address=coordinator_address, num_processes=num_processes,
                                               process_id=process_id, initialization_timeout=int(timeout) + 60)
        except BaseException as error:  # handed to the waiting thread
            outcome["error"] = error

    joining = threading.Thread(target=join, name="jaxfl-cluster-join", daemon=True)
    deadline = time.monotonic() + timeout
    joining.start()
    while joining.is_alive() and time.monotonic() < deadline:
        joining.join(0.1)
    if joining.is_alive():
        who = "this process" if process_id is None else f"process {process_id}"
        count = "the processes" if num_processes is None else f"all {num_processes} processes"
        raise ClusterError(
            f"{who} waited {timeout:g} s for {count} to join the coordinator at {address or '(from the environment)'} "
            "and they did not: start process 0 (its host serves that address), then every other process, each with "
            "the same coordinator address and process count and its own process id; check that the host and port "
            f"are reachable from every host (a longer wait: {TIMEOUT_VARIABLE})")
    if "error" in outcome:
        error = outcome["error"]
        if isinstance(error, ValueError) and ("should be defined" in str(error) or "must be defined" in str(error)):
            raise ValueError(f"the cluster to join is not fully given (jax: {error}) and no cluster was found in the "
                             "environment (SLURM, Open MPI...) to complete it: give the coordinator address (process "
                             "0's HOST:PORT), the process count and this process's id (--coordinator-address, "
                             "--num-processes, --process-id)") from error
        raise error
    global _requested_count
    _requested_count = num_processes


# the process count this process was given (None: from the environment), compared across processes by
# check_same_run: jax takes process 0's count, so another count given to one process would pass unseen
_requested_count: int | None = None


def check_same_run(settings: dict, resume: bool) -> None:
    """Refuse, on every process at once, a run whose processes were given other settings (``settings``:
    the config as ``config.json`` nests it, without what may differ, such as its folder), given another
    process count (:func:`init_cluster`'s ``num_processes``), or of which some resume and some start:
    each would train its share of the clients its own way, and the mixed result would be written
    under process 0's config (or the processes would wait for each other forever). A
    :class:`jaxfl.config.ConfigError` naming the settings that differ from process 0's; collective,
    like :func:`broadcast_text`.

    >>> check_same_run({"seed": 0}, resume=False)   # one process: nothing to compare
    """
    if jax.process_count() == 1:
        return
    import json

    from jaxfl.config import ConfigError
    from jaxfl.execution import available_devices

    available_devices()  # unequal device counts first: the exchange below needs as many on each process

    count = jax.process_count() if _requested_count is None else _requested_count
    mine = json.dumps({"settings": settings, "resume": bool(resume), "num_processes": count},
                      sort_keys=True, default=str)
    first = broadcast_text(mine)
    agree = all_processes(mine == first)
    if all(agree):
        return
    others = ", ".join(str(index) for index, same in enumerate(agree) if not same)
    if mine == first:
        raise ConfigError(f"process {others} of this run {'was' if others.count(',') == 0 else 'were'} given other "
                          f"settings than process {jax.process_index()}'s: every process runs the same command (the "
                          "same flags and config file; --resume on every process or none); its output names them")

    def flat(values: dict, prefix: str = "") -> dict:
        return {key: value for name, item in values.items()
                for key, value in (flat(item, f"{prefix}{name}.").items() if isinstance(item, dict)
                                   else [(f"{prefix}{name}", item)])}

    ours, theirs = flat(json.loads(mine)), flat(json.loads(first))
    def shown(name: str) -> str:  # a field by its name; a fingerprint by what it is of (time_per_step.sha256)
        parts = name.split(".")
        return ".".join(parts[-2:]) if parts[-1].endswith("sha256") and len(parts) > 2 else parts[-1]

    differ = [f"{shown(name)}: {ours.get(name)!r} here, {theirs.get(name)!r} on process 0"
              for name in sorted(ours.keys() | theirs.keys()) if ours.get(name) != theirs.get(name)]
    raise ConfigError(f"process {jax.process_index()} was given other settings than process 0 "
                      f"({'; '.join(differ)}): every process runs the same command (the same flags and config "
                      "file; --resume on every process or none)")


class PeerLost(RuntimeError):
    """Another process of this cluster run ended (killed, crashed, its host lost) while this one ran:
    the message says what the run folder keeps and how to go on. The command ends the process at
    once (``os._exit``) after saying so, rather than wait minutes in jax's shutdown for the lost peer."""


_PEER_LOST_SIGNS = ("connection reset", "connection closed", "closed by peer", "connection refused", "heartbeat",
                    "broken pipe", "socket closed", "gloo allgather failed", "gloo all-reduce failed",
                    "gloo broadcast failed")


def lost_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective's failure because another process of a cluster run is gone:
    jax's runtime error, or gloo's failure however it was re-raised (a ``ValueError`` of the same
    text from a collective), that names a lost connection or heartbeat; not a collective mismatch
    (a bug of the run's own), nor another error that happens to name a connection (a logger's).

    >>> lost_peer(RuntimeError("UNKNOWN: Gloo all-reduce failed: Connection reset by peer"))   # one process
    False
    """
    if jax.process_count() == 1:
        return False
    text = str(error).lower()
    chain, seen = error, []
    while chain is not None and len(seen) < 10:
        seen.append(chain)
        chain = chain.__cause__ or chain.__context__
    from_jax = any(isinstance(item, RuntimeError) and type(item).__module__.split(".")[0] in ("jax", "jaxlib")
                   for item in seen)
    from_gloo = "gloo" in text and "failed" in text
    return "mismatch" not in text and (from_jax or from_gloo) and any(sign in text for sign in _PEER_LOST_SIGNS)


def check_shared_folder(folder: str, wait_s: float = 30.0) -> None:
    """Refuse, on every process at once, a run folder the processes do not share: process 0 writes a
    file into ``folder`` (making it if need be) and every process looks for it, for up to ``wait_s``
    seconds where its path is process 0's (a network file system may show a new file late). The checkpoints of all processes go
    to process 0's run folder, so a process that cannot see it would wait at the first checkpoint
    for ever. A :class:`jaxfl.config.ConfigError` naming the folder and the processes that cannot
    see it; collective, like :func:`broadcast_text`.

    >>> check_shared_folder("runs")   # one process: nothing to compare
    """
    if jax.process_count() == 1:
        return
    import secrets

    from jaxfl.config import ConfigError

    name = ""
    made = False
    if jax.process_index() == 0:
        try:
            made = not os.path.isdir(folder)
            os.makedirs(folder, exist_ok=True)
            name = f".jaxfl-shared-{secrets.token_hex(8)}"
            with open(os.path.join(folder, name), "w"):
                pass
        except OSError as error:  # said on every process: the others would wait at the exchange below
            name = f"!{error}"
    # one exchange: the file's name (or process 0's error) and process 0's path to the folder
    name, _, first_path = broadcast_text(f"{name}\n{os.path.abspath(folder)}").partition("\n")
    if name.startswith("!"):
        raise ConfigError(f"output folder {folder!r} cannot be written by process 0 of this run: {name[1:]}")

    def seen() -> bool:
        try:  # by name, and by listing (a network file system may cache that a name is absent)
            return os.path.exists(os.path.join(folder, name)) or name in os.listdir(folder)
        except OSError:
            return False

    # the same path as process 0's may show the new file late; another path may be another mount of
    # the same folder, or another folder: a shorter wait
    same_path = first_path == os.path.abspath(folder)
    deadline = time.monotonic() + (wait_s if same_path else min(wait_s, 5.0))
    while not (visible := seen()) and time.monotonic() < deadline:
        time.sleep(0.5)
    seen_by = all_processes(visible)
    if jax.process_index() == 0:
        os.remove(os.path.join(folder, name))
        if made and not all(seen_by) and not os.listdir(folder):
            os.rmdir(folder)  # made here for this check alone: nothing is left of a refused run
    if not all(seen_by):
        blind = [str(index) for index, ok in enumerate(seen_by) if not ok]
        raise ConfigError(f"output folder {folder!r} is not shared by every process of this run: process "
                          f"{', '.join(blind)} cannot see the file process 0 wrote into it "
                          f"(process 0's folder: {os.path.abspath(folder)!r}); every process writes its checkpoints "
                          "there, so give --output-dir (or --resume) a folder on a file system every host mounts, "
                          "as the same path")


def process_index() -> int:
    """This process's index (0 writes the run directory)."""
    return jax.process_index()


def process_count() -> int:
    """Processes in the run (1 without :func:`init_cluster`)."""
    return jax.process_count()


def broadcast_text(text: str) -> str:
    """Process 0's ``text`` on every process (collective: every process calls it at the same point).

    >>> broadcast_text("fedbuff-mnist10k-exp-c10")  # one process: the text itself
    'fedbuff-mnist10k-exp-c10'
    """
    if jax.process_count() == 1:
        return text
    from jax.experimental.multihost_utils import broadcast_one_to_all

    data = np.frombuffer(text.encode(), np.uint8).astype(np.int32)
    length = int(broadcast_one_to_all(np.int32(len(data))))  # the other processes' texts may be longer or shorter
    padded = np.zeros(length, np.int32)
    padded[:min(length, len(data))] = data[:length]
    return bytes(broadcast_one_to_all(padded).astype(np.uint8).tolist()).decode()


def all_processes(flag: bool) -> list[bool]:
    """``flag`` of every process, in process order (collective, like :func:`broadcast_text`).

    >>> all_processes(True)
    [True]
    """
    if jax.process_count() == 1:
        return [bool(flag)]
    from jax.experimental.multihost_utils import process_allgather

    return [bool(value) for value in np.asarray(process_allgather(np.int32(flag))).reshape(-1)]


def least_bytes(count: int | None) -> int | None:
    """The least of every process's ``count`` of bytes, in whole MiB (a gather through 32-bit
    integers); None where any process has no figure (collective, like :func:`broadcast_text`).
    Used where each process would decide by its own free memory what the processes must do
    together (the size of a training call, whose clients span them all).

    >>> least_bytes(3 * 2**20 + 5), least_bytes(None)  # one process: its own, whole MiB
    (3145728, None)
    """
    if jax.process_count() == 1:
        return None if count is None else count // 2**20 * 2**20
    from jax.experimental.multihost_utils import process_allgather

    mib = -1 if count is None else min(count // 2**20, 2**31 - 1)
    values = np.asarray(process_allgather(np.int32(mib))).reshape(-1)
    return None if (values < 0).any() else int(values.min()) * 2**20
