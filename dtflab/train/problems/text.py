"""Text that dtflab writes for itself (no download): sentences from a small grammar, one
character per token, so a learner can read what the model reads and what it predicts.

The grammar is a few dozen words in fixed patterns ("the old man finds a red car again."):
the first letter of a word is hard to guess, most of the rest follow from it. A model that
learns only which letter follows which gets the loss from ln(23) = 3.1 nats down to about 2;
one that reads the words around it (attention) goes well below.
"""

from __future__ import annotations

import functools

import numpy as np

SUBJECTS = ("the cat", "a dog", "the bird", "my friend", "the old man", "a small child",
            "her brother", "the teacher")
VERBS = ("sees", "likes", "finds", "follows", "hears", "knows", "draws", "wants")
OBJECTS = ("the ball", "a tree", "the river", "some bread", "the moon", "a red car",
           "the letter", "an apple")
ENDINGS = (".", " today.", " again.", " at night.")

#: Every character the text uses; a token is its index here.
ALPHABET = "".join(sorted(set(" ".join(SUBJECTS + VERBS + OBJECTS + ENDINGS))))
#: Characters of text made per seed, from which every window is cut.
CORPUS_CHARS = 1 << 16


@functools.lru_cache(maxsize=8)
def corpus(seed: int = 0) -> np.ndarray:
    """``CORPUS_CHARS`` tokens of sentences, the same for the same seed."""
    rng = np.random.default_rng([seed, 7919])
    sentences, size = [], 0
    while size < CORPUS_CHARS:
        words = (SUBJECTS[rng.integers(len(SUBJECTS))], VERBS[rng.integers(len(VERBS))],
                 OBJECTS[rng.integers(len(OBJECTS))])
        sentence = " ".join(words) + ENDINGS[rng.integers(len(ENDINGS))]
        sentences.append(sentence)
        size += len(sentence) + 1
    text = " ".join(sentences)[:CORPUS_CHARS]
    codes = np.frombuffer(text.encode("ascii"), np.uint8)
    table = np.frombuffer(ALPHABET.encode("ascii"), np.uint8)  # sorted: a character's index
    return np.searchsorted(table, codes).astype(np.int64)


def decode(tokens) -> str:
    """Tokens back to characters."""
    return "".join(ALPHABET[int(token)] for token in np.asarray(tokens).ravel())


def window(seed: int, step: int, row: int, length: int) -> np.ndarray:
    """Row ``row`` of step ``step``'s batch: ``length`` consecutive tokens from a place in the
    corpus drawn from ``(seed, step, row)`` alone, so a worker makes its own rows only."""
    text = corpus(seed)
    start = np.random.default_rng([seed, step, row]).integers(0, len(text) - length)
    return text[start:start + length]
