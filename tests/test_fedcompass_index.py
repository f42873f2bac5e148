"""FedCompass's indexes: JOINGROUP and CREATEGROUP by bisection choose exactly what the paper's scans choose."""
import dataclasses
import math
import pickle

import numpy as np
import pytest

from jaxfl.algorithms import FedCompass
from jaxfl.algorithms.fedcompass import PAPER, REFERENCE_CODE, ClientState
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


def state_after_a_run(make_simulation, wrapper: str):
    """A 40-client FedCompass run's policy state, without the test's ``wrapper`` of a choice."""
    speeds = ClientSpeeds(SpeedConfig(model="exp", jitter=0.05), 40, seed=1)
    sim, _ = make_simulation(PAPER, speeds, 40, max_updates=50)
    sim.run()
    state = dict(sim.policy.__dict__)
    state.pop(wrapper)
    return sim, state


def test_policy_pickled_without_the_index_rebuilds_it():
    _, state = state_after_a_run(checked_simulation, "_join_choice")
    index = state.pop("_by_expected")
    assert index
    restored = pickle.loads(pickle.dumps(FedCompass(2, 10, polynomial)))
    restored.__setstate__(state)
    assert restored._by_expected == index


MIXED = dataclasses.replace(PAPER, create_rule="t_max", create_far_groups="skip", fastest_over="all")
OPTIONS = [PAPER, REFERENCE_CODE, MIXED]
OPTION_IDS = ["paper", "reference_code", "t_max-skip-all"]


def create_checked_simulation(options, speeds, clients, max_updates, q_range=(2, 10)):
    """A simulation whose every CREATEGROUP asserts that the T_exp index gives the scan's q and holds
    exactly the groups that count, at their T_exp; the counts of calls, of those where a group counted,
    and of those where the far-group skip left out an entry."""
    policy = FedCompass(*q_range, polynomial, options=options)
    calls = {"create": 0, "counted": 0, "far": 0}
    choice = policy._create_choice

    def checked(client, now):
        q = choice(client, now)
        assert q == policy._create_choice_scan(client, now), (client, now)
        reference = "latest" if options.create_rule == "t_max" else "expected"
        counted = {}
        for group_id, group in policy.groups.items():
            members = group.pending if options.fastest_over == "pending" else group.pending | set(group.arrived)
            if not group.aggregated and now < getattr(group, reference) and members:
                fastest = min(policy.clients[m].speed for m in members)
                counted[group_id] = getattr(group, reference) + fastest * policy.q_max
        index = policy._create_index
        assert index == sorted(index) and len(index) == len(policy._create_keys)
        assert {g: t for t, g in index if g in counted} == counted  # the rest: past T_ref, left lazily
        calls["create"] += 1
        calls["counted"] += q >= 0
        speed = policy.clients[client].speed
        calls["far"] += any(math.floor((t - now) / speed) > policy.q_max for t in counted.values())
        return q

    policy._create_choice = checked
    sim = Simulation(policy, speeds, np.full(clients, 1.0 / clients), RecordingBackend(), max_updates=max_updates)
    return sim, calls


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
def test_create_by_index_equals_the_scan_with_jittered_speeds(options):
    speeds = ClientSpeeds(SpeedConfig(model="exp", jitter=0.05, speed_change_prob=0.1), 60, seed=4)
    sim, calls = create_checked_simulation(options, speeds, 60, max_updates=400)
    sim.run()
    assert calls["counted"] > 50 and calls["create"] > calls["counted"]  # both outcomes were checked
    assert calls["far"] > 10  # groups beyond Q_max were among the candidates (skipped with "skip")


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
def test_create_by_index_equals_the_scan_on_ties(options):
    # three speed classes, no jitter: many groups share T_exp
    speeds = ScriptedSpeeds(lambda c, r: (1.0, 2.0, 4.0)[c % 3] * (1.0 + 0.5 * (r % 2 == 1 and c % 5 == 0)),
                            num_clients=30)
    sim, calls = create_checked_simulation(options, speeds, 30, max_updates=200)
    sim.run()
    assert calls["counted"] > 20


def test_create_reenters_only_the_groups_changed_since_the_last_call():
    # 300 groups of one member each, open at once: a CREATEGROUP looks up the fastest member of the
    # groups changed since the previous one only (the paper's scan, of all 300)
    policy = FedCompass(4, 20, polynomial)
    clients = 302
    sim = Simulation(policy, ClientSpeeds(SpeedConfig(model="exp"), clients, seed=0), np.full(clients, 1 / clients),
                     RecordingBackend())
    policy.clients = [ClientState(speed=0.1 + client / 1000) for client in range(clients)]
    for client in range(300):
        policy._create(sim, client)  # each one re-enters the group the one before created
    fastest_calls = []
    fastest = policy._fastest
    policy._fastest = lambda group_id, group: fastest_calls.append(group_id) or fastest(group_id, group)

    def create_choice(client):
        fastest_calls.clear()
        q = policy._create_choice(client, 0.0)
        looked_up = list(fastest_calls)
        assert q == policy._create_choice_scan(client, 0.0) >= 0
        assert len(fastest_calls) == len(looked_up) + 300
        return looked_up

    assert create_choice(300) == [299]  # created since the last CREATEGROUP
    assert create_choice(300) == []  # nothing changed
    policy.clients[301].speed = 0.099  # faster than every member (0.1 s per step and up), q within Q_max for some group
    joined, _ = policy._join_choice(301, 0.0)
    policy._reassign(sim, 301, 0.0)  # joins a group, and is its fastest member now
    assert create_choice(300) == [joined]


def test_policy_pickled_without_the_create_index_rebuilds_it():
    sim, state = state_after_a_run(create_checked_simulation, "_create_choice")
    for name in ("_create_index", "_create_keys", "_create_dirty"):
        state.pop(name)
    restored = pickle.loads(pickle.dumps(FedCompass(2, 10, polynomial)))
    restored.__setstate__(state)
    now = sim.now
    restored.clients[0].speed = 0.2
    assert restored._create_choice(0, now) == restored._create_choice_scan(0, now)
    assert restored._create_keys == {g: t for t, g in restored._create_index}
    assert not restored._create_dirty


def test_groups_pickled_before_their_log_detail_restore_it():
    sim, _ = checked_simulation(PAPER, ClientSpeeds(SpeedConfig(model="exp", jitter=0.05), 40, seed=1), 40, 50)
    sim.run()
    policy = sim.policy
    state = dict(policy.__dict__)
    state.pop("_join_choice")  # the test's wrapper
    for group in policy.groups.values():
        del group.detail  # as a group pickled before the field: the class default ""
    restored = FedCompass.__new__(FedCompass)
    restored.__setstate__(pickle.loads(pickle.dumps(state)))
    assert restored.groups and all(group.detail == f"group {group_id}" for group_id, group in restored.groups.items())
