"""The run path builds every dataset and partition by name, pairs models with their input shapes,
rejects bad combinations before training with messages naming the values, and `jaxfl partition`
prints a split and saves its heatmap."""

from __future__ import annotations

import dataclasses
import gzip
import os
import warnings

import flax.linen as nn
import numpy as np
import pytest

import jaxfl.config
from jaxfl.cli import main
from jaxfl.config import PARTITION_NAMES, RunConfig
from jaxfl.data import FASHION_MNIST_DIR
from jaxfl.experiment import build_data, prepare, run_experiment
from jaxfl.models import MODEL_INPUTS, MODELS, register_model


def config(**changes):
    base = dict(algorithm="fedbuff", model="mlp", clients=5, local_steps=2, batch_size=8, max_updates=1,
                buffer_size=2, progress=False)
    if not changes.get("timing_only"):  # a timing-only run builds no engine and refuses its settings
        base["steps_per_call"] = 1
    return RunConfig(**{**base, **changes})


@pytest.mark.parametrize("partition, extra", [
    ("iid", {}), ("iid", {"client_sizes": "lognormal", "size_skew": 1.5}), ("iid", {"client_sizes": "powerlaw"}),
    ("dirichlet", {"dirichlet_alpha": 0.3}), ("dirichlet_client", {"client_sizes": "lognormal"}), ("class", {}),
    ("dual_dirichlet", {}), ("label_shards", {"shards_per_client": 3}), ("gamma_mix", {"gamma": 0.3}),
])
def test_every_partition_by_name(partition, extra):
    dataset, federation = build_data(jaxfl.config.validate(config(partition=partition, **extra)))
    assert federation.num_clients == 5 and int(federation.counts.sum()) == len(dataset.train_y)
    assert federation.counts.min() >= 1


def test_partition_names_match_the_registry():
    from jaxfl.data import PARTITIONS

    assert set(PARTITION_NAMES) == set(PARTITIONS)


def _idx(arr, code=0x08):
    header = bytes([0, 0, code, arr.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    return header + arr.tobytes()


def _datasets(tmp_path):
    """(dataset name, data_dir, model) for every loader that works offline here."""
    rng = np.random.default_rng(0)
    mnist_dir = tmp_path / "mnist"
    mnist_dir.mkdir()
    for prefix, n in (("train", 40), ("t10k", 10)):
        (mnist_dir / f"{prefix}-images-idx3-ubyte.gz").write_bytes(
            gzip.compress(_idx(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))))
        (mnist_dir / f"{prefix}-labels-idx1-ubyte").write_bytes(_idx((np.arange(n) % 10).astype(np.uint8)))
    npz = tmp_path / "toy.npz"
    np.savez(npz, x_train=rng.integers(0, 256, (30, 32, 32, 3), dtype=np.uint8), y_train=np.arange(30) % 3,
             x_test=rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8), y_test=np.arange(6) % 3)
    # Cheap models where the shape does not matter (lenet5 runs end to end below).
    cases = [("mnist10k", None, "mlp"), ("mnist", str(mnist_dir), "mlp"), ("npz", str(npz), "ccfedavg_cnn"),
             ("synthetic", None, "logreg"), ("synthetic_iid", None, "logreg"), ("synthetic:0.5,0.5", None, "mlp")]
    try:
        import sklearn  # noqa: F401

        cases.append(("digits", None, "logreg"))
    except ImportError:
        pass
    if os.path.isdir(FASHION_MNIST_DIR):
        cases.append(("fashion_mnist", None, "mlp"))
    return cases


def test_every_offline_dataset_prepares_with_a_fitting_model(tmp_path):
    for name, data_dir, model in _datasets(tmp_path):
        cfg, dataset, federation, _, params = prepare(config(dataset=name, data_dir=data_dir, model=model))
        assert federation.num_clients == 5, name
        # a target only where one is known for the data (no invented one for npz or synthetic data)
        assert cfg.target_accuracy == jaxfl.config.DEFAULT_TARGETS.get(name), name


