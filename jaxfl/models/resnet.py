"""CIFAR-style ResNet-18 (FedCompass Tables 10-11; PORT; CC-FedAvg), with BatchNorm or GroupNorm.

Stem: Conv 3x3 (64, stride 1, no bias) + norm + ReLU, **no max-pool**. Four stages of two
BasicBlocks, widths 64/128/256/512, first-block strides 1/2/2/2. Block: conv3x3 -> norm -> ReLU ->
conv3x3 -> norm, plus a shortcut (1x1 conv + norm when the shape changes), then ReLU. Head: global
average pool (= AvgPool(4) on 32x32 inputs) -> Dense. 11,173,962 parameters for 10 classes on
32x32x3 with either norm (both have a scale and a bias per channel).

- ``ResNet18`` (BatchNorm): the running mean/variance live in the ``batch_stats`` collection,
  updated when called with ``train=True`` (PyTorch momentum 0.1 = flax momentum 0.9, eps 1e-5).
- ``ResNet18GN`` (GroupNorm, 16 groups): stateless. CC-FedAvg's code also zero-initialises each
  block's last norm (``zero_init_last=True``, default) and keeps **BatchNorm** on the projection
  shortcuts; that quirk is ``shortcut_norm="batch"`` (default ``"group"``: pure GroupNorm, which
  is what the paper describes).
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["ResNet18", "ResNet18GN", "BasicBlock"]


def _norm(kind: str, train: bool, groups: int, zero_init: bool = False, name: str | None = None) -> nn.Module:
    scale_init = nn.initializers.zeros if zero_init else nn.initializers.ones
    if kind == "batch":
        return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, scale_init=scale_init,
                            name=name)
    if kind == "group":
        return nn.GroupNorm(num_groups=groups, epsilon=1e-5, scale_init=scale_init, name=name)
    raise ValueError(f"norm={kind!r} is not allowed; expected 'batch' or 'group'")


class BasicBlock(nn.Module):
    """ResNet basic block ``(B, H, W, C_in) -> (B, H / s, W / s, features)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> block = BasicBlock(features=8, strides=2)
        >>> v = block.init(jax.random.key(0), jnp.zeros((1, 8, 8, 4)))
        >>> block.apply(v, jnp.zeros((1, 8, 8, 4))).shape
        (1, 4, 4, 8)
    """

    features: int
    strides: int = 1
    norm: str = "batch"
    shortcut_norm: str | None = None  # None: same as norm
    groups: int = 16
    zero_init_last: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        y = nn.Conv(self.features, (3, 3), strides=self.strides, padding=1, use_bias=False)(x)
        y = nn.relu(_norm(self.norm, train, self.groups)(y))
        y = nn.Conv(self.features, (3, 3), padding=1, use_bias=False)(y)
        y = _norm(self.norm, train, self.groups, zero_init=self.zero_init_last)(y)
        if self.strides != 1 or x.shape[-1] != self.features:
            x = nn.Conv(self.features, (1, 1), strides=self.strides, use_bias=False)(x)
            x = _norm(self.shortcut_norm or self.norm, train, self.groups)(x)
        return nn.relu(x + y)


class ResNet18(nn.Module):
    """CIFAR-style ResNet-18 with BatchNorm (FedCompass's CIFAR-10 model; PORT's).

    Call with ``train=True`` (and ``mutable=["batch_stats"]``) to normalise by batch statistics
    and update the running averages; ``train=False`` uses the running averages.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxfl.models import count_params
        >>> shapes = jax.eval_shape(ResNet18().init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
        >>> count_params(shapes["params"])
        11173962
    """

    num_classes: int = 10
    widths: Sequence[int] = (64, 128, 256, 512)
    blocks: Sequence[int] = (2, 2, 2, 2)
    norm: str = "batch"
    shortcut_norm: str | None = None
    groups: int = 16
    zero_init_last: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = nn.Conv(self.widths[0], (3, 3), padding=1, use_bias=False)(x)  # (B, 32, 32, 64)
        x = nn.relu(_norm(self.norm, train, self.groups)(x))
        for stage, (width, count) in enumerate(zip(self.widths, self.blocks)):
            for index in range(count):
                strides = 2 if stage > 0 and index == 0 else 1
                x = BasicBlock(width, strides, self.norm, self.shortcut_norm, self.groups,
                               self.zero_init_last)(x, train)
        x = jnp.mean(x, axis=(1, 2))  # (B, 512); AvgPool(4) on the 4x4 map of a 32x32 input
        return nn.Dense(self.num_classes)(x)


class ResNet18GN(ResNet18):
    """ResNet-18 with GroupNorm (CC-FedAvg's CIFAR-100 model): no running statistics, no state.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = ResNet18GN(num_classes=100)
        >>> v = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
        >>> sorted(v)
        ['params']
    """

    norm: str = "group"
    zero_init_last: bool = True
