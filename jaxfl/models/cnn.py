"""Flax (linen) models for 28x28 image classification.

Modules take float32 images ``(B, H, W, C)`` already normalised and return logits
``(B, num_classes)``. They are written for one client; the engine vmaps them.
"""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["MnistCNN", "MLP", "MODELS", "make_model", "count_params"]


class MnistCNN(nn.Module):
    """The FedCompass MNIST CNN (paper Table 8; 582,026 parameters for 10 classes).

    Conv(32, 5x5, VALID) -> ReLU -> MaxPool 2 -> Conv(64, 5x5, VALID) -> ReLU -> MaxPool 2 ->
    Flatten(4*4*64 = 1024) -> Dense 512 -> ReLU -> Dense num_classes.
    The flatten is in NHWC order (PyTorch flattens NCHW): same function class and parameter
    count, but weights are not interchangeable with a PyTorch checkpoint without a transpose.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = MnistCNN(num_classes=10)
        >>> params = model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
        >>> model.apply(params, jnp.zeros((4, 28, 28, 1))).shape
        (4, 10)
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Conv(32, (5, 5), padding="VALID")(x)  # (B, 24, 24, 32)
        x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))  # (B, 12, 12, 32)
        x = nn.Conv(64, (5, 5), padding="VALID")(x)  # (B, 8, 8, 64)
        x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))  # (B, 4, 4, 64)
        x = x.reshape((x.shape[0], -1))  # (B, 1024)
        x = nn.relu(nn.Dense(512)(x))
        return nn.Dense(self.num_classes)(x)


class MLP(nn.Module):
    """A two-hidden-layer perceptron (200, 200) for fast tests; 199,210 parameters on 28x28x1.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = MLP(num_classes=10)
        >>> params = model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
        >>> model.apply(params, jnp.zeros((3, 28, 28, 1))).shape
        (3, 10)
    """

    num_classes: int = 10
    hidden: tuple[int, ...] = (200, 200)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape((x.shape[0], -1))
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)


MODELS: dict[str, Callable[..., nn.Module]] = {"cnn": MnistCNN, "mlp": MLP}


def make_model(name: str, num_classes: int) -> nn.Module:
    """Build a model by name from ``MODELS``.

    Example:
        >>> make_model("cnn", 10)
        MnistCNN(
            # attributes
            num_classes = 10
        )
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    return MODELS[name](num_classes=num_classes)


def count_params(params) -> int:
    """Total number of scalars in a parameter pytree (arrays or ``jax.eval_shape`` structs).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> count_params({"w": jnp.zeros((3, 4)), "b": jnp.zeros(4)})
        16
    """
    # Read .shape rather than the data so abstract params from jax.eval_shape count without allocating.
    return int(sum(math.prod(jnp.shape(leaf)) for leaf in jax.tree_util.tree_leaves(params)))
