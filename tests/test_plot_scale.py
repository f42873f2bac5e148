"""Timeline plots from either event-log format, and the aggregated views for many clients."""
import csv
import json
import os

import numpy as np
import pytest

from jaxfl import plot
from jaxfl.runlog import EventLog, dispatch_intervals, read_events
from test_runlog import rows_of, synthetic_events

pytest.importorskip("matplotlib")
pytest.importorskip("pyarrow")


def make_run(folder, clients: int, rounds: int, format: str = "auto", federation: int | None = None,
             **options) -> str:
    """A run directory holding only what plot_timeline reads: config.json and the event log.
    ``federation``: the configured number of clients, where only ``clients`` of them take part."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump({"config": {"algorithm": "fedbuff", "data": {"clients": federation or clients}}}, handle)
    columns = synthetic_events(clients=clients, rounds=rounds)
    with EventLog(str(folder), format=format, **options) as log:
        for row in rows_of(columns):
            log.write(row)
    return str(folder)


def test_many_clients_plot_aggregated_views_from_parquet(tmp_path):
    run_dir = make_run(tmp_path / "run", clients=500, rounds=20, switch_rows=2000)
    assert os.path.isdir(os.path.join(run_dir, "events"))
    out = plot.plot_timeline(run_dir, str(tmp_path / "timeline.png"), bins=100)
    assert open(out, "rb").read(4) == b"\x89PNG" and os.path.getsize(out) > 20_000


def test_few_clients_keep_the_gantt_chart_from_either_format(tmp_path):
    for format in ("csv", "parquet"):
        run_dir = make_run(tmp_path / format, clients=6, rounds=5, format=format)
        out = plot.plot_timeline(run_dir, str(tmp_path / f"{format}.png"))
        assert os.path.getsize(out) > 10_000
    # the threshold decides: the same small run drawn aggregated
    plot.plot_timeline(str(tmp_path / "csv"), str(tmp_path / "agg.png"), max_clients=3)
    assert os.path.getsize(tmp_path / "agg.png") > 10_000


def test_busy_intervals_from_columns_match_the_row_reader(tmp_path):
    run_dir = make_run(tmp_path, clients=5, rounds=6, format="csv")
    with open(os.path.join(run_dir, "events.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert plot.busy_intervals(read_events(run_dir)) == plot.busy_intervals(rows)


def test_busy_profile_matches_a_brute_force_count():
    columns = synthetic_events(clients=40, rounds=8)
    end = float(columns["time"].max())
    edges = np.linspace(0.0, end, 33)
    profile = plot.busy_profile(columns, edges)
    spans = dispatch_intervals(columns, horizon=end)
    grid = np.linspace(0.0, end, 200_001)[:-1] + end / 400_000  # midpoints of a fine grid
    busy = np.zeros(len(grid))
    for start, stop in zip(spans["start"], spans["end"]):
        busy += (grid >= start) & (grid < stop)
    which = np.searchsorted(edges, grid, side="right") - 1
    for b in range(len(edges) - 1):
        inside = busy[which == b]
        assert profile["mean"][b] == pytest.approx(inside.mean(), abs=0.05)
        assert profile["min"][b] <= inside.min() and profile["max"][b] >= inside.max()
    assert profile["max"].max() <= 40


def test_binned_quantiles_match_numpy_per_bin():
    rng = np.random.default_rng(1)
    times, values = rng.uniform(0, 10, 5000), rng.integers(0, 100, 5000)
    edges = np.linspace(0, 12, 13)  # the last two bins are empty
    result = plot.binned_quantiles(times, values, edges)
    for b in range(12):
        inside = values[(times >= edges[b]) & (times < edges[b + 1])]
        if len(inside):
            assert result[:, b].tolist() == np.quantile(inside, [0.1, 0.5, 0.9], method="lower").tolist()
        else:
            assert np.isnan(result[:, b]).all()


def test_in_flight_axis_runs_to_the_peak_in_a_large_federation(tmp_path):
    # 200 clients in flight out of 10^6: on an axis to 10^6 they were a flat line at 0
    run_dir = make_run(tmp_path / "run", clients=200, rounds=5, format="csv", federation=1_000_000)
    figure = plot.timeline_figure(run_dir, bins=50)
    busy = figure.axes[0]
    assert busy.get_ylim() == (0.0, 220.0)  # 10 % above the peak of 200
    assert "1,000,000" in busy.get_ylabel() and "1,000,000 clients" in busy.get_title()
    assert "at most 200 in flight" in busy.get_title()
    many = plot.timeline_figure(make_run(tmp_path / "many", clients=500, rounds=20, format="csv"), bins=50)
    assert "1,000 aggregations" in many.axes[0].get_title()  # as the clients are written (was "1000")
    # no line at the federation's size, which is far out of view
    assert [text.get_text() for text in busy.get_legend().get_texts()] == ["min–max in bin",
                                                                          "time-weighted mean in bin"]


def test_in_flight_axis_keeps_the_federation_where_most_clients_train(tmp_path):
    run_dir = make_run(tmp_path / "run", clients=100, rounds=5, format="csv")  # every client always busy
    busy = plot.timeline_figure(run_dir, bins=50).axes[0]
    assert busy.get_ylim() == (0.0, 105.0)
    assert "all 100 clients" in [text.get_text() for text in busy.get_legend().get_texts()]
    assert len(busy.get_lines()) == 2  # the mean and the federation's dashed line


def test_a_time_axis_past_the_run_s_end_shows_nobody_in_flight_after_it(tmp_path):
    """``jaxfl timeline --max-time`` beyond a run's end (runs side by side on one axis): the
    aggregated view drew the clients still in flight at the end as in flight up to the axis's end,
    where the Gantt chart ends their bars at the run's end. Now both stop there, marked."""
    import jaxfl

    result = jaxfl.run_experiment(jaxfl.RunConfig(
        algorithm="fedbuff", dataset="synthetic_iid", partition="natural", model="logreg", clients=200,
        concurrency=50, max_updates=20, timing_only=True, progress=False, output_dir=str(tmp_path)))
    end = result.summary["virtual_time"]
    figure = plot.timeline_figure(result.run_dir, max_time=4 * end, bins=40, max_clients=60)
    busy = figure.axes[0]
    mean = busy.get_lines()[0]
    assert mean.get_label() == "time-weighted mean in bin"
    centres, level = np.asarray(mean.get_xdata()), np.asarray(mean.get_ydata())
    assert level[centres < end * 0.9].max() == pytest.approx(50)  # 50 in flight while it ran
    assert level[centres > end * 1.1].max() == 0  # nobody after its end
    assert any(text.get_text() == " run's end" for text in busy.texts)
    assert "50 in flight" in busy.get_title()
