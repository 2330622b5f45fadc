"""What a training run did, step by step: one type for every loop."""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field


#: The first step (from 0) that ``RunHistory.median_step_s`` counts: the three before it are
#: the run's start-up (the first has no start to time it from).
FIRST_COUNTED_STEP = 3


@dataclass(frozen=True)
class StepRecord:
    """One applied update. ``loss`` is per example; ``time_s`` counts from the run's start;
    ``staleness`` is how many updates other workers applied between this worker's read of
    the parameters and its write (0 for synchronous loops)."""

    step: int
    worker: str
    loss: float
    time_s: float
    examples: int
    staleness: int = 0
    #: Seconds the step waited for its batch after the previous step ended (None: not timed)
    input_wait_s: float | None = None


@dataclass
class RunHistory:
    """Per-step loss, wall time, examples/s, steps per worker and, for async, staleness; it
    knows no strategy: each hands it what its views read (``details``, ``reads``).

    ``steps``, ``losses`` and ``summary()`` count one way for every loop: one per step of
    training. Where every worker reports every step (the loops in worker programs set
    ``step_reports`` to their worker count) ``records`` holds a record per worker per step;
    ``step_records`` merges each step's into one.

    Safe to read while a background run appends to it (``records`` only grows).
    """

    name: str
    loop: str
    workers: list[str] = field(default_factory=lambda: ["all"])  # who adds records
    records: list[StepRecord] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # "worker:1 failed: ..." lines
    recoveries: list = field(default_factory=list)  # train.machinery.checkpoints.Recovery, one each
    stalls: list = field(default_factory=list)  # train.machinery.watchdog.Stall, one per stalled step
    stopped_early: bool = False
    wall_s: float = 0.0
    trace: object = None  # the StepTrace of the step asked for with trace_step=, if any
    cluster: object = field(default=None, repr=False)  # what it trained on (None: one process)
    details: dict = field(default_factory=dict)  # loop-specific figures, named in its docstring
    #: The step as predicted before the run (``train.run_layout``: a ``planner.predicted_run.Prediction``)
    prediction: object = None
    #: The run's folder of TensorBoard files (``train.machinery.logdir``), None where it wrote none
    logdir: str | None = None
    step_reports: int = 1  # records one step makes: a synchronous loop's workers each report it
    #: What a strategy's traced step tells, each ``name: function(trace)``, read as
    #: ``history.name`` (a pipeline's ``bubble``, all-reduce's ``overlap_share``).
    reads: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, record: StepRecord) -> None:
        with self._lock:
            self.records.append(record)

    def note_stall(self, stall) -> None:
        """The watchdog saw a stall (it sets the stall's outcome when it ends)."""
        with self._lock:
            self.stalls.append(stall)

    @property
    def status(self) -> str:
        """The latest stall, as the watchdog says it now ("" while there was none)."""
        with self._lock:
            return str(self.stalls[-1]) if self.stalls else ""

    def __getattr__(self, name):
        # A reading a strategy handed over (``reads``): computed from the traced step when
        # asked for, ``None`` without one.
        reads = self.__dict__.get("reads", {})
        if name in reads:
            return reads[name](self.trace) if self.trace is not None else None
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def since(self, count: int) -> list[StepRecord]:
        """Records after the first ``count`` (for streaming to a live plot)."""
        with self._lock:
            return self.records[count:]

    @property
    def step_records(self) -> list[StepRecord]:
        """One record per step of training, in step order of first report: where several
        workers report each step, their records merged (the step's loss, the examples of
        every worker, the time the last one reported it, worker ``"all"``). A step trained
        again after a restart counts once, as its last run."""
        with self._lock:
            records = list(self.records)
        if self.step_reports == 1:
            return records
        steps: dict[int, list[StepRecord]] = {}
        for record in records:
            group = steps.setdefault(record.step, [])
            if len(group) == self.step_reports:  # the step again, after a restart
                group.clear()
            group.append(record)
        return [merged(group) for group in steps.values()]

    @property
    def losses(self) -> list[float]:
        return [r.loss for r in self.step_records]

    def input_wait_share(self, last_s: float | None = None) -> float | None:
        """The share of the run's time (after its first step; ``last_s``: its last seconds)
        spent waiting for batches: the sum of each step's wait over the time from the first
        step's end to the last's, per worker where each runs its own steps (asynchronous
        training). None where the loop does not time its input, or too few steps ran."""
        records = self.step_records
        if last_s is not None and records:
            records = [r for r in records if r.time_s >= records[-1].time_s - last_s]
        if len(records) < 2 or any(r.input_wait_s is None for r in records[1:]):
            return None
        span = records[-1].time_s - records[0].time_s
        workers = len({r.worker for r in records})
        return sum(r.input_wait_s for r in records[1:]) / (span * workers) if span > 0 else None

    def median_step_s(self) -> float:
        """The median step after the first two (a run's start-up), the slowest worker's where
        every worker reports, the traced step and the one after it left out (tracing slows
        them): what a step of this run takes."""
        by_worker = {}
        for record in self.records:
            by_worker.setdefault(record.worker, []).append(record.time_s)
        medians = []
        for times in by_worker.values():
            gaps = [b - a for a, b in zip(times[FIRST_COUNTED_STEP - 1:],
                                          times[FIRST_COUNTED_STEP:])]
            if self.trace is not None and len(gaps) > 2:
                gaps = gaps[:-2]
            if gaps:
                medians.append(statistics.median(gaps))
        if not medians:
            raise ValueError(f"{self.name}: {len(self.records)} steps recorded; a step is "
                             f"measured from the fourth on: run steps=6 or more")
        return max(medians)

    @property
    def steps(self) -> int:
        """Steps of training (one per update, however many workers report it)."""
        return len(self.step_records) if self.step_reports > 1 else len(self.records)

    @property
    def examples(self) -> int:
        return sum(r.examples for r in self.records)

    @property
    def examples_per_s(self) -> float:
        wall = self.wall_s or (self.records[-1].time_s if self.records else 0.0)
        return self.examples / wall if wall > 0 else 0.0

    @property
    def steps_per_worker(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for record in self.records:
            counts[record.worker] = counts.get(record.worker, 0) + 1
        return counts

    @property
    def staleness(self) -> list[int]:
        return [r.staleness for r in self.records]

    def final_loss(self, last: int = 20) -> float:
        """Mean per-example loss over the last ``last`` steps."""
        tail = self.losses[-last:]
        return sum(tail) / len(tail) if tail else float("nan")

    def summary(self) -> str:
        text = (f"{self.name} ({self.loop}): {self.steps} steps in {self.wall_s:.1f} s, "
                f"{self.examples_per_s:,.0f} examples/s, final loss {self.final_loss():.4g}")
        if any(self.staleness):
            text += f", mean staleness {sum(self.staleness) / len(self.staleness):.2f}"
        waiting = self.input_wait_share()
        if self.details.get("inputs") is not None and waiting is not None:
            text += f", {waiting:.0%} of the time waiting for input"
        if self.failures:
            text += "; " + "; ".join(self.failures)
        if self.recoveries:
            text += "; " + "; ".join(map(str, self.recoveries))
        if self.stalls:
            text += "; " + "; ".join(map(str, self.stalls))
        return text

    def __repr__(self) -> str:
        return f"<RunHistory {self.summary()}>"


def merged(group: list[StepRecord]) -> StepRecord:
    """One step's records, one a worker, as the step's: its loss, the examples of every worker,
    the time the last one reported it, worker ``"all"``."""
    return StepRecord(group[0].step, "all", sum(r.loss for r in group) / len(group),
                      max(r.time_s for r in group), sum(r.examples for r in group),
                      max(r.staleness for r in group), _longest_wait(group))


def _longest_wait(group: list[StepRecord]) -> float | None:
    """A step's wait for input where every worker waits for its own slice: the longest (the
    step is held up that long)."""
    waits = [r.input_wait_s for r in group if r.input_wait_s is not None]
    return max(waits) if waits else None
