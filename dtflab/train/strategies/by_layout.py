"""``train.run``: any layout dtflab trains, on the loop its ways choose (:func:`loop_for`), or
on the one ``loop=`` names where several could run it; and whether a loop runs a layout
(:func:`runs`), which a plan made for the machine it will run on keeps
(``dtflab.plan(..., hardware="here")``).

In [1]: history = train.run(problem, cluster, train.Layout(data=2, tensor=2), steps=20)
In [2]: train.run(problem, cluster, train.Layout(data=2), loop="async_parameter_server")
In [3]: loop_for(train.Layout(data=2, zero=1))     # 'zero'
In [4]: runs(train.Layout(data=2, micro_batches=4))  # False: all_reduce runs the whole slice

What it cannot do: the worker-program loops (``all_reduce``, ``zero``,
``sharded_data_parallel``) start their own worker programs, one a data way, and read only
their threads from ``cluster``; the graph loops train on its worker tasks.
"""

from __future__ import annotations

import importlib

from dtflab import checks
from dtflab.train.layouts.layout import Layout

#: The loops that train on the cluster's worker tasks in one TensorFlow graph (the others, but
#: ``ps_strategy``'s TF2 functions, start worker programs of their own).
GRAPH_LOOPS = ("single", "pipeline", "tensor_parallel", "context_parallel", "expert_parallel",
               "combined")
#: The loops that start worker programs of their own.
PROGRAM_LOOPS = ("all_reduce", "zero", "sharded_data_parallel")
#: Every loop ``loop=`` may name, as ``train`` calls it.
LOOPS = GRAPH_LOOPS + PROGRAM_LOOPS + ("sync_data_parallel", "async_parameter_server",
                                       "ps_strategy", "model_parallel")

#: What each loop that runs one form besides the others can run beside it: ``(the lever that
#: picks it, the loop, the ways it runs, what to use instead)``.
ALONE = (("expert", "expert_parallel", ("data", "expert"), "train.Layout(data=2, expert=2)"),
         ("context", "context_parallel", ("context",), "train.Layout(context=2)"),
         ("zero", "zero", ("data",), "train.Layout(data=2, zero=1)"))


def loop_for(layout: Layout) -> str:
    """The loop that trains ``layout`` (:func:`keywords_for` says what it is called with); a
    layout no loop runs is one line naming what does run."""
    cut = [axis for axis, ways in layout.ways.items() if ways > 1]
    for lever, loop, runs_, instead in ALONE:
        if getattr(layout, lever) > (0 if lever == "zero" else 1):
            beside = [axis for axis in cut if axis not in runs_]
            if beside:
                raise ValueError(f"layout=train.Layout({layout._arguments()}): no dtflab loop "
                                 f"runs {lever} beside {' and '.join(beside)} ways yet "
                                 f"(train.{loop} runs {' and '.join(runs_)} ways alone); use "
                                 f"{instead}, or train.Layout(data=2, tensor=2) for "
                                 f"train.combined")
            return loop  # ZeRO 3 runs train.sharded_data_parallel
    if layout.data > 1 and layout.tensor == layout.pipeline == 1:
        return "all_reduce"
    if sum(ways > 1 for ways in (layout.data, layout.tensor, layout.pipeline)) > 1:
        return "combined"
    if layout.tensor > 1:
        return "tensor_parallel"
    if layout.pipeline > 1:
        return "pipeline"
    return "single"


def loops_for(layout: Layout) -> tuple[str, ...]:
    """Every loop that trains ``layout``: :func:`loop_for`'s first, then the others
    ``loop=`` may name (data ways alone, a replica's batch at once: the parameter servers'
    three loops; one device: 2016's placement; tensor or pipeline ways alone, one
    micro-batch, the default schedule: ``combined``; ZeRO 3: its own loop)."""
    chosen = loop_for(layout)
    found = [chosen]
    plain = layout.tensor == layout.pipeline == layout.context == layout.expert == 1
    whole = layout.micro_batches == 1  # the loops below run a replica's batch at once
    if plain and layout.zero == 0 and whole:
        found += (["sync_data_parallel", "async_parameter_server", "ps_strategy"]
                  if layout.data > 1 else ["model_parallel"])
    if chosen in ("tensor_parallel", "pipeline") and whole and not layout.sequence_parallel \
            and layout.schedule == Layout.schedule:
        found += ["combined"]
    if layout.zero == 3:
        found += ["sharded_data_parallel"]
    return tuple(found)


