"""What a run takes besides its :class:`~jaxfl.config.RunConfig`: your own model, client optimiser,
initial parameters, client speeds, loss and extra metrics (``run_experiment``'s keyword arguments).

None of these fits in ``config.json`` (they are Python objects and arrays), so a run records each
honestly instead: ``config.model`` / ``config.client_optimizer`` become ``<user: module.Name>``,
``config.json``'s ``user_inputs`` holds the names and SHA-256 fingerprints, and the speeds array is
saved as ``client_time_per_step.npy`` in the run directory. ``resume_experiment(run_dir, model=...)``
takes the objects again and refuses a run whose recorded inputs are missing or differ.

Every check here runs before any work, with a one-line ``ValueError`` naming the bad value.

>>> import optax
>>> inputs = UserInputs(client_optimizer=optax.sgd(0.1), time_per_step=[0.1, 0.2, 0.3])
>>> from jaxfl.config import RunConfig
>>> inputs.label(RunConfig(clients=3)).client_optimizer
'<user: optax.GradientTransformation>'
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from jaxfl._user_warnings import warn_user
from jaxfl.config import USER_PREFIX, user_path, ClientConfig, DataConfig, RunConfig, SpeedsConfig

__all__ = ["TIME_PER_STEP_FILE", "UserInputs", "load_time_per_step", "match_init_params", "optimizer_fingerprint",
           "saved_time_per_step",
           "tree_fingerprint"]

TIME_PER_STEP_FILE = "client_time_per_step.npy"
OPTIMIZER_LABEL = USER_PREFIX + "optax.GradientTransformation>"
_OBJECTS = ("model", "client_optimizer", "loss", "metrics")  # Python objects: given again on resume


def _short(obj) -> str:
    """``repr(obj)`` cut to 60 characters, for one-line errors about a user's object."""
    text = repr(obj)
    return text if len(text) <= 60 else text[:57] + "..."


def tree_fingerprint(tree, values: bool = True) -> str:
    """SHA-256 of a pytree's leaf paths, shapes and dtypes (and its values unless ``values=False``).

    Example:
        >>> import numpy as np
        >>> a = tree_fingerprint({"w": np.zeros(3, np.float32)})
        >>> a == tree_fingerprint({"w": np.zeros(3, np.float32)}), a == tree_fingerprint({"w": np.ones(3, np.float32)})
        (True, False)
    """
    import jax

    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        digest.update(f"{jax.tree_util.keystr(path)}|{tuple(leaf.shape)}|{np.dtype(leaf.dtype).str};".encode())
        if values:
            digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return digest.hexdigest()


def match_init_params(init_params, abstract: dict) -> dict:
    """``init_params`` in the layout the engine carries (``{"params": ...}`` plus ``{"state": ...}``
    when given), checked against the model's abstract variables ``abstract``
    (:meth:`~jaxfl.models.adapter.ModelAdapter.init_variables` under ``jax.eval_shape``).

    Accepted: the trainable params alone (what ``ModelAdapter.init`` returns; the caller keeps the
    model's own initial state), ``{"params": ..., "state": ...}``, a linen variables dict ``{"params": ...,
    "batch_stats": ...}``, or an ``nnx.State``. A mismatch raises ``ValueError`` naming the first
    leaf path that differs, with both shapes and dtypes.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> abstract = {"params": {"w": jax.ShapeDtypeStruct((2, 3), jnp.float32)}}
        >>> sorted(match_init_params({"w": jnp.ones((2, 3))}, abstract)["params"])
        ['w']
        >>> match_init_params({"w": jnp.ones((3, 2))}, abstract)
        Traceback (most recent call last):
        ...
        ValueError: init_params['w'] has shape (3, 2) float32 but the model's is (2, 3) float32
    """
    init_params = _pure_nnx_state(init_params)
    if isinstance(init_params, Mapping):  # flax's FrozenDict (linen's variables before flax 0.8), at any depth
        from flax.core import unfreeze

        init_params = unfreeze(init_params)
    expected_params = abstract["params"]
    given = {"params": init_params}
    root = "init_params"
    if isinstance(init_params, dict) and "params" in init_params and not (
            isinstance(expected_params, dict) and "params" in expected_params):
        rest = {key: value for key, value in init_params.items() if key != "params"}
        given = {"params": init_params["params"]}
        if rest:
            given["state"] = rest["state"] if set(rest) == {"state"} else rest
        root = None  # paths then start at the layout's own keys
    chosen = {key: abstract[key] for key in given if key in abstract}
    for key in given:
        if key not in abstract:
            raise ValueError(f"init_params[{key!r}] is given but the model keeps no non-trainable state")
    return {key: _same_tree(given[key], expected, root if root is not None else f"init_params[{key!r}]")
            for key, expected in chosen.items()}


def _pure_nnx_state(init_params):
    """``init_params`` with any ``nnx.State`` in it as plain dicts: a whole model's state
    (``nnx.state(model)``) split as the adapter splits a model, its ``nnx.Param`` as the params, its
    RNG streams (a Dropout's count and key: not parameters) left out and the rest (``nnx.BatchStat``)
    as the state; a ``{"params": State, "state": State}`` dict's States each as a dict.

    >>> from flax import nnx
    >>> model = nnx.Sequential(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.BatchNorm(2, rngs=nnx.Rngs(0)),
    ...                        nnx.Dropout(0.1, rngs=nnx.Rngs(0)))
    >>> pure = _pure_nnx_state(nnx.state(model))
    >>> sorted(pure), sorted(pure["state"]["layers"][1])
    (['params', 'state'], ['mean', 'var'])
    """
    import jax
    from flax import nnx

    if isinstance(init_params, nnx.State):
        params, _, rest = nnx.split_state(init_params, nnx.Param, nnx.RngState, ...)
        rest = nnx.to_pure_dict(rest)
        if not jax.tree_util.tree_leaves(rest):
            return nnx.to_pure_dict(params)  # a model without state: its params alone
        return {"params": nnx.to_pure_dict(params), "state": rest}
    if isinstance(init_params, dict) and any(isinstance(value, nnx.State) for value in init_params.values()):
        return {key: nnx.to_pure_dict(value) if isinstance(value, nnx.State) else value
                for key, value in init_params.items()}
    return init_params


