"""Bytes sent between each pair of devices in one step, as a matrix."""

from __future__ import annotations

from dtflab.tracing.step import StepTrace, short_device
from dtflab.viz.colours import label_colour


def transfer_matrix_figure(step: StepTrace, *, width: int = 380):
    """Bokeh figure: rows are senders, columns receivers, one cell per pair (renderer ``cells``)."""
    from bokeh.models import ColumnDataSource, HoverTool, LinearColorMapper
    from bokeh.palettes import Blues256
    from bokeh.plotting import figure

    names = [short_device(d) for d in step.devices]
    sent = step.bytes_between()
    palette = list(reversed(Blues256))[30:]
    most = max(sent.values(), default=0) or 1
    data = {"src": [], "dst": [], "nbytes": [], "label": [], "colour": [], "label_colour": []}
    for src in step.devices:
        for dst in step.devices:
            nbytes = sent.get((src, dst), 0)
            data["src"].append(short_device(src))
            data["dst"].append(short_device(dst))
            data["nbytes"].append(nbytes)
            data["label"].append(f"{nbytes:,}" if nbytes else "")
            # the mapper's colour for it, and a label that reads on it (dark cells: white)
            data["colour"].append(palette[min(len(palette) - 1, int(nbytes / most * len(palette)))])
            data["label_colour"].append(label_colour(data["colour"][-1]))
    mapper = LinearColorMapper(palette=palette, low=0, high=most)
    fig = figure(title="Bytes on the wire (sender -> receiver)", x_range=names,
                 y_range=list(reversed(names)), width=width, height=80 + 60 * max(len(names), 1),
                 x_axis_label="to", y_axis_label="from", tools="save", toolbar_location="above",
                 x_axis_location="above")
    source = ColumnDataSource(data)
    cells = fig.rect("dst", "src", 1, 1, source=source, line_color="white",
                     fill_color={"field": "nbytes", "transform": mapper}, name="cells")
    fig.text("dst", "src", text="label", source=source, text_align="center",
             text_baseline="middle", text_font_size="11px", text_color="label_colour",
             name="cell_labels")
    fig.add_tools(HoverTool(renderers=[cells], tooltips=[("from", "@src"), ("to", "@dst"),
                                                          ("bytes", "@nbytes{0,0}")]))
    fig.grid.visible = False
    return fig
