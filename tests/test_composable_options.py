"""FedProx (proximal term in the client kernel), FedNova (normalised averaging) and FedOpt (adaptive
server optimisers): hand-computed goldens and the zero-setting identities."""
import re
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfl.cli import main
from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.experiment import prepare, run_experiment
from jaxfl.kernels import ClientView, FederatedArrays, local_train, make_client_trainer
from jaxfl.kernels.fednova import fednova_coefficients
from tests.conftest import replace


def linear_setup():
    model = nn.Dense(3)
    params = model.init(jax.random.key(0), jnp.zeros((1, 2)))
    data = FederatedArrays(jnp.array([[1.0, 2.0], [0.5, -1.0]]), jnp.array([0, 2]))
    return model, params, data, ClientView(jnp.int32(0), jnp.int32(2))


def test_prox_zero_is_exactly_no_prox():
    model, params, data, view = linear_setup()
    plain = make_client_trainer(model.apply, optax.adam(0.1), batch_size=1, preprocess=lambda x: x)
    zero = make_client_trainer(model.apply, optax.adam(0.1), batch_size=1, preprocess=lambda x: x,
                               prox_mu=0.0)
    assert zero.init(params, 3, jax.random.key(1)).anchor is None  # no anchor carried: the same kernel
    a, _ = local_train(plain, params, data, view, jnp.int32(5), jax.random.key(1), max_steps=5)
    b, _ = local_train(zero, params, data, view, jnp.int32(5), jax.random.key(1), max_steps=5)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(ValueError, match="prox_mu"):
        make_client_trainer(model.apply, optax.sgd(0.1), batch_size=1, prox_mu=-1.0)


