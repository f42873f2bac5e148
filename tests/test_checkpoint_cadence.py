"""The checkpoint cadence: every ``checkpoint_every`` global updates, at least
``checkpoint_min_interval_s`` wall seconds apart — unset, 60 s at the default cadence of 25 (a save
costs 0.05-1 s, a tenth of a run of cheap updates) and 0 at a cadence the user chose. The wall-time
spacing changes no result and no run name, and a resume may set it afresh."""
import os

import pytest

from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.experiment import config_hash, resume_experiment, run_experiment
from jaxfl.resume import ResumeError
from conftest import Interrupted, replace


@pytest.fixture
def cheap(small_config):
    """50 cheap updates (one local step each): seconds in all, far under the default 60 s spacing."""
    return replace(small_config, local_steps=1, max_updates=50, eval_every=50, stop_at_target=False)


def _checkpoints(result) -> list[str]:
    return sorted(n for n in os.listdir(os.path.join(result.run_dir, "checkpoints")) if n.startswith("ckpt-"))


def test_the_default_cadence_is_kept_a_minute_apart_and_a_chosen_one_exactly(cheap):
    default = run_experiment(replace(cheap, run_name="default"))
    assert default.summary["checkpoints_written"] == 1 and _checkpoints(default) == ["ckpt-000050"]  # the end only
    exact = run_experiment(replace(cheap, checkpoint_min_interval_s=0, run_name="exact"))
    assert exact.summary["checkpoints_written"] == 3  # at 25 and 50, and the end
    chosen = run_experiment(replace(cheap, checkpoint_every=10, run_name="chosen"))
    assert chosen.summary["checkpoints_written"] == 6  # every 10 updates exactly, and the end
    spaced = run_experiment(replace(cheap, checkpoint_every=1, checkpoint_min_interval_s=3600, run_name="spaced"))
    assert spaced.summary["checkpoints_written"] == 1
    # the same run, whatever the spacing
    assert {run.summary["final_accuracy"] for run in (default, exact, chosen, spaced)} == {default.summary["final_accuracy"]}


def test_the_spacing_changes_no_run_name_and_bad_values_are_refused():
    assert config_hash(validate(RunConfig())) == config_hash(validate(RunConfig(checkpoint_min_interval_s=0))) == \
        config_hash(validate(RunConfig(checkpoint_min_interval_s=600.0)))
    assert config_hash(validate(RunConfig(checkpoint_every=5))) != config_hash(validate(RunConfig()))
    with pytest.raises(ConfigError, match=r"checkpoint_min_interval_s=-1\.0 is not allowed: wall seconds >= 0"):
        validate(RunConfig(checkpoint_min_interval_s=-1.0))
    for bad in (float("nan"), "1 minute"):
        with pytest.raises(ConfigError, match=r"checkpoint_min_interval_s=.* is not allowed"):
            validate(RunConfig(checkpoint_min_interval_s=bad))


def test_a_resume_may_set_the_spacing_afresh(cheap, crash_after_saves):
    config = replace(cheap, checkpoint_every=10)
    disarm = crash_after_saves(2)  # after the checkpoint of update 20
    with pytest.raises(Interrupted):
        run_experiment(replace(config, run_name="cut"))
    disarm()
    run_dir = os.path.join(config.output_dir, "cut")
    with pytest.raises(ResumeError, match="clients=6"):  # what changes the run is still refused
        resume_experiment(run_dir, overrides={"checkpoint_min_interval_s": 3600, "clients": 6})
    resumed = resume_experiment(run_dir, overrides={"checkpoint_min_interval_s": 3600})
    assert resumed.summary["checkpoints_written"] == 1  # the end only, not at 30, 40 and 50
    whole = run_experiment(replace(config, run_name="whole"))
    assert resumed.summary["final_accuracy"] == whole.summary["final_accuracy"]
