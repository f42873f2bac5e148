"""The one-client kernel: sampling, masking, and vmapped training equal to a loop over clients."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfl.kernels import ClientView, FederatedArrays, local_train, make_client_trainer, minibatch_indices


class TinyNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(3)(nn.relu(nn.Dense(8)(x)))


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(40, 4, 4, 1), dtype=np.uint8)
    y = rng.integers(0, 3, size=40).astype(np.int32)
    data = FederatedArrays(jnp.asarray(x), jnp.asarray(y))
    model = TinyNet()
    params = model.init(jax.random.key(0), jnp.zeros((1, 4, 4, 1)))
    trainer = make_client_trainer(model.apply, optax.adam(1e-2), batch_size=4)
    # three ragged clients: 16, 10 and 7 samples
    views = [ClientView(jnp.int32(0), jnp.int32(16)), ClientView(jnp.int32(16), jnp.int32(10)),
             ClientView(jnp.int32(26), jnp.int32(7))]
    return data, params, trainer, views


def test_epoch_is_a_permutation_of_the_clients_own_samples():
    view = ClientView(jnp.int32(100), jnp.int32(10))
    key = jax.random.key(3)
    seen = []
    for step in range(3):  # batch 4: batches of 4, 4, 2 (short, masked) make one epoch
        idx, mask = minibatch_indices(key, jnp.int32(step), view, 4)
        seen += [int(i) for i, m in zip(idx, mask) if m]
    assert sorted(seen) == list(range(100, 110))
    _, last_mask = minibatch_indices(key, jnp.int32(2), view, 4)
    assert last_mask.tolist() == [1.0, 1.0, 0.0, 0.0]
    # the next epoch is a fresh permutation of the same samples
    second = []
    for step in range(3, 6):
        idx, mask = minibatch_indices(key, jnp.int32(step), view, 4)
        second += [int(i) for i, m in zip(idx, mask) if m]
    assert sorted(second) == list(range(100, 110)) and second != seen


def test_masked_steps_have_no_effect(setup):
    data, params, trainer, views = setup
    key = jax.random.key(7)
    delta_exact, metrics_exact = local_train(trainer, params, data, views[0], jnp.int32(5), key, max_steps=5)
    delta_padded, metrics_padded = local_train(trainer, params, data, views[0], jnp.int32(5), key, max_steps=12)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 delta_exact, delta_padded)
    assert int(metrics_padded["steps"]) == 5
    assert float(metrics_exact["loss"]) == pytest.approx(float(metrics_padded["loss"]))
    zero, metrics_zero = local_train(trainer, params, data, views[0], jnp.int32(0), key, max_steps=4)
    assert all(np.all(np.asarray(leaf) == 0) for leaf in jax.tree.leaves(zero))
    assert int(metrics_zero["steps"]) == 0


def test_delta_is_start_minus_final(setup):
    data, params, _, views = setup
    model = TinyNet()
    sgd_trainer = make_client_trainer(model.apply, optax.sgd(0.1), batch_size=4)
    key = jax.random.key(1)
    delta, _ = local_train(sgd_trainer, params, data, views[1], jnp.int32(1), key, max_steps=1)
    # one SGD step by hand on the same minibatch
    idx, mask = minibatch_indices(jax.random.fold_in(key, 0), jnp.int32(0), views[1], 4)

    def loss(p):
        logits = model.apply(p, data.x[idx].astype(jnp.float32) / 255.0)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, data.y[idx])
        return jnp.sum(losses * mask) / jnp.sum(mask)

    grads = jax.grad(loss)(params)
    jax.tree.map(lambda d, g: np.testing.assert_allclose(np.asarray(d), 0.1 * np.asarray(g), rtol=1e-5, atol=1e-7),
                 delta, grads)


def test_vmapped_training_equals_python_loop(setup):
    data, params, trainer, views = setup
    steps = [7, 3, 5]
    keys = [jax.random.key(10 + i) for i in range(3)]
    looped = [local_train(trainer, params, data, v, jnp.int32(s), k, max_steps=7)
              for v, s, k in zip(views, steps, keys)]
    stacked_params = jax.tree.map(lambda leaf: jnp.stack([leaf] * 3), params)
    stacked_views = ClientView(jnp.stack([v.offset for v in views]), jnp.stack([v.count for v in views]))
    batched = jax.vmap(lambda p, v, s, k: local_train(trainer, p, data, v, s, k, max_steps=7))(
        stacked_params, stacked_views, jnp.array(steps, jnp.int32), jnp.stack(keys))
    for i, (delta, metrics) in enumerate(looped):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b)[i], rtol=1e-5, atol=1e-6),
                     delta, batched[0])
        assert int(batched[1]["steps"][i]) == steps[i]
        assert float(batched[1]["loss"][i]) == pytest.approx(float(metrics["loss"]), rel=1e-5)


def test_nonfinite_loss_is_flagged(setup):
    data, params, _, views = setup
    model = TinyNet()
    exploding = make_client_trainer(model.apply, optax.sgd(1e30), batch_size=4)
    _, metrics = local_train(exploding, params, data, views[0], jnp.int32(6), jax.random.key(0), max_steps=6)
    assert not bool(metrics["finite"])


def test_bad_trainer_arguments():
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        make_client_trainer(lambda p, x: x, optax.sgd(0.1), batch_size=0)


@pytest.mark.parametrize("view, num_steps, refused", [
    ((0, 6), 10, r"num_steps=10 is not allowed: steps lie in \[0, max_steps=3\]"),
    ((0, 6), -2, r"num_steps=-2 is not allowed"),
    ((4, 10), 2, r"view ClientView\(offset=4, count=10\) is not allowed: .* offset \+ count <= 6"),
    ((-3, 2), 2, r"view ClientView\(offset=-3, count=2\) is not allowed"),
])
def test_local_train_refuses_known_out_of_range_inputs_and_leaves_traced_ones_to_the_caller(view, num_steps, refused):
    """Eager calls with a count above max_steps trained max_steps, and a view past the data trained on
    clamped rows, silently; under jit and vmap the values are traced and the caller's to check."""
    trainer = make_client_trainer(lambda p, x: x @ p, optax.sgd(0.1), batch_size=2, preprocess=lambda x: x)
    data = FederatedArrays(jnp.ones((6, 4)), jnp.array([0, 1, 2, 0, 1, 2]))
    with pytest.raises(ValueError, match=refused):
        local_train(trainer, jnp.zeros((4, 3)), data, ClientView(*view), num_steps, jax.random.key(0), max_steps=3)
    traced = jax.jit(lambda n: local_train(trainer, jnp.zeros((4, 3)), data, ClientView(0, 6), n, jax.random.key(0),
                                           max_steps=3)[1]["steps"])
    assert int(traced(2)) == 2


