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


# ---------------------------------------------------------------- 4: registration and build checks
def _pairs_policy_class():
    class Pairs(Policy):
        def __init__(self, steps):
            self.local_steps = steps

        def start(self, sim):
            sim.dispatch_many(range(sim.num_clients), self.local_steps)

        def on_arrival(self, sim, record):
            sim.aggregate([(record.id, 0.5)])
            sim.reply(record.client)

    return Pairs


def test_options_class_without_dataclass_is_refused_at_register():
    from jaxfl.algorithms import Algorithm, Options, names, register

    class NoDC(Options):  # forgot @dataclasses.dataclass
        namespace = "nodc_check"
        power: float = 1.0

    class NoDCAlg(Algorithm):
        name, Options = "nodc_check", NoDC

    with pytest.raises(TypeError, match=r"NoDC declares the option\(s\) power but is not a dataclass: "
                                        r"decorate NoDC with @dataclasses.dataclass\(frozen=True\)"):
        register(NoDCAlg)
    assert "nodc_check" not in names()


def test_options_field_without_default_is_refused_at_register():
    import dataclasses

    from jaxfl.algorithms import Algorithm, Options, names, register

    @dataclasses.dataclass(frozen=True)
    class NoDefault(Options):
        namespace = "nodefault_check"
        power: float

    class NDAlg(Algorithm):
        name, Options = "nodefault_check", NoDefault

    with pytest.raises(TypeError, match=r"the option\(s\) power have no default"):
        register(NDAlg)
    assert "nodefault_check" not in names()


def test_options_with_classvars_and_defaults_still_register():
    import dataclasses
    from typing import ClassVar

    from jaxfl.algorithms import Algorithm, Options, register, unregister

    @dataclasses.dataclass(frozen=True)
    class Fine(Options):
        namespace: ClassVar[str] = "fine_check"
        power: float = 1.0
        group: int | None = None

    class FineAlg(Algorithm):
        name, Options, reads = "fine_check", Fine, frozenset({"buffer_size"})

    try:
        assert register(FineAlg) is FineAlg
    finally:
        unregister("fine_check")


def test_misspelt_reads_is_refused_at_register():
    from jaxfl.algorithms import Algorithm, names, register

    class BadReads(Algorithm):
        name, reads = "badreads_check", frozenset({"bufer_size"})

    with pytest.raises(ValueError, match=r"BadReads.reads names 'bufer_size', not among the algorithm-specific "
                                         r"run fields: one of .*buffer_size"):
        register(BadReads)
    assert "badreads_check" not in names()


def test_policy_hook_with_the_wrong_signature_is_refused_when_defined():
    with pytest.raises(TypeError, match=r"BadPolicy.on_arrival\(self, record\) does not match how Policy hooks "
                                        r"are called, on_arrival\(self, sim, record\).*define it as"):
        class BadPolicy(Policy):
            def on_arrival(self, record):
                pass
    with pytest.raises(TypeError, match=r"on_timer\(self, sim, payload, \*, when\)"):
        class KeywordOnly(Policy):
            def on_timer(self, sim, payload, *, when):
                pass

    class Compatible(Policy):  # extra defaulted parameters and *args are callable as the base calls them
        def on_arrival(self, sim, record, extra=None):
            pass

        def on_reply(self, *args):
            pass

        on_timer = lambda self, sim, payload: None  # noqa: E731


def test_device_hook_with_the_wrong_signature_is_refused_when_defined():
    from jaxfl.algorithms import DeviceHook

    with pytest.raises(TypeError, match=r"Sig.weigh\(self, ctx, aggregation\) does not match how DeviceHook "
                                        r"hooks are called, weigh\(self, ctx, aggregation, records\)"):
        class Sig(DeviceHook):
            def weigh(self, ctx, aggregation):
                return None


def test_policy_that_is_not_a_policy_is_refused_when_built():
    from jaxfl.algorithms import Algorithm, build, register, unregister
    from jaxfl.config import RunConfig, validate

    class NotPolicy(Algorithm):
        name = "notpolicy_check"

        def policy(self):
            return object()

    class LateHook(Algorithm):
        name = "latehook_check"

        def policy(self):
            cls = _pairs_policy_class()
            cls.on_arrival = lambda self, record: None  # assigned after the class: seen when built
            return cls(2)

    register(NotPolicy), register(LateHook)
    try:
        algorithm = build(validate(RunConfig(algorithm="notpolicy_check", clients=4)))
        with pytest.raises(TypeError, match=r"NotPolicy.policy\(\) returned <object object at .*> \(object\), "
                                            r"not a jaxfl Policy"):
            algorithm.policy()
        with pytest.raises(TypeError, match=r"on_arrival\(self, record\) does not match"):
            build(validate(RunConfig(algorithm="latehook_check", clients=4))).policy()
    finally:
        unregister("notpolicy_check"), unregister("latehook_check")


def test_built_in_policies_pass_the_checks():
    from jaxfl.algorithms import build, names
    from jaxfl.config import RunConfig, validate

    for name in names():
        if name.endswith("_check"):
            continue
        assert isinstance(build(validate(RunConfig(algorithm=name, clients=4))).policy(), Policy), name
