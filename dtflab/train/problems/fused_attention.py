"""Fused ("flash") attention (Dao et al. 2022; Dao 2023): causal attention computed block by
block, a running maximum, sum and weighted values per query row (the online softmax ring
attention does across workers, here within one device), so no row of scores is ever whole
and none is kept. The forward keeps q, k, v, the output and each row's log-sum-exp (a·s·b
float32 values); the backward computes each block's scores again from them.

A head's s x s scores are cut into ``block`` x ``block`` tiles: query block i meets key blocks
0 to i (the causal ones above the diagonal are skipped, so about half the square is computed),
the diagonal tile masked. Grouped-query attention stacks each group's queries along the
sequence against their one key and value head, as ``transformer_ops.attention_core`` does.

Each tile is a handful of TensorFlow ops, not one kernel, run one tile after another (control
dependencies), so one tile's scores are alive at a time, as in a kernel: the memory a fused
kernel saves, but not all of its time (each tile's scores still go through memory, and the
tiles do not run side by side); ``benchmarks/attention.py`` measures both. The graph grows as
(s / block)², so a long sequence wants a large block.
"""

from __future__ import annotations

import math

import numpy as np

#: The tile's side when none is given: FlashAttention-2's usual query block.
BLOCK = 128


def default_block(sequence: int) -> int:
    """The largest divisor of ``sequence`` at most :data:`BLOCK`."""
    return max(b for b in range(1, min(sequence, BLOCK) + 1) if sequence % b == 0)


def core(tf, block: int, groups: int = 1, joined: bool = True):
    """``(q, k, v) -> output``, causal fused attention on q [batch, heads, s, size] and k, v
    [batch, heads / ``groups``, s, size]: the output [batch, s, heads x size] (the heads joined,
    as the projection reads them) or, ``joined=False``, [batch, heads, s, size]."""

    def run(q, k, v):
        return attend(tf, q, [(k, v, True)], block, groups, joined)

    return run


