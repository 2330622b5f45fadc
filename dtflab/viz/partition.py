"""The partitioned graph: a band per device, ops coloured by device, transfers drawn across."""

from __future__ import annotations

import math

from dtflab.tracing.step import StepTrace, short_device
from dtflab.viz.graph_layout import layout_graph
from dtflab.viz.palette import device_colors

TRANSFER_COLOR = "#d62728"


def _shape(transfer) -> str:
    return "?" if transfer.shape is None else "x".join(map(str, transfer.shape)) or "scalar"


#: Scopes a click can open, beyond those given in ``expand``: every layout up to this many
#: extra scopes deep is computed ahead (the figure stays a static page; no kernel needed).
CLICK_DEPTH = 2
#: At most this many layouts are embedded (each is the whole graph's positions).
MAX_VARIANTS = 24

#: Runs in the page when a node is clicked: a collapsed scope swaps in the layout with that
#: scope open. ``variants`` maps the sorted, "|"-joined extra scopes to a layout's data.
EXPAND_ON_CLICK = """
const i = ops.selected.indices[0];
ops.selected.indices = [];
if (i === undefined) return;
const scope = ops.data.scope[i];
if (!scope || (ops.tags || []).includes(scope)) return;
const opened = (ops.tags || []).concat([scope]).sort();
const variant = variants[opened.join("|")];
if (variant === undefined) return;
ops.tags = opened;
ops.data = variant.ops;
local.data = variant.local;
cross.data = variant.cross;
fig.x_range.end = variant.width + 0.2;
fig.title.text = variant.title;
hint.text = variant.hint;
"""


