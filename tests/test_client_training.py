"""Client optimisers as the seed papers' PyTorch code uses them (momentum, weight decay, a per-dispatch
learning-rate decay), local epochs (per-client step counts) and FedNova's normaliser for momentum
and proximal SGD: hand-computed goldens, the refusals, compilations and resume."""
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfl.algorithms.base import epoch_steps
from jaxfl.algorithms.wrappers import ClientSGD, StepNormalization
from jaxfl.cli import main
from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.experiment import make_client_optimizer, run_experiment, run_name
from jaxfl.kernels import ClientView, FederatedArrays, local_train, make_client_trainer
from jaxfl.kernels.fednova import fednova_coefficients, fednova_normalizer
from jaxfl.scheduler.simulation import DispatchRecord
from jaxfl.testing import check_algorithm
from tests.conftest import replace


def test_sgd_momentum_weight_decay_and_adamw_by_hand():
    """torch.optim.SGD: d = g + λw; b ← ρb + d (b₁ = d); w ← w − ηb. AdamW: the first Adam step is
    η·g/(|g| + ε), plus the decoupled ηλw."""
    w, g = jnp.array([2.0, -1.0]), jnp.array([0.5, 0.25])
    sgd = make_client_optimizer("sgd", 0.1, momentum=0.9, weight_decay=0.1)
    state, params, buffer = sgd.init(w), w, np.zeros(2)
    for _ in range(3):
        buffer = 0.9 * buffer + (np.asarray(g) + 0.1 * np.asarray(params))
        expected = np.asarray(params) - 0.1 * buffer
        updates, state = sgd.update(g, state, params)
        params = optax.apply_updates(params, updates)
        np.testing.assert_allclose(np.asarray(params), expected, rtol=1e-6)
    adamw = make_client_optimizer("adamw", 0.01, weight_decay=0.5)
    updates, _ = adamw.update(g, adamw.init(w), w)
    np.testing.assert_allclose(np.asarray(updates), -0.01 * (np.asarray(g) / (np.abs(g) + 1e-8) + 0.5 * np.asarray(w)),
                               rtol=1e-5, atol=1e-7)
    # Adam with weight decay is L2 (torch.optim.Adam(weight_decay=)): the decay goes through the moments
    adam = make_client_optimizer("adam", 0.01, weight_decay=0.5)
    updates, _ = adam.update(g, adam.init(w), w)
    l2 = np.asarray(g) + 0.5 * np.asarray(w)
    np.testing.assert_allclose(np.asarray(updates), -0.01 * l2 / (np.abs(l2) + 1e-8), rtol=1e-5, atol=1e-7)


def test_refusals_name_the_value_before_any_work(tmp_path, capsys):
    base = RunConfig(client_optimizer="sgd", output_dir=str(tmp_path / "runs"), progress=False)
    cases = [(dict(client_optimizer="adam", client_momentum=0.9), "client_momentum=0.9.*adam"),
             (dict(client_momentum=1.0), r"client_momentum=1.0.*\[0, 1\)"),
             (dict(client_weight_decay=-1e-4), "client_weight_decay"),
             (dict(client_lr_decay=0.0), r"client_lr_decay=0.0.*\(0, 1\]"),
             (dict(client_lr_decay=1.1), "client_lr_decay"),
             (dict(local_epochs=0.0), "local_epochs=0.0"),
             (dict(local_epochs=2.0, local_steps=20), "local_steps=20.*local_epochs=2"),
             (dict(algorithm="fedcompass", local_epochs=1.0), "local_epochs=1.0.*fedcompass.*fedavg"),
             (dict(fednova=True, client_optimizer="adamw"), "fednova=True.*adamw"),
             (dict(fednova=True, client_lr=0.5, prox_mu=2.0), "fednova=True.*>= 1")]
    for changes, message in cases:
        with pytest.raises(ConfigError, match=message):
            validate(replace(base, **changes))
    # an optax object carries its own momentum and decay: those fields would be ignored
    with pytest.raises(ValueError, match="client_momentum=0.9 is not read when client_optimizer= is an optax object"):
        run_experiment(replace(base, client_optimizer="adam", client_momentum=0.9), client_optimizer=optax.sgd(0.1))
    with pytest.raises(ValueError, match="client_weight_decay=0.0001 is not read"):
        run_experiment(replace(base, client_optimizer="adam", client_weight_decay=1e-4),
                       client_optimizer=optax.sgd(0.1))
    assert not os.path.exists(tmp_path / "runs")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--client-optimizer", "adam", "--client-momentum", "0.9", "--out", str(tmp_path / "cli")])
    assert exit_info.value.code == 2 and "client_momentum=0.9" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "cli")


