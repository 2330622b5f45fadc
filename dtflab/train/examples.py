"""Graphs to trace one step of: the source material's set-ups, built from the same 2016 model
the training loops train (``train.exp_regression()``: 1-16-32-1, leaky ReLU 0.2, l2_loss,
Adam), and a large generated one.

Each builder makes a fresh ``tf.Graph`` and returns a :class:`Built` with what a step needs:

In [1]: built = dtflab.train.examples.exp_regression()   # weights on ps:0, biases on ps:1
In [2]: dtflab.trace(session, built.train, built.feed)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dtflab._quiet import import_tf
from dtflab.placement import PlacementPlan
from dtflab.train import problems
from dtflab.train.graphs import one_replica


@dataclass
class Built:
    graph: object
    init: object
    loss: object
    train: object
    feed: dict = field(default_factory=dict)
    variables: list = field(default_factory=list)


def exp_regression(weights_device="/job:ps/task:0", biases_device="/job:ps/task:1",
                   compute_device="/job:master/task:0", batch: int = 100, seed: int = 0) -> Built:
    """The 2016 model's training step with the source material's model-parallel placement:
    weights on ps:0, biases on ps:1 (its ``ps_``), all compute on master (the defaults)."""
    problem = problems.exp_regression(batch)
    plan = PlacementPlan(devices=[weights_device, biases_device, compute_device],
                         compute=compute_device)
    plan.assign("w*", weights_device).assign("b*", biases_device)
    built = one_replica.model_parallel_graph(problem, plan, seed)
    (x, t), (xs, ts) = built.inputs, problem.batch(0, seed)
    return Built(built.graph, built.init, built.loss, built.train, {x: xs, t: ts}, built.variables)


def towers(workers: int = 2, ps_device="/job:ps/task:0", batch: int = 100, seed: int = 0) -> Built:
    """Synchronous data parallelism as the source material wrote it: one fed batch split into
    a tower per worker, the variables on the ps, the towers' gradients averaged there and
    applied once (the multi-GPU CIFAR-10 pattern; ``train.sync_data_parallel`` feeds each tower
    its own slice instead)."""
    tf = import_tf()
    problem = problems.exp_regression(batch)
    graph = tf.Graph()
    with graph.as_default():
        x, t = problem.placeholders()
        with tf.device(ps_device):
            variables = problem.create_variables(seed)
        optimizer = problem.optimizer()
        xs_split, ts_split = tf.split(x, workers), tf.split(t, workers)
        tower_grads, losses = [], []
        for i in range(workers):
            with tf.device(f"/job:worker/task:{i}"), tf.name_scope(f"tower{i}"):
                loss = problem.loss(problem.forward(variables, xs_split[i]), ts_split[i])
                tower_grads.append(optimizer.compute_gradients(loss, variables))
                losses.append(loss)
        with tf.device(ps_device), tf.name_scope("average"):
            averaged = [(tf.add_n([g for g, _ in pairs]) / workers, pairs[0][1])
                        for pairs in zip(*tower_grads)]
            train = optimizer.apply_gradients(averaged)
            loss = tf.add_n(losses, name="loss")
        init = tf.compat.v1.global_variables_initializer()
    xs, ts = problem.batch(0, seed)
    return Built(graph, init, loss, train, {x: xs, t: ts}, variables)


def deep_chain(devices, layers: int = 120, width: int = 8) -> Built:
    """A generated graph of 1,000+ ops: ``layers`` small dense layers, each on the next device
    in turn, so activations cross devices at every layer. For scale tests of the views."""
    tf = import_tf()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, width], name="x")
        h = x
        for i in range(layers):
            with (tf.device(devices[i % len(devices)]),
                  tf.compat.v1.variable_scope(f"block{i // 10}/layer{i}")):
                w = tf.compat.v1.get_variable("w", [width, width])
                b = tf.compat.v1.get_variable("b", [width],
                                              initializer=tf.compat.v1.zeros_initializer())
                h = tf.nn.tanh(tf.matmul(h, w) + b) * 0.9 + tf.reduce_mean(h) * 0.1
        with tf.device(devices[0]):
            loss = tf.reduce_mean(tf.square(h), name="loss")
            train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    import numpy as np

    return Built(graph, init, loss, train,
                 {x: np.random.default_rng(0).random((16, width), dtype=np.float32)})
