"""Learning smoke tests on real data (the embedded MNIST test set, split 8k/2k)."""
import pytest

from jaxfl.experiment import run_experiment
from tests.conftest import replace


@pytest.mark.slow
def test_fedavg_cnn_learns_mnist(small_config):
    # (5-step chunks: a 10-step one, as the 20 local steps pick, compiles in twice the time)
    result = run_experiment(replace(small_config, algorithm="fedavg", model="cnn", clients=4, local_steps=20,
                                    steps_per_call=5, batch_size=32, max_updates=3, target_accuracy=0.85))
    assert result.summary["best_accuracy"] >= 0.85  # chance is 0.1
    assert result.summary["time_to_target"] is not None


@pytest.mark.slow
def test_fedbuff_learns_under_dirichlet_skew(small_config):
    result = run_experiment(replace(small_config, algorithm="fedbuff", partition="dirichlet", dirichlet_alpha=0.5,
                                    clients=6, local_steps=20, buffer_size=3, max_updates=12, stop_at_target=False))
    assert result.summary["best_accuracy"] >= 0.7
