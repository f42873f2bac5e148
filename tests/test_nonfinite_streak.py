"""on_nonfinite="skip" stops a run whose every update diverges, instead of retraining the failure
until its budget (a review found an all-NaN run going on for 10 minutes to its max_time)."""
import math
import pickle

from conftest import replace

from jaxfl import RunConfig, run_experiment
from jaxfl.scheduler.simulation import Simulation, nonfinite_streak_limit
from test_faults import _poisoned_client_zero


def test_a_run_whose_every_update_is_non_finite_stops_as_diverged(small_config):
    config = replace(small_config, algorithm="fedasync", client_optimizer="sgd", client_lr=1e30,
                     max_time=math.inf, max_updates=50, stop_at_target=False, on_nonfinite="skip")
    result = run_experiment(config)
    summary = result.summary
    limit = nonfinite_streak_limit(config.clients)
    assert summary["stop_reason"].startswith(f"diverged: the last {limit} updates were all non-finite")
    assert "lower client_lr" in summary["stop_reason"]
    assert summary["accounting"]["dropped_by_reason"]["non-finite update"] == limit
    assert summary["accounting"]["aggregated"] == 0


def test_one_clients_bad_data_does_not_stop_the_run(tmp_path):
    # Client 0's updates always overflow; the other three's are finite and reset the streak.
    config = RunConfig(algorithm="fedasync", model="mlp", num_classes=3, clients=4, partition="natural",
                       local_steps=2, batch_size=8, max_updates=150, target_accuracy=0.99, on_nonfinite="skip",
                       progress=False, output_dir=str(tmp_path / "runs"))
    result = run_experiment(config, data=_poisoned_client_zero())
    assert result.summary["stop_reason"] == "update budget"
    assert result.summary["accounting"]["dropped_by_reason"]["non-finite update"] >= 20
    assert result.simulation.nonfinite_streak <= 1


def test_the_streak_is_kept_in_checkpoints_and_old_ones_start_at_zero(small_config):
    sim = run_experiment(replace(small_config, max_updates=2)).simulation
    sim.nonfinite_streak = 7
    state = sim.__getstate__()
    restored = Simulation.__new__(Simulation)
    restored.__setstate__(pickle.loads(pickle.dumps(state)))
    assert restored.nonfinite_streak == 7
    del state["nonfinite_streak"]  # a checkpoint from before the streak existed
    older = Simulation.__new__(Simulation)
    older.__setstate__(pickle.loads(pickle.dumps(state)))
    assert older.nonfinite_streak == 0
