"""Bringing your own data: arrays, Datasets and mappings in run_experiment(data=...), checked before any
work; the data's fingerprint on resume; npz files re-read when rewritten; explicit num_classes; float
images used as they are; no invented target for unknown data; normalisation by the training split's
statistics or explicit ones."""
from __future__ import annotations

import dataclasses
import json
import os
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from jaxfl.cli import main
from jaxfl.config import ConfigError, RunConfig, config_from_mapping, load_config_text, to_toml, validate
from jaxfl.data import FASHION_MNIST_DIR, as_dataset, load_dataset
from jaxfl.experiment import make_transforms, normalization_statistics, prepare, resume_experiment, run_experiment
from jaxfl.kernels import scale_uint8
from jaxfl.testing import _Interrupted, _interrupt_after, assert_same_run


def arrays(seed=0, train=200, test=50, classes=4, shape=(8, 8), dtype=np.float32):
    """Random images whose class shifts their mean, so a model can learn something."""
    rng = np.random.default_rng(seed)
    y_train, y_test = np.arange(train) % classes, np.arange(test) % classes
    if dtype == np.uint8:
        return (rng.integers(0, 256, (train, *shape), dtype=np.uint8), y_train,
                rng.integers(0, 256, (test, *shape), dtype=np.uint8), y_test)
    x_train = rng.random((train, *shape)).astype(dtype) + y_train.reshape(-1, *[1] * len(shape)) * 0.5
    x_test = rng.random((test, *shape)).astype(dtype) + y_test.reshape(-1, *[1] * len(shape)) * 0.5
    return x_train, y_train, x_test, y_test


def small(tmp_path, **changes):
    return RunConfig(**{"algorithm": "fedavg", "model": "logreg", "clients": 3, "local_steps": 2, "batch_size": 16,
                        "max_updates": 2, "client_optimizer": "sgd", "client_lr": 0.1, "progress": False,
                        "checkpoint_every": None, "target_accuracy": 0.99, "output_dir": str(tmp_path / "runs"),
                        **changes})


def test_a_run_on_float_images_trains_a_cnn_and_records_the_data(tmp_path):
    data = arrays()
    with pytest.warns(UserWarning, match="dataset 'user' has no default target accuracy"):
        result = run_experiment(small(tmp_path, model="fedasmu_cnn", target_accuracy=None), data=data)
    summary = result.summary
    assert summary["dataset"] == "user" and summary["global_updates"] == 2
    # no invented target: nothing to reach, nothing to stop at
    assert summary["target_accuracy"] is None and summary["time_to_target"] is None
    assert summary["stop_reason"] == "update budget" and 0 <= summary["final_accuracy"] <= 1
    saved = json.loads(open(os.path.join(result.run_dir, "config.json")).read())
    assert saved["config"]["data"]["dataset"] == "user"
    assert saved["config"]["data"]["data_fingerprint"] == as_dataset(data).fingerprint
    assert saved["dataset"] == {"name": "user", "kind": "image", "input_shape": [8, 8, 1], "dtype": "float32",
                                "num_classes": 4, "train_samples": 200, "test_samples": 50, "normalization": None}
    assert os.path.basename(result.run_dir).startswith("fedavg-user-fedasmu_cnn-iid-exp-c3-")


