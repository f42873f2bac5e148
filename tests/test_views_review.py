"""`jaxfl timeline` and `jaxfl partition` as a researcher reads them: a chart that shows its events
apart (a small federation's long run switches to the aggregated view), dropped work marked, the
run's end marked past it, the heatmap's rows at their clients' ids, and clear refusals (a sweep
folder, a missing path, an empty log, a PNG path that is not one) that write nothing."""
import os

import numpy as np
import pytest

from jaxfl.cli import main
from jaxfl.config import RunConfig
from jaxfl.data.report import PartitionReport, plot_class_heatmap
from jaxfl.experiment import run_experiment
from jaxfl.plot import GANTT_MAX_AGGREGATIONS, save_figure, timeline_figure

TIMING = {"dataset": "synthetic_iid", "partition": "natural", "model": "logreg", "timing_only": True,
          "progress": False, "checkpoint_every": None}


def timing_run(tmp_path, name, **settings) -> str:
    return run_experiment(RunConfig(**{**TIMING, "output_dir": str(tmp_path), "run_name": name, **settings})).run_dir


def test_a_small_federation_s_long_run_is_drawn_aggregated_and_its_start_as_a_gantt_chart(tmp_path):
    """10 clients and 3,000 aggregations drew a Gantt chart of solid bars under a wall of aggregation
    lines (the view was chosen by the number of clients alone)."""
    run_dir = timing_run(tmp_path, "long", algorithm="fedbuff", clients=10, local_steps=5,
                         max_updates=2 * GANTT_MAX_AGGREGATIONS)
    assert len(timeline_figure(run_dir).axes) == 3  # clients in flight, aggregations, staleness
    zoomed = timeline_figure(run_dir, max_time=2.0)  # the run's first seconds: a few aggregations
    assert len(zoomed.axes) == 1 and len(zoomed.axes[0].get_yticks()) == 10


def test_dropped_arrivals_are_marked_and_the_run_s_end_past_it(tmp_path):
    """Arrivals after a round's deadline (dropped, never aggregated) were drawn as the used work was;
    a max_time past the run's end left the white after it reading as idle clients, under a note of
    bars "to the run's end" that no bar drew."""
    run_dir = timing_run(tmp_path, "drops", algorithm="fedavg", clients=10, max_updates=6, round_timeout=5.0)
    with open(os.path.join(run_dir, "events.csv")) as handle:
        drops = sum(",drop," in line for line in handle)
    assert drops > 0
    axes = timeline_figure(run_dir, max_time=1000.0).axes[0]
    marked = [line for line in axes.get_lines() if line.get_marker() == "o"]
    assert len(marked) == 1 and len(marked[0].get_xdata()) == drops
    labels = [text.get_text() for text in axes.get_legend().get_texts()]
    assert "dropped (not aggregated)" in labels
    assert any(text.get_text() == " run's end" for text in axes.texts)
    # a synchronous run ends with its next round dispatched at the last instant: no bar is in flight
    plain = timeline_figure(timing_run(tmp_path, "plain", algorithm="fedavg", clients=6, max_updates=3),
                            max_time=1000.0).axes[0]
    assert "still in flight" not in plain.get_xlabel() and any(text.get_text() == " run's end" for text in plain.texts)


def test_an_empty_event_log_and_what_is_not_a_run_are_refused_naming_why(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "events.csv").write_text("")
    with pytest.raises(ValueError, match="has an empty event log: the run wrote no event yet"):
        timeline_figure(str(tmp_path / "empty"))
    sweep = tmp_path / "sweep"
    (sweep / "runs").mkdir(parents=True)
    (sweep / "sweep.json").write_text("{}")
    for path, said in ((tmp_path / "nowhere", "it does not exist: give a run directory written by jaxfl run"),
                       (sweep, f"it is a sweep folder: give one of its runs ({sweep / 'runs' / 'NAME'}), or "
                               f"jaxfl report {sweep} draws the timeline of one run per method"),
                       (tmp_path / "empty", "has an empty event log")):
        with pytest.raises(SystemExit) as refused:
            main(["timeline", str(path), "--out", str(tmp_path / "out" / "t.png")])
        assert refused.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_heatmap_keeps_the_clients_ids_on_a_subset_of_rows_and_a_bounded_width(tmp_path):
    """5,000 clients drew 2,000 rows labelled 0–2,000 (their places in the subset); 1,000 classes drew a
    figure 50,000 pixels wide; a Dirichlet title ran off both sides."""
    rng = np.random.default_rng(0)
    report = PartitionReport(rng.integers(0, 5, size=(5000, 10)), "a long title " * 12)
    path = plot_class_heatmap(report, tmp_path / "many.png")
    from PIL import Image

    with Image.open(path) as image:
        assert image.size[0] <= 700
    wide = plot_class_heatmap(PartitionReport(rng.integers(0, 5, size=(20, 1000))), tmp_path / "wide.png")
    with Image.open(wide) as image:
        assert image.size[0] <= 2000
    with pytest.raises(ValueError, match=r"path='.*heatmap' is not allowed: a file name ending in one of .*\.pdf"):
        plot_class_heatmap(report, tmp_path / "heatmap")  # matplotlib wrote heatmap.png, and "heatmap" came back
    assert plot_class_heatmap(report, tmp_path / "many.pdf").endswith("many.pdf")  # other formats as before
    assert (tmp_path / "many.pdf").read_bytes().startswith(b"%PDF")
    assert sorted(os.listdir(tmp_path)) == ["many.pdf", "many.png", "wide.png"]


def test_the_heatmap_s_axis_spans_every_client_id(tmp_path, monkeypatch):
    import jaxfl.plot

    drawn = {}
    original = jaxfl.plot.save_figure
    monkeypatch.setattr(jaxfl.plot, "save_figure", lambda figure, path, dpi=120: drawn.setdefault("figure", figure)
                        and original(figure, path, dpi))
    plot_class_heatmap(PartitionReport(np.ones((5000, 10), np.int64)), tmp_path / "ids.png")
    axes = drawn["figure"].axes[0]
    assert sorted(axes.get_ylim()) == [-0.5, 4999.5]
    assert "(1000 of 5000 clients shown)" in axes.get_title().replace("\n", " ")


def test_figures_are_written_only_as_png_files_into_folders_that_exist(tmp_path):
    with pytest.raises(ValueError, match=r"path='.*t\.jpg' is not allowed: the figure is written as a PNG"):
        save_figure(None, str(tmp_path / "t.jpg"))
    with pytest.raises(FileNotFoundError, match=r"cannot write '.*missing/t\.png': its folder '.*missing' does not"):
        save_figure(None, str(tmp_path / "missing" / "t.png"))


def test_partition_s_out_takes_the_heatmap_s_png_path_as_timeline_s_does(tmp_path, capsys):
    """`jaxfl partition --out split.png` made a folder named split.png with the figure inside."""
    assert main(["partition", "--clients", "4", "--out", str(tmp_path / "figs" / "split.png"), "--max-rows", "1"]) == 0
    assert (tmp_path / "figs" / "split.png").is_file()
    assert f"class heatmap: {tmp_path / 'figs' / 'split.png'}" in capsys.readouterr().out
    assert main(["partition", "--clients", "4", "--out", str(tmp_path / "folder"), "--max-rows", "1"]) == 0
    assert [name.endswith(".png") for name in os.listdir(tmp_path / "folder")] == [True]
    assert main(["partition", "--clients", "4", "--out", str(tmp_path / "figs" / "split.svg"), "--max-rows", "1"]) == 0
    assert (tmp_path / "figs" / "split.svg").is_file()
