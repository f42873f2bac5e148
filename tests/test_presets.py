"""Per-paper presets: ``jaxfl run --preset NAME`` and ``jaxfl.presets.preset_config(NAME, **overrides)``."""
import csv
import json
import functools
import math
import warnings

import numpy as np
import pytest

from jaxfl.cli import _configs, build_parser, main
from jaxfl.config import ConfigError
from jaxfl.presets import names, preset_config, preset_configs, preset_for_algorithm

PAPER_ALGORITHM = {"fedcompass": "fedcompass", "port": "port", "ccfedavg": "ccfedavg", "fedasmu": "fedasmu"}
PAPER_PRESETS = [name for name in names() if name != "quickstart"]
CIFAR_PRESETS = [name for name in PAPER_PRESETS if name.endswith("-cifar10")]


@functools.lru_cache(maxsize=1)
def _parser():
    return build_parser()  # seconds on a loaded machine: built once for the module


def _parse(*argv):
    return _configs(_parser().parse_args(["run", *argv]))


def test_every_seed_paper_has_its_presets():
    for required in ("fedcompass-mnist", "fedcompass-cifar10", "port-mnist", "port-cifar10", "ccfedavg-fmnist",
                     "ccfedavg-cifar10", "fedasmu-fmnist", "fedasmu-cifar10"):
        assert required in PAPER_PRESETS


