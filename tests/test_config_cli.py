"""Validation before any work, the CLI, and the run directory."""
import csv
import json
import math
import os
import re

import pytest

from jaxfl.cli import main
from jaxfl.config import ConfigError, RunConfig, config_from_mapping, validate

BAD_CONFIGS = [
    ({"algorithm": "fedprox2"}, "algorithm='fedprox2' is not allowed: unknown algorithm 'fedprox2'; registered: fedavg"),
    ({"dataset": "cifar100"}, "dataset='cifar100'"),
    ({"model": "resnet"}, "model='resnet'"),
    ({"partition": "shards"}, "partition='shards'"),
    ({"heterogeneity": "lognormal"}, "heterogeneity='lognormal'"),
    ({"clients": 0}, "clients=0.*>= 1"),
    ({"clients": 2.5}, "clients=2.5.*integer"),
    ({"clients": True}, "clients=True.*integer"),
    ({"local_steps": -1}, "local_steps=-1"),
    ({"batch_size": 0}, "batch_size=0"),
    ({"client_lr": 0.0}, "client_lr=0.0.*> 0"),
    ({"client_lr": math.inf}, "client_lr=inf"),
    ({"speed_mean": -0.1}, "speed_mean=-0.1"),
    ({"jitter": -0.01}, "jitter=-0.01"),
    ({"dirichlet_alpha": 0.0}, "dirichlet_alpha=0.0"),
    ({"speed_change_prob": 1.5}, "speed_change_prob=1.5.*probability"),
    ({"target_accuracy": 1.2}, r"target_accuracy=1.2.*\[0, 1\]"),
    ({"target_accuracy": -0.1}, "target_accuracy=-0.1"),
    ({"server_momentum": 1.0}, "server_momentum=1.0"),
    ({"max_time": 0.0}, "max_time=0.0"),
    ({"max_time": math.inf, "stop_at_target": False}, "max_time=inf.*finite time budget"),
    ({"clients_per_round": 11}, "clients_per_round=11.*at most the number of clients"),
    ({"algorithm": "fedasync", "staleness_alpha": 1.5}, "staleness_alpha=1.5.*at most 1 under fedasync's rule paper"),
    ({"algorithm": "fedavgm", "server_optimizer": "adam"}, "server_optimizer='adam'.*fedavgm"),
    ({"server_optimizer": "lamb"}, "server_optimizer='lamb'"),
    ({"client_optimizer": "rmsprop"}, "client_optimizer='rmsprop'"),
    ({"staleness": "cubic"}, "staleness='cubic'"),
    ({"rule": "original"}, "rule='original'"),
    ({"negative_times": "abs"}, "negative_times='abs'"),
    ({"seed": -1}, "seed=-1"),
    ({"eval_every": 0}, "eval_every=0"),
    ({"eval_interval": -5.0}, "eval_interval=-5.0"),
    ({"bandwidth": 0.0}, "bandwidth=0.0"),
    ({"run_name": "a/b"}, "run_name='a/b'"),
    ({"stop_at_target": "yes"}, "stop_at_target='yes'.*true or false"),
    ({"max_updates": 0}, "max_updates=0"),
    ({"staleness_alpha": 0.0}, "staleness_alpha=0.0"),
    ({"lerning_rate": 0.1}, "unknown config field 'lerning_rate'"),
]


@pytest.mark.parametrize("values, message", BAD_CONFIGS)
def test_bad_config_fails_with_named_value_and_writes_nothing(values, message, tmp_path):
    out = tmp_path / "runs"
    with pytest.raises(ConfigError, match=message):
        config_from_mapping({**values, "output_dir": str(out)})
    assert not out.exists()


def test_defaults_are_valid_and_target_resolves_per_dataset():
    assert validate(RunConfig()).target_accuracy == 0.9
    assert validate(RunConfig(dataset="fashion_mnist")).target_accuracy == 0.8
    assert RunConfig(algorithm="fedavgm").momentum == 0.9
    assert RunConfig(algorithm="fedavg").momentum == 0.0


def test_cli_rejects_bad_flags_before_writing(tmp_path, capsys):
    out = tmp_path / "runs"
    for argv in (["run", "--clients", "0"], ["run", "--algorithm", "fedavg,nope"],
                 ["run", "--target-accuracy", "2"], ["run", "--local-steps", "ten"],
                 ["run", "--dataset", "mnist"]):  # mnist needs --data-dir
        with pytest.raises(SystemExit) as exit_info:
            main(argv + ["--output-dir", str(out)])
        assert exit_info.value.code == 2
    assert not out.exists()
    err = capsys.readouterr().err
    assert "clients=0" in err and "'nope'" in err and "target_accuracy=2.0" in err and "'ten'" in err


