"""CC-FedAvg: budgets and schedules, hand-computed aggregation of trained and skipping clients
under Strategy 1, Strategy 2 and CC-FedAvg, the FedAvg corner, and the gradient steps spent."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.algorithms import CCFedAvg
from jaxfl.algorithms.ccfedavg import level_budgets, two_group_budgets
from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.engine import TRAIN_STREAM
from jaxfl.experiment import make_client_optimizer, prepare, run_experiment
from jaxfl.kernels import ClientView, FederatedArrays, local_train, make_client_trainer
from jaxfl.kernels.ccfedavg import bank_delta_sum, bank_model_sum, init_bank, store
from jaxfl.scheduler.simulation import Simulation
from jaxfl.scheduler.speeds import ScriptedSpeeds
from tests.conftest import RecordingBackend, replace


def test_budget_profiles():
    assert level_budgets(8, 4) == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.125, 0.125]  # spec §3.1's N = 8 example
    assert level_budgets(30, 3) == [1.0] * 10 + [0.5] * 10 + [0.25] * 10  # the paper's β = 3 example
    assert two_group_budgets(8, 0.75, 4) == [1.0, 1.0] + [0.25] * 6
    config = validate(RunConfig(algorithm="ccfedavg", clients=4, algorithm_options={"budget_beta": 1}))
    assert config.algorithm_options.budgets(config.clients) == [1.0] * 4
    with pytest.raises(ConfigError, match="cc.strategy='mifa'"):
        validate(RunConfig(algorithm="ccfedavg", algorithm_options={"strategy": "mifa"}))


def test_bank_kernels_by_hand():
    """x_t = (1, 1); client A trained Δ_A = (0.2, 0); client B skips with D_B = (0, 0.4) and last model
    x_B = (0.5, 0.5); equal weights 1/2. By hand:
    CC-FedAvg:  x' = x − (Δ_A + D_B)/2            = (0.9, 0.8)
    Strategy 2: x' = x − (Δ_A + (x − x_B))/2      = (1 − 0.35, 1 − 0.25) = (0.65, 0.75)
    Strategy 1: x' = x − Δ_A                      = (0.8, 1.0)"""
    x = {"w": jnp.array([1.0, 1.0])}
    deltas = store(init_bank(x, 2), jnp.array([1]), {"w": jnp.array([[0.0, 0.4]])})
    models = store(init_bank(x, 2), jnp.array([1]), {"w": jnp.array([[0.5, 0.5]])})
    delta_a = np.array([0.2, 0.0])
    cc = np.asarray(x["w"]) - (0.5 * delta_a + np.asarray(bank_delta_sum(deltas, jnp.array([0.0, 0.5]))["w"]))
    s2 = np.asarray(x["w"]) - (0.5 * delta_a + np.asarray(bank_model_sum(models, jnp.array([0.0, 0.5]), x)["w"]))
    np.testing.assert_allclose(cc, [0.9, 0.8], rtol=1e-6)
    np.testing.assert_allclose(s2, [0.65, 0.75], rtol=1e-6)
    # padding rows are not written
    padded = store(init_bank(x, 2), jnp.array([0, 0]), {"w": jnp.array([[7.0, 7.0], [9.0, 9.0]])},
                   valid=jnp.array([True, False]))
    np.testing.assert_array_equal(np.asarray(padded["w"]), [[7.0, 7.0], [0.0, 0.0]])


def run_policy(strategy, schedule="round_robin", rounds=3, budgets=(1.0, 0.5, 0.25, 0.125)):
    policy = CCFedAvg(local_steps=5, budgets=budgets, schedule=schedule, strategy=strategy)
    backend = RecordingBackend()
    sim = Simulation(policy, ScriptedSpeeds(lambda c, r: 1.0 + c, num_clients=4), [0.25] * 4, backend,
                     max_updates=rounds)
    sim.run()
    return sim, policy, backend


@pytest.mark.parametrize("strategy, kind, stored", [("cc", "delta", ("delta",)), ("strategy2", "model", ("model",)),
                                                    ("strategy1", "delta", ())])
