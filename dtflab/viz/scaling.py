"""The scaling picture: a measured speed-up beside what Amdahl's law and the bottleneck model
of a ps step predict for more workers, and the speed-ups Google quoted in 2016, labelled as
theirs.

Both models come from :class:`dtflab.train.formulas.scaling.ScalingModel` (measured parts of one-
and two-worker steps; its formula is ``costs.ps_step_s``):

- **Amdahl:** the worker's compute is the part that splits across workers (a fraction p of the
  one-worker step); the rest stays. ``S(N) = 1 / ((1 - p) + p / N)``.
- **Bottleneck:** a step lasts as long as the slower of a worker's own path (its share of the
  compute, then its exchange with the ps, which the ps serves for every worker at once) and the
  machine's cores (every process's CPU time per step, the ps's growing with N, over the cores).

What they cannot know: a real network is slower per byte than the loopback and a bigger cluster
adds stragglers. The models say what shape to expect, not a figure to promise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dtflab.train.formulas.scaling import ScalingModel


@dataclass(frozen=True)
class Quoted:
    """A speed-up someone else measured: ``speedup`` times one machine with ``workers``."""

    what: str
    workers: int
    speedup: float
    source: str


#: As quoted in the 2016 talk the tutorials follow (see SEEDS.md): Google's figures, not ours.
#: The third figure it quotes, synchronous Inception going from 10 to 50 nodes in 80 h -> 20 h
#: (4x for 5x the nodes), has no one-machine baseline, so it is not a point on this plot.
GOOGLE_2016 = (
    Quoted("Inception on 50 GPUs", 50, 40.0, "Google, quoted in 2016"),
    Quoted("RankBrain on 500 nodes", 500, 300.0, "Google, quoted in 2016"),
)


def speedups(rates: dict[int, float]) -> dict[int, float]:
    """Steps per second by worker count -> speed-up over one worker."""
    if 1 not in rates:
        raise ValueError(f"rates has no one-worker run (keys {sorted(rates)}); the speed-up is "
                         f"relative to it, so include workers=1")
    return {n: rate / rates[1] for n, rate in sorted(rates.items())}


def scaling_figure(rates: dict[int, float], model: ScalingModel, *, up_to: int = 512,
                   quoted=GOOGLE_2016, width: int = 620, height: int = 400):
    """Bokeh figure, log-log: speed-up against workers. Renderers are named ``ideal``,
    ``measured``, ``amdahl``, ``bottleneck`` and ``quoted``."""
    from bokeh.models import ColumnDataSource, HoverTool, LabelSet
    from bokeh.plotting import figure

    measured = speedups(rates)
    counts = sorted({round(2 ** (i / 4)) for i in range(int(4 * math.log2(up_to)) + 1)} | {1})
    fig = figure(title="Speed-up with more workers: measured here, two models, Google's figures",
                 x_axis_type="log", y_axis_type="log", x_axis_label="workers",
                 y_axis_label="speed-up over one worker", width=width, height=height,
                 x_range=(0.8, up_to * 1.25), y_range=(0.1, up_to * 1.25), tools="save")
    fig.line(counts, counts, color="gray", line_dash="dashed", legend_label="ideal (N x)", name="ideal")
    fig.line(counts, [model.amdahl(n) for n in counts], color="#1f77b4", line_width=2,
             legend_label=f"Amdahl, p = {model.parallel_fraction:.2f}", name="amdahl")
    cores = f"{model.cores} cores" if model.cores else "cores enough"
    fig.line(counts, [model.speedup(n) for n in counts], color="#ff7f0e", line_width=2,
             legend_label=f"bottleneck: workers' path or the machine ({cores})",
             name="bottleneck")
    fig.line(list(measured), list(measured.values()), color="black", line_width=2)
    fig.scatter(list(measured), list(measured.values()), color="black", size=8,
                legend_label="measured here", name="measured")
    if quoted:
        source = ColumnDataSource(dict(
            x=[q.workers for q in quoted], y=[q.speedup for q in quoted],
            label=[f"{q.what}: {q.speedup:g}x" for q in quoted],
            source=[q.source for q in quoted]))
        points = fig.scatter("x", "y", source=source, marker="diamond", size=13, color="#d62728",
                             legend_label=f"{quoted[0].source} (their figures)", name="quoted")
        fig.add_layout(LabelSet(x="x", y="y", text="label", source=source, x_offset=-8,
                                y_offset=8, text_font_size="10px", text_align="right"))
        fig.add_tools(HoverTool(renderers=[points], tooltips=[("", "@label"), ("source", "@source")]))
    fig.legend.location = "top_left"
    fig.legend.label_text_font_size = "10px"
    return fig


#: How each loop is drawn in :func:`curves_figure`.
LOOP_COLORS = {"sync_data_parallel": "#1f77b4", "async_parameter_server": "#2ca02c",
               "all_reduce": "#d62728", "pipeline": "#9467bd"}


def curves_figure(curves, *, quoted: dict | None = None, width: int = 620, height: int = 380):
    """Bokeh figures side by side: strong scaling (speed-up in steps/s over the fewest workers)
    and weak scaling (speed-up in examples/s), one line per loop, the ideal N x dashed, from a
    :class:`dtflab.train.experiments.scaling.Curves`. ``quoted``: ``{loop: {N: speed-up}}`` measured
    elsewhere (another machine's table), drawn dotted beside ours. Renderers are named after
    the loops (``strong-all_reduce``, ``weak-all_reduce``, ``quoted-all_reduce``)."""
    from bokeh.layouts import row
    from bokeh.plotting import figure

    figures = []
    for mode in ("strong", "weak"):
        loops = curves.rates.get(mode, {})
        if not loops:
            continue
        top = max([max(by_n) for by_n in loops.values()]
                  + [max(by_n) for by_n in (quoted or {}).values()] + [2])
        fig = figure(title=f"{mode} scaling ({'global' if mode == 'strong' else 'per-worker'} "
                           f"batch {curves.batch})", x_axis_label="workers",
                     y_axis_label="speed-up" + (" (examples/s)" if mode == "weak" else ""),
                     width=width // 2 + 60, height=height, tools="save,hover")
        fig.line([1, top], [1, top], color="gray", line_dash="dashed", legend_label="ideal")
        for loop in loops:
            sped = curves.speedups(loop, mode)
            fig.line(list(sped), list(sped.values()), color=LOOP_COLORS[loop], line_width=2,
                     legend_label=loop, name=f"{mode}-{loop}")
            fig.scatter(list(sped), list(sped.values()), color=LOOP_COLORS[loop], size=7)
        for loop, by_n in ((quoted or {}).items() if mode == "strong" else ()):
            fig.line(list(by_n), list(by_n.values()), color=LOOP_COLORS[loop], line_dash="dotted",
                     legend_label=f"{loop} (quoted)", name=f"quoted-{loop}")
        fig.legend.location = "top_left"
        fig.legend.label_text_font_size = "9px"
        figures.append(fig)
    return row(*figures)
