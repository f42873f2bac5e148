"""Tests for client-speed models (jaxfl.scheduler.speeds)."""

import json
import math

import numpy as np
import pytest

from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig

MU = 0.15
MANY = 20_000


def _sequence(speeds, client, rounds, num_steps=1):
    return [speeds.round_duration(client, num_steps) for _ in range(rounds)]


# -- base distributions ---------------------------------------------------------------------------


def test_homo_without_jitter_is_exact():
    speeds = ClientSpeeds(SpeedConfig(model="homo", jitter=0.0), num_clients=5, seed=3)
    assert np.all(speeds.base_time_per_step == MU)
    for client in range(5):
        for steps in (0, 1, 7, 200):
            assert speeds.round_duration(client, steps) == MU * steps


def test_exp_mean_is_mu():
    times = ClientSpeeds(SpeedConfig(model="exp"), MANY, seed=0).base_time_per_step
    assert times.dtype == np.float64
    assert abs(times.mean() / MU - 1) < 0.03
    assert abs(np.median(times) / (MU * math.log(2)) - 1) < 0.05
    assert times.max() / times.min() > 1e3  # very wide, hence float64


def test_normal_mean_and_std():
    times = ClientSpeeds(SpeedConfig(model="normal"), MANY, seed=0).base_time_per_step
    assert abs(times.mean() / MU - 1) < 0.01
    assert abs(times.std() / (0.3 * MU) - 1) < 0.03
    assert times.min() > 0


@pytest.mark.parametrize("model, cap", [("pareto", 30.0), ("zipf", 60.0)])
def test_pareto_and_zipf_respect_cap_and_mapping(model, cap):
    config = SpeedConfig(model=model, cap=cap, reference_time=10.0)
    times = ClientSpeeds(config, MANY, seed=1).base_time_per_step
    idle = (times / MU - 1.0) * 10.0  # invert t = μ(1 + s/ref)
    assert idle.min() >= -1e-9 and idle.max() <= cap + 1e-9
    assert np.isclose(idle.max(), cap)  # heavy tail: some clients hit the cap
    if model == "pareto":
        # Lomax(a=1): median 1 s.
        assert abs(np.median(idle) - 1.0) < 0.05
    else:
        # Zipf draws are integers >= 1 with P(1) = 1/ζ(1.7).
        k = np.arange(1, 100_000, dtype=np.float64)
        zeta = np.sum(k**-1.7) + 100_000**-0.7 / 0.7  # tail by the integral
        idle = np.round(idle, 6)  # undo float error of the inversion
        assert np.array_equal(idle, np.round(idle))
        assert idle.min() == 1.0
        assert abs(np.mean(idle == 1.0) - 1 / zeta) < 0.02


def test_pareto_mapping_matches_plato_epoch_formula():
    # n steps per epoch with n·μ = avg_training_time: an epoch lasts avg_training_time + s.
    steps_per_epoch, avg_training_time = 50, 10.0
    config = SpeedConfig(model="pareto", mean=avg_training_time / steps_per_epoch,
                         reference_time=avg_training_time, jitter=0.0)
    speeds = ClientSpeeds(config, 100, seed=0)
    idle = (speeds.base_time_per_step / config.mean - 1) * avg_training_time
    epochs = 5
    for client in (0, 21, 99):
        assert math.isclose(speeds.round_duration(client, epochs * steps_per_epoch),
                            epochs * (avg_training_time + idle[client]))


def test_same_seed_same_draws_different_seed_different_draws():
    config = SpeedConfig(model="exp")
    a, b, c = (ClientSpeeds(config, 50, seed=s) for s in (4, 4, 5))
    assert np.array_equal(a.base_time_per_step, b.base_time_per_step)
    assert not np.array_equal(a.base_time_per_step, c.base_time_per_step)
    assert _sequence(a, 7, 20, 10) == _sequence(b, 7, 20, 10)


# -- jitter and determinism ------------------------------------------------------------------------


def test_jitter_std_is_five_percent_of_base():
    speeds = ClientSpeeds(SpeedConfig(model="exp", jitter=0.05), num_clients=3, seed=0)
    per_step = np.array(_sequence(speeds, 1, 20_000))
    base = speeds.base_time_per_step[1]
    assert abs(per_step.mean() / base - 1) < 0.002
    assert abs(per_step.std() / (0.05 * base) - 1) < 0.03


def test_one_jitter_draw_covers_the_whole_round():
    config = SpeedConfig(model="normal", jitter=0.05)
    a, b = ClientSpeeds(config, 4, seed=9), ClientSpeeds(config, 4, seed=9)
    for _ in range(5):
        assert math.isclose(a.round_duration(2, 37), 37 * b.round_duration(2, 1))


