"""The conformance suite every algorithm passes: the zoo's tests run it over the registry, and a
user's algorithm can run it too.

:func:`check_algorithm` runs a few seconds-long experiments on the embedded data and checks:

- ``batched``: deferred, vmapped training equals one-at-a-time training (identical event log,
  parameters within ``atol``: vmapped sums reassociate; SGD clients keep that at ~1e-8), and
  one-at-a-time training executes exactly the client-steps the run aggregates;
- ``resume``: a run interrupted at a random event and resumed from its checkpoint is the
  uninterrupted run (event log, metrics, summary and parameters bit for bit);
- ``compilations``: every jitted function (training chunks, hooks' kernels) is traced at most once
  per power-of-two bucket of clients, never once per call;
- ``accounting``: every dispatch ends aggregated, dropped (with a reason), arrived or in flight;
- ``toml``: the resolved config survives :func:`jaxfl.config.to_toml` and back;
- ``no_jax``: the module defining the policy imports without jax (checked in a fresh interpreter
  in which importing jax fails; a policy defined in a notebook or script, ``__main__``, has no module
  to import: the check is reported skipped, with a warning).

>>> # from jaxfl.testing import check_algorithm
>>> # check_algorithm("my_module:MyAlgorithm")          # raises AssertionError naming the failed check
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Iterable

import jax
import numpy as np

from jaxfl._user_warnings import warn_user
from jaxfl import algorithms, checkpoint
from jaxfl.config import RunConfig, config_from_mapping, load_config_text, to_toml, validate
from jaxfl.execution import bucket_size
from jaxfl.runlog import CLASS_ACCURACY_NAME, METRICS_NAME

CHECKS = ("batched", "resume", "compilations", "accounting", "toml", "no_jax")
SMALL = dict(dataset="mnist10k", model="mlp", clients=4, local_steps=6, batch_size=16, max_updates=5,
             heterogeneity="exp", client_optimizer="sgd", client_lr=0.05, stop_at_target=False, progress=False,
             checkpoint_every=2, clients_per_call=4)


class _Interrupted(Exception):
    pass


def conformance_config(algorithm: str | type, output_dir: str, **overrides: Any) -> RunConfig:
    """The small config the suite runs (embedded MNIST, MLP, 4 clients, 6 SGD steps, 5 updates, up to 4
    clients per vmapped call)."""
    name = algorithm if isinstance(algorithm, str) else _reference(algorithm)
    return config_from_mapping({**SMALL, "algorithm": name, "output_dir": output_dir, **overrides})


def _reference(algorithm: type) -> str:
    """The name under which ``algorithm`` is registered (registering it if needed)."""
    algorithms.register(algorithm)
    return algorithm.name


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _first_difference(log: str, other: str) -> str:
    """Where two event logs (:func:`events_without_wall_time`) first differ, for a failure message.

    >>> _first_difference("time,event\\n1.0,arrival\\n", "time,event\\n1.0,dispatch\\n")
    "row 1: '1.0,arrival' against '1.0,dispatch'"
    """
    rows, others = log.splitlines(), other.splitlines()
    for index, (row, that) in enumerate(zip(rows, others)):
        if row != that:
            return f"row {index}: {row!r} against {that!r}"
    return f"row {min(len(rows), len(others))}: one log ends there ({len(rows) - 1} against {len(others) - 1} rows)"


def events_without_wall_time(run_dir: str) -> str:
    """A run directory's ``events.csv`` as text without its wall-clock column (the one that differs
    between two runs of the same config and seed), as ``open(path).read()`` reads the other columns
    (universal newlines), so that it compares with older logs and the golden files.

    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> _ = open(f"{run_dir}/events.csv", "w", newline="").write("time,event,wall_time\\r\\n1.0,aggregate,0.25\\r\\n")
    >>> events_without_wall_time(run_dir)
    'time,event\\n1.0,aggregate\\n'
    """
    import io

    with open(os.path.join(run_dir, "events.csv"), newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    if not rows or "wall_time" not in rows[0]:
        return _read(os.path.join(run_dir, "events.csv"))
    column = rows[0].index("wall_time")
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows([row[:column] + row[column + 1:] for row in rows])
    return text.getvalue()


def metrics_without_wall_time(run_dir: str) -> list[dict]:
    """A run directory's metrics rows without the wall-clock column (the one that differs between runs)."""
    with open(os.path.join(run_dir, METRICS_NAME)) as handle:
        return [{k: v for k, v in row.items() if k != "wall_time"} for row in csv.DictReader(handle)]


