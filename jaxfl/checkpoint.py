"""Checkpoints of a run: the engine's device state with orbax, the scheduler's state with pickle.

Layout under ``RUN_DIR/checkpoints/``::

    ckpt-000012/device/     orbax: global model, server optimiser state, kept versions,
                            trained-but-unaggregated updates (the rows of their batches still
                            waiting, not the rows aggregated), the algorithm's device-hook state;
                            its small arrays stacked by shape and dtype (``packing.json`` says how)
    ckpt-000012/packing.json
                            the order in which the small arrays were stacked (absent: one orbax
                            array per leaf, as older checkpoints and runs of several processes hold)
    ckpt-000012/client_state/
                            per-client tables of the hooks as ``.npy`` files, when they live in host
                            RAM or a memmap (on the device they go into the orbax tree)
    ckpt-000012/state.pkl   the simulation (clock, event queue, dispatch records, the policy with
                            its groups/buffers/RNGs, client speeds and faults), the engine's
                            bookkeeping, the recorder, and the byte lengths of events.csv and
                            metrics.csv at that moment
    ckpt-000012/state.pkl.sha256
                            state.pkl's SHA-256: a state.pkl that differs is unreadable (resume
                            falls back to the previous checkpoint; absent in older checkpoints)
    ckpt-000012/arrays.json the large arrays of state.pkl kept outside it (see below)
    ckpt-000012/config.json the resolved config the run was started with and its SHA-256
                            (:mod:`jaxfl.resume` refuses to continue under another one)
    arrays/SHA256.npy       those arrays, each written once per run directory under its digest
    latest                  the name of the newest complete checkpoint

A checkpoint is written into ``tmp-…`` and renamed into place only when complete, and ``latest``
is replaced atomically after that, so a crash at any moment leaves the previous checkpoint intact.
The two newest checkpoints are kept; an older one is renamed ``removing-…`` before it is deleted,
so that no ``ckpt-…`` folder is ever a partial one. The pickle is tied to the jaxfl version that wrote it.

The scheduler's per-client columns (at 10^6 clients ~56 MB: client weights and base speeds that
never change, busy time, rounds, the idle pool, which change for the few clients that ran) are not
pickled into every state.pkl. Each numpy or ``array.array`` column of one row per client and at
least ``EXTERNAL_ARRAY_BYTES`` is compared with the same column (its position in the pickle) of the
previous checkpoint: the same bytes are referenced, a few changed elements are stored in state.pkl
as (indices, values) on top of that column's file, and anything else is written as a new
``arrays/SHA256.npy`` (content-addressed, so written once). Reading checks each file's SHA-256: a missing or corrupt one makes that checkpoint
unreadable with a message naming the file (resume then falls back to the previous checkpoint, unless
that one names the same file: a column that did not change between them is stored once). A save whose
base file is damaged writes the column anew under its digest. Files no kept checkpoint refers to are deleted.

In a run of several processes (:mod:`jaxfl.cluster`) ``run_dir`` is process 0's run directory on
every process, on a filesystem they all see: every process takes part in orbax's save and restore
(orbax synchronises them, and writes each array once, its slices shared out among the processes),
and process 0 alone writes the other files, since every process holds the same scheduler state.

>>> # save(run_dir, 12, simulation, engine, {"recorder": ...}); load(run_dir, engine)
"""
from __future__ import annotations

import array
import contextlib
import errno
import gc
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import signal
import sys
import threading
import time

import numpy as np

from jaxfl._user_warnings import warn_user
from jaxfl import cluster
from jaxfl.runlog import written_atomically

KEEP = 2
STATE_DIGEST = "state.pkl.sha256"  # state.pkl's SHA-256 (hex), written beside it


class _HashingWriter:
    """A binary file's ``write`` that also feeds the bytes to a SHA-256."""

    def __init__(self, handle):
        self._handle = handle
        self.digest = hashlib.sha256()

    def write(self, data) -> int:
        self.digest.update(data)
        return self._handle.write(data)


def _root(run_dir: str) -> str:
    return os.path.join(os.path.abspath(run_dir), "checkpoints")  # orbax needs absolute paths


def _checkpointer():
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


def _nonempty(tree: dict) -> dict:
    """Orbax stores no empty containers: drop them (restore targets are built the same way)."""
    return {k: v for k, v in tree.items() if not (isinstance(v, dict) and not v)}


PACKING = "packing.json"
PACK_BELOW_BYTES = 1 << 20  # leaves this small are stacked with the others of their shape and dtype


DEVICE_SIZES = "device.sizes.json"  # the byte size of each file orbax wrote, checked before a restore


def _device_sizes(device: str, own_only: bool = False) -> dict[str, int]:
    """The byte size of each file under a checkpoint's ``device`` folder, by its path there; ``own_only``:
    not those of the other processes' parts (``ocdbt.process_1``, ``array_metadatas/process_1``), which a
    shared file system may show process 0 with a size it has not caught up with."""
    sizes = {}
    for folder, _, names in os.walk(device):
        for name in names:
            path = os.path.relpath(os.path.join(folder, name), device)
            if own_only and any(re.fullmatch(r"(.*\.)?process_[1-9][0-9]*", part) for part in path.split(os.sep)):
                continue
            sizes[path] = os.path.getsize(os.path.join(folder, name))
    return sizes


