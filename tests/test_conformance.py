"""Every registered algorithm passes the conformance suite (jaxfl.testing.check_algorithm):
batched = one-at-a-time, interrupt + resume identical, one compilation per bucket, the accounting
invariant, the config through TOML, and a policy module that imports without jax. Hand-computed
goldens stay in the per-algorithm test files."""
import pytest

from jaxfl.algorithms import names
from jaxfl.testing import CHECKS, check_algorithm

# Algorithms that need more than the suite's default 4 clients to do anything in 5 updates.
OVERRIDES = {"fedat": {"clients": 6}, "port": {"clients": 6, "algorithm_options": {"min_clients": 2}},
             "ccfedavg": {"clients": 6}, "fedasmu": {"clients": 6, "algorithm_options": {"max_concurrency": 3}}}


@pytest.mark.parametrize("algorithm", names())
def test_registered_algorithm_conforms(tmp_path, algorithm):
    report = check_algorithm(algorithm, output_dir=str(tmp_path), **OVERRIDES.get(algorithm, {}))
    assert report["global_updates"] == 5
    assert report["policy_module"].startswith("jaxfl.algorithms.")
    if algorithm in ("fedavg", "fedavgm", "fedasync", "fedbuff"):  # the batched engine really vmapped clients
        assert report["mean_clients_per_batch"] > 1.5


def test_unknown_check_is_refused():
    with pytest.raises(ValueError, match="unknown checks.*allowed: " + ", ".join(CHECKS)):
        check_algorithm("fedavg", checks=("speed",))
