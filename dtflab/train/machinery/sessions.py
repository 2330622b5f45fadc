"""What the graph loops share: sessions on a cluster, one synchronous step, and naming the task
a TensorFlow error is about.

Every ``tf.compat.v1`` loop (single, model parallel, sync towers, Downpour, the pipeline, tensor
parallelism) runs its steps through here: a session made with its own config, steps retried
while a restarted task reconnects, a failed task named in a TaskError, a stalled step's session
closed for the watchdog.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

from dtflab import allocator, names
from dtflab._quiet import import_tf
from dtflab.errors import DtflabError, StallError, TaskError, sent_twice
from dtflab.placement import PlacementPlan
from dtflab.train.machinery.logdir import keep_profiles
from dtflab.train.machinery.runner import Update, new_runner
from dtflab.train.machinery.watchdog import Stalled, Watchdog

#: A step that needs a dead task gives up after this long (the sync loop's "within seconds").
OPERATION_TIMEOUT_MS = 10_000
#: A session's first run of a graph places it and registers it on every task: it has as long as
#: the watchdog gives a first step (a starved first step can outlast the 10 s operation
#: timeout, and would be read as a failed task).
FIRST_RUN_S = Watchdog.first_step_s
#: :func:`failed_task`'s job when no task is dead and the error names none.
UNKNOWN = "unknown"
#: How long a step is retried while every task is alive but unreachable (a task just
#: restarted: gRPC channels that saw it die reconnect with a back-off).
TRANSIENT_RETRY_S = 10.0


def new_session(target, graph, device_filters=()):
    """A session with its own config: never the eager context's (which carries a coordination
    service once a TF2 strategy or ``connect()`` ran in this process). ``device_filters``
    limits which tasks its master talks to and places ops on; TensorFlow's distributed master
    places the whole graph (it ignores ``place_pruned_graph``), so a filtered session needs a
    graph that names no other task."""
    tf = import_tf()
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=OPERATION_TIMEOUT_MS,
                                      device_filters=list(device_filters))
    return tf.compat.v1.Session(target, graph=graph, config=config)


def first_run_options(watch=None):
    """``RunOptions`` for a session's first run of a graph: the watchdog's ``first_step_s``
    (``watch``'s, else the default) before TensorFlow ends it, not the operation timeout."""
    seconds = watch.settings.first_step_s if watch is not None else FIRST_RUN_S
    return import_tf().compat.v1.RunOptions(timeout_in_ms=int(max(seconds * 1000, OPERATION_TIMEOUT_MS)))


def renewed(session):
    """A new session like ``session`` (made by :func:`_session` without filters) on the same
    target and graph: the servers keep the variables, a distributed session holds none."""
    return new_session(session.sess_str, session.graph)


def failed_task(cluster, error) -> tuple[str, int]:
    """Which task a TF error is about: a dead task of the cluster, else an address in it, else
    ``(UNKNOWN, 0)``: every task alive and none named, so no task is to blame."""
    dead = dead_task(cluster)
    if dead is not None:
        return dead
    if cluster is not None:
        for job, addresses in cluster.addresses.items():
            for index, address in enumerate(addresses):
                if address in str(error):
                    return job, index
    return names.find(str(error)) or (UNKNOWN, 0)


def describe(job: str, index: int, error) -> str:
    """'ps:0 failed (UnavailableError)', or the error's own first line when no task is named."""
    if job == UNKNOWN:
        first = str(getattr(error, "message", error)).strip().splitlines()[:1]
        return f"{type(error).__name__}: {first[0][:120] if first else ''}".rstrip(": ")
    return f"{job}:{index} failed ({type(error).__name__})"


def stall_behind(error, stall, cluster, watch, worker):
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


def timed_out(error, session, cluster, watch, worker):
    """After a failed step: the Stall, where TensorFlow ended the step on its operation timeout
    with every task alive and none named, in a distributed session, with the watchdog on (a
    slow step, not a failed task: a step starved of CPU can outlast the timeout).
    The session is closed here and the stall noted as the watchdog's own are; the loop
    recovers it as theirs, and gives every later step the first step's deadline. Else None."""
    if (watch is None or not session.sess_str
            or not isinstance(error, import_tf().errors.DeadlineExceededError)
            or failed_task(cluster, error)[0] != UNKNOWN):
        return None
    close_session(session, failed=True)
    return watch.timed_out(worker)


def dead_task(cluster) -> tuple[str, int] | None:
    """A task of ``cluster`` that was killed or exited, if any."""
    for task in (cluster.tasks if cluster is not None else ()):
        if str(task.state) in ("killed", "exited"):
            return task.job, task.index
    return None


def run_step(session, fetch, feed, cluster, options=None, ran=None):
    """``session.run``, retried while the cluster says every task is alive (a transient
    Unavailable after a restart); a failure with a dead task is raised at once. ``ran()``,
    where given (:meth:`StepOnce.ran`), is asked before each retry whether the step's update
    ran before its error: its fetch is then returned, and the step not run twice. A request
    gRPC sent twice (:func:`sent_twice`) is retried only where ``ran`` can say so."""
    tf = import_tf()
    deadline = time.monotonic() + TRANSIENT_RETRY_S
    pause = 0.2
    retry = False
    while True:
        try:
            if retry and ran is not None and (fetched := ran()) is not None:
                return fetched
            retry = True
            return session.run(fetch, feed, options=options)
        except (tf.errors.UnavailableError, tf.errors.AbortedError) as exc:
            if isinstance(exc, tf.errors.AbortedError) and (ran is None or not sent_twice(exc)):
                raise
            if dead_task(cluster) is not None or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


class SessionSteps:
    """A synchronous loop's step: one ``session.run`` of ``once.fetch`` on ``feeds(step)``
    (a :class:`StepOnce`). The next step's batch is made while this step runs
    (``session.run`` releases the GIL); step ``trace_step`` is traced into ``history.trace``
    (the next one, if a stall took its result). A failed task ends the run with a TaskError
    naming it."""

    def __init__(self, session, once, feeds, problem, cluster, runner, trace_step=None):
        self.session, self.once, self.feeds = session, once, feeds
        self.problem, self.cluster, self.history = problem, cluster, runner.history
        self.trace_step = trace_step
        self.watch = runner.watch
        once.start(session, first_run_options(self.watch))
        self._applied = 0  # steps whose update ran, as the servers count them
        self._waited = 0.0  # seconds this step waited for its batch
        self._first = True  # this session has not yet run a step: its graph is not yet placed
        self._slow = False  # a step outlasted the operation timeout: every step gets longer
        self._prefetch = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dtflab-feed")
        self._upcoming = {0: self._prefetch.submit(feeds, 0)}
        self._stall = None  # the stall whose session the watchdog closed
        if session.sess_str:  # an in-process session keeps the variables: never closed
            runner.on_stall = self._on_stall

    def _on_stall(self, worker) -> None:
        self._stall = self.watch.stalled(worker)
        close_session(self.session, failed=True)

    def __call__(self, step: int) -> Update:
        upcoming = self._upcoming.pop(step, None)
        waited = time.perf_counter()
        feed = upcoming.result() if upcoming is not None else self.feeds(step)
        self._waited = time.perf_counter() - waited  # made while the last step ran, if it could
        self._upcoming[step + 1] = self._prefetch.submit(self.feeds, step + 1)
        tries = 0
        while True:
            try:
                return self._run(step, feed)
            except Stalled as stalled:
                if not self.watch.retries_left(tries):
                    error = StallError(stalled.stall, f"gave up after {tries} new session(s)")
                    self.watch.give_up("all", str(error))
                    raise error from None
                tries += 1
                self.session = renewed(self.session)
                self._first = True
                self.watch.settle("all", "recovered")
                ran = self._ran_before_closing()
                if ran is not None:
                    if step == self.trace_step:
                        self.trace_step += 1
                    return self._update(ran)

    def _ran_before_closing(self) -> dict | None:
        """The fetch of the step in progress if its update ran before its session closed."""
        try:
            ran = self.once.ran(self.session, self._applied)
        except import_tf().errors.OpError:  # a task lost its state: run the step again
            return None
        if ran is not None:
            self._applied += 1
        return ran

    def _run(self, step, feed) -> Update:
        tf = import_tf()
        options = first_run_options(self.watch) if self._first or self._slow else None
        try:
            if step == self.trace_step:
                fetched = self._traced(feed, options)
            else:
                fetched = run_step(self.session, self.once.fetch, feed, self.cluster, options,
                                   ran=lambda: self.once.ran(self.session, self._applied))
        except (tf.errors.OpError, RuntimeError) as error:  # RuntimeError: a closed session
            stall, self._stall = self._stall, None
            if stall_behind(error, stall, self.cluster, self.watch, "all") is not None:
                raise Stalled(stall) from None
            slow = timed_out(error, self.session, self.cluster, self.watch, "all")
            if slow is not None:
                self._slow = True
                raise Stalled(slow) from None
            job, index = failed_task(self.cluster, error)
            if job == UNKNOWN:  # every task alive and none named: not a task's failure
                what = f"step {step} failed with every task alive ({describe(job, index, error)})"
                self.history.failures.append(what)
                raise DtflabError(f"{what}; the synchronous run stopped") from None
            self.history.failures.append(f"{job}:{index} failed during step {step}: "
                                         f"{type(error).__name__}")
            raise TaskError(job, index, f"failed during step {step}; the synchronous run "
                            f"stopped ({type(error).__name__})") from None
        self._applied += 1
        self._first = False
        return self._update(fetched)

    def _traced(self, feed, options) -> dict:
        """The step traced into ``history.trace``; where the run writes TensorBoard files,
        every task profiled as well, for XProf (unless ``$DTFLAB_PROFILE`` is ``0``)."""
        from dtflab.tracing.capture import trace
        from dtflab.tracing.profile import profiled, profiles_kept

        def step():
            return trace(self.session, self.once.fetch, feed, options=options)

        if self.history.logdir and self.cluster is not None and profiles_kept():
            # long enough for a traced step (tracing slows it: four untraced steps' time)
            times = [r.time_s for r in self.history.records[-2:]]
            last_s = times[1] - times[0] if len(times) == 2 else 0.25
            self.history.trace, profiles = profiled(self.cluster, step,
                                                    duration_ms=int(min(3000, 300 + 4e3 * last_s)))
            keep_profiles(self.history, profiles)
        else:
            self.history.trace = step()
        return self.history.trace.result

    def _update(self, fetched: dict) -> Update:
        """The Update of one step's fetch; the graph's reports go into the history."""
        reports = {name: value for name, value in fetched.items() if name != "loss"}
        if reports:
            kept = self.history.details.setdefault("per_step", {})
            for name, value in reports.items():
                kept.setdefault(name, []).append(value.tolist())
        return Update(float(fetched["loss"]) / self.problem.batch_size, self.problem.batch_size,
                      input_wait_s=self._waited)

    def close(self) -> None:
        self._prefetch.shutdown(wait=True, cancel_futures=True)
        close_session(self.session, failed=bool(self.history.failures))


def synchronous(runner, steps, session, built, feeds, problem, cluster, trace_step, background):
    """Run a one-session loop (single, model parallel, sync data parallel) of ``built``'s
    training step with ``runner``."""
    stepper = SessionSteps(session, StepOnce(built), feeds, problem, cluster, runner, trace_step)

    def body():
        try:
            runner.loop(steps, stepper)
        finally:
            stepper.close()

    return runner.run(body, background=background)


def close_session(session, failed: bool = False) -> None:
    """Close a session; after a task failed, in the background (closing waits on the dead
    task until the operation timeout) and without raising. One that ended well then lets go of
    its graph (``allocator.let_go``: no gradient of it is built after its run)."""
    tf = import_tf()

    def close():
        try:
            session.close()
        except tf.errors.OpError:
            pass

    if failed:
        threading.Thread(target=close, name="dtflab-session-close", daemon=True).start()
        return
    close()
    allocator.let_go(session.graph)


def train_graph(kind: str, title: str, built, master: str | None, problem, cluster, options, *,
                details: dict | None = None, reads: dict | None = None):
    """The skeleton every one-session loop ends in: ``built`` (its training step, one graph)
    trained as ``options`` (a checked ``RunOptions``) say, the master on device ``master`` of
    ``cluster`` (None: in this process); the history of ``kind``, named ``options.name`` or
    ``title``, holding the loop's own ``details`` and ``reads``. Returns the RunHistory, or a
    BackgroundRun."""
    runner = new_runner(kind, title, options, problem=problem, cluster=cluster)
    runner.history.details.update(details or {})
    if options.inputs is not None:  # what the summary and the dashboard read the wait of
        runner.history.details["inputs"] = options.inputs
    runner.history.reads.update(reads or {})
    if options.predict is not None:  # priced from the graph, before it runs
        runner.history.prediction = options.predict(built, master, problem)
    target = cluster.target(*names.split(master)) if master is not None else ""
    return run_one_replica(built, target, runner, problem, options.steps, options.seed, cluster,
                           options.background, options.trace_step, options.inputs)


def batch_source(problem, seed: int, inputs=None):
    """``batches(step) -> (xs, ts)``: ``problem.batch`` for that step, or the next batch of
    the input pipeline ``inputs`` (made for this problem)."""
    if inputs is None:
        return lambda step: problem.batch(step, seed)
    inputs.check_problem(problem)
    return inputs.batches(seed)


def run_one_replica(built, target, runner, problem, steps, seed, cluster, background,
                     trace_step, inputs=None):
    """The loop shared by single, model parallel, the pipeline and tensor parallelism: one copy
    of the model (on one task or spread over several), one session."""
    batches = batch_source(problem, seed, inputs)
    session = new_session(target, built.graph)
    session.run(built.init, options=first_run_options(runner.watch))
    x, t = built.inputs

    def feeds(step):
        xs, ts = batches(step)
        return {x: xs, t: ts}

    runner.history.cluster = cluster
    return synchronous(runner, steps, session, built, feeds, problem, cluster, trace_step,
                       background)


class StepOnce:
    """A synchronous step's fetch (the loss its training step computed, and the graph's
    reports), and beside the loss, on the servers, a count of the steps applied and the last
    one's fetch. A step whose session the watchdog closed after its update had run is then
    not run a second time (a stalled step applied twice drifts the run from one process's). It
    cannot see a step cancelled part way through its update (some variables updated, the
    count not): that step runs again."""

    def __init__(self, built):
        tf = import_tf()
        with built.graph.as_default(), tf.name_scope("step_once"):
            fetch = {"loss": built.loss, **built.reports}
            with tf.compat.v1.colocate_with(built.loss.op):
                self.applied = _kept(tf, tf.constant(0, tf.int64), "applied")
            kept = {}
            for name, tensor in fetch.items():
                with tf.compat.v1.colocate_with(tensor.op):
                    kept[name] = _kept(tf, tf.zeros([], tensor.dtype), name, any_shape=True)
            with tf.control_dependencies([built.train]):
                keeps = [kept[name].assign(tensor, read_value=False)
                         for name, tensor in fetch.items()]
            with tf.control_dependencies(keeps):
                counted = self.applied.assign_add(1, read_value=False)
            with tf.control_dependencies([counted]):
                self.fetch = {name: tf.identity(tensor) for name, tensor in fetch.items()}
            self.kept = {name: variable.read_value() for name, variable in kept.items()}
            self.init = tf.compat.v1.variables_initializer([self.applied, *kept.values()])

    def start(self, session, options=None) -> None:
        """Set up the count (0) and the kept fetch on the servers."""
        session.run(self.init, options=options)

    def ran(self, session, before: int) -> dict | None:
        """After a stall: the fetch of the step that followed ``before`` applied steps, if
        its update ran (read from the servers), else None."""
        if session.run(self.applied) == before + 1:
            return session.run(self.kept)
        return None


def _kept(tf, initial, name: str, any_shape: bool = False):
    return tf.compat.v1.Variable(initial, trainable=False, name=name, use_resource=True,
                                 collections=[], validate_shape=not any_shape,
                                 shape=tf.TensorShape(None) if any_shape else None)


def ps_plan(cluster):
    job = "ps" if "ps" in cluster.addresses else next(iter(cluster.addresses))
    return PlacementPlan.round_robin(cluster, job=job, compute=f"/job:{job}/task:0")