def test_loss_must_be_per_example():
    """A loss of ``.mean()`` averaged the short last batch's padding rows in, and (B, 1) broadcast to
    (B, B): both trained a different update without a word."""
    data = FederatedArrays(jnp.ones((8, 4)), jnp.array([0, 1, 2, 0, 1, 2, 0, 1]))
    ce = optax.softmax_cross_entropy_with_integer_labels
    for loss, shape in ((lambda logits, y: ce(logits, y).mean(), r"\(\)"),
                        (lambda logits, y: ce(logits, y)[:, None], r"\(4, 1\)")):
        trainer = make_client_trainer(lambda p, x: x @ p, optax.sgd(0.1), 4, preprocess=lambda x: x, loss=loss)
        with pytest.raises(ValueError, match=rf"one value per example, shape \(4,\); it returned shape {shape}"):
            local_train(trainer, jnp.zeros((4, 3)), data, ClientView(jnp.int32(0), jnp.int32(5)), 2,
                        jax.random.key(0), max_steps=2)


def test_x_and_y_of_different_lengths_are_refused():
    """x shorter than y trained on clamped rows; only y's length was checked."""
    trainer = make_client_trainer(lambda p, x: x @ p, optax.sgd(0.1), batch_size=2, preprocess=lambda x: x)
    data = FederatedArrays(jnp.ones((4, 4)), jnp.zeros(6, jnp.int32))
    with pytest.raises(ValueError, match="x holds 4 samples and y 6"):
        local_train(trainer, jnp.zeros((4, 3)), data, ClientView(jnp.int32(0), jnp.int32(5)), 2, jax.random.key(0),
                    max_steps=2)


def test_a_client_without_samples_takes_no_step():
    """With weight decay an empty client's parameters moved, and its ``steps`` (FedNova's τ_i) said 5."""
    data = FederatedArrays(jnp.ones((8, 5)), jnp.zeros(8, jnp.int32))
    trainer = make_client_trainer(lambda p, x: x @ p, optax.adamw(0.1, weight_decay=0.5), 4, preprocess=lambda x: x)
    delta, metrics = local_train(trainer, jnp.full((5, 3), 0.5), data, ClientView(jnp.int32(0), jnp.int32(0)), 5,
                                 jax.random.key(0), max_steps=5)
    assert float(jnp.abs(delta).max()) == 0.0 and int(metrics["steps"]) == 0
