"""Problems a user of the public kernels and the plug-in API met, each pinned by a test."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfl.kernels import ClientView, FederatedArrays, local_train, make_client_trainer, minibatch_indices


def _apply(params, x):
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


def _params(dtype):
    rng = np.random.default_rng(0)
    return {"w1": jnp.asarray(rng.normal(size=(7, 5)), dtype), "w2": jnp.asarray(rng.normal(size=(5, 3)), dtype)}


def _data(n=23):
    rng = np.random.default_rng(1)
    return FederatedArrays(jnp.asarray(rng.normal(size=(n, 7)), jnp.float32),
                           jnp.asarray(rng.integers(0, 3, n), jnp.int32))


def test_float64_model_trains_under_x64():
    """With jax_enable_x64 a float64 model's loss is float64; the scan carry's float32 loss sum refused it."""
    with jax.enable_x64(True):
        trainer = make_client_trainer(_apply, optax.sgd(0.1), 4, preprocess=lambda x: x)
        params = _params(jnp.float64)
        delta, metrics = local_train(trainer, params, _data(), ClientView(jnp.int32(3), jnp.int32(11)),
                                     jnp.int32(5), jax.random.key(0), max_steps=6)
        assert {leaf.dtype for leaf in jax.tree.leaves(delta)} == {jnp.dtype(jnp.float64)}
        assert metrics["loss"].dtype == jnp.float32 and int(metrics["steps"]) == 5
        assert bool(metrics["finite"])


def test_client_without_samples_draws_no_sample_of_another_client():
    """A ClientView with count 0 drew (and trained on) the sample at its offset, another client's."""
    view = ClientView(jnp.int32(5), jnp.int32(0))
    _, mask = minibatch_indices(jax.random.key(0), jnp.int32(0), view, 4)
    assert mask.tolist() == [0.0, 0.0, 0.0, 0.0]
    trainer = make_client_trainer(_apply, optax.sgd(0.1), 4, preprocess=lambda x: x)
    delta, metrics = local_train(trainer, _params(jnp.float32), _data(), view, jnp.int32(3), jax.random.key(0),
                                 max_steps=3)
    assert all(float(jnp.abs(leaf).max()) == 0.0 for leaf in jax.tree.leaves(delta))
    assert float(metrics["loss"]) == 0.0


def test_weighted_sum_of_integer_leaves_is_not_truncated():
    """weighted_mean of integer leaves cast the weights to int (0.5 -> 0) and returned zeros."""
    from jaxfl.kernels import tree_scale, weighted_mean, weighted_sum

    stacked = {"count": jnp.array([[2], [4]], jnp.int32), "w": jnp.array([[1.0], [3.0]])}
    mean = weighted_mean(stacked, jnp.array([0.5, 0.5]))
    assert mean["count"].dtype == jnp.int32 and mean["count"].tolist() == [3]
    assert mean["w"].tolist() == [2.0]
    assert weighted_sum(stacked, [0.25, 1.0])["count"].tolist() == [4]   # 0.5 + 4 = 4.5, rounded half to even
    assert tree_scale({"n": jnp.array([4, 7], jnp.int32)}, 0.5)["n"].tolist() == [2, 4]


def test_weighted_sum_bfloat16_accumulates_in_float32():
    """bfloat16 leaves: the weights were rounded to bfloat16 first, so 0.3 · 100 − 0.29 · 100 gave 1.0703."""
    from jaxfl.kernels import weighted_sum

    total = weighted_sum({"w": jnp.full((2, 3), 100.0, jnp.bfloat16)}, jnp.array([0.3, -0.29]))["w"]
    assert total.dtype == jnp.bfloat16 and total.tolist() == [1.0] * 3


@pytest.mark.parametrize("weights, message", [
    (jnp.ones(4), r"4 weights for a stack of 3 clients \(leaf \['w'\] has shape \(3, 2\)\)"),
    (jnp.ones((3, 1)), r"weights must have shape \(K,\), one per client; got shape \(3, 1\)"),
])
def test_weighted_sum_refuses_weights_that_do_not_match_the_client_axis(weights, message):
    """(3, 1) weights silently returned a (1, 2) leaf; 4 weights for 3 clients a dot_general shape error."""
    from jaxfl.kernels import weighted_mean, weighted_sum

    for function in (weighted_sum, weighted_mean):
        with pytest.raises(ValueError, match=message):
            function({"w": jnp.ones((3, 2))}, weights)


