"""Asynchronous parameter servers (Downpour SGD): each worker reads the parameters, computes its
gradients and applies them on the ps without waiting for the others; staleness counted exactly."""

from __future__ import annotations

import contextlib
import functools
import threading
import time

from dtflab import checks, names, scratch
from dtflab._quiet import import_tf
from dtflab.errors import DtflabError, TaskError
from dtflab.train.layouts.tasks import worker_devices
from dtflab.train.machinery.graphs import TrainGraph, Tower, straggler
from dtflab.train.machinery.options import RunOptions, takes_options
from dtflab.train.machinery.runner import Update, new_runner
from dtflab.train.machinery.sessions import (close_session, dead_task, describe, failed_task,
                                       first_run_options, new_session, ps_plan, run_step,
                                       stall_behind, timed_out)


@takes_options(RunOptions)
def async_parameter_server(problem, cluster, *, workers: int | None = None,
                           checkpoint_every: int | None = None, checkpoint_dir: str | None = None,
                           **options):
    """Downpour SGD: each worker runs its own loop (``steps`` each) and applies its gradients
    on the ps without waiting. A worker that dies is reported in ``history.failures`` and the
    others carry on.

    ``checkpoint_every=K`` writes the ps variables to ``checkpoint_dir`` (default: a temporary
    folder, deleted when the run ends) every K updates; when a ps dies, the loop restarts it,
    restores the newest checkpoint and goes on, losing at most K updates
    (``history.recoveries`` says how many). Restarting needs a backend that can (local, dask);
    see ``train.machinery.checkpoints``.

    Each worker's session sees only the non-worker tasks and its own worker
    (``device_filters``): no worker's step can wait on another worker.
    """
    options = RunOptions(**options).checked().without(
        "async_parameter_server", trace_step="traces no step (each worker runs its own loop)",
        predict="has no one step to price (each worker runs its own loop)")
    steps, seed = options.steps, options.seed
    if checkpoint_every is not None:
        checks.whole(checkpoint_every, "checkpoint_every", example=20)
    devices, slow_devices = worker_devices(cluster, workers, options.slow)
    plan = ps_plan(cluster)
    built = [async_graph(problem, plan, devices, seed, slow_devices, worker=i)
             for i in range(len(devices))]
    runner = new_runner("async", f"async parameter server ({len(devices)} workers)", options,
                        problem=problem, cluster=cluster, workers=[names.task(d) for d in devices])
    history = runner.history
    downpour = _Downpour(built, problem, seed, cluster, devices, history, checkpoint_every,
                         checkpoint_dir)
    if options.inputs is not None:  # each worker its own whole batches (a job's share)
        options.inputs.check_problem(problem)
        history.details["inputs"] = options.inputs
        downpour.batches = [options.inputs.batches(seed, part=(i, len(devices)), whole=True)
                            for i in range(len(devices))]
    downpour.watch, runner.on_stall = runner.watch, downpour.stalled

    def body():
        try:
            runner.in_threads({
                worker: functools.partial(runner.loop, steps, downpour.worker_step(i), worker)
                for i, worker in enumerate(history.workers)})
        finally:
            downpour.close()
        if len(history.failures) == len(devices):
            dead = dead_task(cluster)
            if dead is not None:
                raise TaskError(*dead, "left no worker running")
            raise DtflabError("no worker is left running: " + "; ".join(history.failures))

    return runner.run(body, background=options.background)


