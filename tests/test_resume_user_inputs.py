"""A resume is refused, in one line before any training, when what the run took besides its config
differs from what it was made with, though the objects' names look the same: another client optimiser
(Adam for SGD, or SGD at another learning rate: both labelled ``<user: optax.GradientTransformation>``),
metrics returning other names (their metrics.csv columns), a named model whose code changed since.
Each was resumed without a word before, and the run went on as another run."""
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest

import jaxfl
from jaxfl.config import RunConfig
from jaxfl.experiment import RunInterrupted, prepare, resume_experiment, run_experiment
from jaxfl.models import register_model
from jaxfl.user_inputs import _first_two_updates

CONFIG = dict(algorithm="fedbuff", model="logreg", clients=3, local_steps=2, batch_size=16, buffer_size=2,
              max_updates=2, checkpoint_every=1, stop_at_target=False, progress=False)


def interrupted(tmp_path, **inputs) -> str:
    """A run stopped at its first event, with its first checkpoint (jaxfl.request_stop before it starts)."""
    jaxfl.request_stop("a test")
    with pytest.raises(RunInterrupted) as caught:
        run_experiment(RunConfig(**{**CONFIG, **inputs.pop("config", {})}, output_dir=str(tmp_path)), **inputs)
    return caught.value.run_dir


def test_another_client_optimiser_is_refused_and_the_same_one_resumes(tmp_path):
    run = interrupted(tmp_path, client_optimizer=optax.sgd(0.05))
    with pytest.raises(ValueError, match=r"client_optimizer= is not the optimiser run .* its state has another "
                                         r"structure"):
        resume_experiment(run, client_optimizer=optax.adam(0.05), progress=False)
    with pytest.raises(ValueError, match=r"client_optimizer= is not the optimiser run .* its first updates from "
                                         r"the same gradients differ \(another learning rate"):
        resume_experiment(run, client_optimizer=optax.sgd(0.5), progress=False)
    with pytest.raises(ValueError, match=r"its state has another structure"):  # momentum's trace
        resume_experiment(run, client_optimizer=optax.sgd(0.05, momentum=0.9), progress=False)
    resumed = resume_experiment(run, client_optimizer=optax.sgd(0.05), progress=False)
    assert resumed.summary["global_updates"] == 2


@pytest.mark.parametrize("made, other", [
    (optax.adam(1e-2), optax.adam(1e-2, b1=0.5)), (optax.adam(1e-2), optax.adam(1e-2, b2=0.9)),
    (optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1)), optax.chain(optax.clip_by_global_norm(10.0), optax.sgd(0.1))),
    (optax.sgd(optax.cosine_decay_schedule(0.1, 1000)), optax.sgd(optax.cosine_decay_schedule(0.1, 2000)))],
    ids=["adam b1", "adam b2", "clipping threshold", "schedule length"])
def test_optimisers_that_differ_beyond_one_constant_gradients_first_updates_are_refused(tmp_path, made, other):
    """A probe of two updates from one constant gradient told none of these apart: the resumed run went
    on with the other optimiser (found 2026-12-05)."""
    run = interrupted(tmp_path, client_optimizer=made)
    with pytest.raises(ValueError, match=r"its first updates from the same gradients differ"):
        resume_experiment(run, client_optimizer=other, progress=False)
    assert resume_experiment(run, client_optimizer=made, progress=False).summary["global_updates"] == 2


def test_a_run_recorded_with_the_earlier_probe_is_checked_by_it(tmp_path):
    run = interrupted(tmp_path, client_optimizer=optax.sgd(0.05))
    path = os.path.join(run, "config.json")
    record = json.load(open(path))
    assert len(record["user_inputs"].pop("client_optimizer_probe_steps")) > 2 * 16
    variables = prepare(RunConfig(**CONFIG))[4]
    record["user_inputs"]["client_optimizer_probe"] = _first_two_updates(optax.sgd(0.05), variables["params"])
    json.dump(record, open(path, "w"))
    with pytest.raises(ValueError, match=r"its first updates from the same gradients differ"):
        resume_experiment(run, client_optimizer=optax.sgd(0.5), progress=False)
    assert resume_experiment(run, client_optimizer=optax.sgd(0.05), progress=False).summary["global_updates"] == 2


def test_metrics_returning_other_names_are_refused(tmp_path):
    top = lambda logits, labels: {"top3": jnp.zeros(labels.shape)}  # noqa: E731
    run = interrupted(tmp_path, metrics=top)
    other = lambda logits, labels: {"top5": jnp.zeros(labels.shape)}  # noqa: E731
    with pytest.raises(ValueError, match=r"metrics= returns \['top5'\], and run .* was made with metrics returning "
                                         r"\['top3'\]"):
        resume_experiment(run, metrics=other, progress=False)
    assert "top3" in resume_experiment(run, metrics=top, progress=False).metrics[-1]


