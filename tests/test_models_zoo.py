"""The model zoo: parameter counts from the specs (abstract shapes only, nothing allocated), output
shapes on each model's data, BatchNorm vs GroupNorm ResNets, input checks and user registration."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfl.config
from jaxfl.models import (MODEL_INPUTS, MODELS, CCFedAvgMLP, ResNet18, ResNet18GN, check_model_input, count_params,
                          make_model, models_for, register_model)


def abstract_variables(model, shape, dtype=jnp.float32):
    return jax.eval_shape(model.init, jax.random.key(0), jax.ShapeDtypeStruct((1,) + shape, dtype))


@pytest.mark.parametrize("name, shape, expected", [
    ("cnn", (28, 28, 1), 582_026),  # FedCompass Table 8: 832 + 51,264 + 524,800 + 5,130
    ("resnet18", (32, 32, 3), 11_173_962),  # FedCompass Tables 10-11
    ("resnet18_gn", (32, 32, 3), 11_173_962),  # same scale/bias count with GroupNorm
    ("lenet5", (28, 28, 1), 156 + 2_416 + 48_120 + 10_164 + 850),  # 61,706
    ("ccfedavg_cnn", (32, 32, 3), 456 + 2_416 + 48_120 + 10_164 + 850),  # conv 3->6->16, FC 400-120-84-10
    ("ccfedavg_mlp", (28, 28, 1), 784 * 50 + 50 + 50 * 10 + 10),
    ("mlp", (28, 28, 1), 199_210),
    ("logreg", (60,), 610),
    ("fedasmu_cnn", (32, 32, 3), (4 * 3 * 64 + 64) + (4 * 64 * 32 + 32) + 30 * 30 * 32 * 10 + 10),
])
def test_parameter_counts(name, shape, expected):
    variables = abstract_variables(make_model(name, 10), shape)
    assert count_params(variables["params"]) == expected


def test_resnet18_batchnorm_state_and_groupnorm_statelessness():
    bn = abstract_variables(ResNet18(), (32, 32, 3))
    assert set(bn) == {"params", "batch_stats"}
    # Running mean and variance for every BatchNorm: 2 x (stem 64 + blocks + shortcuts) scalars.
    assert count_params(bn["batch_stats"]) == 2 * 4_800
    gn = abstract_variables(ResNet18GN(), (32, 32, 3))
    assert set(gn) == {"params"}
    quirk = abstract_variables(ResNet18GN(shortcut_norm="batch"), (32, 32, 3))  # CC-FedAvg's code
    assert set(quirk) == {"params", "batch_stats"} and count_params(quirk["params"]) == 11_173_962


def test_resnet18_gn_zero_inits_each_blocks_last_norm():
    model = ResNet18GN(num_classes=10, widths=(16, 16, 16, 16), blocks=(1, 1, 1, 1))  # narrow: same code path
    variables = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)))
    block = variables["params"]["BasicBlock_0"]
    assert float(jnp.abs(block["GroupNorm_1"]["scale"]).max()) == 0.0
    assert float(jnp.abs(block["GroupNorm_0"]["scale"]).min()) == 1.0


def test_resnet18_train_mode_updates_batch_stats():
    model = ResNet18(num_classes=10, widths=(4, 8, 8, 8), blocks=(1, 1, 1, 1))  # narrow: the same code path
    x = jax.random.normal(jax.random.key(1), (4, 8, 8, 3))
    variables = model.init(jax.random.key(0), x)
    logits, updates = model.apply(variables, x, train=True, mutable=["batch_stats"])
    assert logits.shape == (4, 10)
    before = jax.tree.leaves(variables["batch_stats"])
    after = jax.tree.leaves(updates["batch_stats"])
    assert any(not np.allclose(a, b) for a, b in zip(before, after))
    assert model.apply(variables, x).shape == (4, 10)  # eval mode: running statistics, nothing mutable


@pytest.mark.parametrize("name, shape, dtype", [
    ("lenet5", (32, 32, 3), jnp.float32), ("fedasmu_cnn", (28, 28, 1), jnp.float32),
    ("resnet18_gn", (28, 28, 1), jnp.float32), ("textcnn", (40,), jnp.int32), ("lstm", (12,), jnp.int32),
])
def test_output_shapes(name, shape, dtype):
    model = make_model(name, 7, vocab_size=50)
    variables = abstract_variables(model, shape, dtype)
    out = jax.eval_shape(model.apply, variables, jax.ShapeDtypeStruct((3,) + shape, dtype))
    assert out.shape == (3, 7)


def test_text_models_run_and_ignore_padding():
    from jaxfl.models import LSTMClassifier, TextCNN

    model = LSTMClassifier(num_classes=2, vocab_size=20, embed_dim=4, hidden=8)
    tokens = jnp.array([[3, 4, 5, 0, 0, 0]], jnp.int32)
    variables = model.init(jax.random.key(0), tokens)
    longer_padding = jnp.array([[3, 4, 5, 0, 0, 0, 0, 0, 0]], jnp.int32)
    np.testing.assert_allclose(model.apply(variables, tokens), model.apply(variables, longer_padding), atol=1e-6)
    cnn = TextCNN(num_classes=2, vocab_size=20, embed_dim=4, channels=4)
    v = cnn.init(jax.random.key(0), tokens)
    assert cnn.apply(v, tokens, train=True, rngs={"dropout": jax.random.key(1)}).shape == (1, 2)


def test_dropout_only_in_train_mode():
    model = CCFedAvgMLP()
    x = jnp.ones((2, 28, 28, 1))
    variables = model.init(jax.random.key(0), x)
    np.testing.assert_array_equal(model.apply(variables, x), model.apply(variables, x))
    a = model.apply(variables, x, train=True, rngs={"dropout": jax.random.key(1)})
    b = model.apply(variables, x, train=True, rngs={"dropout": jax.random.key(2)})
    assert not np.allclose(a, b)


def test_input_checks_name_both_shapes():
    with pytest.raises(ValueError, match=r"'cnn' is built for images of shape \(28, 28, 1\).*\(32, 32, 3\)"):
        check_model_input("cnn", (32, 32, 3), "image", "tfds:cifar10")
    with pytest.raises(ValueError, match=r"'textcnn' is built for token ids.*image samples of shape \(28, 28, 1\)"):
        check_model_input("textcnn", (28, 28, 1), "image", "mnist10k")
    with pytest.raises(ValueError, match=r"'lenet5'.*H and W >= 28.*\(8, 8, 1\)"):
        check_model_input("lenet5", (8, 8, 1), "image", "digits")
    check_model_input("ccfedavg_cnn", (32, 32, 1), "image")
    assert "textcnn" in models_for((256,), "tokens") and "cnn" not in models_for((256,), "tokens")
    assert set(models_for((60,), "features")) == {n for n, s in MODEL_INPUTS.items() if s.kind == "any"}


def test_register_a_user_model_by_name(monkeypatch):
    monkeypatch.setattr(jaxfl.config, "MODEL_NAMES", jaxfl.config.MODEL_NAMES)
    monkeypatch.setitem(MODELS, "placeholder", None)  # restore the registry afterwards
    MODELS.pop("placeholder")

    class Tiny(nn.Module):
        num_classes: int = 10

        @nn.compact
        def __call__(self, x):
            return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))

    try:
        register_model("tiny_user_net", Tiny)
        assert "tiny_user_net" in jaxfl.config.MODEL_NAMES
        assert jaxfl.config.validate(jaxfl.config.RunConfig(model="tiny_user_net")).model == "tiny_user_net"
        assert make_model("tiny_user_net", 4).num_classes == 4
        with pytest.raises(ValueError, match="already registered"):
            register_model("tiny_user_net", Tiny)
        with pytest.raises(ValueError, match="without spaces or commas"):
            register_model("a,b", Tiny)
    finally:
        MODELS.pop("tiny_user_net", None)
        MODEL_INPUTS.pop("tiny_user_net", None)
