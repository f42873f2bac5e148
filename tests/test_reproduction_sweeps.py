"""The committed sweep files of benchmarks/reproduction/ (the four seed papers' comparisons): every
size expands and every cell validates, without training; the grids hold the papers' methods."""
import glob
import os

import pytest

from jaxfl.config import load_config_file
from jaxfl.sweep import expand, load_sweep_file

FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "reproduction")
FILES = sorted(glob.glob(os.path.join(FOLDER, "*.toml")))


def _sizes(path):
    return list(load_config_file(path).get("sizes", {}))


def test_one_sweep_file_per_paper_and_the_ablation():
    assert [os.path.basename(path) for path in FILES] == [
        "ccfedavg.toml", "fedasmu.toml", "fedcompass.toml", "fedcompass_qratio.toml", "port.toml"]


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_every_size_expands_and_every_cell_validates(path, tmp_path):
    sizes = _sizes(path)
    assert {"quick", "full"} <= set(sizes)
    counts = {}
    for size in sizes:
        cells, _ = expand(*load_sweep_file(path, size), str(tmp_path / size))  # validates every cell
        assert cells and len({cell.run_dir for cell in cells}) == len(cells)
        counts[size] = len(cells)
    assert counts["quick"] <= 12 < counts["full"]  # quick is minutes on a CPU, full is the paper's grid


def _methods(name, size):
    cells, _ = expand(*load_sweep_file(os.path.join(FOLDER, name), size), "sweeps/x")
    return cells, {" ".join([cell.config.algorithm] + [f"{key}={value}" for key, value in cell.values.items()
                                                        if "." in key]) for cell in cells}


def test_the_grids_hold_each_papers_methods():
    cells, methods = _methods("fedcompass.toml", "full")
    assert {cell.config.algorithm for cell in cells} == {
        "fedavg", "fedavgm", "fedasync", "fedbuff", "fedat", "fedcompass", "fedcompass_m", "fedcompass_n"}
    assert len(cells) == 8 * 2 * 3 * 2 * 5
    assert {(cell.config.clients, cell.config.heterogeneity, cell.config.partition) for cell in cells} == {
        (m, h, p) for m in (5, 10) for h in ("homo", "normal", "exp") for p in ("class", "dual_dirichlet")}
    m20, _ = _methods("fedcompass.toml", "full_m20")
    assert {(cell.config.clients, cell.config.local_steps) for cell in m20} == {(20, 100)}
    assert {cell.config.buffer_size for cell in m20 if cell.config.algorithm == "fedbuff"} == {5}

    # the CPU sizes: the full grids with the MLP in place of the paper's CNN / LeNet-5 (no GPU)
    for name in ("fedcompass.toml", "fedasmu.toml", "fedcompass_qratio.toml"):
        full, full_methods = _methods(name, "full")
        cpu, cpu_methods = _methods(name, "cpu")
        assert cpu_methods == full_methods and {cell.config.model for cell in cpu} == {"mlp"}
        assert {cell.config.seed for cell in cpu} == {0, 1, 2}
        def setting(cell):  # everything but the model and the seed
            return (tuple((k, v) for k, v in cell.values.items() if k != "seed"), cell.config.local_steps,
                    cell.config.local_epochs, cell.config.target_accuracy, cell.config.max_time,
                    cell.config.max_client_updates, cell.config.algorithm_options)
        assert {setting(cell) for cell in cpu} == {setting(cell) for cell in full}

    cells, methods = _methods("port.toml", "full")
    # K, Ω and the urgent pull reach only the PORT cells: 3 baselines + 5 × 4 × 2 PORT points
    assert len(methods) == 3 + 5 * 4 * 2 and len(cells) == 43 * 2 * 3
    assert "port port.min_clients=20 port.staleness_bound=inf port.urgent_pull=False" in methods
    assert {cell.config.heterogeneity for cell in cells} == {"pareto", "zipf"}

    cells, methods = _methods("ccfedavg.toml", "full")
    assert "fedavg" in methods and len(methods) == 1 + 5 * 2
    # Table II's six participations, five seeds
    assert {cell.config.clients_per_round for cell in cells} == {10, 20, 30, 40, 60, 80} and len(cells) == 11 * 6 * 5
    assert {cell.config.algorithm_options.strategy for cell in cells if cell.config.algorithm == "ccfedavg"} == {
        "cc", "cc_c", "strategy1", "strategy2", "dropout"}

    cells, methods = _methods("fedasmu.toml", "full")
    # FedASMU, -FA, -DA and -0 against FedAvg, FedAsync, FedBuff and PORT under the uniform speed model
    assert {method for method in methods if method.startswith("fedasmu")} == {
        f"fedasmu fedasmu.fetch={fetch} fedasmu.dynamic={dynamic}" for fetch in (True, False) for dynamic in (True, False)}
    assert {cell.config.heterogeneity for cell in cells} == {"uniform"}
    assert {cell.config.speed_ratio for cell in cells} == {5.0, 110.0, 440.0}
