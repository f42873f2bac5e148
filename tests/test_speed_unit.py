"""``speed_unit``: what a drawn time per step is the time of.

``step`` (the default, every committed result): a round of S_i steps takes S_i · t_i. ``round``
(FedASMU's other reading of "the slowest device's training time is 5x the fastest", with
``local_epochs``): a client's round of E epochs takes E·S̄ steps' time at its time per step, whatever
its data size, S̄ the clients' mean steps per epoch (E·S̄ = mean_i E·⌈n_i/B⌉), so R spreads round
times exactly as it spreads times per step. Communication is never scaled."""
import dataclasses
import math
import os
import pickle

import numpy as np
import pytest

from jaxfl.algorithms.base import epoch_steps
from jaxfl.config import ConfigError, RunConfig, config_from_mapping, validate
from jaxfl.experiment import config_hash, resume_experiment, run_experiment
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig, round_unit_scale
from jaxfl.testing import assert_same_run, events_without_wall_time
from conftest import Interrupted, replace

E, B = 2.0, 64
SIZES = [111, 1453, 640, 300, 999, 64, 65]  # FedASMU's Dir(0.5) range, and one batch and a bit


def hand_round_steps(sizes=SIZES, epochs=E, batch=B):
    """E·S̄ by hand: the mean over clients of ⌊E⌋·⌈n_i/B⌉ (whole passes) + ⌈(E − ⌊E⌋)·n_i/B⌉ (a part
    pass), at least one step."""
    whole = math.floor(epochs)
    return sum(max(1, whole * math.ceil(n / batch) + math.ceil((epochs - whole) * n / batch))
               for n in sizes) / len(sizes)


def uniform_speeds(ratio=5.0, scale=None, clients=len(SIZES), **changes):
    config = SpeedConfig(**{"model": "uniform", "ratio": ratio, "jitter": 0.0, "latency": 0.5, "bandwidth": 1e6,
                            **changes})
    return ClientSpeeds(config, clients, seed=3, model_bytes=250_000, compute_scale=scale)


def test_every_full_round_computes_for_E_Sbar_steps_at_its_time_per_step():
    steps = epoch_steps(E, SIZES, B)
    assert list(steps) == [max(1, int(E) * math.ceil(n / B)) for n in SIZES]
    speeds = uniform_speeds(scale=round_unit_scale(steps))
    comm = speeds.comm_time()
    assert comm == 2 * (0.5 + 250_000 / 1e6)
    t = speeds.base_time_per_step.copy()
    for client, s in enumerate(steps):
        assert speeds.round_duration(client, s) - comm == pytest.approx(hand_round_steps() * t[client], rel=1e-12)
    # a partial round of k steps in proportion; no steps: communication alone, unscaled
    assert speeds.round_duration(1, 5) - comm == pytest.approx(5 * hand_round_steps() / steps[1] * t[1], rel=1e-12)
    assert speeds.round_duration(2, 0) == comm


@pytest.mark.parametrize("ratio", [5.0, 110.0])
def test_the_ratio_spreads_round_times_exactly_as_times_per_step(ratio):
    steps = epoch_steps(E, SIZES, B)
    by_round = uniform_speeds(ratio, scale=round_unit_scale(steps))
    by_step = uniform_speeds(ratio)
    t = by_step.base_time_per_step
    assert t.max() / t.min() == pytest.approx(ratio, rel=1e-12)
    rounds = [by_round.round_duration(c, s) - by_round.comm_time() for c, s in enumerate(steps)]
    assert max(rounds) / min(rounds) == pytest.approx(ratio, rel=1e-12)
    # the per-step reading: S_i · t_i exactly, spread further by the data sizes
    per_step = [by_step.round_duration(c, s) for c, s in enumerate(steps)]
    assert per_step == [s * float(t[c]) + by_step.comm_time() for c, s in enumerate(steps)]
    per_step = [d - by_step.comm_time() for d in per_step]
    assert max(per_step) / min(per_step) > ratio
    # the federation's mean round time is the same sum of steps' times: Σ_i mean(S)·t_i = mean(S)·Σ t_i
    assert sum(rounds) == pytest.approx(hand_round_steps() * t.sum(), rel=1e-12)


