"""What a run's outputs say: the timeline figures (every client, the whole run, a legend), the final
evaluation under --eval-every, the two staleness histograms' names, the report's 0 s references and
its std, and the timing-only line. Tiny hand-written logs and runs: a few seconds in all."""
import json
import os

import numpy as np
import pytest

from jaxfl.runlog import EventLog


def event(time, kind, client=-1, dispatch=None, version=0, staleness=None, steps=None, detail=None):
    return {"time": time, "event": kind, "client": client, "dispatch": dispatch, "version": version,
            "staleness": staleness, "steps": steps, "detail": detail}


def write_run(folder, rows, clients, virtual_time, algorithm="fedbuff"):
    """A run directory holding what the timeline reads: config.json, summary.json, the event log."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump({"config": {"algorithm": algorithm, "data": {"clients": clients}}}, handle)
    with open(os.path.join(folder, "summary.json"), "w") as handle:
        json.dump({"algorithm": algorithm, "clients": clients, "virtual_time": virtual_time}, handle)
    with EventLog(str(folder), format="csv") as log:
        for row in rows:
            log.write(row)
    return str(folder)


# client 0 trains and arrives at 1.0 (an aggregation), and is sent again (in flight at the end);
# client 1 is in flight from 0 to the end; client 2 crashes at 0.5; client 3 is never dispatched.
# The run's time budget ends at 3.0, the log at 1.0.
FOUR_CLIENTS = [event(0.0, "dispatch", 0, 0, steps=5), event(0.0, "dispatch", 1, 1, steps=5),
                event(0.0, "dispatch", 2, 2, steps=5, detail="crash"), event(0.5, "crash", 2, 2, steps=5),
                event(1.0, "arrival", 0, 0, staleness=0, steps=5), event(1.0, "aggregate", version=1,
                                                                           detail="1 updates"),
                event(1.0, "dispatch", 0, 3, version=1, steps=5)]


def bars_by_row(axes):
    """``{row: [(start, end), ...]}`` of the Gantt chart's unhatched bars."""
    bars = {}
    for collection in axes.collections:
        if collection.get_hatch():
            continue
        for path in collection.get_paths():
            (x0, y0), (x1, y1) = path.vertices.min(axis=0), path.vertices.max(axis=0)
            bars.setdefault(round((y0 + y1) / 2), []).append((round(float(x0), 6), round(float(x1), 6)))
    return {row: sorted(spans) for row, spans in bars.items()}


# --------------------------------------------------------------------------- 1. the Gantt chart
def test_the_gantt_chart_draws_every_client_in_flight_and_crashed_dispatches_to_the_runs_end(tmp_path):
    pytest.importorskip("matplotlib")
    from jaxfl.plot import timeline_figure

    axes = timeline_figure(write_run(tmp_path, FOUR_CLIENTS, clients=4, virtual_time=3.0)).axes[0]
    assert [label.get_text() for label in axes.get_yticklabels()] == [f"client {c}" for c in range(4)]
    assert axes.get_xlim() == (0.0, 3.0)  # the run's virtual_time, not the last event (1.0) or 1 s
    assert bars_by_row(axes) == {0: [(0.0, 1.0), (1.0, 3.0)], 1: [(0.0, 3.0)], 2: [(0.0, 0.5)]}
    crashes = [line for line in axes.get_lines() if line.get_marker() == "x"]
    assert len(crashes) == 1 and crashes[0].get_xydata().tolist() == [[0.5, 2.0]]
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert "crashed (client stops)" in legend and "global aggregation" in legend


# --------------------------------------------------------------------------- 2. the aggregated views
def test_the_aggregated_timeline_runs_to_the_runs_virtual_time(tmp_path):
    pytest.importorskip("matplotlib")
    from jaxfl.plot import timeline_figure

    figure = timeline_figure(write_run(tmp_path, FOUR_CLIENTS, clients=4, virtual_time=3.0), max_clients=2, bins=10)
    assert figure.axes[-1].get_xlim() == (0.0, 3.0)
    # busy: client 0 over [0, 3], client 1 over [0, 3], client 2 over [0, 0.5]: 12 - 6.5 idle client-s
    # and one aggregation in 3 s, 1200 an hour (the log alone, to 1.0 s, said 3600)
    title = figure.axes[0].get_title()
    assert "5.5 idle client-s" in title and "1 aggregations (1.2e+03/virtual h)" in title
    # no staleness below 0 in view (all zero spanned -0.04 to 0.04), and one client is not "1 clients"
    assert figure.axes[-1].get_ylim() == (0.0, 1.0)
    from jaxfl.plot import GANTT_MAX_AGGREGATIONS

    one = []  # one client's long run: more aggregations than a Gantt chart shows
    for number in range(GANTT_MAX_AGGREGATIONS + 1):
        one += [event(float(number), "dispatch", 0, number, version=number, steps=1),
                event(number + 1.0, "arrival", 0, number, version=number, staleness=0, steps=1),
                event(number + 1.0, "aggregate", version=number + 1, detail="1 updates")]
    figure = timeline_figure(write_run(tmp_path / "one", one, clients=1, virtual_time=len(one) / 3), bins=10)
    assert figure.axes[0].get_title().startswith("fedbuff: 1 client, at most 1 in flight")


