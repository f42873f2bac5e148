"""README statements that follow from code are checked against that code, so that they cannot go
stale: the fields left out of run names, the models, the demo's run time, the resume flags."""
import pathlib
import re

from jaxfl.experiment import NAME_LEFT_OUT

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_names_the_fields_left_out_of_run_names_as_the_code_does():
    found = re.search(r"leaving out what never changes results — (.*?) —", README, re.DOTALL)
    assert found, "README's run-name paragraph no longer lists the fields left out of the hash"
    listed = re.findall(r"`(\w+)`", found.group(1))
    assert sorted(listed) == sorted(NAME_LEFT_OUT), (
        f"README lists {listed} as left out of run names; jaxfl.experiment.NAME_LEFT_OUT is {list(NAME_LEFT_OUT)}")


def built_in_model_names() -> tuple:
    """jaxfl.config.MODEL_NAMES as jaxfl defines it: the module's global also grows with what
    register_model adds in this process (other tests, register_model's own doctest)."""
    import ast

    import jaxfl.config

    with open(jaxfl.config.__file__) as handle:
        module = ast.parse(handle.read())
    (value,) = [node.value for node in module.body if isinstance(node, ast.Assign)
                and any(getattr(target, "id", None) == "MODEL_NAMES" for target in node.targets)]
    return ast.literal_eval(value)


def test_readme_model_list_names_every_built_in_model():
    MODEL_NAMES = built_in_model_names()

    found = re.search(r"^- \*\*Models\*\* \(`--model`\):(.*?)(?=^- \*\*)", README, re.DOTALL | re.MULTILINE)
    assert found, "README's Models bullet is gone"
    named = set(re.findall(r"`(\w+)`", found.group(1)))
    assert len(MODEL_NAMES) >= 16
    missing = [name for name in MODEL_NAMES if name not in named]
    assert not missing, f"README's Models bullet does not name {missing} (jaxfl.config.MODEL_NAMES)"


def test_readme_and_jaxfl_help_give_the_demo_the_same_run_time():
    import argparse

    from jaxfl.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    (demo,) = [action.help for action in commands._choices_actions if action.dest == "demo"]
    said = re.search(r"\((about (\d+) s on a 2-core CPU)\)", demo)  # 'about 15 s on a 2-core CPU'
    setup = README[README.index("## Set-up"):README.index("## Quickstart")]
    assert f"({said.group(1)})" in setup, f"jaxfl --help says the demo takes {said.group(1)!r}; README's set-up says otherwise"
    # README's measured time fits the words: 'about N s' is within a factor of 1.5 of the first run's
    measured = float(re.search(r"the whole command took\s+([\d.]+) s", README).group(1))
    assert int(said.group(2)) / 1.5 <= measured <= int(said.group(2)) * 1.5, (said.group(1), measured)


def test_readme_flag_table_gives_these_speed_and_engine_flags_with_their_defaults():
    from jaxfl.config import FIELDS

    table = README[README.index("| flag | meaning (default) |"):README.index("Each run directory, named")]
    for name in ("negative_times", "speed_reference_time", "speed_legacy_seed", "memory_limit_mb",
                 "cpu_friendly_layers", "heterogeneity"):
        assert f"`--{name.replace('_', '-')}`" in table, name
    assert FIELDS["heterogeneity"].default == "exp" and "by default `exp`" in table
    assert FIELDS["negative_times"].default == "redraw" and "`redraw` it (default)" in table
    assert FIELDS["speed_reference_time"].default == 10.0 and "(10.0)" in table


def test_tfds_without_data_dir_says_the_default_folder_does_not_exist_and_logs_no_absl_warning(
        tmp_path, monkeypatch, caplog):
    import logging

    import pytest

    pytest.importorskip("tensorflow_datasets")
    from jaxfl.data import tfds_source

    tfds_source.load_tfds.cache_clear()
    monkeypatch.setattr(tfds_source, "_default_data_dirs", lambda tfds: [str(tmp_path / "tensorflow_datasets")])
    caplog.set_level(logging.WARNING)
    with pytest.raises(FileNotFoundError, match=r"^TFDS dataset 'cifar10' is not prepared: TFDS's default data_dir "
                                                r"\S+tensorflow_datasets does not exist; jaxfl never downloads"):
        tfds_source.load_tfds("cifar10")
    (tmp_path / "tensorflow_datasets").mkdir()
    with pytest.raises(FileNotFoundError, match=r"is not prepared: no folder cifar10 in TFDS's default data_dir"):
        tfds_source.load_tfds("cifar10")
    assert not [record for record in caplog.records if record.name == "absl"]
    # what TFDS logs while a split opens is held back only when the open fails
    with tfds_source._absl_held_unless_it_fails():
        logging.getLogger("absl").warning("kept")
    with pytest.raises(KeyError), tfds_source._absl_held_unless_it_fails():
        logging.getLogger("absl").warning("dropped")
        raise KeyError("splits is empty")
    assert [record.getMessage() for record in caplog.records if record.name == "absl"] == ["kept"]
    tfds_source.load_tfds.cache_clear()


def _summary_table() -> dict[str, str]:
    """README's "What summary.json holds": each key of the first column → its row's text."""
    section = README[README.index("### What summary.json holds"):]
    section = section[:section.index("\n### ")]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 2:
            for key in re.findall(r"`([^`]+)`", cells[0]):
                rows[key] = cells[1]
    return rows


def test_readme_summary_table_names_every_key_a_run_and_a_timing_only_run_write(small_config):
    """Every key of summary.json, and every key of its nested figures (accounting, timeline,
    utilisation, device_memory, device_history), is in README's table, in its parent's row; and the
    table names no key that no run writes."""
    import dataclasses

    from jaxfl.experiment import run_experiment

    trained = run_experiment(small_config).summary
    timing = run_experiment(dataclasses.replace(small_config, timing_only=True, max_updates=20)).summary
    table = _summary_table()
    written = set(trained) | set(timing)
    assert not written - set(table), f"summary.json keys README's table does not describe: {written - set(table)}"
    assert not set(table) - written, f"README's summary table names keys no run wrote: {set(table) - written}"
    nested = {"accounting": trained["accounting"],
              "timeline": {**trained["timeline"], **timing["timeline"], **trained["timeline"]["utilisation"]},
              "device_memory": trained["device_memory"], "device_history": trained["device_history"][0]}
    for parent, figures in nested.items():
        missing = [key for key in figures if f"`{key}`" not in table[parent]]
        assert not missing, f"README's row for {parent} does not name {missing}"
    if trained["backend"] == "cpu":  # the row says: null on a CPU
        assert trained["device_memory"]["backend_peak_bytes"] is None
    # the section's opening: which keys each kind of run writes
    timing_only_keys = {"timing_only", "scheduler_seconds", "events_per_second"}
    keys = list(table)
    schedule = set(keys[:keys.index("timeline") + 1])
    assert set(timing) == schedule | timing_only_keys | {"client_steps_aggregated", "peak_host_memory_mb",
                                                         "peak_host_memory_scope", "wall_time_s", "log_bytes"}
    assert set(trained) == set(table) - timing_only_keys
