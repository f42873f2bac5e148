"""``jaxfl.checkpoint.final_params``: takes the run's variables (``RunResult.params``) or their
``"params"`` part (what ``init_params=`` takes) as its template and returns that layout; refuses any
other in one line naming the expected structure; and warns when the checkpoint it reads is not the
run's end (``final_checkpoint=False``, an interrupted run), instead of silently returning an older model."""
import json
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax.core import freeze

import jaxfl
from jaxfl.checkpoint import final_params
from jaxfl.config import DataConfig
from jaxfl.experiment import resume_experiment

from conftest import Interrupted


def tiny(tmp_path, name, **changes):
    return jaxfl.RunConfig(**{**dict(algorithm="fedavg", model="logreg", clients=3, local_steps=2, max_updates=3,
                                     eval_interval=None, progress=False, output_dir=str(tmp_path),
                                     run_name=name), **changes})


def same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def differs(a, b) -> bool:
    return any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def loaded_quietly(run_dir, template):
    """final_params's result, checking that it warned nothing about the run."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        params = final_params(run_dir, template)
    assert not [w for w in caught if str(run_dir) in str(w.message)], [str(w.message) for w in caught]
    return params


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return jaxfl.run_experiment(tiny(tmp_path_factory.mktemp("runs"), "finished"))


def test_the_full_variables_and_their_params_part_both_load_in_their_own_layout(finished):
    assert finished.summary["global_updates"] == 3
    full = loaded_quietly(finished.run_dir, finished.params)
    same(full, finished.params)
    inner = loaded_quietly(finished.run_dir, finished.params["params"])  # was a raw pytree-structure error
    same(inner, finished.params["params"])
    # a template built before any training: shapes and dtypes alone
    abstract = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), finished.params["params"])
    same(loaded_quietly(finished.run_dir, abstract), finished.params["params"])
    # a FrozenDict comes back as a FrozenDict (its node type differs from the restored plain dicts)
    frozen = loaded_quietly(finished.run_dir, freeze(finished.params["params"]))
    assert type(frozen) is type(freeze({}))
    same(frozen, freeze(finished.params["params"]))


def test_a_template_of_another_structure_is_refused_naming_the_expected_one(finished):
    with pytest.raises(ValueError) as refused:
        final_params(finished.run_dir, {"w": jnp.zeros(3)})
    message = str(refused.value)
    assert "\n" not in message and "ckpt-000003" in message
    assert "expected the run's variables (RunResult.params: keys ['params'], 2 arrays)" in message
    assert "or their 'params' part (as init_params= takes: keys ['Dense_0'], 2 arrays)" in message
    assert message.endswith("the template has keys ['w'], 1 arrays")


def test_a_template_of_another_shape_is_refused_naming_the_leaf(finished):
    wrong = jax.tree.map(lambda leaf: jnp.zeros(leaf.shape[:-1] + (leaf.shape[-1] + 1,)), finished.params["params"])
    with pytest.raises(ValueError) as refused:
        final_params(finished.run_dir, wrong)
    message = str(refused.value)
    assert "\n" not in message and "template['Dense_0']['bias'] has shape (11,)" in message
    assert "has (10,) there" in message


def test_an_empty_template_or_a_missing_run_is_refused_before_reading(finished, tmp_path):
    with pytest.raises(ValueError, match=r"template=\{\} holds no arrays"):
        final_params(finished.run_dir, {})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        final_params(str(tmp_path / "nowhere"), finished.params)


def test_without_the_final_checkpoint_it_warns_that_the_model_is_older(tmp_path):
    result = jaxfl.run_experiment(tiny(tmp_path, "no-final", final_checkpoint=False, checkpoint_every=2))
    assert sorted(os.listdir(os.path.join(result.run_dir, "checkpoints"))) == ["ckpt-000002", "latest"]
    with pytest.warns(UserWarning) as caught:
        params = final_params(result.run_dir, result.params["params"])
    message = str(caught[0].message)
    assert caught[0].filename == __file__  # points at the caller
    assert "ckpt-000002 holds the model after update 2, but the run ended at update 3" in message
    assert "final_checkpoint=False" in message and "not its final model" in message
    assert differs(params, result.params["params"])  # it really is the older model the warning names


def test_a_run_without_any_checkpoint_says_why(tmp_path):
    result = jaxfl.run_experiment(tiny(tmp_path, "none", final_checkpoint=False, max_updates=1))
    with pytest.raises(FileNotFoundError,
                       match=r"has no checkpoint \(none is kept with checkpoint_every=None and final_checkpoint off"):
        final_params(result.run_dir, result.params)


def test_an_interrupted_run_warns_it_has_not_finished_until_resumed(tmp_path, crash_after_saves):
    config = tiny(tmp_path, "cut", checkpoint_every=1)
    disarm = crash_after_saves(2)
    with pytest.raises(Interrupted):
        jaxfl.run_experiment(config)
    disarm()
    run_dir = str(tmp_path / "cut")
    assert not os.path.exists(os.path.join(run_dir, "summary.json"))
    template = jaxfl.run_experiment(tiny(tmp_path, "shape", max_updates=1)).params
    with pytest.warns(UserWarning, match="has no summary.json: the run has not finished .*newest checkpoint "
                                         "ckpt-000002 holds the model after update 2, not a final one"):
        cut = final_params(run_dir, template)
    resumed = resume_experiment(run_dir, progress=False)
    assert json.load(open(os.path.join(run_dir, "summary.json")))["global_updates"] == 3
    end = loaded_quietly(run_dir, template)
    same(end, resumed.params)
    assert differs(cut, end)


class DenseBN(nn.Module):
    """Dense → BatchNorm → Dense: a model whose variables hold running statistics ("state")."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dense(8)(x.reshape((x.shape[0], -1)))
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        return nn.Dense(10)(nn.relu(x))


def test_a_model_with_running_statistics_loads_in_both_layouts(tmp_path):
    # config.model left at its default: the given module is the model
    result = jaxfl.run_experiment(tiny(tmp_path, "bn", model=DataConfig.model), model=DenseBN())
    assert sorted(result.params) == ["params", "state"]
    same(loaded_quietly(result.run_dir, result.params), result.params)  # the statistics come back too
    same(loaded_quietly(result.run_dir, result.params["params"]), result.params["params"])
