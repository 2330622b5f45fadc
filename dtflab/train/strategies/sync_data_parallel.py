"""Synchronous data parallelism through a parameter server: a tower per worker on its slice of
each global batch, the gradients combined on the ps and applied once (2016's in-graph
replication)."""

from __future__ import annotations

from dtflab import checks, names
from dtflab._quiet import import_tf
from dtflab.train.layouts.layout import Layout, said_as
from dtflab.train.layouts.tasks import worker_devices
from dtflab.train.machinery.graphs import TrainGraph, Tower, straggler
from dtflab.train.machinery.options import RunOptions, takes_options
from dtflab.train.machinery.runner import new_runner
from dtflab.train.machinery.sessions import (batch_source, first_run_options, new_session, ps_plan,
                                       synchronous)


@takes_options(RunOptions)
def sync_data_parallel(problem, cluster, *, workers: int | None = None,
                       layout: Layout | None = None, gradient_bits: int = 32, **options):
    """A tower per worker on its slice of each global batch; gradients combined on the ps,
    applied once. A dead worker ends the run with a TaskError naming it. ``gradient_bits``
    16 or 8 sends gradients compressed (see sync_graph). ``workers`` (every worker task when
    left out), or ``layout=train.Layout(data=n)``: how many towers."""
    options = RunOptions(**options).checked()
    checks.one_of(gradient_bits, "gradient_bits", (32, 16, 8))
    with said_as(layout is not None, data="workers"):
        if layout is not None:  # else every worker task, or ``workers`` of them
            workers = Layout.given(layout, "sync_data_parallel", {}, data=workers).without(
                "sync_data_parallel", micro_batches="runs each tower's slice at once",
                zero="keeps the variables whole on the ps").alone("data", "sync_data_parallel")
        devices, slow_devices = worker_devices(cluster, workers, options.slow)
        layout = (layout or Layout(data=len(devices))).fits(problem)
    plan = ps_plan(cluster)
    seed, steps = options.seed, options.steps
    built = sync_graph(problem, plan, devices, seed, slow_devices, gradient_bits)
    session = new_session(cluster.target(*names.split(plan.compute)), built.graph)
    session.run(built.init, options=first_run_options())
    share = problem.batch_size // len(devices)
    runner = new_runner("sync", f"sync data parallel ({len(devices)} workers)", options,
                        problem=problem, cluster=cluster)
    runner.history.details["layout"] = layout
    if options.inputs is not None:
        runner.history.details["inputs"] = options.inputs

    batches = batch_source(problem, seed, options.inputs)

    def feeds(step):
        xs, ts = batches(step)
        feed = {}
        for i, tower in enumerate(built.towers):
            feed[tower.x], feed[tower.t] = xs[i * share:(i + 1) * share], ts[i * share:(i + 1) * share]
        return feed

    return synchronous(runner, steps, session, built, feeds, problem, cluster,
                       options.trace_step, options.background)


def _encode(tf, gradient, bits: int, device: str):
    """A gradient as it goes on the wire: float16, or int8 with one float32 scale."""
    with tf.device(device), tf.name_scope("encode"):
        if bits == 16:
            return tf.cast(gradient, tf.float16)
        scale = tf.maximum(tf.reduce_max(tf.abs(gradient)), 1e-12) / 127.0
        return tf.cast(tf.round(gradient / scale), tf.int8), scale


def _decode(tf, encoded, bits: int):
    if bits == 16:
        return tf.cast(encoded, tf.float32)
    quantized, scale = encoded
    return tf.cast(quantized, tf.float32) * scale


def sync_graph(problem, plan, workers: list[str], seed: int, slow: dict | None = None,
               gradient_bits: int = 32) -> TrainGraph:
    """A tower per worker on its slice of the batch; the towers' gradients are combined on
    the variables' devices and applied once.

    The loss sums over examples, so the full batch's gradient is the *sum* of the towers'
    gradients (their average times the number of towers): with the same seed and global batch
    this step equals the single-process step up to float rounding. ``gradient_bits`` 16 or 8
    sends each tower's gradients as float16, or as int8 scaled by their largest magnitude.
    """
    if gradient_bits not in (32, 16, 8):
        raise ValueError(f"gradient_bits must be 32, 16 or 8, got {gradient_bits!r}")
    tf = import_tf()
    graph = tf.Graph()
    with graph.as_default():
        with plan.scope():
            variables = problem.create_variables(seed)
        optimizer = problem.optimizer()
        towers, tower_grads = [], []
        for i, device in enumerate(workers):
            with tf.device(device), tf.name_scope(f"tower{i}"):
                x, t = problem.placeholders()
                with tf.control_dependencies(straggler(slow, device)):
                    loss = problem.loss(problem.forward(variables, x), t)
                tower_grads.append(tf.gradients(loss, variables))
            towers.append(Tower(device, x, t, loss))
        if gradient_bits != 32:  # encoded on each worker, decoded beside each variable
            tower_grads = [[_encode(tf, g, gradient_bits, device) for g in grads]
                           for grads, device in zip(tower_grads, workers)]
        combined = []
        for variable, grads in zip(variables, zip(*tower_grads)):
            with tf.device(variable.device), tf.name_scope("data_sum"):
                if gradient_bits != 32:
                    grads = [_decode(tf, g, gradient_bits) for g in grads]
                combined.append((tf.add_n(list(grads)), variable))
        with plan.scope():
            train = optimizer.apply_gradients(combined)
        loss = tf.add_n([tower.loss for tower in towers])
        init = tf.compat.v1.global_variables_initializer()
    return TrainGraph(graph, init, train, loss, (), towers, variables)
