"""Small Flax (linen) image models of the seed papers: CNNs, MLPs, LeNet-5, logistic regression.

Modules take float32 inputs ``(B, H, W, C)`` (or ``(B, D)`` features) already scaled and return
logits ``(B, num_classes)``. They are written for one client; the engine vmaps them. Modules with
dropout take ``train`` (default False: deterministic) and a ``"dropout"`` RNG when training.
"""

from __future__ import annotations

import flax.linen as nn
import jax

__all__ = ["MnistCNN", "ExampleCNN", "MLP", "LogReg", "LeNet5", "CCFedAvgCNN", "CCFedAvgMLP", "FedASMUCNN"]


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


class ExampleCNN(nn.Module):
    """The CNN of PyTorch's MNIST example (also Flower's and FedML's tutorials): the cross-device
    speed benchmark's model; 1,199,882 parameters on 28x28x1 with 10 classes.

    Conv(32, 3x3, VALID) -> ReLU -> Conv(64, 3x3, VALID) -> ReLU -> MaxPool 2 -> Flatten(12*12*64 =
    9216) -> Dense 128 -> ReLU -> Dense num_classes. The example's two dropout layers are left out:
    the benchmark compares step costs, and dropout would make the PyTorch and JAX runs draw
    different masks.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = ExampleCNN(num_classes=10)
        >>> params = model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
        >>> model.apply(params, jnp.zeros((2, 28, 28, 1))).shape
        (2, 10)
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Conv(32, (3, 3), padding="VALID")(x))  # (B, 26, 26, 32)
        x = nn.relu(nn.Conv(64, (3, 3), padding="VALID")(x))  # (B, 24, 24, 64)
        x = nn.max_pool(x, (2, 2), strides=(2, 2))  # (B, 12, 12, 64)
        x = x.reshape((x.shape[0], -1))  # (B, 9216)
        x = nn.relu(nn.Dense(128)(x))
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


class LogReg(nn.Module):
    """Multinomial logistic regression (FedProx's model for its synthetic data): flatten, one Dense.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = LogReg(num_classes=10)
        >>> params = model.init(jax.random.key(0), jnp.zeros((1, 60)))
        >>> model.apply(params, jnp.zeros((2, 60))).shape
        (2, 10)
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


class LeNet5(nn.Module):
    """LeNet-5 as PLATO builds it (PORT; FedASMU's "LeNet5"): 61,706 parameters on 28x28x1.

    Conv(6, 5x5, pad 2) -> ReLU -> MaxPool 2 -> Conv(16, 5x5) -> ReLU -> MaxPool 2 -> Conv(120, 5x5)
    -> ReLU -> Flatten -> Dense 84 -> ReLU -> Dense num_classes. The padding makes a 28x28 image
    behave like LeCun's 32x32 input; on 32x32 (CIFAR) the last conv map is 2x2 (Dense 480 -> 84).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = LeNet5(num_classes=10)
        >>> params = model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
        >>> model.apply(params, jnp.zeros((2, 28, 28, 1))).shape
        (2, 10)
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Conv(6, (5, 5), padding=2)(x))  # (B, 28, 28, 6)
        x = nn.max_pool(x, (2, 2), strides=(2, 2))  # (B, 14, 14, 6)
        x = nn.relu(nn.Conv(16, (5, 5), padding="VALID")(x))  # (B, 10, 10, 16)
        x = nn.max_pool(x, (2, 2), strides=(2, 2))  # (B, 5, 5, 16)
        x = nn.relu(nn.Conv(120, (5, 5), padding="VALID")(x))  # (B, 1, 1, 120)
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(84)(x))
        return nn.Dense(self.num_classes)(x)


class CCFedAvgCNN(nn.Module):
    """CC-FedAvg's CIFAR-10 "CNN" (its code: LeNet-style, no norm layers); 62,006 parameters on 32x32x3.

    Conv(6, 5x5) -> ReLU -> MaxPool 2 -> Conv(16, 5x5) -> ReLU -> MaxPool 2 -> Flatten(400) ->
    Dense 120 -> ReLU -> Dense 84 -> ReLU -> Dense num_classes.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = CCFedAvgCNN(num_classes=10)
        >>> params = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
        >>> model.apply(params, jnp.zeros((2, 32, 32, 3))).shape
        (2, 10)
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.max_pool(nn.relu(nn.Conv(6, (5, 5), padding="VALID")(x)), (2, 2), strides=(2, 2))  # (B, 14, 14, 6)
        x = nn.max_pool(nn.relu(nn.Conv(16, (5, 5), padding="VALID")(x)), (2, 2), strides=(2, 2))  # (B, 5, 5, 16)
        x = x.reshape((x.shape[0], -1))  # (B, 400)
        x = nn.relu(nn.Dense(120)(x))
        x = nn.relu(nn.Dense(84)(x))
        return nn.Dense(self.num_classes)(x)


class CCFedAvgMLP(nn.Module):
    """CC-FedAvg's FMNIST MLP as its code builds it (``--model mlp``): 784 -> 50 (dropout 0.5, ReLU) -> 10.

    The paper says "3 fully connected layers"; the code's model has two Linear layers (CC-FedAvg,
    Zhang et al., IEEE IoT Journal 2024, Sec. VI, and the authors' code). 39,760 parameters on 28x28x1.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = CCFedAvgMLP(num_classes=10)
        >>> params = model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
        >>> model.apply(params, jnp.zeros((2, 28, 28, 1))).shape
        (2, 10)
    """

    num_classes: int = 10
    hidden: int = 50
    dropout: float = 0.5

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = nn.Dense(self.hidden)(x.reshape((x.shape[0], -1)))
        x = nn.relu(nn.Dropout(self.dropout, deterministic=not train)(x))
        return nn.Dense(self.num_classes)(x)


class FedASMUCNN(nn.Module):
    """FedASMU's small CNN (its Table 3): Conv(64, 2x2) -> ReLU -> Conv(32, 2x2) -> ReLU -> Flatten -> Dense.

    Stride 1, no padding and ReLU are our reading of FedASMU's setup (Liu et al., AAAI 2024); the Dense has
    ``num_classes`` units (the table's 10 is CIFAR-10's).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = FedASMUCNN(num_classes=10)
        >>> params = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
        >>> model.apply(params, jnp.zeros((2, 32, 32, 3))).shape
        (2, 10)
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Conv(64, (2, 2), padding="VALID")(x))
        x = nn.relu(nn.Conv(32, (2, 2), padding="VALID")(x))
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))
