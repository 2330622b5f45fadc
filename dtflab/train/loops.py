"""Training loops that teach: single, model parallel, sync data parallel, async parameter server.

Every loop takes a Problem, a number of steps and a seed, and returns a RunHistory; with
``background=True`` it returns a :class:`BackgroundRun` at once (the kernel stays free, so a
dashboard's Stop button works). ``slow={"worker:1": 0.05}`` makes a task take that many more
seconds per step (a straggler, sleeping on the task itself). ``watchdog=`` sets when a step
counts as stalled and how often it is retried on a new session (train.watchdog).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import shutil
import threading
import time

from dtflab import checks, names
from dtflab._quiet import import_tf
from dtflab.errors import StallError, TaskError
from dtflab.placement import PlacementPlan
from dtflab.train import graphs
from dtflab.train.callbacks import Callback  # noqa: F401  (re-exported)
from dtflab.train.history import RunHistory
from dtflab.train.runner import BackgroundRun, Runner, Update
from dtflab.train.watchdog import Stalled
from dtflab.train.watchdog import settings as watchdog_settings

#: A step that needs a dead task gives up after this long (the sync loop's "within seconds").
OPERATION_TIMEOUT_MS = 10_000
#: How long a step is retried while every task is alive but unreachable (a task just
#: restarted: gRPC channels that saw it die reconnect with a back-off).
TRANSIENT_RETRY_S = 10.0


def _session(target, graph, device_filters=()):
    """A session with its own config: never the eager context's (which carries a coordination
    service once a TF2 strategy or ``connect()`` ran in this process). ``device_filters``
    limits which tasks its master talks to and places ops on; TensorFlow's distributed master
    places the whole graph (it ignores ``place_pruned_graph``), so a filtered session needs a
    graph that names no other task."""
    tf = import_tf()
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=OPERATION_TIMEOUT_MS,
                                      device_filters=list(device_filters))
    return tf.compat.v1.Session(target, graph=graph, config=config)


def _renewed(session):
    """A new session like ``session`` (made by :func:`_session` without filters) on the same
    target and graph: the servers keep the variables, a distributed session holds none."""
    return _session(session.sess_str, session.graph)


def failed_task(cluster, error) -> tuple[str, int]:
    """Which task a TF error is about: a dead task of the cluster, else an address in it."""
    dead = dead_task(cluster)
    if dead is not None:
        return dead
    if cluster is not None:
        for job, addresses in cluster.addresses.items():
            for index, address in enumerate(addresses):
                if address in str(error):
                    return job, index
    return names.find(str(error)) or ("unknown", 0)


def _describe(job: str, index: int, error) -> str:
    """'ps:0 failed (UnavailableError)', or the error's own first line when no task is named."""
    if job == "unknown":
        first = str(getattr(error, "message", error)).strip().splitlines()[:1]
        return f"{type(error).__name__}: {first[0][:120] if first else ''}".rstrip(": ")
    return f"{job}:{index} failed ({type(error).__name__})"


def _stall_behind(error, stall, cluster, watch, worker):
    """After a failed step: ``stall`` if the failure is the watchdog closing a stalled step's
    session while every task lives (the loop recovers it), else None (a failure for the loop's
    usual handling; a stall whose task died is settled as such). A closed session with no
    stall behind it is not a TensorFlow failure: re-raised."""
    if stall is not None and dead_task(cluster) is None:
        return stall
    if stall is not None:
        watch.settle(worker, "a task had died")
    elif not isinstance(error, import_tf().errors.OpError):
        raise error
    return None


def dead_task(cluster) -> tuple[str, int] | None:
    """A task of ``cluster`` that was killed or exited, if any."""
    for task in (cluster.tasks if cluster is not None else ()):
        if str(task.state) in ("killed", "exited"):
            return task.job, task.index
    return None


def run_step(session, fetch, feed, cluster):
    """``session.run``, retried while the cluster says every task is alive (a transient
    Unavailable after a restart); a failure with a dead task is raised at once."""
    tf = import_tf()
    deadline = time.monotonic() + TRANSIENT_RETRY_S
    pause = 0.2
    while True:
        try:
            return session.run(fetch, feed)
        except tf.errors.UnavailableError:
            if dead_task(cluster) is not None or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