def _text_or_none(run_dir: str, name: str) -> str | None:
    path = os.path.join(run_dir, name)
    return _read(path) if os.path.isfile(path) else None


def assert_same_run(a, b, what: str = "runs") -> None:
    """Two :class:`~jaxfl.experiment.RunResult` are the same run: event log, metrics (but wall time),
    summary (but wall and compile times, resumes and the devices of each, per-process compilations and
    memory peaks with their scope) and parameters bit for bit."""
    assert events_without_wall_time(a.run_dir) == events_without_wall_time(b.run_dir), f"{what}: the event logs differ"
    assert metrics_without_wall_time(a.run_dir) == metrics_without_wall_time(b.run_dir), f"{what}: the metrics differ"
    assert _text_or_none(a.run_dir, CLASS_ACCURACY_NAME) == _text_or_none(b.run_dir, CLASS_ACCURACY_NAME), \
        f"{what}: the per-class accuracies differ"
    # per process: a resumed run compiles again, starts its clocks and its memory peaks afresh; whether the
    # peak could be reset (peak_host_memory_scope) depends on the host, not on the run
    ignore = {"wall_time_s", "resumes", "device_history", "compilations", "first_update_wall_s",
              "peak_host_memory_mb", "peak_host_memory_scope",
              "scheduler_seconds", "events_per_second", "compile_wall_s", "training_wall_s", "evaluation_wall_s",
              "checkpoint_wall_s", "checkpoints_written", "log_bytes"}  # log_bytes: its wall_time columns
    assert {k: v for k, v in a.summary.items() if k not in ignore} == \
        {k: v for k, v in b.summary.items() if k not in ignore}, f"{what}: the summaries differ"
    _same_params(a.params, b.params, 0, what)


@contextlib.contextmanager
def _interrupt_after(events: int):
    """Raise inside a run at the first event after ``events`` simulation events at which a checkpoint
    exists (checkpoints are written between events), so the resume really starts mid-run."""
    from jaxfl import experiment

    original = experiment._Checkpointer.after_event
    seen = {"events": 0}

    def interrupting(self, simulation):
        original(self, simulation)
        seen["events"] += 1
        if seen["events"] >= events and self.last_version > 0:
            raise _Interrupted

    experiment._Checkpointer.after_event = interrupting
    try:
        yield
    finally:
        experiment._Checkpointer.after_event = original


def _same_params(a, b, atol: float, what: str) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        if atol == 0:
            assert np.array_equal(x, y), f"{what}: parameters differ (max |Δ| {np.max(np.abs(x - y)):.3g})"
        else:
            assert np.allclose(x, y, rtol=0, atol=atol), f"{what}: parameters differ by {np.max(np.abs(x - y)):.3g}"


def _same_when_run_again(config, full, name: str) -> None:
    """Where a check found two runs different, run ``full``'s config once more: a run that differs from
    itself is the algorithm's non-determinism (an unseeded draw), which the failed check would otherwise
    blame on the batching or the resume."""
    from jaxfl.experiment import run_experiment

    again = run_experiment(dataclasses.replace(config, run_name="again"))
    logs = events_without_wall_time(full.run_dir), events_without_wall_time(again.run_dir)
    if logs[0] != logs[1]:
        where = f"different event logs, first at {_first_difference(*logs)}"
    else:
        try:
            _same_params(full.params, again.params, 0.0, "")
            assert metrics_without_wall_time(full.run_dir) == metrics_without_wall_time(again.run_dir)
            return
        except AssertionError:
            where = "the same event log but other parameters or metrics"
    raise AssertionError(f"{name}: two identical runs (the same config and seed) have {where}: the algorithm is not "
                         "deterministic (draw from a generator seeded by the run's seed, np.random.default_rng("
                         "np.random.SeedSequence([run.seed, STREAM])), never an unseeded one, nor Python's random "
                         "module)")