def partition_figure(step: StepTrace, *, max_ops: int = 150, expand=(), width: int = 900):
    """Bokeh figure of ``step``'s partition graph.

    Renderers are named ``lanes``, ``local_edges``, ``transfers`` and ``ops``. Above
    ``max_ops`` ops the graph is collapsed by top-level name scope (one node per scope and
    device, sized by its op count); click a scope to open it, or pass
    ``expand=("gradients",)``. Each transfer edge carries ``highlight``: the names of the
    send, receive and RPC records that moved it (see ``link_to_timeline``).
    """
    from bokeh.models import ColumnDataSource, CustomJS, HoverTool, LabelSet, TapTool, Title
    from bokeh.plotting import figure

    expand = tuple(scope.rstrip("/") for scope in expand)
    layout = layout_graph(step, max_ops=max_ops, expand=expand)
    colors = device_colors(layout.devices)
    n_lanes = max(len(layout.devices), 1)
    base = _layout_data(step, layout, colors)
    fig = figure(title=base["title"], width=width, height=110 + 120 * n_lanes,
                 tools="pan,wheel_zoom,box_zoom,reset,save",
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

    local = ColumnDataSource(base["local"])
    fig.multi_line(xs="xs", ys="ys", line_color="#888888", line_alpha=0.45, line_width=1,
                   source=local, name="local_edges")
    cross = ColumnDataSource(base["cross"])
    transfers = fig.multi_line(xs="xs", ys="ys", line_width="width", line_color=TRANSFER_COLOR,
                               line_alpha=0.75, source=cross, name="transfers")
    fig.add_tools(HoverTool(renderers=[transfers], tooltips=[
        ("transfer", "@route"), ("tensor", "@tensor"), ("shape", "@shape"), ("dtype", "@dtype"),
        ("bytes", "@nbytes")], line_policy="interp"))

    op_source = ColumnDataSource(base["ops"], tags=[])
    ops = fig.scatter("x", "y", size="size", color="color", line_color="white", source=op_source,
                      name="ops")
    if layout.collapsed:  # few nodes, each a scope: name them, and open one on click
        # what a click does, on a line of its own under the title (one line ran past 760 px)
        hint = Title(text=base["hint"], text_font_style="italic", text_font_size="11px",
                     name="partition_hint")
        fig.add_layout(hint, "above")
        fig.add_layout(LabelSet(x="x", y="y", text="name", source=op_source, y_offset=8,
                                text_font_size="9px", text_color="#444444", angle=0.35))
        variants = _click_variants(step, max_ops, expand, colors)
        fig.add_tools(TapTool(renderers=[ops]))
        op_source.selected.js_on_change("indices", CustomJS(
            args=dict(ops=op_source, local=local, cross=cross, fig=fig, hint=hint,
                      variants=variants),
            code=EXPAND_ON_CLICK))
    fig.add_tools(HoverTool(renderers=[ops], tooltips=[("op", "@name"), ("type", "@type"),
                                                       ("device", "@device")]))
    return fig


def _layout_data(step: StepTrace, layout, colors) -> dict:
    """The figure's data for one layout: ops, local edges, transfers, width, title."""
    wire = sum(t.nbytes for t in step.transfers)
    title = (f"Partitioned graph: {len(step.ops())} ops on {len(layout.devices)} devices, "
             f"{len(step.transfers)} transfers, {wire:,} bytes")
    hint = "collapsed by name scope: click a scope to open it" if layout.collapsed else ""
    local = [e for e in layout.edges if not e.crosses_devices]
    crossing = [e for e in layout.edges if e.crosses_devices]
    biggest = max((e.nbytes for e in crossing), default=1) or 1
    nodes = list(layout.nodes.values())
    point = lambda key: layout.nodes[key]  # noqa: E731
    return {
        "title": title, "hint": hint, "width": max(layout.width, 1),
        "local": dict(xs=[[point(e.src).x, point(e.dst).x] for e in local],
                      ys=[[point(e.src).y, point(e.dst).y] for e in local]),
        "cross": dict(
            xs=[[point(e.src).x, point(e.dst).x] for e in crossing],
            ys=[[point(e.src).y, point(e.dst).y] for e in crossing],
            width=[1.5 + 6 * math.sqrt(e.nbytes / biggest) for e in crossing],
            tensor=[", ".join(t.tensor_name for t in e.tensors[:3]) + (" ..." if len(e.tensors) > 3 else "")
                    for e in crossing],
            shape=[", ".join(_shape(t) for t in e.tensors[:3]) for e in crossing],
            dtype=[", ".join(sorted({t.dtype for t in e.tensors})) for e in crossing],
            nbytes=[f"{e.nbytes:,}" for e in crossing],
            route=[f"{short_device(e.src[0])} -> {short_device(e.dst[0])}" for e in crossing],
            highlight=["\n".join(name for t in e.tensors for name in (t.send_op, t.recv_op, t.key) if name)
                       for e in crossing]),
        "ops": dict(
            x=[n.x for n in nodes], y=[n.y for n in nodes],
            size=[9 + (3 * math.log2(len(n.ops)) if layout.collapsed else 0) for n in nodes],
            color=[colors[n.device] for n in nodes], name=[n.label for n in nodes],
            type=[(f"{len(n.ops)} ops" if n.label.endswith("/") else n.ops[0].type) for n in nodes],
            device=[short_device(n.device) for n in nodes],
            scope=[n.label.rstrip("/") if layout.collapsed and n.label.endswith("/")
                   and n.label != "(top level)/" and len(n.ops) > 1 else "" for n in nodes]),
    }


def _click_variants(step: StepTrace, max_ops: int, expand: tuple, colors) -> dict:
    """Layouts with up to CLICK_DEPTH more scopes open, keyed by those scopes, sorted and
    "|"-joined (at most MAX_VARIANTS, breadth first)."""
    variants = {}
    frontier = [((), layout_graph(step, max_ops=max_ops, expand=expand))]  # (opened, its layout)
    for _ in range(CLICK_DEPTH):
        next_frontier = []
        for opened, layout in frontier:
            scopes = sorted({n.label.rstrip("/") for n in layout.nodes.values()
                             if n.label.endswith("/") and n.label != "(top level)/" and len(n.ops) > 1})
            for scope in scopes:
                if scope in opened:  # its own ops, one level up: open already
                    continue
                key = tuple(sorted(opened + (scope,)))
                if "|".join(key) in variants or len(variants) >= MAX_VARIANTS:
                    continue
                deeper = layout_graph(step, max_ops=max_ops, expand=expand + key)
                variants["|".join(key)] = _layout_data(step, deeper, colors)
                next_frontier.append((key, deeper))
        frontier = next_frontier
    return variants


def link_to_timeline(partition, timeline) -> None:
    """Clicking a transfer edge in ``partition`` selects its send, receive and RPC records in
    ``timeline`` (Bokeh dims the rest); a click elsewhere clears it."""
    from bokeh.models import CustomJS, TapTool

    (edges,) = partition.select(name="transfers")
    records = timeline.select(name="transfers")
    if not records:
        return
    partition.add_tools(TapTool(renderers=[edges]))
    edges.data_source.selected.js_on_change("indices", CustomJS(
        args=dict(edges=edges.data_source, records=records[0].data_source),
        code="""
const picked = new Set();
for (const i of edges.selected.indices) {
    for (const name of edges.data.highlight[i].split("\\n")) picked.add(name);
}
const hits = [];
records.data.name.forEach((name, j) => { if (picked.has(name)) hits.push(j); });
records.selected.indices = hits;
"""))
