"""`jaxfl run --help` is grouped and every flag has real help; settings a run never reads are
refused (or, for a base config reused across algorithms in Python, warned about) instead of being
silently ignored; the algorithms' `reads` declarations match what their schedules depend on."""
import argparse
import dataclasses
import json
import os
import re
import sys
import warnings

import numpy as np
import pytest

from jaxfl import algorithms
from jaxfl.algorithms import build_policy
from jaxfl.cli import _HELP, _configs, build_parser, field_help, main
from jaxfl.config import (ALGORITHM_FIELDS, FIELDS, SECTION_OF, SECTIONS, ConfigError, RunConfig,
                          fields_not_read_by, validate)
from jaxfl.scheduler.simulation import Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from tests.conftest import RecordingBackend

UNNAMED_GROUPS = ("options", "optional arguments", "positional arguments")


def run_parser() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["run"]


def test_every_flag_has_real_help_and_belongs_to_a_named_group():
    parser = run_parser()
    visible = {action.dest for action in parser._actions if action.help != argparse.SUPPRESS}
    checked = 0
    for group in parser._action_groups:
        for action in group._group_actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.help == argparse.SUPPRESS:  # jaxfl 0.1's spelling of a listed flag
                assert action.dest in visible, f"{action.option_strings} is hidden and has no listed spelling"
                continue
            assert group.title not in UNNAMED_GROUPS, f"{action.option_strings} is in no named group"
            text = re.sub(r"\s*\(default: [^)]*\)$", "", action.help)
            generated = action.dest.rpartition(".")[2].replace("_", " ")
            assert len(text) >= 10 and text != generated, f"{action.option_strings}: help {action.help!r}"
            assert "None" not in action.help and "DEFAULT_" not in action.help, action.help
            checked += 1
    assert checked > 100  # every field and every algorithm's options
    titles = [group.title for group in parser._action_groups]
    for section in ("algorithm", *SECTIONS, "port options (port)", "compass options (fedcompass, fedcompass_m, "
                                                                   "fedcompass_n)"):
        assert any(title.startswith(section) for title in titles), (section, titles)


def test_the_other_commands_have_real_help_too():
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("partition", "timeline", "algorithms", "sweep", "report"):
        for action in commands.choices[name]._actions:
            if not isinstance(action, argparse._HelpAction):
                text = re.sub(r"\s*\(default: [^)]*\)$", "", action.help or "")
                assert len(text) >= 10 and text != action.dest.replace("_", " "), (name, action.option_strings)
                assert "None" not in action.help, (name, action.help)


def test_every_config_field_and_algorithm_option_has_a_help_text():
    """A field added without a trailing comment (or ``metadata={"help": ...}``) fails here."""
    for name in FIELDS:
        if name != "algorithm_options":
            owner = SECTIONS.get(SECTION_OF.get(name), RunConfig)
            assert name in _HELP or field_help(owner, name), f"config field {name} has no help text"
    for name in algorithms.names():
        options = algorithms.get(name).Options
        for field in dataclasses.fields(options):
            assert field_help(options, field.name), f"option {name}.{field.name} has no help text"

    @dataclasses.dataclass
    class Example:
        described: int = 1  # what this is
        by_metadata: int = dataclasses.field(default=2, metadata={"help": "from metadata"})
        bare: int = 3

    assert field_help(Example, "described") == "what this is"
    assert field_help(Example, "by_metadata") == "from metadata"
    assert field_help(Example, "bare") == ""


def test_help_is_plain_text_and_hides_old_spellings(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and ":class:" not in text and "(default: None)" not in text
    assert text.startswith("usage: jaxfl run [--config FILE]")
    assert "--port.staleness-bound" in text and "--port-staleness-bound" not in text
    # the old spelling still works
    args = build_parser().parse_args(["run", "--port-staleness-bound", "5", "--no-compass-lr-decay"])
    assert getattr(args, "port.staleness_bound") == 5.0 and getattr(args, "compass.lr_decay") is False


@pytest.mark.parametrize("argv, message", [
    (["--algorithm", "fedavg", "--buffer-size", "5"], r"buffer_size=5 is not allowed with algorithm fedavg.*fedbuff"),
    (["--algorithm", "fedcompass", "--clients-per-round", "4"], r"clients_per_round=4 .*fedcompass"),
    (["--algorithm", "fedbuff", "--round-timeout", "30"], r"round_timeout=30.0 .*fedbuff"),
    (["--algorithm", "port", "--rule", "paper"], r"rule='paper' .*port"),
    (["--algorithm", "fedavg,port", "--staleness", "constant"], r"staleness='constant' .*none of them"),
    (["--data-dir", "/tmp"], r"data_dir='/tmp' is not allowed: leave it unset.*fashion_mnist"),
    (["--partition", "class", "--dirichlet-alpha", "0.1"], r"dirichlet_alpha=0.1 .*partitions dirichlet"),
    (["--heterogeneity", "exp", "--speed-cap", "60"], r"speed_cap=60.0 .*pareto"),
    (["--delay-factor", "3"], r"delay_factor=3.0 .*delay_prob > 0"),
    (["--eval-interval", "10", "--eval-every", "5"], r"--eval-interval 10.0 and --eval-every 5 are both given"),
])
def test_settings_the_run_never_reads_are_refused_before_anything_is_written(tmp_path, capsys, argv, message):
    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *argv, "--output-dir", str(out), "--no-progress"])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists()


