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

The same play on a traced step's own durations (:func:`replay`) checks the structure (the
dependencies, the threads, the order ready ops start in) apart from the prices.
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


@dataclass
class Costs:
    """What :func:`play` charges: each op's CPU seconds alone on a core (``work``, by index), a
    tensor's trip from one task to another (``transfer(bytes, key)``, key ``(producer index,
    output, task)``) and a fed placeholder's from the client (``feed(bytes)``), the cores the
    tasks share, each speed class's share of its speed with every core busy (``together``),
    the share of a trip that takes a core (``transfer_cores``), and when each task may start
    (``start_s``: the framework's fixed cost, the same for every task, or each task's own)."""

    work: list
    transfer: object
    feed: object
    cores: float
    together: dict
    transfer_cores: float
    start_s: dict


def simulate(ops, hardware: Hardware, threads: int) -> Predicted:
    """Run ``ops`` (``planner.graph_ops.step_ops``) on ``hardware`` with ``threads`` inter-op
    threads a task, each op priced from the calibration (:func:`op_seconds`); a placeholder's
    batch is sent from the client to its task as the step starts."""
    tasks = sorted({op.task for op in ops})
    start = hardware.per_step_s + (len(tasks) - 1) * hardware.op_costs.get("task", (0, 0))[0]
    return play(ops, threads, Costs(
        work=[op_seconds(op, hardware) for op in ops],
        transfer=lambda nbytes, key: transfer_seconds(nbytes, hardware),
        feed=lambda nbytes: transfer_seconds(nbytes, hardware),
        cores=max(hardware.cpus or 1.0, 1e-9), together=hardware.together,
        transfer_cores=hardware.transfer_cores, start_s={task: start for task in tasks}))


@dataclass
class Traced:
    """A traced step's own durations, as :func:`replay` takes them: each op's seconds by
    ``(task, name)``, each tensor's trip by ``(producer, output, task)``, when each task's first
    op started (from the step's first), and the step's wall time, first op to last."""

    ops: dict
    transfers: dict
    start_s: dict
    seconds: float

    @classmethod
    def of(cls, trace, ops=()) -> "Traced":
        """From a ``Session.run``'s ``tracing.StepTrace``: an op's seconds are its kernel's
        and, where ``ops`` (what the simulation runs) says what it waited for, the executor's
        time before it: from the later of its inputs' arrival and the end of the op that
        started before it on its task (the step stats give every op of a task one thread) to
        its start. A tensor's trip runs from its producer's end to the end of the receiving
        task's ``RecvTensor`` (asked for early, that waits for the producer: its own duration
        holds the wait)."""
        from dtflab import names

        spans = {}
        for device, timings in trace.timings.items():
            task = names.task(device)
            for timing in timings:
                if timing.kind == "compute":
                    before = spans.get((task, timing.name), (timing.start_us, timing.start_us))
                    spans[task, timing.name] = (min(before[0], timing.start_us),
                                                max(before[1], timing.end_us))
        starts = {}
        for (task, _), (begin, _) in spans.items():
            starts[task] = min(starts.get(task, begin), begin)
        trips, arrivals = {}, {}
        for transfer in trace.transfers:
            if transfer.duration_us is None:
                continue
            producer, _, output = transfer.tensor_name.rpartition(":")
            ready = spans.get((names.task(transfer.src_device), producer),
                              (0.0, transfer.start_us))[1]
            arrived = transfer.start_us + transfer.duration_us
            key = (producer, int(output) if output.isdigit() else 0,
                   names.task(transfer.dst_device))
            trips[key] = max(arrived - max(ready, transfer.start_us), 0.0) / 1e6
            arrivals[key] = arrived
        seconds = {key: (end - begin) / 1e6 for key, (begin, end) in spans.items()}
        by_task = {}
        for key, (begin, end) in spans.items():
            by_task.setdefault(key[0], []).append((begin, end, key))
        previous = {}
        for timed in by_task.values():
            timed.sort()
            for (_, end, _), (_, _, key) in zip(timed, timed[1:]):
                previous[key] = end
        for op in ops:
            key = (op.task, op.name)
            if key not in spans:
                continue
            inputs = [spans[op.task, name][1] if (op.task, name) in spans else
                      arrivals.get((name, output, op.task))
                      for name, output in (*op.inputs, *((a, -1) for a in op.after))]
            if any(at is None for at in inputs):
                continue  # an input the step did not time: its wait stays unknown
            free = max([starts[op.task], previous.get(key, 0.0), *inputs])
            seconds[key] += max(spans[key][0] - free, 0.0) / 1e6
        return cls(seconds, trips, {task: at / 1e6 for task, at in starts.items()},
                   trace.step_us / 1e6)


