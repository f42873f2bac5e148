"""Paths and files as users and their machines leave them: ``~`` in a path, a pathlib.Path, a TOML
file saved with a byte-order mark, a read-only sweep folder, a summary.json, sweep.json, results.csv
or metrics.csv damaged after the run, a failed JSON write, a broken link where a folder should be. Tiny MLP runs on the embedded MNIST: about a minute in all."""
import dataclasses
import json
import os
import pathlib
import subprocess

import pytest

import jaxfl
from jaxfl import cli
from jaxfl.config import ConfigError, check_output_folder, load_config_file
from jaxfl.report import make_report, read_results
from jaxfl.runlog import load_run
from jaxfl.sweep import cell_state, run_sweep

TINY = dict(algorithm="fedavg", dataset="mnist10k", model="mlp", clients=3, local_steps=2, batch_size=16,
            max_updates=2, checkpoint_every=1, progress=False)
FLAGS = ["--algorithm", "fedavg", "--dataset", "mnist10k", "--model", "mlp", "--clients", "3", "--local-steps", "2",
         "--batch-size", "16", "--max-updates", "2", "--no-progress"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    monkeypatch.chdir(tmp_path)
    return folder


def test_a_tilde_in_a_path_is_the_home_folder_in_python_flags_and_config_files(home, tmp_path, capsys):
    result = jaxfl.run_experiment(jaxfl.RunConfig(**TINY, output_dir="~/runs"))
    assert result.run_dir.startswith(str(home / "runs") + os.sep)
    assert not (tmp_path / "~").exists()  # not a folder named ~ in the current one
    name = os.path.basename(result.run_dir)
    assert load_run(f"~/runs/{name}").summary["global_updates"] == 2

    # a flag written --output-dir=~/x reaches jaxfl with its ~ (the shell expands only a word of its own)
    assert cli.main(["run", *FLAGS, "--seed", "1", "--output-dir=~/flag-runs"]) == 0
    assert len(os.listdir(home / "flag-runs")) == 1
    (tmp_path / "c.toml").write_text('output_dir = "~/file-runs"\n')
    assert cli.main(["run", *FLAGS, "--seed", "1", "--config", "~/../c.toml"]) == 0
    assert len(os.listdir(home / "file-runs")) == 1
    assert not (tmp_path / "~").exists()

    # a resume of a ~ path: the run's own folder, not a folder named ~
    assert cli.main(["run", "--resume", f"~/runs/{name}"]) == 0
    assert f"jaxfl: {home}/runs/{name} has already finished" in capsys.readouterr().out


def test_a_run_whose_config_recorded_an_unexpanded_tilde_still_resumes(home, tmp_path, monkeypatch):
    import jaxfl.config

    with monkeypatch.context() as older:  # as jaxfl before it expanded ~: config.json and checkpoints say "~/runs"
        older.setattr(jaxfl.config, "user_path", lambda path: path)
        result = jaxfl.run_experiment(jaxfl.RunConfig(**TINY, output_dir="~/runs"))
    run_dir = str(tmp_path / "~" / "runs" / os.path.basename(result.run_dir))
    assert json.loads(pathlib.Path(run_dir, "config.json").read_text())["config"]["output_dir"] == "~/runs"
    os.remove(os.path.join(run_dir, "summary.json"))  # as a run cut short
    assert jaxfl.resume_experiment(run_dir).summary["global_updates"] == 2


def test_a_tilde_in_a_time_per_step_file_and_in_the_plots(home, sweep_dir):
    from jaxfl.plot import accuracy_figure, timeline_figure
    from jaxfl.user_inputs import load_time_per_step

    (home / "speeds.csv").write_text("0.1\n0.2\n0.3\n")
    assert load_time_per_step("~/speeds.csv").tolist() == [0.1, 0.2, 0.3]
    run_dir = _run_dirs(sweep_dir)[0]
    os.symlink(run_dir, home / "r")
    timeline_figure("~/r")
    accuracy_figure(["~/r"])


def test_a_pathlib_path_is_taken_as_its_text(tmp_path):
    config = jaxfl.RunConfig(**TINY, output_dir=tmp_path / "runs", data_dir=pathlib.Path("~/data"))
    assert config.output_dir == str(tmp_path / "runs") and config.data_dir == "~/data"  # the name hashes data_dir as given
    given_in_a_section = dataclasses.replace(config, data=jaxfl.DataConfig(data_dir=tmp_path / "data"))
    assert given_in_a_section.data_dir == str(tmp_path / "data")
    json.dumps(given_in_a_section.to_dict())  # as config.json holds it (a Path is no JSON)


def test_a_toml_file_saved_with_a_byte_order_mark_reads_as_json_does(tmp_path):
    toml, json_file = tmp_path / "bom.toml", tmp_path / "bom.json"
    toml.write_bytes(b"\xef\xbb\xbfclients = 5\n")
    json_file.write_bytes(b'\xef\xbb\xbf{"clients": 5}')
    assert load_config_file(str(toml)) == load_config_file(str(json_file)) == {"clients": 5}


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("sweep"))
    base = {key: value for key, value in TINY.items() if key not in ("algorithm", "progress")}
    run_sweep(base, {"algorithm": ["fedavg"], "seed": [0, 1]}, folder, progress=False)
    return folder


