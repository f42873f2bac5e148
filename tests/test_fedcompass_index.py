"""FedCompass's T_a index: JOINGROUP by bisection picks exactly the group the paper's scan picks."""
import pickle

import numpy as np
import pytest

from jaxfl.algorithms import FedCompass
from jaxfl.algorithms.fedcompass import PAPER, REFERENCE_CODE
from jaxfl.scheduler.simulation import Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, ScriptedSpeeds, SpeedConfig
from jaxfl.scheduler.staleness import polynomial
from tests.conftest import RecordingBackend


def checked_simulation(options, speeds, clients, max_updates):
    """A simulation whose every JOINGROUP asserts that the index and the scan agree; the count of
    JOINGROUP calls and of the ones that found a group."""
    policy = FedCompass(2, 10, polynomial, options=options)
    calls = {"join": 0, "joined": 0}
    choice = policy._join_choice

    def checked(client, now):
        picked = choice(client, now)
        assert picked == policy._join_choice_scan(client, now), (client, now)
        assert policy._by_expected == sorted((g.expected, i) for i, g in policy.groups.items() if not g.aggregated)
        calls["join"] += 1
        calls["joined"] += picked is not None
        return picked

    policy._join_choice = checked
    sim = Simulation(policy, speeds, np.full(clients, 1.0 / clients), RecordingBackend(), max_updates=max_updates)
    return sim, calls


@pytest.mark.parametrize("options", [PAPER, REFERENCE_CODE], ids=["paper", "reference_code"])
def test_join_by_index_equals_the_scan_with_jittered_speeds(options):
    speeds = ClientSpeeds(SpeedConfig(model="exp", jitter=0.05, speed_change_prob=0.1), 60, seed=4)
    sim, calls = checked_simulation(options, speeds, 60, max_updates=400)
    sim.run()
    assert calls["joined"] > 100 and calls["join"] > calls["joined"]  # both outcomes were checked


@pytest.mark.parametrize("options", [PAPER, REFERENCE_CODE], ids=["paper", "reference_code"])
def test_join_by_index_equals_the_scan_on_ties(options):
    # three speed classes, no jitter: many groups share T_a, or land in the same q; the tie-break
    # (the latest-created group) decides
    sim, calls = checked_simulation(options, ScriptedSpeeds(lambda c, r: (1.0, 2.0, 4.0)[c % 3], num_clients=30),
                                    30, max_updates=200)
    sim.run()
    assert calls["joined"] > 50


def test_policy_pickled_without_the_index_rebuilds_it():
    speeds = ClientSpeeds(SpeedConfig(model="exp", jitter=0.05), 40, seed=1)
    sim, _ = checked_simulation(PAPER, speeds, 40, max_updates=50)
    sim.run()
    state = dict(sim.policy.__dict__)
    state.pop("_join_choice")  # the test's wrapper
    index = state.pop("_by_expected")
    assert index
    restored = pickle.loads(pickle.dumps(FedCompass(2, 10, polynomial)))
    restored.__setstate__(state)
    assert restored._by_expected == index
