"""The scheduler's per-client columns are stored once per run directory, not in every state.pkl.

A column that did not change since the previous checkpoint is referenced, a few changed elements
are stored as (indices, values) on top of it, and a resumed run is still bit-identical; a missing or
corrupt column file makes its checkpoint unreadable with a message naming the file.
"""
import array
import io
import json
import os
import pathlib
import shutil

import numpy as np
import pytest

from jaxfl import checkpoint
from jaxfl.config import RunConfig
from jaxfl.experiment import resume_experiment, run_experiment
from jaxfl.resume import ResumeError, ResumeWarning
from jaxfl.testing import assert_same_run

CLIENTS = 50_000  # a float64 column of 400 KB: over EXTERNAL_ARRAY_BYTES


def save(root: str, previous: list, state: dict) -> tuple[bytes, list, set]:
    """state.pkl's bytes, the slots and the new array files of one save into ``root``."""
    before = set(os.listdir(os.path.join(root, "arrays"))) if os.path.isdir(os.path.join(root, "arrays")) else set()
    store, buffer = checkpoint._ArrayStore(root, previous), io.BytesIO()
    checkpoint._StatePickler(buffer, store, CLIENTS).dump(state)
    return buffer.getvalue(), store.slots, set(os.listdir(os.path.join(root, "arrays"))) - before


def load(root: str, data: bytes) -> dict:
    return checkpoint._StateUnpickler(io.BytesIO(data), os.path.join(root, "arrays")).load()


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_unchanged_columns_are_referenced_and_changed_elements_stored_as_a_delta(tmp_path):
    rng = np.random.default_rng(0)
    weights = rng.random(CLIENTS)  # never changes during a run
    busy = array.array("d", [0.0]) * CLIENTS  # changes for the clients that ran
    state = {"weights": weights, "busy": busy, "also_weights": weights, "small": np.arange(CLIENTS // 100),
             "not_per_client": np.zeros(CLIENTS + 1)}
    first, slots, written = save(str(tmp_path), [], state)
    assert len(slots) == 2 and len(written) == 2  # the two per-client columns, each written once
    # the array of another length stays in the pickle (its 400 KB and little more), the columns do not
    assert len(first) < 8 * (CLIENTS + 1) + 8 * CLIENTS // 100 + 2_000
    second, slots_again, written = save(str(tmp_path), slots, state)
    assert written == set() and slots_again == slots and len(second) == len(first)
    busy[7], busy[40_000] = 1.5, -0.0
    third, _, written = save(str(tmp_path), slots, state)
    assert written == set() and 0 < len(third) - len(first) < 100  # 2 indices (uint32) and 2 float64 values
    restored = load(str(tmp_path), third)
    assert same_bits(restored["busy"], busy) and type(restored["busy"]) is array.array
    assert restored["also_weights"] is restored["weights"] and same_bits(restored["weights"], weights)
    busy[:CLIENTS // 2] = array.array("d", [2.0]) * (CLIENTS // 2)  # half changed: a new file is cheaper
    fourth, fourth_slots, written = save(str(tmp_path), slots, state)
    assert len(written) == 1 and fourth_slots[0] == slots[0] and fourth_slots[1] != slots[1]
    assert same_bits(load(str(tmp_path), fourth)["busy"], busy)


FLAGS = {"algorithm": "fedbuff", "dataset": "synthetic_iid", "partition": "natural", "model": "logreg",
         "clients": 200, "concurrency": 4, "local_steps": 2, "batch_size": 10, "buffer_size": 2, "max_updates": 4,
         "checkpoint_every": 1, "target_accuracy": 0.99, "stop_at_target": False, "progress": False}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A run whose per-client columns (200 clients, 4 in flight) all go to arrays/: checkpoints after updates 3
    and 4, the second mostly deltas of the first (the resumed runs below store theirs so too)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint, "EXTERNAL_ARRAY_BYTES", 1)
        yield run_experiment(RunConfig(**FLAGS, output_dir=str(tmp_path_factory.mktemp("runs")), run_name="full"))


def referenced(run_dir: str, name: str) -> list:
    with open(os.path.join(run_dir, "checkpoints", name, checkpoint.ARRAYS)) as handle:
        return [slot["digest"] for slot in json.load(handle)["slots"]]


def test_a_run_stores_each_column_once_and_resumes_bit_identically(finished, tmp_path):
    root = os.path.join(finished.run_dir, "checkpoints")
    third, fourth = referenced(finished.run_dir, "ckpt-000003"), referenced(finished.run_dir, "ckpt-000004")
    assert len(fourth) >= 6  # client weights, busy time, rounds, the idle pool's two, base speeds, rounds drawn
    # the first checkpoint's files, with the few clients that ran since as deltas in state.pkl: each column
    # was written once in the whole run
    assert third == fourth and sorted(os.listdir(os.path.join(root, "arrays"))) == sorted({f"{d}.npy" for d in fourth})
    run = shutil.copytree(finished.run_dir, str(tmp_path / "interrupted"))
    with open(os.path.join(run, "checkpoints", "ckpt-000004", "state.pkl"), "wb") as handle:
        handle.write(b"garbage")
    with pytest.warns(ResumeWarning, match="resuming from ckpt-000003"):
        resumed = resume_experiment(run, progress=False)
    assert_same_run(finished, resumed, "resumed from a checkpoint whose columns are in arrays/")


@pytest.mark.parametrize("damage, says", [("delete", "is missing"), ("corrupt", "is corrupt")])
def test_a_missing_or_corrupt_column_file_is_named(finished, tmp_path, damage, says):
    run = shutil.copytree(finished.run_dir, str(tmp_path / "damaged"))
    shared = min(set(referenced(run, "ckpt-000003")) & set(referenced(run, "ckpt-000004")))
    path = pathlib.Path(run, "checkpoints", "arrays", f"{shared}.npy")
    if damage == "delete":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    with pytest.raises(ResumeError) as caught:
        resume_experiment(run, progress=False)
    message = str(caught.value)
    assert f"ckpt-000004: state.pkl unreadable (ValueError: array file arrays/{shared[:16]}….npy" in message
    assert says in message and "ckpt-000003" in message and "\n" not in message


@pytest.mark.parametrize("emptied", [False, True])
def test_a_damaged_column_file_is_written_anew_not_named_again(tmp_path, emptied):
    # the next save found the damaged base (its digest did not match), wrote the column "in full" under
    # the same digest, and skipped it as existing: every later checkpoint named the damaged file too
    weights = np.random.default_rng(1).random(CLIENTS)
    _, slots, written = save(str(tmp_path), [], {"weights": weights})
    (name,) = written
    path = tmp_path / "arrays" / name
    damaged = bytearray(path.read_bytes())
    damaged[-1] ^= 0xFF
    path.write_bytes(b"" if emptied else bytes(damaged))  # emptied (a machine's crash): np.load's EOFError
    data, slots_again, _ = save(str(tmp_path), slots, {"weights": weights})
    assert slots_again == slots  # the same digest, its file now whole again
    assert same_bits(load(str(tmp_path), data)["weights"], weights)
