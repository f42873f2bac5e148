"""FedAT's tier aggregation (Chai et al., SC 2021) as one jitted program: the tier's new model and the
cross-tier global model, in the order and with the roundings of the eager per-leaf ops it replaces.

One aggregation of tier m with members i (coefficients c_i summing to 1, start models s_i, updates
Δ_i = s_i − final_i) and cross-tier weights a_k::

    w_m ← −Σ c_i Δ_i + c_1 s_1 + c_2 s_2 + …        # = Σ c_i (s_i − Δ_i), summed in member order
    w   ← 0 + a_0 w_0 + a_1 w_1 + …                 # tiers in order, w_m the new tier model

Every product is rounded before it is added (:func:`jaxfl.kernels.tree.rounded`), as the eager ops
round it, so the jitted update is bit-identical to them.

>>> import jax.numpy as jnp
>>> tier_model, combined = tier_update({"w": jnp.array([1.0])}, ({"w": jnp.array([4.0])},),
...     jnp.array([0, 0]), jnp.array([0.5, 0.5]), jnp.int32(2), None,
...     ({"w": jnp.array([0.0])}, {"w": jnp.array([9.0])}), jnp.int32(0), jnp.array([0.75, 0.25]), jnp.uint32(0))
>>> tier_model["w"].tolist(), combined["w"].tolist()      # −1 + 2 + 2; 0.75 · 3 + 0.25 · 9
([3.0], [4.5])
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxfl.kernels.client import BUFFERS
from jaxfl.kernels.tree import rounded, tree_add, tree_scale

PyTree = Any


@jax.jit  # one program per shape and tier count: called outside a jit, its loop compiled at every call
def tier_update(delta_sum: PyTree, starts: tuple, which: jax.Array, coefficients: jax.Array, count: jax.Array,
                buffers: PyTree | None, models: tuple, position: jax.Array, weights: jax.Array,
                zero: jax.Array) -> tuple[PyTree, PyTree]:
    """``(w_m, w)`` of one tier aggregation (see the module docstring).

    ``delta_sum`` is Σ c_i Δ_i; ``starts`` the distinct start models of the members and ``which[i]``
    member i's index among them; ``coefficients`` the c_i, padded (any length ≥ ``count``, so that
    one compilation serves a bucket of tier sizes); ``count`` the members. ``buffers``, when not
    None, replaces the tier model's non-trainable state (the members' plain mean). ``models`` holds
    every tier's model in the order of ``weights`` (the a_k), the entry at ``position`` being the
    tier's previous model, which ``w_m`` replaces. ``zero`` is a traced unsigned 0
    (:func:`jaxfl.kernels.tree.rounded`).
    """
    stacked_starts = jax.tree.map(lambda *leaves: jnp.stack(leaves), *starts)

    def add_member(index, total):
        start = jax.tree.map(lambda leaf: leaf[which[index]], stacked_starts)
        return tree_add(total, rounded(tree_scale(start, coefficients[index]), zero))

    tier_model = jax.lax.fori_loop(0, count, add_member, rounded(tree_scale(delta_sum, -1.0), zero))
    if buffers is not None:
        tier_model = {**tier_model, BUFFERS: buffers}
    combined = rounded(jax.tree.map(jnp.zeros_like, tier_model), zero)
    for index, model in enumerate(models):
        model = jax.tree.map(lambda new, old: jnp.where(position == index, new, old), tier_model, model)
        combined = tree_add(combined, rounded(tree_scale(model, weights[index]), zero))
    return tier_model, combined
