"""TF2's ParameterServerStrategy + ClusterCoordinator on a dtflab cluster.

This process is the coordinator (the ``chief``); the cluster's ``worker`` tasks run the steps
and its ``ps`` tasks hold the variables. The task servers need
``inter_op_parallelism_threads >= workers + 1`` or steps hang on small machines: dtflab's
clusters start with tasks + 1 (see Cluster.inter_op_threads).
"""

from __future__ import annotations

import os

from dtflab._quiet import import_tf, quiet_fds
from dtflab.cluster.ports import free_ports
from dtflab.train.machinery.options import RunOptions, takes_options
from dtflab.train.machinery.runner import Update, new_runner

#: Distinct batches shipped to the workers (a tf.data pipeline of them, repeated).
DATA_BATCHES = 8


def strategy_for(cluster, **options):
    """A ParameterServerStrategy over ``cluster`` with this process as its coordinator (the
    ``chief``); ``options`` go to the strategy as they are, e.g.
    ``variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(...)``.

    In [1]: strategy = train.strategy_for(cluster)
    In [2]: with strategy.scope(): model = tf.keras.Sequential([...]); model.compile(...)
    In [3]: model.fit(dataset, epochs=5, steps_per_epoch=20)   # Keras 2: see README
    """
    tf = import_tf()
    for job in ("worker", "ps"):
        if job not in cluster.addresses:
            raise ValueError(f"ParameterServerStrategy needs 'worker' and 'ps' jobs; this cluster "
                             f"has: {', '.join(cluster.addresses)}; start one with --ps 1 --workers 2")
    check_keras()
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")  # what TF recommends for it
    (port,) = free_ports(1)
    cluster.let_tasks_reach(port)
    spec = dict(cluster.addresses, chief=[cluster.callback_address(port)])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    with quiet_fds():
        try:
            return tf.distribute.experimental.ParameterServerStrategy(resolver, **options)
        except TypeError as exc:
            raise TypeError(f"{exc}; strategy_for passes its keyword options to "
                            f"tf.distribute.ParameterServerStrategy, which takes "
                            f"variable_partitioner") from None


def check_keras() -> None:
    """Warn when ``tf.keras`` in this process has been loaded as Keras 3 (it breaks TF's
    strategies). Reads TensorFlow's lazy loader without loading Keras."""
    import sys
    import warnings

    loader = getattr(sys.modules.get("tensorflow"), "__dict__", {}).get("keras")
    loaded = getattr(loader, "__dict__", {})
    if loaded.get("_tfll_initialized") and loaded.get("_tfll_keras_version") == "keras_3":
        warnings.warn("tf.keras is Keras 3 in this process (it was loaded before dtflab set "
                      "TF_USE_LEGACY_KERAS=1, or that was set to 0): model.fit under TF's "
                      "strategies fails with it. Restart the kernel and import dtflab before "
                      "using tf.keras.", stacklevel=3)


@takes_options(RunOptions)
def ps_strategy(problem, cluster, *, strategy=None, **options):
    """Train with ``ClusterCoordinator.schedule``: each step goes to whichever worker is free.

    The loss of each step comes back as a RemoteValue, read as steps complete. Staleness is
    not measured here (TensorFlow does not expose which update a worker read). The watchdog
    reports a stalled step here but cannot end it (the coordinator owns the workers' calls).
    """
    from dtflab import checks

    options = RunOptions(**options).checked().without(
        "ps_strategy", slow="has no straggler (the coordinator sends each step to a free "
        "worker)", trace_step="traces no step (its steps are TF2 functions: dtflab.profile)",
        predict="is not priced from its graph (its steps are TF2 functions)",
        inputs="keeps its batches in a TF2 dataset of its own")
    seed = options.seed
    checks.cluster(cluster)
    tf = import_tf()
    strategy = strategy or strategy_for(cluster)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        variables = _variables(problem, seed)
        optimizer = problem.optimizer()
    batches = [problem.batch(step, seed) for step in range(DATA_BATCHES)]
    xs = tf.constant([b[0] for b in batches])
    ts = tf.constant([b[1] for b in batches])

    def dataset_fn():
        return tf.data.Dataset.from_tensor_slices((xs, ts)).repeat()

    with quiet_fds():
        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step_fn(iterator):
        def replica(x, t):
            with tf.GradientTape() as tape:
                loss = problem.loss(problem.forward(variables, x), t)
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss

        x, t = next(iterator)
        return strategy.run(replica, args=(x, t))

    runner = new_runner("ps_strategy", f"ParameterServerStrategy "
                        f"({len(cluster.addresses['worker'])} workers)", options,
                        problem=problem, cluster=cluster, workers=["any worker"])
    pending = []  # (step, RemoteValue): up to 5 steps in flight

    def finished(keep: int):
        done = []
        while len(pending) > keep:
            scheduled, value = pending.pop(0)
            loss = float(value.fetch()) / problem.batch_size
            done.append(Update(loss, problem.batch_size, scheduled, "any worker"))
        return done

    def step(number):
        pending.append((number, coordinator.schedule(step_fn, args=(iterator,))))
        return finished(keep=4)

    def body():
        runner.loop(options.steps, step)
        for update in finished(keep=0):  # the steps still in flight at the end or at Stop
            runner.add(update, update.step)
        coordinator.join()

    return runner.run(body, background=options.background)


def _variables(problem, seed):
    """The problem's variables as TF2 variables (same initial values as the graph loops)."""
    tf = import_tf()
    return [tf.Variable(value, name=name) for name, value in problem.initial_values(seed)]
