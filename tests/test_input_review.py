"""Bad input found by fuzzing the command line and the Python API: each is refused before any work in
one line naming the value and what is allowed, or (what cannot be known before the run: a drawn
negative time, the evaluation grid of a run without max_time) stops the run with its logs and a
summary saying why; nothing given is silently dropped."""
import io
import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from jaxfl.cli import main
from test_cli_inputs import _configs, _error  # the one error line of a refused command; parsed configs
from jaxfl.config import MAX_GRID_POINTS, ConfigError, RunConfig, load_config_file, load_config_text, validate

TINY = ["--clients", "4", "--max-updates", "2", "--model", "mlp", "--timing-only", "--no-progress"]
RUN = ["--dataset", "mnist10k", "--model", "mlp", "--clients", "4", "--local-steps", "2", "--max-updates", "2",
       "--no-progress"]




# 1. the evaluation grid: k·interval points, bounded up front (finite max_time) or mid-run (none)

def _recorder(**changes):
    from jaxfl.experiment import _Recorder

    config = RunConfig(max_time=math.inf, **changes)
    stats = {"accuracy": 0.5, "balanced_accuracy": 0.5, "loss": 1.0, "class_accuracy": []}
    return _Recorder(config, lambda params: stats, io.StringIO(), None, 0.0, params={"w": np.zeros(1)})


def test_grid_points_are_multiples_of_the_interval_not_a_drifting_sum():
    recorder = _recorder(eval_interval=0.1)
    recorder.evaluate_grid_until(1.0, 0, inclusive=True)
    times = [row["time"] for row in recorder.rows]
    assert times == [k * 0.1 for k in range(11)] and times[-1] == 1.0  # the sum gave 0.9999999999999999


def test_a_grid_past_its_bound_writes_no_row_and_says_why():
    recorder = _recorder(eval_interval=1e-5)
    stop = recorder.evaluate_grid_until(2.0, 0, inclusive=True)  # 200,001 identical rows before
    assert recorder.rows == [] and stop.startswith("evaluation grid: eval_interval=1e-05")
    assert f"{MAX_GRID_POINTS:,}" in recorder.grid_stop


def test_a_checkpoint_from_before_the_grid_count_goes_on_adding_intervals():
    recorder = _recorder(eval_interval=0.1)
    recorder.evaluate_grid_until(0.25, 0, inclusive=True)
    state = recorder.state_dict()
    assert state["grid_index"] == 3 and state["next_grid"] == 3 * 0.1
    old = {key: value for key, value in state.items() if key != "grid_index"}
    old["next_grid"] = 0.1 + 0.1 + 0.1  # what the older jaxfl kept: its sum
    resumed = _recorder(eval_interval=0.1)
    resumed.load_state_dict(old)
    resumed.evaluate_grid_until(1.0, 0, inclusive=True)
    expected, point = [], old["next_grid"]
    while point <= 1.0:
        expected.append(point)
        point += 0.1
    assert [row["time"] for row in resumed.rows][3:] == expected  # bit for bit as the old code went on
    assert resumed.state_dict()["grid_index"] is None  # and its next checkpoint keeps doing so


@pytest.mark.parametrize("interval", [1e-6, 1e-300, 1e-310])
def test_a_grid_of_too_many_points_is_refused_up_front(interval, tmp_path, capsys):
    err = _error(capsys, ["run", *RUN, "--eval-interval", repr(interval), "--max-time", "1",
                          "--output-dir", str(tmp_path / "runs")])
    assert f"eval_interval={interval!r}" in err and "max_time=1" in err and f"{MAX_GRID_POINTS:,}" in err
    assert not (tmp_path / "runs").exists()


def test_a_run_without_max_time_stops_at_the_grid_bound_with_a_summary(tmp_path):
    from jaxfl.experiment import RunStopped, run_experiment

    config = RunConfig(dataset="mnist10k", model="logreg", clients=4, local_steps=2, max_updates=2, progress=False,
                       max_time=math.inf, eval_interval=1e-300, output_dir=str(tmp_path))
    with pytest.raises(RunStopped, match="eval_interval=1e-300"):
        run_experiment(config)
    run_dir, = [os.path.join(tmp_path, name) for name in os.listdir(tmp_path)]
    with open(os.path.join(run_dir, "summary.json")) as handle:
        assert json.load(handle)["stop_reason"].startswith("evaluation grid: eval_interval=1e-300")
    with open(os.path.join(run_dir, "metrics.csv")) as handle:
        assert len(handle.readlines()) <= 2  # the header and the start's row


# 2. seeds: what a JAX key takes

