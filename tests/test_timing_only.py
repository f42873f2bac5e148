"""Timing-only runs (``timing_only=True``): the schedule without training or a model on a device.

Every golden config (tests/golden, event logs of real training runs) is replayed timing-only and
must give the golden event log byte for byte: for every algorithm whose schedule does not depend on
model values, the timeline equals the training run's."""
import gc
import json
import os

import jax
import pytest

from jaxfl.config import ConfigError, config_from_mapping
from jaxfl.experiment import run_experiment
from jaxfl.testing import events_without_wall_time
from tests.test_golden_runs import BASE, CONFIGS, GOLDEN

MODEL_DEPENDENT = {"fedasmu_adaptive"}  # the Q-learned fetch slot reads losses


def timing_config(name, output_dir, **changes):
    return config_from_mapping({**BASE, **CONFIGS[name], "output_dir": str(output_dir), "run_name": name,
                                "timing_only": True, **changes})


@pytest.mark.parametrize("name", sorted(set(CONFIGS) - MODEL_DEPENDENT))
def test_timing_only_event_log_equals_the_training_runs(tmp_path, name):
    gc.collect()  # arrays earlier tests left for the collector must not count as this run's
    live = len(jax.live_arrays())
    result = run_experiment(timing_config(name, tmp_path))
    with open(os.path.join(GOLDEN, f"{name}.csv")) as old:
        assert events_without_wall_time(result.run_dir) == old.read()
    assert result.engine is None and result.params is None
    gc.collect()
    assert len(jax.live_arrays()) <= live  # no model, no data reached a device
    summary = json.load(open(os.path.join(result.run_dir, "summary.json")))
    assert summary["timing_only"] and summary["global_updates"] == CONFIGS[name].get("max_updates", 5)
    histogram = summary["timeline"]["staleness_histogram"]
    assert sum(histogram.values()) == summary["accounting"]["aggregated"]


def test_a_schedule_that_reads_the_model_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="timing_only=True.*Q-learning on the loss"):
        timing_config("fedasmu_adaptive", tmp_path)


def test_a_timing_only_run_needs_a_budget_it_can_reach(tmp_path):
    with pytest.raises(ConfigError, match="max_time=inf.*timing-only"):
        timing_config("fedbuff", tmp_path, max_updates=None, max_time=float("inf"), stop_at_target=True)


def test_timeline_statistics_add_up(tmp_path):
    result = run_experiment(timing_config("fedavg", tmp_path, max_updates=None, max_time=60.0))
    timeline = result.summary["timeline"]
    clients, end = result.summary["clients"], result.summary["virtual_time"]
    busy = timeline["utilisation"]["mean"] * clients * end
    assert busy + timeline["idle_client_seconds"] == pytest.approx(clients * end, rel=1e-4)
    assert 0 < timeline["utilisation"]["min"] <= timeline["utilisation"]["median"] <= timeline["utilisation"]["max"] <= 1
    assert timeline["aggregations_per_virtual_hour"] == pytest.approx(result.summary["global_updates"] * 3600 / end, rel=1e-3)


def test_a_synthetic_timing_only_run_needs_the_client_sizes_only(tmp_path):
    from jaxfl.experiment import _synthetic_sizes_only, build_data

    sizes = [{"partition": "natural"}, {"partition": "iid"}, {"partition": "iid", "seed": 3},
             {"partition": "iid", "client_sizes": "lognormal", "seed": 1},
             {"partition": "iid", "client_sizes": "powerlaw", "size_skew": 1.5}]
    for dataset in ("synthetic_iid", "synthetic:0.5,0.5"):
        for changes in sizes:
            config = config_from_mapping({"dataset": dataset, "clients": 300, "model": "logreg", "timing_only": True,
                                          **changes})
            _, sizes_only = _synthetic_sizes_only(config)
            _, built = build_data(config)
            assert (sizes_only.counts == built.counts).all(), (dataset, changes)
            assert (sizes_only.weights("samples") == built.weights("samples")).all()
    result = run_experiment(config_from_mapping({**BASE, "dataset": "synthetic_iid", "partition": "natural",
                                                 "model": "logreg", "clients": 20_000, "algorithm": "fedbuff",
                                                 "max_updates": 50, "timing_only": True, "output_dir": str(tmp_path)}))
    assert result.summary["global_updates"] == 50 and result.summary["policy"]["concurrency"] == 1000


@pytest.mark.parametrize("partition", ["natural", "iid"])
def test_a_timing_only_run_of_a_million_synthetic_clients_generates_no_sample(partition, monkeypatch):
    import jaxfl.experiment

    generated = []
    monkeypatch.setattr(jaxfl.experiment, "load_data", lambda config: generated.append(config))
    config = config_from_mapping({"dataset": "synthetic_iid", "partition": partition, "clients": 1_000_000,
                                  "model": "logreg", "timing_only": True})
    _, dataset, federation, _, _ = jaxfl.experiment.prepare(config)
    assert generated == [] and len(dataset.train_x) == 0
    assert federation.num_clients == 1_000_000 and federation.counts.min() >= 1


