"""The report's figures: a method's own colour and line style in every figure (also past the ninth
method), a mean over seeds that keeps a finished run's last accuracy, "missed" markers inside the frame,
and no stale figures of an earlier report left beside a report that draws none."""
import numpy as np
import pytest

from jaxfl import report


def _drawn_figures(monkeypatch, draw):
    """The matplotlib figures ``draw()`` saves through the report's ``_save`` (still written to disk)."""
    saved = []
    original = report._save
    monkeypatch.setattr(report, "_save", lambda figure, path: saved.append(figure) or original(figure, path))
    draw()
    return saved


def _run(folder, times, accuracies):
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text("time,accuracy\n" + "".join(f"{t},{a}\n" for t, a in zip(times, accuracies)))
    return {"run_dir": str(folder), "target_accuracy": 0.8}


def test_a_finished_seed_keeps_its_last_accuracy_in_the_mean():
    # seed 1 stops at its target at 8 s; seed 0 runs to 20 s: the mean of both seeds to the end
    fast = (np.array([0.0, 4.0, 8.0]), np.array([0.1, 0.5, 0.85]))
    slow = (np.array([0.0, 4.0, 8.0, 12.0, 16.0, 20.0]), np.array([0.1, 0.4, 0.7, 0.72, 0.75, 0.82]))
    grid, mean, low, high = report.accuracy_band([fast, slow])
    assert grid.tolist() == [0.0, 4.0, 8.0, 12.0, 16.0, 20.0]
    assert np.allclose(mean, [0.1, 0.45, 0.775, 0.785, 0.80, 0.835])  # never back to the slower seed's alone
    assert np.allclose(low, [0.1, 0.4, 0.7, 0.72, 0.75, 0.82]) and np.allclose(high[2:], 0.85)


def test_eleven_methods_have_eleven_styles_the_same_in_every_figure(tmp_path, monkeypatch):
    methods = ["fedavg", "fedasync"] + [f"port port.k={k}" for k in range(9)]
    runs = {name: [_run(tmp_path / name.replace(" ", "_") / str(seed), [0.0, 5.0, 10.0],
                        [0.1, 0.5 + 0.01 * number, 0.6]) for seed in (0, 1)]
            for number, name in enumerate(methods)}
    styles = report.method_styles(methods)
    (figure,) = _drawn_figures(monkeypatch, lambda: report.plot_accuracy_bands(
        runs, str(tmp_path), str(tmp_path / "accuracy.png"), title="clients=5", styles=styles))
    (axes,) = figure.axes
    lines = [line for line in axes.get_lines() if not line.get_label().startswith("target")]
    assert len(lines) == 11
    looks = [(tuple(np.round(line.get_color(), 3)), str(line.get_linestyle())) for line in lines]
    assert len(set(looks)) == 11  # K=20's orange was FedAsync's
    assert looks[2 + 8] != looks[1] and looks[9][0] == looks[0][0]  # same colour, other dashes
    assert "a run that ended keeps its last accuracy" in axes.get_title()
    # the bars: each method's colour as in the accuracy figure, the tenth and eleventh hatched
    lines_of_table = [{"clients": 5, "method": name, "time_to_target_mean": 10.0 + number, "time_to_target_std": None}
                      for number, name in enumerate(methods)]
    (bars,) = _drawn_figures(monkeypatch, lambda: report.plot_time_to_target(
        lines_of_table, ["clients"], str(tmp_path / "t.png"), styles=styles))
    drawn = [patch for patch in bars.axes[0].patches if patch.get_height() > 0]
    assert [tuple(np.round(patch.get_facecolor()[:3], 3)) for patch in drawn] == [look[0][:3] for look in looks]
    assert [patch.get_hatch() for patch in drawn] == [None] * 9 + ["//"] * 2