# --------------------------------------------------------------------------- 6. the Gantt chart's colours
def test_the_gantt_legend_names_labels_in_numeric_order_and_says_when_there_is_none(tmp_path):
    pytest.importorskip("matplotlib")
    from jaxfl.plot import timeline_figure

    def grouped(groups):
        rows = []
        for number, group in enumerate(groups):
            rows += [event(float(number), "dispatch", 0, number, steps=1, detail=f"group {group}"),
                     event(number + 0.5, "arrival", 0, number, staleness=0, steps=1)]
        return rows

    # "group 2; dropout 1.0 s" is coloured as group 2: the hatch shows the dropout
    rows = grouped([10, 2, 1]) + [event(3.0, "dispatch", 1, 3, steps=1, detail="group 2; dropout 1.0 s"),
                                  event(4.5, "arrival", 1, 3, staleness=0, steps=1)]
    axes = timeline_figure(write_run(tmp_path / "few", rows, clients=2, virtual_time=5.0)).axes[0]
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend[:3] == ["group 1", "group 2", "group 10"]
    assert "dropout / delay: offline or late s" in legend
    many = timeline_figure(write_run(tmp_path / "many", grouped(range(25)), clients=1, virtual_time=25.0)).axes[0]
    legend = [text.get_text() for text in many.get_legend().get_texts()]
    assert not any(text.startswith("group") for text in legend)
    assert "25 labels: no legend, colours repeat every 20" in many.get_xlabel()


# --------------------------------------------------------------------------- 4. two staleness histograms
def test_the_logs_histogram_is_named_for_arrivals_not_as_the_summarys_aggregated_one(tmp_path):
    from jaxfl.config import RunConfig
    from jaxfl.experiment import run_experiment
    from jaxfl.runlog import read_events, timeline_stats

    result = run_experiment(RunConfig(algorithm="fedbuff", clients=12, model="logreg", local_steps=2, buffer_size=3,
                                      concurrency=6, max_updates=8, timing_only=True, progress=False,
                                      heterogeneity="exp", output_dir=str(tmp_path)))
    events = read_events(result.run_dir)
    stats = timeline_stats(events, num_clients=12, horizon=result.summary["virtual_time"])
    assert not any(key.startswith("staleness") for key in stats)  # nothing reads as the summary's
    arrived = events["staleness"][events["event"] == "arrival"]
    assert stats["arrival_staleness_histogram"] == {str(s): int(n) for s, n in enumerate(np.bincount(arrived)) if n}
    assert stats["arrival_staleness_mean"] == pytest.approx(arrived.mean())
    assert stats["arrival_staleness_max"] == int(arrived.max())
    # the summary's counts the aggregated updates only, at aggregation: the log's counts every arrival
    aggregated = result.summary["timeline"]["staleness_histogram"]
    assert sum(aggregated.values()) == result.summary["accounting"]["aggregated"] == 24
    assert sum(stats["arrival_staleness_histogram"].values()) == stats["arrivals"]


# --------------------------------------------------------------------------- 3. the final model's accuracy
EVERY = dict(algorithm="fedavg", clients=3, model="logreg", local_steps=2, batch_size=16, progress=False,
             checkpoint_every=None, max_updates=5, eval_every=3, stop_at_target=False)


@pytest.fixture(scope="module")
def every_three(tmp_path_factory):
    from jaxfl.config import RunConfig
    from jaxfl.experiment import run_experiment

    return run_experiment(RunConfig(**EVERY, output_dir=str(tmp_path_factory.mktemp("every"))))


