"""Hand-computed goldens for the aggregation kernels, staleness functions and server optimisers."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfl.kernels import (apply_server_update, constant, exponential, hinge, make_server_optimizer,
                           make_staleness, polynomial, weighted_mean, weighted_sum)


def test_weighted_sum_and_mean_by_hand():
    stacked = {"w": jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), "b": jnp.array([1.0, 0.0, -1.0])}
    weights = jnp.array([0.5, 0.25, 0.25])
    total = weighted_sum(stacked, weights)
    # w: 0.5*[1,2] + 0.25*[3,4] + 0.25*[5,6] = [0.5+0.75+1.25, 1+1+1.5]
    np.testing.assert_allclose(total["w"], [2.5, 3.5])
    np.testing.assert_allclose(total["b"], 0.5 - 0.25)
    # weights 2:1:1 normalise to the same numbers
    mean = weighted_mean(stacked, jnp.array([2.0, 1.0, 1.0]))
    np.testing.assert_allclose(mean["w"], [2.5, 3.5])


def test_weighted_sum_does_not_renormalise():
    stacked = {"x": jnp.array([2.0, 4.0])}
    assert float(weighted_sum(stacked, jnp.array([0.1, 0.1]))["x"]) == pytest.approx(0.6)


@pytest.mark.parametrize("s, expected", [(0, 0.9), (3, 0.45), (8, 0.3)])
def test_polynomial_staleness_golden(s, expected):
    # FedCompass App. E.2: 0.9 * (s + 1) ** -0.5
    assert polynomial(s) == pytest.approx(expected)
    assert float(polynomial(jnp.float32(s))) == pytest.approx(expected, rel=1e-6)


def test_polynomial_decreases_with_staleness():
    values = [polynomial(s) for s in range(10)]
    assert all(a > b for a, b in zip(values, values[1:]))


def test_hinge_exponential_constant_goldens():
    assert hinge(3, a=10, b=4) == 1.0
    assert hinge(6, a=10, b=4) == pytest.approx(1 / 21)
    assert float(hinge(jnp.array(6.0), a=10, b=4)) == pytest.approx(1 / 21)
    assert exponential(2, a=0.5) == pytest.approx(math.exp(-1.0))
    assert constant(7) == 1.0
    assert constant(7, alpha=0.5) == 0.5
    # st(∞) of a constant is α, not 0·∞ = NaN, for a number, a NumPy and a JAX array alike
    assert constant(math.inf, alpha=0.5) == 0.5 and type(constant(np.int64(3))) is float
    assert constant(np.array([0.0, np.inf])).tolist() == [1.0, 1.0]
    assert constant(jnp.array([[0.0, jnp.inf]]), alpha=0.5).tolist() == [[0.5, 0.5]]


def test_make_staleness_validates():
    assert make_staleness("polynomial", alpha=1.0, a=0.5)(3) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown staleness function 'cubic'"):
        make_staleness("cubic")
    with pytest.raises(ValueError, match="unknown"):
        make_staleness("constant", a=1.0)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        make_staleness("polynomial", alpha=0.0)


def test_server_sgd_is_plain_subtraction_and_momentum_accumulates():
    params = {"w": jnp.array([1.0, 1.0])}
    g = {"w": jnp.array([0.5, -1.0])}
    sgd = make_server_optimizer("sgd", 1.0)
    new, _ = apply_server_update(sgd, params, sgd.init(params), g)
    np.testing.assert_allclose(new["w"], [0.5, 2.0])
    # FedAvgM: v1 = g; w1 = w0 - g; v2 = 0.9 v1 + g; w2 = w1 - v2
    momentum = make_server_optimizer("sgd", 1.0, momentum=0.9)
    state = momentum.init(params)
    w1, state = apply_server_update(momentum, params, state, g)
    w2, state = apply_server_update(momentum, w1, state, g)
    np.testing.assert_allclose(w1["w"], [0.5, 2.0])
    np.testing.assert_allclose(w2["w"], np.array([0.5, 2.0]) - 1.9 * np.array([0.5, -1.0]), rtol=1e-6)


def test_fedopt_server_optimizers_exist_and_unknown_fails():
    params = {"w": jnp.zeros(3)}
    for name in ("adam", "yogi", "adagrad"):
        opt = make_server_optimizer(name, 0.01)
        new, _ = apply_server_update(opt, params, opt.init(params), {"w": jnp.ones(3)})
        assert np.all(np.asarray(new["w"]) < 0)
    with pytest.raises(ValueError, match="unknown server optimizer 'lamb'"):
        make_server_optimizer("lamb")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.int32])
def test_weighted_mean_normalises_narrow_weights_in_float32(dtype):
    """bfloat16 weights of 1/7 each summed to 1.002 in their own dtype: the mean of seven 100s was 99.80."""
    mean = weighted_mean({"x": jnp.full((7,), 100.0, jnp.float32)}, jnp.ones(7, dtype))
    assert float(mean["x"]) == 100.0


def test_server_update_refuses_a_pseudo_gradient_shaped_unlike_its_parameter():
    """The clients' still-stacked updates gave the global model a client axis, silently (optax broadcasts)."""
    params = {"w": jnp.ones(3)}
    opt = make_server_optimizer("adam", 0.01)
    with pytest.raises(ValueError, match=r"leaf \['w'\] has shape \(4, 3\), its parameter \(3,\).*still stacked"):
        apply_server_update(opt, params, opt.init(params), {"w": jnp.ones((4, 3))})
    with pytest.raises(ValueError, match=r"leaf \['w'\] has shape \(3, 1\)"):
        apply_server_update(opt, params, opt.init(params), {"w": jnp.ones((3, 1))})


