"""Training graphs for each loop, built from a Problem (tf.compat.v1)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    from dtflab import tf_private

    tf = import_tf()
    dataset = tf.data.Dataset.from_tensors(0).repeat().apply(tf_private.data_sleep(int(seconds * 1e6)))
    return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def single_graph(problem, seed: int, device: str | None = None) -> TrainGraph:
    """Everything in one place (``device=None``: wherever the session runs)."""
    return _one_replica_graph(problem, seed, lambda tf: tf.device(device))


def model_parallel_graph(problem, plan, seed: int) -> TrainGraph:
    """Variables where ``plan`` puts them; every other op on ``plan.compute``."""
    return _one_replica_graph(problem, seed, lambda tf: plan.scope())


def _one_replica_graph(problem, seed: int, placement) -> TrainGraph:
    """One copy of the model built under ``placement(tf)``, a device context."""
    tf = import_tf()
    graph = tf.Graph()
    with graph.as_default(), placement(tf):
        x, t = problem.placeholders()
        variables = problem.create_variables(seed)
        loss = problem.loss(problem.forward(variables, x), t)
        train = problem.optimizer().minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    return TrainGraph(graph, init, train, loss, (x, t), variables=variables)


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
                waits = [delay_op(slow[device])] if slow and device in slow else []
                with tf.control_dependencies(waits):
                    loss = problem.loss(problem.forward(variables, x), t)
                tower_grads.append(tf.gradients(loss, variables))
            towers.append(Tower(device, x, t, loss))
        if gradient_bits != 32:  # encoded on each worker, decoded beside each variable
            tower_grads = [[_encode(tf, g, gradient_bits, device) for g in grads]
                           for grads, device in zip(tower_grads, workers)]
        combined = []
        for variable, grads in zip(variables, zip(*tower_grads)):
            with tf.device(variable.device), tf.name_scope("combine"):
                if gradient_bits != 32:
                    grads = [_decode(tf, g, gradient_bits) for g in grads]
                combined.append((tf.add_n(list(grads)), variable))
        with plan.scope():
            train = optimizer.apply_gradients(combined)
        loss = tf.add_n([tower.loss for tower in towers])
        init = tf.compat.v1.global_variables_initializer()
    return TrainGraph(graph, init, train, loss, (), towers, variables)


def async_graph(problem, plan, workers: list[str], seed: int, slow: dict | None = None, *,
                worker: int) -> TrainGraph:
    """Downpour: each worker reads the parameters, computes gradients on its own batch and
    applies them on the ps without waiting for the others.

    Staleness is exact: a global step on the ps counts applied updates; each worker reads it
    just before reading the parameters and gets its new value from its own increment, so
    ``after - before - 1`` updates by others landed in between.

    This builds worker ``worker``'s graph: its tower alone (between-graph replication, as
    each worker's program did in TF1). The variables, the global step, its lock and the
    optimizer's slots have the same names in every worker's graph, so the workers' sessions
    share them on the ps.
    """
    tf = import_tf()
    graph = tf.Graph()
    with graph.as_default():
        with plan.scope():
            variables = problem.create_variables(seed)
        with tf.device(variables[0].device):
            global_step = tf.compat.v1.get_variable(
                "global_step", initializer=tf.constant(0, tf.int64), trainable=False)
            # Add-then-read is two ops; without a lock two workers can read the same count.
            counter_lock = tf.CriticalSection(shared_name="dtflab_global_step_lock")

        def increment():
            with tf.control_dependencies([global_step.assign_add(1)]):
                return global_step.read_value()

        optimizer = problem.optimizer()
        towers = []
        for i, device in enumerate(workers):
            if i != worker:
                continue
            with tf.device(device), tf.name_scope(f"worker{i}"):
                x, t = problem.placeholders()
                before = global_step.read_value()
                waits = [delay_op(slow[device])] if slow and device in slow else []
                with tf.control_dependencies([before] + waits):
                    params = [tf.identity(v) for v in variables]  # this worker's read
                loss = problem.loss(problem.forward(params, x), t)
                grads = tf.gradients(loss, params)
            with tf.name_scope("apply"):  # the same in every worker's graph: Adam's beta powers
                apply = optimizer.apply_gradients(list(zip(grads, variables)))
                with tf.control_dependencies([apply]), tf.device(global_step.device):
                    after = counter_lock.execute(increment)
            towers.append(Tower(device, x, t, loss, run=after, fetch=(loss, before, after)))
        init = tf.compat.v1.global_variables_initializer()
    return TrainGraph(graph, init, None, None, (), towers, variables, global_step)
