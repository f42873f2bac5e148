"""Near a run's end the engine trains ahead only what the run still aggregates: Simulation.foresee runs a
copy of the schedule to the end of the budgets (issue 13: executed ÷ aggregated ≤ 1.1 at the end of any run)."""
import dataclasses
import os

import numpy as np
import pytest

import jaxfl
from jaxfl import algorithms
from jaxfl.algorithms import fedasync, register, unregister
from jaxfl.config import RunConfig, validate
from jaxfl.scheduler.simulation import Simulation, TimingBackend
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from jaxfl.testing import _interrupt_after, _Interrupted, assert_same_run


class _Recording(TimingBackend):
    """A timing-only backend that notes the ids aggregated."""

    def __init__(self):
        super().__init__()
        self.aggregated = []

    def on_aggregate(self, aggregation, records):
        self.aggregated.extend(record.id for record in records)
        return super().on_aggregate(aggregation, records)


def _simulation(algorithm: str, clients: int, updates: int, log=None, **options) -> Simulation:
    config = validate(RunConfig(algorithm=algorithm, clients=clients, max_updates=updates, timing_only=True,
                                local_steps=5, progress=False, **options))
    speeds = ClientSpeeds(SpeedConfig(model="exp", mean=config.speed_mean, jitter=config.jitter), clients, seed=3)
    return Simulation(algorithms.build(config).policy(), speeds, np.full(clients, 1.0 / clients), _Recording(),
                      max_updates=updates, log=log)


@pytest.mark.parametrize("algorithm, options", [("fedasync", {"concurrency": 40}),
                                                ("fedbuff", {"concurrency": 40, "buffer_size": 4}),
                                                ("fedcompass", {}), ("fedat", {}), ("port", {}), ("fedavg", {}),
                                                ("ccfedavg", {}),
                                                ("fedasmu", {"algorithm_options": {"slot": "middle"}})])
def test_foresee_names_exactly_the_dispatches_the_run_aggregates_and_leaves_the_run_as_it_was(algorithm, options):
    rows, alone = [], []
    simulation = _simulation(algorithm, 40, 10, log=rows.append, **options)
    simulation.run()
    simulation.set_budgets(float("inf"), 25, None, None)  # 15 versions more, from between two events
    before = (simulation.events_processed, simulation.version, simulation.records.count, len(simulation.queue))
    foresight = simulation.foresee(max_events=100_000)
    assert (simulation.events_processed, simulation.version, simulation.records.count,
            len(simulation.queue)) == before
    aggregated_before = len(simulation.backend.aggregated)
    simulation.run()
    assert foresight == frozenset(simulation.backend.aggregated[aggregated_before:])
    assert any(d >= before[2] for d in foresight)  # dispatches not made yet when it was asked are among them
    # the copy changed nothing of the run's: the same log as a run to 25 versions that never looked ahead
    reference = _simulation(algorithm, 40, 25, log=alone.append, **options)
    reference.run()
    assert rows == alone


def test_foresee_gives_none_where_the_copy_does_not_end_within_its_events():
    simulation = _simulation("fedasync", 40, 30, concurrency=40)
    simulation.run()
    simulation.set_budgets(float("inf"), 60, None, None)
    assert simulation.foresee(max_events=5) is None
    assert simulation.foresee(max_events=1_000) is not None


def _config(tmp_path, **overrides) -> RunConfig:
    # every client in flight and calls of 16 clients: the fast clients' later rounds overtake the slow
    # ones' first, which a rate cannot tell (executed ÷ aggregated 1.47 at 500 clients before)
    return RunConfig(**{**dict(algorithm="fedasync", model="logreg", dataset="synthetic_iid", partition="natural",
                                clients=64, concurrency=64, local_steps=3, batch_size=8, max_updates=12,
                                clients_per_call=16, heterogeneity="exp", stop_at_target=False, target_accuracy=0.99,
                                eval_interval=None, progress=False, output_dir=str(tmp_path / "runs")),
                             **overrides})


def _executed_and_aggregated(result) -> tuple[int, int]:
    return result.summary["client_steps_executed"], result.summary["client_steps_aggregated"]


