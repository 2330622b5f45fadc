"""Each kind of op's share of a step, predicted (``planner.executor``'s simulation, as
``predicted_run.timeline`` draws it) and traced: where a prediction and its run part
(``Prediction.against`` and ``.differences``).
"""

from __future__ import annotations

from dtflab.train.planner import executor, graph_ops


#: Each kind in the words a learner reads (``Prediction.differences``): what the ops do.
WORDS = {"matrix": "matrix multiplies", "elementwise": "element-wise arithmetic",
         "transcendental": "exponentials, tanh and softmax", "reduce": "sums and means",
         "scatter": "gradients of slices", "move": "copies, slices and casts",
         "update": "optimizer updates", "free": "reshapes, variable reads and other bookkeeping",
         "transfer": "tensors sent between tasks", "collective": "collectives between workers"}


def by_device(predicted, traced) -> dict[str, dict[str, tuple[float, float]]]:
    """Each device's kinds of op, ``{device: {kind: (predicted ms, traced ms)}}``: on each
    device every moment something runs is split evenly among the ops running then (threads and
    transfers overlap), each op's share counted to its kind, so each side adds up to the
    device's busy time. Traced ops are classed by :func:`traced_kind`. A profiled worker
    program's kernels each carry their share of the executor's work around them
    (``tracing.profile.with_executor_time``), as a simulated op's cost does; its collectives in
    flight on the collective thread (a wait for the other worker among them) count only in
    moments when no kernel runs: the step waiting on them."""
    ours, theirs = _shares(predicted), _shares(traced)
    return {device: {kind: (ours.get(device, {}).get(kind, 0.0),
                            theirs.get(device, {}).get(kind, 0.0))
                     for kind in executor.KINDS
                     if kind in ours.get(device, {}) or kind in theirs.get(device, {})}
            for device in sorted({*ours, *theirs})}


def by_kind(predicted, traced) -> list[tuple[str, float, float]]:
    """Each kind of op's share of the step in milliseconds, ``(kind, predicted, traced)``, the
    devices summed (:func:`by_device`), largest difference first."""
    return summed(by_device(predicted, traced))


def summed(devices: dict) -> list[tuple[str, float, float]]:
    """A :func:`by_device` answer's kinds, the devices summed, largest difference first."""
    rows = {}
    for kinds in devices.values():
        for kind, (ours, theirs) in kinds.items():
            before = rows.get(kind, (0.0, 0.0))
            rows[kind] = (before[0] + ours, before[1] + theirs)
    ordered = [(kind, *rows[kind]) for kind in executor.KINDS if kind in rows]
    return sorted(ordered, key=lambda row: -abs(row[1] - row[2]))


def gap(kinds: dict, kind: str) -> float:
    """Predicted less traced milliseconds of ``kind`` on one device (a :func:`by_device` row)."""
    predicted, traced = kinds.get(kind, (0.0, 0.0))
    return predicted - traced


def _shares(trace) -> dict[str, dict[str, float]]:
    from dtflab.tracing.profile import in_flight, with_executor_time

    total = {}
    for device, timings in trace.timings.items():
        events = []
        for timing in with_executor_time(timings):
            kind = traced_kind(timing)
            if kind is not None:
                side = "waits" if in_flight(timing) else "work"
                events += [(timing.start_us, 1, kind, side), (timing.end_us, -1, kind, side)]
        running, last, mine = {"work": {}, "waits": {}}, None, {}
        for at, change, kind, side in sorted(events, key=lambda e: (e[0], e[1])):
            now = running["work"] if sum(running["work"].values()) else running["waits"]
            count = sum(now.values())
            if last is not None and count:
                for name, n in now.items():
                    mine[name] = mine.get(name, 0.0) + (at - last) * n / count / 1e3
            running[side][kind] = running[side].get(kind, 0) + change
            last = at
        if mine:
            total[device] = mine
    return total


def traced_kind(timing) -> str | None:
    """The price class of one traced event, None for the runtime's own. A ``Session.run``'s
    step stats give an op's type (``MatMul``) or a transfer; the profiler's events of a worker
    program name a kernel ``name:Type`` (a collective's: its start on the executor's thread,
    its exchange on the collective thread, each named so, waits for the peer included), its
    collective executor's events name a collective, and its other events are the runtime's.
    oneDNN's ``_Mkl`` and ``_Fused`` names read as the op they stand for."""
    from dtflab.tracing.step import PROFILED_KERNEL

    if timing.kind not in ("compute", "transfer"):
        return None
    op = timing.op
    if PROFILED_KERNEL.match(timing.name):
        op = timing.name.split(":")[1]
        if timing.kind == "transfer" and graph_ops.kind(op) != "collective":
            return "transfer"  # a _Recv's kernel
    elif timing.thread and "Collective" in timing.name:  # the collective executor's own
        return "collective"
    elif timing.kind == "transfer":
        return "transfer"
    return graph_ops.kind(op.replace("_Mkl", "").replace("_Fused", ""))
