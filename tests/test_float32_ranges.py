"""Settings that reach the device as float32 are refused, naming the value and the range, before any work
when float32 cannot hold what they compute (a review of extreme but accepted values: each started a run,
wrote its folder and stopped after work with a message blaming the learning rate, or, for PORT's α and
β near 1e38, ran to the end with a model that never moved); and FedNova's momentum normaliser near ρ = 1."""
import math

import numpy as np
import pytest

from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.kernels.fednova import fednova_normalizer


@pytest.mark.parametrize("options, message", [
    ({"alpha": 1e38}, r"port.alpha=1e\+38 is not allowed: a weight that makes α \+ β \(here 1e\+38 \+ 1\) from "
                      r"1e-30 to 2e\+37: the weights are normalised in float32.*only α:β matters"),
    ({"beta": 1e300}, r"port.beta=1e\+300 is not allowed: a weight that makes α \+ β"),
    ({"alpha": 1e-40, "beta": 0.0}, r"port.alpha=1e-40 is not allowed"),
])
def test_port_weights_that_float32_cannot_normalise_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        validate(RunConfig(algorithm="port", clients=4, algorithm_options=options))
    # the ends of the range run (2e37 in all: the sum's reciprocal is still a normal float32), and a tiny α
    # beside a normal β (the sum decides)
    validate(RunConfig(algorithm="port", clients=4, algorithm_options={"alpha": 1e37, "beta": 1e37}))
    validate(RunConfig(algorithm="port", clients=4, algorithm_options={"alpha": 1e-30, "beta": 0.0}))
    validate(RunConfig(algorithm="port", clients=4, algorithm_options={"alpha": 1e-31, "beta": 1.0}))


def test_port_weights_at_the_ends_of_the_range_are_the_normalised_ones():
    import jax.numpy as jnp

    from jaxfl.kernels.port import port_weights

    never = jnp.array([False, False])
    # raw a + b·(cos + 1)/2 = 1e37 and 2e37 (they came out 0 near 1e38)
    assert port_weights(jnp.zeros(2), jnp.array([0.5e37, 1.5e37]), jnp.array([1e37, 1e37]), never).tolist() == \
        pytest.approx([1 / 3, 2 / 3])
    assert port_weights(jnp.zeros(2), jnp.array([1e-36, 3e-36]), jnp.zeros(2), never).tolist() == \
        pytest.approx([0.25, 0.75])


@pytest.mark.parametrize("settings, message", [
    ({"algorithm": "fedbuff", "staleness_alpha": 1e300}, r"staleness_alpha=1e\+300 is not allowed: at most 3.403e\+38"),
    ({"client_optimizer": "sgd", "client_weight_decay": 1e39}, r"client_weight_decay=1e\+39 is not allowed: at most "),
    ({"normalize": True, "normalize_mean": 0.0, "normalize_std": 1e-45},
     r"normalize_std=1e-45 is not allowed: standard deviations from 1.175e-38 to 3.403e\+38"),
    ({"normalize": True, "normalize_mean": (0.0, 1e39), "normalize_std": 1.0},
     r"normalize_mean=\(0.0, 1e\+39\) is not allowed: finite means of at most 3.403e\+38"),
    ({"client_optimizer": "sgd", "client_momentum": 0.999999999},
     r"client_momentum=0.999999999 is not allowed: a number in \[0, 1\) below 1 - 2\*\*-25 = 0.9999999701976776, "
     r"from which float32 rounds to 1"),
    ({"algorithm": "fedasmu", "algorithm_options": {"lambda0": 1e39}}, r"fedasmu.lambda0=1e\+39 is not allowed: at "
                                                                       r"most 3.403e\+38 in size"),
    ({"algorithm": "fedasmu", "algorithm_options": {"sigma0": -1e39}}, r"fedasmu.sigma0=-1e\+39 is not allowed"),
    ({"algorithm": "fedasmu", "algorithm_options": {"mu_alpha": 1e300}}, r"fedasmu.mu_alpha=1e\+300 is not allowed"),
])
def test_values_float32_cannot_hold_are_refused_by_name(settings, message):
    with pytest.raises(ConfigError, match=message):
        validate(RunConfig(**{"clients": 4, **settings}))


def test_the_largest_momentum_float32_holds_below_1_is_taken():
    validate(RunConfig(clients=4, client_optimizer="sgd", client_momentum=float(np.float32(1 - 2 ** -24))))
    validate(RunConfig(clients=4, client_optimizer="sgd", client_momentum=0.99999997))  # rounds down to it


@pytest.mark.parametrize("rho", [1 - 1e-9, 0.99999994, 1 - 1e-6, 0.9999, 0.999, 0.9, 0.5])
def test_fednova_momentum_normaliser_near_rho_one_is_the_series_sum(rho):
    # Σ_{k=1}^{τ} (1 + ρ + … + ρ^(k−1)), summed exactly with fractions-free float64 loops for small τ;
    # the closed form gave 3 for τ = 3 at ρ = 1 − 1e-9 (the sum is 6 − 1e-8)
    taus = [1, 2, 3, 10, 50, 400]
    brute = [math.fsum(math.fsum(rho ** i for i in range(k)) for k in range(1, tau + 1)) for tau in taus]
    assert fednova_normalizer(taus, momentum=rho).tolist() == pytest.approx(brute, rel=1e-11)