def test_the_same_rule_holds_in_config_files(tmp_path, capsys):
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps({"algorithm": "fedasync", "buffer_size": 4, "client": {"local_steps": 3}}))
    with pytest.raises(SystemExit):
        main(["run", "--config", str(path), "--output-dir", str(tmp_path / "runs")])
    assert "buffer_size=4 is not allowed with algorithm fedasync" in capsys.readouterr().err
    # a field at its default (a full dump of another run's config) is not a setting
    path.write_text(json.dumps({"algorithm": "fedasync", "buffer_size": 3}))
    assert validate(_configs(build_parser().parse_args(["run", "--config", str(path)]))[0]).buffer_size == 3


def test_a_comparison_gives_a_field_to_the_algorithms_that_read_it(capsys):
    fedavg, fedbuff = _configs(build_parser().parse_args(
        ["run", "--algorithm", "fedavg,fedbuff", "--buffer-size", "5", "--clients-per-round", "4"]))
    assert (fedavg.buffer_size, fedbuff.buffer_size) == (3, 5)
    assert fedavg.clients_per_round == fedbuff.clients_per_round == 4  # both read it
    assert "buffer_size=5 applies to fedbuff only (fedavg does not read it)" in capsys.readouterr().err


def test_python_warns_for_an_algorithm_field_and_refuses_an_unread_data_field():
    with pytest.warns(UserWarning, match=r"buffer_size=5 is ignored: fedavg does not read it \(read by fedbuff"):
        validate(RunConfig(algorithm="fedavg", buffer_size=5))
    with pytest.raises(ConfigError, match="shards_per_client=3 is not allowed"):
        validate(RunConfig(partition="iid", shards_per_client=3))
    assert validate(RunConfig(partition="label_shards", shards_per_client=3, clients=20)).shards_per_client == 3
    assert fields_not_read_by(algorithms.get("fedbuff"), {"buffer_size": 5, "round_timeout": 9.0}) == ["round_timeout"]


CHANGED = {"clients_per_round": [2], "buffer_size": [2], "rule": ["paper", "fedcompass"], "staleness": ["constant"],
           "staleness_alpha": [0.4], "staleness_a": [2.0], "round_timeout": [0.5]}


def schedule(algorithm: str, **changes) -> tuple:
    """Events and aggregation coefficients of a short schedule (no training: the policy alone)."""
    config = RunConfig(algorithm=algorithm, clients=4, local_steps=5, heterogeneity="exp", **changes)
    events, backend = [], RecordingBackend()
    speeds = ClientSpeeds(SpeedConfig(model="exp", mean=0.15), 4, seed=0)
    Simulation(build_policy(config), speeds, np.full(4, 0.25), backend, max_time=200.0, max_updates=6,
               log=events.append).run()
    return events, [(a.time, a.mode, tuple((client, round(float(c), 12)) for client, c in a.contributions))
                    for a in backend.aggregations]


@pytest.mark.parametrize("algorithm", algorithms.names())
def test_reads_declarations_match_what_the_schedule_depends_on(algorithm):
    """A field an algorithm says it does not read leaves its schedule and coefficients unchanged
    (refusing it loses nothing); each field it says it reads changes them in some setting."""
    reads = algorithms.get(algorithm).reads
    assert reads is not None and reads <= set(ALGORITHM_FIELDS)
    baseline = schedule(algorithm)
    for name, values in CHANGED.items():
        outcomes = [schedule(algorithm, **{name: value}) for value in values]
        if name not in reads:
            assert all(outcome == baseline for outcome in outcomes), f"{algorithm} reads {name}"
        else:
            assert any(outcome != baseline for outcome in outcomes), f"{algorithm} ignores {name}"


def test_a_run_that_cannot_fit_in_memory_fails_before_writing_anything(tmp_path, capsys):
    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--algorithm", "fedavg", "--model", "mlp", "--clients", "2", "--local-steps", "1",
              "--max-updates", "1", "--memory-limit-mb", "0.01", "--output-dir", str(out), "--no-progress"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "MiB may be used (80% of memory_limit_mb)" in error and "raise memory_limit_mb" in error
    assert "Traceback" not in error and not out.exists()


