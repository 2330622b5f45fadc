"""Which dtflab loop trains a layout (``train.run_layout`` calls it), and whether one does:
what a plan made for the machine it will run on keeps (``dtflab.plan(..., hardware="here")``).

In [1]: loop_for(train.Layout(data=2, zero=1))     # ('zero', {'layout': ...})
In [2]: runs(train.Layout(data=2, micro_batches=4))  # False: all_reduce runs the whole slice
"""

from __future__ import annotations

from dtflab.train.layouts.layout import Layout

#: What each loop that runs one form besides the others can run beside it: ``(the lever that
#: picks it, the loop, the ways it runs, what to use instead)``.
ALONE = (("expert", "expert_parallel", ("data", "expert"), "train.Layout(data=2, expert=2)"),
         ("context", "context_parallel", ("context",), "train.Layout(context=2)"),
         ("zero", "zero", ("data",), "train.Layout(data=2, zero=1)"))


def loop_for(layout: Layout) -> tuple[str, dict]:
    """The loop that trains ``layout``, and the keywords it takes for it; a layout no loop
    runs is one line naming what does run."""
    cut = [axis for axis, ways in layout.ways.items() if ways > 1]
    for lever, loop, runs, instead in ALONE:
        if getattr(layout, lever) > (0 if lever == "zero" else 1):
            beside = [axis for axis in cut if axis not in runs]
            if beside:
                raise ValueError(f"layout=train.Layout({layout._arguments()}): no dtflab loop "
                                 f"runs {lever} beside {' and '.join(beside)} ways yet "
                                 f"(train.{loop} runs {' and '.join(runs)} ways alone); use "
                                 f"{instead}, or train.Layout(data=2, tensor=2) for "
                                 f"train.combined")
            return loop, {"layout": layout}  # ZeRO 3 runs train.sharded_data_parallel
    if layout.data > 1 and layout.tensor == layout.pipeline == 1:
        return "all_reduce", {"layout": layout}
    if sum(ways > 1 for ways in (layout.data, layout.tensor, layout.pipeline)) > 1:
        return "combined", {"layout": layout}
    if layout.tensor > 1:
        return "tensor_parallel", {"layout": layout}
    if layout.pipeline > 1:
        return "pipeline", {"layout": layout}
    return "single", {"layout": layout, "device": "worker:0"}


#: The loops that split a replica's batch into micro-batches (the others run it whole).
MICRO_BATCHED = ("pipeline", "single")


def runs(layout: Layout) -> bool:
    """Whether a dtflab loop trains ``layout``: :func:`loop_for` finds one, and it takes the
    layout's micro-batches."""
    try:
        loop, _ = loop_for(layout)
    except ValueError:
        return False
    return layout.micro_batches == 1 or loop in MICRO_BATCHED
