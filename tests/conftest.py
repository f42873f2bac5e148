import dataclasses

import pytest

from jaxfl.config import RunConfig


@pytest.fixture
def small_config(tmp_path):
    """A seconds-long run on the embedded MNIST-10k: MLP, 4 clients, 4 local steps."""
    return RunConfig(algorithm="fedbuff", dataset="mnist10k", model="mlp", clients=4, local_steps=4,
                     batch_size=16, max_updates=4, buffer_size=2, progress=False,
                     output_dir=str(tmp_path / "runs"))


def replace(config, **changes):
    return dataclasses.replace(config, **changes)
