"""The CPU-friendly layer forms compute the same functions and gradients as XLA's, for any model."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

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
    np.testing.assert_allclose(cpu_friendly(model.apply)(params, x), model.apply(params, x), rtol=1e-5, atol=1e-5)
    fast, exact = (jax.grad(loss)(params, apply) for apply in (cpu_friendly(model.apply), model.apply))
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