def test_tuples_mappings_and_datasets_are_the_same_data(tmp_path):
    x_train, y_train, x_test, y_test = arrays(dtype=np.uint8)
    forms = [(x_train, y_train, x_test, y_test),
             {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test},
             {"train_x": x_train.tolist(), "train_y": y_train, "test_x": x_test, "test_y": y_test},
             as_dataset((x_train, y_train, x_test, y_test))]
    prepared = [prepare(small(tmp_path), data=form) for form in forms]
    assert len({config.data_fingerprint for config, *_ in prepared}) == 1
    assert all(config.dataset == "user" and dataset.kind == "image" and dataset.input_shape == (8, 8, 1)
               for config, dataset, *_ in prepared)
    # a Dataset keeps its own name; an .npz read with np.load is a mapping too
    named = load_dataset("mnist10k")
    config, dataset, *_ = prepare(small(tmp_path, target_accuracy=None), data=named)
    assert config.dataset == "mnist10k" and config.target_accuracy == 0.9 and dataset.num_classes == 10
    np.savez(tmp_path / "d.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, num_classes=6)
    with np.load(tmp_path / "d.npz") as archive:
        config, dataset, *_ = prepare(small(tmp_path), data=archive)
    assert dataset.num_classes == 6 and config.data_fingerprint == prepared[0][0].data_fingerprint
    assert not (tmp_path / "runs").exists()


def _one_line(message: str) -> str:
    assert "\n" not in message and len(message) < 400 and "array(" not in message and "[[" not in message, message
    return message


@pytest.mark.parametrize("data, changes, error, message", [
    ("not data", {}, TypeError, r"data= takes a jaxfl.data.Dataset.*got a str$"),
    (np.zeros((10, 4)), {}, TypeError, r"got a ndarray$"),
    ("three", {}, TypeError, r"got a tuple of length 3$"),
    ("short_labels", {}, ValueError, r"x_train \(200, 8, 8\) and y_train \(199,\) must hold the same number"),
    ("nan", {}, ValueError, r"x_train holds NaN or infinite values, in 1 of its 200 samples \(the first: "
                            r"x_train\[5\]\); drop or fill them first$"),
    # finite as float64, infinite once cast to the float32 the models compute in
    ("past_float32", {}, ValueError, r"x_train holds 1e\+39, beyond float32's range \(\|x\| <= 3.4e\+38\)"),
    ("no_features", {}, ValueError, r"x_train has shape \(200, 0\): a sample holds no values"),
    ("float_labels", {}, ValueError, r"y_train must hold integer labels, got float64: they are whole numbers: "
                                     r"y.astype\(np.int64\)$"),
    ("one_class", {}, ValueError, r"every label is 0, a single class: set num_classes"),
    ("label_7", {"num_classes": 4}, ValueError, r"y_train holds label 7, but num_classes=4 allows labels 0..3: set "
                                                r"num_classes to at least 8$"),
    # common label forms, each refused with the conversion that makes class ids
    ("one_hot", {}, ValueError, r"y_train has shape \(200, 4\): labels are one class id per sample, shape \(200,\): "
                                r"give y.argmax\(axis=1\), if its rows are one-hot$"),
    ("column", {}, ValueError, r"y_test has shape \(50, 1\): .* give y.ravel\(\)$"),
    ("strings", {}, ValueError, r"y_train must hold integer labels, got <U1: classes = np.unique\(np.concatenate\("
                                r"\[y_train, y_test\]\)\) numbers the classes 0, 1, ... for both splits"),
    ("keras", {}, TypeError, r"data= got 2 \(x, y\) pairs: for Keras' load_data\(\) form \(\(x_train, y_train\), "
                             r"\(x_test, y_test\)\), give one tuple \(x_train, y_train, x_test, y_test\); for two "
                             r"clients' data, a mapping with client_train ids .* partition='natural'$"),
    ("unlabelled", {}, ValueError, r"y_test holds label -1: labels are class ids 0, 1, ... \(a marker such as -1"),
    ("empty_list", {}, ConfigError, r"dataset 'user' has an empty test split"),
    ("pairs", {}, TypeError, r"data= got 4 \(x, y\) pairs: for one pair per client, give the clients' samples "
                             r"joined in a mapping, x_train=np.concatenate\(xs\), .* partition='natural'$"),
    ("empty_test", {}, ConfigError, r"dataset 'user' has an empty test split"),
    ("mixed_dtypes", {}, ValueError, r"x_train is float32 but x_test uint8"),
    ("big_ints", {}, ValueError, r"must lie in 0..255, got 0..499 \(pass floats"),
    ("ok", {"dataset": "fashion_mnist"}, ConfigError, r"dataset='fashion_mnist' names a dataset to load, but data="),
    ("ok", {"data_dir": "/tmp"}, ConfigError, r"data_dir='/tmp' is not read when data= is given: leave it unset"),
    ("ok", {"num_classes": 1}, ValueError, r"num_classes=1 is not allowed: an integer >= 2"),
    ("mapping_typo", {}, ValueError, r"may hold client_train .* and num_classes; missing \['test_y'\], unknown "
                                     r"\['ytest'\]"),
])
def test_bad_data_is_refused_before_any_work_in_one_line(tmp_path, data, changes, error, message):
    x_train, y_train, x_test, y_test = arrays()
    cases = {
        "three": (x_train, y_train, x_test),
        "short_labels": (x_train, y_train[:-1], x_test, y_test),
        "nan": (np.where(np.arange(200)[:, None, None] == 5, np.nan, x_train), y_train, x_test, y_test),
        "past_float32": (np.where(np.arange(200)[:, None, None] == 5, 1e39, x_train.astype(np.float64)), y_train,
                         x_test.astype(np.float64), y_test),
        "no_features": (np.zeros((200, 0)), y_train, np.zeros((50, 0)), y_test),
        "float_labels": (x_train, y_train.astype(float), x_test, y_test),
        "one_class": (x_train, np.zeros(200, int), x_test, np.zeros(50, int)),
        "label_7": (x_train, np.where(y_train == 3, 7, y_train), x_test, y_test),
        "one_hot": (x_train, np.eye(4, dtype=np.float32)[y_train], x_test, y_test),
        "column": (x_train, y_train, x_test, y_test[:, None]),
        "strings": (x_train, np.array(list("abcd"))[y_train], x_test, y_test),
        "unlabelled": (x_train, y_train, x_test, np.where(np.arange(50) == 3, -1, y_test)),
        "empty_list": (x_train, y_train, x_test[:0], []),
        "pairs": [(x_train[i::4], y_train[i::4]) for i in range(4)],
        "keras": ((x_train, y_train), (x_test, y_test)),
        "empty_test": (x_train, y_train, x_test[:0], y_test[:0]),
        "mixed_dtypes": (x_train, y_train, (x_test * 50).astype(np.uint8), y_test),
        "big_ints": ((x_train * 200).astype(np.int64), y_train, (x_test * 200).astype(np.int64), y_test),
        "ok": (x_train, y_train, x_test, y_test),
        "mapping_typo": {"x_train": x_train, "y_train": y_train, "x_test": x_test, "ytest": y_test},
    }
    with pytest.raises(error, match=message) as caught:
        run_experiment(small(tmp_path, **changes), data=cases.get(data, data) if isinstance(data, str) else data)
    _one_line(str(caught.value))
    assert not (tmp_path / "runs").exists(), "nothing is written before the data is checked"


def test_one_class_with_an_explicit_num_classes(tmp_path):
    x_train, _, x_test, _ = arrays()
    config, dataset, _, model, params = prepare(small(tmp_path, num_classes=3),
                                                data=(x_train, np.zeros(200, int), x_test, np.zeros(50, int)))
    assert dataset.num_classes == 3 and model.predict(params, jnp.zeros((1, 8, 8, 1))).shape == (1, 3)
    # the same for a named dataset: more logits than labels is allowed, fewer is not
    assert prepare(small(tmp_path, dataset="mnist10k", num_classes=12))[1].num_classes == 12
    with pytest.raises(ConfigError, match=r"num_classes=5 is not allowed: at least 10: dataset 'mnist10k' has label 9"):
        prepare(small(tmp_path, dataset="mnist10k", num_classes=5))
    # an npz file of one class: refused unless num_classes is set
    path = tmp_path / "one.npz"
    np.savez(path, x_train=x_train, y_train=np.zeros(200, int), x_test=x_test, y_test=np.zeros(50, int))
    with pytest.raises(ValueError, match="a single class: set num_classes"):
        prepare(small(tmp_path, dataset="npz", data_dir=str(path)))
    assert prepare(small(tmp_path, dataset="npz", data_dir=str(path), num_classes=2))[1].num_classes == 2


def test_a_rewritten_npz_file_is_read_again_and_a_run_pins_its_content(tmp_path):
    path = tmp_path / "mine.npz"
    x_train, y_train, x_test, y_test = arrays(dtype=np.uint8)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    first = load_dataset("npz", data_dir=path)
    assert load_dataset("npz", data_dir=path) is first  # unchanged: cached
    result = run_experiment(small(tmp_path, dataset="npz", data_dir=str(path), max_updates=1))
    saved = json.loads(open(os.path.join(result.run_dir, "config.json")).read())["config"]
    assert saved["data"]["data_fingerprint"] == first.fingerprint
    np.savez(path, x_train=x_train[:100], y_train=(y_train[:100] + 1) % 4, x_test=x_test, y_test=y_test)
    os.utime(path, ns=(1, 1))  # a rewrite within the clock's resolution still changes the size
    second = load_dataset("npz", data_dir=path)
    assert len(second.train_y) == 100 and second.fingerprint != first.fingerprint
    # the finished run's config (what a resume reads) refuses the rewritten file
    with pytest.raises(ConfigError, match=r"data_fingerprint=.* does not match the data given .*dataset 'npz'"):
        prepare(config_from_mapping(saved))


def test_only_the_last_npz_file_read_stays_in_memory(tmp_path):
    # every file a process had read stayed cached: a notebook looping over ten generated data sets of 20,000
    # images held all ten (157 MB); the last one read is what a sweep's next cell reads again
    from jaxfl.data import datasets

    x_train, y_train, x_test, y_test = arrays(dtype=np.uint8)
    paths = [tmp_path / f"set{i}.npz" for i in range(3)]
    for path in paths:
        np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    loaded = [load_dataset("npz", data_dir=path) for path in paths]
    assert list(datasets._NPZ_CACHE) == [str(paths[-1])]
    assert load_dataset("npz", data_dir=paths[-1]) is loaded[-1]  # still cached
    assert load_dataset("npz", data_dir=paths[0]) is not loaded[0]  # read again, now the one cached
    assert list(datasets._NPZ_CACHE) == [str(paths[0])]


def test_arrays_an_npz_file_holds_unread_are_said_by_a_comparison_that_reads_them(tmp_path):
    # a comparison's check read the file with its notes muted, and its runs took the cached file without a
    # word: a misspelt client_train ("client_trian") trained on an iid split unsaid (a review)
    from jaxfl.comparison import compare

    x_train, y_train, x_test, y_test = arrays(dtype=np.uint8)
    path = tmp_path / "typo.npz"
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
             client_trian=np.arange(len(y_train)) % 3)
    configs = [RunConfig(algorithm=name, dataset="npz", data_dir=str(path), model="logreg", clients=3, local_steps=1,
                         max_updates=1, target_accuracy=0.9, progress=False, output_dir=str(tmp_path / "runs"))
               for name in ("fedavg", "fedbuff")]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        compare(configs)
    assert sum("arrays ['client_trian'] are not read" in str(w.message) for w in said) == 2  # once a run, as asked


