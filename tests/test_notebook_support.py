"""What the notebooks need from the library: an algorithm's options written where annotations are
type objects (a notebook cell, a script without ``from __future__ import annotations``) are checked
and parsed like the built-ins'; plots are matplotlib Figures that never switch the user's backend.

No ``from __future__ import annotations`` in this file, on purpose: the options below are typed as a
notebook types them.
"""
import dataclasses
import os
import pathlib
import re
from typing import Optional

import matplotlib
import pytest
from matplotlib.figure import Figure

import jaxfl
from jaxfl import algorithms
from jaxfl.algorithms import Algorithm, Options
from jaxfl.cli import _configs, build_parser
from jaxfl.plot import accuracy_figure, plot_accuracy, plot_timeline, timeline_figure


@dataclasses.dataclass(frozen=True)
class NotebookOptions(Options):
    namespace = "nbopt"
    max_staleness: int = 4  # updates staler than this are dropped
    scale: float = 1.0  # a number
    limit: Optional[int] = None  # an optional integer


class NotebookAlgorithm(Algorithm):
    name = "notebook_options_test"
    kind = "asynchronous"
    Options = NotebookOptions

    def policy(self):
        return algorithms.get("fedasync")(self.run).policy()


@pytest.fixture
def registered():
    algorithms.register(NotebookAlgorithm)
    yield NotebookAlgorithm
    algorithms.unregister(NotebookAlgorithm.name)


def test_options_typed_with_type_objects_are_checked_and_parsed(registered):
    assert NotebookOptions.__dataclass_fields__["max_staleness"].type is int  # not the text "int"
    config = jaxfl.validate(jaxfl.RunConfig(algorithm=registered.name,
                                            algorithm_options={"max_staleness": 2, "scale": 3, "limit": None}))
    assert config.algorithm_options == NotebookOptions(max_staleness=2, scale=3.0, limit=None)
    assert isinstance(config.algorithm_options.scale, float)  # an int where a float is wanted is converted
    for options, message in (({"max_staleness": "2"}, "nbopt.max_staleness='2' is not allowed: expected an integer"),
                             ({"limit": 1.5}, "nbopt.limit=1.5 is not allowed: expected an integer or null")):
        with pytest.raises(jaxfl.ConfigError, match=message):
            jaxfl.validate(jaxfl.RunConfig(algorithm=registered.name, algorithm_options=options))
    parsed, = _configs(build_parser().parse_args(["run", "--algorithm", registered.name, "--nbopt.max-staleness",
                                                  "7", "--nbopt.scale", "0.5", "--nbopt.limit", "none"]))
    assert parsed.algorithm_options == NotebookOptions(max_staleness=7, scale=0.5, limit=None)
    with pytest.raises(SystemExit):  # argparse names the flag and the bad value
        build_parser().parse_args(["run", "--algorithm", registered.name, "--nbopt.max-staleness", "two"])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    config = jaxfl.RunConfig(algorithm="fedbuff", model="logreg", clients=3, local_steps=2, batch_size=16,
                             buffer_size=2, max_updates=2, progress=False, checkpoint_every=None,
                             output_dir=str(tmp_path_factory.mktemp("runs")))
    return jaxfl.run_experiment(config)


def test_figures_for_notebooks_and_files_leave_the_backend_alone(finished_run, tmp_path):
    before = matplotlib.get_backend()
    matplotlib.use("svg")  # a backend of the user's that is not the one the library would pick
    try:
        accuracy = accuracy_figure([finished_run.run_dir], figsize=(5, 3))
        assert isinstance(accuracy, Figure) and tuple(accuracy.get_size_inches()) == (5, 3)
        axes, = accuracy.axes
        assert [line.get_label() for line in axes.get_lines()][0] == "fedbuff (not reached)"
        assert len(axes.get_lines()[0].get_xdata()) == 3  # the initial model and two updates
        timeline = timeline_figure(finished_run.run_dir)
        assert isinstance(timeline, Figure) and timeline.axes[0].get_title() == "fedbuff: client activity"
        written = [plot_accuracy([finished_run.run_dir], str(tmp_path / "a.png")),
                   plot_timeline(finished_run.run_dir, str(tmp_path / "t.png"))]
        assert all(open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for path in written)
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)


