import dataclasses
import os
import tempfile

import jax
import pytest

from jaxfl.config import RunConfig

# Many tests build engines whose step chunks are the same XLA program (the same small model, batch
# and step count); compiling each once per session instead of once per engine is most of the
# suite's time. The persistent cache keys on the program, so results and trace counts are unchanged.
jax.config.update("jax_compilation_cache_dir", os.environ.get(
    "JAXFL_TEST_XLA_CACHE", os.path.join(tempfile.gettempdir(), f"jaxfl-test-xla-cache-{os.getuid()}")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture
def small_config(tmp_path):
    """A seconds-long run on the embedded MNIST-10k: MLP, 4 clients, 4 local steps."""
    return RunConfig(algorithm="fedbuff", dataset="mnist10k", model="mlp", clients=4, local_steps=4,
                     batch_size=16, max_updates=4, buffer_size=2, progress=False,
                     output_dir=str(tmp_path / "runs"))


def replace(config, **changes):
    return dataclasses.replace(config, **changes)


class RecordingBackend:
    """The scheduler's contract needs no numbers: record what the engine would be asked."""

    def __init__(self):
        self.dispatched, self.aggregations = [], []

    def on_dispatch(self, record):
        self.dispatched.append(record.id)

    def on_aggregate(self, aggregation, records):
        self.aggregations.append(aggregation)
        return False

    def on_drop(self, record):
        pass

    def nonfinite(self, records):
        return []


class Interrupted(Exception):
    """Raised inside a run to interrupt it (tests of resume)."""
