"""Bad input to the tools around runs (sweep grids, jaxfl timeline, jaxfl report, run readers):
one clear line naming the bad value and what is allowed, before any work, and no partial output."""
import json
import os

import pytest

from jaxfl import cli
from jaxfl.report import make_report

HEADER = "cell,algorithm,seed,target_accuracy,time_to_target,best_accuracy,run_dir\n"


def _results_folder(path, algorithms=("fedbuff", "fedasync")):
    path.mkdir()
    rows = "".join(f"{i},{name},0,0.85,{50.0 + i},0.9,runs/{name}\n" for i, name in enumerate(algorithms))
    (path / "results.csv").write_text(HEADER + rows)
    (path / "sweep.json").write_text(json.dumps({"base": {}, "grid": {"algorithm": list(algorithms)},
                                                 "cells": [{"run_dir": f"runs/{name}"} for name in algorithms]}))
    return str(path)


def test_report_without_reference_on_a_sweep_without_fedavg_names_the_default_and_the_methods(tmp_path, capsys):
    sweep = _results_folder(tmp_path / "sweep")
    with pytest.raises(ValueError) as error:
        make_report(sweep, figures=False)
    message = str(error.value)
    assert "default reference, fedavg" in message and "fedbuff, fedasync" in message
    assert "--reference fedbuff" in message and "reference='fedavg'" not in message
    assert not os.path.exists(os.path.join(sweep, "report"))
    with pytest.raises(SystemExit) as status:
        cli.main(["report", sweep, "--no-figures"])
    assert status.value.code == 2
    assert "default reference, fedavg" in capsys.readouterr().err
    # a reference the user gave is still named as given
    with pytest.raises(ValueError, match="reference='nosuch' is not allowed"):
        make_report(sweep, reference="nosuch", figures=False)


@pytest.fixture(scope="module")
def timing_run(tmp_path_factory):
    """A tiny finished timing-only run (a second or two)."""
    from jaxfl.config import config_from_mapping
    from jaxfl.experiment import run_experiment

    out = tmp_path_factory.mktemp("runs")
    config = config_from_mapping({"dataset": "synthetic_iid", "partition": "natural", "model": "logreg",
                                  "timing_only": True, "progress": False, "checkpoint_every": None,
                                  "algorithm": "fedbuff", "clients": 4, "concurrency": 2, "buffer_size": 2,
                                  "max_updates": 5, "output_dir": str(out)})
    return run_experiment(config).run_dir


def _copy(run_dir, tmp_path, name="run"):
    import shutil

    target = tmp_path / name
    shutil.copytree(run_dir, target)
    return str(target)


@pytest.mark.parametrize("value", ["inf", "1e400"])
def test_timeline_refuses_an_infinite_max_time_before_making_its_folders(timing_run, tmp_path, capsys, value):
    out = tmp_path / "OD" / "sub" / "t.png"
    with pytest.raises(SystemExit) as status:
        cli.main(["timeline", timing_run, "--max-time", value, "--out", str(out)])
    assert status.value.code == 2
    err = capsys.readouterr().err
    assert "--max-time=inf is not allowed: a finite number of virtual seconds > 0" in err
    assert "Traceback" not in err and not (tmp_path / "OD").exists()


def test_timeline_figure_refuses_an_infinite_max_time(timing_run):
    pytest.importorskip("matplotlib")
    from jaxfl.plot import timeline_figure

    with pytest.raises(ValueError, match="max_time=inf is not allowed: a finite number"):
        timeline_figure(timing_run, max_time=float("inf"))


@pytest.mark.parametrize("setting", [{"bins": 0}, {"bins": -3}, {"bins": 2.5}, {"max_clients": 0}])
def test_timeline_figure_refuses_a_bin_count_or_client_limit_below_one(timing_run, setting):
    # bins=0 failed in an IndexError, bins=-3 in numpy's linspace
    pytest.importorskip("matplotlib")
    from jaxfl.plot import timeline_figure

    (name, value), = setting.items()
    with pytest.raises(ValueError, match=rf"{name}={value!r} is not allowed: an integer >= 1"):
        timeline_figure(timing_run, **{"max_clients": 1, **setting})