def test_notebook_03_says_which_attribute_the_default_reply_reads():
    """The default on_reply re-dispatches with the policy's ``self.local_steps``. It had a class
    default of 1, so a policy that kept its count as ``self.steps`` trained every re-dispatch for one
    step, and notebook 03 said only "for `local_steps` steps"; the attribute has no default now and
    such a policy is stopped by name at its first reply, as the notebook says."""
    import json
    import os

    from jaxfl.scheduler.simulation import Policy

    class StepsElsewhere(Policy):
        def __init__(self, steps):
            self.steps = steps

    dispatched = []

    class FakeSim:
        def dispatch(self, client, steps):
            dispatched.append((client, steps))

    with pytest.raises(AttributeError, match="StepsElsewhere.*self.local_steps"):
        StepsElsewhere(10).on_reply(FakeSim(), 3, None)
    assert dispatched == []  # never a silent one-step round
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks",
                        "03_your_own_algorithm.ipynb")
    text = " ".join("".join(cell["source"]) for cell in json.load(open(path))["cells"]
                    if cell["cell_type"] == "markdown").replace("\n", " ")
    assert "**`self.local_steps`**" in text and "has no default" in text and "override `on_reply" in text


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="sgd", momentum=-0.5), r"momentum=-0.5 is not allowed: a number in \[0, 1\)"),
    (dict(name="sgd", momentum=1.5), r"momentum=1.5 is not allowed"),
    (dict(name="sgd", learning_rate=float("nan")), r"learning_rate=nan is not allowed: a finite number > 0"),
    (dict(name="adam", learning_rate=0.0), r"learning_rate=0.0 is not allowed"),
    (dict(name="adam", b1=1.2), r"b1=1.2 is not allowed: a number in \[0, 1\)"),
    (dict(name="yogi", b2=-0.1), r"b2=-0.1 is not allowed: a number in \[0, 1\)"),
    (dict(name="adagrad", tau=-1e-3), r"tau=-0.001 is not allowed: a finite number > 0"),
    # τ = 0 (taken, as RunConfig's server_tau was not) made 0/0 = NaN of every coordinate left at 0
    (dict(name="adam", tau=0.0), r"tau=0.0 is not allowed: a finite number > 0 \(τ = 0 makes 0/0 = NaN"),
])
def test_make_server_optimizer_refuses_bad_hyperparameters(kwargs, message):
    """momentum=-0.5 silently built plain SGD; no other hyperparameter was checked."""
    from jaxfl.kernels import make_server_optimizer

    with pytest.raises(ValueError, match=message):
        make_server_optimizer(**kwargs)


def test_the_fedopt_transforms_refuse_tau_zero():
    from jaxfl.kernels.fedopt import fedadagrad, fedadam, fedyogi

    for make in (fedadam, fedyogi, fedadagrad):
        with pytest.raises(ValueError, match=r"tau=0.0 is not allowed: a finite number > 0"):
            make(0.1, tau=0.0)


@pytest.mark.parametrize("name, traced", [("sgd", "learning_rate"), ("sgd", "momentum"), ("adam", "learning_rate"),
                                          ("adam", "b1"), ("yogi", "b2"), ("adagrad", "tau"),
                                          ("optax_adam", "learning_rate")])
def test_make_server_optimizer_takes_a_traced_hyperparameter(name, traced):
    """A vmapped sweep of server learning rates in a user's JAX code: float() of the tracer raised a
    ConcretizationTypeError, a traced b1 was called not in [0, 1)."""
    from jaxfl.kernels import apply_server_update, make_server_optimizer

    params, delta = {"w": jnp.zeros(3)}, {"w": jnp.array([1.0, -2.0, 0.5])}
    values = {"learning_rate": 0.5, "momentum": 0.5, "b1": 0.5, "b2": 0.5, "tau": 0.1}

    def two_steps(value):
        optimizer = make_server_optimizer(name, **{key: values[key] for key in ("learning_rate", traced)
                                                   if key != traced}, **{traced: value})
        state, w = optimizer.init(params), params
        for _ in range(2):
            w, state = apply_server_update(optimizer, w, state, delta)
        return w["w"]

    swept = jax.vmap(two_steps)(jnp.array([values[traced], values[traced] / 2]))
    np.testing.assert_allclose(swept[0], two_steps(values[traced]), rtol=1e-6)  # as the concrete value gives
    assert not np.allclose(swept[0], swept[1])



