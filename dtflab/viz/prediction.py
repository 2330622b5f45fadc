"""A predicted step above the traced one: the same timeline view (``viz.timeline``) for
each, on one time axis, and the kinds of op where they part most, in words."""

from __future__ import annotations

from dtflab.viz.timeline import timeline_figure


def figure(prediction, history, *, width: int = 900):
    """Two timelines, one device a lane: the step as ``prediction`` simulated it (top) and as
    ``history``'s traced step ran (below; ``trace_step=`` is needed), sharing their x axis."""
    from bokeh.layouts import column
    from bokeh.models import Div

    if prediction.timeline is None:
        raise ValueError(f"{prediction.loop}: its prediction comes from the planner's formulas "
                         f"and has no timeline; train.run_layout's has one")
    if getattr(history, "trace", None) is None:
        raise ValueError(f"{history.name}: no traced step to compare with; run it with "
                         f"trace_step=, e.g. trace_step=5")
    predicted = timeline_figure(prediction.timeline, width=width)
    traced = timeline_figure(history.trace, width=width)
    traced.x_range = predicted.x_range
    compared = prediction.against(history)
    predicted.title.text = f"predicted: {prediction.seconds * 1e3:.1f} ms a step"
    traced.title.text = (f"traced: {history.trace.step_us / 1e3:.1f} ms (untraced steps: "
                         f"median {compared['measured_ms']:.1f} ms)")
    words = prediction.differences(history)
    note = Div(text=f"<p class='dtflab-prediction-note'>Where they part most: "
                    f"{words or 'nowhere by more than rounding'}.</p>", width=width)
    return column(predicted, traced, note)


def show(prediction, history, **options) -> None:
    from dtflab.viz.output import show as show_inline

    show_inline(figure(prediction, history, **options))
