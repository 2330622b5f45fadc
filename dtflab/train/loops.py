"""Training loops that teach: single, model parallel, sync data parallel, async parameter server.

Every loop takes a Problem, a number of steps and a seed, and returns a RunHistory; with
``background=True`` it returns a :class:`BackgroundRun` at once (the kernel stays free, so a
dashboard's Stop button works). ``slow={"worker:1": 0.05}`` makes a task take that many more
seconds per step (a straggler, sleeping on the task itself).
"""

from __future__ import annotations

import concurrent.futures
import re
import shutil
import threading
import time

from dtflab._quiet import import_tf
from dtflab.errors import TaskError
from dtflab.placement import PlacementPlan
from dtflab.train import graphs
from dtflab.train.callbacks import Callback
from dtflab.train.history import RunHistory, StepRecord

#: A step that needs a dead task gives up after this long (the sync loop's "within seconds").
OPERATION_TIMEOUT_MS = 10_000
#: How long a step is retried while every task is alive but unreachable (a task just
#: restarted: gRPC channels that saw it die reconnect with a back-off).
TRANSIENT_RETRY_S = 10.0


class BackgroundRun:
    """A loop running in a thread: ``history`` grows as it goes; ``stop()`` ends it after the
    current step and keeps the history; ``wait()`` returns the history or raises its error."""

    def __init__(self, history: RunHistory, target, stop_event: threading.Event):
        self.history, self.error = history, None
        self._stop_event = stop_event

        def run():
            try:
                target()
            except BaseException as exc:  # kept for wait(); the dashboard shows it
                self.error = exc

        self.thread = threading.Thread(target=run, name=f"dtflab-{history.loop}", daemon=True)
        self.thread.start()

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    def stop(self) -> RunHistory:
        self._stop_event.set()
        self.thread.join()
        return self.history

    def wait(self, timeout: float | None = None) -> RunHistory:
        self.thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.history

    def __repr__(self) -> str:
        state = "done" if self.done else "running"
        return f"<BackgroundRun {state}: {self.history.summary()}>"


def _session(target, graph):
    tf = import_tf()
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=OPERATION_TIMEOUT_MS)
    return tf.compat.v1.Session(target, graph=graph, config=config)


def _device(task: str) -> str:
    job, _, index = task.partition(":")
    return f"/job:{job}/task:{index or 0}"


def _task_name(device: str) -> str:
    match = re.search(r"/job:([^/]+)/(?:replica:\d+/)?task:(\d+)", device)
    return f"{match.group(1)}:{match.group(2)}" if match else device


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
    match = re.search(r"/job:([^/]+)/(?:replica:\d+/)?task:(\d+)", str(error))
    return (match.group(1), int(match.group(2))) if match else ("unknown", 0)


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


def _finish(history: RunHistory, started: float, callbacks) -> RunHistory:
    history.wall_s = time.perf_counter() - started
    for callback in callbacks:
        callback.on_run_end(history)
    return history


def _launch(history, body, background: bool, stop_event: threading.Event):
    if background:
        return BackgroundRun(history, body, stop_event)
    body()
    return history


def _sync_loop(history, session, fetch, feeds, problem, steps, seed, callbacks, stop_event,
               cluster, worker_name="all", trace_step=None):
    """Run ``steps`` synchronous steps; ``feeds(step)`` gives each step's feed dict. Step
    ``trace_step`` is traced (``history.trace``); the others are not."""
    tf = import_tf()
    started = time.perf_counter()
    for callback in callbacks:
        callback.on_run_start(history)
    # The next step's batch is made while this step runs (session.run releases the GIL).
    prefetch = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dtflab-feed")
    upcoming = prefetch.submit(feeds, 0)
    try:
        for step in range(steps):
            if stop_event.is_set():
                history.stopped_early = True
                break
            feed = upcoming.result()
            if step + 1 < steps:
                upcoming = prefetch.submit(feeds, step + 1)
            try:
                if step == trace_step:
                    from dtflab.tracing.capture import trace

                    history.trace = trace(session, fetch, feed)
                    loss = history.trace.result
                else:
                    loss = run_step(session, fetch, feed, cluster)
            except tf.errors.OpError as error:
                job, index = failed_task(cluster, error)
                message = f"{job}:{index} failed during step {step}: {type(error).__name__}"
                history.failures.append(message)
                raise TaskError(job, index, f"failed during step {step}; the synchronous run "
                                f"stopped ({type(error).__name__})") from None
            record = StepRecord(step, worker_name, float(loss) / problem.batch_size,
                                time.perf_counter() - started, problem.batch_size)
            history.add(record)
            for callback in callbacks:
                callback.on_step(history, record)
    finally:
        prefetch.shutdown(wait=True, cancel_futures=True)
        _close(session, failed=bool(history.failures))
        _finish(history, started, callbacks)


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
           trace_step: int | None = None):
    """One process does everything (no cluster), or one task does (``cluster`` + ``device``)."""
    built = graphs.single_graph(problem, seed, device)
    target = cluster.target(*_task_name(device).split(":")) if cluster is not None and device else ""
    return _run_one_replica(built, target, RunHistory(name or "single", "single"), problem,
                            steps, seed, cluster, background, callbacks, trace_step)


