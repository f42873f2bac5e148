"""FedAdagrad, FedAdam and FedYogi as Reddi et al., ICLR 2021, Algorithm 2: three server steps on a
tiny pytree computed by hand, the optax versions kept apart, and the config fields that set them.

The engine hands the server optimiser g = −Δ (the aggregated update's negative), so the tests feed
g and check x_{t+1} = x_t + η m_t/(√v_t + τ) with m, v written in terms of Δ as in the paper.
Hand settings: η = 2, β1 = 0.5, β2 = 0.75, τ = 1 (v_{−1} = τ² = 1). Leaf "w" sees Δ = (2, −1),
(0, −1), (−4, −1) in the three rounds; leaf "b" (a scalar) sees Δ = −1 each round.
"""
from math import sqrt

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.kernels.aggregation import SERVER_OPTIMIZER_READS, apply_server_update, make_server_optimizer
from jaxfl.kernels.fedopt import FedOptState

DELTAS = [((2.0, -1.0), -1.0), ((0.0, -1.0), -1.0), ((-4.0, -1.0), -1.0)]
HAND = dict(learning_rate=2.0, b1=0.5, b2=0.75, tau=1.0)


def three_steps(name):
    reads = SERVER_OPTIMIZER_READS[name]  # FedAdagrad takes no β2
    optimizer = make_server_optimizer(name, HAND["learning_rate"], **{key: HAND[key] for key in ("b1", "b2", "tau")
                                                                      if key in reads})
    params = {"w": jnp.zeros(2), "b": jnp.zeros(())}
    state = optimizer.init(params)
    trajectory = []
    for w_delta, b_delta in DELTAS:
        pseudo_gradient = {"w": -jnp.array(w_delta), "b": -jnp.array(b_delta)}
        params, state = jax.jit(lambda p, s, g: apply_server_update(optimizer, p, s, g))(params, state, pseudo_gradient)
        trajectory.append((np.asarray(params["w"]).tolist(), float(params["b"])))
    return trajectory, state


# m (in Δ terms) is the same for all three: w0: 1, 0.5, 0.25 − 2 = −1.75; w1 and b: −0.5, −0.75, −0.875.
# With Δ² = τ² = 1, Adam keeps v = 0.75·1 + 0.25·1 = 1 and Yogi's sign(v − Δ²) = sign(0) = 0 keeps v = 1,
# so their w1 and b move by 2m/(1 + 1) = m: −0.5, −1.25, −2.125.
def test_fedadam_three_steps_by_hand():
    # w0: v = 0.75·1 + 0.25·4 = 1.75; 0.75·1.75 = 1.3125; 0.75·1.3125 + 0.25·16 = 4.984375
    trajectory, state = three_steps("adam")
    x1 = 2 * 1 / (sqrt(1.75) + 1)
    x2 = x1 + 2 * 0.5 / (sqrt(1.3125) + 1)
    x3 = x2 + 2 * -1.75 / (sqrt(4.984375) + 1)
    np.testing.assert_allclose([t[0][0] for t in trajectory], [x1, x2, x3], rtol=1e-6)
    np.testing.assert_allclose([t[0][1] for t in trajectory], [-0.5, -1.25, -2.125], rtol=1e-6)
    np.testing.assert_allclose([t[1] for t in trajectory], [-0.5, -1.25, -2.125], rtol=1e-6)
    assert isinstance(state, FedOptState)
    np.testing.assert_allclose(state.second_moment["w"], [4.984375, 1.0], rtol=1e-6)
    np.testing.assert_allclose(state.momentum["w"], [1.75, 0.875], rtol=1e-6)  # m of g = −Δ


