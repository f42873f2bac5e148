"""The CPU-friendly layer forms compute the same functions and gradients as XLA's, for any model."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

from jaxfl.kernels import make_client_trainer
from jaxfl.kernels.cpu_ops import count_primitive, cpu_friendly
from jaxfl.models import make_model


def _count(function, *args, primitive):
    return count_primitive(jax.make_jaxpr(function)(*args).jaxpr, primitive)


@pytest.mark.parametrize("name, shape", [("cnn_example", (3, 28, 28, 1)), ("cnn", (3, 28, 28, 1)),
                                         ("lenet5", (3, 28, 28, 1)), ("ccfedavg_cnn", (3, 32, 32, 3))])
def test_zoo_models_give_the_same_logits_and_gradients(name, shape):
    model = make_model(name, 10)
    x = jax.random.uniform(jax.random.key(1), shape)
    params = model.init(jax.random.key(0), x[:1])
    loss = lambda p, apply: jnp.sum(jax.nn.log_softmax(apply(p, x))[:, 0])  # noqa: E731
    # jitted, as the engine runs them: one compilation of each program instead of one per operation (eager
    # dispatch compiled each of the models' hundreds of operations alone: the four took 72 CPU seconds, 45 jitted)
    np.testing.assert_allclose(jax.jit(cpu_friendly(model.apply))(params, x), jax.jit(model.apply)(params, x),
                               rtol=1e-5, atol=1e-5)
    fast, exact = (jax.jit(jax.grad(loss), static_argnums=1)(params, apply)
                   for apply in (cpu_friendly(model.apply), model.apply))
    for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(exact)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_the_example_cnn_loses_its_wide_convolution_and_its_pool():
    model = make_model("cnn_example", 10)
    x = jnp.zeros((2, 28, 28, 1))
    params = model.init(jax.random.key(0), x)
    assert _count(model.apply, params, x, primitive="conv_general_dilated") == 2
    # the 1-channel first layer (contraction 9) stays XLA's; the 32-channel one becomes a matmul
    assert _count(cpu_friendly(model.apply), params, x, primitive="conv_general_dilated") == 1
    assert _count(cpu_friendly(model.apply), params, x, primitive="reduce_window_max") == 0


def test_lenet5_keeps_no_xla_convolution_and_the_mnist_cnn_its_wide_first_layer():
    # LeNet-5's first layer (5x5 on 1 channel: contraction 25) is narrow (6 features): in im2col
    # form like the others, so that no XLA convolution keeps the step in unrolled chunks (the engine's
    # choice: tests/test_engine.py); the MNIST CNN's first layer (the same contraction, 32 features)
    # stays XLA's
    x = jnp.zeros((2, 28, 28, 1))
    for name, kept in (("lenet5", 0), ("cnn", 1)):
        model = make_model(name, 10)
        params = model.init(jax.random.key(0), x)
        assert _count(model.apply, params, x, primitive="conv_general_dilated") in (2, 3)
        assert _count(cpu_friendly(model.apply), params, x, primitive="conv_general_dilated") == kept


def test_every_convolution_leaves_no_xla_convolution_in_the_vmapped_gradient():
    """every_convolution=True (the form measured for accelerators): the MNIST CNN's wide first layer
    takes the im2col form too, so K vmapped clients' training step has no (grouped) XLA convolution
    left, and its loss and gradient are the model's up to float rounding."""
    model = make_model("cnn", 10)
    x = jax.random.uniform(jax.random.key(1), (3, 2, 28, 28, 1))  # (K, B, H, W, C)
    params = jax.vmap(lambda key: model.init(key, x[0, :1]))(jax.random.split(jax.random.key(0), 3))

    def step(apply):
        return jax.vmap(jax.value_and_grad(lambda p, x: jnp.sum(apply(p, x) ** 2)))

    every = cpu_friendly(model.apply, every_convolution=True)
    assert _count(step(model.apply), params, x, primitive="conv_general_dilated") > 0
    assert _count(step(cpu_friendly(model.apply)), params, x, primitive="conv_general_dilated") > 0  # its first layer
    assert _count(step(every), params, x, primitive="conv_general_dilated") == 0
    for a, b in zip(jax.tree.leaves(jax.jit(step(every))(params, x)), jax.tree.leaves(jax.jit(step(model.apply))(params, x))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="every_convolution=True rewrites the convolutions of cpu_friendly_layers"):
        make_client_trainer(model.apply, optax.sgd(0.1), batch_size=2, every_convolution=True)