def test_cli_runs_config_file_and_writes_run_directory(tmp_path, capsys):
    config_file = tmp_path / "exp.toml"
    config_file.write_text('algorithm = "fedbuff"\nmodel = "mlp"\nclients = 3\nlocal-steps = 3\n'
                           'batch_size = 16\nbuffer_size = 2\nmax_updates = 3\n')
    out = tmp_path / "runs"
    assert main(["run", "--config", str(config_file), "--algorithm", "fedavg,fedbuff", "--seed", "2",
                 "--no-progress", "--output-dir", str(out)]) == 0
    runs = sorted(os.listdir(out))
    assert "comparison.csv" in runs
    [name] = [name for name in runs if name.startswith("fedbuff-mnist10k-mlp-iid-exp-c3-q3-lr0.003-s2-")]
    run_dir = out / name
    saved = json.loads((run_dir / "config.json").read_text())["config"]
    assert saved["client"]["local_steps"] == 3 and saved["seed"] == 2 and saved["budget"]["target_accuracy"] == 0.9
    with open(run_dir / "events.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {"dispatch", "arrival", "aggregate"} <= {row["event"] for row in rows}
    assert list(rows[0]) == ["time", "event", "client", "dispatch", "version", "staleness", "steps", "detail",
                             "wall_time"]
    assert all((row["wall_time"] != "") == (row["event"] == "aggregate") for row in rows)
    with open(run_dir / "metrics.csv") as handle:
        metrics = list(csv.DictReader(handle))
    assert [int(m["version"]) for m in metrics] == [0, 1, 2, 3]
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("final_accuracy", "best_accuracy", "time_to_target", "client_steps_executed", "wall_time_s"):
        assert key in summary
    assert "fedavg" in capsys.readouterr().out


def test_eval_interval_stamps_a_virtual_time_grid(small_config):
    from jaxfl.experiment import run_experiment
    from tests.conftest import replace

    result = run_experiment(replace(small_config, algorithm="fedasync", eval_interval=0.5, max_time=3.0,
                                    max_updates=None, stop_at_target=False))
    times = [row["time"] for row in result.metrics]
    assert times == pytest.approx([0.5 * k for k in range(7)])


@pytest.mark.parametrize("name, text, said", [
    ("section.toml", "[clinet]\nlocal_steps = 5\n", "unknown config section [clinet] (did you mean [client]?); sections: "
                                                     "data, speeds, faults, client, server, budget, engine"),
    ("section.json", '{"clients": {"local_steps": 5}}', "unknown config section [clients] (did you mean [client]?)"),
    ("field.toml", "local_step = 5\n", "unknown config field 'local_step' (did you mean local_steps"),
])
def test_a_misspelt_config_table_or_field_is_named_with_the_nearest_names(tmp_path, capsys, name, text, said):
    """A misspelt [clinet] table listed ~90 field names; a JSON "clients" table was "given twice"."""
    (tmp_path / name).write_text(text)
    with pytest.raises(SystemExit) as ended:
        main(["run", "--config", str(tmp_path / name), "--out", str(tmp_path / "runs")])
    assert ended.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_config_file_s_options_table_that_no_chosen_algorithm_reads_is_named_as_the_file_s(tmp_path, capsys):
    (tmp_path / "port.toml").write_text("[port]\nstaleness_bound = 5\n")
    with pytest.raises(SystemExit):
        main(["run", "--config", str(tmp_path / "port.toml"), "--algorithm", "fedavg", "--out", str(tmp_path / "r")])
    assert f"the [port] options of config file '{tmp_path / 'port.toml'}' are given but no chosen algorithm (fedavg) " \
           "reads them (read only by port)" in capsys.readouterr().err


def test_a_comparison_that_replaces_another_s_table_says_so(tmp_path):
    """A second comparison into the same --output-dir (runs, by default) replaced the first one's
    comparison.csv and comparison.png without a word; the same comparison again (its runs reused) does not."""
    common = ["--model", "logreg", "--dataset", "synthetic", "--partition", "natural", "--clients", "4",
              "--local-steps", "2", "--max-updates", "2", "--no-progress", "--output-dir", str(tmp_path)]
    import warnings

    said = []
    for algorithms in ("fedasync,fedat", "fedavg,fedbuff", "fedavg,fedbuff"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main(["run", *common, "--algorithm", algorithms]) == 0
        said.append([str(w.message) for w in caught if "held the comparison" in str(w.message)])
    replaced = (f"{tmp_path}/comparison.csv held the comparison of fedasync,fedat (2 runs), replaced by "
                "this one's, with comparison.png; its runs stay in their folders (give each comparison its own "
                "--output-dir to keep both tables)")
    assert said == [[], [replaced], []], said
    with open(tmp_path / "comparison.csv", newline="") as table:
        assert [row["algorithm"] for row in csv.DictReader(table)] == ["fedavg", "fedbuff"]


def test_a_mapping_that_gives_a_field_flat_and_in_its_section_is_refused_as_a_file_is():
    """In Python the mapping's order decided (clients 5 or 3), where the same TOML is refused."""
    for values, said in (({"clients": 3, "data": {"clients": 5}}, "clients = 3 and [data] clients = 5"),
                         ({"data": {"clients": 5}, "clients": 3}, "[data] clients = 5 and clients = 3"),
                         ({"local-steps": 3, "local_steps": 4}, "local-steps = 3 and local_steps = 4")):
        with pytest.raises(ConfigError, match=rf"is given twice: {re.escape(said)}; give it once"):
            config_from_mapping(values)
    assert config_from_mapping({"data": {"clients": 5}}).clients == 5
