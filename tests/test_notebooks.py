"""The numbered notebooks (notebooks/NN_*.ipynb) run end to end as a reader runs them, and the files
committed stay small and clean.

Each notebook is executed with nbclient in a fresh Jupyter kernel that imports this checkout's jaxfl
(PYTHONPATH), in a temporary folder, at a tiny size: a cell of assignments is injected after the
cell tagged ``parameters``, as papermill does. The test then checks that the figures rendered
(image/png outputs) and reads the notebook's key result from a cell appended at the end.
"""
import json
import os
import re

from conftest import sharing_compilations
import nbclient  # the dev extras install them: a missing one must fail here, not skip the notebooks
import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK_DIR = os.path.join(ROOT, "notebooks")
NOTEBOOKS = sorted(name for name in os.listdir(NOTEBOOK_DIR) if re.fullmatch(r"\d\d_\w+\.ipynb", name))
MAX_FILE_BYTES = 300_000  # a committed notebook, outputs included
MAX_PNG_BYTES = 120_000  # one committed figure (base64 text)
RESULT = "KEY RESULT:"

# Seconds, not minutes: few clients and steps, a few global updates, a target no run reaches (so
# every run stops on its update budget and the counts below are exact).
TINY = {
    "01_quickstart.ipynb": dict(clients=4, local_steps=2, target_accuracy=0.99, max_updates=3),
    "02_async_vs_sync.ipynb": dict(clients=4, local_steps=2, target_accuracy=0.99, max_updates=4,
                                   speed_models=["homo", "pareto"], algorithms=["fedavg", "fedbuff"]),
    "03_your_own_algorithm.ipynb": dict(clients=4, local_steps=2, target_accuracy=0.99, max_updates=4,
                                        max_staleness=0, conformance_checks=["accounting", "toml"]),
    "04_kernels_in_your_jax_code.ipynb": dict(clients=4, rounds=2, local_steps=5, batch_size=16),
    "05_sweep_and_report.ipynb": dict(clients=4, local_steps=2, target_accuracy=0.99, max_updates=2,
                                      # exp alone: its base held Pareto's speed_reference_time, which
                                      # a sweep of exp cells refused
                                      algorithms=["fedavg", "fedbuff"], speed_models=["exp"], seeds=[0, 1]),
}
# What each notebook's last cell reports (an expression over the notebook's variables), and the figures it draws.
KEY_RESULTS = {
    "01_quickstart.ipynb": """{"algorithms": [row["algorithm"] for row in comparison.rows],
                               "updates": [r.summary["global_updates"] for r in comparison.results],
                               "fedbuff_updates": summary["global_updates"], "events": run.num_events}""",
    "02_async_vs_sync.ipynb": """{speeds: {r.summary["algorithm"]: r.summary["timeline"]["utilisation"]["mean"]
                                           for r in comparisons[speeds].results} for speeds in speed_models}""",
    "03_your_own_algorithm.ipynb": """{r.summary["algorithm"]: r.summary["accounting"]["dropped_by_reason"]
                                      for r in comparison.results}""",
    "04_kernels_in_your_jax_code.ipynb": "history",
    "05_sweep_and_report.ipynb": """{"cells": [(row["algorithm"], row["seed"], row["global_updates"]) for row in result.rows],
                                  "rerun": [len(again.ran), len(again.skipped)], "markdown": report.markdown,
                                  "space": [(row["algorithm"], row["port.min_clients"], row["port.staleness_bound"])
                                            for row in space.rows if row["seed"] == 0],
                                  "grid": space_report.grid_markdown}""",
}
FIGURES = {"01_quickstart.ipynb": 2, "02_async_vs_sync.ipynb": 5, "03_your_own_algorithm.ipynb": 1,
           "04_kernels_in_your_jax_code.ipynb": 1, "05_sweep_and_report.ipynb": 4}


def test_every_numbered_notebook_is_tested():
    assert NOTEBOOKS == sorted(TINY) == sorted(KEY_RESULTS) == sorted(FIGURES)


def parameters_index(notebook) -> int:
    tagged = [i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1 and notebook.cells[tagged[0]].cell_type == "code", "one code cell tagged 'parameters'"
    return tagged[0]


def with_parameters(notebook, values: dict):
    """The notebook with a cell assigning ``values`` after its parameters cell (papermill's way);
    every name given must be a parameter the notebook declares."""
    index = parameters_index(notebook)
    declared = set(re.findall(r"^(\w+)\s*=", notebook.cells[index].source, re.MULTILINE))
    assert set(values) <= declared, f"not parameters of the notebook: {sorted(set(values) - declared)}"
    source = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))
    return notebook


