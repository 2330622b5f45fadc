"""Context parallelism: a transformer's sequence cut into pieces on c worker tasks, each
worker running every layer on its positions, attention by :mod:`~dtflab.train.graphs.
ring_attention` (keys and values round the ring, an online softmax) or by
:mod:`~dtflab.train.graphs.ulysses` (two all-to-alls swap the pieces for groups of heads).

Everything but attention works position by position (the embedding, LayerNorms, the matrix
multiplies, the MLP, the loss), so each worker computes it on its own positions alone. Worker
0 holds the parameters once and lends them: every other worker reads each once a step and
sends its gradient back, as the context group's gradient all-reduce would (Megatron and
torchtitan keep a copy per worker and all-reduce). Worker 0 also cuts the batch's tokens and
targets for each worker, and sums the workers' losses.

Float32, ``recompute="none"``: what ring attention keeps for its backward is each block's
scores, which is the saving (a worker keeps its share of the a·s²·b of the softmax).

Ops are named ``block{b}/ring_attention_on_worker{m}/q{start}_k{start}_{full|causal}_scores``
(one per block of scores a worker computes), so a traced step shows which worker computed what.
"""

from __future__ import annotations

import math

import numpy as np

from dtflab import checks, names
from dtflab._quiet import import_tf
from dtflab.train.formulas import split_bytes
from dtflab.train.layouts import ring
from dtflab.train.layouts.layout import Layout, said_as
from dtflab.train.layouts.tasks import enough_workers, worker_devices
from dtflab.train.problems import Transformer
from dtflab.train.problems import transformer_ops as ops
from dtflab.train.machinery.graphs import TrainGraph, straggler
from dtflab.train.machinery.options import RunOptions, takes_options
from dtflab.train.machinery.sessions import train_graph
from dtflab.train.graphs import ring_attention, ulysses
from dtflab.train.problems.experts import dense_only
from dtflab.train.problems.transformer_block import norm_weights


#: What ``attention=`` takes.
ATTENTION = ("ring", "ulysses")


