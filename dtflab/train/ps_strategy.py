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
from dtflab.train.history import RunHistory
from dtflab.train.runner import Runner, Update

#: Distinct batches shipped to the workers (a tf.data pipeline of them, repeated).
DATA_BATCHES = 8


def strategy_for(cluster):
    """A ParameterServerStrategy over ``cluster`` with this process as its chief."""
    tf = import_tf()
    for job in ("worker", "ps"):
        if job not in cluster.addresses:
            raise ValueError(f"ParameterServerStrategy needs 'worker' and 'ps' jobs; this cluster "
                             f"has: {', '.join(cluster.addresses)}; start one with --ps 1 --workers 2")
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")  # what TF recommends for it
    (port,) = free_ports(1)
    cluster.let_tasks_reach(port)
    spec = dict(cluster.addresses, chief=[f"127.0.0.1:{port}"])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    with quiet_fds():
        return tf.distribute.experimental.ParameterServerStrategy(resolver)


def ps_strategy(problem, cluster, *, steps: int = 200, seed: int = 0, background: bool = False,
                callbacks=(), name: str | None = None, strategy=None):
    """Train with ``ClusterCoordinator.schedule``: each step goes to whichever worker is free.

    The loss of each step comes back as a RemoteValue, read as steps complete. Staleness is
    not measured here (TensorFlow does not expose which update a worker read).
    """
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

    history = RunHistory(name or f"ParameterServerStrategy ({len(cluster.addresses['worker'])} workers)",
                         "ps_strategy", workers=["any worker"], cluster=cluster)
    runner = Runner(history, callbacks)
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
        runner.loop(steps, step)
        for update in finished(keep=0):  # the steps still in flight at the end or at Stop
            runner.add(update, update.step)
        coordinator.join()

    return runner.run(body, background=background)


def _variables(problem, seed):
    """The problem's variables as TF2 variables (same initial values as the graph loops)."""
    tf = import_tf()
    return [tf.Variable(value, name=name) for name, value in problem.initial_values(seed)]
