"""FedASMU: α and β by hand, both hypergradients against finite differences, the engine's
fetch-and-mix against a step-by-step recomputation, the trigger scheduler, and batching invariance."""

import dataclasses
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfl.algorithms.fedasmu import (DeviceOptions, FedASMU, FixedSlot, FreshModelMix, QLearningSlot, ServerOptions,
                                     Upload, initial_alpha)
from jaxfl.engine import TRAIN_STREAM, Engine, ExecutionPlan
from jaxfl.experiment import run_experiment
from jaxfl.testing import events_without_wall_time
from jaxfl.kernels import ClientView, FederatedArrays, make_client_trainer, make_server_optimizer
from jaxfl.kernels.fedasmu import (device_beta, device_mix, mix, server_alpha, server_hypergradient,
                                   server_update)
from jaxfl.kernels.port import tree_vdot
from jaxfl.scheduler.simulation import DispatchRecord, Simulation
from jaxfl.scheduler.speeds import ScriptedSpeeds
from tests.conftest import RecordingBackend, replace


def test_alpha_and_beta_by_hand():
    # (λ, σ, ι) = (1.5, 0.5, 0.1), t = 4, s = 3, μ_α = 2: ξ = 1.5/(√4·√3) + 0.1 = 0.5330127,
    # α = 2ξ/(1 + 2ξ) = 0.5159788
    alpha = server_alpha(jnp.array([1.5, 0.5, 0.1]), 4.0, 3.0, 2.0, 0.01)
    assert float(alpha) == pytest.approx(0.5159788, abs=1e-6)
    # (γ, ν) = (2, 0.5), fresh version g = 9, start o = 5, μ_β = 1: φ = (2/3)(1 − 0.5/√5) = 0.5175955,
    # β = φ/(1 + φ) = 0.3410629
    assert float(device_beta(jnp.array([2.0, 0.5]), 9.0, 5.0, 1.0)) == pytest.approx(0.3410629, abs=1e-6)
    # clips: a negative φ gives β = 0, a tiny ξ gives α_min; the scheduler's host-side α agrees
    assert float(device_beta(jnp.array([1.0, 5.0]), 9.0, 5.0, 1.0)) == 0.0
    assert float(server_alpha(jnp.array([0.0, 0.5, 0.0]), 4.0, 3.0, 1.0, 0.05)) == pytest.approx(0.05)
    assert initial_alpha(ServerOptions(mu_alpha=2.0, lambda0=1.5, sigma0=0.5, iota0=0.1), 4, 3) == \
        pytest.approx(0.5159788, abs=1e-6)


def test_server_hypergradient_matches_finite_differences_and_its_sign():
    rng = np.random.default_rng(0)
    previous = {"a": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), "b": jnp.asarray(rng.normal(size=5), jnp.float32)}
    g_hat = jax.tree.map(lambda x: 0.3 * x + jnp.asarray(rng.normal(size=x.shape), jnp.float32), previous)
    theta = jnp.array([1.2, 0.7, 0.05])
    t_p, s_p, mu = 3.0, 4.0, 1.5
    gradient = np.asarray(server_hypergradient(theta, previous, t_p, s_p, g_hat, mu, 0.01))
    inner = float(tree_vdot(g_hat, previous))
    f = lambda th: float(server_alpha(jnp.asarray(th, jnp.float32), t_p, s_p, mu, 0.01)) * inner
    eps = 1e-2
    numeric = [(f(np.asarray(theta) + eps * e) - f(np.asarray(theta) - eps * e)) / (2 * eps) for e in np.eye(3)]
    np.testing.assert_allclose(gradient, numeric, rtol=2e-2, atol=1e-4)
    assert gradient[1] != 0  # s_p = 4: σ learns (ln s ≠ 0)
    # one step of server_update, and the sign check of spec §10.2: the next local update (u − w_o) in
    # the direction of the previous one (Δ_p) means the loss still fell along Δ_p: α must rise.
    zeros = jax.tree.map(jnp.zeros_like, previous)
    aligned = jax.tree.map(lambda d: -0.01 * d, previous)  # engine Δ = w_o − u = −(u − w_o)
    record = jnp.array([t_p, s_p, 1.0])
    lrs = jnp.array([0.1, 0.1, 0.1])
    new, alpha, _, new_previous, step = server_update(theta, record, previous, aligned, zeros, zeros, 5.0, 2.0, 0.01,
                                                      lrs, mu, 0.01)
    np.testing.assert_allclose(np.asarray(new), np.maximum(np.asarray(theta) - 0.1 * np.asarray(step), [0, -np.inf, 0]),
                               rtol=1e-6)
    assert float(new[0]) > float(theta[0]) and float(alpha) > float(server_alpha(theta, 5.0, 2.0, mu, 0.01))
    opposite = jax.tree.map(lambda d: 0.01 * d, previous)
    lowered, *_ = server_update(theta, record, previous, opposite, zeros, zeros, 5.0, 2.0, 0.01, lrs, mu, 0.01)
    assert float(lowered[0]) < float(theta[0])
    first_upload, *_ = server_update(theta, jnp.zeros(3), previous, aligned, zeros, zeros, 5.0, 2.0, 0.01, lrs, mu, 0.01)
    np.testing.assert_array_equal(np.asarray(first_upload), np.asarray(theta))  # no record: no update
    np.testing.assert_allclose(np.asarray(new_previous["b"]), np.asarray(-aligned["b"]))  # u − w_t with w_o = w_t = 0