def context_graph(problem, devices, cut: str, seed: int, slow: dict | None = None,
                  attention: str = "ring") -> TrainGraph:
    """The training step with the sequence cut ``cut`` over ``devices``, worker 0 first (see
    the module's docstring), attention by ``attention`` (ring attention or Ulysses);
    ``slow[device]`` seconds are slept on that worker each step."""
    tf = import_tf()
    slow, home, c = slow or {}, devices[0], len(devices)
    pieces = ring.chunks(cut, c, problem.sequence)
    heads, kv, size, d = problem.heads, problem.kv_heads, problem.head_size, problem.d_model
    rotary = problem.positions == "rotary"
    graph = tf.Graph()
    with graph.as_default():
        with tf.device(home):
            x, t = problem.placeholders()
            variables = {name: tf.compat.v1.get_variable(name, initializer=value)
                         for name, value in problem.initial_values(seed)}
        read, h, targets = {}, {}, {}
        for m, device in enumerate(devices):
            task = _task(device)
            with tf.device(home), tf.name_scope(f"tokens_for_{task}"):
                mine = [tf.concat([ids[:, a:b] for a, b in pieces[m]], axis=1) for ids in (x, t)]
            with tf.device(device), tf.name_scope(f"embedding_on_{task}"):
                with tf.control_dependencies(straggler(slow, device)):
                    read[device] = {name: tf.identity(v, name=name) for name, v in variables.items()}
                tokens, targets[device] = (tf.identity(ids) for ids in mine)
                h[device] = ops.dense(tf, tf.one_hot(tokens, problem.vocabulary),
                                      read[device]["wte"])
                if not rotary:
                    wpe = read[device]["wpe"]
                    h[device] += tf.concat([wpe[a:b] for a, b in pieces[m]], axis=0)

        def split(tensor, m, count, turn=False):
            """[batch, n, count x size] -> {chunk: [batch, count, length, size]}; ``turn``: by
            rotary positions, at the chunk's place in the sequence."""
            found, at = {}, 0
            for a, b in pieces[m]:
                part = tf.reshape(tensor[:, at:at + b - a], [-1, b - a, count, size])
                found[a, b], at = tf.transpose(part, [0, 2, 1, 3]), at + b - a
                if turn and rotary:
                    found[a, b] = ops.rotary(tf, np.arange(a, b), size)(found[a, b])
            return found

        def ring_rounds(b, q, held):  # keys and values round the ring, then each worker's attention
            for r in range(1, c):  # each worker takes what its left neighbour held last round
                for m, device in enumerate(devices):
                    left = held[devices[(m - 1) % c]][r - 1]
                    with tf.device(device), tf.name_scope(f"block{b}/ring_on_{_task(device)}"):
                        held[device].append({chunk: (tf.identity(k), tf.identity(v))
                                             for chunk, (k, v) in left.items()})
            outs = {}
            for device in devices:
                with tf.device(device):
                    with tf.name_scope(f"block{b}/ring_attention_on_{_task(device)}"):
                        outs[device] = ring_attention.attend(tf, q[device], held[device], size,
                                                             problem.attention_block)
            return outs

        for b in range(1, problem.blocks + 1):
            w = {device: {name[len(f"h{b}_"):]: v for name, v in read[device].items()
                          if name.startswith(f"h{b}_")} for device in devices}
            q, held = {}, {}  # held[device][r]: {key chunk: (k, v)} in round r
            for m, device in enumerate(devices):
                with tf.device(device), tf.name_scope(f"block{b}/qkv_on_{_task(device)}"):
                    a = problem.normalise(tf, norm_weights(problem, w[device], "ln1"), h[device],
                                          "ln1")
                    qkv = tf.split(ops.dense(tf, a, w[device]["qkv_w"]) + w[device]["qkv_b"],
                                   [heads * size, kv * size, kv * size], -1)
                    q[device] = split(qkv[0], m, heads, turn=True)
                    ks, vs = split(qkv[1], m, kv, turn=True), split(qkv[2], m, kv)
                    held[device] = [{chunk: (ks[chunk], vs[chunk]) for chunk in ks}]
            if attention == "ulysses":
                with tf.name_scope(f"block{b}"):
                    outs = ulysses.attend(tf, problem, devices, q,
                                          {device: held[device][0] for device in devices},
                                          problem.sequence)
            else:
                outs = ring_rounds(b, q, held)
            for m, device in enumerate(devices):
                out = outs[device]
                with tf.device(device):
                    with tf.name_scope(f"block{b}/rest_on_{_task(device)}"):
                        joined = tf.concat([tf.reshape(tf.transpose(out[chunk], [0, 2, 1, 3]),
                                                       [-1, chunk[1] - chunk[0], d])
                                            for chunk in sorted(out, key=pieces[m].index)], 1)
                        h[device] += (ops.dense(tf, joined, w[device]["proj_w"])
                                      + w[device]["proj_b"])
                        n = problem.normalise(tf, norm_weights(problem, w[device], "ln2"),
                                              h[device], "ln2")
                        h[device] += problem.mlp(tf, n, w[device]["fc_w"], w[device]["fc_b"],
                                                 w[device]["out_w"], w[device]["out_b"])
        losses = []
        for device in devices:
            with tf.device(device), tf.name_scope(f"output_on_{_task(device)}"):
                own = read[device]
                out = problem.normalise(tf, norm_weights(problem, own, "lnf"), h[device])
                logits = ops.dense(tf, out, tf.transpose(own["wte"]) if problem.tied
                                   else own["lm_head"])
                per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=targets[device], logits=logits)
                losses.append(tf.reduce_sum(per_token) / problem.sequence)
        with tf.device(home):
            loss = tf.add_n(losses, name="loss")
        train = problem.optimizer().minimize(loss, var_list=list(variables.values()),
                                             colocate_gradients_with_ops=True)
        init = tf.compat.v1.global_variables_initializer()
    return TrainGraph(graph, init, train, loss, (x, t), variables=list(variables.values()))