class _Downpour:
    """The asynchronous loop's state: a graph and a session per worker (``built[i]``), the
    optional checkpoints, and the recovery of a dead ps (at most one at a time; sessions made
    before it are stale)."""

    def __init__(self, built, problem, seed, cluster, devices, history, checkpoint_every,
                 checkpoint_dir):
        from dtflab.train.machinery.checkpoints import Checkpoints

        self.built, self.problem, self.seed = built, problem, seed
        self.batches = None  # one callable a worker, where an input pipeline feeds them
        self.cluster, self.devices, self.history = cluster, devices, history
        self.checkpoints, self.own_folder = None, checkpoint_dir is None
        if checkpoint_every is not None:
            folder = checkpoint_dir or scratch.folder("checkpoints")
            self.checkpoints = Checkpoints(built[0].graph, built[0].global_step, folder,
                                           checkpoint_every, len(devices))
        self.targets = [cluster.target(*names.split(d)) for d in devices]
        worker_jobs = {names.split(d)[0] for d in devices}
        self.ps_jobs = {job for job in cluster.addresses if job not in worker_jobs}
        self.filters = [[f"/job:{job}" for job in sorted(self.ps_jobs)] + [d] for d in devices]
        self.watch = None  # the run's watchdog, set by the loop
        # One {"session", "epoch", "stall", "stepped", "slow"} per worker: a session made
        # before the last recovery is stale; "stall" is (the stall, the session the watchdog
        # closed for it); "stepped" the session that ran this worker's last update; "slow"
        # once a step outlasted TensorFlow's operation timeout (each update's deadline longer).
        self.states = [{"session": self._session(i), "epoch": 0, "stall": None, "stepped": None,
                        "slow": False}
                       for i in range(len(devices))]
        self.states[0]["session"].run(built[0].init, options=first_run_options())
        self.epoch = 0  # recoveries so far
        self.recovering = threading.Lock()
        self.saver = None  # a session on worker 0's graph, which holds the checkpoints' saver
        if self.checkpoints is not None:
            self.saver = self._session(0)
            self.checkpoints.save(self.saver)  # step 0: a failure before the first K loses < K too

    def _session(self, i):
        return new_session(self.targets[i], self.built[i].graph, self.filters[i])

    def stalled(self, worker) -> None:
        """The watchdog's call: end ``worker``'s stalled step by closing its session. The
        stall stays with the session it closed: the step may still end by itself, and then the
        next step finds the session closed."""
        state = self.states[self.history.workers.index(worker)]
        session = state["session"]
        state["stall"] = (self.watch.stalled(worker), session)
        if session is not None:
            close_session(session, failed=True)

    def recover(self, task, seen_epoch) -> None:
        """Restart a dead ps and restore the newest checkpoint (once, whoever asks first)."""
        from dtflab.train.machinery.checkpoints import Recovery

        with self.recovering:
            if self.epoch != seen_epoch:
                return
            with self.checkpoints.held():
                failed_at, began = self.checkpoints.seen_step, time.perf_counter()
                self.cluster.restart(*task)
                close_session(self.saver, failed=True)  # it knew the dead task's graphs
                self.saver = self._session(0)
                resumed = self.checkpoints.restore(self.saver)
                self.history.recoveries.append(Recovery(f"{task[0]}:{task[1]}", failed_at, resumed,
                                                        time.perf_counter() - began))
            self.epoch += 1

    def one_update(self, session, tower, feed, options=None):
        checkpoints = self.checkpoints
        if checkpoints is None:
            return run_step(session, tower.fetch, feed, self.cluster, options)
        checkpoints.begin_update()
        try:
            result = run_step(session, tower.fetch, feed, self.cluster, options)
        except BaseException:
            checkpoints.end_update(None)
            raise
        if checkpoints.end_update(int(result[2])):
            checkpoints.save(self.saver)
        return result

    def worker_step(self, i):
        """Worker ``i``'s step: one update on its own session, re-run on a new session after a
        recovery; ``None`` once the worker gave up (its failure is in the history). A session's
        first update places the graph: it has the watchdog's first-step time."""
        tf = import_tf()
        tower, name = self.built[i].towers[0], self.history.workers[i]
        state = self.states[i]

        def step(local_step):
            waited = time.perf_counter()
            xs, ts = (self.problem.batch(local_step * len(self.devices) + i, self.seed)
                      if self.batches is None else self.batches[i](local_step))
            waited = time.perf_counter() - waited if self.batches is not None else None
            tries = 0
            while True:
                session = state["session"]
                first = state["stepped"] is not session or state["slow"]
                try:
                    loss, before, after = self.one_update(
                        session, tower, {tower.x: xs, tower.t: ts},
                        first_run_options(self.watch) if first else None)
                    state["stepped"] = session
                    return Update(float(loss) / len(xs), len(xs), int(after) - 1, name,
                                  int(after - before - 1), input_wait_s=waited)
                except (tf.errors.OpError, RuntimeError) as error:  # RuntimeError: a closed session
                    stall, closed = state["stall"] or (None, None)
                    state["stall"] = None
                    stall = stall if closed is session else None  # the stall closed this one
                    stall = stall_behind(error, stall, self.cluster, self.watch, name)
                    if stall is None:  # a slow update, not a failed task: a stall too
                        stall = timed_out(error, session, self.cluster, self.watch, name)
                        state["slow"] = state["slow"] or stall is not None
                    if stall is not None:
                        if not self._unstalled(state, stall, name, tries):
                            return None
                        tries += 1
                        continue
                    with self.watch.paused(name) if self.watch else contextlib.nullcontext():
                        if not self._recovered(state, error, name):
                            return None

        return step

    def _unstalled(self, state, stall, name, tries) -> bool:
        """After the watchdog closed a stalled step's session: a new session (True: retry
        the batch), or, after ``retries`` of them, this worker's failure (False)."""
        if not self.watch.retries_left(tries):
            self.watch.give_up(name, f"{stall}; gave up after {tries} new session(s); the other "
                                     f"workers carried on")
            return False
        state["session"] = self._session(self.history.workers.index(name))
        self.watch.settle(name, "recovered")
        return True

    def _recovered(self, state, error, name) -> bool:
        """After a failed update: recover a dead ps and renew the session (True: retry the
        batch), or record this worker's failure (False)."""
        stale = False
        if self.checkpoints is not None:
            with self.recovering:  # let a recovery in progress finish first
                stale = state["epoch"] != self.epoch
        job, index = failed_task(self.cluster, error)
        close_session(state["session"], failed=True)
        state["session"] = None
        if self.checkpoints is not None and (stale or job in self.ps_jobs):
            try:
                if not stale:
                    self.recover((job, index), state["epoch"])
            except Exception as failure:  # the restart or restore failed: give up
                self.history.failures.append(f"{name} stopped: could not recover {job}:{index} "
                                             f"({failure})")
                return False
            state["epoch"], state["session"] = self.epoch, self._session(self.history.workers.index(name))
            return True
        self.history.failures.append(f"{name} stopped: {describe(job, index, error)}; "
                                     f"the other workers carried on")
        return False

    def close(self) -> None:
        for state in self.states:
            if state["session"] is not None:
                close_session(state["session"])
        if self.saver is not None:
            close_session(self.saver)
        if self.checkpoints is not None and self.own_folder:
            scratch.remove(self.checkpoints.folder)  # ours, not the user's
        history = self.history
        with history._lock:  # in step order, except that a restore sends the steps back
            history.records.sort(key=(lambda r: r.time_s) if history.recoveries else (lambda r: r.step))


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
                with tf.control_dependencies([before] + straggler(slow, device)):
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