def _same_tree(given, expected, label: str):
    """``given`` rebuilt with ``expected``'s structure, or ValueError at the first differing leaf."""
    import jax
    import jax.numpy as jnp

    def by_path(tree):
        return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}

    def describe(leaf):
        return f"{tuple(leaf.shape)} {np.dtype(leaf.dtype).name}"

    try:
        given_leaves = {path: jnp.asarray(leaf) for path, leaf in by_path(given).items()}
    except TypeError as error:
        raise ValueError(f"{label} holds a leaf that is not an array: {error}") from None
    expected_flat, treedef = jax.tree_util.tree_flatten_with_path(expected)
    for path, leaf in expected_flat:
        key = jax.tree_util.keystr(path)
        if key not in given_leaves:
            raise ValueError(f"{label}{key} is missing: the model has a leaf of {describe(leaf)} there")
        mine = given_leaves[key]
        if mine.shape != leaf.shape or mine.dtype != leaf.dtype:
            raise ValueError(f"{label}{key} has shape {describe(mine)} but the model's is {describe(leaf)}")
        if jnp.issubdtype(mine.dtype, jnp.inexact) and not bool(jnp.isfinite(mine).all()):
            # else the run stopped at version 0 blaming an aggregation and the server learning rate
            raise ValueError(f"{label}{key} holds NaN or Inf: initial parameters must be finite")
    known = {jax.tree_util.keystr(path) for path, _ in expected_flat}
    extra = [key for key in given_leaves if key not in known]
    if extra:
        raise ValueError(f"{label}{extra[0]} is not a leaf of the model")
    return jax.tree_util.tree_unflatten(treedef, [given_leaves[jax.tree_util.keystr(path)]
                                                  for path, _ in expected_flat])


def _trainable(variables):
    """The trainable part of a model's variables (their ``"params"``), or ``variables`` as they are."""
    return variables["params"] if isinstance(variables, dict) and "params" in variables else variables


# The probe's gradient sizes, one per step: small and large (a clipping threshold clips some and not
# others), changing direction too (optimizer_probe), so that a learning rate, momentum, both of
# Adam's betas, a decay, a clipping threshold or a schedule's first steps each move its updates.
PROBE_SCALES = (0.01, 3.0, 0.2, 50.0, 0.05, 1.0, 7.0, 0.001, 0.5, 20.0, 0.02, 2.0, 0.1, 100.0, 0.3, 5.0)


def optimizer_fingerprint(optimizer, variables) -> dict:
    """What can be told of an optax object from outside, to recognise it on resume: the SHA-256 of
    its state's structure on ``variables``' trainable part (their ``"params"``), and its updates over
    ``len(PROBE_SCALES)`` steps from gradients of changing size and direction (:func:`optimizer_probe`),
    unless ``variables`` are shapes only (a timing-only run) or the update needs more than
    ``(gradient, state, params)``.

    Example:
        >>> import optax
        >>> variables = {"params": {"w": np.ones((2, 3), np.float32)}}
        >>> sgd, adam = (optimizer_fingerprint(o, variables) for o in (optax.sgd(0.1), optax.adam(0.1)))
        >>> sgd["client_optimizer_state_sha256"] == adam["client_optimizer_state_sha256"]
        False
        >>> len(sgd["client_optimizer_probe_steps"])   # each step's mean |update| and mean update, each leaf's sum
        33
    """
    import jax

    trainable = _trainable(variables)
    state = jax.eval_shape(optimizer.init, trainable)
    digest = hashlib.sha256(str(jax.tree.structure(state)).encode())
    for leaf in jax.tree.leaves(state):
        digest.update(f"{tuple(leaf.shape)}|{np.dtype(leaf.dtype).str};".encode())
    record: dict[str, Any] = {"client_optimizer_state_sha256": digest.hexdigest()}
    if any(isinstance(leaf, jax.ShapeDtypeStruct) or not getattr(leaf, "is_fully_addressable", True)
           for leaf in jax.tree.leaves(trainable)):  # shapes only, or arrays spanning other processes
        return record
    try:
        record["client_optimizer_probe_steps"] = optimizer_probe(optimizer, trainable)
    except Exception:  # noqa: BLE001 -- an update that needs more than (gradient, state, params): the structure alone
        pass
    return record


def optimizer_probe(optimizer, params) -> list[float]:
    """``optimizer``'s updates on ``params`` over ``len(PROBE_SCALES)`` steps, each step's gradient
    a fixed pattern of signs and sizes (a sine over each leaf's elements, shifted each step) times
    that step's scale: per step the mean |update| and the mean update over all elements, then per
    leaf the mean |sum of its updates|. Two optimisers that differ in a learning rate, a momentum or
    beta, a clipping threshold or a schedule over these steps give other numbers (a schedule that
    differs only after them does not). Computed on the CPU (a few numbers).

    >>> import optax
    >>> params = {"w": np.ones((2, 3), np.float32)}
    >>> probes = [optimizer_probe(o, params) for o in (optax.adam(1e-2), optax.adam(1e-2, b1=0.5),
    ...                                                optax.adam(1e-2, b2=0.9), optax.adam(2e-2))]
    >>> all(not np.allclose(a, b, rtol=1e-5) for i, a in enumerate(probes) for b in probes[i + 1:])
    True
    """
    import jax

    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(params)]
    treedef = jax.tree.structure(params)
    positions = [np.arange(leaf.size, dtype=np.float32).reshape(leaf.shape) for leaf in leaves]
    # op by op, not one jitted program: jax compiles each operation once per process and shape, so a
    # notebook's later runs probe in ~0.1 s, where a program compiled for each optimiser object took ~1 s
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        params = jax.tree.unflatten(treedef, leaves)
        state = optimizer.init(params)
        totals = [np.zeros(leaf.shape, np.float64) for leaf in leaves]
        figures = []
        for step, scale in enumerate(PROBE_SCALES):
            gradient = [(np.sin(0.7 * position + 1.3 * step + index) * scale).astype(leaf.dtype)
                        for index, (position, leaf) in enumerate(zip(positions, leaves))]
            update, state = optimizer.update(jax.tree.unflatten(treedef, gradient), state, params)
            flat = [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(update)]
            count = sum(leaf.size for leaf in flat)
            figures += [sum(np.abs(leaf).sum() for leaf in flat) / count, sum(leaf.sum() for leaf in flat) / count]
            totals = [total + leaf for total, leaf in zip(totals, flat)]
    return [float(value) for value in figures + [np.mean(np.abs(total)) for total in totals]]


