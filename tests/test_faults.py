"""Faults never hang a run, every update is accounted for, NaNs stop or are skipped, the memory
guard splits calls without changing results, and algorithms are compared on paired randomness."""
import math
import os

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxfl.algorithms import Algorithm, build_policy, names, register, staleness_function, unregister
from jaxfl.config import RunConfig, validate
from jaxfl.engine import ResourceError
from jaxfl.experiment import prepare, run_experiment
from jaxfl.scheduler.faults import ClientFaults, FaultConfig
from jaxfl.scheduler.simulation import NumericalError, Policy, Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from tests.conftest import RecordingBackend, replace

SYNCHRONOUS_PARTS = ("fedavg", "fedavgm", "fedat")


def schedule(algorithm, clients, model, seed, crash, delay, dropout, updates=12, timeout=30.0, max_time=400.0):
    config = RunConfig(algorithm=algorithm, clients=clients, local_steps=5, buffer_size=min(2, clients),
                       round_timeout=timeout, seed=seed, heterogeneity=model)
    policy = build_policy(config)
    speeds = ClientSpeeds(SpeedConfig(model=model, mean=0.15), clients, seed=seed)
    faults = ClientFaults(FaultConfig(crash_prob=crash, delay_prob=delay, dropout_prob=dropout,
                                      dropout_mean=5.0), clients, seed)
    sim = Simulation(policy, speeds, np.full(clients, 1 / clients), RecordingBackend(), max_time=max_time,
                     max_updates=updates, faults=faults)
    return sim, sim.run()


probabilities = st.sampled_from([0.0, 0.05, 0.2, 0.5])


# 2,000 generated schedules (about 7 ms each): each of the 14 algorithms meets each speed model some 35
# times, over random client counts, seeds and fault mixes; 10,000 took 73 CPU seconds of every CI run
@settings(max_examples=2_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(names()), st.integers(1, 6), st.sampled_from(["homo", "normal", "exp", "pareto"]),
       st.integers(0, 2**16), probabilities, probabilities, probabilities)
def test_accounting_holds_over_two_thousand_generated_schedules(algorithm, clients, model, seed, crash, delay,
                                                                dropout):
    if crash + delay + dropout > 1:
        crash = 0.0
    sim, reason = schedule(algorithm, clients, model, seed, crash, delay, dropout)
    counts = sim.accounting()  # raises if dispatched != aggregated + dropped + unaggregated + in flight
    assert counts["dispatched"] == counts["aggregated"] + counts["dropped"] + counts["arrived_unaggregated"] \
        + counts["in_flight"]
    assert set(counts["dropped_by_reason"]) <= {"client crashed", "arrived after round deadline",
                                                 "non-finite update", "stale beyond bound"} | \
        {r.drop_reason for r in sim.records if r.status == "dropped"}
    assert reason in ("update budget", "time budget", "target reached") or reason.startswith("no events left")
    if reason.startswith("no events left"):  # only when every client is gone
        assert all(r.status != "in_flight" or math.isinf(r.arrival_time) for r in sim.records)


@pytest.mark.parametrize("algorithm", names())
def test_no_algorithm_hangs_when_clients_crash(algorithm):
    """A third of the dispatches crash: every algorithm still makes progress (deadlines, timers,
    buffers) and counts the lost updates by reason."""
    sim, reason = schedule(algorithm, 8, "exp", 3, crash=0.1, delay=0.1, dropout=0.1, updates=25, max_time=1e5)
    counts = sim.accounting()
    assert reason == "update budget", (reason, counts)
    assert counts["dropped_by_reason"].get("client crashed", 0) > 0


@pytest.mark.parametrize("algorithm", names())
def test_every_algorithm_ends_once_every_client_has_crashed_without_a_time_budget(algorithm):
    """With no time budget (max_time inf) and every dispatch crashing, FedASMU's trigger timer went on
    moving the clock for ever, a timer event per period and no one to start (found 2026-12-05);
    every algorithm ends with no events left, and says that every client crashed (it said only "no
    events left", as a policy that stopped dispatching does)."""
    sim, reason = schedule(algorithm, 6, "exp", 1, crash=1.0, delay=0.0, dropout=0.0, updates=10, timeout=1.0,
                           max_time=math.inf)
    assert reason == "no events left: all 6 clients crashed", reason
    assert sim.accounting()["aggregated"] == 0 and math.isfinite(sim.now)