def test_tfds_datasets_prepare():
    tfds = pytest.importorskip("tensorflow_datasets")
    from jaxfl.data.tfds_source import load_tfds

    load_tfds.cache_clear()
    try:
        with tfds.testing.mock_data(num_examples=20):
            prepare(config(dataset="tfds:cifar10", model="fedasmu_cnn", partition="label_shards", clients=4))
            cfg, dataset, *_ = prepare(config(dataset="tfds:imdb_reviews", model="textcnn", clients=4))
            assert dataset.kind == "tokens" and cfg.target_accuracy is None
    finally:
        load_tfds.cache_clear()


def test_runs_end_to_end_with_other_input_shapes(tmp_path):
    # LeNet-5 (PLATO's, built for 28x28 and up) trains on MNIST; the synthetic features run via the CLI below.
    lenet = run_experiment(config(model="lenet5", dataset="mnist10k", partition="class", output_dir=str(tmp_path)))
    assert lenet.summary["global_updates"] == 1 and lenet.summary["final_accuracy"] > 0


def test_cli_run_accepts_the_new_names(tmp_path, capsys):
    code = main(["run", "--dataset", "synthetic:0.5,0.5", "--partition", "natural", "--model", "logreg",
                 "--clients", "20", "--max-updates", "1", "--buffer-size", "2", "--local-steps", "2",
                 "--no-progress", "--output-dir", str(tmp_path)])
    assert code == 0 and "fedbuff: best accuracy" in capsys.readouterr().out