def test_server_optimizer_refuses_options_it_would_ignore_and_learning_rates_it_cannot_use():
    """FedAdam "with momentum 0.9" was plain FedAdam; a schedule for FedAdam failed at the first update
    with a TypeError; a 0-d jax learning rate was refused and True accepted."""
    with pytest.raises(ValueError, match=r"momentum=0.9 is not allowed: leave it at its default 0.0, adam does not "
                                         r"read it \(read by sgd\)"):
        make_server_optimizer("adam", 0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"b1=0.1 .* sgd does not read it"):
        make_server_optimizer("sgd", 0.5, b1=0.1)
    with pytest.raises(ValueError, match=r"b2=0.5 .* adagrad does not read it"):
        make_server_optimizer("adagrad", 0.1, b2=0.5)
    with pytest.raises(ValueError, match=r"adam's update takes no schedule"):
        make_server_optimizer("adam", optax.linear_schedule(0.1, 0.01, 10))
    with pytest.raises(ValueError, match=r"learning_rate=True is not allowed"):
        make_server_optimizer("sgd", True)
    params = {"w": jnp.ones(2)}
    opt = make_server_optimizer("sgd", jnp.float32(0.1))
    assert apply_server_update(opt, params, opt.init(params), params)[0]["w"].tolist() == pytest.approx([0.9, 0.9])
    scheduled = make_server_optimizer("optax_adam", optax.linear_schedule(0.1, 0.01, 10))
    assert apply_server_update(scheduled, params, scheduled.init(params), params)[0]["w"].shape == (2,)


def test_weighted_mean_refuses_weights_that_sum_to_zero():
    # a silent NaN (and 0 for an integer leaf), where numpy's average says "Weights sum to zero"
    stacked = {"w": jnp.ones((2, 3)), "count": jnp.array([1, 2], jnp.int32)}
    with pytest.raises(ValueError, match="weighted_mean: the 2 weights sum to 0"):
        weighted_mean(stacked, jnp.zeros(2))
    with pytest.raises(ValueError, match="sum to 0"):
        weighted_mean(stacked, np.array([1.0, -1.0]))
    # the sum as the mean divides by it, in float32: in float64 it was 1e-10 and passed, giving NaN
    with pytest.raises(ValueError, match="the 2 weights sum to 0 in float32"):
        weighted_mean(stacked, [1.0, -1.0 + 1e-10])
    traced = jax.jit(weighted_mean)(stacked, jnp.zeros(2))  # under jit: the documented 0/0
    assert np.isnan(np.asarray(traced["w"])).all()


