"""FedAdagrad, FedAdam and FedYogi: the server optimisers of Reddi et al., "Adaptive Federated
Optimization", ICLR 2021, Algorithm 2, as optax ``GradientTransformation``s.

Algorithm 2, with Δ_t the (weighted) average client update x_i − x_t::

    m_t = β1 m_{t−1} + (1 − β1) Δ_t                          (all three; m_{−1} = 0)
    v_t = v_{t−1} + Δ_t²                                     FedAdagrad
    v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)       FedYogi
    v_t = β2 v_{t−1} + (1 − β2) Δ_t²                         FedAdam
    x_{t+1} = x_t + η m_t / (√v_t + τ)                       (v_{−1} = τ²)

They differ from optax's ``adagrad``/``adam``/``yogi`` (kept as ``optax_adagrad`` etc. in
:func:`jaxfl.kernels.aggregation.make_server_optimizer`): no bias correction, τ outside the root,
the second moment starting at τ² (optax: 0 for Adam, 10⁻⁶ for Yogi, 0.1 for Adagrad), and momentum
in FedAdagrad too.

jaxfl's engine hands the server optimiser the pseudo-gradient g = −Δ_t (w ← w + update, a descent
step on g), so these transforms take g: m_t(g) = −m_t(Δ), v_t is the same (g² = Δ²), and the update
−η m_t(g)/(√v_t + τ) is the paper's +η m_t(Δ)/(√v_t + τ).

>>> import jax.numpy as jnp
>>> opt = fedadam(learning_rate=0.1, b1=0.9, b2=0.99, tau=1e-3)
>>> params = {"w": jnp.zeros(1)}
>>> updates, state = opt.update({"w": jnp.array([-2.0])}, opt.init(params))   # Δ = +2
>>> round(float(updates["w"][0]), 6)    # m = 0.2, v = 0.99e-6 + 0.04: 0.1 · 0.2 / (√0.04000099 + 0.001)
0.099501
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

PyTree = Any


class FedOptState(NamedTuple):
    """The server optimiser's state: m (first moment, of the pseudo-gradient) and v (second moment; v₀ = τ²,
    Reddi et al., ICLR 2021, Algorithm 2).

    >>> fedadam(0.1, tau=0.01).init({"w": jnp.zeros(2)}).second_moment["w"].tolist()
    [9.999999747378752e-05, 9.999999747378752e-05]
    """

    momentum: PyTree
    second_moment: PyTree


def _refuse_outside(field: str, value, inside: Callable[[float], bool], allowed: str) -> None:
    """``value`` refused, naming it, unless it is a number (or a 0-d array) for which ``inside`` holds;
    a value traced under ``jit`` or ``vmap`` is taken as it is (it has no value until the program runs)."""
    if isinstance(value, jax.core.Tracer):
        return
    if isinstance(value, bool) or not isinstance(value, (int, float, jax.Array, np.ndarray, np.number)) \
            or np.ndim(value) != 0 or not inside(float(value)):
        raise ValueError(f"{field}={value!r} is not allowed: {allowed}")


def _fedopt(learning_rate: float, b1: float, tau: float,
            next_second_moment: Callable[[jax.Array, jax.Array], jax.Array]) -> optax.GradientTransformation:
    """Algorithm 2's common shape; ``next_second_moment(v, g²)`` is the one line that differs. τ is
    refused unless > 0 (a traced τ is taken as it is): with v₀ = τ² = 0 every coordinate the
    updates leave at 0 (a frozen leaf, a class no client holds) is 0/0 = NaN; so are a learning rate
    that is not > 0 (a step uphill) and β1 outside [0, 1), as :func:`make_server_optimizer` refuses them."""
    if callable(learning_rate):  # an optax schedule: the update would fail at its first step, on "-schedule"
        raise ValueError(f"learning_rate={learning_rate!r} is not allowed here: a number (Reddi et al.'s η); for a "
                         f"schedule use optax's optimiser, make_server_optimizer('optax_adam', schedule)")
    _refuse_outside("learning_rate", learning_rate, lambda value: 0 < value < float("inf"),
                    "a finite number > 0 (Reddi et al.'s η)")
    _refuse_outside("b1", b1, lambda value: 0 <= value < 1, "a number in [0, 1) (the first moment's decay)")
    _refuse_outside("tau", tau, lambda value: 0 < value < float("inf"),
                    "a finite number > 0 (Reddi et al.'s adaptivity, e.g. 1e-3; τ = 0 gives NaN wherever the update is 0)")

    def init(params):
        return FedOptState(momentum=jax.tree.map(jnp.zeros_like, params),
                           second_moment=jax.tree.map(lambda p: jnp.full_like(p, tau ** 2), params))

    def update(pseudo_gradient, state, params=None):
        del params
        momentum = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.momentum, pseudo_gradient)
        second_moment = jax.tree.map(lambda v, g: next_second_moment(v, g * g), state.second_moment, pseudo_gradient)
        updates = jax.tree.map(lambda m, v: -learning_rate * m / (jnp.sqrt(v) + tau), momentum, second_moment)
        return updates, FedOptState(momentum, second_moment)

    return optax.GradientTransformation(init, update)


def fedadagrad(learning_rate: float, b1: float = 0.9, tau: float = 1e-3) -> optax.GradientTransformation:
    """FedAdagrad (Reddi et al., ICLR 2021, Algorithm 2): v_t = v_{t−1} + Δ_t².

    >>> opt = fedadagrad(1.0, b1=0.0, tau=1e-9)     # plain Adagrad on Δ: a first step of η sign(Δ)
    >>> updates, _ = opt.update({"w": jnp.array([-3.0, 0.5])}, opt.init({"w": jnp.zeros(2)}))
    >>> updates["w"].tolist()
    [1.0, -1.0]
    """
    return _fedopt(learning_rate, b1, tau, lambda v, g2: v + g2)


def fedadam(learning_rate: float, b1: float = 0.9, b2: float = 0.99, tau: float = 1e-3) -> optax.GradientTransformation:
    """FedAdam (Reddi et al., ICLR 2021, Algorithm 2): v_t = β2 v_{t−1} + (1 − β2) Δ_t², no bias correction."""
    _refuse_outside("b2", b2, lambda value: 0 <= value < 1, "a number in [0, 1) (the second moment's decay)")
    return _fedopt(learning_rate, b1, tau, lambda v, g2: b2 * v + (1 - b2) * g2)


def fedyogi(learning_rate: float, b1: float = 0.9, b2: float = 0.99,
            tau: float = 1e-3) -> optax.GradientTransformation:
    """FedYogi (Reddi et al., ICLR 2021, Algorithm 2): v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²).

    >>> opt = fedyogi(1.0, b1=0.0, b2=0.5, tau=1.0)   # v: 1 − 0.5 · 4 · sign(1 − 4) = 3
    >>> _, state = opt.update({"w": jnp.array([2.0])}, opt.init({"w": jnp.zeros(1)}))
    >>> state.second_moment["w"].tolist()
    [3.0]
    """
    _refuse_outside("b2", b2, lambda value: 0 <= value < 1, "a number in [0, 1) (the second moment's decay)")
    return _fedopt(learning_rate, b1, tau, lambda v, g2: v - (1 - b2) * g2 * jnp.sign(v - g2))
