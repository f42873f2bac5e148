"""FedCompass+N/+M arithmetic, FedAT tiers, batching of group re-dispatches, and the timeline."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.algorithms import FedAT, FedCompass
from jaxfl.algorithms.fedat import TierUpdate, form_tiers
from jaxfl.algorithms.wrappers import NormalizeSteps
from jaxfl.cli import main
from jaxfl.engine import TRAIN_STREAM
from jaxfl.experiment import make_client_optimizer, prepare, run_experiment
from jaxfl.kernels import ClientView, FederatedArrays, local_train, make_client_trainer
from jaxfl.kernels.fednova import fednova_coefficients
from jaxfl.plot import busy_intervals, read_events
from jaxfl.scheduler.simulation import Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, ScriptedSpeeds, SpeedConfig
from jaxfl.scheduler.staleness import polynomial
from tests.conftest import RecordingBackend, replace


def test_fedcompass_n_normalises_by_local_steps():
    weights = np.array([0.1, 0.2, 0.3, 0.4])
    policy = FedCompass(5, 25, polynomial, aggregation="normalized")
    speeds = ClientSpeeds(SpeedConfig(model="exp", jitter=0.05), 4, seed=1)
    backend = RecordingBackend()
    sim = Simulation(policy, speeds, weights, backend, max_updates=30)
    sim.run()
    groups = [a for a in backend.aggregations if a.server_optimizer]
    assert groups
    for aggregation in groups:
        records = [sim.records[d] for d, _ in aggregation.contributions]
        # the policy asks for FedNova with τ_eff weighted by p_i; its coefficients are st(s)·p_i
        assert isinstance(aggregation.payload, NormalizeSteps)
        assert dict(zip(aggregation.payload.dispatch_ids, aggregation.payload.step_weights)) == \
            {r.id: weights[r.client] for r in records}
        for (d, coefficient), record in zip(aggregation.contributions, records):
            staleness_weight = coefficient / weights[record.client]
            assert 0 < staleness_weight <= 0.9 + 1e-12  # st(s) = 0.9 (s+1)^-0.5 at buffer time
        # what the device hook makes of them: Q_eff · c_i / Q_i with Q_eff = Σ p_i Q_i / Σ p_i
        p = np.array([weights[r.client] for r in records])
        steps = np.array([r.steps for r in records])
        c = np.array([c for _, c in aggregation.contributions])
        q_eff = float(np.sum(p * steps) / np.sum(p))
        np.testing.assert_allclose(np.asarray(fednova_coefficients(c, steps, p)), q_eff * c / steps, rtol=1e-6)
    singles = [a for a in backend.aggregations if not a.server_optimizer]
    for aggregation in singles:  # first responses are unnormalised: st(s)·p_i
        ((d, coefficient),) = aggregation.contributions
        assert aggregation.payload is None
        staleness = aggregation.version - 1 - sim.records[d].version
        assert coefficient == pytest.approx(polynomial(staleness) * weights[sim.records[d].client])


@pytest.mark.parametrize("momentum, decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 5e-4)])
def test_fedcompass_n_divides_by_q_i_for_momentum_sgd_clients_too(momentum, decay):
    # the run's SGD replaced the hook's τ_i by FedNova's ‖a_i‖₁ (6.0·Q_i at 20 steps and 9.1·Q_i at
    # 100 under momentum 0.9): a 20-step update weighted 2.13 instead of the authors' 1.5
    from types import SimpleNamespace

    from jaxfl.algorithms import build, device_hooks
    from jaxfl.config import RunConfig, validate

    run = validate(RunConfig(algorithm="fedcompass_n", client_optimizer="sgd", client_lr=0.1,
                             client_momentum=momentum, client_weight_decay=decay, local_steps=100))
    (hook,) = device_hooks(build(run))
    records = [SimpleNamespace(steps=20, lr_scale=1.0), SimpleNamespace(steps=100, lr_scale=1.0)]
    np.testing.assert_array_equal(hook.effective_steps(records), [20.0, 100.0])
    c = np.array([0.5, 0.5])
    np.testing.assert_allclose(np.asarray(fednova_coefficients(c, hook.effective_steps(records), c)), [1.5, 0.3],
                               rtol=1e-6)  # Q_eff · c_i / Q_i, Q_eff = 60


@pytest.mark.parametrize("times, timeout, tiers", [([1.0, 1.0, 1.1, 5.0], 12.0, [[0, 1, 2, 3]]),
                                                   ([1.0, 1.2, 6.0, 30.0], 100.0, [[0, 1], [2, 3]])])
def test_a_client_late_for_the_profiling_deadline_joins_an_existing_tier(times, timeout, tiers):
    """Its round is longer than the deadline: a tier of its own (tried, 2026-12-05) never completed a
    round while its untrained model took the fastest tier's count as its cross-tier weight, and the
    accuracy stalled (0.76 against 0.87 in 25 updates)."""
    policy = FedAT(5 if timeout == 12.0 else 10, tier_ratio=2.0, round_timeout=timeout)
    backend = RecordingBackend()
    sim = Simulation(policy, ScriptedSpeeds(lambda client, r: times[client], 4), [0.25] * 4, backend, max_time=1200)
    sim.run()
    assert policy.tiers == tiers and len(policy.counts) == len(tiers)


def test_form_tiers_and_tier_weights():
    assert form_tiers([1.0, 5.0, 1.5, 2.5, 2.0], ratio=2.0) == [[0, 2, 4], [3, 1]]
    assert form_tiers([3.0, 1.0, 9.0], ratio=2.0) == [[1], [0], [2]]
    policy = FedAT(10, tier_ratio=2.0)
    policy.counts = [5, 2, 1]  # fast → slow
    policy._round = {0: ["open"], 1: ["open"], 2: ["open"]}
    assert policy.tier_weights() == [(0, 1 / 8), (1, 2 / 8), (2, 5 / 8)]  # slow tiers get the fast counts
    with pytest.raises(ValueError, match="fedat_tier_ratio=0.5"):
        FedAT(10, tier_ratio=0.5)


def test_a_fedat_tier_whose_members_all_crashed_leaves_the_cross_tier_average():
    """Kept in, a dead tier took its mirror tier's growing count: 0.61 of the global model at t = 310
    in this run, against 0.10 for the one tier still training."""
    from jaxfl.scheduler.faults import ClientFaults, FaultConfig

    clients, rows = 8, []
    policy = FedAT(5, tier_ratio=2.0, round_timeout=30.0)
    backend = RecordingBackend()
    sim = Simulation(policy, ClientSpeeds(SpeedConfig(model="exp", mean=0.5), clients, seed=0),
                     np.full(clients, 1 / clients), backend, max_time=320, log=rows.append,
                     faults=ClientFaults(FaultConfig(crash_prob=0.08), clients, 0))
    sim.run()
    crashed_at = {row["client"]: row["time"] for row in rows if row["event"] == "crash"}
    dead_since = {tier: max(crashed_at[c] for c in members) + 30.0 for tier, members in enumerate(policy.tiers)
                  if all(c in crashed_at for c in members)}
    assert 0 < len(dead_since) < len(policy.tiers)  # some tiers died while others went on
    checked = 0
    for aggregation in backend.aggregations:
        if not isinstance(aggregation.payload, TierUpdate):
            continue
        weights = dict(aggregation.payload.tier_weights)
        assert sum(weights.values()) == pytest.approx(1.0)
        for tier, since in dead_since.items():
            if aggregation.time > since:
                assert weights[tier] == 0.0, (aggregation.time, tier, weights)
                checked += 1
    assert checked > 20


def test_fedat_tiers_run_synchronously_inside_and_asynchronously_across():
    speeds = ScriptedSpeeds(lambda c, r: [1.0, 1.2, 5.0, 5.5][c], num_clients=4)
    policy = FedAT(10, tier_ratio=2.0)
    backend = RecordingBackend()
    sim = Simulation(policy, speeds, [0.25] * 4, backend, max_updates=8)
    sim.run()
    assert policy.tiers == [[0, 1], [2, 3]]
    profiling, *tiered = backend.aggregations
    assert profiling.time == pytest.approx(55.0) and profiling.payload is None  # a FedAvg round: 10 × 5.5
    fast = [a for a in tiered if a.payload.tier == 0]
    slow = [a for a in tiered if a.payload.tier == 1]
    assert [a.time for a in fast][:3] == pytest.approx([67.0, 79.0, 91.0])  # 55 + k·12 (tier waits for 1.2)
    assert slow[0].time == pytest.approx(110.0)  # 55 + 10 × 5.5
    assert all(len(a.contributions) == 2 and isinstance(a.payload, TierUpdate) for a in tiered)


def test_fedat_tier_arithmetic_matches_hand_computation(small_config):
    config = replace(small_config, algorithm="fedat", clients=3, heterogeneity="exp", max_updates=4,
                     client_optimizer="sgd", client_lr=0.05, algorithm_options={"profiling": "oracle"})
    result = run_experiment(config)
    config, dataset, federation, model, params = prepare(config)
    trainer = make_client_trainer(model, make_client_optimizer("sgd", 0.05), config.batch_size)
    data = FederatedArrays(jnp.asarray(federation.x), jnp.asarray(federation.y))
    root = jax.random.fold_in(jax.random.key(config.seed), TRAIN_STREAM)
    p = federation.weights("samples")
    versions, tier_models, w = {0: params}, {}, params
    policy = result.simulation.policy
    counts = [1] * len(policy.tiers)
    by_version = {}
    for record in result.simulation.records:
        if record.aggregated_in is not None:
            by_version.setdefault(record.aggregated_in, []).append(record)
    for version in sorted(by_version):
        records = by_version[version]
        tier = next(k for k, members in enumerate(policy.tiers) if records[0].client in members)
        total = sum(p[r.client] for r in records)
        model_m = None
        for r in records:
            key = jax.random.fold_in(jax.random.fold_in(root, r.client), r.client_round)
            view = ClientView(jnp.int32(federation.offsets[r.client]), jnp.int32(federation.counts[r.client]))
            delta, _ = local_train(trainer, versions[r.version], data, view, jnp.int32(r.steps), key, r.steps)
            final = jax.tree.map(lambda s, d: (p[r.client] / total) * (s - d), versions[r.version], delta)
            model_m = final if model_m is None else jax.tree.map(jnp.add, model_m, final)
        counts[tier] += 1
        for k in range(len(counts)):
            tier_models.setdefault(k, w)
        tier_models[tier] = model_m
        last = len(counts) - 1
        w = jax.tree.map(lambda *leaves: sum(counts[last - k] / sum(counts) * leaf for k, leaf in enumerate(leaves)),
                         *[tier_models[k] for k in range(len(counts))])
        versions[version] = w
    for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(result.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_group_redispatches_train_in_one_call_and_padding_is_reported(small_config):
    result = run_experiment(replace(small_config, algorithm="fedcompass", clients=8, local_steps=20,
                                    clients_per_call=8, steps_per_call=4, max_updates=20))
    assert result.summary["mean_clients_per_batch"] > 1.5
    stats = result.engine.stats
    assert stats.executed_steps > stats.useful_steps  # Q_i differ inside a call: masked steps
    assert result.summary["padding_waste"] == pytest.approx(1 - stats.useful_steps / stats.executed_steps, abs=1e-6)


@pytest.mark.parametrize("algorithm", ["fedcompass", "fedcompass_m", "fedcompass_n", "fedat"])
@pytest.mark.parametrize("heterogeneity", ["homo", "normal", "exp"])
def test_semi_async_algorithms_run_on_real_data(small_config, algorithm, heterogeneity):
    result = run_experiment(replace(small_config, algorithm=algorithm, heterogeneity=heterogeneity, clients=5,
                                    local_steps=10, max_updates=6))
    summary = result.summary
    assert summary["global_updates"] == 6
    assert summary["best_accuracy"] > 0.3  # chance is 0.1
    counts = summary["accounting"]
    assert counts["dispatched"] == counts["aggregated"] + counts["in_flight"] + counts["arrived_unaggregated"]


def test_timeline_from_a_run(small_config, tmp_path):
    result = run_experiment(replace(small_config, algorithm="fedcompass", clients=4, local_steps=10, max_updates=8))
    events = read_events(result.run_dir)
    intervals = busy_intervals(events)
    assert set(intervals) == {0, 1, 2, 3}
    for spans in intervals.values():
        assert all(a < b for a, b, _ in spans)
        assert all(b1 <= a2 for (_, b1, _), (a2, _, _) in zip(spans, spans[1:]))  # never two rounds at once
    assert any(label.startswith("group ") for spans in intervals.values() for _, _, label in spans)
    out = tmp_path / "t.png"
    assert main(["timeline", result.run_dir, "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000
    with pytest.raises(SystemExit):
        main(["timeline", str(tmp_path / "nothing")])