@pytest.mark.parametrize("name", PAPER_PRESETS)
def test_every_preset_loads_validates_and_keeps_every_setting(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no setting of the paper's method is ignored
        config = preset_config(name)
    assert config.algorithm == PAPER_ALGORITHM[name.split("-")[0]]
    assert config.dataset == {"mnist": "mnist10k", "fmnist": "fashion_mnist", "cifar10": "tfds:cifar10"}[
        name.split("-")[1]]
    assert config.target_accuracy is not None
    fields, options, _ = preset_for_algorithm(name, config.algorithm)
    for key, value in fields.items():  # every preset value is in force, none replaced by a default
        got = getattr(config, key)
        if isinstance(got, tuple):  # per-channel statistics: one number reads as one channel
            value = tuple(value) if isinstance(value, list) else (value,)
        assert got == value or (isinstance(value, (int, float)) and math.isclose(got, value)), key
    for key, value in options.items():
        assert getattr(config.algorithm_options, key) == value, key


def test_a_paper_preset_runs_its_baselines_in_the_same_setting():
    method = preset_config("fedcompass-mnist")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fedbuff = preset_config("fedcompass-mnist", algorithm="fedbuff")
        fedavg = preset_config("fedcompass-mnist", algorithm="fedavg")
    assert (fedbuff.buffer_size, fedbuff.rule) == (3, "fedcompass")  # FedCompass's Table 12 baselines
    assert fedavg.rule is None  # a baseline setting FedAvg never reads is left out, not warned about
    for config in (fedbuff, fedavg):
        for section in ("data", "speeds", "client", "budget"):
            assert getattr(config, section) == getattr(method, section)
    # the preset's [compass] table goes to FedCompass only
    assert method.algorithm_options.latest_time_factor == 1.2
    assert preset_for_algorithm("fedcompass-mnist", "fedbuff")[2] == ["[compass] options"]


def test_preset_then_config_file_then_flags(tmp_path):
    experiment = tmp_path / "experiment.toml"
    experiment.write_text('clients = 6\nlocal_steps = 7\n[compass]\nlatest_time_factor = 1.4\n')
    config, = _parse("--preset", "fedcompass-mnist", "--config", str(experiment), "--local-steps", "5",
                     "--compass.latest-time-factor", "1.5")
    assert (config.clients, config.local_steps, config.algorithm_options.latest_time_factor) == (6, 5, 1.5)
    # the rest is the preset's, exactly as in Python with the same overrides
    assert (config.model, config.partition, config.client_lr, config.batch_size) == ("cnn", "class", 0.003, 64)
    assert config == preset_config("fedcompass-mnist", clients=6, local_steps=5,
                                   algorithm_options={"latest_time_factor": 1.5})
    assert config.algorithm_options.q_max is None  # so Q_max follows --local-steps (Table 9: Q = Q_max)


def test_flags_still_refuse_what_the_chosen_algorithm_never_reads():
    with pytest.raises(ConfigError, match="buffer_size=7 is not allowed with algorithm fedcompass"):
        _parse("--preset", "fedcompass-mnist", "--buffer-size", "7")
    with pytest.raises(ConfigError, match="options --port.* are given but no chosen algorithm"):
        _parse("--preset", "fedcompass-mnist", "--port.min-clients", "2")


def test_a_preset_comparison_gives_each_algorithm_its_own_settings(capsys):
    configs = _parse("--preset", "fedcompass-mnist", "--algorithm", "fedcompass,fedbuff,fedavg")
    assert [config.algorithm for config in configs] == ["fedcompass", "fedbuff", "fedavg"]
    assert [config.rule for config in configs] == [None, "fedcompass", None]
    assert "preset fedcompass-mnist: rule, [compass] options not read by fedavg, left out" in capsys.readouterr().err


def test_the_quickstart_preset_is_the_demo():
    assert _parse("--preset", "quickstart") == preset_configs("quickstart")


def test_the_demo_s_own_flags_replace_the_preset_s_and_draw_no_note(capsys):
    """``jaxfl demo --clients 4`` ran `jaxfl run` with the preset's ``--clients 10`` and then the user's,
    so it printed both and noted a flag "given more than once" that the user gave once."""
    from jaxfl.cli import _demo_flags

    flags = _demo_flags(["--clients", "4", "--no-stop-at-target", "--model=logreg"])
    assert flags.count("--clients") == 1 and flags[-4:] == ["--clients", "4", "--no-stop-at-target", "--model=logreg"]
    assert "--model" not in flags and flags[:2] == ["--algorithm", "fedavg,fedavgm,fedasync,fedbuff,fedcompass"]
    # an alternative replaces the preset's setting: --local-epochs beside its --local-steps was refused
    assert "--local-steps" not in _demo_flags(["--local-epochs", "1"]) and "--local-steps" in flags
    with warnings.catch_warnings(record=True) as said, pytest.raises(SystemExit) as exit_info:
        warnings.simplefilter("always")
        main(["demo", "--clients", "4", "--model", "nosuchmodel"])  # stops after the parse, at the model
    assert exit_info.value.code == 2
    assert not [warning for warning in said if "given more than once" in str(warning.message)]
    printed = capsys.readouterr().out
    assert "--clients 4" in printed and "--clients 10" not in printed and "--model mlp" not in printed


def test_an_unknown_preset_is_refused_listing_the_names(tmp_path, capsys):
    with pytest.raises(ConfigError, match="preset='port-mnst' is not allowed: one of ccfedavg-cifar10, .*port-mnist"):
        preset_config("port-mnst")
    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--preset", "port-mnst", "--output-dir", str(out)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "preset='port-mnst' is not allowed" in error and all(name in error for name in names())
    assert not out.exists()


def test_preset_with_resume_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--resume", str(tmp_path), "--preset", "port-mnist"])
    assert exit_info.value.code == 2
    assert "--preset port-mnist is not allowed with --resume" in capsys.readouterr().err


def test_preset_config_takes_one_algorithm():
    with pytest.raises(ConfigError, match="one algorithm"):
        preset_config("quickstart")


@pytest.mark.parametrize("name", CIFAR_PRESETS)
def test_cifar_presets_fail_before_any_work_when_the_data_is_absent(name, tmp_path):
    from jaxfl.experiment import run_experiment

    out = tmp_path / "runs"
    config = preset_config(name, data_dir=str(tmp_path / "no-tfds-here"), output_dir=str(out))
    # the data loader's own message: TFDS data not prepared (or, without tensorflow-datasets, how to install it)
    with pytest.raises((FileNotFoundError, ImportError),
                       match=r"TFDS dataset 'cifar10' is not prepared(.|\n)*jaxfl never downloads|pip install jaxfl\[tfds\]"):
        run_experiment(config)
    assert not out.exists()


def test_port_mnist_runs_shortened_with_plato_round_times(tmp_path):
    out = tmp_path / "runs"
    assert main(["run", "--preset", "port-mnist", "--max-updates", "1", "--port.clients-in-flight", "4",
                 "--port.min-clients", "2", "--no-progress", "--checkpoint-every", "none", "--output-dir", str(out)]) == 0
    run_dir, = out.iterdir()
    with open(run_dir / "events.csv", newline="") as handle:
        arrivals = [row for row in csv.DictReader(handle) if row["event"] == "arrival"]
    assert len(arrivals) == 2  # K = 2 arrivals, one aggregation
    # PLATO's reproducible mode by hand: each of the 100 clients holds 80 images, E = 3 epochs of batch
    # 32 are 3 · ceil(80 / 32) = 9 steps of μ (1 + s_i / 10) with μ = 10/3 s, s_i = min(pareto_i, 30)
    # drawn as PLATO draws them (RandomState(1)); every client started at time 0: E·(T_avg + s_i)
    idle = np.minimum(np.random.RandomState(1).pareto(1.0, 100), 30.0)
    for row in arrivals:
        client = int(row["client"])
        assert float(row["time"]) == pytest.approx(3 * (10.0 + idle[client]))
        assert float(row["time"]) == pytest.approx(9 * 10 / 3 * (1 + idle[client] / 10.0))


def test_a_flag_typed_none_unsets_the_preset_s_value(tmp_path):
    """``--max-updates none`` was parsed to None, argparse's "not given", and the preset's 80 stayed;
    so a preset's local_epochs could not give way to --local-steps from the command line."""
    from jaxfl.cli import main

    common = ["--preset", "port-mnist", "--model", "logreg", "--timing-only", "--no-progress",
              "--out", str(tmp_path)]
    assert main(["run", *common, "--max-updates", "none", "--max-time", "30", "--run-name", "budget"]) == 0
    stored = json.loads((tmp_path / "budget" / "config.json").read_text())["config"]
    assert stored["budget"]["max_updates"] is None and stored["budget"]["max_time"] == 30
    assert main(["run", *common, "--local-epochs", "none", "--local-steps", "10", "--max-updates", "1",
                 "--run-name", "steps"]) == 0
    stored = json.loads((tmp_path / "steps" / "config.json").read_text())["config"]
    assert stored["client"]["local_epochs"] is None and stored["client"]["local_steps"] == 10


def test_a_preset_s_value_a_flag_makes_unread_is_left_out_with_a_note(capsys):
    """`--preset port-mnist --heterogeneity exp`: "speed_legacy_seed=1 is not allowed: leave it unset",
    a value the user never typed; and `--partition iid` was refused over the preset's dirichlet_alpha
    with a hint, "--dirichlet-alpha none unsets it", that argparse then refused too. A preset value a
    flag makes unread is left out, with a note, as the preset's fields another algorithm does not read."""
    (config,) = _configs(build_parser().parse_args(["run", "--preset", "port-mnist", "--heterogeneity", "exp",
                                                    "--timing-only"]))
    assert "preset port-mnist: speed_legacy_seed 1 not read by this run (port, with the flags given), left out" \
        in capsys.readouterr().err
    assert config.heterogeneity == "exp" and config.speed_legacy_seed is None
    (config,) = _configs(build_parser().parse_args(["run", "--preset", "port-mnist", "--partition", "iid"]))
    assert config.partition == "iid" and config.dirichlet_alpha == 0.5
    assert "dirichlet_alpha 5.0 not read by this run" in capsys.readouterr().err
    # a value that is read but refused with the flag: the hint offers "none" only where the field takes it
    with pytest.raises(ConfigError, match=r"client_momentum=0.9 is not allowed.* \(set by --preset port-mnist: give "
                                          r"it another value\)$"):
        _configs(build_parser().parse_args(["run", "--preset", "port-mnist", "--client-optimizer", "adam"]))
    (config,) = _configs(build_parser().parse_args(["run", "--preset", "port-mnist", "--heterogeneity", "exp",
                                                    "--speed-legacy-seed", "none", "--timing-only"]))
    assert config.heterogeneity == "exp" and config.speed_legacy_seed is None
