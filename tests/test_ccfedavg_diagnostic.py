"""CC-FedAvg's estimate diagnostic (Zhang et al., IEEE IoT Journal 2024, Fig. 2): the estimating
clients' true updates are trained on the side and compared with their estimates, per round, without
changing the run; the comparison kernel by hand; the log survives an interrupted and resumed run."""
import csv
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.experiment import run_experiment
from jaxfl.kernels.ccfedavg import estimation_error
from jaxfl.testing import check_algorithm, events_without_wall_time
from tests.conftest import replace


def read_estimates(run_dir):
    with open(os.path.join(run_dir, "ccfedavg_estimates.csv"), newline="") as handle:
        return list(csv.DictReader(handle))


def test_estimation_error_by_hand():
    """Rows of Δ = (3, 4), ‖Δ‖ = 5: Δ̂ = Δ → error 0, cosine 1; Δ̂ = 2Δ → ‖Δ‖/‖Δ‖ = 1, cosine 1;
    Δ̂ = −Δ → 2, cosine −1; Δ̂ = (−4, 3) ⟂ Δ → ‖(−7, −1)‖/5 = √50/5 = √2, cosine 0; Δ = 0 → NaN."""
    truth = {"a": jnp.array([[3.0], [3.0], [3.0], [3.0], [0.0]]), "b": jnp.array([[4.0], [4.0], [4.0], [4.0], [0.0]])}
    estimate = {"a": jnp.array([[3.0], [6.0], [-3.0], [-4.0], [1.0]]),
                "b": jnp.array([[4.0], [8.0], [-4.0], [3.0], [1.0]])}
    out = jax.device_get(estimation_error(estimate, truth))
    np.testing.assert_allclose(out["relative_error"][:4], [0.0, 1.0, 2.0, np.sqrt(2.0)], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out["cosine"][:4], [1.0, 1.0, -1.0, 0.0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out["true_norm"], [5, 5, 5, 5, 0], rtol=1e-6)
    assert np.isnan(out["relative_error"][4]) and np.isnan(out["cosine"][4])


def frozen(small_config, **changes):
    """CC-FedAvg, round robin with budgets 1, 1/2, 1/4, 1/8 (periods 1, 2, 4, 8), on a logistic regression
    whose global model a negligible server rate keeps at x_0."""
    return replace(small_config, algorithm="ccfedavg", model="logreg", local_steps=2, client_optimizer="sgd",
                   client_lr=0.1, server_lr=1e-30, **changes)


def test_diagnostic_leaves_the_run_unchanged_and_trains_what_the_client_would(small_config):
    # a per-dispatch learning-rate decay: the side training must use the scale the client's next dispatch gets
    config = frozen(small_config, max_updates=4, client_lr_decay=0.5)
    plain = run_experiment(replace(config, run_name="plain", algorithm_options={"schedule": "round_robin"}))
    diagnosed = run_experiment(replace(config, run_name="diagnosed",
                                       algorithm_options={"schedule": "round_robin", "diagnostic": True}))
    for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(diagnosed.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))  # the same trajectory, bit for bit
    assert events_without_wall_time(plain.run_dir) == events_without_wall_time(diagnosed.run_dir)
    assert diagnosed.summary["client_steps_executed"] == plain.summary["client_steps_executed"]  # not the run's work
    assert not os.path.exists(os.path.join(plain.run_dir, "ccfedavg_estimates.csv"))
    rows = read_estimates(diagnosed.run_dir)
    # one row per round and skipping client: round t (version t + 1) skips the selected clients not trained
    expected = [(t + 1, c) for t, selected, trained in diagnosed.simulation.policy.history[:4]
                for c in selected if c not in trained]
    assert [(int(r["version"]), int(r["client"])) for r in rows] == expected == \
        [(2, 1), (2, 2), (2, 3), (3, 2), (3, 3), (4, 1), (4, 2), (4, 3)]
    assert len(rows) == diagnosed.summary["policy"]["banked_updates"]
    assert {r["estimate"] for r in rows} == {"delta"}
    by = {(int(r["version"]), int(r["client"])): r for r in rows}
    # different minibatches (client rounds 0 and 1): the estimate is close, not exact
    assert all(float(r["relative_error"]) > 1e-3 and 0 < float(r["cosine"]) < 1 for r in rows)
    # Client 1's true update in round 1 (its client round 1, from x_1 = x_0) is the update it really
    # computes when it next trains (round 2, client round 1, from x_2 = x_0), which is its estimate D_1 in round 3.
    assert float(by[2, 1]["client_round"]) == 1 and float(by[4, 1]["client_round"]) == 2
    assert float(by[2, 1]["true_norm"]) == pytest.approx(float(by[4, 1]["estimate_norm"]), rel=1e-5)


def test_estimate_equals_the_truth_when_the_model_is_frozen_and_batches_are_full(small_config):
    """With full-batch local steps a client's update depends only on its start model, so the banked D_i
    (trained from x_0 in round 0) equals the update it would compute from x_1 = x_0 in round 1: error 0
    and cosine 1 (up to float32 sums in another order)."""
    config = frozen(small_config, max_updates=2, batch_size=2048, run_name="full-batch",
                    algorithm_options={"schedule": "round_robin", "diagnostic": True})
    rows = read_estimates(run_experiment(config).run_dir)
    assert [int(r["client"]) for r in rows] == [1, 2, 3]  # only client 0 trains in round 1
    for row in rows:
        assert float(row["relative_error"]) == pytest.approx(0.0, abs=1e-4)
        assert float(row["cosine"]) == pytest.approx(1.0, abs=1e-6)
        assert float(row["true_norm"]) > 0


def test_strategy2_diagnosed_and_resume_keeps_the_log(tmp_path):
    report = check_algorithm("ccfedavg", checks=("resume",), output_dir=str(tmp_path), model="logreg", max_updates=4,
                             local_steps=2, algorithm_options={"strategy": "strategy2", "schedule": "round_robin",
                                                              "diagnostic": True})
    full = read_estimates(report["run_dir"])
    assert full and {r["estimate"] for r in full} == {"model"}
    assert read_estimates(str(tmp_path / "interrupted")) == full


def test_diagnostic_refused_where_nothing_is_estimated():
    with pytest.raises(ConfigError, match="cc.diagnostic=True.*strategy 'strategy1'"):
        validate(RunConfig(algorithm="ccfedavg", algorithm_options={"strategy": "strategy1", "diagnostic": True}))
    with pytest.raises(ConfigError, match="cc.diagnostic=True.*timing-only"):
        validate(RunConfig(algorithm="ccfedavg", timing_only=True, max_updates=2,
                           algorithm_options={"diagnostic": True}))