def test_cli_partition_prints_the_table_and_saves_the_heatmap(tmp_path, capsys):
    code = main(["partition", "--dataset", "mnist10k", "--partition", "label_shards", "--clients", "20",
                 "--seed", "3", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "mnist10k, label_shards, shards_per_client 2, 20 clients, seed 3" in out and "20 clients, 8000 samples" in out
    pytest.importorskip("matplotlib")
    png = tmp_path / "partition-mnist10k-label_shards-shards2-c20-s3.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    # the split's own settings name the figure: another alpha was written over the first one
    for alpha in ("0.1", "100"):
        assert main(["partition", "--partition", "dirichlet", "--dirichlet-alpha", alpha, "--clients", "5",
                     "--out", str(tmp_path)]) == 0
    assert "dirichlet_alpha 0.1, 5 clients" in capsys.readouterr().out
    assert {"partition-mnist10k-dirichlet-a0.1-c5-s0.png", "partition-mnist10k-dirichlet-a100-c5-s0.png"} <= \
        set(os.listdir(tmp_path))
    # two npz files of one name are two figures, each titled with its file
    for folder, classes in (("a", 3), ("b", 5)):
        os.makedirs(tmp_path / folder)
        labels = np.arange(60) % classes
        np.savez(tmp_path / folder / "mine.npz", x_train=np.zeros((60, 4), np.float32), y_train=labels,
                 x_test=np.zeros((10, 4), np.float32), y_test=labels[:10])
        assert main(["partition", "--dataset", "npz", "--data-dir", str(tmp_path / folder / "mine.npz"),
                     "--clients", "3", "--out", str(tmp_path / "npz")]) == 0
        assert "npz mine.npz " in capsys.readouterr().out
    assert len([name for name in os.listdir(tmp_path / "npz") if name.startswith("partition-npz-mine.npz-")]) == 2
    # a file name that is no UTF-8 (its bytes kept as surrogates) is shown escaped, not a traceback
    odd = os.fsdecode(os.fsencode(str(tmp_path / "a" / "caf")) + b"\xe9.npz")
    os.rename(tmp_path / "a" / "mine.npz", odd)
    assert main(["partition", "--dataset", "npz", "--data-dir", odd, "--clients", "3", "--out", str(tmp_path / "odd")]) == 0
    assert "npz caf\\udce9.npz " in capsys.readouterr().out


def test_cli_partition_of_a_synthetic_federation_split_anew_says_what_it_undoes(tmp_path):
    # jaxfl run said so, the command that shows the split did not
    with pytest.warns(UserWarning, match="partition='iid' pools them and splits them anew, which undoes it"):
        assert main(["partition", "--dataset", "synthetic", "--clients", "5", "--out", str(tmp_path)]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["partition", "--dataset", "synthetic", "--partition", "natural", "--clients", "5",
                     "--out", str(tmp_path)]) == 0


def test_niid_bench_s_dirichlet_settings_reach_the_split_and_name_the_run_only_when_set(tmp_path):
    # NIID-Bench's code draws until every client holds 10 samples and stops giving classes to a
    # client that holds N/C; partition_dirichlet had both, a run could set neither
    from jaxfl.data import load_dataset
    from jaxfl.data.federated import PARTITION_STREAM
    from jaxfl.data.partition import partition_dirichlet
    from jaxfl.experiment import partition_data, run_name

    dataset = load_dataset("mnist10k")
    plain = jaxfl.config.RunConfig(partition="dirichlet", dirichlet_alpha=0.1, clients=10)
    niid = jaxfl.config.RunConfig(partition="dirichlet", dirichlet_alpha=0.1, clients=10, dirichlet_min_samples=10,
                                  dirichlet_balance=True)
    rng = np.random.default_rng(np.random.SeedSequence([0, PARTITION_STREAM]))
    expected = partition_dirichlet(dataset.train_y, 10, 0.1, rng, min_samples=10, balance=True)
    federation = partition_data(jaxfl.config.validate(niid), dataset)
    assert federation.counts.tolist() == [len(part) for part in expected]
    for client, part in enumerate(expected):
        start = federation.offsets[client]
        assert (federation.y[start:start + len(part)] == dataset.train_y[np.asarray(part)]).all()
    assert partition_data(jaxfl.config.validate(plain), dataset).counts.tolist() != federation.counts.tolist()
    assert federation.counts.max() <= 8000 // 10 + max(np.bincount(dataset.train_y))  # the balance cap, one class over
    # a run made before these fields existed keeps its name; a run that sets them is another run
    assert run_name(plain) == run_name(jaxfl.config.RunConfig(partition="dirichlet", dirichlet_alpha=0.1, clients=10,
                                                              dirichlet_min_samples=1, dirichlet_balance=False))
    assert run_name(niid) != run_name(plain)
    for bad, message in (({"dirichlet_min_samples": 0}, "dirichlet_min_samples=0 is not allowed: an integer >= 1"),
                         ({"dirichlet_min_samples": 900}, "min_samples=900 is infeasible"),
                         ({"partition": "iid", "dirichlet_alpha": 0.5, "dirichlet_min_samples": 1},
                          "dirichlet_balance=True is not allowed.*read only with partition dirichlet")):
        with pytest.raises((jaxfl.config.ConfigError, ValueError), match=message):
            config = jaxfl.config.validate(dataclasses.replace(niid, **bad))
            partition_data(config, dataset)


def test_cli_partition_rejects_bad_values(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["partition", "--partition", "dirichlet", "--dirichlet-alpha", "0", "--out", str(tmp_path)])
    assert info.value.code == 2 and "dirichlet_alpha=0.0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["partition", "--clients", "9000", "--out", str(tmp_path)])
    assert "partition='iid' cannot split dataset='mnist10k' over clients=9000 (seed 0): clients=9000 must be " \
        "between 1 and the number of samples (8000)" in capsys.readouterr().err


# --------------------------------------------------------------------------- validation before training


@pytest.mark.parametrize("changes, message", [
    ({"clients": 9000}, r"^partition='iid' cannot split dataset='mnist10k' over clients=9000 \(seed 0\): "
                        r"clients=9000 must be between 1 and the number of samples \(8000\)"),
    ({"model": "cnn", "dataset": "synthetic"}, r"'cnn' is built for images of shape \(28, 28, 1\).*\(60,\)"),
    ({"model": "textcnn"}, r"'textcnn' is built for token ids.*shape \(28, 28, 1\)"),
    ({"model": "mlp", "dataset": "synthetic", "augment": "crop_flip"},
     r"augment='crop_flip' needs image samples but dataset 'synthetic' has features samples"),
    ({"partition": "natural"}, r"^partition='natural' cannot split dataset='mnist10k' over clients=\d+ \(seed 0\): "
                               r"partition 'natural' needs a per-sample client id column"),
    ({"partition": "dual_dirichlet", "clients": 2000},
     r"^partition='dual_dirichlet' cannot split dataset='mnist10k' over clients=2000 \(seed 0\): .* left \d+ of "
     r"2000 clients without samples"),
    ({"partition": "label_shards", "clients": 4000, "shards_per_client": 3}, r"12000 shards exceeds the 8000"),
    ({"dataset": "synthetic:x,y"}, r"synthetic:ALPHA,BETA"),
])
def test_bad_combinations_fail_before_training(changes, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        prepare(config(output_dir=str(tmp_path), **changes))
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["mnist10k", "digits", "fashion_mnist", "synthetic", "synthetic_iid",
                                  "synthetic:0.5,0.5", "synthetic:iid+parallel"])
def test_the_input_a_dataset_name_fixes_is_the_loaded_datas(name):
    from jaxfl.data import load_dataset
    from jaxfl.data.datasets import known_input

    if name == "digits":
        pytest.importorskip("sklearn")
    if name == "fashion_mnist" and not os.path.isdir(FASHION_MNIST_DIR):
        pytest.skip(f"no {FASHION_MNIST_DIR}")
    options = {"num_clients": 3} if name.startswith("synthetic") else {}
    dataset = load_dataset(name, **options)
    assert known_input(name) == (dataset.input_shape, dataset.kind)


def test_a_model_that_cannot_take_a_named_dataset_is_refused_before_the_data_is_built(tmp_path, monkeypatch):
    # a million synthetic clients take a minute and gigabytes to generate: the model is checked first
    import jaxfl.experiment

    built = []
    monkeypatch.setattr(jaxfl.experiment, "load_data", lambda config: built.append(config))
    with pytest.raises(ValueError, match=r"'cnn' is built for images of shape \(28, 28, 1\).*synthetic_iid.*\(60,\)"):
        prepare(config(output_dir=str(tmp_path), model="cnn", dataset="synthetic_iid", clients=1_000_000,
                       timing_only=True))
    assert built == [] and not (tmp_path / "runs").exists()


def test_a_users_model_unfit_for_a_named_dataset_is_refused_before_the_data_is_built(tmp_path, monkeypatch):
    # only tracing knows what a user's model takes: it is traced on the input the dataset's name fixes
    import jaxfl.experiment
    from jaxfl.data.datasets import known_classes

    class ImagesOnly(nn.Module):
        num_classes: int = 10

        @nn.compact
        def __call__(self, x):
            return nn.Dense(self.num_classes)(nn.Conv(4, (3, 3))(x).reshape((x.shape[0], -1)))

    class Features(nn.Module):
        num_classes: int = 10

        @nn.compact
        def __call__(self, x):
            return nn.Dense(self.num_classes)(x)

    built = []
    monkeypatch.setattr(jaxfl.experiment, "load_data", lambda config: built.append(config))
    settings = dict(output_dir=str(tmp_path), dataset="synthetic", partition="dirichlet", clients=1_000_000,
                    timing_only=True, model="cnn")  # the default, which a model object replaces
    with pytest.raises(ValueError, match=r"ImagesOnly>' cannot take dataset 'synthetic' samples of shape \(60,\)"):
        run_experiment(config(**settings), model=ImagesOnly)
    assert known_classes("synthetic") == 10
    with pytest.raises(ValueError, match=r"outputs 10 logits but dataset 'synthetic' has 12 classes"):
        prepare(config(num_classes=12, **settings), model=Features(num_classes=10))
    assert built == [] and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["mnist10k", "digits", "synthetic", "synthetic:0.5,0.5"])
def test_the_classes_a_dataset_name_fixes_are_the_loaded_datas(name):
    from jaxfl.data import load_dataset
    from jaxfl.data.datasets import known_classes

    if name == "digits":
        pytest.importorskip("sklearn")
    options = {"num_clients": 3} if name.startswith("synthetic") else {}
    assert known_classes(name) == load_dataset(name, **options).num_classes


def test_model_width_must_match_the_classes(monkeypatch):
    class ThreeWay(nn.Module):
        num_classes: int = 10

        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(x.reshape((x.shape[0], -1)))  # ignores num_classes

    monkeypatch.setattr(jaxfl.config, "MODEL_NAMES", jaxfl.config.MODEL_NAMES)
    try:
        register_model("three_way", ThreeWay)
        with pytest.raises(ValueError, match="'three_way' outputs 3 logits but dataset 'mnist10k' has 10 classes"):
            prepare(config(model="three_way"))
    finally:
        MODELS.pop("three_way", None)
        MODEL_INPUTS.pop("three_way", None)


class _KeepsImageAxes(nn.Module):
    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(x)  # no flatten: (batch, 28, 28, classes)


class _AveragesTheBatch(nn.Module):
    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1))).mean(0, keepdims=True)


