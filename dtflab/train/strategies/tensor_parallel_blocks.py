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
gradient to the k - 1 others (:func:`dtflab.train.formulas.costs.
transformer_tensor_parallel_bytes` counts them).

Under ``recompute="full"`` each worker recomputes its own half-blocks (its LayerNorm, its heads
or hidden units) from its copy of the residual stream, not the whole block.

Ops are named ``block{b}/attention_worker{j}/...``, ``block{b}/mlp_worker{j}/...`` and
``block{b}/{attention|mlp}_sum_on_worker{j}/...``.
"""

from __future__ import annotations

import numpy as np

from dtflab import names
from dtflab._quiet import import_tf
from dtflab.train.run.graphs import TrainGraph, straggler


def heads_per_worker(problem, ways: int, available: int) -> int:
    """How many of each block's heads a worker holds, if ``ways`` splits them evenly;
    ``available`` worker tasks only shape the suggestion."""
    if problem.heads % ways:
        fits = max(d for d in range(1, max(available, 1) + 1) if problem.heads % d == 0)
        raise ValueError(f"ways={ways}: {problem.name}'s {problem.heads} heads do not split into "
                         f"{ways} equal groups; use ways={fits}, or heads divisible by {ways}, "
                         f"e.g. train.transformer(heads={ways * max(1, problem.heads // ways)}, "
                         f"...)")
    return problem.heads // ways


def blocks_graph(problem, devices, seed: int, slow: dict | None = None) -> TrainGraph:
    """The tensor-parallel training step of a transformer (see the module's docstring) over
    ``devices``, worker 0 first. ``slow[device]`` seconds are slept on that worker each step
    before its first half-block: every sum waits for it."""
    tf = import_tf()
    slow = slow or {}
    k, home, d = len(devices), devices[0], problem.d_model
    heads = problem.heads // k
    initial = dict(problem.initial_values(seed))
    graph = tf.Graph()
    variables = {}

    def variable(name, value, device=home):
        with tf.device(device):
            variables[name] = tf.compat.v1.get_variable(name, initializer=value)
        return variables[name]

    def compute(v):  # a variable as the forward's type, read where the current scope is
        return problem.compute_view(v)

    def half_block(function):
        return problem.recomputed(function) if problem.recompute == "full" else function

    def shares(b, own, whole, streams, kind, norm, matrices, columns, rows, function):
        """Each worker's partial output of one half-block of block ``b``: ``function`` on its
        stream's LayerNorm ``norm``, with its ``columns(j)`` of the first of ``matrices`` and
        of its bias, and its ``rows(j)`` of the second."""
        first, bias, second = matrices
        partials = []
        for j, device in enumerate(devices):
            mine = [variable(f"h{b}_{first}_part{j}", own[first][:, columns(j)], device),
                    variable(f"h{b}_{bias}_part{j}", own[bias][columns(j)], device),
                    variable(f"h{b}_{second}_part{j}", own[second][rows(j), :], device)]
            with tf.device(device), tf.name_scope(f"block{b}/{kind}_worker{j}"):
                partials.append(half_block(function)(streams[device], *(compute(v) for v in (
                    whole[f"{norm}_scale"], whole[f"{norm}_bias"], *mine))))
        return partials

    def attention(h, scale, bias, qkv_w, qkv_b, proj_w):
        a = problem.layer_norm(tf, scale, bias, h, "ln1")
        return problem.attention(tf, a, qkv_w, qkv_b, proj_w, None, heads=heads)

    def mlp(h, scale, bias, fc_w, fc_b, out_w):
        m = problem.layer_norm(tf, scale, bias, h, "ln2")
        return problem.mlp(tf, m, fc_w, fc_b, out_w, None)

    width, hidden = heads * problem.head_size, 4 * d // k

    def heads_of(j):  # worker j's heads' columns of q (of k and v: d and 2d further)
        return np.arange(j * width, (j + 1) * width)

    def qkv_of(j):
        return np.concatenate([heads_of(j) + part * d for part in range(3)])

    def units_of(j):  # worker j's hidden units of the MLP
        return np.arange(j * hidden, (j + 1) * hidden)

    with graph.as_default():
        with tf.device(home):
            x, t = problem.placeholders()
            embedding = [variable(name, initial[name]) for name in problem.stage_parameters(1, 0)]
            h = problem.stage_forward(embedding, x, 1, 0)
        streams = {}  # device -> its copy of the residual stream
        for device in devices:
            with tf.device(device), tf.name_scope(f"input_on_{_task(device)}"):
                with tf.control_dependencies(straggler(slow, device)):
                    streams[device] = tf.identity(h, name="h")
        for b in range(1, problem.blocks + 1):
            own = {name[len(f"h{b}_"):]: value for name, value in initial.items()
                   if name.startswith(f"h{b}_")}
            whole = {name: variable(f"h{b}_{name}", own[name])
                     for name in ("ln1_scale", "ln1_bias", "proj_b", "ln2_scale", "ln2_bias",
                                  "out_b")}
            partials = shares(b, own, whole, streams, "attention", "ln1",
                              ("qkv_w", "qkv_b", "proj_w"), qkv_of, heads_of, attention)
            streams = _sums(tf, partials, whole["proj_b"], streams, devices, compute,
                            f"block{b}/attention")
            partials = shares(b, own, whole, streams, "mlp", "ln2", ("fc_w", "fc_b", "out_w"),
                              units_of, units_of, mlp)
            last = b == problem.blocks
            streams = _sums(tf, partials, whole["out_b"], streams,
                            [home] if last else devices, compute, f"block{b}/mlp")
        with tf.device(home):
            wanted = problem.stage_parameters(problem.blocks + 1, problem.blocks)
            output = [variables[name] if name in variables else variable(name, initial[name])
                      for name in wanted]
            loss = problem.loss(problem.stage_forward(output, streams[home], problem.blocks + 1,
                                                      problem.blocks), t)
        train = problem.optimizer().minimize(loss, var_list=list(variables.values()),
                                             colocate_gradients_with_ops=True)
        init = tf.compat.v1.global_variables_initializer()
    return TrainGraph(graph, init, train, loss, (x, t), variables=list(variables.values()))


def _sums(tf, partials, bias, streams, where, compute, scope):
    """Each device in ``where``'s residual stream plus the sum of ``partials`` and ``bias``."""
    summed = {}
    for device in where:
        with tf.device(device), tf.name_scope(f"{scope}_sum_on_{_task(device)}"):
            summed[device] = streams[device] + (tf.add_n(partials, name="sum") + compute(bias))
    return summed


def _task(device: str) -> str:
    return names.task(device).replace(":", "")
