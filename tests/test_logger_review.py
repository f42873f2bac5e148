"""Loggers and the comparison table as a notebook user meets them: the rows of an evaluation grid, a
TensorBoard log across a resume, a logger that fails to start or to close, a run that made no
evaluation, and two runs of one algorithm side by side."""
import csv
import os
import warnings

import numpy as np
import pytest

import jaxfl
from jaxfl.cli import main
from jaxfl.comparison import compare, format_table
from jaxfl.experiment import resume_experiment, run_experiment

TINY = dict(algorithm="fedavg", clients=3, model="logreg", local_steps=2, batch_size=8, stop_at_target=False,
            progress=False, checkpoint_every=None)


def tiny(tmp_path, **changes) -> jaxfl.RunConfig:
    return jaxfl.RunConfig(**{**TINY, "output_dir": str(tmp_path), **changes})


class Recording:
    def __init__(self, stop_at_row=None, interrupt_at_row=None):
        self.rows, self.closed = [], 0
        self.stop_at_row, self.interrupt_at_row = stop_at_row, interrupt_at_row

    def log(self, row, step):
        self.rows.append((step, row))
        if len(self.rows) == self.interrupt_at_row:
            raise KeyboardInterrupt
        return len(self.rows) == self.stop_at_row

    def close(self):
        self.closed += 1


def metrics_rows(run_dir):
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as handle:
        return list(csv.DictReader(handle))


def test_grid_rows_reach_the_loggers_with_the_updates_of_the_model_in_force(tmp_path):
    # client_updates was the live count: a grid row of version 0 written when version 1 came read 3
    logger = Recording()
    result = run_experiment(tiny(tmp_path, max_updates=3, eval_interval=0.25), loggers=[logger])
    assert len(logger.rows) == len(result.metrics) > 4
    for step, row in logger.rows:
        assert step == row["version"] and row["client_updates"] == 3 * row["version"], row  # 3 clients a round
        assert row["client_steps"] == 2 * row["client_updates"]  # 2 local steps each


def test_a_logger_s_stop_on_a_grid_keeps_every_grid_point_the_clock_passed(tmp_path):
    logger = Recording(stop_at_row=2)
    result = run_experiment(tiny(tmp_path, max_updates=5, eval_interval=0.1), loggers=[logger])
    assert result.summary["stop_reason"].startswith("stopped by")
    times = [float(row["time"]) for row in metrics_rows(result.run_dir)]
    assert [row["time"] for _, row in logger.rows] == times
    # the grid has no hole: each point up to the event at which the run stopped, then the final
    # model's row at that event (below)
    grid, end = times[:-1], times[-1]
    assert np.allclose(np.diff(grid), 0.1) and grid[-1] + 0.1 > result.summary["virtual_time"] == end > grid[-1]


def test_a_logger_s_stop_on_a_grid_ends_with_the_final_model_s_row(tmp_path):
    # the stop comes at the aggregation of the version whose arrival wrote the grid row: the summary
    # counted and timed that version (global_updates 6, virtual_time 3.13) while its final_accuracy
    # was the row's, version 5's at 3.0
    logger = Recording(stop_at_row=6)
    config = tiny(tmp_path, algorithm="fedbuff", clients=4, buffer_size=2, local_steps=5, max_updates=50,
                  eval_interval=0.5)
    result = run_experiment(config, loggers=[logger])
    rows, summary = metrics_rows(result.run_dir), result.summary
    grid, last = rows[:-1], rows[-1]
    assert summary["stop_reason"] == "stopped by Recording" and len(grid) >= 6
    assert np.allclose([float(row["time"]) for row in grid], np.arange(len(grid)) * 0.5)
    assert int(grid[-1]["version"]) < int(last["version"]) == summary["global_updates"]
    assert float(last["time"]) == summary["virtual_time"] > float(grid[-1]["time"])
    assert int(last["client_steps"]) == summary["client_steps_aggregated"]
    assert summary["final_accuracy"] == float(last["accuracy"])
    assert [row["time"] for _, row in logger.rows] == [float(row["time"]) for row in rows]  # the loggers' too


