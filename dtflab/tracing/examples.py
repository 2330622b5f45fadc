"""Small graphs to trace: the source material's set-ups and a large generated one.

Each builder makes a fresh ``tf.Graph`` and returns a :class:`Built` with what a step needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dtflab._quiet import import_tf

EXP_LAYERS = (1, 16, 32, 1)  # the source material's MLP: 1 -> 16 -> 32 -> 1


@dataclass
class Built:
    graph: object
    init: object
    loss: object
    train: object
    feed: dict = field(default_factory=dict)
    variables: list = field(default_factory=list)


def exp_batch(size: int = 100, seed: int = 0):
    """x uniform in [0, 1) and t = exp(x), as float32 column vectors."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.random((size, 1), dtype=np.float32)
    return x, np.exp(x)


def _inputs(tf, seed):
    """A fresh graph with the seed set and the x, t placeholders; enter the graph yourself."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        x = tf.compat.v1.placeholder(tf.float32, [None, 1], name="x")
        t = tf.compat.v1.placeholder(tf.float32, [None, 1], name="t")
    return graph, x, t


def _mlp(tf, h, weights_device, biases_device, compute_device, prefix=""):
    for i in range(3):
        with tf.device(weights_device):
            w = tf.compat.v1.get_variable(f"w{i + 1}", [EXP_LAYERS[i], EXP_LAYERS[i + 1]])
        with tf.device(biases_device):
            b = tf.compat.v1.get_variable(f"b{i + 1}", [EXP_LAYERS[i + 1]],
                                          initializer=tf.compat.v1.zeros_initializer())
        with tf.device(compute_device), tf.name_scope(f"{prefix}layer{i + 1}"):
            h = tf.nn.leaky_relu(tf.matmul(h, w) + b, alpha=0.2)
    return h


def exp_regression(weights_device="/job:ps/task:0", biases_device="/job:ps/task:1",
                   compute_device="/job:master/task:0", batch: int = 100, seed: int = 0) -> Built:
    """y = exp(x) with the MLP 1-16-32-1, leaky ReLU 0.2, l2_loss, Adam (the 2016 set-up).

    Defaults are the source material's model-parallel placement: weights on ps:0, biases on
    ps:1 (its ``ps_``), all compute on master.
    """
    tf = import_tf()
    graph, x, t = _inputs(tf, seed)
    with graph.as_default():
        y = _mlp(tf, x, weights_device, biases_device, compute_device)
        with tf.device(compute_device):
            loss = tf.nn.l2_loss(y - t, name="loss")
            train = tf.compat.v1.train.AdamOptimizer().minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
        variables = tf.compat.v1.global_variables()
    xs, ts = exp_batch(batch, seed)
    return Built(graph, init, loss, train, {x: xs, t: ts}, variables)


def towers(workers: int = 2, ps_device="/job:ps/task:0", batch: int = 100, seed: int = 0) -> Built:
    """Synchronous data parallelism: one tower per worker on its slice of the batch, the
    gradients averaged on the ps and applied once (the multi-GPU CIFAR-10 pattern)."""
    tf = import_tf()
    graph, x, t = _inputs(tf, seed)
    with graph.as_default():
        optimizer = tf.compat.v1.train.AdamOptimizer()
        xs_split, ts_split = tf.split(x, workers), tf.split(t, workers)
        tower_grads, losses = [], []
        for i in range(workers):
            device = f"/job:worker/task:{i}"
            with tf.compat.v1.variable_scope("model", reuse=i > 0):
                y = _mlp(tf, xs_split[i], ps_device, ps_device, device, prefix=f"tower{i}/")
            with tf.device(device), tf.name_scope(f"tower{i}"):
                loss = tf.nn.l2_loss(y - ts_split[i])
                tower_grads.append(optimizer.compute_gradients(loss))
                losses.append(loss)
        with tf.device(ps_device), tf.name_scope("average"):
            averaged = [(tf.add_n([g for g, _ in pairs]) / workers, pairs[0][1])
                        for pairs in zip(*tower_grads)]
            train = optimizer.apply_gradients(averaged)
            loss = tf.add_n(losses, name="loss")
        init = tf.compat.v1.global_variables_initializer()
        variables = tf.compat.v1.global_variables()
    xs, ts = exp_batch(batch, seed)
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
            with tf.device(devices[i % len(devices)]), tf.compat.v1.variable_scope(f"block{i // 10}/layer{i}"):
                w = tf.compat.v1.get_variable("w", [width, width])
                b = tf.compat.v1.get_variable("b", [width], initializer=tf.compat.v1.zeros_initializer())
                h = tf.nn.tanh(tf.matmul(h, w) + b) * 0.9 + tf.reduce_mean(h) * 0.1
        with tf.device(devices[0]):
            loss = tf.reduce_mean(tf.square(h), name="loss")
            train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    import numpy as np

    return Built(graph, init, loss, train,
                 {x: np.random.default_rng(0).random((16, width), dtype=np.float32)})
