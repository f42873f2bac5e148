"""Simulation.dispatch_many: the same dispatches as one dispatch() call per client."""
import dataclasses
import gc

import numpy as np
import pytest

from jaxfl.scheduler.faults import ClientFaults, FaultConfig
from jaxfl.scheduler.simulation import Policy, Simulation, collections_paused
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from tests.conftest import RecordingBackend


class StartAll(Policy):
    """Starts every client (in one bulk call or one call each), then aggregates each arrival alone."""

    def __init__(self, bulk: bool):
        self.bulk = bulk

    def start(self, sim):
        if self.bulk:
            with collections_paused():
                sim.dispatch_many(range(sim.num_clients - 1, -1, -1), 3, lr_scale=0.5, detail="warm-up")
        else:
            for client in range(sim.num_clients - 1, -1, -1):
                sim.dispatch(client, 3, lr_scale=0.5, detail="warm-up")

    def on_arrival(self, sim, record):
        sim.aggregate([(record.id, 0.1)])
        sim.dispatch(record.client, 2)


def simulate(bulk: bool, faults: bool, clients: int = 40):
    rows, backend = [], RecordingBackend()
    speeds = ClientSpeeds(SpeedConfig(model="exp", jitter=0.05, speed_change_prob=0.2), clients, seed=5)
    fault_model = ClientFaults(FaultConfig(delay_prob=0.2, dropout_prob=0.1), clients, 5) if faults else None
    sim = Simulation(StartAll(bulk), speeds, np.full(clients, 1.0 / clients), backend, max_updates=60,
                     log=rows.append, faults=fault_model, client_lr_decay=0.9)
    sim.run()
    return rows, backend.dispatched, [dataclasses.astuple(r) for r in sim.records], sim


@pytest.mark.parametrize("faults", [False, True], ids=["no_faults", "faults"])
def test_dispatch_many_equals_one_dispatch_per_client(faults):
    rows, dispatched, records, sim = simulate(bulk=True, faults=faults)
    assert (rows, dispatched, records) == simulate(bulk=False, faults=faults)[:3]
    assert sum(row["event"] == "dispatch" and str(row["detail"]).startswith("warm-up") for row in rows) == 40
    assert sim.accounting()["in_flight"] == 40


def test_dispatch_many_refuses_a_bad_client_like_dispatch():
    speeds = ClientSpeeds(SpeedConfig(model="exp"), 3, seed=0)
    sim = Simulation(StartAll(True), speeds, np.full(3, 1 / 3), RecordingBackend(), max_updates=1)
    with pytest.raises(ValueError, match=r"client 3 out of range \[0, 3\)"):
        sim.dispatch_many([0, 3], 2)
    with pytest.raises(ValueError, match="steps must be >= 0, got -1"):
        sim.dispatch_many([0], -1)


@pytest.mark.parametrize("algorithm", ["fedcompass", "fedasync"])
def test_a_start_is_frozen_while_the_run_goes_and_nothing_after(algorithm):
    from jaxfl.algorithms import FedAsync, FedCompass
    from jaxfl.scheduler.staleness import polynomial

    assert gc.get_freeze_count() == 0
    policy = FedCompass(2, 10, polynomial) if algorithm == "fedcompass" else FedAsync(10, polynomial, concurrency=20)
    frozen = []
    sim = Simulation(policy, ClientSpeeds(SpeedConfig(model="exp"), 50, seed=0), np.full(50, 0.02),
                     RecordingBackend(), max_updates=5, after_event=lambda sim: frozen.append(gc.get_freeze_count()))
    sim.run()
    assert frozen[0] > 0  # the start's objects were kept out of the collections while it ran
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_a_run_counts_the_frozen_objects_once_at_most(monkeypatch):
    # gc.get_freeze_count() walks every frozen object (after a freeze: every object of the process),
    # which in a process of many small runs (a hypothesis test, a sweep) cost more than the runs
    from jaxfl.algorithms import FedAsync
    from jaxfl.scheduler.staleness import polynomial

    counts = []
    monkeypatch.setattr(gc, "get_freeze_count", lambda real=gc.get_freeze_count: counts.append(1) or real())
    sim = Simulation(FedAsync(10, polynomial, concurrency=20), ClientSpeeds(SpeedConfig(model="exp"), 50, seed=0),
                     np.full(50, 0.02), RecordingBackend(), max_updates=5)
    sim.run()
    assert len(counts) == 1
    monkeypatch.undo()
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_a_pause_inside_a_start_leaves_nothing_frozen_after_the_run():
    from jaxfl.algorithms import FedAsync
    from jaxfl.scheduler.staleness import polynomial

    class PausingStart(FedAsync):
        def start(self, sim):
            with collections_paused(freeze=True):  # a policy's own pause, inside the run's
                super().start(sim)

    sim = Simulation(PausingStart(10, polynomial, concurrency=20), ClientSpeeds(SpeedConfig(model="exp"), 50, seed=0),
                     np.full(50, 0.02), RecordingBackend(), max_updates=5)
    sim.run()
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_a_start_that_raises_leaves_nothing_frozen():
    """The run's pause froze on its way out of a start that raised, and the run never unfroze it:
    every later collection in the process skipped those objects (four bulk tests failed after it)."""

    class FailingStart(StartAll):
        def start(self, sim):
            super().start(sim)
            raise RuntimeError("a plug-in's mistake")

    sim = Simulation(FailingStart(bulk=True), ClientSpeeds(SpeedConfig(model="exp"), 30, seed=0), np.full(30, 1 / 30),
                     RecordingBackend(), max_updates=5)
    with pytest.raises(RuntimeError, match="plug-in's mistake"):
        sim.run()
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_objects_a_user_froze_stay_frozen_and_none_are_added():
    from jaxfl.algorithms import FedCompass
    from jaxfl.scheduler.staleness import polynomial

    kept = [[] for _ in range(10)]
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        assert before >= len(kept)
        sim = Simulation(FedCompass(2, 10, polynomial), ClientSpeeds(SpeedConfig(model="exp"), 50, seed=0),
                         np.full(50, 0.02), RecordingBackend(), max_updates=5)
        sim.run()
        # not unfrozen (the count falls only by frozen objects freed meanwhile), and nothing more frozen
        assert before - 1000 < gc.get_freeze_count() <= before and gc.isenabled()
    finally:
        gc.unfreeze()


def test_dispatch_many_keeps_an_indexed_queue_up_to_date():
    speeds = ClientSpeeds(SpeedConfig(model="exp"), 5, seed=0)
    sim = Simulation(StartAll(True), speeds, np.full(5, 0.2), RecordingBackend(), max_updates=1)
    assert sim.queue.find("arrival", 0) is None  # builds the (kind, payload) index PORT's pull uses
    sim.dispatch_many(range(5), 2)
    assert [sim.queue.find("arrival", record.id).client for record in sim.records] == [0, 1, 2, 3, 4]
