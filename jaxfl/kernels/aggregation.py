"""Aggregation kernels: weighted sums over a stacked client axis and the server optimiser.

A stacked pytree has a leading client axis ``K`` on every leaf. The server treats the aggregated
client update as a pseudo-gradient and hands it to an optax transformation (FedOpt, Reddi et al.,
ICLR 2021; its adaptive ones in :mod:`jaxfl.kernels.fedopt`): plain FedAvg is ``optax.sgd(1.0)``
(w ← w − Σ p_i Δ_i); FedAvgM (Hsu et al. 2019) is ``optax.sgd(1.0, momentum=β)`` (v ← βv + Σ p_i Δ_i;
w ← w − v).

>>> import jax.numpy as jnp
>>> stacked = {"w": jnp.array([[1.0, 2.0], [3.0, 4.0]])}        # K = 2 clients
>>> weighted_sum(stacked, jnp.array([0.25, 0.75]))["w"].tolist()
[2.5, 3.5]
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfl.kernels import fedopt
from jaxfl.kernels.tree import (accumulation_dtype, as_structure_of, to_leaf_dtype, tree_add,  # noqa: F401 (tree.py)
                                tree_scale)

from jaxfl.scheduler.staleness import (STALENESS_FUNCTIONS, constant, exponential, hinge,  # noqa: F401
                                       make_staleness, polynomial)

PyTree = Any

SERVER_OPTIMIZERS = ("sgd", "adam", "yogi", "adagrad", "optax_adam", "optax_yogi", "optax_adagrad")
# The options each server optimiser reads (the rest must stay at their defaults: a FedAdam "with
# momentum 0.9" would otherwise be plain FedAdam without a word), and which take an optax schedule.
SERVER_OPTIMIZER_READS = {"sgd": ("momentum",), "adam": ("b1", "b2", "tau"), "yogi": ("b1", "b2", "tau"),
                          "adagrad": ("b1", "tau"), "optax_adam": ("b1", "b2", "tau"),
                          "optax_yogi": ("b1", "b2", "tau"), "optax_adagrad": ("tau",)}
SERVER_OPTIMIZER_DEFAULTS = {"momentum": 0.0, "b1": 0.9, "b2": 0.99, "tau": 1e-3}
TAKE_SCHEDULES = ("sgd", "optax_adam", "optax_yogi", "optax_adagrad")


def _check_weights(stacked: PyTree, weights: jax.Array) -> None:
    """``weights`` of shape ``(K,)`` with ``K`` the leading axis of every leaf (shapes are static: no cost)."""
    if weights.ndim != 1:
        raise ValueError(f"weights must have shape (K,), one per client; got shape {tuple(weights.shape)}")
    for path, leaf in jax.tree_util.tree_leaves_with_path(stacked):
        shape = tuple(jnp.shape(leaf))
        if not shape or shape[0] != weights.shape[0]:
            raise ValueError(f"{weights.shape[0]} weights for a stack of {shape[0] if shape else 'no'} clients "
                             f"(leaf {jax.tree_util.keystr(path)} has shape {shape}); every leaf needs the "
                             f"leading client axis K = len(weights)")


def _refuse_nonfinite(function: str, weights) -> None:
    """Known ``weights`` (not traced under ``jit``, ``grad`` or ``vmap``) refused where one is NaN or
    infinite: the whole result was NaN, said nowhere."""
    if any(isinstance(weight, jax.core.Tracer) for weight in jax.tree.leaves(weights)):
        return
    values = np.asarray(weights)
    if jnp.issubdtype(values.dtype, jnp.inexact) and not np.all(np.isfinite(values)):  # bfloat16's kind is "V"
        index = int(np.flatnonzero(~np.isfinite(values.ravel()))[0])
        raise ValueError(f"{function}: weights[{index}] = {values.ravel()[index].item()!r} is not allowed: a finite "
                         f"number (a NaN or infinite weight makes every coordinate of the result NaN)")


def weighted_sum(stacked: PyTree, weights: jax.Array) -> PyTree:
    """Σ_k weights[k] · stacked[k] over the leading client axis ``K`` of every leaf; ``weights`` has
    shape ``(K,)``. Computed in float32 for bfloat16/float16 leaves and for integer ones (float64
    under x64: :func:`~jaxfl.kernels.tree.accumulation_dtype`; then cast back, integers rounded), in
    the leaf's dtype for float32/float64. A NaN or infinite weight is refused where it is known.

    No renormalisation: the FedCompass/FedBuff rules of the authors' framework sum st·p_i·Δ_i. A
    weight of 0 does not take a client's NaN or Inf out (0 · NaN is NaN; see :func:`weighted_mean`).

    >>> weighted_sum({"w": jnp.array([[1.0, 2.0], [3.0, 4.0]])}, jnp.array([1.0, -1.0]))["w"].tolist()
    [-2.0, -2.0]
    """
    _refuse_nonfinite("weighted_sum", weights)
    weights = jnp.asarray(weights)
    _check_weights(stacked, weights)
    return _sum_over_clients(stacked, weights)


def _sum_over_clients(stacked: PyTree, weights: jax.Array) -> PyTree:
    """:func:`weighted_sum`'s arithmetic, of weights already checked (:func:`weighted_mean`'s shares)."""
    def reduce(path, leaf):
        leaf = jnp.asarray(leaf)  # first: a numpy float64 leaf is float32 where jax runs without x64, said nowhere
        if not (jnp.issubdtype(leaf.dtype, jnp.number) or leaf.dtype == bool):
            raise ValueError(f"leaf {jax.tree_util.keystr(path)} holds {leaf.dtype}, not numbers to sum (an "
                             f"nnx.split state's RNG keys: split the parameters alone, nnx.split(model, nnx.Param, ...))")
        dtype = accumulation_dtype(leaf.dtype)
        total = jnp.tensordot(weights.astype(dtype), leaf.astype(dtype), axes=([0], [0]))
        return to_leaf_dtype(total, leaf.dtype)

    return jax.tree_util.tree_map_with_path(reduce, stacked)


def weighted_mean(stacked: PyTree, weights: jax.Array) -> PyTree:
    """Σ_k w_k x_k / Σ_k w_k over the leading client axis (FedAvg's weighted average).

    >>> weighted_mean({"b": jnp.array([2.0, 4.0])}, jnp.array([1.0, 3.0]))["b"].item()
    3.5

    Weights that sum to 0, and a NaN or infinite weight, are refused where they are known (as
    :func:`numpy.average` refuses the first); traced under ``jit``, they give NaN, as any 0/0 does,
    and an integer leaf garbage. A weight of 0 does not take a client's NaN or Inf out (0 · NaN is
    NaN): leave such a client out of the stack, or zero its rows first, as the engine does with
    ``metrics["finite"]``.
    """
    # a list or tuple of traced weights (jit, grad, vmap over a weight) is not a Tracer itself
    traced = any(isinstance(weight, jax.core.Tracer) for weight in jax.tree.leaves(weights))
    _refuse_nonfinite("weighted_mean", weights)
    weights = jnp.asarray(weights)
    _check_weights(stacked, weights)
    # normalised in at least float32: bfloat16 shares of 1/7 sum to 1.002, not 1
    weights = weights.astype(jnp.promote_types(weights.dtype, jnp.float32))
    total = jnp.sum(weights)
    # the sum the mean divides by, checked as computed (in float64 [1, -1 + 1e-10] passed, and its float32
    # sum of 0 gave NaN)
    if not traced and float(total) == 0.0:
        raise ValueError(f"weighted_mean: the {np.size(weights)} weights sum to 0 in {weights.dtype}: the mean is 0/0 "
                         f"(give at least one client a nonzero weight)")
    return _sum_over_clients(stacked, weights / total)  # (checked above: not again, a host copy each)


def make_server_optimizer(name: str = "sgd", learning_rate: float | None = None, momentum: float = 0.0,
                          b1: float = 0.9, b2: float = 0.99, tau: float = 1e-3
                          ) -> optax.GradientTransformation:
    """The server optimiser applied to the aggregated update (pseudo-gradient).

    ``sgd`` with ``learning_rate=1`` and ``momentum=0`` is FedAvg's w ← w − Δ; ``momentum=β`` is
    FedAvgM. ``adam``/``yogi``/``adagrad`` are FedAdam/FedYogi/FedAdagrad exactly as Reddi et al.,
    ICLR 2021, Algorithm 2 (:mod:`jaxfl.kernels.fedopt`: τ outside the root, v₀ = τ², no bias
    correction, β1 momentum in all three); ``optax_adam``/``optax_yogi``/``optax_adagrad`` are optax's
    optimisers of those names with ``eps`` = τ, for comparison (optax's Adagrad takes no β's).

    >>> opt = make_server_optimizer("sgd", 1.0, momentum=0.9)
    >>> params = {"w": jnp.zeros(2)}
    >>> params, state = apply_server_update(opt, params, opt.init(params), {"w": jnp.ones(2)})
    >>> params["w"].tolist()
    [-1.0, -1.0]

    Without ``learning_rate`` each takes the rate :data:`jaxfl.config.DEFAULT_SERVER_LR` names, as
    ``jaxfl run`` does without ``--server-lr``: 1 for ``sgd`` (FedAvg's w ← w − Δ), the best CIFAR-10
    server rates of Reddi et al. for the adaptive ones (0.01 for ``adam`` and ``yogi``, 0.1 for
    ``adagrad``); a rate of 1 made FedAdam's first step ≈ ±1 a coordinate.

    >>> opt, zeros = make_server_optimizer("adam"), {"w": jnp.zeros(2)}
    >>> first, state = apply_server_update(opt, zeros, opt.init(zeros), {"w": jnp.ones(2)})
    >>> [round(value, 4) for value in first["w"].tolist()]
    [-0.0099, -0.0099]

    Bad values are refused, naming them: ``learning_rate`` a finite number > 0 or a 0-d float array
    (or, for ``sgd`` and the optax optimisers, an optax schedule), ``momentum``, ``b1`` and ``b2`` in
    [0, 1), ``tau`` a finite number > 0 (τ = 0 makes 0/0 of every coordinate the update leaves at 0);
    so is an option the optimiser does not read set off its default (:data:`SERVER_OPTIMIZER_READS`:
    ``momentum`` is ``sgd``'s, FedAdam's momentum is ``b1``). A value traced under ``jit``, ``vmap`` or
    ``grad`` (a sweep of server learning rates in your own JAX code) is taken unchecked, as optax
    takes it:

    >>> def step(lr):
    ...     opt, zeros = make_server_optimizer("sgd", lr, momentum=0.9), {"w": jnp.zeros(2)}
    ...     return apply_server_update(opt, zeros, opt.init(zeros), {"w": jnp.ones(2)})[0]["w"][0]
    >>> jax.vmap(step)(jnp.array([0.5, 1.0])).tolist()
    [-0.5, -1.0]
    """
    def refuse(field, value, allowed):
        raise ValueError(f"make_server_optimizer({name!r}): {field}={value!r} is not allowed: {allowed}")

    traced = lambda value: isinstance(value, jax.core.Tracer)  # noqa: E731 (no value to check until it runs)

    def number(value):  # a 0-d float array as the number it holds, as JAX code holds its hyperparameters
        if isinstance(value, (jax.Array, np.ndarray)) and not traced(value) and np.ndim(value) == 0 \
                and jnp.issubdtype(value.dtype, jnp.floating):
            return float(value)
        return value

    learning_rate, momentum, b1, b2, tau = (number(value) for value in (learning_rate, momentum, b1, b2, tau))
    if name not in SERVER_OPTIMIZERS:
        raise ValueError(f"unknown server optimizer {name!r}; allowed: {', '.join(SERVER_OPTIMIZERS)}")
    if learning_rate is None:
        from jaxfl.config import DEFAULT_SERVER_LR  # (the config imports the kernels)

        learning_rate = DEFAULT_SERVER_LR[name]
    if traced(learning_rate):
        pass
    elif callable(learning_rate):
        if name not in TAKE_SCHEDULES:
            refuse("learning_rate", learning_rate, f"a finite number > 0 ({name}'s update takes no schedule; "
                                                   f"schedules: {', '.join(TAKE_SCHEDULES)})")
    else:
        if isinstance(learning_rate, bool) or not (isinstance(learning_rate, numbers.Real)
                                                   and math.isfinite(learning_rate) and learning_rate > 0):
            refuse("learning_rate", learning_rate, "a finite number > 0, a 0-d float array"
                   + (", or an optax schedule" if name in TAKE_SCHEDULES else ""))
    for field, value in (("momentum", momentum), ("b1", b1), ("b2", b2)):
        if not traced(value) and (isinstance(value, bool) or not (isinstance(value, numbers.Real) and 0 <= value < 1)):
            refuse(field, value, "a number in [0, 1), or a 0-d float array")
    if not traced(tau) and (isinstance(tau, bool) or not (isinstance(tau, numbers.Real) and math.isfinite(tau)
                                                          and tau > 0)):
        refuse("tau", tau, "a finite number > 0 (τ = 0 makes 0/0 = NaN of every coordinate the update leaves at 0)")
    given = {"momentum": momentum, "b1": b1, "b2": b2, "tau": tau}
    for field, value in given.items():
        if field not in SERVER_OPTIMIZER_READS[name] and (traced(value) or value != SERVER_OPTIMIZER_DEFAULTS[field]):
            readers = ", ".join(key for key, reads in SERVER_OPTIMIZER_READS.items() if field in reads)
            refuse(field, value, f"leave it at its default {SERVER_OPTIMIZER_DEFAULTS[field]!r}, {name} does not "
                                 f"read it (read by {readers})")
    if name == "sgd":
        return optax.sgd(learning_rate, momentum=momentum if traced(momentum) or momentum > 0 else None)
    if name == "adam":
        return fedopt.fedadam(learning_rate, b1=b1, b2=b2, tau=tau)
    if name == "yogi":
        return fedopt.fedyogi(learning_rate, b1=b1, b2=b2, tau=tau)
    if name == "adagrad":
        return fedopt.fedadagrad(learning_rate, b1=b1, tau=tau)
    if name == "optax_adam":
        return optax.adam(learning_rate, b1=b1, b2=b2, eps=tau)
    if name == "optax_yogi":
        return optax.yogi(learning_rate, b1=b1, b2=b2, eps=tau)
    return optax.adagrad(learning_rate, eps=tau)  # optax_adagrad


def apply_server_update(optimizer: optax.GradientTransformation, params: PyTree, opt_state: PyTree,
                        pseudo_gradient: PyTree) -> tuple[PyTree, PyTree]:
    """One server step: ``params ← params + optimizer(pseudo_gradient)``.

    The pseudo-gradient is the aggregated client update Σ c_i Δ_i (a descent direction is
    *subtracted*, so it plays the role of a gradient). Reddi et al., "Adaptive Federated Optimization",
    ICLR 2021, Algorithm 2 (FedOpt), with ``optimizer`` from :func:`make_server_optimizer`.

    >>> opt = make_server_optimizer("sgd", 0.5)
    >>> params = {"w": jnp.array([1.0, 1.0])}
    >>> params, state = apply_server_update(opt, params, opt.init(params), {"w": jnp.array([2.0, -2.0])})
    >>> params["w"].tolist()
    [0.0, 2.0]
    """
    pseudo_gradient = _check_like_params(params, pseudo_gradient)
    updates, opt_state = optimizer.update(pseudo_gradient, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _check_like_params(params: PyTree, pseudo_gradient: PyTree) -> PyTree:
    """Refuse a pseudo-gradient leaf shaped unlike its parameter (static shapes, so free under jit):
    optax would broadcast it, and the clients' still-stacked ``(K, …)`` updates would give the global
    model a client axis without a word. Returns it in the parameters' containers (a FrozenDict's
    update for a dict's parameters: :func:`~jaxfl.kernels.tree.as_structure_of`)."""
    # the leaf where they part, not a tree_map error
    pseudo_gradient = as_structure_of(params, pseudo_gradient, "apply_server_update", ("params", "pseudo_gradient"))
    named = jax.tree_util.tree_leaves_with_path(params)
    given = jax.tree.leaves(pseudo_gradient)
    for (path, param), leaf in zip(named, given):
        if jnp.shape(param) != jnp.shape(leaf):
            stacked = " (still stacked over clients? aggregate them first, e.g. weighted_mean)" \
                if jnp.shape(leaf)[1:] == jnp.shape(param) else ""
            raise ValueError(f"pseudo_gradient leaf {jax.tree_util.keystr(path) or 'params'} has shape "
                             f"{jnp.shape(leaf)}, its parameter {jnp.shape(param)}: they must be equal{stacked}")
    return pseudo_gradient