def test_the_accuracy_figure_takes_one_run_as_itself_and_refuses_none(finished_run):
    # a run directory given as a string was taken character by character ("run '/' has no summary.json");
    # an empty list drew an empty figure with a legend warning
    axes, = accuracy_figure(finished_run.run_dir).axes
    assert [line.get_label() for line in axes.get_lines()][0] == "fedbuff (not reached)"
    with pytest.raises(ValueError, match=r"run_dirs=\[\] is not allowed: give the run directories to plot"):
        accuracy_figure([])


def test_load_run_of_a_file_in_a_run_names_the_folder(finished_run):
    path = os.path.join(finished_run.run_dir, "summary.json")
    with pytest.raises(NotADirectoryError, match=rf"is a file, not a run directory: give the folder that holds it "
                                                 rf"\({re.escape(repr(finished_run.run_dir))}\)"):
        jaxfl.load_run(path)


def test_a_run_evaluated_once_is_drawn_as_a_point(tmp_path):
    # stopped before its first aggregation: one evaluation, whose steps line of one point drew nothing
    once = jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedavg", model="logreg", clients=3, local_steps=2,
                                                batch_size=16, max_time=0.001, progress=False, checkpoint_every=None,
                                                output_dir=str(tmp_path)))
    axes, = accuracy_figure([once.run_dir]).axes
    line = axes.get_lines()[0]
    assert len(line.get_xdata()) == 1 and line.get_marker() == "o"


def test_the_accuracy_figure_tells_eleven_runs_apart(finished_run):
    """Past matplotlib's ten colours the runs keep distinct styles (a report's method styles)."""
    axes, = accuracy_figure([finished_run.run_dir] * 11).axes
    runs = [line for line in axes.get_lines() if line.get_label().startswith("fedbuff")]
    assert len(runs) == 11
    assert len({(line.get_color(), str(line.get_linestyle())) for line in runs}) == 11


def test_the_accuracy_figure_of_a_timing_only_or_unfinished_run_is_one_error_naming_it(finished_run, tmp_path):
    """A timing-only run in the list was a bare KeyError 'target_accuracy'; a run without its summary
    a FileNotFoundError. Both are refused, naming the run and what to plot or do instead."""
    timing = jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedbuff", dataset="synthetic_iid", partition="natural",
                                                  model="logreg", clients=20, max_updates=3, timing_only=True,
                                                  progress=False, output_dir=str(tmp_path / "runs")))
    with pytest.raises(ValueError, match=rf"run '{re.escape(timing.run_dir)}' is a timing-only run: it evaluates no "
                                         r"model.*jaxfl.plot.timeline_figure\(run_dir\)"):
        accuracy_figure([finished_run.run_dir, timing.run_dir])
    with pytest.raises(ValueError, match=rf"run '{re.escape(str(tmp_path))}' has no summary.json"):
        accuracy_figure([str(tmp_path)])


def test_a_figure_is_an_image_in_a_notebook_that_has_not_used_pyplot(finished_run):
    """In a fresh kernel (no pyplot use, no ``%matplotlib inline``) IPython showed the library's
    figures as the text ``<Figure size 700x450 with 1 Axes>``: no PNG formatter knew the class."""
    interactiveshell = pytest.importorskip("IPython.core.interactiveshell")
    shell = interactiveshell.InteractiveShell.instance()
    try:
        png = shell.display_formatter.formatters["image/png"]
        png.type_printers.pop(Figure, None)  # as in a fresh kernel
        backend = matplotlib.get_backend()
        for figure in (accuracy_figure([finished_run.run_dir]), timeline_figure(finished_run.run_dir)):
            shown, _ = shell.display_formatter.format(figure)
            assert shown["image/png"][:4] == b"\x89PNG"
        assert matplotlib.get_backend() == backend
    finally:
        interactiveshell.InteractiveShell.clear_instance()