def test_set_rows_drops_a_negative_row_instead_of_writing_the_last_one():
    # -1 is a common padding id; numpy's indexing (and .at[] with mode="drop") takes it for the last row
    from jaxfl.kernels import ccfedavg
    from jaxfl.kernels.tree import set_rows

    bank = ccfedavg.init_bank({"w": jnp.zeros(2)}, 3)
    assert ccfedavg.store(bank, jnp.array([-1, 0]), {"w": jnp.ones((2, 2))})["w"].tolist() == \
        [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    assert set_rows(jnp.zeros((3, 1)), jnp.array([-1, 2]), jnp.ones((2, 1)), jnp.array([True, False])).tolist() == \
        [[0.0], [0.0], [0.0]]


def test_a_numpy_float64_stack_is_summed_without_jax_s_truncation_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Explicitly requested dtype float64 ... will be truncated", three of them
        mean = weighted_mean({"w": np.ones((2, 3))}, np.ones(2))["w"]
    assert mean.tolist() == [1.0, 1.0, 1.0] and mean.dtype == jnp.asarray(np.ones(1)).dtype


def test_out_of_domain_staleness_and_fednova_parameters_are_refused_by_name():
    from jaxfl.kernels.fednova import fednova_normalizer

    with pytest.raises(ValueError, match="staleness hinge threshold b must be >= 0 .* got -1"):
        make_staleness("hinge", b=-1)  # st(0) was 0.0909: a fresh update discounted
    with pytest.raises(ValueError, match="staleness hinge slope a must be >= 0"):
        make_staleness("hinge", a=-1.0)
    with pytest.raises(ValueError, match=r"momentum=1.0 is not allowed: SGD's momentum ρ in \[0, 1\)"):
        fednova_normalizer([3], momentum=1.0)  # was [nan]
    assert make_staleness("hinge", b=0)(0) == 1.0


def test_library_inputs_of_the_wrong_form_get_an_error_naming_them():
    import flax.linen as nn

    from jaxfl.kernels import ClientView, FederatedArrays, ccfedavg, local_train, make_client_trainer
    from jaxfl.models import ModelAdapter
    from jaxfl.scheduler import ClientSpeeds, SpeedConfig

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            return nn.Dense(3)(x.reshape((x.shape[0], -1)))

    adapter = ModelAdapter.from_linen(Net())
    data = FederatedArrays(jnp.zeros((4, 2, 2), jnp.uint8), jnp.zeros(4, jnp.int32))
    variables = adapter.init_variables(jax.random.key(0), data.x[:1])
    trainer = make_client_trainer(adapter, optax.sgd(0.1), 2)
    with pytest.raises(ValueError, match="takes the model's variables, .* not their 'params' part"):
        local_train(trainer, variables["params"], data, ClientView(0, 4), 1, jax.random.key(0), max_steps=1)  # KeyError
    with pytest.raises(ValueError, match=r"model_bytes=1000000.0 is not allowed: an integer"):
        ClientSpeeds(SpeedConfig(), 2, 0, model_bytes=1e6)  # "'float' object cannot be interpreted as an integer"
    bank = ccfedavg.init_bank({"w": jnp.zeros(2)}, 3)
    assert ccfedavg.bank_model_sum(bank, [0.1, 0.2, 0.7], {"w": jnp.ones(2)})["w"].tolist() == [1.0, 1.0]  # TypeError


def test_port_cosine_at_extreme_magnitudes():
    # float32's product of the squared norms underflowed (1e-12: cosine 1, not -1) or overflowed (1e10: 0, not 1)
    from jaxfl.kernels import port

    tiny, huge = jnp.full(4, 1e-12), jnp.full(4, 1e10)
    assert float(port.cosine({"w": tiny}, {"w": -tiny})) == pytest.approx(-1.0)
    assert float(port.cosine({"w": huge}, {"w": huge})) == pytest.approx(1.0)
    assert float(port.cosine({"w": jnp.zeros(2)}, {"w": jnp.ones(2)})) == 1.0  # no direction: as before
    # a NaN update is not "aligned" (it was 1, so a kernel user's NaN client got PORT's full interference weight)
    assert np.isnan(float(port.cosine({"w": jnp.array([jnp.nan, 1.0])}, {"w": jnp.ones(2)})))
    assert np.isnan(float(port.cosine({"w": jnp.ones(2)}, {"w": jnp.array([1.0, jnp.inf])})))
    u, g = {"w": jnp.array([1.0, 2.0, -3.0])}, {"w": jnp.array([0.5, -1.0, 2.0])}
    assert float(port.cosine(u, g)) == float(jnp.vdot(u["w"], g["w"]) / jnp.sqrt(14.0 * 5.25))  # bit for bit


def test_server_optimizer_hyperparameters_may_be_0d_arrays_as_the_learning_rate():
    # b1=jnp.float32(0.8) was refused ("a number in [0, 1)") where learning_rate=jnp.float32(0.1) was taken
    taken = make_server_optimizer("adam", jnp.float32(0.1), b1=jnp.float32(0.8), b2=np.float64(0.99),
                                  tau=jnp.float32(1e-3))
    given = make_server_optimizer("adam", float(jnp.float32(0.1)), b1=float(jnp.float32(0.8)), b2=0.99,
                                  tau=float(jnp.float32(1e-3)))  # the float32 values the arrays hold
    params, grads = {"w": jnp.array([1.0, -2.0])}, {"w": jnp.array([0.5, 0.25])}
    ours, theirs = taken.update(grads, taken.init(params), params)[0], given.update(grads, given.init(params), params)[0]
    assert ours["w"].tolist() == theirs["w"].tolist()
    with pytest.raises(ValueError, match=r"b1=1.0 is not allowed: a number in \[0, 1\), or a 0-d float array"):
        make_server_optimizer("adam", 0.1, b1=jnp.float32(1.0))
