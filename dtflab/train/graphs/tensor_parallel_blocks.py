"""Tensor parallelism as Megatron-LM splits a transformer block: the attention's heads and the
MLP's hidden units cut across k worker tasks, one sum of activations forward and one of
gradients backward after each half of a block.

Worker j holds, of every block, the query, key and value columns of heads ``j x heads / k`` to
``(j + 1) x heads / k - 1`` (``qkv_w[:, q|k|v columns]`` and their biases) and the same rows
of the projection (``proj_w[rows, :]``), so it computes those heads' attention alone and a
partial projection; it holds the MLP's columns ``j`` of the first matrix and rows ``j`` of the
second, as :mod:`~dtflab.train.strategies.tensor_parallel` splits an MLP's pair. The k partial
outputs summed are the half-block's output, before its bias, which is added once, after the sum.

What Megatron replicates, worker 0 holds once and lends: the embeddings, every LayerNorm's
scale and bias, the two output biases, the final LayerNorm and the output layer. Each worker
computes the LayerNorms on its own copy of the residual stream (a copy per worker, as
Megatron's). Every sum is an ``add_n`` on every worker (all-to-all, as the MLP's sums: in one
graph a tensor is sent once to each task that reads it), except the last block's MLP, which
sums on worker 0 only, where the loss is; backward, each worker's copy of a sum sends its
gradient to the k - 1 others (:func:`dtflab.train.formulas.split_bytes.
transformer_tensor_parallel_bytes` counts them).

Under ``recompute="full"`` each worker recomputes its own half-blocks (its LayerNorm, its heads
or hidden units) from its copy of the residual stream, not the whole block.

**Sequence parallelism** (``sequence_parallel=True``; Korthikanti et al. 2022, Megatron's
``--sequence-parallel``) cuts what the above leaves whole on every worker, the residual stream
and the LayerNorms, along the sequence: worker j holds positions ``j x s / k`` to
``(j + 1) x s / k - 1`` of the stream, normalises its piece, and the k normalised pieces are
gathered on every worker for its heads or hidden units (an all-gather); each worker cuts its
partial output where it made it and sends piece j to worker j, which sums the k pieces onto
its piece of the stream (a reduce-scatter). LayerNorm works per position, so nothing else
changes. Worker 0 cuts the embedded batch for the others and gathers the last block's pieces
for the final LayerNorm and the loss. What the matrix multiply after a gather keeps for the
backward is the gathered input, whole: Megatron gathers it again in the backward instead,
which one graph, where a tensor crosses once a step, does not do
(:func:`dtflab.train.formulas.memory.split_activation_bytes` counts it).

Ops are named ``block{b}/attention_worker{j}/...``, ``block{b}/mlp_worker{j}/...`` and
``block{b}/{attention|mlp}_sum_on_worker{j}/...``; under sequence parallelism also
``block{b}/{ln1|ln2}_on_worker{j}`` (a piece's LayerNorm), ``..._gathered_on_worker{j}`` and
``block{b}/{attention|mlp}_pieces_of_worker{j}`` (a partial output cut for the scatter).
"""

from __future__ import annotations

import numpy as np

from dtflab import names
from dtflab._quiet import import_tf
from dtflab.train.problems.transformer_block import norm_parts, norm_weights
from dtflab.train.machinery.graphs import TrainGraph, straggler


def blocks_graph(problem, devices, seed: int, slow: dict | None = None,
                 sequence_parallel: bool = False) -> TrainGraph:
    """The tensor-parallel training step of a transformer (see the module's docstring) over
    ``devices``, worker 0 first. ``slow[device]`` seconds are slept on that worker each step
    before its first half-block: every sum waits for it. ``sequence_parallel`` keeps the
    residual stream and the LayerNorms cut along the sequence (see the module's docstring)."""
    tf = import_tf()
    graph = tf.Graph()
    with graph.as_default():
        with tf.device(devices[0]):
            x, t = problem.placeholders()
        loss, variables = blocks_loss(problem, x, t, [(tuple(devices), 1, problem.blocks)],
                                      dict(problem.initial_values(seed)), slow,
                                      sequence_parallel)
        train = problem.optimizer().minimize(loss, var_list=list(variables.values()),
                                             colocate_gradients_with_ops=True)
        init = tf.compat.v1.global_variables_initializer()
    return TrainGraph(graph, init, train, loss, (x, t), variables=list(variables.values()))