def test_another_loss_of_the_same_name_is_refused(tmp_path):
    """Only the loss's label (module and name) was compared: another lambda, or a functools.partial of
    one function with other settings, resumed the run on another objective without a word."""
    import functools

    def focal(logits, labels, gamma):
        probabilities = jnp.exp(-optax.softmax_cross_entropy_with_integer_labels(logits, labels))
        return (1 - probabilities) ** gamma * optax.softmax_cross_entropy_with_integer_labels(logits, labels)

    def scaled(factor):  # a factory's lambdas share one label
        return lambda logits, labels: factor * focal(logits, labels, 0.0)

    for name, made, other in (("partial", functools.partial(focal, gamma=0.0), functools.partial(focal, gamma=5.0)),
                              ("lambda", scaled(1.0), scaled(2.0))):
        run = interrupted(tmp_path / name, loss=made)
        stored = json.load(open(os.path.join(run, "config.json")))["user_inputs"]
        assert len(stored["loss_probe"]) == 4
        with pytest.raises(ValueError, match=r"loss= is not the loss run .* was made with: on the same logits and "
                                             r"labels it gives other values"):
            resume_experiment(run, loss=other, progress=False)
        assert resume_experiment(run, loss=made, progress=False).summary["global_updates"] == 2


class Settable(nn.Module):
    num_classes: int = 10
    activation: str = "relu"
    rate: float = 0.0

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = getattr(nn, self.activation)(nn.Dense(8)(x.reshape((x.shape[0], -1))))
        return nn.Dense(self.num_classes)(nn.Dropout(self.rate, deterministic=not train)(x))


def test_a_linen_model_with_other_settings_of_the_same_shapes_is_refused(tmp_path):
    """Parameter shapes alone were compared: another activation or dropout rate resumed the run as another model."""
    run = interrupted(tmp_path, model=Settable(), config=dict(model="cnn"))
    with pytest.raises(ValueError, match=r"model= is not the model run .* was made with: its settings differ "
                                         r"\(activation='tanh', rate=0.5 now, activation='relu', rate=0.0 then\)"):
        resume_experiment(run, model=Settable(activation="tanh", rate=0.5), progress=False)
    assert resume_experiment(run, model=Settable(), progress=False).summary["global_updates"] == 2


def test_a_named_model_whose_code_changed_is_refused_as_such(tmp_path):
    # it failed deep in the checkpoint's restore as "device data unreadable (... 16 leaves recorded,
    # 16 expected)": a corrupt checkpoint, not a changed model
    def hidden(width):  # a model factory whose hidden layer is `width` wide
        def factory(num_classes=10):
            class Net(nn.Module):
                @nn.compact
                def __call__(self, x):
                    return nn.Dense(num_classes)(nn.relu(nn.Dense(width)(x.reshape((x.shape[0], -1)))))
            return Net()
        return factory

    narrow, wide = hidden(8), hidden(16)

    register_model("resume_probe_net", narrow, overwrite=True)
    run = interrupted(tmp_path, config={"model": "resume_probe_net"})
    register_model("resume_probe_net", wide, overwrite=True)
    with pytest.raises(ValueError, match=r"the model named in run .*'s config has other parameter shapes now than "
                                         r"when the run was made"):
        resume_experiment(run, progress=False)
    register_model("resume_probe_net", narrow, overwrite=True)
    assert resume_experiment(run, progress=False).summary["global_updates"] == 2


def test_a_linen_models_settings_read_alike_in_every_process():
    """A set field printed its strings in another order under another PYTHONHASHSEED: the same model,
    resumed in a new process, was refused as one with other settings."""
    import subprocess
    import sys

    script = ("import flax.linen as nn\nfrom jaxfl.user_inputs import linen_settings\n"
              "class Tagged(nn.Module):\n    skip: frozenset = frozenset({'dense_a', 'dense_b', 'dropout', 'norm', 'head'})\n"
              "    table: tuple = ({'x', 'y', 'z'}, {'k': {'b', 'a'}})\n"
              "print(linen_settings(Tagged()))\n")
    outputs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(1, 4)}
    assert len(outputs) == 1 and "frozenset({'dense_a', 'dense_b', 'dropout', 'head', 'norm'})" in outputs.pop()


def _nan_past(limit: float) -> optax.GradientTransformation:
    """NaN for a gradient entry beyond ``limit``: the probe's largest gradients (100) meet it, training's do not."""
    return optax.GradientTransformation(lambda params: optax.EmptyState(),
                                        lambda updates, state, params=None: (
                                            jax.tree.map(lambda u: jnp.where(jnp.abs(u) > limit, jnp.nan, u), updates),
                                            state))


def test_an_optimiser_whose_probe_gives_nan_resumes_with_itself(tmp_path):
    # its recorded probe held NaN, and NaN != NaN refused every resume as "not the optimiser"
    made = optax.chain(_nan_past(50.0), optax.sgd(0.05))
    run = interrupted(tmp_path, client_optimizer=made)
    recorded = json.load(open(os.path.join(run, "config.json")))["user_inputs"]["client_optimizer_probe_steps"]
    assert any(value != value for value in recorded)  # NaN in the record
    assert resume_experiment(run, client_optimizer=made, progress=False).summary["global_updates"] == 2
    with pytest.raises(ValueError, match=r"its first updates from the same gradients differ"):
        resume_experiment(run, client_optimizer=optax.chain(_nan_past(50.0), optax.sgd(0.5)), progress=False)
