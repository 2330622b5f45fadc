"""One runner for every training loop: the clock, the callbacks, the background thread, Stop
and the end of a run. A loop builds its model and supplies its steps; the runner does the rest.

In [1]: runner = Runner(RunHistory("mine", "single"), callbacks)
In [2]: def step(i): return Update(loss_per_example, examples)
In [3]: runner.run(lambda: runner.loop(200, step), background=True)   # a BackgroundRun

A step returns one :class:`Update`, a list of them (a loop whose results arrive late, or from
several workers at once), or ``None`` (this worker has ended). While a run goes on, a watchdog
(train.machinery.watchdog) times every step in progress; a loop that can recover a stalled step sets
``runner.on_stall``.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

from dtflab.train.machinery.history import RunHistory, StepRecord
from dtflab.train.machinery.watchdog import Watch, Watchdog


@dataclass(frozen=True)
class Update:
    """What one step applied. ``step`` and ``worker`` default to the loop's own count and
    worker name; ``loss`` is per example."""

    loss: float
    examples: int
    step: int | None = None
    worker: str | None = None
    staleness: int = 0
    input_wait_s: float | None = None


class Runner:
    """Owns one run: its history, its clock (``time_s`` of each record counts from the start
    of :meth:`run`, or from :meth:`restart_clock`), its callbacks and its Stop request."""

    def __init__(self, history: RunHistory, callbacks=(), *, on_stop=None,
                 watchdog: Watchdog | None = None):
        self.history = history
        self.callbacks = tuple(callbacks)
        self._on_stop = on_stop  # tells whoever runs the steps elsewhere (worker programs)
        self.started = time.perf_counter()
        self._stop = threading.Event()
        #: ``on_stall(worker)``: the loop's way to end a stalled step (e.g. close its session).
        self.on_stall = None
        self.watch = Watch(watchdog, history, self._stalled) if watchdog is not None else None

    # -- for the user (through BackgroundRun and the dashboard) ---------------------------

    def request_stop(self) -> None:
        """End the run after the step in progress; returns at once."""
        self._stop.set()
        if self._on_stop is not None:
            self._on_stop()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    # -- for loops --------------------------------------------------------------------------

    def _stalled(self, worker: str) -> None:
        # A step that ended between the watchdog's look and now needs nothing: ending it would
        # close a session the next step then fails on, with no stall to explain it (seen in CI
        # under load: a sync run ended with "ps:0 failed ... (CancelledError)").
        if self.on_stall is not None and self.watch.stalled(worker) is not None:
            self.on_stall(worker)

    def restart_clock(self) -> None:
        """Count time from now (a loop whose first step waits on other processes starting)."""
        self.started = time.perf_counter()

    def add(self, update: Update, step: int, worker: str = "all") -> StepRecord:
        """Record one update and tell the callbacks."""
        record = StepRecord(update.step if update.step is not None else step,
                            update.worker or worker, float(update.loss),
                            time.perf_counter() - self.started, update.examples, update.staleness,
                            update.input_wait_s)
        self.history.add(record)
        for callback in self.callbacks:
            callback.on_step(self.history, record)
        return record

    def loop(self, count: int | None, step, worker: str = "all", *, stop_here: bool = True) -> None:
        """Call ``step(i)`` for i in 0..count-1 (``None``: no limit) until Stop is asked,
        recording what it returns; a step that returns ``None`` ends this loop. With
        ``stop_here=False`` the steps end themselves after a Stop (``on_stop`` told them)."""
        watch = self.watch
        try:
            for i in range(count) if count is not None else itertools.count():
                if stop_here and self.stop_requested:
                    self.history.stopped_early = True
                    return
                if watch is not None:
                    watch.begin(worker, i)
                updates = step(i)
                if watch is not None:
                    watch.end(worker)
                if updates is None:
                    self.history.stopped_early = self.stop_requested
                    return
                for update in ([updates] if isinstance(updates, Update) else updates):
                    self.add(update, i, worker)
        finally:
            if watch is not None:
                watch.end(worker)

    def in_threads(self, loops: dict[str, object]) -> None:
        """Run each ``{worker: body}`` in a thread of its own and wait for all of them. A body
        records with :meth:`add` or :meth:`loop`; what it raises is re-raised here."""
        errors: list[BaseException] = []

        def guarded(body):
            try:
                body()
            except BaseException as exc:  # re-raised in the run's thread below
                errors.append(exc)

        threads = [threading.Thread(target=guarded, args=(body,), name=f"dtflab-{worker}",
                                    daemon=True) for worker, body in loops.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def run(self, body, *, background: bool = False):
        """Run ``body()`` between ``on_run_start`` and ``on_run_end``, here (returns the history)
        or in a thread (returns a :class:`BackgroundRun` at once)."""

        def whole():
            self.restart_clock()
            for callback in self.callbacks:
                callback.on_run_start(self.history)
            if self.watch is not None:
                self.watch.start()
            try:
                body()
            finally:
                if self.watch is not None:
                    self.watch.close()
                self.history.wall_s = time.perf_counter() - self.started
                for callback in self.callbacks:
                    callback.on_run_end(self.history)

        if background:
            return BackgroundRun(self, whole)
        whole()
        return self.history


def new_runner(kind: str, title: str, options, *, problem=None, cluster=None,
               workers: list[str] | None = None, on_stop=None) -> Runner:
    """The Runner of a new run of ``kind`` (``RunHistory.loop``) as ``options`` (a checked
    ``RunOptions``) say: its history named ``options.name`` or ``title``, its callbacks, its
    watchdog and its TensorBoard files (``options.logdir``, of ``problem``)."""
    from dtflab.train.machinery.logdir import run_log

    history = RunHistory(options.name or title, kind, cluster=cluster,
                         **({} if workers is None else {"workers": list(workers)}))
    log = run_log(options.logdir, problem, options.callbacks)
    callbacks = (*options.callbacks, log) if log is not None else options.callbacks
    return Runner(history, callbacks, on_stop=on_stop, watchdog=options.watchdog)


class BackgroundRun:
    """A loop running in a thread: ``history`` grows as it goes; ``stop()`` ends it after the
    current step and keeps the history; ``wait()`` returns the history or raises its error."""

    def __init__(self, runner: Runner, target):
        self.runner, self.history, self.error = runner, runner.history, None

        def run():
            try:
                target()
            except BaseException as exc:  # kept for wait(); the dashboard shows it
                self.error = exc

        self.thread = threading.Thread(target=run, name=f"dtflab-{self.history.loop}", daemon=True)
        self.thread.start()

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    def stop(self, wait: bool = True) -> RunHistory:
        """Ask the run to end after its current step; with ``wait`` (the default), wait for it."""
        self.runner.request_stop()
        if wait:
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
