"""Faster forms of three layers on XLA:CPU, applied to any model by rewriting its jaxpr.

Measured on the 2-core development CPU (jax 0.10.2), PyTorch's MNIST example CNN, one SGD step:
XLA:CPU's convolution (forward and backward) and its max-pool gradient (``select_and_scatter``)
are most of the step. The same functions written as

- a convolution → its im2col form: the shifted input windows side by side on the feature axis
  (built in one fused loop, :func:`_patches`) and one matrix product with the reshaped kernel
  (vmapped clients then make a batched matmul rather than a grouped convolution);
- a max-pool whose windows tile the input (window = stride, no padding) → a reshape and a max,
  with XLA's own gradient (the cotangent to each window's first maximum) in one fused loop
  (:func:`tiled_max_pool`; XLA's ``select_and_scatter`` takes three passes)

run a training step 1.9× faster at batch 10 (12.1 → 6.4 ms) and 2.7× at batch 64 (127 → 46 ms).
And a dense layer's matrix product ``x @ W`` (``W`` of shape (in, out), contracted on its first
axis, as ``flax.linen.Dense`` does) → the same product with its own gradient rule, which computes
the kernel's gradient as ``xᵀ g`` laid out (in, out) like ``W``. JAX's rule computes ``gᵀ x`` of
shape (out, in) and transposes it, and XLA:CPU folds that transpose into the optimiser's update of
``W``, a strided pass over the whole kernel. For the example CNN's 9216 × 128 layer at batch 10
that product and update were 19 % of the step's traced operations on one core, 8 % in this form,
and a step costs 7–9 % less CPU time (``benchmarks/cpu_step.py``, figures in benchmarks/README.md).
Values are the same up to float reassociation (the dense gradient sums the same terms; on the
development CPU it is bit-identical); the max-pool and its gradient are bit-identical to XLA's,
tied maxima and NaNs included.

:func:`cpu_friendly` wraps a function (the model's forward pass): every call traces it to a
jaxpr and evaluates that with the three rewrites, so it applies to user models as well, including
under ``vmap`` and ``grad`` (not forward-mode ``jvp``, which a custom gradient rule does not
support: JAX says so if asked). Convolutions with groups or dilation, and wide ones with a small
contraction (fewer than ``MIN_IM2COL_CONTRACTION`` inputs per output and at least ``MIN_XLA_FEATURES``
outputs, e.g. a first layer on one channel to 32 features, where XLA's own is as fast or faster) are
left as they are, as is everything inside loops and custom derivative rules.

>>> import jax, jax.numpy as jnp, flax.linen as nn
>>> conv = nn.Conv(8, (3, 3), padding="VALID")
>>> params = conv.init(jax.random.key(0), jnp.zeros((1, 6, 6, 4)))
>>> x = jax.random.normal(jax.random.key(1), (2, 6, 6, 4))
>>> bool(jnp.allclose(cpu_friendly(conv.apply)(params, x), conv.apply(params, x), atol=1e-5))
True
"""
from __future__ import annotations

import functools
import itertools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["MIN_IM2COL_CONTRACTION", "MIN_XLA_FEATURES", "count_primitive", "cpu_friendly", "dense_product",
           "largest_patches_bytes", "tiled_max_pool"]

# Contraction sizes (kernel height × width × input channels) from which the im2col form is faster:
# measured, a 3×3 convolution on 1 channel (9) is faster as XLA's, on 32 channels (288) as im2col.
MIN_IM2COL_CONTRACTION = 32
# ... unless the convolution has fewer output features than this. Such a narrow layer (LeNet-5's first,
# 5x5 on 1 channel to 6) costs the same either way, but left to XLA it keeps the whole step in
# unrolled chunks (XLA:CPU's convolutions are several times slower inside a loop), and without it
# the step runs as one rolled loop: LeNet-5's client step 10 % faster at batch 32 and 27 % at batch
# 10 (2026-11-29, AMD EPYC core, 5 vmapped clients). Wide first layers stay XLA's: in im2col form
# the MNIST CNN's (5x5 on 1 channel to 32) made its rolled step 1-6 % slower than its unrolled one.
MIN_XLA_FEATURES = 32