def test_round_robin_contributions_per_strategy(strategy, kind, stored):
    sim, policy, backend = run_policy(strategy)
    # round-robin phases aligned at 0: periods 1, 2, 4, 8 → round 0 all, round 1 {0}, round 2 {0, 1}
    assert [trained for _, _, trained in policy.history[:3]] == [[0, 1, 2, 3], [0], [0, 1]]
    first, second, third = backend.aggregations
    assert [c for _, c in first.contributions] == [0.25] * 4 and first.payload.bank == ()
    assert second.payload.kind == kind and second.payload.store == stored
    if strategy == "strategy1":  # skippers dropped: the mean over who trained
        assert [c for _, c in second.contributions] == [1.0] and second.payload.bank == ()
        assert [c for _, c in third.contributions] == [0.5, 0.5]
    else:  # the mean over all of S_t
        assert [c for _, c in second.contributions] == [0.25] and second.payload.bank == ((1, 0.25), (2, 0.25), (3, 0.25))
    # a round lasts as long as its slowest *training* client: 5 steps × (1 + c) s
    assert [a.time for a in backend.aggregations] == [20.0, 25.0, 35.0]


def test_cc_c_switches_estimator_and_dropout_quota():
    policy = CCFedAvg(local_steps=5, budgets=[1.0, 0.5, 0.25, 0.125], schedule="round_robin", strategy="cc_c",
                      switch_round=2)
    backend = RecordingBackend()
    Simulation(policy, ScriptedSpeeds(lambda c, r: 1.0, num_clients=4), [0.25] * 4, backend, max_updates=4).run()
    assert [a.payload.kind for a in backend.aggregations] == ["delta", "delta", "model", "model"]
    assert all(a.payload.store == ("delta", "model") for a in backend.aggregations)
    dropout = CCFedAvg(local_steps=5, budgets=[1.0, 0.5, 0.25, 0.125], strategy="dropout", total_rounds=8)
    Simulation(dropout, ScriptedSpeeds(lambda c, r: 1.0, num_clients=4), [0.25] * 4, RecordingBackend(),
               max_updates=6).run()
    # active while p_i T ≥ t: client 3 (p T = 1) for t ≤ 1, client 2 for t ≤ 2, client 1 for t ≤ 4
    assert [trained for _, _, trained in dropout.history[:6]] == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2], [0, 1],
                                                                 [0, 1], [0]]


def reference(config):
    """Recompute the two rounds with local_train: round 0 everybody trains, round 1 only client 0.
    Returns x2 for each strategy."""
    config, _, federation, model, params = prepare(config)
    trainer = make_client_trainer(model, make_client_optimizer("sgd", config.client_lr), config.batch_size)
    data = FederatedArrays(jnp.asarray(federation.x), jnp.asarray(federation.y))
    root = jax.random.fold_in(jax.random.key(config.seed), TRAIN_STREAM)
    w = federation.weights("samples")

    steps = config.local_steps
    trained = jax.jit(lambda start, view, key: local_train(trainer, start, data, view, jnp.int32(steps), key, steps)[0])

    def train(start, client, client_round):
        key = jax.random.fold_in(jax.random.fold_in(root, client), client_round)
        return trained(start, ClientView(jnp.int32(federation.offsets[client]), jnp.int32(federation.counts[client])),
                       key)

    tmap = jax.tree.map
    x0 = params
    d0 = [train(x0, i, 0) for i in range(4)]
    x1 = tmap(lambda x, *d: x - sum(w[i] * d[i] for i in range(4)), x0, *d0)
    d1 = train(x1, 0, 1)
    return {
        "strategy1": tmap(lambda x, d: x - d, x1, d1),  # only client 0 trained: its update alone
        "cc": tmap(lambda x, a, *d: x - (w[0] * a + sum(w[i] * d[i] for i in (1, 2, 3))), x1, d1, *d0),  # Δ_i^0 again
        # skippers send their round-0 models x0 − Δ_i^0, i.e. pseudo-gradient x1 − (x0 − Δ_i^0)
        "strategy2": tmap(lambda x, z, a, *d: x - (w[0] * a + sum(w[i] * (x - (z - d[i])) for i in (1, 2, 3))),
                          x1, x0, d1, *d0),
    }