def model_parallel(problem, cluster, plan: PlacementPlan | None = None, *, steps: int = 200,
                   seed: int = 0, background: bool = False, callbacks=(), name: str | None = None,
                   trace_step: int | None = None):
    """Variables spread over the ps tasks by layer (or by ``plan``); compute on one task."""
    plan = plan or PlacementPlan.by_layer(cluster, job="ps")
    built = graphs.model_parallel_graph(problem, plan, seed)
    job, index = _task_name(plan.compute).split(":")
    history = RunHistory(name or "model parallel", "model_parallel")
    return _run_one_replica(built, cluster.target(job, int(index)), history, problem, steps, seed,
                            cluster, background, callbacks, trace_step)


def _run_one_replica(built, target, history, problem, steps, seed, cluster, background,
                     callbacks, trace_step):
    """The loop shared by single and model parallel: one copy of the model, one session."""
    session = _session(target, built.graph)
    session.run(built.init)
    x, t = built.inputs
    stop = threading.Event()

    def feeds(step):
        xs, ts = problem.batch(step, seed)
        return {x: xs, t: ts}

    fetch = _with_train(built)
    body = lambda: _sync_loop(history, session, fetch, feeds, problem, steps, seed, callbacks,
                              stop, cluster, trace_step=trace_step)
    return _launch(history, body, background, stop)


def _with_train(built):
    """Fetch the loss computed by the training step itself (no second forward pass)."""
    tf = import_tf()
    with built.graph.as_default(), tf.control_dependencies([built.train]):
        return tf.identity(built.loss)


def _workers(cluster, workers):
    names = [f"worker:{i}" for i in range(len(cluster.addresses.get("worker", [])))]
    if not names:
        raise ValueError(f"data parallelism needs a 'worker' job; this cluster has: "
                         f"{', '.join(cluster.addresses)}")
    chosen = names[:workers] if workers else names
    if workers and workers > len(names):
        raise ValueError(f"workers={workers} but the cluster has {len(names)} worker tasks")
    return [_device(name) for name in chosen]


def _ps_plan(cluster):
    job = "ps" if "ps" in cluster.addresses else next(iter(cluster.addresses))
    return PlacementPlan.round_robin(cluster, job=job, compute=f"/job:{job}/task:0")


def sync_data_parallel(problem, cluster, *, steps: int = 200, seed: int = 0,
                       workers: int | None = None, slow: dict | None = None,
                       background: bool = False, callbacks=(), name: str | None = None,
                       trace_step: int | None = None, gradient_bits: int = 32):
    """A tower per worker on its slice of each global batch; gradients combined on the ps,
    applied once. A dead worker ends the run with a TaskError naming it. ``gradient_bits``
    16 or 8 sends gradients compressed (see graphs.sync_graph)."""
    devices = _workers(cluster, workers)
    plan = _ps_plan(cluster)
    slow_devices = {_device(task): seconds for task, seconds in (slow or {}).items()}
    built = graphs.sync_graph(problem, plan, devices, seed, slow_devices, gradient_bits)
    job, index = _task_name(plan.compute).split(":")
    session = _session(cluster.target(job, int(index)), built.graph)
    session.run(built.init)
    share = problem.batch_size // len(devices)
    history = RunHistory(name or f"sync data parallel ({len(devices)} workers)", "sync")
    stop = threading.Event()

    def feeds(step):
        xs, ts = problem.batch(step, seed)
        feed = {}
        for i, tower in enumerate(built.towers):
            feed[tower.x], feed[tower.t] = xs[i * share:(i + 1) * share], ts[i * share:(i + 1) * share]
        return feed

    fetch = _with_train(built)
    body = lambda: _sync_loop(history, session, fetch, feeds, problem, steps, seed, callbacks,
                              stop, cluster, trace_step=trace_step)
    return _launch(history, body, background, stop)