def test_client_sequences_do_not_depend_on_query_order():
    config = SpeedConfig(model="exp", jitter=0.05, speed_change_prob=0.3)
    num_clients, rounds = 6, 15
    rng = np.random.default_rng(0)

    def per_client(order):
        speeds = ClientSpeeds(config, num_clients, seed=11)
        out = {c: [] for c in range(num_clients)}
        for client in order:
            out[client].append(speeds.round_duration(client, 10))
        return out

    round_robin = [c for _ in range(rounds) for c in range(num_clients)]
    client_by_client = [c for c in reversed(range(num_clients)) for _ in range(rounds)]
    shuffled = list(rng.permutation(round_robin))
    reference = per_client(round_robin)
    assert per_client(client_by_client) == reference
    assert per_client(shuffled) == reference


def test_step_count_does_not_shift_later_rounds():
    config = SpeedConfig(model="normal", speed_change_prob=0.5)
    a, b = ClientSpeeds(config, 2, seed=2), ClientSpeeds(config, 2, seed=2)
    a.round_duration(0, 0)
    b.round_duration(0, 50)
    assert a.round_duration(0, 3) == b.round_duration(0, 3)


# -- negative draws --------------------------------------------------------------------------------

WIDE_NORMAL = dict(model="normal", normal_std_ratio=2.0, jitter=0.0)


def test_redraw_policy_resamples_and_counts():
    speeds = ClientSpeeds(SpeedConfig(**WIDE_NORMAL, negative="redraw"), 2_000, seed=0)
    assert speeds.base_time_per_step.min() > 0
    # p = P(N(μ, (2μ)²) <= 0) = Φ(-0.5) ≈ 0.309; redraws can be negative again, so each client
    # meets p / (1 - p) ≈ 0.446 non-positive draws on average.
    assert abs(speeds.negative_draws / 2_000 - 0.446) < 0.06


def test_clip_policy_floors_at_min_time_ratio_of_mean():
    config = SpeedConfig(**WIDE_NORMAL, negative="clip", min_time_ratio=0.01)
    speeds = ClientSpeeds(config, 2_000, seed=0)
    floor = 0.01 * MU
    assert speeds.base_time_per_step.min() == floor
    # The floor is monotone: tiny positive draws are raised to it too, but only the
    # non-positive ones count as negative draws.
    assert (speeds.base_time_per_step == floor).sum() >= speeds.negative_draws
    assert abs(speeds.negative_draws / 2_000 - 0.309) < 0.04


def test_error_policy_names_client_and_value():
    with pytest.raises(ValueError, match=r"client \d+") as info:
        ClientSpeeds(SpeedConfig(**WIDE_NORMAL, negative="error"), 100, seed=0)
    assert "-" in str(info.value)  # the negative value is in the message


def test_negative_jitter_draws_are_handled_too():
    config = SpeedConfig(model="homo", jitter=2.0, negative="clip")
    speeds = ClientSpeeds(config, 1, seed=0)
    durations = np.array(_sequence(speeds, 0, 2_000))
    assert durations.min() == 0.01 * MU
    # P(N(1, 2²) <= 0) ≈ 0.31
    assert abs(speeds.negative_draws / 2_000 - 0.309) < 0.04
    assert np.sum(durations == 0.01 * MU) >= speeds.negative_draws
    with pytest.raises(ValueError, match="client 0"):
        _sequence(ClientSpeeds(SpeedConfig(model="homo", jitter=2.0, negative="error"), 1, 0), 0, 200)


def test_default_normal_model_rarely_goes_negative_but_reports_it():
    speeds = ClientSpeeds(SpeedConfig(model="normal"), 50_000, seed=0)
    # Φ(-3.33) ≈ 4.3e-4 → about 21 of 50,000.
    assert 5 <= speeds.negative_draws <= 45
    assert speeds.base_time_per_step.min() > 0


# -- speed changes ---------------------------------------------------------------------------------


def test_speed_change_prob_one_redraws_every_round_zero_never():
    always = ClientSpeeds(SpeedConfig(model="exp", jitter=0.0, speed_change_prob=1.0), 3, seed=0)
    seen = []
    for _ in range(10):
        duration = always.round_duration(0, 1)
        assert duration == always.base_time_per_step[0]
        seen.append(duration)
    assert len(set(seen)) == 10 and always.speed_changes == 10

    never = ClientSpeeds(SpeedConfig(model="exp", jitter=0.0, speed_change_prob=0.0), 3, seed=0)
    initial = never.base_time_per_step.copy()
    assert _sequence(never, 0, 10) == [initial[0]] * 10
    assert np.array_equal(never.base_time_per_step, initial) and never.speed_changes == 0


def test_speed_change_redraws_from_base_distribution():
    speeds = ClientSpeeds(SpeedConfig(model="exp", jitter=0.0, speed_change_prob=1.0), 1, seed=0)
    redrawn = np.array(_sequence(speeds, 0, 20_000))
    assert abs(redrawn.mean() / MU - 1) < 0.03