def _copy(folder, tmp_path):
    import shutil

    copy = str(tmp_path / "copy")
    shutil.copytree(folder, copy)
    return copy


def _run_dirs(folder):
    return [os.path.join(folder, "runs", name) for name in sorted(os.listdir(os.path.join(folder, "runs")))]


def test_a_damaged_summary_counts_as_unfinished_and_resuming_writes_it_anew(sweep_dir, tmp_path, capsys):
    folder = _copy(sweep_dir, tmp_path)
    first, second = _run_dirs(folder)
    whole = json.loads(pathlib.Path(first, "summary.json").read_text())
    pathlib.Path(first, "summary.json").write_text('{"global_updates": 2, "stop_re')  # cut after the run
    assert cell_state(first) == "resumable"  # not "finished": it left no readable summary
    with pytest.raises(ValueError, match=f"{first}/summary.json is damaged: it is not a JSON object .*; resume the "
                                         f"run \\(jaxfl run --resume {first}\\), which writes it anew"):
        load_run(first)

    assert cli.main(["run", "--resume", first]) == 0  # was: "already finished", exit 0, the file left unreadable
    rebuilt = json.loads(pathlib.Path(first, "summary.json").read_text())
    assert rebuilt["final_accuracy"] == whole["final_accuracy"] and rebuilt["global_updates"] == 2

    # the same in a sweep: its table lists the cell again once the same sweep goes on
    pathlib.Path(second, "summary.json").write_text("")
    base = {key: value for key, value in TINY.items() if key not in ("algorithm", "progress")}
    result = run_sweep(base, {"algorithm": ["fedavg"], "seed": [0, 1]}, folder, progress=False)
    assert result.resumed == [1] and result.skipped == [0] and len(read_results(folder)) == 2
    assert json.loads(pathlib.Path(second, "summary.json").read_text())["global_updates"] == 2


def test_a_damaged_sweep_json_is_named_with_what_to_do(sweep_dir, tmp_path):
    folder = _copy(sweep_dir, tmp_path)
    pathlib.Path(folder, "sweep.json").write_text('{"base": {')
    with pytest.raises(ValueError, match=f"{folder}/sweep.json is damaged: .*remove it: the sweep writes it again"):
        make_report(folder, figures=False)
    base = {key: value for key, value in TINY.items() if key not in ("algorithm", "progress")}
    with pytest.raises(ValueError, match=f"{folder}/sweep.json is damaged"):
        run_sweep(base, {"algorithm": ["fedavg"], "seed": [0, 1]}, folder, progress=False)
    os.remove(os.path.join(folder, "sweep.json"))  # as the message says: the sweep writes it again
    result = run_sweep(base, {"algorithm": ["fedavg"], "seed": [0, 1]}, folder, progress=False)
    assert result.skipped == [0, 1] and os.path.isfile(os.path.join(folder, "sweep.json"))


def test_a_results_table_cut_after_the_sweep_is_told_from_cells_not_finished(sweep_dir, tmp_path):
    folder = _copy(sweep_dir, tmp_path)
    table = pathlib.Path(folder, "results.csv")
    text = table.read_text()
    table.write_text(text[:-7])  # its last row cut mid-line
    with pytest.raises(ValueError, match="results.csv is damaged: its last line is cut short .*the same jaxfl sweep "
                                         "command writes it again"):
        read_results(folder)
    table.write_text(text[:text.rstrip("\n").rfind("\n") + 1])  # cut at a line end: one row of two left
    note = make_report(folder, figures=False).markdown
    assert "results.csv lists 1 runs, but 2 of its cells have finished: the table was cut or is behind" in note
    assert "have not finished" not in note
    base = {key: value for key, value in TINY.items() if key not in ("algorithm", "progress")}
    run_sweep(base, {"algorithm": ["fedavg"], "seed": [0, 1]}, folder, progress=False)  # rewrites it, reruns none
    assert len(read_results(folder)) == 2


