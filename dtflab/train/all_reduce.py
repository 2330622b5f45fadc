"""Synchronous all-reduce: MultiWorkerMirroredStrategy in N worker programs (ring over gRPC).

Every worker holds a full copy of the variables, trains on its slice of each global batch and
sums the gradients with the others; there is no parameter server. The workers are programs
started with ``dtflab.run`` (the same warm fork server as every local task), each running
``dtflab/train/all_reduce_worker.py``; this notebook only listens.

How the records come back: the notebook opens a TCP listener on 127.0.0.1 (let through the
cluster's private network) and every worker connects to it and writes a JSON line per step;
a thread per worker reads them into a queue, and the runner turns them into ``StepRecord``
objects (``time_s`` is when the notebook received the step, from the moment every worker had
set up its strategy). Stop goes the other way, as a ``stop`` line to every worker; the workers
agree on the last step inside the next all-reduce.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

from dtflab import names
from dtflab.cluster.task import TaskState, log_tail
from dtflab.errors import StallError, TaskError
from dtflab.train.checkpoints import Recovery
from dtflab.train.history import RunHistory
from dtflab.train.runner import Runner, Update
from dtflab.train.watchdog import Stalled

WORKER_PROGRAM = Path(__file__).with_name("all_reduce_worker.py")
#: How often a wait for a worker's next message looks at whether the worker still runs.
POLL_S = 0.5


class WorkerDied(Exception):
    """A worker program ended before it said it was done."""

    def __init__(self, worker: str, status: str):
        super().__init__(f"{worker} {status}")
        self.worker, self.status = worker, status


def all_reduce(problem, *, workers: int = 2, steps: int = 200, seed: int = 0,
               slow: dict | None = None, checkpoint_every: int | None = None,
               checkpoint_dir: str | None = None, trace_step: int | None = None,
               background: bool = False, callbacks=(), name: str | None = None,
               timeout: float = 60.0, start_method: str | None = None,
               collective_timeout_s: float | None = None, threads: int | None = None,
               lockstep: bool = False, watchdog=True):
    """Train ``problem`` with MultiWorkerMirroredStrategy in ``workers`` worker programs.

    In [1]: run = train.all_reduce(problem, workers=2, background=True)
    In [2]: Dashboard(run)

    Each worker reports the global batch's loss each step (so every worker's curve is the
    same) and a fingerprint of its weights (``history.details["fingerprints"]``: one list
    per worker, equal when the copies agree). ``slow={"worker:1": 0.05}`` makes that worker
    sleep that long before each step: a straggler. ``trace_step=k`` profiles step k on every
    worker (``history.trace``: a per-worker timeline with the collectives).

    A worker that dies stops the whole job (every other worker waits for it in the next
    all-reduce). With ``checkpoint_every=K`` each worker saves every K steps, and the run
    restarts every worker from the newest checkpoint and goes on (``history.recoveries``
    says how many steps were lost); without it the run ends with a ``TaskError``.
    ``history.cluster`` is the program cluster (running until the run ends: kill a worker
    there to see a fault). ``threads=1`` gives each worker one intra-op and one inter-op
    thread (one core each, for speedup measurements); ``collective_timeout_s`` bounds how
    long a collective waits for the others (TensorFlow's default: no limit).

    ``lockstep=True`` makes each worker wait, after each step, until this notebook has
    recorded it and run the callbacks: callbacks then see the workers between steps (what
    ``WireBytes`` needs for exact per-step bytes; it turns this on), for one local round trip
    per step. The watchdog reports a step that stalls (every worker waits in the collective);
    if it lasts ``1 + retries`` times the watchdog's bound, the run restarts every worker from
    the newest checkpoint (with ``checkpoint_every``) or ends with a ``StallError``.
    """
    from dtflab import checks
    from dtflab.cluster import MAX_THREADS
    from dtflab.cluster import run as run_programs
    from dtflab.spec import parse_count
    from dtflab.train.watchdog import settings as watchdog_settings

    checks.run_arguments(steps, seed, trace_step)
    watchdog = watchdog_settings(watchdog)
    workers = parse_count(workers, "workers")
    checks.seconds(timeout, "timeout", example=60)
    if collective_timeout_s is not None:
        checks.seconds(collective_timeout_s, "collective_timeout_s", example=30)
    if threads is not None:
        checks.whole(threads, "threads", maximum=MAX_THREADS, example=1)
    if problem.batch_size % workers:
        raise ValueError(f"the batch of {problem.batch_size} does not split into {workers} equal "
                         f"slices; choose workers that divide it, e.g. workers=2")
    chosen = [f"worker:{i}" for i in range(workers)]
    slow = checks.tasks_in(slow, "slow", chosen, example={chosen[-1]: 0.05})
    if checkpoint_every is not None:
        checks.whole(checkpoint_every, "checkpoint_every", example=10)
    lockstep = lockstep or any(getattr(callback, "between_steps", False) for callback in callbacks)
    folder = checkpoint_dir or (tempfile.mkdtemp(prefix="dtflab-allreduce-")
                                if checkpoint_every or trace_step is not None else "")
    reports = Reports(workers)
    args = [f"--problem={_escaped(json.dumps(dataclasses.asdict(problem)))}", f"--steps={steps}",
            f"--seed={seed}", f"--report=127.0.0.1:{reports.port}",
            f"--checkpoint-dir={folder}", f"--checkpoint-every={checkpoint_every or 0}",
            f"--trace-step={-1 if trace_step is None else trace_step}",
            f"--trace-dir={os.path.join(folder, 'trace') if folder else ''}",
            f"--timeout={collective_timeout_s or 0}", f"--slow={_escaped(json.dumps(slow or {}))}",
            f"--threads={threads or 0}"] + (["--lockstep"] if lockstep else [])
    try:
        cluster = run_programs(WORKER_PROGRAM, *args, workers=workers, timeout=timeout,
                               start_method=start_method)
    except BaseException:
        reports.close()
        if folder and not checkpoint_dir:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    cluster.let_tasks_reach(reports.port)
    history = RunHistory(name or f"all-reduce ({workers} workers)", "all_reduce",
                         workers=[f"worker:{i}" for i in range(workers)], cluster=cluster)
    history.details["fingerprints"] = {worker: [] for worker in history.workers}
    history.details["report_port"] = reports.port
    runner = Runner(history, callbacks, on_stop=reports.send_stop, watchdog=watchdog)
    job = _Job(cluster, reports, history, checkpoint_every, timeout, lockstep, runner.watch,
               trace_step)

    def body():
        try:
            job.start()
            runner.restart_clock()
            runner.loop(None, job.step, stop_here=False)
            cluster.wait(timeout=timeout)
            if trace_step is not None and folder:
                history.trace = _worker_trace(Path(folder, "trace"), history.workers)
        finally:
            reports.close()
            cluster.stop_letting_tasks_reach(reports.port)
            cluster.stop()
            if folder and not checkpoint_dir:
                shutil.rmtree(folder, ignore_errors=True)

    return runner.run(body, background=background)


def _escaped(text: str) -> str:
    """Braces doubled: program arguments treat ``{name}`` as a placeholder."""
    return text.replace("{", "{{").replace("}", "}}")


class _Job:
    """The worker programs of one run, seen from the notebook: their step reports, and the
    restart of all of them after one died or the run stalled (when they checkpoint)."""

    #: How often a worker that crashed in the traced step is restarted to trace it again.
    TRACE_RETRIES = 2

    def __init__(self, cluster, reports, history, checkpoint_every, timeout, lockstep, watch,
                 trace_step=None):
        self.cluster, self.reports, self.history = cluster, reports, history
        self.checkpoint_every, self.timeout, self.lockstep = checkpoint_every, timeout, lockstep
        self.watch, self.trace_step = watch, trace_step
        self.trace_retries = self.TRACE_RETRIES
        self.last_step = -1
        self.recorded = False  # the previous step's records went through the runner

    def start(self) -> dict:
        try:
            return self.reports.accept(self.cluster, self.timeout)
        except WorkerDied as died:
            raise self._error(died, f"{died.status} before its first step") from None

    def step(self, _):
        """The next step's records, one per worker; ``None`` once every worker is done."""
        if self.lockstep and self.recorded:
            self.reports.send("go")
        self.recorded = False
        while True:
            try:
                messages = self.reports.next_step(self.cluster, self._waiting)
            except WorkerDied as died:
                self._after_death(died)
                continue
            except Stalled as stalled:
                self._after_stall(stalled.stall)
                continue
            if messages is None:
                return None
            updates = []
            for message in messages:
                self.history.details["fingerprints"][message["worker"]].append(message["fingerprint"])
                updates.append(Update(message["loss"], message["examples"], message["step"],
                                      message["worker"]))
            self.last_step, self.recorded = messages[0]["step"], True
            return updates

    def _after_death(self, died: WorkerDied) -> None:
        step = self.last_step + 1
        if self.watch is not None and self.watch.stalled("all") is not None:
            self.watch.settle("all", "a task had died")
        if step == self.trace_step and died.status.startswith("exited with code -") and self.trace_retries:
            # TensorFlow's profiler crashed (see all_reduce_worker): a checkpoint from just
            # before this step is there, so every worker restarts from it and traces it again.
            self.trace_retries -= 1
            crash = self._error(died, f"{died.status} in the traced step {step}")
            self.history.failures.append(f"{crash}; TensorFlow's profiler crashes now and then "
                                         f"on a loaded machine: every worker restarted at step "
                                         f"{step} to trace it again")
            self._restart_all(died.worker, step)
            return
        self.history.failures.append(f"{died.worker} {died.status} during step {step}: every "
                                     f"other worker waits for it in the all-reduce, so the whole "
                                     f"job stopped")
        if not self.checkpoint_every:
            raise self._error(died, f"{died.status} during step {step}; every other worker waits "
                                    f"for it in the all-reduce, so the whole job stopped (pass "
                                    f"checkpoint_every=K to resume from a checkpoint)") from None
        self._restart_all(died.worker, step)

    def _error(self, died: WorkerDied, what: str) -> TaskError:
        return TaskError(*names.split(died.worker), what,
                         log_tail=log_tail(self.cluster.logs(*names.split(died.worker))))

    def _waiting(self) -> None:
        """While no report comes: a stall that has lasted ``1 + retries`` times its bound (the
        time a session loop spends on its new sessions) is given up on."""
        stall = self.watch.stalled("all") if self.watch is not None else None
        if stall is not None and self.watch.waited_s("all") >= stall.bound_s * (
                1 + self.watch.settings.retries):
            raise Stalled(stall)

    def _after_stall(self, stall) -> None:
        """A collective cannot be cancelled from here: without checkpoints the run ends with a
        StallError; with them every worker restarts from the newest one."""
        waited = self.watch.waited_s("all")
        if not self.checkpoint_every:
            error = StallError(stall, f"still no step after {waited:.1f} s, so the run ended "
                                      f"(pass checkpoint_every=K to restart every worker from a "
                                      f"checkpoint instead)")
            self.history.failures.append(str(error))
            self.watch.settle("all", "gave up")
            raise error
        self.history.failures.append(f"{stall}; no step for {waited:.1f} s: every worker restarts")
        self._restart_all("the run (stalled)", self.last_step + 1)
        self.watch.settle("all", "recovered")

    def _restart_all(self, cause: str, step: int) -> None:
        """Restart every worker (the survivors hang in a collective) from the newest checkpoint."""
        began = time.perf_counter()
        with self.watch.paused("all") if self.watch is not None else contextlib.nullcontext():
            for worker in self.history.workers:
                self.cluster.restart(*names.split(worker))
            try:
                hellos = self.reports.accept(self.cluster, self.timeout)
            except WorkerDied as died:
                raise self._error(died, f"{died.status} while every worker restarted") from None
        resumed = min(hello["resumed_at"] for hello in hellos.values())
        self.history.recoveries.append(Recovery(cause, step, resumed,
                                                time.perf_counter() - began, "every worker"))


class Reports:
    """The notebook's end of the workers' reports: a listener, a reader thread per worker."""

    def __init__(self, workers: int):
        self.workers = workers
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.queues: dict[str, queue.Queue] = {}
        self.connections: dict[str, socket.socket] = {}
        self.done: set[str] = set()
        self.stopping = False  # a Stop that came before a worker connected reaches it then

    def accept(self, cluster, timeout: float) -> dict[str, dict]:
        """Wait for every worker's ``hello``; returns them by worker."""
        for connection in self.connections.values():
            connection.close()
        self.connections, self.queues, self.done = {}, {}, set()
        hellos = {}
        deadline = time.monotonic() + timeout
        self.listener.settimeout(0.05)
        # A worker connects first and says hello once its strategy is up, which needs every
        # worker: the hellos are read in threads, so a worker that died meanwhile is noticed.
        greeted: queue.Queue = queue.Queue()
        while len(hellos) < self.workers:
            try:
                connection, _ = self.listener.accept()
                threading.Thread(target=self._hello, args=(connection, greeted),
                                 name="dtflab-reports-hello", daemon=True).start()
            except socket.timeout:
                pass
            try:
                connection, lines, hello = greeted.get(timeout=0.05)
            except queue.Empty:
                self._check_alive(cluster, waiting_for=set(hellos))
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {len(hellos)} of {self.workers} workers reported "
                                       f"within {timeout:g} s; see cluster.logs('worker:0')")
                continue
            if hello.get("kind") != "hello":
                connection.close()
                continue
            worker = hello["worker"]
            hellos[worker] = hello
            self.connections[worker] = connection
            self.queues[worker] = queue.Queue()
            if self.stopping:
                connection.sendall(b"stop\n")
            threading.Thread(target=self._read, args=(lines, self.queues[worker]),
                             name=f"dtflab-reports-{worker}", daemon=True).start()
        return hellos

    @staticmethod
    def _hello(connection, greeted: queue.Queue) -> None:
        lines = connection.makefile("r")
        try:
            hello = json.loads(lines.readline() or "{}")
        except (OSError, ValueError):
            hello = {}
        greeted.put((connection, lines, hello))

    @staticmethod
    def _read(lines, messages: queue.Queue) -> None:
        try:
            for line in lines:
                messages.put(json.loads(line))
        except (OSError, ValueError):
            pass
        messages.put({"kind": "closed"})

    def next_step(self, cluster, waiting=lambda: None) -> list[dict] | None:
        """Every worker's next ``step`` message (the same step), or ``None`` when all are done.
        ``waiting()`` is called every POLL_S while none comes (it may raise to end the wait)."""
        messages = []
        for worker in sorted(self.queues):
            while True:
                try:
                    message = self.queues[worker].get(timeout=POLL_S)
                except queue.Empty:
                    self._check_alive(cluster)
                    waiting()
                    continue
                if message["kind"] == "step":
                    messages.append(message)
                    break
                if message["kind"] == "done":
                    self.done.add(worker)
                    break
                if message["kind"] == "closed":
                    self._check_alive(cluster, wait_s=5)
        return messages or None

    def _check_alive(self, cluster, waiting_for=(), wait_s: float = 0.0) -> None:
        """Raise WorkerDied for a worker program that ended without saying it was done."""
        deadline = time.monotonic() + wait_s
        while True:
            # states(): a cheap read; tasks (with its memory figures) only for the dead ones
            dead = [name for name, state in cluster.states(programs_only=True).items()
                    if name not in self.done and name not in waiting_for
                    and state in (TaskState.KILLED, TaskState.EXITED)]
            if dead:
                # The cause first: a survivor's collective fails once its peer is gone, and it
                # may exit (code 1) before this look.
                infos = sorted((t for t in cluster.tasks if t.name in dead),
                               key=lambda t: (t.state is not TaskState.KILLED, (t.exit_code or 0) >= 0))
                first = infos[0]
                raise WorkerDied(first.name, "was killed" if first.state is TaskState.KILLED
                                 else first.status)
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def send_stop(self) -> None:
        self.stopping = True
        self.send("stop")

    def send(self, line: str) -> None:
        for connection in list(self.connections.values()):
            try:
                connection.sendall(line.encode() + b"\n")
            except OSError:  # that worker is gone: the caller finds out from its state
                pass

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close()
        self.listener.close()


def _worker_trace(folder: Path, workers: list[str]):
    """The profiled step of every worker as one StepTrace (timings only)."""
    from dtflab.tracing.profile import read_xplane_files
    from dtflab.tracing.step import StepTrace
    from dtflab.train.all_reduce_worker import trace_folder

    files = {}
    for worker in workers:
        found = sorted(Path(trace_folder(str(folder), worker)).glob("plugins/profile/*/*.xplane.pb"))
        if found:
            files[names.full(worker)] = found[-1]
    timings = read_xplane_files(files)
    ends = [t.end_us for device in timings.values() for t in device]
    return StepTrace(None, {}, [], [], timings, max(ends, default=0.0),
                     note="TF profiler on each worker program, one all-reduce step; "
                          "CollectiveReduceV2 is the all-reduce")
