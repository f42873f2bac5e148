"""Bring your own model, client optimiser, initial parameters, client speeds, loss and metrics.

Each test would have caught one of the issue's failures: an nnx factory lambda raising a raw
TypeError, the CLI unable to use a user model (and --resume of one in a new process), the loss fixed
to softmax cross-entropy, and speeds / initial parameters only as distributions and seeds."""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxfl
from jaxfl.config import RunConfig
from jaxfl.experiment import make_evaluator, prepare, resume_experiment, run_experiment
from jaxfl.models import MODEL_INPUTS, MODELS, ModelAdapter, build_model, register_model
from jaxfl.testing import events_without_wall_time, metrics_without_wall_time

replace = dataclasses.replace
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LinenLogReg(nn.Module):
    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


class NnxLogReg(nnx.Module):
    def __init__(self, num_classes: int, rngs: nnx.Rngs):
        self.out = nnx.Linear(784, num_classes, rngs=rngs)

    def __call__(self, x):
        return self.out(x.reshape((x.shape[0], -1)))


class NnxNoClasses(nnx.Module):  # a user's model with the class count built in
    def __init__(self, rngs: nnx.Rngs):
        self.out = nnx.Linear(784, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(x.reshape((x.shape[0], -1)))


@pytest.fixture
def tiny(tmp_path):
    """Three clients, two local steps, one FedAvg round on the embedded MNIST-10k."""
    return RunConfig(algorithm="fedavg", dataset="mnist10k", clients=3, local_steps=2, batch_size=16,
                     max_updates=1, progress=False, checkpoint_every=None, output_dir=str(tmp_path / "runs"))


def _leaves_equal(a, b) -> bool:
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("form", ["linen_instance", "linen_class", "nnx_class", "nnx_factory", "nnx_instance",
                                  "adapter", "num_classes_factory"])
def test_every_model_form_builds_to_the_same_kind_of_adapter(form):
    model = {"linen_instance": LinenLogReg(num_classes=10), "linen_class": LinenLogReg, "nnx_class": NnxLogReg,
             "nnx_factory": lambda rngs: NnxNoClasses(rngs=rngs), "nnx_instance": NnxNoClasses(nnx.Rngs(3)),
             "adapter": ModelAdapter.from_linen(LinenLogReg()),
             "num_classes_factory": lambda num_classes: LinenLogReg(num_classes=num_classes)}[form]
    adapter = build_model(model, num_classes=10)
    variables = adapter.init_variables(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    assert adapter.predict(variables, jnp.ones((5, 28, 28, 1))).shape == (5, 10)
    assert sum(leaf.size for leaf in jax.tree.leaves(variables)) == 7850


def test_nnx_factory_lambda_registered_by_name_runs(tiny, monkeypatch):
    monkeypatch.setattr(jaxfl.config, "MODEL_NAMES", jaxfl.config.MODEL_NAMES)
    try:  # the raw TypeError: make_model called the lambda with num_classes=
        register_model("byo_nnx_lambda", lambda rngs: NnxNoClasses(rngs=rngs))
        result = run_experiment(replace(tiny, model="byo_nnx_lambda"))
    finally:
        MODELS.pop("byo_nnx_lambda", None)
        MODEL_INPUTS.pop("byo_nnx_lambda", None)
    assert result.summary["global_updates"] == 1
    assert set(result.params["params"]) == {"out"}


@pytest.mark.parametrize("model", [LinenLogReg, lambda rngs: NnxLogReg(10, rngs=rngs)], ids=["linen", "nnx"])
def test_model_objects_run_and_are_recorded_honestly(tiny, model):
    result = run_experiment(tiny, model=model)
    assert result.summary["global_updates"] == 1 and result.summary["client_steps_aggregated"] == 6
    stored = json.load(open(os.path.join(result.run_dir, "config.json")))
    label = stored["config"]["data"]["model"]
    assert label.startswith("<user: ") and label == stored["user_inputs"]["model"]
    assert (label == "<user: test_byo_model.LinenLogReg>") == (model is LinenLogReg)
    assert stored["model_parameters"] == 7850
    # the same config and seed give the same run (the seed initialises the model)
    again = run_experiment(replace(tiny, run_name="again"), model=model)
    assert _leaves_equal(result.params, again.params)


def test_bad_inputs_fail_in_one_line_before_any_work(tiny):
    output = tiny.output_dir
    cases = [
        (dict(model=lambda key: NnxNoClasses(rngs=nnx.Rngs(key))), r"<lambda>\(key\) has the wrong signature"),
        (dict(model=42), r"model=42 is not a model; expected"),
        (dict(model="mlp"), r"model='mlp' is a name: set it in the config"),
        (dict(model=dict), r"is a class but not a Flax module"),
        (dict(model=lambda: 3), r"returned 3, not a Flax module"),
        (dict(client_optimizer=optax.linear_schedule(0.1, 0.0, 10)), r"is not an optax.GradientTransformation"),
        (dict(client_optimizer=optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2)),
         r"is not an optax.GradientTransformation .*; its .gradient_transformation\(\) is one"),
        (dict(client_optimizer=optax.sgd(0.1), config=dict(client_lr=0.5)), r"client_lr=0.5 is not read"),
        (dict(loss="mse"), r"loss='mse' is not callable"),
        (dict(loss=lambda logits, labels: jnp.mean(logits)), r"returned .* expected per-example float losses"),
        (dict(metrics=lambda logits, labels: {"loss": labels * 1.0}), r"metrics name 'loss' is not allowed"),
        (dict(metrics=lambda logits, labels: {"m": jnp.mean(logits)}), r"metrics\['m'\] has shape \(\)"),
        (dict(time_per_step=[0.1, 0.2]), r"time_per_step has shape \(2,\); expected \(3,\)"),
        (dict(time_per_step=[0.1, float("nan"), 0.2]), r"time_per_step\[1\]=nan is not allowed"),
        (dict(time_per_step=[0.1, 0.2, 0.3], config=dict(speed_change_prob=0.1)), r"speed_change_prob=0.1 is not allowed"),
        (dict(time_per_step=[0.1, 0.2, 0.3], config=dict(heterogeneity="normal")),
         r"heterogeneity='normal' is not allowed with time_per_step"),
        (dict(time_per_step=[0.1, 0.2, 0.3], config=dict(speed_mean=0.5)), r"speed_mean=0.5 is not allowed with time_per_step"),
        (dict(model=LinenLogReg, config=dict(model="mlp")), r"config.model='mlp' too"),
        (dict(config=dict(model="<user: my.Net>")), r"was a Python object given to run_experiment\(model=...\)"),
        (dict(config=dict(model="no_such_module_xyz:Net")), r"model='no_such_module_xyz:Net' could not be imported"),
    ]
    for arguments, message in cases:
        changes = arguments.pop("config", {})
        with pytest.raises(ValueError, match=message) as caught:
            run_experiment(replace(tiny, **changes), **arguments)
        assert "\n" not in str(caught.value), str(caught.value)
        assert not os.path.exists(output), f"{arguments}: a run directory was written"


def test_init_params_are_the_runs_version_zero(tiny):
    config, dataset, _, model, seeded = prepare(replace(tiny, model="logreg"))
    noise = jax.random.normal(jax.random.key(5), seeded["params"]["Dense_0"]["kernel"].shape)
    pretrained = {"Dense_0": {"bias": seeded["params"]["Dense_0"]["bias"],  # a "peer's" init
                              "kernel": seeded["params"]["Dense_0"]["kernel"] + 0.05 * noise}}
    # SGD with rate 0: every client update is zero, so the final model is version 0 itself
    result = run_experiment(config, init_params=pretrained, client_optimizer=optax.sgd(0.0))
    assert _leaves_equal(result.params["params"], pretrained)
    evaluate = make_evaluator(model.predict, dataset.test_x, dataset.test_y)
    assert result.metrics[0]["version"] == 0
    assert result.metrics[0]["loss"] == evaluate({"params": pretrained})["loss"]
    assert result.metrics[0]["loss"] != evaluate(seeded)["loss"]
    stored = json.load(open(os.path.join(result.run_dir, "config.json")))
    assert stored["user_inputs"]["init_params_sha256"] == jaxfl.user_inputs.tree_fingerprint({"params": pretrained})
    # the layout init_variables returns, and a linen variables dict, are the same version 0
    other = run_experiment(replace(config, run_name="layout"), init_params={"params": pretrained},
                           client_optimizer=optax.sgd(0.0))
    assert _leaves_equal(other.params["params"], pretrained)
    # flax's FrozenDict (what linen's init returned before flax 0.8), whole or nested: the same version 0
    # (a frozen variables dict was taken as params alone and refused naming a leaf that is there)
    from flax.core import freeze

    for name, frozen in (("frozen", freeze({"params": pretrained})), ("nested", {"params": freeze(pretrained)})):
        again = run_experiment(replace(config, run_name=name), init_params=frozen, client_optimizer=optax.sgd(0.0))
        assert _leaves_equal(again.params["params"], pretrained)


class NnxNormDrop(nnx.Module):  # BatchNorm state and a Dropout's RNG stream beside the params
    def __init__(self, rngs: nnx.Rngs):
        self.hidden, self.norm = nnx.Linear(784, 16, rngs=rngs), nnx.BatchNorm(16, rngs=rngs)
        self.drop, self.out = nnx.Dropout(0.1, rngs=rngs), nnx.Linear(16, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(nnx.relu(self.norm(self.hidden(x.reshape((x.shape[0], -1)))))))


@pytest.mark.parametrize("layout", ["whole state", "params and state as States"])
def test_an_nnx_models_state_is_version_zero_whole_or_split(tiny, layout):
    """nnx.state(model) of a model with BatchNorm and Dropout was refused ("init_params['drop']['rngs']
    ['count'] is not a leaf of the model"), and a {"params": State, "state": State} dict too."""
    peer = NnxNormDrop(nnx.Rngs(7))
    _, params, _, state = nnx.split(peer, nnx.Param, nnx.RngState, ...)
    given = nnx.state(peer) if layout == "whole state" else {"params": params, "state": state}
    result = run_experiment(replace(tiny, run_name=layout.replace(" ", "-")), model=NnxNormDrop, init_params=given,
                            client_optimizer=optax.sgd(0.0))
    assert _leaves_equal(result.params["params"], nnx.to_pure_dict(params))


def test_init_params_that_are_not_finite_are_refused_before_any_work(tiny):
    config = replace(tiny, model="logreg")
    params = prepare(config)[4]["params"]
    broken = {"Dense_0": {"bias": params["Dense_0"]["bias"].at[3].set(jnp.nan), "kernel": params["Dense_0"]["kernel"]}}
    with pytest.raises(ValueError, match=r"init_params\['Dense_0'\]\['bias'\] holds NaN or Inf"):
        run_experiment(config, init_params=broken)
    assert not os.path.exists(config.output_dir)


@pytest.mark.parametrize("optimizer, message", [
    (optax.chain(optax.sgd(0.1), optax.contrib.reduce_on_plateau()), r"cannot update from \(gradient, state, params\) "
                                                                     r"alone.*missing 1 required keyword-only argument: 'value'"),
    (optax.lbfgs(), r"cannot update from \(gradient, state, params\) alone"),
    (optax.GradientTransformation(lambda p: jnp.zeros((), jnp.int32), lambda u, s, p=None: (u, s + 1.5)),
     r"a client's local step turns its state.opt_state from \(\) int32 into \(\) float32")],
    ids=["needs the loss value", "lbfgs", "state changes dtype"])
def test_an_optimiser_a_client_step_cannot_run_is_refused_before_any_work(tiny, optimizer, message):
    """Each failed inside the step's trace (a raw TypeError) or, the dtype change, at the first
    training call after the run's folder was made (found 2026-12-05)."""
    with pytest.raises(ValueError, match=message):
        run_experiment(replace(tiny, model="logreg"), client_optimizer=optimizer)
    assert not os.path.exists(tiny.output_dir)


def test_init_params_mismatch_names_the_first_leaf(tiny):
    config = replace(tiny, model="logreg")
    params = prepare(config)[4]["params"]  # {"Dense_0": {"bias": (10,), "kernel": (784, 10)}}
    bad = [
        ({"Dense_0": {"bias": params["Dense_0"]["bias"], "kernel": jnp.zeros((784, 11))}},
         r"init_params\['Dense_0'\]\['kernel'\] has shape \(784, 11\) float32 but the model's is \(784, 10\) float32"),
        ({"Dense_0": {"bias": params["Dense_0"]["bias"].astype(jnp.bfloat16), "kernel": params["Dense_0"]["kernel"]}},
         r"init_params\['Dense_0'\]\['bias'\] has shape \(10,\) bfloat16 but the model's is \(10,\) float32"),
        ({"Dense_0": {"kernel": params["Dense_0"]["kernel"]}}, r"init_params\['Dense_0'\]\['bias'\] is missing"),
        ({"Dense_0": {**params["Dense_0"], "scale": jnp.ones(3)}}, r"init_params\['Dense_0'\]\['scale'\] is not a leaf"),
    ]
    for init_params, message in bad:
        with pytest.raises(ValueError, match=message):
            run_experiment(config, init_params=init_params)
    assert not os.path.exists(config.output_dir)


def test_time_per_step_sets_the_virtual_timeline_exactly(tiny):
    times = np.array([0.125, 0.5, 0.25])  # exact in binary: sums of them are exact too
    config = replace(tiny, algorithm="fedasync", model="logreg", jitter=0.0, max_updates=6)
    result = run_experiment(config, time_per_step=times)
    run = jaxfl.load_run(result.run_dir)
    events = run.events
    dispatched = {}
    arrivals = 0
    for time, event, client, dispatch, steps in zip(events["time"], events["event"], events["client"],
                                                    events["dispatch"], events["steps"]):
        if event == "dispatch":
            dispatched[int(dispatch)] = time
        elif event == "arrival":
            assert time - dispatched[int(dispatch)] == steps * times[int(client)]
            arrivals += 1
    assert arrivals >= 6
    np.testing.assert_array_equal(np.load(os.path.join(result.run_dir, "client_time_per_step.npy")), times)
    # the drawn speeds give another timeline: the array was used; a speed model set with it is refused
    drawn = run_experiment(replace(config, run_name="drawn", heterogeneity="normal"))
    assert list(jaxfl.load_run(drawn.run_dir).events["time"]) != list(events["time"])


def test_loss_hook_trains_and_evaluates_and_metrics_are_columns(tiny):
    config = replace(tiny, model="logreg", max_updates=2)

    def squared_error(logits, labels):  # Brier score on the softmax: a real alternative objective
        return jnp.sum((jax.nn.softmax(logits) - jax.nn.one_hot(labels, logits.shape[-1])) ** 2, axis=-1)

    def top3(logits, labels):
        return {"top3_accuracy": jnp.any(jax.lax.top_k(logits, 3)[1] == labels[:, None], axis=-1).astype(jnp.float32)}

    default = run_experiment(config)
    explicit = run_experiment(replace(config, run_name="ce"),
                              loss=optax.softmax_cross_entropy_with_integer_labels)
    assert _leaves_equal(default.params, explicit.params)  # the hook is the kernel's loss, nothing else
    custom = run_experiment(replace(config, run_name="brier"), loss=squared_error,
                            metrics=top3)
    assert not _leaves_equal(default.params, custom.params)
    _, dataset, _, model, _ = prepare(config)
    brier = make_evaluator(model.predict, dataset.test_x, dataset.test_y, loss=squared_error, metrics=top3)(custom.params)
    last = custom.metrics[-1]
    assert last["loss"] == pytest.approx(brier["loss"], rel=1e-6) and 0 < last["loss"] < 2
    assert last["top3_accuracy"] == pytest.approx(brier["top3_accuracy"]) and last["top3_accuracy"] >= last["accuracy"]
    with open(os.path.join(custom.run_dir, "metrics.csv")) as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3 and float(rows[-1]["top3_accuracy"]) == pytest.approx(last["top3_accuracy"])
    assert json.load(open(os.path.join(custom.run_dir, "config.json")))["user_inputs"]["loss"] == \
        "<user: test_byo_model.test_loss_hook_trains_and_evaluates_and_metrics_are_columns.<locals>.squared_error>"


def test_resume_needs_the_objects_again(tiny):
    config = replace(tiny, algorithm="fedbuff", buffer_size=2, max_updates=2,
                     checkpoint_every=1, jitter=0.0)
    times = [0.125, 0.25, 0.5]
    result = run_experiment(config, model=LinenLogReg, client_optimizer=optax.sgd(0.05), time_per_step=times)
    with pytest.raises(ValueError, match=r"made with model, client_optimizer given as Python objects: pass "
                                         r"model=..., client_optimizer=..."):
        resume_experiment(result.run_dir)
    with pytest.raises(ValueError, match=r"made with model <user: test_byo_model.LinenLogReg>, not "):
        resume_experiment(result.run_dir, model=NnxNoClasses, client_optimizer=optax.sgd(0.05))
    with pytest.raises(ValueError, match=r"time_per_step differs from the run's"):
        resume_experiment(result.run_dir, model=LinenLogReg, client_optimizer=optax.sgd(0.05),
                          time_per_step=[0.125, 0.25, 0.75])
    with pytest.raises(ValueError, match=r"made without a user loss"):
        resume_experiment(result.run_dir, model=LinenLogReg, client_optimizer=optax.sgd(0.05),
                          loss=optax.softmax_cross_entropy_with_integer_labels)
    resumed = resume_experiment(result.run_dir, model=LinenLogReg, client_optimizer=optax.sgd(0.05))
    assert resumed.summary["resumes"] == 1 and resumed.summary["global_updates"] == 2


def test_a_resume_of_a_run_given_init_params_follows_the_checkpoint_it_can_use(tiny):
    """The checkpoint holds the model, so a resume needs no init_params, also when checkpoints/latest
    names a deleted checkpoint and an older one is used; with none left it is refused as having none."""
    from jaxfl.resume import ResumeError, ResumeWarning

    config = replace(tiny, model="logreg", max_updates=2, checkpoint_every=1)
    result = run_experiment(config, init_params=prepare(config)[4])
    root = os.path.join(result.run_dir, "checkpoints")
    shutil.rmtree(os.path.join(root, "ckpt-000002"))  # latest dangles; ckpt-000001 reads back
    with pytest.warns(ResumeWarning, match="latest names ckpt-000002, which does not exist; trying ckpt-000001"):
        resumed = resume_experiment(result.run_dir)
    assert resumed.summary["resumes"] == 1 and resumed.summary["global_updates"] == 2
    for name in os.listdir(root):
        if name.startswith("ckpt-"):
            shutil.rmtree(os.path.join(root, name))  # latest dangles and nothing else is left
    for resume in (lambda: resume_experiment(result.run_dir),
                   lambda: run_experiment(config, resume_dir=result.run_dir)):
        with pytest.raises(ResumeError, match="nothing to resume from"):
            resume()


@pytest.mark.slow
def test_cli_module_object_model_and_resume_in_a_fresh_process(tmp_path, monkeypatch):
    (tmp_path / "byo_cli_models.py").write_text(
        "from flax import nnx\n\n"
        "class Net(nnx.Module):\n"
        "    def __init__(self, num_classes, rngs):\n"
        "        self.out = nnx.Linear(784, num_classes, rngs=rngs)\n\n"
        "    def __call__(self, x):\n"
        "        return self.out(x.reshape((x.shape[0], -1)))\n\n"
        "def make_model(rngs):\n"
        "    return Net(10, rngs=rngs)\n")
    (tmp_path / "speeds.csv").write_text("seconds\n0.125\n0.25\n0.5\n")
    monkeypatch.chdir(tmp_path)  # the CLI imports module:object from the working directory, as python -m does
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "byo_cli_models", raising=False)
    from jaxfl.cli import main

    assert main(["run", "--algorithm", "fedbuff", "--model", "byo_cli_models:make_model", "--clients", "3",
                 "--local-steps", "2", "--batch-size", "16", "--buffer-size", "2", "--max-updates", "3",
                 "--checkpoint-every", "1", "--time-per-step", "speeds.csv", "--jitter", "0", "--no-progress",
                 "--output-dir", "runs", "--run-name", "full"]) == 0
    sys.modules.pop("byo_cli_models", None)
    run_dir = tmp_path / "runs" / "full"
    stored = json.loads((run_dir / "config.json").read_text())
    assert stored["config"]["data"]["model"] == "byo_cli_models:make_model"
    np.testing.assert_array_equal(np.load(run_dir / "client_time_per_step.npy"), [0.125, 0.25, 0.5])
    events, metrics = events_without_wall_time(run_dir), metrics_without_wall_time(run_dir)
    # rewind to the checkpoint of update 2 and resume in a new process: the model is re-imported
    checkpoints = run_dir / "checkpoints"
    shutil.rmtree(checkpoints / "ckpt-000003")
    (checkpoints / "latest").write_text("ckpt-000002\n")
    os.remove(run_dir / "summary.json")
    resumed = subprocess.run([sys.executable, "-m", "jaxfl", "run", "--resume", str(run_dir), "--no-progress"],
                             cwd=tmp_path, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert events_without_wall_time(run_dir) == events
    assert metrics_without_wall_time(run_dir) == metrics
    assert json.loads((run_dir / "summary.json").read_text())["resumes"] == 1


def test_a_cli_model_that_does_not_fit_the_data_names_its_own_line(tmp_path, monkeypatch, capsys):
    """A module:object model whose layer does not fit the samples was one line naming the shapes but
    not where in the user's module; the line now names it, still one line and status 2 (bad input)."""
    (tmp_path / "byo_cli_misfit.py").write_text(
        "from flax import nnx\n\n"
        "class Net(nnx.Module):\n"
        "    def __init__(self, num_classes, rngs):\n"
        "        self.out = nnx.Linear(100, num_classes, rngs=rngs)\n\n"
        "    def __call__(self, x):\n"
        "        return self.out(x.reshape((x.shape[0], -1)))\n\n"
        "def make_model(rngs):\n"
        "    return Net(10, rngs=rngs)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "byo_cli_misfit", raising=False)
    from jaxfl.cli import main

    try:
        with pytest.raises(SystemExit) as ended:
            main(["run", "--algorithm", "fedavg", "--model", "byo_cli_misfit:make_model", "--clients", "3",
                  "--local-steps", "2", "--max-updates", "1", "--no-progress", "--output-dir", "runs"])
    finally:
        sys.modules.pop("byo_cli_misfit", None)
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert err.startswith("jaxfl: error: model 'byo_cli_misfit:make_model' cannot take dataset")
    assert err.rstrip().endswith(f"(in your code: {tmp_path / 'byo_cli_misfit.py'}, line 8, in __call__)")
    assert not (tmp_path / "runs").exists()


class Bfloat16Logreg(nn.Module):
    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)(x.reshape((x.shape[0], -1)))


def test_a_bfloat16_models_held_out_sums_are_taken_in_float32(tiny):
    """Per-example losses and metrics of a bfloat16 model were summed in bfloat16 over each held-out
    batch (3 significant digits): a metric of 1/3 for every sample read 0.33 and something."""
    third = lambda logits, labels: {"third": jnp.full(labels.shape, 1 / 3, logits.dtype)}  # noqa: E731
    result = run_experiment(replace(tiny, max_updates=1, run_name="bf16"), model=Bfloat16Logreg(), metrics=third,
                            client_optimizer=optax.sgd(0.0))
    exact = float(jnp.asarray(1 / 3, jnp.bfloat16))  # the value each sample's metric holds
    assert abs(result.metrics[0]["third"] - exact) < 1e-6