def keywords_for(loop: str, layout: Layout, cluster) -> dict:
    """What ``loop`` is called with for ``layout`` on ``cluster`` (its own spelling of the
    ways: a Downpour run's worker count, the cluster's workers for ParameterServerStrategy)."""
    if loop == "single":
        return {"layout": layout, "device": "worker:0", "cluster": cluster}
    if loop == "async_parameter_server":
        return {"workers": layout.data}
    if loop == "ps_strategy":
        workers = len(cluster.addresses.get("worker", []))
        if workers != layout.data:
            raise ValueError(f"layout=train.Layout({layout._arguments()}): train.ps_strategy "
                             f"sends steps to every worker task, and the cluster has {workers}; "
                             f"use train.Layout(data={workers})")
        return {}
    if loop == "model_parallel":
        return {}
    return {"layout": layout}


def program_threads(cluster) -> int | None:
    """The threads a worker program of a run on ``cluster`` gets (intra- and inter-op): one
    where the cluster's tasks have one intra-op thread each (``start_cluster(...,
    intra_op_threads=1)``), so the programs run as the calibration timed the tasks; else
    None, TensorFlow's default (every core): two programs of a thread a core each would
    share the cores they were timed alone on."""
    return 1 if cluster.intra_op_threads == 1 else None


def chosen(problem, cluster, layout, loop: str | None = None,
           caller: str = "train.run") -> tuple[str, Layout, dict]:
    """``(loop, layout, keywords)`` :func:`run` calls, every check made before anything
    starts: ``layout`` as a Layout (a plan's row gives its own), the loop that runs it, the
    cluster big enough for a graph loop."""
    checks.cluster(cluster)
    if hasattr(layout, "layout") and type(layout) is not Layout:  # a Plan, or a plan's row
        layout = layout.layout
    if layout is None:
        layout = Layout()
    if not isinstance(layout, Layout):
        raise ValueError(f"layout={layout!r}: {caller} takes a train.Layout(...), a Plan or a "
                         f"row of dtflab.plan(...) (plans.best)")
    able = loops_for(layout)
    if loop is None:
        loop = able[0]
    elif loop not in LOOPS:
        raise ValueError(f"loop={loop!r}: not a dtflab loop; choose one of "
                         f"{', '.join(map(repr, LOOPS))}")
    elif loop not in able:
        raise ValueError(f"loop={loop!r}: train.{loop} does not run "
                         f"layout=train.Layout({layout._arguments()}); the loops that do: "
                         f"{', '.join(map(repr, able))}")
    layout.fits(problem)
    if loop in GRAPH_LOOPS + ("sync_data_parallel", "async_parameter_server"):
        workers = len(cluster.addresses.get("worker", []))
        if layout.size > workers:
            raise ValueError(f"layout=train.Layout({layout._arguments()}): {layout.size} "
                             f"devices, but the cluster has {workers} worker tasks; start one "
                             f"with dtflab.start_cluster(workers={layout.size})")
    return loop, layout, keywords_for(loop, layout, cluster)


def run(problem, cluster, layout=None, *, loop: str | None = None, **options):
    """Train ``problem`` on ``cluster`` as ``layout`` says (a ``train.Layout``, a Plan or a
    plan's row, ``dtflab.plan(...).best``; none: one task), on the loop its ways choose
    (:func:`loop_for`) or the one ``loop`` names where several run it (:func:`loops_for`:
    data ways alone on ``"sync_data_parallel"``, ``"async_parameter_server"`` or
    ``"ps_strategy"``; one device on ``"model_parallel"``, 2016's placement, with its
    ``plan=``). ``options`` are the loop's (``steps``, ``seed``, ``trace_step``, ...); a worker
    program's ``threads`` are the cluster's (:func:`program_threads`) unless given. Returns the
    loop's RunHistory (or BackgroundRun)."""
    loop, _, keywords = chosen(problem, cluster, layout, loop)
    return run_chosen(problem, cluster, loop, keywords, **options)


def run_chosen(problem, cluster, loop: str, keywords: dict, **options):
    """Call ``loop`` as :func:`chosen` said, its checks already made."""
    strategy = getattr(importlib.import_module(f"dtflab.train.strategies.{loop}"), loop)
    if loop in PROGRAM_LOOPS:
        options.setdefault("threads", program_threads(cluster))
    if loop in PROGRAM_LOOPS or loop == "single":  # single's cluster is among its keywords
        return strategy(problem, **keywords, **options)
    return strategy(problem, cluster, **keywords, **options)


#: The loops that split a replica's batch into micro-batches (the others run it whole).
MICRO_BATCHED = ("pipeline", "single")


def runs(layout: Layout) -> bool:
    """Whether a dtflab loop trains ``layout``: :func:`loop_for` finds one, and it takes the
    layout's micro-batches."""
    try:
        loop = loop_for(layout)
    except ValueError:
        return False
    return layout.micro_batches == 1 or loop in MICRO_BATCHED
