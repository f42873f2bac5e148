"""jaxfl report over several folders: folders swept with different settings that their rows do
not carry (a base learning rate, the target accuracy) are refused rather than merged into seeds of
one method; parts of one grid (other seeds, execution settings such as --data-dir) still merge."""
import json

import pytest

from jaxfl.report import make_report, read_results_of

HEADER = "cell,algorithm,seed,compass.q_min,target_accuracy,time_to_target,best_accuracy,run_dir\n"


def _folder(path, seed, base, target=0.85, time=50.0):
    path.mkdir()
    (path / "results.csv").write_text(HEADER + f"0,fedcompass,{seed},4,{target},{time},0.9,runs/a\n"
                                      f"1,fedcompass,{seed},2,{target},{time * 2},0.9,runs/b\n")
    (path / "sweep.json").write_text(json.dumps({"base": {"algorithm": "fedcompass", "seed": seed, **base},
                                                 "grid": {"compass.q_min": [2, 4]}, "cells": [{}, {}]}))
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
