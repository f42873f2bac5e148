"""Run names (``config_hash``) stay the same across jaxfl versions: a field that never changes results
(``client_state``) is left out, and a field added later is left out at the value that does what
runs did before it existed, so a sweep folder made by an older jaxfl reuses its finished cells.

``tests/data/sweep_before_client_state`` was made by jaxfl at commit 95f2631, the last before the
``client_state`` field existed (``run_sweep(BASE, GRID, folder)``; ``results.parquet`` left out):
its one run directory is named with that version's hash of the cell's config.

That promise holds from commit f8afff3 on, where ``FIELDS_ADDED`` began (fields added before it are
hashed at their defaults and renamed older runs): ``HASHED`` below freezes the fields that enter the
hash, so a field added without a ``FIELDS_ADDED`` entry fails here with what to do.
"""
import hashlib
import json
import os
import shutil

import pytest

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
    del values["data"]["dirichlet_min_samples"], values["data"]["dirichlet_balance"]  # added at 1 and False
    del values["engine"]["step_loop"]  # added at None (the engine's choice)
    del values["data"]["weight_init"]  # added at "flax" (flax's layer defaults)
    assert config_hash(config) == hashlib.sha256(canonical_json(values).encode()).hexdigest()[:6]
    hashes = {config_hash(validate(RunConfig(algorithm="fedbuff", buffer_size=size))) for size in (2, 3, 4)}
    assert len(hashes) == 3
    # an algorithm's option too (namespace.option), only for the algorithm that has it
    monkeypatch.setitem(config_module.FIELDS_ADDED, "port.staleness_bound", 10.0)
    port = validate(RunConfig(algorithm="port"))
    values = port.to_dict()
    del values["output_dir"], values["run_name"], values["progress"], values["engine"]["client_state"]
    del values["checkpoint_min_interval_s"], values["speeds"]["speed_unit"]
    del values["data"]["dirichlet_min_samples"], values["data"]["dirichlet_balance"], values["engine"]["step_loop"]
    del values["data"]["weight_init"]
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


# Every config field that enters a run's name hash (config_hash) at the defaults, as its path in the
# nested config.json, and every algorithm option by namespace. Frozen here on purpose: a field that
# joins this set renames every run made before it (a sweep folder reruns its finished cells), the
# way eight fields added before FIELDS_ADDED existed did (README, "Each run directory, named ...").
HASHED = {
    "algorithm", "seed", "checkpoint_every", "final_checkpoint",
    "data.dataset", "data.data_dir", "data.model", "data.clients", "data.partition", "data.dirichlet_alpha",
    "data.client_sizes", "data.size_skew", "data.shards_per_client", "data.gamma", "data.client_weights",
    "data.augment", "data.normalize", "data.normalize_mean", "data.normalize_std", "data.num_classes",
    "data.data_fingerprint",
    "speeds.heterogeneity", "speeds.speed_mean", "speeds.jitter", "speeds.speed_change_prob", "speeds.speed_cap",
    "speeds.negative_times", "speeds.latency", "speeds.bandwidth", "speeds.speed_reference_time",
    "speeds.speed_ratio", "speeds.speed_legacy_seed",
    "faults.crash_prob", "faults.delay_prob", "faults.delay_factor", "faults.dropout_prob", "faults.dropout_mean",
    "faults.round_timeout", "faults.on_nonfinite",
    "client.local_steps", "client.batch_size", "client.client_optimizer", "client.client_lr", "client.prox_mu",
    "client.client_momentum", "client.client_weight_decay", "client.client_lr_decay", "client.local_epochs",
    "server.server_optimizer", "server.server_lr", "server.server_momentum", "server.server_tau",
    "server.server_beta1", "server.server_beta2", "server.clients_per_round", "server.concurrency",
    "server.buffer_size", "server.rule", "server.staleness", "server.staleness_alpha", "server.staleness_a",
    "server.fednova",
    "budget.max_time", "budget.max_updates", "budget.max_client_updates", "budget.max_client_steps",
    "budget.target_accuracy", "budget.stop_at_target", "budget.eval_every", "budget.eval_interval",
    "budget.eval_at_start",
    "engine.batching", "engine.clients_per_call", "engine.steps_per_call", "engine.cpu_friendly_layers",
    "engine.devices", "engine.memory_limit_mb", "engine.timing_only",
}
HASHED_OPTIONS = {
    "compass": {"create_far_groups", "create_rule", "empty_timer", "fastest_over", "join_max_factor",
                "latest_time_factor", "lr_decay", "preset", "q_max", "q_min", "speed_estimate", "staleness_at",
                "warmup"},
    "fedat": {"profiling", "tier_ratio"},
    "port": {"alpha", "beta", "bound_rule", "clients_in_flight", "cosine", "cosine_skip_rounds",
             "cosine_skip_staleness", "min_clients", "preset", "pull_steps", "replace", "staleness_bound",
             "urgent_pull"},
    "cc": {"budget", "budget_beta", "diagnostic", "insufficient_fraction", "nova_steps", "schedule", "strategy",
           "switch_round", "total_rounds", "window"},
    "fedasmu": {"alpha_min", "dynamic", "epochs", "fetch", "gamma0", "iota0", "lambda0", "lr_gamma", "lr_iota",
                "lr_lambda", "lr_nu", "lr_sigma", "max_concurrency", "mu_alpha", "mu_beta", "nu0",
                "rl_baseline_rate", "rl_hidden", "rl_lr", "sigma0", "slot", "staleness_bound", "trigger_batch",
                "trigger_period"},
}
WHAT_TO_DO = (
    "A config field or algorithm option that enters config_hash renames every run made before it, so a sweep "
    "folder reruns its finished cells and README's promise that names stay the same across versions breaks. "
    "For a new field: add it to jaxfl.config.FIELDS_ADDED with the value that does what runs did before it "
    "existed (usually its default; an option as 'namespace.option'), or to jaxfl.experiment.NAME_LEFT_OUT if "
    "it never changes results. A field removed, renamed or moved to another section renames runs as well. "
    "Only if renaming every run is deliberate: update HASHED / HASHED_OPTIONS in tests/test_run_names.py and say "
    "which runs are renamed in README's run-name paragraph.")


