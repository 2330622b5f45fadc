"""What the loops that train in worker programs share (``train.all_reduce``,
``train.sharded_data_parallel``): their checked arguments, the programs started with
``dtflab.run``, the notebook's end of their reports, and restarts after a death or a stall.

How the records come back: every worker writes a JSON line per step to the notebook's
listener (``dtflab.train.machinery.reports``), and the runner turns them into ``StepRecord`` objects
(``time_s`` is when the notebook received the step, from the moment every worker had set up
its collectives). Stop goes the other way, as a ``stop`` line to every worker; the workers
agree on the last step in their next check (every ``check_every`` steps). Each worker program
runs ``dtflab.train.worker_programs.loop``'s step loop around its own step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path

from dtflab import names, scratch
from dtflab.cluster.task import log_tail
from dtflab.errors import StallError, TaskError
from dtflab.train import problems
from dtflab.train.layouts import tasks as layout
from dtflab.train.layouts.layout import Layout, said_as
from dtflab.train.machinery.checkpoints import Recovery
from dtflab.train.machinery.reports import EVERY_INTERFACE, LOOPBACK, Reports, WorkerDied
from dtflab.train.machinery.logdir import keep_profiles
from dtflab.train.machinery.options import RunOptions
from dtflab.train.machinery.runner import Update, new_runner
from dtflab.train.machinery.watchdog import Stalled
from dtflab.train.worker_programs.contract import GO, Flags


@dataclasses.dataclass(frozen=True)
class Loop:
    """What one worker-program loop brings: its program, how its history is named and what
    every other worker waits in when one dies (``collective``), and what its trace shows."""

    program: Path
    kind: str  # RunHistory.kind
    title: str  # RunHistory.name, before " (N workers)"
    collective: str  # "all-reduce": "every other worker waits for it in the all-reduce"
    trace_note: str


@dataclasses.dataclass(frozen=True)
class ProgramOptions(RunOptions):
    """What every loop that trains in worker programs takes beside its own: a run's options
    and theirs (``train.all_reduce``'s docstring says what each does). A loop takes them as
    ``**options`` and shows them in its signature with ``takes_options(ProgramOptions)``."""

    workers: int | None = None
    layout: object = None
    checkpoint_every: int | None = None
    checkpoint_dir: str | None = None
    timeout: float = 60.0
    start_method: str | None = None
    collective_timeout_s: float | None = None
    threads: int | None = None
    lockstep: bool = False
    check_every: int = 10
    watchdog: object = True
    backend: str | None = None
    scheduler: str | None = None
    client: object = None

    @property
    def elsewhere(self) -> bool:
        """The programs run on another machine's Dask workers."""
        return self.scheduler is not None or self.client is not None

    def checked(self, problem, loop: str, **shorthand) -> "ProgramOptions":
        """Checked before anything starts (one line naming the bad value and the fix); the
        layout (``layout=``, or the one ``workers=`` and the loop's own ``shorthand`` build:
        2 data ways when left out) and the workers as a count, ``slow`` by task, the
        watchdog's settings."""
        from dtflab import checks
        from dtflab.cluster import MAX_THREADS
        from dtflab.spec import parse_count

        watchdog = RunOptions.checked(self).without(
            loop, predict="runs worker programs: train.run_layout prices it with the planner"
        ).watchdog
        if self.inputs is not None:
            self.inputs.check_problem(problem)
        workers = None if self.workers is None else parse_count(self.workers, "workers")
        with said_as(self.layout is not None, data="workers"):
            run_layout = Layout.given(self.layout, loop, {"data": 2}, data=workers, **shorthand)
            workers = run_layout.alone("data", loop)
            run_layout.without(loop, micro_batches="runs the whole slice at once",
                               schedule="has no pipeline", expert="trains a dense model",
                               sequence_parallel="has no tensor ways").fits(problem)
        checks.seconds(self.timeout, "timeout", example=60)
        if self.collective_timeout_s is not None:
            checks.seconds(self.collective_timeout_s, "collective_timeout_s", example=30)
        if self.threads is not None:
            checks.whole(self.threads, "threads", maximum=MAX_THREADS, example=1)
        chosen = layout.worker_tasks(workers)
        slow = checks.tasks_in(self.slow, "slow", chosen, example={chosen[-1]: 0.05})
        if self.checkpoint_every is not None:
            checks.whole(self.checkpoint_every, "checkpoint_every", example=10)
        checks.whole(self.check_every, "check_every", example=10)
        if self.elsewhere and not self.checkpoint_dir and (self.checkpoint_every
                                                           or self.trace_step is not None):
            what = "checkpoint_every" if self.checkpoint_every else "trace_step"
            raise ValueError(f"{what} on a Dask cluster needs checkpoint_dir, a folder this "
                             f"machine and every worker's host share (on NFS, say), where the "
                             f"workers write their checkpoints and profiles; for example "
                             f"checkpoint_dir='/shared/dtflab-run'")
        return dataclasses.replace(self, workers=workers, layout=run_layout, slow=slow,
                                   watchdog=watchdog)


def train_in_programs(loop: Loop, problem, options: ProgramOptions, *, flags=None, details=None):
    """Start ``loop.program`` on ``options.workers`` workers and run them to the end
    (``options`` already :meth:`~ProgramOptions.checked`); the RunHistory, or a BackgroundRun
    with ``background=True``. ``flags`` are the program's own (``Flags`` fields, e.g.
    ``bucket_bytes``); ``details`` go into ``history.details`` as they are (the loop's
    formulas). ``scheduler`` or ``client`` (``backend="dask"``) run the programs on a Dask
    cluster's workers: the listener is then on every interface, and each worker reports to
    this machine's address on the interface that routes to its host (``{client_host}``)."""
    from dtflab.cluster import run as run_programs

    o = options
    lockstep = o.lockstep or any(getattr(callback, "between_steps", False)
                                 for callback in o.callbacks)
    folder = o.checkpoint_dir or (scratch.folder(loop.kind)
                                  if o.checkpoint_every or o.trace_step is not None else "")
    reports = Reports(o.workers, EVERY_INTERFACE if o.elsewhere else LOOPBACK)
    args = Flags(problem=problems.to_json(problem), steps=o.steps, seed=o.seed,
                 report=f"{{client_host}}:{reports.port}", slow=json.dumps(o.slow or {}),
                 checkpoint_dir=folder, checkpoint_every=o.checkpoint_every or 0,
                 trace_step=-1 if o.trace_step is None else o.trace_step,
                 trace_dir=os.path.join(folder, "trace") if folder else "",
                 threads=o.threads or 0, lockstep=lockstep, check_every=o.check_every,
                 timeout=o.collective_timeout_s or 0,
                 inputs=o.inputs.to_json() if o.inputs is not None else "",
                 **(flags or {})).argv()
    cluster = None
    try:
        cluster = run_programs(loop.program, *args, workers=o.workers, timeout=o.timeout,
                               start_method=o.start_method, backend=o.backend,
                               scheduler=o.scheduler, client=o.client)
        cluster.let_tasks_reach(reports.port)
    except BaseException:
        reports.close()
        if cluster is not None:
            cluster.stop()
        if folder and not o.checkpoint_dir:
            scratch.remove(folder)
        raise
    runner = new_runner(loop.kind, f"{loop.title} ({o.workers} workers)", o, problem=problem,
                        cluster=cluster, on_stop=reports.send_stop,
                        workers=layout.worker_tasks(o.workers))
    history = runner.history
    if runner.watch is not None:  # a worker stalled in a collective leaves the others idle
        runner.watch.watch_cpu(cluster.cpu_seconds)
    history.step_reports = o.workers  # every worker reports every step
    history.details["fingerprints"] = {worker: [] for worker in history.workers}
    history.details["state_bytes"] = {}
    history.details["memory"] = {}
    history.details["step_peak_bytes"] = {}
    history.reads["overlap_share"] = overlap_share
    history.details["report_port"] = reports.port
    history.details["layout"] = o.layout
    history.details["threads"] = o.threads  # each worker's intra- and inter-op; None: every core
    history.details.update(details or {})
    if o.inputs is not None:
        history.details["inputs"] = o.inputs
    job = _Job(cluster, reports, history, o.checkpoint_every, o.timeout, lockstep, runner.watch,
               o.trace_step, loop.collective)

    def body():
        try:
            job.start()
            runner.restart_clock()
            runner.loop(None, job.step, stop_here=False)
            cluster.wait(timeout=o.timeout)
            if o.trace_step is not None and folder:
                profiles = _profiles(Path(folder, "trace"), history.workers)
                history.trace = _worker_trace(profiles, loop.trace_note)
                keep_profiles(history, profiles)  # before the folder goes, for XProf
        finally:
            reports.close()
            cluster.stop_letting_tasks_reach(reports.port)
            cluster.stop()
            if folder and not o.checkpoint_dir:
                scratch.remove(folder)

    return runner.run(body, background=o.background)


class _Job:
    """The worker programs of one run, seen from the notebook: their step reports, and the
    restart of all of them after one died or the run stalled (when they checkpoint)."""

    #: How often a worker that crashed in the traced step is restarted to trace it again.
    TRACE_RETRIES = 2

    def __init__(self, cluster, reports, history, checkpoint_every, timeout, lockstep, watch,
                 trace_step=None, collective="all-reduce"):
        self.cluster, self.reports, self.history = cluster, reports, history
        self.collective = collective
        self.checkpoint_every, self.timeout, self.lockstep = checkpoint_every, timeout, lockstep
        self.watch, self.trace_step = watch, trace_step
        self.trace_retries = self.TRACE_RETRIES
        self.last_step = -1
        self.recorded = False  # the previous step's records went through the runner

    def start(self) -> None:
        try:
            hellos = self.reports.accept(self.cluster, self.timeout)
        except WorkerDied as died:
            raise self._error(died, f"{died.status} before its first step") from None
        # where each worker reached this notebook: 127.0.0.1, or this machine's address
        self.history.details["reported_to"] = {w: h["reached"] for w, h in sorted(hellos.items())}

    def step(self, _):
        """The next step's records, one per worker; ``None`` once every worker is done."""
        if self.lockstep and self.recorded:
            self.reports.send(GO)
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
            # Each worker reports its slice's summed loss: the global batch's loss per example
            # is their sum over the batch, the same on every worker's curve.
            loss = sum(m["loss_sum"] for m in messages) / sum(m["examples"] for m in messages)
            updates = []
            for message in messages:
                if message["fingerprint"] is not None:
                    self.history.details["fingerprints"][message["worker"]].append(
                        message["fingerprint"])
                updates.append(Update(loss, message["examples"], message["step"],
                                      message["worker"],
                                      input_wait_s=message.get("input_wait_s")))
                for key in ("state_bytes", "memory"):  # what the worker holds, when it says
                    if message.get(key):
                        self.history.details[key][message["worker"]] = message[key]
                if message.get("step_peak_bytes") is not None:
                    self.history.details["step_peak_bytes"].setdefault(
                        message["worker"], []).append(message["step_peak_bytes"])
            self.last_step, self.recorded = messages[0]["step"], True
            return updates

    def _after_death(self, died: WorkerDied) -> None:
        step = self.last_step + 1
        if self.watch is not None and self.watch.stalled("all") is not None:
            self.watch.settle("all", "a task had died")
        if step == self.trace_step and died.status.startswith("exited with code -") and self.trace_retries:
            # TensorFlow's profiler crashed (see worker_programs.loop): a checkpoint from just
            # before this step is there, so every worker restarts from it and traces it again.
            self.trace_retries -= 1
            crash = self._error(died, f"{died.status} in the traced step {step}")
            self.history.failures.append(f"{crash}; TensorFlow's profiler crashes now and then "
                                         f"on a loaded machine: every worker restarted at step "
                                         f"{step} to trace it again")
            self._restart_all(died.worker, step)
            return
        self.history.failures.append(f"{died.worker} {died.status} during step {step}: every "
                                     f"other worker waits for it in the {self.collective}, so the "
                                     f"whole job stopped")
        if not self.checkpoint_every:
            raise self._error(died, f"{died.status} during step {step}; every other worker waits "
                                    f"for it in the {self.collective}, so the whole job stopped "
                                    f"(pass checkpoint_every=K to resume from a checkpoint)") from None
        self._restart_all(died.worker, step)

    def _error(self, died: WorkerDied, what: str) -> TaskError:
        return TaskError(*names.split(died.worker), what,
                         log_tail=log_tail(self.cluster.logs(*names.split(died.worker))))

    def _waiting(self) -> None:
        """While no report comes: a stall that has lasted ``1 + retries`` times its bound (the
        time a session loop spends on its new sessions) is given up on."""
        stall = self.watch.outlasted_retries("all") if self.watch is not None else None
        if stall is not None:
            raise Stalled(stall)

    def _after_stall(self, stall) -> None:
        """A collective cannot be cancelled from here: without checkpoints the run ends with a
        StallError; with them every worker restarts from the newest one."""
        waited = self.watch.waited_s("all")
        if not self.checkpoint_every:
            error = StallError(stall, f"still no step after {waited:.1f} s, so the run ended "
                                      f"(pass checkpoint_every=K to restart every worker from a "
                                      f"checkpoint instead)")
            self.watch.give_up("all", str(error))
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


def _profiles(folder: Path, workers: list[str]) -> dict[str, Path]:
    """Each worker's profile of the traced step (its newest ``xplane.pb``), by worker."""
    from dtflab.train.worker_programs.loop import trace_folder

    files = {}
    for worker in workers:
        found = sorted(Path(trace_folder(str(folder), worker)).glob("plugins/profile/*/*.xplane.pb"))
        if found:
            files[worker] = found[-1]
    return files


def _worker_trace(profiles: dict[str, Path], note: str):
    """The profiled step of every worker as one StepTrace (timings only)."""
    from dtflab.tracing.profile import read_xplane_files
    from dtflab.tracing.step import StepTrace

    timings = read_xplane_files({names.full(worker): path for worker, path in profiles.items()})
    ends = [t.end_us for device in timings.values() for t in device]
    return StepTrace(None, {}, [], [], timings, max(ends, default=0.0), note=note)


def overlap_share(trace) -> float | None:
    """The share of a traced step's collective time the workers also computed (hidden under
    compute; mean over workers); ``None`` without collectives."""
    shares = trace.collective_overlap()
    return sum(shares.values()) / len(shares) if shares else None
