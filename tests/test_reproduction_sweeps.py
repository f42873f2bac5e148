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


def test_seed2_exp_runs_each_missing_cell_once_and_keeps_its_table(tmp_path):
    # the script that runs the long seed-2 cells across sessions, on a copy of its folder with a stand-in
    # jaxfl that writes each one-cell sweep's table: every cell of a grid once, none again once its table is kept
    import shutil
    import stat
    import subprocess

    folder = tmp_path / "benchmarks" / "reproduction"
    folder.mkdir(parents=True)
    shutil.copy(os.path.join(FOLDER, "seed2_exp.sh"), folder)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "jaxfl"
    fake.write_text('#!/bin/sh\necho "$*" >> "$CALLS"\nfor last; do :; done\nmkdir -p "$last"\n'
                    'printf "cell,algorithm,seed,time_to_target\\n0,fedcompass,2,12.5\\n" > "$last/results.csv"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CALLS": str(calls)}

    def run(*arguments):
        return subprocess.run(["bash", str(folder / "seed2_exp.sh"), *arguments], env=env, capture_output=True,
                              text=True, timeout=60)

    assert run("0", "1", "qratio").returncode == 0
    commands = calls.read_text().splitlines()
    assert [command.split("--compass.q-min ")[1].split()[0] for command in commands] == \
        ["10", "20", "80", "120", "160", "200"]
    assert all(command.startswith("sweep benchmarks/reproduction/fedcompass_qratio.toml --size cpu --seed 2 "
                                  "--heterogeneity exp ") for command in commands)
    tables = folder / "results" / "fedcompass-qratio-cpu-seed2-exp"
    assert sorted(path.name for path in tables.iterdir()) == sorted(f"q_min-{q}.csv" for q in (10, 20, 80, 120, 160, 200))
    # the ablation's other tables have its Q_min as a column, which the report groups by; the one-cell
    # sweeps took it as a base setting, so the script adds it
    assert (tables / "q_min-80.csv").read_text() == "cell,algorithm,seed,compass.q_min,time_to_target\n" \
                                                    "0,fedcompass,2,80,12.5\n"
    assert run("0", "1", "qratio").returncode == 0 and len(calls.read_text().splitlines()) == 6  # all kept: none again
    calls.unlink()
    assert run("1", "2").returncode == 0  # the FedCompass grid's second stream: every other cell of 32
    commands = calls.read_text().splitlines()
    assert (folder / "results" / "fedcompass-cpu-seed2-exp" / "fedavg-c5-dual_dirichlet.csv").read_text() == \
        "cell,algorithm,seed,time_to_target\n0,fedcompass,2,12.5\n"  # its cells' settings are columns already
    assert len(commands) == 16 and commands[0].startswith("sweep benchmarks/reproduction/fedcompass.toml --size cpu "
                                                          "--seed 2 --heterogeneity exp --algorithm fedavg --clients 5 "
                                                          "--partition dual_dirichlet --no-progress --out ")
    refused = run("0", "1", "bogus")
    assert refused.returncode == 2 and "GRID bogus is not allowed: fedcompass or qratio" in refused.stderr
