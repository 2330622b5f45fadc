"""Plan, run, compare in one call: ``train.run_layout(problem, cluster, layout)`` runs any layout
dtflab can train, choosing the loop, and its history carries the step as predicted before the
first step (``history.prediction``) beside what was measured.

In [1]: plans = dtflab.plan(problem, devices=2, hardware="here", cluster=cluster)
In [2]: history = train.run_layout(problem, cluster, plans.best, steps=20, trace_step=15)
In [3]: history.prediction.against(history)       # predicted and measured, by kind of op
In [4]: history.prediction.show(history)          # the two timelines, one above the other

A graph loop's step is predicted from the graph it will execute (``planner.graph_ops``),
priced and simulated on this machine's calibration (``planner.executor``); a worker-program
loop's (all-reduce, ZeRO) from each worker's own step function (ZeRO's, traced:
``planner.program_graphs``; all-reduce's, one copy of the model's graph a worker), simulated the
same way, its collectives at their measured cost (:func:`program_prediction`); its memory by kind
from ``planner.device_memory`` either way. What it cannot see: what the executor module says,
and another program on the machine while the run runs.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import statistics
import weakref
from dataclasses import dataclass, field

from dtflab import names
from dtflab.train.layouts.layout import Layout
from dtflab.train.planner import executor, graph_ops, step_kinds
from dtflab.train.planner.device_memory import Plan, per_device
from dtflab.train.strategies.by_layout import (GRAPH_LOOPS, chosen, program_threads,
                                               run_chosen)
from dtflab.train.machinery.history import FIRST_COUNTED_STEP

VIEWS = "dtflab.viz.prediction"


@dataclass
class Prediction:
    """A step predicted before the run: ``seconds``, ``parts`` (by kind of op for a graph
    loop, by part of the step for the planner's), ``memory`` (bytes by kind on the fullest
    device), ``timeline`` (a ``StepTrace`` of the simulated step, per device; None from the
    planner), ``source`` (which model made it), and for a graph loop the ``ops`` it simulated
    with its tasks' ``threads`` (:meth:`replayed`)."""

    loop: str
    seconds: float
    parts: dict
    memory: dict
    source: str
    timeline: object = field(default=None, repr=False)
    ops: list | None = field(default=None, repr=False)
    threads: int = 0

    def replayed(self, history) -> dict | None:
        """The structure checked apart from the costs: the ops this prediction simulated,
        replayed with the traced step's own durations (``executor.replay``), against that
        step's wall time: ``{"replayed_ms", "traced_ms", "error", "ops_traced", "ops"}``
        (how many of the simulated ops the trace timed by name). None without a traced step
        of a graph loop."""
        trace = getattr(history, "trace", None)
        if self.ops is None or trace is None or trace.metadata is None:
            return None
        traced = executor.Traced.of(trace, self.ops)
        replayed = executor.replay(self.ops, traced, self.threads)
        return {"replayed_ms": replayed.seconds * 1e3, "traced_ms": traced.seconds * 1e3,
                "error": replayed.seconds / traced.seconds - 1,
                "ops_traced": sum((op.task, op.name) in traced.ops for op in self.ops),
                "ops": len(self.ops)}

    def against(self, history) -> dict:
        """Predicted beside measured: the step (the median of the steps after the first two,
        the slowest worker's) and its error, and, where the run traced a step and this
        prediction has a timeline, each kind of op's time summed over devices, predicted and
        traced, largest difference first (``"matrix"``: 4.1 ms predicted, 3.7 traced)."""
        measured = history.median_step_s()
        found = {"predicted_ms": self.seconds * 1e3, "measured_ms": measured * 1e3,
                 "error": self.seconds / measured - 1}
        if self.timeline is not None and getattr(history, "trace", None) is not None:
            found["by_kind"] = step_kinds.by_kind(self.timeline, history.trace)
        return found

    def differences(self, history) -> str:
        """The largest differences by kind in a learner's words, each with the task where it
        is largest: ``"tensors sent between tasks 2.1 ms (40%) over, most on worker:1"``."""
        if self.timeline is None or getattr(history, "trace", None) is None:
            return ""
        devices = step_kinds.by_device(self.timeline, history.trace)
        words = []
        for kind, predicted, traced in step_kinds.summed(devices)[:3]:  # by_kind's rows
            gap = predicted - traced
            share = f"{abs(gap) / traced:.0%}" if traced else f"{abs(gap):.1f} ms"
            most = max(devices, key=lambda d: abs(step_kinds.gap(devices[d], kind)))
            words.append(f"{step_kinds.WORDS[kind]} {abs(gap):.1f} ms ({share}) "
                         f"{'over' if gap > 0 else 'under'}, most on {names.task(most)}")
        return "; ".join(words)

    def figure(self, history, **options):
        """The predicted timeline above the traced one (``dtflab.viz.prediction``)."""
        return importlib.import_module(VIEWS).figure(self, history, **options)

    def show(self, history, **options) -> None:
        importlib.import_module(VIEWS).show(self, history, **options)


