"""Checks of the plug-in API that turn a plug-in author's slip into a clear error up front: a policy
that keeps its step count under another name, a zero-time dispatch loop, an Options class or policy
that is not what the registry expects, a plug-in file named like a standard module, a device hook
returning too few coefficients, and numpy numbers given to the staleness functions."""

import contextlib
import inspect
import os
import re

import pytest

from jaxfl.scheduler.simulation import NumericalError, Policy, Simulation
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


def test_the_cli_says_a_default_on_reply_without_local_steps_in_one_line(tmp_path, capsys):
    # a full traceback through jaxfl's own files ended the run, and no "jaxfl: error" line
    from jaxfl.cli import main

    plugin = tmp_path / "elsewhere.py"
    plugin.write_text(PLUGIN.replace("self.local_steps, self.buffer = steps, []", "self.steps, self.buffer = steps, []")
                      .replace("sim.dispatch_many(range(sim.num_clients), self.local_steps)",
                               "sim.dispatch_many(range(sim.num_clients), self.steps)")
                      .replace('"pairs_plugin_check"', '"elsewhere_plugin_check"'))
    try:
        with pytest.raises(SystemExit) as stopped:
            main(["run", "--algorithm", f"{plugin}:Pairs", "--model", "logreg", "--clients", "3", "--local-steps", "2",
                  "--max-updates", "4", "--no-progress", "--output-dir", str(tmp_path / "runs")])
    finally:
        from jaxfl.algorithms import names
        from jaxfl.algorithms.base import unregister

        if "elsewhere_plugin_check" in names():
            unregister("elsewhere_plugin_check")
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.strip().splitlines() == [
        f"jaxfl: error: PairPolicy.on_reply: the default on_reply re-dispatches client {error.split('client ')[1].split()[0]} "
        "for self.local_steps steps, and PairPolicy sets no self.local_steps: define self.local_steps (e.g. "
        "self.local_steps = run.local_steps in __init__) or override on_reply"]


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

        def policy(self):
            return StepsElsewhere(self.run.local_steps)

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


def test_settings_given_to_a_plug_in_that_declares_no_reads_are_said_to_pass_unchecked(recwarn):
    # the README's own example took --rule plato and --round-timeout 3 and ignored them in silence (a review)
    import dataclasses

    from jaxfl.algorithms import Algorithm, register, unregister
    from jaxfl.config import RunConfig, validate

    class Undeclared(Algorithm):
        name = "undeclared_reads_check"

        def policy(self):
            return StepsElsewhere(self.run.local_steps)

    class Declared(Undeclared):
        name, reads = "declared_reads_check", frozenset({"rule"})

    class Waits(Undeclared):  # a default of its own, and a deadline it asks for: neither said
        name, kind, waits_for_clients = "waits_reads_check", "synchronous", "every client of a round"
        changed_defaults = {"rule": (None, "plato")}

    register(Undeclared)
    register(Declared)
    register(Waits)
    try:
        validate(RunConfig(algorithm="undeclared_reads_check", rule="fedcompass", round_timeout=3.0))
        (note,) = [str(warning.message) for warning in recwarn if "declares no reads" in str(warning.message)]
        assert note.startswith("undeclared_reads_check declares no reads (which of the run fields clients_per_round, "
                               "buffer_size, rule, staleness, staleness_alpha, staleness_a, round_timeout it reads), "
                               "so rule='fedcompass', round_timeout=3.0 are passed to it unchecked")
        assert "Set reads = frozenset({...}) on Undeclared" in note
        recwarn.clear()
        validate(RunConfig(algorithm="undeclared_reads_check"))  # nothing given: nothing to say
        validate(RunConfig(algorithm="declared_reads_check", rule="plato"))
        assert not [warning for warning in recwarn if "reads" in str(warning.message)]
        # a validated FedBuff config reused: its written rule 'paper' is said with how to leave it out
        validate(dataclasses.replace(validate(RunConfig(algorithm="fedbuff")), algorithm="undeclared_reads_check"))
        (note,) = [str(warning.message) for warning in recwarn if "declares no reads" in str(warning.message)]
        assert "rule='paper' (if it comes from a validated fedasync or fedbuff config, which holds it as their default: " \
               "dataclasses.replace(config, algorithm='undeclared_reads_check', rule=None) leaves it out) is passed to " \
               "it unchecked" in note
        recwarn.clear()
        with pytest.warns(UserWarning, match=r"round_timeout=3.0 is ignored: declared_reads_check does not read it"):
            validate(RunConfig(algorithm="declared_reads_check", round_timeout=3.0))
        recwarn.clear()
        assert validate(RunConfig(algorithm="waits_reads_check", round_timeout=3.0, crash_prob=0.1)).rule == "plato"
        assert not [warning for warning in recwarn if "declares no reads" in str(warning.message)]
    finally:
        unregister("undeclared_reads_check")
        unregister("declared_reads_check")
        unregister("waits_reads_check")


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


# ---------------------------------------------------------------- 5: plug-in files shadow no module
PLUGIN = '''
import dataclasses, os
import jaxfl
from jaxfl.algorithms import Algorithm, Options
from jaxfl.scheduler.simulation import Policy


class PairPolicy(Policy):
    def __init__(self, steps):
        self.local_steps, self.buffer = steps, []

    def start(self, sim):
        sim.dispatch_many(range(sim.num_clients), self.local_steps)

    def on_arrival(self, sim, record):
        self.buffer.append((record.id, sim.client_weights[record.client] / (1 + sim.staleness(record))))
        sim.reply(record.client)
        if len(self.buffer) >= 2:
            sim.aggregate(self.buffer)
            self.buffer = []
            if sim.version == 3 and os.environ.get("STOP_AT_3"):
                jaxfl.request_stop("stopped for the test")


class Pairs(Algorithm):
    name = "pairs_plugin_check"
    reads = frozenset()

    def policy(self):
        return PairPolicy(self.run.local_steps)
'''


def test_a_plugin_file_named_like_a_standard_module_shadows_nothing(tmp_path):
    import json
    import sys

    from jaxfl.algorithms import get, unregister

    (tmp_path / "json.py").write_text(PLUGIN)
    try:
        cls = get(f"{tmp_path / 'json.py'}:Pairs")
        assert sys.modules["json"] is json and json.dumps({"a": 1}) == '{"a": 1}'
        assert cls.__module__.startswith("jaxfl_user_") and cls.__module__.endswith("_json")
        assert sys.modules[cls.__module__].__file__ == str(tmp_path / "json.py")
        assert get(f"{tmp_path / 'json.py'}:Pairs") is cls  # loaded once
    finally:
        unregister("pairs_plugin_check")


