"""ModelAdapter: one functional interface for linen and nnx models, with and without BatchNorm.

train=True updates the non-trainable state (batch statistics) and uses dropout; train=False
leaves the state as it is and is deterministic. Both adapters are jit/vmap/grad friendly."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxfl.models import ModelAdapter, as_adapter, make_model

X = jax.random.normal(jax.random.key(9), (6, 5)) * 3 + 1  # batch statistics far from the (0, 1) init


class LinenBN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dense(4)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        x = nn.Dropout(0.5, deterministic=not train)(x)
        return nn.Dense(3)(x)


class NnxBN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.dense = nnx.Linear(5, 4, rngs=rngs)
        self.norm = nnx.BatchNorm(4, momentum=0.9, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.head = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        return self.head(self.drop(self.norm(self.dense(x))))


class NnxPlain(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.dense = nnx.Linear(5, 3, rngs=rngs)

    def __call__(self, x):
        return self.dense(x)


ADAPTERS = {
    "linen_bn": lambda: ModelAdapter.from_linen(LinenBN()),
    "nnx_bn": lambda: ModelAdapter.from_nnx(NnxBN),
    "linen_plain": lambda: ModelAdapter.from_linen(nn.Dense(3)),
    "nnx_plain": lambda: ModelAdapter.from_nnx(NnxPlain),
}


def leaves_equal(a, b):
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("name", ["linen_bn", "nnx_bn"])
def test_batchnorm_state_updates_only_in_training(name):
    adapter = ADAPTERS[name]()
    params, state = adapter.init(jax.random.key(0), X[:1])
    assert adapter.has_state(state) and isinstance(state, dict)
    logits, trained_state = adapter.apply(params, state, X, train=True, key=jax.random.key(1))
    assert logits.shape == (6, 3)
    assert jax.tree.structure(trained_state) == jax.tree.structure(state)
    assert not leaves_equal(trained_state, state), "train=True moves the running statistics"
    # momentum 0.9: running mean = 0.9 * 0 + 0.1 * batch mean of the pre-norm activations.
    means = [leaf for leaf in jax.tree.leaves(trained_state) if float(jnp.min(leaf)) != float(jnp.max(leaf))]
    assert means, "statistics are per-feature"
    eval_logits, eval_state = adapter.apply(params, trained_state, X, train=False, key=None)
    assert leaves_equal(eval_state, trained_state), "train=False leaves the state alone"
    again, _ = adapter.apply(params, trained_state, X, train=False, key=jax.random.key(5))
    np.testing.assert_array_equal(eval_logits, again)  # deterministic: no dropout, running stats


@pytest.mark.parametrize("name", ["linen_plain", "nnx_plain"])
def test_stateless_models_have_empty_state(name):
    adapter = ADAPTERS[name]()
    params, state = adapter.init(jax.random.key(0), X[:1])
    assert not adapter.has_state(state)
    logits, new_state = adapter.apply(params, state, X, train=True, key=jax.random.key(1))
    assert logits.shape == (6, 3) and not adapter.has_state(new_state)


@pytest.mark.parametrize("name", ["linen_bn", "nnx_bn"])
def test_dropout_follows_the_key(name):
    adapter = ADAPTERS[name]()
    params, state = adapter.init(jax.random.key(0), X[:1])
    a, _ = adapter.apply(params, state, X, train=True, key=jax.random.key(1))
    b, _ = adapter.apply(params, state, X, train=True, key=jax.random.key(1))
    c, _ = adapter.apply(params, state, X, train=True, key=jax.random.key(2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_jit_vmap_grad(name):
    adapter = ADAPTERS[name]()
    params, state = adapter.init(jax.random.key(0), X[:1])

    def loss(p, s, x, key):
        logits, new_state = adapter.apply(p, s, x, train=True, key=key)
        return jnp.mean(logits**2), new_state

    grads, _ = jax.jit(jax.grad(loss, has_aux=True))(params, state, X, jax.random.key(3))
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    # vmap over a client axis: stacked params/state, one key per client.
    stack = lambda tree: jax.tree.map(lambda leaf: jnp.stack([leaf, leaf]), tree)  # noqa: E731
    logits, states = jax.vmap(lambda p, s, k: adapter.apply(p, s, X, True, k))(
        stack(params), stack(state), jax.random.split(jax.random.key(4), 2))
    assert logits.shape == (2, 6, 3)
    assert jax.tree.structure(states) == jax.tree.structure(stack(state))


def test_nnx_factory_init_uses_the_key_and_instances_keep_their_weights():
    adapter = ModelAdapter.from_nnx(NnxPlain)
    p0, _ = adapter.init(jax.random.key(0), X[:1])
    p1, _ = adapter.init(jax.random.key(1), X[:1])
    assert not leaves_equal(p0, p1)
    instance = NnxPlain(nnx.Rngs(7))
    fixed = ModelAdapter.from_nnx(instance)
    q0, _ = fixed.init(jax.random.key(0), X[:1])
    q1, _ = fixed.init(jax.random.key(1), X[:1])
    assert leaves_equal(q0, q1)
    np.testing.assert_allclose(fixed.apply(q0, {}, X, train=False)[0], instance(X), rtol=1e-6)


def test_linen_and_nnx_give_the_same_function_for_the_same_weights():
    linen = ModelAdapter.from_linen(nn.Dense(3))
    lp, _ = linen.init(jax.random.key(0), X[:1])
    nnx_adapter = ModelAdapter.from_nnx(NnxPlain)
    np_, _ = nnx_adapter.init(jax.random.key(0), X[:1])
    np_ = {"dense": {"kernel": lp["kernel"], "bias": lp["bias"]}}
    np.testing.assert_allclose(linen.apply(lp, {}, X)[0], nnx_adapter.apply(np_, {}, X)[0], rtol=1e-6)


def test_zoo_models_through_the_adapter():
    resnet = as_adapter(make_model("resnet18", 10).clone(widths=(4, 4, 4, 4), blocks=(1, 1, 1, 1)))
    params, state = resnet.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)))
    assert set(state) == {"batch_stats"} and "batch_stats" not in params
    x = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
    _, new_state = resnet.apply(params, state, x, train=True, key=jax.random.key(2))
    assert not leaves_equal(new_state, state)
    mlp = as_adapter(make_model("ccfedavg_mlp", 10))  # dropout only, no state
    params, state = mlp.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    assert state == {} and as_adapter(mlp) is mlp


def test_from_nnx_rejects_non_modules():
    with pytest.raises(ValueError, match="nnx.Module or a factory"):
        ModelAdapter.from_nnx(42)


def test_init_variables_is_one_compiled_program_with_the_op_by_op_values():
    """A zoo model's initialisers run as one program (op by op, each compiles its own small program:
    seconds for a CNN on a CPU); the values are those of the op-by-op init, bit for bit, and the next
    run's model (built anew, equal) compiles nothing."""
    adapter = as_adapter(make_model("cnn", 10))
    key, sample = jax.random.key(3), jnp.zeros((1, 28, 28, 1))
    jax.block_until_ready((key, sample))
    compiled = []

    def count(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(event)

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        first = adapter.init_variables(key, sample)
        after_first = len(compiled)
        again = as_adapter(make_model("cnn", 10)).init_variables(key, sample)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert after_first <= 1 and len(compiled) == after_first  # 0 where the tests' compilation cache had it
    op_by_op, _ = adapter.init(key, sample)
    for a, b, c in zip(jax.tree.leaves(first["params"]), jax.tree.leaves(again["params"]), jax.tree.leaves(op_by_op),
                       strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)


def test_a_cpu_compiles_the_zoo_initialiser_cheaply_to_xla_s_default_values():
    """At top level on a CPU the zoo initialiser's program is compiled with XLA:CPU's cheaper
    settings (it runs once per run); its values are those of XLA's defaults, bit for bit. In a
    process of its own, without the suite's XLA flags (conftest.py), so that the defaults are XLA's."""
    import os
    import subprocess
    import sys

    script = (
        "import jax, jax.numpy as jnp, numpy as np\n"
        "from jaxfl.models import make_model\n"
        "from jaxfl.models.adapter import ModelAdapter, _compiled_zoo_init\n"
        "module = make_model('cnn', 10)\n"
        "key, sample = jax.random.key(3), jnp.zeros((1, 28, 28, 1))\n"
        "cheap = ModelAdapter.from_linen(module).init_variables(key, sample)['params']\n"
        "_compiled_zoo_init(module, True)  # a cache hit if init_variables compiled the cheap program\n"
        "default = jax.jit(ModelAdapter.from_linen(module).init)(key, sample)[0]\n"
        "same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(cheap), jax.tree.leaves(default), strict=True))\n"
        "print(same, len(jax.tree.leaves(default)), _compiled_zoo_init.cache_info().hits)\n")
    env = {key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR")}
    done = subprocess.run([sys.executable, "-c", script], env={**env, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "8", "1"]  # the cheap program was the one init_variables used


def test_a_zoo_initialiser_runs_inside_a_trace_with_the_top_level_values():
    """Inside ``jax.eval_shape`` (the model-input check) or a user's jit, jax refuses compiler options
    on a nested jit: the initialiser then compiles with the defaults, to the same values."""
    adapter = as_adapter(make_model("lenet5", 10))
    key, sample = jax.random.key(1), jnp.zeros((1, 28, 28, 1))
    top = adapter.init_variables(key, sample)
    shapes = jax.eval_shape(adapter.init_variables, key, sample)
    traced = jax.jit(adapter.init_variables)(key, sample)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), shapes) == jax.tree.map(lambda a: (a.shape, a.dtype), top)
    for a, b in zip(jax.tree.leaves(top), jax.tree.leaves(traced), strict=True):
        assert np.array_equal(a, b)


class NnxTakingTrain(nnx.Module):
    """Ported from linen: its layers read the mode from a `train` argument, not the view's defaults."""

    def __init__(self, rngs: nnx.Rngs):
        self.dense = nnx.Linear(5, 4, rngs=rngs)
        self.norm = nnx.BatchNorm(4, momentum=0.9, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x, train: bool = False):
        x = self.norm(self.dense(x), use_running_average=not train)
        return self.drop(x, deterministic=not train)


def test_an_nnx_module_taking_train_trains_in_train_mode():
    """A train argument set by the call wins over nnx.view; it was never passed, so such a module
    trained in eval mode: BatchNorm statistics at their init, no dropout."""
    adapter = ModelAdapter.from_nnx(NnxTakingTrain)
    params, state = adapter.init(jax.random.key(0), X)
    _, trained = adapter.apply(params, state, X, train=True, key=jax.random.key(1))
    assert not np.allclose(trained["norm"]["mean"], state["norm"]["mean"])
    dropped, _ = adapter.apply(params, state, X, train=True, key=jax.random.key(1))
    assert (np.asarray(dropped) == 0).mean() > 0.2  # dropout on
    evaluated, kept = adapter.apply(params, state, X, train=False, key=None)
    assert np.allclose(kept["norm"]["mean"], state["norm"]["mean"]) and (np.asarray(evaluated) != 0).all()


class LinenOtherFlag(nn.Module):
    @nn.compact
    def __call__(self, x, is_train: bool = False):
        return nn.BatchNorm(use_running_average=not is_train)(nn.Dense(4)(x))


def test_a_mode_argument_jaxfl_cannot_set_is_named():
    with pytest.warns(UserWarning, match=r"model LinenOtherFlag.__call__ takes is_train=False, which jaxfl does not "
                                         r"set: jaxfl passes the mode as train, training, is_training or deterministic"):
        ModelAdapter.from_linen(LinenOtherFlag())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ModelAdapter.from_linen(LinenBN())
        ModelAdapter.from_nnx(NnxTakingTrain)
        ModelAdapter.from_linen(LinenWithAnOption())  # a boolean that is no mode: no word


class LinenWithAnOption(nn.Module):
    @nn.compact
    def __call__(self, x, return_features: bool = False):
        features = nn.Dense(4)(x)
        return features if return_features else nn.Dense(2)(features)
