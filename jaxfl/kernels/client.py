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

Models: either a plain ``apply(params, x) -> logits`` (stateless; ``params`` any pytree) or a
:class:`~jaxfl.models.adapter.ModelAdapter`. With an adapter the model the kernel receives and
returns is the dict ``{"params": trainable}`` plus ``{"state": buffers}`` when the model keeps
non-trainable state (BatchNorm running statistics; :meth:`ModelAdapter.init_variables`). Training
runs the model in train mode (batch statistics, dropout with a per-step key); only ``"params"``
gets gradients, optimiser updates and the proximal term; the delta of ``"state"`` is zero, and the
client's final buffers are in ``LocalState.params["state"]`` for the aggregator (as in the FedCompass
authors' code: buffers are not averaged as deltas but replaced by the plain mean of the aggregated clients').
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfl.kernels.cpu_ops import cpu_friendly
from jaxfl.kernels.permutation import permute
from jaxfl.kernels.tree import tree_all_finite
from jaxfl.models.adapter import ModelAdapter

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]

# Sub-streams of a dispatch key, fixed so that random draws never depend on batching.
_PERMUTATION_STREAM = 0
_AUGMENT_STREAM = 1
_DROPOUT_STREAM = 2
BUFFERS = "state"  # key of the non-trainable state in an adapter model's variables


class FederatedArrays(NamedTuple):
    """All clients' samples on device, stored once: ``x`` (N, ...) and integer labels ``y`` (N,), client
    after client (:func:`jaxfl.data.build_federation` builds them; any arrays of that layout will do).

    >>> data = FederatedArrays(jnp.zeros((5, 28, 28, 1), jnp.uint8), jnp.array([0, 1, 2, 3, 4]))
    >>> data.x.shape, data.y.shape
    ((5, 28, 28, 1), (5,))
    """

    x: jax.Array
    y: jax.Array


class ClientView(NamedTuple):
    """One client's slice of :class:`FederatedArrays`: int32 scalars ``offset`` and ``count`` (samples
    ``offset .. offset + count - 1``). Stacked, each field is a ``(C,)`` array, one row per client, ready
    for ``jax.vmap``; a client with ``count`` 0 trains on nothing (no step, ``steps`` 0).

    >>> views = ClientView(jnp.array([0, 3], jnp.int32), jnp.array([3, 2], jnp.int32))   # clients of 3 and 2
    >>> jax.tree.map(lambda field: field[1], views)
    ClientView(offset=Array(3, dtype=int32), count=Array(2, dtype=int32))
    """

    offset: jax.Array
    count: jax.Array