def attend(tf, q, pieces: list, block: int, groups: int = 1, joined: bool = False):
    """Fused attention of the queries ``q`` [batch, heads, n, size] over key pieces in order,
    each ``(k, v, causal)``: k and v [batch, heads / ``groups``, m, size]; ``causal`` marks the
    piece holding the queries' own positions (m = n, the future masked), the others are wholly
    before them. Ring attention passes every piece a worker holds; the backward of each piece
    uses the softmax over all of them (their log-sum-exp), so nothing per piece is kept."""
    f32 = tf.float32
    heads, n, size = q.shape[1], q.shape[2], q.shape[3]
    kv = heads // groups
    scale = 1.0 / math.sqrt(size)
    dtype = q.dtype
    flags = [causal for _, _, causal in pieces]
    for k, _, causal in pieces:
        if k.shape[2] % block or n % block or (causal and k.shape[2] != n):
            raise ValueError(f"attention_block={block}: the queries' {n} positions and a "
                             f"piece's {k.shape[2]} keys must each be whole blocks; use a block "
                             f"that divides both, e.g. attention_block={math.gcd(n, k.shape[2])}")
    rows = n // block
    mask = tf.constant(np.tile(np.triu(np.ones([block, block], np.float32), 1) * -1e9,
                               (groups, 1)))

    def query_blocks(x, width):  # [b, heads, n, width] -> per block [b, kv, groups*block, width]
        x = tf.reshape(x, [-1, kv, groups, n, width])
        return [tf.reshape(x[:, :, :, i * block:(i + 1) * block], [-1, kv, groups * block, width])
                for i in range(rows)]

    def from_blocks(parts, width):  # the inverse of query_blocks
        whole = tf.concat([tf.reshape(p, [-1, kv, groups, block, width]) for p in parts], 3)
        return tf.reshape(whole, [-1, heads, n, width])

    def tiles(i, keys):  # the (piece, key block) pairs query block i meets, in order
        for p, causal in enumerate(flags):
            count = keys[p].shape[2] // block
            for j in range(i + 1 if causal else count):
                yield p, j, causal and j == i

    def scores(qi, k, j, diagonal, after):
        """A tile's scores, computed once the tensors ``after`` are (the previous tile's): one
        tile alive at a time, as in a kernel, instead of every tile's scores made at once."""
        if after:
            with tf.control_dependencies(after):
                qi = tf.identity(qi)
        kj = k[:, :, j * block:(j + 1) * block]
        s = tf.cast(tf.matmul(qi, kj, transpose_b=True), f32) * scale
        return s + mask if diagonal else s

    def to_output(o):  # [b, heads, n, size] -> the layout asked for
        return tf.reshape(tf.transpose(o, [0, 2, 1, 3]), [-1, n, heads * size]) if joined else o

    def from_output(o):
        return tf.transpose(tf.reshape(o, [-1, n, heads, size]), [0, 2, 1, 3]) if joined else o

    @tf.custom_gradient
    def fused(q, *kvs):
        keys, values = kvs[0::2], kvs[1::2]
        outs, sums, last = [], [], []  # last: the previous tile's state, as in the backward
        for i, qi in enumerate(query_blocks(q, size)):
            top = total = acc = None
            for p, j, diagonal in tiles(i, keys):
                s = scores(qi, keys[p], j, diagonal, last)
                new = tf.reduce_max(s, axis=-1, keepdims=True)
                new = new if top is None else tf.maximum(top, new)
                weights = tf.exp(s - new)
                vj = values[p][:, :, j * block:(j + 1) * block]
                part = tf.cast(tf.matmul(tf.cast(weights, dtype), vj), f32)
                row = tf.reduce_sum(weights, axis=-1, keepdims=True)
                if top is None:
                    total, acc = row, part
                else:
                    decay = tf.exp(top - new)
                    total, acc = total * decay + row, acc * decay + part
                top, last = new, [total, acc]
            outs.append(tf.cast(acc / total, dtype))
            sums.append(top + tf.math.log(total))
        lse = from_blocks(sums, 1)  # [b, heads, n, 1], float32: kept with q, k, v and out
        with tf.control_dependencies([lse]):  # made in the forward, as a kernel writes it
            out = to_output(from_blocks(outs, size))

        def backward(d_out):
            # Once the gradient has come, not before (see ops.gelu): the scores computed again
            # would otherwise run in the forward, or merge with its own, and be kept.
            with tf.control_dependencies([d_out]):
                q_, o, lse_ = tf.identity(q), tf.identity(out), tf.identity(lse)
                keys_, values_ = [tf.identity(k) for k in keys], [tf.identity(v) for v in values]
            d_o, o = (from_output(x) for x in (d_out, o))
            d_q, d_k, d_v = [], [None] * len(keys), [None] * len(keys)
            qs, dos, os_ = query_blocks(q_, size), query_blocks(d_o, size), query_blocks(o, size)
            lses = query_blocks(lse_, 1)
            last = []  # the previous tile's gradients: one tile's scores alive at a time
            for i, qi in enumerate(qs):
                doi = dos[i]
                delta = tf.reduce_sum(tf.cast(doi, f32) * tf.cast(os_[i], f32), -1, keepdims=True)
                dqi = None
                for p, j, diagonal in tiles(i, keys_):
                    count = keys_[p].shape[2] // block
                    kj = keys_[p][:, :, j * block:(j + 1) * block]
                    vj = values_[p][:, :, j * block:(j + 1) * block]
                    with tf.control_dependencies(last):  # dp too: it needs no scores
                        qt, dot = tf.identity(qi), tf.identity(doi)
                    weights = tf.exp(scores(qt, keys_[p], j, diagonal, None) - lses[i])
                    dp = tf.cast(tf.matmul(dot, vj, transpose_b=True), f32)
                    ds = tf.cast(weights * (dp - delta) * scale, dtype)
                    dq = tf.cast(tf.matmul(ds, kj), f32)
                    dqi = dq if dqi is None else dqi + dq
                    d_k[p] = _add_at(d_k[p], tf.cast(tf.matmul(ds, qi, transpose_a=True), f32),
                                     j, count)
                    d_v[p] = _add_at(d_v[p], tf.cast(tf.matmul(tf.cast(weights, dtype), doi,
                                                               transpose_a=True), f32), j, count)
                    last = [dqi, d_k[p][j], d_v[p][j]]
                d_q.append(dqi)
            grads = [tf.cast(from_blocks(d_q, size), dtype)]
            for p in range(len(keys)):
                grads += [_joined(tf, d_k[p], keys[p]), _joined(tf, d_v[p], values[p])]
            return grads

        return out, backward

    return fused(q, *[x for k, v, _ in pieces for x in (k, v)])


def _add_at(found, part, j, count):
    """``found`` (a list of ``count`` key blocks' sums, or None) with ``part`` added at j."""
    found = found or [None] * count
    found[j] = part if found[j] is None else found[j] + part
    return found


def _joined(tf, blocks, like):
    """The key blocks' gradients as one tensor shaped as ``like``; a block no query met, zero."""
    block = like.shape[2] // len(blocks)
    zero = tf.zeros_like(like[:, :, :block], tf.float32)
    return tf.cast(tf.concat([zero if b is None else b for b in blocks], axis=2), like.dtype)
