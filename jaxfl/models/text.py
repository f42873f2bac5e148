"""Small text classifiers over token ids ``(B, L)`` int32 (0 = padding): TextCNN and an LSTM.

FedASMU trains a TextCNN on IMDb (Liu et al., AAAI 2024, experimental setup; no layer sizes given): we use Kim (2014)'s
shape, embedding 128, filters of width 3/4/5 with 100 channels each, max-over-time pooling,
dropout 0.5, one Dense. ``LSTMClassifier`` reads the sequence with one LSTM layer and classifies
from the state at the last non-padding token.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["TextCNN", "LSTMClassifier"]


class TextCNN(nn.Module):
    """Kim-style 1-D CNN: Embed -> Conv1D (widths 3/4/5) -> ReLU -> max over time -> dropout -> Dense.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = TextCNN(num_classes=2, vocab_size=100)
        >>> v = model.init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32))
        >>> model.apply(v, jnp.ones((3, 16), jnp.int32)).shape
        (3, 2)
    """

    num_classes: int = 2
    vocab_size: int = 20_000
    embed_dim: int = 128
    widths: Sequence[int] = (3, 4, 5)
    channels: int = 100
    dropout: float = 0.5

    @nn.compact
    def __call__(self, tokens: jax.Array, train: bool = False) -> jax.Array:
        x = nn.Embed(self.vocab_size, self.embed_dim)(tokens.astype(jnp.int32))  # (B, L, E)
        pooled = [jnp.max(nn.relu(nn.Conv(self.channels, (w,), padding="VALID")(x)), axis=1)
                  for w in self.widths]  # each (B, channels)
        x = nn.Dropout(self.dropout, deterministic=not train)(jnp.concatenate(pooled, axis=-1))
        return nn.Dense(self.num_classes)(x)


class LSTMClassifier(nn.Module):
    """Embed -> one LSTM layer -> hidden state at the last real token -> Dense.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = LSTMClassifier(num_classes=2, vocab_size=50)
        >>> v = model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
        >>> model.apply(v, jnp.ones((2, 8), jnp.int32)).shape
        (2, 2)
    """

    num_classes: int = 2
    vocab_size: int = 20_000
    embed_dim: int = 64
    hidden: int = 128

    @nn.compact
    def __call__(self, tokens: jax.Array, train: bool = False) -> jax.Array:
        tokens = tokens.astype(jnp.int32)
        x = nn.Embed(self.vocab_size, self.embed_dim)(tokens)  # (B, L, E)
        # Each sequence stops at its last real token, so right padding never enters the state; a
        # left-padded one (Keras' pad_sequences default) reads its leading padding, then every word.
        # (A count of the non-zero tokens would stop a left-padded sequence inside its padding.)
        real = tokens != 0
        last = tokens.shape[1] - jnp.argmax(real[:, ::-1], axis=1)
        lengths = jnp.where(real.any(axis=1), last, 1)
        carry, _ = nn.RNN(nn.LSTMCell(self.hidden), return_carry=True)(x, seq_lengths=lengths)
        return nn.Dense(self.num_classes)(carry[1])  # carry = (c, h)
