"""The papers' CIFAR models (ResNet-20, VGG-11/16 with BatchNorm, AlexNet): parameter counts derived
by hand (abstract shapes only, nothing allocated), option-A shortcuts, BatchNorm state, the input
checks, and one vmapped training step of each in the client kernel with the CPU-friendly layers."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfl.cli import main
from jaxfl.kernels import ClientView, FederatedArrays, make_client_trainer
from jaxfl.models import MODEL_INPUTS, as_adapter, check_model_input, count_params, make_model
from jaxfl.models.cifar import _shortcut_a

CIFAR = (32, 32, 3)


def conv(k, c_in, c_out, bias=True):
    return k * k * c_in * c_out + (c_out if bias else 0)


def resnet20_params(classes):
    # He et al. 2016 Sec. 4.2 with option-A shortcuts (no parameters): 3x3 convolutions without bias,
    # each followed by a BatchNorm (scale + bias per channel). Stem 3->16; stage 1: six 16->16;
    # stage 2: one 16->32 and five 32->32; stage 3: one 32->64 and five 64->64; Dense 64->classes.
    convs = (conv(3, 3, 16, False) + 6 * conv(3, 16, 16, False) + conv(3, 16, 32, False) + 5 * conv(3, 32, 32, False)
             + conv(3, 32, 64, False) + 5 * conv(3, 64, 64, False))
    norms = 2 * (16 + 6 * 16 + 6 * 32 + 6 * 64)
    return convs + norms + 64 * classes + classes


def vgg_params(layers, classes):
    # each 3x3 convolution with bias and a BatchNorm (scale + bias); five 2x2 pools take 32x32 to
    # 1x1, so the one classifier is 512 -> classes
    total, channels = 0, 3
    for width in (w for w in layers if w not in ("M", "A")):
        total += conv(3, channels, width) + 2 * width
        channels = width
    return total + 512 * classes + classes


VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "A")


def alexnet_params(classes):
    # conv 11x11 3->64, 5x5 64->192, 3x3 192->384, 384->256, 256->256 (all with bias); on 32x32 the
    # maps are 8 -> pool 4 -> 4 -> pool 2 -> 2 -> pool 1, so the classifier is 256 -> classes
    return (conv(11, 3, 64) + conv(5, 64, 192) + conv(3, 192, 384) + conv(3, 384, 256) + conv(3, 256, 256)
            + 256 * classes + classes)


@pytest.mark.parametrize("name, classes, expected, published", [
    ("resnet20", 10, resnet20_params(10), 269_722),  # He et al. Table 6: "0.27M"
    ("resnet20", 100, resnet20_params(100), 275_572),
    ("vgg11", 10, vgg_params(VGG11, 10), 9_231_114),  # the CIFAR VGG-11-BN's usual 9.23 M
    ("vgg11", 100, vgg_params(VGG11, 100), 9_277_284),
    ("vgg16", 10, vgg_params(VGG16, 10), 14_728_266),  # the CIFAR VGG-16-BN's usual 14.7 M
    ("vgg16", 100, vgg_params(VGG16, 100), 14_774_436),
    ("alexnet", 10, alexnet_params(10), 2_472_266),  # pytorch-classification's CIFAR AlexNet: 2.47 M
    ("alexnet", 100, alexnet_params(100), 2_495_396),
])
def test_parameter_counts(name, classes, expected, published):
    assert expected == published
    variables = jax.eval_shape(make_model(name, classes).init, jax.random.key(0),
                               jax.ShapeDtypeStruct((1,) + CIFAR, jnp.float32))
    assert count_params(variables["params"]) == expected
    # BatchNorm's running mean and variance: one pair per normalised channel; AlexNet has none
    norms = {"resnet20": 16 + 6 * 16 + 6 * 32 + 6 * 64, "vgg11": sum(w for w in VGG11 if w != "M"),
             "vgg16": sum(w for w in VGG16 if w != "A" and w != "M"), "alexnet": 0}[name]
    assert count_params(variables.get("batch_stats", {})) == 2 * norms


def test_option_a_shortcut_subsamples_and_zero_pads():
    x = jnp.arange(2 * 4 * 4 * 2, dtype=jnp.float32).reshape(2, 4, 4, 2)
    out = _shortcut_a(x, features=6, strides=2)
    assert out.shape == (2, 2, 2, 6)
    np.testing.assert_array_equal(out[..., 2:4], x[:, ::2, ::2, :])  # the old channels in the middle
    assert not np.any(out[..., :2]) and not np.any(out[..., 4:])


@pytest.mark.parametrize("name, too_small", [("resnet20", (4, 4, 3)), ("vgg11", (28, 28, 1)),
                                             ("vgg16", (16, 16, 3)), ("alexnet", (28, 28, 1))])
def test_input_checks_name_the_shapes(name, too_small):
    assert MODEL_INPUTS[name].accepts(CIFAR, "image")
    with pytest.raises(ValueError, match=rf"model '{name}' is built for images .* has image samples of shape"):
        check_model_input(name, too_small, "image", "mnist10k")


@pytest.mark.slow
def test_resnet20_trains_one_vmapped_step_with_cpu_friendly_layers():
    """Two clients trained together (vmap) for one SGD step on 32x32x3 pixels, as the engine does on
    a CPU: the loss is finite, every layer of each client moves, and the BatchNorm statistics update.
    (One model: each such step compiles for 10-15 CPU-seconds; VGG and AlexNet are checked below.)"""
    adapter = as_adapter(make_model("resnet20", 10))
    variables = jax.jit(adapter.init_variables)(jax.random.key(0), jnp.zeros((1,) + CIFAR))
    trainer = make_client_trainer(adapter, optax.sgd(0.01), batch_size=2, cpu_friendly_layers=True)
    pixels = np.random.default_rng(0).integers(0, 256, (8,) + CIFAR, dtype=np.uint8)
    data = FederatedArrays(jnp.asarray(pixels), jnp.arange(8, dtype=jnp.int32) % 10)
    views = ClientView(jnp.array([0, 4], jnp.int32), jnp.array([4, 4], jnp.int32))
    stacked = jax.tree.map(lambda leaf: jnp.stack([leaf, leaf]), variables)
    start = jax.vmap(lambda params, key: trainer.init(params, jnp.int32(1), key))(
        stacked, jax.random.split(jax.random.key(1), 2))
    state = jax.jit(jax.vmap(trainer.step, in_axes=(0, None, 0)))(start, data, views)
    assert state.step.tolist() == [1, 1] and bool(state.all_finite.all()) and np.all(state.loss_sum > 0)
    moved = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(axis=tuple(range(1, a.ndim))),
                         state.params["params"], stacked["params"])
    assert all(np.all(change > 0) for change in jax.tree.leaves(moved))  # every layer, both clients
    means = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(state.params["state"])
             if "mean" in jax.tree_util.keystr(path)]
    assert len(means) == 19 and not np.allclose(means[0][0], means[0][1])  # the clients' batches differ


# VGG's first convolution (3x3 on 3 channels: 27 inputs per output) is below MIN_IM2COL_CONTRACTION
# and stays XLA's, where it is faster; AlexNet's first (11x11x3 = 363) becomes a matrix product
@pytest.mark.parametrize("name, convolutions, kept", [("vgg11", 8, 1), ("vgg16", 13, 1), ("alexnet", 5, 0)])
def test_the_vmapped_training_step_traces_with_cpu_friendly_layers(name, convolutions, kept):
    """The same vmapped client step as above, traced to its shapes only (compiling each would cost
    10-15 CPU-seconds): it fits these models, and the CPU rewrite turns the convolutions (AlexNet's
    11x11 stride-4 one included) into matrix products and every max-pool into a reshape."""
    from jaxfl.kernels.cpu_ops import count_primitive, cpu_friendly

    adapter = as_adapter(make_model(name, 10))
    variables = jax.eval_shape(adapter.init_variables, jax.random.key(0), jnp.zeros((1,) + CIFAR))
    trainer = make_client_trainer(adapter, optax.sgd(0.01), batch_size=2, cpu_friendly_layers=True)
    data = FederatedArrays(jax.ShapeDtypeStruct((8,) + CIFAR, jnp.uint8), jax.ShapeDtypeStruct((8,), jnp.int32))
    views = ClientView(jnp.array([0, 4], jnp.int32), jnp.array([4, 4], jnp.int32))
    stacked = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct((2,) + leaf.shape, leaf.dtype), variables)
    start = jax.eval_shape(jax.vmap(lambda params, key: trainer.init(params, jnp.int32(1), key)),
                           stacked, jax.random.split(jax.random.key(1), 2))
    state = jax.eval_shape(jax.vmap(trainer.step, in_axes=(0, None, 0)), start, data, views)
    assert jax.tree.map(lambda leaf: leaf.shape, state.params) == jax.tree.map(lambda leaf: leaf.shape, stacked)

    def forward(params, x):
        return adapter.apply(params["params"], params.get("state", {}), x, train=True, key=jax.random.key(2))[0]

    x = jnp.zeros((2,) + CIFAR)
    plain, fast = (jax.make_jaxpr(f)(variables, x).jaxpr for f in (forward, cpu_friendly(forward)))
    assert count_primitive(plain, "conv_general_dilated") == convolutions
    assert count_primitive(fast, "conv_general_dilated") == kept and count_primitive(fast, "reduce_window_max") == 0


def test_the_cli_knows_the_models_and_refuses_data_they_are_not_built_for(tmp_path, capsys):
    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--model", "vgg16", "--dataset", "mnist10k", "--output-dir", str(out)])
    assert exit_info.value.code == 2 and not out.exists()
    assert "model 'vgg16' is built for images (H, W, C) with H and W >= 32" in capsys.readouterr().err


def test_vgg16_ends_as_plato_builds_it_with_an_average_pool():
    # PORT ran in PLATO, whose VGG (plato/models/vgg.py) ends its layer plan with the last convolution
    # and pools the 2x2 map by AvgPool2d(2); kuangliu's VGG-11 ends in a max-pool
    from jaxfl.models.cifar import VGG_LAYERS

    assert VGG_LAYERS["vgg16"] == VGG16 and VGG_LAYERS["vgg11"][-1] == "M"
    model = make_model("vgg16", 10)
    variables = model.init(jax.random.key(0), jnp.zeros((1,) + CIFAR))
    x = jax.random.normal(jax.random.key(1), (2,) + CIFAR)
    logits, intermediates = model.apply(variables, x, capture_intermediates=True, mutable=["intermediates"])
    last_relu_input = intermediates["intermediates"]["BatchNorm_12"]["__call__"][0]  # (2, 2, 2, 512)
    pooled = jax.nn.relu(last_relu_input).mean(axis=(1, 2))
    dense = variables["params"]["Dense_0"]
    np.testing.assert_allclose(logits, pooled @ dense["kernel"] + dense["bias"], rtol=1e-5, atol=1e-5)