def test_what_reading_an_npz_file_says_is_said_by_the_jaxfl_command_and_every_cached_read(tmp_path, recwarn):
    # the command checked its configs with their notes muted, reading the file into the cache, and the run
    # read it from there: channels-first images and a label only in the test set trained with nothing said
    x_train, y_train, x_test, y_test = arrays(dtype=np.uint8, classes=4)
    y_train = np.minimum(y_train, 2)  # label 3 only in the test set
    path = tmp_path / "torch_layout.npz"
    np.savez(path, x_train=x_train[:, None], y_train=y_train, x_test=x_test[:, None], y_test=y_test)
    assert main(["run", "--dataset", "npz", "--data-dir", str(path), "--model", "logreg", "--clients", "3",
                 "--local-steps", "1", "--max-updates", "1", "--target-accuracy", "0.9", "--no-progress",
                 "--output-dir", str(tmp_path / "runs")]) == 0
    said = [str(warning.message) for warning in recwarn]
    assert sum("x_train of shape (200, 1, 8, 8) looks channels-first" in message for message in said) == 1, said
    assert sum("y_test holds label(s) 3 above y_train's largest, 2" in message for message in said) == 1, said
    recwarn.clear()
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        load_dataset("npz", data_dir=path)  # from the cache
    assert sum("looks channels-first" in str(warning.message) for warning in again) == 2  # x_train and x_test


