"""Per-client state of device hooks: tables of one row per client, placed where they fit.

Some papers keep something for every client of the federation: CC-FedAvg's bank of each client's
last update (Zhang et al., IEEE IoT Journal 2024, Algorithm 1), FedASMU's per-client coefficients
and previous update (Liu et al., AAAI 2024, Formulas 1–3). At 10^4 clients of a 1.2 M-parameter CNN
such a bank is 48 GB: it cannot live on the device, and an aggregation only ever reads and writes
the rows of the clients it involves. A hook therefore declares its per-client tables by their
initial row (:meth:`jaxfl.algorithms.DeviceHook.init_per_client`), and the engine keeps them all in
one :class:`ClientState`, placed once for the run:

- ``"device"`` while all tables together fit :data:`DEVICE_FRACTION` of the free device memory
  (on a CPU, of the available RAM): the training calls, kept versions and samples need the rest;
- else ``"host"``, NumPy arrays in RAM, while they fit :data:`HOST_FRACTION` of the available RAM;
- else ``"memmap"``, NumPy memory-mapped ``.npy`` files under ``RUN_DIR/client_state/``.

Hooks move only the rows they need (:meth:`ClientState.rows` gathers them onto the device,
:meth:`ClientState.set_rows` scatters them back), so the arithmetic is the same in every placement
and so are the results, bit for bit.

>>> import numpy as np, jax.numpy as jnp
>>> state = ClientState({"bank": {"delta": {"w": jnp.zeros(2)}}}, num_clients=4, placement="host")
>>> state.placement, state.nbytes
('host', 32)
>>> state.set_rows("bank", "delta", np.array([3, 1]), {"w": jnp.array([[1.0, 2.0], [3.0, 4.0]])})
>>> state.rows("bank", "delta", np.array([1, 3, 0]))["w"].tolist()
[[3.0, 4.0], [1.0, 2.0], [0.0, 0.0]]
"""
from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl._user_warnings import warn_user
from jaxfl.config import CLIENT_STATE_PLACEMENTS as PLACEMENTS
from jaxfl.execution import available_host_memory, bucket_size, free_device_memory
from jaxfl.kernels.tree import set_rows, tree_bytes
from jaxfl.scheduler.simulation import PluginError

PyTree = Any
# Per-client tables are a standing allocation; a training call is sized at run time from what is
# free then (the memory guard takes 80% of it), so the tables may take a quarter of the device and
# leave the training calls, kept versions and samples the rest.
DEVICE_FRACTION = 0.25
# Host RAM also holds the scheduler, the event buffers and the data as loaded; half of what is
# available leaves that room, and beyond it the operating system pages a memmap in and out as the
# rows are touched, rather than the process being killed.
HOST_FRACTION = 0.5
MEMMAP_CHUNK_BYTES = 64 * 2**20  # rows copied at a time when a memmap is filled or restored

log = logging.getLogger(__name__)


class ClientStatePlacementWarning(UserWarning):
    """The per-client tables did not fit the device and were placed in host RAM or a memmap."""


def choose_placement(table_bytes: int, device_free: int | None, host_available: int | None,
                     requested: str = "auto") -> tuple[str, str]:
    """``(placement, reason)`` for tables of ``table_bytes``: ``requested`` unless ``"auto"``, else
    the device while they fit :data:`DEVICE_FRACTION` of ``device_free``, host RAM while they fit
    :data:`HOST_FRACTION` of ``host_available``, else a memmap. Unknown figures count as room.

    >>> choose_placement(10, device_free=100, host_available=1000)[0]
    'device'
    >>> choose_placement(30, device_free=100, host_available=1000)
    ('host', '30 bytes > 25% of 100 bytes free on the device; <= 50% of 1000 bytes of available RAM')
    >>> choose_placement(600, 100, 1000)[0], choose_placement(600, 100, 1000, requested="device")[0]
    ('memmap', 'device')
    """
    if requested not in PLACEMENTS:
        raise ValueError(f"client_state={requested!r} is not allowed: one of {', '.join(PLACEMENTS)}")
    if requested != "auto":
        return requested, f"client_state={requested} was asked for"
    device_budget = None if device_free is None else int(DEVICE_FRACTION * device_free)
    if device_budget is None or table_bytes <= device_budget:
        return "device", f"{table_bytes} bytes <= {DEVICE_FRACTION:.0%} of {device_free} bytes free on the device"
    too_big = f"{table_bytes} bytes > {DEVICE_FRACTION:.0%} of {device_free} bytes free on the device"
    if host_available is None or table_bytes <= HOST_FRACTION * host_available:
        return "host", f"{too_big}; <= {HOST_FRACTION:.0%} of {host_available} bytes of available RAM"
    return "memmap", f"{too_big} and > {HOST_FRACTION:.0%} of {host_available} bytes of available RAM"