def test_base_times_are_read_only():
    speeds = ClientSpeeds(SpeedConfig(), 3, seed=0)
    with pytest.raises(ValueError):
        speeds.base_time_per_step[0] = 1.0


# -- communication ---------------------------------------------------------------------------------


def test_comm_time_formula():
    config = SpeedConfig(model="homo", jitter=0.0, latency=0.2, bandwidth=1e6)
    speeds = ClientSpeeds(config, 2, seed=0, model_bytes=3_000_000)
    assert speeds.transfer_time() == pytest.approx(3.2)
    assert speeds.comm_time() == pytest.approx(2 * (0.2 + 3.0))
    assert speeds.round_duration(1, 10) == pytest.approx(10 * MU + 6.4)
    assert ClientSpeeds(SpeedConfig(), 2, seed=0, model_bytes=10**9).comm_time() == 0.0


# -- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("model", "lognormal"),
        ("negative", "ignore"),
        ("mean", 0.0),
        ("mean", -1.0),
        ("mean", math.nan),
        ("mean", math.inf),
        ("normal_std_ratio", -0.1),
        ("jitter", -0.01),
        ("jitter", math.nan),
        ("pareto_shape", 0.0),
        ("zipf_s", 1.0),
        ("cap", 0.0),
        ("cap", math.nan),
        ("reference_time", 0.0),
        ("speed_change_prob", 1.5),
        ("speed_change_prob", -0.1),
        ("min_time_ratio", 0.0),
        ("latency", -1.0),
        ("bandwidth", 0.0),
        ("bandwidth", math.nan),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"SpeedConfig.{field}="):
        SpeedConfig(**{field: value})


def test_round_duration_rejects_bad_client_and_steps():
    speeds = ClientSpeeds(SpeedConfig(), 3, seed=0)
    with pytest.raises(ValueError, match="num_steps"):
        speeds.round_duration(0, -1)
    for client in (-1, 3):
        with pytest.raises(ValueError, match="client"):
            speeds.round_duration(client, 1)
    with pytest.raises(ValueError, match="num_clients"):
        ClientSpeeds(SpeedConfig(), 0, seed=0)


# -- checkpointing ---------------------------------------------------------------------------------


def test_state_dict_round_trip_continues_the_same_sequence():
    config = SpeedConfig(model="normal", speed_change_prob=0.2, latency=0.1)
    original = ClientSpeeds(config, 5, seed=8, model_bytes=1000)
    for client in (0, 3, 3, 1):
        original.round_duration(client, 4)

    restored = ClientSpeeds(config, 5, seed=8, model_bytes=1000)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert np.array_equal(restored.base_time_per_step, original.base_time_per_step)
    assert np.array_equal(restored.rounds_done, original.rounds_done)
    for client in (3, 2, 0, 4, 3, 1):  # both touched and untouched clients
        assert restored.round_duration(client, 6) == original.round_duration(client, 6)
    assert restored.state_dict() == original.state_dict()


def test_load_state_dict_rejects_a_different_run():
    state = ClientSpeeds(SpeedConfig(model="exp"), 5, seed=8).state_dict()
    with pytest.raises(ValueError, match="seed"):
        ClientSpeeds(SpeedConfig(model="exp"), 5, seed=9).load_state_dict(state)
    with pytest.raises(ValueError, match="config"):
        ClientSpeeds(SpeedConfig(model="normal"), 5, seed=8).load_state_dict(state)


@pytest.mark.parametrize("model, reference_time, fastest, mean_over_mu", [
    ("pareto", 10.0, 1.0, (1.30, 1.38)), ("pareto", 1.5, 1.0, (3.15, 3.40)),
    ("zipf", 10.0, 1.1, (1.45, 1.55)), ("zipf", 1.5, 1 + 1 / 1.5, (4.2, 4.5))])
def test_pareto_and_zipf_speeds_add_idle_times_to_mu_and_the_mean_is_as_the_readme_says(model, reference_time,
                                                                                          fastest, mean_over_mu):
    # --speed-mean was called the "mean time per local step" for every model; for pareto and zipf the
    # idle times only add to it (README: "the mean is 1.3x mu for pareto at the defaults and 3.3x at
    # --speed-reference-time 1.5, 1.5x and 4.4x for zipf"; zipf's idle times are 1 or more)
    times = np.asarray(ClientSpeeds(SpeedConfig(model=model, mean=0.15, jitter=0.0, reference_time=reference_time),
                                    100_000, seed=0).base_time_per_step)
    assert times.min() == pytest.approx(0.15 * fastest, rel=1e-4)  # Pareto's smallest idle time of 100,000: ~1e-5 s
    assert mean_over_mu[0] < times.mean() / 0.15 < mean_over_mu[1]
