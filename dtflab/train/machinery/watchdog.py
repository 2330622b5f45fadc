"""The watchdog: a run never waits silently.

A worker whose step has run for far longer than its usual step time is *stalled*. The bound is
``max(floor_s, factor x the median of its last 50 step times)``, and ``first_step_s`` before it
has finished a step (the first step builds the graph on every task). The watchdog then

- says so in ``history.stalls`` and ``history.status`` ("worker:1 stalled at step 57: ..."),
  which the live dashboard shows under its plots;
- asks the loop to recover: loops that run ``tf.compat.v1`` sessions close the stalled
  worker's session, which cancels the step inside TensorFlow, open a new one and run the same
  batch again (a synchronous step whose update had already run is not: see
  ``sessions.StepOnce``), up to ``retries`` times in a row; after that the worker (in a
  synchronous loop, the run) ends with a ``TaskError`` saying it stalled at step N.

``all_reduce`` cannot cancel a collective: a stall that lasts ``1 + retries`` times its bound
restarts every worker from a checkpoint, or ends the run with a ``StallError``.
``ps_strategy`` only reports a stall (its coordinator owns the call).

Where the loop can read its tasks' CPU time (the worker programs' loops on this machine's
processes: ``watch_cpu``), a step's clock stops while they work: a stalled collective's tasks sit
idle (0.0 CPU seconds in 5 s, measured), a starved one's work slowly (a notebook on Binder's
one shared CPU: a first step past 90 s), and only the first is a stall. A step whose tasks
work for ``BUSY_PATIENCE`` times its bound is a stall all the same (a task spinning in a loop).

In [1]: train.async_parameter_server(problem, cluster, watchdog=train.Watchdog(floor_s=2))
In [2]: train.async_parameter_server(problem, cluster, watchdog=None)   # no watchdog
"""

from __future__ import annotations

import collections
import contextlib
import statistics
import threading
import time
from dataclasses import dataclass

#: How often the watchdog looks (seconds).
CHECK_EVERY_S = 0.25
#: Tasks that used this share of one CPU since the last look are working, not stalled.
BUSY_SHARE = 0.02
#: A step whose tasks work throughout is a stall after this many times its bound.
BUSY_PATIENCE = 10


def _check(name: str, value, minimum: float, *, whole: bool = False, inclusive: bool = False):
    """A Watchdog setting: a number (``whole``: an integer) above ``minimum`` (or equal to it)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or (whole and value != int(value)) or value < minimum or (
            value == minimum and not inclusive):
        need = f"{'a whole number' if whole else 'a number'} {'>=' if inclusive else '>'} {minimum:g}"
        default = getattr(Watchdog, name)
        raise ValueError(f"Watchdog({name}={value!r}): {name} must be {need}; "
                         f"for example Watchdog({name}={default!r}), the default")


@dataclass(frozen=True)
class Watchdog:
    """When a step counts as stalled, and how often a stalled step is retried.

    ``factor`` x the worker's median step time, but never less than ``floor_s`` seconds;
    ``first_step_s`` for a worker's first step; ``retries`` new sessions in a row before the
    worker gives up (0: give up at once)."""

    factor: float = 20.0
    floor_s: float = 5.0
    first_step_s: float = 30.0
    retries: int = 2

    def __post_init__(self):
        _check("factor", self.factor, 1, inclusive=True)
        _check("floor_s", self.floor_s, 0)
        _check("first_step_s", self.first_step_s, 0)
        _check("retries", self.retries, 0, whole=True, inclusive=True)


def settings(watchdog) -> Watchdog | None:
    """The loops' ``watchdog=`` argument: a Watchdog, True (the defaults) or None/False (off)."""
    if watchdog is True:
        return Watchdog()
    if watchdog is None or watchdog is False:
        return None
    if not isinstance(watchdog, Watchdog):
        raise ValueError(f"watchdog={watchdog!r}: pass train.Watchdog(factor=..., floor_s=..., "
                         f"first_step_s=..., retries=...), True for the defaults, or None to switch it off")
    return watchdog


