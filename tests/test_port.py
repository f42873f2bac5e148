"""PORT: hand-computed weights, the staleness bound, the design-space corners (K = all → FedAvg,
K = 1 → an aggregation per arrival as FedAsync), the PLATO preset and PLATO's idle-time table."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.algorithms import FedAsync
from jaxfl.algorithms.port import PAPER, PLATO, PORT, PortOptions, PortWeights, staleness_discount
from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.experiment import run_experiment
from jaxfl.kernels.port import cosine, port_coefficients, port_weights
from jaxfl.scheduler.simulation import Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, ScriptedSpeeds, SpeedConfig
from jaxfl.scheduler.staleness import polynomial
from tests.conftest import RecordingBackend, replace

# Three clients: data shares d = (1/2, 1/4, 1/4), staleness S = (0, 2, 5), Ω = 10, α = 3, β = 1 and
# cosines with the last global step (1, 0, −1/2). By hand:
#   a_k = d_k α Ω/(S_k+Ω) = 1.5, 0.625, 0.5      b_k = d_k β = 0.5, 0.25, 0.25
#   θ_k/β = (cos+1)/2   = 1, 0.5, 0.25        p̃_k = a_k + b_k θ_k/β = 2, 0.75, 0.5625 (Σ = 3.3125 = 53/16)
#   p = (32, 12, 9) / 53
GOLDEN = np.array([32.0, 12.0, 9.0]) / 53.0


def test_port_weights_for_three_clients_by_hand():
    a = np.array([0.5 * staleness_discount(0, 3.0, 10.0), 0.25 * staleness_discount(2, 3.0, 10.0),
                  0.25 * staleness_discount(5, 3.0, 10.0)])
    np.testing.assert_allclose(a, [1.5, 0.625, 0.5])
    b = np.array([0.5, 0.25, 0.25])
    weights = port_weights(jnp.array([1.0, 0.0, -0.5]), jnp.asarray(a), jnp.asarray(b), jnp.zeros(3, bool))
    np.testing.assert_allclose(np.asarray(weights), GOLDEN, rtol=1e-6)
    # the same from the updates themselves: last global step g = (1, 0); u_k = −Δ_k ("own" update)
    g = {"w": jnp.array([1.0, 0.0])}
    u = np.array([[2.0, 0.0], [0.0, 3.0], [-1.0, math.sqrt(3.0)]])  # cos = 1, 0, −1/2
    deltas = {"w": jnp.asarray(-u)}
    current = {"w": jnp.array([5.0, 5.0])}
    previous = jax.tree.map(lambda c, s: c - s, current, g)
    p, cos = port_coefficients(deltas, deltas, current, jax.tree.map(jnp.subtract, current, previous),
                               jnp.asarray(a), jnp.asarray(b), jnp.zeros(3, bool), jnp.ones(3, bool), "own")
    np.testing.assert_allclose(np.asarray(cos), [1.0, 0.0, -0.5], atol=1e-6)
    np.testing.assert_allclose(np.asarray(p), GOLDEN, rtol=1e-6)
    # forcing cos = 1 for the third (PLATO: fresh clients) gives it the full β: p̃_3 = 0.75
    forced = port_weights(jnp.array([1.0, 0.0, -0.5]), jnp.asarray(a), jnp.asarray(b), jnp.array([False, False, True]))
    np.testing.assert_allclose(np.asarray(forced), np.array([2.0, 0.75, 0.75]) / 3.5, rtol=1e-6)
    # PLATO's cosine uses w_k − w_τ: a client that started at w_τ − g and moved by +g has u = 0 → cos 1
    starts = {"w": jnp.asarray(np.stack([current["w"] - g["w"]] * 3))}
    moved = {"w": jnp.asarray(-np.stack([g["w"]] * 3))}  # Δ = start − final = −g
    _, cos_current = port_coefficients(moved, starts, current, g, jnp.asarray(a), jnp.asarray(b), jnp.zeros(3, bool),
                                       jnp.ones(3, bool), "current")
    np.testing.assert_allclose(np.asarray(cos_current), [1.0, 1.0, 1.0])
    assert float(cosine({"w": jnp.zeros(2)}, g)) == 1.0  # no direction: no interference penalty


def test_policy_hands_the_engine_staleness_and_data_shares():
    policy = PORT(local_steps=5, min_clients=3, staleness_bound=10.0, alpha=3.0, beta=1.0)
    speeds = ScriptedSpeeds(lambda c, r: [1.0, 2.0, 3.0][c], num_clients=3)
    backend = RecordingBackend()
    sim = Simulation(policy, speeds, [0.5, 0.25, 0.25], backend, max_updates=2)
    sim.run()
    first, second = backend.aggregations
    assert isinstance(first.payload, PortWeights) and first.mode == "mix"
    assert first.payload.dispatch_ids == tuple(d for d, _ in first.contributions)
    # version 0: no last global step, cos forced to 1; all fresh: a_k = 3 d_k, b_k = d_k
    np.testing.assert_allclose(first.payload.staleness_part, [1.5, 0.75, 0.75])
    np.testing.assert_allclose(first.payload.interference_scale, [0.5, 0.25, 0.25])
    assert first.payload.force_cosine_one == (True, True, True)
    np.testing.assert_allclose([c for _, c in first.contributions], [0.5, 0.25, 0.25])
    assert second.payload.force_cosine_one == (False, False, False)  # the paper computes the cosine from round 2


def run_port(time_per_step, bound, options=PAPER, K=1, max_updates=40):
    policy = PORT(local_steps=10, min_clients=K, staleness_bound=bound, options=options)
    backend = RecordingBackend()
    sim = Simulation(policy, ScriptedSpeeds(time_per_step, num_clients=4), [0.25] * 4, backend,
                     max_updates=max_updates)
    sim.run()
    staleness = [a.version - 1 - sim.records[d].version for a in backend.aggregations for d, _ in a.contributions]
    return sim, policy, backend, staleness


def test_staleness_bound_waits_for_stale_clients():
    speeds = lambda c, r: [1.0, 1.1, 1.2, 9.0][c]  # client 3 is 9× slower
    _, unbounded, _, staleness = run_port(speeds, math.inf)
    assert max(staleness) >= 6 and unbounded.waits == 0
    sim, policy, backend, staleness = run_port(speeds, 3.0)
    assert max(staleness) == 2  # paper: every aggregated update has S < Ω
    assert policy.waits > 0
    # Step 3 takes every client that arrives before the stale one, and the stale one itself
    assert any(len(a.contributions) > 1 for a in backend.aggregations)
    assert all(s >= 0 for s in staleness)
    _, plato, _, staleness_code = run_port(speeds, 3.0, options=PLATO)
    assert max(staleness_code) == 4  # PLATO forces only S > Ω: up to Ω + 1 reaches the aggregation


def test_k_equal_one_aggregates_every_arrival_like_fedasync():
    speeds = ClientSpeeds(SpeedConfig(model="exp", jitter=0.05), 4, seed=3)
    port_backend, asynchronous = RecordingBackend(), RecordingBackend()
    port_sim = Simulation(PORT(10, min_clients=1, staleness_bound=math.inf), speeds, [0.25] * 4, port_backend,
                          max_updates=20)
    port_sim.run()
    fedasync_sim = Simulation(FedAsync(10, polynomial), ClientSpeeds(SpeedConfig(model="exp", jitter=0.05), 4, seed=3),
                              [0.25] * 4, asynchronous, max_updates=20)
    fedasync_sim.run()
    assert all(len(a.contributions) == 1 for a in port_backend.aggregations)
    assert [a.time for a in port_backend.aggregations] == [a.time for a in asynchronous.aggregations]
    assert [port_sim.records[a.contributions[0][0]].client for a in port_backend.aggregations] == \
        [fedasync_sim.records[a.contributions[0][0]].client for a in asynchronous.aggregations]


def test_all_clients_no_bound_no_divergence_is_fedavg(small_config):
    common = dict(clients=4, heterogeneity="exp", jitter=0.0, max_updates=3, client_optimizer="sgd", client_lr=0.05)
    fedavg = run_experiment(replace(small_config, algorithm="fedavg", run_name="avg", **common))
    port = run_experiment(replace(small_config, algorithm="port", run_name="port", **common,
                                  algorithm_options={"min_clients": 4, "staleness_bound": math.inf, "beta": 0.0}))
    for a, b in zip(jax.tree.leaves(fedavg.params), jax.tree.leaves(port.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    times = lambda run: [(r.aggregated_in, r.arrival_time) for r in run.simulation.records if r.aggregated_in]
    assert sorted(times(fedavg)) == sorted(times(port))
    assert port.summary["compilations"].get("port_weights") == 1


def test_engine_cosines_and_weights_in_a_bounded_run(small_config):
    result = run_experiment(replace(small_config, algorithm="port", clients=4, heterogeneity="exp", max_updates=6,
                                    algorithm_options={"min_clients": 2, "staleness_bound": 3.0}))
    engine = result.engine
    assert sum(engine.last_weights.values()) == pytest.approx(1.0, abs=1e-6)
    cosines = [m["port_cosine"] for m in engine._client_metrics.values() if "port_cosine" in m]
    assert cosines and all(-1.0 - 1e-6 <= c <= 1.0 + 1e-6 for c in cosines)
    assert any(abs(c) < 0.999 for c in cosines)  # real cosines, not the forced 1
    assert result.summary["policy"]["max_aggregated_staleness"] <= 2
    assert result.summary["final_accuracy"] > 0.3  # learns (chance is 0.1)


def test_presets_and_validation():
    def switches(**options):
        return validate(RunConfig(algorithm="port", algorithm_options=options)).algorithm_options.switches()

    assert switches() == PAPER
    assert switches(preset="plato") == PLATO
    mixed = switches(preset="plato", cosine="own")
    assert mixed.cosine == "own" and mixed.replace == "step2"  # an explicit switch wins over the preset
    with pytest.raises(ConfigError, match="port.cosine='angle'"):
        validate(RunConfig(algorithm="port", algorithm_options={"cosine": "angle"}))
    with pytest.raises(ConfigError, match="port.min_clients=11"):
        validate(RunConfig(algorithm="port", algorithm_options={"min_clients": 11}))
    with pytest.raises(ConfigError, match="port.alpha=0.0"):
        validate(RunConfig(algorithm="port", algorithm_options={"alpha": 0.0, "beta": 0.0}))
    with pytest.raises(ValueError, match="port_bound_rule"):
        PortOptions(bound_rule="loose").validate()


@pytest.mark.parametrize("setting", [{"server_lr": 0.5}, {"server_momentum": 0.9}, {"server_optimizer": "adam"}])
def test_eq_4_takes_no_server_optimiser(setting):
    # a server learning rate, momentum or Adam given to PORT was applied to its average (Eq. 4 is
    # the new global model), silently; the mixing algorithms (FedAsync, FedASMU) refused them
    (name, value), = setting.items()
    with pytest.raises(ConfigError, match=rf"{name}={value!r} is not allowed: leave it .*port's Eq. 4"):
        validate(RunConfig(algorithm="port", **setting))


def test_plato_idle_time_table():
    """RandomState(1).pareto(1, 100) capped at 30 s: the spec's §5.2 table, via speed_legacy_seed."""
    speeds = ClientSpeeds(SpeedConfig(model="pareto", mean=1.0, reference_time=1.0, jitter=0.0, cap=30.0,
                                      legacy_seed=1), 100, seed=0)
    idle = speeds.base_time_per_step - 1.0
    np.testing.assert_allclose(idle[:10], [0.72, 2.58, 0.00, 0.43, 0.17, 0.10, 0.23, 0.53, 0.66, 1.17], atol=0.005)
    assert idle[21] == idle[40] == 30.0  # clients 22 and 41 are capped
    assert round(float(idle.mean()), 2) == 3.25 and round(float(np.median(idle)), 2) == 0.89
    other_seed = ClientSpeeds(SpeedConfig(model="pareto", mean=1.0, reference_time=1.0, jitter=0.0, legacy_seed=1),
                              100, seed=7)
    np.testing.assert_array_equal(other_seed.base_time_per_step, speeds.base_time_per_step)  # PLATO ignores our seed