def cpu_friendly(function: Callable, *, inference: bool = False, every_convolution: bool = False) -> Callable:
    """``function`` with its convolutions in im2col form and its tiling max-pools as reshapes (see
    the module docstring); same arguments, same outputs.

    ``inference=True`` is for a function that is not differentiated (an evaluation's forward pass):
    only narrow convolutions (fewer than ``MIN_XLA_FEATURES`` output features) take the im2col form,
    since XLA's forward convolution is fast on wide ones (the MNIST CNN's held-out evaluation took
    2.6x as long with the whole rewrite; LeNet-5's is 1.1x faster this way); max-pools and dense
    layers keep XLA's forms (the reshaped pool's forward is slower than XLA's, and its rule and the
    dense layer's change only the gradient).

    ``every_convolution=True`` puts every convolution it can rewrite in im2col form, wide ones with a
    small contraction too: the form to measure for vmapped clients on an accelerator, where XLA's
    vmapped convolution is a grouped one and the im2col form a batched matrix product
    (``benchmarks/client_batching.py --im2col``).

    >>> import flax.linen as nn
    >>> conv = nn.Conv(6, (5, 5), padding="VALID")
    >>> params = conv.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> x = jax.random.normal(jax.random.key(1), (2, 8, 8, 1))
    >>> bool(jnp.allclose(cpu_friendly(conv.apply, inference=True)(params, x), conv.apply(params, x), atol=1e-5))
    True
    """

    def rewritten(*args, **options):  # options (flax's train=True) as the function takes them, held fixed
        closed, out_shape = jax.make_jaxpr(functools.partial(function, **options), return_shape=True)(*args)
        outputs = _evaluate(closed.jaxpr, closed.consts, jax.tree.leaves(args), inference, every_convolution)
        return jax.tree.unflatten(jax.tree.structure(out_shape), outputs)

    return rewritten


def count_primitive(jaxpr, name: str) -> int:
    """How often primitive ``name`` occurs in a jaxpr and the jaxprs nested in it (a jit, a scan's
    body, a cond's branches, a custom derivative's function).

    >>> count_primitive(jax.make_jaxpr(lambda x: jnp.sin(jnp.sin(x)))(1.0).jaxpr, "sin")
    2
    """
    total = 0
    for eqn in jaxpr.eqns:
        total += eqn.primitive.name == name
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's jaxpr
                if hasattr(inner, "eqns"):
                    total += count_primitive(inner, name)
    return total


def largest_patches_bytes(function: Callable, *args, inference: bool = False) -> int:
    """Bytes of the largest im2col patch matrix that ``cpu_friendly(function, inference=inference)``
    builds when called with ``args`` (0: it builds none). The patches are the largest array of such a
    forward pass, several times its input (LeNet-5's first layer: 25 values per output pixel, 78 kB an
    image), so they decide how large a batch still runs in the CPU's cache (see
    :func:`jaxfl.experiment.evaluation_batch_size`).

    >>> import flax.linen as nn
    >>> conv = nn.Conv(6, (5, 5), padding="VALID")  # on (2, 8, 8, 1): 2·4·4 windows of 5·5·1 float32
    >>> params = conv.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> largest_patches_bytes(conv.apply, params, jnp.zeros((2, 8, 8, 1)), inference=True)
    3200
    """
    closed = jax.make_jaxpr(function)(*args)
    return _largest_patches(closed.jaxpr, inference)