def test_resuming_a_timing_only_run_says_what_it_is(tmp_path, capsys):
    """``--resume`` of a finished timing-only run said it had no checkpoints/ folder ("deleted, or the
    run was killed") and exited 2; the README promises a finished run's "already finished" and 0.
    An unfinished one (interrupted) is said to keep no checkpoints by design, with how to rerun it."""
    from jaxfl.cli import main

    result = run_experiment(timing_config("fedbuff", tmp_path))
    assert main(["run", "--resume", result.run_dir]) == 0
    assert f"{result.run_dir} has already finished (5 updates" in capsys.readouterr().out
    os.remove(os.path.join(result.run_dir, "summary.json"))
    with pytest.raises(SystemExit) as ended:
        main(["run", "--resume", result.run_dir])
    assert ended.value.code == 2
    said = capsys.readouterr().err
    assert "a timing-only run writes no checkpoints" in said and "deleted" not in said
    command = said.rstrip().rsplit("run its config again: ", 1)[1]
    assert command == f"jaxfl run --config {os.path.join(result.run_dir, 'config.json')}"
    events = events_without_wall_time(result.run_dir)
    assert main(command.split()[1:] + ["--run-name", "again", "--no-progress"]) == 0  # the command said works
    assert events_without_wall_time(os.path.join(tmp_path, "again")) == events


def test_a_training_runs_config_replays_timing_only_from_the_command_line(tmp_path, capsys):
    """`jaxfl run --config RUN/config.json --timing-only` of a run with its own evaluation and
    checkpoint cadence was refused ("eval_every=2 is not allowed"): the file's settings a timing-only
    run does not read are left out with a note, and the schedule is the run's (found 2026-12-05)."""
    from jaxfl import cli

    common = ["--algorithm", "fedbuff", "--model", "logreg", "--clients", "4", "--local-steps", "2",
              "--max-updates", "4", "--no-progress"]
    assert cli.main(["run", *common, "--eval-every", "2", "--checkpoint-every", "2", "--clients-per-call", "2",
                     "--output-dir", str(tmp_path / "trained")]) == 0
    (trained,) = os.listdir(tmp_path / "trained")
    trained = os.path.join(tmp_path, "trained", trained)
    capsys.readouterr()
    assert cli.main(["run", "--config", os.path.join(trained, "config.json"), "--timing-only",
                     "--output-dir", str(tmp_path / "timing")]) == 0
    assert "note: eval_every, checkpoint_every, clients_per_call from the config file" in capsys.readouterr().err
    (timing,) = os.listdir(tmp_path / "timing")
    assert events_without_wall_time(os.path.join(tmp_path, "timing", timing)) == events_without_wall_time(trained)
    with pytest.raises(SystemExit):  # a flag that gives one is still refused: it was asked for
        cli.main(["run", "--config", os.path.join(trained, "config.json"), "--timing-only", "--eval-every", "3",
                  "--output-dir", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()


def test_a_timing_only_runs_config_without_checkpoints_runs_again_under_its_name(tmp_path, capsys):
    """checkpoint_every=None (what a timing-only run does anyway) was left out of a --config file as
    a setting it does not read: the rerun took the default 25 and another run name."""
    from jaxfl import RunConfig, cli

    config = RunConfig(algorithm="fedbuff", model="logreg", clients=4, local_steps=2, max_updates=4,
                       timing_only=True, checkpoint_every=None, progress=False, output_dir=str(tmp_path / "first"))
    first = run_experiment(config)
    capsys.readouterr()
    assert cli.main(["run", "--config", os.path.join(first.run_dir, "config.json"),
                     "--output-dir", str(tmp_path / "again")]) == 0
    assert "checkpoint_every" not in capsys.readouterr().err
    assert os.listdir(tmp_path / "again") == [os.path.basename(first.run_dir)]


def test_a_flag_over_a_runs_config_json_decides_again_what_its_setting_decided(tmp_path, capsys):
    """config.json records what validation filled in: a preset's options, server_lr from the server
    optimiser, the dataset's target. `--config RUN/config.json --compass.preset reference_code` kept
    the paper's λ 1.2 and speed estimate (labelled reference_code), --server-optimizer adam ran at
    sgd's server_lr 1.0, --dataset kept the old dataset's target. A value the flags give stays."""
    from jaxfl import RunConfig, cli

    run = run_experiment(RunConfig(algorithm="fedcompass", dataset="digits", model="logreg", clients=4,
                                   timing_only=True, max_updates=3, progress=False, output_dir=str(tmp_path)))
    saved = os.path.join(run.run_dir, "config.json")

    def configs(*flags):
        return cli._configs(cli.build_parser().parse_args(["run", "--config", saved, *flags]))

    capsys.readouterr()
    (config,) = configs("--compass.preset", "reference_code", "--server-optimizer", "adam",
                        "--dataset", "fashion_mnist")
    options = config.algorithm_options
    assert (options.latest_time_factor, options.speed_estimate, options.lr_decay) == (1.5, "ema", True)
    assert config.server_lr == 0.01 and config.target_accuracy == 0.8
    note = capsys.readouterr().err
    assert "holds values its settings gave, which a flag changes; decided again: server_lr 1.0 (server_optimizer " \
           "'sgd' gave it; --server-lr 1.0 keeps it); target_accuracy 0.9 (dataset 'digits' gave it; " \
           "--target-accuracy 0.9 keeps it); compass.speed_estimate, " in note
    assert "latest_time_factor (compass.preset 'paper' gave them; a --compass.OPTION flag keeps one)" in note
    # a flag that changes nothing decides nothing again, and says nothing
    (config,) = configs("--server-optimizer", "sgd", "--dataset", "digits", "--compass.preset", "paper")
    assert config.server_lr == 1.0 and config.algorithm_options.latest_time_factor == 1.2
    assert "decided again" not in capsys.readouterr().err
    (config,) = configs("--compass.preset", "reference_code", "--compass.lambda", "1.2", "--server-optimizer",
                        "adam", "--server-lr", "1.0")
    assert config.algorithm_options.latest_time_factor == 1.2 and config.server_lr == 1.0
    assert config.algorithm_options.speed_estimate == "ema"
