"""The partitioned graph: a band per device, ops coloured by device, transfers drawn across."""

from __future__ import annotations

import math

from dtflab.tracing.step import StepTrace, short_device
from dtflab.viz.graph_layout import layout_graph
from dtflab.viz.palette import device_colors

TRANSFER_COLOR = "#d62728"


def _shape(transfer) -> str:
    return "?" if transfer.shape is None else "x".join(map(str, transfer.shape)) or "scalar"


def partition_figure(step: StepTrace, *, max_ops: int = 150, expand=(), width: int = 900):
    """Bokeh figure of ``step``'s partition graph.

    Renderers are named ``lanes``, ``local_edges``, ``transfers`` and ``ops``. Above
    ``max_ops`` ops the graph is collapsed by top-level name scope (one node per scope and
    device, sized by its op count); pass ``expand=("gradients",)`` to open scopes.
    """
    from bokeh.models import ColumnDataSource, HoverTool, LabelSet
    from bokeh.plotting import figure

    layout = layout_graph(step, max_ops=max_ops, expand=expand)
    colors = device_colors(layout.devices)
    n_lanes = max(len(layout.devices), 1)
    wire = sum(t.nbytes for t in step.transfers)
    title = (f"Partitioned graph: {len(step.ops())} ops on {len(layout.devices)} devices, "
             f"{len(step.transfers)} transfers, {wire:,} bytes"
             + (" (collapsed by name scope)" if layout.collapsed else ""))
    fig = figure(title=title, width=width, height=110 + 120 * n_lanes, tools="pan,wheel_zoom,box_zoom,reset,save",
                 x_range=(-1.2, max(layout.width, 1) + 0.2), y_range=(-n_lanes + 0.45, 0.55),
                 toolbar_location="above")
    fig.axis.visible = False
    fig.grid.visible = False

    lanes = ColumnDataSource(dict(
        bottom=[-i - 0.48 for i in range(n_lanes)], top=[-i + 0.48 for i in range(n_lanes)],
        color=[colors[d] for d in layout.devices], label=[short_device(d) for d in layout.devices],
        x=[-1.15] * n_lanes, y=[-i + 0.3 for i in range(n_lanes)]))
    fig.quad(left=-1.2, right=max(layout.width, 1) + 0.2, bottom="bottom", top="top", color="color",
             fill_alpha=0.08, line_alpha=0.3, source=lanes, name="lanes")
    fig.add_layout(LabelSet(x="x", y="y", text="label", source=lanes, text_font_style="bold",
                            text_font_size="12px"))

    local = [e for e in layout.edges if not e.crosses_devices]
    fig.multi_line(xs=[[layout.nodes[e.src].x, layout.nodes[e.dst].x] for e in local],
                   ys=[[layout.nodes[e.src].y, layout.nodes[e.dst].y] for e in local],
                   line_color="#888888", line_alpha=0.45, line_width=1, name="local_edges")

    crossing = [e for e in layout.edges if e.crosses_devices]
    biggest = max((e.nbytes for e in crossing), default=1) or 1
    cross_source = ColumnDataSource(dict(
        xs=[[layout.nodes[e.src].x, layout.nodes[e.dst].x] for e in crossing],
        ys=[[layout.nodes[e.src].y, layout.nodes[e.dst].y] for e in crossing],
        width=[1.5 + 6 * math.sqrt(e.nbytes / biggest) for e in crossing],
        tensor=[", ".join(t.tensor_name for t in e.tensors[:3]) + (" ..." if len(e.tensors) > 3 else "")
                for e in crossing],
        shape=[", ".join(_shape(t) for t in e.tensors[:3]) for e in crossing],
        dtype=[", ".join(sorted({t.dtype for t in e.tensors})) for e in crossing],
        nbytes=[f"{e.nbytes:,}" for e in crossing],
        route=[f"{short_device(e.src[0])} -> {short_device(e.dst[0])}" for e in crossing]))
    transfers = fig.multi_line(xs="xs", ys="ys", line_width="width", line_color=TRANSFER_COLOR,
                               line_alpha=0.75, source=cross_source, name="transfers")
    fig.add_tools(HoverTool(renderers=[transfers], tooltips=[
        ("transfer", "@route"), ("tensor", "@tensor"), ("shape", "@shape"), ("dtype", "@dtype"),
        ("bytes", "@nbytes")], line_policy="interp"))

    nodes = list(layout.nodes.values())
    op_source = ColumnDataSource(dict(
        x=[n.x for n in nodes], y=[n.y for n in nodes],
        size=[9 + (3 * math.log2(len(n.ops)) if layout.collapsed else 0) for n in nodes],
        color=[colors[n.device] for n in nodes], name=[n.label for n in nodes],
        type=[(f"{len(n.ops)} ops" if layout.collapsed else n.ops[0].type) for n in nodes],
        device=[short_device(n.device) for n in nodes]))
    ops = fig.scatter("x", "y", size="size", color="color", line_color="white", source=op_source,
                      name="ops")
    if layout.collapsed:  # few nodes, each a scope: name them
        fig.add_layout(LabelSet(x="x", y="y", text="name", source=op_source, y_offset=8,
                                text_font_size="9px", text_color="#444444", angle=0.35))
    fig.add_tools(HoverTool(renderers=[ops], tooltips=[("op", "@name"), ("type", "@type"),
                                                       ("device", "@device")]))
    return fig