def test_prox_one_step_by_hand():
    """One SGD step on both samples (batch 2) with anchor a ≠ w:
    w1 = w0 − η (∇f(w0) + μ (w0 − a)),  ∇_W f = Xᵀ(softmax(XW + b) − Y)/2,  ∇_b f = mean(softmax − Y)."""
    model, params, data, view = linear_setup()
    eta, mu = 0.1, 0.5
    trainer = make_client_trainer(model.apply, optax.sgd(eta), batch_size=2, preprocess=lambda x: x,
                                  prox_mu=mu)
    anchor = jax.tree.map(lambda p: p + 1.0, params)
    state = trainer.init(params, 1, jax.random.key(2), anchor=anchor)
    state = trainer.step(state, data, view)
    W = np.asarray(params["params"]["kernel"], np.float64)
    b = np.asarray(params["params"]["bias"], np.float64)
    X = np.array([[1.0, 2.0], [0.5, -1.0]])
    Y = np.eye(3)[[0, 2]]
    z = X @ W + b
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    grad_W = X.T @ (p - Y) / 2 + mu * (W - (W + 1.0))  # the prox pull is −μ per entry here
    grad_b = (p - Y).mean(axis=0) + mu * (b - (b + 1.0))
    np.testing.assert_allclose(np.asarray(state.params["params"]["kernel"]), W - eta * grad_W, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state.params["params"]["bias"]), b - eta * grad_b, rtol=1e-5, atol=1e-6)
    # the default anchor is the start model: then the first step has no pull at all
    no_pull = trainer.step(trainer.init(params, 1, jax.random.key(2)), data, view)
    plain = make_client_trainer(model.apply, optax.sgd(eta), batch_size=2, preprocess=lambda x: x)
    reference = plain.step(plain.init(params, 1, jax.random.key(2)), data, view)
    for x, y in zip(jax.tree.leaves(no_pull.params), jax.tree.leaves(reference.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)


def test_fednova_coefficients_by_hand():
    # c = (0.5, 0.3, 0.2), τ = (10, 20, 40): τ_eff = 5 + 6 + 8 = 19; c' = c τ_eff/τ = (0.95, 0.285, 0.095)
    np.testing.assert_allclose(fednova_coefficients([0.5, 0.3, 0.2], [10, 20, 40]), [0.95, 0.285, 0.095], rtol=1e-6)
    np.testing.assert_array_equal(fednova_coefficients([0.25, 0.75], [7, 7]), [0.25, 0.75])  # equal steps: FedAvg
    np.testing.assert_array_equal(fednova_coefficients([0.0, 0.0], [3, 9]), [0.0, 0.0])  # Σ c = 0: unchanged
    # padding entries (c = 0) change nothing, and the kernel jits
    padded = jax.jit(fednova_coefficients)(jnp.array([0.5, 0.3, 0.2, 0.0]), jnp.array([10, 20, 40, 1]))
    np.testing.assert_allclose(padded, [0.95, 0.285, 0.095, 0.0], rtol=1e-6)
    # τ_eff weighted by given weights (FedCompass+N: p_i): p = (1, 3), τ = (2, 6) → τ_eff = 5
    np.testing.assert_allclose(fednova_coefficients([0.2, 0.4], [2, 6], [1.0, 3.0]), [0.5, 1 / 3], rtol=1e-6)


def test_fednova_in_the_engine_and_the_cc_fednova_baseline(small_config):
    # CC-FedAvg's FedNova baseline: every client trains ceil(p_i K) steps, K = 4, p = (1, 1/2, 1/4, 1/8)
    result = run_experiment(replace(small_config, algorithm="ccfedavg", clients=4,
                                    local_steps=4, max_updates=2, algorithm_options={"strategy": "fednova"}))
    records = [r for r in result.simulation.records if r.aggregated_in == 2]
    assert sorted((r.client, r.steps) for r in records) == [(0, 4), (1, 2), (2, 1), (3, 1)]
    # equal data shares 1/4: τ_eff = 2, c'_i = 0.25 · 2 / τ_i = (0.125, 0.25, 0.5, 0.5)
    weights = {result.simulation.records[d].client: c for d, c in result.engine.last_weights.items()}
    np.testing.assert_allclose([weights[i] for i in range(4)], [0.125, 0.25, 0.5, 0.5], rtol=1e-6)
    with pytest.raises(ConfigError, match="fednova=True"):
        validate(RunConfig(algorithm="fedcompass_n", fednova=True))


def test_fedadam_first_step_by_hand_and_fednova_option_with_equal_steps_is_fedavg(small_config):
    """FedAdam's first server step (Reddi et al., Algorithm 2, no bias correction): m = (1 − β1) g,
    v = β2 τ² + (1 − β2) g², w1 = w0 − η m/(√v + τ) with η = 10⁻², β1 = 0.9, β2 = 0.99, τ = 10⁻³ and
    g = FedAvg's pseudo-gradient w0 − w1_FedAvg."""
    common = dict(clients=4, max_updates=1, client_optimizer="sgd", client_lr=0.05)
    fedavg = run_experiment(replace(small_config, algorithm="fedavg", run_name="avg", **common))
    fedadam = run_experiment(replace(small_config, algorithm="fedadam", run_name="adam", **common))
    nova = run_experiment(replace(small_config, algorithm="fedavg", fednova=True, run_name="nova", **common))
    w0 = prepare(replace(small_config, algorithm="fedavg", **common))[4]
    for start, avg, adam, normalised in zip(*(jax.tree.leaves(t) for t in (w0, fedavg.params, fedadam.params,
                                                                            nova.params))):
        g = np.asarray(start, np.float64) - np.asarray(avg, np.float64)
        expected = np.asarray(start) - 1e-2 * 0.1 * g / (np.sqrt(0.99e-6 + 0.01 * g * g) + 1e-3)
        np.testing.assert_allclose(np.asarray(adam), expected, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(np.asarray(normalised), np.asarray(avg), rtol=0, atol=1e-7)


def test_fedopt_names_and_server_optimizer_option():
    assert (validate(RunConfig(algorithm="fedyogi")).server_optimizer, validate(RunConfig(algorithm="fedyogi")).server_lr) \
        == ("yogi", 1e-2)
    assert validate(RunConfig(algorithm="fedadagrad")).server_lr == 1e-1
    assert validate(RunConfig(algorithm="fedadam", server_lr=0.03)).server_lr == 0.03  # an explicit rate wins
    assert validate(RunConfig(algorithm="fedbuff", server_optimizer="adam")).server_lr == 1e-2
    assert validate(RunConfig(algorithm="fedavg")).server_lr == 1.0
    with pytest.raises(ConfigError, match="server_optimizer='yogi'"):
        validate(RunConfig(algorithm="fedadam", server_optimizer="yogi"))
    with pytest.raises(ConfigError, match="prox_mu=-0.1"):
        validate(RunConfig(prox_mu=-0.1))


def test_cli_runs_the_new_algorithms(tmp_path, capsys):
    code = main(["run", "--algorithm", "fedasmu,fedyogi", "--model", "mlp", "--clients", "4",
                 "--local-steps", "4", "--batch-size", "16", "--max-updates", "2", "--no-progress",
                 "--fedasmu-max-concurrency", "2", "--prox-mu", "0.01", "--checkpoint-every", "none",
                 "--output-dir", str(tmp_path)])
    assert code in (0, None)
    out = capsys.readouterr().out
    for name in ("fedasmu", "fedyogi"):
        assert name in out


def test_fednova_is_refused_where_it_would_change_nothing():
    """FedAsync aggregates one update at a time (FedNova's coefficient is then 1) and FedBuff's rule
    plato averages models: ``fednova=True`` was accepted there, recorded in config.json, and the run
    was bit-identical to one without it."""
    for kwargs in ({"algorithm": "fedasync"}, {"algorithm": "fedasync", "rule": "plato"},
                   {"algorithm": "fedasync", "rule": "paper"}, {"algorithm": "fedbuff", "rule": "plato"}):
        with pytest.raises(ConfigError, match=rf"fednova=True is not allowed: leave it false for {kwargs['algorithm']}"):
            validate(RunConfig(fednova=True, client_optimizer="sgd", **kwargs))
    for rule in (None, "paper", "fedcompass"):
        assert validate(RunConfig(algorithm="fedbuff", rule=rule, fednova=True, client_optimizer="sgd")).fednova


def test_fednova_is_refused_before_the_client_optimiser_where_the_algorithm_never_reads_it():
    """validate(RunConfig(algorithm="fedasync", fednova=True)) asked for client_optimizer sgd first
    (the default is adam), and only with sgd said that fedasync never reads fednova."""
    with pytest.raises(ConfigError, match="fednova=True is not allowed: leave it false for fedasync"):
        validate(RunConfig(algorithm="fedasync", fednova=True))


@pytest.mark.parametrize("strategy", ["cc", "strategy2", "cc_c"])
def test_fednova_is_refused_for_cc_fedavg_strategies_that_re_send_banked_updates(strategy):
    """CC-FedAvg with fednova=True normalised the clients that trained (τ_eff from them alone) and
    added the skipping clients' banked updates at their raw weight: a banked 12-step update pulled
    34 % harder than FedNova over the round allows."""
    with pytest.raises(ConfigError, match=rf"fednova=True is not allowed: leave it false with cc.strategy "
                                          rf"'{strategy}': its skipping clients re-send banked updates"):
        validate(RunConfig(algorithm="ccfedavg", fednova=True, client_optimizer="sgd",
                           algorithm_options={"strategy": strategy}))
    for allowed in ("strategy1", "dropout", "fednova"):  # nothing banked: every update is this round's
        assert validate(RunConfig(algorithm="ccfedavg", fednova=True, client_optimizer="sgd",
                                  algorithm_options={"strategy": allowed})).fednova


@pytest.mark.parametrize("options, ignored", [
    ({"fetch": False, "mu_beta": 2.0}, "fedasmu.mu_beta=2.0 is ignored: it is read only with fedasmu.fetch on"),
    ({"fetch": False, "gamma0": 3.0}, "fedasmu.gamma0=3.0 is ignored: it is read only with fedasmu.fetch on"),
    ({"dynamic": False, "lr_lambda": 0.5}, "fedasmu.lr_lambda=0.5 is ignored: it is read only with fedasmu.dynamic on"),
])
def test_fedasmu_settings_of_a_switched_off_part_are_said_to_be_ignored(options, ignored):
    """FedASMU-FA (no fetch) has no fresh-model weight β(γ, ν), FedASMU-DA (no dynamic) learns no
    weights: their settings changed nothing, without a word (identical results)."""
    with pytest.warns(UserWarning, match=re.escape(ignored)):
        validate(RunConfig(algorithm="fedasmu", algorithm_options={"slot": "first", **options}))
    with warnings.catch_warnings():  # (with SGD clients: Adam's own note, the hypergradient's, aside)
        warnings.simplefilter("error")
        validate(RunConfig(algorithm="fedasmu", client_optimizer="sgd",
                           algorithm_options={"slot": "first", "mu_beta": 2.0, "lr_lambda": 0.5}))


def test_port_settings_that_cannot_act_are_said_to_be_ignored():
    """β = 0 switches PORT's cosine term off and Ω = inf never pulls a client: their settings were
    accepted without a word. A preset's own values (plato's cosine) are not the user's: no note."""
    with pytest.warns(UserWarning, match=r"port.cosine='current' is ignored: port.beta=0 switches the cosine term off"):
        validate(RunConfig(algorithm="port", algorithm_options={"beta": 0, "cosine": "current"}))
    with pytest.warns(UserWarning, match=r"port.pull_steps=2 is ignored: with port.staleness_bound=inf"):
        validate(RunConfig(algorithm="port", algorithm_options={"staleness_bound": float("inf"), "pull_steps": 2}))
    # the bound's rule and the urgent pull neither (they ran without a word)
    with pytest.warns(UserWarning, match=r"port.bound_rule='exceeds', port.urgent_pull=False are ignored: with "
                                         r"port.staleness_bound=inf no client is ever too stale"):
        validate(RunConfig(algorithm="port", algorithm_options={"staleness_bound": float("inf"),
                                                                 "bound_rule": "exceeds", "urgent_pull": False}))
    with warnings.catch_warnings():  # plato's own rule and no pull under inf: the preset's values, no note
        warnings.simplefilter("error")
        validate(RunConfig(algorithm="port", algorithm_options={"staleness_bound": float("inf"), "preset": "plato"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(RunConfig(algorithm="port", algorithm_options={"beta": 0, "preset": "plato"}))
        validate(RunConfig(algorithm="port", algorithm_options={"cosine": "current", "pull_steps": 2,
                                                                 "urgent_pull": True}))


def test_fednova_in_a_comparison_or_sweep_goes_to_the_algorithms_it_normalises(tmp_path, capsys):
    """``--algorithm fedbuff,fedasmu --fednova`` was refused outright; other shared settings go to
    the algorithms that read them, with a note, as FedNova now does."""
    from jaxfl.sweep import expand

    common = ["--fednova", "--client-optimizer", "sgd", "--model", "logreg", "--clients", "4", "--max-updates", "1",
              "--local-steps", "5", "--timing-only", "--no-progress", "--out", str(tmp_path)]
    assert main(["run", "--algorithm", "fedbuff,fedasync", *common]) == 0
    assert "note: fednova=True applies to fedbuff only (fedasync does not read it)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--algorithm", "fedasync", *common])
    assert "fednova=True is not allowed with algorithm fedasync: it never reads it (read only by fedavg" in \
        capsys.readouterr().err
    cells, notes = expand({"fednova": True, "client_optimizer": "sgd"}, {"algorithm": ["fedbuff", "fedasync"]}, "x")
    assert [cell.config.fednova for cell in cells] == [True, False]
    assert notes == ["fednova applies only to the cells that read it (algorithm=fedbuff)"]


def test_a_comparison_s_setting_is_routed_by_the_options_given(tmp_path, capsys):
    """FedASMU reads client_weights only with its learned slot: with ``--fedasmu.slot first`` the
    note said the setting applied to FedASMU, and the next line refused it as read by FedASMU never."""
    common = ["--fedasmu.slot", "first", "--client-weights", "uniform", "--model", "logreg", "--clients", "4",
              "--max-updates", "1", "--local-steps", "5", "--timing-only", "--no-progress", "--out", str(tmp_path)]
    with pytest.raises(SystemExit):
        main(["run", "--algorithm", "fedbuff,fedasmu", *common])
    err = capsys.readouterr().err
    assert "note:" not in err and "none of them reads it" in err
    assert main(["run", "--algorithm", "fedbuff,fedasmu", "--rule", "fedcompass", *common]) == 0
    assert "client_weights='uniform' applies to fedbuff only (fedasmu does not read it)" in capsys.readouterr().err