# Urgent pull, by hand (latency 0.5 s per transfer; K = 2, Ω = 3, strict rule: pull when S + 1 ≥ 3):
#   clients 0, 1: 10 steps × 1 s + 1 s transfers = 11 s rounds → aggregations at 11 (v1) and 22 (v2);
#   client 2: 3.5 s per step, planned arrival 0.5 + 35 + 0.5 = 36. After v2 (t = 22) its S = 2: pulled.
#   It trains from 0.5, so at 22 it is in step ⌈21.5 / 3.5⌉ = 7; it uploads at 0.5 + 7·3.5 + 0.5 = 25.5.
#   With the pull, v3 comes at 33 (client 0's arrival, with client 2's 7 steps); without it the
#   server waits for client 2's full 10 steps until 36.
PULL_TIMES = [1.0, 1.0, 3.5]


def run_pull_scenario(urgent_pull, pull_steps=1):
    policy = PORT(local_steps=10, min_clients=2, staleness_bound=3.0, pull_steps=pull_steps,
                  options=dataclasses.replace(PAPER, urgent_pull=urgent_pull))
    rows, backend = [], RecordingBackend()
    sim = Simulation(policy, ScriptedSpeeds(lambda c, r: PULL_TIMES[c], 3, latency=0.5), [1 / 3] * 3, backend,
                     max_updates=3, log=rows.append)
    sim.run()
    return sim, policy, backend, rows