def test_faults_are_paired_across_algorithms():
    a = ClientFaults(FaultConfig(crash_prob=0.3, delay_prob=0.3), 4, seed=9)
    b = ClientFaults(FaultConfig(crash_prob=0.3, delay_prob=0.3), 4, seed=9)
    first = [a.draw(c).kind for c in (0, 1, 2, 3) for _ in range(5)]
    second = {c: [b.draw(c).kind for _ in range(5)] for c in (3, 1, 0, 2)}  # another interleaving
    assert first == [k for c in (0, 1, 2, 3) for k in second[c]]


def test_draw_rejects_a_client_out_of_range():
    # Client streams live in one table, where -1 would silently be the last client's row.
    faults = ClientFaults(FaultConfig(crash_prob=0.5), 3, seed=0)
    for client in (-1, 3):
        with pytest.raises(ValueError, match=f"client={client} out of range"):
            faults.draw(client)


def test_crash_without_deadline_is_rejected_for_synchronous_methods(tmp_path):
    from jaxfl.config import ConfigError, config_from_mapping

    with pytest.raises(ConfigError, match="round_timeout=None.*crashed client would stall"):
        config_from_mapping({"algorithm": "fedavg", "crash_prob": 0.1})
    config_from_mapping({"algorithm": "fedavg", "crash_prob": 0.1, "round_timeout": 30.0})


def test_a_nan_stops_the_run_naming_client_time_and_version_and_keeps_the_logs(small_config):
    config = replace(small_config, algorithm="fedasync", client_optimizer="sgd", client_lr=1e30, max_updates=5)
    with pytest.raises(NumericalError, match=r"client \d+ returned a non-finite .* virtual time .* version"):
        run_experiment(config)
    run_dir = os.path.join(config.output_dir, os.listdir(config.output_dir)[0])
    with open(os.path.join(run_dir, "summary.json")) as handle:
        assert "numerical error" in handle.read()
    with open(os.path.join(run_dir, "events.csv")) as handle:
        assert len(handle.readlines()) > 1  # everything logged up to the failure is kept


def test_a_nan_after_a_huge_server_step_names_server_lr_too(small_config):
    """FedAdam at server_lr 1e30 made version 1 huge, its clients' updates non-finite, and the message
    said only "lower client_lr"."""
    config = replace(small_config, algorithm="fedavg", server_optimizer="adam", server_lr=1e30, max_updates=5)
    with pytest.raises(NumericalError, match=r"trained from version [1-9].* lower client_lr \(or server_lr, where the server does more than average the updates: the model"):
        run_experiment(config)


def test_nan_updates_can_be_skipped_and_are_counted(small_config):
    result = run_experiment(replace(small_config, algorithm="fedbuff", client_optimizer="sgd", client_lr=1e30,
                                    max_time=20.0, max_updates=None, stop_at_target=False, on_nonfinite="skip"))
    counts = result.summary["accounting"]
    assert counts["dropped_by_reason"]["non-finite update"] > 0
    assert counts["aggregated"] == 0
    assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in jax.tree.leaves(result.params))


def _poisoned_client_zero(seed: int = 0) -> dict:
    """Four clients of 100 rows each; client 0's features overflow every update it trains."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(400, 20)).astype(np.float32)
    owner = np.repeat(np.arange(4), 100)
    x[owner == 0] = 3e38
    return {"x_train": x, "y_train": rng.integers(0, 3, 400), "client_train": owner,
            "x_test": rng.normal(size=(50, 20)).astype(np.float32), "y_test": rng.integers(0, 3, 50)}


def test_a_skipped_nan_update_does_not_reach_the_updates_trained_beside_it(tmp_path):
    # Client 0's features overflow its update; clients 1-3 train in the same calls and are aggregated
    # from the same stacked batch, where the dropped row gets a zero weight (and 0 · NaN is NaN).
    data = _poisoned_client_zero()
    config = RunConfig(algorithm="fedbuff", model="mlp", num_classes=3, clients=4, partition="natural",
                       local_steps=3, batch_size=8, max_updates=6, buffer_size=2, clients_per_call=4,
                       target_accuracy=0.99, on_nonfinite="skip", progress=False, output_dir=str(tmp_path / "runs"))
    result = run_experiment(config, data=data)
    counts = result.summary["accounting"]
    assert counts["dropped_by_reason"]["non-finite update"] >= 1 and counts["aggregated"] >= 10
    assert result.summary["mean_clients_per_batch"] > 1  # the bad update shared its calls
    assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in jax.tree.leaves(result.params))
    assert all(math.isfinite(row["loss"]) for row in result.metrics)


def test_memory_guard_splits_calls_without_changing_results(small_config):
    config = replace(small_config, algorithm="fedavg", clients=8, clients_per_call=8, max_updates=2,
                     client_optimizer="sgd", client_lr=0.05)
    whole = run_experiment(replace(config, run_name="whole"))
    # a limit between XLA's figures for calls of 2 and of 4 clients: calls of 2
    limit = (whole.engine.call_bytes(2) + whole.engine.call_bytes(4)) / 2 / 0.8
    split = run_experiment(replace(config, run_name="split", memory_limit_mb=limit / 2**20))
    assert split.summary["calls_split_by_memory_guard"] > 0 and whole.summary["calls_split_by_memory_guard"] == 0
    assert split.summary["mean_clients_per_batch"] == 2.0
    for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(split.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    with pytest.raises(ResourceError, match="lower batch_size"):
        run_experiment(replace(config, run_name="tiny", memory_limit_mb=0.01))


def test_a_call_far_beyond_the_hosts_memory_fails_before_the_run_folder_is_written(small_config, monkeypatch, tmp_path):
    """On a CPU without memory_limit_mb the guard waited for the first call, so a hopeless batch_size
    left config.json, logs and .lock behind the one-line error; the README says it fails before it
    writes anything. The per-client estimate decides where XLA's figure is worth compiling."""
    import jaxfl.engine

    monkeypatch.setattr(jaxfl.engine, "free_device_memory", lambda: 2**20)  # 1 MiB free
    config = replace(small_config, algorithm="fedavg", max_updates=2, output_dir=str(tmp_path / "runs"))
    with pytest.raises(ResourceError, match="one client per device needs about .* MiB but only 0.8 MiB may be used"):
        run_experiment(config)
    assert not (tmp_path / "runs").exists()