def test_an_evaluation_rewrites_only_narrow_convolutions():
    # inference=True (the held-out forward pass): LeNet-5's 6- and 16-feature layers take the im2col
    # form, its 120-feature one, its pools and dense layers stay XLA's, as do the MNIST CNN's wide
    # convolutions (XLA's forward is faster there); the logits are the model's up to float rounding
    x = jax.random.uniform(jax.random.key(1), (3, 28, 28, 1))
    for name, convolutions, kept in (("lenet5", 3, 1), ("cnn", 2, 2)):
        model = make_model(name, 10)
        params = model.init(jax.random.key(0), x[:1])
        inference = cpu_friendly(model.apply, inference=True)
        assert _count(model.apply, params, x, primitive="conv_general_dilated") == convolutions
        assert _count(inference, params, x, primitive="conv_general_dilated") == kept
        assert _count(inference, params, x, primitive="reduce_window_max") == \
            _count(model.apply, params, x, primitive="reduce_window_max")
        assert _count(inference, params, x, primitive="custom_vjp_call") == 0  # no gradient rules
        np.testing.assert_allclose(inference(params, x), model.apply(params, x), rtol=1e-5, atol=1e-5)


def test_strides_padding_layouts_and_odd_pools_match_xla():
    x = jax.random.normal(jax.random.key(0), (2, 5, 11, 9))  # NCHW
    w = jax.random.normal(jax.random.key(1), (7, 5, 3, 2))  # OIHW
    conv = lambda x, w: lax.conv_general_dilated(x, w, (2, 1), ((1, 2), (0, 1)),  # noqa: E731
                                                 dimension_numbers=("NCHW", "OIHW", "NCHW"))
    np.testing.assert_allclose(cpu_friendly(conv)(x, w), conv(x, w), rtol=1e-5, atol=1e-5)
    pool = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 3, 3, 1), "VALID")  # noqa: E731
    y = jax.random.normal(jax.random.key(2), (2, 10, 8, 3))  # 10 and 8 are not multiples of 3
    np.testing.assert_array_equal(cpu_friendly(pool)(y), pool(y))


def test_vmapped_clients_and_left_alone_forms():
    # under vmap (the engine's client axis) the rewrite still applies and agrees
    w = jax.random.normal(jax.random.key(1), (4, 3, 3, 8, 16))
    x = jax.random.normal(jax.random.key(0), (4, 2, 9, 9, 8))
    conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME",  # noqa: E731
                                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    np.testing.assert_allclose(jax.vmap(cpu_friendly(conv))(x, w), jax.vmap(conv)(x, w), rtol=1e-5, atol=1e-5)
    # grouped and dilated convolutions are left as XLA's
    grouped = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "VALID", rhs_dilation=(2, 2),  # noqa: E731
                                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))
    assert _count(cpu_friendly(grouped), x[0], w[0], primitive="conv_general_dilated") == 1


def _transposed_shapes(jaxpr) -> list:
    """The output shapes of the transposes in a jaxpr and the jaxprs nested in it."""
    shapes = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "transpose":
            shapes.append(eqn.outvars[0].aval.shape)
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    shapes += _transposed_shapes(inner)
    return shapes


