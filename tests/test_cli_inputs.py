"""Bad or ambiguous command-line input: a one-line ``jaxfl: error:`` naming the value and what is
allowed, before any work and without partial output; flags that win over a --config file however it
spells a setting; sweep lists of synthetic:A,B data sets; timing-only sweeps' lines and reports."""
import csv
import json
import os
import shutil

import pytest

from jaxfl import cli
from jaxfl.cli import main
from jaxfl.config import ConfigError
from jaxfl.report import is_timing_only, make_report
from jaxfl.sweep import Cell, _finished_line, load_sweep_file, run_sweep

TINY = ["--clients", "4", "--max-updates", "2", "--model", "mlp", "--timing-only", "--no-progress"]


def _error(capsys, argv) -> str:
    """The one error line of a refused command (status 2, no traceback)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxfl: error: ") and "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def _configs(argv):
    return cli._configs(cli.build_parser().parse_args(["run", *argv]))


# 1. --config: flags win however the file spells a field; a field given twice is refused

def test_a_flag_wins_over_a_section_field_of_the_config_file(tmp_path):
    (tmp_path / "a.toml").write_text("seed = 2\n[data]\nclients = 5\n[port]\nstaleness_bound = 4\n")
    config, = _configs(["--config", str(tmp_path / "a.toml"), "--clients", "3", "--algorithm", "port",
                        "--port.staleness-bound", "7"])
    assert (config.clients, config.seed, config.algorithm_options.staleness_bound) == (3, 2, 7)
    config, = _configs(["--config", str(tmp_path / "a.toml"), "--algorithm", "port"])
    assert (config.clients, config.algorithm_options.staleness_bound) == (5, 4)


def test_a_config_file_giving_a_field_twice_is_refused_naming_both(tmp_path, capsys):
    (tmp_path / "k8.toml").write_text("clients = 4\n[data]\nclients = 5\n")
    out = tmp_path / "runs"
    err = _error(capsys, ["run", "--config", str(tmp_path / "k8.toml"), *TINY, "--clients", "3",
                          "--output-dir", str(out)])
    assert "gives clients twice: clients = 4 and [data] clients = 5; give it once" in err
    assert not out.exists()
    (tmp_path / "opt.toml").write_text('algorithm = "port"\n"port.staleness_bound" = 3\n[port]\nstaleness_bound = 4\n')
    with pytest.raises(ConfigError, match=r"port.staleness_bound twice: port.staleness_bound = 3 and "
                                          r"\[port\] staleness_bound = 4"):
        _configs(["--config", str(tmp_path / "opt.toml")])
    # the same value twice is not a conflict
    (tmp_path / "same.toml").write_text("clients = 5\n[data]\nclients = 5\n")
    assert _configs(["--config", str(tmp_path / "same.toml"), "--clients", "3"])[0].clients == 3


def test_the_reported_run_takes_the_flag_over_both_spellings_of_the_file(tmp_path, capsys):
    (tmp_path / "k.toml").write_text("[data]\nclients = 5\n")
    assert main(["run", "--config", str(tmp_path / "k.toml"), *TINY, "--clients", "3",
                 "--output-dir", str(tmp_path / "runs")]) == 0
    run_dir, = os.listdir(tmp_path / "runs")
    with open(tmp_path / "runs" / run_dir / "summary.json") as handle:
        assert json.load(handle)["clients"] == 3


def test_a_sweep_file_giving_a_field_twice_is_refused(tmp_path):
    (tmp_path / "s.toml").write_text("clients = 4\n[data]\nclients = 5\n[grid]\nseed = [0]\n")
    with pytest.raises(ConfigError, match=r"gives clients twice: clients = 4 and \[data\] clients = 5"):
        load_sweep_file(str(tmp_path / "s.toml"))


# 2. sweep --dataset synthetic:A,B

def _sweep_values(argv):
    return cli._sweep_values(cli.build_parser().parse_args(["sweep", "--out", "x", *argv]))


def test_a_synthetic_dataset_s_comma_is_its_own_in_a_sweep_list():
    base, grid = _sweep_values(["--dataset", "synthetic:0.5,0.5"])
    assert base["dataset"] == "synthetic:0.5,0.5" and "dataset" not in grid
    base, grid = _sweep_values(["--dataset", "synthetic:0.5,0.5,mnist10k,synthetic:1,1+parallel,synthetic_iid"])
    assert grid["dataset"] == ["synthetic:0.5,0.5", "mnist10k", "synthetic:1,1+parallel", "synthetic_iid"]
    assert _sweep_values(["--clients", "4,5"])[1]["clients"] == [4, 5]


def test_the_documented_synthetic_sweep_runs(tmp_path, capsys):
    out = str(tmp_path / "x")
    assert main(["sweep", "--dataset", "synthetic:0.5,0.5", "--model", "logreg", "--clients", "4",
                 "--max-updates", "2", "--timing-only", "--no-progress", "--out", out]) == 0
    with open(os.path.join(out, "results.csv"), newline="") as handle:
        assert [row["dataset"] for row in csv.DictReader(handle)] == ["synthetic:0.5,0.5"]


# 3. the sweep's help names the run flags it has not

def test_sweep_help_names_the_run_flags_it_does_not_take(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--config", "--preset", "--resume", "--log-to", "--output-dir", "--run-name"):
        assert flag in text.partition("positional arguments")[0], flag
    assert "--time-per-step FILE gives every cell the same measured speeds" in text  # a sweep flag since
    assert "every jaxfl run flag of a config field or algorithm option takes a comma-separated list" in text
    assert "synthetic:A,B keeps its comma" in text
    # the short spellings of jaxfl run take lists here too
    assert _sweep_values(["--lr", "0.1,0.2", "--steps", "3"]) == ({"local_steps": 3}, {"client_lr": [0.1, 0.2]})


def test_a_negative_value_argparse_takes_for_a_flag_reaches_the_check_naming_what_is_allowed(tmp_path, capsys):
    """argparse reads ``-inf``, ``-1e3`` or a sweep's ``-1,2`` after a flag as another flag ("expected
    one argument"); jaxfl hands them to the value's check."""
    assert _error(capsys, ["run", "--max-time", "-inf", *TINY]) == \
        "jaxfl: error: max_time=-inf is not allowed: virtual seconds > 0 (inf for no time budget)"
    assert _error(capsys, ["run", "--speed-mean", "-1e3", *TINY]).startswith(
        "jaxfl: error: speed_mean=-1000.0 is not allowed")
    assert "seed=-1 is not allowed" in _error(capsys, ["sweep", "--seed", "-1,2", *TINY, "--out", str(tmp_path / "s")])
    assert not (tmp_path / "s").exists()
    with pytest.raises(SystemExit):  # a flag without its value is still told so
        main(["run", "--max-time", "--max-updates", "2"])
    assert "argument --max-time: expected one argument" in capsys.readouterr().err