def timeline(predicted: executor.Predicted):
    """The simulated step as a ``StepTrace`` (timings only), drawn by the traced step's views."""
    from dtflab.tracing.step import OpTiming, StepTrace

    timings = {}
    for task, name, op_type, kind, start, end in predicted.spans:
        device = names.full(task)
        timings.setdefault(device, []).append(OpTiming(
            device, name, op_type, start * 1e6, (end - start) * 1e6,
            "transfer" if kind == "transfer" else "compute"))
    return StepTrace(None, {device: [] for device in timings}, [], [], timings,
                     predicted.seconds * 1e6, note="predicted by dtflab's executor simulation")


def hardware_for(hardware, cluster):
    """``hardware`` as a Hardware; ``"here"``: ``cluster`` calibrated, once per cluster
    (``dtflab.plan``'s and this module's calls share it; ``train.calibrate`` measures anew)."""
    from dtflab.train.planner.plans import resolve

    return resolve(hardware, cluster)


def plan_of(problem, layout: Layout) -> Plan:
    """``problem``'s shape on ``layout``, as the planner prices it."""
    from dtflab.train.planner.plans import base_plan

    fields = {f.name: getattr(layout, f.name) for f in dataclasses.fields(Layout)}
    return dataclasses.replace(base_plan(problem), **fields)