class SessionSteps:
    """A synchronous loop's step: one ``session.run`` of ``fetch`` on ``feeds(step)``. The
    next step's batch is made while this step runs (``session.run`` releases the GIL); step
    ``trace_step`` is traced into ``history.trace``. A failed task ends the run with a
    TaskError naming it."""

    def __init__(self, session, fetch, feeds, problem, cluster, runner, trace_step=None):
        self.session, self.fetch, self.feeds = session, fetch, feeds
        self.problem, self.cluster, self.history = problem, cluster, runner.history
        self.trace_step = trace_step
        self._prefetch = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dtflab-feed")
        self._upcoming = {0: self._prefetch.submit(feeds, 0)}
        self.watch = runner.watch
        self._stall = None  # the stall whose session the watchdog closed
        if session.sess_str:  # an in-process session keeps the variables: never closed
            runner.on_stall = self._on_stall

    def _on_stall(self, worker) -> None:
        self._stall = self.watch.stalled(worker)
        _close(self.session, failed=True)

    def __call__(self, step: int) -> Update:
        upcoming = self._upcoming.pop(step, None)
        feed = upcoming.result() if upcoming is not None else self.feeds(step)
        self._upcoming[step + 1] = self._prefetch.submit(self.feeds, step + 1)
        tries = 0
        while True:
            try:
                return self._run(step, feed)
            except Stalled as stalled:
                if tries == self.watch.settings.retries:
                    error = StallError(stalled.stall, f"gave up after {tries} new session(s)")
                    self.history.failures.append(str(error))
                    self.watch.settle("all", "gave up")
                    raise error from None
                tries += 1
                self.session = _renewed(self.session)
                self.watch.settle("all", "recovered")

    def _run(self, step, feed) -> Update:
        tf = import_tf()
        try:
            if step == self.trace_step:
                from dtflab.tracing.capture import trace

                self.history.trace = trace(self.session, self.fetch, feed)
                loss = self.history.trace.result
            else:
                loss = run_step(self.session, self.fetch, feed, self.cluster)
        except (tf.errors.OpError, RuntimeError) as error:  # RuntimeError: a closed session
            stall, self._stall = self._stall, None
            if _stall_behind(error, stall, self.cluster, self.watch, "all") is not None:
                raise Stalled(stall) from None
            job, index = failed_task(self.cluster, error)
            self.history.failures.append(f"{job}:{index} failed during step {step}: "
                                         f"{type(error).__name__}")
            raise TaskError(job, index, f"failed during step {step}; the synchronous run "
                            f"stopped ({type(error).__name__})") from None
        return Update(float(loss) / self.problem.batch_size, self.problem.batch_size)

    def close(self) -> None:
        self._prefetch.shutdown(wait=True, cancel_futures=True)
        _close(self.session, failed=bool(self.history.failures))


def _synchronous(runner, steps, session, fetch, feeds, problem, cluster, trace_step, background):
    """Run a one-session loop (single, model parallel, sync data parallel) with ``runner``."""
    stepper = SessionSteps(session, fetch, feeds, problem, cluster, runner, trace_step)

    def body():
        try:
            runner.loop(steps, stepper)
        finally:
            stepper.close()

    return runner.run(body, background=background)


def _close(session, failed: bool = False) -> None:
    """Close a session; after a task failed, in the background (closing waits on the dead
    task until the operation timeout) and without raising."""
    tf = import_tf()

    def close():
        try:
            session.close()
        except tf.errors.OpError:
            pass

    if failed:
        threading.Thread(target=close, name="dtflab-session-close", daemon=True).start()
    else:
        close()


def single(problem, *, steps: int = 200, seed: int = 0, cluster=None, device: str | None = None,
           background: bool = False, callbacks=(), name: str | None = None,
           trace_step: int | None = None, watchdog=True):
    """One process does everything (no cluster), or one task does (``cluster`` + ``device``,
    e.g. ``"/job:worker/task:0"``)."""
    checks.run_arguments(steps, seed, trace_step)
    if device is not None:
        if cluster is None:
            raise ValueError(f"device={device!r} needs the cluster it is on: pass cluster= too, "
                             f"or leave device out to train in this process")
        checks.cluster(cluster)
        device = _checked_device(cluster, device, "device")
    runner = Runner(RunHistory(name or "single", "single"), callbacks,
                    watchdog=watchdog_settings(watchdog))
    built = graphs.single_graph(problem, seed, device)
    target = cluster.target(*names.split(device)) if cluster is not None and device else ""
    return _run_one_replica(built, target, runner, problem, steps, seed, cluster, background,
                            trace_step)


