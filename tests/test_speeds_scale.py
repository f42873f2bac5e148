"""Client streams at federation scale: ClientSpeeds and ClientFaults keep one PCG64 state per client
in arrays (jaxfl.scheduler.speeds.ClientStreams) and must draw exactly what one Generator per
client, seeded from SeedSequence([seed, stream, client]), drew before."""

import json
import pickle
import resource
import time

import numpy as np
import pytest

from jaxfl.scheduler.faults import FAULT_STREAM, ClientFaults, Fault, FaultConfig
from jaxfl.scheduler.speeds import (
    STREAM_CLIENT_ROUNDS,
    ClientSpeeds,
    ClientStreams,
    SpeedConfig,
    _pcg64_initial_states,
)


class GeneratorPerClientSpeeds(ClientSpeeds):
    """The former implementation: one lazily built Generator per client (the reference)."""

    def round_duration(self, client, num_steps):
        rngs = self.__dict__.setdefault("_reference_rngs", {})
        if client not in rngs:
            rngs[client] = np.random.default_rng(np.random.SeedSequence([self.seed, STREAM_CLIENT_ROUNDS, client]))
        rng, config = rngs[client], self.config
        if config.speed_change_prob > 0 and rng.random() < config.speed_change_prob:
            self._base[client] = self._fix_nonpositive(
                float(self._draw_base(rng, 1)[0]), client, lambda: float(self._draw_base(rng, 1)[0]))
            self.speed_changes += 1
        base_time = float(self._base[client])
        if config.jitter > 0:
            std = config.jitter * base_time
            step_time = self._fix_nonpositive(float(rng.normal(base_time, std)), client,
                                              lambda: float(rng.normal(base_time, std)))
        else:
            step_time = base_time
        self._rounds_done[client] += 1
        return num_steps * step_time + self.comm_time()


def generator_per_client_faults(config, seed, calls):
    """The former ClientFaults.draw, one Generator per client, for (client, duration) calls."""
    rngs, out = {}, []
    for client, duration in calls:
        rng = rngs.setdefault(client, np.random.default_rng(np.random.SeedSequence([seed, FAULT_STREAM, client])))
        u, fraction, offline = rng.random(), rng.random(), rng.exponential(config.dropout_mean)
        if u < config.crash_prob:
            out.append(Fault("crash", fraction=fraction))
        elif u < config.crash_prob + config.delay_prob:
            out.append(Fault("delay", extra_time=(config.delay_factor - 1.0) * duration))
        elif u < config.crash_prob + config.delay_prob + config.dropout_prob:
            out.append(Fault("dropout", extra_time=float(offline)))
        else:
            out.append(Fault(None))
    return out


def without_live_view(streams):
    """Force the portable path (bit_generator.state dicts) that layouts other than numpy's use."""
    streams._live = None
    return streams


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 - 1, 2**32, 2**63 + 11, 2**64 + 5, 2**100 + 7])
@pytest.mark.parametrize("stream", [STREAM_CLIENT_ROUNDS, FAULT_STREAM, 0, 2**40 + 1])
def test_initial_states_match_numpy_seeding(seed, stream):
    # Seeds of 1, 2 and 3+ words cover every branch of SeedSequence's entropy mixing.
    clients = np.array([0, 1, 2, 3, 999, 65_535, 65_536, 2**31, 2**32 - 1])
    rows = _pcg64_initial_states(seed, stream, clients)
    for client, row in zip(clients.tolist(), rows.tolist()):
        expected = np.random.PCG64(np.random.SeedSequence([seed, stream, client])).state["state"]
        assert (row[1] << 64 | row[0], row[3] << 64 | row[2]) == (expected["state"], expected["inc"])


def test_streams_built_in_blocks_match_numpy_across_block_edges():
    streams = ClientStreams(seed=3, stream=STREAM_CLIENT_ROUNDS, num_clients=70_000)
    for client in (0, 65_535, 65_536, 69_999):
        own = np.random.default_rng(np.random.SeedSequence([3, STREAM_CLIENT_ROUNDS, client]))
        rng = streams.load(client)
        assert rng.random(3).tolist() == own.random(3).tolist()
        streams.save(client)


SPEED_CONFIGS = [
    SpeedConfig(model="exp", jitter=0.05),
    SpeedConfig(model="exp", jitter=0.05, speed_change_prob=0.3),
    SpeedConfig(model="normal", normal_std_ratio=2.0, jitter=2.0, speed_change_prob=0.5),  # many redraws
    SpeedConfig(model="normal", normal_std_ratio=2.0, jitter=2.0, speed_change_prob=0.5, negative="clip"),
    SpeedConfig(model="pareto", jitter=0.1, speed_change_prob=0.2),
    SpeedConfig(model="zipf", cap=60.0, jitter=0.0, speed_change_prob=0.4),
    SpeedConfig(model="homo", jitter=0.05, latency=0.3, bandwidth=1e6),
]


