"""On-device preprocessing and augmentation (pure JAX), and the optional augment hook of the client kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfl.data.augment import (NORMALIZATION, dataset_family, make_augment, make_preprocess, normalize, random_crop,
                                random_flip, scale)
from jaxfl.kernels import ClientView, FederatedArrays, local_train, make_client_trainer, scale_uint8

IMAGES = jax.random.randint(jax.random.key(0), (64, 6, 6, 3), 0, 256).astype(jnp.uint8)


def test_scale_is_bit_identical_to_the_kernel_default():
    np.testing.assert_array_equal(scale(IMAGES), scale_uint8(IMAGES))
    np.testing.assert_array_equal(jax.jit(make_preprocess("mnist10k"))(IMAGES), jax.jit(scale_uint8)(IMAGES))


def test_normalisation_per_dataset():
    mean, std = NORMALIZATION["cifar10"]
    out = make_preprocess("tfds:cifar10", normalized=True)(IMAGES)
    np.testing.assert_allclose(out, (np.asarray(IMAGES) / 255.0 - np.array(mean)) / np.array(std), atol=1e-5)
    assert dataset_family("tfds:cifar100") == "cifar100" and dataset_family("fashion_mnist") == "fashion_mnist"
    np.testing.assert_allclose(normalize(jnp.full((1, 1, 1, 1), 0.5), (0.5,), (0.5,)), 0.0)
    with pytest.raises(ValueError, match="no normalisation statistics for dataset 'digits'"):
        make_preprocess("digits", normalized=True)


def test_random_crop_is_a_window_of_the_zero_padded_image():
    padding = 2
    out = np.asarray(random_crop(jax.random.key(1), IMAGES, padding))
    padded = np.pad(np.asarray(IMAGES), ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    offsets = set()
    for i in range(len(out)):
        matches = [(dy, dx) for dy in range(2 * padding + 1) for dx in range(2 * padding + 1)
                   if np.array_equal(padded[i, dy:dy + 6, dx:dx + 6], out[i])]
        assert matches, f"sample {i} is not a crop"
        offsets.add(matches[0])
    assert len(offsets) > 5, "offsets are drawn per sample"
    np.testing.assert_array_equal(random_crop(jax.random.key(1), IMAGES, padding), out)  # same key, same crops
    assert out.dtype == np.uint8


def test_random_flip_mirrors_about_half():
    out = np.asarray(random_flip(jax.random.key(2), IMAGES))
    flipped = [np.array_equal(o, np.asarray(x)[:, ::-1]) for o, x in zip(out, IMAGES)]
    same = [np.array_equal(o, np.asarray(x)) for o, x in zip(out, IMAGES)]
    assert all(f or s for f, s in zip(flipped, same))
    assert 16 < sum(flipped) < 48


def test_make_augment_defaults_per_dataset_and_vmaps():
    cifar = make_augment("tfds:cifar10", normalized=True)
    a = cifar(jax.random.key(3), IMAGES)
    b = cifar(jax.random.key(4), IMAGES)
    assert a.dtype == jnp.float32 and a.shape == IMAGES.shape and not np.allclose(a, b)
    digits = make_augment("mnist10k")  # digits are neither cropped nor mirrored by default
    np.testing.assert_array_equal(digits(jax.random.key(3), IMAGES), scale(IMAGES))
    batched = jax.vmap(cifar)(jax.random.split(jax.random.key(5), 2), jnp.stack([IMAGES[:4], IMAGES[4:8]]))
    assert batched.shape == (2, 4, 6, 6, 3)
    with pytest.raises(ValueError, match="crop_padding=-1"):
        make_augment("tfds:cifar10", crop_padding=-1)


def test_preprocess_for_features_and_tokens():
    from jaxfl.data import load_dataset

    synthetic = load_dataset("synthetic", num_clients=3)
    x = jnp.asarray(synthetic.train_x[:4])
    np.testing.assert_array_equal(make_preprocess(synthetic)(x), x)
    tokens = jnp.array([[3, 4, 0]], jnp.int32)
    from jaxfl.data import dataset_from_arrays

    text = dataset_from_arrays("t", np.array([[3, 4, 0]]), [0], np.array([[1, 0, 0]]), [1])
    assert make_preprocess(text)(tokens).dtype == jnp.int32


# --------------------------------------------------------------------------- the kernel hook


def _train(augment, steps=4):
    model_w = {"w": jnp.zeros((6 * 6 * 3, 4)), "b": jnp.zeros(4)}

    def apply_fn(params, x):
        return x.reshape((x.shape[0], -1)) @ params["w"] + params["b"]

    trainer = make_client_trainer(apply_fn, optax.sgd(0.1), batch_size=8, augment=augment)
    data = FederatedArrays(IMAGES, jnp.arange(64) % 4)
    return local_train(trainer, model_w, data, ClientView(jnp.int32(0), jnp.int32(64)), jnp.int32(steps),
                       jax.random.key(7), max_steps=steps)


def test_kernel_default_unchanged_and_augment_hook():
    base_delta, base_metrics = _train(None)
    # An augmentation that only rescales reproduces the default path exactly.
    same_delta, _ = _train(lambda key, x: scale(x))
    for a, b in zip(jax.tree.leaves(base_delta), jax.tree.leaves(same_delta)):
        np.testing.assert_array_equal(a, b)
    crop_delta, crop_metrics = _train(make_augment("tfds:cifar10", crop_padding=2))
    assert bool(crop_metrics["finite"]) and int(crop_metrics["steps"]) == 4
    assert not np.allclose(crop_delta["w"], base_delta["w"])
    again, _ = _train(make_augment("tfds:cifar10", crop_padding=2))
    np.testing.assert_array_equal(again["w"], crop_delta["w"])  # keys derive from the dispatch key and step
