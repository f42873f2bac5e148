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


# ---------------------------------------------------------------- 2: zero-time dispatches
class ZeroSteps(Policy):
    local_steps = 2

    def start(self, sim):
        sim.dispatch_many(range(sim.num_clients), 2)

    def on_arrival(self, sim, record):
        self.arrivals = getattr(self, "arrivals", 0) + 1
        if self.arrivals > 1000:  # without the check the clock never moves: fail instead of hanging
            raise RuntimeError(f"{self.arrivals} arrivals at t = {sim.now}: zero-time rounds loop")
        sim.dispatch(record.client, 0)


def test_a_zero_step_dispatch_with_no_time_is_refused_instead_of_looping():
    sim = simulation(ZeroSteps())
    with pytest.raises(ValueError, match=r"dispatch of client \d with 0 steps takes no virtual time"):
        sim.run()
    # (called outside a run: an error raised inside a policy's start would leave gc frozen)
    with pytest.raises(ValueError, match=r"dispatch of client 1 with 0 steps takes no virtual time"):
        simulation(ZeroSteps()).dispatch_many([1, 2], 0)


def test_a_zero_step_dispatch_that_takes_time_is_allowed():
    sim = simulation(StepsElsewhere(2), latency=0.5)
    record = sim.dispatch(0, 0)
    assert record.arrival_time == pytest.approx(1.0)
    record = simulation(StepsElsewhere(2)).dispatch(1, 0, extra_time=0.25)
    assert record.arrival_time == pytest.approx(0.25)
    many = simulation(StepsElsewhere(2), latency=0.5)
    many.dispatch_many([0, 1], 0)
    assert [record.arrival_time for record in many.records] == pytest.approx([1.0, 1.0])


# ---------------------------------------------------------------- 3: the hooks' docstrings
@pytest.mark.parametrize("method", [Policy.start, Policy.on_arrival, Policy.on_reply, Policy.on_timer,
                                    Policy.on_crash, Simulation.cancel])
def test_policy_hooks_and_cancel_are_documented_with_an_example(method):
    doc = inspect.getdoc(method) or ""
    assert len(doc) > 200 and "Example" in doc and "::" in doc, method.__qualname__