def test_speeds_in_a_config_or_sweep_file_say_where_they_go(tmp_path, capsys):
    file = tmp_path / "study.toml"
    file.write_text('time_per_step = "speeds.npy"\n[grid]\nalgorithm = ["fedavg"]\n')
    assert _error(capsys, ["sweep", str(file), "--out", str(tmp_path / "s")]).endswith(
        "time_per_step is not a config field: give the speeds file with --time-per-step FILE (jaxfl run, jaxfl sweep) "
        "or the array as time_per_step=... (run_experiment, run_sweep)")
    file.write_text('time_per_step = "speeds.npy"\n')
    assert "time_per_step is not a config field: give the speeds file with --time-per-step FILE" in \
        _error(capsys, ["run", "--config", str(file)])
    assert not (tmp_path / "s").exists()


# 4. output paths and bad tables: an error line before any work

def test_an_output_path_that_is_a_file_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("")
    import jaxfl.experiment

    def no_work(*args, **kwargs):
        raise AssertionError("built data before refusing the output folder")

    monkeypatch.setattr(jaxfl.experiment, "check_buildable", no_work)
    monkeypatch.setattr(jaxfl.experiment, "run_experiment", no_work)
    for path in (str(afile), str(afile / "sub")):
        err = _error(capsys, ["run", *TINY, "--output-dir", path])
        assert f"--output-dir={path!r} is not allowed: {str(afile)!r} is a file, not a folder" in err
        err = _error(capsys, ["sweep", "--clients", "4", "--max-updates", "2", "--timing-only", "--out", path])
        assert f"--out={path!r} is not allowed: {str(afile)!r} is a file, not a folder" in err
    err = _error(capsys, ["partition", "--clients", "4", "--out", str(afile)])
    assert "is a file, not a folder" in err
    (tmp_path / "conf.toml").write_text(f"output_dir = {str(afile)!r}\n")
    assert "output_dir=" in _error(capsys, ["run", "--config", str(tmp_path / "conf.toml"), *TINY])
    assert afile.read_text() == ""


