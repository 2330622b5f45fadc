"""The placement map: devices x variables, bytes per cell, totals and balance."""

from __future__ import annotations

from dtflab.placement.plan import PlacementPlan, variable_info
from dtflab.tracing.step import short_device
from dtflab.viz.palette import device_colors

TOTAL = "total"


def placement_figure(plan: PlacementPlan, variables, *, width: int = 520):
    """Bokeh figure: a column per device, a row per variable, a cell where it lives.

    The bottom row holds each device's total bytes; the title the imbalance (largest over mean
    bytes across the devices the strategy spreads over). Renderer names: ``cells``, ``totals``.
    """
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    infos = [variable_info(v) for v in variables]
    placement = plan.placement(infos)
    devices = plan.devices
    names = [short_device(d) for d in devices]
    colors = device_colors(devices)
    cells = {"device": [], "variable": [], "nbytes": [], "label": [], "color": [], "shape": []}
    for info in infos:
        device = placement[info.name]
        cells["device"].append(short_device(device))
        cells["variable"].append(info.name)
        cells["nbytes"].append(info.nbytes)
        cells["label"].append(f"{info.nbytes:,}")
        cells["color"].append(colors[device])
        cells["shape"].append("x".join(map(str, info.shape)) or "scalar")
    totals = plan.bytes_per_device(infos)
    total_data = {"device": names, "variable": [TOTAL] * len(names),
                  "label": [f"{totals[d]:,}" for d in devices]}
    rows = [TOTAL] + [info.name for info in reversed(infos)]
    fig = figure(title=f"Placement: imbalance {plan.imbalance(infos):.2f} (largest / mean bytes)",
                 x_range=names, y_range=rows, width=width, height=90 + 24 * len(rows),
                 tools="save", toolbar_location="above", x_axis_location="above")
    cell_renderer = fig.rect("device", "variable", 0.92, 0.86, source=ColumnDataSource(cells),
                             color="color", fill_alpha=0.35, line_color="color", name="cells")
    fig.text("device", "variable", text="label", source=ColumnDataSource(cells),
             text_align="center", text_baseline="middle", text_font_size="10px")
    fig.rect("device", "variable", 0.92, 0.86, source=ColumnDataSource(total_data),
             fill_color="#eeeeee", line_color="#999999", name="totals")
    fig.text("device", "variable", text="label", source=ColumnDataSource(total_data),
             text_align="center", text_baseline="middle", text_font_size="10px",
             text_font_style="bold")
    fig.add_tools(HoverTool(renderers=[cell_renderer], tooltips=[
        ("variable", "@variable"), ("shape", "@shape"), ("bytes", "@nbytes{0,0}"),
        ("device", "@device")]))
    fig.grid.visible = False
    return fig
