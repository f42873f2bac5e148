"""`jaxfl demo` (the README's first command) and what every comparison run writes."""
import csv
import json
import os
import shlex

import pytest

from jaxfl.cli import _configs, build_parser, main
from jaxfl.presets import preset_argv, preset_configs, preset_values
from jaxfl.runlog import read_json, run_jaxfl_code

QUICKSTART_ALGORITHMS = ["fedavg", "fedavgm", "fedasync", "fedbuff", "fedcompass"]


def test_quickstart_is_a_valid_non_iid_heterogeneous_comparison_of_its_algorithms():
    configs = preset_configs("quickstart")
    assert [config.algorithm for config in configs] == QUICKSTART_ALGORITHMS
    # what the demo is for: a label-skewed split and heterogeneous client speeds, a real target
    for config in configs:
        assert config.dataset == "mnist10k" and config.partition == "dirichlet"
        assert config.heterogeneity == "pareto" and config.target_accuracy == 0.85 and config.stop_at_target
    # a paired comparison: the runs differ in the algorithm only (same seed, split, speeds); the
    # FedAsync/FedBuff update rule is given to those two only, as `jaxfl run` does
    settings = [{**config.to_dict(), "algorithm": None, "algorithm_options": None} for config in configs]
    for setting in settings:
        setting["server"]["rule"] = None
    assert all(setting == settings[0] for setting in settings)
    assert [config.rule for config in configs] == [None, None, "paper", "paper", None]


def test_the_printed_command_is_the_quickstart_experiment():
    parsed = _configs(build_parser().parse_args(["run", *preset_argv("quickstart")]))
    assert parsed == preset_configs("quickstart")
    assert preset_argv("quickstart")[:2] == ["--algorithm", ",".join(QUICKSTART_ALGORITHMS)]


def test_demo_prints_its_command_then_runs_it_with_overrides(tmp_path, capsys):
    out = tmp_path / "runs"
    # the schedule of the same five runs, without training (the full demo trains for ~15 s)
    assert main(["demo", "--timing-only", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    header, _, rest = printed.partition("\n\n")
    command = shlex.split(header.split("\n", 1)[1].replace("\\\n", " "))
    assert command == ["jaxfl", "run", *preset_argv("quickstart"), "--timing-only", "--output-dir", str(out)]
    run_dirs = sorted(os.listdir(out))
    assert [name.split("-")[0] for name in run_dirs] == sorted(QUICKSTART_ALGORITHMS)
    for name in run_dirs:
        saved = json.loads((out / name / "config.json").read_text())["config"]
        assert saved["data"]["partition"] == "dirichlet"
        assert saved["data"]["dirichlet_alpha"] == preset_values("quickstart")["dirichlet_alpha"]
        assert saved["client"]["local_steps"] == preset_values("quickstart")["local_steps"]
        assert saved["engine"]["timing_only"] is True
    assert all(f"{algorithm} (timing only)" in rest for algorithm in QUICKSTART_ALGORITHMS)


@pytest.mark.parametrize("chosen", ["fedavg", "fedavg,fedcompass"])
def test_demo_with_algorithms_that_read_none_of_its_settings_leaves_them_out(tmp_path, capsys, chosen):
    # the quickstart's rule (FedAsync's and FedBuff's) refused jaxfl demo --algorithm fedavg with
    # "rule='paper' is not allowed with algorithm fedavg", a setting the user never typed
    out = tmp_path / "runs"
    assert main(["demo", "--algorithm", chosen, "--timing-only", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr()
    assert "jaxfl: note: jaxfl demo: rule of the quickstart not read by the algorithms given, left out" in printed.err
    header = printed.out.partition("\n\n")[0]
    assert "--rule" not in header and f"--algorithm {chosen}" in header
    assert sorted(name.split("-")[0] for name in os.listdir(out)) == sorted(chosen.split(","))
    assert main(["demo", "--algorithm", "fedavg,fedbuff", "--timing-only", "--output-dir", str(tmp_path / "b")]) == 0
    assert "--rule paper" in capsys.readouterr().out  # read by one of them: kept


def test_demo_with_a_bad_override_fails_before_writing(tmp_path, capsys):
    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--clients", "0", "--output-dir", str(out)])
    assert exit_info.value.code == 2
    assert "clients=0" in capsys.readouterr().err
    assert not out.exists()


def test_comparison_writes_table_and_plot_and_prints_where(tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["run", "--algorithm", "fedavg,fedbuff", "--model", "logreg", "--clients", "3", "--local-steps", "2",
                 "--batch-size", "16", "--buffer-size", "2", "--max-updates", "2", "--no-progress",
                 "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    with open(out / "comparison.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["algorithm"] for row in rows] == ["fedavg", "fedbuff"]
    assert all(row["global_updates"] == "2" and os.path.isfile(os.path.join(row["run_dir"], "summary.json"))
               for row in rows)
    assert all(0 < float(row["client_utilisation"]) <= 1 for row in rows)
    # the jaxfl that made each run: a later command reuses the runs this one finished
    for row in rows:
        summary = read_json(os.path.join(row["run_dir"], "summary.json"))
        assert row["jaxfl_code"] == run_jaxfl_code(row["run_dir"], summary) != ""
        assert row["jaxfl_code"].startswith(summary["device_history"][0]["versions"]["jaxfl"])
    plot = out / "comparison.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(plot).shape
    assert width > 400 and height > 300
    assert not list(out.glob("*.tmp*"))  # written atomically
    assert f"table (CSV): {out / 'comparison.csv'}" in printed
    assert f"plot of accuracy over virtual time: {plot}" in printed
    assert all(f"  {row['run_dir']}" in printed for row in rows)
    assert "install matplotlib" not in printed