class DeviceFilesDamaged(ValueError):
    """A checkpoint's orbax file is missing or not the size it was written with."""


def _check_device_sizes(folder: str) -> None:
    """:class:`DeviceFilesDamaged` naming the first of a checkpoint's orbax files that is missing or not the size it was
    written with (a crash or a full disk cut it short): said before orbax reads anything, whose restore
    of damaged data leaves reads running that print tracebacks for seconds after it failed. A checkpoint
    of an older jaxfl, without the sizes, or whose sizes file is itself unreadable, is not checked here."""
    path = os.path.join(folder, DEVICE_SIZES)
    try:
        with open(path) as handle:
            written = json.load(handle)
    except (OSError, ValueError):  # none (an older jaxfl), or itself cut short: orbax checks the data
        return
    # sizes as _save writes them, of files inside device/; anything else is no record of them (left to orbax)
    if not isinstance(written, dict) or not all(
            isinstance(size, int) and not isinstance(size, bool) and size >= 0 and isinstance(name, str)
            and name and not os.path.isabs(name) and ".." not in name.split(os.sep) for name, size in written.items()):
        return
    device = os.path.join(folder, "device")
    for name, size in sorted(written.items()):
        file = os.path.join(device, name)
        if not os.path.isfile(file):
            raise DeviceFilesDamaged(f"{name} is missing")
        if (found := os.path.getsize(file)) != size:
            raise DeviceFilesDamaged(f"{name} is {found} bytes, written with {size}")


def _pack(tree: dict, packing: dict | None = None) -> tuple[dict, dict]:
    """``tree`` (arrays, or a restore target's ``jax.ShapeDtypeStruct``) as orbax saves it: its
    leaves under ``PACK_BELOW_BYTES`` stacked into one array per shape and dtype, the larger ones
    kept whole, and the record of that order. Orbax's cost grows with the number of arrays, not their
    bytes (FedBuff with 1,000 clients in flight keeps ~200 model versions: 0.4 s a checkpoint for
    kilobytes). A target is packed as ``packing`` (the record of the save) says, checked against it.

    >>> import numpy as np
    >>> packed, packing = _pack({"a": np.zeros(3), "b": {"c": np.ones(3), "d": np.ones(2)}})
    >>> {name: value.shape for name, value in packed["packed"].items()}, packing["groups"]
    ({'0': (2, 3), '1': (1, 2)}, [[0, 1], [2]])
    >>> _unpack(packed, {"a": 0, "b": {"c": 0, "d": 0}}, packing)["b"]["c"].tolist()
    [1.0, 1.0, 1.0]
    """
    import jax

    from jaxfl.kernels.tree import tree_bytes

    kept = {"params": tree["params"]} if "params" in tree else {}  # whole: final_params reads them alone
    leaves = jax.tree.leaves({name: part for name, part in tree.items() if name != "params"})
    signatures = [[list(leaf.shape), str(leaf.dtype)] for leaf in leaves]
    if packing is None:
        groups, whole = {}, []
        for index, leaf in enumerate(leaves):
            # typed PRNG keys (an extended dtype) have no host form to stack: kept whole
            if not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended) and \
                    tree_bytes(leaf) < PACK_BELOW_BYTES:
                groups.setdefault((tuple(leaf.shape), str(leaf.dtype)), []).append(index)
            else:
                whole.append(index)
        packing = {"format": 1, "leaves": signatures, "groups": list(groups.values()), "whole": whole}
    elif packing.get("format") != 1 or packing["leaves"] != signatures:
        raise ValueError("the checkpoint's packing.json does not describe the arrays this run restores "
                         f"({len(packing.get('leaves', []))} leaves recorded, {len(leaves)} expected)")
    if leaves and not isinstance(leaves[0], jax.ShapeDtypeStruct):
        # the arrays of a save: the small ones stacked on the host (only those fetched: orbax reads
        # the whole ones from their devices itself)
        grouped = [index for indices in packing["groups"] for index in indices]
        host = dict(zip(grouped, jax.device_get([leaves[index] for index in grouped])))
        stack = lambda indices: np.stack([host[i] for i in indices])
    else:
        stack = lambda indices: jax.ShapeDtypeStruct((len(indices),) + tuple(leaves[indices[0]].shape),
                                                     leaves[indices[0]].dtype, sharding=leaves[indices[0]].sharding)
    packed = {"packed": {str(g): stack(indices) for g, indices in enumerate(packing["groups"])},
              "whole": {str(index): leaves[index] for index in packing["whole"]}}
    return {**kept, **{name: part for name, part in packed.items() if part}}, packing


def _unpack(packed: dict, target, packing: dict):
    """The tree of :func:`_pack`'s ``packed`` arrays, shaped like ``target``: each leaf placed as the
    target's leaf asks (its ``sharding``, where it has one)."""
    import jax

    targets, structure = jax.tree.flatten({name: part for name, part in target.items() if name != "params"})
    leaves = [None] * len(targets)
    for g, indices in enumerate(packing["groups"]):
        stacked = packed["packed"][str(g)]
        for row, index in enumerate(indices):
            leaves[index] = stacked[row]
    for index in packing["whole"]:
        leaves[index] = packed["whole"][str(index)]
    placed = [jax.device_put(leaf, target.sharding) if getattr(target, "sharding", None) is not None else leaf
              for leaf, target in zip(leaves, targets)]
    tree = jax.tree.unflatten(structure, placed)
    return {**({"params": packed["params"]} if "params" in target else {}), **tree}