def _cut(path, size):
    with open(path, "rb") as handle:
        data = handle.read(size)
    with open(path, "wb") as handle:
        handle.write(data)


def test_timeline_of_a_finished_run_with_a_cut_event_log_is_one_line_and_makes_no_folder(timing_run, tmp_path,
                                                                                         capsys):
    run = _copy(timing_run, tmp_path)
    _cut(os.path.join(run, "events.csv"), 100)  # the header and part of the first row, as the review did
    out = tmp_path / "OD" / "sub" / "t.png"
    with pytest.raises(SystemExit) as status:
        cli.main(["timeline", run, "--out", str(out)])
    assert status.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert os.path.join(run, "events.csv") in err and "last line is cut short" in err and "restore" in err
    assert not (tmp_path / "OD").exists()


def _lines(path):
    with open(path, "rb") as handle:
        return handle.read().splitlines(keepends=True)


@pytest.mark.parametrize("pyarrow", [True, False])
def test_a_killed_runs_cut_last_row_is_left_out_and_damage_mid_file_is_refused(timing_run, tmp_path, monkeypatch,
                                                                               pyarrow):
    from jaxfl import runlog

    if not pyarrow:
        monkeypatch.setattr(runlog, "_pyarrow", lambda: None)
    elif runlog._pyarrow() is None:
        pytest.skip("pyarrow is not installed")
    run = _copy(timing_run, tmp_path)
    os.remove(os.path.join(run, "summary.json"))  # killed: it never finished
    events, metrics = os.path.join(run, "events.csv"), os.path.join(run, "metrics.csv")
    whole = len(runlog.read_events(run)["time"])
    lines = _lines(events)
    _cut(events, sum(map(len, lines[:-1])) + len(lines[-1]) // 2)  # killed mid-write of its last row
    assert len(runlog.read_events(run)["time"]) == whole - 1
    with open(metrics, "w") as handle:  # a timing-only run evaluates nothing: rows as a trained run's
        handle.write("time,version,accuracy\n0.0,0,0.1\n1.0,1,0.4\n2.0,2,0.5\n")
    metric_lines = _lines(metrics)
    _cut(metrics, sum(map(len, metric_lines)) - 3)
    assert runlog.read_metrics(run)["accuracy"].tolist() == [0.1, 0.4]
    assert runlog.load_run(run).num_events == whole - 1

    # a row of the wrong width inside the file is damage, not a cut: one line naming the file and a resume
    with open(events, "wb") as handle:
        handle.write(b"".join(lines[:2] + [b"0.0,di\n"] + lines[3:]))
    with pytest.raises(ValueError) as error:
        runlog.read_events(run)
    assert str(error.value).startswith(f"{events} is damaged:") and "jaxfl run --resume" in str(error.value)
    with open(metrics, "wb") as handle:
        handle.write(b"".join(metric_lines[:1] + [metric_lines[1].replace(b",", b",x", 1)] + metric_lines[2:]))
    with pytest.raises(ValueError, match=r"metrics.csv is damaged: column \w+ holds 'x"):
        runlog.read_metrics(run)


def test_a_damaged_parquet_part_and_summary_are_named(timing_run, tmp_path):
    from jaxfl import runlog

    if runlog._pyarrow() is None:
        pytest.skip("pyarrow is not installed")
    run = tmp_path / "pq"
    run.mkdir()
    with runlog.EventLog(str(run), format="parquet") as log:
        log.write({"time": 0.0, "event": "dispatch", "client": 0, "dispatch": 0, "version": 0, "staleness": None,
                   "steps": 5, "detail": None})
    part = run / "events" / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[:40])
    with pytest.raises(ValueError, match="part-00000.parquet.*cannot be read as Parquet"):
        runlog.read_events(str(run))
    copy = _copy(timing_run, tmp_path)
    _cut(os.path.join(copy, "summary.json"), 30)
    with pytest.raises(ValueError, match=r"summary.json is damaged: it is not a JSON object"):
        runlog.load_run(copy)