def replica_ops(problem, workers: int = 2, seed: int = 0) -> list:
    """One copy of ``problem``'s graph a worker, each on its slice of the batch (what
    all-reduce's step function runs before and around its one collective), worker i's named
    ``w<i>/...`` on ``worker:i``."""
    from dtflab.train.graphs.one_replica import single_graph

    replica = dataclasses.replace(problem, batch_size=problem.batch_size // workers)
    built = single_graph(replica, seed, device=names.device("worker:0"))
    x, t = built.inputs
    xs, ts = replica.batch(0, seed)
    one = graph_ops.step_ops(built.graph, [built.train, built.loss], {x: xs, t: ts}, "worker:0",
                             built.init)
    return [op for i in range(workers) for op in graph_ops.on_worker(one, i)]


#: The last few worker-program graphs read, by (problem, ZeRO stage, workers, seed): a trace
#: takes seconds, and the programs' costs are fitted on four graphs simulated many times.
READ: dict = {}


def program_ops(problem, stage: int, workers: int = 2, seed: int = 0) -> list:
    """Every worker's step ops: ZeRO ``stage``'s own step functions, traced
    (``program_graphs``); all-reduce's (stage 0), one copy of the model's graph a worker
    (:func:`replica_ops`: MultiWorkerMirroredStrategy's step cannot be traced without its
    cluster)."""
    from dtflab.train.planner import program_graphs

    key = (problem, stage, workers, seed)
    if key not in READ:
        while len(READ) >= 4:
            READ.pop(next(iter(READ)))
        READ[key] = (replica_ops(problem, workers, seed) if stage == 0 else
                     program_graphs.program_ops(problem, stage, workers, seed))
    return READ[key]


def program_step(problem, stage: int, hardware, workers: int = 2, seed: int = 0,
                 threads: int | None = None):
    """:func:`program_ops` simulated, every worker at once with ``threads`` inter-op threads
    (None: a thread a core): an ``executor.Predicted``."""
    return executor.simulate(program_ops(problem, stage, workers, seed), hardware,
                             threads or os.cpu_count())


def pack_seconds(problem, hardware, workers: int) -> float:
    """All-reduce's one collective a step: its cost a call and the ring's bytes (every
    gradient, 2 (N - 1) / N of it sent) at the transfer's rate."""
    parameters = sum(value.size for _, value in problem.initial_values(0))
    _, per_byte = hardware.op_costs["transfer"]
    ring = 2 * (workers - 1) / workers * 4 * parameters * per_byte
    return hardware.op_costs["collective_ring"][0] + ring


def program_prediction(problem, layout: Layout, machine, memory: dict, loop: str,
                       seed: int = 0, threads: int | None = None) -> Prediction:
    """A worker-program loop's step (all-reduce, ZeRO): :func:`program_step`, each collective
    at the programs' measured cost a call and its bytes at the transfer's rate, all-reduce's
    one pack after the backward (:func:`pack_seconds`), and the program's own cost a step
    (``op_costs``'s ``call``: ``op_costs.program_costs``). What it cannot see: the arrival
    skew between the workers (each collective waits for the later one; the simulation runs
    them alike), and for all-reduce how much of its pack overlaps the backward."""
    simulated = program_step(problem, layout.zero, machine, layout.data, seed, threads)
    call = machine.op_costs["call"][0]
    parts = {**simulated.parts(), "call": call}
    seconds = simulated.seconds + call
    if layout.zero == 0:
        parts["collective"] = pack_seconds(problem, machine, layout.data)
        simulated.spans += [(f"worker:{i}", "all-reduce of the gradients", "CollectiveReduceV2",
                             "collective", simulated.seconds,
                             simulated.seconds + parts["collective"]) for i in range(layout.data)]
        seconds += parts["collective"]
    parts["total"] = seconds
    source = ("each worker's own step function traced and simulated, and the programs' "
              "measured costs a call and a collective" if layout.zero else
              "a copy of the graph a worker, simulated, one all-reduce of its gradients, and "
              "the programs' measured costs a call and a collective")
    return Prediction(loop, seconds, parts, memory, source,
                      timeline(dataclasses.replace(simulated, seconds=seconds)))


#: The costs fitted to probe runs on each cluster, by the calibration they were fitted to: a
#: list of (which costs, calibration, calibration with them), found by identity.
FITTED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _once(which: str, machine, cluster, fit):
    """``fit()``, once a ``which``, calibration and cluster (:data:`FITTED`)."""
    fitted = FITTED.setdefault(cluster, [])
    for kind, calibration, with_costs in fitted:
        if kind == which and calibration is machine:
            return with_costs
    fitted.append((which, machine, fit()))
    return fitted[-1][2]


def _forget(which: str, machine, cluster) -> None:
    """Drop what :func:`_once` kept of ``which`` for ``machine`` on ``cluster``."""
    rows = FITTED.setdefault(cluster, [])
    rows[:] = [row for row in rows if not (row[0] == which and row[1] is machine)]


def with_dispatch(machine, cluster):
    """``machine`` (a calibration) with what an op of a whole step costs beyond one of a chain
    (``op_costs.dispatch_cost``), fitted to the one-task loop of ``op_costs.PROBE`` on
    ``cluster`` (three runs of 60 steps, about 6 s), once a calibration and cluster; a machine
    not measured (a preset), or one with that cost, as it is."""
    from dtflab.train.planner.op_costs import PROBE, dispatch_cost
    from dtflab.train.problems import transformer
    from dtflab.train.strategies.single import single

    if not machine.measured or "dispatch" in machine.op_costs:
        return machine

    def fit():
        read, steps = [], []

        def reading(built, master, problem):
            if not read:
                read.append(loop_ops(built, master, *first_counted(built, problem, 0)))

        for _ in range(3):  # a run is a moment of the machine: the median of three
            steps.append(single(transformer(**PROBE), cluster=cluster, steps=60, seed=0,
                                watchdog=False, predict=reading).median_step_s())
        threads = cluster.inter_op_threads
        return dispatch_cost(machine, lambda h: executor.simulate(read[0], h, threads).seconds,
                             statistics.median(steps))

    return _once("dispatch", machine, cluster, fit)


def with_program_costs(machine, cluster):
    """``machine`` with the worker programs' costs (``op_costs.program_costs``) on
    :func:`with_dispatch`'s, timed on programs of the threads a run on ``cluster`` gives them
    (:func:`program_threads`): once a calibration and cluster (about 40 s), so that every later
    run given the same ``train.calibrate(cluster)`` reuses them. Where the link comes to the
    search's bottom (``op_costs.at_lowest_link``), :func:`with_dispatch` and the probes are
    both timed once more, and that fit is kept whatever it reads."""
    from dtflab.train.planner import op_costs

    threads = program_threads(cluster)

    def timed():
        return op_costs.program_costs(
            with_dispatch(machine, cluster),
            lambda p, stage, h: program_step(p, stage, h, threads=threads).seconds,
            lambda p, h: pack_seconds(p, h, 2), threads=threads)

    def fit():
        fitted = timed()
        if op_costs.at_lowest_link(fitted):
            _forget("dispatch", machine, cluster)
            fitted = timed()
        return fitted

    return _once("programs", machine, cluster, fit)


def first_counted(built, problem, seed: int) -> tuple[dict, list]:
    """The feed of the step a run counts first, and the updates before it (``(op, feed)``):
    a router's dispatch is priced as that step routes (a router, learning, soon routes
    otherwise than at the start)."""
    x, t = built.inputs
    before = [(built.train, dict(zip((x, t), problem.batch(step, seed))))
              for step in range(FIRST_COUNTED_STEP)]
    return dict(zip((x, t), problem.batch(FIRST_COUNTED_STEP, seed))), before


def loop_ops(built, master, feed: dict, before: list) -> list:
    """A graph loop's step fed ``feed`` after ``before`` (:func:`first_counted`), as
    ``graph_ops.step_ops`` reads it from the loop's graph, an op without a device on the
    master's task."""
    return graph_ops.step_ops(built.graph, [built.train, built.loss, *built.reports.values()],
                              feed, names.task(master) if master else "worker:0", built.init,
                              before)


def routing(plan: Plan, loads) -> float:
    """Rows the routed experts computed a token on the fullest device (``Plan.routing``),
    from ``loads`` (the tokens each expert took, [blocks, experts]): each of the plan's
    expert ways holds experts / expert of them, in order, and takes its share of the tokens
    of the data ways that share them."""
    mine = plan.experts // plan.expert
    tokens = plan.batch * plan.sequence
    held = [sum(float(block[e]) for block in loads for e in range(g * mine, (g + 1) * mine))
            for g in range(plan.expert)]
    return max(held) * plan.expert / (tokens * len(loads))


def run_layout(problem, cluster, layout, *, hardware="here", **options):
    """Train ``problem`` on ``cluster`` as ``layout`` says, as ``train.run`` does (the loop
    chosen from its ways: ``by_layout.loop_for``), with the step predicted before it runs on
    ``hardware`` (``"here"``: ``cluster`` calibrated once, about 35 s, a whole step's cost an
    op the first time a run is predicted, about 6 s (:func:`with_dispatch`), and the worker
    programs' costs the first time one is, about 40 s; or a Hardware, such as
    ``train.calibrate(cluster)``, whose costs are fitted once too) into
    ``history.prediction``. ``options`` are the loop's (``steps``, ``trace_step``, ...); a
    worker program's ``threads`` are the cluster's (``by_layout.program_threads``) unless
    given."""
    if not hasattr(problem, "d_model"):
        raise ValueError(f"problem={problem!r}: train.run_layout plans a transformer; pass "
                         f"train.transformer(...), or call train.run for an MLP")
    if "loop" in options:
        raise ValueError(f"loop={options['loop']!r}: train.run_layout predicts the loop the "
                         f"layout's ways choose; name a loop with train.run")
    loop, layout, keywords = chosen(problem, cluster, layout, caller="train.run_layout")
    machine = hardware_for(hardware, cluster)
    if loop not in GRAPH_LOOPS:
        options.setdefault("threads", program_threads(cluster))
        if "collective_ring" not in machine.op_costs:
            machine = with_program_costs(machine, cluster)
    else:
        machine = with_dispatch(machine, cluster)
    if hardware == "here":  # what a later run or plan "here" on this cluster starts from
        from dtflab.train.planner.plans import CALIBRATED

        CALIBRATED[cluster] = machine
    plan = plan_of(problem, layout)
    memory = per_device(plan)
    if loop in GRAPH_LOOPS:
        threads = cluster.inter_op_threads

        def predict(built, master, problem):
            feed, before = first_counted(built, problem, options.get("seed", 0))
            ops = loop_ops(built, master, feed, before)
            simulated = executor.simulate(ops, machine, threads)
            held = memory
            if "tokens_per_expert" in built.reports and not problem.pad_to_capacity:
                loads, = graph_ops.values_after(built.graph, [built.reports["tokens_per_expert"]],
                                                feed, built.init, before)
                held = per_device(dataclasses.replace(plan, routing=routing(plan, loads)))
            return Prediction(loop, simulated.seconds, simulated.parts(), held,
                              "dtflab's graph, simulated on the calibration",
                              timeline(simulated), ops, threads)

        return run_chosen(problem, cluster, loop, keywords, predict=predict, **options)
    prediction = program_prediction(problem, layout, machine, memory, loop,
                                    options.get("seed", 0), options["threads"])
    history = run_chosen(problem, cluster, loop, keywords, **options)
    if hasattr(history, "prediction"):
        history.prediction = prediction
    else:  # a BackgroundRun: its history
        history.history.prediction = prediction
    return history