def test_fedyogi_three_steps_by_hand():
    # w0: v = 1 − 0.25·4·sign(1 − 4) = 2; 2 − 0.25·0·sign(2) = 2; 2 − 0.25·16·sign(2 − 16) = 6
    trajectory, state = three_steps("yogi")
    x1 = 2 * 1 / (sqrt(2) + 1)
    x2 = x1 + 2 * 0.5 / (sqrt(2) + 1)
    x3 = x2 + 2 * -1.75 / (sqrt(6) + 1)
    np.testing.assert_allclose([t[0][0] for t in trajectory], [x1, x2, x3], rtol=1e-6)
    np.testing.assert_allclose([t[0][1] for t in trajectory], [-0.5, -1.25, -2.125], rtol=1e-6)
    np.testing.assert_allclose([t[1] for t in trajectory], [-0.5, -1.25, -2.125], rtol=1e-6)
    np.testing.assert_allclose(state.second_moment["w"], [6.0, 1.0], rtol=1e-6)


def test_fedadagrad_three_steps_by_hand():
    # Adagrad adds Δ²: w0: v = 5, 5, 21; w1 and b: v = 2, 3, 4. β2 is not used.
    trajectory, state = three_steps("adagrad")
    w0 = [2 * 1 / (sqrt(5) + 1)]
    w0.append(w0[-1] + 2 * 0.5 / (sqrt(5) + 1))
    w0.append(w0[-1] + 2 * -1.75 / (sqrt(21) + 1))
    w1 = [2 * -0.5 / (sqrt(2) + 1)]
    w1.append(w1[-1] + 2 * -0.75 / (sqrt(3) + 1))
    w1.append(w1[-1] + 2 * -0.875 / (2 + 1))
    np.testing.assert_allclose([t[0][0] for t in trajectory], w0, rtol=1e-6)
    np.testing.assert_allclose([t[0][1] for t in trajectory], w1, rtol=1e-6)
    np.testing.assert_allclose([t[1] for t in trajectory], w1, rtol=1e-6)
    np.testing.assert_allclose(state.second_moment["w"], [21.0, 4.0], rtol=1e-6)


def test_paper_defaults_first_step_and_optax_versions_differ():
    """Defaults β1 = 0.9, β2 = 0.99, τ = 10⁻³: a first FedAdam step with Δ = 1 moves by
    η·0.1/(√(0.99·10⁻⁶ + 0.01) + 10⁻³) ≈ 0.990 η, where optax's bias-corrected Adam moves η/(1 + 10⁻³)."""
    params = {"w": jnp.zeros(1)}
    step = lambda opt: float(apply_server_update(opt, params, opt.init(params), {"w": -jnp.ones(1)})[0]["w"][0])
    assert step(make_server_optimizer("adam", 1.0)) == pytest.approx(0.1 / (sqrt(0.99e-6 + 0.01) + 1e-3), rel=1e-6)
    assert step(make_server_optimizer("optax_adam", 1.0)) == pytest.approx(1 / (1 + 1e-3), rel=1e-6)
    # Yogi: v = 10⁻⁶ + 0.01·1 (sign(10⁻⁶ − 1) = −1); optax's Yogi starts v at 10⁻⁶ too but bias-corrects m
    assert step(make_server_optimizer("yogi", 1.0)) == pytest.approx(0.1 / (sqrt(1e-6 + 0.01) + 1e-3), rel=1e-6)
    assert step(make_server_optimizer("optax_yogi", 1.0)) != pytest.approx(step(make_server_optimizer("yogi", 1.0)))
    # Adagrad: v = 10⁻⁶ + 1, m = 0.1; optax's accumulator starts at 0.1, has no momentum and eps inside the root
    assert step(make_server_optimizer("adagrad", 1.0)) == pytest.approx(0.1 / (sqrt(1 + 1e-6) + 1e-3), rel=1e-6)
    assert step(make_server_optimizer("optax_adagrad", 1.0)) == pytest.approx(1 / sqrt(0.1 + 1 + 1e-3), rel=1e-6)
    assert isinstance(make_server_optimizer("optax_adam", 1.0).init(params)[0], optax.ScaleByAdamState)


