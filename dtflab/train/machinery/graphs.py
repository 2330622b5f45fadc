"""What every graph loop builds with: a TrainGraph, a tower per worker, a straggler's sleep, and
the order of a backward's multiplies. The graphs themselves are built from these parts in
``dtflab.train.graphs`` (one copy of the model: ``graphs.one_replica``) or in a loop's module."""

from __future__ import annotations

from dataclasses import dataclass, field

from dtflab import tf_private
from dtflab._quiet import import_tf


@dataclass
class TrainGraph:
    """A built graph: what to feed, what to run, what to fetch. ``towers`` has one entry per
    worker for data-parallel graphs (its placeholders, and for async its own ops)."""

    graph: object
    init: object
    train: object = None
    loss: object = None
    inputs: tuple = ()
    towers: list = field(default_factory=list)
    variables: list = field(default_factory=list)
    global_step: object = None  # async: the count of applied updates, on the ps
    reports: dict = field(default_factory=dict)  # name -> a tensor fetched with every step


@dataclass
class Tower:
    device: str
    x: object
    t: object
    loss: object
    run: object = None        # async: the op this worker runs each step
    fetch: object = None      # async: (loss, step read before, step after its write)


def delay_op(seconds: float):
    """An op that sleeps ``seconds`` on the device it is placed on, without spinning a core
    (a tf.data sleep, pulled once per run). Used for stragglers."""
    tf = import_tf()
    dataset = tf.data.Dataset.from_tensors(0).repeat().apply(tf_private.data_sleep(int(seconds * 1e6)))
    # tf.data would otherwise prefetch the next element in the background: a task with time
    # between two pulls (waiting on other tasks) then did not sleep at all (measured: 0.2 s
    # asked, 0.001 s slept).
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False
    return tf.compat.v1.data.make_one_shot_iterator(dataset.with_options(options)).get_next()


def straggler(slow: dict | None, device: str, after=(), share: float = 1.0) -> list:
    """What ``device``'s next op waits for: ``after`` (its previous work), then, if ``slow``
    names it, a sleep of ``slow[device] x share`` seconds on it (a slower machine; ops named
    ``straggler/...``). Use as ``tf.control_dependencies(straggler(slow, device))``."""
    if not slow or device not in slow:
        return list(after)
    tf = import_tf()
    with tf.control_dependencies(list(after)), tf.name_scope("straggler"):
        return [delay_op(slow[device] * share)]


def one_multiply_at_a_time(graph, scope: str) -> None:
    """Order the matrix multiplies of one backward: every gradient with respect to a layer's
    input first (the next stage back waits for it), then those with respect to the weights.

    ``tf.gradients`` leaves each layer's two multiplies side by side, and a task with more than
    one inter-op thread would run them at once: a stage would then use two cores, and a
    micro-batch's input gradient would leave later."""
    multiplies = [op for op in graph.get_operations()
                  if op.name.startswith(scope) and op.type == "MatMul"]
    # "MatMul_grad/MatMul" is the gradient of a layer's input, "MatMul_grad/MatMul_1" of its
    # weights (TensorFlow's MatMul gradient); tf.gradients builds layers last to first.
    inputs = [op for op in multiplies if op.name.endswith("MatMul_grad/MatMul")]
    weights = [op for op in multiplies if op.name.endswith("MatMul_grad/MatMul_1")]
    in_order(inputs + weights)


def in_order(ops) -> None:
    """Make each of ``ops`` wait for the one before it."""
    for before, op in zip(ops, ops[1:]):
        tf_private.run_after(op, before)
