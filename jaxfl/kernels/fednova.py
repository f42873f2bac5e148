"""FedNova's normalised averaging (Wang et al., NeurIPS 2020): coefficients from local step counts.

An aggregation Σ_i c_i Δ_i over updates of τ_i local steps becomes::

    τ_eff = Σ_i w_i τ_i / Σ_i w_i             # w_i = c_i (FedNova) or given weights (FedCompass+N: p_i)
    Σ_i c_i' Δ_i  with  c_i' = c_i · τ_eff / τ_i

so every update counts per local step (a client that ran 4× the steps no longer pulls 4× as hard)
and the total step length stays that of an average client. Σ c_i' = Σ c_i only when all τ_i are
equal; with equal τ_i the coefficients are unchanged (FedNova = FedAvg). Pure JAX and jittable;
entries with c_i = w_i = 0 (padding) change nothing.

>>> import jax.numpy as jnp
>>> [round(float(c), 6) for c in fednova_coefficients(jnp.array([0.5, 0.5]), jnp.array([10, 40]))]   # τ_eff = 25
[1.25, 0.3125]
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def fednova_coefficients(coefficients: jax.Array, steps: jax.Array, step_weights: jax.Array | None = None) -> jax.Array:
    """c_i · τ_eff / τ_i over axis 0 (see the module docstring); τ_i < 1 counts as 1, and Σ w_i = 0
    returns the coefficients unchanged."""
    c = jnp.asarray(coefficients, jnp.float32)
    tau = jnp.maximum(jnp.asarray(steps, jnp.float32), 1.0)
    weights = c if step_weights is None else jnp.asarray(step_weights, jnp.float32)
    total = jnp.sum(weights, axis=0)
    tau_eff = jnp.sum(weights * tau, axis=0) / jnp.where(total == 0, 1.0, total)
    return jnp.where(total == 0, c, c * tau_eff / tau)
