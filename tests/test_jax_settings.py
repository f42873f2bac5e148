"""The jax settings a researcher's process may hold that change a run's numbers or cannot run it
(jaxfl.experiment.JAX_NUMERICS, jax_disable_jit)."""
import json
import os

import jax
import pytest

from jaxfl.config import ConfigError
from jaxfl.experiment import resume_experiment, run_experiment
from jaxfl.resume import ResumeError


def test_a_run_under_jax_enable_x64_is_named_and_recorded_apart_and_resumes_only_under_it(small_config):
    # x64 makes optax's Adam correct its bias in float64, so every update differs: the same config and seed
    # gave other numbers under the same name, a comparison reused the other mode's run, and a resume
    # across modes ended at parameters neither mode's uninterrupted run has
    plain = run_experiment(small_config)
    with jax.enable_x64(True):
        wide = run_experiment(small_config)
    assert plain.run_dir != wide.run_dir
    assert os.path.basename(plain.run_dir)[:-6] == os.path.basename(wide.run_dir)[:-6]  # the hash alone differs
    written = [json.load(open(os.path.join(run.run_dir, "config.json"))) for run in (plain, wide)]
    assert written[0]["jax"] == {} and written[1]["jax"] == {"jax_enable_x64": True}
    with jax.enable_x64(True), pytest.raises(ResumeError, match="made with jax's default settings and this "
                                                                "process has jax_enable_x64=True.*JAX_ENABLE_X64=false"):
        resume_experiment(plain.run_dir)
    with pytest.raises(ResumeError, match="made with jax_enable_x64=True .*JAX_ENABLE_X64=true in the environment"):
        resume_experiment(wide.run_dir)
    with pytest.raises(ResumeError, match="made with jax_enable_x64=True"):  # the same through run_experiment
        run_experiment(small_config, resume_dir=wide.run_dir)


def test_a_run_recorded_before_jaxfl_wrote_its_jax_settings_resumes_with_a_warning(small_config):
    # an older config.json does not say which settings the run was made with: not known, so not refused (a
    # run an older jaxfl made under x64 would be refused in the very process that made it)
    import dataclasses

    run = run_experiment(dataclasses.replace(small_config, checkpoint_every=1))
    path = os.path.join(run.run_dir, "config.json")
    written = json.load(open(path))
    assert written["jax"] == {}  # at jax's defaults, said
    del written["jax"]
    with open(path, "w") as handle:
        json.dump(written, handle)
    with jax.enable_x64(True), pytest.warns(UserWarning, match="does not say which jax settings it was made with"):
        resumed = resume_experiment(run.run_dir)
    assert resumed.summary["global_updates"] == 4


def test_jax_disable_jit_is_refused_before_the_run_folder_is_written(small_config):
    # jaxfl compiles its training ahead of time, which jax refuses without jit: the run failed deep in jax
    # after its data, its first evaluation and a folder without summary.json
    with jax.disable_jit(), pytest.raises(ConfigError, match="jax_disable_jit is on"):
        run_experiment(small_config)
    assert not os.path.exists(small_config.output_dir)


def test_jax_disable_jit_is_refused_before_a_sweep_or_comparison_writes_its_folder(small_config, tmp_path):
    # a sweep wrote sweep.json, results.csv, .lock and runs/ before its first cell was refused
    import dataclasses

    from jaxfl.comparison import compare
    from jaxfl.sweep import run_sweep

    sweep_dir = str(tmp_path / "sweep")
    with jax.disable_jit(), pytest.raises(ConfigError, match="sweep cell 0 .*jax_disable_jit is on"):
        run_sweep(dataclasses.replace(small_config, output_dir="runs"), {"seed": [0, 1]}, sweep_dir, progress=False)
    assert not os.path.exists(sweep_dir)
    configs = [dataclasses.replace(small_config, buffer_size=size) for size in (1, 2)]
    with jax.disable_jit(), pytest.raises(ConfigError, match="jax_disable_jit is on"):
        compare(configs)
    assert not os.path.exists(small_config.output_dir)


def test_the_built_in_adam_on_float16_parameters_is_refused_before_any_work(small_config):
    import dataclasses
    # Adam's eps=1e-8 is 0 in float16: a zero gradient stepped by 0/0 = NaN, and the run stopped at update 0
    # advising a lower client_lr; bfloat16 parameters (float32's exponent) train
    import flax.linen as nn
    import jax.numpy as jnp

    def mlp(param_dtype):
        class MLP(nn.Module):
            num_classes: int = 10

            @nn.compact
            def __call__(self, x):
                x = nn.relu(nn.Dense(16, param_dtype=param_dtype)(x.reshape((x.shape[0], -1))))
                return nn.Dense(self.num_classes, param_dtype=param_dtype)(x)
        return MLP

    small_config = dataclasses.replace(small_config, model="cnn")  # the default: a model object replaces it
    with pytest.raises(ConfigError, match=r"client_optimizer='adam' is not allowed with the model's float16 "
                                          r"parameters \(params\['Dense_0'\]\['bias'\] and 3 more\)"):
        run_experiment(small_config, model=mlp(jnp.float16))
    assert not os.path.exists(small_config.output_dir)
    result = run_experiment(small_config, model=mlp(jnp.bfloat16))
    assert result.summary["global_updates"] == 4
    assert {leaf.dtype for leaf in jax.tree.leaves(result.params["params"])} == {jnp.dtype(jnp.bfloat16)}


def test_a_runs_config_json_taken_as_a_config_file_says_it_was_made_under_other_jax_settings(small_config):
    # `jaxfl run --config RUN/config.json` runs any run's config again: an x64 run's ran without x64, under
    # another name and with other numbers, without a word
    import warnings

    from jaxfl.config import load_config_text

    with jax.enable_x64(True):
        wide = run_experiment(small_config)
    text = open(os.path.join(wide.run_dir, "config.json")).read()
    with pytest.warns(UserWarning, match="made with jax_enable_x64=True and this process has jax's default settings"):
        load_config_text(text, ".json")
    with jax.enable_x64(True), warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config_text(text, ".json")  # the same settings: nothing to say