def check_algorithm(algorithm: str | type, checks: Iterable[str] = CHECKS, output_dir: str | None = None,
                    atol: float = 1e-6, **overrides: Any) -> dict:
    """Run the conformance checks (module docstring) for a registered name, a ``module:Class``
    reference or an :class:`~jaxfl.algorithms.Algorithm` subclass; ``overrides`` change the small
    config (e.g. ``clients=6`` or ``algorithm_options={...}``). Returns what was measured
    (``report["skipped"]`` names a check asked for that could not run, with a warning: ``no_jax``
    for an algorithm whose policy is defined in a script or notebook);
    raises ``AssertionError`` naming the first failed check. The runs go into ``output_dir``, or a
    temporary folder that is deleted when every check passed (kept, and named in the error, when one
    failed; ``report["run_dir"]`` only with ``output_dir``).

    >>> report = check_algorithm("fedbuff", checks=("toml", "accounting"))  # doctest: +SKIP
    """
    checks = tuple(checks)
    unknown = set(checks) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; allowed: {', '.join(CHECKS)}")
    folder = output_dir or tempfile.mkdtemp(prefix="jaxfl-conformance-")
    try:
        report = _check_algorithm(algorithm, checks, folder, atol, overrides)
    except AssertionError as failure:
        raise AssertionError(f"{failure} (the runs: {folder})") from None
    except BaseException:
        if output_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if output_dir is None:  # each call wrote tens of MB of runs no one could find
        shutil.rmtree(folder, ignore_errors=True)
        report.pop("run_dir", None)
    return report


