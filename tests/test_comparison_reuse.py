"""compare(configs, reuse=True): a notebook run again trains only what it has not finished, as
``jaxfl run --algorithm a,b`` does (a cell run twice trained every run again into -2 folders, with a
warning per run and one that the table was replaced by the same table)."""
import dataclasses
import os
import re
import warnings

import pytest

from jaxfl.algorithms import FedAvgAlgorithm, register, unregister
from jaxfl.comparison import compare
from jaxfl.config import RunConfig
from jaxfl.testing import _interrupt_after, _Interrupted

BASE = dict(model="logreg", clients=3, local_steps=2, batch_size=16, max_updates=4, checkpoint_every=2,
            checkpoint_min_interval_s=0, stop_at_target=False, progress=False)


def configs(out, names=("fedavg", "fedasync")):
    return [RunConfig(**BASE, algorithm=name, output_dir=str(out)) for name in names]


def test_a_comparison_run_again_reads_its_finished_runs_back(tmp_path):
    first = compare(configs(tmp_path), reuse=True)
    folders = sorted(os.listdir(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "trains it again", no "replaced by this one's"
        again = compare(configs(tmp_path), reuse=True)
    assert sorted(os.listdir(tmp_path)) == folders
    assert again.run_dirs == first.run_dirs and again.rows == first.rows
    for before, now in zip(first.results, again.results):
        assert now.summary == before.summary and now.metrics == before.metrics
        assert before.params is not None and now.params is None and now.simulation is None
    # without reuse, as before: trained again beside them, and said
    with pytest.warns(UserWarning, match="holds a finished run of this config"):
        plain = compare(configs(tmp_path))
    assert all(run_dir.endswith("-2") for run_dir in plain.run_dirs)


def test_an_interrupted_run_of_the_comparison_is_resumed(tmp_path):
    compare(configs(tmp_path, ("fedavg",)), reuse=True)
    with pytest.raises(_Interrupted), _interrupt_after(events=6):
        compare(configs(tmp_path), reuse=True)  # fedasync cut after a checkpoint
    with pytest.warns(UserWarning, match=r"fedasync: resuming .*fedasync-.*, interrupted after a checkpoint"):
        comparison = compare(configs(tmp_path), reuse=True)
    assert comparison.results[1].summary["resumes"] == 1 and comparison.results[1].summary["global_updates"] == 4
    assert len(os.listdir(tmp_path)) == 2 + 2  # two runs, comparison.csv and .png


def test_an_algorithm_without_a_file_is_trained_again(tmp_path):
    # its code may have been edited in the notebook since, which no fingerprint of a file can tell
    Local = type("LocalFedAvg", (FedAvgAlgorithm,), {"name": "reuse_test_local_fedavg", "__module__": "__main__"})
    register(Local)
    try:
        out = configs(tmp_path, ("fedavg", "reuse_test_local_fedavg"))
        compare(out, reuse=True)
        # said why, not advised to reuse it with reuse=True (the call's own)
        with pytest.warns(UserWarning, match=r"holds a finished run of this config.*not reused: the algorithm "
                                             r"'reuse_test_local_fedavg' is defined in a notebook or script") as said:
            again = compare(out, reuse=True)
        assert len([w for w in said if "holds a finished run" in str(w.message)]) == 1
        assert not [w for w in said if "reuse=True" in str(w.message)]
        # the same comparison's table, not another's: its run trained again into a folder of its own
        # said "comparison.csv held the comparison of fedavg,reuse_test_local_fedavg (2 runs), replaced by this one's"
        assert not [w for w in said if "held the comparison" in str(w.message)]
        assert again.results[0].params is None and again.results[1].params is not None
        assert again.run_dirs[1].endswith("-2")
    finally:
        unregister("reuse_test_local_fedavg")


def test_a_run_given_objects_beside_its_config_is_not_reused(tmp_path):
    # a peer started from another run's weights (init_params=) was read back as the config's own run
    from jaxfl.experiment import run_experiment

    started = run_experiment(configs(tmp_path / "first", ("fedavg",))[0])
    peer = run_experiment(configs(tmp_path, ("fedavg",))[0], init_params=started.params)
    again = compare(configs(tmp_path, ("fedavg",)), reuse=True)
    assert again.run_dirs[0] != peer.run_dir and again.results[0].params is not None  # trained: its own run


def test_a_model_registered_in_the_notebook_is_trained_again(tmp_path):
    # redefined under its name (another width), its earlier run was reused without a word
    import flax.linen as nn

    from jaxfl.models.zoo import MODEL_INPUTS, MODELS

    class Linear(nn.Module):
        num_classes: int = 10

        @nn.compact
        def __call__(self, x):
            return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))

    from jaxfl.models.zoo import register_model

    register_model("reuse_test_model", Linear, overwrite=True)
    try:
        out = [RunConfig(**{**BASE, "model": "reuse_test_model"}, algorithm="fedavg", output_dir=str(tmp_path))]
        compare(out, reuse=True)
        with pytest.warns(UserWarning, match="not reused: the model 'reuse_test_model' is registered by name"):
            again = compare(out, reuse=True)
        assert again.results[0].params is not None and again.run_dirs[0].endswith("-2")
    finally:
        MODELS.pop("reuse_test_model", None)
        MODEL_INPUTS.pop("reuse_test_model", None)