def test_server_fields_validated_and_refused_where_unread():
    config = validate(RunConfig(algorithm="fedadam", server_tau=1e-2, server_beta1=0.0, server_beta2=0.9))
    assert (config.server_optimizer, config.server_tau, config.server_beta1, config.server_beta2) == ("adam", 1e-2, 0.0, 0.9)
    assert validate(RunConfig(algorithm="fedavg", server_optimizer="optax_yogi")).server_lr == 1e-2
    with pytest.raises(ConfigError, match="server_tau=0.0"):
        validate(RunConfig(algorithm="fedadam", server_tau=0.0))
    with pytest.raises(ConfigError, match="server_beta1=1.0"):
        validate(RunConfig(algorithm="fedyogi", server_beta1=1.0))
    with pytest.raises(ConfigError, match="server_tau=0.01.*never reads it"):
        validate(RunConfig(algorithm="fedavg", server_tau=1e-2))
    with pytest.raises(ConfigError, match="server_beta2=0.9.*never reads it"):
        validate(RunConfig(algorithm="fedadagrad", server_beta2=0.9))
    with pytest.raises(ConfigError, match="server_momentum=0.5.*never reads it"):
        validate(RunConfig(algorithm="fedadam", server_momentum=0.5))
    with pytest.raises(ConfigError, match="server_optimizer='lamb'"):
        validate(RunConfig(server_optimizer="lamb"))


def test_a_comparison_gives_server_fields_to_the_algorithms_whose_optimizer_reads_them(tmp_path, capsys):
    from jaxfl import cli
    from jaxfl.sweep import expand

    argv = ["--algorithm", "fedavg,fedadam", "--server-tau", "0.01", "--server-momentum", "0.5"]
    configs = cli._configs(cli.build_parser().parse_args(["run", *argv]))
    assert [(c.algorithm, c.server_tau, c.server_momentum) for c in configs] == \
        [("fedavg", 1e-3, 0.5), ("fedadam", 0.01, None)]
    err = capsys.readouterr().err
    assert "server_tau=0.01 applies to fedadam only" in err and "server_momentum=0.5 applies to fedavg only" in err
    with pytest.raises(ConfigError, match=r"server_tau=0.01 is not allowed with algorithm fedavg.*fedadam"):
        cli._configs(cli.build_parser().parse_args(["run", "--algorithm", "fedavg", "--server-tau", "0.01"]))
    # a sweep keeps the field in the cells whose optimiser reads it (FedAdam's own adam)
    cells, notes = expand({"model": "logreg", "server_tau": 0.01}, {"algorithm": ["fedavg", "fedadam"]}, str(tmp_path))
    assert [(cell.config.algorithm, cell.config.server_tau) for cell in cells] == [("fedavg", 1e-3), ("fedadam", 0.01)]
    assert notes == ["server_tau applies only to the cells that read it (algorithm=fedadam)"]


def test_one_server_lr_over_servers_of_other_defaults_says_whose_defaults_it_replaces(capsys):
    # FedAvg's sgd server at 0.05 damps the baseline 20-fold: given to both without a word before
    from jaxfl import cli

    configs = cli._configs(cli.build_parser().parse_args(["run", "--algorithm", "fedavg,fedadam", "--server-lr", "0.05"]))
    assert [(c.algorithm, c.server_lr) for c in configs] == [("fedavg", 0.05), ("fedadam", 0.05)]
    assert "server_lr=0.05 applies to every one of fedavg, fedadam, in place of their own defaults (fedavg 1 (sgd), " \
           "fedadam 0.01 (adam))" in capsys.readouterr().err
    cli._configs(cli.build_parser().parse_args(["run", "--algorithm", "fedavg,fedbuff", "--server-lr", "0.5"]))
    assert "server_lr" not in capsys.readouterr().err  # one default (sgd's 1) for both: nothing to say
    cli._configs(cli.build_parser().parse_args(["run", "--algorithm", "fedavg,fedavgm", "--server-momentum", "0.5"]))
    assert "server_momentum=0.5 applies to every one of fedavg, fedavgm, in place of their own defaults (fedavg 0, " \
           "fedavgm 0.9)" in capsys.readouterr().err
