"""FedASMU's heterogeneity model: ``heterogeneity="uniform"`` with ``speed_ratio`` (Liu et al., AAAI 2024)."""
import csv
import json

import numpy as np
import pytest

from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from jaxfl.testing import conformance_config

MU = 0.15


@pytest.mark.parametrize("ratio", [5.0, 110.0, 440.0])
def test_times_span_exactly_the_ratio_and_are_uniform_in_between(ratio):
    times = ClientSpeeds(SpeedConfig(model="uniform", ratio=ratio), 20_000, seed=0).base_time_per_step
    fastest = 2 * MU / (1 + ratio)  # the range [a, R a] has mean μ
    assert times.min() == pytest.approx(fastest, rel=1e-12) and times.max() == pytest.approx(ratio * fastest, rel=1e-12)
    assert times.max() / times.min() == pytest.approx(ratio, rel=1e-12)
    assert times.mean() == pytest.approx(MU, rel=0.01)
    # uniform, not just bounded: a quarter of the clients in each quarter of the range
    quarters = np.histogram(times, bins=4, range=(fastest, ratio * fastest))[0] / times.size
    assert np.allclose(quarters, 0.25, atol=0.01)


@pytest.mark.parametrize("clients", [2, 3, 10, 100])
def test_the_fastest_and_slowest_device_are_the_ratio_apart_for_any_federation(clients):
    # the paper states the gap between its devices: plain draws of 100 clients on [a, 440a] span ~140x
    for seed in range(5):
        times = ClientSpeeds(SpeedConfig(model="uniform", ratio=440.0), clients, seed=seed).base_time_per_step
        assert times.max() / times.min() == pytest.approx(440.0, rel=1e-12)


def test_ratio_one_is_every_client_at_the_mean():
    speeds = ClientSpeeds(SpeedConfig(model="uniform", ratio=1.0, jitter=0.0), 4, seed=3)
    assert np.all(speeds.base_time_per_step == MU)
    assert speeds.round_duration(2, 10) == pytest.approx(10 * MU)


def test_same_seed_same_times_other_seed_other_times():
    config = SpeedConfig(model="uniform", ratio=5.0)
    first = ClientSpeeds(config, 50, seed=4)
    second = ClientSpeeds(config, 50, seed=4)
    assert np.array_equal(first.base_time_per_step, second.base_time_per_step)
    assert [first.round_duration(c, 7) for c in (3, 1, 3)] == [second.round_duration(c, 7) for c in (3, 1, 3)]
    assert not np.array_equal(first.base_time_per_step, ClientSpeeds(config, 50, seed=5).base_time_per_step)


def test_communication_is_the_same_for_every_device():
    speeds = ClientSpeeds(SpeedConfig(model="uniform", jitter=0.0, latency=0.5, bandwidth=1e6), 3, seed=0,
                          model_bytes=1_000_000)
    for client in range(3):  # 2 transfers of 0.5 s + 1 s on top of 10 steps at the client's own speed
        assert speeds.round_duration(client, 10) == pytest.approx(10 * speeds.base_time_per_step[client] + 3.0)


def test_speed_changes_redraw_within_the_ratio_and_resume_continues_them():
    config = SpeedConfig(model="uniform", ratio=20.0, speed_change_prob=0.5)
    original = ClientSpeeds(config, 6, seed=2)
    for client in (0, 5, 5, 2):
        original.round_duration(client, 3)
    restored = ClientSpeeds(config, 6, seed=2)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    for client in (5, 1, 0, 5, 2, 2):
        assert restored.round_duration(client, 4) == original.round_duration(client, 4)
    fastest = 2 * MU / 21
    assert original.speed_changes > 0
    assert np.all((original.base_time_per_step >= fastest) & (original.base_time_per_step <= 20 * fastest))


def test_a_checkpoint_without_the_ratio_field_still_loads():
    state = ClientSpeeds(SpeedConfig(model="exp"), 3, seed=1).state_dict()
    del state["config"]["ratio"]  # written before the field existed
    ClientSpeeds(SpeedConfig(model="exp"), 3, seed=1).load_state_dict(state)


@pytest.mark.parametrize("ratio", [0.5, 0.0, -2.0, float("inf"), float("nan")])
def test_a_ratio_below_one_is_refused_naming_it(ratio):
    with pytest.raises(ValueError, match="SpeedConfig.ratio="):
        SpeedConfig(model="uniform", ratio=ratio)
    with pytest.raises(ConfigError, match=r"speed_ratio=.* is not allowed: (a finite slowest/fastest ratio >= 1|expected a number)"):
        validate(RunConfig(heterogeneity="uniform", speed_ratio=ratio))


def test_speed_ratio_without_uniform_is_refused():
    with pytest.raises(ConfigError, match="speed_ratio=110.0 is not allowed: .*heterogeneity uniform"):
        validate(RunConfig(heterogeneity="exp", speed_ratio=110.0))


def test_a_run_draws_its_clients_speeds_from_it(tmp_path):
    config = conformance_config("fedasync", str(tmp_path), heterogeneity="uniform", speed_ratio=40.0, jitter=0.0,
                                max_updates=3, checkpoint_every=None)
    from jaxfl.experiment import run_experiment

    result = run_experiment(config)
    assert result.summary["global_updates"] == 3
    times = ClientSpeeds(SpeedConfig(model="uniform", ratio=40.0, jitter=0.0), config.clients,
                         seed=config.seed).base_time_per_step
    with open(f"{result.run_dir}/events.csv", newline="") as handle:
        arrivals = [row for row in csv.DictReader(handle) if row["event"] == "arrival"]
    # every client starts at time 0, so the first arrival is the fastest client's, at Q a, a = 2μ/(1 + R)
    first = arrivals[0]
    assert float(first["time"]) == pytest.approx(config.local_steps * 2 * config.speed_mean / 41.0)
    assert int(first["client"]) == int(np.argmin(times))


def test_clipping_negative_jitter_keeps_the_ratio_even_at_440():
    # the clip floor was 0.01μ, above the fastest client's a = 2μ/441 ≈ 0.0045μ: that client was raised to
    # it, and the slowest was 200x the fastest (a review's measurement), not 440x
    speeds = ClientSpeeds(SpeedConfig(model="uniform", ratio=440.0, negative="clip", jitter=0.0), 100, seed=0)
    times = speeds.base_time_per_step
    assert times.max() / times.min() == pytest.approx(440.0, rel=1e-12)
    # a jittered round still has a floor: a hundredth of the fastest client's time
    jittered = ClientSpeeds(SpeedConfig(model="uniform", ratio=440.0, negative="clip", jitter=5.0), 100, seed=0)
    fastest = int(np.argmin(times))
    rounds = [jittered.round_duration(fastest, 1) for _ in range(200)]
    assert min(rounds) == pytest.approx(0.01 * times.min(), rel=1e-12) and min(rounds) > 0