def tensorboard_points(folder, tag="time") -> list:
    """The ``time`` scalars TensorBoard shows, as (step, value): a file that opens with a restart
    (tensorboardX's ``purge_step``: a session-log START at that step) drops the earlier files'
    points from that step on, as TensorBoard's reader does."""
    from tensorboardX.proto import event_pb2
    import struct

    points: list = []
    for name in sorted(os.listdir(folder)):
        data = open(os.path.join(folder, name), "rb").read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                points = [point for point in points if point[0] < event.step]
            points += [(event.step, value.simple_value) for value in event.summary.value if value.tag == tag]
    return points


def test_tensorboard_across_a_resume_on_a_grid_holds_each_metrics_row_once(tmp_path):
    pytest.importorskip("tensorboardX")
    config = tiny(tmp_path, max_updates=4, eval_interval=0.1, checkpoint_every=1, run_name="cut")
    with pytest.raises(jaxfl.RunInterrupted) as interrupted:
        run_experiment(config, loggers=["tensorboard", Recording(interrupt_at_row=8)])
    run_dir = interrupted.value.run_dir
    resume_experiment(run_dir, progress=False)
    rows = metrics_rows(run_dir)
    # two event files, the resumed run's after the interrupted one's, also when both were opened in one
    # second (a file is named by its second: the second writer truncated the first)
    assert len(os.listdir(os.path.join(run_dir, "tensorboard"))) == 2
    shown = tensorboard_points(os.path.join(run_dir, "tensorboard"))
    assert [step for step, _ in shown] == [int(row["version"]) for row in rows]
    assert np.allclose([value for _, value in shown], [float(row["time"]) for row in rows])


def test_a_logger_that_fails_to_start_or_to_close(tmp_path):
    class Failing(Recording):
        def __init__(self, at):
            super().__init__()
            self.at = at

        def start(self, run_dir, config):
            if self.at == "start":
                raise RuntimeError("cannot reach the server")

        def close(self):
            super().close()
            if self.at == "close":
                raise RuntimeError("cannot upload")

    started, failing = Recording(), Failing("start")
    with pytest.raises(RuntimeError, match="cannot reach the server"):
        run_experiment(tiny(tmp_path, max_updates=1, run_name="start"), loggers=[started, failing])
    assert started.closed == 1  # the logger that had started is closed, as the run's files are

    other, failing = Recording(), Failing("close")
    with pytest.warns(RuntimeWarning, match=r"logger Failing's close\(\) raised RuntimeError: cannot upload; "
                                            r"the run's own files are complete"):
        result = run_experiment(tiny(tmp_path, max_updates=2, run_name="close"), loggers=[failing, other])
    # the finished run is a finished run: its summary written, the other logger closed
    assert result.summary["global_updates"] == 2 and other.closed == 1 and failing.closed == 1
    assert jaxfl.load_run(result.run_dir).summary["stop_reason"] == "update budget"
    # a run that ends in an interrupt still says which logger failed to close
    failing = Failing("close")
    with pytest.warns(RuntimeWarning, match=r"logger Failing's close\(\) raised RuntimeError: cannot upload"), \
            pytest.raises(jaxfl.RunInterrupted):
        run_experiment(tiny(tmp_path, max_updates=3, checkpoint_every=1, run_name="cut"),
                       loggers=[failing, Recording(interrupt_at_row=3)])