@pytest.mark.parametrize("live", [True, False], ids=["live-view", "state-dicts"])
@pytest.mark.parametrize("config", SPEED_CONFIGS, ids=lambda c: f"{c.model}-{c.negative}-{c.speed_change_prob}")
def test_speeds_draw_exactly_what_one_generator_per_client_drew(config, live):
    num_clients, seed = 40, 17
    order = np.random.default_rng(0).integers(0, num_clients, 3_000).tolist()
    steps = np.random.default_rng(1).integers(0, 50, 3_000).tolist()
    new = ClientSpeeds(config, num_clients, seed, model_bytes=2_000_000)
    if not live:
        without_live_view(new._streams)
    old = GeneratorPerClientSpeeds(config, num_clients, seed, model_bytes=2_000_000)
    assert [new.round_duration(c, k) for c, k in zip(order, steps)] == \
           [old.round_duration(c, k) for c, k in zip(order, steps)]
    assert np.array_equal(new.base_time_per_step, old.base_time_per_step)
    assert (new.negative_draws, new.speed_changes) == (old.negative_draws, old.speed_changes)
    assert new.negative_draws > 0 or config.normal_std_ratio < 1  # the redraw paths were exercised
    # The shared generator's spare-32-bit cache is never filled, so no state hides outside the table.
    assert new._streams._rng.bit_generator.state["has_uint32"] == 0


@pytest.mark.parametrize("live", [True, False], ids=["live-view", "state-dicts"])
def test_faults_draw_exactly_what_one_generator_per_client_drew(live):
    config = FaultConfig(crash_prob=0.2, delay_prob=0.2, dropout_prob=0.3, dropout_mean=5.0)
    rng = np.random.default_rng(2)
    calls = list(zip(rng.integers(0, 30, 2_000).tolist(), rng.uniform(0, 9, 2_000).tolist()))
    faults = ClientFaults(config, 30, seed=2**33 + 1)
    if not live:
        without_live_view(faults._streams)
    assert [faults.draw(c, d) for c, d in calls] == generator_per_client_faults(config, 2**33 + 1, calls)
    assert faults._streams._rng.bit_generator.state["has_uint32"] == 0


def test_error_policy_keeps_the_stream_where_the_failing_draw_left_it():
    config = SpeedConfig(model="homo", jitter=2.0, negative="error")
    new, old = ClientSpeeds(config, 2, seed=0), GeneratorPerClientSpeeds(config, 2, seed=0)
    for speeds in (new, old):
        with pytest.raises(ValueError, match="client 1"):
            for _ in range(200):
                speeds.round_duration(1, 1)
    clip = SpeedConfig(model="homo", jitter=2.0, negative="clip")  # same stream, now tolerant
    new.config = old.config = clip
    assert [new.round_duration(1, 1) for _ in range(20)] == [old.round_duration(1, 1) for _ in range(20)]


def test_pickle_continues_the_sequence_and_stores_only_clients_that_drew():
    config = SpeedConfig(model="exp", jitter=0.05, speed_change_prob=0.2)
    speeds = ClientSpeeds(config, 100_000, seed=5)
    for client in (7, 99_999, 7, 0):
        speeds.round_duration(client, 3)
    streams_pickle = pickle.dumps(speeds._streams)
    assert len(streams_pickle) < 2_000  # three touched clients, not a 3.2 MB table
    restored = pickle.loads(pickle.dumps(speeds))
    for client in (7, 5, 99_999, 0, 5):
        assert restored.round_duration(client, 4) == speeds.round_duration(client, 4)
    assert restored.state_dict() == speeds.state_dict()

    faults = ClientFaults(FaultConfig(crash_prob=0.3, delay_prob=0.3), 50_000, seed=1)
    faults.draw(3)
    again = pickle.loads(pickle.dumps(faults))
    assert [again.draw(c) for c in (3, 4, 3)] == [faults.draw(c) for c in (3, 4, 3)]


def test_state_dict_holds_only_clients_that_drew_and_survives_json():
    speeds = ClientSpeeds(SpeedConfig(model="normal"), 10_000, seed=8)
    speeds.round_duration(9_999, 1)
    speeds.round_duration(4, 1)
    state = json.loads(json.dumps(speeds.state_dict()))
    assert state["client_streams"]["clients"] == [4, 9_999]
    fresh = ClientSpeeds(SpeedConfig(model="normal"), 10_000, seed=8)
    fresh.load_state_dict(state)
    assert [fresh.round_duration(c, 2) for c in (4, 9_999, 5)] == [speeds.round_duration(c, 2) for c in (4, 9_999, 5)]
    bad = json.loads(json.dumps(state))
    bad["client_streams"]["clients"] = [4, 10_000]
    with pytest.raises(ValueError, match="clients"):
        fresh.load_state_dict(bad)


def test_a_million_clients_cost_arrays_not_objects():
    # The former code built 10^6 Generators for ClientFaults (~16 s, ~1 GB); the bound is loose.
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    speeds = ClientSpeeds(SpeedConfig(model="exp", jitter=0.05), 10**6, seed=0)
    faults = ClientFaults(FaultConfig(crash_prob=0.1), 10**6, seed=0)
    elapsed = time.perf_counter() - start
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # KiB on Linux
    assert elapsed < 5.0
    assert grown_mb < 300
    assert speeds._streams._table.nbytes == faults._streams._table.nbytes == 32 * 10**6
    last = np.random.default_rng(np.random.SeedSequence([0, STREAM_CLIENT_ROUNDS, 10**6 - 1]))
    base = speeds.base_time_per_step[-1]
    assert speeds.round_duration(10**6 - 1, 1) == last.normal(base, 0.05 * base)
