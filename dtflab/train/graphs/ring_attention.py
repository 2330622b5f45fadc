"""Ring attention (Liu et al. 2023; picotron's ``context_parallel/``): causal attention over a
sequence cut into pieces on c workers. Each worker keeps its queries; the keys and values go
round the ring, one hop a round, and each worker folds each piece it holds into its queries'
attention with an online softmax (a running maximum, sum and weighted values per query row),
so it never holds a whole row of scores.

Which positions each worker holds (the naive and the zig-zag cut), which blocks of scores it
computes and how far each chunk of keys travels: :mod:`dtflab.train.layouts.ring`. A block of
keys wholly after a chunk of queries is not computed at all.

With fused attention (``train.transformer(attention="fused")``) each worker folds the pieces
it holds as one fused attention (``problems.fused_attention``): the same online softmax, tile
by tile, and a backward that computes each tile's scores again, so a worker keeps no scores.
"""

from __future__ import annotations

import math

import numpy as np

from dtflab.train.layouts.ring import relation
from dtflab.train.problems import fused_attention


def attend(tf, queries: dict, held: list[dict], size: int, block: int = 0):
    """One worker's attention output for each of its query chunks: ``queries[chunk]`` is
    [batch, heads, length, size]; ``held[r]`` maps each key chunk the worker holds in round
    r to its ``(k, v)``, [batch, kv heads, length, size]. Blocks are folded in round order
    with an online softmax. With fewer key/value heads than query heads (grouped-query
    attention), each group's queries are stacked along the sequence against their one key and
    value head, as ``transformer_ops.attention_core`` does. ``block``: fused attention's tile
    (0: plain attention, each block of scores kept for TensorFlow's autodiff)."""
    if block:
        return _fused(tf, queries, held, block)
    scale = 1.0 / math.sqrt(size)
    outputs = {}
    for query, q in queries.items():
        heads, length = q.shape[1], query[1] - query[0]
        kv = next(iter(held[0].values()))[0].shape[1]
        groups = heads // kv
        if groups > 1:
            q = tf.reshape(q, [-1, kv, groups * length, size])
        state = None  # running (maximum, sum, weighted values)
        for r, pieces in enumerate(held):
            for key, (k, v) in pieces.items():
                kind = relation(query, key)
                if kind == "none":
                    continue
                name = f"q{query[0]}_k{key[0]}_{kind}"
                scores = tf.matmul(q, k, transpose_b=True, name=f"{name}_scores") * scale
                if kind == "causal":
                    future = np.triu(np.ones([length, length], np.float32), 1) * -1e9
                    scores = scores + tf.constant(np.tile(future, (groups, 1)))
                top = tf.stop_gradient(tf.reduce_max(scores, axis=-1, keepdims=True))
                if state is not None:
                    top = tf.maximum(state[0], top)
                weights = tf.exp(scores - top)
                total = tf.reduce_sum(weights, axis=-1, keepdims=True)
                values = tf.matmul(weights, v, name=f"{name}_values")
                if state is not None:
                    decay = tf.exp(state[0] - top)
                    total, values = state[1] * decay + total, state[2] * decay + values
                state = (top, total, values)
        out = state[2] / state[1]
        outputs[query] = tf.reshape(out, [-1, heads, length, size]) if groups > 1 else out
    return outputs


def _fused(tf, queries: dict, held: list[dict], block: int) -> dict:
    """:func:`attend` with every piece a query chunk meets folded by one fused attention."""
    outputs = {}
    for query, q in queries.items():
        pieces = [(k, v, relation(query, key) == "causal") for pieces in held
                  for key, (k, v) in pieces.items() if relation(query, key) != "none"]
        groups = q.shape[1] // pieces[0][0].shape[1]
        with tf.name_scope(f"q{query[0]}_fused"):
            outputs[query] = fused_attention.attend(tf, q, pieces, block, groups)
    return outputs
