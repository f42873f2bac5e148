"""Bring-your-own data and models: bad inputs refused before any work, nothing silently changed."""

from __future__ import annotations

import flax.linen as nn
import numpy as np
import pytest

from jaxfl.data import Dataset, as_dataset


def _features(n):
    return np.random.default_rng(0).random((n, 5)).astype(np.float32)


def test_labels_beyond_int32_are_refused_not_wrapped():
    # int64 labels 2**32 + k used to become k after the int32 cast: another class, silently
    y = np.arange(20, dtype=np.int64) % 2 + 2**32
    with pytest.raises(ValueError, match=r"labels must lie in \[0, num_classes\), got y_train in \[4294967296"):
        as_dataset((_features(20), y, _features(4), np.arange(4) % 2))
    with pytest.raises(ValueError, match="y_test"):
        as_dataset((_features(20), np.arange(20) % 2, _features(4), np.arange(4, dtype=np.uint64) + 2**63))


def test_negative_token_ids_are_refused():
    tokens = np.random.default_rng(0).integers(1, 50, (20, 6))
    tokens[:, 0] = -3  # an embedding lookup clips or wraps it to another token
    with pytest.raises(ValueError, match=r"token ids and must lie in \[0, 2147483647\].*got \[-3, 49\]"):
        as_dataset((tokens, np.arange(20) % 2, np.abs(tokens[:4]), np.arange(4) % 2))
    wide = np.abs(tokens).astype(np.int64)
    wide[0, 0] = 2**32 + 1  # the int32 cast would wrap it to 1
    with pytest.raises(ValueError, match="token ids"):
        as_dataset((wide, np.arange(20) % 2, np.abs(tokens[:4]), np.arange(4) % 2))


def test_token_ids_checked_against_the_datasets_vocab_size():
    tokens = np.random.default_rng(0).integers(0, 50, (20, 6)).astype(np.int32)
    y = (np.arange(20) % 2).astype(np.int32)
    data = Dataset("toks", tokens, y, tokens[:4], y[:4], 2, vocab_size=10)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 10\) \(0 = padding\), got \[0, 49\]"):
        as_dataset(data)
    assert as_dataset(Dataset("toks", tokens, y, tokens[:4], y[:4], 2, vocab_size=50)).vocab_size == 50


def test_uint8_token_ids_get_their_vocab_size():
    tokens = np.random.default_rng(0).integers(0, 30, (20, 6)).astype(np.uint8)
    ds = as_dataset((tokens, np.arange(20) % 2, tokens[:4], np.arange(4) % 2))
    assert ds.kind == "tokens" and ds.vocab_size == int(tokens.max()) + 1


def _npz(path, **extra):
    x = np.random.default_rng(0).random((12, 4, 4)).astype(np.float32)
    y = np.arange(12) % 3
    np.savez(path, x_train=x, y_train=y, x_test=x[:3], y_test=y[:3], **extra)
    return str(path)


@pytest.mark.parametrize("stored, shown", [(5.7, "5.7"), (1, "1"), ("ten", "'ten'"),
                                           (np.array([3, 3]), "an array of shape (2,)")])
def test_npz_num_classes_must_be_one_whole_number(tmp_path, stored, shown):
    # 5.7 was truncated to 5 silently, 1 accepted, an array or a string raised a bare TypeError / int() error
    from jaxfl.data import load_dataset

    path = _npz(tmp_path / "d.npz", num_classes=stored)
    with pytest.raises(ValueError, match=rf"d\.npz: num_classes={shown}".replace("(", r"\(").replace(")", r"\)")
                       + " is not allowed: one integer >= 2"):
        load_dataset("npz", path)
    with pytest.raises(ValueError, match="num_classes=.* is not allowed"):
        as_dataset(dict(np.load(path)))
    assert load_dataset("npz", _npz(tmp_path / "ok.npz", num_classes=np.float64(4.0))).num_classes == 4


def test_npz_that_is_no_archive_is_named(tmp_path):
    from jaxfl.data import load_dataset

    text = tmp_path / "text.npz"
    text.write_text("hello")
    with pytest.raises(ValueError, match=r"text\.npz is not a \.npz archive of numeric arrays.*a pickle"):
        load_dataset("npz", str(text))
    single = tmp_path / "one.npy"
    np.save(single, np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"one\.npy holds one ndarray of shape \(3, 2\), not a \.npz archive"):
        load_dataset("npz", str(single))
    ragged = tmp_path / "ragged.npz"
    np.savez(ragged, x_train=np.array([np.zeros(2), np.zeros(3)], dtype=object), y_train=[0, 1],
             x_test=np.zeros((1, 2)), y_test=[0])
    with pytest.raises(ValueError, match=r"ragged\.npz holds an object array, which needs pickle"):
        load_dataset("npz", str(ragged))