def test_the_start_compiles_no_program_only_to_check_a_budget_the_estimate_fits_many_times_over(small_config):
    # On an accelerator (or under memory_limit_mb) the start compiled the smallest call to read XLA's
    # figure for it: on an H200 a CNN program of 7-17 s that a FedBuff run never called. Where the
    # per-client estimate fits ESTIMATE_MARGIN times over it now compiles only the calls the run makes.
    from jaxfl.execution import ESTIMATE_MARGIN, MEMORY_HEADROOM

    config = replace(small_config, algorithm="fedavg", clients=8, clients_per_round=8, clients_per_call=8,
                     max_updates=1)
    plenty = run_experiment(replace(config, run_name="plenty", memory_limit_mb=10_000))
    estimate = plenty.engine.plan.devices * plenty.engine.bytes_per_client
    assert estimate * ESTIMATE_MARGIN <= 10_000 * 2**20 * MEMORY_HEADROOM
    step_programs = lambda run: {count for name, count in run.summary["compilations"].items()  # noqa: E731
                                 if name in ("run_and_finish", "run_steps")}
    assert step_programs(plenty) == {1}  # the one call shape of 8 clients
    # a budget the estimate fits, but not by the margin: the smallest call is compiled to check it first
    tight = estimate * ESTIMATE_MARGIN / 2 / MEMORY_HEADROOM
    checked = run_experiment(replace(config, run_name="checked", memory_limit_mb=tight / 2**20))
    assert step_programs(checked) == {2} and checked.summary["calls_split_by_memory_guard"] == 0
    for a, b in zip(jax.tree.leaves(plenty.params), jax.tree.leaves(checked.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_changing_only_the_algorithm_keeps_speeds_and_partition_paired(small_config):
    runs = {a: run_experiment(replace(small_config, algorithm=a, run_name=a, max_updates=3))
            for a in ("fedavg", "fedasync", "fedcompass")}
    speeds = [r.simulation.speeds.base_time_per_step.tolist() for r in runs.values()]
    assert speeds[0] == speeds[1] == speeds[2]
    partitions = [prepare(replace(small_config, algorithm=a))[2].counts.tolist() for a in runs]
    assert partitions[0] == partitions[1] == partitions[2]
    # each client's k-th round takes as long under every algorithm (same per-client streams)
    durations = {a: {(rec.client, rec.client_round): rec.arrival_time - rec.start_time
                     for rec in r.simulation.records if rec.steps == 4} for a, r in runs.items()}
    common = set(durations["fedavg"]) & set(durations["fedasync"])
    assert common and all(math.isclose(durations["fedavg"][k], durations["fedasync"][k]) for k in common)


@pytest.mark.parametrize("algorithm, options", [
    ("fedavg", {"clients_per_round": 4}), ("fedat", {}), ("ccfedavg", {"clients_per_round": 4}),
    ("port", {}), ("fedbuff", {"buffer_size": 2}), ("fedasync", {}),
    ("fedcompass", {}), ("fedasmu", {})])
def test_a_skipped_nan_update_is_weighed_as_if_it_had_never_arrived(algorithm, options, tmp_path, monkeypatch):
    # Averaging rules renormalise over the finite updates (a tier model or FedAvg's step keeps its
    # scale), FedBuff's buffer waits for K finite ones, and one-update rules make no empty version.
    from jaxfl.scheduler import simulation

    aggregations, aggregate = [], simulation.Simulation.aggregate

    def recording(sim, contributions, *args, **kwargs):
        contributions = list(contributions)
        aggregations.append((sim, contributions, kwargs.get("payload")))
        return aggregate(sim, contributions, *args, **kwargs)

    monkeypatch.setattr(simulation.Simulation, "aggregate", recording)
    config = RunConfig(algorithm=algorithm, model="mlp", num_classes=3, clients=4, partition="natural",
                       local_steps=3, batch_size=8, max_updates=8, target_accuracy=0.99, on_nonfinite="skip",
                       progress=False, output_dir=str(tmp_path / "runs"), **options)
    result = run_experiment(config, data=_poisoned_client_zero())
    # the run's own (not those of the copies the engine runs ahead of it, Simulation.foresee, which see no NaN)
    aggregations = [(contributions, payload) for sim, contributions, payload in aggregations
                    if sim is result.simulation]
    records = list(result.simulation.records)
    dropped = {r.id for r in records if r.drop_reason == "non-finite update"}
    assert dropped and {r.client for r in records if r.id in dropped} == {0}
    assert aggregations
    if algorithm != "fedcompass":  # whose group without arrivals still applies the (empty) general buffer
        assert all(contributions or getattr(payload, "bank", ()) for contributions, payload in aggregations)
    assert not dropped & {d for contributions, _ in aggregations for d, _ in contributions}
    for contributions, payload in aggregations:
        total = sum(c for _, c in contributions) + sum(c for _, c in getattr(payload, "bank", ()))
        if algorithm in ("fedavg", "fedat", "ccfedavg", "port"):
            assert total == pytest.approx(1.0), contributions
        if algorithm == "fedbuff":
            assert len(contributions) == 2
    assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in jax.tree.leaves(result.params))
    if algorithm == "port":  # a dropped update's slot went to a new client: four always in flight or arrived
        assert result.simulation.policy.P == 4 and len(result.simulation.policy.in_flight) >= 1


@pytest.mark.parametrize("algorithm, options", [("fedavg", None), ("ccfedavg", None), ("fedat", None), ("port", None),
                                                ("fedasmu", {"fetch": False})])
@pytest.mark.parametrize("step_time, steps, timeout", [(0.5, 2, 1.0), (0.1, 3, 0.3), (0.7, 3, 2.1)])
def test_an_update_arriving_exactly_at_its_deadline_is_on_time(algorithm, options, step_time, steps, timeout):
    """Homogeneous clients whose round takes exactly round_timeout: the deadline's timer fired before
    the arrivals at the same instant, and every update was dropped ("arrived after round deadline").
    0.1 s × 3 steps is 0.30000000000000004 in floats, after the 0.3 s deadline: on time all the same
    (Simulation.due_by_rounding), where every update was dropped as late."""
    config = validate(RunConfig(algorithm=algorithm, clients=4, local_steps=steps, round_timeout=timeout,
                                heterogeneity="homo", jitter=0.0, max_updates=6, client_optimizer="sgd",
                                algorithm_options=options))
    speeds = ClientSpeeds(SpeedConfig(model="homo", mean=step_time, jitter=0.0), 4, seed=0)
    backend = RecordingBackend()
    sim = Simulation(build_policy(config), speeds, [0.25] * 4, backend, max_updates=6, max_time=100.0)
    sim.run()
    assert len(backend.aggregations) == 6
    late = [r for r in sim.records if r.status == "dropped"]
    assert late == [], [(r.client, r.arrival_time) for r in late]


@pytest.mark.parametrize("algorithm", ["port", "fedasmu", "fedbuff", "fedavg"])
def test_a_crashed_dispatchs_record_stays_findable_after_later_records_are_let_go(algorithm):
    # the server cannot tell that a client crashed, so PORT (its in-flight set) and FedASMU (its running and
    # lost ones) look the id up long after: once 10,000 later records had finished, the record was let go
    # and the run ended in a KeyError without summary.json (PORT at 5,000 clients, 1% crashes, in 2,000 s)
    clients, crash_prob = 20, 0.1
    config = RunConfig(algorithm=algorithm, clients=clients, local_steps=5, client_optimizer="sgd",
                       **({"buffer_size": 2} if algorithm == "fedbuff" else {"round_timeout": 5.0}),
                       algorithm_options={"slot": "middle"} if algorithm == "fedasmu" else None)
    faults = ClientFaults(FaultConfig(crash_prob=crash_prob), clients, seed=1)
    sim = Simulation(build_policy(validate(config)), ClientSpeeds(SpeedConfig(model="exp", mean=0.15), clients, seed=1),
                     np.full(clients, 1 / clients), RecordingBackend(), max_time=2_000.0, max_updates=150,
                     faults=faults, keep_finished_records=2)
    sim.run()
    crashed = sim.records.crashed
    assert crashed and all(sim.records[d].drop_reason == "client crashed" and d in sim.records for d in crashed)
    assert len(sim.records.finished) == 2 and sim.accounting()["dropped_by_reason"]["client crashed"] == len(crashed)


def test_a_checkpoint_from_before_crashed_records_were_kept_moves_them_out_of_the_finished_ones():
    # pickled by a jaxfl before DispatchRecords.crashed: its crashed records sat among the finished ones and
    # were let go after 10,000 more, so a resumed PORT or FedASMU run still died in a KeyError
    import pickle

    from jaxfl.scheduler.simulation import CRASHED, DispatchRecord, DispatchRecords

    records = DispatchRecords(keep_finished=1)
    for i in range(2):
        records.add(DispatchRecord(i, client=i, version=0, steps=1, client_round=0, start_time=0.0, arrival_time=1.0))
    records[0].drop_reason = CRASHED
    records.finish_many([records[0], records[1]])
    old = dict(records.__dict__)
    old["finished"] = type(records.finished)([(0, old["crashed"].pop(0)), *old["finished"].items()])
    del old["crashed"]
    restored = DispatchRecords.__new__(DispatchRecords)
    restored.__setstate__(pickle.loads(pickle.dumps(old)))
    assert list(restored.crashed) == [0] and list(restored.finished) == [1]
    assert restored[0].drop_reason == CRASHED


class _UnscreenedFedAsyncPolicy(Policy):
    """FedAsync (rule "fedcompass") as notebook 03 writes a plug-in: it aggregates every arrival
    without screening it first (``sim.screen``)."""

    def __init__(self, local_steps, staleness_weight):
        self.local_steps, self.staleness_weight = local_steps, staleness_weight

    def start(self, sim):
        for client in range(sim.num_clients):
            sim.dispatch(client, self.local_steps)

    def on_arrival(self, sim, record):
        weight = self.staleness_weight(sim.staleness(record)) * sim.client_weights[record.client]
        sim.aggregate([(record.id, weight)])
        sim.reply(record.client)


class _UnscreenedFedAsync(Algorithm):
    name = "test_faults_unscreened_fedasync"
    kind = "asynchronous"
    reads = frozenset({"staleness", "staleness_alpha", "staleness_a"})
    summary = "FedAsync whose policy never screens (a test plug-in)"

    def policy(self):
        return _UnscreenedFedAsyncPolicy(self.run.local_steps, staleness_function(self.run))


def test_an_aggregation_whose_every_update_the_last_resort_screen_drops_makes_no_version(tmp_path):
    # it made a version of "0 updates", which with server momentum moved the model
    from jaxfl.testing import events_without_wall_time

    runs = {}
    register(_UnscreenedFedAsync)
    try:
        for name, algorithm, options in (("plug-in", _UnscreenedFedAsync.name, {}),
                                         ("built-in", "fedasync", {"rule": "fedcompass"})):
            config = RunConfig(algorithm=algorithm, model="mlp", num_classes=3, clients=4, partition="natural",
                               local_steps=2, batch_size=8, max_updates=30, stop_at_target=False,
                               on_nonfinite="skip", server_momentum=0.9, progress=False, output_dir=str(tmp_path),
                               run_name=name, **options)
            runs[name] = run_experiment(config, data=_poisoned_client_zero())
    finally:
        unregister(_UnscreenedFedAsync.name)
    plug_in = runs["plug-in"]
    assert plug_in.summary["accounting"]["dropped_by_reason"]["non-finite update"] >= 3
    assert plug_in.summary["accounting"]["aggregated"] == plug_in.summary["global_updates"] == 30
    assert events_without_wall_time(plug_in.run_dir) == events_without_wall_time(runs["built-in"].run_dir)
    for a, b in zip(jax.tree.leaves(plug_in.params), jax.tree.leaves(runs["built-in"].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