def test_missed_markers_are_inside_the_frame(tmp_path, monkeypatch):
    methods = ["fedavg", "fedbuff", "fedasync"]
    lines = [{"clients": m, "method": name, "time_to_target_mean": None if name != "fedbuff" else 50.0,
              "time_to_target_std": None} for m in (5, 10) for name in methods]
    (figure,) = _drawn_figures(monkeypatch, lambda: report.plot_time_to_target(lines, ["clients"], str(tmp_path / "t.png")))
    axes = figure.axes[0]
    # a word in grey, not the tables' "–" in the method's colour, which on the axis read as a very short bar
    markers = [text for text in axes.texts if text.get_text().strip() == "missed"]
    assert len(markers) == 4 and {marker.get_color() for marker in markers} == {"0.35"}
    assert "one seed a method (missed = missed in ≥ half)" in figure.texts[0].get_text()  # no error bars to promise
    left, right = axes.get_xlim()
    bottom, top = axes.get_ylim()
    for marker in markers:
        x, y = marker.get_position()
        assert left < x < right and bottom <= y < top


def test_a_bar_over_fewer_seeds_than_its_runs_says_how_many(tmp_path, monkeypatch):
    # fedbuff reached the target in 2 of its 3 runs: its bar is the mean of those 2, and says so; fedavg's
    # bar of all 3 and fedasync's "–" (1 of 3) carry no such mark
    lines = [{"clients": 5, "method": "fedavg", "runs": 3, "reached": 3, "time_to_target_mean": 40.0,
              "time_to_target_std": 2.0},
             {"clients": 5, "method": "fedbuff", "runs": 3, "reached": 2, "time_to_target_mean": 50.0,
              "time_to_target_std": 5.0},
             {"clients": 5, "method": "fedasync", "runs": 3, "reached": 1, "time_to_target_mean": None,
              "time_to_target_std": None}]
    (figure,) = _drawn_figures(monkeypatch, lambda: report.plot_time_to_target(lines, ["clients"], str(tmp_path / "t.png")))
    axes = figure.axes[0]
    marks = [text for text in axes.texts if "/" in text.get_text()]
    assert [mark.get_text() for mark in marks] == ["2/3"]
    (bar,) = [patch for patch in axes.patches if patch.get_height() == 50.0]
    assert marks[0].xy == (pytest.approx(bar.get_x() + bar.get_width() / 2), 55.0)  # over its error bar
    assert axes.get_ylim()[1] > 55.0 * 1.05  # the mark inside the frame
    assert "k/n over a bar" in figure.texts[0].get_text()
    for line in lines:  # every run reached it, or fewer than half: no mark, nor its explanation
        line["reached"] = 3 if line["time_to_target_mean"] is not None else 1
    (figure,) = _drawn_figures(monkeypatch, lambda: report.plot_time_to_target(lines, ["clients"], str(tmp_path / "t.png")))
    assert not [text for text in figure.axes[0].texts if "/" in text.get_text()]
    assert "k/n" not in figure.texts[0].get_text()


def test_a_report_without_figures_removes_the_earlier_report_s_figures_only(tmp_path):
    (tmp_path / "results.csv").write_text(
        "cell,algorithm,clients,seed,target_accuracy,time_to_target,best_accuracy\n"
        "0,fedavg,5,0,0.8,100.0,0.9\n1,fedbuff,5,0,0.8,,0.7\n")
    out = tmp_path / "report"
    first = report.make_report(str(tmp_path), figures="table", out=str(out))
    assert [path.rsplit("/", 1)[1] for path in first.figures] == ["time_to_target.png"]
    (out / "accuracy.png").write_text("an earlier full report's")
    (out / "notes.png").write_text("the user's own")
    again = report.make_report(str(tmp_path), figures=False, out=str(out))
    assert again.figures == []
    assert sorted(path.name for path in out.iterdir()) == ["notes.png", "report.csv", "report.md"]