def test_urgent_pull_brings_a_stale_client_early_with_the_steps_it_trained():
    sim, policy, backend, rows = run_pull_scenario(urgent_pull=True)
    pulled = sim.records[2]
    assert (pulled.client, pulled.steps, pulled.planned_steps, pulled.arrival_time) == (2, 7, 10, 25.5)
    assert [a.time for a in backend.aggregations] == [11.0, 22.0, 33.0]
    third = backend.aggregations[2]
    assert [sim.records[d].client for d, _ in third.contributions] == [2, 0]  # aggregated like any other
    assert third.payload.staleness_part[0] == pytest.approx(0.5 * staleness_discount(2, 3.0, 3.0))
    assert policy.waits == 0 and policy.pulls == 1 and policy.summary()["urgent_pulls"] == 1
    pull_rows = [r for r in rows if r["event"] == "pull"]
    assert pull_rows == [{"time": 22.0, "event": "pull", "client": 2, "dispatch": 2, "version": 0, "staleness": 2,
                          "steps": 7, "detail": "urgent pull: 7 of 10 steps, uploads at 25.5", "wall_time": None}]
    arrival = next(r for r in rows if r["event"] == "arrival" and r["dispatch"] == 2)
    assert (arrival["time"], arrival["steps"], arrival["detail"]) == (25.5, 7, "pulled: 7 of 10 steps")
    assert sim.busy_time[2] >= 25.5  # its busy time ends at the upload
    # blocks of 4 steps (an "epoch"): at 22 it is in its second block, so it uploads 8 steps at 29
    sim4, _, _, _ = run_pull_scenario(urgent_pull=True, pull_steps=4)
    assert (sim4.records[2].steps, sim4.records[2].arrival_time) == (8, 29.0)