def test_dense_products_are_rewritten_and_their_kernel_gradients_need_no_transpose():
    # JAX's rule transposes each kernel gradient (gᵀx, out × in); the rewritten rule computes xᵀg in
    # the kernel's (in, out) layout directly
    for name, kernels in (("mlp", [(784, 200), (200, 200), (200, 10)]), ("cnn_example", [(9216, 128), (128, 10)])):
        model = make_model(name, 10)
        x = jax.random.uniform(jax.random.key(1), (3, 28, 28, 1))
        params = model.init(jax.random.key(0), x[:1])
        pools = name == "cnn_example"  # its max-pool has a gradient rule of its own as well
        assert _count(cpu_friendly(model.apply), params, x, primitive="custom_vjp_call") == len(kernels) + pools
        plain, fast = (_transposed_shapes(jax.make_jaxpr(jax.grad(lambda p: jnp.sum(apply(p, x))))(params).jaxpr)
                       for apply in (model.apply, cpu_friendly(model.apply)))
        assert sorted(shape for shape in plain if shape in kernels) == sorted(kernels)
        assert not [shape for shape in fast if shape in kernels]


@pytest.mark.parametrize("x_shape", [(4, 5), (2, 3, 5), (5,)])
def test_dense_product_matches_xla_values_and_gradients(x_shape):
    # the same float32 sums over the same terms, maybe in another order: a reassociation tolerance
    # (on the development CPU they are bit-identical)
    from jaxfl.kernels.cpu_ops import dense_product

    x = jax.random.normal(jax.random.key(0), x_shape)
    w = jax.random.normal(jax.random.key(1), (5, 7))
    np.testing.assert_array_equal(dense_product(x, w), x @ w)
    weights = jax.random.normal(jax.random.key(2), x_shape[:-1] + (7,))
    loss = lambda product: lambda x, w: jnp.sum(jnp.tanh(product(x, w)) * weights)  # noqa: E731
    fast = jax.grad(loss(dense_product), argnums=(0, 1))(x, w)
    exact = jax.grad(loss(jnp.matmul), argnums=(0, 1))(x, w)
    for a, b in zip(fast, exact):
        assert a.dtype == jnp.float32 and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    # vmapped clients (the engine's client axis) differentiate through it as well
    per_client = jax.vmap(jax.grad(loss(dense_product), argnums=1), in_axes=(None, 0))(x, jnp.stack([w, 2 * w]))
    np.testing.assert_allclose(per_client[1], jax.grad(loss(jnp.matmul), argnums=1)(x, 2 * w), rtol=1e-6, atol=1e-6)


def test_other_products_are_left_as_they_are():
    x, w = jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5))
    batched = lambda x, w: jnp.einsum("bij,bjk->bik", x, w)  # noqa: E731  (batch axes)
    highest = lambda x, w: jnp.dot(x, w[0], precision=lax.Precision.HIGHEST)  # noqa: E731
    integer = lambda x, w: x.astype(jnp.int32) @ w[0].astype(jnp.int32)  # noqa: E731
    transposed = lambda x, w: lax.dot_general(x, w[0], (((2,), (1,)), ((), ())))  # noqa: E731  (contracts W's last axis)
    for function in (batched, highest, integer):
        assert _count(cpu_friendly(function), x, w, primitive="custom_vjp_call") == 0
    assert _count(cpu_friendly(transposed), x, jnp.ones((2, 5, 4)), primitive="custom_vjp_call") == 0


def test_runs_on_a_cpu_train_with_the_rewritten_layers_unless_switched_off(small_config):
    """The engine's choice: on the CPU backend a run's client step has the rewritten forms (here the
    MLP's three dense kernel gradients without their transposes); cpu_friendly_layers=False keeps XLA's."""
    import dataclasses

    from jaxfl import run_experiment
    from jaxfl.kernels.client import ClientView

    assert jax.default_backend() == "cpu"
    transposes = {}
    for switch in (True, False):
        config = dataclasses.replace(small_config, max_updates=1, local_steps=1, cpu_friendly_layers=switch,
                                     run_name=f"layers-{switch}")
        engine = run_experiment(config).engine
        state = jax.eval_shape(engine.trainer.init, engine.params, 0, jax.random.key(0))
        scalar = jax.ShapeDtypeStruct((), jnp.int32)
        step = jax.make_jaxpr(engine.trainer.step)(state, engine.data, ClientView(scalar, scalar))
        transposes[switch] = _transposed_shapes(step.jaxpr)
    kernels = [(784, 200), (200, 200), (200, 10)]
    assert sorted(s for s in transposes[False] if s in kernels) == sorted(kernels)
    assert not [s for s in transposes[True] if s in kernels]