def _check_algorithm(algorithm, checks: tuple[str, ...], folder: str, atol: float, overrides: dict) -> dict:
    from jaxfl.experiment import resume_experiment, run_experiment

    config = conformance_config(algorithm, folder, **overrides)
    name = config.algorithm
    report: dict = {"algorithm": name}
    full = None
    if {"batched", "resume", "compilations", "accounting"} & set(checks):
        full = run_experiment(dataclasses.replace(config, run_name="full"))
        report["global_updates"] = full.summary["global_updates"]
        report["run_dir"] = full.run_dir
    if "batched" in checks:
        single = run_experiment(dataclasses.replace(config, batching=False, clients_per_call=None, checkpoint_every=None,
                                                    checkpoint_min_interval_s=None, run_name="one-at-a-time"))
        batched_log, single_log = events_without_wall_time(full.run_dir), events_without_wall_time(single.run_dir)
        if batched_log != single_log:
            _same_when_run_again(config, full, name)  # the policy, not the batching?
            raise AssertionError(f"{name}: batched and one-at-a-time runs have different event logs, first at "
                                 f"{_first_difference(batched_log, single_log)}")
        try:
            _same_params(full.params, single.params, atol, f"{name}: batched vs one-at-a-time")
        except AssertionError:
            _same_when_run_again(config, full, name)
            raise
        stats = single.engine.stats  # one at a time, nothing is trained that no aggregation uses
        assert stats.useful_steps == stats.aggregated_steps, \
            f"{name}: one-at-a-time training executed {stats.useful_steps} client-steps for {stats.aggregated_steps} aggregated"
        report["mean_clients_per_batch"] = full.summary["mean_clients_per_batch"]
    if "resume" in checks:
        with open(os.path.join(full.run_dir, "events.csv")) as handle:
            arrivals = sum(row["event"] == "arrival" for row in csv.DictReader(handle))
        assert arrivals >= 3, f"{name}: too few arrivals ({arrivals}) in the conformance run to interrupt it"
        kill_at = int(np.random.default_rng(sum(map(ord, name))).integers(arrivals // 3, arrivals - 1))
        # (a run of 5 updates with a checkpoint every 2 is interrupted between its 2nd and 5th update)
        before = set(os.listdir(folder))
        with _interrupt_after(kill_at):
            try:
                run_experiment(dataclasses.replace(config, run_name="interrupted"))
            except _Interrupted:
                pass
            else:
                raise AssertionError(f"{name}: the run ended before event {kill_at}; nothing was interrupted")
        # this call's run: an output_dir used before holds an earlier call's "interrupted" (this one is
        # "interrupted-2"), which was resumed in its place and tested nothing of this algorithm
        (interrupted,) = [entry for entry in set(os.listdir(folder)) - before
                          if re.fullmatch(r"interrupted(-\d+)?", entry)]
        interrupted = os.path.join(folder, interrupted)
        assert checkpoint.latest(interrupted) is not None, (
            f"{name}: no checkpoint written before event {kill_at} (a checkpoint comes with a global update: "
            "did any happen? a round deadline shorter than every client's round makes none)")
        resumed = resume_experiment(interrupted, progress=False)
        try:
            assert_same_run(full, resumed, f"{name}: interrupted + resumed vs uninterrupted")
        except AssertionError:
            _same_when_run_again(config, full, name)  # the algorithm, not its resume?
            raise
        report["interrupted_at_event"] = kill_at
    if "compilations" in checks:
        buckets = bucket_size(config.clients).bit_length()  # the buckets 1, 2, 4, … up to the clients
        traces = full.summary["compilations"]
        too_many = {fn: n for fn, n in traces.items() if n > buckets}
        assert not too_many, f"{name}: traced more often than the {buckets} client buckets allow: {too_many}"
        report["compilations"] = traces
    if "accounting" in checks:
        counts = full.simulation.accounting()  # raises if the four states do not add up
        assert counts["aggregated"] >= 1, f"{name}: no update was aggregated in the conformance run"
        assert all(reason for reason in counts["dropped_by_reason"]), f"{name}: a drop without a reason"
        report["accounting"] = counts
    if "toml" in checks:
        resolved = validate(config)
        again = config_from_mapping(load_config_text(to_toml(resolved), ".toml"))
        assert again == resolved, f"{name}: the config changed through TOML: {resolved} → {again}"
    if "no_jax" in checks:
        module = type(algorithms.build(validate(config)).policy()).__module__
        report["policy_module"] = module
        if not check_imports_without_jax(module):  # asked for, not done: said, not passed in silence
            report["skipped"] = {"no_jax": f"the policy's module is {module} (a script or notebook), which "
                                           "no other interpreter can import: put the algorithm in a file to check it"}
            warn_user(f"{name}: no_jax not checked: {report['skipped']['no_jax']}")
    return report


_NO_JAX = r"""
import importlib, importlib.util, os, sys, types
# jaxfl/__init__ imports the engine (jax): load jaxfl's subpackages under a bare parent instead.
origin = importlib.util.find_spec("jaxfl").origin
stub = types.ModuleType("jaxfl")
stub.__path__ = [os.path.dirname(origin)]
sys.modules["jaxfl"] = stub
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "flax", "optax"):
            raise ImportError(f"{name} is blocked: a policy module must not import jax at import time")
sys.meta_path.insert(0, Blocked())
module = importlib.import_module(sys.argv[1])
if sys.argv[2:] == ["walk"] and hasattr(module, "__path__"):  # a package: every module below it too
    import pkgutil
    for info in pkgutil.walk_packages(module.__path__, prefix=module.__name__ + "."):
        importlib.import_module(info.name)
print("ok")
"""


def check_imports_without_jax(module: str, walk: bool = False) -> bool:
    """Import ``module`` (with ``walk``, every module of the package too) in a fresh interpreter where
    importing jax, jaxlib, flax or optax fails; ``AssertionError`` with the traceback otherwise.
    False, with nothing checked, for a script's or a notebook's ``__main__``, which no other
    interpreter can import.

    >>> check_imports_without_jax("__main__")
    False
    """
    if module == "__main__" or module.startswith("__"):
        return False
    loaded = sys.modules.get(module)
    folders = [os.path.dirname(loaded.__file__)] if getattr(loaded, "__file__", None) else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(folders + [p for p in sys.path if p]))
    result = subprocess.run([sys.executable, "-c", _NO_JAX, module] + (["walk"] if walk else []),
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), \
        f"{module} does not import without jax:\n{result.stderr[-2000:]}"
    return True
