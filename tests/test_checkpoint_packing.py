"""A checkpoint's small device arrays (the model versions FedBuff keeps for its clients in flight,
trained updates, optimiser state) are stacked into one orbax array per shape and dtype: orbax's cost
grows with the number of arrays. The run resumes from it bit for bit."""
import json
import os

import jax
import pytest

from jaxfl import checkpoint
from jaxfl.experiment import prepare, resume_experiment, run_experiment
from jaxfl.testing import assert_same_run
from conftest import Interrupted, replace


def test_small_arrays_are_stacked_by_shape_and_the_run_resumes_bit_for_bit(small_config, crash_after_saves):
    config = replace(small_config, clients=8, concurrency=6, buffer_size=2, max_updates=4, checkpoint_every=1)
    disarm = crash_after_saves(2)
    with pytest.raises(Interrupted):
        run_experiment(replace(config, run_name="cut"))
    disarm()
    run_dir = os.path.join(config.output_dir, "cut")
    folder = checkpoint.latest(run_dir)
    with open(os.path.join(folder, checkpoint.PACKING)) as handle:
        packing = json.load(handle)
    shapes = {(tuple(shape), dtype) for shape, dtype in packing["leaves"]}
    assert len(packing["groups"]) == len(shapes) and packing["whole"] == []  # the MLP's leaves are all < 1 MiB
    assert sorted(i for group in packing["groups"] for i in group) == list(range(len(packing["leaves"])))
    import orbax.checkpoint as ocp

    stored = ocp.StandardCheckpointer().metadata(os.path.join(folder, "device"))
    stored = getattr(stored, "item_metadata", stored)
    params = len(jax.tree.leaves(prepare(config)[4]["params"]))
    # the model's leaves alone (final_params reads them), then one array per shape and dtype
    assert len(jax.tree.leaves(stored)) == params + len(shapes) < params + len(packing["leaves"])
    assert_same_run(resume_experiment(run_dir), run_experiment(replace(config, run_name="whole")))


def test_a_packing_record_that_does_not_fit_the_run_is_refused():
    import numpy as np

    _, packing = checkpoint._pack({"a": np.zeros(3), "b": np.zeros(2)})
    with pytest.raises(ValueError, match="packing.json does not describe the arrays this run restores"):
        checkpoint._pack({"a": np.zeros(3)}, packing)


def test_only_the_trained_rows_still_waiting_for_aggregation_are_stored_and_the_run_resumes_bit_for_bit(
        small_config, crash_after_saves):
    # FedAsync aggregates one row of a batch trained together per arrival: a checkpoint between two
    # arrivals finds batches whose earlier rows are consumed, and stores the rest alone
    config = replace(small_config, algorithm="fedasync", clients=8, max_updates=8, checkpoint_every=1)
    disarm = crash_after_saves(4)
    with pytest.raises(Interrupted):
        run_experiment(replace(config, run_name="cut"))
    disarm()
    run_dir = os.path.join(config.output_dir, "cut")
    meta = checkpoint.load_state(checkpoint.latest(run_dir))["engine"]
    stored = sum(len(rows) for rows in meta["batch_rows"].values())
    assert stored == len(meta["placement"]) < sum(meta["batch_sizes"].values())
    assert_same_run(resume_experiment(run_dir), run_experiment(replace(config, run_name="whole")))
