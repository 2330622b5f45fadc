"""Every run's TensorBoard files: one folder per run, named by its loop and layout, under a run
directory (``logdir=``; by default ``$DTFLAB_LOGDIR``, or ``runs/<notebook>`` beside it).

- **Scalars**, per step: ``loss``, ``step_time_s``, ``examples_per_s`` (``tokens_per_s`` for a
  transformer), ``input_wait_s`` where the input is timed; steps that come faster than one
  each 10 ms (``EVERY_S``) as their means over 10 ms, at the latest one's loss. Where several
  workers report each step, the step's merged figures are the run's and each worker's are in
  a sub-run of its own (``worker-0``), so TensorBoard draws them on one chart.
- **At the end**: memory by kind per device (what the workers reported, or the traced step's
  allocator records), bytes sent per task (the traced step's transfers; ``WireBytes``' count at
  the transport), and the prediction (``predicted``, a sub-run) beside each measured figure.
- **HParams**: the run's loop, layout, schedule, ZeRO stage, recomputation, precision and model,
  with ``final/loss``, ``final/step_time_s`` and ``final/peak_memory_bytes`` as its metrics.
- **The traced step**: a graph loop's ``RunMetadata`` (TensorBoard's Graphs tab, compute time
  and memory per node); the profile of every worker of a worker program, or of every task of
  a graph loop on a ``local`` cluster, where the profiler plugin (XProf) reads it
  (``plugins/profile/<session>/<task>.xplane.pb``).

Writing never fails a run: a folder that cannot be written is said once, and the run trains on.
A step only queues its figures (1.1 us a step, 3.5 us a worker's report: measured with
20,000 records); a thread of the run's log makes them into events and writes them every 0.5 s
(``FLUSH_S``), with their checksums in C (:mod:`dtflab.train.machinery.events`).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import threading
import time
import warnings
from pathlib import Path

from dtflab.train.machinery.callbacks import Callback
from dtflab.train.machinery.events import EventFile
from dtflab.train.machinery.history import merged
from dtflab.train.machinery.traced_memory import step_memory

#: Where runs go when a loop is not given ``logdir=``: this variable, or ``runs`` (relative to
#: the working folder: a notebook's kernel runs beside the notebook; ``run_directory``).
ENV, DEFAULT = "DTFLAB_LOGDIR", "runs"
NOTEBOOK = "JPY_SESSION_NAME"  # the notebook's path, in each kernel Jupyter's server starts
FLUSH_S = 0.5  # seconds between writes of a run's queued events to its files
EVERY_S = 0.01  # the least run time between two steps' figures: faster ones go as their means


def run_directory(logdir) -> Path | None:
    """The folder runs go in: ``logdir`` as given; for None, ``$DTFLAB_LOGDIR``, else
    ``runs/<notebook>`` in a notebook's kernel (``runs/14_plan_a_run``), else ``runs``; ``False``
    for none at all."""
    if logdir is False:
        return None
    if logdir is None or logdir is True:
        notebook = os.environ.get(NOTEBOOK, "")
        logdir = os.environ.get(ENV) or (os.path.join(DEFAULT, Path(notebook).stem)
                                         if notebook.endswith(".ipynb") else DEFAULT)
    if not isinstance(logdir, (str, os.PathLike)):
        raise ValueError(f"logdir={logdir!r}: a folder's path (str), or False to write no "
                         f"TensorBoard files")
    return Path(logdir).expanduser()


def run_name(loop: str, layout=None, when: float | None = None) -> str:
    """``pipeline-p2-mb4-1f1b-1128-081502``: the loop, the layout's ways and levers that are not
    their defaults, and the time it started (month, day, time of day)."""
    parts = [loop]
    if layout is not None:
        parts += [f"{axis[0]}{ways}" for axis, ways in layout.ways.items() if ways > 1]
        if layout.expert > 1:
            parts.append(f"e{layout.expert}")
        if layout.micro_batches > 1:
            parts.append(f"mb{layout.micro_batches}")
        if layout.pipeline > 1:
            parts.append(layout.schedule + (f"{layout.chunks}" if layout.chunks > 1 else ""))
        parts += [f"zero{layout.zero}"] * bool(layout.zero)
        parts += [f"recompute-{layout.recompute}"] * (layout.recompute != "none")
        parts += [layout.precision] * (layout.precision != "float32")
        parts += ["sp"] * layout.sequence_parallel
    parts.append(time.strftime("%m%d-%H%M%S", time.localtime(when)))
    return re.sub(r"[^\w.-]", "_", "-".join(parts))


def hparams(history, problem) -> dict:
    """What the HParams table lines runs up by: the loop, its layout and its model."""
    found = {"loop": history.loop}
    layout = history.details.get("layout")
    if layout is not None:
        found.update(layout.ways, expert=layout.expert, micro_batches=layout.micro_batches,
                     schedule=layout.schedule if layout.pipeline > 1 else "none",
                     zero=layout.zero, recompute=layout.recompute, precision=layout.precision,
                     sequence_parallel=layout.sequence_parallel)
    if problem is not None:
        found.update(model=problem.name, batch_size=problem.batch_size)
    return found


class RunLog(Callback):
    """Writes one run's TensorBoard files into ``folder`` (see the module's docstring). Made by
    :func:`run_log`; the runner calls it like any callback."""

    def __init__(self, where: Path, problem=None, callbacks=()):
        self.where, self.problem, self.callbacks = where, problem, callbacks
        self.folder: Path | None = None  # this run's, made as it starts
        self._writers: dict[str, object] = {}  # one a run and sub-run, made by the flusher
        self._groups: dict[int, list] = {}  # a step's records until every worker's is in
        self._last: dict[str, float] = {}  # each clock's last written step's time
        self._since: dict[str, list] = {}  # each clock's steps since: start, steps, examples,
        #                                     wait, and the latest (run, record)
        self._failed = False
        self._queued: collections.deque = collections.deque()  # (run, Event), for the flusher
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._error: Exception | None = None  # what the flusher met, said at the run's end

    # -- the runner's calls ----------------------------------------------------------------

    def on_run_start(self, history) -> None:
        self.folder = self._made(run_name(history.loop, history.details.get("layout")))
        if self.folder is None:
            return
        history.logdir = str(self.folder)
        from tensorboard.plugins.hparams import summary_v2

        if history.loop != "trace":  # a step traced alone is no row of the layouts' table
            self._guarded(lambda: self._write("", 0, summary_v2.hparams_pb(
                hparams(history, self.problem), trial_id=self.folder.name)))
        self._flusher = threading.Thread(target=self._flush_every, name="dtflab-run-log",
                                         daemon=True)
        self._flusher.start()

    def on_step(self, history, record) -> None:
        if self._failed or self._error is not None:
            return
        self._guarded(lambda: self._step(history, record))

    def on_run_end(self, history) -> None:
        if self.folder is None:
            return
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        try:
            if self._error is not None and not self._failed:
                self._said(self._error)
            self._guarded(lambda: self._end(history))
            self._guarded(self._flush)
        finally:
            for writer in self._writers.values():
                try:
                    writer.close()
                except Exception:  # noqa: BLE001 - said once, in _guarded, if it failed before
                    pass

    # -- what is written ---------------------------------------------------------------------

    def _step(self, history, record) -> None:
        several = history.step_reports > 1 or len(history.workers) > 1
        if several:
            self._figures(f"{record.worker.replace(':', '-')}", record.worker, record)
        if history.step_reports > 1:
            group = self._groups.setdefault(record.step, [])
            group.append(record)
            if len(group) < history.step_reports:
                return
            del self._groups[record.step]
            record = merged(group)
        if history.step_reports > 1 or not several:
            self._figures("", "all", record)

    def _figures(self, run: str, clock: str, record) -> None:
        # A step's figures, or, where steps come faster than one each EVERY_S, the mean step,
        # the examples a second and the wait over those since the last written, at the latest
        # step's loss (TensorBoard draws at most 1,000 points a curve all the same).
        since = self._since.setdefault(clock, [self._last.get(clock, 0.0), 0, 0, 0.0, None])
        since[1:4] = since[1] + 1, since[2] + record.examples, since[3] + (record.input_wait_s or 0)
        since[4] = (run, record)
        if record.time_s - since[0] >= EVERY_S or since[1] == 1 and clock not in self._last:
            self._written(clock)

    def _written(self, clock: str) -> None:
        start, steps, examples, waited, (run, record) = self._since.pop(clock)
        self._last[clock] = record.time_s
        took = record.time_s - start
        values = {"loss": record.loss, "step_time_s": took / steps}
        if took > 0:
            values["examples_per_s"] = examples / took
            sequence = getattr(self.problem, "sequence", None)
            if sequence:
                values["tokens_per_s"] = examples * sequence / took
        if record.input_wait_s is not None:
            values["input_wait_s"] = waited / steps
        self._scalars(run, record.step, values)

    def _end(self, history) -> None:
        from tensorboard.plugins.hparams import summary as hparams_summary
        from tensorboard.plugins.hparams.api_pb2 import Status

        for clock in list(self._since):  # the last steps, not yet written
            self._written(clock)

        step = history.records[-1].step if history.records else 0
        memory = _memory(history)
        for device, kinds in memory.items():
            self._scalars(device.replace(":", "-"), step, {f"memory/{k}": v for k, v in kinds.items()})
        for task, sent in _bytes_sent(history, self.callbacks).items():
            self._scalars(task.replace(":", "-"), step, sent)
        finals = {"final/loss": history.final_loss()} if history.records else {}
        with contextlib.suppress(ValueError):  # timed from a worker's fourth step: maybe none
            finals["final/step_time_s"] = history.median_step_s()
        peaks = [kinds.get("peak", sum(kinds.values())) for kinds in memory.values()]
        if peaks:
            finals["final/peak_memory_bytes"] = max(peaks)
        self._scalars("", step, finals)
        prediction = history.prediction
        if getattr(prediction, "seconds", None) is not None:  # not a reason it has none
            predicted = {"step_time_s": prediction.seconds, "final/step_time_s": prediction.seconds,
                         **{f"memory/{k}": v for k, v in prediction.memory.items()}}
            first = history.records[0].step if history.records else 0
            self._scalars("predicted", first, predicted)
            self._scalars("predicted", step, predicted)
        self._traced_step(history, step)
        if history.loop == "trace":
            return
        failed = history.failures or history.stopped_early or not history.records
        self._write("", step, hparams_summary.session_end_pb(
            Status.STATUS_FAILURE if failed else Status.STATUS_SUCCESS))

    def _traced_step(self, history, step: int) -> None:
        metadata = getattr(history.trace, "metadata", None)
        if metadata is not None:  # a graph loop's Session.run: the Graphs tab reads it
            from tensorboard.compat.proto import event_pb2

            tagged = event_pb2.TaggedRunMetadata(tag="traced step",
                                                 run_metadata=metadata.SerializeToString())
            self._write("", step, event_pb2.Event(wall_time=time.time(), step=step,
                                                  tagged_run_metadata=tagged))

    # -- writing ---------------------------------------------------------------------------------

    def _made(self, name: str) -> Path | None:
        folder = self.where / name
        for extra in range(1, 100):  # two runs started in one second
            if not folder.exists():
                break
            folder = self.where / f"{name}-{extra}"
        try:
            folder.mkdir(parents=True)
        except OSError as error:
            self._failed = True
            why = ("a file is in the way" if isinstance(error, (FileExistsError, NotADirectoryError))
                   else error.strerror or type(error).__name__)
            warnings.warn(f"dtflab: no TensorBoard files for this run: {folder} cannot be made "
                          f"({why}); the run trains on without them; pass logdir= a folder you "
                          f"can write, or logdir=False", stacklevel=2)
            return None
        return folder

    def _writer(self, run: str):
        if run not in self._writers:
            self._writers[run] = EventFile(self.folder / run if run else self.folder)
        return self._writers[run]

    def _scalars(self, run: str, step: int, values: dict) -> None:
        if values:  # made into an Event by the flusher: a step only queues its figures
            self._queued.append((run, step, time.time(), values))

    def _write(self, run: str, step: int, summary) -> None:
        self._queued.append((run, step, time.time(), summary))

    @staticmethod
    def _event(step: int, wall_time: float, what):
        """The Event of a queued item: scalars (a dict), a Summary, or an Event as it is."""
        from tensorboard.compat.proto import event_pb2, summary_pb2

        if isinstance(what, event_pb2.Event):
            return what
        if isinstance(what, dict):
            what = summary_pb2.Summary(value=[
                summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
                for tag, value in what.items()])
        elif not isinstance(what, summary_pb2.Summary):  # TensorFlow's class, where it is loaded
            what = summary_pb2.Summary.FromString(what.SerializeToString())
        return event_pb2.Event(wall_time=wall_time, step=step, summary=what)

    def _flush_every(self) -> None:
        # A step only queues its figures; events are made, checksummed and written here, in
        # batches (TensorBoard's own writer, handed each event by the step, cost a 0.7 ms step
        # 13%; its checksum in Python took 45 us an event, google-crc32c's takes under 3 us).
        while not self._stop.wait(FLUSH_S):
            try:
                self._flush()
            except Exception as error:  # noqa: BLE001 - said in the run's thread, at its end
                self._error = error
                return

    def _flush(self) -> None:
        while self._queued:
            run, step, wall_time, what = self._queued.popleft()
            self._writer(run).write(self._event(step, wall_time, what))
        for writer in self._writers.values():
            writer.flush()

    def _guarded(self, write) -> None:
        if self._failed:
            return
        try:
            write()
        except Exception as error:  # noqa: BLE001 - logging never fails the run
            self._said(error)

    def _said(self, error: Exception) -> None:
        """Writing failed: said once, in one line; nothing more is written."""
        self._failed = True
        warnings.warn(f"dtflab: the run's TensorBoard files could not be written to "
                      f"{self.folder} ({type(error).__name__}: {error}); the run trains "
                      f"on without them; pass logdir= a folder you can write, or "
                      f"logdir=False", stacklevel=3)


def run_log(logdir, problem=None, callbacks=()) -> RunLog | None:
    """The RunLog of a new run under ``logdir`` (a loop's ``logdir=``: see
    :func:`run_directory`), or None for ``logdir=False``. Its folder is made as the run starts,
    named by the run's loop and ``history.details["layout"]``."""
    where = run_directory(logdir)
    return None if where is None else RunLog(where, problem, callbacks)