def test_a_plugin_file_with_a_name_of_its_own_keeps_it(tmp_path):
    import sys

    from jaxfl.algorithms import get, unregister
    from jaxfl.algorithms.base import plugin_module_name

    (tmp_path / "jaxfl_pairs_plugin_check.py").write_text(PLUGIN)
    try:
        cls = get(f"{tmp_path / 'jaxfl_pairs_plugin_check.py'}:Pairs")
        assert cls.__module__ == "jaxfl_pairs_plugin_check"  # importable by name (the conformance no-jax check)
    finally:
        unregister("pairs_plugin_check")
        sys.modules.pop("jaxfl_pairs_plugin_check", None)
    for stem in ("json", "random", "os", "sys", "numpy", "jaxfl"):
        assert plugin_module_name(str(tmp_path / f"{stem}.py")).startswith("jaxfl_user_"), stem


RUN = '''
import os, sys
import jaxfl
from jaxfl.experiment import RunInterrupted
config = jaxfl.RunConfig(algorithm=sys.argv[1], dataset="mnist10k", model="logreg", clients=4, local_steps=2,
                         batch_size=16, max_updates=6, checkpoint_every=1, output_dir=sys.argv[2], run_name="run",
                         progress=False, stop_at_target=False)
if sys.argv[3] == "start":
    try:
        jaxfl.run_experiment(config)
    except RunInterrupted:
        print("interrupted")
else:
    import json
    result = jaxfl.resume_experiment(os.path.join(sys.argv[2], "run"), progress=False)
    print("resumed", result.summary["global_updates"], result.summary["resumes"], json.__name__)
'''


def test_a_run_of_a_plugin_file_resumes_in_a_new_process(tmp_path):
    import os
    import subprocess
    import sys

    (tmp_path / "json.py").write_text(PLUGIN)
    (tmp_path / "driver").mkdir()  # not beside json.py: a script's folder comes first on sys.path
    (tmp_path / "driver" / "go.py").write_text(RUN)
    reference = f"{tmp_path / 'json.py'}:Pairs"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def go(stage, **env):
        done = subprocess.run([sys.executable, str(tmp_path / "driver" / "go.py"), reference, str(tmp_path / "out"), stage],
                              capture_output=True, text=True, cwd=root, timeout=600,
                              env={**os.environ, "JAXFL_CPU_DEVICES": "1", **env})
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    assert go("start", STOP_AT_3="1") == "interrupted"
    assert go("resume") == "resumed 6 1 json"


# ---------------------------------------------------------------- 6: a weigh hook's coefficient count
@pytest.mark.parametrize("coefficients, given", [([1.0], "1 coefficients"), ([1.0, 2.0, 3.0], "3 coefficients"),
                                                 (0.5, "float 0.5, not a sequence of coefficients,")])
def test_weigh_returning_another_count_than_records_is_refused_by_name(coefficients, given):
    import re
    from types import SimpleNamespace

    from jaxfl.algorithms import DeviceHook
    from jaxfl.engine import Engine
    from jaxfl.scheduler.simulation import Aggregation

    class Short(DeviceHook):
        name = "short"

        def weigh(self, ctx, aggregation, records):
            return coefficients

    records = [SimpleNamespace(id=3), SimpleNamespace(id=1)]
    aggregation = Aggregation(time=1.0, version=1, contributions=((3, 0.5), (1, 0.5)))
    engine = SimpleNamespace(hooks=[Short()], last_weights=None)
    with pytest.raises(ValueError, match=re.escape(f"device hook 'short' (Short).weigh returned {given} for 2 "
                                                   "records (dispatches 3, 1): it must return one coefficient "
                                                   "per record")):
        Engine._weigh(engine, aggregation, records)


@pytest.mark.parametrize("coefficients, refused, error", [
    ({3: 0.5, 1: 0.5}, "weigh returned a dict: it must return one coefficient per record, in the records' order",
     ValueError),
    # a numerical error, which stops the run with its summary: PORT's and FedASMU's own weights overflow
    # to NaN on the finite but huge updates of a diverging run (they ended it as bad input, exit 2, no summary)
    ([0.5, float("nan")], "weigh returned non-finite coefficients for aggregation 1 (dispatch 1: nan) "
                          "from finite updates: every coefficient must be a finite number", NumericalError),
])
def test_weigh_returning_a_mapping_or_a_non_finite_coefficient_is_refused_by_name(coefficients, refused, error):
    """A dict's keys (dispatch ids) would be read as the coefficients, and a NaN one would turn the global
    model NaN with the next client trained from it blamed."""
    import re
    from types import SimpleNamespace

    from jaxfl.algorithms import DeviceHook
    from jaxfl.engine import Engine
    from jaxfl.scheduler.simulation import Aggregation

    class Odd(DeviceHook):
        name = "odd"

        def weigh(self, ctx, aggregation, records):
            return coefficients

    records = [SimpleNamespace(id=3), SimpleNamespace(id=1)]
    aggregation = Aggregation(time=1.0, version=1, contributions=((3, 0.5), (1, 0.5)))
    engine = SimpleNamespace(hooks=[Odd()], last_weights=None)
    with pytest.raises(error, match=re.escape(f"device hook 'odd' (Odd).{refused}")) as raised:
        Engine._weigh(engine, aggregation, records)
    if error is NumericalError:  # a hook of the user's is pointed at; a built-in one (PORT's, FedASMU's) is not
        assert str(raised.value).endswith("(lower the learning rate); a hook of your own may compute NaN (check its "
                                          "weigh)")
        Odd.__module__ = "jaxfl.algorithms.port"
        with pytest.raises(error) as raised:
            Engine._weigh(engine, aggregation, records)
        assert str(raised.value).endswith("come from a diverging run (lower the learning rate)")


