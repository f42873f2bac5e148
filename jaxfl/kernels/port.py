"""PORT's aggregation weights (PORT, Su & Li, IEEE IWQoS 2022, Eq. 1–4): pure JAX, one client or a stack.

For each client k of the aggregation set A of round τ::

    d_k = n_k / Σ_{j∈A} n_j                                # data share within this set
    s_k = α · Ω / (S_k + Ω)                                # staleness discount, Eq. (1)
    θ_k = β · (cos(u_k, w_τ − w_{τ−1}) + 1) / 2            # interference discount, Eq. (2)
    p_k = d_k (s_k + θ_k) / Σ_{j∈A} d_j (s_j + θ_j)        # Eq. (3), normalised
    w_{τ+1} = Σ_k p_k w_k                                  # Eq. (4)

The scheduler (``jaxfl.algorithms.port``) computes the parts that need no parameters, ``a_k = d_k s_k``
and ``b_k = d_k β``, and whether the cosine is forced to 1 (first round; the PLATO preset also
forces it for fresh clients). The engine computes the cosines on device with :func:`cosine` vmapped
over the aggregation's clients and combines them with :func:`port_weights`.

``u_k``, the client's "weight update" in the cosine (the paper says "weight update" without defining it):
- ``"own"`` (paper reading, default): u_k = w_k − w_start,k, the client's own progress;
- ``"current"`` (PLATO code): u_k = w_k − w_τ, the client's final model minus the *current* global
  model, which for a stale client also subtracts the global drift since it started.

>>> import jax.numpy as jnp
>>> float(cosine({"w": jnp.array([1.0, 0.0])}, {"w": jnp.array([0.0, 2.0])}))
0.0
>>> p = port_weights(jnp.array([0.0, 1.0]), jnp.array([0.5, 0.5]), jnp.array([1.0, 1.0]),
...                  jnp.array([False, True]))     # θ = (0 + 1)/2 and forced 1: raw 1.0 and 1.5
>>> [round(float(x), 4) for x in p]
[0.4, 0.6]
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxfl.kernels.tree import paired_leaves, tree_vdot  # noqa: F401 (also exported here)

PyTree = Any
COSINE_DEFINITIONS = ("own", "current")


def cosine(u: PyTree, g: PyTree) -> jax.Array:
    """cos(u, g) over the whole flattened model (PORT, Su & Li, IEEE IWQoS 2022, Eq. 2); 1 when either vector is zero (no
    direction to disagree with), NaN when either holds a NaN or an Inf. Computed in float32 at any size: where a
    squared norm or their product leaves float32's normal range (entries far below 1e-10 or above 1e10) both
    vectors are first scaled by a power of two to a largest entry near 1, which a cosine does not see. Entries
    below float32's smallest normal number (about 1.2e-38) count as 0 on a CPU, whose XLA flushes them. Example:
    the module docstring."""
    value, plain = _plain_cosine(u, g)
    if not isinstance(plain, jax.core.Tracer):  # called eagerly: a cond of fresh lambdas compiled at every call
        return value if bool(plain) else _scaled_cosine(u, g)
    return jax.lax.cond(plain, lambda: value, lambda: _scaled_cosine(u, g))


def _plain_cosine(u: PyTree, g: PyTree) -> tuple[jax.Array, jax.Array]:
    """cos(u, g) as ⟨u, g⟩ / √(‖u‖²‖g‖²), and whether float32 holds each part (where not, the value is not
    the cosine: :func:`_scaled_cosine` is)."""
    dot = tree_vdot(u, g)
    uu, gg = tree_vdot(u, u), tree_vdot(g, g)
    product = uu * gg
    tiny = jnp.finfo(jnp.float32).tiny
    plain = jnp.isfinite(product) & jnp.isfinite(dot) & (uu >= tiny) & (gg >= tiny) & (product >= tiny)
    return dot / jnp.where(plain, jnp.sqrt(product), 1.0), plain


def _scaled_cosine(u: PyTree, g: PyTree) -> jax.Array:
    """cos(u, g) of ``u`` and ``g`` each scaled by a power of two (exact: no rounding, no reciprocal to
    flush) to a largest entry in [0.5, 1); 1 when either is zero."""
    def scaled(tree):
        leaves = [jnp.asarray(leaf).astype(jnp.float32) for leaf in jax.tree.leaves(tree)]
        largest = jnp.max(jnp.stack([jnp.max(jnp.abs(leaf), initial=0.0) for leaf in leaves])) if leaves \
            else jnp.zeros((), jnp.float32)
        _, exponent = jnp.frexp(largest)
        return [jnp.ldexp(leaf, -exponent) for leaf in leaves], largest

    unit_u, largest_u = scaled(u)
    unit_g, largest_g = scaled(g)
    value = tree_vdot(unit_u, unit_g) / jnp.sqrt(tree_vdot(unit_u, unit_u) * tree_vdot(unit_g, unit_g))
    return jnp.where((largest_u == 0) | (largest_g == 0), 1.0, value)


def update_direction(delta: PyTree, start: PyTree, current: PyTree, definition: str) -> PyTree:
    """u_k for the cosine of PORT, Su & Li, IEEE IWQoS 2022, Eq. 2, from the engine's Δ_k = start_k − final_k (see the module docstring).

    >>> update_direction({"w": jnp.array([1.0])}, {"w": jnp.array([5.0])}, {"w": jnp.array([3.0])}, "current")["w"].tolist()
    [1.0]
    """
    if definition == "own":
        return jax.tree.map(jnp.negative, delta)
    if definition == "current":
        return jax.tree.map(lambda s, d, w: (s - d) - w, start, delta, current)
    raise ValueError(f"unknown PORT cosine definition {definition!r}; allowed: {', '.join(COSINE_DEFINITIONS)}")


def port_weights(cosines: jax.Array, staleness_part: jax.Array, interference_scale: jax.Array,
                 force: jax.Array, valid: jax.Array | None = None) -> jax.Array:
    """Normalised p_k from cosines ``(K,)``, ``a_k = d_k s_k``, ``b_k = d_k β`` and the force-to-1 mask.

    ``valid`` masks padding entries (weight 0). The weights sum to 1 over the valid entries (PORT, Su & Li, IEEE IWQoS 2022,
    Eq. 3). Example: the module docstring.
    """
    theta = jnp.where(force, 1.0, (cosines + 1.0) / 2.0)
    raw = staleness_part + interference_scale * theta
    raw = raw.astype(jnp.promote_types(raw.dtype, jnp.float32))  # normalised as weighted_mean: bfloat16's 7 shares sum to 1.005
    if valid is not None:
        raw = jnp.where(valid, raw, 0.0)
    return raw / jnp.sum(raw)


def port_coefficients(deltas: PyTree, starts: PyTree, current: PyTree, last_step: PyTree,
                      staleness_part: jax.Array, interference_scale: jax.Array, force: jax.Array,
                      valid: jax.Array | None = None, definition: str = "own") -> tuple[jax.Array, jax.Array]:
    """``(p, cos)`` for a stacked aggregation set: every leaf of ``deltas``/``starts`` has a leading ``K``.

    ``last_step`` = w_τ − w_{τ−1}, the last global step; ``current`` = w_τ. ``valid`` ``(K,)`` masks
    padding rows (weight 0; None: every row is an update). This is the kernel the engine jits
    (``definition`` static). PORT, Su & Li, IEEE IWQoS 2022, Eq. 1–3.

    >>> p, cos = port_coefficients({"w": jnp.array([[-1.0, 0.0], [0.0, -1.0]])}, {"w": jnp.zeros((2, 2))},
    ...                            {"w": jnp.zeros(2)}, {"w": jnp.array([1.0, 0.0])}, jnp.zeros(2), jnp.ones(2),
    ...                            jnp.array([False, False]), jnp.array([True, True]))
    >>> cos.tolist(), [round(float(x), 4) for x in p]          # θ = 1 and 0.5
    ([1.0, 0.0], [0.6667, 0.3333])
    """
    paired_leaves(deltas, starts, "port_coefficients", ("deltas", "starts"))
    paired_leaves(current, last_step, "port_coefficients", ("current", "last_step"))
    paired_leaves(current, deltas, "port_coefficients", ("current", "deltas"), b_rows=True)  # (K, ...) stacks
    directions = jax.vmap(update_direction, in_axes=(0, 0, None, None))(deltas, starts, current, definition)
    # the scaled form only where some cosine needs it: vmapped, cosine's own cond would compute both
    values, plain = jax.vmap(_plain_cosine, in_axes=(0, None))(directions, last_step)
    scaled = lambda: jnp.where(plain, values, jax.vmap(_scaled_cosine, in_axes=(0, None))(directions, last_step))  # noqa: E731
    if not isinstance(plain, jax.core.Tracer):  # called eagerly: as cosine
        cosines = values if bool(jnp.all(plain)) else scaled()
    else:
        cosines = jax.lax.cond(jnp.all(plain), lambda: values, scaled)
    return port_weights(cosines, staleness_part, interference_scale, force, valid), cosines