def test_a_report_interrupted_while_drawing_leaves_the_earlier_report_whole(tmp_path, monkeypatch):
    (tmp_path / "results.csv").write_text(
        "cell,algorithm,clients,seed,target_accuracy,time_to_target,best_accuracy\n"
        "0,fedavg,5,0,0.8,100.0,0.9\n1,fedbuff,5,0,0.8,,0.7\n")
    out = tmp_path / "report"
    first = report.make_report(str(tmp_path), figures="table", out=str(out))
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    assert sorted(before) == ["report.csv", "report.md", "time_to_target.png"]
    # another seed, then Ctrl-C while the bars are drawn: the tables are already written by then
    with open(tmp_path / "results.csv", "a") as handle:
        handle.write("2,fedavg,5,1,0.8,120.0,0.88\n")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "plot_time_to_target", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.make_report(str(tmp_path), figures="table", out=str(out))
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before  # nothing half-replaced or left over
    monkeypatch.undo()
    again = report.make_report(str(tmp_path), figures="table", out=str(out))
    assert again.markdown_path == first.markdown_path == str(out / "report.md")
    assert again.figures == [str(out / "time_to_target.png")] and (out / "report.md").read_text() != before["report.md"].decode()
    assert sorted(path.name for path in out.iterdir()) == ["report.csv", "report.md", "time_to_target.png"]


@pytest.mark.parametrize("count, below", [(3, False), (5, False), (6, True), (11, True)])
def test_an_accuracy_figure_of_many_methods_has_its_legend_below_the_curves(count, below, tmp_path, monkeypatch):
    methods = ["fedavg"] + [f"port port.k={k}" for k in range(count - 1)]
    runs = {name: [_run(tmp_path / name.replace(" ", "_"), [0.0, 5.0, 10.0], [0.1, 0.5, 0.6])] for name in methods}
    (figure,) = _drawn_figures(monkeypatch, lambda: report.plot_accuracy_bands(
        runs, str(tmp_path), str(tmp_path / "accuracy.png")))
    (axes,) = figure.axes
    if below:  # one legend of the figure, below the axes, with every method and the target
        (legend,) = figure.legends
        assert axes.get_legend() is None and len(legend.get_texts()) == count + 1
        figure.canvas.draw()
        assert legend.get_window_extent().y1 <= axes.get_window_extent().y0
    else:
        assert not figure.legends and len(axes.get_legend().get_texts()) == count + 1


def test_a_run_without_summary_json_is_named_with_how_to_report_without_figures(tmp_path):
    (tmp_path / "runs" / "fedbuff-1").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"run directory '.*fedbuff-1' of cell 3 has no summary.json \(the "
                                                r"run did not finish there, or the file was removed\): the staleness "
                                                r"figure needs it \(jaxfl report --no-figures"):
        report.plot_staleness({"fedbuff": [{"run_dir": "runs/fedbuff-1", "cell": 3}]}, str(tmp_path),
                              str(tmp_path / "staleness.png"))
    assert not (tmp_path / "staleness.png").exists()


def test_staleness_panels_give_the_tables_mean_and_bin_thousands_of_values(tmp_path, monkeypatch):
    """Two seeds of unequal update counts: the title's mean is the mean of the runs' means (the
    tables' figure; pooling gave another). Staleness in the thousands: one bar per value was
    drawn (tens of thousands of patches, slowly) and the tallest, at 0, sat invisible beside the
    axis; it is now binned."""
    import json

    def run(name, histogram):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps({"timeline": {"staleness_histogram": histogram}}))
        return {"run_dir": str(folder)}

    few = run("few", {"0": 1, "2": 1})  # mean 1
    many = run("many", {"0": 5, "2000": 1, "1000": 4})  # mean 6000 / 10 = 600
    (figure,) = _drawn_figures(monkeypatch, lambda: report.plot_staleness_by_group(
        {"": {"fedcompass": [few, many]}}, str(tmp_path), str(tmp_path / "staleness.png")))
    panel = figure.axes[0]
    assert panel.get_title().endswith("2 runs, mean of their means 300.50")
    assert len(panel.patches) == 1  # one filled outline, not a bar per value
    heights = panel.patches[0].get_path().vertices[:, 1]
    assert heights.max() == 7  # staleness 0 and 2 of both runs, in the first bin
    # whole versions a bin (it was 33.4: some bins held one value more than their neighbours)
    assert panel.get_ylabel() == "updates per 34 versions"

    # a run that aggregated nothing (its initial model at the target) is not counted in the mean's runs
    idle = run("idle", {})
    (figure,) = _drawn_figures(monkeypatch, lambda: report.plot_staleness_by_group(
        {"": {"fedcompass": [few, many, idle]}}, str(tmp_path), str(tmp_path / "staleness.png")))
    assert " ".join(figure.axes[0].get_title().split()).endswith("2 runs, mean of their means 300.50 (1 more without updates)")


