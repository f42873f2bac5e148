"""Local training of ONE client: a pure-JAX kernel that the engine vmaps.

The kernel is written for a single, unbatched client. Training is split into three pure functions
so that the engine can drive the step loop in whatever form is fastest on the backend (a
``lax.scan``, unrolled or rolled, or a jitted step called from Python); the reference driver
:func:`local_train` chains them with one ``lax.scan``.

Data layout: every client's samples live once, flat, in :class:`FederatedArrays` (``x`` of shape
``(N, ...)`` and ``y`` of shape ``(N,)``); a client is a :class:`ClientView` ``(offset, count)``
into it. Minibatches are drawn inside the kernel the way a shuffled PyTorch ``DataLoader`` that
restarts every round does (the seed papers' clients): epoch ``e`` is a fresh permutation of the
client's own samples, batch ``b`` of that epoch takes positions ``[bB, bB + B)`` of it, and the last
batch of an epoch is short (masked), after which the next epoch starts. Steps at or beyond the
client's ``num_steps`` leave parameters and optimiser state untouched, so clients with different
step counts share one call.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]

# Sub-streams of a dispatch key, fixed so that results never depend on batching.
_PERMUTATION_STREAM = 0
_AUGMENT_STREAM = 1


class FederatedArrays(NamedTuple):
    """All clients' samples on device, stored once: ``x`` (N, ...) and integer labels ``y`` (N,)."""

    x: jax.Array
    y: jax.Array


class ClientView(NamedTuple):
    """One client's slice of :class:`FederatedArrays`: int32 scalars ``offset`` and ``count``."""

    offset: jax.Array
    count: jax.Array


class LocalState(NamedTuple):
    """The carry of local training for one client."""

    params: PyTree
    opt_state: PyTree
    key: jax.Array
    step: jax.Array  # int32, steps taken so far (masked steps included)
    num_steps: jax.Array  # int32, steps this client is asked to take
    loss_sum: jax.Array  # float32, summed minibatch loss over the active steps
    all_finite: jax.Array  # bool, every active loss so far was finite
    lr_scale: jax.Array  # float32, multiplies every optimiser update (1 = the optimiser as built)
    anchor: PyTree = None  # FedProx: w_start of the proximal term (None when prox_mu = 0)


class ClientTrainer(NamedTuple):
    """Pure functions for local training (optax-style bundle, built by :func:`make_client_trainer`).

    ``init(params, num_steps, key, lr_scale=1.0) -> LocalState``;
    ``step(state, data, view) -> LocalState`` (one masked step);
    ``finish(start_params, state) -> (delta, metrics)`` with ``delta = start - final``.
    """

    init: Callable[..., LocalState]
    step: Callable[..., LocalState]
    finish: Callable[..., tuple[PyTree, dict]]
    batch_size: int
    max_count: int
    # ``batch_loss(params, state, data, view) -> loss`` of ``params`` on the minibatch that
    # ``step(state)`` draws next (no proximal term); FedASMU's device-side hypergradient uses it.
    batch_loss: Callable[..., jax.Array] | None = None


def scale_uint8(x: jax.Array) -> jax.Array:
    """Default preprocessing: uint8 pixels to float32 in [0, 1] (FedCompass: ToTensor only)."""
    return x.astype(jnp.float32) / 255.0


def minibatch_indices(key: jax.Array, step: jax.Array, view: ClientView, batch_size: int,
                      max_count: int) -> tuple[jax.Array, jax.Array]:
    """Global sample indices ``(B,)`` and a float mask ``(B,)`` for one step of one client.

    Sampling is without replacement within an epoch (a fresh permutation of the client's ``count``
    samples per epoch, derived from ``key`` and the epoch number) and wraps to a new epoch; the last
    batch of an epoch is short, its missing entries masked. ``max_count`` (static) bounds every
    client's ``count`` so the permutation has a static shape.

    >>> idx, mask = minibatch_indices(jax.random.key(0), jnp.int32(0),
    ...                               ClientView(jnp.int32(10), jnp.int32(5)), 4, 8)
    >>> idx.shape, float(mask.sum())
    ((4,), 4.0)
    """
    count = jnp.maximum(view.count, 1)
    batches_per_epoch = (count + batch_size - 1) // batch_size
    epoch = step // batches_per_epoch
    batch_in_epoch = step % batches_per_epoch
    scores = jax.random.uniform(jax.random.fold_in(key, epoch), (max_count,))
    # Positions beyond the client's own samples sort last, so the first `count` entries of the
    # argsort are a uniform permutation of the client's samples.
    scores = jnp.where(jnp.arange(max_count) < count, scores, 2.0)
    permutation = jnp.argsort(scores)
    positions = batch_in_epoch * batch_size + jnp.arange(batch_size)
    valid = positions < count
    local = permutation[jnp.minimum(positions, max_count - 1)]
    local = jnp.where(valid, local, 0)
    return view.offset + local, valid.astype(jnp.float32)