def blocks_loss(problem, x, t, stages, initial: dict, slow: dict | None = None,
                sequence_parallel: bool = False):
    """One copy of the model's loss on tokens ``x`` and targets ``t``, built in the current
    graph: ``stages`` is ``[(devices, first block, last block), ...]``, each stage's blocks
    split over its devices (a tensor group, its worker 0 first), the stages in order (a
    pipeline; each device hands its copy of the stream to the device at its place in the next
    stage). Returns the loss (on the last stage's worker 0) and ``{name: variable}``, the
    variables made with ``initial``'s values in the current variable scope: the embeddings on
    the first stage's worker 0, each block's LayerNorms and output biases on its stage's."""
    tf = import_tf()
    slow = slow or {}
    k, d = len(stages[0][0]), problem.d_model
    heads, kv_heads = problem.heads // k, max(problem.kv_heads // k, 1)
    # the workers a key/value head is copied on (0: the heads are split)
    copies = k // problem.kv_heads if k > problem.kv_heads else 0
    variables = {}

    def variable(name, value, device):
        with tf.device(device):
            variables[name] = tf.compat.v1.get_variable(name, initializer=value)
        return variables[name]

    def compute(v):  # a variable as the forward's type, read where the current scope is
        return problem.compute_view(v)

    def half_block(function):
        return problem.recomputed(function) if problem.recompute == "full" else function

    def inputs(b, devices, streams, norm, whole):
        """Each worker's input to a half-block of block ``b`` and the LayerNorm's scale and
        bias, which the half-block applies; under sequence parallelism, each piece's LayerNorm
        ``norm``, gathered, and no scale or bias."""
        scale_bias = norm_weights(problem, whole, norm)
        if not sequence_parallel:
            return streams, scale_bias
        pieces, gathered = {}, {}
        for device in devices:
            with tf.device(device), tf.name_scope(f"block{b}/{norm}_on_{_task(device)}"):
                pieces[device] = half_block(lambda h, *weights: problem.normalise(
                    tf, list(weights), h, norm))(streams[device], *map(compute, scale_bias))
        for device in devices:
            with tf.device(device), tf.name_scope(f"block{b}/{norm}_gathered_on_{_task(device)}"):
                gathered[device] = tf.concat([pieces[other] for other in devices], axis=1)
        return gathered, []

    def shares(b, devices, own, inputs_and_norm, kind, matrices, columns, rows, core):
        """Each worker's partial output of one half-block of block ``b``: ``core`` on its
        input (normalised first where the LayerNorm's scale and bias come with it), with its
        ``columns(j)`` of the first of ``matrices`` and of its bias, and its ``rows(j)`` of the
        second."""
        (inputs, norm), (first, bias, second) = inputs_and_norm, matrices

        def function(h, *weights):
            if norm:
                h = problem.normalise(tf, list(weights[:len(norm)]), h,
                                      f"ln{1 + (kind == 'mlp')}")
            return core(h, *weights[len(norm):])

        partials = []
        for j, device in enumerate(devices):
            mine = [variable(f"h{b}_{first}_part{j}", own[first][:, columns(j)], device),
                    variable(f"h{b}_{bias}_part{j}", own[bias][columns(j)], device),
                    variable(f"h{b}_{second}_part{j}", own[second][rows(j), :], device)]
            with tf.device(device), tf.name_scope(f"block{b}/{kind}_worker{j}"):
                weights = [compute(v) for v in (*norm, *mine)]
                if kind == "attention" and copies:  # its key/value head, lent by its owner
                    weights += [compute(v) for v in lent_keys(b, j, devices, own)]
                partials.append(half_block(function)(inputs[device], *weights))
        return partials

    def lent_keys(b, j, devices, own):
        """Where the tensor ways outnumber the key/value heads, worker j's head's key and value
        columns of ``qkv_w`` and ``qkv_b``: one variable a head, on the first of the workers
        that copy it; the others read it, and their gradients are summed into it (Megatron
        keeps a copy each and sums their gradients)."""
        g = j // copies
        owner = devices[g * copies]
        columns = np.concatenate([problem.heads * size + g * size + np.arange(size) + part
                                  * problem.kv_heads * size for part in range(2)])
        found = []
        for name, value in (("qkv_w", own["qkv_w"][:, columns]), ("qkv_b", own["qkv_b"][columns])):
            name = f"h{b}_{name}_keys{g}"
            found.append(variables[name] if name in variables else variable(name, value, owner))
        return found

    def attention(a, qkv_w, qkv_b, proj_w, *lent):
        if lent:  # the query columns, then the lent key/value head's
            qkv_w, qkv_b = [qkv_w, lent[0]], [qkv_b, lent[1]]
        return problem.attention(tf, a, qkv_w, qkv_b, proj_w, None, heads=heads,
                                 kv_heads=kv_heads)

    def mlp(m, fc_w, fc_b, out_w):
        return problem.mlp(tf, m, fc_w, fc_b, out_w, None)

    def summed(partials, bias, devices, streams, where, scope):
        if sequence_parallel:
            return _scattered_sums(tf, partials, bias, streams, devices, compute, scope)
        return _sums(tf, partials, bias, streams, where, compute, scope)

    size = problem.head_size
    width, hidden = heads * size, problem.hidden // k

    def heads_of(j):  # worker j's query heads' columns of q
        return np.arange(j * width, (j + 1) * width)

    def qkv_of(j):  # and of its key and value heads, after the d of q (lent where copied)
        if copies:
            return heads_of(j)
        keys = problem.heads * size + np.arange(j * kv_heads * size, (j + 1) * kv_heads * size)
        return np.concatenate([heads_of(j), keys, keys + problem.kv_heads * size])

    def units_of(j):  # worker j's hidden units of the MLP
        return np.arange(j * hidden, (j + 1) * hidden)

    def gates_of(j):  # and its columns of the first matrix: SwiGLU's of gate and of up
        gates = 2 if problem.activation == "swiglu" else 1
        return np.concatenate([units_of(j) + part * problem.hidden for part in range(gates)])

    first_home, last_home = stages[0][0][0], stages[-1][0][0]
    with tf.device(first_home):
        embedding = [variable(name, initial[name], first_home)
                     for name in problem.stage_parameters(1, 0)]
        h = problem.stage_forward(embedding, x, 1, 0)
    streams = {first_home: h}  # device -> its copy of the residual stream, or its piece of it
    for s, (devices, first, last) in enumerate(stages):
        home, before = devices[0], list(streams)
        arrived = {}
        for j, device in enumerate(devices):
            if s == 0 and sequence_parallel:
                with tf.device(home), tf.name_scope(f"input_for_{_task(device)}"):
                    handed = _piece(h, j, k)
            else:  # the whole input from worker 0, or from this place in the stage before
                handed = streams[before[j] if s else home]
            with tf.device(device), tf.name_scope(f"input_on_{_task(device)}"):
                with tf.control_dependencies(straggler(slow, device)):
                    arrived[device] = tf.identity(handed, name="h")
        streams = arrived
        for b in range(first, last + 1):
            own = {name[len(f"h{b}_"):]: value for name, value in initial.items()
                   if name.startswith(f"h{b}_")}
            whole = {name: variable(f"h{b}_{name}", own[name], home)
                     for name in (*(f"ln{n}_{part}" for n in (1, 2) for part in
                                    norm_parts(problem)), "proj_b", "out_b")}
            partials = shares(b, devices, own, inputs(b, devices, streams, "ln1", whole),
                              "attention", ("qkv_w", "qkv_b", "proj_w"), qkv_of, heads_of,
                              attention)
            streams = summed(partials, whole["proj_b"], devices, streams, devices,
                             f"block{b}/attention")
            partials = shares(b, devices, own, inputs(b, devices, streams, "ln2", whole), "mlp",
                              ("fc_w", "fc_b", "out_w"), gates_of, units_of, mlp)
            final = b == problem.blocks and not sequence_parallel
            streams = summed(partials, whole["out_b"], devices, streams,
                             [home] if final else devices, f"block{b}/mlp")
    with tf.device(last_home):
        if sequence_parallel:
            with tf.name_scope("gathered_on_worker0"):
                streams[last_home] = tf.concat(list(streams.values()), axis=1)
        wanted = problem.stage_parameters(problem.blocks + 1, problem.blocks)
        output = [variables[name] if name in variables else variable(name, initial[name],
                                                                      last_home)
                  for name in wanted]
        loss = problem.loss(problem.stage_forward(output, streams[last_home], problem.blocks + 1,
                                                  problem.blocks), t)
    return loss, variables


