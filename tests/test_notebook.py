"""The quickstart notebook's code cells run (on a shortened budget)."""
import json
import os

import matplotlib
import pytest

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "notebooks", "quickstart.ipynb")


@pytest.mark.slow
def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    with open(NOTEBOOK) as handle:
        cells = [c for c in json.load(handle)["cells"] if c["cell_type"] == "code"]
    namespace = {}
    for index, cell in enumerate(cells):
        source = "".join(cell["source"])
        if index == 0:  # shorten the budget, keep everything else as a reader would run it
            source = source.replace("target_accuracy=0.9", "target_accuracy=0.7").replace("local_steps=20", "local_steps=10")
        exec(compile(source, f"quickstart cell {index}", "exec"), namespace)
    assert set(namespace["results"]) == {"fedavg", "fedavgm", "fedasync", "fedbuff"}
    assert all(r.summary["time_to_target"] is not None for r in namespace["results"].values())
    assert namespace["rows"][0]["event"] == "dispatch"
