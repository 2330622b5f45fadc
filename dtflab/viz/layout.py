"""A run's layout drawn: a box per task, a line per pair that talks, coloured by axis
(``Layout.picture``, which reaches here by name)."""

from __future__ import annotations

from dtflab.train.layouts.layout import AXES, PATTERNS

#: One colour per axis.
COLOURS = {"tensor": "#c44e52", "context": "#8172b2", "data": "#4c72b0", "pipeline": "#55a868"}


def positions(layout) -> dict[int, tuple[float, float]]:
    """Where the picture draws each rank: a block per pipeline stage, left to right; in it a
    row per data replica, top to bottom; along the row the context pieces, each holding
    its tensor ways side by side."""
    width = layout.context * layout.tensor
    placed = {}
    for rank in range(layout.size):
        at = layout.coordinates(rank)
        x = at["pipeline"] * (width + 1) + at["context"] * layout.tensor + at["tensor"]
        placed[rank] = (float(x), -float(at["data"]))
    return placed


def picture(layout, *, width: int = 640, sent: dict | None = None):
    """The mesh as a Bokeh figure: a box per task with its coordinates, a line per pair
    that talks, coloured by axis (hover a box for its groups); with ``sent`` (see
    :meth:`~dtflab.train.layouts.layout.Layout.link_bytes`), each link labelled with the bytes
    that crossed it."""
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    placed = positions(layout)
    xs = [x for x, _ in placed.values()]
    ys = [y for _, y in placed.values()]
    fig = figure(title=f"layout: {layout}", width=width,
                 height=max(180, 90 * layout.data + 80), tools="",
                 x_range=(min(xs) - 0.7, max(xs) + 0.7), y_range=(min(ys) - 0.8, 0.8))
    fig.axis.visible = False
    fig.grid.visible = False
    for axis in AXES:
        pairs = [(a, b) for a, b, along in layout.links() if along == axis]
        if not pairs:
            continue
        bend = {"pipeline": 0.0, "data": 0.12, "context": -0.25, "tensor": 0.25}[axis]
        fig.segment([placed[a][0] for a, _ in pairs], [placed[a][1] + bend for a, _ in pairs],
                    [placed[b][0] for _, b in pairs], [placed[b][1] + bend for _, b in pairs],
                    line_color=COLOURS[axis], line_width=3, alpha=0.8,
                    legend_label=f"{axis} ({PATTERNS[axis]})", name=f"links_{axis}")
        if sent is not None:
            crossed = layout.link_bytes(sent)
            fig.text([(placed[a][0] + placed[b][0]) / 2 for a, b in pairs],
                     [(placed[a][1] + placed[b][1]) / 2 + bend for a, b in pairs],
                     text=[_size(crossed.get((min(a, b), max(a, b)), 0)) for a, b in pairs],
                     text_color=COLOURS[axis], text_font_size="10px", text_align="center",
                     name=f"bytes_{axis}")
    source = ColumnDataSource({
        "x": xs, "y": ys, "task": [f"worker:{r}" for r in placed],
        "where": [", ".join(f"{a[0]}{i}" for a, i in layout.coordinates(r).items()
                            if layout.ways[a] > 1) or "-" for r in placed],
        "groups": ["; ".join(f"{a}: {list(layout.group(a, r))}" for a in AXES
                             if layout.ways[a] > 1) or "alone" for r in placed]})
    boxes = fig.rect("x", "y", 0.8, 0.55, source=source, fill_color="white",
                     line_color="#333333", name="tasks")
    fig.text("x", "y", text="task", source=source, text_align="center",
             text_baseline="bottom", text_font_size="11px")
    fig.text("x", "y", text="where", source=source, text_align="center",
             text_baseline="top", text_font_size="10px", text_color="#555555")
    fig.add_tools(HoverTool(renderers=[boxes], tooltips=[("task", "@task"),
                                                         ("coordinates", "@where"),
                                                         ("groups", "@groups")]))
    if fig.legend:
        fig.legend.location = "top_left"
        fig.legend.orientation = "horizontal"
    return fig


def _size(count: int) -> str:
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"
