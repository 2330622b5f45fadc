"""Time TF2 code (eager ops, ``tf.function``) on a connected cluster with the TF profiler.

What TensorFlow 2.21 gives for TF2 code on remote tasks, measured: ``RunMetadata`` stays empty
(no partition graphs, no step stats), so there is no partition view and no transfer list. The
profiler does work: every task of a ``local`` cluster serves it on its own port, and a capture
returns each task's threads with the kernels they ran. That is what this module reads.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import re
import tempfile
import threading
from pathlib import Path

from dtflab import tf_private
from dtflab._quiet import import_tf, quiet_fds
from dtflab.errors import NotSupportedError
from dtflab.tracing.step import PROFILED_KERNEL, OpTiming, StepTrace

NOISE = re.compile(r"^ThreadpoolListener::|^\$")
TRANSFER = re.compile(r"Recv|Send|CopyToDevice|Collective", re.I)  # collectives move tensors too
#: ``0`` in this variable: a graph loop's traced step is kept without its tasks' profiles
#: (:func:`profiles_kept`).
PROFILE_ENV = "DTFLAB_PROFILE"


def profile(cluster, fn, *args, duration_ms: int = 1000, **kwargs) -> StepTrace:
    """Call ``fn(*args, **kwargs)`` over and over for ``duration_ms`` while every task is
    profiled; return the per-task timings as a :class:`StepTrace` (timings only).

    In [1]: cluster.connect()
    In [2]: timings = dtflab.profile(cluster, step, batch)
    In [3]: timings.show()

    ``fn`` runs once first, unprofiled (tracing and sending the function to the tasks). Needs
    a cluster whose tasks serve the profiler (the ``local`` backend). Times are microseconds
    from the first event captured; tasks on one machine share its clock.
    """
    ports = getattr(cluster, "profiler_ports", None)
    if not ports:
        raise NotSupportedError(
            f"dtflab.profile needs task servers that run the TensorFlow profiler; the "
            f"{cluster.backend} backend has none: start the cluster with --backend local")
    import_tf()  # quietly, before the profiler client imports it
    profiler_client = tf_private.profiler_client()

    fn(*args, **kwargs)
    calls, failure = [0], []
    stop = threading.Event()

    def keep_calling():
        try:
            while not stop.is_set():
                fn(*args, **kwargs)
                calls[0] += 1
        except Exception as exc:  # reported below, in the caller's thread
            failure.append(exc)

    service = _service(cluster, ports)
    worker = threading.Thread(target=keep_calling, name="dtflab-profile", daemon=True)
    with tempfile.TemporaryDirectory(prefix="dtflab-profile-") as logdir:
        worker.start()
        try:
            with quiet_fds():
                profiler_client.trace(service, logdir, duration_ms, num_tracing_attempts=3)
        finally:
            stop.set()
            worker.join()
        if failure:
            raise failure[0]
        timings = read_xplanes(Path(logdir), ports)
    ends = [t.end_us for device in timings.values() for t in device]
    note = (f"TF profiler: {calls[0]} calls of {getattr(fn, '__name__', 'fn')} in "
            f"{duration_ms} ms; TensorFlow gives no partitions or transfers for TF2 code")
    return StepTrace(None, {}, [], [], timings, max(ends, default=0.0), note=note)


def profiles_kept() -> bool:
    """Whether a graph loop that writes TensorBoard files also profiles every task of its
    traced step for XProf (the capture holds every task for 0.3-3 s): yes unless
    ``$DTFLAB_PROFILE`` is ``0``. A worker program's step is read from its profiles, so those
    are kept whatever it says."""
    return os.environ.get(PROFILE_ENV, "1").strip() != "0"


def profiled(cluster, fn, *, duration_ms: int = 1500) -> tuple[object, dict[str, bytes]]:
    """``fn()`` called once while TensorFlow's profiler records every task of ``cluster``: its
    result and each task's profile (the ``xplane.pb`` XProf reads), by task (``worker:0``).
    ``{}`` for a cluster whose tasks serve no profiler (only the ``local`` backend's do), or
    where the capture failed. Whatever ``fn`` does after ``duration_ms`` (less the 0.2 s the
    capture is given to start) is not recorded."""
    ports = getattr(cluster, "profiler_ports", None) or {}
    if not ports:
        return fn(), {}
    import_tf()
    profiler_client = tf_private.profiler_client()
    service = _service(cluster, ports)
    failed = []

    def capture(folder):
        try:
            with quiet_fds():
                profiler_client.trace(service, folder, duration_ms, num_tracing_attempts=1)
        except Exception as error:  # noqa: BLE001 - the step's result stands without it
            failed.append(error)

    with tempfile.TemporaryDirectory(prefix="dtflab-profile-") as folder:
        capturing = threading.Thread(target=capture, args=(folder,), name="dtflab-profile",
                                     daemon=True)
        capturing.start()
        try:
            capturing.join(0.2)  # the capture's requests reach the tasks
            result = fn()
        finally:
            capturing.join()
        profiles = {f"{job}:{index}": path.read_bytes()
                    for (job, index), path in _captured(Path(folder), ports).items()}
    return result, profiles


def read_xplanes(logdir: Path, ports: dict[tuple[str, int], int]) -> dict[str, list[OpTiming]]:
    """Every task's events from one profiler capture of the tasks serving on ``ports``."""
    return read_xplane_files({f"/job:{job}/replica:0/task:{index}/device:CPU:0": path
                              for (job, index), path in _captured(logdir, ports).items()})


def _service(cluster, ports: dict[tuple[str, int], int]) -> str:
    """The profiler client's address list for the tasks serving on ``ports``."""
    endpoints = cluster.endpoints  # parsed once, not once per task
    return ",".join(f"grpc://{endpoints[key][0]}:{port}" for key, port in ports.items())


def _captured(logdir: Path, ports: dict[tuple[str, int], int]) -> dict[tuple[str, int], Path]:
    """Each task's file of one capture into ``logdir`` (the client names it by the port)."""
    by_port = {port: key for key, port in ports.items()}
    files = {}
    for path in logdir.glob("plugins/profile/*/*.xplane.pb"):
        port = int(path.name.split(".xplane.pb")[0].rsplit("_", 1)[1])
        if port in by_port:
            files[by_port[port]] = path
    return files


def read_xplane_files(files: dict[str, Path]) -> dict[str, list[OpTiming]]:
    """``{device: xplane.pb}``: one device per file, times relative to the earliest event."""
    xplane_pb2 = tf_private.xplane_pb2()
    raw = []
    for device, path in files.items():
        space = xplane_pb2.XSpace()
        space.ParseFromString(Path(path).read_bytes())
        for plane in space.planes:
            for line in plane.lines:
                for event in line.events:
                    name = plane.event_metadata[event.metadata_id].name
                    if NOISE.search(name):
                        continue
                    start_ns = line.timestamp_ns + event.offset_ps / 1000
                    raw.append((device, name, line.name, start_ns, event.duration_ps / 1e6))
    t0 = min((r[3] for r in raw), default=0)
    timings: dict[str, list[OpTiming]] = {}
    for device, name, thread, start_ns, duration_us in raw:
        kind = ("transfer" if TRANSFER.search(name) else
                "compute" if PROFILED_KERNEL.match(name) else "runtime")
        timings.setdefault(device, []).append(OpTiming(
            device, name, thread.split("/")[0], (start_ns - t0) / 1000, duration_us, kind, thread))
    return timings


#: The executor's event around the kernels it runs in a row on one thread.
PROCESS = "ExecutorState::Process"
#: The thread TensorFlow runs a collective's exchange on, from its start to its end.
COLLECTIVE_THREAD = "collective_ops"


def in_flight(timing: OpTiming) -> bool:
    """Whether ``timing`` is a collective in flight: an event of the collective thread, which
    spans the exchange and any wait for its peers (nested events for one collective, and
    several collectives at once), not a thread's work."""
    return timing.thread.split("/")[0] == COLLECTIVE_THREAD


def with_executor_time(timings: list[OpTiming]) -> list[OpTiming]:
    """One device's profiled events with each kernel given its share of the executor's work
    around it: the kernels one ``ExecutorState::Process`` event ran on its thread are laid end
    to end across that event, each lengthened by an equal share of the time between them (the
    executor's own per-op work, which the profiler records outside the kernels). Events of a
    ``Session.run`` (no thread) and events outside a Process event are kept as they are."""
    by_thread: dict[str, list[OpTiming]] = {}
    for timing in timings:
        by_thread.setdefault(timing.thread, []).append(timing)
    kept = []
    for thread, events in by_thread.items():
        processes = sorted((t for t in events if t.name == PROCESS), key=lambda t: t.start_us)
        if not thread or not processes:
            kept += events
            continue
        inside: dict[int, list[OpTiming]] = {}
        starts = [p.start_us for p in processes]
        for timing in sorted(events, key=lambda t: t.start_us):
            at = _within(processes, starts, timing) if PROFILED_KERNEL.match(timing.name) else None
            if at is None:
                kept.append(timing)
            else:
                inside.setdefault(at, []).append(timing)
        for at, kernels in inside.items():
            process, start = processes[at], processes[at].start_us
            share = max(0.0, process.duration_us - sum(k.duration_us for k in kernels)) / len(kernels)
            for kernel in kernels:
                kept.append(dataclasses.replace(kernel, start_us=start,
                                                duration_us=kernel.duration_us + share))
                start += kernel.duration_us + share
    return kept


def _within(processes: list[OpTiming], starts: list[float], timing: OpTiming) -> int | None:
    """The index of the Process event (sorted by ``starts``) that holds ``timing``, or None."""
    at = bisect.bisect_right(starts, timing.start_us) - 1
    if at >= 0 and timing.end_us <= processes[at].end_us + 1e-3:
        return at
    return None