# Shared by every ClientState, so that engines built one after another (a comparison, a sweep) trace
# and compile the gather and the scatter once per table shape and bucket.
_gather = jax.jit(lambda tables, index: [table[index] for table in tables])
_scatter = jax.jit(set_rows, donate_argnums=0)


def _file_name(key: tuple[str, str], index: int) -> str:
    """The ``.npy`` file of leaf ``index`` of table ``key`` = (hook, table), in a memmap folder or a checkpoint."""
    return f"{key[0]}.{key[1]}.{index}.npy"


def _leaf_shapes(row: PyTree, num_clients: int) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct((num_clients,) + tuple(np.shape(leaf)), np.dtype(leaf.dtype))
            for leaf in jax.tree.leaves(row)]


class ClientState:
    """Every hook's per-client tables, in one placement (module docstring).

    ``rows`` maps hook name → table name → the initial row of every client (a pytree of arrays).
    ``placement`` is one of :data:`PLACEMENTS` (``"auto"`` chooses by :func:`choose_placement`);
    ``directory`` holds the memmap files (set later by :meth:`attach` when the run directory is
    made after the engine; a temporary folder if rows are touched before); ``device`` is where rows
    go (the engine's home device).
    """

    def __init__(self, rows: dict[str, dict[str, PyTree]], num_clients: int, placement: str = "auto",
                 device=None, directory: str | None = None):
        self.num_clients = num_clients
        self.device = device or jax.local_devices()[0]
        requested = placement
        self._initial = {(hook, table): row for hook, tables in rows.items() for table, row in (tables or {}).items()}
        self._treedefs = {key: jax.tree.structure(row) for key, row in self._initial.items()}
        self.shapes = {key: _leaf_shapes(row, num_clients) for key, row in self._initial.items()}
        self.nbytes = tree_bytes(self.shapes)
        if not self._initial:
            placement, self.reason = "device", "no per-client state"
        else:
            placement, self.reason = choose_placement(self.nbytes, free_device_memory(), available_host_memory(),
                                                      placement)
            if jax.process_count() > 1:  # the processes save their tables together: process 0's free memory decides
                from jaxfl.cluster import broadcast_text

                placement, self.reason = broadcast_text(f"{placement}\n{self.reason}").split("\n", 1)
        self.placement = placement
        self.peak_rows_bytes = 0  # the most bytes of rows one gather put on the device
        self._tables: dict[tuple[str, str], list] | None = None
        self._directory = directory
        self._temporary = None
        if self._initial:
            message = f"per-client state of {self.nbytes / 2**20:.1f} MiB placed on {placement} ({self.reason})"
            log.info(message)
            if placement in ("host", "memmap") and requested == "auto":
                warn_user(message, ClientStatePlacementWarning)
        if placement != "memmap" or directory is not None:
            self._tables = self._allocate()

    # ------------------------------------------------------------------ placement
    @property
    def keys(self) -> list[tuple[str, str]]:
        """The (hook, table) pairs held."""
        return list(self._initial)

    @property
    def device_bytes(self) -> int:
        """Bytes the tables hold on the device (0 unless placed there)."""
        return self.nbytes if self.placement == "device" else 0

    @property
    def directory(self) -> str | None:
        """Where the memmap files are (None until they are made, and for other placements)."""
        return self._directory if self.placement == "memmap" and self._tables is not None else None

    def attach(self, directory: str) -> None:
        """Put the memmap files in ``directory`` (the run's ``client_state`` folder); a no-op for the
        other placements. Called once the run directory exists, before any row is touched."""
        if self.placement == "memmap" and self._tables is None:
            self._directory = directory
            self._tables = self._allocate()

    def _storage(self) -> dict:
        if self._tables is None:  # a memmap of an engine used without a run directory
            self._temporary = tempfile.TemporaryDirectory(prefix="jaxfl-client-state-")
            self._directory = self._temporary.name
            self._tables = self._allocate()
        return self._tables

    def _allocate(self) -> dict:
        tables = {}
        if self.placement == "memmap":
            os.makedirs(self._directory, exist_ok=True)
        for key, row in self._initial.items():
            leaves = []
            for index, (leaf, shape) in enumerate(zip(jax.tree.leaves(row), self.shapes[key])):
                initial = np.asarray(leaf, dtype=shape.dtype)
                if self.placement == "device":
                    leaves.append(jax.device_put(jnp.broadcast_to(jnp.asarray(initial), shape.shape), self.device))
                    continue
                if self.placement == "host":
                    # Written in full now, not left as lazily paged zeros: the memory is committed
                    # before the run starts, and rows first touched mid-run would each pay a page
                    # fault (measured on the 2-core VM: 32 rows of 0.8 MB gathered and scattered in
                    # 90 ms on fresh zero pages, 6.5 ms on written ones; writing 1.5 GB took 0.25-1 s).
                    table = np.empty(shape.shape, shape.dtype)
                else:  # a new memmap reads as zeros; it may exceed RAM, so it is not written in full
                    table = np.lib.format.open_memmap(self._file(key, index), mode="w+", dtype=shape.dtype,
                                                      shape=shape.shape)
                if self.placement == "host" or initial.any():
                    for start, stop in self._chunks(shape):
                        table[start:stop] = initial
                leaves.append(table)
            tables[key] = leaves
        return tables

    def _file(self, key: tuple[str, str], index: int) -> str:
        return os.path.join(self._directory, _file_name(key, index))

    def _chunks(self, shape: jax.ShapeDtypeStruct):
        row_bytes = max(1, int(np.prod(shape.shape[1:])) * shape.dtype.itemsize)
        step = max(1, MEMMAP_CHUNK_BYTES // row_bytes)
        return [(start, min(start + step, self.num_clients)) for start in range(0, self.num_clients, step)]

    # ------------------------------------------------------------------ rows
    def _checked_clients(self, hook: str, table: str, clients, valid=None) -> np.ndarray:
        """``clients`` as int32 ids, refused naming the table where one is out of range or, among the
        ``valid`` rows of a write, repeated: on the device a gather clamps (row 7 of 4 read row 3) and a
        scatter drops or picks one at random, where host RAM raised, so placements disagreed."""
        ids = np.asarray(clients)
        if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)
                                 or (np.issubdtype(ids.dtype, np.floating) and np.all(ids == np.round(ids)))):
            raise PluginError(f"client table {hook}/{table}: clients must be a 1-d sequence of integer ids, got "
                              f"{ids.dtype} of shape {ids.shape}")
        # a write's padding rows (valid False) are not written: whatever id they hold is fine
        written = ids if valid is None else ids[np.asarray(valid, bool)]
        if written.size and (written.min() < 0 or written.max() >= self.num_clients):
            bad = written[(written < 0) | (written >= self.num_clients)]
            raise PluginError(f"client table {hook}/{table}: client ids {bad[:5].tolist()} are out of range: "
                              f"0 to {self.num_clients - 1}")
        if valid is not None:
            values, counts = np.unique(written, return_counts=True)
            if (counts > 1).any():
                raise PluginError(f"client table {hook}/{table}: a write names clients {values[counts > 1][:5].tolist()} "
                                  "more than once; each valid row must be another client's")
            ids = np.where(np.asarray(valid, bool), ids, 0)  # padding points at row 0, which it does not write
        return ids.astype(np.int32)

    def rows(self, hook: str, table: str, clients) -> PyTree:
        """The rows of ``clients`` (in that order, repeats allowed) of a table, stacked on a leading
        axis on the device."""
        key = (hook, table)
        clients = self._checked_clients(hook, table, clients)
        leaves = self._storage()[key]
        if self.placement == "device":
            padded = np.zeros(bucket_size(len(clients)), np.int32)  # one compilation per bucket
            padded[:len(clients)] = clients
            gathered = _gather(leaves, jnp.asarray(padded))
            rows = [leaf[:len(clients)] for leaf in gathered] if len(padded) != len(clients) else gathered
        else:
            rows = [jax.device_put(np.take(leaf, clients, axis=0), self.device) for leaf in leaves]
        self.peak_rows_bytes = max(self.peak_rows_bytes, tree_bytes(rows))
        return jax.tree.unflatten(self._treedefs[key], rows)

    def set_rows(self, hook: str, table: str, clients, values: PyTree, valid=None) -> None:
        """Write ``values`` (stacked like :meth:`rows` returns them) into the rows of ``clients``; rows
        where ``valid`` is False (padding) are not written. Valid clients must not repeat."""
        key = (hook, table)
        valid = np.ones(np.size(clients), bool) if valid is None else np.asarray(valid, bool)
        clients = self._checked_clients(hook, table, clients, valid)
        leaves = self._storage()[key]
        values = jax.tree.leaves(values)
        for index, (value, leaf) in enumerate(zip(values, leaves)):
            # checked here: the device path pads to its bucket first, and the error named the padded rows
            if tuple(np.shape(value)) != (len(clients), *leaf.shape[1:]):
                raise PluginError(f"client table {hook}/{table}: a write of {len(clients)} clients got leaf {index} "
                                  f"of shape {tuple(np.shape(value))}; one row per client named (padding rows "
                                  f"with valid=False), each of the table's shape {tuple(leaf.shape[1:])}: "
                                  f"{(len(clients), *leaf.shape[1:])}")
        if len(values) != len(leaves):
            raise PluginError(f"client table {hook}/{table}: a write of {len(values)} leaves, the table has "
                              f"{len(leaves)}; give values of the structure init_per_client declared")
        if self.placement == "device":
            size = bucket_size(len(clients))
            index, written = np.zeros(size, np.int32), np.zeros(size, bool)  # padding: not written
            index[:len(clients)], written[:len(clients)] = clients, valid
            if size != len(clients):
                values = [jnp.concatenate([v, jnp.zeros((size - len(clients),) + v.shape[1:], v.dtype)])
                          for v in values]
            self._storage()[key] = _scatter(leaves, jnp.asarray(index), values, jnp.asarray(written))
            return
        values = jax.device_get(values)
        for leaf, value in zip(leaves, values):
            leaf[clients[valid]] = np.asarray(value)[valid].astype(leaf.dtype, copy=False)

    # ------------------------------------------------------------------ checkpoints
    def arrays(self) -> dict[str, dict[str, PyTree]]:
        """hook → table → its whole table (device arrays, NumPy arrays or memmaps, as placed)."""
        return self._nested(self._storage())

    def targets(self) -> dict[str, dict[str, PyTree]]:
        """Shapes and dtypes of :meth:`arrays` (for restoring a device copy with orbax)."""
        return self._nested(self.shapes)

    def _nested(self, leaves_by_key: dict) -> dict[str, dict[str, PyTree]]:
        """hook → table → the pytree of that table's ``leaves_by_key[(hook, table)]``."""
        nested: dict[str, dict[str, PyTree]] = {}
        for key in self._initial:
            nested.setdefault(key[0], {})[key[1]] = jax.tree.unflatten(self._treedefs[key], leaves_by_key[key])
        return nested

    def save_files(self, folder: str) -> list[str]:
        """Write every table as ``.npy`` files into ``folder`` (a checkpoint's); returns their names."""
        os.makedirs(folder, exist_ok=True)
        names = []
        for key, leaves in self._storage().items():
            for index, leaf in enumerate(leaves):
                name = _file_name(key, index)
                saved = np.lib.format.open_memmap(os.path.join(folder, name), mode="w+", dtype=leaf.dtype,
                                                  shape=leaf.shape)
                for start, stop in self._chunks(self.shapes[key][index]):
                    saved[start:stop] = np.asarray(leaf[start:stop])
                saved.flush()
                del saved
                names.append(name)
        return names

    @staticmethod
    def read_files(folder: str, targets: dict) -> dict:
        """The tables :meth:`save_files` wrote into ``folder``, memory-mapped read-only, shaped as
        ``targets`` (:meth:`targets`); a file of another shape or dtype raises ``ValueError``."""
        nested = {}
        for hook, tables in targets.items():
            for table, target in tables.items():
                leaves, treedef = jax.tree.flatten(target)
                read = []
                for index, shape in enumerate(leaves):
                    array = np.load(os.path.join(folder, _file_name((hook, table), index)), mmap_mode="r")
                    if array.shape != shape.shape or array.dtype != shape.dtype:
                        raise ValueError(f"client state {hook}.{table} leaf {index} is {array.dtype}{array.shape}, "
                                         f"expected {shape.dtype}{shape.shape}")
                    read.append(array)
                nested.setdefault(hook, {})[table] = jax.tree.unflatten(treedef, read)
        return nested

    def load(self, arrays: dict) -> None:
        """Replace every table with ``arrays`` (as :meth:`arrays` or :meth:`read_files` give them,
        from any placement), copied into this one's."""
        tables = self._storage()
        for key in self._initial:
            saved = jax.tree.leaves(arrays[key[0]][key[1]])
            for index, (leaf, shape) in enumerate(zip(saved, self.shapes[key])):
                if self.placement == "device":
                    tables[key][index] = jax.device_put(jnp.asarray(leaf, shape.dtype), self.device)
                    continue
                for start, stop in self._chunks(shape):
                    tables[key][index][start:stop] = np.asarray(leaf[start:stop])