def test_eval_every_evaluates_the_final_model_too(every_three):
    result = every_three
    # versions 0 and 3 on the cadence, and the final version 5 at the time it was made
    assert [row["version"] for row in result.metrics] == [0, 3, 5]
    final = result.metrics[-1]
    assert result.summary["final_accuracy"] == final["accuracy"]
    assert final["client_steps"] == result.summary["client_steps_aggregated"]
    events = np.genfromtxt(os.path.join(result.run_dir, "events.csv"), delimiter=",", names=True, dtype=None,
                           encoding="utf-8")
    assert final["time"] == pytest.approx(events["time"][events["event"] == "aggregate"][-1])
    assert final["time"] <= result.summary["virtual_time"]


def test_a_resumed_eval_every_run_ends_with_the_same_final_row(every_three, tmp_path):
    from jaxfl import testing
    from jaxfl.config import RunConfig
    from jaxfl.experiment import resume_experiment, run_experiment

    config = RunConfig(**{**EVERY, "checkpoint_every": 1}, output_dir=str(tmp_path), run_name="cut")
    with testing._interrupt_after(6), pytest.raises(testing._Interrupted):
        run_experiment(config)
    resumed = resume_experiment(os.path.join(str(tmp_path), "cut"), progress=False)
    testing.assert_same_run(resumed, every_three, "resumed with eval_every")
    # resumed once more from its final checkpoint: no second final row
    again = resume_experiment(os.path.join(str(tmp_path), "cut"), progress=False)
    assert [row["version"] for row in again.metrics] == [0, 3, 5]


# --------------------------------------------------------------------------- 5. a reference at 0 s
def at_start_rows():
    """FedAvg's initial model reaches the target in both seeds (0 s, no step executed); FedBuff's
    in seed 0, and at 2 s in seed 1."""
    return [{"algorithm": algorithm, "seed": seed, "time_to_target": time, "best_accuracy": 0.9,
             "final_accuracy": 0.9, "client_steps_executed": steps}
            for algorithm, steps, times in (("fedavg", 0, (0.0, 0.0)), ("fedbuff", 10, (0.0, 2.0)))
            for seed, time in enumerate(times)]


def test_a_reference_that_reached_the_target_at_0_s_is_no_miss():
    from jaxfl.report import format_markdown, summarise

    lines = summarise(at_start_rows())
    fedavg, fedbuff = lines
    assert fedavg["reference_reached"] and fedavg["reference_at_start"] and fedbuff["reference_at_start"]
    assert fedavg["relative_time"] is None and fedbuff["relative_time"] is None  # no ratio against 0 s
    assert fedbuff["relative_steps"] is None and fedbuff["reference_steps_zero"]
    assert fedbuff["times_by_seed"] == [(0, 0.0, None), (1, 2.0, None)]
    markdown = format_markdown(lines, [], "fedavg", "90%").splitlines()
    assert "| fedavg | reached at start |" in markdown and "| fedbuff | no ratio (1.0 s) |" in markdown
    assert "| fedavg | at start / at start |" in markdown and "| fedbuff | at start / no ratio (2.0 s) |" in markdown
    assert "| fedbuff | 0.9000 ± 0.0000 (10 steps, no ratio) |" in markdown
    assert not any("n/a (" in line for line in markdown)  # "n/a" says the reference missed: it did not
    # a method reaching at 0 s against a reference that took time: a ratio of 0, said as reached at start
    later = [dict(row, time_to_target=row["time_to_target"] + 4.0, client_steps_executed=5)
             if row["algorithm"] == "fedavg" else row for row in at_start_rows()]
    fedavg, fedbuff = summarise(later)
    assert fedbuff["relative_time"] == pytest.approx(2.0 / 8.0) and fedbuff["relative_steps"] == 2.0
    assert fedbuff["times_by_seed"] == [(0, 0.0, 0.0), (1, 2.0, 0.5)]


