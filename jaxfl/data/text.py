"""A small word-level tokenizer for text classification sets (numpy + the standard library).

Lower-cased words (runs of letters, digits and apostrophes) are counted on the training texts; the
``vocab_size - 2`` most frequent (ties broken alphabetically, so the vocabulary is deterministic)
get ids ``2..``; ``0`` pads and ``1`` stands for any other word. Sequences keep their first
``max_len`` words and are right-padded with 0. (Keras' ``pad_sequences`` pads and truncates at the
front by default, keeping a review's last words; a text loaded that way is another input.)
"""

from __future__ import annotations

import collections
import re
from typing import Iterable, Sequence

import numpy as np

__all__ = ["PAD_ID", "OOV_ID", "build_vocab", "encode_texts"]

PAD_ID = 0
OOV_ID = 1
_WORD = re.compile(r"[a-z0-9']+")


def _words(text) -> list[str]:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    # IMDb reviews carry HTML line breaks; they are not words.
    return _WORD.findall(str(text).lower().replace("<br />", " "))


def build_vocab(texts: Iterable, vocab_size: int) -> dict[str, int]:
    """Word -> id for the ``vocab_size - 2`` most frequent words of ``texts`` (ids from 2).

    Example:
        >>> build_vocab(["a b b", "b c"], vocab_size=4)
        {'b': 2, 'a': 3}
    """
    if vocab_size < 3:
        raise ValueError(f"vocab_size={vocab_size} must be >= 3 (padding, unknown and at least one word)")
    counts = collections.Counter()
    for text in texts:
        counts.update(_words(text))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: vocab_size - 2]
    return {word: index + 2 for index, (word, _) in enumerate(ranked)}


def encode_texts(texts: Sequence, vocab: dict[str, int], max_len: int) -> np.ndarray:
    """``(N, max_len)`` int32 token ids, truncated and right-padded with ``PAD_ID``.

    Example:
        >>> encode_texts(["b a zzz"], {"b": 2, "a": 3}, max_len=5).tolist()
        [[2, 3, 1, 0, 0]]
    """
    if max_len < 1:
        raise ValueError(f"max_len={max_len} must be >= 1")
    out = np.zeros((len(texts), max_len), np.int32)
    for row, text in enumerate(texts):
        ids = [vocab.get(word, OOV_ID) for word in _words(text)[:max_len]]
        out[row, : len(ids)] = ids
    return out