def test_a_seed_past_what_a_jax_key_takes_is_refused_naming_the_range(tmp_path, capsys):
    validate(RunConfig(seed=2 ** 63 - 1))
    with pytest.raises(ConfigError, match=r"seed=9223372036854775808 is not allowed: an integer in \[0, 2\^63 - 1\]"):
        validate(RunConfig(seed=2 ** 63))
    assert "seed=99999999999999999999" in _error(capsys, ["partition", "--seed", "99999999999999999999",
                                                          "--out", str(tmp_path / "p")])
    assert not (tmp_path / "p").exists()


# 3. duplicate keys in a JSON file

def test_a_json_key_given_twice_is_refused_naming_both_values(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"key 'clients' is given twice \(4, then 5\)"):
        load_config_text('{"clients": 4, "clients": 5}', ".json")
    with pytest.raises(ConfigError, match="key 'seed' is given twice"):
        load_config_text('{"data": {"clients": 4}, "seed": 1, "seed": 1}', ".json")
    (tmp_path / "c.json").write_text('{"clients": 4, "clients": 5}')
    assert "given twice" in _error(capsys, ["run", "--config", str(tmp_path / "c.json"), "--timing-only",
                                            "--output-dir", str(tmp_path / "runs")])


# 4. size_skew where the drawn sizes overflow