def async_parameter_server(problem, cluster, *, steps: int = 200, seed: int = 0,
                           workers: int | None = None, slow: dict | None = None,
                           checkpoint_every: int | None = None, checkpoint_dir: str | None = None,
                           background: bool = False, callbacks=(), name: str | None = None):
    """Downpour SGD: each worker runs its own loop (``steps`` each) and applies its gradients
    on the ps without waiting. A worker that dies is reported in ``history.failures`` and the
    others carry on.

    ``checkpoint_every=K`` writes the ps variables to ``checkpoint_dir`` (default: a temporary
    folder, deleted when the run ends) every K updates; when a ps dies, the loop restarts it,
    restores the newest checkpoint and goes on, losing at most K updates
    (``history.recoveries`` says how many). Restarting needs a backend that can (local, dask);
    see ``train.checkpoints``.
    """
    import tempfile

    from dtflab.train.checkpoints import Checkpoints, Recovery

    tf = import_tf()
    devices = _workers(cluster, workers)
    plan = _ps_plan(cluster)
    slow_devices = {_device(task): seconds for task, seconds in (slow or {}).items()}
    built = graphs.async_graph(problem, plan, devices, seed, slow_devices)
    checkpoints = None
    if checkpoint_every is not None:
        folder = checkpoint_dir or tempfile.mkdtemp(prefix="dtflab-checkpoints-")
        checkpoints = Checkpoints(built.graph, built.global_step, folder, checkpoint_every,
                                  len(devices))
    targets = [cluster.target(*_split(_task_name(d))) for d in devices]
    sessions = [_session(target, built.graph) for target in targets]
    sessions[0].run(built.init)
    history = RunHistory(name or f"async parameter server ({len(devices)} workers)", "async",
                         workers=[_task_name(d) for d in devices])
    stop = threading.Event()
    ps_jobs = {job for job in cluster.addresses if job not in {_split(_task_name(d))[0] for d in devices}}
    epoch = [0]  # recoveries so far; a session made before the last one is stale
    recovering = threading.Lock()
    if checkpoints is not None:
        checkpoints.save(sessions[0])  # step 0: a failure before the first K loses < K too

    def recover(task, seen_epoch):
        """Restart a dead ps and restore the newest checkpoint (once, whoever asks first)."""
        with recovering:
            if epoch[0] != seen_epoch:
                return
            with checkpoints.held():
                failed_at, began = checkpoints.seen_step, time.perf_counter()
                cluster.restart(*task)
                with _session(targets[0], built.graph) as session:
                    resumed = checkpoints.restore(session)
                history.recoveries.append(Recovery(f"{task[0]}:{task[1]}", failed_at, resumed,
                                                   time.perf_counter() - began))
            epoch[0] += 1

    def one_update(session, tower, feed):
        if checkpoints is None:
            return run_step(session, tower.fetch, feed, cluster)
        checkpoints.begin_update()
        try:
            result = run_step(session, tower.fetch, feed, cluster)
        except BaseException:
            checkpoints.end_update(None)
            raise
        if checkpoints.end_update(int(result[2])):
            checkpoints.save(session)
        return result

    def worker_loop(i, session, tower, started):
        name_ = _task_name(tower.device)
        session_epoch, local_step = epoch[0], 0
        while local_step < steps:
            if stop.is_set():
                history.stopped_early = True
                break
            xs, ts = problem.batch(local_step * len(devices) + i, seed)
            try:
                loss, before, after = one_update(session, tower, {tower.x: xs, tower.t: ts})
            except tf.errors.OpError as error:
                if checkpoints is not None:
                    with recovering:  # let a recovery in progress finish first
                        stale = session_epoch != epoch[0]
                job, index = failed_task(cluster, error)
                if checkpoints is not None and (stale or job in ps_jobs):
                    _close(session, failed=True)
                    try:
                        if not stale:
                            recover((job, index), session_epoch)
                    except Exception as failure:  # the restart or restore failed: give up
                        history.failures.append(f"{name_} stopped: could not recover {job}:{index} "
                                                f"({failure})")
                        return
                    session_epoch, session = epoch[0], _session(targets[i], built.graph)
                    continue  # the same batch again
                history.failures.append(f"{name_} stopped: {job}:{index} failed "
                                        f"({type(error).__name__}); the other workers carried on")
                _close(session, failed=True)
                return
            record = StepRecord(int(after) - 1, name_, float(loss) / len(xs),
                                time.perf_counter() - started, len(xs), int(after - before - 1))
            history.add(record)
            for callback in callbacks:
                callback.on_step(history, record)
            local_step += 1
        _close(session)

    def body():
        started = time.perf_counter()
        for callback in callbacks:
            callback.on_run_start(history)
        threads = [threading.Thread(target=worker_loop, args=(i, s, tower, started),
                                    name=f"dtflab-async-{i}", daemon=True)
                   for i, (s, tower) in enumerate(zip(sessions, built.towers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if checkpoints is not None and checkpoint_dir is None:
            shutil.rmtree(checkpoints.folder, ignore_errors=True)  # ours, not the user's
        with history._lock:  # in step order, except that a restore sends the steps back
            history.records.sort(key=(lambda r: r.time_s) if history.recoveries else (lambda r: r.step))
        _finish(history, started, callbacks)
        if len(history.failures) == len(devices):
            raise TaskError(*failed_task(cluster, "")[:2], "left no worker running")

    return _launch(history, body, background, stop)


def _split(task: str) -> tuple[str, int]:
    job, index = task.split(":")
    return job, int(index)


__all__ = ["single", "model_parallel", "sync_data_parallel", "async_parameter_server",
           "BackgroundRun", "Callback", "failed_task"]