def test_lr_scale_is_a_per_client_input_and_equals_a_smaller_learning_rate():
    """SGD with momentum: updates × s equals the optimiser built with lr · s (the decayed rate), and
    clients vmapped in one call train with their own scales."""
    model = nn.Dense(3)
    params = model.init(jax.random.key(0), jnp.zeros((1, 2)))
    data = FederatedArrays(jnp.array([[1.0, 2.0], [0.5, -1.0], [0.0, 1.0]]), jnp.array([0, 2, 1]))
    view = ClientView(jnp.int32(0), jnp.int32(3))
    scaled = make_client_trainer(model.apply, make_client_optimizer("sgd", 0.2, momentum=0.9), batch_size=2,
                                 preprocess=lambda x: x)
    smaller = make_client_trainer(model.apply, make_client_optimizer("sgd", 0.05, momentum=0.9), batch_size=2,
                                  preprocess=lambda x: x)

    def train(trainer, scale):
        state = trainer.init(params, 4, jax.random.key(1), lr_scale=scale)
        for _ in range(4):
            state = trainer.step(state, data, view)
        return trainer.finish(params, state)[0]

    reference = jax.jit(lambda: train(smaller, 1.0))()
    # two clients in one vmapped call, each with its own rate
    batched = jax.jit(jax.vmap(lambda scale: train(scaled, scale)))(jnp.array([1.0, 0.25]))
    for a, b in zip(jax.tree.leaves(batched), jax.tree.leaves(reference)):
        np.testing.assert_allclose(np.asarray(a[1]), np.asarray(b), rtol=1e-5, atol=1e-7)
        assert not np.allclose(np.asarray(a[0]), np.asarray(b))


def test_fednova_normalizer_by_hand():
    # momentum ρ = 0.5: a(τ) = [τ − ρ(1 − ρ^τ)/(1 − ρ)]/(1 − ρ): τ = 2 → 2.5, τ = 4 → 6.125
    np.testing.assert_allclose(fednova_normalizer([2, 4], momentum=0.5), [2.5, 6.125])
    np.testing.assert_allclose(fednova_normalizer([3, 5]), [3.0, 5.0])  # plain SGD: τ
    # proximal pull ηα = 0.2: [1 − 0.8^τ]/0.2
    np.testing.assert_allclose(fednova_normalizer([2, 4], learning_rate=0.1, pull=2.0), [1.8, 2.952])
    # two clients, p = (1/2, 1/2), τ = (2, 4), ρ = 0.5: τ_eff = (2.5 + 6.125)/2 = 4.3125,
    # c_i = ½ · 4.3125 / a_i = (0.8625, 0.35204…): the 4-step client no longer pulls 2.45× as hard
    records = [DispatchRecord(i, client=i, version=0, steps=s, client_round=0, start_time=0.0, arrival_time=1.0)
               for i, s in enumerate((2, 4))]
    hook = StepNormalization(always=True, sgd=ClientSGD(momentum=0.5, learning_rate=0.1))
    a = hook.effective_steps(records)
    np.testing.assert_allclose(a, [2.5, 6.125])
    np.testing.assert_allclose(fednova_coefficients([0.5, 0.5], a), [0.8625, 0.5 * 4.3125 / 6.125], rtol=1e-6)


@pytest.mark.parametrize("momentum,pull", [(0.9, 0.0), (0.0, 0.5), (0.9, 0.5)])
def test_fednova_normalizer_is_what_the_kernel_trains(momentum, pull):
    """With a constant gradient g the local update is exactly η‖a‖₁ g: a linear loss Σ logits on a
    tiny tree, SGD with momentum and a weight decay (pull) α, τ = 1, 3, 7 steps."""
    model = nn.Dense(2)
    params = model.init(jax.random.key(0), jnp.zeros((1, 2)))
    params = jax.tree.map(jnp.zeros_like, params)  # w_start = 0: weight decay acts as a proximal pull
    data = FederatedArrays(jnp.array([[1.0, 2.0], [1.0, 2.0]]), jnp.array([0, 1]))
    view = ClientView(jnp.int32(0), jnp.int32(2))
    eta = 0.1
    trainer = make_client_trainer(model.apply, make_client_optimizer("sgd", eta, momentum, weight_decay=pull),
                                  batch_size=2, preprocess=lambda x: x, loss=lambda logits, labels: logits.sum(-1))
    gradient = {"params": {"kernel": jnp.array([[1.0, 1.0], [2.0, 2.0]]), "bias": jnp.array([1.0, 1.0])}}
    for steps in (1, 3, 7):
        delta, _ = local_train(trainer, params, data, view, jnp.int32(steps), jax.random.key(1), max_steps=7)
        expected = fednova_normalizer([steps], momentum, eta, pull)[0]
        for d, g in zip(jax.tree.leaves(delta), jax.tree.leaves(gradient)):
            np.testing.assert_allclose(np.asarray(d) / (eta * np.asarray(g)), expected, rtol=1e-5)