def test_a_hook_that_makes_the_global_model_nan_stops_the_run_naming_it_not_a_client(tmp_path):
    """An ``apply`` that returns NaN: every client trained from the model after it returns NaN; the run
    stops saying the global model holds NaN and which hooks update it, with on_nonfinite 'skip' too
    (dropping clients one by one could never recover)."""
    import jax

    import jaxfl
    from jaxfl.algorithms import Algorithm, DeviceHook, register
    from jaxfl.algorithms.base import unregister
    from jaxfl.scheduler.simulation import NumericalError

    class Poison(DeviceHook):
        name = "poison"

        def apply(self, ctx, aggregation, records):
            return jax.tree.map(lambda leaf: leaf * float("nan"), ctx.params)

    class EveryArrival(Policy):
        def __init__(self, local_steps):
            self.local_steps = local_steps

        def start(self, sim):
            for client in range(sim.num_clients):
                sim.dispatch(client, self.local_steps)

        def on_arrival(self, sim, record):
            sim.aggregate([(record.id, 1.0 / sim.num_clients)])
            sim.reply(record.client)

    @register
    class PoisonedAsync(Algorithm):
        name = "poisoned_async_test"

        def policy(self):
            return EveryArrival(self.run.local_steps)

        def hooks(self):
            return (Poison(),)

    try:
        for on_nonfinite in ("stop", "skip"):
            config = jaxfl.RunConfig(algorithm="poisoned_async_test", model="logreg", clients=3, local_steps=2,
                                     batch_size=8, max_updates=6, on_nonfinite=on_nonfinite, progress=False,
                                     output_dir=str(tmp_path / on_nonfinite), checkpoint_every=None,
                                     final_checkpoint=False)  # a local policy class: no checkpoint pickles it
            with pytest.raises(NumericalError, match=r"the global model \(version \d+\) holds NaN/Inf: an aggregation "
                                                     r"made it so, not a client .* hook 'poison' \(Poison\)"):
                jaxfl.run_experiment(config)
    finally:
        unregister("poisoned_async_test")


def test_weigh_returning_one_coefficient_per_record_replaces_them():
    from types import SimpleNamespace

    import numpy as np

    from jaxfl.algorithms import DeviceHook
    from jaxfl.engine import Engine
    from jaxfl.scheduler.simulation import Aggregation

    class Halves(DeviceHook):
        def weigh(self, ctx, aggregation, records):
            return np.array([0.25, 0.75])

    aggregation = Aggregation(time=1.0, version=1, contributions=((3, 0.5), (1, 0.5)))
    engine = SimpleNamespace(hooks=[Halves()], last_weights=None)
    weighed = Engine._weigh(engine, aggregation, [SimpleNamespace(id=3), SimpleNamespace(id=1)])
    assert weighed.contributions == ((3, 0.25), (1, 0.75)) and engine.last_weights == {3: 0.25, 1: 0.75}


# ---------------------------------------------------------------- 7: staleness parameters, examples
def test_staleness_parameters_take_any_real_number():
    import numpy as np

    from jaxfl.scheduler.staleness import make_staleness

    assert make_staleness("polynomial", a=np.float32(0.5))(3) == pytest.approx(0.45)
    assert make_staleness("hinge", alpha=np.float64(1.0), a=np.int64(1), b=4)(5) == pytest.approx(0.5)
    assert make_staleness("exponential", a=0)(7) == 1.0
    for bad in (True, "0.5", float("nan"), np.float32("inf"), None):
        with pytest.raises(ValueError, match="must be a finite real number"):
            make_staleness("polynomial", a=bad)


def test_staleness_functions_have_runnable_examples():
    import doctest

    from jaxfl.scheduler import staleness

    for function in (staleness.constant, staleness.hinge, staleness.exponential, staleness.polynomial):
        assert ">>> " in (function.__doc__ or ""), function.__name__
    result = doctest.testmod(staleness)
    assert result.failed == 0 and result.attempted >= 8


# ---------------------------------------------------------------- 8: README's "Adding an algorithm"
def test_readme_adding_an_algorithm_snippet_runs():
    import os
    import re

    from jaxfl.algorithms import names, unregister

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    section = text.split("## Adding an algorithm", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, re.S)
    assert "self.local_steps" in section
    try:
        exec(compile(snippet, "README.md (Adding an algorithm)", "exec"), {"__name__": "readme_snippet"})
        assert "mine" in names()
    finally:
        unregister("mine")


@pytest.mark.parametrize("source, said", [("class Broken(:\n    pass\n", r"invalid syntax at .*broken\.py:1"),
                                          ("raise RuntimeError('boom')\n", r"importing .* raised RuntimeError: boom")])
def test_a_plugin_file_that_does_not_import_is_named_in_one_line(tmp_path, source, said):
    """A syntax error or an exception while importing --algorithm FILE.py:Class escaped as a raw
    traceback; it is a KeyError naming the reference, the file and line, as --model's is."""
    from jaxfl.algorithms import get

    path = tmp_path / "broken.py"
    path.write_text(source)
    with pytest.raises(KeyError, match=rf"algorithm reference '.*broken\.py:Broken' could not be imported: {said}"):
        get(f"{path}:Broken")


# ---------------------------------------------------------------- a misspelt hook, a policy without on_arrival
def test_a_misspelt_hook_is_refused_when_its_class_is_defined():
    """``on_arival``, ``weight`` or ``hook`` would never be called (the base's default runs instead, an
    error deep in the run or silently nothing): refused at once, naming the hook it misses."""
    from jaxfl.algorithms import Algorithm, DeviceHook

    with pytest.raises(TypeError, match="Typo.on_arival looks like a misspelt on_arrival, which Policy calls"):
        class Typo(Policy):
            def on_arival(self, sim, record):
                pass
    with pytest.raises(TypeError, match="Weights.weight looks like a misspelt weigh, which DeviceHook calls"):
        class Weights(DeviceHook):
            def weight(self, ctx, aggregation, records):
                return None
    with pytest.raises(TypeError, match="OneHook.hook looks like a misspelt hooks, which Algorithm calls"):
        class OneHook(Algorithm):
            name = "one_hook_test"

            def hook(self):
                return ()

    class Helpers(Policy):  # a near name beside the hook itself is a helper: allowed
        def on_arrival(self, sim, record):
            pass

        def on_arrivals(self, sim, records):
            pass

    assert Helpers.on_arrivals


def test_a_policy_without_on_arrival_is_refused_before_the_run():
    from types import SimpleNamespace

    from jaxfl.algorithms import Algorithm

    class Starts(Policy):
        def start(self, sim):
            pass

    class NoArrivals(Algorithm):
        name = "no_arrivals_test"

        def policy(self):
            return Starts()

    with pytest.raises(TypeError, match=r"NoArrivals.policy\(\) returned a Starts, which does not define "
                                        r"on_arrival\(self, sim, record\)"):
        NoArrivals(SimpleNamespace(local_steps=2)).policy()