def test_a_grid_value_spelled_twice_is_refused_naming_both_spellings(tmp_path, capsys):
    from jaxfl.config import ConfigError
    from jaxfl.sweep import expand

    with pytest.raises(ConfigError, match=r"grid client_lr=\[1, 1.0\] is not allowed: 1 and 1.0 are the same "
                                          r"client_lr \(one value spelled twice\)"):
        expand({"model": "logreg"}, {"client_lr": [1, 1.0]}, str(tmp_path / "s"))
    with pytest.raises(ConfigError, match="5 and 5.0 are the same port.staleness_bound"):  # an algorithm's option
        expand({"model": "logreg", "algorithm": "port"}, {"port.staleness_bound": [5, 5.0]}, str(tmp_path / "s"))
    sweep_file = tmp_path / "dup.toml"
    sweep_file.write_text('model = "logreg"\n[grid]\nclient_lr = [1, 1.0]\n')
    with pytest.raises(SystemExit) as status:
        cli.main(["sweep", str(sweep_file), "--out", str(tmp_path / "OD"), "--no-progress"])
    assert status.value.code == 2 and "1 and 1.0 are the same client_lr" in capsys.readouterr().err
    assert not (tmp_path / "OD").exists()


def test_two_cells_with_one_config_are_refused_and_unread_axes_still_collapse(tmp_path):
    from jaxfl.config import ConfigError
    from jaxfl.sweep import expand

    # FedAdam sets its server optimiser itself: its sgd and adam cells are one run (one name)
    with pytest.raises(ConfigError) as error:
        expand({"model": "logreg"}, {"algorithm": ["fedavg", "fedadam"], "server_optimizer": ["sgd", "adam"]},
               str(tmp_path / "s"))
    message = str(error.value)
    assert message.startswith("sweep cells 2 (algorithm=fedadam server_optimizer=sgd) and 3 (algorithm=fedadam "
                              "server_optimizer=adam) are not allowed together: they are one run (fedadam-")
    assert "server_optimizer='sgd' and 'adam' give the same config" in message
    # a setting a cell does not read still collapses its cells into one run, as before
    cells, notes = expand({"model": "logreg"}, {"algorithm": ["fedavg", "fedbuff"], "buffer_size": [2, 3]},
                          str(tmp_path / "s"))
    assert [cell.label() for cell in cells] == ["algorithm=fedavg", "algorithm=fedbuff buffer_size=2",
                                                "algorithm=fedbuff buffer_size=3"]
    assert len({cell.run_dir for cell in cells}) == 3


def test_a_report_that_fails_on_a_damaged_run_leaves_no_new_folder(tmp_path):
    pytest.importorskip("matplotlib")
    from jaxfl.sweep import run_sweep

    base = {"dataset": "synthetic_iid", "partition": "natural", "model": "logreg", "timing_only": True,
            "checkpoint_every": None, "algorithm": "fedbuff", "clients": 4, "concurrency": 2, "buffer_size": 2,
            "max_updates": 5}
    result = run_sweep(base, {"seed": [0]}, str(tmp_path / "sweep"), progress=False)
    events = os.path.join(result.cells[0].run_dir, "events.csv")
    _cut(events, os.path.getsize(events) - 3)  # a finished run's log cut short: damage
    out = tmp_path / "R" / "sub"
    with pytest.raises(ValueError, match="events.csv is damaged: its last line is cut short"):
        make_report(str(tmp_path / "sweep"), out=str(out))
    assert not (tmp_path / "R").exists()


def test_the_accuracy_figures_metrics_reader_names_a_damaged_metrics_csv(tmp_path):
    from jaxfl import plot

    (tmp_path / "metrics.csv").write_text("time,version,accuracy\n0.0,0,0.1\n1.0,1\n2.0,2,0.5\n")
    with pytest.raises(ValueError, match=r"metrics.csv is damaged: row 3 has 2 values, the header 3 columns; "
                                         r"if the run was interrupted"):
        plot.read_metrics(str(tmp_path))