def _largest_patches(jaxpr, inference: bool) -> int:
    largest = 0
    for eqn in jaxpr.eqns:  # the equations _evaluate rewrites: the top level and the jits in it
        if eqn.primitive.name == "conv_general_dilated" and _im2col_applies(eqn, inference):
            spec = eqn.params["dimension_numbers"]
            rhs, out = eqn.invars[1].aval, eqn.outvars[0].aval
            window = np.prod([rhs.shape[axis] for axis in spec.rhs_spec[1:]])  # C·kh·kw
            positions = np.prod([out.shape[axis] for axis in (spec.out_spec[0], *spec.out_spec[2:])])  # N·H'·W'
            largest = max(largest, int(window * positions) * np.dtype(eqn.invars[0].aval.dtype).itemsize)
        elif eqn.primitive.name in ("pjit", "jit", "closed_call") and "jaxpr" in eqn.params:
            largest = max(largest, _largest_patches(eqn.params["jaxpr"].jaxpr, inference))
    return largest


def _evaluate(jaxpr, consts, args, inference: bool = False, every_convolution: bool = False) -> list:
    from jax.extend.core import Literal

    env = {}
    read = lambda var: var.val if isinstance(var, Literal) else env[var]  # noqa: E731
    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        inputs = [read(var) for var in eqn.invars]
        name = eqn.primitive.name
        if name == "conv_general_dilated" and _im2col_applies(eqn, inference, every_convolution):
            outputs = [_im2col_convolution(*inputs, **eqn.params)]
        elif name == "dot_general" and not inference and _is_dense(eqn):
            outputs = [dense_product(*inputs)]
        elif name == "reduce_window_max" and not inference and _tiles(eqn):
            outputs = [_tiled_max(inputs[0], eqn.params["window_dimensions"])]
        elif name in ("pjit", "jit", "closed_call") and "jaxpr" in eqn.params:
            inner = eqn.params["jaxpr"]
            outputs = _evaluate(inner.jaxpr, inner.consts, inputs, inference, every_convolution)
        else:
            with eqn.ctx.manager:
                outputs = eqn.primitive.bind(*inputs, **eqn.primitive.get_bind_params(eqn.params))
            if not eqn.primitive.multiple_results:
                outputs = [outputs]
        env.update(zip(eqn.outvars, outputs))
    return [read(var) for var in jaxpr.outvars]


def _im2col_applies(eqn, inference: bool = False, every_convolution: bool = False) -> bool:
    params = eqn.params
    lhs, rhs = (var.aval for var in eqn.invars)
    if lhs.ndim != 4 or params["feature_group_count"] != 1 or params["batch_group_count"] != 1:
        return False
    if any(d != 1 for d in params["lhs_dilation"]) or any(d != 1 for d in params["rhs_dilation"]):
        return False
    if any(low < 0 or high < 0 for low, high in params["padding"]):
        return False
    if every_convolution:
        return True
    spec = params["dimension_numbers"].rhs_spec  # (out, in, spatial...)
    contraction = rhs.shape[spec[1]] * rhs.shape[spec[2]] * rhs.shape[spec[3]]
    narrow = rhs.shape[spec[0]] < MIN_XLA_FEATURES
    return narrow if inference else contraction >= MIN_IM2COL_CONTRACTION or narrow


def _im2col_convolution(lhs, rhs, *, window_strides, padding, dimension_numbers, preferred_element_type=None,
                        **unused):
    lhs_spec, rhs_spec, out_spec = dimension_numbers.lhs_spec, dimension_numbers.rhs_spec, dimension_numbers.out_spec
    x = jnp.transpose(lhs, (lhs_spec[0], lhs_spec[2], lhs_spec[3], lhs_spec[1]))  # (N, H, W, C)
    kernel = jnp.transpose(rhs, (rhs_spec[2], rhs_spec[3], rhs_spec[1], rhs_spec[0]))  # (kh, kw, C, O)
    x = jnp.pad(x, ((0, 0), tuple(padding[0]), tuple(padding[1]), (0, 0)))
    kh, kw, channels, features = kernel.shape
    (sh, sw), (height, width) = window_strides, x.shape[1:3]
    out_h, out_w = (height - kh) // sh + 1, (width - kw) // sw + 1
    out = jnp.matmul(_patches(x, kh, kw, sh, sw, out_h, out_w), kernel.reshape(kh * kw * channels, features),
                     preferred_element_type=preferred_element_type)  # (N, H', W', O)
    return jnp.transpose(out, np.argsort((out_spec[0], out_spec[2], out_spec[3], out_spec[1])))