def test_without_the_pull_the_server_waits_for_the_whole_local_training():
    sim, policy, backend, rows = run_pull_scenario(urgent_pull=False)
    assert (sim.records[2].steps, sim.records[2].planned_steps, sim.records[2].arrival_time) == (10, None, 36.0)
    assert [a.time for a in backend.aggregations] == [11.0, 22.0, 36.0]
    assert policy.waits == 1 and policy.pulls == 0
    assert not [r for r in rows if r["event"] == "pull"]
    assert PLATO.urgent_pull is False and PAPER.urgent_pull is True


def test_a_pull_block_of_the_whole_round_is_said_to_leave_the_pull_nothing_to_cut():
    # accepted without a word before: every pull then waited for the whole round, as no pull at all
    whole, _, whole_backend, _ = run_pull_scenario(urgent_pull=True, pull_steps=10)
    waited, _, waited_backend, _ = run_pull_scenario(urgent_pull=False)
    assert (whole.records[2].steps, whole.records[2].arrival_time) == (10, 36.0)
    assert [a.time for a in whole_backend.aggregations] == [a.time for a in waited_backend.aggregations]
    with pytest.warns(UserWarning, match=r"port.pull_steps=10 is not below local_steps=4: a pulled client is always "
                                         r"in its round's last block"):
        validate(RunConfig(algorithm="port", local_steps=4, algorithm_options={"pull_steps": 10}))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(RunConfig(algorithm="port", local_steps=4, algorithm_options={"pull_steps": 3}))
        validate(RunConfig(algorithm="port", local_epochs=1.0, algorithm_options={"pull_steps": 60}))  # per client


