"""The matrix multiplies a built step really runs, counted from its graph: every ``MatMul`` and
``BatchMatMulV2`` that the fetched tensors depend on, at 2 FLOPs per multiply-add, from the
shapes TensorFlow inferred. It is what a formula of FLOPs is checked against.

Not TensorFlow's own profiler (``tf.compat.v1.profiler`` with ``float_operation()``): on TF 2.21
its count for ``BatchMatMulV2`` ignores ``adj_x``/``adj_y`` (measured: 8 times the true count
for a weight gradient of a [16, 32, 256] x [16, 32, 64] product), and it counts ops nothing
fetches (the gradient of a one-hot input). Elementwise ops (LayerNorm, softmax, GELU, Adam) are
left out: a few FLOPs per element.
"""

from __future__ import annotations

import math

MULTIPLIES = ("MatMul", "BatchMatMulV2", "BatchMatMul")


def needed(fetches) -> dict:
    """``{name: op}`` of every op ``fetches`` (tensors or ops of one graph) depend on, through
    data and control inputs, themselves included: what a session runs for them."""
    found, todo = {}, [getattr(f, "op", f) for f in fetches]
    while todo:
        op = todo.pop()
        if op.name in found:
            continue
        found[op.name] = op
        todo.extend(tensor.op for tensor in op.inputs)
        todo.extend(op.control_inputs)
    return found


def matmul_flops(fetches) -> int:
    """FLOPs of the matrix multiplies ``fetches`` (tensors or ops of one graph) depend on; every
    shape must be known (feed placeholders of a fixed batch)."""
    return sum(_flops(op) for op in needed(fetches).values() if op.type in MULTIPLIES)


def training_step(problem) -> int:
    """The matrix-multiply FLOPs per token of one training step of ``problem`` at its batch
    (its gradients, built with placeholders of a fixed batch)."""
    from dtflab._quiet import import_tf

    tf = import_tf()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.int32, [problem.batch_size, problem.sequence])
        t = tf.compat.v1.placeholder(tf.int64, [problem.batch_size, problem.sequence])
        variables = problem.create_variables(0)
        gradients = tf.gradients(problem.loss(problem.forward(variables, x), t), variables)
    return matmul_flops(gradients) // (problem.batch_size * problem.sequence)


def _flops(op) -> int:
    out = op.outputs[0].shape.as_list()
    a = op.inputs[0].shape.as_list()
    adjoint = op.get_attr("transpose_a") if op.type == "MatMul" else op.get_attr("adj_x")
    inner = a[-2] if adjoint else a[-1]
    if None in out or inner is None:
        raise ValueError(f"{op.name}: shape {out} not fully known; build the step with a fixed "
                         f"batch (placeholders of shape [batch, ...]) to count its FLOPs")
    return 2 * math.prod(out) * inner
