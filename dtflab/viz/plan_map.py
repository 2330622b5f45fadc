"""The configuration map of a plan, as the Ultra-Scale Playbook draws its: tensor ways across,
pipeline ways down, each cell the fastest layout that fits with those ways (the data and context
ways fill the rest of the devices; the levers are the cell's best), coloured by MFU, grey where
no layout with those ways fits; hovering a cell shows its breakdown."""

from __future__ import annotations

from dtflab.viz.colours import label_colour

GREY = "#d9d9d9"
#: The two ends of the MFU scale, pale to deep blue; a cell's label is dark on pale cells and
#: white on deep ones (whichever contrasts more with the cell: WCAG's ratio).
LOW, HIGH = (222, 235, 247), (8, 48, 107)


def cells(plans) -> dict:
    """Bokeh columns, a cell per (tensor, pipeline) the plan has a layout for."""
    best = {}
    for row in plans.rows:  # fastest that fit first, then the rest by memory
        key = (row.plan.tensor, row.plan.pipeline)
        if key not in best or (row.fits and not best[key].fits):
            best[key] = row
    columns = {k: [] for k in ("tensor", "pipeline", "mfu", "colour", "label", "label_colour",
                               "layout", "step", "memory", "kinds", "parts", "fits")}
    top = max((row.mfu for row in best.values() if row.fits), default=1.0) or 1.0
    for (t, p), row in sorted(best.items()):
        columns["tensor"].append(str(t))
        columns["pipeline"].append(str(p))
        columns["mfu"].append(row.mfu if row.fits else 0.0)
        columns["colour"].append(_colour(row.mfu / top) if row.fits else GREY)
        columns["label_colour"].append(label_colour(columns["colour"][-1]))
        columns["label"].append(f"{row.mfu:.0%}" if row.fits else
                                f"{row.memory['total'] / 1e9:.0f} GB")
        columns["layout"].append(row.name)
        columns["step"].append(f"{row.seconds['total']:.3g} s")
        columns["memory"].append(f"{row.memory['total'] / 1e9:.3g} GB"
                                 + ("" if row.fits else " (does not fit)"))
        columns["kinds"].append(", ".join(f"{kind.replace('_', ' ')} {held / 1e9:.3g}"
                                          for kind, held in row.memory.items()
                                          if kind != "total"))
        columns["parts"].append(", ".join(f"{k} {v:.3g}" for k, v in row.seconds.items()
                                          if v and k != "total"))
        columns["fits"].append(row.fits)
    return columns


def _colour(share: float) -> str:
    """From pale to deep blue as a cell's MFU nears the map's best."""
    share = max(0.0, min(1.0, share))
    r, g, b = (round(a + (z - a) * share) for a, z in zip(LOW, HIGH))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(plans, *, width: int = 560, height: int = 420):
    """The map (see the module's docstring); renderer ``plan_cells``."""
    from bokeh.models import (ColorBar, ColumnDataSource, HoverTool, LabelSet, LinearColorMapper,
                              NumeralTickFormatter, Title)
    from bokeh.plotting import figure

    data = cells(plans)
    tensors = sorted({int(t) for t in data["tensor"]})
    pipelines = sorted({int(p) for p in data["pipeline"]}, reverse=True)
    fig = figure(title="MFU of each cell's best layout (grey: none fits)",
                 x_range=[str(t) for t in tensors], y_range=[str(p) for p in pipelines],
                 width=width, height=height, x_axis_label="tensor ways",
                 y_axis_label="pipeline ways", tools="save", toolbar_location="below")
    # the machine on a line of its own: one line held both and ran past the figure's width
    fig.add_layout(Title(text=f"{plans.devices} devices of {plans.hardware.name}",
                         text_font_style="italic", text_font_size="11px"), "above")
    source = ColumnDataSource(data)
    cells_renderer = fig.rect(x="tensor", y="pipeline", width=0.95, height=0.95,
                              color="colour", source=source, name="plan_cells")
    fig.add_layout(LabelSet(x="tensor", y="pipeline", text="label", source=source,
                            text_color="label_colour", text_align="center",
                            text_baseline="middle", text_font_size="10px"))
    best = max(data["mfu"], default=0.0)  # a cell where none fits holds 0
    scale = LinearColorMapper(palette=[_colour(i / 255) for i in range(256)], low=0.0,
                              high=best or 1.0)
    fig.add_layout(ColorBar(color_mapper=scale, title="MFU", width=12,
                            formatter=NumeralTickFormatter(format="0%"), name="plan_scale"), "right")
    fig.add_tools(HoverTool(renderers=[cells_renderer], tooltips=[
        ("layout", "@layout"), ("step", "@step"), ("MFU", "@mfu{0.0%}"), ("memory", "@memory"),
        ("by kind (GB)", "@kinds"), ("time by part (s)", "@parts")]))
    fig.grid.visible = False
    return fig


def show_map(plans, **options) -> None:
    """:func:`heatmap`, inline in a notebook."""
    from dtflab.viz.output import show

    show(heatmap(plans, **options))