def model_parallel(problem, cluster, plan: PlacementPlan | None = None, *, steps: int = 200,
                   seed: int = 0, background: bool = False, callbacks=(), name: str | None = None,
                   trace_step: int | None = None, watchdog=True):
    """Variables spread over the ps tasks by layer (or by ``plan``); compute on one task."""
    checks.run_arguments(steps, seed, trace_step)
    checks.cluster(cluster)
    runner = Runner(RunHistory(name or "model parallel", "model_parallel"), callbacks,
                    watchdog=watchdog_settings(watchdog))
    plan = plan or PlacementPlan.by_layer(cluster, job="ps")
    for device in [plan.compute, *plan.devices]:
        _checked_device(cluster, device, "plan")
    built = graphs.model_parallel_graph(problem, plan, seed)
    return _run_one_replica(built, cluster.target(*names.split(plan.compute)), runner,
                            problem, steps, seed, cluster, background, trace_step)


def _run_one_replica(built, target, runner, problem, steps, seed, cluster, background,
                     trace_step):
    """The loop shared by single and model parallel: one copy of the model, one session."""
    session = _session(target, built.graph)
    session.run(built.init)
    x, t = built.inputs

    def feeds(step):
        xs, ts = problem.batch(step, seed)
        return {x: xs, t: ts}

    runner.history.cluster = cluster
    return _synchronous(runner, steps, session, _with_train(built), feeds, problem, cluster,
                        trace_step, background)


def _with_train(built):
    """Fetch the loss computed by the training step itself (no second forward pass)."""
    tf = import_tf()
    with built.graph.as_default(), tf.control_dependencies([built.train]):
        return tf.identity(built.loss)


def _workers(cluster, workers, slow=None):
    """The worker devices a data-parallel run uses, and ``slow`` as {device: seconds}."""
    checks.cluster(cluster)
    tasks = [f"worker:{i}" for i in range(len(cluster.addresses.get("worker", [])))]
    if not tasks:
        raise ValueError(f"data parallelism needs a 'worker' job; this cluster has: "
                         f"{', '.join(cluster.addresses)}")
    if workers is not None:
        checks.whole(workers, "workers", maximum=len(tasks), example=len(tasks))
    chosen = tasks[:workers] if workers is not None else tasks
    slow = checks.tasks_in(slow, "slow", chosen, example={chosen[-1]: 0.05})
    return [names.device(task) for task in chosen], {names.device(t): s for t, s in slow.items()}


def _checked_device(cluster, device, what: str) -> str:
    """``device`` as a full device name, if it names a task of ``cluster``."""
    tasks = [f"{job}:{i}" for job, addresses in cluster.addresses.items() for i in range(len(addresses))]
    try:
        task = "{}:{}".format(*names.split(device))
    except (ValueError, AttributeError):
        task = None
    if task not in tasks:
        raise ValueError(f"{what} names {device!r}, which is not a task of this cluster; "
                         f"use one of: {', '.join(names.device(t) for t in tasks)}")
    return names.device(task)


def _ps_plan(cluster):
    job = "ps" if "ps" in cluster.addresses else next(iter(cluster.addresses))
    return PlacementPlan.round_robin(cluster, job=job, compute=f"/job:{job}/task:0")


