"""CIFAR image models of the seed papers: ResNet-20, VGG-11/16 with BatchNorm, and AlexNet.

- ``ResNet20``: He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), Sec. 4.2
  (FedASMU's CIFAR-100 and Tiny-ImageNet model).
- ``VGG11`` / ``VGG16``: the CIFAR VGG of Simonyan & Zisserman (ICLR 2015) configurations A and D
  with BatchNorm after every convolution and a single 512 -> classes classifier (PORT's
  CINIC-10 VGG-16, "with BatchNorm, one FC layer 512 -> 10"; FedASMU's VGG-11). VGG-16 is PLATO's
  (``plato/models/vgg.py``, where PORT ran): its fifth pool is a 2x2 average, not a max.
- ``AlexNet``: the CIFAR AlexNet (FedASMU's AlexNet; the paper gives no layers, so this is the
  common CIFAR variant of Krizhevsky et al., NeurIPS 2012, from Wei Yang's widely used
  pytorch-classification: five convolutions, no local response normalisation, one classifier).

BatchNorm models keep their running mean and variance in the ``batch_stats`` collection, updated
when called with ``train=True`` (PyTorch momentum 0.1 = flax momentum 0.9, eps 1e-5), as
:class:`~jaxfl.models.resnet.ResNet18` does; the engine carries them as the model's state.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["ResNet20", "VGG", "VGG11", "VGG16", "AlexNet", "VGG_LAYERS"]


def _batch_norm(train: bool) -> nn.BatchNorm:
    return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5)


def _shortcut_a(x: jax.Array, features: int, strides: int) -> jax.Array:
    """He et al.'s option-A shortcut: subsample by ``strides``, zero-pad the new channels (no parameters)."""
    x = x[:, ::strides, ::strides, :]
    extra = features - x.shape[-1]
    return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)))


class _ResNet20Block(nn.Module):
    """:class:`~jaxfl.models.resnet.BasicBlock`'s main path with the option-A shortcut
    (:func:`_shortcut_a`, no parameters) where BasicBlock projects (1x1 conv + norm): ResNet-20's
    parameter count depends on it, so the two blocks stay apart."""

    features: int
    strides: int = 1

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        y = nn.Conv(self.features, (3, 3), strides=self.strides, padding=1, use_bias=False)(x)
        y = nn.relu(_batch_norm(train)(y))
        y = nn.Conv(self.features, (3, 3), padding=1, use_bias=False)(y)
        y = _batch_norm(train)(y)
        if self.strides != 1 or x.shape[-1] != self.features:
            x = _shortcut_a(x, self.features, self.strides)
        return nn.relu(x + y)


class ResNet20(nn.Module):
    """CIFAR ResNet-20 (He et al., CVPR 2016, Sec. 4.2): 269,722 parameters for 10 classes.

    Conv 3x3 (16, no bias) + BatchNorm + ReLU, then three stages of ``n = 3`` basic blocks with
    16/32/64 channels on 32/16/8-pixel maps (the first block of stages 2 and 3 has stride 2),
    global average pooling and a Dense classifier: 6n + 2 = 20 weighted layers.

    The shortcuts are **option A** (identity; where the shape changes, a stride-2 subsampling
    zero-padded to the new width), the choice of the paper's CIFAR experiments ("our residual
    models have exactly the same depth, width, and number of parameters as the plain
    counterparts"); it gives the paper's 0.27 M parameters (option B's 1x1 projections with
    BatchNorm would add 2,752).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxfl.models import count_params
        >>> shapes = jax.eval_shape(ResNet20().init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
        >>> count_params(shapes["params"]), sorted(shapes)
        (269722, ['batch_stats', 'params'])
    """

    num_classes: int = 10
    widths: Sequence[int] = (16, 32, 64)
    blocks_per_stage: int = 3

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = nn.Conv(self.widths[0], (3, 3), padding=1, use_bias=False)(x)
        x = nn.relu(_batch_norm(train)(x))
        for stage, width in enumerate(self.widths):
            for index in range(self.blocks_per_stage):
                x = _ResNet20Block(width, 2 if stage > 0 and index == 0 else 1)(x, train)
        x = jnp.mean(x, axis=(1, 2))  # (B, 64): the 8x8 map of a 32x32 input, averaged
        return nn.Dense(self.num_classes)(x)