def test_equal_client_sizes_make_round_the_same_as_step_bit_for_bit():
    assert np.array_equal(round_unit_scale([13] * 5), np.ones(5))
    a = uniform_speeds(clients=5, jitter=0.05)
    b = uniform_speeds(clients=5, jitter=0.05, scale=round_unit_scale([13] * 5))
    assert [a.round_duration(c % 5, 13) for c in range(20)] == [b.round_duration(c % 5, 13) for c in range(20)]


def test_the_bulk_first_wave_gives_the_scalar_values():
    clients = 40_000  # above ClientSpeeds' bulk threshold (2^15)
    scale = np.random.default_rng(0).uniform(0.2, 3.0, clients)
    config = SpeedConfig(model="exp", jitter=0.05)
    bulk = ClientSpeeds(config, clients, seed=1, compute_scale=scale)
    one = ClientSpeeds(config, clients, seed=1, compute_scale=scale)
    order = list(range(clients))
    assert bulk.round_durations(order, 7) == [one.round_duration(c, 7) for c in order]
    assert bulk.round_durations([3, 5], 7) == [one.round_duration(3, 7), one.round_duration(5, 7)]


def test_the_scale_is_saved_and_restored_with_the_speeds():
    scale = round_unit_scale(epoch_steps(E, SIZES, B))
    a = uniform_speeds(scale=scale, jitter=0.05)
    [a.round_duration(c, 3) for c in (0, 1, 1, 4)]
    b = uniform_speeds(jitter=0.05)  # built without one: the state's is restored
    b.load_state_dict(a.state_dict())
    assert np.array_equal(b.compute_scale, scale)
    c = pickle.loads(pickle.dumps(a))
    expected = [a.round_duration(k, 9) for k in range(len(SIZES))]
    assert [b.round_duration(k, 9) for k in range(len(SIZES))] == expected
    assert [c.round_duration(k, 9) for k in range(len(SIZES))] == expected
    old = uniform_speeds(jitter=0.05).state_dict()  # a state from before compute_scale: none
    del old["compute_scale"]
    a.load_state_dict(old)
    assert a.compute_scale is None
    legacy = uniform_speeds()
    del legacy.__dict__["_scale"]  # pickled before compute_scale existed
    assert pickle.loads(pickle.dumps(legacy)).compute_scale is None
    with pytest.raises(ValueError, match="one factor per client"):
        uniform_speeds(scale=[1.0, 2.0])
    with pytest.raises(ValueError, match="finite factors > 0"):
        uniform_speeds(scale=[1.0] * (len(SIZES) - 1) + [0.0])
    with pytest.raises(ValueError, match="integers >= 1"):
        round_unit_scale([3, 0])


def test_round_without_local_epochs_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"speed_unit='round' is not allowed: leave it at its default 'step'.*"
                                          r"read only with local_epochs set"):
        validate(RunConfig(speed_unit="round"))
    with pytest.raises(ConfigError, match=r"speed_unit='epoch' is not allowed: one of step, round"):
        validate(RunConfig(speed_unit="epoch", local_epochs=1.0, algorithm="fedasync"))
    assert validate(RunConfig(speed_unit="round", local_epochs=1.0, algorithm="fedasync")).speed_unit == "round"


def test_the_cli_flag_is_refused_without_local_epochs(tmp_path, capsys):
    from jaxfl.cli import main

    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--speed-unit", "round", "--output-dir", str(out), "--no-progress"])
    assert exit_info.value.code == 2
    assert "speed_unit='round' is not allowed" in capsys.readouterr().err
    assert not out.exists()


def test_step_is_the_default_and_keeps_every_run_name():
    base = validate(RunConfig(algorithm="fedasync", local_epochs=1.0))
    assert base.speed_unit == "step"
    assert base.to_dict()["speeds"]["speed_unit"] == "step"
    assert config_hash(replace(base, speed_unit="round")) != config_hash(base)
    # a config recorded before the field existed hashes as the same config with step
    values = base.to_dict()
    del values["speeds"]["speed_unit"]
    assert config_hash(validate(config_from_mapping(values))) == config_hash(base)
    # (tests/test_run_names.py: a run recorded by an older jaxfl keeps its name)