@pytest.mark.parametrize("b, message", [
    ({"a": jnp.ones(2)}, r"tree_vdot: the trees have 2 and 1 leaves"),
    ({"a": jnp.ones((3, 2)), "b": jnp.ones(3)}, r"tree_vdot: leaf \['a'\] has shape \(2, 3\) in a and \(3, 2\) in b"),
])
def test_tree_vdot_refuses_trees_that_do_not_match(b, message):
    """Mismatched trees gave a partial dot (2.0 here), mismatched shapes a dot of the flattened leaves."""
    from jaxfl.kernels import tree_vdot

    a = {"a": jnp.ones((2, 3)) if b["a"].ndim == 2 else jnp.ones(2), "b": jnp.ones(3)}
    with pytest.raises(ValueError, match=message):
        tree_vdot(a, b)
    assert float(tree_vdot(a, a)) == float(sum(leaf.size for leaf in jax.tree.leaves(a)))


def test_tree_vdot_refuses_leaves_paired_by_position_under_other_names():
    """Trees of as many leaves of the same shapes under other keys were paired by position: ⟨{"w": x,
    "b": y}, {"bias": y, "w": x}⟩ paired b with w (flattened in key order) without a word."""
    from flax.core import FrozenDict

    from jaxfl.kernels import tree_vdot

    a = {"b": jnp.array([1.0, 2.0]), "w": jnp.array([3.0, 4.0])}
    renamed = {"bias": jnp.array([1.0, 2.0]), "w": jnp.array([3.0, 4.0])}
    with pytest.raises(ValueError, match=r"leaf \['b'\] of a meets leaf \['bias'\] of b"):
        tree_vdot(a, renamed)
    assert float(tree_vdot(a, FrozenDict(a))) == 30.0  # another container of the same keys pairs as it should
    import collections

    Pair = collections.namedtuple("Pair", "b w")  # trees that name leaves otherwise pair in order, as before
    assert float(tree_vdot(Pair(a["b"], a["w"]), (a["b"], a["w"]))) == 30.0


def test_make_client_trainer_refuses_a_fractional_batch_size():
    """batch_size=4.5 built a kernel drawing 5-sample batches of float positions."""
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1, got 4.5"):
        make_client_trainer(_apply, optax.sgd(0.1), 4.5)


def test_fednova_coefficients_refuse_mismatched_shapes():
    """Steps of shape (K, 1) with coefficients (K,) broadcast to a (K, K) result instead of an error."""
    from jaxfl.kernels import fednova_coefficients

    with pytest.raises(ValueError, match=r"steps has shape \(2, 1\) but coefficients \(2,\)"):
        fednova_coefficients(jnp.array([0.5, 0.5]), jnp.array([[10], [40]]))
    with pytest.raises(ValueError, match=r"step_weights has shape \(3,\) but coefficients \(2,\)"):
        fednova_coefficients(jnp.array([0.5, 0.5]), jnp.array([10, 40]), jnp.ones(3))


def test_fedasmu_mix_takes_a_python_float():
    """mix(local, fresh, 0.25) raised AttributeError: 'float' object has no attribute 'astype'."""
    from jaxfl.kernels import fedasmu

    mixed = fedasmu.mix({"w": jnp.array([0.0, 4.0], jnp.bfloat16)}, {"w": jnp.array([2.0, 0.0], jnp.bfloat16)}, 0.25)
    assert mixed["w"].dtype == jnp.bfloat16 and mixed["w"].tolist() == [0.5, 3.0]


def test_local_train_called_eagerly_compiles_once():
    """Outside jit, every local_train call traced and compiled a new scan (its body is a fresh closure):
    ~1.5 s per call on a CPU, for a model of 24 parameters."""
    import io
    import logging

    trainer = make_client_trainer(lambda p, x: x @ p, optax.sgd(0.1), 4, preprocess=lambda x: x)
    data = FederatedArrays(jnp.ones((40, 8)), jnp.zeros(40, jnp.int32))
    view, params = ClientView(jnp.int32(0), jnp.int32(40)), jnp.zeros((8, 3))
    first, _ = local_train(trainer, params, data, view, 5, jax.random.key(0), max_steps=5)  # compiles here
    log, handler = io.StringIO(), None
    handler = logging.StreamHandler(log)
    logging.getLogger("jax").addHandler(handler)
    try:
        with jax.log_compiles(True):
            for seed in (0, 1, 2):
                delta, metrics = local_train(trainer, params, data, view, jnp.int32(5), jax.random.key(seed),
                                             max_steps=5)
    finally:
        logging.getLogger("jax").removeHandler(handler)
    assert "Compiling" not in log.getvalue(), log.getvalue()[:2000]
    assert int(metrics["steps"]) == 5
    jitted, _ = jax.jit(lambda p: local_train(trainer, p, data, view, 5, jax.random.key(0), max_steps=5))(params)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(jitted))