def test_hooks_returning_one_hook_and_a_policy_dispatching_a_fraction_of_a_step_are_refused_by_name():
    """``hooks()`` must return a tuple (one hook alone failed as "'H' object is not iterable"), and a
    step count of 2.7 trained 2 steps, silently."""
    from types import SimpleNamespace

    from jaxfl.algorithms import Algorithm, DeviceHook, PluginError, device_hooks
    from jaxfl.scheduler.simulation import local_steps_of

    class Lone(DeviceHook):
        name = "lone"

    class OneHookAlone(Algorithm):
        name = "one_hook_alone_test"

        def hooks(self):
            return Lone()

    run = SimpleNamespace(local_steps=2, client_optimizer="sgd", client_lr=0.1, client_momentum=0.0,
                          client_lr_decay=1.0, prox_mu=0.0, client_weight_decay=0.0, fednova=False)
    with pytest.raises(PluginError, match=r"OneHookAlone.hooks\(\) returned a Lone: it must return a tuple of "
                                          r"DeviceHook instances"):
        device_hooks(OneHookAlone(run))

    class Fraction(StepsElsewhere):
        def start(self, sim):
            sim.dispatch(0, 2.7)

    with pytest.raises(ValueError, match=r"steps=2.7 \(float\) is not a step count: an integer >= 0"):
        simulation(Fraction(2)).run()
    with pytest.raises(ValueError, match=r"local_steps=2.5 \(float\) is not a step count"):
        local_steps_of(2.5, 0)
    assert local_steps_of(3.0, 0) == 3 and local_steps_of((4, 5), 1) == 5


def test_aggregating_a_record_instead_of_its_id_and_an_algorithm_class_as_the_config_name_are_named():
    import jaxfl
    from jaxfl.algorithms import FedAvgAlgorithm, PluginError
    from jaxfl.config import ConfigError, validate

    class ByRecord(StepsElsewhere):
        def start(self, sim):
            sim.dispatch(0, self.steps)

        def on_arrival(self, sim, record):
            sim.aggregate([(record, 1.0)])

    with pytest.raises(PluginError, match=r"aggregate\(\) takes \(dispatch id, coefficient\) pairs, e.g. "
                                          r"\[\(record.id, weight\)\]; got \[\(DispatchRecord"):
        simulation(ByRecord(2)).run()
    with pytest.raises(ConfigError, match="expected a string naming it: its registered name 'fedavg' or 'module:Class'"):
        validate(jaxfl.RunConfig(algorithm=FedAvgAlgorithm))


def test_jaxfl_algorithms_shows_a_plugin_s_docstring_where_it_has_no_summary(capsys):
    from jaxfl import cli
    from jaxfl.algorithms import FedAvgAlgorithm, register, unregister

    @register
    class Documented(FedAvgAlgorithm):
        """FedAvg, documented by its docstring alone.

        More lines that the listing leaves out.
        """
        name = "documented_test"
        summary = ""

    try:
        assert cli.main(["algorithms"]) == 0
        line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("documented_test"))
        assert line.endswith("FedAvg, documented by its docstring alone")
    finally:
        unregister("documented_test")


def test_a_plugin_file_whose_class_cannot_be_registered_is_one_error_naming_why(tmp_path):
    """A bad ``kind`` (or no ``name``...) of a ``file.py:Class`` came out as register()'s traceback."""
    from jaxfl import algorithms

    (tmp_path / "bad_kind_plugin.py").write_text(
        "from jaxfl.algorithms import Algorithm\n\n\nclass BadKind(Algorithm):\n    name = 'bad_kind_test'\n"
        "    kind = 'async'\n")
    reference = f"{tmp_path / 'bad_kind_plugin.py'}:BadKind"
    with pytest.raises(KeyError, match=r"cannot be registered: BadKind.kind='async' is not one of synchronous, "
                                       r"asynchronous, semi-asynchronous"):
        algorithms.get(reference)
    assert "bad_kind_test" not in algorithms.names()


def test_an_error_raised_in_a_plugin_s_own_code_keeps_its_traceback(tmp_path, capsys):
    """A ValueError from the user's policy came out as "jaxfl: error: ..." and status 2, the
    one-line form of bad input, with no word of where it was raised. It is a bug in their code:
    the traceback, the file and line, and status 1. jaxfl's own refusals stay one line."""
    from jaxfl import cli
    from jaxfl.algorithms import unregister

    plugin = PLUGIN.replace("        sim.reply(record.client)\n",
                            "        sim.reply(record.client)\n"
                            "        if sim.version == 1:\n"
                            "            raise ValueError('my policy cannot handle version 1')\n")
    (tmp_path / "raising_plugin.py").write_text(plugin)
    common = ["run", "--algorithm", f"{tmp_path / 'raising_plugin.py'}:Pairs", "--dataset", "mnist10k",
              "--model", "logreg", "--clients", "4", "--local-steps", "2", "--batch-size", "16",
              "--max-updates", "4", "--no-progress", "--out", str(tmp_path / "runs")]
    try:
        with pytest.raises(SystemExit) as ended:
            cli.main(common)
        assert ended.value.code == 1
        err = capsys.readouterr().err
        line = plugin.splitlines().index("            raise ValueError('my policy cannot handle version 1')") + 1
        assert "Traceback (most recent call last)" in err
        assert err.rstrip().splitlines()[-1] == (
            f"jaxfl: error in your code ({tmp_path / 'raising_plugin.py'}, line {line}, in on_arrival; traceback "
            "above): ValueError: my policy cannot handle version 1")

        with pytest.raises(SystemExit) as ended:  # bad input to jaxfl, with the same plug-in: one line
            cli.main(common + ["--clients", "0"])
        assert ended.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.startswith("jaxfl: error: ") and "clients" in err
    finally:
        unregister("pairs_plugin_check")


@pytest.mark.parametrize("name, hint", [("fedprox", "--prox-mu MU"), ("FedNova", "--fednova"),
                                        ("fedopt", "--server-optimizer adam|yogi|adagrad")])
def test_a_paper_s_name_that_jaxfl_offers_as_an_option_points_to_it(name, hint):
    """``--algorithm fedprox`` listed the registered algorithms; the README's heading names it."""
    from jaxfl.algorithms import get

    with pytest.raises(KeyError, match=re.escape(f"in jaxfl {name} is an option of the algorithms, not one of them: {hint}")):
        get(name)


