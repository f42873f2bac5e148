"""summary.json's peak host memory is the run's, not the process's: runs made one after another in
one process (a sweep's cells, ``jaxfl run --algorithm a,b``) each reported the largest peak of every
run before them (FedBuff after FedCompass at 10^6 clients: 1,419 MB, alone 362 MB)."""
import builtins
import dataclasses
import io

import numpy as np
import pytest

from jaxfl import experiment
from jaxfl.config import RunConfig

BIG_MB = 600  # an allocation well above what the small runs below take


def tiny_run(tmp_path, **options):
    config = RunConfig(**{"algorithm": "fedbuff", "timing_only": True, "dataset": "synthetic_iid",
                          "partition": "natural", "model": "logreg", "clients": 50, "max_updates": 20,
                          "progress": False, "output_dir": str(tmp_path), **options})
    return experiment.run_experiment(config).summary


def peak_after_a_big_allocation() -> float:
    """Touch BIG_MB of memory and free it; the process's high-water mark (MB) it left."""
    big = np.ones(BIG_MB * 2**20 // 8)  # np.ones writes every page: resident
    del big
    return experiment._memory_status()["VmHWM"] / 1024


def needs_a_resettable_peak():
    if not experiment._memory_status():
        pytest.skip("no /proc/self/status (not Linux)")
    if experiment._reset_peak_host_memory() != "run":
        pytest.skip("this kernel does not reset the peak RSS (/proc/self/clear_refs)")


def test_a_run_after_a_big_allocation_reports_its_own_peak(tmp_path):
    needs_a_resettable_peak()
    high = peak_after_a_big_allocation()
    summary = tiny_run(tmp_path)
    assert summary["peak_host_memory_scope"] == "run"
    # the process reached `high` before the run; the run itself stays far below it
    assert summary["peak_host_memory_mb"] < high - BIG_MB / 2


def test_the_scope_is_there_in_timing_only_and_trained_runs(tmp_path):
    timing = tiny_run(tmp_path / "timing")
    trained = tiny_run(tmp_path / "trained", timing_only=False, algorithm="fedavg", clients=2, local_steps=1,
                       max_updates=1)
    for summary in (timing, trained):
        assert summary["peak_host_memory_scope"] in ("run", "process")
        assert summary["peak_host_memory_mb"] > 0


def refusing_clear_refs(kind):
    """An ``open`` for jaxfl.experiment where /proc/self/clear_refs refuses writes (``"refused"``) or
    takes them without resetting anything (``"ignored"``: a kernel or sandbox that drops them)."""
    def fake_open(path, *args, **kwargs):
        if path == "/proc/self/clear_refs":
            if kind == "refused":
                raise PermissionError(path)
            return io.StringIO()
        return builtins.open(path, *args, **kwargs)
    return fake_open


@pytest.mark.parametrize("kind", ["refused", "ignored"])
def test_without_a_reset_the_figure_says_it_is_the_process_s_peak(tmp_path, monkeypatch, kind):
    if not experiment._memory_status():
        pytest.skip("no /proc/self/status (not Linux)")
    high = peak_after_a_big_allocation()
    monkeypatch.setattr(experiment, "open", refusing_clear_refs(kind), raising=False)
    summary = tiny_run(tmp_path)
    # the earlier allocation's peak, and a scope that says so
    assert summary["peak_host_memory_scope"] == "process"
    assert summary["peak_host_memory_mb"] >= high - 1


def test_a_finished_run_leaves_no_array_alive_without_a_garbage_collection(small_config):
    # the engine's training programs closed over the _Calls object they were stored on: a reference cycle
    # that kept each finished run's samples on the device and its executables until a full collection,
    # which a one-process sweep of small cells may never reach (417 MB to 1,099 MB over 30 cells)
    import gc

    import jax

    from jaxfl.experiment import run_experiment

    gc.collect()
    before = {id(array) for array in jax.live_arrays()}
    gc.disable()
    try:
        result = run_experiment(small_config)
        assert result.summary["global_updates"] == 4
        del result
        left = [(array.shape, array.dtype) for array in jax.live_arrays() if id(array) not in before]
    finally:
        gc.enable()
    assert left == []


def test_the_engine_keeps_the_client_metrics_of_the_last_released_dispatches_only(small_config, monkeypatch):
    # every trained dispatch's metrics stayed in the engine and in each checkpoint: 0.5 KB an update, so
    # memory and state.pkl grew with the run (1.1 MB to 3.0 MB over 60,000 updates), not with what is in flight
    from jaxfl import engine as engine_module
    from jaxfl.experiment import run_experiment

    monkeypatch.setattr(engine_module, "KEPT_RELEASED_METRICS", 5)
    config = dataclasses.replace(small_config, algorithm="fedasync", max_updates=60, checkpoint_every=None)
    result = run_experiment(config)
    engine = result.simulation.backend
    assert result.summary["global_updates"] == 60
    assert len(engine._released_metrics) == 5
    # the five last released, the unreleased ones, and those released since the last pruning: at most 2 × 5
    assert len(engine._client_metrics) <= 2 * 5 + len(engine._results) + len(engine._pending)
    assert set(engine._released_metrics) <= set(engine._client_metrics)
