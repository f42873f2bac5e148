"""The st(s) memo the asynchronous policies share (jaxfl.scheduler.staleness.StalenessWeights)."""

import pickle

import numpy as np
import pytest

from jaxfl.algorithms.fedasync import FedAsync
from jaxfl.algorithms.fedbuff import FedBuff
from jaxfl.algorithms.fedcompass import FedCompass
from jaxfl.scheduler.simulation import Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from jaxfl.scheduler.staleness import STALENESS_FUNCTIONS, StalenessWeights, make_staleness
from tests.conftest import RecordingBackend


class CountingStaleness:
    """A staleness function that counts its calls (picklable, as a policy's st must be)."""

    def __init__(self, name):
        self.function = make_staleness(name)
        self.calls = 0

    def __call__(self, s):
        self.calls += 1
        return self.function(s)


@pytest.mark.parametrize("name", STALENESS_FUNCTIONS)
def test_each_weight_is_st_of_s_as_a_float_computed_once(name):
    staleness = CountingStaleness(name)
    weights = StalenessWeights(staleness)
    stalenesses = [3, 0, 7, 3, 0, 40, 7, 7]
    values = [weights[s] for s in stalenesses]
    assert values == [float(staleness.function(s)) for s in stalenesses]
    assert all(type(value) is float for value in values)
    assert staleness.calls == len(set(stalenesses)) and sorted(weights) == [0, 3, 7, 40]


def test_a_pickle_keeps_the_function_and_none_of_the_values():
    weights = StalenessWeights(make_staleness("hinge", a=1.0, b=4.0))
    assert weights[5] == 0.5
    restored = pickle.loads(pickle.dumps(weights))
    assert type(restored) is StalenessWeights and len(restored) == 0
    assert restored[5] == 0.5 and restored[2] == 1.0


@pytest.mark.parametrize("policy_class", ["fedasync", "fedbuff", "fedcompass"])
def test_each_asynchronous_policy_weighs_through_the_memo_and_restores_one(policy_class):
    staleness = CountingStaleness("polynomial")
    policy = {"fedasync": lambda: FedAsync(5, staleness, concurrency=10, seed=1),
              "fedbuff": lambda: FedBuff(5, 3, staleness, concurrency=10, seed=1),
              "fedcompass": lambda: FedCompass(1, 5, staleness)}[policy_class]()
    clients = 30
    simulation = Simulation(policy, ClientSpeeds(SpeedConfig(model="exp"), clients, seed=4),
                            np.full(clients, 1 / clients), RecordingBackend(), max_updates=40)
    simulation.run()
    memo = policy._staleness_weights
    assert type(memo) is StalenessWeights and memo.staleness is staleness
    assert len(memo) > 2 and staleness.calls == len(memo)  # once per staleness value seen
    # a checkpoint from before the shared memo: a plain dict (FedAsync, FedCompass) or none (FedBuff)
    state = dict(policy.__dict__)
    state["_staleness_weights"] = {0: 0.9}
    old = type(policy).__new__(type(policy))
    old.__setstate__(state)
    assert type(old._staleness_weights) is StalenessWeights and old._staleness_weights[3] == 0.45
    del state["_staleness_weights"]
    older = type(policy).__new__(type(policy))
    older.__setstate__(state)
    assert type(older._staleness_weights) is StalenessWeights


@pytest.mark.parametrize("name, parameter", [("polynomial", "a"), ("hinge", "b"), ("hinge", "alpha"),
                                             ("exponential", "a"), ("exponential", "alpha")])
def test_a_parameter_traced_beside_numpy_staleness_values(name, parameter):
    # hinge and exponential chose NumPy from the staleness values' type alone, and NumPy cannot take
    # a tracer (notebook 04's delays are NumPy): jit and vmap over a parameter failed
    import jax
    import jax.numpy as jnp

    from jaxfl.scheduler import staleness

    function = getattr(staleness, name)
    delays = np.arange(10) % 5
    traced = jax.jit(lambda value: function(delays, **{parameter: value}))(0.7)
    np.testing.assert_allclose(np.asarray(traced), function(delays.astype(np.float64), **{parameter: 0.7}), rtol=1e-6)
    swept = jax.vmap(lambda value: function(delays, **{parameter: value}))(jnp.array([0.3, 0.7]))
    np.testing.assert_allclose(np.asarray(swept[1]), np.asarray(traced), rtol=1e-6)
    assert function(3, **{parameter: 0.7}) == pytest.approx(float(traced[3]))  # plain numbers stay NumPy
