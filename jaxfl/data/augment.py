"""On-device preprocessing: normalisation and augmentation as pure JAX functions (the one jax module in data/).

Pixels stay uint8 on the host and on device; these functions turn a gathered minibatch
``(B, H, W, C)`` into float32 inside the jitted client kernel, so augmentation costs no host work
and no transfer. Only integer pixels are divided by 255; float images and features are used as
they are. Augmentations take an explicit key and treat every sample independently, so
they vmap over clients and give the same result however clients are batched.

- :func:`make_preprocess` ``(x) -> float`` for evaluation (and training without augmentation);
- :func:`make_augment` ``(key, x_uint8) -> float`` for training: random crop with zero padding and
  horizontal flip for CIFAR (CC-FedAvg's code: ``RandomCrop(32, padding=4)``,
  ``RandomHorizontalFlip()``), then the same scaling/normalisation as :func:`make_preprocess`.

A run's ``normalize=True`` divides by the statistics of its own training split
(:attr:`jaxfl.data.Dataset.channel_statistics`) unless ``normalize_mean``/``normalize_std`` are
given. ``NORMALIZATION`` keeps the constants the seed papers' code uses, to pass explicitly where a
paper's exact preprocessing matters. FedCompass trains MNIST with ToTensor only (no mean/std), which
is why normalisation is off unless asked for.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

__all__ = ["NORMALIZATION", "AUGMENTED", "scale", "normalize", "random_crop", "random_flip", "make_preprocess",
           "make_augment", "dataset_family"]

NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),  # the usual MNIST statistics (PORT/PLATO)
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),  # CC-FedAvg's CIFAR code
    "cifar100": ((0.507, 0.487, 0.441), (0.267, 0.256, 0.276)),  # CC-FedAvg's CIFAR-100 code
}
# Families trained with crop + flip by default (natural images; digits must not be mirrored).
AUGMENTED = ("cifar10", "cifar100")


def dataset_family(name: str) -> str:
    """The key into ``NORMALIZATION``: ``"tfds:cifar10"`` -> ``"cifar10"``, ``"mnist10k"`` -> ``"mnist"``.

    Example:
        >>> dataset_family("tfds:emnist/balanced"), dataset_family("mnist10k")
        ('emnist', 'mnist')
    """
    base = name.split(":", 1)[1] if name.startswith(("tfds:", "array_record:")) else name
    base = base.split("/")[0]
    return "mnist" if base == "mnist10k" else base


def scale(x: jax.Array) -> jax.Array:
    """Integer pixels to float32 in [0, 1] (ToTensor); floats unchanged (as float32). The same
    operations as ``kernels.client.scale_uint8``.

    Example:
        >>> scale(jnp.array([0, 255], jnp.uint8)).tolist(), scale(jnp.array([0.5, 2.0])).tolist()
        ([0.0, 1.0], [0.5, 2.0])
    """
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


def normalize(x: jax.Array, mean, std) -> jax.Array:
    """``(x - mean) / std`` over the channel (last) axis.

    Example:
        >>> normalize(jnp.ones((1, 2, 2, 1)), (0.5,), (0.5,)).ravel().tolist()
        [1.0, 1.0, 1.0, 1.0]
    """
    return (x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)


def random_crop(key: jax.Array, x: jax.Array, padding: int = 4) -> jax.Array:
    """Per-sample random crop of a ``(B, H, W, C)`` batch after zero-padding ``padding`` pixels per side.

    Offsets are uniform in ``[0, 2 * padding]`` on each axis, one pair per sample, as torchvision's
    ``RandomCrop(H, padding)``. The dtype is kept (crop before scaling, as on PIL images).

    Example:
        >>> x = jnp.arange(2 * 4 * 4, dtype=jnp.uint8).reshape(2, 4, 4, 1)
        >>> random_crop(jax.random.key(0), x, padding=1).shape
        (2, 4, 4, 1)
    """
    batch, height, width, _ = x.shape
    padded = jnp.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    offsets = jax.random.randint(key, (batch, 2), 0, 2 * padding + 1)

    def crop(image, offset):
        return jax.lax.dynamic_slice(image, (offset[0], offset[1], 0), (height, width, image.shape[-1]))

    return jax.vmap(crop)(padded, offsets)


def random_flip(key: jax.Array, x: jax.Array) -> jax.Array:
    """Mirror each sample of a ``(B, H, W, C)`` batch left-right with probability 1/2.

    Example:
        >>> x = jnp.arange(3, dtype=jnp.uint8).reshape(1, 1, 3, 1)
        >>> sorted({tuple(random_flip(jax.random.key(k), x).ravel().tolist()) for k in range(8)})
        [(0, 1, 2), (2, 1, 0)]
    """
    flip = jax.random.bernoulli(key, 0.5, (x.shape[0],))
    return jnp.where(flip[:, None, None, None], x[:, :, ::-1, :], x)


def _statistics(dataset, normalized: bool, mean, std):
    """``(mean, std)`` to normalise by, or None: explicit values, else a Dataset's own training
    statistics, else (a name) the published constants in ``NORMALIZATION``."""
    if not normalized:
        return None
    if mean is not None and std is not None:
        return tuple(mean), tuple(std)
    if (mean is None) != (std is None):
        raise ValueError("give normalisation mean and std together (or neither, for the training split's)")
    if not isinstance(dataset, str):
        return dataset.channel_statistics
    family = dataset_family(dataset)
    if family not in NORMALIZATION:
        raise ValueError(f"no normalisation statistics for dataset {family!r}; known: {sorted(NORMALIZATION)} "
                         "(pass the Dataset itself to use its training split's, or mean and std)")
    return NORMALIZATION[family]


def make_preprocess(dataset, normalized: bool = False, mean=None, std=None) -> Callable[[jax.Array], jax.Array]:
    """``x -> model input`` for a :class:`~jaxfl.data.Dataset` (or a dataset name, taken as images).

    Images and features: integer pixels scaled to [0, 1], floats taken as they are (float32); then,
    if ``normalized``, ``(x - mean) / std`` per channel (last axis) with the given ``mean``/``std``,
    else a Dataset's own training statistics (:attr:`~jaxfl.data.Dataset.channel_statistics`),
    else (a name) ``NORMALIZATION``. Token ids: passed through unchanged.

    Example:
        >>> f = make_preprocess("tfds:cifar10", normalized=True)
        >>> f(jnp.zeros((1, 2, 2, 3), jnp.uint8)).shape
        (1, 2, 2, 3)
        >>> make_preprocess("mine", normalized=True, mean=(0.5,), std=(0.25,))(jnp.ones((1, 1))).tolist()
        [[2.0]]
    """
    kind = "image" if isinstance(dataset, str) else dataset.kind
    if kind == "tokens":
        if normalized:
            raise ValueError(f"dataset {dataset.name!r} holds token ids, which cannot be normalised")
        return lambda x: x
    stats = _statistics(dataset, normalized, mean, std)
    if stats is None:
        return scale
    mean, std = stats
    return lambda x: normalize(scale(x), mean, std)


def make_augment(dataset, crop_padding: int | None = None, flip: bool | None = None,
                 normalized: bool = False, mean=None, std=None) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """``(key, x_uint8 (B, H, W, C)) -> float32`` training transform for a dataset (or its name).

    Defaults per dataset: CIFAR-10/100 crop with 4-pixel padding and flip; others neither (the
    transform is then :func:`make_preprocess`'s, ignoring the key). The key is split once per
    augmentation, so one key per (client, step) gives independent crops and flips.

    Example:
        >>> aug = make_augment("tfds:cifar10", normalized=True)
        >>> aug(jax.random.key(0), jnp.zeros((8, 32, 32, 3), jnp.uint8)).dtype
        dtype('float32')
    """
    name = dataset if isinstance(dataset, str) else dataset.name
    family = dataset_family(name)
    crop_padding = (4 if family in AUGMENTED else 0) if crop_padding is None else int(crop_padding)
    flip = (family in AUGMENTED) if flip is None else bool(flip)
    if crop_padding < 0:
        raise ValueError(f"crop_padding={crop_padding} must be >= 0")
    preprocess = make_preprocess(dataset, normalized, mean, std)

    def augment(key: jax.Array, x: jax.Array) -> jax.Array:
        crop_key, flip_key = jax.random.split(key)
        if crop_padding:
            x = random_crop(crop_key, x, crop_padding)
        if flip:
            x = random_flip(flip_key, x)
        return preprocess(x)

    return augment