def test_run_names_tell_configs_apart_and_config_json_records_versions(tmp_path):
    from jaxfl.experiment import run_experiment

    base = RunConfig(algorithm="fedavg", model="mlp", clients=2, local_steps=1, batch_size=8, max_updates=1,
                     timing_only=True, progress=False, output_dir=str(tmp_path))
    first = run_experiment(base).run_dir
    other = run_experiment(dataclasses.replace(base, client=dataclasses.replace(base.client, batch_size=16))).run_dir
    again = run_experiment(base).run_dir
    name = os.path.basename(first)
    assert re.fullmatch(r"fedavg-mnist10k-mlp-iid-exp-c2-q1-lr0.003-s0-[0-9a-f]{6}", name)
    # batch size is not in the readable part, but the config hash tells the runs apart
    assert os.path.basename(other)[:-7] == name[:-7] and other != first and not other.endswith("-2")
    assert again == first + "-2"  # the same config again
    versions = json.loads(open(os.path.join(first, "config.json")).read())["versions"]
    assert set(versions) == {"jaxfl", "jax", "jaxlib", "flax", "optax", "numpy", "python"}
    assert all(isinstance(value, str) and value for value in versions.values())


def _subcommand(name: str) -> argparse.ArgumentParser:
    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def test_model_help_lists_every_registered_model_in_run_and_sweep():
    # the list is made from MODEL_NAMES, the names jaxfl.models.MODELS registers: a model added there is in --help
    # (jaxfl's own: one a test of this worker registered, as a user's script would, is not a built-in)
    import jaxfl.config
    from jaxfl.models import MODELS

    assert tuple(MODELS)[:len(jaxfl.config.MODEL_NAMES)] == jaxfl.config.MODEL_NAMES[:len(MODELS)]
    assert set(MODELS) <= set(jaxfl.config.MODEL_NAMES)
    built_in = [name for name in jaxfl.config.MODEL_NAMES
                if name in MODELS and getattr(MODELS[name], "__module__", "").startswith("jaxfl.")]
    for command in ("run", "sweep"):
        (action,) = [a for a in _subcommand(command)._actions if "--model" in a.option_strings]
        listed = re.findall(r"[a-z0-9_]+", action.help.partition(", or module:object")[0])
        assert listed == built_in, (command, action.help)


def test_resume_help_names_every_flag_a_resume_may_change():
    from jaxfl.resume import BUDGETS, MAY_DIFFER

    (action,) = [a for a in _subcommand("run")._actions if "--resume" in a.option_strings]
    allowed, _, raised = action.help.partition("except ")[2].partition(";")
    named = re.findall(r"--(?!no-)([a-z0-9-]+)", allowed)
    assert named == [name.replace("_", "-") for name in MAY_DIFFER], action.help
    assert "--progress/--no-progress" in allowed
    assert re.findall(r"--([a-z0-9-]+)", raised) == [name.replace("_", "-") for name in BUDGETS] + \
        ["no-stop-at-target"], action.help


def test_an_unknown_flag_gets_the_command_s_usage_and_the_nearest_flag(capsys):
    """Not the top level's usage (``jaxfl [-h] {run,...}``), which says nothing about the flag."""
    from jaxfl import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--max-updatez", "2", "--seedd", "3"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("usage: jaxfl run ")
    assert err.strip().endswith("jaxfl run: error: unrecognized arguments: --max-updatez 2 --seedd 3 (did you mean "
                                "--max-updates for --max-updatez, --seed for --seedd?)")


def test_jaxfl_version_names_the_code_and_its_libraries(capsys):
    # `jaxfl --version` was "the following arguments are required: command"
    import jaxfl
    from jaxfl.cli import main
    from jaxfl.experiment import jaxfl_source

    with pytest.raises(SystemExit) as shown:
        main(["--version"])
    assert shown.value.code == 0
    line = capsys.readouterr().out.strip()
    source = jaxfl_source()
    code = jaxfl.__version__ + (f"+g{source['commit'][:9]}" + ".modified" * source["modified"] if source else "")
    assert line.startswith(f"jaxfl {code} (jax ") and "optax " in line and "python " in line


def test_a_flag_is_read_by_its_whole_name_only(capsys):
    # argparse took --local-step for --local-steps (a config file's local_step is refused)
    with pytest.raises(SystemExit) as refused:
        main(["run", "--local-step", "5", "--max-updates", "1"])
    assert refused.value.code == 2
    assert "unrecognized arguments: --local-step 5 (did you mean --local-steps" in capsys.readouterr().err