@pytest.mark.parametrize("source, message", [
    ("import flax\nclass Net(:\n    pass\n", r"could not be imported: invalid syntax at .*broken\.py:2$"),
    ("def helper():\n    raise RuntimeError('boom')\n\nhelper()\n",
     r"importing '.*broken\.py' raised RuntimeError: boom at .*broken\.py:2$"),
])
def test_model_file_that_fails_to_import_is_one_line_before_any_work(tmp_path, source, message):
    # a syntax error or an exception in the user's model file used to escape as a raw traceback
    import jaxfl

    path = tmp_path / "broken.py"
    path.write_text(source)
    config = jaxfl.RunConfig(model=f"{path}:Net", algorithm="fedavg", clients=2, max_updates=1, progress=False,
                             output_dir=str(tmp_path / "runs"))
    with pytest.raises(ValueError, match=message) as caught:
        jaxfl.run_experiment(config)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "runs").exists()


def test_tfds_name_missing_from_data_dir_is_one_plain_line(tmp_path):
    # TFDS's own message said the set was "already prepared ... in the TFRECORD format" (it is not
    # there at all) over several lines
    pytest.importorskip("tensorflow_datasets")
    from jaxfl.data import load_dataset

    with pytest.raises(FileNotFoundError, match=r"'cifar10' is not prepared in .*: no folder .*cifar10 .*tfds build "
                                                r"cifar10") as caught:
        load_dataset("tfds:cifar10", data_dir=tmp_path)
    assert "\n" not in str(caught.value) and "TFRECORD" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []
    file = tmp_path / "x.npz"
    file.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"data_dir .*x\.npz is not a folder"):
        load_dataset("tfds:emnist/balanced", data_dir=file)
    with pytest.raises(FileNotFoundError, match=r"'cifar10' is not prepared: data_dir .*nowhere does not exist; "
                                                r"jaxfl never downloads"):
        load_dataset("tfds:cifar10", data_dir=tmp_path / "nowhere")


def test_linen_model_that_breaks_only_in_train_mode_is_one_line_before_any_file(tmp_path):
    # init and the shape check run in eval mode; a module needing its own RNG stream in training
    # escaped from the client kernel's tracing as Flax's InvalidRngError traceback
    import flax.linen as nn
    import jax

    class NoiseNet(nn.Module):
        num_classes: int = 3

        @nn.compact
        def __call__(self, x, train: bool = False):
            x = x.reshape((x.shape[0], -1))
            if train:
                x = x + jax.random.normal(self.make_rng("noise"), x.shape)
            return nn.Dense(self.num_classes)(x)

    x = _refused_in_one_line(tmp_path, NoiseNet, r"model NoiseNet in train mode asks for an RNG stream jaxfl does "
                                                 r"not give \(.*\"noise\"\); it gives \['dropout'\]")
    # with the stream named, the same module trains
    from jaxfl.models import ModelAdapter

    adapter = ModelAdapter.from_linen(NoiseNet(), rng_streams=("dropout", "noise"))
    params, state = adapter.init(jax.random.key(0), x[:1])
    assert adapter.apply(params, state, x[:4], train=True, key=jax.random.key(1))[0].shape == (4, 3)


def _refused_in_one_line(tmp_path, model, message: str):
    """A run of ``model`` on 30 random samples is refused with ``message``, in one line, before any
    file is written; returns the samples."""
    import jaxfl

    x = _features(30)
    config = jaxfl.RunConfig(algorithm="fedavg", clients=2, max_updates=1, local_steps=1, progress=False,
                             target_accuracy=0.9, output_dir=str(tmp_path / "runs"))
    with pytest.raises(ValueError, match=message) as caught:
        jaxfl.run_experiment(config, data=(x, np.arange(30) % 3, x[:6], np.arange(6) % 3), model=model)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "runs").exists()
    return x


def test_idx_data_dir_that_is_a_file_is_named_as_such(tmp_path):
    # it said "looked in .../d.npz and found no train-images-idx3-ubyte[.gz], ...; install it with
    # `apt-get install dataset-fashion-mnist` or pass data_dir" although data_dir was passed
    from jaxfl.data import load_dataset

    file = tmp_path / "d.npz"
    file.write_bytes(b"")
    for name in ("fashion_mnist", "mnist"):
        with pytest.raises(FileNotFoundError, match=rf"dataset '{name}': data_dir .*d\.npz is not a folder \(a file\)"):
            load_dataset(name, data_dir=file)
    with pytest.raises(FileNotFoundError, match=r"found no train-images.*pass data_dir pointing at the Fashion-MNIST"):
        load_dataset("fashion_mnist", data_dir=tmp_path)


