"""The scaling picture: a measured speed-up beside what Amdahl's law and a communication model
predict for more workers, and the speed-ups Google quoted in 2016, labelled as theirs.

Both models (their formulas in ``dtflab.train.costs``) start from one traced step of synchronous data parallelism with one worker:

- **Amdahl:** the worker's compute is the part that splits across workers (a fraction p of the
  step); the rest stays. ``S(N) = 1 / ((1 - p) + p / N)``.
- **Communication:** the same, plus the ps's link. Each worker receives the parameters and sends
  its gradients; the ps moves N times that, one worker after another, at the rate the traced
  step did. ``step(N) = compute / N + rest + N x wire``, so adding workers stops paying at
  ``N = sqrt(compute / wire)``.

What they cannot know: the trace is one step on one machine, where the "wire" is memory and
gRPC; a real network is slower per byte and a bigger cluster adds stragglers. The models say
what shape to expect, not a figure to promise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dtflab.train import costs


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


@dataclass(frozen=True)
class ScalingModel:
    """One worker's step, split into what more workers share and what they do not."""

    step_s: float  # the whole step
    compute_s: float  # the worker's ops: this part splits across N workers
    wire_s: float  # waiting on transfers to and from the ps: the ps moves N times this

    @classmethod
    def from_trace(cls, step) -> "ScalingModel":
        """From a StepTrace of a one-worker synchronous step."""
        totals = step.device_totals()
        workers = [d for d in totals if "/job:worker" in d]
        if len(workers) != 1:
            raise ValueError(f"the trace has {len(workers)} worker devices; the scaling models "
                             f"start from a one-worker step, e.g. "
                             f"train.sync_data_parallel(problem, cluster, workers=1, trace_step=1)")
        compute = totals[workers[0]]["compute_us"] / 1e6
        wire = sum(total["transfer_us"] for device, total in totals.items()
                   if "/job:worker" in device or "/job:ps" in device) / 1e6
        step_s = max(step.step_us / 1e6, compute + wire)
        return cls(step_s, compute, wire)

    @property
    def rest_s(self) -> float:
        """The part no worker takes over: the ps's update, the client, the runtime."""
        return max(self.step_s - self.compute_s - self.wire_s, 0.0)

    @property
    def parallel_fraction(self) -> float:
        return self.compute_s / self.step_s

    def amdahl(self, workers: float) -> float:
        return costs.amdahl(self.parallel_fraction, workers)

    def communication(self, workers: float) -> float:
        return self.step_s / costs.ps_link_step(self.compute_s, self.rest_s, self.wire_s, workers)

    @property
    def best_workers(self) -> float:
        """Where the communication model's speed-up peaks."""
        return costs.ps_link_best_workers(self.compute_s, self.wire_s)


def speedups(rates: dict[int, float]) -> dict[int, float]:
    """Steps per second by worker count -> speed-up over one worker."""
    if 1 not in rates:
        raise ValueError(f"rates has no one-worker run (keys {sorted(rates)}); the speed-up is "
                         f"relative to it, so include workers=1")
    return {n: rate / rates[1] for n, rate in sorted(rates.items())}


def scaling_figure(rates: dict[int, float], model: ScalingModel, *, up_to: int = 512,
                   quoted=GOOGLE_2016, width: int = 620, height: int = 400):
    """Bokeh figure, log-log: speed-up against workers. Renderers are named ``ideal``,
    ``measured``, ``amdahl``, ``communication`` and ``quoted``."""
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
    fig.line(counts, [model.communication(n) for n in counts], color="#ff7f0e", line_width=2,
             legend_label=f"Amdahl + the ps's link (peaks at N = {model.best_workers:.0f})",
             name="communication")
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
               "all_reduce": "#d62728"}


def curves_figure(curves, *, quoted: dict | None = None, width: int = 620, height: int = 380):
    """Bokeh figures side by side: strong scaling (speed-up in steps/s over the fewest workers)
    and weak scaling (speed-up in examples/s), one line per loop, the ideal N x dashed, from a
    :class:`dtflab.train.scaling.Curves`. ``quoted``: ``{loop: {N: speed-up}}`` measured
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
