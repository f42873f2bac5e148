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
                                                 "cells": [{} for _ in algorithms]}))
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