def replay(ops, traced: Traced, threads: int) -> Predicted:
    """``ops`` run as :func:`simulate` runs them, each op for the seconds ``traced`` gives it
    (0 for an op the traced step did not run: folded, fused or pruned by Grappler), each
    tensor for its traced trip, each task from its traced start, on as many cores as there
    are ops running (a traced op's time already holds its share of the machine): what the
    simulation's structure (dependencies, threads, the order ready ops start in) makes of the
    step's own durations, against ``traced.seconds``. What it cannot see: an op that ran under
    a name other than the graph's (a Grappler rewrite: its time is lost), and the executor's
    time before an op whose inputs the step did not all time."""
    first = {op.task: traced.start_s.get(op.task, 0.0) for op in ops}
    return play(ops, threads, Costs(
        work=[traced.ops.get((op.task, op.name), 0.0) for op in ops],
        transfer=lambda nbytes, key: traced.transfers.get(
            (ops[key[0]].name, max(key[1], 0), key[2]), 0.0),
        feed=lambda nbytes: 0.0, cores=math.inf, together={}, transfer_cores=0.0,
        start_s=first))


def play(ops, threads: int, costs: Costs) -> Predicted:
    """The tasks' executors run ``ops`` side by side, charged as ``costs`` says."""
    feeds = {op.name: op.outputs[0] for op in ops if op.type == "Placeholder" and op.outputs}
    index = {op.name: i for i, op in enumerate(ops)}
    cores = costs.cores
    work = costs.work
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
    start_at = min(costs.start_s.values(), default=0.0)
    now = 0.0
    free_threads = {task: threads for task in tasks}
    ready = {task: [] for task in tasks}
    remaining: dict = {}  # running job -> CPU seconds left (job: op index or transfer key)
    started: dict = {}
    timed: list = []  # (time, order, job) for delays that take no core
    spans, busy = [], {task: {} for task in tasks}
    left = [len(keys) for keys in waits]
    order = 0
    late = {task: costs.start_s.get(task, start_at) - start_at for task in tasks}
    waiting_after: dict = {}
    together = costs.together
    speed_class = {i: "matrix" if op.kind == "matrix" else "memory" for i, op in enumerate(ops)}

    def release(key, at):
        nonlocal order
        for i in consumers.get(key, ()):
            left[i] -= 1
            if left[i] == 0:
                if at < late[ops[i].task]:  # its task has not begun the step yet
                    heapq.heappush(timed, (late[ops[i].task], order, i))
                    order += 1
                else:
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
                whole = costs.transfer(transfers[key], key)
                if costs.transfer_cores > 0:  # gRPC's work first, on a core; then the wait
                    speed_class[key] = "transfer"
                    remaining[key] = whole * costs.transfer_cores
                    waiting_after[key] = whole * (1 - costs.transfer_cores)
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
            delay = late[ops[i].task]
            if ops[i].name in feeds:  # the client's feed arrives first
                delay += costs.feed(feeds[ops[i].name])
            if delay > 0:
                heapq.heappush(timed, (delay, order, i))
                order += 1
            else:
                heapq.heappush(ready[ops[i].task], i)
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
            else:  # a feed arrived, or the op's task began: it is ready
                heapq.heappush(ready[ops[job].task], job)
    return Predicted(start_at + now, spans, busy)
