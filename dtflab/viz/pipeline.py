"""The pipeline chart: each stage's forwards and backwards as they really ran in a traced step,
the bubble shaded, beside the bubble formula's schedule for the same stages and micro-batches."""

from __future__ import annotations

from dtflab import names
from dtflab.train.formulas import costs

KIND_COLORS = {"F": "#1f77b4", "B": "#ff7f0e"}
BUBBLE_COLOR = "#d9d9d9"


def _columns():
    return {k: [] for k in ("left", "right", "bottom", "top", "color", "label", "stage", "what",
                            "start", "duration")}


def _add(columns, stage, left, right, color, label, what):
    columns["left"].append(left)
    columns["right"].append(right)
    columns["top"].append(-stage + 0.38)
    columns["bottom"].append(-stage - 0.38)
    columns["color"].append(color)
    columns["label"].append(label)
    columns["stage"].append(f"stage {stage}")
    columns["what"].append(what)
    columns["start"].append(f"{left:.2f}")
    columns["duration"].append(f"{right - left:.2f}")


def _idle(busy: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The gaps between ``busy`` intervals inside ``start`` .. ``end``."""
    gaps, at = [], start
    for left, right in sorted(busy):
        if left > at:
            gaps.append((at, left))
        at = max(at, right)
    if end > at:
        gaps.append((at, end))
    return gaps


def _lanes(fig, stages: int, labels) -> None:
    fig.yaxis.ticker = [-s for s in range(stages)]
    fig.yaxis.major_label_overrides = {-s: labels[s] for s in range(stages)}
    fig.ygrid.visible = False


def _draw(fig, slots, stages, start, end, prefix: str, what: str):
    """Bars (``{prefix}forward``, ``{prefix}backward``) and shaded gaps (``{prefix}bubble``),
    each micro-batch's bar labelled F0, B0, ..."""
    from bokeh.models import ColumnDataSource, LabelSet

    columns = {"F": _columns(), "B": _columns(), "bubble": _columns()}
    for stage in range(stages):
        own = [s for s in slots if s[0] == stage]
        for _, kind, j, left, right in own:
            _add(columns[kind], stage, left, right, KIND_COLORS[kind], f"{kind}{j}",
                 f"{'forward' if kind == 'F' else 'backward'} of micro-batch {j} ({what})")
        for left, right in _idle([(s[3], s[4]) for s in own], start, end):
            _add(columns["bubble"], stage, left, right, BUBBLE_COLOR, "", f"idle ({what})")
    renderers = []
    for key, name, legend in (("bubble", "bubble", "idle: the bubble"),
                              ("F", "forward", "forward"), ("B", "backward", "backward")):
        source = ColumnDataSource(columns[key])
        renderers.append(fig.quad(left="left", right="right", bottom="bottom", top="top",
                                  color="color", line_color="white" if key != "bubble" else None,
                                  hatch_pattern="/" if key == "bubble" else None,
                                  hatch_color="#999999", source=source, legend_label=legend,
                                  name=prefix + name))
        if key != "bubble":
            labels = dict(columns[key])
            labels["x"] = [(a + b) / 2 for a, b in zip(labels["left"], labels["right"])]
            labels["y"] = [(a + b) / 2 for a, b in zip(labels["top"], labels["bottom"])]
            fig.add_layout(LabelSet(x="x", y="y", text="label", source=ColumnDataSource(labels),
                                    text_align="center", text_baseline="middle",
                                    text_font_size="9px", text_color="white"))
    return renderers


def pipeline_chart(bubble, *, width: int = 720):
    """Two Bokeh figures, one above the other, sharing their x range (ms): the traced step (renderers
    ``forward``, ``backward``, ``bubble``) and the formula's schedule with each forward and
    backward as long as the traced step's mean (``formula_forward``, ``formula_backward``,
    ``formula_bubble``)."""
    from bokeh.layouts import column
    from bokeh.models import HoverTool, Range1d
    from bokeh.plotting import figure

    p, m = bubble.stages, bubble.micro_batches
    origin = min(s.start_us for s in bubble.slots)
    measured = [(s.stage, s.kind, s.micro_batch, (s.start_us - origin) / 1e3,
                 (s.end_us - origin) / 1e3) for s in bubble.slots]
    forward = _mean([e - b for _, k, _, b, e in measured if k == "F"])
    backward = _mean([e - b for _, k, _, b, e in measured if k == "B"])
    ideal = costs.pipeline_timeline(bubble.schedule, p, m, forward=forward, backward=backward)
    end = max(bubble.span_us / 1e3, max(slot[4] for slot in ideal))
    x_range = Range1d(0, end * 1.02)
    height = 110 + 45 * p
    labels = [f"stage {s} ({names.task(d)})" for s, d in enumerate(bubble.devices)]
    shares = bubble.idle_share
    left = figure(title=f"Measured: idle {bubble.mean_idle_share:.0%} of "
                  f"{bubble.span_us / 1e3:.1f} ms ({bubble.schedule}, m = {m})",
                  x_range=x_range, y_range=(-p + 0.5, 0.5), width=width, height=height,
                  x_axis_label="ms from the first micro-batch", tools="xpan,xwheel_zoom,reset,save",
                  toolbar_location="above")
    _lanes(left, p, [f"{label}: idle {share:.0%}" for label, share in zip(labels, shares)])
    hover = _draw(left, measured, p, 0.0, bubble.span_us / 1e3, "", "measured")
    right = figure(title=f"Formula: idle {bubble.formula:.0%} = (p - 1) / (m + p - 1), "
                   f"no overhead", x_range=x_range, y_range=(-p + 0.5, 0.5), width=width,
                   height=height, x_axis_label="ms, each slot the measured mean",
                   tools="xpan,xwheel_zoom,reset,save", toolbar_location="above")
    _lanes(right, p, labels)
    hover += _draw(right, ideal, p, 0.0, max(slot[4] for slot in ideal), "formula_", "formula")
    for fig, renderers in ((left, hover[:3]), (right, hover[3:])):
        fig.add_tools(HoverTool(renderers=renderers, tooltips=[
            ("", "@what"), ("stage", "@stage"), ("start ms", "@start"), ("ms", "@duration")]))
        legend = fig.legend[0]
        legend.orientation = "horizontal"
        legend.label_text_font_size = "10px"
        fig.add_layout(legend, "below")
    return column(left, right)


def show_chart(bubble, **options) -> None:
    """:func:`pipeline_chart`, inline in a notebook."""
    from dtflab.viz.output import show

    show(pipeline_chart(bubble, **options))


def _mean(values) -> float:
    return sum(values) / len(values) if values else 1.0