@pytest.mark.parametrize("strides", [(1, 1), (2, 1)])
def test_im2col_patches_are_the_windows_concatenated_on_the_channel_axis(strides):
    # the fused form only moves the same values elsewhere: exactly the windows side by side
    from jaxfl.kernels.cpu_ops import _patches

    x = jax.random.normal(jax.random.key(0), (2, 9, 8, 5))
    (sh, sw), kh, kw = strides, 3, 2
    out_h, out_w = (9 - kh) // sh + 1, (8 - kw) // sw + 1
    windows = [x[:, i:i + (out_h - 1) * sh + 1:sh, j:j + (out_w - 1) * sw + 1:sw, :] for i in range(kh) for j in range(kw)]
    np.testing.assert_array_equal(_patches(x, kh, kw, sh, sw, out_h, out_w), jnp.concatenate(windows, axis=-1))


def test_the_wide_convolutions_patches_are_built_in_one_fused_loop():
    # XLA:CPU leaves a concatenation on the minor axis unfused (each window written out, then copied
    # again); the patches of the example CNN's 32-channel convolution, forward and backward, must not
    # need a concatenate of their own in the compiled step
    model = make_model("cnn_example", 10)
    x = jax.random.uniform(jax.random.key(1), (2, 28, 28, 1))
    params = model.init(jax.random.key(0), x[:1])
    loss = lambda p: jnp.sum(cpu_friendly(model.apply)(p, x))  # noqa: E731
    text = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
    entry = text[text.index("\nENTRY"):]
    assert " concatenate(" not in entry
    assert "concatenate(" in text  # inside a fusion


def _bits(array):
    return np.asarray(array).view(np.uint32)


_NAN, _INF = float("nan"), float("inf")


@pytest.mark.parametrize("inputs", ["random", "relu", "rounded", "zeros", "signed_zeros", "nan_inf"])
@pytest.mark.parametrize("window", [(1, 2, 2, 1), (1, 3, 3, 1), (2, 1, 2, 3)])
def test_tiled_max_pool_gives_xla_s_gradient_bit_for_bit_ties_included(inputs, window):
    # XLA's gradient of reduce_window max hands each window's cotangent to one element: the first
    # maximum in row-major order at ties (zeros after a ReLU, rounded values), the element after a
    # NaN; the rule must choose the very same one, with the same bits (signed zeros included), and
    # the forward must be XLA's max bit for bit; shapes that leave a remainder drop it in both
    from jaxfl.kernels.cpu_ops import tiled_max_pool

    shape = (4, 13, 12, 6)
    x = jax.random.normal(jax.random.key(0), shape)
    x = {"random": x, "relu": jax.nn.relu(x), "rounded": jnp.round(x), "zeros": jnp.zeros(shape),
         "signed_zeros": jnp.where(x > 0, 0.0, -0.0),
         "nan_inf": jnp.where(x > 1.2, _NAN, jnp.where(x < -1.2, -_INF, jnp.where(jnp.abs(x) < 0.1, _INF, jnp.round(x))))
         }[inputs]
    xla = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, window, window, "VALID")  # noqa: E731
    np.testing.assert_array_equal(_bits(tiled_max_pool(x, window)), _bits(xla(x)))
    weights = jax.random.normal(jax.random.key(1), xla(x).shape)
    weights = weights.at[0].set(-0.0)  # XLA's form adds a cotangent to 0: a -0 comes out +0
    gradients = [jax.grad(lambda x: jnp.sum(pool(x) * weights))(x) for pool in (xla, lambda x: tiled_max_pool(x, window))]
    np.testing.assert_array_equal(_bits(gradients[1]), _bits(gradients[0]))
    if inputs == "zeros":  # every window tied: all of the cotangent on its first element
        assert int(jnp.count_nonzero(gradients[1])) == int(jnp.count_nonzero(weights))