class LocalState(NamedTuple):
    """The carry of local training for one client (:meth:`ClientTrainer.init` builds it; ``step`` advances it).

    >>> trainer = make_client_trainer(lambda p, x: x @ p, optax.sgd(0.1), batch_size=2, preprocess=lambda x: x)
    >>> state = trainer.init(jnp.zeros((4, 3)), num_steps=5, key=jax.random.key(0))
    >>> int(state.step), int(state.num_steps), float(state.lr_scale), state.anchor is None
    (0, 5, 1.0, True)
    """

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

    Drive the steps yourself (here two steps of a linear model, as :func:`local_train` does in a scan):

    >>> trainer = make_client_trainer(lambda p, x: x @ p, optax.sgd(0.1), batch_size=2, preprocess=lambda x: x)
    >>> data = FederatedArrays(jnp.ones((4, 4)), jnp.array([0, 1, 2, 0]))
    >>> view, params = ClientView(jnp.int32(0), jnp.int32(4)), jnp.zeros((4, 3))
    >>> state = trainer.init(params, 2, jax.random.key(0))
    >>> for _ in range(2):
    ...     state = trainer.step(state, data, view)
    >>> delta, metrics = trainer.finish(params, state)
    >>> delta.shape, int(metrics["steps"]), bool(metrics["finite"])
    ((4, 3), 2, True)
    """

    init: Callable[..., LocalState]
    step: Callable[..., LocalState]
    finish: Callable[..., tuple[PyTree, dict]]
    batch_size: int
    # ``batch_loss(params, state, data, view) -> loss`` of ``params`` on the minibatch that
    # ``step(state)`` draws next (no proximal term); FedASMU's device-side hypergradient uses it.
    batch_loss: Callable[..., jax.Array] | None = None
    # Built from a ModelAdapter: the model is {"params": ...} plus {"state": buffers} when it keeps
    # non-trainable state, whose final values the aggregator reads from ``LocalState.params["state"]``.
    adapter: bool = False


def scale_uint8(x: jax.Array) -> jax.Array:
    """Default preprocessing: integer (uint8) pixels to float32 in [0, 1] (FedCompass: ToTensor only);
    float inputs are already model inputs and are only cast to float32, never divided by 255.

    >>> scale_uint8(jnp.array([51], jnp.uint8)).tolist(), scale_uint8(jnp.array([0.2])).tolist()
    ([0.20000000298023224], [0.20000000298023224])
    """
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


def minibatch_indices(key: jax.Array, step: jax.Array, view: ClientView,
                      batch_size: int) -> tuple[jax.Array, jax.Array]:
    """Global sample indices ``(B,)`` and a float mask ``(B,)`` for one step of one client.

    Sampling is without replacement within an epoch (a fresh keyed permutation of the client's
    ``count`` samples per epoch, derived from ``key`` and the epoch number) and wraps to a new epoch;
    the last batch of an epoch is short, its missing entries masked; a client with ``count`` 0 gets an
    all-masked batch (no other client's sample). Only the ``B`` positions of
    this step are permuted (:func:`jaxfl.kernels.permutation.permute`, a Feistel network), so a step
    costs O(B) whatever the client's size — no array as long as the largest client.

    >>> idx, mask = minibatch_indices(jax.random.key(0), jnp.int32(0),
    ...                               ClientView(jnp.int32(10), jnp.int32(5)), 4)
    >>> idx.shape, float(mask.sum())
    ((4,), 4.0)
    """
    count = jnp.maximum(view.count, 1)
    batches_per_epoch = (count + batch_size - 1) // batch_size
    epoch = step // batches_per_epoch
    batch_in_epoch = step % batches_per_epoch
    positions = batch_in_epoch * batch_size + jnp.arange(batch_size, dtype=jnp.int32)
    valid = positions < view.count  # not ``count``: an empty client must not read the sample at its offset
    local = jnp.where(valid, permute(jax.random.fold_in(key, epoch), positions, count), 0)
    return view.offset + local, valid.astype(jnp.float32)


def integer_label_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """The default per-example loss: softmax cross-entropy with integer labels ``(B,)`` (optax's), whose
    labels of another rank are refused by name (``(B, 1)`` labels came back as optax's "indices and arr
    must have the same number of dimensions").

    >>> [round(float(x), 4) for x in integer_label_cross_entropy(jnp.zeros((2, 4)), jnp.array([1, 3]))]   # ln 4
    [1.3863, 1.3863]
    """
    if jnp.ndim(labels) != jnp.ndim(logits) - 1:
        raise ValueError(f"labels of shape {tuple(jnp.shape(labels))} for logits of shape {tuple(jnp.shape(logits))}: "
                         "the default loss takes one integer class per example, labels of the logits' shape "
                         "without their last axis (an image's y of shape (N,): a (N, 1) y is y.reshape(-1)); other "
                         "targets need a loss of your own")
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def make_client_trainer(model: ApplyFn | ModelAdapter, optimizer: optax.GradientTransformation, batch_size: int,
                        preprocess: Callable[[jax.Array], jax.Array] = scale_uint8,
                        augment: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
                        prox_mu: float = 0.0, cpu_friendly_layers: bool = False,
                        loss: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
                        every_convolution: bool = False) -> ClientTrainer:
    """Build the local-training kernel for one client (FedCompass Alg. 1, FEDCOMPASS-CLIENT).

    ``preprocess`` turns the stored inputs into model inputs; the default, :func:`scale_uint8`, is for
    images: integer pixels of any integer dtype are divided by 255. Token ids (an embedding's input)
    need ``preprocess=lambda x: x``, as the engine passes for token datasets.

    ``model`` is ``apply(params, x) -> logits`` or a :class:`~jaxfl.models.adapter.ModelAdapter`
    (then ``params`` is ``{"params": ..., "state": ...}``, see the module docstring). The objective is
    ``loss(logits, labels) -> (B,)`` per example (default: softmax cross-entropy with integer labels)
    averaged over the valid entries of the minibatch. The client optimiser (any optax transformation) is re-initialised at
    every dispatch, as the seed papers' code does. ``augment(key, x_raw) -> x`` (e.g.
    :func:`jaxfl.data.augment.make_augment`), if given, replaces ``preprocess`` in training; its key
    is ``fold_in(fold_in(dispatch_key, 1), step)``, so it never depends on batching.

    ``prox_mu`` = μ > 0 adds FedProx's proximal term μ/2 ‖w − w_start‖² to the local objective
    (its gradient μ (w − w_start) is added to every minibatch gradient; the reported loss stays the
    data loss). ``init(..., anchor=...)`` overrides w_start; μ = 0 builds exactly the kernel without it.

    ``cpu_friendly_layers`` runs the model's convolutions, tiling max-pools and dense products in the
    forms XLA:CPU computes faster (:mod:`jaxfl.kernels.cpu_ops`; the engine's runs turn it on on CPUs);
    with ``every_convolution`` every convolution takes the im2col form, wide ones too
    (``cpu_friendly(..., every_convolution=True)``: the form to measure on accelerators).

    >>> import flax.linen as nn
    >>> model = nn.Dense(3)
    >>> params = model.init(jax.random.key(0), jnp.zeros((1, 4)))
    >>> trainer = make_client_trainer(model.apply, optax.sgd(0.1), batch_size=2, preprocess=lambda x: x)
    >>> data = FederatedArrays(jnp.ones((4, 4)), jnp.array([0, 1, 2, 0]))
    >>> delta, metrics = local_train(trainer, params, data, ClientView(jnp.int32(0), jnp.int32(4)),
    ...                              jnp.int32(3), jax.random.key(1), max_steps=5)
    >>> int(metrics["steps"])
    3
    """
    if not (isinstance(batch_size, numbers.Integral) and not isinstance(batch_size, bool) and batch_size >= 1):
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if isinstance(prox_mu, (np.ndarray, jax.Array)) and np.ndim(prox_mu) == 0 and not isinstance(prox_mu, jax.core.Tracer):
        prox_mu = float(prox_mu)  # a 0-d array, as JAX code holds its hyperparameters
    if isinstance(prox_mu, bool) or not isinstance(prox_mu, numbers.Real) \
            or not (prox_mu >= 0 and math.isfinite(prox_mu)):  # μ = inf: every step's gradient inf · 0, NaN
        raise ValueError(f"prox_mu={prox_mu!r} is not allowed: a finite number >= 0 (FedProx's μ; 0 turns it off)")

    per_example_loss = integer_label_cross_entropy if loss is None else loss
    # With augmentation the batch arrives already transformed (augment ends with the preprocessing).
    transform = preprocess if augment is None else (lambda x: x)
    adapter = model if isinstance(model, ModelAdapter) else None

    def split(tree):
        """(trainable, buffers or None) of the model the kernel carries."""
        if adapter is None:
            return tree, None
        if not isinstance(tree, dict) or "params" not in tree:  # traced once: the check costs nothing per call
            keys = sorted(tree) if isinstance(tree, dict) else type(tree).__name__
            raise ValueError(f"a trainer of a ModelAdapter takes the model's variables, {{'params': ..., "
                             f"{BUFFERS!r}: ...}} as adapter.init_variables returns them, not their 'params' part: "
                             f"got {keys}")
        return tree["params"], tree.get(BUFFERS)

    def merge(trainable, buffers):
        if adapter is None:
            return trainable
        return {"params": trainable} if buffers is None else {"params": trainable, BUFFERS: buffers}

    def forward(trainable, buffers, x, key):
        """Training-mode logits and the updated buffers."""
        if adapter is None:
            return model(trainable, x), buffers
        logits, new_buffers = adapter.apply(trainable, {} if buffers is None else buffers, x, train=True, key=key)
        return logits, (None if buffers is None else new_buffers)

    if every_convolution and not cpu_friendly_layers:
        raise ValueError("every_convolution=True rewrites the convolutions of cpu_friendly_layers: "
                         "set cpu_friendly_layers=True with it")
    if cpu_friendly_layers:
        forward = cpu_friendly(forward, every_convolution=every_convolution)

    def loss_fn(trainable, buffers, x, y, weights, key):
        logits, new_buffers = forward(trainable, buffers, transform(x), key)
        losses = per_example_loss(logits, y)
        if jnp.shape(losses) != jnp.shape(weights):
            # a scalar (.mean()) would average the masked padding rows in; (B, 1) broadcasts to (B, B)
            raise ValueError(f"loss(logits, labels) must return one value per example, shape {jnp.shape(weights)}; "
                             f"it returned shape {jnp.shape(losses)} (a mean over the batch? return the "
                             "per-example losses: the kernel masks and averages them)")
        return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0), new_buffers

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def minibatch(state: LocalState, data: FederatedArrays, view: ClientView):
        """The step's inputs, labels, sample weights and model key (all fixed by key and step)."""
        permutation_key = jax.random.fold_in(state.key, _PERMUTATION_STREAM)
        indices, weights = minibatch_indices(permutation_key, state.step, view, batch_size)
        x = data.x[indices]
        if augment is not None:
            x = augment(jax.random.fold_in(jax.random.fold_in(state.key, _AUGMENT_STREAM), state.step), x)
        model_key = jax.random.fold_in(jax.random.fold_in(state.key, _DROPOUT_STREAM), state.step)
        return x, data.y[indices], weights, model_key

    def init(params, num_steps, key, lr_scale=1.0, anchor=None) -> LocalState:
        trainable, _ = split(params)
        return LocalState(params=params, opt_state=optimizer.init(trainable), key=key,
                          step=jnp.zeros((), jnp.int32), num_steps=jnp.asarray(num_steps, jnp.int32),
                          loss_sum=jnp.zeros((), jnp.float32), all_finite=jnp.ones((), bool),
                          lr_scale=jnp.asarray(lr_scale, jnp.float32),
                          anchor=(trainable if anchor is None else split(anchor)[0]) if prox_mu > 0 else None)

    def step(state: LocalState, data: FederatedArrays, view: ClientView) -> LocalState:
        x, y, weights, model_key = minibatch(state, data, view)
        trainable, buffers = split(state.params)
        (loss, new_buffers), grads = grad_fn(trainable, buffers, x, y, weights, model_key)
        if prox_mu > 0:  # FedProx: ∇ μ/2 ‖w − w_start‖²
            grads = jax.tree.map(lambda g, w, a: g + prox_mu * (w - a), grads, trainable, state.anchor)
        updates, opt_state = optimizer.update(grads, state.opt_state, trainable)
        updates = jax.tree.map(lambda u: u * state.lr_scale.astype(u.dtype), updates)
        params = merge(optax.apply_updates(trainable, updates), new_buffers)
        # a client without samples takes no step (weight decay would still move it; FedNova reads steps)
        num_steps = jnp.where(view.count > 0, state.num_steps, 0)
        active = state.step < num_steps
        keep = lambda new, old: jnp.where(active, new, old)
        return LocalState(
            params=jax.tree.map(keep, params, state.params),
            opt_state=jax.tree.map(keep, opt_state, state.opt_state),
            key=state.key,
            step=state.step + 1,
            num_steps=num_steps,
            # float32 whatever the model's dtype (a float64 model under jax_enable_x64 has a float64 loss)
            loss_sum=state.loss_sum + jnp.where(active, loss, 0.0).astype(jnp.float32),
            all_finite=state.all_finite & (~active | jnp.isfinite(loss)),
            lr_scale=state.lr_scale,
            anchor=state.anchor,
        )

    def finish(start_params, state: LocalState):
        (start, _), (end, buffers) = split(start_params), split(state.params)
        # Buffers are not a delta: their update is zero and the aggregator reads the final values.
        moved = jax.tree.map(lambda a, b: a - b, start, end)
        delta = merge(moved, None if buffers is None else jax.tree.map(jnp.zeros_like, buffers))
        steps = jnp.minimum(state.step, state.num_steps)
        delta_finite = tree_all_finite((moved, buffers))  # the zeros are finite: not checked
        metrics = {
            "loss": state.loss_sum / jnp.maximum(steps, 1).astype(jnp.float32),
            "steps": steps,
            "finite": state.all_finite & delta_finite,
        }
        return delta, metrics

    def batch_loss(params, state: LocalState, data: FederatedArrays, view: ClientView):
        x, y, weights, model_key = minibatch(state, data, view)
        trainable, buffers = split(params)
        return loss_fn(trainable, buffers, x, y, weights, model_key)[0]

    return ClientTrainer(init=init, step=step, finish=finish, batch_size=batch_size,
                         batch_loss=batch_loss,
                         adapter=adapter is not None)


def local_train(trainer: ClientTrainer, params: PyTree, data: FederatedArrays, view: ClientView,
                num_steps: jax.Array, key: jax.Array, max_steps: int, unroll: int | bool = 1):
    """Reference driver: ``num_steps`` (≤ ``max_steps``, static) masked steps in one ``lax.scan``.

    Returns ``(delta, metrics)``: ``delta`` shaped like ``params`` (start − final), ``metrics`` the
    float32 mean ``loss`` over the active steps, the int32 ``steps`` taken (at most ``max_steps``) and
    ``finite``; for a :class:`~jaxfl.models.adapter.ModelAdapter` model with non-trainable state
    (BatchNorm statistics) also ``buffers``, the client's final values of ``params["state"]`` (whose
    delta is zero: average them, as the engine takes their plain mean over the aggregated clients).
    ``jax.vmap`` it over clients (params, view, num_steps and key; ``data`` shared):

    >>> trainer = make_client_trainer(lambda p, x: x @ p, optax.sgd(0.1), batch_size=2, preprocess=lambda x: x)
    >>> data = FederatedArrays(jnp.ones((6, 4)), jnp.array([0, 1, 2, 0, 1, 2]))
    >>> views = ClientView(jnp.array([0, 4], jnp.int32), jnp.array([4, 2], jnp.int32))
    >>> train = jax.jit(jax.vmap(lambda view, n, key: local_train(trainer, jnp.zeros((4, 3)), data, view, n, key,
    ...                                                          max_steps=3)))
    >>> deltas, metrics = train(views, jnp.array([3, 1]), jax.random.split(jax.random.key(0), 2))
    >>> deltas.shape, metrics["steps"].tolist()
    ((2, 4, 3), [3, 1])
    """
    _check_concrete_inputs(data, view, num_steps, max_steps)
    # One jitted program per (trainer, max_steps, unroll): called eagerly, the scan over a fresh body
    # closure was traced and compiled again on every call; inside the caller's jit/vmap it is inlined.
    # int32 as ClientView says: a view of Python ints, NumPy or jax integers would each compile a program
    view = ClientView(jnp.asarray(view.offset, jnp.int32), jnp.asarray(view.count, jnp.int32))
    return _local_train(trainer, params, data, view, jnp.asarray(num_steps, jnp.int32), key, max_steps=max_steps,
                        unroll=unroll)


def _check_concrete_inputs(data: FederatedArrays, view: ClientView, num_steps, max_steps: int) -> None:
    """Refuse, by value, a step count outside ``[0, max_steps]`` and a view outside the data, where they
    are known (an eager call; traced values, under ``jit`` or ``vmap``, are the caller's to keep in
    range): inside the program a count above ``max_steps`` trains ``max_steps`` steps and a view past
    the end trains on clamped rows, both without a word."""
    def concrete(value):
        try:
            return np.asarray(value)
        except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError, TypeError):
            return None

    if len(data.x) != len(data.y):  # static shapes: checked under jit too
        raise ValueError(f"data is not allowed: x holds {len(data.x)} samples and y {len(data.y)}; "
                         "FederatedArrays needs x (N, ...) and y (N,) of the same N")
    if isinstance(max_steps, bool) or not isinstance(max_steps, numbers.Integral) or max_steps < 0:
        raise ValueError(f"max_steps={max_steps!r} is not allowed: an int >= 0 (the steps the program is built for)")
    steps, offset, count = concrete(num_steps), concrete(view.offset), concrete(view.count)
    if steps is not None and steps.dtype.kind not in "iub":  # 2.5 was cast to 2 steps without a word
        raise ValueError(f"num_steps={num_steps!r} is not allowed: whole steps, an int (or an int array) in "
                         f"[0, max_steps={max_steps}]")
    if steps is not None and steps.size and (steps.min() < 0 or steps.max() > max_steps):
        raise ValueError(f"num_steps={num_steps!r} is not allowed: steps lie in [0, max_steps={max_steps}]")
    if offset is None or count is None or not offset.size:
        return
    samples = len(data.y)
    if offset.min() < 0 or count.min() < 0 or (offset + count).max() > samples:
        raise ValueError(f"view {view!r} is not allowed: offset >= 0 and count >= 0 with offset + count <= "
                         f"{samples}, the samples of data")


@functools.partial(jax.jit, static_argnames=("trainer", "max_steps", "unroll"))
def _local_train(trainer: ClientTrainer, params: PyTree, data: FederatedArrays, view: ClientView,
                 num_steps: jax.Array, key: jax.Array, max_steps: int, unroll: int | bool):
    state = trainer.init(params, num_steps, key)

    def body(carry, _):
        return trainer.step(carry, data, view), None

    state, _ = jax.lax.scan(body, state, None, length=max_steps, unroll=unroll)
    delta, metrics = trainer.finish(params, state)
    if trainer.adapter and isinstance(state.params, dict) and BUFFERS in state.params:
        metrics = {**metrics, "buffers": state.params[BUFFERS]}  # their delta is zero: the final values
    return delta, metrics