def _patches(x, kh, kw, sh, sw, out_h, out_w):
    """The im2col patches (N, H', W', kh·kw·C) of ``x`` (N, H, W, C), window (i, j) at features
    ``(i·kw + j)·C …``. XLA:CPU never fuses a concatenation on the minor axis (nor one of more than 8
    operands): the kh·kw windows concatenated on the channel axis were each written out and then
    copied again. Stacked instead on two new axes before the channels — the kernel columns, then the
    kernel rows, two different axes so that XLA does not merge the two concatenations into one —
    and reshaped (free: the same row-major bytes), they are built in one fused pass."""
    rows = [jnp.concatenate([x[:, i:i + (out_h - 1) * sh + 1:sh, j:j + (out_w - 1) * sw + 1:sw, None, None, :]
                             for j in range(kw)], axis=4) for i in range(kh)]  # each (N, H', W', 1, kw, C)
    n, channels = x.shape[0], x.shape[3]
    return jnp.concatenate(rows, axis=3).reshape(n, out_h, out_w, kh * kw * channels)


def _tiles(eqn) -> bool:
    params = eqn.params
    return (tuple(params["window_dimensions"]) == tuple(params["window_strides"])
            and all(pad == (0, 0) for pad in map(tuple, params["padding"]))
            and all(d == 1 for d in params["base_dilation"]) and all(d == 1 for d in params["window_dilation"]))


def _tiled_max(x, window):
    """VALID max-pool with stride = window: crop the remainder, split each axis into (blocks, window)."""
    return tiled_max_pool(x, tuple(window))


