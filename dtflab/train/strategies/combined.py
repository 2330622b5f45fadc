"""The forms combined on one layout: data x tensor x pipeline (Megatron's "3D"), each rank a
worker task as :class:`~dtflab.train.layouts.layout.Layout` numbers them.

Each data replica d trains on its slice of the global batch with its own copy of the model,
built by :func:`~dtflab.train.graphs.tensor_parallel_blocks.blocks_loss`: its blocks cut
into ``pipeline`` stages of whole blocks, each stage's blocks split over that stage's tensor
group (Megatron's block: heads and hidden units). A stage hands the stream to the next from
each tensor rank to the same rank of the next stage. Then the data axis: each variable's
gradient is summed over the replicas' copies, on every replica (each sends its gradient to the
D - 1 others: all pairs, as the tensor sums), and each replica applies Adam to its own copy;
copies that start equal stay equal.

The pipeline has one micro-batch: stage after stage, no overlap (the schedules are
``train.pipeline``'s); it shows what the pipeline axis sends, not its bubble. Worker 0 holds the
batch and sends each replica its slice; the targets go on to the replica's last stage.
Context parallelism is ``train.context_parallel``'s, not combined here yet.

Ops and variables are named ``replica{d}/...``, so a traced step shows whose they are.
"""

from __future__ import annotations

from dtflab._quiet import import_tf
from dtflab.train.formulas import split_bytes
from dtflab.train.layouts.layers import layer_ranges
from dtflab.train.layouts.layout import Layout
from dtflab.train.problems import Transformer
from dtflab.train.machinery.graphs import TrainGraph
from dtflab.train.machinery.options import RunOptions, takes_options
from dtflab.train.machinery.sessions import train_graph
from dtflab.train.graphs.tensor_parallel_blocks import blocks_loss
from dtflab.train.problems.experts import dense_only


def combined_graph(problem, layout: Layout, devices, seed: int, ranges) -> TrainGraph:
    """The training step over ``devices`` (rank r's at ``devices[r]``; see the module's
    docstring), stage p holding blocks ``ranges[p]`` (1-based, inclusive)."""
    tf = import_tf()
    D, T = layout.data, layout.tensor
    initial = dict(problem.initial_values(seed))
    per = problem.batch_size // D
    graph = tf.Graph()
    with graph.as_default():
        with tf.device(devices[0]):
            x, t = problem.placeholders()
        losses, copies = [], []
        for d in range(D):
            stages = [(tuple(devices[layout.rank(data=d, pipeline=p, tensor=j)] for j in range(T)),
                       first, last) for p, (first, last) in enumerate(ranges)]
            with tf.device(devices[0]), tf.name_scope(f"batch_for_replica{d}"):
                mine = [ids[d * per:(d + 1) * per] for ids in (x, t)]
            with tf.device(stages[0][0][0]), tf.name_scope(f"replica{d}/batch"):
                tokens, targets = (tf.identity(ids) for ids in mine)
            with tf.device(stages[-1][0][0]), tf.name_scope(f"replica{d}/targets"):
                targets = tf.identity(targets)
            with tf.compat.v1.variable_scope(f"replica{d}"), tf.name_scope(f"replica{d}"):
                loss, variables = blocks_loss(problem, tokens, targets, stages, initial)
            losses.append(loss)
            copies.append(variables)
        with tf.device(devices[0]):
            loss = tf.add_n(losses, name="loss")
        order = list(copies[0])
        every = [copies[d][name] for d in range(D) for name in order]
        gradients = dict(zip(((d, name) for d in range(D) for name in order),
                             tf.compat.v1.gradients(loss, every,
                                                    colocate_gradients_with_ops=True)))
        pairs = []
        for d in range(D):
            for name in order:
                variable = copies[d][name]
                with tf.device(variable.device), tf.name_scope(f"replica{d}/data_sum"):
                    total = (tf.add_n([gradients[e, name] for e in range(D)]) if D > 1 else
                             gradients[d, name])
                pairs.append((total, variable))
        train = problem.optimizer().apply_gradients(pairs)
        init = tf.compat.v1.global_variables_initializer()
    return TrainGraph(graph, init, train, loss, (x, t), variables=every)


@takes_options(RunOptions)
def combined(problem, cluster, layout: Layout, **options):
    """Train ``problem`` (a ``Transformer``) on ``layout``'s data, tensor and pipeline ways at
    once, rank r on ``worker:r`` (see the module's docstring).

    In [1]: layout = train.Layout(data=2, tensor=2, pipeline=2)
    In [2]: wire = train.WireBytes()
    In [3]: run = train.combined(train.transformer(), cluster, layout, callbacks=[wire])
    In [4]: layout.axis_bytes(wire.per_step.sent)   # bytes per step on each axis's links

    The losses are ``train.single``'s on the whole batch up to float rounding.
    ``history.details["bytes_formula"]`` holds :func:`dtflab.train.formulas.split_bytes.
    combined_bytes`: each axis's bytes per step, every link both ways.
    """
    options = RunOptions(**options).checked().without("combined", slow="has no straggler yet")
    dense_only(problem, "combined")
    layout = Layout.given(layout, "combined", {"data": 2, "tensor": 2})
    if not isinstance(problem, Transformer):
        raise ValueError(f"combined: {problem.name} is not a transformer; it combines a "
                         f"transformer's forms, e.g. train.transformer()")
    layout.without("combined", context="does not cut the sequence yet (train.context_parallel "
                   "does, alone)", expert="trains a dense model",
                   micro_batches="runs one micro-batch a step (train.pipeline has schedules)",
                   schedule="runs one micro-batch a step", zero="keeps whole copies on each "
                   "replica (train.zero shards them)", sequence_parallel="does not cut the "
                   "sequence yet").fits(problem)
    devices = layout.tasks(cluster)
    ranges = layer_ranges(problem, layout.pipeline)  # the pipeline's cut, balanced by work
    built = combined_graph(problem, layout, devices, options.seed, ranges)
    return train_graph("combined", f"combined ({layout})", built, devices[0], problem, cluster,
                       options, details={
                           "layout": layout, "stages": ranges,
                           "bytes_formula": split_bytes.combined_bytes(problem, layout)})