def sync_data_parallel(problem, cluster, *, steps: int = 200, seed: int = 0,
                       workers: int | None = None, slow: dict | None = None,
                       background: bool = False, callbacks=(), name: str | None = None,
                       trace_step: int | None = None, gradient_bits: int = 32, watchdog=True):
    """A tower per worker on its slice of each global batch; gradients combined on the ps,
    applied once. A dead worker ends the run with a TaskError naming it. ``gradient_bits``
    16 or 8 sends gradients compressed (see graphs.sync_graph)."""
    checks.run_arguments(steps, seed, trace_step)
    checks.one_of(gradient_bits, "gradient_bits", (32, 16, 8))
    watchdog = watchdog_settings(watchdog)
    devices, slow_devices = _workers(cluster, workers, slow)
    plan = _ps_plan(cluster)
    built = graphs.sync_graph(problem, plan, devices, seed, slow_devices, gradient_bits)
    session = _session(cluster.target(*names.split(plan.compute)), built.graph)
    session.run(built.init)
    share = problem.batch_size // len(devices)
    history = RunHistory(name or f"sync data parallel ({len(devices)} workers)", "sync",
                         cluster=cluster)

    def feeds(step):
        xs, ts = problem.batch(step, seed)
        feed = {}
        for i, tower in enumerate(built.towers):
            feed[tower.x], feed[tower.t] = xs[i * share:(i + 1) * share], ts[i * share:(i + 1) * share]
        return feed

    return _synchronous(Runner(history, callbacks, watchdog=watchdog), steps, session,
                        _with_train(built), feeds, problem, cluster, trace_step, background)


def async_parameter_server(problem, cluster, *, steps: int = 200, seed: int = 0,
                           workers: int | None = None, slow: dict | None = None,
                           checkpoint_every: int | None = None, checkpoint_dir: str | None = None,
                           background: bool = False, callbacks=(), name: str | None = None,
                           watchdog=True):
    """Downpour SGD: each worker runs its own loop (``steps`` each) and applies its gradients
    on the ps without waiting. A worker that dies is reported in ``history.failures`` and the
    others carry on.

    ``checkpoint_every=K`` writes the ps variables to ``checkpoint_dir`` (default: a temporary
    folder, deleted when the run ends) every K updates; when a ps dies, the loop restarts it,
    restores the newest checkpoint and goes on, losing at most K updates
    (``history.recoveries`` says how many). Restarting needs a backend that can (local, dask);
    see ``train.checkpoints``.

    Each worker's session sees only the non-worker tasks and its own worker
    (``device_filters``): no worker's step can wait on another worker.
    """
    checks.run_arguments(steps, seed)
    if checkpoint_every is not None:
        checks.whole(checkpoint_every, "checkpoint_every", example=20)
    watchdog = watchdog_settings(watchdog)
    devices, slow_devices = _workers(cluster, workers, slow)
    plan = _ps_plan(cluster)
    built = [graphs.async_graph(problem, plan, devices, seed, slow_devices, worker=i)
             for i in range(len(devices))]
    history = RunHistory(name or f"async parameter server ({len(devices)} workers)", "async",
                         workers=[names.task(d) for d in devices], cluster=cluster)
    runner = Runner(history, callbacks, watchdog=watchdog)
    downpour = _Downpour(built, problem, seed, cluster, devices, history, checkpoint_every,
                         checkpoint_dir)
    downpour.watch, runner.on_stall = runner.watch, downpour.stalled

    def body():
        try:
            runner.in_threads({
                worker: functools.partial(runner.loop, steps, downpour.worker_step(i), worker)
                for i, worker in enumerate(history.workers)})
        finally:
            downpour.close()
        if len(history.failures) == len(devices):
            raise TaskError(*failed_task(cluster, "")[:2], "left no worker running")

    return runner.run(body, background=background)


