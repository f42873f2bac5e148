"""jaxfl's kernels called by other JAX code (a review of them as a library): traced weights given as a
list, dtypes kept, keyword arguments, labels of the wrong rank, cosines of vectors far from 1 in size."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfl.kernels import ClientView, FederatedArrays, local_train, make_client_trainer, weighted_mean
from jaxfl.kernels import ccfedavg, fedasmu, fedat, port
from jaxfl.kernels.cpu_ops import cpu_friendly
from jaxfl.kernels.fednova import fednova_coefficients
from jaxfl.kernels.tree import tree_add
from jaxfl.scheduler.staleness import constant

STACK = {"w": jnp.arange(4.0).reshape(2, 2)}


def test_weights_given_as_a_list_of_traced_values_work_as_eagerly():
    # the zero-sum check ran np.asarray on the list of tracers: TracerArrayConversionError under jit and grad
    eager = weighted_mean(STACK, [1.0, 3.0])["w"]
    assert jax.jit(weighted_mean)(STACK, [1.0, 3.0])["w"].tolist() == eager.tolist()
    # Σ_w of (a·[0, 1] + [2, 3]) / (a + 1) = (a + 5)/(a + 1), whose derivative is −4/(a + 1)²: −1 at a = 1
    gradient = jax.grad(lambda a: weighted_mean(STACK, [a, 1.0])["w"].sum())(1.0)
    assert float(gradient) == pytest.approx(-1.0)
    traced_steps = jax.jit(lambda a: fednova_coefficients(jnp.array([0.5, 0.5]), [a, 40.0]))(10.0)
    assert traced_steps.tolist() == fednova_coefficients(jnp.array([0.5, 0.5]), jnp.array([10, 40])).tolist()
    with pytest.raises(ValueError, match=r"steps has shape \(3,\) but coefficients \(2,\)"):
        fednova_coefficients(jnp.array([0.5, 0.5]), [1, 2, 3])


def test_constant_staleness_keeps_the_staleness_dtype_under_x64():
    s = jnp.array([0.0, 3.0], jnp.float32)
    with jax.enable_x64(True):
        assert constant(s).dtype == jnp.float32 == jnp.asarray(s + 1.0).dtype
        assert constant(jnp.array([2, 5])).tolist() == [1.0, 1.0]


def test_cpu_friendly_takes_the_keyword_arguments_the_function_takes():
    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            x = nn.Conv(4, (3, 3), padding="VALID")(x)
            return nn.Dropout(0.5, deterministic=not train)(x)

    net = Net()
    x = jax.random.normal(jax.random.key(1), (2, 6, 6, 1))
    params = net.init(jax.random.key(0), x)
    plain = net.apply(params, x, train=False)
    assert jnp.allclose(cpu_friendly(net.apply)(params, x, train=False), plain, atol=1e-5)


def test_labels_of_another_rank_are_refused_by_the_default_loss_by_name():
    model = nn.Dense(3)
    params = model.init(jax.random.key(0), jnp.zeros((1, 4)))
    trainer = make_client_trainer(model.apply, optax.sgd(0.1), batch_size=2, preprocess=lambda x: x)
    data = FederatedArrays(jnp.ones((4, 4)), jnp.array([[0], [1], [2], [0]]))
    with pytest.raises(ValueError, match=r"labels of shape \(2, 1\) for logits of shape \(2, 3\): the default loss "
                                         r"takes one integer class per example, labels of the logits' shape without "
                                         r"their last axis"):
        local_train(trainer, params, data, ClientView(0, 4), 1, jax.random.key(1), max_steps=1)


@pytest.mark.parametrize("u, g, expected", [
    ([-1e-25], [1e-25], -1.0),           # the squared norms underflowed: "zero", so 1
    ([1e30, 0.0], [1e30, 1e30], 2 ** -0.5),  # they overflowed: NaN
    ([1e38, 0.5e38], [1e38, -0.5e38], 0.6),  # divided by its largest entry, whose reciprocal XLA flushed: NaN
    ([1.0, 2.0, -3.0], [0.5, -1.0, 2.0], -7.5 / (14 * 5.25) ** 0.5),
])
def test_port_cosine_far_from_unit_size(u, g, expected):
    u, g = {"w": jnp.array(u, jnp.float32)}, {"w": jnp.array(g, jnp.float32)}
    assert float(port.cosine(u, g)) == pytest.approx(expected, rel=1e-6)
    assert float(jax.jit(port.cosine)(u, g)) == pytest.approx(expected, rel=1e-6)
    # as the engine computes them: vmapped over an aggregation's updates (u_k = −Δ_k), the scaled form where needed
    stacked = {"w": -jnp.stack([u["w"], jnp.ones_like(u["w"])])}
    _, cosines = port.port_coefficients(stacked, stacked, g, g, jnp.zeros(2), jnp.ones(2), jnp.zeros(2, bool),
                                        jnp.ones(2, bool))
    assert float(cosines[0]) == pytest.approx(expected, rel=1e-6)


def test_port_coefficients_without_a_padding_mask_weigh_every_row():
    # valid was required: a caller without padding had to build an all-True mask to call it
    stacked, g = {"w": jnp.array([[-1.0, 0.0], [0.0, -1.0]])}, {"w": jnp.array([1.0, 0.0])}
    args = (stacked, stacked, {"w": jnp.zeros(2)}, g, jnp.zeros(2), jnp.ones(2), jnp.zeros(2, bool))
    unmasked, masked = port.port_coefficients(*args), port.port_coefficients(*args, jnp.ones(2, bool))
    assert [np.asarray(x).tolist() for x in unmasked] == [np.asarray(x).tolist() for x in masked]
    p, _ = port.port_coefficients(*args, definition="own")
    assert float(p.sum()) == pytest.approx(1.0)


def test_port_cosine_of_ordinary_vectors_is_the_plain_formula_bit_for_bit():
    # the scaled form is computed only where float32 cannot hold the plain one (it cost 5-20x a PORT aggregation)
    rng = np.random.default_rng(0)
    for _ in range(20):
        u, g = (rng.normal(size=7).astype(np.float32) * 10.0 ** rng.uniform(-3, 3) for _ in range(2))
        plain = jnp.vdot(u, g) / jnp.sqrt(jnp.vdot(u, u) * jnp.vdot(g, g))
        assert np.asarray(port.cosine({"w": u}, {"w": g})).tobytes() == np.asarray(plain).tobytes()


# a second review (2026-12-06): one compilation per shape outside a jit, no precision lost to an early
# rounding, and no silent broadcast or mispairing of the trees a kernel combines
def test_port_and_fedat_kernels_compile_once_per_shape_when_called_eagerly(caplog):
    # each call compiled again: 0.2-0.3 s a call of a cosine in a Python loop
    import logging

    u, g = {"a": jnp.ones(3)}, {"a": jnp.arange(3.0)}
    stacked = {"w": jnp.array([[-1.0, 0.0], [0.0, -1.0]])}

    def calls(shift):
        cos_value = float(port.cosine(u, {"a": g["a"] + shift}))
        p, cos = port.port_coefficients(jax.tree.map(lambda x: (1 + shift) * x, stacked), {"w": jnp.zeros((2, 2))},
                                        {"w": jnp.zeros(2)}, {"w": jnp.array([1.0, 0.0])}, jnp.zeros(2), jnp.ones(2),
                                        jnp.array([False, False]), jnp.array([True, True]))
        tier_model, _ = fedat.tier_update({"w": jnp.array([1.0])}, ({"w": jnp.array([4.0 + shift])},),
                                          jnp.array([0, 0]), jnp.array([0.5, 0.5]), jnp.int32(2), None,
                                          ({"w": jnp.array([0.0])}, {"w": jnp.array([9.0])}), jnp.int32(0),
                                          jnp.array([0.75, 0.25]), jnp.uint32(0))
        return cos_value, cos.tolist(), [round(float(x), 4) for x in p], tier_model["w"].tolist()

    assert calls(0.0) == (pytest.approx(3 / (3 ** 0.5 * 5 ** 0.5)), [1.0, 0.0], [0.6667, 0.3333], [3.0])
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        assert [calls(shift)[3] for shift in (1.0, 2.0, 3.0)] == [[4.0], [5.0], [6.0]]
    assert not [record.getMessage() for record in caplog.records if "Compiling" in record.getMessage()]


def test_a_bfloat16_bank_model_sum_keeps_a_difference_below_the_sums_last_bit():
    # Σ w x rounded to bfloat16 first, then total·current subtracted: 0 where the answer is -2^-8
    out = ccfedavg.bank_model_sum({"w": jnp.array([[1.0078125], [1.0]], jnp.bfloat16)}, jnp.array([0.5, 0.5]),
                                  {"w": jnp.array([1.0], jnp.bfloat16)})
    assert out["w"].dtype == jnp.bfloat16 and out["w"].tolist() == [-0.00390625]


def test_a_mixed_fresh_model_keeps_the_local_models_dtype():
    mixed = fedasmu.mix({"w": jnp.ones(2, jnp.bfloat16)}, {"w": jnp.zeros(2, jnp.float32)}, 0.25)
    assert mixed["w"].dtype == jnp.bfloat16 and mixed["w"].tolist() == [0.75, 0.75]


def test_kernels_refuse_trees_that_would_broadcast_or_pair_other_leaves_naming_the_leaf():
    one, stack = {"w": jnp.ones(2)}, {"w": jnp.ones((3, 2))}
    with pytest.raises(ValueError, match=r"tree_add: leaf \['w'\] has shape \(2,\) in a and \(3, 2\) in b"):
        tree_add(one, stack)
    with pytest.raises(ValueError, match=r"mix: leaf \['w'\] has shape \(2,\) in local and \(3, 2\) in fresh"):
        fedasmu.mix(one, stack, 0.25)
    with pytest.raises(ValueError, match=r"set_rows: leaf \['w'\] of values has shape \(2,\): 2 rows of shape \(2,\)"):
        ccfedavg.store(ccfedavg.init_bank(one, 3), jnp.array([0, 2]), {"w": jnp.array([7.0, 8.0])})
    with pytest.raises(ValueError, match=r"bank_model_sum: leaf \['w'\] has shape \(2,\) in current and \(3, 3, 2\) "
                                         r"in models \(after its leading axis of rows\)"):
        ccfedavg.bank_model_sum({"w": jnp.zeros((3, 3, 2))}, jnp.ones(3), one)
    with pytest.raises(ValueError, match=r"estimation_error: leaf \['b'\] of estimates meets leaf \['c'\] of truths"):
        ccfedavg.estimation_error({"a": jnp.ones((1, 2)), "b": jnp.ones((1, 2))},
                                  {"a": jnp.ones((1, 2)), "c": jnp.ones((1, 2))})
    with pytest.raises(ValueError, match=r"estimation_error: leaf \['w'\] has shape \(1, 2\) in estimates and \(3, 2\)"):
        ccfedavg.estimation_error({"w": jnp.zeros((1, 2))}, {"w": jnp.ones((3, 2))})
    with pytest.raises(ValueError, match=r"server_update: leaf \['w'\] has shape \(2,\) in start and \(5, 2\) in "
                                         r"previous_delta"):
        fedasmu.server_update(jnp.array([1.0, 0.5, 0.0]), jnp.array([4.0, 2.0, 1.0]), {"w": jnp.zeros((5, 2))}, one,
                              one, one, 5.0, 1.0, 1.0, jnp.full(3, 0.1), 1.0, 0.0)
    with pytest.raises(ValueError, match=r"port_coefficients: leaf \['w'\] has shape \(2,\) in current and \(2,\) in "
                                         r"deltas \(after its leading axis of rows\)"):
        port.port_coefficients({"w": jnp.ones(2)}, {"w": jnp.ones(2)}, one, one, jnp.zeros(2), jnp.ones(2),
                               jnp.array([False, False]))


def test_the_smaller_library_edges_of_the_second_review_are_named_or_kept():
    import optax

    from jaxfl.kernels import fedopt
    from jaxfl.kernels.aggregation import apply_server_update, make_server_optimizer, weighted_sum
    from jaxfl.kernels.tree import stacked_zeros, tree_bytes, tree_vdot
    from jaxfl.scheduler.staleness import exponential, polynomial

    opt = make_server_optimizer("sgd", 1.0)
    params = {"a": jnp.ones(2), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"apply_server_update: leaf \['b'\] of params meets leaf \['c'\] of "
                                         r"pseudo_gradient"):
        apply_server_update(opt, params, opt.init(params), {"a": jnp.ones(2), "c": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"learning_rate=.* is not allowed here: a number .* make_server_optimizer\("
                                         r"'optax_adam', schedule\)"):
        fedopt.fedadam(optax.constant_schedule(0.1))
    with pytest.raises(ValueError, match=r"staleness s=-2 is not allowed: s = τ_g − τ_i >= 0"):
        polynomial(-2)  # (s + 1)^(-a) of -1: a complex number
    with pytest.raises(ValueError, match="staleness s=-1"):
        exponential(-1)
    with pytest.raises(ValueError, match=r"tree_vdot: leaf \['a'\] is complex"):
        tree_vdot({"a": jnp.array([1j])}, {"a": jnp.array([1j])})
    assert stacked_zeros({"w": 1.0}, 2)["w"].shape == (2,) and tree_bytes({"w": 1.0, "v": jnp.zeros(3)}) == 16
    with pytest.raises(ValueError, match=r"leaf \['key'\] holds key<fry>, not numbers to sum"):
        weighted_sum({"key": jax.random.split(jax.random.key(0), 3), "w": jnp.ones((3, 2))}, jnp.ones(3))
    shares = port.port_weights(jnp.zeros(7, jnp.bfloat16), jnp.ones(7, jnp.bfloat16), jnp.ones(7, jnp.bfloat16),
                               jnp.zeros(7, bool))
    assert float(jnp.sum(shares)) == pytest.approx(1.0, abs=1e-6)  # bfloat16's sevenths summed to 1.005


def test_make_staleness_takes_a_0d_array_as_make_server_optimizer_does_and_refuses_a_traced_one():
    from jaxfl.scheduler.staleness import make_staleness

    assert make_staleness("polynomial", alpha=np.array(0.9), a=jnp.float32(0.5))(3) == pytest.approx(0.45)
    assert make_staleness("hinge", b=jnp.array(4))(5) == pytest.approx(1.0 / 11.0)
    with pytest.raises(ValueError, match=r"staleness parameter alpha must be a finite real number, got array\(\[0.9\]\)"):
        make_staleness("polynomial", alpha=np.array([0.9]))
    with pytest.raises(ValueError, match=r"staleness parameter a must be a finite real number, got .*Tracer"):
        jax.jit(lambda a: make_staleness("polynomial", a=a)(3))(0.5)


def test_a_trainer_refuses_an_infinite_prox_mu_as_the_config_does():
    # μ = inf made every proximal gradient inf · 0 = NaN at the first step, from the library without a word
    model = nn.Dense(2)
    with pytest.raises(ValueError, match=r"prox_mu=inf is not allowed: a finite number >= 0"):
        make_client_trainer(model, optax.sgd(0.1), batch_size=4, prox_mu=float("inf"))
    with pytest.raises(ValueError, match=r"prox_mu=-1.0 is not allowed"):
        make_client_trainer(model, optax.sgd(0.1), batch_size=4, prox_mu=-1.0)


def test_fednova_coefficients_keep_float64_under_x64_and_float32_otherwise():
    # it cast everything to float32: float64 coefficients under x64 came back rounded
    third = 1.0 / 3.0
    with jax.enable_x64(True):
        out = fednova_coefficients(np.array([third, 1 - third]), np.array([10, 40]))
        assert out.dtype == jnp.float64 and float(out[0]) == pytest.approx(third * 30.0 / 10.0, rel=1e-15)
    assert fednova_coefficients(jnp.array([0.5, 0.5], jnp.bfloat16), jnp.array([10, 40])).dtype == jnp.float32
    assert fednova_coefficients([1, 1], [10, 40]).dtype == jnp.float32


# ---- a review of the kernels as a JAX library (2026-12-07) ----

def test_negative_staleness_in_an_array_is_refused_as_a_negative_number_is():
    # polynomial(np.array([-2., -1., 0.])) gave [nan inf 0.9], exponential(np.array([-10.])) 148 (α = 1)
    from jaxfl.scheduler.staleness import exponential, hinge, polynomial

    for function in (polynomial, exponential, hinge, constant):
        for bad in (np.array([-2.0, -1.0, 0.0]), jnp.float32(-2.0), np.array([np.nan])):
            with pytest.raises(ValueError, match=r"staleness s=(-2\.0|-1\.0|nan) \(in an array of shape .*\) is not allowed"):
                function(bad)
    assert polynomial(np.array([0.0, 3.0])).tolist() == [0.9, 0.45]
    # traced: no value to check, taken as it is
    assert jax.jit(polynomial)(jnp.array([0.0, 3.0])).tolist() == pytest.approx([0.9, 0.45])


def test_the_staleness_functions_refuse_the_parameters_make_staleness_refuses():
    # polynomial(3, a=-0.5) = 1.8 grew with staleness; hinge(0, b=-2) discounted a fresh update
    from jaxfl.scheduler.staleness import exponential, hinge, polynomial

    for call, message in ((lambda: polynomial(3, a=-0.5), "exponent a must be >= 0, got -0.5"),
                          (lambda: polynomial(3, alpha=-1), "alpha must be > 0, got -1"),
                          (lambda: hinge(0, b=-2), "threshold b must be >= 0"),
                          (lambda: exponential(1, a=float("nan")), "parameter a must be a finite real number"),
                          (lambda: constant(1, alpha=0.0), "alpha must be > 0, got 0.0")):
        with pytest.raises(ValueError, match=message):
            call()
    # a traced parameter (a sweep of α under vmap) is taken as it is
    assert jax.vmap(lambda a: polynomial(3, a=a))(jnp.array([0.5, 1.0])).tolist() == pytest.approx([0.45, 0.225])


def test_integer_leaves_are_summed_in_float64_under_x64():
    # a counter of 2^40 + 1 came back as 2^40 from weighted_mean, and from tree_scale by 1
    from jaxfl.kernels.tree import tree_scale

    with jax.enable_x64(True):
        counter = {"n": jnp.array([2**40 + 1, 2**40 + 1], jnp.int64)}
        assert int(weighted_mean(counter, jnp.array([1.0, 1.0]))["n"]) == 2**40 + 1
        assert int(tree_scale({"n": jnp.array(2**40 + 1, jnp.int64)}, 1.0)["n"]) == 2**40 + 1
        pair = {"n": jnp.array([100000001, 100000003], jnp.int32)}
        assert int(weighted_mean(pair, jnp.array([1.0, 1.0]))["n"]) == 100000002
    # without x64 the sum stays float32, as documented (exact up to 2^24)
    assert int(weighted_mean({"n": jnp.array([3, 5])}, jnp.array([1.0, 1.0]))["n"]) == 4


def test_a_nan_or_infinite_weight_is_refused_where_it_is_known():
    from jaxfl.kernels.aggregation import weighted_sum

    for function, name in ((weighted_mean, "weighted_mean"), (weighted_sum, "weighted_sum")):
        for bad, shown in ((jnp.nan, "nan"), (jnp.inf, "inf")):
            with pytest.raises(ValueError, match=rf"{name}: weights\[1\] = {shown} is not allowed: a finite number"):
                function(STACK, jnp.array([1.0, bad]))
    # traced, as the engine's programs call them: no check, the documented NaN
    assert np.isnan(jax.jit(weighted_mean)(STACK, jnp.array([1.0, jnp.nan]))["w"]).all()
    # bfloat16 too, whose NumPy kind is "V", not "f" (a review of the first version)
    with pytest.raises(ValueError, match=r"weighted_sum: weights\[0\] = nan is not allowed"):
        weighted_sum(STACK, jnp.array([jnp.nan, 1.0], jnp.bfloat16))
    from jaxfl.scheduler.staleness import polynomial

    with pytest.raises(ValueError, match=r"staleness s=-2\.0 \(in an array of shape \(1,\)\) is not allowed"):
        polynomial(jnp.array([-2.0], jnp.bfloat16))


def test_the_fedopt_optimisers_refuse_what_make_server_optimizer_refuses():
    # fedadam(0.1, b2=1.5) gave a NaN update, fedadam(-1.0) a step uphill
    from jaxfl.kernels import fedopt

    for call, message in ((lambda: fedopt.fedadam(0.1, b2=1.5), r"b2=1.5 is not allowed: a number in \[0, 1\)"),
                          (lambda: fedopt.fedyogi(0.1, b2=-0.1), r"b2=-0.1 is not allowed"),
                          (lambda: fedopt.fedadam(-1.0), r"learning_rate=-1.0 is not allowed: a finite number > 0"),
                          (lambda: fedopt.fedadagrad(0.1, b1=1.0), r"b1=1.0 is not allowed: a number in \[0, 1\)")):
        with pytest.raises(ValueError, match=message):
            call()
    assert fedopt.fedadam(jnp.float32(0.1), b2=np.float64(0.99)) is not None  # 0-d values, as JAX code holds them


def test_make_server_optimizer_takes_each_optimizers_default_rate_as_the_run_does():
    # every optimiser defaulted to a learning rate of 1: FedAdam's first step was ≈ ±1 a coordinate
    from jaxfl.config import DEFAULT_SERVER_LR
    from jaxfl.kernels.aggregation import SERVER_OPTIMIZERS, apply_server_update, make_server_optimizer

    zeros, gradient = {"w": jnp.zeros(3)}, {"w": jnp.array([1.0, -2.0, 0.5])}
    for name in SERVER_OPTIMIZERS:
        default = make_server_optimizer(name)
        given = make_server_optimizer(name, DEFAULT_SERVER_LR[name])
        first = apply_server_update(default, zeros, default.init(zeros), gradient)[0]["w"]
        assert first.tolist() == apply_server_update(given, zeros, given.init(zeros), gradient)[0]["w"].tolist(), name
    assert DEFAULT_SERVER_LR["sgd"] == 1.0 and DEFAULT_SERVER_LR["adam"] == 0.01


def test_the_reference_driver_refuses_fractional_steps_and_names_a_bad_max_steps():
    # num_steps=2.5 trained 2 steps without a word; max_steps=-1 blamed num_steps=0; prox_mu=None a bare TypeError
    from jaxfl.kernels import ClientView, make_client_trainer

    trainer = make_client_trainer(lambda params, x: x @ params["w"], optax.sgd(0.1), 4, preprocess=lambda x: x)
    data = FederatedArrays(jnp.ones((8, 4)), jnp.zeros(8, jnp.int32))
    view, key, params = ClientView(jnp.int32(0), jnp.int32(8)), jax.random.key(0), {"w": jnp.zeros((4, 3))}
    with pytest.raises(ValueError, match=r"num_steps=2.5 is not allowed: whole steps"):
        local_train(trainer, params, data, view, 2.5, key, max_steps=3)
    with pytest.raises(ValueError, match=r"max_steps=-1 is not allowed: an int >= 0"):
        local_train(trainer, params, data, view, 0, key, max_steps=-1)
    assert int(local_train(trainer, params, data, view, jnp.int32(2), key, max_steps=3)[1]["steps"]) == 2
    with pytest.raises(ValueError, match=r"prox_mu=None is not allowed: a finite number >= 0"):
        make_client_trainer(lambda params, x: x, optax.sgd(0.1), 4, prox_mu=None)
    assert make_client_trainer(lambda params, x: x, optax.sgd(0.1), 4, prox_mu=jnp.float32(0.1)) is not None


def test_the_same_leaves_in_other_containers_are_added_and_applied_in_the_first_trees():
    # a FrozenDict's parameters and a dict's update (or a tuple and a list) met jax's multi-line
    # "pytree structure error" in apply_server_update and tree_add
    import collections

    from flax.core import FrozenDict

    from jaxfl.kernels.aggregation import apply_server_update, make_server_optimizer

    params = FrozenDict({"w": jnp.ones(2)})
    server = make_server_optimizer("sgd", 1.0)
    updated, _ = apply_server_update(server, params, server.init(params), {"w": jnp.full(2, 0.5)})
    assert isinstance(updated, FrozenDict) and updated["w"].tolist() == [0.5, 0.5]
    assert tree_add(params, {"w": jnp.ones(2)})["w"].tolist() == [2.0, 2.0]
    assert tree_add((jnp.ones(2),), [jnp.ones(2)])[0].tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match=r"tree_add: leaf \['w'\] has shape \(2,\) in a and \(3, 2\) in b"):
        tree_add(params, {"w": jnp.ones((3, 2))})  # shapes still checked
    Pair = collections.namedtuple("Pair", "a b")
    with pytest.raises(ValueError, match=r"tree_add: a and b hold their leaves in other containers"):
        tree_add(Pair(jnp.ones(1), jnp.ones(1)), (jnp.ones(1), jnp.ones(1)))  # fields are not positions