@pytest.mark.parametrize("model, returned", [(_KeepsImageAxes, r"\(2, 28, 28, 10\)"), (_AveragesTheBatch, r"\(1, 10\)")])
def test_a_model_must_return_one_row_of_logits_per_sample(tmp_path, model, returned):
    """Labels are one class per sample: logits of any other shape are refused in words, before any data
    is built, rather than failing inside the loss (an axis out of bounds)."""
    with pytest.raises(ValueError, match=rf"returns logits of shape {returned} for a batch of 2 samples of "
                                         r"shape \(28, 28, 1\); it must return \(2, 10\)"):
        prepare(config(output_dir=str(tmp_path)), model=model)
    assert not (tmp_path / "runs").exists()


def _counting_generations(monkeypatch) -> list:
    import jaxfl.data.synthetic

    generated, generate = [], jaxfl.data.synthetic.load_synthetic

    def load_synthetic(**options):
        generated.append(options)
        return generate(**options)

    monkeypatch.setattr(jaxfl.data.synthetic, "load_synthetic", load_synthetic)
    return generated


SYNTHETIC_RUN = ["--dataset", "synthetic_iid", "--partition", "natural", "--clients", "12", "--model", "logreg",
                 "--local-steps", "2", "--max-updates", "1", "--no-stop-at-target"]


