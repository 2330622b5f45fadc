"""One step as a Gantt chart per device: computing vs waiting on transfers."""

from __future__ import annotations

from dtflab.tracing.step import StepTrace, short_device
from dtflab.viz.palette import device_colors

KIND_COLORS = {"transfer": "#d62728", "send": "#bbbbbb", "recv": "#bbbbbb", "runtime": "#cccccc"}
RENDERERS = (("compute", "compute"), ("transfers", "waiting on a transfer"),
             ("runtime", "TensorFlow runtime"))


def _pack(timings) -> list[int]:
    """A sub-row for each op so that ops overlapping in time (parallel threads) don't cover
    each other; greedy, in start order."""
    ends: list[float] = []
    rows = []
    for timing in timings:
        for row, end in enumerate(ends):
            if timing.start_us >= end:
                ends[row] = timing.end_us
                rows.append(row)
                break
        else:
            ends.append(timing.end_us)
            rows.append(len(ends) - 1)
    return rows


def timeline_figure(step: StepTrace, *, width: int = 600):
    """Bokeh figure: x is milliseconds from the step start, a lane per device.

    Compute ops take the device's colour; ``RecvTensor`` records (a task waiting for and copying
    a tensor from another task) are red; TF2 profiler runtime events grey. Renderer names:
    ``compute``, ``transfers``, and ``runtime`` where there are such events.
    """
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    devices = step.devices
    colors = device_colors(devices)
    columns = {kind: {k: [] for k in ("left", "right", "bottom", "top", "color", "name", "op",
                                      "device", "start", "duration")}
               for kind, _ in RENDERERS}
    for lane, device in enumerate(devices):
        timings = sorted(step.timings.get(device, []), key=lambda t: (t.start_us, t.name))
        rows = _pack(timings)
        n_rows = max(rows, default=0) + 1
        for timing, row in zip(timings, rows):
            data = columns[timing.kind if timing.kind in ("compute", "runtime") else "transfers"]
            top = -lane + 0.42 - 0.84 * row / n_rows
            data["left"].append(timing.start_us / 1000)
            data["right"].append(max(timing.end_us, timing.start_us + 0.5) / 1000)
            data["top"].append(top)
            data["bottom"].append(top - 0.84 / n_rows * 0.9)
            data["color"].append(KIND_COLORS.get(timing.kind, colors[device]))
            data["name"].append(timing.name)
            data["op"].append(timing.op if timing.kind == "compute" else f"{timing.op} ({timing.kind})")
            data["device"].append(short_device(device))
            data["start"].append(f"{timing.start_us / 1000:.3f}")
            data["duration"].append(f"{timing.duration_us / 1000:.3f}")
    fig = figure(title=f"Timeline of one step ({step.step_us / 1000:.2f} ms)", width=width,
                 height=90 + 70 * max(len(devices), 1), x_axis_label="ms from step start",
                 y_range=(-len(devices) + 0.45, 0.55), tools="xpan,xwheel_zoom,box_zoom,reset,save",
                 toolbar_location="above")
    fig.yaxis.ticker = [-i for i in range(len(devices))]
    fig.yaxis.major_label_overrides = {-i: short_device(d) for i, d in enumerate(devices)}
    fig.ygrid.visible = False
    renderers = []
    for kind, label in RENDERERS:
        if kind == "runtime" and not columns[kind]["left"]:
            continue
        renderers.append(fig.quad(left="left", right="right", bottom="bottom", top="top",
                                  color="color", line_color=None, source=ColumnDataSource(columns[kind]),
                                  legend_label=label, name=kind))
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[
        ("op", "@name"), ("type", "@op"), ("device", "@device"), ("start ms", "@start"),
        ("duration ms", "@duration")]))
    legend = fig.legend[0]
    legend.orientation = "horizontal"
    legend.label_text_font_size = "10px"
    fig.add_layout(legend, "below")
    return fig