def test_a_method_evaluated_once_is_drawn_as_a_point(tmp_path, monkeypatch):
    # a run stopped before its first aggregation has one evaluation: a steps line of one point drew nothing
    runs = {"fedavg": [_run(tmp_path / "avg", [0.0], [0.1])],
            "fedbuff": [_run(tmp_path / "buff", [0.0, 5.0], [0.1, 0.5])]}
    (figure,) = _drawn_figures(monkeypatch, lambda: report.plot_accuracy_bands(
        runs, str(tmp_path), str(tmp_path / "accuracy.png")))
    lines = {line.get_label().split(" (")[0]: line for line in figure.axes[0].get_lines()}
    assert lines["fedavg"].get_marker() == "o" and lines["fedbuff"].get_marker() in (None, "None", "")


def test_a_sweep_whose_runs_have_no_target_draws_no_time_to_target_chart(tmp_path):
    """Runs on a dataset without a default target (synthetic) drew time_to_target.png empty."""
    import os

    from jaxfl.report import make_report
    from jaxfl.sweep import run_sweep

    folder = str(tmp_path / "synthetic")
    run_sweep({"dataset": "synthetic_iid", "partition": "natural", "model": "logreg", "clients": 4, "local_steps": 2,
               "max_updates": 2}, {"algorithm": ["fedavg", "fedbuff"]}, folder, progress=False)
    names = sorted(os.path.basename(path) for path in make_report(folder, reference="fedavg").figures)
    assert "accuracy.png" in names and "time_to_target.png" not in names


def test_a_timeline_is_drawn_from_the_lowest_seed_with_a_schedule(tmp_path):
    # a method whose lowest seed wrote no event (its initial model reached the target: the run stopped at 0 s)
    # failed the whole report ("has an empty event log ... nothing to draw"), report.md not written
    from jaxfl.config import RunConfig
    from jaxfl.sweep import run_sweep

    base = RunConfig(algorithm="fedbuff", clients=4, timing_only=True, max_updates=3, buffer_size=2,
                     output_dir="runs", progress=False)
    result = run_sweep(base, {"seed": [0, 1]}, str(tmp_path), progress=False)
    seed_0 = next(cell.run_dir for cell in result.cells if cell.config.seed == 0)
    with open(f"{seed_0}/events.csv") as handle:
        header = handle.readline()
    with open(f"{seed_0}/events.csv", "w") as handle:
        handle.write(header)
    made = report.make_report(str(tmp_path), out=str(tmp_path / "report"))
    assert [name for name in (path.rsplit("/", 1)[1] for path in made.figures) if name.startswith("timeline")] == \
        ["timeline-fedbuff.png"]
    assert (tmp_path / "report" / "report.md").exists()