def test_a_reused_run_that_diverged_is_a_stopped_run_as_when_it_ran(tmp_path):
    from jaxfl.comparison import StoppedRun

    out = [RunConfig(**{**BASE, "client_lr": 1e38, "client_optimizer": "sgd"}, algorithm="fedavg",
                     output_dir=str(tmp_path))]
    with pytest.warns(UserWarning, match="fedavg: run stopped"):
        first = compare(out, reuse=True)
    with pytest.warns(UserWarning, match=r"fedavg: run stopped: (?!numerical error).*\(reused: it had finished so\)"):
        again = compare(out, reuse=True)
    assert isinstance(first.results[0], StoppedRun) and isinstance(again.results[0], StoppedRun)
    assert again.run_dirs == first.run_dirs



def test_a_reused_run_stopped_by_a_negative_time_is_a_stopped_run_as_when_it_ran(tmp_path):
    # RunStopped (a negative time per step, an evaluation grid) is a NumericalError: a StoppedRun when it ran,
    # a RunResult without a word when reused
    from jaxfl.comparison import StoppedRun

    out = [RunConfig(**{**BASE, "jitter": 5.0, "negative_times": "error"}, algorithm="fedavg",
                     output_dir=str(tmp_path))]
    with pytest.warns(UserWarning, match="fedavg: run stopped: non-positive time per step"):
        first = compare(out, reuse=True)
    with pytest.warns(UserWarning, match=r"fedavg: run stopped: negative time.*\(reused: it had finished so\)"):
        again = compare(out, reuse=True)
    assert isinstance(first.results[0], StoppedRun) and isinstance(again.results[0], StoppedRun)
    assert again.results[0].summary["stop_reason"].startswith("negative time")


def _arrays(shift=0.0):
    import numpy as np

    rng = np.random.default_rng(0)
    return (rng.random((60, 8, 8), np.float32) + shift, np.arange(60) % 3, rng.random((20, 8, 8), np.float32),
            np.arange(20) % 3)


def test_a_comparison_on_your_own_data_and_speeds_trains_every_run_on_them_and_reuses_them(tmp_path):
    # compare took configs alone: a notebook comparing algorithms on its own arrays looped run_experiment
    speeds = [0.1, 0.2, 0.3]
    mine = [RunConfig(**{**BASE, "target_accuracy": 0.5}, algorithm=name, output_dir=str(tmp_path))
            for name in ("fedavg", "fedasync")]
    first = compare(mine, reuse=True, data=_arrays(), time_per_step=speeds)
    assert [result.summary["dataset"] for result in first.results] == ["user", "user"]
    assert all(result.params is not None for result in first.results)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = compare(mine, reuse=True, data=_arrays(), time_per_step=speeds)
    assert again.run_dirs == first.run_dirs and all(result.params is None for result in again.results)
    # a read-back run's model, as the docstring says to read it: its variables built as a template
    import jax
    import numpy as np

    from jaxfl.checkpoint import final_params
    from jaxfl.experiment import prepare

    model = final_params(again.run_dirs[0], prepare(mine[0], data=_arrays())[4])
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(first.results[0].params)))
    # other values of the same shapes, or other speeds: other runs, trained
    other = compare(mine, reuse=True, data=_arrays(shift=1.0), time_per_step=speeds)
    assert all(result.params is not None for result in other.results)
    assert not set(other.run_dirs) & set(first.run_dirs)
    drawn = compare(mine, reuse=True, data=_arrays())
    assert all(result.params is not None for result in drawn.results)
    assert not set(drawn.run_dirs) & set(first.run_dirs + other.run_dirs)


