"""CC-FedAvg's per-client update bank (CC-FedAvg, Zhang et al., IEEE IoT Journal 2024, Sec. III-B and Algorithm 1): pure JAX.

A bank is a pytree shaped like the model with a leading client axis ``C`` (one stored vector per
client, on device). The engine keeps up to two banks and the scheduler names their use:

- ``"delta"`` bank: D_i, client i's last *trained* update Δ_i = start − final (the engine's sign).
  A skipping client under CC-FedAvg (Strategy 3) contributes D_i again: the estimate
  x_t + Δ^i_{t−1} of its model, i.e. pseudo-gradient term c_i · D_i.
- ``"model"`` bank: x^i_last, client i's last trained final model. Under Strategy 2 a skipping
  client sends this stale model, i.e. its update is x^i_last − x_t and the pseudo-gradient term
  (engine sign) is c_i · (x_t − x^i_last).

Both are exact weighted sums over the bank's client axis, so one compiled call serves every round.

>>> import jax.numpy as jnp
>>> bank = init_bank({"w": jnp.zeros(2)}, num_clients=3)
>>> bank = store(bank, jnp.array([2, 0]), {"w": jnp.array([[1.0, 2.0], [3.0, 4.0]])})
>>> bank_delta_sum(bank, jnp.array([0.5, 0.0, 0.25]))["w"].tolist()      # 0.5·[3,4] + 0.25·[1,2]
[1.75, 2.5]
>>> bank_model_sum(bank, jnp.array([1.0, 0.0, 0.0]), {"w": jnp.array([1.0, 1.0])})["w"].tolist()
[-2.0, -3.0]
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxfl.kernels.aggregation import _check_weights, weighted_sum
from jaxfl.kernels.tree import accumulation_dtype, paired_leaves, set_rows, stacked_zeros, to_leaf_dtype

PyTree = Any
BANK_KINDS = ("delta", "model")


def init_bank(params: PyTree, num_clients: int) -> PyTree:
    """An empty bank: zeros of shape ``(C,) + leaf.shape`` for every leaf of ``params`` (CC-FedAvg, Zhang et al., IEEE IoT Journal 2024, Algorithm 1).
    Example: the module docstring."""
    return stacked_zeros(params, num_clients)


def store(bank: PyTree, clients: jax.Array, values: PyTree, valid: jax.Array | None = None) -> PyTree:
    """Write ``values[k]`` (stacked on a leading ``K``) into row ``clients[k]`` of the bank
    (:func:`jaxfl.kernels.tree.set_rows`). Rows with ``valid[k]`` False (padding) are not written.
    ``clients`` must not repeat among the valid rows (the engine keeps the newest dispatch of a client).
    CC-FedAvg, Zhang et al., IEEE IoT Journal 2024, Algorithm 1. Example: the module docstring.
    """
    return set_rows(bank, clients, values, valid)


def bank_delta_sum(bank: PyTree, weights: jax.Array) -> PyTree:
    """Σ_i weights[i] · D_i over the client axis (``weights`` has shape ``(C,)``, 0 for absent clients):
    Strategy 3 of CC-FedAvg, Zhang et al., IEEE IoT Journal 2024, Sec. III-B. Example: the module docstring."""
    return weighted_sum(bank, weights)


def bank_model_sum(models: PyTree, weights: jax.Array, current: PyTree) -> PyTree:
    """Σ_i weights[i] · (current − x^i_last): Strategy 2's stale models as a pseudo-gradient (CC-FedAvg, Zhang et al., IEEE IoT Journal 2024,
    Sec. III-B). Example: the module docstring. Computed as (Σ_i weights[i]) · current − Σ_i weights[i] · x^i_last,
    in float32 for bfloat16/float16 models (rounded once at the end: rounding the sum first left nothing of a
    difference below its last bit)."""
    weights = jnp.asarray(weights)  # a list too, as weighted_sum takes it
    _check_weights(models, weights)
    paired_leaves(current, models, "bank_model_sum", ("current", "models"), b_rows=True)

    def leaf(w, m):
        dtype = accumulation_dtype(m.dtype)
        stale = jnp.tensordot(weights.astype(dtype), m.astype(dtype), axes=([0], [0]))
        return to_leaf_dtype(jnp.sum(weights).astype(dtype) * w.astype(dtype) - stale, w.dtype)

    return jax.tree.map(leaf, current, models)


def bank_rows(deltas: tuple, starts: tuple | None) -> dict[str, PyTree]:
    """The banks' new rows for a round's trained clients (CC-FedAvg, Zhang et al., IEEE IoT Journal
    2024, Algorithm 1), each stacked on a leading ``K``: ``"delta"`` their updates Δ_k and, when
    ``starts`` (their start models) is given, ``"model"`` their final models start_k − Δ_k.

    >>> rows = bank_rows(({"w": jnp.array([1.0])}, {"w": jnp.array([2.0])}), ({"w": jnp.array([5.0])},) * 2)
    >>> rows["delta"]["w"].tolist(), rows["model"]["w"].tolist()
    ([[1.0], [2.0]], [[4.0], [3.0]])
    """
    stack = lambda trees: jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)
    rows = {"delta": stack(deltas)}
    if starts is not None:
        rows["model"] = jax.tree.map(jnp.subtract, stack(starts), rows["delta"])
    return rows


def banked_estimation_error(rows: PyTree, truths: PyTree, current: PyTree | None) -> dict[str, jax.Array]:
    """:func:`estimation_error` of banked estimates: the bank rows themselves (Strategy 3's D_i) when
    ``current`` is None, else ``current − row`` (Strategy 2's x_t − x^i_last, the engine's sign).

    >>> out = banked_estimation_error({"w": jnp.array([[1.0, 0.0]])}, {"w": jnp.array([[1.0, 0.0]])},
    ...                               {"w": jnp.array([2.0, 0.0])})
    >>> out["cosine"].tolist()
    [1.0]
    """
    estimates = rows if current is None else jax.tree.map(lambda w, m: w[None] - m, current, rows)
    return estimation_error(estimates, truths)


def estimation_error(estimates: PyTree, truths: PyTree) -> dict[str, jax.Array]:
    """How well each estimate Δ̂_k matches the true update Δ_k (stacked on a leading axis ``K``; all
    leaves taken as one vector): ``relative_error`` ‖Δ̂ − Δ‖/‖Δ‖, ``cosine`` ⟨Δ̂, Δ⟩/(‖Δ̂‖ ‖Δ‖), and
    both norms (NaN where a norm is 0). CC-FedAvg (Zhang et al., IEEE IoT Journal 2024, Fig. 2)
    motivates Strategy 3 by this closeness of a client's last update to its current one.

    >>> truth = {"w": jnp.array([[3.0, 4.0], [1.0, 0.0]])}
    >>> out = estimation_error({"w": jnp.array([[3.0, 4.0], [0.0, 2.0]])}, truth)
    >>> out["relative_error"].tolist(), out["cosine"].tolist()    # equal; orthogonal: ‖(−1, 2)‖/1
    ([0.0, 2.2360680103302], [1.0, 0.0])
    """
    paired_leaves(estimates, truths, "estimation_error", ("estimates", "truths"))

    def per_row(function, *trees):
        return sum(jnp.sum(function(*leaves).reshape(leaves[0].shape[0], -1), axis=1)
                   for leaves in zip(*(jax.tree.leaves(tree) for tree in trees)))

    f32 = lambda tree: jax.tree.map(lambda leaf: leaf.astype(jnp.float32), tree)
    estimates, truths = f32(estimates), f32(truths)
    true_norm = jnp.sqrt(per_row(lambda t: t * t, truths))
    estimate_norm = jnp.sqrt(per_row(lambda e: e * e, estimates))
    error = jnp.sqrt(per_row(lambda e, t: (e - t) ** 2, estimates, truths))
    dot = per_row(lambda e, t: e * t, estimates, truths)
    def ratio(numerator, denominator):  # NaN, not a division warning, where the denominator is 0
        positive = denominator > 0
        return jnp.where(positive, numerator / jnp.where(positive, denominator, 1), jnp.float32(jnp.nan))

    return {"relative_error": ratio(error, true_norm), "cosine": ratio(dot, true_norm * estimate_norm),
            "true_norm": true_norm, "estimate_norm": estimate_norm}
