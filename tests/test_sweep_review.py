"""What a review of `jaxfl sweep` found on 2026-12-05: a sweep file's axis spelled with hyphens
kept its values over a flag's; an axis spelled two ways lost one spelling's values; an option's
axis as a TOML table was refused with a misleading message; a cell's devices were refused only as
it started, after the cells before it ran; a damaged sweep.json was a traceback."""
import json
import os

import pytest

from jaxfl import cli
from jaxfl.config import ConfigError
from jaxfl.sweep import load_sweep_file

SMALL = ["--clients", "4", "--model", "mlp", "--local-steps", "2", "--max-updates", "3", "--no-progress"]


def _file(tmp_path, text, name="sweep.toml"):
    path = tmp_path / name
    path.write_text('model = "mlp"\nclients = 4\nlocal_steps = 2\nmax_updates = 3\n' + text)
    return str(path)


def test_a_flag_replaces_a_file_axis_however_the_file_spells_it(tmp_path):
    path = _file(tmp_path, '[grid]\n"client-lr" = [0.01, 0.02]\n"port.staleness-bound" = [1, 2]\n'
                           'algorithm = ["port"]\n')
    assert cli.main(["sweep", path, "--client-lr", "0.05", "--port.staleness-bound", "7", "--no-progress",
                     "--out", str(tmp_path / "out")]) == 0
    definition = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert len(definition["cells"]) == 1
    assert definition["base"]["client_lr"] == 0.05 and definition["base"]["port.staleness_bound"] == 7.0
    assert "client_lr" not in definition["grid"] and "port.staleness_bound" not in definition["grid"]


def test_an_axis_given_in_two_spellings_is_refused(tmp_path):
    path = _file(tmp_path, '[grid]\nclient_lr = [0.01]\n"client-lr" = [0.02, 0.03]\n')
    with pytest.raises(ConfigError, match=r"\[grid\] gives client_lr twice: client_lr = \[0.01\] and client-lr = "
                                          r"\[0.02, 0.03\]; give it once"):
        load_sweep_file(path)


@pytest.mark.parametrize("grid", ['[grid]\nport.staleness_bound = [1, 2]\n',   # unquoted: a TOML table
                                  '[grid.port]\nstaleness_bound = [1, 2]\n',
                                  '[grid.client]\nclient_lr = [0.1, 0.2]\n'])   # a section's table
def test_an_option_s_or_a_section_s_axis_as_a_table(tmp_path, grid):
    _, axes = load_sweep_file(_file(tmp_path, 'algorithm = "port"\n' + grid))
    assert axes in ({"port.staleness_bound": [1, 2]}, {"client_lr": [0.1, 0.2]})


def test_a_size_s_axis_replaces_the_file_s_in_another_spelling(tmp_path):
    path = _file(tmp_path, '[grid]\n"client-lr" = [0.01, 0.02]\n[sizes.quick.grid]\nclient_lr = [0.5]\n')
    assert load_sweep_file(path, "quick")[1] == {"client_lr": [0.5]}


