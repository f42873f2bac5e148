"""The worked example: a user's algorithm in one file outside the package (examples/age_norm_fedbuff.py)
registers, passes the conformance suite, runs from Python and from `jaxfl run --algorithm FILE:Class`,
and its device hook weighs updates as its docstring says."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl import algorithms
from jaxfl.cli import main
from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.experiment import run_experiment
from jaxfl.testing import check_algorithm

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "age_norm_fedbuff.py")
REFERENCE = f"{EXAMPLE}:AgeNormFedBuff"


@pytest.fixture(scope="module")
def example():
    cls = algorithms.get(REFERENCE)
    import sys

    return sys.modules[cls.__module__]


def test_registered_under_its_name_and_conforms(example, tmp_path):
    assert algorithms.get("age_norm_fedbuff") is example.AgeNormFedBuff
    report = check_algorithm(example.AgeNormFedBuff, output_dir=str(tmp_path))
    assert report["policy_module"] == "age_norm_fedbuff"
    assert report["compilations"]["update_norms"] <= 3  # buckets of 1, 2 and 4 updates at most


def test_norm_kernel_and_factors_by_hand(example):
    delta = {"a": jnp.array([3.0, 0.0]), "b": {"c": jnp.array([[4.0]])}}
    assert float(example.update_norm(delta)) == pytest.approx(5.0)
    stacked = jax.tree.map(lambda x: jnp.stack([x, 2 * x]), delta)
    np.testing.assert_allclose(jax.vmap(example.update_norm)(stacked), [5.0, 10.0], rtol=1e-6)
    # median of (1, 2, 6) is 2: only the long one shrinks, to 2/6; a factor 2 lets it be up to 4
    np.testing.assert_allclose(example.norm_factors(np.array([1.0, 2.0, 6.0]), 1.0), [1, 1, 1 / 3])
    np.testing.assert_allclose(example.norm_factors(np.array([1.0, 2.0, 6.0]), 2.0), [1, 1, 2 / 3])


def test_engine_applies_age_over_k_times_norm_factor(example, small_config):
    config = RunConfig(**{**small_config.to_dict(), "algorithm": REFERENCE, "buffer_size": 3, "max_updates": 1,
                          "clients": 4, "algorithm_options": {"clip_factor": 0.5}, "run_name": "weights"})
    result = run_experiment(config)
    weights = result.engine.last_weights
    assert len(weights) == 3
    metrics = {d: result.engine.client_metrics(d) for d in weights}
    norms = np.array([metrics[d]["update_norm"] for d in weights])
    limit = 0.5 * np.median(norms)
    for d, weight in weights.items():
        staleness = 0  # the first aggregation: every update is fresh
        expected = 0.9 * (staleness + 1) ** -0.5 / 3 * min(1.0, limit / metrics[d]["update_norm"])
        assert weight == pytest.approx(expected, rel=1e-6)
    assert any(metrics[d]["norm_factor"] < 1 for d in weights)  # clip factor 0.5: the longer half is shrunk


def test_without_clipping_it_is_its_baseline_fedbuff(example, small_config):
    # the example runs against fedbuff: what differs must be the clipping alone, not the weighting
    shared = {**small_config.to_dict(), "clients": 5, "buffer_size": 2, "max_updates": 4}
    unclipped = run_experiment(RunConfig(**{**shared, "algorithm": REFERENCE, "run_name": "unclipped",
                                            "algorithm_options": {"clip_factor": 1e9}}))
    fedbuff = run_experiment(RunConfig(**{**shared, "algorithm": "fedbuff", "run_name": "fedbuff"}))
    assert [row["accuracy"] for row in unclipped.metrics] == [row["accuracy"] for row in fedbuff.metrics]
    for ours, theirs in zip(jax.tree.leaves(unclipped.params), jax.tree.leaves(fedbuff.params)):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-6, atol=1e-7)


def test_runs_from_python_and_from_the_command_line(example, tmp_path, capsys):
    results = example.main(["--quick", "--output-dir", str(tmp_path / "python")])
    assert [r.summary["algorithm"] for r in results] == ["age_norm_fedbuff", "fedbuff"]
    assert os.path.isfile(tmp_path / "python" / "comparison.png")
    code = main(["run", "--algorithm", f"{REFERENCE},fedbuff", "--agenorm.clip-factor", "1.5", "--model", "mlp",
                 "--clients", "4", "--local-steps", "3", "--batch-size", "16", "--max-updates", "2", "--no-progress",
                 "--output-dir", str(tmp_path / "cli")])
    assert code == 0
    out = capsys.readouterr().out
    assert "age_norm_fedbuff" in out and os.path.isfile(tmp_path / "cli" / "comparison.png")
    with pytest.raises(ConfigError, match="agenorm.clip_factor=0.0"):
        validate(RunConfig(algorithm=REFERENCE, algorithm_options={"clip_factor": 0.0}))
