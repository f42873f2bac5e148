"""The reproduction README's report tables are what `jaxfl report` makes of the committed results
CSVs today: a change to the report, or a CSV re-committed, that would leave a published table
stale fails here, not in a reader's hands."""
import pathlib

import pytest

from jaxfl.report import make_report

ROOT = pathlib.Path(__file__).resolve().parent.parent
REPRODUCTION = ROOT / "benchmarks" / "reproduction"

# (the section's heading, its results CSVs, the report's reference, the least number of its tables
# that must be the report's: the rest are tables written by hand, each with a header of its own;
# and the report's design grid, where it has one)
SECTIONS = [
    ("### FedCompass Q_min/Q_max ablation, cpu size",
     ["fedcompass-qratio-cpu-seeds01.csv", "fedcompass-qratio-cpu-seed2-homo-normal.csv"]
     + [f"fedcompass-qratio-cpu-seed2-exp/q_min-{q_min}.csv" for q_min in (10, 20, 40, 80, 120, 160, 200)],
     "fedcompass compass.q_min=40", 3),
    ("### FedCompass cpu size, seeds 0, 1 and 2", ["fedcompass-cpu-seeds01.csv", "fedcompass-cpu-seed2-homo-normal.csv"],
     "fedcompass", 3),
    ("### FedCompass cpu size, all 288 runs",
     ["fedcompass-cpu-seeds01.csv", "fedcompass-cpu-seed2-homo-normal.csv"]
     + [f"fedcompass-cpu-seed2-exp/{algorithm}-c{clients}-{partition}.csv"
        for algorithm in ("fedasync", "fedat", "fedavg", "fedavgm", "fedbuff", "fedcompass", "fedcompass_m",
                          "fedcompass_n")
        for clients in (5, 10) for partition in ("class", "dual_dirichlet")],
     "fedcompass", 3),
    ("### CC-FedAvg full size, seeds 0–4",
     [f"ccfedavg-full-seed{seed}.csv" for seed in range(5)] + [f"ccfedavg-full-3060-seed{seed}.csv" for seed in range(5)],
     "fedavg", 7),
    ("### FedASMU cpu size", ["fedasmu-cpu-seeds012.csv"], "fedavg", 3),
    ("### FedASMU full size", ["fedasmu-full-seeds012.csv"], "fedavg", 6),
    ("### FedASMU with round times", ["fedasmu-cpu-round-seed0.csv"], "fedavg", 1),
    ("### PORT full size, seed 1", ["port-full-seed1.csv"], "fedavg", 3, ("port.min_clients", "port.staleness_bound")),
    ("### PORT full size, seed 2", ["port-full-seed2-pareto.csv", "port-full-seed2-zipf.csv"], "fedavg", 2,
     ("port.min_clients", "port.staleness_bound")),
    ("### PORT full size, seeds 0–2",
     ["port-full-seed0-pareto.csv", "port-full-seed0-zipf.csv", "port-full-seed1.csv", "port-full-seed2-pareto.csv",
      "port-full-seed2-zipf.csv"], "fedavg", 2, ("port.min_clients", "port.staleness_bound")),
    ("### PORT full size with whole passes, seed 0", ["port-full-epochs-seed0.csv"], "fedavg", 2,
     ("port.min_clients", "port.staleness_bound")),
    ("### PORT full size with whole passes, seeds 0–2 under Pareto",
     ["port-full-epochs-seed0.csv", "port-full-epochs-seed1-pareto.csv", "port-full-epochs-seed2-pareto.csv"], "fedavg", 1,
     ("port.min_clients", "port.staleness_bound")),
    ("### PORT full size with whole passes, seeds 0–2 under Zipf",
     ["port-full-epochs-seed0.csv", "port-full-epochs-seed1-zipf.csv", "port-full-epochs-seed2-zipf.csv"], "fedavg", 1,
     ("port.min_clients", "port.staleness_bound")),
]


def _section(lines: list[str], heading: str) -> list[str]:
    starts = [number for number, line in enumerate(lines) if line.startswith(heading)]
    assert len(starts) == 1, f"{heading!r} should head one section of benchmarks/reproduction/README.md"
    end = next((number for number in range(starts[0] + 1, len(lines))
                if lines[number].startswith(("## ", "### "))), len(lines))
    return lines[starts[0]:end]


def _tables(lines: list[str]) -> list[list[str]]:
    tables, table = [], []
    for line in [*lines, ""]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            tables.append(table)
            table = []
    return tables


@pytest.mark.parametrize("heading, csvs, reference, least, grid", [(*s, None)[:5] for s in SECTIONS],
                         ids=[s[0][4:40] for s in SECTIONS])
def test_the_readme_tables_are_the_report_of_the_committed_csvs(heading, csvs, reference, least, grid, tmp_path):
    section = _section((REPRODUCTION / "README.md").read_text().splitlines(), heading)
    report = make_report([str(REPRODUCTION / "results" / name) for name in csvs], reference, str(tmp_path),
                         figures=False, grid=grid).markdown
    report_lines = report.splitlines()
    theirs = [table for table in _tables(section) if table[0] in report_lines]  # the header: a report's table
    assert len(theirs) >= least, f"{heading}: {len(theirs)} of the report's tables found, expected {least} or more"
    for table in theirs:
        assert "\n".join(table) in report, (
            f"{heading}: the table under {table[0][:80]!r} is not what jaxfl report makes of "
            f"{', '.join(csvs)} now; regenerate it with jaxfl report {' '.join('results/' + c for c in csvs)} "
            f"--reference {reference!r} --no-figures{' --grid ' + ','.join(grid) if grid else ''}")