def test_a_comparison_generates_its_synthetic_data_once(tmp_path, monkeypatch, capsys):
    generated = _counting_generations(monkeypatch)
    assert main(["run", "--algorithm", "fedavg,fedbuff", *SYNTHETIC_RUN, "--output-dir", str(tmp_path)]) == 0
    assert len(generated) == 1  # checked before the runs, then the same arrays for both runs
    assert len(list((tmp_path).glob("*/summary.json"))) == 2
    assert main(["run", "--algorithm", "fedavg", *SYNTHETIC_RUN, "--output-dir", str(tmp_path / "one")]) == 0
    assert len(generated) == 2  # the block ended with the comparison: a later run generates its own


def test_a_sweep_in_one_process_generates_its_synthetic_data_once(tmp_path, monkeypatch):
    from jaxfl.sweep import run_sweep

    generated = _counting_generations(monkeypatch)
    base = {"dataset": "synthetic_iid", "partition": "natural", "clients": 12, "model": "logreg", "local_steps": 2,
            "max_updates": 1, "stop_at_target": False}
    result = run_sweep(base, {"algorithm": ["fedavg", "fedbuff"]}, str(tmp_path), progress=False)
    assert len(result.rows) == 2 and len(generated) == 1


@pytest.mark.parametrize("dataset, partition, timing_only, warned", [
    ("synthetic:0.5,0.5", "iid", False, True), ("synthetic", "dirichlet", False, True),
    ("synthetic:0.5,0.5", "natural", False, False), ("synthetic_iid", "iid", False, False),
    ("synthetic:0.5,0.5", "iid", True, False)])
def test_a_split_that_undoes_synthetic_heterogeneity_is_said(dataset, partition, timing_only, warned, tmp_path):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare(config(output_dir=str(tmp_path), dataset=dataset, partition=partition, clients=20, model="logreg",
                       timing_only=timing_only))
    said = [str(w.message) for w in caught if "FedProx's heterogeneity" in str(w.message)]
    assert len(said) == warned
    if warned:
        assert f"partition={partition!r}" in said[0] and "--partition natural" in said[0]
