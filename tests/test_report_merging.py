"""jaxfl report over several folders: folders swept with different settings that their rows do
not carry (a base learning rate, the target accuracy) are refused rather than merged into seeds of
one method; parts of one grid (other seeds, execution settings such as --data-dir) still merge."""
import json
import os

import pytest

from jaxfl.report import make_report, read_results_of

HEADER = "cell,algorithm,seed,compass.q_min,target_accuracy,time_to_target,best_accuracy,run_dir\n"


def _folder(path, seed, base, target=0.85, time=50.0):
    path.mkdir()
    (path / "results.csv").write_text(HEADER + f"0,fedcompass,{seed},4,{target},{time},0.9,runs/a\n"
                                      f"1,fedcompass,{seed},2,{target},{time * 2},0.9,runs/b\n")
    (path / "sweep.json").write_text(json.dumps({"base": {"algorithm": "fedcompass", "seed": seed, **base},
                                                 "grid": {"compass.q_min": [2, 4]}, "cells": [{"run_dir": "runs/a"}, {"run_dir": "runs/b"}]}))
    return str(path)


def test_folders_with_different_base_settings_and_targets_are_refused(tmp_path):
    first = _folder(tmp_path / "A", 0, {"client_lr": 0.003, "target_accuracy": 0.85})
    second = _folder(tmp_path / "B", 1, {"client_lr": 0.01, "target_accuracy": 0.8}, target=0.8)
    with pytest.raises(ValueError) as error:
        make_report([first, second], reference="fedcompass compass.q_min=4", figures=False)
    message = str(error.value)
    assert "\n" not in message
    assert f"client_lr 0.003 in {first}, 0.01 in {second}" in message
    assert f"target_accuracy 0.85 in {first}, 0.8 in {second}" in message
    assert "report each on its own" in message
    assert not (tmp_path / "A" / "report").exists()  # refused before anything is written


def test_results_csvs_with_different_targets_are_refused(tmp_path):
    first = _folder(tmp_path / "A", 0, {})
    second = _folder(tmp_path / "B", 1, {}, target=0.8)
    with pytest.raises(ValueError, match=r"target_accuracy 0\.85 in .*results\.csv, 0\.8 in .*results\.csv"):
        read_results_of([f"{first}/results.csv", f"{second}/results.csv"])


def test_parts_of_one_grid_still_merge(tmp_path):
    # seeds of one grid, one run on a GPU with its own data folder: one table, two seeds a method
    first = _folder(tmp_path / "A", 0, {"client_lr": 0.003, "data_dir": "/data"})
    second = _folder(tmp_path / "B", 1, {"client_lr": 0.003}, time=70.0)
    report = make_report([first, second], reference="fedcompass compass.q_min=4", figures=False)
    found = {line["method"]: line for line in report.rows}
    assert found["fedcompass compass.q_min=4"]["runs"] == 2
    assert found["fedcompass compass.q_min=4"]["time_to_target_mean"] == 60.0
    assert found["fedcompass compass.q_min=2"]["relative_time"] == 2.0


def _runs(folder, seed, **settings):
    """config.json for the folder's two runs (runs/a: q_min 4, runs/b: q_min 2), as jaxfl run writes it."""
    from jaxfl.config import RunConfig

    for name, q_min in (("a", 4), ("b", 2)):
        run = f"{folder}/runs/{name}"
        os.makedirs(run)
        config = RunConfig(algorithm="fedcompass", seed=seed, output_dir=f"{folder}/runs", run_name=name,
                           algorithm_options={"q_min": q_min}, **settings)
        with open(f"{run}/config.json", "w") as handle:
            json.dump({"config": config.to_dict()}, handle)


def test_a_setting_one_sweep_left_at_its_default_and_another_set_is_refused(tmp_path):
    # sweep.json of A does not name client_lr (its runs took the default), B's base sets it: only the
    # runs' own configs tell them apart
    first = _folder(tmp_path / "A", 0, {})
    second = _folder(tmp_path / "B", 1, {"client_lr": 0.01})
    _runs(first, 0)
    _runs(second, 1, client_lr=0.01, clients_per_round=5)
    with pytest.raises(ValueError) as error:
        read_results_of([first, second])
    message = str(error.value)
    assert f"client_lr of the fedcompass runs 0.003 in {first}, 0.01 in {second}" in message
    assert "report each on its own" in message
    for carried_or_execution in ("seed of", "run_name of", "output_dir of", "q_min of"):
        assert carried_or_execution not in message


def test_parts_of_one_grid_with_their_run_folders_still_merge(tmp_path):
    first = _folder(tmp_path / "A", 0, {"client_lr": 0.01})
    second = _folder(tmp_path / "B", 1, {"client_lr": 0.01, "data_dir": "/data"})
    _runs(first, 0, client_lr=0.01)
    _runs(second, 1, client_lr=0.01, data_dir="/data", checkpoint_every=5)  # execution settings may differ
    rows = read_results_of([first, second])
    assert sorted((row["seed"], row["compass.q_min"]) for row in rows) == [(0, 2), (0, 4), (1, 2), (1, 4)]


def test_a_grid_axis_named_by_its_alias_and_by_its_field_is_one_method(tmp_path):
    """A sweep of before 2026-12-05 kept an axis as its file spelled it (compass.lambda), one of now
    names the field (compass.latest_time_factor): merged, they were two methods of one seed each,
    and the alias no longer named a reference or panels."""
    folders = []
    for seed, column in ((0, "compass.lambda"), (1, "compass.latest_time_factor")):
        path = tmp_path / column
        path.mkdir()
        (path / "results.csv").write_text(f"cell,algorithm,seed,{column},target_accuracy,time_to_target,best_accuracy,"
                                          f"run_dir\n0,fedcompass,{seed},1.2,0.85,50.0,0.9,runs/a\n"
                                          f"1,fedcompass,{seed},1.5,0.85,40.0,0.9,runs/b\n")
        (path / "sweep.json").write_text(json.dumps({"base": {"algorithm": "fedcompass", "seed": seed},
                                                     "grid": {column: [1.2, 1.5]}, "cells": []}))
        folders.append(str(path))
    assert {key for row in read_results_of(folders) for key in row} >= {"compass.latest_time_factor"}
    report = make_report(folders, reference="fedcompass compass.lambda=1.2", figures=False,
                         out=str(tmp_path / "report"))
    methods = {line["method"]: line for line in report.rows}
    assert set(methods) == {"fedcompass compass.latest_time_factor=1.2", "fedcompass compass.latest_time_factor=1.5"}
    assert methods["fedcompass compass.latest_time_factor=1.5"]["runs"] == 2
    assert methods["fedcompass compass.latest_time_factor=1.5"]["relative_time"] == 0.8
