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


def _without_wall_time(path):
    import csv

    with open(path) as handle:
        return [{k: v for k, v in row.items() if k != "wall_time"} for row in csv.DictReader(handle)]


def assert_same_run(a, b):
    """Two RunResults are the same run: event log, metrics, parameters bit for bit, and summary."""
    import os

    import jax
    import numpy as np

    with open(os.path.join(a.run_dir, "events.csv")) as x, open(os.path.join(b.run_dir, "events.csv")) as y:
        assert x.read() == y.read()
    assert _without_wall_time(os.path.join(a.run_dir, "metrics.csv")) == \
        _without_wall_time(os.path.join(b.run_dir, "metrics.csv"))
    for p, q in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_array_equal(np.asarray(p), np.asarray(q))
    ignore = {"wall_time_s", "resumes", "compilations"}  # per process: a resumed run compiles again
    assert {k: v for k, v in a.summary.items() if k not in ignore} == \
        {k: v for k, v in b.summary.items() if k not in ignore}
