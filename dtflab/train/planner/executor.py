"""One step of a graph, simulated as TensorFlow's executors would run it on this machine: every
op priced from the calibration (``Hardware.op_costs``), every edge between tasks priced as the
gRPC transfer it will be, and the tasks' executors run side by side (pure Python).

Each task runs its ops on its inter-op threads, an op starting when its inputs have arrived
and a thread is free (the earliest-made ready op first); every op running on any task shares
the machine's cores (``Hardware.cpus``): with more running than cores, each runs that much
slower, and while another core runs an op too, each keeps the share of its speed alone that
the calibration measured with every core busy (``Hardware.together``: multiplies and
memory-bound ops apart). A tensor another task needs is sent once per task, when its op ends, and arrives a
transfer later (``op_costs["transfer"]``: a trip's latency plus bytes at its rate, as measured
inside a running step), taking no core of the simulation's: the measured trip holds the
copies gRPC makes. The step starts after the framework's fixed cost (``per_step_s``: the client's
call and its feed). A collective (a worker program's) is ready once every member of its group,
on every task, has its inputs, and then runs as an op does, on a thread of its task, for its
cost a call (``op_costs["collective_ring"]`` for a gather or an all-reduce,
``"collective_pair"`` for one side of a broadcast, which ``op_costs.program_costs`` sets to 0:
a reduce-scatter's broadcasts run together) and its bytes at the transfer's rate: traced
ZeRO steps showed their collectives' work and their arithmetic hardly overlapping (on one
worker, 61 ms of arithmetic and 120 of collective work in a 188 ms step).

What it cannot see: Grappler's rewrites (an op folded away is still priced at the fixed
cost), the executor running cheap ops inline on the thread that readied them, caches warmer
or colder than in the calibration, and other programs on the machine.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from dtflab.train.planner.hardware import Hardware
from dtflab.train.planner.op_costs import CACHE_SPAN

#: The price classes a step's time is reported by, as ``planner.graph_ops.kind`` names them,
#: and ``transfer`` (tensors between tasks).
KINDS = ("matrix", "elementwise", "transcendental", "reduce", "scatter", "move", "update", "free",
         "transfer", "collective")


def op_seconds(op, hardware: Hardware) -> float:
    """One op alone on a core: a multiply's arithmetic at the calibrated rate for its size (a
    rate timed with the op's fixed cost in it), or the executor's fixed cost for its class
    and its bytes at the class's measured cost a byte (read between its cost on tensors that
    fit a core's cache and on ones that do not, by the op's bytes on a log scale); either with
    what an op of a whole step costs beyond one of a chain (``op_costs["dispatch"]``)."""
    if op.kind == "collective":
        latency, per_byte = hardware.op_costs.get("transfer", (hardware.node.latency, 0.0))
        family = "pair" if op.type.startswith("CollectiveBcast") else "ring"
        return (hardware.op_costs.get(f"collective_{family}", (latency, 0.0))[0]
                + op.nbytes * per_byte)
    fixed, per_byte = hardware.op_costs.get(op.kind, hardware.op_costs.get("elementwise",
                                                                             (hardware.per_op_s,
                                                                              0.0)))
    dispatch = hardware.op_costs.get("dispatch", (0.0, 0.0))[0]
    if op.kind == "matrix" and op.flops:
        unit = op.unit_flops or op.flops  # a batch of small multiplies runs at a small one's rate
        return op.flops / hardware.matrix_rate(unit) + dispatch  # timed with the fixed cost in
    if op.kind in hardware.cached and op.nbytes:  # a small op's tensors sit in the cache
        small_bytes, small_per_byte = hardware.cached[op.kind]
        share = (math.log(op.nbytes) - math.log(small_bytes)) / math.log(CACHE_SPAN)
        share = min(max(share, 0.0), 1.0)
        per_byte = small_per_byte + share * (per_byte - small_per_byte)
    return fixed + dispatch + op.nbytes * per_byte


def transfer_seconds(nbytes: float, hardware: Hardware) -> float:
    """A tensor sent from one task to another inside a step (gRPC; ``op_costs["transfer"]``,
    else the link's)."""
    if "transfer" in hardware.op_costs:
        latency, per_byte = hardware.op_costs["transfer"]
        return latency + nbytes * per_byte
    return hardware.node.latency + nbytes / hardware.node.bandwidth


@dataclass
class Predicted:
    """A simulated step: its ``seconds`` (with the framework's fixed cost), each op's and each
    transfer's ``(task, name, type, kind, start_s, end_s)`` in ``spans``, and by task the
    seconds its ops ran, by kind (``busy``)."""

    seconds: float
    spans: list = field(default_factory=list)
    busy: dict = field(default_factory=dict)

    def parts(self) -> dict:
        """The busiest task's seconds by kind, ``idle`` (its share of the step with nothing
        running) and ``framework``: what this step is predicted to spend on each."""
        task = max(self.busy, key=lambda t: sum(self.busy[t].values()))
        by_kind = {kind: self.busy[task].get(kind, 0.0) for kind in KINDS}
        return {**by_kind, "task": task, "total": self.seconds}


def simulate(ops, hardware: Hardware, threads: int) -> Predicted:
    """Run ``ops`` (``planner.graph_ops.step_ops``) on ``hardware`` with ``threads`` inter-op
    threads a task; a placeholder's batch is sent from the client to its task as the step
    starts."""
    feeds = {op.name: op.outputs[0] for op in ops if op.type == "Placeholder" and op.outputs}
    index = {op.name: i for i, op in enumerate(ops)}
    cores = max(hardware.cpus or 1.0, 1e-9)
    work = [op_seconds(op, hardware) for op in ops]
    # one transfer per (producer's output, task that needs it): TensorFlow sends it once
    waits: list[set] = [set() for _ in ops]  # what each op waits for: op or transfer keys
    consumers: dict = {}  # key -> ops that wait for it
    transfers: dict = {}  # (producer, output, task) -> bytes
    for i, op in enumerate(ops):
        for producer, output in op.inputs:
            j = index.get(producer)
            if j is None:
                continue
            key = j if ops[j].task == op.task else (j, output, op.task)
            if key != j:
                transfers[key] = ops[j].outputs[output] if output < len(ops[j].outputs) else 0
            waits[i].add(key)
        for producer in op.after:
            j = index.get(producer)
            if j is None:
                continue
            key = j if ops[j].task == op.task else (j, -1, op.task)
            if key != j:
                transfers.setdefault(key, 0)
            waits[i].add(key)
    groups: dict = {}
    for i, op in enumerate(ops):
        if op.group:
            groups.setdefault(op.group, []).append(i)
    for members in groups.values():  # a collective waits for every member's inputs
        every = set().union(*(waits[i] for i in members))
        for i in members:
            waits[i] = set(every)
    for i, keys in enumerate(waits):
        for key in keys:
            consumers.setdefault(key, []).append(i)
    by_producer: dict = {}
    for key in transfers:
        by_producer.setdefault(key[0], []).append(key)

    tasks = sorted({op.task for op in ops})
    start_at = hardware.per_step_s + (len(tasks) - 1) * hardware.op_costs.get("task", (0, 0))[0]
    now = 0.0
    free_threads = {task: threads for task in tasks}
    ready = {task: [] for task in tasks}
    remaining: dict = {}  # running job -> CPU seconds left (job: op index or transfer key)
    started: dict = {}
    timed: list = []  # (time, order, job) for delays that take no core
    spans, busy = [], {task: {} for task in tasks}
    left = [len(keys) for keys in waits]
    order = 0
    waiting_after: dict = {}
    together = hardware.together
    speed_class = {i: "matrix" if op.kind == "matrix" else "memory" for i, op in enumerate(ops)}

    def release(key, at):
        for i in consumers.get(key, ()):
            left[i] -= 1
            if left[i] == 0:
                heapq.heappush(ready[ops[i].task], i)

    def finish(job, at):
        nonlocal order
        if isinstance(job, int):
            op = ops[job]
            spans.append((op.task, op.name, op.type, op.kind, start_at + started[job],
                          start_at + at))
            busy[op.task][op.kind] = busy[op.task].get(op.kind, 0.0) + at - started[job]
            free_threads[op.task] += 1
            release(job, at)
            for key in by_producer.get(job, ()):  # its tensors leave for the tasks that need them
                started[key] = at
                whole = transfer_seconds(transfers[key], hardware)
                if hardware.transfer_cores > 0:  # gRPC's work first, on a core; then the wait
                    speed_class[key] = "transfer"
                    remaining[key] = whole * hardware.transfer_cores
                    waiting_after[key] = whole * (1 - hardware.transfer_cores)
                else:
                    heapq.heappush(timed, (at + whole, order, key))
                    order += 1
        elif job in waiting_after:  # its copy done: the rest of the trip takes no core
            heapq.heappush(timed, (at + waiting_after.pop(job), order, job))
            order += 1
        else:
            producer = ops[job[0]]
            spans.append((job[2], f"{producer.name}:{max(job[1], 0)} from {producer.task}",
                          "RecvTensor", "transfer", start_at + started[job], start_at + at))
            busy[job[2]]["transfer"] = busy[job[2]].get("transfer", 0.0) + at - started[job]
            release(job, at)

    for i, keys in enumerate(waits):
        if not keys:
            if ops[i].name in feeds:  # the client's feed arrives first
                heapq.heappush(timed, (transfer_seconds(feeds[ops[i].name], hardware), order, i))
                order += 1
            else:
                heapq.heappush(ready[ops[i].task], i)
    fed = set(item[2] for item in timed)
    done = 0
    while done < len(ops):
        for task in tasks:
            while free_threads[task] and ready[task]:
                i = heapq.heappop(ready[task])
                free_threads[task] -= 1
                remaining[i] = work[i]
                started[i] = now
        if not remaining and not timed:
            raise RuntimeError(f"the simulated step stopped with {len(ops) - done} ops never "
                               f"ready (a cycle, or an input outside the graph)")
        share = min(1.0, cores / len(remaining)) if remaining else 1.0
        crowded = len(remaining) >= 2 and cores >= 2  # other cores busy: memory and caches shared
        rates = {job: share * (together.get(speed_class[job], 1.0) if crowded else 1.0)
                 for job in remaining}
        step = min((left_s / rates[job] for job, left_s in remaining.items()),
                   default=float("inf"))
        if timed and timed[0][0] - now < step:
            step = timed[0][0] - now
        now += step
        for job in list(remaining):
            remaining[job] -= rates[job] * step
            if remaining[job] <= 1e-12:
                del remaining[job]
                finish(job, now)
                if isinstance(job, int):
                    done += 1
        while timed and timed[0][0] <= now + 1e-12:
            _, _, job = heapq.heappop(timed)
            if isinstance(job, tuple):  # a tensor arrived
                waiting_after.pop(job, None)
                finish(job, now)
            elif job in fed:  # a feed arrived: the placeholder is ready
                heapq.heappush(ready[ops[job].task], job)
    return Predicted(start_at + now, spans, busy)