def test_pulled_updates_train_their_steps_and_resume_bit_identical(small_config, crash_after_saves):
    """The engine trains a pulled dispatch to its cut step count, also when it had trained it in full
    already (batched with earlier arrivals); a run interrupted with a pull in flight resumes exactly."""
    import os

    from jaxfl.experiment import resume_experiment
    from jaxfl.testing import assert_same_run
    from conftest import Interrupted

    config = replace(small_config, algorithm="port", model="logreg", clients=3, local_steps=10, jitter=0.0,
                     latency=0.5, max_updates=3, checkpoint_every=1, stop_at_target=False,
                     algorithm_options={"min_clients": 2, "staleness_bound": 3.0})
    single = run_experiment(replace(config, batching=False, run_name="single"), time_per_step=PULL_TIMES)
    batched = run_experiment(replace(config, clients_per_call=4, run_name="batched"), time_per_step=PULL_TIMES)
    record = batched.simulation.records[2]
    assert (record.steps, record.planned_steps) == (7, 10)
    assert batched.engine.client_metrics(2)["steps"] == 7
    for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(batched.params)):  # up to reassociation
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-4)
    assert batched.summary["policy"]["urgent_pulls"] == 1
    def pull_in_flight(checkpointer, simulation):  # after v2: client 2's pull is in flight
        assert 2 in simulation.policy.pulled

    disarm = crash_after_saves(2, before=pull_in_flight)
    with pytest.raises(Interrupted):
        run_experiment(replace(config, clients_per_call=4, run_name="killed"), time_per_step=PULL_TIMES)
    disarm()
    resumed = resume_experiment(os.path.join(config.output_dir, "killed"), progress=False)
    assert_same_run(batched, resumed)