class DiskWriteError(OSError):
    """A run's file could not be written (a full disk, a quota, a file-size limit): the message, one
    line, says what the run keeps and how to go on (``jaxfl`` exits with status 74, sysexits' EX_IOERR)."""


class CheckpointWriteError(DiskWriteError):
    """A checkpoint could not be written (a full disk, a quota, a folder gone): its ``tmp-…`` folder is
    removed and the run's earlier checkpoints are intact; the message says what a resume goes on from."""


class LogWriteError(DiskWriteError):
    """A run's logs (``events.csv``, ``metrics.csv``, ``summary.json``...) could not be written, the disk
    full or a quota reached: a resume goes on from the newest checkpoint, its logs cut back to it."""


# what a full disk (or quota, or file-size limit) makes a write fail with
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


# a failure of the disk as tensorstore (orbax's writer) reports it: its errno
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


def _disk_failure(error: BaseException) -> str | None:
    """What ``error`` says went wrong with the disk (``No space left on device``), or None if it is
    not a failure of the disk."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.strerror or os.strerror(error.errno)
    found = _OS_ERROR_CODE.search(str(error))
    if found:
        return os.strerror(int(found.group(1)))
    if isinstance(error, OSError):
        return _first(error)
    return None


def _first(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


@contextlib.contextmanager
def _quiet_absl():
    """absl's (orbax's) and asyncio's error logs muted: a failed save logs each of its threads'
    tracebacks before raising, and asyncio each failed write task's ("Task exception was never
    retrieved") when it is collected; :func:`save` says the failure in one line."""
    import logging

    loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


_CLOSED_LOOP_MESSAGE = "Event loop is closed"
_CLOSED_LOOP = f"RuntimeError: {_CLOSED_LOOP_MESSAGE}"
_HEADER = "Traceback (most recent call last):"