def test_size_skew_that_overflows_the_sizes_is_refused_naming_it():
    from jaxfl.data.partition import client_sizes

    for sizes, skew, allowed in [("powerlaw", 0.001, ">= 0.1"), ("lognormal", 1000.0, "(0, 100]")]:
        with pytest.raises(ConfigError) as refused:
            validate(RunConfig(client_sizes=sizes, size_skew=skew))
        assert f"size_skew={skew!r} is not allowed: " in str(refused.value) and allowed in str(refused.value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning first
        with pytest.raises(ValueError, match="skew=0.001 drew powerlaw client sizes that overflow"):
            client_sizes(10_000, 50, "powerlaw", np.random.default_rng(0), 0.001)
    validate(RunConfig(client_sizes="powerlaw", size_skew=0.1))


# 5. a negative time drawn under negative_times error

@pytest.mark.parametrize("mode", [[], ["--timing-only"]])
def test_a_negative_time_drawn_mid_run_stops_it_with_a_summary_naming_negative_times(tmp_path, capsys, mode):
    """A timing-only run (the cheap check of a speed model) stopped with status 2, a bare
    NegativeTimeError and no summary.json."""
    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *RUN, *mode, "--heterogeneity", "normal", "--jitter", "1e6", "--negative-times", "error",
              "--output-dir", str(out)])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "jaxfl: run stopped: " in err and "negative_times (--negative-times) is 'error'" in err
    assert "redraw, clip, error" in err and "SpeedConfig" not in err
    run_dir, = [out / name for name in os.listdir(out)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"].startswith("negative time: non-positive time per step")


# 6. alternative settings both given

@pytest.mark.parametrize("argv, names", [
    (["--local-epochs", "1", "--local-steps", "5", "--algorithm", "fedavg"], ("--local-epochs 1.0", "--local-steps 5")),
    (["--eval-every", "1", "--eval-interval", "5"], ("--eval-interval 5.0", "--eval-every 1")),
])
def test_two_alternative_flags_are_refused_even_at_a_default(argv, names):
    with pytest.raises(ConfigError) as refused:
        _configs(argv)
    assert all(name in str(refused.value) for name in names) and "give only one" in str(refused.value)


def test_two_alternative_flags_are_refused_in_a_sweep_too(tmp_path, capsys):
    err = _error(capsys, ["sweep", "--local-epochs", "1", "--local-steps", "5", "--algorithm", "fedavg",
                          "--out", str(tmp_path / "sw")])
    assert "--local-epochs '1' and --local-steps '5' are both given" in err
    assert not (tmp_path / "sw").exists()


def test_alternatives_in_a_config_file_are_refused_but_a_saved_config_is_read(tmp_path):
    (tmp_path / "a.toml").write_text('algorithm = "fedavg"\nlocal_epochs = 1\nlocal_steps = 5\n')
    with pytest.raises(ConfigError, match="local_epochs = 1 in config file .* and local_steps = 5 in config file"):
        _configs(["--config", str(tmp_path / "a.toml")])
    (tmp_path / "b.toml").write_text("eval_every = 1\n")
    with pytest.raises(ConfigError, match="--eval-interval 5.0 and eval_every = 1 in config file"):
        _configs(["--config", str(tmp_path / "b.toml"), "--eval-interval", "5"])
    saved = {**RunConfig(algorithm="fedavg", local_epochs=2.0).to_dict()}  # both, as config.json keeps them
    (tmp_path / "saved.json").write_text(json.dumps(saved))
    config, = _configs(["--config", str(tmp_path / "saved.json")])
    assert config.local_epochs == 2.0


# 7. smaller ones

def test_an_empty_output_dir_is_refused():
    with pytest.raises(ConfigError, match="output_dir='' is not allowed: a folder's path"):
        validate(RunConfig(output_dir=""))


def test_partition_max_rows_below_one_is_refused_and_one_shows_a_row(tmp_path, capsys):
    from jaxfl.data.report import PartitionReport

    for rows in ("0", "-1"):
        with pytest.raises(SystemExit) as exit_info:
            main(["partition", "--max-rows", rows, "--out", str(tmp_path / "p")])
        assert exit_info.value.code == 2 and f"'{rows}' is not allowed: an integer >= 1" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
    report = PartitionReport(np.array([[3, 0], [1, 2], [2, 2]]))
    with pytest.raises(ValueError, match="max_rows=0 is not allowed"):
        report.table(0)
    lines = report.table(1).splitlines()
    assert lines[1].split()[0] == "0" and lines[2].strip() == "..."


def test_a_batch_larger_than_every_client_is_said_up_front(tmp_path):
    from jaxfl.experiment import prepare

    with pytest.warns(UserWarning, match="batch_size=100000 is larger than the largest client's 2000 samples"):
        prepare(RunConfig(dataset="mnist10k", model="logreg", clients=4, batch_size=100_000))


def test_time_per_step_files_that_are_not_numbers_are_refused_plainly(tmp_path):
    from jaxfl.user_inputs import load_time_per_step

    np.save(tmp_path / "b.npy", np.array([True, False]))
    np.save(tmp_path / "s.npy", np.array(["1", "2"]))
    (tmp_path / "g.npy").write_bytes(b"not an array at all")
    os.mkdir(tmp_path / "d.npy")
    for name, said in [("b.npy", "dtype bool, not numbers"), ("s.npy", "dtype <U1, not numbers"),
                       ("g.npy", "no .npy header"), ("d.npy", "is a directory")]:
        with pytest.raises(ValueError) as refused:
            load_time_per_step(str(tmp_path / name))
        assert said in str(refused.value) and "allow_pickle" not in str(refused.value)
    os.mkdir(tmp_path / "c.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config_file(str(tmp_path / "c.toml"))


@pytest.mark.parametrize("given, said", [({"clients": 4}, "got a dict"), (None, "got None")])
def test_run_experiment_names_what_it_was_given(given, said):
    from jaxfl.experiment import run_experiment

    with pytest.raises(TypeError, match=f"run_experiment takes a RunConfig, {said}.*config_from_mapping"):
        run_experiment(given)


def test_numpy_numbers_are_taken_where_numbers_are():
    config = validate(RunConfig(clients=np.int64(4), client_lr=np.float32(0.5)))
    assert config.clients == 4 and type(config.clients) is int and type(config.client_lr) is float


def test_a_warning_before_a_refusal_is_one_note_line(tmp_path):
    # a user's model (a module:object reference) that only tracing finds unfit for data whose shape
    # only the data tells (an npz file): refused after the data is read, when its notes have been said
    rng = np.random.default_rng(0)
    features = rng.normal(size=(40, 60)).astype(np.float32)
    np.savez(tmp_path / "features.npz", x_train=features, y_train=np.arange(40) % 10, x_test=features[:10],
             y_test=np.arange(10))
    (tmp_path / "images_only.py").write_text(
        "import flax.linen as nn\n"
        "class Net(nn.Module):\n"
        "    num_classes: int = 10\n"
        "    @nn.compact\n"
        "    def __call__(self, x):\n"
        "        return nn.Dense(self.num_classes)(nn.Conv(4, (3, 3))(x).reshape((x.shape[0], -1)))\n")
    done = subprocess.run([sys.executable, "-m", "jaxfl", "run", "--dataset", "npz", "--data-dir",
                           str(tmp_path / "features.npz"), "--model", "images_only:Net", "--clients", "4",
                           "--max-updates", "1", "--batch-size", "8", "--no-progress",
                           "--output-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert "jaxfl: note: dataset 'npz' has no default target accuracy" in lines[0], done.stderr
    assert lines[-1].startswith("jaxfl: error: model 'images_only:Net' cannot take") and len(lines) == 2, done.stderr
    assert "UserWarning" not in done.stderr and "warnings.warn" not in done.stderr