def test_a_resume_missing_the_data_and_an_object_names_both_at_once(tmp_path):
    # only the object was named; the data came as the next try's error (a review)
    import optax

    config = small(tmp_path, algorithm="fedbuff", buffer_size=2, max_updates=2, checkpoint_every=1,
                   client_optimizer="adam", client_lr=0.003)  # (the defaults, which an optax object leaves)
    result = run_experiment(config, data=arrays(seed=2), client_optimizer=optax.sgd(0.05))
    with pytest.raises(ValueError, match=r"made with data, client_optimizer given as Python objects: pass data=\.\.\., "
                                         r"client_optimizer=\.\.\. to resume_experiment"):
        resume_experiment(result.run_dir)
    with pytest.raises(ValueError, match=r"made with client_optimizer given as Python objects: pass "
                                         r"client_optimizer=\.\.\."):
        resume_experiment(result.run_dir, data=arrays(seed=2))


def test_an_npz_file_s_notes_are_said_before_its_error(tmp_path):
    # kept until the file was read: a misspelt num_classes array's note, which explains the error, was lost
    x_train, y_train, x_test, y_test = arrays(dtype=np.uint8)
    path = tmp_path / "misspelt.npz"
    np.savez(path, x_train=x_train, y_train=y_train.astype(np.float32) + 0.5, x_test=x_test, y_test=y_test,
             num_clases=4)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(ValueError):
            load_dataset("npz", data_dir=path)
    assert any("arrays ['num_clases'] are not read" in str(warning.message) for warning in said)


def test_resume_takes_the_same_data_again_and_refuses_other_data(tmp_path):
    data = arrays(seed=1)
    config = small(tmp_path, algorithm="fedbuff", buffer_size=2, max_updates=3, checkpoint_every=1, stop_at_target=False)
    full = run_experiment(dataclasses.replace(config, run_name="full"), data=data)
    with _interrupt_after(4):
        with pytest.raises(_Interrupted):
            run_experiment(dataclasses.replace(config, run_name="cut"), data=data)
    cut = str(tmp_path / "runs" / "cut")
    assert not os.path.exists(os.path.join(cut, "summary.json"))
    with pytest.raises(ConfigError, match=r"dataset 'user' is data that was passed in Python .* pass the same data"):
        resume_experiment(cut)
    other = (data[0] + 0.1,) + data[1:]
    # said with what differs, not "clear data_fingerprint", which is no step of a resume
    with pytest.raises(ConfigError, match=rf"cannot resume '{cut}' on this data: the run was made on 200 training and "
                                          r"50 test samples of shape \(8, 8, 1\), float32, 4 classes, and data= "
                                          r"gives other values of the same sizes and shapes: pass the data the run "
                                          r"was made on$") as caught:
        resume_experiment(cut, data=other)
    _one_line(str(caught.value))
    with pytest.raises(ConfigError, match=r"made on 200 training .* and data= gives 199 training and 50 test"):
        resume_experiment(cut, data=(data[0][:-1], data[1][:-1]) + data[2:])
    # the same arrays under another name: the message names both, not "dataset='user' names a dataset to load"
    with pytest.raises(ConfigError, match=r"made on arrays \(named 'user'\), and data= gives a Dataset named 'mine'"
                       r": pass the run's data as it was passed then") as caught:
        resume_experiment(cut, data=as_dataset(data, name="mine"))
    _one_line(str(caught.value))
    resumed = resume_experiment(cut, data=data)
    assert resumed.summary["resumes"] == 1
    assert_same_run(full, resumed, "resumed on the same data")


