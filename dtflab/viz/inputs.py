"""The input on the timeline: each step of a run as the time it waited for its batch, then the
time it ran, one row per run, so an input-bound run shows as more wait than step.

In [1]: show(input_timeline(here, served))

A step's wait is timed where its batch is read: in the notebook, from the end of the last step
to the batch in hand, or in each worker program, for its own share (the step's is the longest);
``StepRecord.input_wait_s``. The rest of the step is the step itself and what surrounds it. The
first step is left out: nothing before it marks where its wait began.
"""

from __future__ import annotations

WAIT_COLOUR, STEP_COLOUR = "#ff7f0e", "#1f77b4"


def input_timeline(*histories, steps: int | None = None):
    """A Bokeh figure: for each history (a run that read an input pipeline, or not), its steps
    after the first as waits (orange) and runs (blue) along the run's own clock; ``steps``
    keeps the first that many of each."""
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    names = [history.name for history in histories]
    fig = figure(y_range=list(reversed(names)), height=90 + 50 * len(histories), width=760,
                 title="Each step: waiting for its batch (orange), then running (blue)",
                 x_axis_label="seconds since the run began", tools="xpan,xwheel_zoom,reset,save")
    for kind, colour in (("waiting for input", WAIT_COLOUR), ("step", STEP_COLOUR)):
        data = {"run": [], "left": [], "right": [], "step": []}
        for history in histories:
            records = history.step_records  # the longest wait of a step's workers
            records = records[:steps + 1] if steps else records
            for before, record in zip(records, records[1:]):
                wait = record.input_wait_s or 0.0
                left, right = (before.time_s, before.time_s + wait) if kind != "step" else \
                    (before.time_s + wait, record.time_s)
                data["run"].append(history.name)
                data["left"].append(left)
                data["right"].append(right)
                data["step"].append(record.step)
        fig.hbar(y="run", left="left", right="right", height=0.6, color=colour,
                 source=ColumnDataSource(data), legend_label=kind)
    fig.add_tools(HoverTool(tooltips=[("run", "@run"), ("step", "@step"),
                                      ("seconds", "@left{0.000} to @right{0.000}")]))
    fig.legend.location = "bottom_right"
    fig.legend.orientation = "horizontal"
    return fig


def input_scaling_figure(curve):
    """Examples a second against data workers (0: made in the notebook): the prediction as a
    dashed line, the measurements as dots, what the loop reached with ready batches dotted."""
    from bokeh.models import ColumnDataSource, Span
    from bokeh.plotting import figure

    source = ColumnDataSource({"workers": [r[0] for r in curve.rows],
                               "predicted": [r[1] for r in curve.rows],
                               "measured": [r[2] for r in curve.rows]})
    fig = figure(title="Examples a second against data workers (0: made in the notebook)",
                 height=300, width=560, x_axis_label="data workers", y_axis_label="examples/s",
                 tools="save")
    fig.line("workers", "predicted", source=source, line_dash="dashed", color=STEP_COLOUR,
             legend_label="predicted", line_width=2)
    fig.scatter("workers", "measured", source=source, size=9, color="#d62728",
                legend_label="measured")
    fig.add_layout(Span(location=curve.compute_rate, dimension="width", line_dash="dotted",
                        line_color="#555555"))
    fig.legend.location = "bottom_right"
    fig.xaxis.ticker = [r[0] for r in curve.rows]
    return fig
