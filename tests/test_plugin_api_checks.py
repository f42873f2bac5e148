"""Checks of the plug-in API that turn a plug-in author's slip into a clear error up front: a policy
that keeps its step count under another name, a zero-time dispatch loop, an Options class or policy
that is not what the registry expects, a plug-in file named like a standard module, a device hook
returning too few coefficients, and numpy numbers given to the staleness functions."""

import inspect

import pytest

from jaxfl.scheduler.simulation import Policy, Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from tests.conftest import RecordingBackend


def simulation(policy, clients=3, latency=0.0, max_updates=5):
    speeds = ClientSpeeds(SpeedConfig(model="homo", mean=0.1, jitter=0.0, latency=latency), clients, seed=0)
    return Simulation(policy, speeds, [1 / clients] * clients, RecordingBackend(), max_updates=max_updates)


# ---------------------------------------------------------------- 1: the default on_reply's local_steps
class StepsElsewhere(Policy):
    """Keeps its count as ``self.steps``: the default on_reply used to re-dispatch for 1 step."""

    def __init__(self, steps):
        self.steps = steps

    def start(self, sim):
        sim.dispatch_many(range(sim.num_clients), self.steps)

    def on_arrival(self, sim, record):
        sim.aggregate([(record.id, 0.5)])
        sim.reply(record.client)


def test_default_on_reply_without_local_steps_is_refused_by_name():
    sim = simulation(StepsElsewhere(10))
    with pytest.raises(AttributeError, match=r"StepsElsewhere sets no self.local_steps: define self.local_steps "
                                             r"\(.*\) or override on_reply"):
        sim.run()
    assert all(record.steps == 10 for record in sim.records)  # no 1-step round was dispatched


def test_default_on_reply_uses_local_steps_when_set():
    class Named(StepsElsewhere):
        def __init__(self, steps):
            self.steps = self.local_steps = steps

    sim = simulation(Named(7))
    sim.run()
    assert sim.version == 5 and {record.steps for record in sim.records} == {7}


def test_policy_class_default_local_steps_is_none():
    assert Policy.local_steps is None
