"""One copy of the model in one graph: everything in one place (``single``), or the variables
where a placement plan puts them (``model_parallel``); each batch whole or in micro-batches
whose gradients are summed (gradient accumulation)."""

from __future__ import annotations

from dtflab._quiet import import_tf
from dtflab.train.machinery.graphs import TrainGraph


def single_graph(problem, seed: int, device: str | None = None,
                 micro_batches: int = 1) -> TrainGraph:
    """Everything in one place (``device=None``: wherever the session runs), each batch in
    ``micro_batches`` equal micro-batches (gradient accumulation)."""
    return _one_replica_graph(problem, seed, lambda tf: tf.device(device), micro_batches)


def model_parallel_graph(problem, plan, seed: int) -> TrainGraph:
    """Variables where ``plan`` puts them; every other op on ``plan.compute``."""
    return _one_replica_graph(problem, seed, lambda tf: plan.scope())


def _one_replica_graph(problem, seed: int, placement, micro_batches: int = 1) -> TrainGraph:
    """One copy of the model built under ``placement(tf)``, a device context."""
    tf = import_tf()
    graph = tf.Graph()
    with graph.as_default(), placement(tf):
        x, t = problem.placeholders()
        variables = problem.create_variables(seed)
        if micro_batches == 1:
            loss = problem.loss(problem.forward(variables, x), t)
            train = problem.optimizer().minimize(loss)
        else:
            optimizer = problem.optimizer()
            loss, gradients = accumulated(optimizer, problem, variables, x, t, micro_batches)
            train = optimizer.apply_gradients(zip(gradients, variables))
        init = tf.compat.v1.global_variables_initializer()
        reports = getattr(problem, "step_reports", dict)()
    return TrainGraph(graph, init, train, loss, (x, t), variables=variables, reports=reports)


def accumulated(optimizer, problem, variables, x, t, micro_batches: int):
    """The loss and gradients of the batch ``(x, t)`` as the sums of its ``micro_batches``
    equal slices', one slice at a time: each slice's forward waits for the previous slice's
    gradients, so one slice's activations are alive at once. A problem's loss sums over its
    examples, so the sums are the whole batch's loss and gradients (to float rounding).

    Ops: ``micro_batch<i>/...`` for each slice's forward and backward, ``accumulate/...`` for
    the running sums."""
    tf = import_tf()
    loss, sums = None, None
    for i, (xs, ts) in enumerate(zip(tf.split(x, micro_batches), tf.split(t, micro_batches))):
        with tf.name_scope(f"micro_batch{i + 1}"):
            # Only the slice waits, not every op: an op with control inputs is one Grappler
            # leaves alone, and the forward would keep more than one batch's forward does.
            with tf.control_dependencies(sums or []):
                xs, ts = tf.identity(xs), tf.identity(ts)
            part = problem.loss(problem.forward(variables, xs), ts)
            # As minimize computes them (each op's gradients gated together): with plain
            # tf.gradients the slice's forward kept a different set of buffers from run to run.
            gradients = [g for g, _ in optimizer.compute_gradients(part, variables)]
        if sums is None:
            loss, sums = part, gradients
            continue
        with tf.name_scope("accumulate"):
            loss = loss + part
            sums = [total + g for total, g in zip(sums, gradients)]
    return loss, sums
