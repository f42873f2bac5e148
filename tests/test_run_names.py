"""Run names (``config_hash``) stay the same across jaxfl versions: a field that never changes results
(``client_state``) is left out, and a field added later is left out at the value that does what
runs did before it existed, so a sweep folder made by an older jaxfl reuses its finished cells.

``tests/data/sweep_before_client_state`` was made by jaxfl at commit 95f2631, the last before the
``client_state`` field existed (``run_sweep(BASE, GRID, folder)``; ``results.parquet`` left out):
its one run directory is named with that version's hash of the cell's config.
"""
import hashlib
import json
import os
import shutil

from jaxfl import config as config_module
from jaxfl.config import RunConfig, config_from_mapping, validate
from jaxfl.experiment import config_hash, run_name
from jaxfl.resume import canonical_json
from jaxfl.sweep import run_sweep

OLD_SWEEP = os.path.join(os.path.dirname(__file__), "data", "sweep_before_client_state")
BASE = {"model": "logreg", "clients": 3, "local_steps": 2, "batch_size": 16, "max_updates": 1,
        "checkpoint_every": None, "final_checkpoint": False}
GRID = {"algorithm": ["fedavg"]}
OLD_RUN = "fedavg-mnist10k-logreg-iid-exp-c3-q2-lr0.003-s0-cb67ef"
OLD_HASH = "cb67ef"  # config_hash of that run's recorded config, computed by jaxfl at 95f2631


def test_a_config_recorded_before_client_state_existed_hashes_as_it_did_then():
    with open(os.path.join(OLD_SWEEP, "runs", OLD_RUN, "config.json")) as handle:
        recorded = json.load(handle)["config"]
    assert "client_state" not in recorded["engine"]  # the old layout
    config = validate(config_from_mapping(recorded))
    assert config_hash(config) == OLD_HASH
    assert run_name(config) == OLD_RUN
    # the placement never changes results, so it never changes the name either (a CC-FedAvg config here)
    cc = validate(RunConfig(algorithm="ccfedavg", algorithm_options={"strategy": "cc"}))
    assert {config_hash(validate(RunConfig(algorithm="ccfedavg", algorithm_options={"strategy": "cc"},
                                           client_state=placement))) for placement in ("device", "host", "memmap")} \
        == {config_hash(cc)}


def test_a_sweep_folder_made_before_client_state_reuses_its_finished_cell(tmp_path):
    folder = shutil.copytree(OLD_SWEEP, tmp_path / "sweep")
    result = run_sweep(BASE, GRID, str(folder), progress=False)
    assert result.ran == [] and result.skipped == [0]
    assert sorted(os.listdir(folder / "runs")) == [OLD_RUN]
    assert [row["global_updates"] for row in result.rows] == [1]


def test_an_added_field_is_hashed_only_away_from_the_value_runs_had_before_it(monkeypatch):
    # as if buffer_size had just been added at its default 3: configs at 3 keep the names they had
    # without it, any other value (a later default too) is part of the name
    monkeypatch.setitem(config_module.FIELDS_ADDED, "buffer_size", 3)
    config = validate(RunConfig(algorithm="fedbuff", buffer_size=3))
    values = config.to_dict()
    del values["output_dir"], values["run_name"], values["progress"], values["engine"]["client_state"]
    del values["checkpoint_min_interval_s"], values["server"]["buffer_size"]
    del values["speeds"]["speed_unit"]  # added at "step", where configs keep the names they had
    assert config_hash(config) == hashlib.sha256(canonical_json(values).encode()).hexdigest()[:6]
    hashes = {config_hash(validate(RunConfig(algorithm="fedbuff", buffer_size=size))) for size in (2, 3, 4)}
    assert len(hashes) == 3
    # an algorithm's option too (namespace.option), only for the algorithm that has it
    monkeypatch.setitem(config_module.FIELDS_ADDED, "port.staleness_bound", 10.0)
    port = validate(RunConfig(algorithm="port"))
    values = port.to_dict()
    del values["output_dir"], values["run_name"], values["progress"], values["engine"]["client_state"]
    del values["checkpoint_min_interval_s"], values["speeds"]["speed_unit"]
    del values["algorithm_options"]["staleness_bound"], values["server"]["buffer_size"]  # both added
    assert config_hash(port) == hashlib.sha256(canonical_json(values).encode()).hexdigest()[:6]
    assert config_hash(validate(RunConfig(algorithm="port", algorithm_options={"staleness_bound": 5}))) != \
        config_hash(port)


def test_names_of_python_object_runs_are_one_folder_a_shell_takes_unquoted(tmp_path):
    # '<user: common.make_model>' put '<', '>' and a space in the folder's name (a pasted resume command
    # broke in bash), and 'lr0.003' named a learning rate the user's optax optimiser does not use
    import re

    import flax.linen as nn
    import optax

    import jaxfl
    from jaxfl.experiment import RunInterrupted, resume_experiment, run_experiment

    class Small(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(10)(x.reshape((x.shape[0], -1)))

    named = run_name(validate(RunConfig(model="my_models:make_model", dataset="synthetic:0.5,0.5")))
    assert named.startswith("fedbuff-synthetic_0.5,0.5-my_models_make_model-iid-")  # as before
    config = RunConfig(algorithm="fedbuff", clients=3, local_steps=2, batch_size=16, buffer_size=2, max_updates=2,
                       checkpoint_every=1, stop_at_target=False, progress=False, output_dir=str(tmp_path))
    jaxfl.request_stop("a test")  # taken at the first event: the run stops with its first checkpoint
    try:
        run_experiment(config, model=Small(), client_optimizer=optax.sgd(0.05))
    except RunInterrupted as interrupt:
        stopped = interrupt
    name = os.path.basename(stopped.run_dir)
    assert re.fullmatch(r"fedbuff-mnist10k-user_[\w.]+\.Small-iid-exp-c3-q2-user_optimizer-s0-[0-9a-f]{6}", name), name
    # no command line can pass the objects: the message says what resume_experiment needs again
    assert str(stopped).endswith(f"resume_experiment({stopped.run_dir!r}, model=..., client_optimizer=...) goes on "
                                 "from there, given the same objects again")
    resumed = resume_experiment(stopped.run_dir, model=Small(), client_optimizer=optax.sgd(0.05), progress=False)
    assert resumed.summary["global_updates"] == 2
