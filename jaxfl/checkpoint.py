"""Checkpoints of a run: the engine's device state with orbax, the scheduler's state with pickle.

Layout under ``RUN_DIR/checkpoints/``::

    ckpt-000012/device/     orbax: global model, server optimiser state, kept versions,
                            trained-but-unaggregated updates, the algorithm's device-hook state;
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


PACKING = "packing.json"
PACK_BELOW_BYTES = 1 << 20  # leaves this small are stacked with the others of their shape and dtype


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
    import numpy as np

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
    tree, packing = _nonempty(tree), None
    if jax.process_count() == 1:  # several processes write each array's slices: left one array per leaf
        tree, packing = _pack(tree)
    checkpointer = _checkpointer()
    checkpointer.save(os.path.join(temporary, "device"), tree)
    checkpointer.wait_until_finished()
    if not writes_files:
        return final
    if packing is not None:
        with open(os.path.join(temporary, PACKING), "w") as handle:
            json.dump(packing, handle)
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
    target = _nonempty(engine.checkpoint_target(meta))
    packing_path = os.path.join(folder, PACKING)
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

