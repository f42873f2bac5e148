"""What Simulation.dispatch promises a policy (its own plug-in's too): a client trains one model at a
time, and a crashed client is gone for good. A plug-in's "every client each round" used to send a
second model to a client still training (utilisation 138 %), and one that re-sent work to a crashed
client had it train and arrive as if it had never crashed."""
import pickle

import numpy as np
import pytest

from jaxfl.scheduler.faults import ClientFaults, FaultConfig
from jaxfl.scheduler.simulation import Policy, Simulation
from jaxfl.scheduler.speeds import ScriptedSpeeds
from tests.conftest import RecordingBackend


class EveryClientEveryRound(Policy):
    """The plug-in author's mistake: a timer every second sends every client a model, busy or not."""

    def start(self, sim):
        self.on_timer(sim, None)

    def on_timer(self, sim, payload):
        for client in range(sim.num_clients):
            sim.dispatch(client, 10)
        sim.set_timer(sim.now + 1.0, "round")

    def on_arrival(self, sim, record):
        pass


def half_a_second(client, round):
    return 0.5


def simulation(policy, clients=3, faults=None, **budgets):
    return Simulation(policy, ScriptedSpeeds(half_a_second, clients), np.full(clients, 1 / clients),
                      RecordingBackend(), faults=faults, **budgets)


def test_a_dispatch_to_a_client_still_training_is_refused_naming_it():
    sim = simulation(EveryClientEveryRound(), max_time=20.0)
    with pytest.raises(ValueError, match=r"client 0 is still training dispatch 0 \(sent at 0 s, arriving at 5 s\): "
                                         r"a client trains one model at a time"):
        sim.run()
    assert sim.now == 1.0 and sim.records.count == 3  # nothing of the refused dispatch was made


def test_dispatch_many_refuses_a_client_in_flight_or_listed_twice_before_dispatching_any():
    sim = simulation(Policy(), clients=4)
    sim.dispatch(2, 5)
    for clients, said in (([0, 1, 2], "client 2 is still training dispatch 0"),
                          ([0, 1, 0], "client 0 is listed twice in one dispatch_many")):
        with pytest.raises(ValueError, match=said):
            sim.dispatch_many(clients, 5)
        assert sim.records.count == 1 and list(sim.training) == [0, 0, 1, 0]  # nothing left marked
    with pytest.raises(ValueError, match=r"client 9 out of range"):  # (left 0 and 1 marked, then a KeyError)
        sim.dispatch_many([0, 1, 9], 5)
    assert list(sim.training) == [0, 0, 1, 0]
    sim.dispatch_many([0, 1, 3], 5)
    assert list(sim.training) == [2, 3, 1, 4]


class RedispatchOnArrival(Policy):
    """Sends every client again as each arrives or (unknown to the server) is found gone."""

    def start(self, sim):
        for client in range(sim.num_clients):
            sim.dispatch(client, 4)

    def on_arrival(self, sim, record):
        sim.aggregate([(record.id, 1.0)])
        sim.dispatch(record.client, 4)

    def on_crash(self, sim, record):
        self.told = getattr(self, "told", 0) + 1


def test_a_crashed_client_never_trains_again_and_a_dispatch_to_it_crashes_at_once():
    rows = []

    class Resend(RedispatchOnArrival):
        def on_crash(self, sim, record):
            super().on_crash(sim, record)
            if self.told <= 3:  # a server that, not knowing, tries the same client again
                sim.dispatch(record.client, 4)

    policy = Resend()
    sim = simulation(policy, clients=4, faults=ClientFaults(FaultConfig(crash_prob=0.3), 4, seed=2), max_time=200.0)
    sim._bind_log(rows.append)
    sim.run()
    crashed_at = {}
    for row in rows:
        if row["event"] == "crash":
            crashed_at.setdefault(row["client"], row["time"])
        elif row["event"] == "arrival":
            assert row["client"] not in crashed_at, f"client {row['client']} arrived after its crash"
    assert crashed_at and policy.told > len(crashed_at)  # the re-sent dispatches crashed too
    again = [row for row in rows if row["event"] == "dispatch" and row["detail"] == "crash (crashed before)"]
    assert again and all(row["client"] in crashed_at and row["time"] >= crashed_at[row["client"]] for row in again)
    assert sim.accounting()["dropped_by_reason"]["client crashed"] == len(crashed_at) + len(again)


def test_a_checkpoint_from_before_the_clients_in_training_were_kept_restores_them():
    sim = simulation(RedispatchOnArrival(), clients=4, faults=ClientFaults(FaultConfig(crash_prob=0.1), 4, seed=1),
                     max_updates=20)
    sim.run()
    state = pickle.loads(pickle.dumps(sim)).__getstate__()
    expected, crashed = list(sim.training), set(sim.crashed_clients)
    assert any(expected) and crashed
    del state["training"], state["crashed_clients"]
    restored = Simulation.__new__(Simulation)
    restored.__setstate__(state)
    assert list(restored.training) == expected and restored.crashed_clients == crashed


def test_a_timer_at_a_float32_time_is_refused_and_float64_and_integers_are_taken():
    # a jax float32 time was taken as it is: its 24 bits moved the timer (4.9338111877 for 4.9338111803)
    # and every event after it, without a word
    import jax.numpy as jnp

    from jaxfl.scheduler.simulation import PluginError

    sim = simulation(Policy())
    for time in (jnp.float32(4.9338111803), np.float32(2.5), "3"):
        with pytest.raises(PluginError, match=r"Policy: set_timer's time .* is not a number of virtual seconds the "
                                              r"clock takes: a Python float or int"):
            sim.set_timer(time)
    for time in (4.9338111803, np.float64(5.5), 7, np.int64(8)):
        assert sim.set_timer(time).time == time