@pytest.fixture(scope="module")
def timing_sweep(tmp_path_factory):
    """The timing-only sweep of the report's bug: two methods, two seeds, nothing evaluated."""
    folder = str(tmp_path_factory.mktemp("timing") / "swt")
    return run_sweep({"timing_only": True, "model": "mlp", "clients": 4, "local_steps": 2, "max_updates": 5},
                     {"seed": [0, 1], "algorithm": ["fedavg", "fedbuff"]}, folder, progress=False)


def test_report_and_timeline_output_paths(timing_sweep, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    err = _error(capsys, ["report", timing_sweep.sweep_dir, "--out", str(afile)])
    assert f"--out={str(afile)!r} is not allowed: {str(afile)!r} is a file, not a folder" in err
    with pytest.raises(ValueError, match="is a file; give a folder"):
        make_report(timing_sweep.sweep_dir, out=str(afile / "sub"), figures=False)
    run_dir = os.path.join(timing_sweep.sweep_dir, timing_sweep.rows[0]["run_dir"])
    made = tmp_path / "nodir" / "deeper" / "tl.png"  # a missing folder is made, as run and sweep make theirs
    assert main(["timeline", run_dir, "--out", str(made)]) == 0 and made.is_file()
    assert not list(made.parent.glob("*.tmp.png"))
    err = _error(capsys, ["timeline", run_dir, "--out", str(afile / "tl.png")])
    assert "is a file, not a folder" in err
    assert "a PNG file's path, ending in .png" in _error(capsys, ["timeline", run_dir, "--out", str(tmp_path)])
    assert "a PNG file's path" in _error(capsys, ["timeline", run_dir, "--out", str(tmp_path / "tl.jpg")])


def test_a_csv_without_jaxfl_s_columns_is_refused_naming_them(tmp_path, capsys):
    table = tmp_path / "x.csv"
    table.write_text("algorithm,seed,accuracy\nfedavg,0,0.9\n")
    err = _error(capsys, ["report", str(table), "--no-figures"])
    assert "it has no time_to_target, best_accuracy columns (its columns: algorithm, seed, accuracy)" in err
    assert not (tmp_path / "x-report").exists()
    table.write_text("algorithm,seed,time_to_target,best_accuracy\nfedavg,0,,0.9\n")
    assert "has no run_dir column: the figures need the runs" in _error(capsys, ["report", str(table)])
    assert main(["report", str(table), "--no-figures"]) == 0


def test_a_size_that_is_not_a_table_is_refused_naming_it(tmp_path, capsys):
    (tmp_path / "s.toml").write_text("[grid]\nseed = [0]\n[sizes]\nquick = 3\n")
    err = _error(capsys, ["sweep", str(tmp_path / "s.toml"), "--size", "quick", "--out", str(tmp_path / "o")])
    assert "[sizes] quick = 3 is not allowed: each size is a table of overrides, [sizes.quick]" in err
    (tmp_path / "g.toml").write_text("[sizes.quick]\nmax_updates = 2\ngrid = 3\n")
    with pytest.raises(ConfigError, match=r"\[sizes.quick\] grid = 3 is not allowed"):
        load_sweep_file(str(tmp_path / "g.toml"), "quick")
    assert not (tmp_path / "o").exists()


# 5. timing-only sweeps: their lines and their report

def test_a_timing_only_cell_s_line_gives_its_schedule_not_an_accuracy(timing_sweep):
    with open(os.path.join(timing_sweep.sweep_dir, timing_sweep.rows[1]["run_dir"], "summary.json")) as handle:
        summary = json.load(handle)
    line = _finished_line(timing_sweep.cells[1], summary, "new")
    assert line.startswith("cell 1 (seed=0 algorithm=fedbuff): timing only: 5 updates in ")
    assert "virtual s, mean staleness " in line and "accuracy" not in line and line.endswith("stop: update budget")
    trained = _finished_line(Cell(0, {}, timing_sweep.cells[0].config, "x"),
                             {"best_accuracy": 0.5, "time_to_target": None, "stop_reason": "update budget"}, "resumable")
    assert trained == "cell 0 (the base config): best accuracy 0.5000, target not reached, stop: update budget [resumed]"


def test_a_timing_only_report_tables_the_schedule_and_draws_no_accuracy(timing_sweep, tmp_path, capsys):
    assert main(["report", timing_sweep.sweep_dir, "--reference", "fedavg", "--out", str(tmp_path / "r")]) == 0
    printed = capsys.readouterr().out
    assert "Time to first reach" not in printed and "accuracy, mean" not in printed and "–" not in printed
    assert "## Timing-only runs: the schedule, mean ± std over seeds" in printed
    assert "| method | runs | virtual time (s) | global updates | client updates | client steps aggregated | client utilisation " \
           "| mean staleness | wall time (s) | stop |" in printed
    assert "| fedavg | 2 | " in printed and "| fedbuff | 2 | " in printed and " 5 ± 0 " in printed
    # a timing-only run trains nothing: its row's executed steps were its aggregated ones, under that name
    assert all(row["client_steps_executed"] is None and row["client_steps_aggregated"] > 0 for row in timing_sweep.rows)
    assert sorted(os.listdir(tmp_path / "r")) == ["report.csv", "report.md", "staleness.png", "timeline-fedavg.png",
                                                  "timeline-fedbuff.png"]
    with open(tmp_path / "r" / "report.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["method"], row["runs"], row["timing_only"], row["global_updates_mean"]) for row in rows] == [
        ("fedavg", "2", "True", "5.0"), ("fedbuff", "2", "True", "5.0")]
    assert "time_to_target_mean" not in rows[0]
    assert "reference='fedprox' is not allowed" in _error(capsys, ["report", timing_sweep.sweep_dir, "--reference",
                                                                   "fedprox", "--out", str(tmp_path / "never")])
    assert "the runs are timing-only" in _error(capsys, ["report", timing_sweep.sweep_dir, "--panels", "seed",
                                                         "--out", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()


def test_a_timing_only_results_table_alone_is_told_apart_by_its_missing_accuracies(timing_sweep, tmp_path):
    kept = tmp_path / "kept.csv"
    shutil.copy(os.path.join(timing_sweep.sweep_dir, "results.csv"), kept)  # the runs are not beside it
    report = make_report(str(kept), figures="table")
    assert report.figures == [] and "## Timing-only runs" in report.markdown
    # a swept timing_only column says it, whatever the accuracies
    assert is_timing_only({"timing_only": False, "best_accuracy": None}) is False
    assert is_timing_only({"timing_only": True, "best_accuracy": None}) is True


def test_panels_with_no_figures_is_refused(timing_sweep, tmp_path, capsys):
    err = _error(capsys, ["report", timing_sweep.sweep_dir, "--panels", "buffer_size", "--no-figures",
                          "--out", str(tmp_path / "never")])
    assert "--panels buffer_size is not allowed with --no-figures" in err


def test_a_sweep_of_timing_only_and_trained_runs_reports_each_its_own_way(tmp_path):
    folder = str(tmp_path / "mixed")
    result = run_sweep({"model": "mlp", "clients": 4, "local_steps": 2, "max_updates": 2, "target_accuracy": 0.2,
                        "batch_size": 16}, {"timing_only": [True, False]}, folder, progress=False)
    assert [row["timing_only"] for row in result.rows] == [True, False]
    report = make_report(folder, reference="fedbuff")
    assert "## Time to first reach 20% held-out accuracy" in report.markdown
    assert "## Timing-only runs: the schedule, mean ± std over seeds (the tables above are of the other runs)" \
           in report.markdown
    names = sorted(os.path.basename(path) for path in report.figures)
    assert "time_to_target.png" in names and "staleness.png" in names and "accuracy.png" in names
    assert [line.get("timing_only", False) for line in report.rows] == [False, True]


def test_a_setting_given_twice_with_other_values_is_noted_and_the_last_is_used(tmp_path, capsys):
    """``--clients 10 ... --clients 20`` (a wrapper script's flags, then the user's own) ran with 20
    and said nothing of the 10; the same value twice, or a flag meant to repeat, draws no note."""
    import warnings

    out = str(tmp_path / "runs")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert main(["run", *TINY, "--clients", "6", "--output-dir", out, "--progress", "--no-progress",
                     "--client-lr", "0.5", "--client-lr=.5"]) == 0
    notes = [str(warning.message) for warning in said if "given more than once" in str(warning.message)]
    assert notes == ["--clients 4, then --clients 6: a setting given more than once takes its last value (--clients 6)",
                     "--no-progress, then --progress, then --no-progress: a setting given more than once takes its "
                     "last value "
                     "(--no-progress)"]
    (run,) = os.listdir(out)
    with open(os.path.join(out, run, "config.json")) as handle:
        assert json.load(handle)["config"]["data"]["clients"] == 6
    for argv in (["algorithms", "--algorithm", "a.py:A", "--algorithm", "b.py:B"],  # lists both
                 # the same value through a setting's two spellings
                 ["run", "--algorithm", "fedcompass", "--compass.lambda", "1.2", "--compass.latest-time-factor", "1.2"]):
        parser = cli.build_parser()
        parser.parse_known_args(argv)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            cli._note_repeated_flags(parser.flags_read)
        assert said == [], argv