# Output channels of each 3x3 convolution, "M" a 2x2 max-pool, "A" a 2x2 average pool (Simonyan &
# Zisserman, Table 1). VGG-16's last pool is PLATO's AvgPool2d(2) after its layer plan (PORT ran in
# PLATO); VGG-11 is kuangliu's, whose plan ends in a max-pool.
VGG_LAYERS: dict[str, tuple] = {
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "A"),
}


class VGG(nn.Module):
    """CIFAR VGG with BatchNorm: each ``layers`` entry a Conv 3x3 (padding 1, with bias) +
    BatchNorm + ReLU, ``"M"`` a 2x2 max-pool or ``"A"`` a 2x2 average pool; then flatten and one Dense classifier
    (512 -> classes on 32x32 inputs, whose five pools leave a 1x1 map).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = VGG(layers=(8, "M", 16, "M"), num_classes=3)
        >>> x = jnp.zeros((2, 8, 8, 3))
        >>> variables = jax.eval_shape(model.init, jax.random.key(0), x)  # shapes only: nothing computed
        >>> jax.eval_shape(model.apply, variables, x).shape
        (2, 3)
    """

    layers: Sequence[int | str] = VGG_LAYERS["vgg16"]
    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        for layer in self.layers:
            if layer == "M":
                x = nn.max_pool(x, (2, 2), strides=(2, 2))
            elif layer == "A":
                x = nn.avg_pool(x, (2, 2), strides=(2, 2))
            else:
                x = nn.relu(_batch_norm(train)(nn.Conv(int(layer), (3, 3), padding=1)(x)))
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


class VGG11(VGG):
    """CIFAR VGG-11 with BatchNorm (configuration A; FedASMU's VGG): 9,231,114 parameters for 10 classes.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxfl.models import count_params
        >>> shapes = jax.eval_shape(VGG11().init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
        >>> count_params(shapes["params"])
        9231114
    """

    layers: Sequence[int | str] = VGG_LAYERS["vgg11"]


class VGG16(VGG):
    """CIFAR VGG-16 with BatchNorm (configuration D; PORT's CINIC-10 model, as PLATO builds it: the
    fifth pool a 2x2 average): 14,728,266 parameters for 10 classes.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxfl.models import count_params
        >>> shapes = jax.eval_shape(VGG16().init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
        >>> count_params(shapes["params"])
        14728266
    """

    layers: Sequence[int | str] = VGG_LAYERS["vgg16"]


class AlexNet(nn.Module):
    """CIFAR AlexNet (FedASMU's AlexNet): 2,472,266 parameters for 10 classes on 32x32x3.

    Conv(64, 11x11, stride 4, pad 5) -> ReLU -> MaxPool 2 -> Conv(192, 5x5, pad 2) -> ReLU ->
    MaxPool 2 -> Conv(384, 3x3, pad 1) -> ReLU -> Conv(256, 3x3, pad 1) -> ReLU -> Conv(256, 3x3,
    pad 1) -> ReLU -> MaxPool 2 -> Flatten (256 on a 32x32 input) -> Dense classes. FedASMU
    (Liu et al., AAAI 2024) names AlexNet without its layers; this is the common CIFAR variant of
    Wei Yang's pytorch-classification (its README: 2.47 M parameters), not ImageNet's 224x224 net.
    Inputs need H, W >= 29 (the last max-pool needs a 2x2 map).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxfl.models import count_params
        >>> model, x = AlexNet(num_classes=10), jnp.zeros((2, 32, 32, 3))
        >>> variables = jax.eval_shape(model.init, jax.random.key(0), x)  # shapes only: nothing computed
        >>> jax.eval_shape(model.apply, variables, x).shape, count_params(variables)
        ((2, 10), 2472266)
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Conv(64, (11, 11), strides=4, padding=5)(x))  # (B, 8, 8, 64)
        x = nn.max_pool(x, (2, 2), strides=(2, 2))  # (B, 4, 4, 64)
        x = nn.relu(nn.Conv(192, (5, 5), padding=2)(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))  # (B, 2, 2, 192)
        x = nn.relu(nn.Conv(384, (3, 3), padding=1)(x))
        x = nn.relu(nn.Conv(256, (3, 3), padding=1)(x))
        x = nn.relu(nn.Conv(256, (3, 3), padding=1)(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))  # (B, 1, 1, 256)
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))