def test_runs_of_other_settings_in_one_accuracy_figure_are_told_apart(finished_run, tmp_path):
    """Runs of two speed models plotted together were all titled by the first run's speeds, labelled
    by their algorithm alone, and drawn against the last run's target only."""
    import json
    import shutil

    other = shutil.copytree(finished_run.run_dir, str(tmp_path / "homo"))
    for name, edit in (("config.json", lambda record: record["config"]["speeds"].update(heterogeneity="homo")),
                       ("summary.json", lambda summary: summary.update(target_accuracy=0.5))):
        with open(f"{other}/{name}") as handle:
            record = json.load(handle)
        edit(record)
        with open(f"{other}/{name}", "w") as handle:
            json.dump(record, handle)
    axes, = accuracy_figure([finished_run.run_dir, other]).axes
    labels = [line.get_label() for line in axes.get_lines()]
    assert [label.split(" (")[0] for label in labels if label.startswith("fedbuff")] == \
        ["fedbuff, exp speeds", "fedbuff, homo speeds"]
    assert "speeds" not in axes.get_title() and "mnist10k, logreg, 3 clients" in axes.get_title()
    assert sorted(label for label in labels if label.startswith("target")) == \
        sorted({f"target {finished_run.summary['target_accuracy']:.0%}", "target 50%"})


def test_runs_of_one_algorithm_at_two_learning_rates_are_labelled_by_the_rate(finished_run, tmp_path):
    """Two runs that differ in a field the title leaves out (a learning rate, an update rule) had one
    label, "fedbuff", twice."""
    import json
    import shutil

    other = shutil.copytree(finished_run.run_dir, str(tmp_path / "lr"))
    with open(f"{other}/config.json") as handle:
        record = json.load(handle)
    before = record["config"]["client"]["client_lr"]
    record["config"]["client"]["client_lr"] = 0.5
    with open(f"{other}/config.json", "w") as handle:
        json.dump(record, handle)
    axes, = accuracy_figure([finished_run.run_dir, other, finished_run.run_dir]).axes
    labels = [line.get_label().split(" (")[0] for line in axes.get_lines() if line.get_label().startswith("fedbuff")]
    assert labels == [f"fedbuff, client_lr={before}", "fedbuff, client_lr=0.5", f"fedbuff, client_lr={before}"]


def test_a_run_of_a_config_that_already_finished_says_it_trains_again(finished_run):
    """A notebook cell run twice trained its run again into a -2 folder without a word."""
    config = jaxfl.RunConfig(algorithm="fedbuff", model="logreg", clients=3, local_steps=2, batch_size=16,
                             buffer_size=2, max_updates=2, progress=False, checkpoint_every=None,
                             output_dir=str(pathlib.Path(finished_run.run_dir).parent))
    with pytest.warns(UserWarning, match=rf"{re.escape(finished_run.run_dir)} holds a finished run of this config "
                                         rf".*again, into {re.escape(finished_run.run_dir)}-2 "):
        again = jaxfl.run_experiment(config)
    assert again.run_dir == finished_run.run_dir + "-2"


def test_no_jax_check_of_a_policy_defined_in_a_notebook_is_reported_skipped_not_passed(tmp_path):
    """A notebook's (or script's) policy lives in ``__main__``, which no fresh interpreter imports:
    ``no_jax`` asked for is said to be skipped (report and warning), not counted as passed."""
    from jaxfl.scheduler.simulation import Policy
    from jaxfl.testing import check_algorithm

    class NotebookPolicy(Policy):
        __module__ = "__main__"

        def __init__(self, local_steps):
            self.local_steps = local_steps

        def start(self, sim):
            for client in range(sim.num_clients):
                sim.dispatch(client, self.local_steps)

        def on_arrival(self, sim, record):
            sim.aggregate([(record.id, sim.client_weights[record.client])])
            sim.reply(record.client)

    class NotebookPolicyAlgorithm(Algorithm):
        name = "notebook_algorithm_for_no_jax"
        kind = "asynchronous"

        def policy(self):
            return NotebookPolicy(self.run.local_steps)

    try:
        with pytest.warns(UserWarning, match="no_jax not checked: the policy's module is __main__"):
            report = check_algorithm(NotebookPolicyAlgorithm, checks=["toml", "no_jax"], output_dir=str(tmp_path))
    finally:
        algorithms.unregister(NotebookPolicyAlgorithm.name)
    assert report["policy_module"] == "__main__" and set(report["skipped"]) == {"no_jax"}
    # a policy in a module of its own is imported and checked, and nothing is skipped
    assert "skipped" not in check_algorithm("fedbuff", checks=["no_jax"], output_dir=str(tmp_path / "fedbuff"))