def tiny_setup():
    model = nn.Dense(3)
    params = model.init(jax.random.key(0), jnp.zeros((1, 4)))
    rng = np.random.default_rng(1)
    data = FederatedArrays(jnp.asarray(rng.normal(size=(12, 4)), jnp.float32), jnp.asarray(rng.integers(0, 3, 12)))
    trainer = make_client_trainer(model.apply, optax.sgd(0.1), batch_size=3, preprocess=lambda x: x)
    fresh = jax.tree.map(lambda p: p + 0.3, params)
    return params, fresh, data, trainer


def test_device_hypergradient_matches_finite_differences():
    params, fresh, data, trainer = tiny_setup()
    view = ClientView(jnp.int32(6), jnp.int32(6))
    state = trainer.init(params, 5, jax.random.key(3))
    state = trainer.step(trainer.step(state, data, view), data, view)
    coefficients = jnp.array([1.0, 0.4])
    lrs = jnp.array([0.5, 0.5])
    mixed_state, new, info = device_mix(trainer.batch_loss, state, fresh, coefficients, 2.0, 6.0, True, data, view,
                                        1.0, lrs)
    loss = lambda c: float(trainer.batch_loss(mix(state.params, fresh, device_beta(jnp.asarray(c, jnp.float32), 6.0,
                                                                                   2.0, 1.0)), state, data, view))
    eps = 1e-2
    numeric = np.array([(loss(coefficients + eps * e) - loss(coefficients - eps * e)) / (2 * eps) for e in np.eye(2)])
    np.testing.assert_allclose(np.asarray(coefficients - new) / 0.5, numeric, rtol=2e-2, atol=1e-5)
    beta = float(device_beta(coefficients, 6.0, 2.0, 1.0))
    assert float(info["beta"]) == pytest.approx(beta)
    expected = mix(state.params, fresh, jnp.float32(beta))
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(mixed_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    assert float(info["loss_after_mix"]) == pytest.approx(loss(coefficients), rel=1e-5)
    untouched, same, _ = device_mix(trainer.batch_loss, state, fresh, coefficients, 2.0, 6.0, False, data, view, 1.0, lrs)
    np.testing.assert_array_equal(np.asarray(same), np.asarray(coefficients))


def test_engine_trains_to_the_fetch_mixes_and_trains_on():
    params, fresh, data, trainer = tiny_setup()
    hook = FreshModelMix(DeviceOptions(mu_beta=1.0, lr_gamma=0.5, lr_nu=0.5, gamma0=1.0, nu0=0.4))
    engine = Engine(trainer, params, data, np.array([0, 6]), np.array([6, 6]), make_server_optimizer("sgd"), seed=0,
                    plan=ExecutionPlan(clients_per_call=2, steps_per_call=2), keep_start_versions=True, hooks=[hook])
    mixing = DispatchRecord(id=0, client=1, version=0, steps=5, client_round=0, start_time=0.0, arrival_time=9.0,
                            fetch_step=2)
    plain = DispatchRecord(id=1, client=0, version=0, steps=5, client_round=0, start_time=0.0, arrival_time=9.0)
    engine.on_dispatch(mixing)
    engine.on_dispatch(plain)
    engine.flush()
    assert 1 in engine._results and 0 not in engine._results  # the mixing dispatch waits for its fetch
    engine._versions[1], engine.version = fresh, 1  # a global update happened meanwhile
    mixing.fetched, mixing.fetch_version = True, 1
    engine.on_fetch(mixing)
    engine.flush()
    # by hand: 2 steps from w_0, mix with β(γ0, ν0; g = 2, o = 1) (1-based versions), 3 more steps
    root = jax.random.fold_in(jax.random.key(0), TRAIN_STREAM)
    view = ClientView(jnp.int32(6), jnp.int32(6))
    state = trainer.init(params, 5, jax.random.fold_in(jax.random.fold_in(root, 1), 0))
    for _ in range(2):
        state = trainer.step(state, data, view)
    state, coefficients, _ = device_mix(trainer.batch_loss, state, fresh, jnp.array([1.0, 0.4]), 1.0, 2.0, True,
                                        data, view, 1.0, jnp.array([0.5, 0.5]))
    for _ in range(3):
        state = trainer.step(state, data, view)
    expected = jax.tree.map(jnp.subtract, params, state.params)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(engine.delta(mixing))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(engine.state["fedasmu_device"][1]), np.asarray(coefficients), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(engine.state["fedasmu_device"][0]), [1.0, 0.4])  # not mixed
    assert 0 < engine.client_metrics(0)["beta"] < 1
    assert engine.stats.useful_steps == 10
    assert 1 not in engine._version_users  # the fetched version is released once trained


