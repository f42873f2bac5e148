"""FedASMU's meta-model for the fetch slot: an LSTM policy trained by REINFORCE (FedASMU, Liu et al.,
AAAI 2024, "intelligent time slot selection", Formula 5).

The server-side meta-model is an LSTM followed by one fully connected layer. For the decision
epochs l = 1 … 𝓛−2 it emits, one after the other, the probability p_l of the binary decision
f_l = 1 "request the fresh global model after epoch l"; the first epoch whose decision is 1 is the
slot l*, and l* = 𝓛−1 when none is (one request per local run, at most after the second-to-last
epoch). The slot's distribution is therefore::

    P(l* = k) = p_k · Π_{l<k} (1 − p_l)   for k ≤ 𝓛−2,     P(l* = 𝓛−1) = Π_{l≤𝓛−2} (1 − p_l)

and REINFORCE (Formula 5) with the moving-average baseline b ascends (R − b) · ∇_θ log P(l*)::

    θ ← θ + η_RL · ∇_θ log P(l* | context; θ) · (R − b)          # plain SGD, as Formula 5

The paper leaves the LSTM's inputs, size and pre-training unspecified [ours]: each decision step
reads the epoch (one-hot l) and the same context vector (what the server knows at dispatch,
see ``jaxfl.algorithms.fedasmu.LearnedSlot``); 16 hidden units; no pre-training (a seeded random
initialisation). Because the decisions stop at the first 1, every decision on the sampled path is
taken after zeros only, so the previous decision is not an input (it would always be 0).

The LSTM and its REINFORCE step are pure JAX; the scheduler calls them through
:func:`make_slot_meta_model`, whose jitted functions are shared by every selector with the same
shapes and return NumPy (the scheduler's side), so they are not for use inside another ``jit``.

>>> model = make_slot_meta_model(epochs=5, num_features=2, hidden=4, learning_rate=1e-3)
>>> params, opt_state = model.init(0)
>>> probs = model.slot_probabilities(params, np.zeros(2, np.float32))
>>> probs.shape, round(float(probs.sum()), 5)
((4,), 1.0)
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax


class SlotLSTM(nn.Module):
    """LSTM + one dense layer: one logit of p_l = P(f_l = 1) per decision epoch (rows of ``inputs``)."""

    hidden: int = 16

    @nn.compact
    def __call__(self, inputs):
        outputs = nn.RNN(nn.OptimizedLSTMCell(self.hidden))(inputs[None])[0]
        return nn.Dense(1)(outputs)[:, 0]


def decision_inputs(context, epochs: int):
    """One row per decision epoch l = 1 … 𝓛−2: (one-hot l, context).

    >>> decision_inputs(jnp.array([7.0]), 4).tolist()
    [[1.0, 0.0, 7.0], [0.0, 1.0, 7.0]]
    """
    positions = jnp.eye(epochs - 2, dtype=jnp.float32)
    context = jnp.broadcast_to(jnp.asarray(context, jnp.float32), (epochs - 2, jnp.shape(context)[-1]))
    return jnp.concatenate([positions, context], axis=1)


def slot_log_probabilities(logits):
    """log P(l* = k), k = 1 … 𝓛−1, from the 𝓛−2 decision logits (the stopping rule above).

    >>> np.exp(slot_log_probabilities(jnp.zeros(2))).round(3).tolist()   # p = ½, ½: slots ½, ¼, ¼
    [0.5, 0.25, 0.25]
    """
    waited = jnp.concatenate([jnp.zeros(1), jnp.cumsum(jax.nn.log_sigmoid(-logits))])
    return jnp.concatenate([jax.nn.log_sigmoid(logits) + waited[:-1], waited[-1:]])


class SlotMetaModel(NamedTuple):
    """The jitted functions of one meta-model shape (see :func:`make_slot_meta_model`)."""

    init: Callable[[int], tuple[Any, Any]]
    slot_probabilities: Callable[[Any, np.ndarray], np.ndarray]
    decision_probabilities: Callable[[Any, np.ndarray], np.ndarray]
    reinforce: Callable[[Any, Any, np.ndarray, int, float], tuple[Any, Any]]


@functools.lru_cache(maxsize=None)
def make_slot_meta_model(epochs: int, num_features: int, hidden: int, learning_rate: float) -> SlotMetaModel:
    """The meta-model for ``epochs`` local epochs (slots 1 … 𝓛−1, 𝓛 ≥ 3) and ``num_features`` context
    features: ``init(seed)`` → (params, optimiser state); ``slot_probabilities(params, context)`` →
    P(l* = k); ``decision_probabilities`` → p_l; ``reinforce(params, opt_state, context, slot, advantage)``
    → one step of Formula 5 (slot 1-based, advantage R − b). Everything returned is NumPy.

    >>> model = make_slot_meta_model(epochs=4, num_features=1, hidden=4, learning_rate=0.5)
    >>> params, opt_state = model.init(0)
    >>> context = np.ones(1, np.float32)
    >>> before = model.slot_probabilities(params, context)[0]
    >>> params, opt_state = model.reinforce(params, opt_state, context, 1, 1.0)   # slot 1 was rewarded
    >>> bool(model.slot_probabilities(params, context)[0] > before)
    True
    """
    if epochs < 3:
        raise ValueError(f"epochs={epochs}: the meta-model needs at least 3 epochs (two slots to choose from)")
    network = SlotLSTM(hidden)
    optimizer = optax.sgd(learning_rate)  # Formula 5 is a plain gradient step

    def logits(params, context):
        return network.apply(params, decision_inputs(context, epochs))

    @jax.jit
    def slot_probabilities(params, context):
        return jnp.exp(slot_log_probabilities(logits(params, context)))

    @jax.jit
    def decision_probabilities(params, context):
        return jax.nn.sigmoid(logits(params, context))

    @jax.jit
    def reinforce(params, opt_state, context, slot_index, advantage):
        def negative_objective(p):  # −(R − b) log P(l*): its descent is Formula 5's ascent
            return -advantage * slot_log_probabilities(logits(p, context))[slot_index]

        updates, opt_state = optimizer.update(jax.grad(negative_objective)(params), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    # jitted: run eagerly, the LSTM's scan compiled a new program at every call and jax kept each
    # (one per FedASMU run: 36 memory maps each, which 10,000 runs in one process took past the
    # kernel's 65,530 and crashed XLA's next compilation)
    @jax.jit
    def initial_state(key):
        params = network.init(key, jnp.zeros((epochs - 2, epochs - 2 + num_features), jnp.float32))
        return params, optimizer.init(params)

    def init(seed: int):
        return jax.device_get(initial_state(jax.random.key(seed)))

    return SlotMetaModel(
        init=init,
        # host numbers go to the programs as NumPy values (a jnp conversion is an eager op per call)
        slot_probabilities=lambda params, context: np.asarray(slot_probabilities(params, np.asarray(context,
                                                                                                   np.float32))),
        decision_probabilities=lambda params, context: np.asarray(decision_probabilities(
            params, np.asarray(context, np.float32))),
        reinforce=lambda params, opt_state, context, slot, advantage: jax.device_get(reinforce(
            params, opt_state, np.asarray(context, np.float32), np.int32(slot - 1), np.float32(advantage))),
    )