# ---------------------------------------------------------------- a policy a checkpoint cannot pickle
class LambdaWeighted(Policy):
    """A newcomer's staleness function kept as a lambda, in __init__ or once the run starts."""

    def __init__(self, local_steps, late=False):
        self.local_steps, self.late = local_steps, late
        if not late:
            self.weight = lambda s: 0.5 ** s

    def start(self, sim):
        if self.late:
            self.weight = lambda s: 0.5 ** s
        sim.dispatch_many(range(sim.num_clients), self.local_steps)

    def on_arrival(self, sim, record):
        sim.aggregate([(record.id, self.weight(sim.staleness(record)) * sim.client_weights[record.client])])
        sim.reply(record.client)


@pytest.fixture
def lambda_algorithms():
    from jaxfl.algorithms import Algorithm, register, unregister

    made = []
    for late in (False, True):
        class LambdaAlgorithm(Algorithm):
            name = f"lambda_weighted_test_{'late' if late else 'init'}"
            kind = "asynchronous"
            starts_late = late

            def policy(self):
                return LambdaWeighted(self.run.local_steps, self.starts_late)

        made.append(register(LambdaAlgorithm).name)
    yield made
    for name in made:
        unregister(name)


def test_a_policy_a_checkpoint_cannot_pickle_is_refused_before_the_run(tmp_path, lambda_algorithms):
    """It trained the whole run, then failed at the final checkpoint in a raw traceback, no summary."""
    import dataclasses

    import jaxfl

    at_init, at_start = lambda_algorithms
    config = jaxfl.RunConfig(algorithm=at_init, model="logreg", clients=3, local_steps=2, batch_size=16,
                             max_updates=3, progress=False, output_dir=str(tmp_path / "runs"))
    with pytest.raises(TypeError, match=r"LambdaAlgorithm.policy\(\) returned a LambdaWeighted that a checkpoint "
                                        r"cannot pickle \(AttributeError: .*lambda.*\): keep functions .* at module level"):
        jaxfl.run_experiment(config)
    assert not (tmp_path / "runs").exists()
    # without checkpoints nothing is pickled: it runs
    result = jaxfl.run_experiment(dataclasses.replace(config, checkpoint_every=None, final_checkpoint=False))
    assert result.summary["global_updates"] == 3
    # made unpicklable once started: the checkpoint says what cannot be pickled, naming the policy
    with pytest.raises(TypeError, match=r"checkpoint 1: the scheduler's state cannot be pickled .*what the policy "
                                        r"\(LambdaWeighted\) and the other parts of a run keep must be picklable"):
        jaxfl.run_experiment(dataclasses.replace(config, algorithm=at_start, checkpoint_every=1))


def test_a_comparison_refuses_a_policy_a_checkpoint_cannot_pickle_before_its_first_run(tmp_path, lambda_algorithms):
    # it was refused at its own turn, after the runs before it had trained (a review: a long baseline first)
    from jaxfl.comparison import compare

    import jaxfl

    at_init, _ = lambda_algorithms
    configs = [jaxfl.RunConfig(algorithm=name, model="logreg", clients=3, local_steps=2, batch_size=16, max_updates=3,
                               progress=False, output_dir=str(tmp_path / "runs")) for name in ("fedavg", at_init)]
    with pytest.raises(TypeError, match=r"LambdaAlgorithm.policy\(\) returned a LambdaWeighted that a checkpoint "
                                        r"cannot pickle"):
        compare(configs)
    assert not (tmp_path / "runs").exists()  # fedavg did not run


def test_the_check_before_a_comparison_builds_a_plug_in_s_policy_only_where_a_checkpoint_pickles_it(lambda_algorithms):
    from jaxfl.algorithms import get
    from jaxfl.experiment import check_buildable

    import jaxfl

    at_init, _ = lambda_algorithms
    cls, built = get(at_init), []
    policy = cls.policy
    cls.policy = lambda self: built.append(1) or policy(self)
    try:
        check_buildable(jaxfl.RunConfig(algorithm=at_init, model="logreg", clients=3, local_steps=2, max_updates=3,
                                        checkpoint_every=None, final_checkpoint=False))
        assert built == []  # nothing to pickle: a policy built for nothing (its side effects, its memory)
    finally:
        cls.policy = policy


def test_an_algorithm_without_a_policy_is_refused_at_register():
    from jaxfl.algorithms import Algorithm, register

    class NoPolicy(Algorithm):
        name = "no_policy_test"

    with pytest.raises(TypeError, match=r"NoPolicy defines no policy\(self\): the method that returns its "
                                        r"scheduling Policy"):
        register(NoPolicy)


class MixesWithoutStartModels(Policy):
    local_steps = 2

    def start(self, sim):
        sim.dispatch_many(range(sim.num_clients), self.local_steps)

    def on_arrival(self, sim, record):
        sim.aggregate([(record.id, 0.5)], mode="mix", server_optimizer=False)
        sim.reply(record.client)


def test_a_mix_aggregation_without_needs_start_models_names_the_attribute():
    """It failed in the engine: "needs the engine built with keep_start_versions=True", an argument no
    user sets (and ctx.start_model() in a bare KeyError)."""
    with pytest.raises(TypeError, match=r"MixesWithoutStartModels aggregates with mode='mix', which needs the model "
                                        r"each dispatch started from: set needs_start_models = True"):
        simulation(MixesWithoutStartModels()).run()

    class Mixes(MixesWithoutStartModels):
        needs_start_models = True

    sim = simulation(Mixes())
    sim.run()
    assert [a.mode for a in sim.backend.aggregations] == ["mix"] * 5


@pytest.mark.parametrize("annotation", ["tuple[int, ...]", "int | float", "Literal['median', 'trimmed']",
                                        "list[float]"])
def test_an_option_type_jaxfl_cannot_check_is_refused_at_register(annotation):
    """Every value of it, the default included, was refused as "expected a string" at every run."""
    import dataclasses

    from jaxfl.algorithms import Algorithm, Options, register

    Typed = dataclasses.make_dataclass("Typed", [("value", annotation, dataclasses.field(default=None))],
                                       bases=(Options,), frozen=True)

    class TypedAlg(Algorithm):
        name, Options = "typed_option_test", Typed

        def policy(self):
            return StepsElsewhere(self.run.local_steps)

    with pytest.raises(TypeError, match=rf"TypedAlg.Options: option value: {re.escape(annotation)} is not a type "
                                        r"jaxfl can check .*use one of bool, int, float, str"):
        register(TypedAlg)


