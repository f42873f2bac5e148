"""FedASMU's learned mixing weights and their hypergradients (FedASMU, Liu et al., AAAI 2024).

Pure JAX, written for ONE client; the engine gathers the client's coefficients from its on-device
arrays (``(C, 3)`` server and ``(C, 2)`` device coefficients) and vmaps the device-side kernel over
the clients of a training call.

Server side (Formulas 1–3 and Algorithm 1 of the paper). Versions are counted from 1 as in Algorithm 1, i.e. ``t`` is
the 1-based index of the aggregation being made, ``s = t − o + 1`` the staleness (1 = fresh)::

    ξ(λ, σ, ι; t, s) = λ / (√t · s^σ) + ι                         # Formula 2 as the appendix implies [recon]
    α = clip(μ_α ξ / (1 + μ_α ξ), α_min, 1)                         # squash; clip [ours]
    w ← (1 − α) w + α u                                             # Formula 1
    on client i's next upload, before its α: (λ, σ, ι) −= η ⊙ ∂F(w_o)/∂(λ, σ, ι)   # Formula 3
    with ∂F/∂θ = ∂/∂θ ⟨stop_grad(ĝ), w_{t_p} + α(θ; t_p, s_p) Δ_p⟩,  ĝ = (w_o − u)/(η_i K)

(Δ_p = u_p − w_{t_p}: the client's previous upload minus the global model it was mixed into; the
record ``(Δ_p, t_p, s_p)`` is kept per client. ĝ's sign is the gradient's, not the appendix's;
``jax.grad`` replaces the appendix's hand derivatives, which have four defects.)

Device side (Formulas 7–9 and Algorithm 2)::

    φ(γ, ν; g, o) = (γ / √g) · (1 − ν / √(g − o + 1))
    β = clip(μ_β φ / (1 + μ_β φ), 0, 1)
    w^a = (1 − β) w^b + β w_g                                       # w_g: the fresh global, version g > o
    (γ, ν) −= η ⊙ ∂F_i(w^a(γ, ν); ζ)/∂(γ, ν)                        # ζ: the minibatch of the next step

Readings taken where the paper is silent or garbled [ours]: below zero the squash x/(1+x) is
continued linearly (x), so it has no pole at μξ = −1; the clips to [α_min, 1] and [0, 1] pass the
gradient straight through (a coefficient that reaches a clip can still come back); λ and ι are kept
≥ 0 after each step (so ξ ≥ 0, as the convergence proof of the appendix needs).

>>> import jax.numpy as jnp
>>> round(float(server_alpha(jnp.array([1.0, 0.5, 0.0]), 4.0, 4.0, 1.0, 0.0)), 4)   # ξ = 1/(2·2) → 0.25/1.25
0.2
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxfl.kernels.tree import paired_leaves, tree_vdot

PyTree = Any


def squash(x: jax.Array) -> jax.Array:
    """x / (1 + x) for x ≥ 0 (FedASMU, Liu et al., AAAI 2024, Formula 2's squash), continued linearly (x) below 0 (same value and
    slope at 0, no pole) [ours].

    >>> squash(jnp.array([1.0, -0.5])).tolist()
    [0.5, -0.5]
    """
    return jnp.where(x >= 0, x / (1.0 + jnp.abs(x)), x)


def _clip_straight_through(x: jax.Array, low, high) -> jax.Array:
    """clip(x, low, high) in value; the gradient of x (straight through) [ours]."""
    return x + jax.lax.stop_gradient(jnp.clip(x, low, high) - x)


def server_xi(coefficients: jax.Array, t, s) -> jax.Array:
    """ξ = λ / (√t · s^σ) + ι with ``coefficients = (λ, σ, ι)`` (FedASMU, Liu et al., AAAI 2024, Formula 2).
    ``t`` and ``s`` count from 1 as the paper's Algorithm 1 does (s = 1: fresh); the staleness of
    :mod:`jaxfl.scheduler` counts from 0, so pass it plus one (s = 0 divides by 0: ξ = ∞, α = NaN).

    >>> float(server_xi(jnp.array([1.0, 0.5, 0.25]), 4.0, 4.0))     # 1 / (2 · 2) + 0.25
    0.5
    """
    lam, sigma, iota = coefficients[0], coefficients[1], coefficients[2]
    return lam / (jnp.sqrt(t) * jnp.power(s, sigma)) + iota


def server_alpha(coefficients: jax.Array, t, s, mu_alpha, alpha_min) -> jax.Array:
    """α = clip(μ_α ξ / (1 + μ_α ξ), α_min, 1) (straight-through clip; FedASMU, Liu et al., AAAI 2024, Formulas 1–2),
    ``t`` and ``s`` from 1 (:func:`server_xi`). Example: the module docstring."""
    return _clip_straight_through(squash(mu_alpha * server_xi(coefficients, t, s)), alpha_min, 1.0)


def server_hypergradient(coefficients: jax.Array, previous_delta: PyTree, t_p, s_p, pseudo_gradient: PyTree,
                         mu_alpha, alpha_min) -> jax.Array:
    """∂/∂(λ, σ, ι) of ⟨stop_grad(ĝ), w_{t_p} + α(λ, σ, ι; t_p, s_p) · Δ_p⟩ (w_{t_p} drops out;
    FedASMU, Liu et al., AAAI 2024, Formula 3).

    ``pseudo_gradient`` is ĝ ≈ ∇F(w_o), ``previous_delta`` is Δ_p.
    """
    inner = tree_vdot(jax.lax.stop_gradient(pseudo_gradient), previous_delta)

    def surrogate(c):
        return server_alpha(c, t_p, s_p, mu_alpha, alpha_min) * inner

    return jax.grad(surrogate)(coefficients)


def _project(coefficients: jax.Array) -> jax.Array:
    """Keep λ ≥ 0 and ι ≥ 0 (σ is free) [ours]."""
    return coefficients.at[0].max(0.0).at[2].max(0.0)


def server_update(coefficients: jax.Array, record: jax.Array, previous_delta: PyTree, delta: PyTree,
                  start: PyTree, current: PyTree, t, s, step_size, learning_rates: jax.Array,
                  mu_alpha, alpha_min):
    """One upload of one client: hypergradient step, then this aggregation's α (FedASMU, Liu et al.,
    AAAI 2024, Algorithm 1 with Formulas 1–3).

    ``record = (t_p, s_p, has_record)`` describes the client's previous aggregation; ``delta`` is
    the engine's Δ = w_o − u of this upload trained from ``start`` = w_o; ``current`` is the global
    w_t; ``step_size`` = η_i·K (ĝ = Δ / step_size). Returns ``(coefficients, alpha, new_record,
    new_previous_delta, hypergradient)``.
    """
    for tree, name in ((delta, "delta"), (current, "current"), (previous_delta, "previous_delta")):
        paired_leaves(start, tree, "server_update", ("start", name))
    pseudo_gradient = jax.tree.map(lambda d: d / step_size, delta)
    gradient = server_hypergradient(coefficients, previous_delta, record[0], record[1], pseudo_gradient,
                                    mu_alpha, alpha_min)
    gradient = jnp.where(record[2] > 0, gradient, 0.0)  # first upload: nothing to update
    coefficients = _project(coefficients - learning_rates * gradient)
    alpha = server_alpha(coefficients, t, s, mu_alpha, alpha_min)
    new_previous_delta = jax.tree.map(lambda w0, d, w: (w0 - d) - w, start, delta, current)  # u − w_t
    new_record = jnp.stack([jnp.asarray(t, jnp.float32), jnp.asarray(s, jnp.float32), jnp.float32(1.0)])
    return coefficients, alpha, new_record, new_previous_delta, gradient


def device_phi(coefficients: jax.Array, g, o) -> jax.Array:
    """φ = (γ/√g)(1 − ν/√(g − o + 1)) with ``coefficients = (γ, ν)`` (1-based versions, g > o; FedASMU, Liu et al., AAAI 2024, Formula 8).

    >>> float(device_phi(jnp.array([2.0, 1.0]), 4.0, 1.0))     # (2/2)(1 − 1/2)
    0.5
    """
    gamma, nu = coefficients[0], coefficients[1]
    return (gamma / jnp.sqrt(g)) * (1.0 - nu / jnp.sqrt(g - o + 1.0))


def device_beta(coefficients: jax.Array, g, o, mu_beta) -> jax.Array:
    """β = clip(μ_β φ / (1 + μ_β φ), 0, 1) (straight-through clip; FedASMU, Liu et al., AAAI 2024, Formulas 7–8).

    >>> float(device_beta(jnp.array([2.0, 1.0]), 4.0, 1.0, 2.0))     # φ = 0.5: 1 / (1 + 1)
    0.5
    """
    return _clip_straight_through(squash(mu_beta * device_phi(coefficients, g, o)), 0.0, 1.0)


def mix(local: PyTree, fresh: PyTree, beta) -> PyTree:
    """(1 − β) w^b + β w_g (FedASMU, Liu et al., AAAI 2024, Formula 9).

    >>> mix({"w": jnp.array([0.0, 4.0])}, {"w": jnp.array([2.0, 0.0])}, 0.25)["w"].tolist()
    [0.5, 3.0]
    """
    beta = jnp.asarray(beta)  # a Python float too (it has no .astype)
    paired_leaves(local, fresh, "mix", ("local", "fresh"))
    # in the local model's dtype (a float32 global mixed into a bfloat16 client changed its training carry)
    return jax.tree.map(lambda b, g: ((1.0 - beta).astype(b.dtype) * b + beta.astype(b.dtype) * g).astype(b.dtype),
                        local, fresh)


def device_mix(batch_loss: Callable, state, fresh: PyTree, coefficients: jax.Array, o, g, active,
               data, view, mu_beta, learning_rates: jax.Array):
    """Mix the fresh global into one client's local training state and take its (γ, ν) step (FedASMU,
    Liu et al., AAAI 2024, Algorithm 2 with Formulas 7–9).

    ``batch_loss(params, state, data, view)`` is the loss on the minibatch the client's next step
    draws (:class:`~jaxfl.kernels.client.ClientTrainer` ``batch_loss``), so the hypergradient reuses
    that step's minibatch ζ (Formula 9). ``active`` False leaves state and coefficients untouched
    (padding rows, clients without a newer global). Returns ``(state, coefficients, diagnostics)``
    with the β applied and the minibatch loss before and after the mix (the RL reward is their
    difference; the paper's RL time-slot selection).
    """
    def mixed_loss(c):
        return batch_loss(mix(state.params, fresh, device_beta(c, g, o, mu_beta)), state, data, view)

    loss_after, gradient = jax.value_and_grad(mixed_loss)(coefficients)
    beta = device_beta(coefficients, g, o, mu_beta)
    loss_before = batch_loss(state.params, state, data, view)
    mixed = mix(state.params, fresh, beta)
    params = jax.tree.map(lambda new, old: jnp.where(active, new, old), mixed, state.params)
    coefficients = jnp.where(active, coefficients - learning_rates * gradient, coefficients)
    diagnostics = {"beta": jnp.where(active, beta, 0.0), "loss_before_mix": loss_before,
                   "loss_after_mix": loss_after}
    return state._replace(params=params), coefficients, diagnostics