@pytest.mark.parametrize("overrides", [{}, {"algorithm": "fedbuff", "buffer_size": 3},
                                       {"max_updates": None, "max_client_updates": 20},
                                       {"algorithm": "fedbuff", "buffer_size": 3, "crash_prob": 0.05,
                                        "delay_prob": 0.1, "dropout_prob": 0.1, "dropout_mean": 1.0}])
def test_a_run_with_every_client_in_flight_trains_nothing_it_does_not_aggregate(tmp_path, overrides):
    result = jaxfl.run_experiment(_config(tmp_path, **overrides))
    executed, aggregated = _executed_and_aggregated(result)
    assert aggregated > 0 and executed == aggregated
    assert result.engine._foresight is not None


class _CountingFedAsync(fedasync.FedAsync):
    """A plug-in's policy: FedAsync that counts the arrivals it is told of."""

    arrivals = 0

    def on_arrival(self, sim, record):
        type(self).arrivals += 1
        super().on_arrival(sim, record)


class _CountingAlgorithm(fedasync.FedAsyncAlgorithm):
    name = "counting_fedasync_foresight"

    def policy(self):
        run = self.run
        return _CountingFedAsync(self.local_steps, fedasync.staleness_function(run), rule=run.rule or "paper",
                                 concurrency=run.concurrency, seed=run.seed)


def _plug_in_staleness(s):
    return 1.0 / (1.0 + s)


class _OwnStalenessAlgorithm(fedasync.FedAsyncAlgorithm):
    """A plug-in that hands jaxfl's own FedAsync policy a staleness function of its own."""

    name = "own_staleness_foresight"

    def policy(self):
        return fedasync.FedAsync(self.local_steps, _plug_in_staleness, rule="paper", concurrency=self.run.concurrency,
                                 seed=self.run.seed)


def test_a_plug_in_is_not_copied(tmp_path):
    # its code may do more than schedule (count, print, write files): the rate alone guides it, as before,
    # whether the plug-in is the policy or only an algorithm handing jaxfl's policy a function of its own
    register(_CountingAlgorithm)
    try:
        _CountingFedAsync.arrivals = 0
        result = jaxfl.run_experiment(_config(tmp_path, algorithm="counting_fedasync_foresight"))
    finally:
        unregister("counting_fedasync_foresight")
    assert not result.engine.foresight_allowed and result.engine._foresight is None
    counts = result.simulation.accounting()
    assert _CountingFedAsync.arrivals == counts["dispatched"] - counts["in_flight"]  # the run's own, no copy's
    register(_OwnStalenessAlgorithm)
    try:
        result = jaxfl.run_experiment(_config(tmp_path, algorithm="own_staleness_foresight"))
    finally:
        unregister("own_staleness_foresight")
    assert not result.engine.foresight_allowed and result.engine._foresight is None


def test_a_client_step_budget_is_not_recounted_at_every_event_of_a_first_round(tmp_path, monkeypatch):
    # before the first aggregation its updates_left sums every live dispatch's steps: the look at every
    # event of a first FedAvg round of 40,000 clients took 70 s of a 89 s run (a review)
    calls = []
    original = Simulation.updates_left

    def counted(simulation, *args):
        if not simulation.client_updates_aggregated:
            calls.append(simulation.events_processed)
        return original(simulation, *args)

    monkeypatch.setattr(Simulation, "updates_left", counted)
    result = jaxfl.run_experiment(_config(tmp_path, algorithm="fedavg", concurrency=None, clients=64,
                                          max_updates=None, max_client_steps=3 * 64 * 3))
    assert result.summary["global_updates"] == 3
    assert len(calls) <= 3  # before the first event, and the first aggregation's own (not 64 arrivals' worth)


def _poisoned(clients: int = 24) -> dict:
    rng = np.random.default_rng(0)
    owner = np.repeat(np.arange(clients), 40)
    x = rng.normal(size=(clients * 40, 20)).astype(np.float32)
    x[np.isin(owner, (0, 5, 11))] = 3e38  # three clients whose updates overflow
    return {"x_train": x, "y_train": rng.integers(0, 3, clients * 40), "client_train": owner,
            "x_test": rng.normal(size=(50, 20)).astype(np.float32), "y_test": rng.integers(0, 3, 50)}