def test_a_value_given_to_an_on_off_switch_is_named_as_such(tmp_path, capsys):
    # `--batching true,false` took `true,false` for the sweep file ("config file 'true,false' does not
    # exist"), or, after a sweep file, called it an unrecognized argument
    grid = tmp_path / "grid.toml"
    grid.write_text("[grid]\nseed = [0, 1]\n")
    for argv, switch in ((["sweep", "--out", str(tmp_path / "sweep"), "--batching", "true,false"], "--batching"),
                         (["sweep", str(grid), "--out", str(tmp_path / "sweep"), "--eval-at-start", "true,false"],
                          "--eval-at-start"),
                         (["run", "--output-dir", str(tmp_path / "runs"), "--no-batching", "false"], "--no-batching")):
        with pytest.raises(SystemExit) as refused:
            main(argv)
        said = capsys.readouterr().err
        assert refused.value.code == 2 and f"{switch} takes no value, and {argv[-1]!r} followed it" in said, said
        flag = switch.removeprefix("--no-").removeprefix("--")
        assert f"given as --{flag} or --no-{flag}" in said
        name = flag.replace("-", "_")
        assert (f"list it in a sweep file's [grid] ({name} = [true, false])" in said) == (argv[0] == "sweep")
        assert not (tmp_path / "sweep").exists() and not (tmp_path / "runs").exists()
    # a switch without a --no- form, and one whose word may be the command's own argument
    with pytest.raises(SystemExit):
        main(["run", "--cluster", "true"])
    assert "--cluster takes no value, and 'true' followed it: it is given alone (--cluster)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", "--no-figures", str(tmp_path / "no-sweep")])
    assert "takes no value" not in capsys.readouterr().err
    # the switch as typed: an algorithm's old flat spelling too
    with pytest.raises(SystemExit):
        main(["run", "--algorithm", "fedcompass", "--compass-lr-decay", "true"])
    assert "given as --compass-lr-decay or --no-compass-lr-decay" in capsys.readouterr().err
    # a sweep's word after a switch that is no value is its (missing) sweep file
    with pytest.raises(SystemExit):
        main(["sweep", "--no-progress", "nosuch", "--out", str(tmp_path / "sweep")])
    assert "sweep file 'nosuch' does not exist" in capsys.readouterr().err
    # a sweep file after a switch is no value; a missing one is named plainly
    with pytest.raises(SystemExit):
        main(["sweep", "--no-progress", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "sweep")])
    assert "config file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sweep", "nosuchgrid", "--out", str(tmp_path / "sweep")])
    assert "sweep file 'nosuchgrid' does not exist (a sweep file is a .toml or .json file)" in capsys.readouterr().err


def test_run_help_spells_the_values_a_choice_takes(capsys):
    # the help said "the paper or the reference code" and "T_a (paper) | T_max (code)", where the
    # values are reference_code and t_a / t_max (a review, 2026-12-07)
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "paper | reference_code" in text and "t_a (paper) | T_max: t_max (code)" in text
    assert "--normalize-mean X[,X...]" in text and "stop (the run stops) or skip" in text
    assert "unset: paper for both" in text and ".npy, .csv or .txt file" in text
    assert "0.9 for fedavgm and fedcompass_m" in text


def test_a_sweep_says_each_note_once_not_once_per_cell(tmp_path, recwarn, monkeypatch):
    # a FedASMU grid said its notes in the check before the cells and again in every cell: 33 times for 32
    # cells. A note is the same in every cell; a note that names a cell's values differs, and is said for each
    argv = ["sweep", "--out", str(tmp_path / "sweep"), "--algorithm", "fedasmu", "--seed", "0,1",
            "--model", "logreg", "--clients", "5", "--max-updates", "1", "--local-steps", "2", "--no-progress"]
    warnings.simplefilter("always")  # (pytest's own filter: every warning to the recorder, as to a terminal)
    assert main(argv) == 0
    said = [str(warning.message) for warning in recwarn]
    assert sum("leaves no step for the fetch at slots" in note for note in said) == 1, said
    assert sum("client_optimizer='adam': the server learns" in note for note in said) == 1, said
    # a filter about other warnings leaves it so; the user's "always" (-W, PYTHONWARNINGS) says every cell's
    for options, repeated in ((["ignore::DeprecationWarning"], False), (["always"], True)):
        recwarn.clear()
        monkeypatch.setattr(sys, "warnoptions", options)
        assert main([*argv[:2], str(tmp_path / options[0].partition(":")[0]), *argv[3:]]) == 0
        said = sum("leaves no step for the fetch at slots" in str(warning.message) for warning in recwarn)
        assert (said > 1) == repeated, (options, said)
