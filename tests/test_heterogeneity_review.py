"""Review of the client heterogeneity and fault models: bad settings are refused up front, naming the
value and what is allowed, instead of being silently ignored or failing later with a TypeError."""
import re

import numpy as np
import pytest

from jaxfl.scheduler.faults import FaultConfig
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig


@pytest.mark.parametrize("model, field, value", [
    ("exp", "legacy_seed", 1),          # would silently draw the run's own stream, not PLATO's
    ("normal", "ratio", 110.0),         # FedASMU's spread, read by uniform only
    ("homo", "cap", 60.0),              # PORT's Zipf cap, read by pareto/zipf only
    ("uniform", "reference_time", 20.0),
    ("exp", "normal_std_ratio", 0.5),
    ("zipf", "pareto_shape", 2.0),
    ("pareto", "zipf_s", 2.0),
])
def test_a_model_specific_setting_for_a_model_that_never_reads_it_is_refused(model, field, value):
    with pytest.raises(ValueError, match=rf"SpeedConfig\.{field}={value!r} is not allowed with model='{model}'"):
        SpeedConfig(model=model, **{field: value})


@pytest.mark.parametrize("model, field, value", [
    ("pareto", "legacy_seed", 1), ("zipf", "legacy_seed", 1), ("zipf", "cap", 60.0), ("pareto", "cap", 60.0),
    ("uniform", "ratio", 440.0), ("normal", "normal_std_ratio", 0.5), ("pareto", "reference_time", 20.0),
])
def test_the_model_that_reads_a_setting_accepts_it(model, field, value):
    assert getattr(SpeedConfig(model=model, **{field: value}), field) == value


def test_defaults_of_unread_settings_are_accepted_for_every_model():
    for model in ("homo", "normal", "exp", "pareto", "zipf", "uniform"):
        ClientSpeeds(SpeedConfig(model=model), 3, seed=0)


def test_a_bool_legacy_seed_is_refused():
    with pytest.raises(ValueError, match=r"legacy_seed=True"):
        SpeedConfig(model="pareto", legacy_seed=True)


@pytest.mark.parametrize("field, value", [("crash_prob", "0.1"), ("delay_prob", None), ("dropout_prob", True),
                                          ("delay_factor", "3"), ("dropout_mean", None), ("crash_prob", [0.1])])
def test_a_fault_setting_that_is_not_a_number_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=re.escape(f"{field}={value!r} is not allowed: a number")):
        FaultConfig(**{field: value})


def test_numpy_fault_settings_are_numbers():
    assert FaultConfig(crash_prob=np.float64(0.25), delay_factor=np.int64(3)).active


def test_a_speed_change_under_homogeneous_speeds_is_refused():
    """homo's time per step is the mean for every client, so a speed change draws the same time
    again: --speed-change-prob with --heterogeneity homo did nothing, silently."""
    from jaxfl.config import ConfigError, RunConfig, validate

    with pytest.raises(ConfigError, match=r"speed_change_prob=0\.1 is not allowed.*heterogeneity normal, exp"):
        validate(RunConfig(heterogeneity="homo", speed_change_prob=0.1))
    assert validate(RunConfig(heterogeneity="exp", speed_change_prob=0.1)).speed_change_prob == 0.1