def _first_two_updates(optimizer, params) -> list[float] | None:
    """The probe of runs made before 2026-12-05 (``client_optimizer_probe`` in their config): the mean
    |update| of each leaf over the first two updates from the gradient 0.01 everywhere, which did
    not tell Adam's betas, a clipping threshold or a schedule's length apart. None where the update
    needs more than (gradient, state, params)."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def first_updates(params):
        gradient = jax.tree.map(lambda leaf: jnp.full(jnp.shape(leaf), 0.01, jnp.result_type(leaf)), params)
        opt_state = optimizer.init(params)
        first, opt_state = optimizer.update(gradient, opt_state, params)
        second, _ = optimizer.update(gradient, opt_state, params)
        return [jnp.mean(jnp.abs(update)) for update in jax.tree.leaves(first) + jax.tree.leaves(second)]

    try:
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            return [float(value) for value in first_updates(jax.tree.map(np.asarray, params))]
    except Exception:  # noqa: BLE001 -- as optimizer_fingerprint
        return None


def linen_settings(model) -> dict[str, str] | None:
    """A linen module instance's fields as text (``repr``, memory addresses left out), to recognise
    it on resume where its parameter shapes alone do not tell (another activation, dropout rate or
    BatchNorm momentum); None for anything else (an nnx module, a class or a factory).

    >>> import flax.linen as nn
    >>> linen_settings(nn.Dropout(0.5))["rate"]
    '0.5'
    """
    import flax.linen as nn

    if not isinstance(model, nn.Module):
        return None
    return {field.name: re.sub(r" at 0x[0-9a-fA-F]+", "", _stable_repr(getattr(model, field.name, None)))
            for field in dataclasses.fields(model) if field.name not in ("parent", "name")}


def _stable_repr(value) -> str:
    """``repr(value)`` with sets in sorted order, through tuples, lists and dicts: a set of strings
    prints in another order in each process (PYTHONHASHSEED), the same model read as another one.

    >>> _stable_repr({"b": frozenset({"y", "x"}), "a": (1, {2, 1})})
    "{'b': frozenset({'x', 'y'}), 'a': (1, {1, 2})}"
    """
    if isinstance(value, (set, frozenset)) and value:
        inner = ", ".join(sorted(_stable_repr(item) for item in value))
        return f"frozenset({{{inner}}})" if isinstance(value, frozenset) else f"{{{inner}}}"
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        inner = ", ".join(_stable_repr(item) for item in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(_stable_repr(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_stable_repr(key)}: {_stable_repr(item)}" for key, item in value.items()) + "}"
    return repr(value)


def load_time_per_step(path: str):
    """Seconds per step per client from a ``.npy`` file or a ``.csv``/``.txt`` file of numbers: one
    number per line, or one row of numbers separated by commas, spaces or tabs; a first line with no
    number in it is a header and is skipped. A table (a trace with a row per client) is read where its
    header names the column: ``time_per_step`` or ``seconds_per_step`` (any case, ``-``, ``_`` or
    spaces), in the order of a ``client``, ``client_id``, ``client_index`` or ``id`` column of
    distinct integers where it has one (the smallest id is client 0), else in file order; its other
    columns are not read, and a UserWarning names them, except a latency or bandwidth column whose name
    says its unit (``latency_s``, ``latency_ms``, ``bandwidth_bytes_per_s``, ``bandwidth_kbps``,
    ``bandwidth_mbps``): each client's network, read into a structured array (``time_per_step``,
    ``latency`` in seconds, ``bandwidth`` in bytes per second; a ``.npy`` file may hold one too). Any
    other table is refused (which column holds the times is not guessed), as are an empty file and a
    suffix other than these.

    Example:
        >>> import tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> path = os.path.join(folder, "speeds.csv")
        >>> _ = open(path, "w").write("seconds\\n0.1\\n0.25\\n")
        >>> load_time_per_step(path)
        array([0.1 , 0.25])
        >>> _ = open(path, "w").write("0.1 0.2\\t0.3, 0.4\\n")
        >>> load_time_per_step(path)
        array([0.1, 0.2, 0.3, 0.4])
        >>> _ = open(path, "w").write("client_id,seconds_per_step\\n2,0.25\\n1,0.12\\n")
        >>> load_time_per_step(path)
        array([0.12, 0.25])
        >>> _ = open(path, "w").write("device,speed\\n1,0.12\\n2,0.25\\n")
        >>> load_time_per_step(path)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: time_per_step file ... holds a table (2 rows of 2 columns): ...; keep only the seconds-per-step column
    """
    path = user_path(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".npy", ".csv", ".txt"):
        raise ValueError(f"time_per_step file {path!r} must end in .npy, .csv or .txt")
    if os.path.isdir(path):
        raise ValueError(f"time_per_step file {path!r} is a directory: give a .npy, .csv or .txt file")
    if not os.path.isfile(path):
        raise ValueError(f"time_per_step file {path!r} does not exist")
    if suffix == ".npy":
        try:
            times = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as error:
            # np.load's own text for a pickled or damaged file speaks of allow_pickle, which is not the user's
            cause = "it has no .npy header (a pickle, text or other data)" if "allow_pickle" in str(error) else \
                f"it is not a valid .npy file ({error})"
            raise ValueError(f"time_per_step file {path!r} could not be read as numbers: {cause}; expected a "
                             "numeric array saved with np.save (seconds per step, one per client)") from None
        if not isinstance(times, np.ndarray) or (times.dtype.kind not in "iuf" and not times.dtype.names):
            kind = f"dtype {times.dtype}" if isinstance(times, np.ndarray) else type(times).__name__
            raise ValueError(f"time_per_step file {path!r} holds an array of {kind}, not numbers: expected integer or "
                             "floating-point seconds per step, one per client")
        return times
    return _time_per_step_from_text(path)


def saved_time_per_step(run_dir: str, recorded: dict) -> np.ndarray:
    """The seconds per step a run was given, read back from ``run_dir`` as its ``config.json``'s
    ``user_inputs.time_per_step`` (``recorded``: its file and SHA-256) names them; ValueError where the
    file is missing or is not the one recorded (a resume, and ``jaxfl run --config RUN/config.json``)."""
    path = os.path.join(run_dir, recorded["file"])
    if not os.path.isfile(path):
        raise ValueError(f"run {run_dir!r} was made with time_per_step but {path!r} is missing")
    saved = np.load(path, allow_pickle=False)
    if hashlib.sha256(saved.tobytes()).hexdigest() != recorded["sha256"]:
        raise ValueError(f"{path!r} does not match the fingerprint in config.json (was it edited?)")
    return saved


_ALLOWED_TEXT = "one number per line (an optional header line first), or one row of numbers separated by commas, " \
                "spaces or tabs"

# a table's columns by name, compared without case, spaces, '-' or '_'
_TIME_COLUMNS = ("timeperstep", "secondsperstep")
_TIME_COLUMNS_TEXT = "time_per_step or seconds_per_step"
_ID_COLUMNS = ("client", "clientid", "clientindex", "id")
# a trace's network columns, read where their names say their unit: (column, factor to seconds or bytes/s);
# kbps, mbps and gbps are bits a second, and bytes where the name writes a capital B (MBps): _network_factor
_NETWORK_COLUMNS = {"latencys": ("latency", 1.0), "latencysec": ("latency", 1.0), "latencyseconds": ("latency", 1.0),
                    "latencyms": ("latency", 1e-3),
                    "bandwidthbytespers": ("bandwidth", 1.0), "bandwidthbytespersecond": ("bandwidth", 1.0),
                    "bandwidthkbps": ("bandwidth", 1e3 / 8), "bandwidthmbps": ("bandwidth", 1e6 / 8),
                    "bandwidthgbps": ("bandwidth", 1e9 / 8)}


def _network_factor(name: str) -> float:
    """The factor from a network column's unit to seconds or bytes per second: ``bandwidth_Mbps`` and
    ``bandwidth_mbps`` are megabits a second (÷ 8), ``bandwidth_MBps`` megabytes, told by the case of
    its B, which the column's key (:func:`_column_key`) lowercases.

    >>> _network_factor("bandwidth_mbps"), _network_factor("Bandwidth (MBps)"), _network_factor("latency_ms")
    (125000.0, 1000000.0, 0.001)
    """
    import re

    factor = _NETWORK_COLUMNS[_column_key(name)][1]
    unit = re.search(r"([kKmMgG])(B)ps\W*$", name)
    return factor * 8 if unit else factor
_NETWORK_UNITS = {"latency": "latency_s or latency_ms", "bandwidth": "bandwidth_bytes_per_s, bandwidth_kbps or "
                                                                      "bandwidth_mbps (bits)"}


def _column_key(name: str) -> str:
    import re

    return re.sub(r"[^a-z0-9]", "", name.lower())


def _trace_table(lines: list[tuple[int, str]], is_number) -> tuple[list[str], list] | None:
    """``(header, rows)`` of a trace table, a CSV (or tab-separated) file whose first line names a
    column :data:`_TIME_COLUMNS`, its fields split as a CSV reader splits them (quotes, names and
    values with spaces, empty fields kept); None for anything else.

    >>> number = lambda text: text.replace(".", "", 1).isdigit()
    >>> _trace_table([(1, 'client id,"seconds per step",os'), (2, '3,0.2,Pixel 7')], number)
    (['client id', 'seconds per step', 'os'], [(2, ['3', '0.2', 'Pixel 7'])])
    """
    import csv

    if len(lines) < 2:  # a header alone is said as such by the caller
        return None
    first = lines[0][1].strip()
    # European spreadsheets separate by ';' and write decimal commas
    delimiter = ";" if ";" in first else "," if "," in first else "\t" if "\t" in first else None

    def split(line: str) -> list[str]:
        if delimiter != "\t":
            line = line.strip()
        if delimiter is None:
            return line.split()
        fields = [field.strip() for field in next(csv.reader([line], delimiter=delimiter, skipinitialspace=True))]
        return [field.replace(",", ".") for field in fields] if delimiter == ";" else fields

    header = split(first)
    while header and header[-1] == "":  # a separator after the last name, as exporters write after every row
        header.pop()
    if len(header) < 2 or any(is_number(name) for name in header) or \
            not any(_column_key(name) in _TIME_COLUMNS for name in header):
        return None
    rows = []
    for number, line in lines[1:]:
        row = split(line)
        if len(row) > len(header) and not any(row[len(header):]):  # its trailing separators
            row = row[:len(header)]
        rows.append((number, row))
    return header, rows


def _times_from_table(path: str, header: list[str], rows: list, is_number) -> np.ndarray:
    """A trace table's seconds per step: the column headed time_per_step (or seconds_per_step), in
    the order of a client id column (client, client_id, client_index or id: distinct integers, the
    smallest id is client 0) where there is one, else in file order. A latency or bandwidth column
    whose name gives its unit (:data:`_NETWORK_COLUMNS`) is each client's network: the array is then
    structured, with ``latency`` in seconds and ``bandwidth`` in bytes per second beside
    ``time_per_step``. Other columns are not read, and a UserWarning names them (a latency or
    bandwidth column without a unit among them, with the names that are read)."""

    for number, row in rows:
        if len(row) != len(header):
            raise ValueError(f"time_per_step file {path!r} line {number}: {len(row)} field{'s' * (len(row) != 1)} "
                             "under a header of "
                             f"{len(header)} columns ({', '.join(header)})")
    keys = [_column_key(name) for name in header]
    times_at = [i for i, key in enumerate(keys) if key in _TIME_COLUMNS]
    ids_at = [i for i, key in enumerate(keys) if key in _ID_COLUMNS]
    network_at = {name: [i for i, key in enumerate(keys) if _NETWORK_COLUMNS.get(key, ("",))[0] == name]
                  for name in ("latency", "bandwidth")}
    for found, what in ((times_at, "seconds per step"), (ids_at, "client ids"), (network_at["latency"], "latency"),
                        (network_at["bandwidth"], "bandwidth")):
        if len(found) > 1:
            raise ValueError(f"time_per_step file {path!r} has {len(found)} columns of {what} "
                             f"({', '.join(repr(header[i]) for i in found)}): keep one")
    (time_at,) = times_at
    network_at = {name: found[0] for name, found in network_at.items() if found}
    for number, row in rows:
        for at in times_at + ids_at + list(network_at.values()):
            if not is_number(row[at]):
                shown = "an empty field" if row[at] == "" else repr(row[at])
                raise ValueError(f"time_per_step file {path!r} line {number}, column {header[at]!r}: {shown} is not "
                                 "a number")
    times = np.array([float(row[time_at]) for _, row in rows])
    from jaxfl.scheduler.speeds import NETWORK_ALLOWED, _network_value_allowed, trace_array

    network = {name: np.array([float(row[at]) for _, row in rows]) * _network_factor(header[at])
               for name, at in network_at.items()}
    for name, at in network_at.items():  # checked as written, naming the line (its client's index comes later)
        for (number, row), value in zip(rows, network[name].tolist()):
            if not _network_value_allowed(name, value):
                raise ValueError(f"time_per_step file {path!r} line {number}, column {header[at]!r}: {row[at]!r} is "
                                 f"not allowed: {NETWORK_ALLOWED[name]}")
    notes = []
    if ids_at:
        (id_at,) = ids_at
        ids = []
        for number, row in rows:
            try:  # as an integer, exactly: ids past 2^53 were compared as floats, and two of them as one
                ids.append(int(row[id_at]))
            except ValueError:
                value = float(row[id_at])
                if not value.is_integer():
                    raise ValueError(f"time_per_step file {path!r} line {number}, column {header[id_at]!r}: "
                                     f"{row[id_at]!r} is not an integer client id") from None
                ids.append(int(value))
        seen: dict[int, int] = {}
        for (number, _), value in zip(rows, ids):
            if value in seen:
                raise ValueError(f"time_per_step file {path!r}: client id {value} is on lines {seen[value]} "
                                 f"and {number} (column {header[id_at]!r}): each client needs one row")
            seen[value] = number
        order = sorted(range(len(ids)), key=ids.__getitem__)
        times = times[order]
        network = {name: values[order] for name, values in network.items()}
        ordered = [ids[i] for i in order]
        if ordered != list(range(ordered[0], ordered[0] + len(ordered))):  # gaps: renumbered, and said so
            shown = ", ".join(f"id {value} is client {client}" for client, value in enumerate(ordered[:3]))
            notes.append(f"its client ids are not consecutive: clients are numbered in id order ({shown}, ...)")
    read = [time_at, *ids_at, *network_at.values()]
    unread = [name for i, name in enumerate(header) if i not in read]
    if unread:
        # a latency or bandwidth whose unit the name does not say (ms or s? bits or bytes?) is not guessed
        unitless = [(name, what) for name in unread for what in _NETWORK_UNITS
                    if _column_key(name).startswith(what) and what not in network_at]
        hint = "".join(f" (to read {name!r} as each client's {what}, name its unit: {_NETWORK_UNITS[what]})"
                       for name, what in unitless)
        notes.insert(0, f"not read: {', '.join(repr(name) for name in unread)}{hint}")
    if notes:
        named = [header[time_at], *(header[at] for at in network_at.values())]
        warn_user(f"time_per_step file {path!r}: read column{'s' * (len(named) > 1)} "
                  f"{', '.join(repr(name) for name in named)}"
                  + (f" in the order of {header[ids_at[0]]!r}" if ids_at else "")
                  + "; " + "; ".join(notes))
    return trace_array(times, network)


def _time_per_step_from_text(path: str) -> np.ndarray:
    """The numbers of a ``.csv``/``.txt`` time_per_step file, or ValueError naming what it holds."""
    import re

    # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8") would make the first number look like a
    # header and silently drop the first client
    with open(path, encoding="utf-8-sig") as handle:
        # a table's lines keep their trailing tabs (a tab-separated row's empty last fields)
        raw = [(number, line.rstrip("\r\n").lstrip(" ")) for number, line in enumerate(handle, 1) if line.strip()]
    lines = [(number, line.strip()) for number, line in raw]
    if not lines:
        raise ValueError(f"time_per_step file {path!r} is empty: expected {_ALLOWED_TEXT}")

    def fields(line: str) -> list[str]:
        # a trailing comma is what some exporters write after every row; a comma with nothing
        # between it and the next one is a missing value, and dropping it would shift every client
        return re.split(r"\s*,\s*|\s+", line.rstrip(", \t"))

    def is_number(text: str) -> bool:
        try:
            float(text)
        except ValueError:
            return False
        return True

    table = _trace_table(raw, is_number)
    if table is not None:
        return _times_from_table(path, *table, is_number)
    rows = [(number, fields(line)) for number, line in lines]
    header = None
    # a header names columns and holds no number; a first line like "phone-a 0.12" is a table's row
    if not any(is_number(field) for field in rows[0][1]):
        header, rows = rows[0][1], rows[1:]  # only the first line may be a header
        if not rows:
            raise ValueError(f"time_per_step file {path!r} holds a header line and no numbers: "
                             f"expected {_ALLOWED_TEXT}")
    # the shape first: a table with a column of device names is a table, not a bad number
    widths = sorted({len(row) for _, row in rows})
    if len(rows) > 1 and widths != [1]:
        columns = f"{widths[0]} columns" if len(widths) == 1 else f"{widths[0]} to {widths[-1]} columns"
        raise ValueError(f"time_per_step file {path!r} holds a table ({len(rows)} rows of {columns}): expected "
                         f"{_ALLOWED_TEXT}, or a table whose header names a column {_TIME_COLUMNS_TEXT}; "
                         "keep only the seconds-per-step column")
    # one row under a header names the clients ("c0,c1,c2") or is a one-client table whose first
    # column holds ids ("client_id,seconds" over "1,0.12"): the id would become client 0's time
    ids = r"(client|device|node|user|phone)?(id|ids|index|idx|number)|(client|device|node|user|phone|name)s?"
    if header is not None and len(rows) == 1 and len(rows[0][1]) > 1 \
            and re.fullmatch(ids, _column_key(header[0])):
        raise ValueError(f"time_per_step file {path!r} holds a table (1 row of {len(rows[0][1])} columns, the first "
                         f"headed {header[0]!r}, a column of ids): expected {_ALLOWED_TEXT}; keep only the "
                         "seconds-per-step column")
    for number, row in rows:
        for field in row:
            if not is_number(field):
                shown = "an empty field" if field == "" else f"{field!r}"
                raise ValueError(f"time_per_step file {path!r} line {number}: {shown} is not a number "
                                 f"(expected {_ALLOWED_TEXT})")
    return np.array([float(field) for _, row in rows for field in row])



def drawing_settings(config: RunConfig) -> tuple[str, ...]:
    """The speed settings that only shape drawn times per step, so that times given to the run
    (``time_per_step``) leave them unread: the model, its ratio and μ (negative jittered times are
    clipped at a fraction of the fastest given time, not of μ; the pareto/zipf settings are refused
    without pareto/zipf).

    >>> drawing_settings(RunConfig())
    ('heterogeneity', 'speed_ratio', 'speed_mean')
    """
    return ("heterogeneity", "speed_ratio", "speed_mean")

def recorded_speeds_sha256(record: dict) -> str | None:
    """The SHA-256 of the given speeds a run's ``config.json`` (``record``) recorded, or None (drawn).

    >>> recorded_speeds_sha256({"user_inputs": {"time_per_step": {"sha256": "ab12"}}}), recorded_speeds_sha256({})
    ('ab12', None)
    """
    return (record.get("user_inputs", {}).get("time_per_step") or {}).get("sha256")


@dataclasses.dataclass(frozen=True)
class UserInputs:
    """``run_experiment``'s keyword arguments beyond the config (all optional).

    - ``model``: a Flax linen module, an nnx module class/instance or factory ``rngs -> Module``, a
      factory ``(num_classes=...) -> Module``, or a :class:`~jaxfl.models.ModelAdapter`;
    - ``client_optimizer``: any ``optax.GradientTransformation`` (schedules included), re-initialised at
      every dispatch as the built-in ones are, so a schedule's step count restarts at each dispatch;
    - ``init_params``: the global model's version 0 (see :func:`match_init_params`);
    - ``time_per_step``: (clients,) seconds per step, the clients' base speeds instead of draws;
    - ``loss``: per-example ``loss(logits, labels) -> (B,)`` for training and evaluation;
    - ``metrics``: ``metrics(logits, labels) -> {name: (B,) values}``, held-out means as extra
      ``metrics.csv`` columns.

    Example:
        >>> UserInputs(loss=42).check(RunConfig())
        Traceback (most recent call last):
        ...
        ValueError: loss=42 is not callable: expected loss(logits, labels) -> per-example losses (B,)
    """

    model: Any = None
    client_optimizer: Any = None
    init_params: Any = None
    time_per_step: Any = None
    loss: Callable | None = None
    metrics: Callable | None = None
    metric_names: tuple[str, ...] = ()  # what ``metrics`` returns, known once traced (check_functions)

    def given_again(self) -> tuple[str, ...]:
        """The Python objects given (of ``model``, ``client_optimizer``, ``loss``, ``metrics``), which a
        resume of the run must be given again.

        >>> UserInputs(loss=lambda logits, labels: logits[:, 0]).given_again()
        ('loss',)
        """
        return tuple(name for name in _OBJECTS if getattr(self, name) is not None)

    def _check_model_object(self) -> None:
        """``model`` is a model object (not a name, not something else), said before anything else of it."""
        from jaxfl.models import check_model_object

        if isinstance(self.model, str):
            raise ValueError(f"model={self.model!r} is a name: set it in the config (RunConfig(model={self.model!r})); "
                             "model= takes a model object")
        if self.model is not None:
            check_model_object(self.model)

    def check(self, config: RunConfig) -> "UserInputs":
        """The checks that need no data (types, signatures, the speeds array); ``time_per_step`` comes
        back as a float64 array. ``config`` must be validated."""
        import optax

        from jaxfl.scheduler.speeds import check_time_per_step, given_network

        self._check_model_object()
        if self.client_optimizer is not None and not isinstance(self.client_optimizer, optax.GradientTransformation):
            # optax.MultiSteps is a wrapper object whose transformation is one method away
            hint = "; its .gradient_transformation() is one" if callable(
                getattr(self.client_optimizer, "gradient_transformation", None)) else ""
            raise ValueError(f"client_optimizer={_short(self.client_optimizer)} is not an optax.GradientTransformation "
                             f"(e.g. optax.sgd(optax.cosine_decay_schedule(0.1, 1000))){hint}")
        if self.loss is not None and not callable(self.loss):
            raise ValueError(f"loss={_short(self.loss)} is not callable: expected loss(logits, labels) -> "
                             "per-example losses (B,)")
        if self.metrics is not None and not callable(self.metrics):
            raise ValueError(f"metrics={_short(self.metrics)} is not callable: expected metrics(logits, labels) -> "
                             "{name: per-example values (B,)}")
        times = self.time_per_step
        if times is not None:
            times = check_time_per_step(times, config.clients, config.speed_change_prob, config.speed_legacy_seed)
            for name in drawing_settings(config):  # read only to draw the times that the given ones replace
                default = getattr(SpeedsConfig, name)
                if getattr(config, name) != default:
                    raise ValueError(f"{name}={getattr(config, name)!r} is not allowed with time_per_step: it only "
                                     f"shapes drawn times, and the times are given (leave it at its default {default!r})")
            for name in given_network(times):  # the trace's column gives each client's
                default = getattr(SpeedsConfig, name)
                if getattr(config, name) != default:
                    raise ValueError(f"{name}={getattr(config, name)!r} is not allowed with a time_per_step trace "
                                     f"that has a {name} column: the trace gives each client's {name} (leave it "
                                     f"at its default {default!r})")
        return dataclasses.replace(self, time_per_step=times)

    def label(self, config: RunConfig) -> RunConfig:
        """``config`` with ``model`` / ``client_optimizer`` naming the given objects (``<user: ...>``).

        A config field set to something else as well is refused (one of the two would be ignored).
        """
        from jaxfl.models import user_label

        changes = {}
        if self.model is not None:
            self._check_model_object()  # model=5 beside config.model: "not a model", not the two models' clash
            label = user_label(self.model)
            if config.model not in (DataConfig.model, label):
                raise ValueError(f"model={label!r} is given and config.model={config.model!r} too: leave "
                                 f"config.model at its default ({DataConfig.model!r}); the run records {label!r}")
            changes["model"] = label
        elif isinstance(config.model, str) and config.model.startswith(USER_PREFIX):  # (not a str: validation says)
            raise ValueError(f"model={config.model!r} was a Python object given to run_experiment(model=...): pass "
                             f"it again (resume_experiment(run_dir, model=...))")
        if self.client_optimizer is not None:
            if config.client_optimizer not in (ClientConfig.client_optimizer, OPTIMIZER_LABEL):
                raise ValueError(f"client_optimizer= is an optax object and config.client_optimizer="
                                 f"{config.client_optimizer!r} too: leave the config's at its default")
            if config.client_lr != ClientConfig.client_lr:
                raise ValueError(f"client_lr={config.client_lr} is not read when client_optimizer= is an optax "
                                 "object: put the learning rate (or schedule) in it")
            for name in ("client_momentum", "client_weight_decay"):
                if getattr(config, name) != getattr(ClientConfig, name):
                    raise ValueError(f"{name}={getattr(config, name)} is not read when client_optimizer= is an "
                                     "optax object: put it in the object (optax.sgd(lr, momentum=...), "
                                     "optax.add_decayed_weights)")
            changes["client_optimizer"] = OPTIMIZER_LABEL
        elif isinstance(config.client_optimizer, str) and config.client_optimizer.startswith(USER_PREFIX):
            raise ValueError(f"client_optimizer={config.client_optimizer!r} was an optax object given to "
                             "run_experiment(client_optimizer=...): pass it again")
        return dataclasses.replace(config, **changes) if changes else config

    def check_functions(self, num_classes: int) -> tuple[str, ...]:
        """Trace ``loss`` and ``metrics`` on abstract logits ``(2, num_classes)`` and int32 labels;
        returns the extra metric names, or ValueError naming what the function returned."""
        import jax
        import jax.numpy as jnp

        logits = jax.ShapeDtypeStruct((2, num_classes), jnp.float32)
        labels = jax.ShapeDtypeStruct((2,), jnp.int32)
        what = f"logits (2, {num_classes}) float32 and labels (2,) int32"
        if self.loss is not None:
            try:
                out = jax.eval_shape(self.loss, logits, labels)
            except Exception as error:  # the user's function: any failure is reported in one line
                raise ValueError(f"loss={_short(self.loss)} failed on {what}: {type(error).__name__}: "
                                 f"{str(error).splitlines()[0] if str(error) else ''}") from error
            if not (hasattr(out, "shape") and out.shape == (2,) and jnp.issubdtype(out.dtype, jnp.floating)):
                raise ValueError(f"loss={_short(self.loss)} returned {_short(out)} on {what}; expected per-example "
                                 "float losses of shape (2,)")
        if self.metrics is None:
            return ()
        from jaxfl.experiment import METRIC_FIELDS

        try:
            out = jax.eval_shape(self.metrics, logits, labels)
        except Exception as error:
            raise ValueError(f"metrics={_short(self.metrics)} failed on {what}: {type(error).__name__}: "
                             f"{str(error).splitlines()[0] if str(error) else ''}") from error
        if not isinstance(out, dict) or not out:
            raise ValueError(f"metrics={_short(self.metrics)} returned {_short(out)}; expected a non-empty dict "
                             "{name: per-example values (B,)}")
        for name, value in out.items():
            reserved = METRIC_FIELDS + ("class_accuracy",)
            if not (isinstance(name, str) and name and name.replace("_", "").isalnum()) or name in reserved:
                raise ValueError(f"metrics name {name!r} is not allowed: letters, digits and _, other than "
                                 f"{', '.join(reserved)}")
            if not (hasattr(value, "shape") and value.shape == (2,)):
                raise ValueError(f"metrics[{name!r}] has shape {getattr(value, 'shape', type(value).__name__)} on "
                                 f"{what}; expected per-example values of shape (2,)")
        return tuple(out)

    def check_optimizer(self, variables) -> None:
        """The given ``client_optimizer`` updates from what a client step gives it, ``update(gradient,
        state, params)`` (traced on ``variables``' params: shapes, no work); one that needs more (the
        loss value: ``optax.contrib.reduce_on_plateau``, ``optax.lbfgs``) or params of its own layout
        (``optax.lookahead``) is a ValueError saying so, not a traceback from inside the step.

        >>> import optax
        >>> params = {"params": {"w": np.ones(3, np.float32)}}
        >>> UserInputs(client_optimizer=optax.sgd(0.1)).check_optimizer(params)
        >>> UserInputs(client_optimizer=optax.contrib.reduce_on_plateau()).check_optimizer(params)
        Traceback (most recent call last):
        ...
        ValueError: client_optimizer= cannot update from (gradient, state, params) alone, as a client's step calls it: ...
        """
        import jax

        if self.client_optimizer is None:
            return
        trainable = _trainable(variables)
        optimizer = self.client_optimizer
        try:
            jax.eval_shape(lambda params: optimizer.update(params, optimizer.init(params), params), trainable)
        except Exception as error:  # noqa: BLE001 -- whatever the object raises, said in one line
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ValueError(f"client_optimizer= cannot update from (gradient, state, params) alone, as a client's "
                             f"step calls it: {type(error).__name__}: {first} (an optimiser that needs the loss "
                             f"value, as optax.contrib.reduce_on_plateau and optax.lbfgs do, or params of its own "
                             f"layout, as optax.lookahead, does not fit a client step)") from None

    def loss_probe(self, num_classes: int) -> list[float] | None:
        """The per-example values of ``loss`` on fixed pseudo-random logits ``(4, num_classes)`` and
        labels, to recognise the function on resume (its label names only where it is defined: two
        lambdas, or two ``functools.partial`` of one function, share it); None without a loss.

        >>> import optax
        >>> UserInputs(loss=optax.softmax_cross_entropy_with_integer_labels).loss_probe(3)[0] > 0
        True
        """
        if self.loss is None:
            return None
        import jax
        import jax.numpy as jnp

        # on the CPU, as the optimiser's probe: a GPU's matrix products (TF32) would give a resume
        # on another backend other values
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            logits = jnp.asarray(np.random.default_rng(0).normal(size=(4, num_classes)) * 2, jnp.float32)
            labels = jnp.asarray(np.arange(4) % num_classes, jnp.int32)
            return np.asarray(self.loss(logits, labels), np.float64).tolist()

    def record(self, variables, num_classes: int | None = None) -> dict:
        """What ``config.json``'s ``user_inputs`` says about the given inputs (names, fingerprints);
        with ``num_classes``, the loss's values on fixed inputs too (:meth:`loss_probe`)."""
        import jax

        from jaxfl.models import user_label

        record: dict[str, Any] = {}
        if self.model is not None:
            record["model"] = user_label(self.model)
            settings = linen_settings(self.model)
            if settings is not None:
                record["model_settings"] = settings
        # a named model too: its code (or what is registered under its name) may change before a resume
        record["model_structure_sha256"] = tree_fingerprint(variables, values=False)
        if self.client_optimizer is not None:
            record["client_optimizer"] = OPTIMIZER_LABEL
            record.update(optimizer_fingerprint(self.client_optimizer, variables))
        if self.init_params is not None:  # a timing-only run has shapes only: no values to fingerprint
            concrete = not any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(variables))
            record["init_params_sha256"] = tree_fingerprint(variables) if concrete else None
        if self.time_per_step is not None:
            record["time_per_step"] = {"file": TIME_PER_STEP_FILE, "sha256": self.speeds_sha256()}
        for name in ("loss", "metrics"):
            if getattr(self, name) is not None:
                record[name] = user_label(getattr(self, name))
        if self.loss is not None and num_classes is not None:
            record["loss_probe"] = self.loss_probe(num_classes)
        if self.metrics is not None:
            record["metric_names"] = list(self.metric_names)
        return record

    def speeds_sha256(self) -> str | None:
        """The SHA-256 of the checked ``time_per_step`` array (``config.json`` records it), or None."""
        return None if self.time_per_step is None else hashlib.sha256(self.time_per_step.tobytes()).hexdigest()

    def save(self, run_dir: str) -> None:
        """Write the arrays the run directory keeps (the speeds) next to ``config.json``."""
        if self.time_per_step is not None:
            np.save(os.path.join(run_dir, TIME_PER_STEP_FILE), self.time_per_step, allow_pickle=False)

    def for_resume(self, run_dir: str, recorded: dict, data_missing: bool = False) -> "UserInputs":
        """These inputs checked against what the run in ``run_dir`` recorded; the speeds come from its
        ``client_time_per_step.npy`` when not given. One ``ValueError`` lists everything missing (with
        ``data``, where ``data_missing``: the run's data were passed in Python and are not given again).
        ``init_params`` are never missing: a resume continues from a checkpoint, which holds the model
        (a run without one is refused, :mod:`jaxfl.resume`); given, they must be the run's."""
        from jaxfl.models import user_label

        missing = [name for name in _OBJECTS if name in recorded and getattr(self, name) is None]
        if missing and data_missing:
            missing.insert(0, "data")
        if missing:
            raise ValueError(f"run {run_dir!r} was made with {', '.join(missing)} given as Python objects: pass "
                             f"{', '.join(f'{name}=...' for name in missing)} to resume_experiment")
        for name in ("model", "loss", "metrics"):
            given = getattr(self, name)
            if given is not None and name not in recorded:
                raise ValueError(f"run {run_dir!r} was made without a user {name}: resume it without {name}=")
            if given is not None and user_label(given) != recorded[name]:
                raise ValueError(f"run {run_dir!r} was made with {name} {recorded[name]}, not {user_label(given)}")
        if self.client_optimizer is not None and "client_optimizer" not in recorded:
            raise ValueError(f"run {run_dir!r} was made without a user client_optimizer: resume it without it")
        if self.init_params is not None and "init_params_sha256" not in recorded:
            raise ValueError(f"run {run_dir!r} was made without init_params: resume it without them")
        times = self.time_per_step
        if "time_per_step" in recorded:
            saved = saved_time_per_step(run_dir, recorded["time_per_step"])
            path = os.path.join(run_dir, recorded["time_per_step"]["file"])
            if times is not None and not np.array_equal(np.asarray(times, np.float64), saved):
                raise ValueError(f"time_per_step differs from the run's {path!r}")
            times = saved
        elif times is not None:
            raise ValueError(f"run {run_dir!r} was made without time_per_step: resume it without it")
        return dataclasses.replace(self, time_per_step=times)

    def check_resumed(self, run_dir: str, recorded: dict, variables) -> None:
        """After the model is built: its structure (and a linen module's settings), the client
        optimiser's and any init_params are the recorded ones."""
        then = recorded.get("model_settings")
        if self.model is not None and then is not None:
            now = linen_settings(self.model)
            if now is not None and now != then:
                changed = sorted(name for name in {*now, *then} if now.get(name) != then.get(name))
                raise ValueError(f"model= is not the model run {run_dir!r} was made with: its settings differ "
                                 f"({', '.join(f'{name}={now.get(name)}' for name in changed)} now, "
                                 f"{', '.join(f'{name}={then.get(name)}' for name in changed)} then)")
        if "model_structure_sha256" in recorded and \
                tree_fingerprint(variables, values=False) != recorded["model_structure_sha256"]:
            if self.model is not None:
                raise ValueError(f"model= has other parameter shapes than the model run {run_dir!r} was made with")
            raise ValueError(f"the model named in run {run_dir!r}'s config has other parameter shapes now than when "
                             "the run was made (its code, or the model registered under its name, changed since): "
                             "resume with the model the run was made with")
        if self.client_optimizer is not None and "client_optimizer_state_sha256" in recorded:
            now = optimizer_fingerprint(self.client_optimizer, variables)
            if now["client_optimizer_state_sha256"] != recorded["client_optimizer_state_sha256"]:
                raise ValueError(f"client_optimizer= is not the optimiser run {run_dir!r} was made with: its state "
                                 "has another structure (another kind of optimiser, e.g. Adam's moments where the "
                                 "run's had none)")
            probe, then = now.get("client_optimizer_probe_steps"), recorded.get("client_optimizer_probe_steps")
            if then is None and recorded.get("client_optimizer_probe") is not None:  # a run of before 2026-12-05
                trainable = _trainable(variables)
                probe, then = _first_two_updates(self.client_optimizer, trainable), recorded["client_optimizer_probe"]
            if probe is not None and then is not None and (
                    len(probe) != len(then) or not np.allclose(probe, then, rtol=1e-5, atol=1e-12, equal_nan=True)):
                raise ValueError(f"client_optimizer= is not the optimiser run {run_dir!r} was made with: its first "
                                 "updates from the same gradients differ (another learning rate, momentum or beta, "
                                 "decay, clipping threshold or schedule)")
        if self.init_params is not None and tree_fingerprint(variables) != recorded["init_params_sha256"]:
            raise ValueError(f"init_params differ from those run {run_dir!r} was made with")

    def check_resumed_metrics(self, run_dir: str, recorded: dict, num_classes: int | None = None) -> None:
        """After ``loss`` and ``metrics`` are traced (:meth:`check_functions`): the loss gives the values
        the run's did on the same inputs (:meth:`loss_probe`, where the run recorded them), and
        ``metrics`` returns the names the run's ``metrics.csv`` has columns for (another name would be
        an empty column from the resume on)."""
        then = recorded.get("loss_probe")
        if self.loss is not None and then is not None and num_classes is not None:
            now = self.loss_probe(num_classes)
            if len(now) != len(then) or not np.allclose(now, then, rtol=1e-5, atol=1e-7, equal_nan=True):
                raise ValueError(f"loss= is not the loss run {run_dir!r} was made with: on the same logits and "
                                 "labels it gives other values (another function, or other settings of it)")
        names = recorded.get("metric_names")
        if self.metrics is not None and names is not None and list(self.metric_names) != list(names):
            raise ValueError(f"metrics= returns {list(self.metric_names)}, and run {run_dir!r} was made with "
                             f"metrics returning {names}: its metrics.csv has columns for those")