@takes_options(RunOptions)
def context_parallel(problem, cluster, *, ways: int | None = None, layout: Layout | None = None,
                     cut: str | None = None, attention: str = "ring", **options):
    """Train ``problem`` (a ``Transformer``) with its sequence cut ``ways`` ways over the first
    worker tasks, attention by ring attention or DeepSpeed-Ulysses (context parallelism).

    In [1]: run = train.context_parallel(train.transformer(sequence=64), cluster, ways=2,
       ...:                              cut="naive", trace_step=3)
    In [2]: run.trace.show()      # the last worker busy in attention, the first idle

    ``cut="naive"`` gives worker i the i-th of ``ways`` pieces; ``"zigzag"`` (ring attention's
    default) cuts 2 x ``ways`` pieces and gives worker i pieces i and 2 ways - 1 - i, which
    balances the causal mask's work (:func:`dtflab.train.layouts.ring.work`). The sequence
    must cut into equal pieces. ``attention="ulysses"`` swaps the pieces for groups of heads
    around attention (:mod:`~dtflab.train.graphs.ulysses`; naive cut, the heads and the
    key/value heads split over the ways or the latter copied onto them;
    ``split_bytes.ulysses_bytes``).
    ``layout=train.Layout(context=c)`` says the same as ``ways=c`` (2 when left out). The
    losses are ``train.single``'s up to float rounding. ``history.details["bytes_formula"]``
    holds what :func:`dtflab.train.formulas.split_bytes.context_parallel_bytes` says each
    worker sends per step;
    ``history.details["attention_work"]`` the query-key pairs each worker computes per block.
    """
    options = RunOptions(**options).checked()
    dense_only(problem, "context_parallel")
    with said_as(layout is not None, context="ways"):
        layout = Layout.given(layout, "context_parallel", {"context": 2}, context=ways)
        ways = layout.alone("context", "context_parallel")
        layout.without("context_parallel", micro_batches="runs the whole batch at once",
                       schedule="has no pipeline", zero="keeps whole copies")
    checks.one_of(attention, "attention", ATTENTION)
    cut = cut or ("zigzag" if attention == "ring" else "naive")
    checks.one_of(cut, "cut", ring.CUTS)
    _check_problem(problem, ways, cut, attention)
    enough_workers(cluster, ways, "ways", "each piece of the sequence runs on a worker task")
    devices, slow_devices = worker_devices(cluster, ways, options.slow)
    built = context_graph(problem, tuple(devices), cut, options.seed, slow_devices, attention)
    formula = (split_bytes.ulysses_bytes(problem, ways) if attention == "ulysses"
               else split_bytes.context_parallel_bytes(problem, ways, cut))
    name = (f"context parallel ({ways} ways, Ulysses)" if attention == "ulysses"
            else f"context parallel ({ways} ways, {cut})")
    return train_graph("context_parallel", name, built,
                       devices[0], problem, cluster, options, details={
                           "layout": layout,
                           "bytes_formula": {names.task(device): sent
                                             for device, sent in zip(devices, formula)},
                           "attention_work": {
                               names.task(device): pairs for device, pairs in
                               zip(devices, ring.work(cut, ways, problem.sequence))}
                           if attention == "ring" else {}})


def _check_problem(problem, ways: int, cut: str, attention: str = "ring") -> None:
    if not isinstance(problem, Transformer):
        raise ValueError(f"context_parallel: {problem.name} has no sequence; it cuts a "
                         f"transformer's, e.g. train.transformer()")
    if problem.recompute != "none" or problem.precision != "float32":
        raise ValueError(f"recompute={problem.recompute!r}, precision={problem.precision!r}: "
                         f"context parallelism runs float32 without recomputation; use "
                         f"train.transformer(recompute='none', precision='float32')")
    pieces = ways * (2 if cut == "zigzag" else 1)
    if problem.sequence % pieces:
        raise ValueError(f"ways={ways}, cut={cut!r}: {problem.name}'s sequence of "
                         f"{problem.sequence} does not cut into {pieces} equal pieces; use a "
                         f"sequence divisible by {pieces}, e.g. train.transformer(sequence="
                         f"{pieces * -(-problem.sequence // pieces)}, ...)")
    length = problem.sequence // pieces
    if attention == "ring" and problem.attention_block and length % problem.attention_block:
        raise ValueError(f"attention_block={problem.attention_block}: ring attention's pieces "
                         f"are {length} tokens ({problem.sequence} cut into {pieces}) and fused "
                         f"attention's tiles must cut each evenly; use train.transformer("
                         f"attention_block={math.gcd(length, problem.attention_block)}, ...)")
    if attention != "ulysses":
        return
    if cut != "naive":
        raise ValueError(f"cut={cut!r}: Ulysses attends whole sequences for each worker's heads, "
                         f"so its work is even without a zig-zag cut; use cut='naive' (or "
                         f"leave cut out)")
    if problem.heads % ways:
        raise ValueError(f"ways={ways}: Ulysses gives each worker heads/ways of "
                         f"{problem.name}'s {problem.heads} heads; use ways="
                         f"{max(k for k in range(1, ways + 1) if problem.heads % k == 0)}")
    kv = problem.kv_heads
    if kv % ways and ways % kv:
        raise ValueError(f"ways={ways}: {problem.name}'s {kv} key/value heads neither split over "
                         f"{ways} ways nor copy evenly onto them; use a divisor or a multiple "
                         f"of {kv}")


def _task(device: str) -> str:
    return names.task(device).replace(":", "")
