"""Tensor parallelism as Megatron-LM splits an MLP (a transformer's blocks:
:mod:`~dtflab.train.graphs.tensor_parallel_blocks`): every pair of layers cut across k worker
tasks, the first matrix by columns and the second by rows, one sum of activations forward and
one of gradients backward per pair.

Pairs are layers ``(1, 2), (3, 4), ...`` from the input (:func:`dtflab.train.layouts.layers.
tensor_parallel_pairs`); an odd depth leaves the last layer, the output layer, whole on worker 0.
Worker j holds columns j of the pair's first weights and bias (``w1[:, j]``, ``b1[j]``), computes
its slice of the hidden activation and its activation function locally, multiplies that slice
by rows j of the second weights (``w2[j, :]``) and so holds a partial output; the k partial
outputs summed are the layer's output, before its bias, which is added once, after the sum.

The sum is an ``add_n`` in the one graph, placed where the sum is used. A pair followed by
another pair sums on every worker (each sends its partial output to the k - 1 others and adds
them in the same order: an all-reduce, all-to-all rather than a ring, since in one graph
TensorFlow sends a tensor once to each task that reads it). Backward, that all-reduce comes for
free: each worker's next pair reads its own copy of the sum, so the gradients of the copies are
partial, and ``tf.gradients`` adds them up on the task that made each partial output (the
gradient with respect to the next pair's input, summed). The last pair sums on worker 0 only,
where the loss is, and worker 0 sends the output's gradient back. For k = 2 each worker sends
one activation forward and one gradient back per pair, as a ring all-reduce would; for larger k
an all-to-all sends ``k - 1`` copies where a ring sends ``2 (k - 1) / k``
(:func:`dtflab.train.formulas.costs.tensor_parallel_bytes` counts them).

Ops are named ``pair{n}/worker{j}/...`` (a worker's slice of pair n) and ``pair{n}/sum_on_
worker{j}/...`` (the sum), so a traced step's transfers show where the sums sit.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtflab import names
from dtflab._quiet import import_tf
from dtflab.train.formulas import costs, split_bytes
from dtflab.train.layouts.layers import split_layers
from dtflab.train.layouts.layout import Layout, said_as
from dtflab.train.layouts.tasks import enough_workers, worker_devices
from dtflab.train.problems import Transformer
from dtflab.train.machinery.graphs import TrainGraph, straggler
from dtflab.train.machinery.options import RunOptions, takes_options
from dtflab.train.graphs.tensor_parallel_blocks import blocks_graph
from dtflab.train.machinery.sessions import train_graph
from dtflab.train.problems.experts import dense_only


@dataclass(frozen=True)
class Split:
    """Where a tensor-parallel model lives: slice j of every pair on ``devices[j]``; the batch,
    the loss, the layers in ``whole`` and the second bias of every pair on ``devices[0]``."""

    devices: tuple[str, ...]
    pairs: tuple[tuple[int, int], ...]
    whole: tuple[int, ...]

    @property
    def ways(self) -> int:
        return len(self.devices)


def tensor_parallel_graph(problem, split: Split, seed: int, slow: dict | None = None) -> TrainGraph:
    """The tensor-parallel training step (see the module's docstring). ``slow[device]``
    seconds are slept on that worker each step before its first slice (a slower machine: every
    sum waits for it)."""
    tf = import_tf()
    slow = slow or {}
    initial = dict(problem.initial_values(seed))
    home, k = split.devices[0], split.ways
    graph = tf.Graph()
    variables = []

    def variable(name, value, device):
        with tf.device(device):
            variables.append(tf.compat.v1.get_variable(name, initializer=value))
        return variables[-1]

    with graph.as_default():
        with tf.device(home):
            x, t = problem.placeholders()
        inputs = {}  # device -> the pair's input there
        for device in split.devices:  # the batch reaches each worker from worker 0
            scope = f"input_on_{names.task(device).replace(':', '')}"
            with tf.device(device), tf.name_scope(scope):
                with tf.control_dependencies(straggler(slow, device)):
                    inputs[device] = tf.identity(x, name="x")
        for number, (first, second) in enumerate(split.pairs, start=1):
            cut = problem.layers[first] // k
            partials = []
            for j, device in enumerate(split.devices):
                columns = slice(j * cut, (j + 1) * cut)
                w1 = variable(f"w{first}_part{j}", initial[f"w{first}"][:, columns], device)
                b1 = variable(f"b{first}_part{j}", initial[f"b{first}"][columns], device)
                w2 = variable(f"w{second}_part{j}", initial[f"w{second}"][columns, :], device)
                with tf.device(device), tf.name_scope(f"pair{number}/worker{j}"):
                    with tf.name_scope(f"layer{first}"):
                        hidden = problem.activate(tf.matmul(inputs[device], w1) + b1, first)
                    with tf.name_scope(f"layer{second}"):
                        partials.append(tf.matmul(hidden, w2, name="partial"))
            b2 = variable(f"b{second}", initial[f"b{second}"], home)
            with tf.device(home), tf.name_scope(f"pair{number}/bias"):
                bias = b2.read_value()
            last = number == len(split.pairs)
            inputs = {}
            for device in ([home] if last else split.devices):
                scope = f"pair{number}/sum_on_{names.task(device).replace(':', '')}"
                with tf.device(device), tf.name_scope(scope):
                    total = tf.add_n(partials, name="sum") + bias
                    inputs[device] = problem.activate(total, second)
        h = inputs[home]
        for layer in split.whole:
            w = variable(f"w{layer}", initial[f"w{layer}"], home)
            b = variable(f"b{layer}", initial[f"b{layer}"], home)
            with tf.device(home):
                h = problem.forward([w, b], h, first_layer=layer)
        with tf.device(home):
            loss = problem.loss(h, t)
        train = problem.optimizer().minimize(loss, var_list=variables,
                                             colocate_gradients_with_ops=True)
        init = tf.compat.v1.global_variables_initializer()
    return TrainGraph(graph, init, train, loss, (x, t), variables=variables)


@takes_options(RunOptions)
def tensor_parallel(problem, cluster, *, ways: int | None = None,
                    sequence_parallel: bool | None = None, layout: Layout | None = None,
                    **options):
    """Train ``problem`` with every layer pair of an MLP, or every block of a transformer,
    split ``ways`` ways over the first worker tasks (Megatron-style tensor parallelism).

    In [1]: run = train.tensor_parallel(train.classification(hidden_layers=3), cluster, ways=2,
       ...:                             trace_step=5, background=True)
    In [2]: run.wait().trace.show()      # step 5: the partial outputs crossing to the sums

    Layers 1 and 2, 3 and 4, ... are pairs (an odd depth leaves the output layer whole on
    worker:0); each pair's hidden width must split into ``ways`` equal slices. A transformer's
    heads split into ``ways`` equal groups, its MLP's hidden units too
    (:mod:`~dtflab.train.graphs.tensor_parallel_blocks`). The losses are
    ``train.single``'s up to float rounding (the partial outputs are summed in another order).
    ``history.details["bytes_formula"]`` holds what :func:`dtflab.train.formulas.costs.
    tensor_parallel_bytes` (a transformer: ``transformer_tensor_parallel_bytes``) says each
    worker sends per step; ``train.WireBytes`` counts it.
    ``sequence_parallel=True`` (a transformer's) also cuts what tensor parallelism leaves whole,
    the residual stream and the LayerNorms, along the sequence (Korthikanti et al. 2022): each
    sum becomes a reduce-scatter and each half-block's input an all-gather
    (``split_bytes.transformer_sequence_parallel_bytes``).
    ``layout=train.Layout(tensor=k, sequence_parallel=True)`` says the same as ``ways=k,
    sequence_parallel=True``, which build one (2 ways when left out).
    ``slow={"worker:1": 0.05}`` makes that worker sleep that long a step: every sum waits for
    it. A dead task ends the run with a TaskError naming it.
    """
    options = RunOptions(**options).checked()
    dense_only(problem, "tensor_parallel")
    with said_as(layout is not None, tensor="ways"):
        layout = Layout.given(layout, "tensor_parallel", {"tensor": 2}, tensor=ways,
                              sequence_parallel=sequence_parallel)
        ways = layout.alone("tensor", "tensor_parallel")
        layout.without("tensor_parallel", micro_batches="runs the whole batch at once",
                       schedule="has no pipeline", zero="keeps whole copies")
        enough_workers(cluster, ways, "ways", "each way runs on a worker task")
        layout.fits(problem)
    sequence_parallel = layout.sequence_parallel
    available = len(cluster.addresses["worker"])
    devices, slow_devices = worker_devices(cluster, ways, options.slow)
    if isinstance(problem, Transformer):
        built = blocks_graph(problem, tuple(devices), options.seed, slow_devices, sequence_parallel)
        split = Split(tuple(devices), (), ())
        formula = (split_bytes.transformer_sequence_parallel_bytes if sequence_parallel else
                   split_bytes.transformer_tensor_parallel_bytes)(ways, problem)
    else:
        pairs, whole = split_layers(problem, ways, available)
        split = Split(tuple(devices), pairs, whole)
        built = tensor_parallel_graph(problem, split, options.seed, slow_devices)
        formula = costs.tensor_parallel_bytes(ways, problem.batch_size, problem.layers)
    label = "tensor and sequence parallel" if sequence_parallel else "tensor parallel"
    return train_graph("tensor_parallel", f"{label} ({ways} ways)", built, devices[0], problem,
                       cluster, options, details={
                           "split": split, "layout": layout,
                           "bytes_formula": {names.task(device): sent
                                             for device, sent in zip(devices, formula)}})