def keep_trace(trace, logdir=None, profiles: dict | None = None) -> Path | None:
    """Keep a step traced outside a run (``dtflab.trace``) for TensorBoard, in a folder of its
    own under ``logdir`` (:func:`run_directory`): its RunMetadata and each task's profile
    (``{task: xplane.pb}``, :func:`keep_profiles`). Returns the folder (None where nothing
    was written: said once, in one line)."""
    from dtflab.train.machinery.history import RunHistory

    history = RunHistory("dtflab.trace", "trace", trace=trace)
    log = run_log(logdir)
    if log is None:
        return None
    log.on_run_start(history)
    keep_profiles(history, profiles or {})
    log.on_run_end(history)
    return log.folder


def keep_profiles(history, profiles: dict) -> None:
    """Keep each task's profile of the traced step (``{task: path or bytes of its
    xplane.pb}``) in the run's folder, where the profiler plugin (XProf) lists one host per
    task; nothing where the run writes no TensorBoard files. Never raises: the run's own trace
    has been read already."""
    if not history.logdir or not profiles:
        return
    session = Path(history.logdir, "plugins", "profile", time.strftime("%Y_%m_%d_%H_%M_%S"))
    try:
        session.mkdir(parents=True, exist_ok=True)
        for worker, path in profiles.items():
            target = session / f"{worker.replace(':', '-')}.xplane.pb"
            if isinstance(path, bytes):
                target.write_bytes(path)
            else:
                shutil.copyfile(path, target)
    except OSError as error:
        warnings.warn(f"dtflab: the traced step's profiles could not be kept in {session} "
                      f"({error}); pass logdir= a folder you can write", stacklevel=2)


def _memory(history) -> dict[str, dict[str, float]]:
    """Bytes by kind per device: what the worker programs reported, else the traced step's."""
    reported = history.details.get("memory") or {}
    if reported:
        return {worker: {k: v for k, v in kinds.items() if isinstance(v, (int, float))}
                for worker, kinds in reported.items()}
    metadata = getattr(history.trace, "metadata", None)
    if metadata is None:
        return {}
    from dtflab import names

    return {names.short(device): kinds for device, kinds in step_memory(metadata).items()}


def _bytes_sent(history, callbacks) -> dict[str, dict[str, float]]:
    """Per task: the traced step's bytes sent, and WireBytes' per step at the transport."""
    from dtflab import names

    found: dict[str, dict[str, float]] = {}
    if history.trace is not None:
        for (source, _), sent in history.trace.bytes_between().items():
            row = found.setdefault(names.short(source), {"bytes_sent/traced_step": 0.0})
            row["bytes_sent/traced_step"] += sent
    for callback in callbacks:
        per_step = getattr(callback, "per_step", None)
        if per_step is not None and hasattr(per_step, "sent_by"):
            for task, sent in per_step.sent_by().items():
                found.setdefault(task, {})["bytes_sent/per_step_at_transport"] = sent
    return found