def test_trained_and_skipping_clients_match_hand_recomputation(small_config):
    config = replace(small_config, algorithm="ccfedavg", clients=4, max_updates=2,
                     client_optimizer="sgd", client_lr=0.05, algorithm_options={"schedule": "round_robin"})
    expected = reference(config)
    for strategy in ("cc", "strategy2", "strategy1"):
        result = run_experiment(replace(config, run_name=strategy,
                                        algorithm_options={"schedule": "round_robin", "strategy": strategy}))
        assert result.simulation.policy.history[1][2] == [0]
        for a, b in zip(jax.tree.leaves(expected[strategy]), jax.tree.leaves(result.params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(jax.tree.leaves(expected["cc"])[0]),
                           np.asarray(jax.tree.leaves(expected["strategy2"])[0]), atol=1e-5)


def test_all_budgets_one_is_fedavg(small_config):
    common = dict(clients=4, heterogeneity="exp", max_updates=3, client_optimizer="sgd", client_lr=0.05)
    fedavg = run_experiment(replace(small_config, algorithm="fedavg", run_name="avg", **common))
    cc = run_experiment(replace(small_config, algorithm="ccfedavg", run_name="cc", **common,
                                algorithm_options={"budget_beta": 1}))
    for a, b in zip(jax.tree.leaves(fedavg.params), jax.tree.leaves(cc.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    assert cc.summary["client_steps_aggregated"] == fedavg.summary["client_steps_aggregated"]


def test_gradient_steps_spent_are_the_trained_mask_times_k(small_config):
    result = run_experiment(replace(small_config, algorithm="ccfedavg", clients=4, max_updates=6, local_steps=4,
                                    steps_per_call=4, devices=1, algorithm_options={"schedule": "adhoc"}))
    policy = result.simulation.policy
    aggregated_rounds = policy.history[:6]  # the 7th round was dispatched but never needed
    masks = np.array([[c in trained for c in range(4)] for _, _, trained in aggregated_rounds])
    assert 0 < masks.sum() < masks.size  # some clients skipped
    expected = int(masks.sum()) * 4
    assert result.engine.stats.aggregated_steps == expected
    assert result.summary["client_steps_executed"] == expected  # skippers cost no training compute
    assert result.summary["steps_computed_with_padding"] == expected  # one CPU device: one client per call, no padding
    assert result.summary["policy"]["banked_updates"] == masks.size - masks.sum()


def test_a_round_nobody_trains_is_a_version_and_spent_quotas_stop_the_run():
    # Strategy 1, round-robin p = 1/2 for both: round 1 has only skippers, a round of the paper's T all the
    # same ("the global model stays unchanged that round"); it made no version, so T rounds ran longer
    policy = CCFedAvg(local_steps=5, budgets=[0.5, 0.5], schedule="round_robin", strategy="strategy1")
    backend = RecordingBackend()
    sim = Simulation(policy, ScriptedSpeeds(lambda c, r: 1.0, num_clients=2), [0.5] * 2, backend, max_updates=3)
    assert sim.run() == "update budget"
    assert [trained for _, _, trained in policy.history[:3]] == [[0, 1], [], [0, 1]]  # (the 4th opened)
    empty = backend.aggregations[1]
    assert empty.contributions == () and not empty.server_optimizer and empty.time == backend.aggregations[0].time
    # FedAvg(dropout) ran rounds of nobody, taking no time and making nothing, for ever once every quota was
    # used up (max_time never came): now it stops, saying why, and its rounds with nobody left are versions
    dropout = CCFedAvg(local_steps=5, budgets=[0.5, 0.25], strategy="dropout", total_rounds=4, clients_per_round=1)
    backend = RecordingBackend()
    sim = Simulation(dropout, ScriptedSpeeds(lambda c, r: 1.0, num_clients=2), [0.5] * 2, backend, max_updates=100)
    reason = sim.run()
    assert reason.startswith("every client's FedAvg(dropout) quota p_i·T is used up (T = 4 rounds, largest p_i 0.5)")
    # active while p_i T >= t: client 0 for t <= 2, client 1 for t <= 1; round 3 has nobody left
    assert sim.version == len(dropout.history) == 3
    for (t, selected, trained), aggregation in zip(dropout.history, backend.aggregations):
        assert trained == selected == [c for c in selected if [0.5, 0.25][c] * 4 >= t]
        assert len(aggregation.contributions) == len(trained)


def test_an_empty_strategy1_round_leaves_the_model_unchanged(small_config):
    options = {"budget": "two_group", "insufficient_fraction": 1.0, "window": 2, "schedule": "round_robin",
               "strategy": "strategy1"}
    config = replace(small_config, algorithm="ccfedavg", clients=2, client_optimizer="sgd", client_lr=0.05,
                     server_momentum=0.9, algorithm_options=options)
    one, two = (run_experiment(replace(config, run_name=f"r{rounds}", max_updates=rounds)) for rounds in (1, 2))
    assert [trained for _, _, trained in two.simulation.policy.history[:2]] == [[0, 1], []]
    assert two.summary["global_updates"] == 2
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(two.params)):  # no server step, momentum or not
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
