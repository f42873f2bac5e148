"""Tests for jaxfl.models: the FedCompass MNIST CNN and the 2NN MLP (the zoo: test_models_zoo.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxfl.models import MLP, MODELS, ExampleCNN, MnistCNN, count_params, make_model


def _init(model, shape=(1, 28, 28, 1)):
    return model.init(jax.random.key(0), jnp.zeros(shape, jnp.float32))


def test_cnn_param_count_matches_paper():
    # FedCompass Table 8: 832 + 51,264 + 524,800 + 5,130.
    assert count_params(_init(MnistCNN(num_classes=10))) == 582_026


def test_example_cnn_param_count_matches_pytorch_example():
    # PyTorch's MNIST example without dropout: 320 + 18,496 + 1,179,776 + 1,290.
    assert count_params(_init(ExampleCNN(num_classes=10))) == 1_199_882


def test_count_params_on_abstract_shapes():
    abstract = jax.eval_shape(MnistCNN().init, jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    assert count_params(abstract) == 582_026


@pytest.mark.parametrize("num_classes", [10, 47])
def test_cnn_output_shape(num_classes):
    model = MnistCNN(num_classes=num_classes)
    params = _init(model)
    logits = model.apply(params, jnp.ones((5, 28, 28, 1), jnp.float32))
    assert logits.shape == (5, num_classes) and logits.dtype == jnp.float32


def test_mlp_output_shape_and_size():
    model = MLP(num_classes=10)
    params = _init(model)
    assert model.apply(params, jnp.ones((3, 28, 28, 1))).shape == (3, 10)
    assert count_params(params) == 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10


def test_make_model():
    assert {"cnn", "mlp", "logreg", "lenet5", "ccfedavg_cnn", "ccfedavg_mlp", "fedasmu_cnn", "resnet18",
            "resnet18_gn", "textcnn", "lstm"} <= set(MODELS)
    assert isinstance(make_model("cnn", 10), MnistCNN)
    assert make_model("mlp", 3).num_classes == 3
    assert make_model("textcnn", 2, vocab_size=77).vocab_size == 77
    with pytest.raises(ValueError, match=r"'resnet'.*cnn.*mlp"):
        make_model("resnet", 10)