def scheduled(time_per_step, **kwargs):
    options = dict(local_steps=10, client_lr=0.1, epochs=5, trigger_period=5.0, max_concurrency=2, slot="middle")
    options.update(kwargs)
    policy = FedASMU(**options)
    backend = RecordingBackend()
    rows = []
    sim = Simulation(policy, ScriptedSpeeds(time_per_step, num_clients=6, latency=0.5), [1 / 6] * 6, backend,
                     max_time=200.0, log=rows.append)
    sim.run()
    return sim, policy, backend, rows


def test_trigger_schedule_concurrency_fetch_times_and_staleness_bound():
    sim, policy, backend, rows = scheduled(lambda c, r: [0.5, 1.0, 1.5, 2.0, 3.0, 4.0][c])
    starts = sorted(r.start_time for r in sim.records)
    assert starts[:2] == [0.0, 5.0]  # one device per trigger
    assert all(t % 5.0 == 0 for t in starts)  # devices start only at trigger ticks
    events = sorted([(r.start_time, 1) for r in sim.records] + [(r.arrival_time, -1) for r in sim.records
                                                                 if r.arrival_time <= 200.0])
    running = np.cumsum([d for _, d in sorted(events, key=lambda e: (e[0], e[1]))])
    assert running.max() <= 2  # bounded concurrency
    fetches = [row for row in rows if row["event"] == "fetch"]
    assert fetches and any(row["detail"] == "fresh model" for row in fetches)
    for record in sim.records:
        assert record.fetch_step == 4  # middle slot: after epoch 2 of 5, 2 steps each
        step_time = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0][record.client]
        # request = start + one download (0.5) + 4 steps + the request latency (0.5); one more download charged
        fetch = [row for row in fetches if row["dispatch"] == record.id]
        if fetch:
            assert fetch[0]["time"] == pytest.approx(record.start_time + 0.5 + 4 * step_time + 0.5)
        assert record.arrival_time - record.start_time == pytest.approx(10 * step_time + 2 * 0.5 + 1.0)
    assert all(isinstance(a.payload, Upload) and a.mode == "mix" and not a.server_optimizer
               for a in backend.aggregations)
    client, t, s, step_size = backend.aggregations[0].payload
    assert (t, s, step_size) == (1.0, 1.0, 1.0)  # first upload: t = 1, fresh s = 1, η·K = 0.1 · 10
    bounded, *_ = scheduled(lambda c, r: [0.5, 1.0, 1.5, 2.0, 3.0, 4.0][c], staleness_bound=1, max_concurrency=3)
    assert bounded.accounting()["dropped_by_reason"].get("staleness bound", 0) > 0
    no_fetch, *_ = scheduled(lambda c, r: 1.0, fetch=False)
    assert all(r.fetch_step is None and r.arrival_time - r.start_time == pytest.approx(11.0) for r in no_fetch.records)


def test_slot_selectors():
    assert [FixedSlot(rule).choose(0, 5) for rule in ("first", "middle", "second_last")] == [1, 2, 4]
    selector = QLearningSlot(num_clients=2, epochs=5, seed=0, epsilon=0.0)
    assert selector.choose(0, 5) == 2  # first participation: the middle slot
    selector.feedback(0, 2, reward=-1.0)  # mixing at slot 2 hurt
    slots = [selector.choose(0, 5)]
    assert 1 <= slots[0] <= 4


