"""DeepSpeed-Ulysses (Jacobs et al. 2023): causal attention over a sequence cut into c pieces,
one a worker, by swapping the pieces of the sequence for groups of heads. Around attention,
an all-to-all sends worker j every position's queries of its a / c heads and the keys and
values of their key/value heads (kv / c of them, or, where the ways outnumber the key/value
heads, the one its queries share, copied as tensor parallelism copies it); j attends whole
sequences for those heads, and a second all-to-all sends each worker its positions of every
head's output. Each worker computes a / c of the heads over the whole causal mask, so the
work is even without a zig-zag cut.

What crosses (:func:`dtflab.train.formulas.split_bytes.ulysses_bytes`) does not grow with the
ways as ring attention's keys and values do, but it carries the queries and outputs too: with
few key/value heads, ring attention sends less.
"""

from __future__ import annotations

from dtflab import names
from dtflab.train.problems import fused_attention
from dtflab.train.problems import transformer_ops as ops


def heads_of(problem, ways: int, j: int) -> tuple[range, range]:
    """Worker j's query heads and key/value heads."""
    per = problem.heads // ways
    if problem.kv_heads >= ways:
        kv = problem.kv_heads // ways
        return range(j * per, (j + 1) * per), range(j * kv, (j + 1) * kv)
    group = j // (ways // problem.kv_heads)
    return range(j * per, (j + 1) * per), range(group, group + 1)


def attend(tf, problem, devices, queries: dict, keys: dict, sequence: int) -> dict:
    """Each worker's attention output for its piece: ``queries[device]`` is ``{chunk: [batch,
    heads, length, size]}`` (one chunk a worker, in order), ``keys[device]`` ``{chunk: (k, v)}``
    with [batch, kv heads, length, size]; returns ``{device: {chunk: [batch, heads, length,
    size]}}``, as ring attention's ``attend`` gives each worker."""
    c, size = len(devices), problem.head_size
    chunks = [next(iter(queries[device])) for device in devices]
    outputs = {}
    for j, device in enumerate(devices):
        mine, kv = heads_of(problem, c, j)
        pieces = {"q": [], "k": [], "v": []}
        for m, source in enumerate(devices):  # each piece cut where it is, so only it crosses
            chunk = chunks[m]
            with tf.device(source), tf.name_scope(f"ulysses_to_{_task(device)}"):
                k, v = keys[source][chunk]
                pieces["q"].append(queries[source][chunk][:, mine.start:mine.stop])
                pieces["k"].append(k[:, kv.start:kv.stop])
                pieces["v"].append(v[:, kv.start:kv.stop])
        with tf.device(device), tf.name_scope(f"ulysses_attention_on_{_task(device)}"):
            q, k, v = (tf.concat(pieces[name], axis=2) for name in ("q", "k", "v"))
            groups = len(mine) // len(kv)
            core = (fused_attention.core(tf, problem.attention_block, groups, joined=False)
                    if problem.attention_block
                    else ops.attention_core(tf, sequence, size, q.dtype, groups))
            outputs[device] = core(q, k, v)  # [batch, a / c, sequence, size]
    found = {}
    for m, device in enumerate(devices):
        start, stop = chunks[m]
        back = []
        for j, source in enumerate(devices):
            with tf.device(source), tf.name_scope(f"ulysses_back_to_{_task(device)}"):
                back.append(outputs[source][:, :, start:stop])
        with tf.device(device), tf.name_scope(f"ulysses_joined_on_{_task(device)}"):
            found[device] = {chunks[m]: tf.concat(back, axis=1)}
    return found


def _task(device: str) -> str:
    return names.task(device).replace(":", "")