@dataclass
class Stall:
    """One stalled step. ``outcome``: "stalled" while it lasts, then "recovered" (a new
    session ran it), "resumed" (it finished by itself) or "gave up"."""

    worker: str
    step: int
    waited_s: float
    bound_s: float
    usual_s: float | None
    outcome: str = "stalled"

    def __str__(self) -> str:
        who = "the run" if self.worker == "all" else self.worker
        usual = f"its steps take {self.usual_s * 1000:.0f} ms" if self.usual_s else "its first step"
        text = (f"{who} stalled at step {self.step}: no step for {self.waited_s:.1f} s "
                f"({usual}; bound {self.bound_s:.1f} s)")
        return text if self.outcome == "stalled" else f"{text}; {self.outcome}"


class Stalled(Exception):
    """Raised inside a loop's step when the watchdog's stall ends it there: the loop then
    recovers the step (a new session, a restart from a checkpoint) or gives up."""

    def __init__(self, stall: Stall):
        super().__init__(str(stall))
        self.stall = stall


class Watch:
    """The watchdog of one run: a thread that looks at every worker's step in progress."""

    def __init__(self, settings: Watchdog, history, on_stall=None):
        self.settings, self.history = settings, history
        self.on_stall = on_stall  # called once per stall, from the watchdog's thread
        self._lock = threading.Lock()
        self._began: dict[str, tuple[int, float]] = {}  # worker -> (step, when it began)
        self._times: dict[str, collections.deque] = {}
        self._current: dict[str, Stall] = {}  # the stall each worker is in, if any
        self._paused: set[str] = set()  # workers the loop is recovering on purpose
        self._busy_s: dict[str, float] = {}  # worker -> seconds its step's tasks worked
        self._cpu_s = None  # the tasks' CPU seconds so far (watch_cpu), or None
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def watch_cpu(self, cpu_seconds) -> None:
        """Stop a step's clock while ``cpu_seconds()`` (the CPU seconds every task of the run
        has used, or None where it cannot tell) grows: for loops whose workers step together,
        where one stalled task leaves every other one waiting idle."""
        self._cpu_s = cpu_seconds

    # -- from the loop's threads ------------------------------------------------------------

    def begin(self, worker: str, step: int) -> None:
        with self._lock:
            self._began[worker] = (step, time.monotonic())
            self._busy_s[worker] = 0.0

    def end(self, worker: str) -> None:
        """The step in progress finished (or the worker ended)."""
        with self._lock:
            began = self._began.pop(worker, None)
            stall = self._current.pop(worker, None)
            if began is not None and stall is None:
                self._times.setdefault(worker, collections.deque(maxlen=50)).append(
                    time.monotonic() - began[1])
        if stall is not None and stall.outcome == "stalled":
            stall.outcome = "resumed"  # the history holds this object: its status follows

    def stalled(self, worker: str) -> Stall | None:
        """The stall ``worker`` is in now, if any."""
        with self._lock:
            return self._current.get(worker)

    def timed_out(self, worker: str) -> Stall:
        """The stall of ``worker``'s step that TensorFlow's operation timeout ended with every
        task alive, before the watchdog's bound (a starved machine, not a failed task): noted
        as the watchdog notes one, for the loop to recover the same way."""
        with self._lock:
            stall = self._current.get(worker)
            noted = stall is None
            if noted:
                step, began = self._began.get(worker, (0, time.monotonic()))
                stall = self._stalled_now(worker, step, time.monotonic() - began)
        if noted:
            self.history.note_stall(stall)
        return stall

    def _stalled_now(self, worker: str, step: int, waited_s: float) -> Stall:
        """A new stall of ``worker`` at ``step``, held as its current one (the lock held)."""
        times = self._times.get(worker)
        stall = Stall(worker, step, waited_s, self.bound_s(worker),
                      statistics.median(times) if times else None)
        self._current[worker] = stall
        return stall

    def waited_s(self, worker: str) -> float:
        """How long ``worker``'s step in progress has run (0 if none is)."""
        with self._lock:
            began = self._began.get(worker)
        return time.monotonic() - began[1] if began is not None else 0.0

    def settle(self, worker: str, outcome: str) -> None:
        """The loop's answer to a stall: "recovered" (a new session is running the step) or
        "gave up"."""
        with self._lock:
            stall = self._current.pop(worker, None)
            if worker in self._began and outcome == "recovered":
                self._began[worker] = (self._began[worker][0], time.monotonic())
                self._busy_s[worker] = 0.0
        if stall is not None:
            stall.outcome = outcome

    # -- the stall policy every loop follows ---------------------------------------------------

    def retries_left(self, tries: int) -> bool:
        """Whether a stalled step that has had ``tries`` new sessions in a row may have one
        more (the loop then renews it and calls ``settle(worker, "recovered")``)."""
        return tries < self.settings.retries

    def outlasted_retries(self, worker: str) -> Stall | None:
        """For a step that cannot be renewed (a collective): its stall, once it has lasted
        ``1 + retries`` times its bound (the time a session loop spends on its retries), on the
        clock the bound is held to (``_idle_s``: its tasks' idle time, where it is read)."""
        stall = self.stalled(worker)
        with self._lock:
            idle = self._idle_s(worker, time.monotonic())
        if stall is not None and idle >= stall.bound_s * (1 + self.settings.retries):
            return stall
        return None

    def give_up(self, worker: str, failure: str) -> None:
        """The end of a stall nothing could recover: ``failure`` goes into the history's
        failures and the stall says "gave up"."""
        self.history.failures.append(failure)
        self.settle(worker, "gave up")

    @contextlib.contextmanager
    def paused(self, worker: str):
        """Not watching ``worker`` for the block (the loop restores a task); its step's clock
        starts again after it."""
        with self._lock:
            self._paused.add(worker)
        try:
            yield
        finally:
            with self._lock:
                self._paused.discard(worker)
                if worker in self._began:
                    self._began[worker] = (self._began[worker][0], time.monotonic())
                    self._busy_s[worker] = 0.0

    def _idle_s(self, worker: str, now: float) -> float:
        """The clock a bound is held to: the seconds ``worker``'s step has run while its tasks
        sat idle, or its whole time over ``BUSY_PATIENCE`` (the lock held)."""
        began = self._began.get(worker)
        if began is None:
            return 0.0
        waited = now - began[1]
        return max(waited - self._busy_s.get(worker, 0.0), waited / BUSY_PATIENCE)

    def bound_s(self, worker: str) -> float:
        times = self._times.get(worker)
        if not times:
            return self.settings.first_step_s
        return max(self.settings.floor_s, self.settings.factor * statistics.median(times))

    # -- the thread -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="dtflab-watchdog", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _watch(self) -> None:
        looked, cpu = time.monotonic(), self._read_cpu()
        while not self._closed.wait(CHECK_EVERY_S):
            now, found, before, cpu = time.monotonic(), [], cpu, self._read_cpu()
            working = (cpu is not None and before is not None
                       and cpu - before >= BUSY_SHARE * (now - looked))
            with self._lock:
                for worker, (step, began) in self._began.items():
                    if working:
                        self._busy_s[worker] = self._busy_s.get(worker, 0.0) + now - looked
                    if (worker not in self._current and worker not in self._paused
                            and self._idle_s(worker, now) > self.bound_s(worker)):
                        found.append(self._stalled_now(worker, step, now - began))
            looked = now
            for stall in found:
                self.history.note_stall(stall)
                if self.on_stall is not None:
                    self.on_stall(stall.worker)

    def _read_cpu(self) -> float | None:
        try:
            return self._cpu_s() if self._cpu_s is not None else None
        except Exception:  # a cluster stopping under the watchdog: wall time only, this look
            return None