def test_an_optional_written_with_typing_is_an_optional_option():
    """`Optional[int]` (a module with ``from __future__ import annotations`` keeps it as text) was
    checked as a string."""
    import dataclasses

    from jaxfl.algorithms import Algorithm, Options, register, unregister
    from jaxfl.config import RunConfig, validate

    Typed = dataclasses.make_dataclass("Typed", [("limit", "Optional[int]", dataclasses.field(default=None))],
                                       bases=(Options,), frozen=True, namespace={"namespace": "typed_opt"})

    class TypedAlg(Algorithm):
        name, Options = "typed_optional_test", Typed

        def policy(self):
            return StepsElsewhere(self.run.local_steps)

    register(TypedAlg)
    try:
        assert validate(RunConfig(algorithm="typed_optional_test", algorithm_options={"limit": 3})
                        ).algorithm_options.limit == 3
        with pytest.raises(ValueError, match=r"typed_opt.limit='3' is not allowed: expected an integer or null"):
            validate(RunConfig(algorithm="typed_optional_test", algorithm_options={"limit": "3"}))
    finally:
        unregister("typed_optional_test")


def test_a_sweep_file_s_options_table_of_a_plugin_that_did_not_import_says_why(tmp_path, capsys):
    """The table was named an unknown config field, and nothing more (a --config file said why)."""
    from jaxfl import cli

    (tmp_path / "sweep.toml").write_text('clients = 4\n\n[trim]\ntrim = 1\n\n[grid]\n'
                                         'algorithm = ["fedavg", "no_such_file.py:Trimmed"]\n')
    with pytest.raises(SystemExit):
        cli.main(["sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "out")])
    said = capsys.readouterr().err
    # the cause first, then the table, named as a section, as --config names it; a relative path is the
    # working directory's (a review read it as the sweep file's folder)
    assert f"algorithm reference 'no_such_file.py:Trimmed' could not be imported: no file 'no_such_file.py' in the " \
           f"working directory {os.getcwd()}; the unknown section [trim] may be its options'" in said
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- what device hooks return
class EveryArrival(Policy):
    def __init__(self, local_steps):
        self.local_steps = local_steps

    def start(self, sim):
        sim.dispatch_many(range(sim.num_clients), self.local_steps)

    def on_arrival(self, sim, record):
        sim.aggregate([(record.id, 1.0 / sim.num_clients)])
        sim.reply(record.client)


@contextlib.contextmanager
def every_arrival_with(hook):
    """An asynchronous algorithm aggregating every arrival, with ``hook`` (a DeviceHook class),
    registered for the block; yields its name."""
    from jaxfl.algorithms import Algorithm, register, unregister

    class WithHook(Algorithm):
        name, kind = "hook_test", "asynchronous"

        def policy(self):
            return EveryArrival(self.run.local_steps)

        def hooks(self):
            return (hook(),)

    register(WithHook)
    try:
        yield WithHook.name
    finally:
        unregister(WithHook.name)


def _hook_mistakes():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxfl.algorithms import DeviceHook

    class HalfApply(DeviceHook):
        name = "half"

        def apply(self, ctx, aggregation, records):
            return jax.tree.map(lambda leaf: leaf.astype(jnp.bfloat16), ctx.params)

    class TransposedApply(DeviceHook):
        name = "transposed"

        def apply(self, ctx, aggregation, records):
            return jax.tree.map(lambda leaf: leaf.T, ctx.params)

    class SetsParams(DeviceHook):
        name = "sets_params"

        def apply(self, ctx, aggregation, records):
            ctx.params = jax.tree.map(lambda leaf: leaf * 0.5, ctx.params)

    class ScalarExtra(DeviceHook):
        name = "scalar_extra"

        def extra_pseudo_gradient(self, ctx, aggregation, records):
            return jax.tree.map(lambda leaf: 1e-3 * jnp.sum(leaf * leaf), ctx.params)

    class ColumnWeigh(DeviceHook):
        name = "column_weigh"

        def weigh(self, ctx, aggregation, records):
            return np.full((len(records), 1), 0.5)

    return {
        HalfApply: r"'half' \(HalfApply\).apply returned new parameters unlike the model's: leaf \[.*\] has shape "
                   r"\(\d+,?\d*\) and dtype bfloat16 where the parameters' has .* and float32",
        TransposedApply: r"'transposed' \(TransposedApply\).apply returned new parameters unlike the model's: leaf",
        SetsParams: r"'sets_params' \(SetsParams\).apply set ctx.params and returned None: return the new parameters",
        ScalarExtra: r"'scalar_extra' \(ScalarExtra\).extra_pseudo_gradient returned a term unlike the "
                     r"pseudo-gradient: leaf .* has shape \(\)",
        ColumnWeigh: r"'column_weigh' \(ColumnWeigh\).weigh returned coefficients of shape \(1, 1\): it must return "
                     r"one number per record"}


def test_what_a_device_hook_returns_is_checked_against_the_model(tmp_path):
    """bfloat16 parameters from apply failed at the next training call as XLA's argument check; a
    transposed leaf at the next aggregation; a scalar extra term per leaf was broadcast silently (the
    run "succeeded" at chance accuracy); an apply that set ctx.params had the generic update applied
    on top; a weigh of an (n, 1) array was a bare TypeError."""
    import jaxfl

    for hook, message in _hook_mistakes().items():
        with every_arrival_with(hook) as name, pytest.raises(ValueError, match=message):
            jaxfl.run_experiment(jaxfl.RunConfig(algorithm=name, model="logreg", clients=3, local_steps=2,
                                                 batch_size=8, max_updates=2, progress=False,
                                                 output_dir=str(tmp_path / hook.__name__)))


def _state_hooks():
    import jax.numpy as jnp
    import numpy as np

    from jaxfl.algorithms import DeviceHook

    class CountsUpdates(DeviceHook):  # state a Python number: the checkpoint failed after the training
        name = "counts"

        def init(self, params, num_clients):
            return 0

        def after_update(self, ctx, aggregation, records):
            ctx.state[self.name] = ctx.state[self.name] + 1

    class HalvesACounter(DeviceHook):  # an int32 counter become float32: saved, then every resume failed
        name = "halves"

        def init(self, params, num_clients):
            return jnp.zeros((), jnp.int32)

        def after_update(self, ctx, aggregation, records):
            ctx.state[self.name] = ctx.state[self.name] + 0.5

    class CountsPerClient(DeviceHook):  # NumPy state updated in place: it must stay NumPy
        name = "per_client"

        def init(self, params, num_clients):
            return {"counts": np.zeros(num_clients, np.int32)}

        def after_update(self, ctx, aggregation, records):
            ctx.state[self.name]["counts"][np.array([r.client for r in records])] += 1

    class ReadsStartModels(DeviceHook):  # a policy aggregating the newest version's dispatches: kept anyway
        name = "reads_starts"

        def after_update(self, ctx, aggregation, records):
            for record in records:
                ctx.start_model(record)

    return CountsUpdates, HalvesACounter, CountsPerClient, ReadsStartModels


def test_a_hooks_state_is_saved_as_arrays_and_checked_against_its_init(tmp_path):
    import jaxfl

    counts, halves, per_client, reads_starts = _state_hooks()
    results = {}
    for hook in (counts, halves, per_client):
        with every_arrival_with(hook) as name:
            config = jaxfl.RunConfig(algorithm=name, model="logreg", clients=3, local_steps=2, batch_size=8,
                                     max_updates=3, checkpoint_every=1, progress=False,
                                     output_dir=str(tmp_path / hook.__name__))
            if hook is not halves:
                results[hook] = jaxfl.run_experiment(config)
            else:
                with pytest.raises(TypeError, match=r"device hook 'halves' \(HalvesACounter\): the state it keeps is "
                                                    r"unlike the state its init made.*dtype float32 where its init's "
                                                    r"has \(\) and int32.*fixed_state_shape = False"):
                    jaxfl.run_experiment(config)
    assert int(results[counts].engine.state["counts"]) == 3
    assert results[per_client].engine.state["per_client"]["counts"].sum() == 3


def test_start_model_of_a_version_the_engine_keeps_needs_no_declaration(tmp_path):
    """A synchronous round's dispatches all start from the current version, which the engine always
    keeps: ctx.start_model() of them worked before needs_start_models was asked for, and still does."""
    import jaxfl
    from jaxfl.algorithms import Algorithm, register, unregister
    from jaxfl.algorithms.fedavg import FedAvg

    *_, reads_starts = _state_hooks()

    @register
    class RoundsReadingStarts(Algorithm):
        name, kind = "rounds_reading_starts_test", "synchronous"

        def policy(self):
            return FedAvg(self.run.local_steps)

        def hooks(self):
            return (reads_starts(),)

    try:
        result = jaxfl.run_experiment(jaxfl.RunConfig(algorithm=RoundsReadingStarts.name, model="logreg", clients=3,
                                                      local_steps=2, batch_size=8, max_updates=2, progress=False,
                                                      output_dir=str(tmp_path)))
        assert result.summary["global_updates"] == 2
    finally:
        unregister(RoundsReadingStarts.name)


def test_plugin_namespaces_that_meet_run_flags_or_a_built_in_namespace_parse():
    """A namespace "server" with an option "momentum" (jaxfl 0.1's flat spelling --server-momentum is
    a run flag) made argparse refuse the whole parser; a plug-in extending FedCompass's options got
    only FedCompass's flags (--compass.jitter unrecognised); an option typed otherwise than the same
    option of the namespace's other algorithm was parsed by the other's type."""
    import dataclasses

    from jaxfl.algorithms import Options, register, unregister
    from jaxfl.algorithms.fedbuff import FedBuffAlgorithm
    from jaxfl.algorithms.fedcompass import FedCompassAlgorithm, FedCompassConfig
    from jaxfl.cli import _configs, build_parser

    ServerOptions = dataclasses.make_dataclass("ServerOptions", [("momentum", "float", dataclasses.field(default=0.9))],
                                               bases=(Options,), frozen=True, namespace={"namespace": "server"})
    CompassMore = dataclasses.make_dataclass("CompassMore", [("jitter", "float", dataclasses.field(default=0.0))],
                                             bases=(FedCompassConfig,), frozen=True)
    IntBound = dataclasses.make_dataclass("IntBound", [("staleness_bound", "int", dataclasses.field(default=5))],
                                          bases=(Options,), frozen=True, namespace={"namespace": "port"})
    server = register(type("ServerMom", (FedBuffAlgorithm,), {"name": "server_mom_test", "Options": ServerOptions}))
    compass = register(type("MoreCompass", (FedCompassAlgorithm,), {"name": "more_compass_test",
                                                                     "Options": CompassMore}))
    try:
        def parsed(*argv):
            (config,) = _configs(build_parser().parse_args(["run", "--clients", "4", *argv]))
            return config

        assert parsed("--algorithm", server.name, "--server.momentum", "0.5").algorithm_options.momentum == 0.5
        assert parsed("--algorithm", compass.name, "--compass.jitter", "0.25").algorithm_options.jitter == 0.25
        with pytest.raises(TypeError, match=r"option port.staleness_bound is int, but port's in the same namespace "
                                            r"is float"):
            register(type("IntPort", (FedBuffAlgorithm,), {"name": "int_port_test", "Options": IntBound}))
    finally:
        for name in (server.name, compass.name, "int_port_test"):
            unregister(name)


def test_resuming_a_run_whose_plugin_file_was_edited_says_so(tmp_path, crash_after_saves):
    """The resumed run went on with the edited algorithm without a word (the model and data are checked)."""
    import json

    import jaxfl
    from conftest import Interrupted

    plugin = tmp_path / "edited_plugin.py"
    plugin.write_text(PLUGIN)
    config = jaxfl.RunConfig(algorithm=f"{plugin}:Pairs", model="logreg", clients=4, local_steps=2, batch_size=16,
                             max_updates=6, checkpoint_every=1, output_dir=str(tmp_path / "out"), run_name="run",
                             progress=False, stop_at_target=False)
    disarm = crash_after_saves(2)
    with pytest.raises(Interrupted):
        jaxfl.run_experiment(config)
    disarm()
    run_dir = str(tmp_path / "out" / "run")
    recorded = json.load(open(f"{run_dir}/config.json"))["algorithm_source"]
    assert recorded["file"] == str(plugin) and len(recorded["sha256"]) == 64
    plugin.write_text(PLUGIN.replace("1 + sim.staleness(record)", "2 + sim.staleness(record)"))
    with pytest.warns(UserWarning, match=rf"{re.escape(str(plugin))} \(algorithm .*:Pairs\) has changed since run "
                                         rf".* began: the resumed run goes on with the edited code"):
        jaxfl.resume_experiment(run_dir, progress=False)


def test_a_hook_that_keeps_state_in_its_own_attributes_is_warned_of_at_the_first_checkpoint(tmp_path):
    """A counter kept as self.t on a hook was lost on resume, silently: the resumed run parted from the
    uninterrupted one (accuracy 0.9495 against 0.926)."""
    import warnings

    import jaxfl
    from jaxfl.algorithms import DeviceHook, register
    from jaxfl.algorithms.base import unregister
    from jaxfl.algorithms.fedbuff import FedBuffAlgorithm
    import numpy as np

    from jaxfl.engine import HookStateWarning

    class BiasCorrection(DeviceHook):
        name = "bias_correction"

        def __init__(self):
            self.t = 0

        def apply(self, ctx, aggregation, records):
            self.t += 1  # should live in ctx.state[self.name]
            return None

    class SizedAtInit(DeviceHook):  # attributes set by init, before the run: kept, not warned of
        name = "sized_at_init"

        def init(self, params, num_clients):
            self.num_clients, self.reference = num_clients, {"w": np.zeros(3)}
            return None

    @register
    class Counting(FedBuffAlgorithm):
        name = "counting_hook_test"

        def hooks(self):
            return (*super().hooks(), BiasCorrection(), SizedAtInit())

    try:
        config = jaxfl.RunConfig(algorithm="counting_hook_test", model="logreg", clients=4, local_steps=2,
                                 batch_size=8, buffer_size=2, max_updates=4, checkpoint_every=2, progress=False,
                                 output_dir=str(tmp_path))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            jaxfl.run_experiment(config)
        said = [str(w.message) for w in caught if issubclass(w.category, HookStateWarning)]
        assert len(said) == 1, said  # once, not at every checkpoint
        assert said[0].startswith("device hook 'bias_correction' (BiasCorrection) changed its attribute t during the "
                                  "run") and "ctx.state[self.name]" in said[0]
    finally:
        unregister("counting_hook_test")


def test_server_settings_that_no_aggregation_applied_are_warned_of(tmp_path):
    """A plug-in that mixes models (never the server optimiser) and does not declare unread_settings
    ran --server-momentum 0.9 and --server-optimizer adam to the same accuracy as without, saying nothing."""
    import warnings

    import jaxfl
    from jaxfl.algorithms import register
    from jaxfl.algorithms.base import unregister
    from jaxfl.algorithms.fedasync import FedAsyncAlgorithm

    @register
    class Mixing(FedAsyncAlgorithm):  # FedAsync's mix, without its refusal of the server settings
        name = "mixing_plugin_test"

        @classmethod
        def unread_settings(cls, run, options=None):
            return {}

    def said(**server):
        config = jaxfl.RunConfig(algorithm="mixing_plugin_test", model="logreg", clients=3, local_steps=2,
                                 batch_size=8, max_updates=3, progress=False, output_dir=str(tmp_path),
                                 checkpoint_every=None, final_checkpoint=False, **server)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            jaxfl.run_experiment(config)
        return [str(w.message) for w in caught if "applied the server optimiser" in str(w.message)]

    try:
        assert said() == []  # plain sgd at lr 1: nothing to apply
        (adam,) = said(server_optimizer="adam")
        assert adam.startswith("server_optimizer='adam', server_lr=0.01: none of this run's 3 aggregations applied")
        assert "Mixing.unread_settings can refuse them" in adam
        (momentum,) = said(server_momentum=0.9)
        assert "server_momentum=0.9" in momentum
    finally:
        unregister("mixing_plugin_test")
    # a built-in's own momentum (FedCompass+M's 0.9) in a run still in its single updates: no setting of the user's
    config = jaxfl.RunConfig(algorithm="fedcompass_m", model="logreg", clients=10, max_updates=3, progress=False,
                             output_dir=str(tmp_path), checkpoint_every=None, final_checkpoint=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jaxfl.run_experiment(config)
    assert not [w for w in caught if "applied the server optimiser" in str(w.message)]


# ---------------------------------------------------------------- a plug-in that waits, with crashes
def test_a_waiting_plug_in_without_a_deadline_under_crashes_is_told_both_ways_out(capsys):
    """Without round_timeout it was refused for lacking one, and with it for never reading it: neither
    message said to read it or to set waits_for_clients = None (a review's plug-in met both)."""
    from jaxfl.algorithms import Algorithm, register, unregister
    from jaxfl.algorithms.fedavg import FedAvg as FedAvgPolicy
    from jaxfl.config import ConfigError, RunConfig, validate

    class WaitingPlugin(Algorithm):
        name, kind = "waiting_plugin_check", "synchronous"
        waits_for_clients = "80% of a round"
        reads = frozenset({"clients_per_round"})

        def policy(self):
            return FedAvgPolicy(self.run.local_steps, self.run.clients_per_round)

    register(WaitingPlugin)
    try:
        with pytest.raises(ConfigError) as refused:
            validate(RunConfig(algorithm="waiting_plugin_check", crash_prob=0.1))
        message = str(refused.value)
        assert message.startswith("crash_prob=0.1 is not allowed: only 0 for waiting_plugin_check: it waits for 80% "
                                  "of a round")
        assert "round_timeout is not among its reads" in message and "(read round_timeout and close" in message
        assert "or set waits_for_clients = None if its on_crash stops the wait" in message
        with pytest.raises(ConfigError) as refused:  # the same with the deadline it does not read
            validate(RunConfig(algorithm="waiting_plugin_check", crash_prob=0.1, round_timeout=5.0))
        assert str(refused.value) == message
        from jaxfl import cli  # the command line refuses the unread deadline first: both ways out there too

        with pytest.raises(SystemExit):
            cli.main(["run", "--algorithm", "waiting_plugin_check", "--crash-prob", "0.1", "--round-timeout", "5"])
        said = capsys.readouterr().err
        assert "round_timeout=5.0 is not allowed with algorithm waiting_plugin_check: it never reads it" in said
        assert "read round_timeout in it (a timer that closes the wait), or set waits_for_clients = None" in said
        validate(RunConfig(algorithm="fedavg", crash_prob=0.1, round_timeout=5.0))  # a built-in reads it
        with pytest.raises(ConfigError, match=r"round_timeout=None is not allowed: a deadline"):
            validate(RunConfig(algorithm="fedavg", crash_prob=0.1))
    finally:
        unregister("waiting_plugin_check")