def _piece(h, j: int, k: int):
    """Piece ``j`` of ``k`` of ``h`` ([batch, sequence, d]) along the sequence."""
    size = h.shape[1] // k
    return h[:, j * size:(j + 1) * size]


def _scattered_sums(tf, partials, bias, pieces, devices, compute, scope):
    """Sequence parallelism's reduce-scatter: each device's piece of the residual stream plus
    its piece of the sum of ``partials`` and ``bias``; each partial is cut where it was made, so
    only the piece another device sums crosses to it."""
    k = len(devices)
    cut = [[None] * k for _ in partials]
    for i, (device, partial) in enumerate(zip(devices, partials)):
        with tf.device(device), tf.name_scope(f"{scope}_pieces_of_{_task(device)}"):
            cut[i] = [_piece(partial, j, k) for j in range(k)]
    summed = {}
    for j, device in enumerate(devices):
        with tf.device(device), tf.name_scope(f"{scope}_sum_on_{_task(device)}"):
            summed[device] = pieces[device] + (tf.add_n([row[j] for row in cut], name="sum")
                                               + compute(bias))
    return summed


def _sums(tf, partials, bias, streams, where, compute, scope):
    """Each device in ``where``'s residual stream plus the sum of ``partials`` and ``bias``."""
    summed = {}
    for device in where:
        with tf.device(device), tf.name_scope(f"{scope}_sum_on_{_task(device)}"):
            summed[device] = streams[device] + (tf.add_n(partials, name="sum") + compute(bias))
    return summed


def _task(device: str) -> str:
    return names.task(device).replace(":", "")