def make_client_trainer(apply_fn: ApplyFn, optimizer: optax.GradientTransformation, batch_size: int,
                        max_count: int, preprocess: Callable[[jax.Array], jax.Array] = scale_uint8,
                        augment: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
                        prox_mu: float = 0.0) -> ClientTrainer:
    """Build the local-training kernel for one client (FedCompass Alg. 1, FEDCOMPASS-CLIENT).

    ``apply_fn(params, x) -> logits``; the loss is softmax cross-entropy averaged over the valid
    entries of the minibatch. The client optimiser (any optax transformation) is re-initialised at
    every dispatch, as the seed papers' code does. ``augment(key, x_raw) -> x`` (e.g.
    :func:`jaxfl.data.augment.make_augment`), if given, replaces ``preprocess`` in training; its key
    is ``fold_in(fold_in(dispatch_key, 1), step)``, so it never depends on batching.

    ``prox_mu`` = μ > 0 adds FedProx's proximal term μ/2 ‖w − w_start‖² to the local objective
    (its gradient μ (w − w_start) is added to every minibatch gradient; the reported loss stays the
    data loss). ``init(..., anchor=...)`` overrides w_start; μ = 0 builds exactly the kernel without it.

    >>> import flax.linen as nn
    >>> model = nn.Dense(3)
    >>> params = model.init(jax.random.key(0), jnp.zeros((1, 4)))
    >>> trainer = make_client_trainer(model.apply, optax.sgd(0.1), batch_size=2, max_count=4,
    ...                               preprocess=lambda x: x)
    >>> data = FederatedArrays(jnp.ones((4, 4)), jnp.array([0, 1, 2, 0]))
    >>> delta, metrics = local_train(trainer, params, data, ClientView(jnp.int32(0), jnp.int32(4)),
    ...                              jnp.int32(3), jax.random.key(1), max_steps=5)
    >>> int(metrics["steps"])
    3
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_count < 1:
        raise ValueError(f"max_count must be >= 1, got {max_count}")
    if not prox_mu >= 0:
        raise ValueError(f"prox_mu must be >= 0, got {prox_mu}")

    # With augmentation the batch arrives already transformed (augment ends with the preprocessing).
    transform = preprocess if augment is None else (lambda x: x)

    def loss_fn(params, x, y, weights):
        logits = apply_fn(params, transform(x))
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
        return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)

    grad_fn = jax.value_and_grad(loss_fn)

    def init(params, num_steps, key, lr_scale=1.0, anchor=None) -> LocalState:
        return LocalState(params=params, opt_state=optimizer.init(params), key=key,
                          step=jnp.zeros((), jnp.int32), num_steps=jnp.asarray(num_steps, jnp.int32),
                          loss_sum=jnp.zeros((), jnp.float32), all_finite=jnp.ones((), bool),
                          lr_scale=jnp.asarray(lr_scale, jnp.float32),
                          anchor=(params if anchor is None else anchor) if prox_mu > 0 else None)

    def step(state: LocalState, data: FederatedArrays, view: ClientView) -> LocalState:
        permutation_key = jax.random.fold_in(state.key, _PERMUTATION_STREAM)
        indices, weights = minibatch_indices(permutation_key, state.step, view, batch_size, max_count)
        x = data.x[indices]
        if augment is not None:
            x = augment(jax.random.fold_in(jax.random.fold_in(state.key, _AUGMENT_STREAM), state.step), x)
        loss, grads = grad_fn(state.params, x, data.y[indices], weights)
        if prox_mu > 0:  # FedProx: ∇ μ/2 ‖w − w_start‖²
            grads = jax.tree.map(lambda g, w, a: g + prox_mu * (w - a), grads, state.params, state.anchor)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        updates = jax.tree.map(lambda u: u * state.lr_scale.astype(u.dtype), updates)
        params = optax.apply_updates(state.params, updates)
        active = state.step < state.num_steps
        keep = lambda new, old: jnp.where(active, new, old)
        return LocalState(
            params=jax.tree.map(keep, params, state.params),
            opt_state=jax.tree.map(keep, opt_state, state.opt_state),
            key=state.key,
            step=state.step + 1,
            num_steps=state.num_steps,
            loss_sum=state.loss_sum + jnp.where(active, loss, 0.0),
            all_finite=state.all_finite & (~active | jnp.isfinite(loss)),
            lr_scale=state.lr_scale,
            anchor=state.anchor,
        )

    def finish(start_params, state: LocalState):
        delta = jax.tree.map(lambda start, end: start - end, start_params, state.params)
        steps = jnp.minimum(state.step, state.num_steps)
        delta_finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf))
                                          for leaf in jax.tree.leaves(delta)]))
        metrics = {
            "loss": state.loss_sum / jnp.maximum(steps, 1).astype(jnp.float32),
            "steps": steps,
            "finite": state.all_finite & delta_finite,
        }
        return delta, metrics

    def batch_loss(params, state: LocalState, data: FederatedArrays, view: ClientView):
        permutation_key = jax.random.fold_in(state.key, _PERMUTATION_STREAM)
        indices, weights = minibatch_indices(permutation_key, state.step, view, batch_size, max_count)
        x = data.x[indices]
        if augment is not None:
            x = augment(jax.random.fold_in(jax.random.fold_in(state.key, _AUGMENT_STREAM), state.step), x)
        return loss_fn(params, x, data.y[indices], weights)

    return ClientTrainer(init=init, step=step, finish=finish, batch_size=batch_size,
                         max_count=max_count, batch_loss=batch_loss)


def local_train(trainer: ClientTrainer, params: PyTree, data: FederatedArrays, view: ClientView,
                num_steps: jax.Array, key: jax.Array, max_steps: int, unroll: int | bool = 1):
    """Reference driver: ``num_steps`` (≤ ``max_steps``, static) masked steps in one ``lax.scan``.

    Returns ``(delta, metrics)``. See :func:`make_client_trainer` for an example.
    """
    state = trainer.init(params, num_steps, key)

    def body(carry, _):
        return trainer.step(carry, data, view), None

    state, _ = jax.lax.scan(body, state, None, length=max_steps, unroll=unroll)
    return trainer.finish(params, state)