def test_resuming_a_user_data_run_from_the_command_line_says_what_to_do(tmp_path, capsys):
    result = run_experiment(small(tmp_path, max_updates=1), data=arrays())
    os.remove(os.path.join(result.run_dir, "summary.json"))  # unfinished: a finished run is left as it is
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--resume", result.run_dir])
    assert exit_info.value.code == 2
    assert "is data that was passed in Python" in _one_line(capsys.readouterr().err.strip())


def test_float_inputs_are_never_divided_by_255():
    x = jnp.array([[0.25, 2.0]], jnp.float32)
    np.testing.assert_array_equal(scale_uint8(x), x)  # the kernel's default preprocessing
    np.testing.assert_array_equal(scale_uint8(jnp.array([[255]], jnp.uint8)), [[1.0]])
    data = arrays()
    dataset = as_dataset(data)
    preprocess, augment = make_transforms(validate(RunConfig()), dataset)
    np.testing.assert_array_equal(preprocess(jnp.asarray(dataset.train_x[:3])), dataset.train_x[:3])
    assert augment is None


def test_a_dataset_without_a_known_target_has_none():
    assert validate(RunConfig(dataset="synthetic")).target_accuracy is None
    assert validate(RunConfig(dataset="synthetic", target_accuracy=0.5)).target_accuracy == 0.5
    assert validate(RunConfig(dataset="fashion_mnist")).target_accuracy == 0.8
    with pytest.raises(ConfigError, match="max_time=inf.*has no default target accuracy to stop at"):
        validate(RunConfig(dataset="synthetic", max_time=float("inf")))
    for budget in ("max_updates", "max_client_updates", "max_client_steps"):  # any count budget ends the run
        assert validate(RunConfig(dataset="synthetic", max_time=float("inf"), **{budget: 3})).target_accuracy is None


# --------------------------------------------------------------------------- normalisation


def test_normalize_uses_the_training_splits_statistics_and_records_them(tmp_path):
    x_train, y_train, x_test, y_test = arrays(shape=(6, 6, 3), dtype=np.uint8)
    x_test = np.full_like(x_test, 255)  # the held-out split must not leak into the statistics
    data = (x_train, y_train, x_test, y_test)
    config, dataset, *_ = prepare(small(tmp_path, normalize=True), data=data)
    pixels = x_train.reshape(-1, 3) / 255.0
    stats = normalization_statistics(config, dataset)
    assert stats["source"] == "training split"
    np.testing.assert_allclose(stats["mean"], pixels.mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(stats["std"], pixels.std(axis=0), atol=1e-6)
    preprocess, _ = make_transforms(config, dataset)
    normalised = np.asarray(preprocess(jnp.asarray(x_train))).reshape(-1, 3)
    np.testing.assert_allclose(normalised.mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(normalised.std(axis=0), 1, atol=1e-4)
    result = run_experiment(small(tmp_path, normalize=True, max_updates=1), data=data)
    recorded = json.loads(open(os.path.join(result.run_dir, "config.json")).read())["dataset"]["normalization"]
    assert recorded == {**stats, "mean": list(stats["mean"]), "std": list(stats["std"])}


def test_explicit_statistics_override_and_are_checked(tmp_path, capsys):
    config = small(tmp_path, normalize=True, normalize_mean=[0.5, 0.5, 0.5], normalize_std=0.25)
    resolved = validate(config)
    assert resolved.normalize_mean == (0.5, 0.5, 0.5) and resolved.normalize_std == (0.25,)
    data = arrays(shape=(6, 6, 3), dtype=np.uint8)
    config, dataset, *_ = prepare(config, data=data)
    preprocess, _ = make_transforms(config, dataset)
    np.testing.assert_allclose(preprocess(jnp.asarray(data[0][:2])), (data[0][:2] / 255.0 - 0.5) / 0.25, atol=1e-5)
    assert normalization_statistics(config, dataset)["source"] == "config"
    # survives TOML
    assert config_from_mapping(load_config_text(to_toml(resolved), ".toml")).normalize_mean == (0.5, 0.5, 0.5)
    for changes, message in [
        ({"normalize_mean": 0.5, "normalize_std": 0.2}, r"normalize_mean=0.5 is not allowed: null unless normalize"),
        ({"normalize": True, "normalize_mean": 0.5}, r"normalize_std=None is not allowed: set together with"),
        ({"normalize": True, "normalize_mean": 0.5, "normalize_std": [0.2, 0.0]}, r"standard deviations > 0"),
        ({"normalize": True, "normalize_mean": [0.1, 0.2], "normalize_std": 0.3},
         r"normalize_mean=\[0.1, 0.2\] is not allowed: one number or one per channel \(3 "),
    ]:
        with pytest.raises(ConfigError, match=message):
            prepare(small(tmp_path, **changes), data=data)
    tokens = (np.array([[3, 4, 0], [5, 1, 0], [2, 2, 0]]), [0, 1, 0], np.array([[6, 2, 0]]), [1])
    with pytest.raises(ConfigError, match="normalize=True is not allowed: dataset 'user' holds token ids"):
        prepare(small(tmp_path, normalize=True, model="lstm"), data=tokens)
    # the command line takes one number per channel, comma-separated, and checks it before work
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--normalize", "--normalize-mean", "0.1,0.2", "--normalize-std", "0.3", "--model", "logreg",
              "--max-updates", "1", "--no-progress", "--output-dir", str(tmp_path / "cli")])
    assert exit_info.value.code == 2 and "one number or one per channel (1 for dataset 'mnist10k'" in \
        _one_line(capsys.readouterr().err.strip())
    assert not (tmp_path / "cli").exists()
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST_DIR), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_is_normalised_by_its_own_statistics():
    config = validate(RunConfig(dataset="fashion_mnist", normalize=True))
    stats = normalization_statistics(config, load_dataset("fashion_mnist"))
    np.testing.assert_allclose(stats["mean"], [0.2860], atol=1e-4)
    np.testing.assert_allclose(stats["std"], [0.3530], atol=1e-4)