def test_nnx_model_that_breaks_only_in_train_mode_is_one_line_naming_it(tmp_path):
    # nnx.Dropout without rngs: eval mode (init, the shape check) works, training raised Flax's
    # two-line message, naming neither the model nor the mode, from inside the client kernel
    from flax import nnx

    class DropNoRngs(nnx.Module):
        def __init__(self, num_classes, rngs):
            self.linear, self.drop = nnx.Linear(5, num_classes, rngs=rngs), nnx.Dropout(0.5)

        def __call__(self, x):
            return self.linear(self.drop(x))

    _refused_in_one_line(tmp_path, DropNoRngs, r"model DropNoRngs fails in train mode \(init ran in eval mode\): "
                                               r".*no `rngs` argument was provided to Dropout")


@pytest.mark.parametrize("times", [["0.1", "0.2", "0.3"], [True, True, True], np.array([0.1 + 0j, 0.2, 0.3])])
def test_speeds_that_are_no_real_numbers_are_refused(times):
    """Strings were read as seconds, True as 1 s a step, complex numbers with a warning (2026-12-05)."""
    from jaxfl.scheduler.speeds import check_time_per_step

    with pytest.raises(ValueError, match="time_per_step must be an array of seconds per step, one per client: real "
                                         "numbers, got an array of"):
        check_time_per_step(times, 3)


class AlwaysDropping(nn.Module):  # a Dropout that draws in eval mode too
    @nn.compact
    def __call__(self, x):
        return nn.Dropout(0.5, deterministic=False)(nn.Dense(3)(x))


class UnsetBatchNorm(nn.Module):  # use_running_average set neither in the constructor nor at call time
    @nn.compact
    def __call__(self, x):
        return nn.BatchNorm()(nn.Dense(3)(x))


def test_a_layer_whose_mode_nothing_sets_is_said_as_such_not_as_a_shape(tmp_path):
    """The first read "asks for an RNG stream jaxfl does not give ...; it gives ['dropout']", the
    second "cannot take ... samples of shape (8,)" (2026-12-05)."""
    _refused_in_one_line(tmp_path, AlwaysDropping, r"^model AlwaysDropping draws random numbers in eval mode .*must "
                                                   r"follow a `train` or `deterministic` argument of __call__")
    _refused_in_one_line(tmp_path, UnsetBatchNorm, r'^model UnsetBatchNorm: Parameter "use_running_average" must be '
                                                   r"passed .* through a `train`")


def test_an_archive_from_np_load_with_more_arrays_is_read_with_a_note(tmp_path):
    """data=np.load(path) of an archive holding x_val was refused, where dataset 'npz' of the same file
    reads it with a note (2026-12-05); a plain dict with an unknown key stays refused (a misspelt
    client_train would lose the writers' split)."""
    x, y = _features(30), np.arange(30) % 3
    np.savez(tmp_path / "d.npz", x_train=x[:24], y_train=y[:24], x_test=x[24:], y_test=y[24:], x_val=x[:3])
    with pytest.warns(UserWarning, match=r"data: arrays \['x_val'\] of the archive are not read"):
        dataset = as_dataset(np.load(tmp_path / "d.npz"))
    assert dataset.train_x.shape == (24,) + x.shape[1:]
    with pytest.raises(ValueError, match=r"unknown \['client_trian'\]"):
        as_dataset({"x_train": x[:24], "y_train": y[:24], "x_test": x[24:], "y_test": y[24:],
                    "client_trian": np.zeros(24, int)})


def test_a_model_that_is_no_model_is_said_so_before_the_clash_with_config_model(tmp_path):
    import jaxfl

    with pytest.raises(ValueError, match=r"^model=5 is not a model"):
        jaxfl.run_experiment(jaxfl.RunConfig(model="mlp", output_dir=str(tmp_path)), model=5)


def test_the_cli_s_one_line_error_leaves_out_jax_s_note_on_its_filtered_traceback(tmp_path, capsys):
    """jaxfl run --model file.py:Net whose Dropout draws in eval mode: the one line ended with
    "; --------------------" and jax's paragraph on the frames it removed from a traceback no one sees."""
    from jaxfl.cli import main

    (tmp_path / "dropping.py").write_text(
        "import flax.linen as nn\n\n\n"
        "class Net(nn.Module):\n"
        "    num_classes: int = 10\n\n"
        "    @nn.compact\n"
        "    def __call__(self, x, is_train=True):\n"
        "        x = nn.Dense(16)(x.reshape((x.shape[0], -1)))\n"
        "        return nn.Dense(self.num_classes)(nn.Dropout(0.5, deterministic=not is_train)(x))\n")
    with pytest.raises(SystemExit) as refused:
        main(["run", "--model", f"{tmp_path / 'dropping.py'}:Net", "--clients", "3", "--max-updates", "1",
              "--no-progress", "--output-dir", str(tmp_path / "runs")])
    assert refused.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("jaxfl: error: model Net draws random numbers in eval mode")
    assert error.endswith(f"(in your code: {tmp_path / 'dropping.py'}, line 10, in __call__)"), error
