"""The report's staleness histograms and client timelines follow the tables' groups: a sweep over
two concurrencies drew one FedBuff histogram of both ("fedbuff: 4 runs, mean 52.34" against the
tables' 9.85 and 94.83) and only the first group's timeline, without saying which run it was."""
import os

import pytest

from jaxfl import plot, report
from jaxfl.report import make_report
from jaxfl.sweep import run_sweep

pytest.importorskip("matplotlib")

GRID = {"algorithm": ["fedbuff", "fedasync"], "concurrency": [2, 6], "seed": [0, 1]}


@pytest.fixture(scope="module")
def timing_sweep(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("groups") / "sweep")
    return run_sweep({"timing_only": True, "model": "logreg", "dataset": "synthetic_iid", "partition": "natural",
                      "clients": 80, "max_updates": 30, "buffer_size": 2}, GRID, folder, progress=False)


def drawn_figures(monkeypatch) -> dict[str, object]:
    """Every figure the report saves, by file name (still written to disk)."""
    figures = {}

    def keep(figure, path):
        figures[os.path.basename(path)] = figure
        return original(figure, path)

    original = plot.save_figure
    monkeypatch.setattr(plot, "save_figure", keep)  # the timelines
    monkeypatch.setattr(report, "save_figure", keep)  # the report's own figures
    return figures


def test_staleness_has_a_panel_per_group_and_method_with_the_table_s_mean(timing_sweep, tmp_path, monkeypatch):
    figures = drawn_figures(monkeypatch)
    made = make_report(timing_sweep.sweep_dir, out=str(tmp_path / "r"))
    panels = [axes for axes in figures["staleness.png"].axes if axes.axison]
    assert len(panels) == 4  # 2 concurrencies × 2 methods, not one panel a method
    titles = [axes.get_title() for axes in panels]
    # a row per group, in the tables' order, each panel named by its group, method and runs
    assert [title.splitlines()[0] for title in titles] == ["concurrency=2"] * 2 + ["concurrency=6"] * 2
    for title, line in zip(titles, made.rows):
        assert title.splitlines()[1] == f"{line['method']}: 2 runs, mean of their means {line['mean_staleness_mean']:.2f}"
    assert len({title.splitlines()[1] for title in titles}) == 4  # the groups' means differ


def test_a_timeline_per_group_and_method_names_the_run_it_shows(timing_sweep, tmp_path, monkeypatch):
    figures = drawn_figures(monkeypatch)
    made = make_report(timing_sweep.sweep_dir, out=str(tmp_path / "r"))
    timelines = sorted(name for name in map(os.path.basename, made.figures) if name.startswith("timeline-"))
    assert timelines == ["timeline-fedasync-concurrency2.png", "timeline-fedasync-concurrency6.png",
                         "timeline-fedbuff-concurrency2.png", "timeline-fedbuff-concurrency6.png"]
    title = figures["timeline-fedbuff-concurrency6.png"].axes[0].get_title()
    assert title.startswith("fedbuff, concurrency=6, seed 0 (1 of 2 runs): 80 clients, at most 6 in flight")


def test_one_group_keeps_its_figure_names_and_plain_titles(timing_sweep, tmp_path, monkeypatch):
    folder = str(tmp_path / "one")
    run_sweep({"timing_only": True, "model": "logreg", "dataset": "synthetic_iid", "partition": "natural",
               "clients": 8, "max_updates": 6, "concurrency": 4}, {"algorithm": ["fedbuff"], "seed": [0]}, folder,
              progress=False)
    figures = drawn_figures(monkeypatch)
    made = make_report(folder, out=str(tmp_path / "r"))
    assert sorted(map(os.path.basename, made.figures)) == ["staleness.png", "timeline-fedbuff.png"]
    (panel,) = [axes for axes in figures["staleness.png"].axes if axes.axison]
    assert panel.get_title().startswith("fedbuff: 1 run, mean ")
    assert figures["timeline-fedbuff.png"].axes[0].get_title() == "fedbuff, seed 0: client activity"  # a Gantt chart


def test_trained_and_timing_only_runs_are_groups_of_their_own():
    rows = [{"algorithm": "fedbuff", "clients": c, "seed": 0} for c in (5, 10)]
    groups = report.figure_groups(report._grouping(rows), report._grouping(rows[:1]))
    assert list(groups) == ["trained, clients=5", "trained, clients=10", "timing-only"]
    assert [len(by_method["fedbuff"]) for by_method in groups.values()] == [1, 1, 1]


def test_timing_rows_of_a_table_from_before_the_aggregated_column_keep_their_steps_beside_new_ones():
    # reported together, the old rows hold the column as None: their steps (under the executed name) counted
    from jaxfl.report import _grouping, summarise_timing

    rows = [{"algorithm": "fedavg", "seed": 0, "client_steps_executed": None, "client_steps_aggregated": 360},
            {"algorithm": "fedavg", "seed": 1, "client_steps_executed": 999, "client_steps_aggregated": None}]
    (line,) = summarise_timing(_grouping(rows))
    assert line["client_steps_aggregated_mean"] == 679.5