def test_a_method_without_a_seed_of_the_references_says_why_its_steps_have_no_ratio():
    # the steps ratio is paired seed by seed: FedBuff's seeds 2 and 3 against FedAvg's 0 and 1 have none,
    # and the cell showed FedBuff's accuracy alone, as if its steps had not been counted
    from jaxfl.report import format_markdown, summarise

    rows = [dict(row, seed=row["seed"] + 2, time_to_target=1.0) if row["algorithm"] == "fedbuff"
            else dict(row, client_steps_executed=20) for row in at_start_rows()]
    fedavg, fedbuff = summarise(rows)
    assert fedbuff["relative_steps"] is None and not fedbuff["reference_steps_zero"]
    markdown = format_markdown([fedavg, fedbuff], [], "fedavg", "90%").splitlines()
    assert "| fedbuff | 0.9000 ± 0.0000 (10 steps, no seed counted by both it and fedavg) |" in markdown, markdown
    assert "| fedavg | 0.9000 ± 0.0000 |" in markdown
    # a seed in common where the reference ran no step: no ratio, not "no seed in common"; a reference
    # without a step count (a table from before it was a column): the accuracy alone
    shared = [dict(row, seed=0, client_steps_executed=50) if row["algorithm"] == "fedbuff" else
              dict(row, client_steps_executed=100 * row["seed"]) for row in at_start_rows() if row["algorithm"] == "fedavg"
              or row["seed"] == 0]
    said = format_markdown(summarise(shared), [], "fedavg", "90%")
    assert "| fedbuff | 0.9000 ± 0.0000 (50 steps, no ratio) |" in said.splitlines()
    assert "or in those both ran, the steps themselves: no ratio against 0." in said
    uncounted = [row if row["algorithm"] == "fedbuff" else {k: v for k, v in row.items() if k != "client_steps_executed"}
                 for row in at_start_rows()]
    assert "| fedbuff | 0.9000 ± 0.0000 |" in format_markdown(summarise(uncounted), [], "fedavg", "90%").splitlines()


# --------------------------------------------------------------------------- 7. which std
def test_the_report_says_its_std_is_the_population_one():
    from jaxfl.report import format_markdown, format_timing_markdown, summarise

    rows = [{"algorithm": "fedavg", "seed": seed, "time_to_target": 10.0, "best_accuracy": accuracy}
            for seed, accuracy in enumerate((0.8, 0.9))]
    markdown = format_markdown(summarise(rows), [], "fedavg", "90%")
    assert "| fedavg | 0.8500 ± 0.0500 |" in markdown.splitlines()  # np.std(ddof=0): 0.05, not 0.0707
    assert "population's (ddof 0" in markdown
    timing = format_timing_markdown([{"method": "fedbuff", "runs": 2, "virtual_time_mean": 15.0,
                                      "virtual_time_std": 5.0}], [])
    assert "population's (ddof 0" in timing


# --------------------------------------------------------------------------- 9. staleness ticks
def test_staleness_histogram_ticks_stay_few_at_large_staleness(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from jaxfl import report

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    histogram = {str(s): 1 + s % 7 for s in range(0, 3000, 3)}  # staleness up to ~3,000 versions
    (run_dir / "summary.json").write_text(json.dumps({"timeline": {"staleness_histogram": histogram}}))
    drawn = {}
    monkeypatch.setattr(report, "_save", lambda figure, path: drawn.setdefault("figure", figure) and path)
    report.plot_staleness_by_group({"": {"fedbuff": [{"run_dir": "run"}]}}, str(tmp_path), str(tmp_path / "s.png"))
    panel = drawn["figure"].axes[0]
    low, high = panel.get_xlim()
    ticks = [tick for tick in panel.get_xticks() if low <= tick <= high]
    assert 2 <= len(ticks) <= 7 and all(float(tick).is_integer() for tick in ticks)


# --------------------------------------------------------------------------- 8. the timing-only line
def test_the_timing_line_of_a_run_without_aggregations_says_no_staleness(tmp_path):
    from jaxfl.cli import _timing_line
    from jaxfl.config import RunConfig
    from jaxfl.experiment import run_experiment

    # 10 clients in flight, none back by 0.01 virtual s: no aggregation
    result = run_experiment(RunConfig(algorithm="fedbuff", dataset="synthetic_iid", partition="natural", clients=20,
                                      concurrency=10, model="logreg", max_time=0.01, timing_only=True, progress=False,
                                      output_dir=str(tmp_path)))
    assert result.summary["global_updates"] == 0
    line = _timing_line(result.summary, "RUN")
    assert "0 updates in 0.01 virtual s" in line and "mean staleness –," in line
    assert f"{result.summary['timeline']['events']} queue events (arrivals, replies, crashes, timers)" in line


def test_a_run_logged_to_a_file_shows_its_bar_at_evaluations_not_ten_times_a_second(tmp_path, capsys):
    from jaxfl.cli import main

    assert main(["run", "--algorithm", "fedbuff", "--dataset", "mnist10k", "--model", "logreg", "--clients", "12",
                 "--local-steps", "2", "--max-updates", "60", "--eval-every", "20", "--no-stop-at-target",
                 "--output-dir", str(tmp_path)]) == 0
    shown = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if "of the budget" in line]
    assert any("100%" in line for line in shown)
    assert len(shown) <= 4 + 2  # the start, the 4 evaluations (0, 20, 40, 60), the close