def test_local_train_returns_the_final_buffers_of_an_adapter_model():
    """With a ModelAdapter model (BatchNorm), local_train computed the client's final running statistics
    and dropped them: (delta, metrics) held a zero delta for "state" and no buffers, so a hand-written
    FedAvg (notebook 04) could never update them."""
    import flax.linen as nn

    from jaxfl.models import ModelAdapter

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            return nn.Dense(3)(nn.relu(nn.BatchNorm(use_running_average=not train)(nn.Dense(6)(x))))

    adapter = ModelAdapter.from_linen(Net())
    variables = adapter.init_variables(jax.random.key(0), jnp.zeros((1, 7)))
    trainer = make_client_trainer(adapter, optax.sgd(0.1), 4, preprocess=lambda x: x)
    data, view, key = _data(), ClientView(jnp.int32(2), jnp.int32(9)), jax.random.key(3)
    delta, metrics = local_train(trainer, variables, data, view, jnp.int32(3), key, max_steps=4)
    state = trainer.init(variables, jnp.int32(3), key)
    for _ in range(4):
        state = trainer.step(state, data, view)
    expected = state.params["state"]
    assert jax.tree.structure(metrics["buffers"]) == jax.tree.structure(expected)
    for got, want, initial in zip(jax.tree.leaves(metrics["buffers"]), jax.tree.leaves(expected),
                                  jax.tree.leaves(variables["state"])):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
        assert not np.allclose(np.asarray(got), np.asarray(initial))  # the statistics moved
    plain = make_client_trainer(_apply, optax.sgd(0.1), 4, preprocess=lambda x: x)
    assert "buffers" not in local_train(plain, _params(jnp.float32), data, view, 2, key, max_steps=2)[1]


def test_notebook_04_says_where_batchnorm_statistics_come_back():
    import json
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks",
                        "04_kernels_in_your_jax_code.ipynb")
    text = " ".join("".join(cell["source"]) for cell in json.load(open(path))["cells"]).replace("\n", " ")
    assert 'metrics["buffers"]' in text


def test_a_policy_summary_of_arrays_and_numpy_numbers_is_written_as_json_numbers(tmp_path, monkeypatch):
    """A plug-in policy's summary() holding a NumPy array was written as its elided text, "[0.6 0.33 ...]",
    and a jax or NumPy number as a string, without a word."""
    import json

    import jaxfl
    from jaxfl.algorithms.fedasync import FedAsync

    monkeypatch.setattr(FedAsync, "summary", lambda self: {"rates": np.linspace(0, 1, 2000), "last": jnp.float32(0.5),
                                                           "pair": (np.int64(2), 3)})
    result = jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedasync", clients=3, max_updates=2, timing_only=True,
                                                  progress=False, output_dir=str(tmp_path)))
    with open(f"{result.run_dir}/summary.json") as handle:
        policy = json.load(handle)["policy"]
    assert policy["rates"] == np.linspace(0, 1, 2000).tolist() and policy["last"] == 0.5 and policy["pair"] == [2, 3]


def test_previous_params_is_the_model_before_the_last_update_also_after_a_hooks_apply(tmp_path):
    """ctx.previous_params was set by the generic update alone: after a hook's apply (FedAT's, a plug-in's)
    it stayed the model of an older version, the initial one in a run of apply updates only."""
    import jaxfl

    config = jaxfl.RunConfig(algorithm="fedat", model="logreg", clients=4, local_steps=2, max_updates=1,
                             stop_at_target=False, progress=False, output_dir=str(tmp_path))
    one = jaxfl.run_experiment(config)
    two = jaxfl.run_experiment(dataclasses.replace(config, max_updates=2))
    for before, after in zip(jax.tree.leaves(two.engine.previous_params), jax.tree.leaves(one.params)):
        np.testing.assert_allclose(np.asarray(before), np.asarray(after), rtol=0, atol=1e-6)
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(two.engine.previous_params),
                                                        jax.tree.leaves(two.params)))