def test_a_run_that_made_no_evaluation_is_reported_not_a_traceback(tmp_path, capsys):
    assert main(["run", "--algorithm", "fedavg,fedbuff", "--model", "logreg", "--clients", "3", "--local-steps", "2",
                 "--no-eval-at-start", "--max-time", "0.1", "--no-progress", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fedavg: best accuracy none (no evaluation)" in out
    table = out[out.index("algorithm  to target"):]
    assert table.splitlines()[1].split()[:4] == ["fedavg", "-", "-", "-"]
    row = {"algorithm": "x", "time_to_target": None, "best_accuracy": None, "final_accuracy": None,
           "global_updates": 0, "client_steps_executed": 0, "wall_time_s": 1.0}
    assert format_table([row], None).splitlines()[-1].split()[:4] == ["x", "-", "-", "-"]
    # the plot: an empty frame said as such (its legend read "(not reached)", as of runs that missed the target)
    from jaxfl.plot import accuracy_figure

    assert f"plot of accuracy over virtual time: {tmp_path / 'comparison.png'} (empty: no run made an evaluation)" \
        in out
    runs = [line.strip() for line in out[out.index("run directories:"):].splitlines()[1:]]
    (axes,) = accuracy_figure(runs).axes
    assert [text.get_text() for text in axes.get_legend().get_texts()][:2] == ["fedavg (no evaluation)",
                                                                               "fedbuff (no evaluation)"]
    assert any(text.get_text().startswith("no run made an evaluation") for text in axes.texts)


def test_two_runs_of_one_algorithm_are_told_apart_in_the_table_and_no_target_is_not_unreached(tmp_path):
    pytest.importorskip("matplotlib")
    from jaxfl.plot import accuracy_figure

    comparison = compare([tiny(tmp_path, algorithm="fedbuff", clients=4, buffer_size=size, max_updates=1)
                          for size in (2, 3)])
    assert [row["algorithm"] for row in comparison.rows] == ["fedbuff, buffer_size=2", "fedbuff, buffer_size=3"]
    with open(comparison.table, newline="") as handle:
        assert [row["algorithm"] for row in csv.DictReader(handle)] == ["fedbuff, buffer_size=2",
                                                                       "fedbuff, buffer_size=3"]
    # one algorithm once keeps its plain name
    assert [row["algorithm"] for row in compare([tiny(tmp_path / "one", max_updates=1)]).rows] == ["fedavg"]

    rng = np.random.default_rng(0)
    arrays = (rng.random((60, 8, 8), np.float32), np.arange(60) % 2, rng.random((20, 8, 8), np.float32),
              np.arange(20) % 2)
    result = run_experiment(tiny(tmp_path / "user", max_updates=1), data=arrays)
    assert result.summary["target_accuracy"] is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figure = accuracy_figure([result.run_dir])
    assert [line.get_label() for line in figure.axes[0].get_lines()] == ["fedavg"]


def test_an_interrupt_while_a_comparison_writes_says_so_and_leaves_no_half_comparison(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    import jaxfl.plot

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(jaxfl.plot, "plot_accuracy", interrupted)
    argv = ["run", "--algorithm", "fedavg,fedbuff", "--model", "logreg", "--clients", "3", "--local-steps", "2",
            "--max-updates", "1", "--no-progress", "--output-dir", str(tmp_path)]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "every run of the comparison finished, but it was cut short while writing comparison.png" in err
    assert "jaxfl run --algorithm fedavg,fedbuff" in err
    assert not (tmp_path / "comparison.csv").exists()  # a comparison.csv stands for a comparison written whole
    monkeypatch.undo()
    assert main(argv) == 0 and (tmp_path / "comparison.csv").exists() and (tmp_path / "comparison.png").exists()
    assert "(reused: it had finished)" in capsys.readouterr().out


def test_two_tensorboard_writers_in_one_second_keep_their_own_files(tmp_path):
    pytest.importorskip("tensorboardX")
    from jaxfl.loggers import TensorBoardLogger

    for step in (0, 1):  # well within one second
        logger = TensorBoardLogger(str(tmp_path))
        logger.log({"accuracy": 0.5}, step=step)
        logger.close()
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and all(".tfevents." in name for name in files)
    assert [step for step, _ in tensorboard_points(str(tmp_path), tag="accuracy")] == [0, 1]


def test_sigterm_ending_a_comparison_at_once_says_what_of_the_comparison_is_left(tmp_path, monkeypatch):
    # a cluster run cannot stop between events, so SIGTERM ends its processes at once, saying what the
    # cut run keeps; it did not say which runs of the comparison never ran, nor that no comparison.csv exists
    import jaxfl.cli
    from jaxfl import stopping

    said = []
    real = jaxfl.cli._comparison_run

    def second_run_cut(config, times, log_to):
        if config.algorithm == "fedbuff":
            said.append(stopping._state.last_words())  # what the SIGTERM handler writes now
            raise KeyboardInterrupt
        return real(config, times, log_to)

    monkeypatch.setattr(jaxfl.cli, "_comparison_run", second_run_cut)
    argv = ["run", "--algorithm", "fedavg,fedbuff,fedasync", "--model", "logreg", "--clients", "3", "--local-steps",
            "2", "--max-updates", "1", "--no-progress", "--output-dir", str(tmp_path)]
    assert main(argv) == 130
    assert said == [f"the comparison fedavg,fedbuff,fedasync: finished: fedavg; not run: fedasync; comparison.csv not "
                    f"written: jaxfl {' '.join(argv)} goes on (finished runs reused, the cut one resumed) and writes it"]


def test_a_named_logger_new_at_a_resume_is_recorded_and_said_to_start_there(tmp_path):
    # it was taken without a word, log.csv starting mid-run, and a later plain resume dropped it
    import json

    import jaxfl

    class StopAfter:
        def __init__(self, rows):
            self.rows = rows

        def log(self, row, step):
            self.rows -= 1
            if not self.rows:
                jaxfl.request_stop("the test")

        def close(self):
            pass

    config = tiny(tmp_path, max_updates=6, checkpoint_every=1)
    with pytest.raises(jaxfl.RunInterrupted) as stopped:
        run_experiment(config, loggers=[StopAfter(3)])  # versions 0, 1, 2 evaluated: stopped at update 2
    run_dir = stopped.value.run_dir
    with pytest.warns(UserWarning, match=r"loggers csv \(--log-to\) are new for run .*: they log the evaluations "
                                         r"after update 2, where this resume starts"):
        resume_experiment(run_dir, loggers=["csv"], progress=False)
    assert json.load(open(os.path.join(run_dir, "config.json")))["log_to"] == ["csv"]
    with open(os.path.join(run_dir, "log.csv"), newline="") as handle:
        assert [int(row["version"]) for row in csv.DictReader(handle)] == [3, 4, 5, 6]


def test_a_recorded_logger_left_out_of_a_resume_is_said_to_miss_that_stretch(tmp_path):
    import jaxfl

    config = tiny(tmp_path, max_updates=4, checkpoint_every=1)
    with pytest.raises(jaxfl.RunInterrupted) as interrupted:
        run_experiment(config, loggers=["csv", Recording(interrupt_at_row=3)])
    with pytest.warns(UserWarning, match=r"loggers csv \(--log-to\), which run .* was started with, are not given to "
                                         r"this resume: they log nothing from update 1 on"):
        resume_experiment(interrupted.value.run_dir, loggers=[Recording()], progress=False)


def test_a_built_in_logger_given_as_an_object_is_not_called_left_out(tmp_path):
    import warnings as warnings_module

    import jaxfl
    from jaxfl.loggers import CSVLogger

    config = tiny(tmp_path, max_updates=4, checkpoint_every=1)
    with pytest.raises(jaxfl.RunInterrupted) as interrupted:
        run_experiment(config, loggers=["csv", Recording(interrupt_at_row=3)])
    with warnings_module.catch_warnings():
        warnings_module.simplefilter("error")  # no "csv ... not given" note
        resume_experiment(interrupted.value.run_dir, progress=False,
                          loggers=[CSVLogger(os.path.join(interrupted.value.run_dir, "log.csv"), append=True)])