def test_local_epochs_give_each_client_its_steps_and_fednova_reweights_the_round(small_config):
    """FedAvg, 3 clients of lognormal sizes, 0.05 epochs of batch 16: τ_i = ⌈0.05 n_i/16⌉, the rate
    halved per client round; FedNova
    reweights p_i to p_i τ_eff/τ_i exactly and changes the model; equal steps leave FedAvg as it is."""
    config = replace(small_config, algorithm="fedavg", clients=3, local_steps=50, client_sizes="lognormal",
                     local_epochs=0.05, batch_size=16, max_updates=2, client_optimizer="sgd", client_lr=0.05,
                     client_lr_decay=0.5)
    plain = run_experiment(replace(config, run_name="plain"))
    nova = run_experiment(replace(config, run_name="nova", fednova=True))
    counts = np.array(_client_samples(plain.run_dir))
    expected = epoch_steps(0.05, counts, 16)
    assert len(set(expected)) > 1, "the sizes must differ for this test to mean something"
    for result in (plain, nova):
        steps = {(r.client, r.steps) for r in result.simulation.records}
        assert steps == {(i, s) for i, s in enumerate(expected)}
        # ragged step counts share one program (a rolled loop, with finish in it)
        assert result.summary["compilations"]["run_and_finish"] == 1 and "run_steps" not in result.summary["compilations"]
        # the second round trains with half the rate: lr_scale = 0.5^(the client's round)
        assert all(r.lr_scale == 0.5 ** r.client_round for r in result.simulation.records)
        assert {r.client_round for r in result.simulation.records} >= {0, 1}
    assert "-e0.05-" in run_name(config)
    p = counts / counts.sum()
    tau_eff = float(np.sum(p * np.array(expected)))
    weights = {nova.simulation.records[d].client: c for d, c in nova.engine.last_weights.items()}
    np.testing.assert_allclose([weights[i] for i in range(3)], p * tau_eff / np.array(expected), rtol=1e-5)
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(nova.params)))


def _client_samples(run_dir):
    from jaxfl.runlog import load_run

    return load_run(run_dir).client_samples


def test_client_training_options_resume_bit_identically_with_one_program(tmp_path, monkeypatch):
    """FedBuff with per-client epochs, momentum, weight decay, a per-dispatch rate decay and FedNova:
    interrupted + resumed is bit-identical, and one program per call size however the rates and
    step counts differ (the run's last call holds only what its budget can still use: a size of its own)."""
    from jaxfl.engine import Engine

    train_batch, call_sizes = Engine._train_batch, set()

    def noting(engine, records):
        alone = len(records) == 1 and engine._home_only is not None
        call_sizes.add("one device" if alone else engine.plan.call_size(len(records)))
        return train_batch(engine, records)

    monkeypatch.setattr(Engine, "_train_batch", noting)
    report = check_algorithm("fedbuff", checks=("resume", "compilations"), output_dir=str(tmp_path),
                             local_steps=50, local_epochs=0.03, client_sizes="powerlaw", client_momentum=0.9,
                             client_weight_decay=1e-4, client_lr_decay=0.8, fednova=True)
    assert report["compilations"]["run_and_finish"] <= len(call_sizes) <= 2
    assert "run_steps" not in report["compilations"]


def test_a_part_epoch_s_steps_are_exact_for_large_clients():
    """⌈0.2 · 11,235,800 / 1⌉ is 2,247,160, but a fixed allowance of 1e-9 for floating-point error was
    smaller than the error at n / B ≈ 10^7: one step too many (351 of 200,000 random cases, all B = 1)."""
    from fractions import Fraction

    assert epoch_steps(3.2, [11_235_800], 1) == (3 * 11_235_800 + 2_247_160,)
    rng = np.random.default_rng(0)
    for epochs in (0.05, 0.1, 0.3, 1.5, 2.7, 3.2):
        counts = rng.integers(1, 10**8, size=200)
        for batch in (1, 7, 64):
            exact = Fraction(str(epochs))
            expected = tuple(max(1, int(exact // 1) * -(-int(n) // batch)
                                 + -(-(exact - exact // 1) * int(n) // batch)) for n in counts)
            assert epoch_steps(epochs, counts, batch) == expected


def test_local_train_compiles_once_whatever_integers_the_view_holds():
    # a view of Python ints, then NumPy's, then jax's int32: three programs before
    from jaxfl.kernels.client import _local_train

    trainer = make_client_trainer(lambda p, x: x @ p, optax.sgd(0.1), batch_size=2, preprocess=lambda x: x)
    data = FederatedArrays(jnp.ones((6, 4)), jnp.array([0, 1, 2, 0, 1, 2]))
    before = _local_train._cache_size()
    for view in (ClientView(0, 4), ClientView(np.int32(0), np.int64(4)), ClientView(jnp.int32(0), jnp.int32(4))):
        local_train(trainer, jnp.zeros((4, 3)), data, view, 2, jax.random.key(0), max_steps=3)
    assert _local_train._cache_size() - before == 1
