"""The configuration map of a plan, as the Ultra-Scale Playbook draws its: tensor ways across,
pipeline ways down, each cell the fastest layout that fits with those ways (the data and context
ways fill the rest of the devices; the levers are the cell's best), coloured by MFU, grey where
no layout with those ways fits; hovering a cell shows its breakdown."""

from __future__ import annotations

GREY = "#d9d9d9"


def cells(plans) -> dict:
    """Bokeh columns, a cell per (tensor, pipeline) the plan has a layout for."""
    best = {}
    for row in plans.rows:  # fastest that fit first, then the rest by memory
        key = (row.plan.tensor, row.plan.pipeline)
        if key not in best or (row.fits and not best[key].fits):
            best[key] = row
    columns = {k: [] for k in ("tensor", "pipeline", "mfu", "colour", "label", "layout", "step",
                               "memory", "kinds", "parts", "fits")}
    top = max((row.mfu for row in best.values() if row.fits), default=1.0) or 1.0
    for (t, p), row in sorted(best.items()):
        columns["tensor"].append(str(t))
        columns["pipeline"].append(str(p))
        columns["mfu"].append(row.mfu if row.fits else 0.0)
        columns["colour"].append(_colour(row.mfu / top) if row.fits else GREY)
        columns["label"].append(f"{row.mfu:.0%}" if row.fits else
                                f"{row.memory['total'] / 1e9:.0f} GB")
        columns["layout"].append(row.layout)
        columns["step"].append(f"{row.seconds['total']:.3g} s")
        columns["memory"].append(f"{row.memory['total'] / 1e9:.3g} GB"
                                 + ("" if row.fits else " (does not fit)"))
        columns["kinds"].append(", ".join(f"{kind} {row.memory[kind] / 1e9:.3g}" for kind in
                                          ("parameters", "gradients", "optimizer", "activations")))
        columns["parts"].append(", ".join(f"{k} {v:.3g}" for k, v in row.seconds.items()
                                          if v and k != "total"))
        columns["fits"].append(row.fits)
    return columns


def _colour(share: float) -> str:
    """From pale to deep blue as a cell's MFU nears the map's best."""
    share = max(0.0, min(1.0, share))
    low, high = (222, 235, 247), (8, 48, 107)
    r, g, b = (round(a + (z - a) * share) for a, z in zip(low, high))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(plans, *, width: int = 560, height: int = 420):
    """The map (see the module's docstring); renderer ``plan_cells``."""
    from bokeh.models import ColumnDataSource, HoverTool, LabelSet
    from bokeh.plotting import figure

    data = cells(plans)
    tensors = sorted({int(t) for t in data["tensor"]})
    pipelines = sorted({int(p) for p in data["pipeline"]}, reverse=True)
    fig = figure(title=f"{plans.devices} devices of {plans.hardware.name}: MFU of each cell's "
                       f"best layout (grey: none fits)",
                 x_range=[str(t) for t in tensors], y_range=[str(p) for p in pipelines],
                 width=width, height=height, x_axis_label="tensor ways",
                 y_axis_label="pipeline ways", tools="save", toolbar_location="above")
    source = ColumnDataSource(data)
    cells_renderer = fig.rect(x="tensor", y="pipeline", width=0.95, height=0.95,
                              color="colour", source=source, name="plan_cells")
    fig.add_layout(LabelSet(x="tensor", y="pipeline", text="label", source=source,
                            text_align="center", text_baseline="middle", text_font_size="10px"))
    fig.add_tools(HoverTool(renderers=[cells_renderer], tooltips=[
        ("layout", "@layout"), ("step", "@step"), ("MFU", "@mfu{0.0%}"), ("memory", "@memory"),
        ("by kind (GB)", "@kinds"), ("time by part (s)", "@parts")]))
    fig.grid.visible = False
    return fig


def show_map(plans, **options) -> None:
    """:func:`heatmap`, inline in a notebook."""
    from dtflab.viz.output import show

    show(heatmap(plans, **options))