def test_a_results_csv_of_the_user_s_may_end_without_a_line_end_and_odd_files_are_named(sweep_dir, tmp_path):
    folder = _copy(sweep_dir, tmp_path)
    kept = tmp_path / "kept.csv"
    kept.write_text(pathlib.Path(folder, "results.csv").read_text().rstrip("\r\n"))  # as an editor saves it
    assert len(read_results(str(kept))) == 2
    pathlib.Path(folder, "sweep.json").write_text('{"cells": ["x"]}')
    with pytest.raises(ValueError, match="sweep.json is damaged: its cells are not a list of objects"):
        make_report(folder, figures=False)
    run_dir = _run_dirs(folder)[0]
    summary = json.loads(pathlib.Path(run_dir, "summary.json").read_text())
    for odd in (None, [1], {"metrics.csv": "many"}):  # hand-edited: not a size to compare, so none is compared
        pathlib.Path(run_dir, "summary.json").write_text(json.dumps({**summary, "log_bytes": odd}))
        assert len(load_run(run_dir).metrics["version"]) == 3


def test_a_finished_run_s_log_cut_at_a_line_end_is_damage_not_fewer_rows(sweep_dir, tmp_path):
    folder = _copy(sweep_dir, tmp_path)
    run_dir = _run_dirs(folder)[0]
    summary = json.loads(pathlib.Path(run_dir, "summary.json").read_text())
    metrics = pathlib.Path(run_dir, "metrics.csv")
    assert summary["log_bytes"]["metrics.csv"] == metrics.stat().st_size
    assert set(summary["log_bytes"]) == {"metrics.csv", "class_accuracy.csv", "events.csv"}
    text = metrics.read_text()
    metrics.write_text(text[:text.rstrip("\n").rfind("\n") + 1])  # the last evaluation gone, whole rows left
    with pytest.raises(ValueError, match=f"{run_dir}/metrics.csv is damaged: it holds .* bytes, and the run ended "
                                         f"with {summary['log_bytes']['metrics.csv']:,}"):
        load_run(run_dir)


def test_a_json_write_that_fails_leaves_neither_the_file_nor_its_temporary(tmp_path):
    from jaxfl.experiment import _write_json

    circular = {}
    circular["self"] = circular
    with pytest.raises(ValueError, match="Circular reference"):
        _write_json(str(tmp_path / "summary.json"), {"global_updates": 1, "bad": circular})
    assert os.listdir(tmp_path) == []


def test_a_broken_link_where_the_output_folder_goes_is_named_as_one(tmp_path):
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match=f"'{link}' is a link to '{tmp_path / 'gone'}', which does not exist, not a "
                                          "folder"):
        check_output_folder("--output-dir", str(link))