class _Downpour:
    """The asynchronous loop's state: a graph and a session per worker (``built[i]``), the
    optional checkpoints, and the recovery of a dead ps (at most one at a time; sessions made
    before it are stale)."""

    def __init__(self, built, problem, seed, cluster, devices, history, checkpoint_every,
                 checkpoint_dir):
        import tempfile

        from dtflab.train.checkpoints import Checkpoints

        self.built, self.problem, self.seed = built, problem, seed
        self.cluster, self.devices, self.history = cluster, devices, history
        self.checkpoints, self.own_folder = None, checkpoint_dir is None
        if checkpoint_every is not None:
            folder = checkpoint_dir or tempfile.mkdtemp(prefix="dtflab-checkpoints-")
            self.checkpoints = Checkpoints(built[0].graph, built[0].global_step, folder,
                                           checkpoint_every, len(devices))
        self.targets = [cluster.target(*names.split(d)) for d in devices]
        worker_jobs = {names.split(d)[0] for d in devices}
        self.ps_jobs = {job for job in cluster.addresses if job not in worker_jobs}
        self.filters = [[f"/job:{job}" for job in sorted(self.ps_jobs)] + [d] for d in devices]
        self.watch = None  # the run's watchdog, set by the loop
        # One {"session", "epoch", "stall"} per worker: a session made before the last recovery
        # is stale; "stall" is the stall whose session the watchdog closed.
        self.states = [{"session": self._session(i), "epoch": 0, "stall": None}
                       for i in range(len(devices))]
        self.states[0]["session"].run(built[0].init)
        self.epoch = 0  # recoveries so far
        self.recovering = threading.Lock()
        self.saver = None  # a session on worker 0's graph, which holds the checkpoints' saver
        if self.checkpoints is not None:
            self.saver = self._session(0)
            self.checkpoints.save(self.saver)  # step 0: a failure before the first K loses < K too

    def _session(self, i):
        return _session(self.targets[i], self.built[i].graph, self.filters[i])

    def stalled(self, worker) -> None:
        """The watchdog's call: end ``worker``'s stalled step by closing its session."""
        state = self.states[self.history.workers.index(worker)]
        state["stall"] = self.watch.stalled(worker)
        if state["session"] is not None:
            _close(state["session"], failed=True)

    def recover(self, task, seen_epoch) -> None:
        """Restart a dead ps and restore the newest checkpoint (once, whoever asks first)."""
        from dtflab.train.checkpoints import Recovery

        with self.recovering:
            if self.epoch != seen_epoch:
                return
            with self.checkpoints.held():
                failed_at, began = self.checkpoints.seen_step, time.perf_counter()
                self.cluster.restart(*task)
                _close(self.saver, failed=True)  # it knew the dead task's graphs
                self.saver = self._session(0)
                resumed = self.checkpoints.restore(self.saver)
                self.history.recoveries.append(Recovery(f"{task[0]}:{task[1]}", failed_at, resumed,
                                                        time.perf_counter() - began))
            self.epoch += 1

    def one_update(self, session, tower, feed):
        checkpoints = self.checkpoints
        if checkpoints is None:
            return run_step(session, tower.fetch, feed, self.cluster)
        checkpoints.begin_update()
        try:
            result = run_step(session, tower.fetch, feed, self.cluster)
        except BaseException:
            checkpoints.end_update(None)
            raise
        if checkpoints.end_update(int(result[2])):
            checkpoints.save(self.saver)
        return result

    def worker_step(self, i):
        """Worker ``i``'s step: one update on its own session, re-run on a new session after a
        recovery; ``None`` once the worker gave up (its failure is in the history)."""
        tf = import_tf()
        tower, name = self.built[i].towers[0], self.history.workers[i]
        state = self.states[i]

        def step(local_step):
            xs, ts = self.problem.batch(local_step * len(self.devices) + i, self.seed)
            tries = 0
            while True:
                try:
                    loss, before, after = self.one_update(state["session"], tower,
                                                          {tower.x: xs, tower.t: ts})
                    state["stall"] = None  # a stalled step that finished by itself
                    return Update(float(loss) / len(xs), len(xs), int(after) - 1, name,
                                  int(after - before - 1))
                except (tf.errors.OpError, RuntimeError) as error:  # RuntimeError: a closed session
                    stall, state["stall"] = state["stall"], None
                    if _stall_behind(error, stall, self.cluster, self.watch, name) is not None:
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
        if tries == self.watch.settings.retries:
            self.history.failures.append(f"{stall}; gave up after {tries} new session(s); "
                                         f"the other workers carried on")
            self.watch.settle(name, "gave up")
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
        _close(state["session"], failed=True)
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
        self.history.failures.append(f"{name} stopped: {_describe(job, index, error)}; "
                                     f"the other workers carried on")
        return False

    def close(self) -> None:
        for state in self.states:
            if state["session"] is not None:
                _close(state["session"])
        if self.saver is not None:
            _close(self.saver)
        if self.checkpoints is not None and self.own_folder:
            shutil.rmtree(self.checkpoints.folder, ignore_errors=True)  # ours, not the user's
        history = self.history
        with history._lock:  # in step order, except that a restore sends the steps back
            history.records.sort(key=(lambda r: r.time_s) if history.recoveries else (lambda r: r.step))


__all__ = ["single", "model_parallel", "sync_data_parallel", "async_parameter_server",
           "BackgroundRun", "Callback", "Runner", "failed_task"]