def _hashed_paths(config, monkeypatch) -> set[str]:
    """The paths of the values config_hash hashes for ``config`` (what it hands to canonical_json)."""
    from jaxfl import experiment

    seen = []
    real = experiment.resume.canonical_json
    monkeypatch.setattr(experiment.resume, "canonical_json", lambda values: seen.append(values) or real(values))
    config_hash(config)
    monkeypatch.setattr(experiment.resume, "canonical_json", real)
    (values,) = seen
    return {f"{key}.{name}" if isinstance(value, dict) else key
            for key, value in values.items()
            for name in (value if isinstance(value, dict) else [None])}


def test_the_fields_that_enter_run_names_are_the_frozen_ones(monkeypatch):
    from jaxfl import algorithms

    plain, options = set(), {}
    # jaxfl's own: a plug-in another test of this process registered (the example's agenorm) has its own
    for name in [name for name in algorithms.names() if algorithms.get(name).__module__.startswith("jaxfl.")]:
        paths = _hashed_paths(validate(RunConfig(algorithm=name)), monkeypatch)
        plain |= {path for path in paths if not path.startswith("algorithm_options.")}
        space = algorithms.get(name).option_namespace()
        options.setdefault(space, set()).update(path.partition(".")[2] for path in paths
                                                if path.startswith("algorithm_options."))
    options = {space: names for space, names in options.items() if names}
    added, gone = sorted(plain - HASHED), sorted(HASHED - plain)
    assert not added and not gone, f"run-name hash fields changed: new {added}, gone {gone}. {WHAT_TO_DO}"
    for space in sorted(set(options) | set(HASHED_OPTIONS)):
        new, old = options.get(space, set()), HASHED_OPTIONS.get(space, set())
        assert new == old, (f"run-name hash options of [{space}] changed: new {sorted(new - old)}, "
                            f"gone {sorted(old - new)}. {WHAT_TO_DO}")


def test_the_freeze_catches_a_field_added_without_a_fields_added_entry(monkeypatch):
    # a stand-in for a new RunConfig field: a key config.json would hold that config_hash does not leave out
    real = RunConfig.to_dict
    monkeypatch.setattr(RunConfig, "to_dict", lambda self: {**real(self), "new_field": 1})
    assert "new_field" in _hashed_paths(validate(RunConfig()), monkeypatch) - HASHED
    monkeypatch.setitem(config_module.FIELDS_ADDED, "checkpoint_every", 25)  # left out at its value
    assert "checkpoint_every" not in _hashed_paths(validate(RunConfig()), monkeypatch)


def test_a_float_field_given_as_an_int_names_the_same_run():
    """RunConfig(max_time=3000) was named apart from max_time=3000.0 (the CLI's, a config file's, a
    sweep's spelling): a Python run and a sweep of the same config did not find each other's
    finished runs. (-0.0 stays -0.0, as every spelling has always kept it.)"""
    from jaxfl.experiment import config_hash

    ints = RunConfig(max_time=3000, client_lr=1, latency=0, staleness_alpha=1, checkpoint_min_interval_s=0)
    floats = RunConfig(max_time=3000.0, client_lr=1.0, latency=0.0, staleness_alpha=1.0, checkpoint_min_interval_s=0.0)
    assert config_hash(ints) == config_hash(floats) and ints.to_dict() == floats.to_dict()
    assert type(ints.max_time) is float and type(ints.clients) is int
    assert str(RunConfig(latency=-0.0).latency) == "-0.0"
    # past 2^53 too, where a float equals the int (10^20 was kept an int, named apart from 1e20)
    assert config_hash(RunConfig(max_time=10 ** 20)) == config_hash(RunConfig(max_time=1e20))
    from jaxfl.algorithms import get

    PortOptions = get("port").Options
    assert config_hash(validate(RunConfig(algorithm="port", algorithm_options=PortOptions(staleness_bound=5)))) == \
        config_hash(validate(RunConfig(algorithm="port", algorithm_options={"staleness_bound": 5.0})))


def test_numpy_numbers_in_algorithm_options_and_per_channel_lists_are_plain_numbers():
    """np.int64 in algorithm_options and np.float32 in normalize_mean were refused as "expected a
    number/an integer", where the same types are taken for every top-level field."""
    import numpy as np

    given = validate(RunConfig(algorithm="port", normalize=True, normalize_mean=(np.float32(0.5),),
                               normalize_std=(np.float32(0.25),),
                               algorithm_options={"staleness_bound": np.int64(5), "min_clients": np.int64(2)}))
    plain = validate(RunConfig(algorithm="port", normalize=True, normalize_mean=(0.5,), normalize_std=(0.25,),
                               algorithm_options={"staleness_bound": 5.0, "min_clients": 2}))
    assert given.to_dict() == plain.to_dict() and config_hash(given) == config_hash(plain)


@pytest.mark.parametrize("name", ["", " ", " run", "run ", "a/b", ".", ".."])
def test_a_run_name_that_is_no_plain_folder_name_is_refused(name):
    """" " was accepted: a folder named by one space, and a run's line ending in "→ runs/ "."""
    from jaxfl.config import ConfigError, validate

    with pytest.raises(ConfigError, match=r"run_name=.* is not allowed: a plain folder name without path separators, "
                                          r"not starting or ending in a space"):
        validate(RunConfig(run_name=name))
