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

τ_i is the plain-SGD case of FedNova's normaliser ‖a_i‖₁ (Wang et al., §4 and Appendix): the local
update is Δ_i = η Σ_k a_{i,k} g_{i,k}, and dividing by Σ_k a_{i,k} turns it into an average gradient.
With momentum or a proximal pull the later gradients count more or less than once, and
:func:`fednova_normalizer` gives Σ_k a_{i,k}, which goes into :func:`fednova_coefficients` in place
of τ_i.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def fednova_coefficients(coefficients: jax.Array, steps: jax.Array, step_weights: jax.Array | None = None) -> jax.Array:
    """c_i · τ_eff / τ_i over axis 0 (see the module docstring); τ_i < 1 counts as 1, and Σ w_i = 0
    returns the coefficients unchanged. ``steps`` and ``step_weights`` (default: the coefficients) have
    the coefficients' shape, ``(K,)`` (else ``ValueError``, not a broadcast).

    >>> fednova_coefficients(jnp.array([0.5, 0.5]), jnp.array([10, 40]), step_weights=jnp.array([1.0, 0.0])).tolist()
    [0.5, 0.125]
    """
    c = jnp.asarray(coefficients)
    # in float32 at least, float64 coefficients (under x64) kept so; as arrays first: np.shape of a list of
    # traced values (jit, grad) fails
    dtype = jnp.promote_types(c.dtype, jnp.float32)
    c, steps = c.astype(dtype), jnp.asarray(steps).astype(dtype)
    step_weights = None if step_weights is None else jnp.asarray(step_weights).astype(dtype)
    for name, value in (("steps", steps), ("step_weights", step_weights)):
        if value is not None and value.shape != c.shape:
            raise ValueError(f"fednova_coefficients: {name} has shape {tuple(value.shape)} but coefficients "
                             f"{tuple(c.shape)}; one entry per update")
    tau = jnp.maximum(steps, 1.0)
    weights = c if step_weights is None else step_weights
    total = jnp.sum(weights, axis=0)
    tau_eff = jnp.sum(weights * tau, axis=0) / jnp.where(total == 0, 1.0, total)
    return jnp.where(total == 0, c, c * tau_eff / tau)


def fednova_normalizer(steps, momentum: float = 0.0, learning_rate=0.0, pull: float = 0.0) -> np.ndarray:
    """FedNova's ‖a_i‖₁ for clients that ran ``steps`` = τ_i steps of SGD (host-side numpy, per client).

    SGD with PyTorch momentum ρ (buffer v ← ρv + g, w ← w − ηv, v₀ = 0): gradient k counts
    1 + ρ + … + ρ^(τ−1−k) times, so (Wang et al., NeurIPS 2020, §4, "momentum SGD")::

        ‖a‖₁ = [τ − ρ(1 − ρ^τ)/(1 − ρ)] / (1 − ρ)

    A pull α towards a fixed point — FedProx's μ(w − w_start), or weight decay λw, whose λw_start part
    counts as gradient — with step ``learning_rate`` η shrinks older gradients by (1 − ηα) per
    step (§4, "proximal updates")::

        ‖a‖₁ = [1 − (1 − ηα)^τ] / (ηα)

    With both, the linear recursion they come from is run exactly (u counts the gradients' total
    weight in −(w_τ − w_0)/η, v the momentum buffer's): v ← ρv + 1 − ηα·u, u ← u + v. Plain SGD
    gives τ. ``learning_rate`` may differ per client (a decayed rate); ``pull`` = α = μ + λ.

    >>> [round(float(a), 6) for a in fednova_normalizer([1, 2, 4], momentum=0.5)]   # 1; 1 + 1.5; 1 + 1.5 + 1.75 + 1.875
    [1.0, 2.5, 6.125]
    >>> round(float(fednova_normalizer([3], learning_rate=0.1, pull=1.0)[0]), 6)   # 1 + 0.9 + 0.81
    2.71
    """
    tau = np.maximum(np.asarray(steps, np.int64), 0)
    eta_pull = np.broadcast_to(np.asarray(learning_rate, np.float64) * float(pull), tau.shape)
    rho = float(momentum)
    if not 0.0 <= rho < 1.0:  # 1: a buffer that never forgets, whose series has no sum (and 0/0 above)
        raise ValueError(f"momentum={momentum!r} is not allowed: SGD's momentum ρ in [0, 1)")
    if not eta_pull.any():
        if rho == 0.0:
            return tau.astype(np.float64)
        return _momentum_normalizer(tau, rho)
    u = np.zeros(tau.shape, np.float64)
    v = np.zeros(tau.shape, np.float64)
    for k in range(int(tau.max(initial=0))):
        active = k < tau
        v_next = rho * v + 1.0 - eta_pull * u
        u = np.where(active, u + v_next, u)
        v = np.where(active, v_next, v)
    return u


def _momentum_normalizer(tau: np.ndarray, rho: float) -> np.ndarray:
    """[τ − ρ(1 − ρ^τ)/(1 − ρ)] / (1 − ρ) for momentum ρ in [0, 1), without its cancellation near ρ = 1.

    With ε = 1 − ρ the bracket is ε·τ(τ+1)/2 to first order, so the closed form loses all its digits
    as ε·τ → 0 (ρ = 1 − 1e-9 gave 3 for τ = 3, not 6). There it is the alternating binomial series
    Σ_{k≥1} (−ε)^(k−1) C(τ+1, k+1), whose terms fall by ε·τ/(k+2) at least: exact to float64 in a few.

    >>> [round(float(a), 6) for a in _momentum_normalizer(np.array([3, 10]), 1 - 1e-9)]   # τ(τ+1)/2, nearly
    [6.0, 55.0]
    """
    tau = tau.astype(np.float64)
    epsilon = 1.0 - rho
    with np.errstate(divide="ignore", invalid="ignore"):
        closed = (tau - rho * (1.0 - rho ** tau) / epsilon) / epsilon
    near_one = epsilon * tau <= 1e-3  # beyond, the closed form's relative error stays below 1e-10 (against mpmath)
    if not near_one.any():
        return closed
    series = term = tau * (tau + 1.0) / 2.0
    for k in range(1, 12):  # |term| falls by ≥ 1e-3·(τ−k)/(τ·(k+2)) a step: 12 reach float64's last digit
        term = term * -epsilon * (tau - k) / (k + 2)
        series = series + term
    return np.where(near_one, series, closed)