def _window_blocks(x, window):
    """``x`` cropped to whole windows and each windowed axis split into (blocks, window): the
    window's axes (the reduced ones) and the input's shape with every windowed axis split. Axes of
    window 1 stay whole (XLA:CPU reduces over fewer, real axes faster)."""
    x = x[tuple(slice(0, size - size % w) for size, w in zip(x.shape, window))]
    shape, window_axes = [], []
    for size, w in zip(x.shape, window):
        shape += [size // w, w] if w > 1 else [size]
        if w > 1:
            window_axes.append(len(shape) - 1)
    return x.reshape(shape), tuple(window_axes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def tiled_max_pool(x, window):
    """The max-pool of ``x`` over windows of shape ``window`` (one size per axis) that tile it (stride =
    window, VALID: a remainder is dropped), as a reshape and a max, with XLA's own gradient.

    XLA's gradient of ``reduce_window`` max (``select_and_scatter_add``, select ``ge``) walks each
    window in row-major order, keeps the element chosen so far while it is ``>=`` the next and
    otherwise takes the next, and gives the whole cotangent to the one it ends on: the first maximum
    where several are equal (common after a ReLU: zeros), and after a NaN the next element. That
    costs XLA:CPU three passes; the rule here makes the same choice with the same comparisons, as
    elementwise selects over the window's positions, in one fused loop. So the gradient is
    bit-identical to XLA's, ties and NaNs included, where JAX's rule for a max over the reshaped axes
    would split the cotangent among tied maxima.

    >>> x = jnp.array([[1.0, 3.0, 0.0, 0.0], [3.0, 2.0, 0.0, 0.0]])
    >>> tiled_max_pool(x, (2, 2))
    Array([[3., 0.]], dtype=float32)
    >>> jax.grad(lambda x: jnp.sum(tiled_max_pool(x, (2, 2))))(x)  # the first of the tied maxima
    Array([[0., 1., 1., 0.],
           [0., 0., 0., 0.]], dtype=float32)
    """
    blocks, window_axes = _window_blocks(x, window)
    return jnp.max(blocks, axis=window_axes)


def _tiled_max_pool_forward(x, window):
    return tiled_max_pool(x, window), x


def _tiled_max_pool_backward(window, x, cotangent):
    blocks, window_axes = _window_blocks(x, window)
    sizes = [blocks.shape[axis] for axis in window_axes]
    at = lambda position: blocks[tuple(  # noqa: E731  (the element at ``position`` of every window)
        dict(zip(window_axes, position)).get(axis, slice(None)) for axis in range(blocks.ndim))]
    positions = list(itertools.product(*(range(size) for size in sizes)))  # row-major, as XLA walks a window
    chosen_value, chosen = at(positions[0]), jnp.zeros(cotangent.shape, jnp.int32)
    for index, position in enumerate(positions[1:], 1):
        candidate = at(position)
        keep = chosen_value >= candidate  # XLA's select: ge, the element chosen so far first
        chosen_value, chosen = jnp.where(keep, chosen_value, candidate), jnp.where(keep, chosen, index)
    # each element's row-major position in its window
    position = sum(jax.lax.broadcasted_iota(jnp.int32, blocks.shape, axis) * int(np.prod(sizes[i + 1:]))
                   for i, axis in enumerate(window_axes))
    spread = lambda a: jnp.expand_dims(a, window_axes)  # noqa: E731  (block → its window)
    # XLA adds the cotangent to a zero (0 + g), which turns a -0 into +0: so a zero stays +0 here too
    gradient = jnp.where((spread(chosen) == position) & (spread(cotangent) != 0), spread(cotangent),
                         jnp.zeros((), x.dtype))
    cropped = [size - size % w for size, w in zip(x.shape, window)]
    gradient = gradient.reshape(cropped)
    if tuple(cropped) != x.shape:
        gradient = jnp.pad(gradient, [(0, size - kept) for size, kept in zip(x.shape, cropped)])
    return (gradient,)


tiled_max_pool.defvjp(_tiled_max_pool_forward, _tiled_max_pool_backward)


def _is_dense(eqn) -> bool:
    """A dense layer's product: ``x`` (..., in) times a 2-D ``W`` (in, out), floats of one dtype,
    no batch axes and the default output type (the forms whose gradient rule :func:`dense_product` gives)."""
    (lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
    lhs, rhs = (var.aval for var in eqn.invars)
    return (rhs.ndim == 2 and lhs.ndim >= 1 and tuple(lhs_contracting) == (lhs.ndim - 1,)
            and tuple(rhs_contracting) == (0,) and not lhs_batch and not rhs_batch
            and lhs.dtype == rhs.dtype and jnp.issubdtype(lhs.dtype, jnp.floating)
            and eqn.params.get("preferred_element_type") in (None, lhs.dtype) and eqn.params.get("precision") is None)


@jax.custom_vjp
def dense_product(x, kernel):
    """``x @ kernel`` for ``x`` (..., in) and ``kernel`` (in, out), whose gradient with respect to
    ``kernel`` is computed directly in the kernel's (in, out) layout (see the module docstring).

    >>> x, w = jnp.arange(6.0).reshape(3, 2), jnp.ones((2, 4))
    >>> grad = jax.grad(lambda w: jnp.sum(dense_product(x, w) ** 2))(w)
    >>> bool(jnp.allclose(grad, jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)))
    True
    """
    return _dense_forward(x, kernel)


def _dense_forward(x, kernel):
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


def _dense_product_forward(x, kernel):
    return _dense_forward(x, kernel), (x, kernel)


def _dense_product_backward(residuals, cotangent):
    x, kernel = residuals
    leading = tuple(range(x.ndim - 1))
    # g Wᵀ: (..., out) · (in, out) over out → (..., in)
    x_cotangent = jax.lax.dot_general(cotangent, kernel, (((cotangent.ndim - 1,), (1,)), ((), ())))
    # xᵀ g over every leading axis → (in, out), the kernel's own layout: no transpose after
    kernel_cotangent = jax.lax.dot_general(x, cotangent, ((leading, leading), ((), ())))
    return x_cotangent.astype(x.dtype), kernel_cotangent.astype(kernel.dtype)


dense_product.defvjp(_dense_product_forward, _dense_product_backward)