def run_config(tmp_path, algorithm="fedasync", **changes):
    values = {"algorithm": algorithm, "dataset": "mnist10k", "model": "logreg", "clients": 6, "local_epochs": 0.25,
              "batch_size": 64, "max_updates": 6, "progress": False, "stop_at_target": False,
              "partition": "dirichlet", "dirichlet_alpha": 0.5, "heterogeneity": "uniform", "speed_ratio": 5.0,
              "jitter": 0.0, "latency": 0.5, "speed_unit": "round", "checkpoint_every": None,
              "output_dir": str(tmp_path / "runs"), **changes}
    if algorithm == "fedasmu":
        values.update({"fedasmu_max_concurrency": 3, "fedasmu_slot": "middle"})
    return config_from_mapping(values)


def events(run_dir):
    import csv
    import io

    return list(csv.DictReader(io.StringIO(events_without_wall_time(run_dir))))


def test_a_run_dispatches_rounds_of_E_Sbar_steps_time(tmp_path):
    result = run_experiment(run_config(tmp_path, timing_only=True))
    sizes = np.load(os.path.join(result.run_dir, "client_samples.npy"))
    speeds = result.simulation.speeds
    t, comm = speeds.base_time_per_step, speeds.comm_time()
    assert comm == 1.0  # latency 0.5 each way; the bandwidth is unlimited
    round_steps = hand_round_steps(sizes, 0.25, 64)
    starts, checked = {}, 0
    for row in events(result.run_dir):
        if row["event"] == "dispatch":
            client = int(row["client"])
            assert int(row["steps"]) == max(1, math.ceil(0.25 * sizes[client] / 64))
            starts[row["dispatch"]] = (float(row["time"]), client)
        elif row["event"] == "arrival":
            start, client = starts[row["dispatch"]]
            assert float(row["time"]) - start - comm == pytest.approx(round_steps * t[client], rel=1e-9)
            checked += 1
    assert checked >= 6
    step_run = run_experiment(run_config(tmp_path, timing_only=True, speed_unit="step"))
    assert events_without_wall_time(step_run.run_dir) != events_without_wall_time(result.run_dir)


@pytest.mark.parametrize("algorithm", ["fedasmu"])
def test_timing_only_gives_the_training_runs_event_log(tmp_path, algorithm):
    trained = run_experiment(run_config(tmp_path, algorithm, run_name="trained"))
    timed = run_experiment(run_config(tmp_path, algorithm, run_name="timed", timing_only=True))
    log = events_without_wall_time(trained.run_dir)
    assert "fetch" in log  # FedASMU's partial round, at a scaled step time
    assert events_without_wall_time(timed.run_dir) == log


def test_a_resumed_run_is_the_uninterrupted_one(tmp_path, crash_after_saves):
    config = run_config(tmp_path, checkpoint_every=2)
    disarm = crash_after_saves(2)
    with pytest.raises(Interrupted):
        run_experiment(replace(config, run_name="cut"))
    disarm()
    resumed = resume_experiment(os.path.join(config.output_dir, "cut"))
    assert resumed.simulation.speeds.compute_scale is not None
    assert_same_run(resumed, run_experiment(replace(config, run_name="whole")))


def test_an_urgent_pull_cuts_a_scaled_round_in_proportion():
    """tests/test_port.py's pull scenario (1, 1 and 3.5 s per step) made of other times per step and
    factors: client 2 at 7 s per step and factor 0.5 is pulled after 7 of its 10 steps at 25.5 s."""
    from jaxfl.algorithms.port import PAPER, PORT
    from jaxfl.scheduler.simulation import Simulation
    from conftest import RecordingBackend

    policy = PORT(local_steps=10, min_clients=2, staleness_bound=3.0, pull_steps=1,
                  options=dataclasses.replace(PAPER, urgent_pull=True))
    speeds = ClientSpeeds(SpeedConfig(jitter=0.0, latency=0.5), 3, seed=0, time_per_step=[0.5, 0.5, 7.0],
                          compute_scale=[2.0, 2.0, 0.5])
    backend = RecordingBackend()
    sim = Simulation(policy, speeds, [1 / 3] * 3, backend, max_updates=3)
    sim.run()
    pulled = sim.records[2]
    assert (pulled.client, pulled.steps, pulled.planned_steps, pulled.arrival_time) == (2, 7, 10, 25.5)
    assert [a.time for a in backend.aggregations] == [11.0, 22.0, 33.0]