def test_the_example_cnn_s_gradient_is_bit_identical_to_xla_s_pool():
    # the whole model: cpu_friendly with only its pool rewritten gives the flax model's gradient bit
    # for bit (after the ReLU many windows tie at zero), so that rewrite changes no training run
    from jaxfl.kernels import cpu_ops

    model = make_model("cnn_example", 10)
    x = jax.random.uniform(jax.random.key(1), (3, 28, 28, 1)) - 0.5
    params = model.init(jax.random.key(0), x[:1])
    loss = lambda p, apply: jnp.sum(jax.nn.log_softmax(apply(p, x))[:, 0])  # noqa: E731
    saved = cpu_ops._is_dense, cpu_ops._im2col_applies
    cpu_ops._is_dense = cpu_ops._im2col_applies = lambda eqn, *inference: False
    try:
        pool_only = jax.jit(jax.grad(lambda p: loss(p, cpu_friendly(model.apply))))(params)
    finally:
        cpu_ops._is_dense, cpu_ops._im2col_applies = saved
    exact = jax.jit(jax.grad(lambda p: loss(p, model.apply)))(params)
    for a, b in zip(jax.tree.leaves(pool_only), jax.tree.leaves(exact)):
        np.testing.assert_array_equal(_bits(a), _bits(b))


@pytest.mark.parametrize("name, shape, batch", [
    ("lenet5", (28, 28, 1), 106),  # 28·28 windows of 5·5 floats: 78,400 bytes an image
    ("ccfedavg_cnn", (32, 32, 3), 50),  # 28·28·75 floats (235 kB): 35 images, at least EVAL_MIN_BATCH
    ("cnn", (28, 28, 1), 1000),  # wide convolutions stay XLA's: no patches
    ("mlp", (28, 28, 1), 1000)])
def test_the_held_out_batch_keeps_a_cpu_evaluation_s_patches_in_the_cache(name, shape, batch):
    from jaxfl.experiment import EVAL_BATCH, evaluation_batch_size, make_evaluator
    from jaxfl.kernels.cpu_ops import largest_patches_bytes
    from jaxfl.models.adapter import as_adapter

    model = as_adapter(make_model(name, 10))
    variables = model.init_variables(jax.random.key(0), jnp.zeros((1,) + shape))
    assert evaluation_batch_size(model.predict, variables, shape, cpu_layers=True) == batch
    assert evaluation_batch_size(model.predict, variables, shape, cpu_layers=False) == EVAL_BATCH
    if batch < EVAL_BATCH:
        patches = largest_patches_bytes(model.predict, variables, jnp.zeros((batch,) + shape), inference=True)
        assert patches <= 8 * 2**20 or batch == 50
        # the figures do not depend on the batch: the same counts, the loss summed in another order
        rng = np.random.default_rng(0)
        x, y = rng.integers(0, 256, (600,) + shape, dtype=np.uint8), rng.integers(0, 10, 600).astype(np.int32)
        predict = cpu_friendly(model.predict, inference=True)
        small, large = (make_evaluator(predict, x, y, size)(variables) for size in (batch, EVAL_BATCH))
        assert small["accuracy"] == large["accuracy"]
        np.testing.assert_array_equal(small["class_accuracy"], large["class_accuracy"])
        assert small["loss"] == pytest.approx(large["loss"], rel=1e-6)


def test_a_cpu_run_of_lenet5_evaluates_in_batches_that_fit_the_cache(small_config):
    import dataclasses

    from jaxfl import run_experiment

    config = dataclasses.replace(small_config, max_updates=1, local_steps=1, run_name="lenet5")
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, model="lenet5"))
    assert run_experiment(config).summary["evaluation_batch"] == 106
    off = dataclasses.replace(config, cpu_friendly_layers=False, run_name="lenet5-xla")
    assert run_experiment(off).summary["evaluation_batch"] == 1000
