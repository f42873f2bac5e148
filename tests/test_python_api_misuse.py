"""Plausible mistakes with jaxfl's Python API in a notebook, each refused in one line naming the value and
what is allowed, before any work (from a review of the public API's misuse, 2026-12-07)."""
import json
import os

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxfl
from jaxfl.config import ConfigError

TINY = dict(algorithm="fedavg", model="logreg", clients=3, local_steps=2, batch_size=8, max_updates=1,
            stop_at_target=False, progress=False)


def test_objects_given_in_the_config_instead_of_beside_it_say_where_they_go(tmp_path):
    """An optax object in RunConfig raised a TypeError from rebuilding it as a plain tuple; a model object
    (or None) an AttributeError ('Dense' object has no attribute 'startswith')."""
    import flax.linen as nn

    config = jaxfl.RunConfig(**{**TINY, "client_optimizer": optax.adam(1e-3)}, output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"client_optimizer=.* is not allowed: expected a string naming one; an optax "
                                          r"object goes to run_experiment\(config, client_optimizer=\.\.\.\)$"):
        jaxfl.run_experiment(config)
    with pytest.raises(ConfigError, match=r"is not allowed: expected a string naming one; a model object goes to "
                                          r"run_experiment\(config, model=\.\.\.\)$"):
        jaxfl.run_experiment(jaxfl.RunConfig(**{**TINY, "model": nn.Dense(10)}, output_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match=r"model=None is not allowed: a value is required"):
        jaxfl.run_experiment(jaxfl.RunConfig(**{**TINY, "model": None}, output_dir=str(tmp_path)))
    assert os.listdir(tmp_path) == []


def test_compare_takes_a_list_of_run_configs(tmp_path):
    from jaxfl.comparison import compare

    with pytest.raises(TypeError, match=r"configs\[0\]='fedavg' is not allowed: compare takes a list of RunConfig"):
        compare(["fedavg", "fedbuff"])
    with pytest.raises(TypeError, match=r"configs=RunConfig\(\.\.\.\) is one config: compare takes a list of them"):
        compare(jaxfl.RunConfig(**TINY, output_dir=str(tmp_path)))
    assert os.listdir(tmp_path) == []


def test_another_algorithm_s_options_are_refused_not_recorded_as_applied(tmp_path):
    """FedBuff has no options class of its own (the base class, of which PORT's is a subclass): PortConfig
    given to it ran FedBuff, and config.json recorded PORT's options as if they applied."""
    config = jaxfl.RunConfig(**{**TINY, "algorithm": "fedbuff"}, output_dir=str(tmp_path),
                             algorithm_options=jaxfl.algorithms.PortConfig(staleness_bound=3.0))
    with pytest.raises(ConfigError, match=r"algorithm_options=PortConfig\(.*\) is not allowed: none: fedbuff has no "
                                          r"options of its own \(PortConfig is another algorithm's\); leave it unset$"):
        jaxfl.run_experiment(config)
    assert os.listdir(tmp_path) == []


def test_numpy_numbers_in_a_sweep_grid_are_recorded_as_numbers(tmp_path):
    """list(np.arange(1, 3)) as a grid axis: sweep.json recorded its values as the strings '"1"', '"2"'."""
    from jaxfl.sweep import run_sweep

    base = {key: value for key, value in TINY.items() if key not in ("progress",)}
    run_sweep(base, {"local_steps": list(np.arange(1, 3))}, str(tmp_path), progress=False)
    with open(tmp_path / "sweep.json") as handle:
        written = json.load(handle)
    assert written["grid"]["local_steps"] == [1, 2]
    assert [cell["values"]["local_steps"] for cell in written["cells"]] == [1, 2]


def test_tree_scale_takes_one_number_for_every_leaf():
    """A vector scale broadcast against each leaf's last axis: one per client scaled the columns."""
    from jaxfl.kernels import tree_scale

    with pytest.raises(ValueError, match=r"scale of shape \(3,\) is not allowed: one number for every leaf"):
        tree_scale({"w": jnp.ones((3, 3))}, jnp.array([1.0, 2.0, 3.0]))
    assert float(tree_scale({"w": jnp.ones((2,))}, jnp.float32(2.0))["w"][0]) == 2.0


def test_a_run_that_fails_before_its_first_event_leaves_no_folder(tmp_path):
    """A metrics function that passed the check but failed at the first evaluation left a run folder of a
    config.json, a .lock and header-only logs, no checkpoint and no summary (partial output)."""
    def metrics(logits, labels):  # fine at the check's small batch, broken at the evaluation's
        if logits.shape[0] > 8:
            raise RuntimeError("broken at the evaluation's batch")
        return {"mean_logit": jnp.mean(logits, axis=1)}

    with pytest.raises(RuntimeError, match="broken at the evaluation's batch"):
        jaxfl.run_experiment(jaxfl.RunConfig(**TINY, output_dir=str(tmp_path)), metrics=metrics)
    assert os.listdir(tmp_path) == []