def test_a_run_that_skips_nan_updates_resumes_bit_identically_after_the_look_ahead(tmp_path):
    # the copy takes every update as finite, so after a skipped NaN update its dispatches part from the run's;
    # a resume that looked again found another set and trained in other calls (a review: parameters 3e-8 apart)
    config = RunConfig(algorithm="fedasync", model="mlp", num_classes=3, clients=24, partition="natural",
                       concurrency=24, local_steps=3, batch_size=8, max_updates=48, clients_per_call=8,
                       heterogeneity="normal", target_accuracy=0.99, stop_at_target=False, on_nonfinite="skip",
                       progress=False, checkpoint_every=4, output_dir=str(tmp_path / "runs"))
    whole = jaxfl.run_experiment(dataclasses.replace(config, run_name="whole"), data=_poisoned())
    assert whole.summary["accounting"]["dropped_by_reason"]["non-finite update"] > 0
    with _interrupt_after(53):
        with pytest.raises(_Interrupted):
            jaxfl.run_experiment(dataclasses.replace(config, run_name="cut"), data=_poisoned())
    resumed = jaxfl.resume_experiment(os.path.join(config.output_dir, "cut"), progress=False, data=_poisoned())
    assert_same_run(whole, resumed, "uninterrupted and resumed")


def test_an_extended_run_looks_ahead_again_to_its_new_end(tmp_path):
    first = jaxfl.run_experiment(_config(tmp_path))
    assert first.engine._foresight is not None
    extended = jaxfl.resume_experiment(first.run_dir, overrides={"max_updates": 30}, progress=False)
    assert extended.summary["global_updates"] == 30
    executed, aggregated = _executed_and_aggregated(extended)
    assert executed == aggregated


def test_a_run_resumed_after_the_look_ahead_is_the_uninterrupted_run(tmp_path):
    config = _config(tmp_path, checkpoint_every=1, max_updates=16)
    whole = jaxfl.run_experiment(dataclasses.replace(config, run_name="whole"))
    assert whole.engine._foresight is not None
    with _interrupt_after(12):  # past the look ahead (at most 2 × 64 updates left: at the start)
        with pytest.raises(_Interrupted):
            jaxfl.run_experiment(dataclasses.replace(config, run_name="cut"))
    cut = os.path.join(config.output_dir, "cut")
    assert not os.path.exists(os.path.join(cut, "summary.json"))  # cut short
    resumed = jaxfl.resume_experiment(cut)
    assert_same_run(whole, resumed, "uninterrupted and resumed")


def test_no_look_ahead_while_a_stop_is_pending(tmp_path):
    # a target reached in the event where the look was first due: the copy inherited the stop, found no
    # dispatch, and the checkpoint kept that for a resume past the target (a review: 131 calls for 47)
    result = jaxfl.run_experiment(_config(tmp_path))
    engine, simulation = result.engine, result.simulation
    simulation.set_budgets(float("inf"), simulation.version + 10, None, None)  # 10 versions more to look at
    simulation._stop_requested = "target reached"
    engine.between_events(simulation)
    assert engine._foresight is None or engine._foresight_budgets != simulation.budgets
    simulation._stop_requested = None
    engine.between_events(simulation)
    assert engine._foresight and engine._foresight_budgets == simulation.budgets


def test_an_extension_looks_afresh_after_a_look_that_ran_out_of_events(tmp_path, monkeypatch):
    result = jaxfl.run_experiment(_config(tmp_path))
    engine, simulation = result.engine, result.simulation
    simulation.set_budgets(float("inf"), simulation.version + 40, None, None)
    monkeypatch.setattr(Simulation, "foresee", lambda sim, max_events: None)  # as a copy past its events
    engine._foresight = engine._foresight_budgets = None
    engine.between_events(simulation)
    assert engine._foresight is None and engine._foresight_below < float("inf")
    monkeypatch.undo()
    simulation.set_budgets(float("inf"), simulation.version + 60, None, None)  # extended again
    engine.between_events(simulation)
    assert engine._foresight is not None and engine._foresight_budgets == simulation.budgets
