"""Export a step as a Chrome trace (chrome://tracing, ui.perfetto.dev)."""

from __future__ import annotations

import json
from pathlib import Path

from dtflab import names


def chrome_trace(step, path=None) -> dict:
    """A ``StepTrace`` as a dict in the Trace Event Format; written to ``path`` if given.
    (``StepTrace.to_chrome_trace`` calls this; the type is not imported back: no circle.)

    One process per task, one thread per device, every op a complete ("X") event, and every
    cross-task transfer a flow ("s" -> "f") from the end of its producer to the end of the
    receiving RPC (or, where TF recorded no RPC, to the first op that used the tensor).
    Times are microseconds from the step start.
    """
    tasks = sorted({names.task(d) for d in step.devices})
    pids = {task: number + 1 for number, task in enumerate(tasks)}
    tids: dict[str, int] = {}
    events: list[dict] = []
    for task in tasks:
        events.append({"ph": "M", "name": "process_name", "pid": pids[task], "tid": 0,
                       "args": {"name": task}})
    for device in step.devices:
        pid = pids[names.task(device)]
        tids[device] = sum(1 for d in tids if names.task(d) == names.task(device)) + 1
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[device],
                       "args": {"name": device.rsplit("/", 1)[-1]}})
    for device, timings in step.timings.items():
        for timing in timings:
            events.append({"ph": "X", "name": timing.name, "cat": timing.kind,
                           "pid": pids[names.task(device)], "tid": tids[device],
                           "ts": timing.start_us, "dur": max(timing.duration_us, 0.001),
                           "args": {"op": timing.op, "device": device}})
    ops = {(t.device, t.name): t for timings in step.timings.values() for t in timings}
    for number, transfer in enumerate(step.transfers, start=1):
        producer = ops.get((transfer.src_device, transfer.producer))
        consumers = [ops[transfer.dst_device, c] for c in transfer.consumers
                     if (transfer.dst_device, c) in ops]
        if transfer.start_us is not None:  # the receiver's RPC record
            end = transfer.start_us + (transfer.duration_us or 0)
        elif consumers:  # TF does not always record the RPC: the first use of the tensor
            end = min(c.start_us for c in consumers)
        else:
            continue
        begin = producer.end_us if producer else end
        common = {"name": "transfer", "cat": "transfer", "id": number,
                  "args": {"tensor": transfer.tensor_name, "bytes": transfer.nbytes,
                           "shape": list(transfer.shape or ()), "dtype": transfer.dtype}}
        events.append({**common, "ph": "s", "pid": pids[names.task(transfer.src_device)],
                       "tid": tids[transfer.src_device], "ts": min(begin, end)})
        events.append({**common, "ph": "f", "bp": "e", "pid": pids[names.task(transfer.dst_device)],
                       "tid": tids[transfer.dst_device], "ts": end})
    trace = {"traceEvents": events, "displayTimeUnit": "ms",
             "otherData": {"generator": "dtflab", "step_us": step.step_us}}
    if path is not None:
        Path(path).write_text(json.dumps(trace))
    return trace