class _WithoutClosedLoopTracebacks:
    """``sys.stderr`` less the tracebacks ending in ``RuntimeError: Event loop is closed``: after a
    failed save, tensorstore completes the writes still under way into the event loops orbax has
    closed, and prints one such traceback for each (dozens, also after the run has said why it stopped)."""

    def __init__(self, stream):
        self._stream = stream
        # per thread, the traceback it is writing, until its last line says what it is: two writer
        # threads print theirs at once, line by line interleaved
        self._held: dict[int, str] = {}
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._take(text, threading.get_ident())
        return len(text)

    def _take(self, text: str, thread: int) -> None:
        while text:
            held = self._held.pop(thread, None)
            if held is None:
                if not (text.startswith(_HEADER) or _HEADER.startswith(text)):
                    self._stream.write(text)
                    return
                held = ""
            held, text = held + text, ""
            if not (held.startswith(_HEADER) or _HEADER.startswith(held)):  # not a traceback after all
                self._stream.write(held)
                return
            lines = held.split("\n")
            for end in range(1, len(lines) - 1):  # the complete lines after the header
                line = lines[end]
                if line and not line[0].isspace():  # the exception's line: the traceback is whole
                    block, text, held = "\n".join(lines[:end + 1]) + "\n", "\n".join(lines[end + 1:]), None
                    if line.strip() != _CLOSED_LOOP:
                        self._stream.write(block)
                    break
            if held is not None:
                self._held[thread] = held

    def flush(self) -> None:
        self._stream.flush()

    def release(self) -> None:
        """Write what is held (tracebacks cut off when the filter is taken away)."""
        with self._lock:
            for held in self._held.values():
                if held:
                    self._stream.write(held)
            self._held.clear()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _wait_for_orbax_threads() -> None:
    """Wait (a few seconds at most) for orbax's writer threads that a failed save left running, so
    that nothing writes into the ``tmp-…`` folder once it is removed, and that their noise comes
    while stderr is filtered and absl muted (:func:`save`)."""
    try:
        from orbax.checkpoint._src.futures import future as orbax_future

        kinds = tuple(getattr(orbax_future, name) for name in ("_SignalingThread",) if hasattr(orbax_future, name))
    except ImportError:
        kinds = ()
    deadline = time.monotonic() + 5
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and (isinstance(thread, kinds) or "orbax" in
                                                         type(thread).__module__):
            try:
                thread.join(max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - orbax's threads re-raise their failure at join: the one being said
                pass
    time.sleep(0.2)  # tensorstore's last completions, into the closed loops


@contextlib.contextmanager
def _sigint_after():
    """Ctrl-C (SIGINT) during a save waits for its end: interrupted, orbax's writer threads died with
    the interpreter's shutdown and printed a hundred lines of tracebacks. The interrupt is raised as
    the save returns (the checkpoint it wrote complete, so the run resumes from it). Only where this
    is the main thread and SIGINT has Python's handler (or the command's, which also keeps a stop
    request: :mod:`jaxfl.stopping`)."""
    from jaxfl import stopping

    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or \
            previous not in (signal.default_int_handler, stopping._on_sigint):
        yield
        return
    caught = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        previous(signal.SIGINT, None)  # the handler's own interrupt (both raise KeyboardInterrupt)


def save(run_dir: str, number: int, simulation, engine, extra: dict, config: dict | None = None) -> str:
    """Write checkpoint ``number`` of a run; returns its folder. ``config`` (JSON-able: the run's
    resolved config and its hash, :func:`jaxfl.resume.checkpoint_config`) goes to ``config.json``.
    With several processes every process calls it, with the same ``run_dir`` and ``number``.

    A Ctrl-C during the save is raised once it is written. A save that fails on the disk (full, a
    quota) removes its ``tmp-…`` folder and raises :class:`CheckpointWriteError` in one line saying
    what the run keeps and how to go on; another failure removes it too, and is raised as it is."""
    import jax

    temporary = os.path.join(_root(run_dir), f"tmp-{number:06d}")
    stderr = sys.stderr
    sys.stderr = filtered = _WithoutClosedLoopTracebacks(stderr)  # orbax's noise of a failed save, while it lasts
    try:
        with _quiet_absl():
            try:
                with _sigint_after(), cluster.at_a_barrier():
                    return _save(run_dir, number, simulation, engine, extra, config)
            except Exception as failed:
                _wait_for_orbax_threads()
                error, why = failed, _disk_failure(failed)
            if why is not None:
                # said in one line below: the failed write tasks that the error's frames hold go now,
                # while asyncio's log is muted, not at some later collection (the process's end)
                error = None
                gc.collect()
    finally:
        if sys.stderr is filtered:
            sys.stderr = stderr
        filtered.release()
    if jax.process_index() == 0:
        shutil.rmtree(temporary, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.remove(os.path.join(_root(run_dir), "latest.tmp"))
    if why is None:
        raise error
    # the newest whole checkpoint (only whole ones have ckpt- names): this one where only naming it in
    # `latest` failed, which a resume finds, else the one before
    written = [name for name in os.listdir(_root(run_dir)) if name.startswith("ckpt-")] \
        if os.path.isdir(_root(run_dir)) else []
    go_on = (f"logs and checkpoints kept up to update {checkpoint_order(max(written, key=checkpoint_order))[0]}; "
             f"free space and resume with `jaxfl run --resume {run_dir}`" if written else
             "it has no checkpoint yet; free space and start the run again")
    raise CheckpointWriteError(f"could not write checkpoint {number} to {run_dir}: {why}; {go_on}") from None


def _save(run_dir: str, number: int, simulation, engine, extra: dict, config: dict | None) -> str:
    import jax

    root = _root(run_dir)
    temporary = os.path.join(root, f"tmp-{number:06d}")
    final = os.path.join(root, f"ckpt-{number:06d}")
    writes_files = jax.process_index() == 0
    if writes_files:  # before orbax's first barrier, which the other processes wait at
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(temporary, ignore_errors=True)
        os.makedirs(temporary)
    tree, meta = engine.checkpoint_state()
    tree, packing = _nonempty(tree), None
    if jax.process_count() == 1:  # several processes write each array's slices: left one array per leaf
        tree, packing = _pack(tree)
    checkpointer = _checkpointer()
    try:
        checkpointer.save(os.path.join(temporary, "device"), tree)
        checkpointer.wait_until_finished()
    finally:
        checkpointer.close()  # its threads end here, not at the interpreter's exit
    if not writes_files:
        return final
    if packing is not None:
        with open(os.path.join(temporary, PACKING), "w") as handle:
            json.dump(packing, handle)
    # every process's files are written (orbax's save ends at a barrier of all of them)
    with open(os.path.join(temporary, DEVICE_SIZES), "w") as handle:
        json.dump(_device_sizes(os.path.join(temporary, "device"), own_only=jax.process_count() > 1), handle,
                  indent=0, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    engine.save_client_state_files(os.path.join(temporary, "client_state"))
    arrays = _ArrayStore(root, _previous_slots(run_dir))
    with open(os.path.join(temporary, "state.pkl"), "wb") as handle:
        hashing = _HashingWriter(handle)
        try:
            _StatePickler(hashing, arrays, getattr(simulation, "num_clients", None)).dump(
                {"simulation": simulation, "engine": meta, **extra})
        except (pickle.PicklingError, AttributeError, TypeError) as error:  # a raw traceback from pickle's depths
            from jaxfl.scheduler.simulation import PluginError

            policy = type(getattr(simulation, "policy", None)).__name__
            raise PluginError(f"checkpoint {number}: the scheduler's state cannot be pickled ({type(error).__name__}: "
                              f"{error}): what the policy ({policy}) and the other parts of a run keep must be "
                              "picklable, functions at module level rather than lambdas or local functions, no open "
                              "files; or run without checkpoints (checkpoint_every=None, final_checkpoint=False)") from None
        handle.flush()
        os.fsync(handle.fileno())
    with open(os.path.join(temporary, STATE_DIGEST), "w") as handle:  # load_state checks state.pkl against it
        handle.write(hashing.digest.hexdigest() + "\n")
    if arrays.slots:
        with open(os.path.join(temporary, ARRAYS), "w") as handle:
            json.dump({"format": 1, "slots": arrays.slots}, handle)
    if config is not None:
        with open(os.path.join(temporary, "config.json"), "w") as handle:
            json.dump(config, handle, indent=1, sort_keys=True)
            handle.write("\n")
    _remove(root, os.path.basename(final))
    os.rename(temporary, final)
    with written_atomically(os.path.join(root, "latest")) as pointer, open(pointer, "w") as handle:
        handle.write(os.path.basename(final) + "\n")
    for name in sorted((n for n in os.listdir(root) if n.startswith("ckpt-")), key=checkpoint_order)[:-KEEP]:
        _remove(root, name)
    for name in os.listdir(root):  # removals that a kill cut short
        if name.startswith(REMOVING):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    _delete_unreferenced_arrays(root)
    return final


REMOVING = "removing-"


def checkpoint_order(name: str) -> tuple[int, str]:
    """A checkpoint folder's place among a run's: its update number, not its name's text, which puts
    ``ckpt-1000002`` before ``ckpt-999999`` (past a million updates a run pruned its newest checkpoint
    as it wrote it); a name without a number first.

    >>> sorted(["ckpt-1000002", "ckpt-999999", "ckpt-000012"], key=checkpoint_order)
    ['ckpt-000012', 'ckpt-999999', 'ckpt-1000002']
    """
    number = name.removeprefix("ckpt-")
    return (int(number), name) if number.isdigit() else (-1, name)


def _remove(root: str, name: str) -> None:
    """Remove the checkpoint folder ``root/name``, renamed out of the ``ckpt-`` names first: a removal
    cut short (a kill inside ``rmtree``) would otherwise leave a checkpoint with some of its files,
    which a resume tries and skips; the next save removes what is left."""
    folder = os.path.join(root, name)
    if not os.path.isdir(folder):
        return
    doomed = os.path.join(root, REMOVING + name)
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def latest(run_dir: str) -> str | None:
    """The newest complete checkpoint folder of a run, or None: the newest ``ckpt-*`` folder (one is
    complete once renamed from ``tmp-*``), as a resume takes it (:func:`jaxfl.resume.candidates`).
    Not the ``latest`` pointer alone: a kill between a checkpoint's rename and the pointer's update
    leaves it one behind, and a kill while a checkpoint number is saved again (the final one, after
    the last update's) leaves it naming a folder just removed, with the one before still whole."""
    root = _root(run_dir)
    if not os.path.isdir(root):
        return None
    folders = [name for name in os.listdir(root) if name.startswith("ckpt-") and os.path.isdir(os.path.join(root, name))]
    return os.path.join(root, max(folders, key=checkpoint_order)) if folders else None


def load_state(folder: str) -> dict:
    """The pickled scheduler state of a checkpoint folder (with its arrays kept outside it, checked
    against their SHA-256), state.pkl itself checked against the SHA-256 in ``state.pkl.sha256``
    (ValueError if it differs; a checkpoint of an older jaxfl, without that file, is read unchecked)."""
    path = os.path.join(folder, "state.pkl")
    arrays = os.path.join(os.path.dirname(os.path.abspath(folder)), "arrays")
    digest_path = os.path.join(folder, STATE_DIGEST)
    if not os.path.isfile(digest_path):
        with open(path, "rb") as handle:
            return _StateUnpickler(handle, arrays).load()
    with open(digest_path) as handle:
        expected = handle.read().strip()
    with open(path, "rb") as handle:
        data = handle.read()
    if hashlib.sha256(data).hexdigest() != expected:
        raise ValueError(f"state.pkl is corrupt: its contents do not match the SHA-256 in {STATE_DIGEST}")
    return _StateUnpickler(io.BytesIO(data), arrays).load()


def load_config(folder: str) -> dict | None:
    """The ``config.json`` of a checkpoint folder as written by :func:`save`, or None if it has none."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def load_device(folder: str, engine, meta: dict) -> dict:
    """The engine's device tree of a checkpoint folder, restored with the engine's shapes (with the
    per-client tables the folder holds as files, memory-mapped)."""
    _check_device_sizes(folder)
    stderr = sys.stderr
    sys.stderr = filtered = _WithoutClosedLoopTracebacks(stderr)  # a failed restore's noise, as a failed save's
    try:
        return _load_device(folder, engine, meta)
    except Exception:
        _quiet_abandoned_orbax_reads()
        # tensorstore completes the other reads into the loop orbax closed, and the reads left as coroutines
        # go at the next collection: both now, while stderr is filtered (a resume then tries an older checkpoint)
        _wait_for_orbax_threads()
        gc.collect()
        raise
    finally:
        if sys.stderr is filtered:
            sys.stderr = stderr
        filtered.release()


# a restore failed in this process (the jaxfl command then ends without the interpreter's teardown, where
# the reads it abandoned print past any hook: jaxfl.cli.main)
ABANDONED_READS = False


def _quiet_abandoned_orbax_reads() -> None:
    """After a restore failed on damaged data (a resume then says so in one line and tries an older
    checkpoint), orbax's reads of the other arrays are left as coroutines never awaited, each printed
    at exit as "Exception ignored in: <coroutine ...>" with tensorstore's whole spec: 130 lines
    around the one line. Those are dropped; any other unraisable exception goes to the hook as before."""
    global ABANDONED_READS
    ABANDONED_READS = True
    previous = sys.unraisablehook
    if getattr(previous, "_jaxfl_quiet_orbax", False):
        return

    def hook(unraisable) -> None:
        code = getattr(unraisable.object, "cr_code", None)
        if code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename:
            return
        if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == _CLOSED_LOOP_MESSAGE:
            return  # a late completion into the loop orbax closed
        previous(unraisable)

    hook._jaxfl_quiet_orbax = True
    sys.unraisablehook = hook


def _load_device(folder: str, engine, meta: dict) -> dict:
    target = _nonempty(engine.checkpoint_target(meta))
    packing_path = os.path.join(folder, PACKING)
    with cluster.at_a_barrier():
        if os.path.isfile(packing_path):
            with open(packing_path) as handle:
                packing = json.load(handle)
            packed_target, _ = _pack(target, packing)
            tree = _unpack(_checkpointer().restore(os.path.join(folder, "device"), packed_target), target, packing)
        else:
            tree = _checkpointer().restore(os.path.join(folder, "device"), target)
    tree.setdefault("batches", {})
    tree.setdefault("hooks", {})
    files = engine.read_client_state_files(os.path.join(folder, "client_state"), meta)
    if files is not None:
        tree["client_state"] = files
    return tree


def final_params(run_dir: str, template):
    """The global model of a run's newest checkpoint, shaped like ``template``, on this process's first
    device (also for a run of several processes, whose arrays span devices this process does not have).

    ``template`` is the run's variables as ``RunResult.params`` holds them (``{"params": ...}``, plus
    ``"state"`` for a model with BatchNorm statistics) or their ``"params"`` part (the layout
    ``init_params=`` takes); the same layout comes back. Arrays or ``jax.ShapeDtypeStruct`` leaves
    both do. That checkpoint is the run's final model when the run finished with ``final_checkpoint``
    on; otherwise (``final_checkpoint=False``, a run interrupted or still going) a ``UserWarning``
    names the update it holds and how the run stands.

    Example:
        >>> import jaxfl, tempfile
        >>> result = jaxfl.run_experiment(jaxfl.RunConfig(
        ...     algorithm="fedavg", model="logreg", clients=3, local_steps=2, max_updates=2,
        ...     eval_interval=None, progress=False, output_dir=tempfile.mkdtemp()))
        >>> inner = final_params(result.run_dir, result.params["params"])
        >>> kernel = result.params["params"]["Dense_0"]["kernel"]
        >>> sorted(inner), bool((inner["Dense_0"]["kernel"] == kernel).all())
        (['Dense_0'], True)
        >>> sorted(final_params(result.run_dir, result.params))
        ['params']
        >>> final_params(result.run_dir, {"w": 0})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: template does not match the model in ...: expected the run's variables ... or their 'params' part...
    """

    import jax
    import orbax.checkpoint as ocp

    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run directory {run_dir!r} does not exist")
    folder = latest(run_dir)
    if folder is None:
        raise FileNotFoundError(f"run directory {run_dir!r} has no checkpoint (none is kept with checkpoint_every=None "
                                f"and final_checkpoint off, nor before a run's first one)")
    if not jax.tree.leaves(template):
        raise ValueError(f"template={_short_repr(template)} holds no arrays: expected the run's variables "
                         f"(RunResult.params) or their 'params' part")
    try:
        _check_device_sizes(folder)
    except DeviceFilesDamaged as damaged:
        raise DeviceFilesDamaged(f"checkpoint {folder} is damaged: {damaged}") from None
    here = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    restored = ocp.Checkpointer(ocp.StandardCheckpointHandler()).restore(
        os.path.join(folder, "device"), args=ocp.args.StandardRestore(fallback_sharding=here))
    params = _shaped_like(template, restored["params"], folder)
    stale = _not_the_end(run_dir, folder)
    if stale is not None:
        warn_user(stale)
    return params


def _short_repr(obj) -> str:
    text = repr(obj)
    return text if len(text) <= 60 else text[:57] + "..."


def _shaped_like(template, variables: dict, folder: str):
    """``variables`` (restored without a target: plain dicts), or their ``"params"`` part, rebuilt with
    ``template``'s structure, whichever layout ``template`` has; ValueError naming both otherwise."""
    import jax

    def by_path(tree) -> dict:
        return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}

    # paths, not tree structures: a FrozenDict or nnx pure-dict template lays out the same keys
    # as the plain dicts orbax restores, though its node type differs
    wanted, structure = jax.tree_util.tree_flatten_with_path(template)
    paths = [jax.tree_util.keystr(path) for path, _ in wanted]
    inner = variables.get("params") if isinstance(variables, dict) else None
    for layout in (variables, inner):
        if layout is None:
            continue
        saved = by_path(layout)
        if sorted(saved) != sorted(paths):
            continue
        for path, (_, leaf) in zip(paths, wanted):
            shape = getattr(leaf, "shape", None)
            if shape is not None and tuple(shape) != tuple(saved[path].shape):
                raise ValueError(f"template{path} has shape {tuple(shape)} but the model in {folder} has "
                                 f"{tuple(saved[path].shape)} there: the template is of another model")
        return jax.tree_util.tree_unflatten(structure, [jax.numpy.asarray(saved[path]) for path in paths])

    def keys(tree) -> str:
        return repr(sorted(tree)) if isinstance(tree, dict) or hasattr(tree, "keys") else type(tree).__name__

    raise ValueError(f"template does not match the model in {folder}: expected the run's variables "
                     f"(RunResult.params: keys {keys(variables)}, {len(by_path(variables))} arrays) or their "
                     f"'params' part (as init_params= takes: keys {keys(inner or {})}, {len(by_path(inner or {}))} "
                     f"arrays); the template has keys {keys(template)}, {len(paths)} arrays")


def _not_the_end(run_dir: str, folder: str) -> str | None:
    """Why checkpoint ``folder`` does not hold ``run_dir``'s final model, or None if it does.

    A finished run has a ``summary.json`` with its last update (``global_updates``), and a checkpoint
    folder is named after the update it holds (:func:`save`); the global model changes only at an
    update, so a checkpoint of the last update holds the final model."""
    name = os.path.basename(folder)
    try:
        update = int(name.removeprefix("ckpt-"))
    except ValueError:
        return f"{run_dir}: cannot tell whether checkpoint {name} holds the run's final model (not a ckpt-NNNNNN name)"
    summary = os.path.join(run_dir, "summary.json")
    if not os.path.isfile(summary):
        return (f"{run_dir} has no summary.json: the run has not finished (interrupted, or still running); its newest "
                f"checkpoint {name} holds the model after update {update}, not a final one (resume the run for that)")
    try:
        with open(summary) as handle:
            last = int(json.load(handle)["global_updates"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        return (f"{run_dir}: cannot tell whether checkpoint {name} (update {update}) holds the run's final model: "
                f"summary.json does not say its global_updates ({type(error).__name__}: {error})")
    if update != last:
        return (f"{run_dir}: the newest checkpoint {name} holds the model after update {update}, but the run ended "
                f"at update {last} (run with final_checkpoint=False, or it stopped on an error): this is not its "
                f"final model")
    return None



# --------------------------------------------------------------------------- arrays outside state.pkl

ARRAYS = "arrays.json"
EXTERNAL_ARRAY_BYTES = 1 << 18  # smaller arrays stay in state.pkl (below ~32,000 clients, every array)
_DELTA_SHARE = 4  # a changed array is stored as (indices, values) while that takes under 1/4 of its bytes
_ARRAY_CODES = frozenset("bBhHiIlLqQfd")  # array.array type codes that are numpy dtype codes too
_PERSISTENT = "jaxfl-array"
_VERIFIED: set = set()  # (path, size, mtime) of array files whose digest this process has checked


def _digest(values: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(values)).cast("B")).hexdigest()


def _delta_index_type(size: int) -> type:
    """The type of a delta's flat indices into an array of ``size`` elements (written and read alike)."""
    return np.uint32 if size < 2**32 else np.int64


def _as_bits(values: np.ndarray) -> np.ndarray | None:
    """``values`` as unsigned integers of the same width (so -0.0 differs from 0.0 and NaN equals
    itself), or None for widths without one."""
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(values.dtype.itemsize)
    return None if width is None else values.reshape(-1).view(width)


def _previous_slots(run_dir: str) -> list:
    """The array slots of the newest checkpoint (what this save compares with), or none."""
    folder = latest(run_dir)
    path = None if folder is None else os.path.join(folder, ARRAYS)
    if path is None or not os.path.isfile(path):
        return []
    try:
        with open(path) as handle:
            return json.load(handle)["slots"]
    except (OSError, ValueError, KeyError):
        return []  # unreadable: this save writes its arrays in full


def _read_array(directory: str, digest: str, dtype: str, shape: tuple) -> np.ndarray:
    """The array file ``digest``, checked against its digest, dtype and shape (ValueError naming it)."""
    path = os.path.join(directory, f"{digest}.npy")
    label = f"array file {os.path.join('arrays', digest[:16])}….npy ({dtype}, shape {tuple(shape)})"
    try:
        values = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ValueError(f"{label} is missing") from None
    except (OSError, ValueError, EOFError) as error:  # EOFError: a file emptied (a machine's crash)
        raise ValueError(f"{label} is unreadable: {error or type(error).__name__}") from None
    if str(values.dtype) != dtype or values.shape != tuple(shape) or _digest(values) != digest:
        raise ValueError(f"{label} is corrupt: its contents do not match its SHA-256")
    return values


def _verified_array(directory: str, digest: str, dtype: str, shape) -> np.ndarray | None:
    """The array file ``digest``, checked against its digest once per process (memory-mapped after),
    or None where it is missing or damaged."""
    path = os.path.join(directory, f"{digest}.npy")
    try:
        status = os.stat(path)
        key = (path, status.st_size, status.st_mtime_ns)
        if key in _VERIFIED:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        values = _read_array(directory, digest, dtype, shape)
    except (OSError, ValueError):
        return None
    _VERIFIED.add(key)
    return values


class _ArrayStore:
    """The large arrays of one save: each compared with the previous checkpoint's array in the same
    slot (its order in the pickle), and referenced, stored as a delta, or written in full."""

    def __init__(self, root: str, previous: list):
        self.directory = os.path.join(root, "arrays")
        self.previous = previous
        self.slots: list[dict] = []

    def reference(self, values: np.ndarray) -> tuple:
        """``(digest, indices, changed values)`` of ``values`` against the file ``digest`` (the last two
        None, or the bytes of uint32 or int64 flat indices and of the values there)."""
        slot = len(self.slots)
        dtype, shape = str(values.dtype), list(values.shape)
        base = self._base(slot, dtype, shape)
        indices = changed = None
        if base is not None:
            bits, base_bits = _as_bits(values), _as_bits(base)
            differ = np.flatnonzero(bits != base_bits)
            index_type = _delta_index_type(values.size)
            if differ.size * (np.dtype(index_type).itemsize + values.dtype.itemsize) * _DELTA_SHARE < values.nbytes:
                digest = self.previous[slot]["digest"]
                if differ.size:  # as bytes: arrays inside the reference would be offered to the store again
                    indices, changed = differ.astype(index_type).tobytes(), values.reshape(-1)[differ].tobytes()
            else:
                base = None
        if base is None:
            digest = self._write(values)
        self.slots.append({"digest": digest, "dtype": dtype, "shape": shape})
        return digest, indices, changed

    def _base(self, slot: int, dtype: str, shape: list) -> np.ndarray | None:
        if slot >= len(self.previous):
            return None
        entry = self.previous[slot]
        if entry.get("dtype") != dtype or entry.get("shape") != shape or _as_bits(np.empty(0, dtype)) is None:
            return None
        # a missing or damaged base is not built upon: this save writes the array in full
        return _verified_array(self.directory, entry["digest"], dtype, shape)

    def _write(self, values: np.ndarray) -> str:
        digest = _digest(values)
        path = os.path.join(self.directory, f"{digest}.npy")
        # content-addressed: an existing file holds these bytes, unless it was damaged since (which is why
        # its column is written here, where a delta on it would have served), and then it is written anew:
        # kept, every later checkpoint would name the damaged file too
        if _verified_array(self.directory, digest, str(values.dtype), values.shape) is None:
            os.makedirs(self.directory, exist_ok=True)
            with written_atomically(path) as temporary, open(temporary, "wb") as handle:
                np.save(handle, values, allow_pickle=False)
                handle.flush()
                os.fsync(handle.fileno())
        return digest


class _StatePickler(pickle.Pickler):
    """state.pkl's pickler: the per-client columns (numpy arrays and ``array.array`` of ``clients`` rows
    and at least ``EXTERNAL_ARRAY_BYTES``) go to the :class:`_ArrayStore`, the pickle keeping their
    reference (and changed elements). Other arrays (the recorder's model, which changes at every
    checkpoint) stay in the pickle."""

    def __init__(self, handle, arrays: _ArrayStore, clients: int | None):
        super().__init__(handle, protocol=pickle.HIGHEST_PROTOCOL)
        self._arrays = arrays
        self._clients = clients
        self._seen: dict[int, tuple] = {}  # id -> (object, slot): an array pickled twice is one array

    def persistent_id(self, obj):
        kind = type(obj)
        if kind is np.ndarray:
            if obj.nbytes < EXTERNAL_ARRAY_BYTES or not obj.shape or obj.shape[0] != self._clients \
                    or obj.dtype.kind not in "biuf" or not obj.dtype.isnative or not obj.flags.c_contiguous:
                return None
            values, code = obj, None
        elif kind is array.array:
            if obj.itemsize * len(obj) < EXTERNAL_ARRAY_BYTES or len(obj) != self._clients \
                    or obj.typecode not in _ARRAY_CODES:
                return None
            values, code = np.frombuffer(obj, dtype=obj.typecode), obj.typecode
        else:
            return None
        seen = self._seen.get(id(obj))
        if seen is not None:
            return (_PERSISTENT, "again", seen[1])
        slot = len(self._arrays.slots)
        digest, indices, changed = self._arrays.reference(values)
        self._seen[id(obj)] = (obj, slot)
        return (_PERSISTENT, 1, slot, code, str(values.dtype), tuple(values.shape), digest, indices, changed)


class _StateUnpickler(pickle.Unpickler):
    def __init__(self, handle, directory: str):
        super().__init__(handle)
        self._directory = directory
        self._loaded: dict[int, object] = {}

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and pid and pid[0] == _PERSISTENT):
            raise pickle.UnpicklingError(f"unknown persistent id {str(pid)[:80]}")
        if pid[1] == "again":
            return self._loaded[pid[2]]
        _, _, slot, code, dtype, shape, digest, indices, changed = pid
        values = _read_array(self._directory, digest, dtype, shape)
        if indices is not None:
            values.reshape(-1)[np.frombuffer(indices, _delta_index_type(values.size))] = np.frombuffer(changed, values.dtype)
        restored = values if code is None else array.array(code, values.tobytes())
        self._loaded[slot] = restored
        return restored


def _delete_unreferenced_arrays(root: str) -> None:
    """Delete the array files that no checkpoint under ``root`` (kept or being written) refers to."""
    directory = os.path.join(root, "arrays")
    if not os.path.isdir(directory):
        return
    referenced = set()
    for name in os.listdir(root):
        path = os.path.join(root, name, ARRAYS)
        if os.path.isfile(path):
            try:
                with open(path) as handle:
                    referenced.update(slot["digest"] for slot in json.load(handle)["slots"])
            except (OSError, ValueError, KeyError):
                return  # a manifest that cannot be read: keep every file rather than guess
    for name in os.listdir(directory):
        if name.removesuffix(".npy") not in referenced:
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass
