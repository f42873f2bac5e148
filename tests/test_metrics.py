"""Balanced accuracy and per-class accuracy: exact values on hand-made predictions, the columns and
the class_accuracy.csv a run writes, load_run, the user's loss/metrics hooks beside them, and resume."""
import csv
import os
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score

from jaxfl.experiment import METRIC_FIELDS, make_evaluator, prepare, resume_experiment, run_experiment
from jaxfl.kernels.client import scale_uint8
from jaxfl.runlog import load_run
from jaxfl.testing import assert_same_run
from conftest import Interrupted, replace


def logits_predicting(predictions, num_classes):
    """Logits whose argmax is each given class."""
    return np.eye(num_classes, dtype=np.float32)[predictions] * 5.0


def test_balanced_and_per_class_accuracy_by_hand():
    # 9 held-out samples, 4 classes, class 3 absent from the labels (but predicted once):
    #   class 0: labels at 0-3, predicted 0, 0, 0, 1 -> recall 3/4
    #   class 1: labels at 4-5, predicted 1, 3       -> recall 1/2
    #   class 2: labels at 6-8, predicted 0, 1, 0    -> recall 0/3
    #   class 3: no samples                          -> NaN, left out of the balanced mean
    # accuracy 4/9; balanced accuracy (3/4 + 1/2 + 0) / 3 = 5/12. Batches of 4 (the last padded
    # with 3 masked samples whose label 0 must not count) check the per-batch sums.
    labels = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2], np.int32)
    predictions = np.array([0, 0, 0, 1, 1, 3, 0, 1, 0])
    evaluate = make_evaluator(lambda params, x: x, logits_predicting(predictions, 4), labels, batch_size=4,
                              preprocess=lambda v: v)
    stats = evaluate(None)
    np.testing.assert_array_equal(stats["class_accuracy"], [0.75, 0.5, 0.0, np.nan])
    assert stats["accuracy"] == pytest.approx(4 / 9)
    assert stats["balanced_accuracy"] == pytest.approx(5 / 12)
    with warnings.catch_warnings():  # sklearn warns that class 3 is predicted but absent from the labels
        warnings.simplefilter("ignore")
        assert stats["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, predictions))


@pytest.mark.parametrize("batch_size", [4, 5])  # three full batches; two and a padded third
def test_batches_placed_once_give_the_one_batch_figures(batch_size):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 12).astype(np.int32)
    logits = rng.normal(size=(12, 3)).astype(np.float32)
    whole = make_evaluator(lambda params, x: x, logits, labels, batch_size=12, preprocess=lambda v: v)(None)
    stats = make_evaluator(lambda params, x: x, logits, labels, batch_size=batch_size, preprocess=lambda v: v)(None)
    assert stats["accuracy"] == whole["accuracy"] == np.mean(logits.argmax(1) == labels)
    assert stats["loss"] == pytest.approx(whole["loss"], rel=1e-6)
    np.testing.assert_array_equal(stats["class_accuracy"], whole["class_accuracy"])


def test_a_class_without_samples_is_nan_and_left_out_of_the_balanced_mean():
    labels = np.array([1, 1, 1, 1], np.int32)  # one class only: balanced accuracy = its recall
    stats = make_evaluator(lambda params, x: x, logits_predicting(np.array([1, 1, 0, 1]), 3), labels,
                           preprocess=lambda v: v, num_classes=3)(None)
    np.testing.assert_array_equal(stats["class_accuracy"], [np.nan, 0.75, np.nan])
    assert stats["balanced_accuracy"] == stats["accuracy"] == 0.75


def test_a_run_writes_balanced_accuracy_and_class_accuracy(small_config):
    config = replace(small_config, max_updates=2, checkpoint_every=None, final_checkpoint=False)
    result = run_experiment(config)
    with open(os.path.join(result.run_dir, "metrics.csv")) as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(METRIC_FIELDS)
    with open(os.path.join(result.run_dir, "class_accuracy.csv")) as handle:
        class_rows = list(csv.reader(handle))
    assert class_rows[0] == ["time", "version"] + [f"class_{k}" for k in range(10)]
    assert [row[:2] for row in class_rows[1:]] == [[row["time"], row["version"]] for row in rows]

    run = load_run(result.run_dir)
    assert run.class_accuracy.shape == (len(rows), 10) == (3, 10)  # versions 0, 1, 2
    np.testing.assert_allclose(run.metrics["balanced_accuracy"], np.nanmean(run.class_accuracy, axis=1))
    # the final model's predictions, recomputed outside the evaluator, give the same numbers
    _, dataset, _, model, _ = prepare(config)
    predicted = np.concatenate([np.asarray(model.predict(result.params, scale_uint8(jnp.asarray(batch)))).argmax(-1)
                                for batch in np.array_split(dataset.test_x, 4)])
    recall = [np.mean(predicted[dataset.test_y == k] == k) for k in range(10)]
    np.testing.assert_allclose(run.class_accuracy[-1], recall, rtol=1e-12)
    assert run.metrics["balanced_accuracy"][-1] == pytest.approx(balanced_accuracy_score(dataset.test_y, predicted))
    assert result.summary["final_balanced_accuracy"] == pytest.approx(run.metrics["balanced_accuracy"][-1])
    # accuracy is the class-size-weighted mean of the same recalls
    sizes = np.bincount(dataset.test_y, minlength=10)
    assert run.metrics["accuracy"][-1] == pytest.approx(float(sizes @ run.class_accuracy[-1] / sizes.sum()))
    pytest.importorskip("pandas")
    frame = run.to_pandas("class_accuracy")
    assert list(frame.columns[:3]) == ["time", "version", "class_0"] and len(frame) == 3


def test_user_loss_and_metrics_hooks_beside_the_new_columns(small_config, tmp_path):
    def squared_error(logits, labels):
        return jnp.sum((logits - jnp.eye(logits.shape[-1])[labels]) ** 2, axis=-1)

    def is_zero(logits, labels):
        return {"label_zero": (labels == 0).astype(jnp.float32)}

    config = replace(small_config, max_updates=1, checkpoint_every=None, final_checkpoint=False)
    result = run_experiment(config, loss=squared_error, metrics=is_zero)
    run = load_run(result.run_dir)
    assert list(run.metrics) == list(METRIC_FIELDS) + ["label_zero"]
    _, dataset, *_ = prepare(config)
    assert run.metrics["label_zero"][-1] == pytest.approx(np.mean(dataset.test_y == 0))
    assert run.class_accuracy.shape == (2, 10) and 0 <= run.metrics["balanced_accuracy"][-1] <= 1
    for reserved in ("balanced_accuracy", "class_accuracy"):
        output = tmp_path / reserved
        with pytest.raises(ValueError, match=f"metrics name '{reserved}' is not allowed"):
            run_experiment(replace(config, output_dir=str(output)),
                           metrics=lambda logits, labels, name=reserved: {name: labels.astype(jnp.float32)})
        assert not output.exists()  # refused before any work


def test_resume_cuts_back_and_regrows_class_accuracy(small_config, crash_after_saves):
    config = replace(small_config, max_updates=4, checkpoint_every=1)
    straight = run_experiment(replace(config, run_name="straight"))
    def garbage_after_the_checkpoint(checkpointer, simulation):
        checkpointer.recorder.class_writer.writerow(["garbage written after the checkpoint"])

    disarm = crash_after_saves(2, before=garbage_after_the_checkpoint)
    with pytest.raises(Interrupted):
        run_experiment(replace(config, run_name="killed"))
    disarm()
    resumed = resume_experiment(os.path.join(config.output_dir, "killed"), progress=False)
    assert_same_run(straight, resumed)  # class_accuracy.csv included, byte for byte
    assert load_run(resumed.run_dir).class_accuracy.shape == (5, 10)


@pytest.mark.parametrize("count, batches_per_call, dispatches", [(100, 1, 15), (100, 4, 5), (98, 4, 4), (100, 256, 2)])
def test_batches_grouped_per_call_give_the_one_batch_per_call_figures_bit_for_bit(count, batches_per_call, dispatches):
    """Several held-out batches per device call (a lax.map), the last call overlapping the one before
    it, and the padded last batch: the sums are those of one call per batch, exactly, in fewer calls."""
    import flax.linen as nn
    import jax

    rng = np.random.default_rng(1)
    x, labels = rng.normal(size=(count, 5)).astype(np.float32), rng.integers(0, 3, count).astype(np.int32)
    model = nn.Dense(3)
    params = model.init(jax.random.key(0), x)
    squares = lambda logits, labels: {"max_logit": jnp.max(logits, axis=-1)}
    one = make_evaluator(model.apply, x, labels, batch_size=7, preprocess=lambda v: v, metrics=squares,
                         batches_per_call=1)
    grouped = make_evaluator(model.apply, x, labels, batch_size=7, preprocess=lambda v: v, metrics=squares,
                             batches_per_call=batches_per_call)
    expected, stats = one(params), grouped(params)
    assert grouped.dispatches == dispatches and one.dispatches == -(-count // 7)
    for name in ("accuracy", "balanced_accuracy", "loss", "max_logit"):
        assert stats[name] == expected[name], name
    np.testing.assert_array_equal(stats["class_accuracy"], expected["class_accuracy"])
    logits = np.asarray(model.apply(params, x))
    assert stats["accuracy"] == np.mean(logits.argmax(1) == labels)
    assert stats["max_logit"] == pytest.approx(float(np.mean(logits.max(1))), rel=1e-5)
    with pytest.raises(ValueError, match="batches_per_call must be at least 1, got 0"):
        make_evaluator(model.apply, x, labels, batches_per_call=0)