def test_a_cell_s_devices_are_checked_before_any_cell_runs(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        cli.main(["sweep", "--algorithm", "fedavg", *SMALL, "--devices", "1,64", "--out", str(out)])
    assert exited.value.code == 2
    assert "sweep cell 1 (devices=64): devices=64 is not allowed: this process has" in capsys.readouterr().err
    assert not out.exists()


def test_a_damaged_sweep_json_is_named_not_a_traceback(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["sweep", "--algorithm", "fedavg", *SMALL, "--out", str(out)]) == 0
    definition = json.loads((out / "sweep.json").read_text())
    for damage in ({"cells": [{"cell": 0}]}, {"run_jobs": {"runs/x": "two"}}):
        (out / "sweep.json").write_text(json.dumps({**definition, **damage}))
        with pytest.raises(SystemExit):
            cli.main(["sweep", "--algorithm", "fedavg", *SMALL, "--out", str(out)])
        assert f"{os.path.join(str(out), 'sweep.json')} is damaged" in capsys.readouterr().err


def test_a_size_s_one_value_replaces_the_axis_and_every_size_is_checked(tmp_path):
    path = tmp_path / "study.toml"
    path.write_text('[grid]\nalgorithm = ["fedavg", "fedbuff"]\nseed = [0, 1, 2]\n'
                    '[sizes.quick]\nseed = 0\nalgorithm = "fedavg"\n[sizes.full]\nmax_updates = 50\n')
    # the size's values were merged into the base, which every axis then replaced: 6 cells, not 1
    base, grid = load_sweep_file(str(path), "quick")
    assert base["seed"] == 0 and base["algorithm"] == "fedavg" and grid == {}
    assert load_sweep_file(str(path), "full")[1] == {"algorithm": ["fedavg", "fedbuff"], "seed": [0, 1, 2]}
    # a base setting the grid sweeps was read by no cell, silently
    clash = tmp_path / "clash.toml"
    clash.write_text('seed = 5\n[grid]\nseed = [0, 1]\n')
    with pytest.raises(ConfigError, match=r"seed is set in the base settings and swept in \[grid\]; every cell takes "
                                          r"the grid's values"):
        load_sweep_file(str(clash))
    # a misspelt key of a size not chosen surfaced only the day that size ran
    typo = tmp_path / "typo.toml"
    typo.write_text('[grid]\nseed = [0]\n[sizes.full]\nmax_update = 3\n')
    with pytest.raises(ConfigError, match=r"\[sizes.full\]: unknown config field 'max_update'"):
        load_sweep_file(str(typo))


def test_sigterm_as_a_cell_starts_says_how_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    # SIGTERM before a cell's first event ends the process with the words of the run it cuts: they
    # told a sweep's user to resume one run (or start it again), not that the sweep command goes on
    import jaxfl.sweep
    from jaxfl import stopping

    said = []

    def cell_starting(base, grid, sweep_dir, **kwargs):
        os.makedirs(sweep_dir)
        with stopping.said_on_sigterm(lambda: "runs/x holds the logs until it stopped but no checkpoint yet"):
            said.append(stopping._state.last_words())  # what the SIGTERM handler writes now
        raise KeyboardInterrupt

    monkeypatch.setattr(jaxfl.sweep, "run_sweep", cell_starting)
    folder = tmp_path / "sweep"
    assert cli.main(["sweep", "--algorithm", "fedavg", "--model", "logreg", "--clients", "2", "--no-progress",
                     "--out", str(folder)]) == 130
    assert said == [f"runs/x holds the logs until it stopped but no checkpoint yet; the sweep: 0 finished cells in "
                    f"{folder / 'results.csv'}; the same jaxfl sweep command goes on (finished cells are skipped, "
                    "the interrupted one resumes from its newest checkpoint or starts again)"]
    assert stopping._state.last_words is None  # restored when the command ends


def test_cells_run_on_an_npz_file_before_it_changed_are_refused_not_reported_as_its(tmp_path):
    # a run records the SHA-256 of the file's arrays, which its name does not hold: the same sweep after
    # the file was written anew said "2 already finished" and reported the old data's results as the new
    import numpy as np

    from jaxfl.sweep import run_sweep

    def save(seed):
        rng = np.random.default_rng(seed)
        np.savez(tmp_path / "mine.npz", x_train=rng.normal(size=(40, 4)).astype(np.float32), y_train=np.arange(40) % 2,
                 x_test=rng.normal(size=(10, 4)).astype(np.float32), y_test=np.arange(10) % 2)

    base = dict(dataset="npz", data_dir=str(tmp_path / "mine.npz"), model="logreg", clients=2, local_steps=1,
                max_updates=1)
    grid = {"algorithm": ["fedavg", "fedbuff"]}
    save(0)
    first = run_sweep(base, grid, str(tmp_path / "sweep"), progress=False)
    save(1)
    with pytest.raises(ConfigError, match=r"2 cells of this sweep were run on the npz file .*mine.npz before it changed "
                                          r"\(its arrays' SHA-256 \w{12}… then, \w{12}… now\): cell 0 \(algorithm=fedavg\)"):
        run_sweep(base, grid, str(tmp_path / "sweep"), progress=False)
    save(0)  # the file as it was: its cells again
    again = run_sweep(base, grid, str(tmp_path / "sweep"), progress=False)
    assert [row["run_dir"] for row in again.rows] == [row["run_dir"] for row in first.rows]


def test_a_parallel_sweep_says_its_cells_notes_once_each(tmp_path, capsys):
    # its workers kept every note in their logs, and the sweep's own check of the cells had them muted:
    # channels-first images trained in two cells with nothing said (--jobs 1 said it)
    import numpy as np

    rng = np.random.default_rng(0)
    path = tmp_path / "torch_layout.npz"
    np.savez(path, x_train=rng.integers(0, 255, (60, 1, 8, 8), dtype=np.uint8), y_train=np.arange(60) % 3,
             x_test=rng.integers(0, 255, (12, 1, 8, 8), dtype=np.uint8), y_test=np.arange(12) % 3)
    assert cli.main(["sweep", "--out", str(tmp_path / "sweep"), "--dataset", "npz", "--data-dir", str(path),
                     "--model", "logreg", "--clients", "3", "--local-steps", "1", "--max-updates", "1",
                     "--target-accuracy", "0.99", "--seed", "0,1", "--jobs", "2", "--no-progress"]) == 0
    said = capsys.readouterr()
    lines = (said.out + said.err).splitlines()
    noted = [line for line in lines if "x_train of shape (60, 1, 8, 8) looks channels-first" in line]
    assert len(noted) == 1 and noted[0].startswith(("cell 0: ", "cell 1: ")), lines