def test_batched_equals_one_at_a_time_and_learns(small_config):
    options = {"epochs": 3, "max_concurrency": 4, "trigger_period": 0.3, "trigger_batch": 2, "lr_gamma": 0.1,
               "lr_nu": 0.1, "lr_lambda": 0.01}
    config = replace(small_config, algorithm="fedasmu", clients=6, local_steps=6, max_updates=10,
                     client_optimizer="sgd", client_lr=0.05, heterogeneity="exp", algorithm_options=options)
    single = run_experiment(replace(config, batching=False, run_name="single"))
    batched = run_experiment(replace(config, clients_per_call=2, run_name="batched"))
    assert events_without_wall_time(single.run_dir) == events_without_wall_time(batched.run_dir)
    for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(batched.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    assert batched.summary["mean_clients_per_batch"] > 1.0
    mixed = [m for m in batched.engine._client_metrics.values() if "beta" in m]
    assert mixed, "no upload mixed in a fresh global model"
    assert batched.summary["policy"]["fetches"] > 0
    assert batched.summary["final_accuracy"] > 0.3  # chance is 0.1


def test_the_hypergradient_divides_by_the_step_sizes_taken_with_a_decayed_rate():
    # ĝ = Δ/(η·K) took η at its start under --client-lr-decay: a device's k-th upload read d^k too small
    policy = FedASMU(local_steps=10, client_lr=0.1, epochs=5, trigger_period=5.0, max_concurrency=2, slot="middle")
    backend = RecordingBackend()
    sim = Simulation(policy, ScriptedSpeeds(lambda c, r: 0.5, num_clients=2, latency=0.5), [0.5] * 2, backend,
                     max_time=200.0, client_lr_decay=0.9)
    sim.run()
    records = {record.id: record for record in sim.records}
    assert len(backend.aggregations) > 4
    for aggregation in backend.aggregations:
        (dispatch, _), = aggregation.contributions
        record = records[dispatch]
        assert aggregation.payload.step_size == pytest.approx(0.1 * 0.9 ** record.client_round * 10)
    assert any(records[a.contributions[0][0]].client_round > 0 for a in backend.aggregations)


def test_fedasmu_fa_reads_no_slot_and_its_schedule_needs_no_model():
    from jaxfl.config import RunConfig, validate

    with pytest.warns(UserWarning, match=r"fedasmu.slot='second_last' is ignored: it is read only with "
                                         r"fedasmu.fetch on .* FedASMU-FA"):
        validate(RunConfig(algorithm="fedasmu", client_optimizer="sgd", timing_only=True,
                           algorithm_options={"fetch": False, "slot": "second_last"}))
    # no fetch, no reward for the learned slot: timing-only is the training run's schedule
    config = validate(RunConfig(algorithm="fedasmu", client_optimizer="sgd", timing_only=True,
                                algorithm_options={"fetch": False}))
    assert config.timing_only
    with pytest.warns(UserWarning, match="client_optimizer='adam': the server learns λ, σ, ι"):
        validate(RunConfig(algorithm="fedasmu", client_optimizer="adam"))
    # SGD with momentum: ĝ = Δ/(η·steps) about 4x the gradient at 0.9 and 10 steps, taken without a word
    with pytest.warns(UserWarning, match="client_momentum=0.9: the server learns λ, σ, ι"):
        validate(RunConfig(algorithm="fedasmu", client_optimizer="sgd", client_momentum=0.9))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(RunConfig(algorithm="fedasmu", client_optimizer="sgd"))  # the paper's plain SGD: no warning


def test_fedasmu_s_learned_weights_refuse_an_optax_object_whose_rate_they_cannot_read(tmp_path):
    """ĝ = Δ/(η·steps) read η from client_lr, which an optax object replaces: clients on
    optax.sgd(0.05) had every upload divided by the default 0.003. Refused before any folder is made;
    with the learning rates of λ, σ, ι at 0 (nothing learned from ĝ) the object is taken."""
    import optax

    from jaxfl import RunConfig, run_experiment
    from jaxfl.config import ConfigError

    config = RunConfig(algorithm="fedasmu", dataset="digits", model="logreg", clients=4, local_steps=4,
                       max_updates=2, progress=False, output_dir=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match=r"client_optimizer='<user: .*' is not allowed: a named optimiser with "
                                          r"FedASMU's learned weights: .*--client-optimizer sgd --client-lr η"):
        run_experiment(config, client_optimizer=optax.sgd(0.05))
    assert not (tmp_path / "runs").exists()
    frozen = dataclasses.replace(config, algorithm_options={"lr_lambda": 0.0, "lr_sigma": 0.0, "lr_iota": 0.0})
    assert run_experiment(frozen, client_optimizer=optax.sgd(0.05)).summary["global_updates"] == 2