def test_urgent_pull_options_from_python_and_the_command_line():
    def resolved(**options):
        return validate(RunConfig(algorithm="port", algorithm_options=options)).algorithm_options

    assert resolved().urgent_pull is True and resolved(preset="plato").urgent_pull is False
    assert resolved(preset="plato", urgent_pull=True).switches().urgent_pull is True
    assert resolved(pull_steps=5).pull_steps == 5
    # unset: one step, or with local epochs the paper's unit, an epoch of ceil(n_k / B) steps per client
    from jaxfl.algorithms import build

    assert build(validate(RunConfig(algorithm="port", clients=3))).policy().pull_steps == 1
    epochs = validate(RunConfig(algorithm="port", clients=3, local_epochs=2.0, batch_size=32))
    policy = build(epochs, client_samples=[100, 32, 5]).policy()
    assert policy.local_steps == (8, 2, 2) and policy.pull_steps == (4, 1, 1)  # 2 epochs of 1 epoch blocks
    assert build(validate(replace(epochs, algorithm_options={"pull_steps": 2})), client_samples=[100, 32, 5]).policy().pull_steps == 2
    with pytest.raises(ConfigError, match="port.pull_steps=0 is not allowed"):
        validate(RunConfig(algorithm="port", algorithm_options={"pull_steps": 0}))
    with pytest.raises(ValueError, match="port_pull_steps=0"):
        PORT(local_steps=5, pull_steps=0)
    from jaxfl.cli import _configs, build_parser

    parser = build_parser()

    def from_cli(*argv):
        (config,) = _configs(parser.parse_args(["run", "--algorithm", "port", *argv]))
        return validate(config).algorithm_options

    assert from_cli("--no-port.urgent-pull").urgent_pull is False
    assert from_cli("--port.preset", "plato", "--port.urgent-pull").switches().urgent_pull is True
    assert from_cli("--port.pull-steps", "3").pull_steps == 3


@pytest.mark.parametrize("options", [PAPER, PLATO])
def test_crashed_clients_do_not_use_up_the_clients_in_flight(options):
    """A dispatch presumed lost at its deadline gives its slot to an idle client: before, the crashed
    clients held PORT's P slots for good and the run stopped ("no events left") with most clients
    alive and idle (20 crashes of P = 20 ended a 100-client run after 232 of 2,000 updates)."""
    from jaxfl.scheduler.faults import ClientFaults, FaultConfig

    clients = 40
    policy = PORT(local_steps=5, options=dataclasses.replace(options, urgent_pull=False), seed=0,
                  clients_in_flight=10, min_clients=3, round_timeout=30.0)
    faults = ClientFaults(FaultConfig(crash_prob=0.05, delay_prob=0.3, delay_factor=10.0), clients, seed=0)
    sim = Simulation(policy, ClientSpeeds(SpeedConfig(model="exp", mean=1.0), clients, seed=0),
                     np.full(clients, 1 / clients), RecordingBackend(), max_updates=150, faults=faults)
    reason = sim.run()
    crashed = {r.client for r in sim.records if r.drop_reason == "client crashed"}
    assert crashed and len(crashed) >= 10  # as many crashes as slots: the old code stopped here
    assert reason == "update budget" and sim.version == 150
    assert any(r.drop_reason == "arrived after round deadline" for r in sim.records)
    # every slot the server counts is a client it still waits for; idle = neither in flight nor lost
    assert len(policy.in_flight) + len(policy.buffer) <= policy.P
    busy = set(policy.in_flight.values()) | set(policy.lost.values())
    assert policy.idle.in_order() == [c for c in range(clients) if c not in busy]


def test_a_bound_of_one_pulls_no_client_sent_the_newest_model_and_rounds_keep_their_steps(tmp_path):
    # with Ω = 1 every in-flight client counted as too stale, those dispatched a moment before with
    # the newest model too: each was pulled before it trained, and every round after the first ran
    # one step of the ten asked for. Now Ω = 1 is a synchronous round of full work, pull or not.
    logs = {}
    for pull in (True, False):
        config = RunConfig(algorithm="port", dataset="mnist10k", model="logreg", clients=6, local_steps=10,
                           max_updates=4, timing_only=True, progress=False, output_dir=str(tmp_path), run_name=str(pull),
                           algorithm_options={"staleness_bound": 1, "min_clients": 2, "urgent_pull": pull})
        result = run_experiment(config)
        with open(f"{result.run_dir}/events.csv") as handle:
            logs[pull] = [line.rsplit(",", 1)[0] for line in handle.read().splitlines()]  # less wall_time
        assert result.summary["client_steps_aggregated"] == 4 * 6 * 10
        assert result.summary["policy"]["urgent_pulls"] == 0 and result.summary["policy"]["max_aggregated_staleness"] == 0
    assert logs[True] == logs[False]