def test_an_output_folder_on_a_file_system_that_makes_no_folders_is_refused_before_any_work(tmp_path):
    """/proc lets root write (access() says yes) but makes no folders: refused naming the flag and why,
    with nothing left behind, instead of an OSError after the data was built."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    # (not root: access() already says no, and the message names the permissions)
    with pytest.raises(ConfigError, match=r"--output-dir='/proc/jaxfl-runs' is not allowed: (no folder can be made in "
                                          r"'/proc' \(.+\)|the folder '/proc' cannot be written \(permissions, or a read-only file system\)); "
                                          "give a folder you can write"):
        check_output_folder("--output-dir", "/proc/jaxfl-runs")
    check_output_folder("--output-dir", str(tmp_path / "runs"))  # a folder that can be made: nothing left behind
    assert os.listdir(tmp_path) == []


@pytest.fixture
def read_only_copy(sweep_dir, tmp_path):
    """A copy of the sweep on a read-only mount (root: a read-only bind mount; others: chmod)."""
    folder = _copy(sweep_dir, tmp_path)
    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
        yield folder
        os.chmod(folder, 0o755)
        return
    mounted = str(tmp_path / "read-only")
    os.mkdir(mounted)
    if subprocess.run(["mount", "--bind", folder, mounted], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", mounted], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        yield mounted
    finally:
        subprocess.run(["umount", mounted], capture_output=True)


def test_a_report_of_a_read_only_sweep_folder_says_to_give_out(read_only_copy, tmp_path, capsys):
    with pytest.raises(SystemExit) as ended:
        cli.main(["report", read_only_copy, "--no-figures"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (f"the default out, '{read_only_copy}/report', is not allowed: the folder '{read_only_copy}' cannot be "
            "written (permissions, or a read-only file system); give a folder you can write (--out DIR; out= in make_report)") in err
    assert cli.main(["report", read_only_copy, "--no-figures", "--out", str(tmp_path / "elsewhere")]) == 0
    assert os.path.isfile(tmp_path / "elsewhere" / "report.md")


def test_an_output_folder_that_is_not_text_or_too_long_is_refused_before_any_work(tmp_path, capsys):
    """A path with bytes that are not UTF-8 trained the whole run, then orbax's first checkpoint failed
    in a 134-line traceback; a 300-byte folder name failed after the data were built (a review)."""
    common = ["run", "--algorithm", "fedbuff", "--model", "logreg", "--clients", "4", "--local-steps", "1",
              "--max-updates", "2", "--no-progress"]
    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/bad\xffname")
    with pytest.raises(SystemExit):
        cli.main([*common, "--output-dir", bad])
    said = capsys.readouterr().err
    assert "--output-dir=" in said and "is not allowed: its path holds bytes that are not UTF-8 text" in said, said
    with pytest.raises(ConfigError, match=r"output_dir=.* is not allowed: its path holds bytes that are not UTF-8 text"):
        jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedbuff", model="logreg", clients=4, local_steps=1,
                                             max_updates=2, progress=False, output_dir=bad))
    long_folder = str(tmp_path / ("x" * 300))
    with pytest.raises(ConfigError, match=r"its folder name 'x+'\.\.\. is 300 bytes, and this file system takes at "
                                          r"most \d+"):
        check_output_folder("--output-dir", long_folder)
    with pytest.raises(ConfigError, match=r"run_name=.* is not allowed: a name of at most 240 bytes"):
        jaxfl.validate(jaxfl.RunConfig(run_name="x" * 241))
    with pytest.raises(ConfigError, match=r"run_name=.* is not allowed: a name of UTF-8 text"):
        jaxfl.validate(jaxfl.RunConfig(run_name="bad\udcffname"))
    assert sorted(os.listdir(tmp_path)) == []  # nothing made


def test_the_python_api_refuses_an_output_folder_the_command_refuses_before_building_anything(tmp_path, monkeypatch):
    # run_experiment(output_dir=<a file>) raised NotADirectoryError from os.makedirs after the data, the
    # model and the engine were built
    from jaxfl import experiment

    afile = tmp_path / "afile"
    afile.write_text("")

    def no_data(*args, **kwargs):
        raise AssertionError("the data were built before the output folder was checked")

    monkeypatch.setattr(experiment, "_prepare", no_data)
    with pytest.raises(ConfigError, match=rf"output_dir='{afile}' is not allowed: '{afile}' is a file, not a folder"):
        jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedbuff", model="logreg", clients=4, local_steps=1,
                                             max_updates=2, progress=False, output_dir=str(afile)))


def test_a_figure_or_table_cut_by_a_full_disk_leaves_no_temporary_file_and_names_its_path(tmp_path, monkeypatch):
    """A comparison on a filling disk left comparison.png.tmp.png (32 KB of a PNG) or an empty
    comparison.csv.tmp behind, and the error ('[Errno 28] No space left on device') named no file."""
    import errno

    import matplotlib.pyplot as plt
    from PIL import Image

    from jaxfl.plot import save_figure
    from jaxfl.runlog import write_csv

    save = Image.Image.save

    def fills_the_disk(self, target, *args, **kwargs):
        if not isinstance(target, str):  # matplotlib's own PNG into memory
            return save(self, target, *args, **kwargs)
        with open(target, "wb") as handle:
            handle.write(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")  # as Pillow raises it: no file named

    monkeypatch.setattr(Image.Image, "save", fills_the_disk)
    figure = plt.figure()
    with pytest.raises(OSError, match=r"No space left on device: '.*comparison\.png'"):
        save_figure(figure, str(tmp_path / "comparison.png"))
    plt.close(figure)

    class Unwritable:
        def __str__(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match=r"No space left on device: '.*comparison\.csv'"):
        write_csv(str(tmp_path / "comparison.csv"), [{"a": Unwritable()}], ["a"])
    assert os.listdir(tmp_path) == []  # neither the files nor their temporary ones


def test_a_report_that_cannot_be_written_does_not_say_files_were_kept(tmp_path, capsys, monkeypatch):
    # "(the files written before it are kept ...)" where the report's folder did not exist afterwards
    import errno
    from unittest import mock

    from jaxfl import report

    sweep = tmp_path / "sweep"
    assert cli.main(["sweep", "--algorithm", "fedavg", "--model", "logreg", "--clients", "3", "--local-steps", "1",
                     "--max-updates", "1", "--target-accuracy", "0.5", "--no-progress", "--out", str(sweep)]) == 0

    # (a Mock: raised from no frame of a user's file, as the disk raises it, not a bug of one to show)
    monkeypatch.setattr(report, "_publish", mock.Mock(side_effect=OSError(
        errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "report.md"))))
    capsys.readouterr()
    assert cli.main(["report", str(sweep), "--no-figures", "--out", str(tmp_path / "out")]) == cli.CHECKPOINT_WRITE_STATUS
    said = capsys.readouterr().err
    assert "No space left on device" in said and "(fix that and run the same command again: it writes the report " \
                                                 "anew)" in said and "are kept" not in said, said
    assert not (tmp_path / "out").exists()


def test_a_damaged_log_of_a_finished_sweep_cell_says_how_the_sweep_mends_it(tmp_path, capsys):
    """The advice was "restore it from a copy, or run the experiment again", and no command did: the
    sweep skips a finished cell, and --resume of a finished run leaves its logs as they are."""
    sweep = tmp_path / "sweep"
    flags = ["sweep", "--algorithm", "fedavg", "--model", "logreg", "--clients", "3", "--local-steps", "1",
             "--max-updates", "2", "--target-accuracy", "0.5", "--no-progress", "--out", str(sweep)]
    assert cli.main(flags) == 0
    (cell,) = (sweep / "runs").iterdir()
    events = cell / "events.csv"
    events.write_bytes(events.read_bytes()[:-9])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["report", str(sweep), "--out", str(tmp_path / "report")])
    said = capsys.readouterr().err
    assert f"remove the cell's folder ({cell}) and run the same jaxfl sweep command again" in said, said
    import shutil

    shutil.rmtree(cell)
    assert cli.main(flags) == 0  # the advice works: the cell runs anew
    assert cli.main(["report", str(sweep), "--out", str(tmp_path / "report")]) == 0


def test_a_missing_or_garbage_client_samples_file_is_named(tmp_path):
    # numpy's FileNotFoundError, or "This file contains pickled (object) data" naming no file
    run = jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedavg", model="logreg", clients=3, local_steps=1,
                                               max_updates=1, target_accuracy=0.5, progress=False,
                                               output_dir=str(tmp_path)))
    path = os.path.join(run.run_dir, "client_samples.npy")
    assert len(jaxfl.load_run(run.run_dir).client_samples) == 3  # read back whole
    with open(path, "wb") as handle:
        handle.write(os.urandom(200))
    with pytest.raises(ValueError, match=rf"{path} is damaged: it is not the array of sample counts config.json "
                                         r"records .*restore it from a copy"):
        jaxfl.load_run(run.run_dir).client_samples
    os.remove(path)
    with pytest.raises(ValueError, match=rf"{path} is missing: config.json records the clients' sample counts there"):
        jaxfl.load_run(run.run_dir).client_samples


def test_a_run_name_given_and_taken_says_where_the_run_goes(tmp_path):
    """--run-name big twice wrote big-2 without a word; `jaxfl run --resume runs/big` then named the
    first run (a review)."""
    config = jaxfl.RunConfig(algorithm="fedavg", model="logreg", clients=3, local_steps=1, max_updates=1,
                             target_accuracy=0.5, progress=False, output_dir=str(tmp_path), run_name="big")
    first = jaxfl.run_experiment(config)
    with pytest.warns(UserWarning, match=rf"run_name 'big': {tmp_path / 'big'} exists already, so this run goes "
                                         rf"into {tmp_path / 'big-2'} \(give another run_name"):
        second = jaxfl.run_experiment(config)
    assert (first.run_dir, second.run_dir) == (str(tmp_path / "big"), str(tmp_path / "big-2"))


def test_resuming_a_file_says_it_is_a_file():
    # "no such directory", though the path was there
    from jaxfl.resume import ResumeError, read_record

    with pytest.raises(ResumeError, match=r"cannot resume '.*': it is a file, not a run's folder"):
        read_record(__file__)