def test_a_comparison_s_interrupted_run_on_your_own_data_resumes_on_it(tmp_path):
    mine = configs(tmp_path)
    compare(mine[:1], reuse=True, data=_arrays())
    with pytest.raises(_Interrupted), _interrupt_after(events=6):
        compare(mine, reuse=True, data=_arrays())
    with pytest.warns(UserWarning, match=r"fedasync: resuming .*fedasync-user-.*, interrupted after a checkpoint"):
        comparison = compare(mine, reuse=True, data=_arrays())
    assert comparison.results[1].summary["resumes"] == 1 and comparison.results[1].summary["global_updates"] == 4
    assert comparison.results[0].params is None  # fedavg's: read back


def test_a_comparison_on_an_npz_file_reuses_its_runs_until_the_file_changes(tmp_path):
    # a run on an npz file records (and is named by) the SHA-256 of its arrays, which a config does not
    # hold: no run of such a config was ever found, so every comparison on a file trained everything again
    # and a Ctrl-C'd one restarted its cut run instead of resuming it
    import numpy as np

    def save(shift):
        x_train, y_train, x_test, y_test = _arrays(shift)
        np.savez(tmp_path / "mine.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)

    save(0.0)
    mine = [dataclasses.replace(config, dataset="npz", data_dir=str(tmp_path / "mine.npz"))
            for config in configs(tmp_path / "runs")]
    compare(mine[:1], reuse=True)
    with pytest.raises(_Interrupted), _interrupt_after(events=6):
        compare(mine, reuse=True)
    with pytest.warns(UserWarning, match=r"fedasync: resuming .*fedasync-npz-.*, interrupted after a checkpoint"):
        first = compare(mine, reuse=True)
    assert first.results[0].params is None and first.results[1].summary["resumes"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing trained again
        again = compare(mine, reuse=True)
    assert again.run_dirs == first.run_dirs and all(result.params is None for result in again.results)
    save(1.0)  # the file edited: other data, other runs
    edited = compare(mine, reuse=True)
    assert all(result.params is not None for result in edited.results)
    assert not set(edited.run_dirs) & set(first.run_dirs)


def test_a_comparison_checks_what_it_is_given_with_every_config_before_the_first_run(tmp_path):
    import optax

    with pytest.raises(ValueError, match=r"time_per_step has shape \(2,\); expected \(3,\)"):
        compare(configs(tmp_path), data=_arrays(), time_per_step=[0.1, 0.2])
    with pytest.raises(ValueError, match="loss=3 is not callable"):
        compare(configs(tmp_path), loss=3)
    with pytest.raises(ValueError, match="client_optimizer= cannot update from"):
        compare(configs(tmp_path), client_optimizer=optax.contrib.reduce_on_plateau())
    assert os.listdir(tmp_path) == []  # nothing written
    # given objects its config does not name: trained again, and said why
    compare(configs(tmp_path, ("fedavg",)), reuse=True, client_optimizer=optax.sgd(0.1))
    with pytest.warns(UserWarning, match=r"holds a finished run of this config.*not reused: client_optimizer= "
                                         r"given, which no config names"):
        again = compare(configs(tmp_path, ("fedavg",)), reuse=True, client_optimizer=optax.sgd(0.1))
    assert again.results[0].params is not None


def test_an_interrupted_run_given_objects_is_trained_again_saying_how_to_resume_it(tmp_path):
    # (a review: it started over without a word, its folder left behind)
    import optax

    with pytest.raises(_Interrupted), _interrupt_after(events=6):
        compare(configs(tmp_path, ("fedasync",)), reuse=True, data=_arrays(), client_optimizer=optax.sgd(0.1))
    [cut] = os.listdir(tmp_path)
    with pytest.warns(UserWarning, match=rf"{cut} holds an interrupted run of this config, not resumed: "
                                         rf"client_optimizer= given.*resume_experiment\('.*{cut}', "
                                         rf"client_optimizer=\.\.\.\) goes on with it"):
        again = compare(configs(tmp_path, ("fedasync",)), reuse=True, data=_arrays(), client_optimizer=optax.sgd(0.1))
    assert again.results[0].summary["resumes"] == 0 and again.run_dirs[0].endswith("-2")


@pytest.mark.parametrize("given, advice", [
    ({}, r"compare\(configs, reuse=True\), and a comparison on the command line, jaxfl run --algorithm a,b, reuse it"),
    ({"data": True}, r"compare\(configs, reuse=True, data=\.\.\.\) reuses it\)$"),
    ({"data": True, "time_per_step": [0.1, 0.2, 0.3]}, r"compare\(configs, reuse=True, data=\.\.\., "
                                                       r"time_per_step=\.\.\.\) reuses it\)$"),
    ({"time_per_step": [0.1, 0.2, 0.3]}, r"reuse=True, time_per_step=\.\.\.\), and a comparison on the command "
                                         r"line, jaxfl run --algorithm a,b --time-per-step FILE, reuse it"),
    ({"init_params": True}, r"reads the finished one; a comparison does not reuse a run given objects beside its "
                            r"config\)$")])
def test_a_run_trained_again_says_how_to_have_the_finished_one_back_given_what_it_was_given(tmp_path, given, advice):
    # (a review: runs on arrays or given objects were told that compare(configs, reuse=True) reuses them)
    from jaxfl.experiment import run_experiment

    config = configs(tmp_path, ("fedavg",))[0]
    given = {**given, "data": _arrays()} if "data" in given else dict(given)
    if "init_params" in given:
        given["init_params"] = run_experiment(dataclasses.replace(config, output_dir=str(tmp_path / "start"))).params
    run_experiment(config, **given)
    with pytest.warns(UserWarning, match=r"holds a finished run of this config") as said:
        run_experiment(config, **given)
    [line] = [str(w.message) for w in said if "holds a finished run" in str(w.message)]
    assert re.search(advice, line), line


def test_runs_on_given_speeds_are_drawn_as_such_and_told_apart_by_their_speeds(tmp_path):
    # (a review: titled "exp speeds", the drawing default that drew nothing, and both labelled "fedavg")
    pytest.importorskip("matplotlib")
    from jaxfl.experiment import run_experiment
    from jaxfl.plot import accuracy_figure

    config = configs(tmp_path, ("fedavg",))[0]
    fast, slow = (run_experiment(config, time_per_step=speeds) for speeds in ([0.1, 0.1, 0.1], [1.0, 1.0, 5.0]))
    (axes,) = accuracy_figure([fast.run_dir, slow.run_dir]).axes
    assert "given speeds" in axes.get_title() and "exp speeds" not in axes.get_title()
    labels = [text.get_text() for text in axes.get_legend().get_texts()]
    assert labels[0].startswith("fedavg, time_per_step=sha256 ") and labels[1].startswith("fedavg, time_per_step=")
    assert labels[0] != labels[1]
    drawn = run_experiment(dataclasses.replace(config, output_dir=str(tmp_path / "drawn")))
    (axes,) = accuracy_figure([drawn.run_dir]).axes
    assert "exp speeds" in axes.get_title()  # drawn speeds are named as before
    # a colour per algorithm: the two fedavg runs share one, told apart by their dashes; another algorithm
    # first in the list takes the first colour (by place, fedavg's colour followed whatever was listed first)
    other = run_experiment(dataclasses.replace(config, algorithm="fedasync", output_dir=str(tmp_path / "other")))
    lines = [line for line in accuracy_figure([other.run_dir, fast.run_dir, slow.run_dir]).axes[0].get_lines()
             if line.get_label().startswith("fedasync") or line.get_label().startswith("fedavg")]
    fedasync, fedavg_fast, fedavg_slow = lines
    assert fedavg_fast.get_color() == fedavg_slow.get_color() != fedasync.get_color()
    assert fedavg_fast.get_linestyle() != fedavg_slow.get_linestyle()


def test_a_comparison_hashes_the_data_it_is_given_once(tmp_path, monkeypatch):
    # its check, its search for a finished run and each run hashed data= again: 9 times for 3 runs, 0.2 s
    # each for Fashion-MNIST-sized floats (1.7 of 14.5 s; 0.8 of 1.9 s when every run was reused)
    import functools

    from jaxfl.data.datasets import Dataset

    hashed = []
    sha256 = Dataset.fingerprint.func

    def counted(dataset):
        hashed.append(dataset.name)
        return sha256(dataset)

    counting = functools.cached_property(counted)
    counting.__set_name__(Dataset, "fingerprint")
    monkeypatch.setattr(Dataset, "fingerprint", counting)
    mine = configs(tmp_path)
    first = compare(mine, reuse=True, data=_arrays())
    assert hashed == ["user"]
    again = compare(mine, reuse=True, data=_arrays())  # other objects of the same values: hashed once more
    assert hashed == ["user", "user"] and again.run_dirs == first.run_dirs
    other = compare(mine, reuse=True, data=_arrays(shift=1.0))  # and other values are still other data
    assert not set(other.run_dirs) & set(first.run_dirs)
    # one comparison's hash is its own: the same object changed in place before the next is other data,
    # also where both run in one outer block that shares generated data (it held the hash across them)
    from jaxfl.experiment import shared_data

    data = _arrays(shift=2.0)
    with shared_data():
        before = compare(mine, reuse=True, data=data)
        data[0][:] += 1.0
        after = compare(mine, reuse=True, data=data)
    assert all(result.params is not None for result in after.results)
    assert not set(after.run_dirs) & set(before.run_dirs)
