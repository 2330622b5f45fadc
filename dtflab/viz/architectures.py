"""The two data-parallel architectures side by side: a parameter server and a ring all-reduce,
drawn with Bokeh for ``workers`` workers, each arrow labelled with what crosses it per step
(in units of the model's size M)."""

from __future__ import annotations

import math

from dtflab.viz.palette import PALETTE


def architectures(workers: int = 3, model_bytes: int | None = None):
    """A Bokeh row: parameter server (left), ring all-reduce (right)."""
    from bokeh.layouts import row

    size = f" (M = {model_bytes:,} bytes)" if model_bytes else ""
    return row(_parameter_server(workers, size), _ring(workers, size))


def _figure(title: str):
    from bokeh.plotting import figure

    fig = figure(title=title, width=430, height=380, x_range=(-1.6, 1.6), y_range=(-1.6, 1.7),
                 tools="save", toolbar_location=None)
    fig.axis.visible = False
    fig.grid.visible = False
    fig.outline_line_color = None
    return fig


def _circle(workers: int, radius: float = 1.1):
    return [(radius * math.sin(2 * math.pi * i / workers), radius * math.cos(2 * math.pi * i / workers))
            for i in range(workers)]


def _nodes(fig, points, names, color) -> None:
    from bokeh.models import ColumnDataSource, LabelSet

    source = ColumnDataSource({"x": [p[0] for p in points], "y": [p[1] for p in points],
                               "name": names})
    fig.scatter("x", "y", source=source, size=46, color=color, alpha=0.9, name="tasks")
    fig.add_layout(LabelSet(x="x", y="y", text="name", source=source, text_align="center",
                            text_baseline="middle", text_color="white", text_font_size="10px"))


def _arrow(fig, start, end, color, label=None, shrink=0.22, label_side=1) -> None:
    from bokeh.models import Arrow, Label, VeeHead

    (x0, y0), (x1, y1) = start, end
    length = math.hypot(x1 - x0, y1 - y0)
    ux, uy = (x1 - x0) / length, (y1 - y0) / length
    fig.add_layout(Arrow(end=VeeHead(size=9, fill_color=color, line_color=color),
                         x_start=x0 + ux * shrink, y_start=y0 + uy * shrink,
                         x_end=x1 - ux * shrink, y_end=y1 - uy * shrink,
                         line_color=color, line_width=2))
    if label:
        offset = -0.32 * label_side  # left of the arrow: opposite arrows, opposite sides
        fig.add_layout(Label(x=(x0 + x1) / 2 - uy * offset, y=(y0 + y1) / 2 + ux * offset, text=label,
                             text_font_size="9px", text_align="center", text_color=color))


def _parameter_server(workers: int, size: str):
    fig = _figure(f"Parameter server: {workers} x M in and out of the ps{size}")
    points = _circle(workers)
    for i, (x, y) in enumerate(points):
        nx, ny = -y * 0.08, x * 0.08  # side by side: gradients in on one side, parameters out
        _arrow(fig, (x + nx, y + ny), (nx, ny), PALETTE[1], "gradients M" if i == 0 else None)
        _arrow(fig, (-nx, -ny), (x - nx, y - ny), PALETTE[0], "parameters M" if i == 0 else None)
    _nodes(fig, [(0.0, 0.0)], ["ps:0"], PALETTE[3])
    _nodes(fig, points, [f"worker:{i}" for i in range(workers)], PALETTE[2])
    return fig


def _ring(workers: int, size: str):
    share = f"{2 * (workers - 1)}/{workers}" if workers > 1 else "0"
    fig = _figure(f"Ring all-reduce: {share} x M out of each worker{size}")
    points = _circle(workers)
    if workers > 1:
        for i, point in enumerate(points):
            _arrow(fig, point, points[(i + 1) % workers], PALETTE[1],
                   f"{2 * (workers - 1)} pieces of M/{workers}" if i == 0 else None)
    _nodes(fig, points, [f"worker:{i}" for i in range(workers)], PALETTE[2])
    return fig