def test_integer_features_for_a_feature_model_are_refused_with_the_cast_that_fixes_them(tmp_path):
    # integer (N, D) arrays are read as token ids, and the refusal did not say how to pass features
    x_train, y_train, x_test, y_test = arrays(shape=(6,))
    integers = (np.rint(x_train * 4).astype(np.int64), y_train, np.rint(x_test * 4).astype(np.int64), y_test)
    with pytest.raises(ValueError, match=r"has token-id samples of shape \(6,\).*integer arrays of shape \(N, L\) "
                                         r"are read as token ids: for feature vectors pass floats "
                                         r"\(x.astype\(np.float32\)\); pixels of uint8 images flattened: "
                                         r"x.astype\(np.float32\) / 255 scales them as jaxfl scales images, or pass "
                                         r"them as images of shape \(N, H, W\)"):
        run_experiment(small(tmp_path, model="mlp"), data=integers)
    assert not os.path.exists(tmp_path / "runs")
    floats = tuple(a.astype(np.float32) if a.ndim == 2 else a for a in integers)
    assert run_experiment(small(tmp_path, model="mlp"), data=floats).summary["global_updates"] == 2


def test_a_comparison_of_timing_only_runs_says_why_it_writes_no_table(tmp_path, capsys):
    assert main(["run", "--timing-only", "--algorithm", "fedavg,fedbuff", "--clients", "4", "--max-updates", "2",
                 "--model", "logreg", "--output-dir", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "timing-only runs evaluate no model: no comparison.csv or accuracy plot" in out
    assert not os.path.exists(tmp_path / "comparison.csv")


@pytest.mark.parametrize("train_dtype, test_dtype", [(np.float32, np.int64), (np.int64, np.float32),
                                                     (np.uint8, np.float32)])
def test_features_given_as_floats_on_one_side_and_integers_on_the_other_are_refused(train_dtype, test_dtype):
    """Integer held-out features beside float training ones (a pandas int64 block) were read as
    pixels and divided by 255 at evaluation: every held-out metric scored inputs no client saw."""
    from jaxfl.data import as_dataset

    x = np.arange(60).reshape(20, 3) % 5
    with pytest.raises(ValueError, match=rf"x_train is {np.dtype(train_dtype)} but x_test {np.dtype(test_dtype)}: "
                                         r"give both as"):
        as_dataset((x.astype(train_dtype), np.arange(20) % 3, x[:9].astype(test_dtype), np.arange(9) % 3))
    as_dataset((x.astype(np.float32), np.arange(20) % 3, x[:9].astype(np.float64), np.arange(9) % 3))  # floats alike


def test_a_value_past_float32_is_refused_without_numpy_s_overflow_warning(tmp_path):
    x_train, y_train, x_test, y_test = arrays()
    big = np.where(np.arange(200)[:, None, None] == 5, 1e39, x_train.astype(np.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "overflow encountered in cast" came first, or instead under -W error
        with pytest.raises(ValueError, match="beyond float32's range"):
            run_experiment(small(tmp_path), data=(big, y_train, x_test.astype(np.float64), y_test))


def test_bfloat16_samples_are_taken_as_the_floats_they_are():
    # numpy does not count ml_dtypes' bfloat16 as floating: such data were refused as "not uint8 images, float
    # images or features", while float16 data were taken
    x_train, y_train, x_test, y_test = arrays()
    wide = as_dataset((x_train, y_train, x_test, y_test))
    narrow = as_dataset((x_train.astype(jnp.bfloat16), y_train, x_test.astype(jnp.bfloat16), y_test))
    assert narrow.train_x.dtype == np.float32 and narrow.kind == wide.kind
    np.testing.assert_array_equal(narrow.train_x.reshape(x_train.shape), x_train.astype(jnp.bfloat16).astype(np.float32))


@pytest.mark.parametrize("given, said", [
    ({"dataset": "blobs.npz"}, "(a file of your own arrays: dataset 'npz' with data_dir='blobs.npz', --dataset npz "
                               "--data-dir blobs.npz)"),
    ({"data_dir": "blobs.npz"}, "; a file of your own arrays is dataset 'npz' (--dataset npz)"),
])
def test_an_npz_file_named_in_the_wrong_setting_is_refused_saying_where_it_goes(given, said):
    # the errors listed the dataset names, or said data_dir is not read, without the way to one's own file
    from jaxfl.config import ConfigError, RunConfig, validate

    with pytest.raises(ConfigError) as refused:
        validate(RunConfig(model="logreg", **given))
    assert str(refused.value).endswith(said)


def test_images_named_after_cifar_say_that_the_name_chose_their_augmentation(tmp_path):
    # a review: arrays named "cifar10" (the built-in is "tfds:cifar10") took CIFAR's crop and flip without a word
    x_train, y_train, x_test, y_test = arrays(dtype=np.uint8, shape=(8, 8, 3))
    config = RunConfig(algorithm="fedavg", model="logreg", clients=2, local_steps=1, max_updates=1, progress=False,
                       eval_interval=None, target_accuracy=0.99, output_dir=str(tmp_path))
    named = as_dataset((x_train, y_train, x_test, y_test), name="cifar10")
    with pytest.warns(UserWarning, match=r"data named 'cifar10' is trained with random crops and flips, which "
                                         r"augment='auto' takes for the CIFAR family its name gives; augment='none'"):
        run_experiment(config, data=named)
    for augment, data in (("none", named), ("crop_flip", named),
                          ("auto", as_dataset((x_train, y_train, x_test, y_test), name="my_cifar10"))):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            run_experiment(dataclasses.replace(config, augment=augment), data=data)


def test_data_that_trains_but_is_likely_not_what_was_meant_is_said():
    # a review's own data ran without a word: PyTorch's layout normalised per image column, 0/1 masks
    # divided by 255, a test class no client trains on, class ids with gaps as 20,001 outputs
    x_train, y_train, x_test, y_test = arrays(dtype=np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        as_dataset((x_train, y_train, x_test, y_test))
    first = lambda x: np.repeat(x[:, None], 3, axis=1)  # noqa: E731 - (N, 3, 8, 8)
    with pytest.warns(UserWarning, match=r"x_train of shape \(200, 3, 8, 8\) looks channels-first \(PyTorch's N, C, "
                                         r"H, W\): .* x_train.transpose\(0, 2, 3, 1\) gives \(200, 8, 8, 3\)"):
        as_dataset((first(x_train), y_train, first(x_test), y_test))
    with pytest.warns(UserWarning, match=r"integer x_train holds only 0 and 1, read as image pixels 0..255"):
        as_dataset(((x_train > 127).astype(np.int64), y_train, (x_test > 127).astype(np.int64), y_test))
    with pytest.warns(UserWarning, match=r"y_test holds label\(s\) 0, which no training sample has"):
        as_dataset((x_train, np.maximum(y_train, 1), x_test, y_test))
    with pytest.warns(UserWarning, match=r"the labels take 4 distinct values, but their largest is 9: the model gets 10 "
                                         r"outputs .* label\(s\) 1, 2, 4, 5, 7, ... \(6 in all\) occur in neither "
                                         r"split; classes = np.unique\(np.concatenate\(\[y_train, y_test\]\)\)"):
        assert as_dataset((x_train, 3 * y_train, x_test, 3 * y_test)).num_classes == 10
    with warnings.catch_warnings():  # the classes set: what the user means
        warnings.simplefilter("error")
        as_dataset((x_train, 3 * y_train, x_test, 3 * y_test), num_classes=10)
    from jaxfl.models.zoo import check_model_input

    with pytest.raises(ValueError, match=r"name='tfds:cifar10' is not allowed: it names a built-in dataset, whose "
                                         r"defaults \(target accuracy, augmentation\) a run would take for your data"):
        as_dataset((x_train, y_train, x_test, y_test), name="tfds:cifar10")  # it stopped at CIFAR-10's 60% target
    with pytest.raises(ValueError, match=r"name='synthetic_mine' is not allowed"):  # it failed in the synthetic note
        as_dataset((x_train, y_train, x_test, y_test), name="synthetic_mine")
    with pytest.raises(ValueError, match=r"models for this data: mlp, .*; your images look channels-first \(PyTorch's "
                                         r"C, H, W\): x.transpose\(0, 2, 3, 1\) gives this model's \(28, 28, 1\)$"):
        check_model_input("cnn", (1, 28, 28), "image", "user")


def test_client_ids_given_with_the_data_are_said_where_the_partition_does_not_read_them(tmp_path):
    x_train, y_train, x_test, y_test = arrays()
    data = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test,
            "client_train": np.repeat([0, 1, 2], [120, 50, 30])}
    with pytest.warns(UserWarning, match=r"your data gives a client id per training sample \(client_train\), which "
                                         r"partition='iid' does not read: .* partition='natural'"):
        federation = prepare(small(tmp_path), data=data)[2]
    assert sorted(federation.counts.tolist()) == [66, 67, 67]
    # a Dataset of the user's named synthetic-something: their ids, not a generated federation (the synthetic
    # note failed on the name)
    with pytest.warns(UserWarning, match=r"your data gives a client id per training sample"):
        prepare(small(tmp_path), data=dataclasses.replace(as_dataset(data), name="synthetic_mine"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prepare(small(tmp_path, partition="natural"), data=data)[2].counts.tolist() == [120, 50, 30]
    # a built-in synthetic federation passed back as data=: its generated clients are said by the synthetic
    # note where they carry heterogeneity, and iid ones not at all (the client_train note named ids not given)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare(small(tmp_path, clients=3, model="logreg", target_accuracy=0.5),
                data=load_dataset("synthetic_iid", num_clients=3))


def test_two_num_classes_that_disagree_are_refused_before_the_run(tmp_path):
    # the config's 10 won over the data's 12 with nothing said (a review); the same, either way, is fine
    x_train, y_train, x_test, y_test = arrays()
    data = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test, "num_classes": 12}
    with pytest.raises(ConfigError, match=r"^num_classes=10 is given, and data= holds num_classes=12: give one of them, "
                                          r"or the same in both$"):
        run_experiment(small(tmp_path, num_classes=10), data=data)
    path = tmp_path / "twelve.npz"
    np.savez(path, **data)
    with pytest.raises(ConfigError, match=r"num_classes=10 is given, and .*twelve.npz holds num_classes=12: give one"):
        run_experiment(small(tmp_path, num_classes=10, dataset="npz", data_dir=str(path)))
    assert load_dataset("npz", data_dir=path, num_classes=10).num_classes == 10  # load_dataset's option wins, as said
    assert not (tmp_path / "runs").exists()
    assert run_experiment(small(tmp_path, num_classes=12), data=data).summary["global_updates"] == 2
    assert run_experiment(small(tmp_path, num_classes=12, dataset="npz", data_dir=str(path))).summary["global_updates"] == 2


def test_a_run_recorded_with_a_num_classes_beside_its_npz_file_s_resumes(tmp_path):
    # made before such a pair was refused: its resume, which gives nothing, goes on as the run was made
    x_train, y_train, x_test, y_test = arrays()
    path = tmp_path / "twelve.npz"
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, num_classes=12)
    made = run_experiment(small(tmp_path, num_classes=12, dataset="npz", data_dir=str(path), checkpoint_every=1))
    record_path = os.path.join(made.run_dir, "config.json")
    record = json.load(open(record_path))
    assert record["config"]["data"]["num_classes"] == 12 and record["config"]["data"]["data_fingerprint"]
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, num_classes=10)
    # the same arrays, but the file now holds 10: a recorded num_classes 12 is the run's
    resumed = resume_experiment(made.run_dir, overrides={"max_updates": 3})
    assert resumed.summary["global_updates"] == 3


def test_a_num_classes_held_by_the_data_is_recorded_and_its_resume_needs_only_the_arrays(tmp_path):
    x_train, y_train, x_test, y_test = arrays()
    data = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test, "num_classes": 6}
    made = run_experiment(small(tmp_path, checkpoint_every=1), data=data)
    recorded = lambda run: json.load(open(os.path.join(run.run_dir, "config.json")))["config"]["data"]  # noqa: E731
    assert recorded(made)["num_classes"] == 6
    plain = run_experiment(small(tmp_path, checkpoint_every=1), data=(x_train, y_train, x_test, y_test))
    assert recorded(plain)["num_classes"] is None and os.path.basename(plain.run_dir) != os.path.basename(made.run_dir)
    # the arrays alone resume it (the model's 6 outputs were a "model changed" refusal)
    resumed = resume_experiment(made.run_dir, data=(x_train, y_train, x_test, y_test), overrides={"max_updates": 3})
    assert resumed.summary["global_updates"] == 3 and recorded(resumed)["num_classes"] == 6
    # a mapping of another num_classes: the run's goes on, said (it was taken without a word)
    with pytest.warns(UserWarning, match=r"data= holds num_classes=8, but the run was made with num_classes=6: it goes "
                                         r"on with 6"):
        again = resume_experiment(made.run_dir, data={**data, "num_classes": 8}, overrides={"max_updates": 4})
    assert recorded(again)["num_classes"] == 6
