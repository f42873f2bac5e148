"""ClientSpeeds draws a client's jitter normals ahead (NORMALS_AHEAD at a time from its third round on)
and a first wave of clients in bulk (ClientSpeeds.round_durations): both must give exactly the
rounds one draw per round gives, and a pickle or state_dict taken between two rounds must go on
with the same draws."""

import dataclasses
import json
import pickle

import numpy as np
import pytest

from jaxfl.scheduler.speeds import (
    _BULK_FIRST_DRAWS,
    NORMALS_AHEAD,
    STREAM_CLIENT_ROUNDS,
    ClientSpeeds,
    SpeedConfig,
    _ziggurat_tables,
)
from jaxfl.scheduler.simulation import Simulation
from tests.conftest import RecordingBackend
from tests.test_scheduler_bulk import StartAll


def reference_rounds(speeds: ClientSpeeds, client: int, rounds: int, steps: int = 10) -> list[float]:
    """The client's rounds drawn one standard normal at a time from its own Generator (no speed changes)."""
    rng = np.random.default_rng(np.random.SeedSequence([speeds.seed, STREAM_CLIENT_ROUNDS, client]))
    base, jitter, out = float(speeds.base_time_per_step[client]), speeds.config.jitter, []
    for _ in range(rounds):
        step_time = base + jitter * base * rng.standard_normal()
        while step_time <= 0:  # negative="redraw"
            step_time = base + jitter * base * rng.standard_normal()
        out.append(steps * step_time + speeds.comm_time())
    return out


@pytest.mark.parametrize("jitter", [0.05, 0.7])  # 0.7: non-positive draws redrawn from the values ahead
def test_rounds_drawn_ahead_are_the_rounds_drawn_one_at_a_time(jitter):
    speeds = ClientSpeeds(SpeedConfig(model="normal", jitter=jitter), 3, seed=4, model_bytes=100)
    rounds = 3 * NORMALS_AHEAD + 2
    drawn = {client: [] for client in range(3)}
    for index in range(rounds):
        for client in (2, 0, 1):
            drawn[client].append(speeds.round_duration(client, 10))
        if index == NORMALS_AHEAD + 2:  # between two blocks' draws: values ahead kept, then restored
            speeds = pickle.loads(pickle.dumps(speeds))
        if index == 2 * NORMALS_AHEAD - 3:
            restored = ClientSpeeds(SpeedConfig(model="normal", jitter=jitter), 3, seed=4, model_bytes=100)
            restored.load_state_dict(json.loads(json.dumps(speeds.state_dict())))
            speeds = restored
    assert all(drawn[client] == reference_rounds(speeds, client, rounds) for client in range(3))
    assert list(speeds.rounds_done) == [rounds] * 3


def test_a_state_holds_the_values_ahead_and_refuses_ones_that_do_not_fit():
    speeds = ClientSpeeds(SpeedConfig(model="exp"), 4, seed=1)
    for _ in range(4):  # two rounds alone, then a block at the third: NORMALS_AHEAD - 2 kept after the fourth
        speeds.round_duration(1, 5)
    ahead = speeds.state_dict()["normals_ahead"]
    assert ahead["clients"] == [1] and len(ahead["values"][0]) == NORMALS_AHEAD - 2
    state = speeds.state_dict()
    state["normals_ahead"] = {"clients": [9], "values": [[0.5]]}
    with pytest.raises(ValueError, match=r"clients must be ids in \[0, 4\)"):
        ClientSpeeds(SpeedConfig(model="exp"), 4, seed=1).load_state_dict(state)
    old_state = speeds.state_dict()
    del old_state["normals_ahead"]  # a state from before the values ahead: the streams are where the rounds are
    ClientSpeeds(SpeedConfig(model="exp"), 4, seed=1).load_state_dict(old_state)


@pytest.mark.parametrize("config", [dict(model="exp"), dict(model="normal", jitter=0.7),
                                    dict(model="normal", jitter=0.7, negative="clip"), dict(model="uniform", latency=0.2)])
def test_a_first_wave_in_bulk_is_each_first_round_drawn_alone(config):
    assert _ziggurat_tables() is not None  # else every round is drawn alone and the bulk path is untested here
    clients = _BULK_FIRST_DRAWS + 5_000
    order = np.random.default_rng(0).permutation(clients).tolist()
    bulk = ClientSpeeds(SpeedConfig(**config), clients, seed=3, model_bytes=1000)
    alone = ClientSpeeds(SpeedConfig(**config), clients, seed=3, model_bytes=1000)
    for speeds in (bulk, alone):  # some clients have drawn already: their second round is not a first
        for client in order[:50]:
            speeds.round_duration(client, 2)
    assert bulk.round_durations(order, 7) == [alone.round_duration(client, 7) for client in order]
    assert bulk.state_dict() == alone.state_dict()
    assert (bulk.negative_draws, list(bulk.rounds_done)) == (alone.negative_draws, list(alone.rounds_done))
    assert [bulk.round_duration(c, 3) for c in order[:500]] == [alone.round_duration(c, 3) for c in order[:500]]


def test_round_durations_checks_every_client_before_drawing():
    speeds = ClientSpeeds(SpeedConfig(model="exp"), 3, seed=0)
    with pytest.raises(ValueError, match=r"client=3 out of range \[0, 3\)"):
        speeds.round_durations([0, 3], 2)
    assert list(speeds.rounds_done) == [0, 0, 0]
    one_by_one = ClientSpeeds(SpeedConfig(model="exp"), 3, seed=0)
    assert speeds.round_durations([1, 1], 2) == [one_by_one.round_duration(1, 2), one_by_one.round_duration(1, 2)]


def test_a_bulk_first_wave_dispatches_what_one_dispatch_per_client_does():
    clients = _BULK_FIRST_DRAWS + 1_000

    def simulate(bulk: bool):
        rows = []
        speeds = ClientSpeeds(SpeedConfig(model="exp"), clients, seed=5)
        sim = Simulation(StartAll(bulk), speeds, np.full(clients, 1.0 / clients), RecordingBackend(), max_updates=300,
                         log=rows.append, client_lr_decay=0.9)
        sim.run()
        return rows, [dataclasses.astuple(record) for record in sim.records], speeds.state_dict()

    assert simulate(bulk=True) == simulate(bulk=False)
