"""PyTorch's default initialisation for flax parameters (``RunConfig(weight_init="pytorch")``).

The seed papers' code trains PyTorch models at their layers' default initialisation: a
``nn.Linear`` or ``nn.Conv2d`` draws its weight from kaiming_uniform(a=√5), which is
U(±1/√fan_in), and its bias from U(±1/√fan_in) of the same fan-in; an ``nn.Embedding`` draws N(0, 1).
flax draws LeCun-normal weights (a √3 larger std) and zero biases, so the same architecture starts
elsewhere. :func:`pytorch_default_init` redraws a flax parameter tree the PyTorch way, by its leaves'
names and shapes:

- ``kernel`` of rank 2 (a Dense, ``(in, out)``): fan_in = in; of rank ≥ 3 (a Conv, ``(*window,
  in / groups, out)``): fan_in = the product of all but the last axis. A ``bias`` beside it: the
  same bound.
- ``embedding``: N(0, 1).
- Everything else (BatchNorm's and GroupNorm's ``scale`` 1 and ``bias`` 0, as in PyTorch; a
  kernel-less ``bias``): unchanged.

An LSTM's gates are Dense layers in flax, so each takes its own fan-in (the input's for the input
kernels, the hidden size for the recurrent ones), where PyTorch's ``nn.LSTM`` draws every weight and
bias from U(±1/√hidden). Models whose authors set another initialisation in code (akamaster's
ResNet-20: kaiming_normal) are drawn with PyTorch's defaults all the same.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["pytorch_default_init"]


def _name(entry) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def _fan_in(kernel) -> int:
    return int(kernel.shape[0]) if kernel.ndim == 2 else int(math.prod(kernel.shape[:-1]))


def pytorch_default_init(params, key: jax.Array):
    """``params`` (a flax parameter tree) with every Dense/Conv kernel and its bias drawn from
    U(±1/√fan_in) and every embedding from N(0, 1), as PyTorch's layers initialise themselves;
    other leaves unchanged. Deterministic in ``key``; each leaf takes its own stream.

    Example:
        >>> import flax.linen as nn, jax, jax.numpy as jnp
        >>> params = nn.Dense(3).init(jax.random.key(0), jnp.zeros((1, 4)))["params"]
        >>> redrawn = pytorch_default_init(params, jax.random.key(1))
        >>> bool(jnp.all(jnp.abs(redrawn["kernel"]) <= 0.5)), bool(jnp.any(redrawn["bias"] != 0))
        (True, True)
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    kernels = {tuple(_name(entry) for entry in path[:-1]): leaf for path, leaf in leaves
               if path and _name(path[-1]) == "kernel" and getattr(leaf, "ndim", 0) >= 2}
    redrawn = []
    for index, (path, leaf) in enumerate(leaves):
        name = _name(path[-1]) if path else ""
        parent = tuple(_name(entry) for entry in path[:-1])
        stream = jax.random.fold_in(key, index)
        dtype = getattr(leaf, "dtype", jnp.float32)
        if name in ("kernel", "bias") and parent in kernels:
            bound = 1.0 / math.sqrt(max(1, _fan_in(kernels[parent])))
            leaf = jax.random.uniform(stream, leaf.shape, dtype, -bound, bound)
        elif name == "embedding" and getattr(leaf, "ndim", 0) == 2:
            leaf = jax.random.normal(stream, leaf.shape, dtype)
        redrawn.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, redrawn)
