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
    assert "jax" not in written[0] and written[1]["jax"] == {"jax_enable_x64": True}
    with jax.enable_x64(True), pytest.raises(ResumeError, match="made with jax's default settings and this "
                                                                "process has jax_enable_x64=True.*JAX_ENABLE_X64=false"):
        resume_experiment(plain.run_dir)
    with pytest.raises(ResumeError, match="made with jax_enable_x64=True .*JAX_ENABLE_X64=true in the environment"):
        resume_experiment(wide.run_dir)


def test_jax_disable_jit_is_refused_before_the_run_folder_is_written(small_config):
    # jaxfl compiles its training ahead of time, which jax refuses without jit: the run failed deep in jax
    # after its data, its first evaluation and a folder without summary.json
    with jax.disable_jit(), pytest.raises(ConfigError, match="jax_disable_jit is on"):
        run_experiment(small_config)
    assert not os.path.exists(small_config.output_dir)
