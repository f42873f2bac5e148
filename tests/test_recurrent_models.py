"""Recurrent models train: a scan over time steps inside a client's step (the built-in ``lstm``, a
user's ``nn.RNN``) starts its carry from constants, which ``shard_map``'s varying-axes check
refused ("scan body function carry input and carry output must have equal types"), so no
recurrent model trained, the built-in one included, on one device or several (found 2026-12-05)."""
import flax.linen as nn
import numpy as np
import pytest

import jaxfl


def _last_token_task():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 20, size=(600, 6)).astype(np.int32)
    y = (x[:, -1] < 10).astype(np.int64)  # decided by the last token: a recurrent model learns it in a few updates
    return x[:480], y[:480], x[480:], y[480:]


def _config(tmp_path, **values):
    return jaxfl.RunConfig(algorithm="fedavg", clients=3, local_steps=10, max_updates=6, jitter=0.0, progress=False,
                           num_classes=2, target_accuracy=None, output_dir=str(tmp_path), **values)


@pytest.mark.parametrize("model", ["lstm", "textcnn"])  # the text models: neither had trained in a test
def test_the_built_in_text_models_train_on_token_ids(tmp_path, model):
    # textcnn's 1-D convolutions keep the unrolled step loop: a 2-step chunk compiles in a fifth of the
    # 10-step one the local steps would pick, and trains the same steps
    chunk = {"steps_per_call": 2} if model == "textcnn" else {}
    result = jaxfl.run_experiment(_config(tmp_path, model=model, **chunk), data=_last_token_task())
    accuracy = jaxfl.load_run(result.run_dir).metrics["accuracy"]
    assert result.summary["global_updates"] == 6
    assert accuracy[-1] > 0.75 > accuracy[0] + 0.1, accuracy


class GRUClassifier(nn.Module):
    num_classes: int = 2

    @nn.compact
    def __call__(self, tokens):
        embedded = nn.Embed(20, 8)(tokens)                                            # (B, T, 8)
        carry, _ = nn.RNN(nn.GRUCell(16), return_carry=True)(embedded)                # (B, 16)
        return nn.Dense(self.num_classes)(carry)


def test_a_users_linen_rnn_trains_and_repeats_bit_for_bit(tmp_path):
    runs = [jaxfl.run_experiment(_config(tmp_path, run_name=f"gru-{i}"), data=_last_token_task(), model=GRUClassifier)
            for i in range(2)]
    first, second = (jaxfl.load_run(run.run_dir).metrics for run in runs)
    assert first["accuracy"][-1] > 0.75 > first["accuracy"][0] + 0.1, first["accuracy"]
    assert np.array_equal(first["loss"], second["loss"]) and np.array_equal(first["accuracy"], second["accuracy"])


def test_the_lstm_classifies_from_the_last_real_token_whatever_the_padding():
    # it counted the non-zero tokens: a left-padded sequence (Keras' pad_sequences default) stopped
    # inside its padding, and every such review got the same logits
    import jax
    import jax.numpy as jnp

    from jaxfl.models import make_model

    model = make_model("lstm", 2, vocab_size=50)
    variables = model.init(jax.random.key(0), jnp.zeros((1, 6), jnp.int32))

    def logits(*tokens):
        return np.asarray(model.apply(variables, jnp.asarray([tokens], jnp.int32)))

    np.testing.assert_allclose(logits(5, 7, 9, 0, 0, 0), logits(5, 7, 9), rtol=1e-6)
    assert not np.allclose(logits(0, 0, 0, 0, 0, 9), logits(0, 0, 0, 0, 0, 42))
    assert not np.allclose(logits(0, 0, 0, 0, 0, 9), logits(0, 0, 0, 0, 0, 0))
    # a padding id inside the text is read as a token, up to the last real one
    np.testing.assert_allclose(logits(5, 0, 7, 9, 0, 0), logits(5, 0, 7, 9), rtol=1e-6)
