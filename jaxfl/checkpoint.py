"""Checkpoints of a run: the engine's device state with orbax, the scheduler's state with pickle.

Layout under ``RUN_DIR/checkpoints/``::

    ckpt-000012/device/     orbax: global model, server optimiser state, kept versions,
                            trained-but-unaggregated updates, the algorithm's device-hook state
    ckpt-000012/client_state/
                            per-client tables of the hooks as ``.npy`` files, when they live in host
                            RAM or a memmap (on the device they go into the orbax tree)
    ckpt-000012/state.pkl   the simulation (clock, event queue, dispatch records, the policy with
                            its groups/buffers/RNGs, client speeds and faults), the engine's
                            bookkeeping, the recorder, and the byte lengths of events.csv and
                            metrics.csv at that moment
    ckpt-000012/config.json the resolved config the run was started with and its SHA-256
                            (:mod:`jaxfl.resume` refuses to continue under another one)
    latest                  the name of the newest complete checkpoint

A checkpoint is written into ``tmp-…`` and renamed into place only when complete, and ``latest``
is replaced atomically after that, so a crash at any moment leaves the previous checkpoint intact.
The two newest checkpoints are kept. The pickle is tied to the jaxfl version that wrote it.

In a run of several processes (:mod:`jaxfl.cluster`) ``run_dir`` is process 0's run directory on
every process, on a filesystem they all see: every process takes part in orbax's save and restore
(orbax synchronises them, and writes each array once, its slices shared out among the processes),
and process 0 alone writes the other files, since every process holds the same scheduler state.

>>> # save(run_dir, 12, simulation, engine, {"recorder": ...}); load(run_dir, engine)
"""
from __future__ import annotations

import json
import os
import pickle
import shutil

KEEP = 2


def _root(run_dir: str) -> str:
    return os.path.join(os.path.abspath(run_dir), "checkpoints")  # orbax needs absolute paths


def _checkpointer():
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


def _nonempty(tree: dict) -> dict:
    """Orbax stores no empty containers: drop them (restore targets are built the same way)."""
    return {k: v for k, v in tree.items() if not (isinstance(v, dict) and not v)}


def save(run_dir: str, number: int, simulation, engine, extra: dict, config: dict | None = None) -> str:
    """Write checkpoint ``number`` of a run; returns its folder. ``config`` (JSON-able: the run's
    resolved config and its hash, :func:`jaxfl.resume.checkpoint_config`) goes to ``config.json``.
    With several processes every process calls it, with the same ``run_dir`` and ``number``."""
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
    checkpointer = _checkpointer()
    checkpointer.save(os.path.join(temporary, "device"), _nonempty(tree))
    checkpointer.wait_until_finished()
    if not writes_files:
        return final
    engine.save_client_state_files(os.path.join(temporary, "client_state"))
    with open(os.path.join(temporary, "state.pkl"), "wb") as handle:
        pickle.dump({"simulation": simulation, "engine": meta, **extra}, handle, protocol=pickle.HIGHEST_PROTOCOL)
        handle.flush()
        os.fsync(handle.fileno())
    if config is not None:
        with open(os.path.join(temporary, "config.json"), "w") as handle:
            json.dump(config, handle, indent=1, sort_keys=True)
            handle.write("\n")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(temporary, final)
    pointer = os.path.join(root, "latest")
    with open(pointer + ".tmp", "w") as handle:
        handle.write(os.path.basename(final) + "\n")
    os.replace(pointer + ".tmp", pointer)
    for name in sorted(n for n in os.listdir(root) if n.startswith("ckpt-"))[:-KEEP]:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return final


def latest(run_dir: str) -> str | None:
    """The newest complete checkpoint folder of a run, or None."""
    pointer = os.path.join(_root(run_dir), "latest")
    if not os.path.isfile(pointer):
        return None
    with open(pointer) as handle:
        path = os.path.join(_root(run_dir), handle.read().strip())
    return path if os.path.isdir(path) else None


def load_state(folder: str) -> dict:
    """The pickled scheduler state of a checkpoint folder."""
    with open(os.path.join(folder, "state.pkl"), "rb") as handle:
        return pickle.load(handle)


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
    tree = _checkpointer().restore(os.path.join(folder, "device"), _nonempty(engine.checkpoint_target(meta)))
    tree.setdefault("batches", {})
    tree.setdefault("hooks", {})
    files = engine.read_client_state_files(os.path.join(folder, "client_state"), meta)
    if files is not None:
        tree["client_state"] = files
    return tree


def final_params(run_dir: str, template):
    """The global model at the end of a run (its last checkpoint), shaped like ``template``, on this
    process's first device (also for a run of several processes, whose arrays span devices this
    process does not have).

    >>> # params = final_params("runs/fedbuff-mnist10k-exp-c10-s0", model_params_template)
    """
    import jax
    import orbax.checkpoint as ocp

    folder = latest(run_dir)
    if folder is None:
        raise FileNotFoundError(f"run directory {run_dir!r} has no checkpoint")
    here = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    restored = ocp.Checkpointer(ocp.StandardCheckpointHandler()).restore(
        os.path.join(folder, "device"), args=ocp.args.StandardRestore(fallback_sharding=here))
    # Restored without a target the tree holds plain containers: give it the template's structure.
    return jax.tree.map(lambda _, leaf: jax.numpy.asarray(leaf), template, restored["params"])

