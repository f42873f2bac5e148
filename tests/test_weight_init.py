"""weight_init="pytorch": the papers' models start where the authors' PyTorch code starts them
(U(±1/√fan_in) weights and biases, N(0, 1) embeddings), by name and shape of each flax leaf."""
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfl
from jaxfl.cli import main
from jaxfl.config import ConfigError, validate
from jaxfl.experiment import config_hash, prepare, run_experiment
from jaxfl.models.init import pytorch_default_init

SMALL = dict(algorithm="fedavg", clients=3, local_steps=2, batch_size=16, max_updates=1, stop_at_target=False,
             progress=False, checkpoint_every=None)


def leaves(params) -> dict:
    return {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


@pytest.mark.parametrize("model, fan_ins", [
    # Conv 5x5 1->32, 5x5 32->64, Dense 1024->512, 512->10 (FedCompass's MNIST CNN)
    ("cnn", {"['Conv_0']": 25, "['Conv_1']": 800, "['Dense_0']": 1024, "['Dense_1']": 512}),
    ("mlp", None),
])
def test_every_kernel_and_its_bias_is_uniform_within_one_over_root_fan_in(model, fan_ins):
    _, _, _, _, flax_start = prepare(jaxfl.RunConfig(model=model))
    _, _, _, _, torch_start = prepare(jaxfl.RunConfig(model=model, weight_init="pytorch"))
    flax_leaves, torch_leaves = leaves(flax_start["params"]), leaves(torch_start["params"])
    assert flax_leaves.keys() == torch_leaves.keys()
    kernels = {name[:-len("['kernel']")]: value for name, value in torch_leaves.items() if name.endswith("['kernel']")}
    assert kernels
    for layer, kernel in kernels.items():
        fan_in = kernel.shape[0] if kernel.ndim == 2 else math.prod(kernel.shape[:-1])
        if fan_ins is not None:
            assert fan_in == fan_ins[layer]
        bound = 1 / math.sqrt(fan_in)
        for value in (kernel, torch_leaves[layer + "['bias']"]):
            assert np.abs(value).max() <= bound and np.abs(value).max() > 0.9 * bound
            # a uniform draw's std is bound/√3, not flax's LeCun-normal 1/√fan_in
            if value.size > 1000:
                assert np.std(value) == pytest.approx(bound / math.sqrt(3), rel=0.05)
        assert not np.any(flax_leaves[layer + "['bias']"])  # flax: zero biases


def test_embeddings_are_standard_normal_and_norm_layers_untouched():
    embedding = pytorch_default_init({"Embed_0": {"embedding": jnp.zeros((5000, 16))}}, jax.random.key(0))
    assert np.std(embedding["Embed_0"]["embedding"]) == pytest.approx(1.0, rel=0.02)
    params = {"BatchNorm_0": {"scale": jnp.ones(4), "bias": jnp.zeros(4)}, "Dense_0": {"kernel": jnp.zeros((9, 2))}}
    redrawn = pytorch_default_init(params, jax.random.key(0))
    assert np.all(redrawn["BatchNorm_0"]["scale"] == 1) and np.all(redrawn["BatchNorm_0"]["bias"] == 0)
    assert np.abs(redrawn["Dense_0"]["kernel"]).max() <= 1 / 3
    again = pytorch_default_init(params, jax.random.key(0))
    assert np.array_equal(again["Dense_0"]["kernel"], redrawn["Dense_0"]["kernel"])  # deterministic in the key


def test_a_run_at_pytorch_initialisation_is_its_own_run_and_repeats(tmp_path):
    flax_run = run_experiment(jaxfl.RunConfig(**SMALL, model="mlp", output_dir=str(tmp_path)))
    torch_run = run_experiment(jaxfl.RunConfig(**SMALL, model="mlp", weight_init="pytorch", output_dir=str(tmp_path)))
    assert flax_run.run_dir != torch_run.run_dir
    assert flax_run.metrics[0]["accuracy"] != torch_run.metrics[0]["accuracy"]  # another model at version 0
    again = run_experiment(jaxfl.RunConfig(**SMALL, model="mlp", weight_init="pytorch",
                                           output_dir=str(tmp_path / "again")))
    assert [row["accuracy"] for row in again.metrics] == [row["accuracy"] for row in torch_run.metrics]
    recorded = json.load(open(os.path.join(torch_run.run_dir, "config.json")))["config"]
    assert recorded["data"]["weight_init"] == "pytorch"
    # the default is left out of the run's name: runs named before the field existed keep their names
    assert config_hash(validate(jaxfl.RunConfig(weight_init="flax"))) == config_hash(validate(jaxfl.RunConfig()))


def test_bad_or_unread_weight_init_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"weight_init='torch' is not allowed: one of flax, pytorch"):
        validate(jaxfl.RunConfig(weight_init="torch"))
    _, _, _, _, start = prepare(jaxfl.RunConfig(model="mlp"))
    with pytest.raises(ConfigError, match=r"weight_init='pytorch' is not read when init_params= is given"):
        run_experiment(jaxfl.RunConfig(**SMALL, model="mlp", weight_init="pytorch", output_dir=str(tmp_path)),
                       init_params=start["params"])
    assert not os.listdir(tmp_path)
    assert main(["run", "--model", "mlp", "--weight-init", "pytorch", "--clients", "3", "--local-steps", "2",
                 "--max-updates", "1", "--no-progress", "--output-dir", str(tmp_path / "cli")]) == 0