def png_outputs(notebook) -> list[str]:
    return [output["data"]["image/png"] for cell in notebook.cells if cell.cell_type == "code"
            for output in cell.get("outputs", []) if "image/png" in output.get("data", {})]


def text_of(cell) -> str:
    return "".join(output.get("text", "") for output in cell.get("outputs", []))


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_at_tiny_size(name, tmp_path, monkeypatch):
    notebook = with_parameters(nbformat.read(os.path.join(NOTEBOOK_DIR, name), as_version=4), TINY[name])
    notebook.cells.append(nbformat.v4.new_code_cell(f"import json\nprint({RESULT!r}, json.dumps({KEY_RESULTS[name]}))"))
    # the kernel imports this checkout's jaxfl and shares the test session's compilation cache
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    for variable, value in sharing_compilations().items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()

    assert len(png_outputs(notebook)) == FIGURES[name]
    printed = text_of(notebook.cells[-1])
    result = json.loads(printed[printed.index(RESULT) + len(RESULT):])
    if name.startswith("01"):
        assert result["algorithms"] == ["fedavg", "fedavgm", "fedasync", "fedbuff", "fedcompass"]
        assert result["updates"] == [3] * 5 and result["fedbuff_updates"] == 3 and result["events"] > 0
        assert os.path.isfile(tmp_path / "runs" / "comparison" / "comparison.png")  # compare() wrote into its folder
    elif name.startswith("02"):
        # a synchronous round waits for its slowest client; FedBuff's clients never wait
        assert result["pareto"]["fedbuff"] == 1.0 and result["pareto"]["fedavg"] < 0.9
        assert result["homo"]["fedavg"] > result["pareto"]["fedavg"]
    elif name.startswith("03"):
        assert result["fedavg"] == {} and result["fedasync"] == {}
        assert result["fedasync_cutoff"]["staler than max_staleness"] > 0  # max_staleness 0 drops every stale one
        assert "cutoff.max_staleness=-1 is not allowed" in "".join(text_of(cell) for cell in notebook.cells)
    elif name.startswith("05"):
        assert result["cells"] == [["fedavg", 0, 2], ["fedavg", 1, 2], ["fedbuff", 0, 2], ["fedbuff", 1, 2]]
        assert result["rerun"] == [0, 4]  # the second call finds every cell finished
        assert "| fedbuff | – |" in result["markdown"]  # nobody reaches 99% in 2 updates: "–"
        assert (tmp_path / "sweeps" / "05_sweep" / "results.parquet").is_file()
        # the design space: FedAvg once, PORT at each K × Ω; nobody reaches 99%: every grid cell "–"
        assert result["space"] == [["fedavg", None, None], ["port", 1, 3], ["port", 1, "inf"], ["port", 3, 3],
                                   ["port", 3, "inf"]]
        assert "| port.min_clients \\ port.staleness_bound | 3 | inf |" in result["grid"]
        assert "| 1 | – | – |" in result["grid"] and "| 3 | – | – |" in result["grid"]
    else:
        assert set(result) == {"FedAvg", "stale, weights p_i", "stale, weights st(s) p_i / Σ"}
        assert all(len(curve) == TINY[name]["rounds"] + 1 for curve in result.values())
        assert result["FedAvg"][-1] > result["FedAvg"][0] + 0.1  # it learns


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_is_small_clean_and_executed(name):
    path = os.path.join(NOTEBOOK_DIR, name)
    assert os.path.getsize(path) < MAX_FILE_BYTES
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    parameters_index(notebook)
    assert not any("injected-parameters" in cell.metadata.get("tags", []) for cell in notebook.cells)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    # executed top to bottom at the default size, as a reader opens it: figures in, no errors, no local paths
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    assert not any(output.output_type == "error" for cell in code for output in cell.outputs)
    figures = png_outputs(notebook)
    assert len(figures) == FIGURES[name] and all(len(png) < MAX_PNG_BYTES for png in figures)
    with open(path) as handle:
        text = handle.read()
    assert ROOT not in text and "/tmp/" not in text