def test_the_computation_curve_stops_an_evaluation_at_its_aggregation_when_two_fall_at_one_instant(tmp_path):
    # equal speeds without jitter: FedBuff's K = 3 of 6 arrivals make versions 1 and 2 at t = 0.3. Version
    # 1's evaluation was drawn at 12 steps (every arrival at 0.3), and the band then showed version 2's alone
    (tmp_path / "metrics.csv").write_text("time,version,accuracy\n0.0,0,0.1\n0.3,1,0.2\n0.3,2,0.3\n0.5,2,0.3\n")
    log = ["time,event,client,dispatch,version,staleness,steps,detail,wall_time"]
    log += [f"0.0,dispatch,{c},{c},0,,2,," for c in range(6)]
    log += [f"0.3,arrival,{c},{c},0,0,2,," for c in range(3)] + ["0.3,aggregate,,,1,,,,"]
    log += [f"0.3,arrival,{c},{c},0,1,2,," for c in range(3, 6)] + ["0.3,aggregate,,,2,,,,"]
    log += ["0.4,arrival,0,6,2,0,2,,"]  # after version 2, before an evaluation on a time grid: computed by 0.5
    (tmp_path / "events.csv").write_text("\n".join(log) + "\n")
    steps, accuracy = report.computation_curve(str(tmp_path))
    assert steps.tolist() == [0.0, 6.0, 12.0, 14.0] and accuracy.tolist() == [0.1, 0.2, 0.3, 0.3]


def test_an_evaluation_on_a_time_grid_counts_every_arrival_of_its_instant(tmp_path):
    # a grid point that falls on version 1's aggregation: the evaluation comes after every event of that
    # instant (the two arrivals buffered after the aggregation too), as a grid point between events does
    import json

    from jaxfl.config import RunConfig

    config = RunConfig(eval_interval=0.3, eval_every=None).to_dict()
    (tmp_path / "config.json").write_text(json.dumps({"config": config}))
    (tmp_path / "metrics.csv").write_text("time,version,accuracy\n0.0,0,0.1\n0.3,1,0.2\n")
    log = ["time,event,client,dispatch,version,staleness,steps,detail,wall_time"]
    log += [f"0.0,dispatch,{c},{c},0,,2,," for c in range(6)]
    log += [f"0.3,arrival,{c},{c},0,0,2,," for c in range(4)] + ["0.3,aggregate,,,1,,,,"]
    log += [f"0.3,arrival,{c},{c},0,1,2,," for c in range(4, 6)]
    (tmp_path / "events.csv").write_text("\n".join(log) + "\n")
    assert report.computation_curve(str(tmp_path))[0].tolist() == [0.0, 12.0]
    (tmp_path / "config.json").unlink()  # evaluated at each aggregation: version 1's at its 4 arrivals
    assert report.computation_curve(str(tmp_path))[0].tolist() == [0.0, 8.0]


def test_staleness_panels_and_single_seed_captions_follow_the_report(tmp_path, monkeypatch):
    """The staleness panels were default blue for every method while the accuracy figures and bars gave each
    method its own colour; one seed a method was still captioned "band = min-max" (no band drawn)."""
    import json

    from matplotlib.colors import to_rgba

    def run(name, histogram, times=(0.0, 10.0), accuracies=(0.1, 0.9)):
        folder = tmp_path / name
        _run(folder, times, accuracies)
        (folder / "summary.json").write_text(json.dumps({"timeline": {"staleness_histogram": histogram}}))
        return {"run_dir": str(folder), "target_accuracy": 0.8}

    runs = {"fedavg": [run("avg", {"0": 3})], "fedasync": [run("async", {"0": 1, "3": 2})]}
    styles = report.method_styles(["fedavg", "fedasync"])
    (figure,) = _drawn_figures(monkeypatch, lambda: report.plot_staleness_by_group(
        {"": runs}, str(tmp_path), str(tmp_path / "staleness.png"), styles))
    for panel, name in zip(figure.axes, runs):
        assert {to_rgba(patch.get_facecolor()) for patch in panel.patches} == {to_rgba(styles[name]["color"])}
    (figure,) = _drawn_figures(monkeypatch, lambda: report.plot_accuracy_bands(
        runs, str(tmp_path), str(tmp_path / "accuracy.png"), styles=styles))
    assert figure.axes[0].get_title().startswith("one seed a method; a run that ended keeps its last accuracy")
    runs["fedavg"].append(run("avg2", {"0": 3}))
    (figure,) = _drawn_figures(monkeypatch, lambda: report.plot_accuracy_bands(
        runs, str(tmp_path), str(tmp_path / "accuracy.png"), styles=styles))
    assert figure.axes[0].get_title().startswith("mean over seeds, band = min–max")
