"""The pipeline chart: each worker's forwards, backwards (and, zero-bubble, weight gradients) as
they really ran in a traced step, the bubble shaded, above the schedule's formula timeline for
the same workers, micro-batches and chunks. :class:`Timeline` is one such lane chart whose bars
can be replaced in place (the schedule playground redraws it as a slider moves)."""

from __future__ import annotations

from dtflab import names

KIND_COLORS = {"F": "#1f77b4", "B": "#ff7f0e", "W": "#2ca02c"}
KIND_WORDS = {"F": "forward", "B": "backward", "W": "weight gradients"}
BUBBLE_COLOR = "#d9d9d9"
#: Renderer names by kind, after the prefix (``formula_forward``...).
RENDERERS = {"bubble": "bubble", "F": "forward", "B": "backward", "W": "weights"}
#: Each schedule's idle share, as a chart's title writes it.
FORMULAS = {"gpipe": "(p - 1) / (m + p - 1)", "1f1b": "(p - 1) / (m + p - 1)",
            "interleaved": "(p - 1) / (v m + p - 1)",
            "zero_bubble": "r / (1 + r), r = (p - 1)(F + B - W) / (m (F + B + W))"}
#: The x range's room past the last piece; the lane labels' share of a chart's width (at most,
#: "stage 0 (worker:0): idle 54%"), and a bar label's width per character (9 px type), in pixels.
FIT, LANE_LABELS_PX, CHAR_PX = 1.02, 190, 5.5
_FIELDS = ("left", "right", "bottom", "top", "color", "label", "text", "stage", "what", "start",
           "duration", "x", "y")


def _idle(busy: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The gaps between ``busy`` intervals inside ``start`` .. ``end``."""
    gaps, at = [], start
    for left, right in sorted(busy):
        if left > at:
            gaps.append((at, left))
        at = max(at, right)
    if end > at:
        gaps.append((at, end))
    return gaps


def columns(slots, rows: int, end: float, what: str, chunks: int = 1) -> dict[str, dict]:
    """Bokeh columns for each kind (``"F"``, ``"B"``, ``"W"``, ``"bubble"``): one bar per piece
    labelled F0, B0, W0 (F0.1: chunk 1 of micro-batch 0) and the gaps from 0 to ``end``.
    ``slots`` are ``(worker, kind, micro_batch, start, end, chunk)``."""
    data = {kind: {field: [] for field in _FIELDS} for kind in RENDERERS}

    def add(kind, row, left, right, label, words):
        column = data[kind]
        for field, value in (("left", left), ("right", right), ("top", -row + 0.38),
                             ("bottom", -row - 0.38), ("label", label), ("stage", f"{row}"),
                             ("what", words), ("start", f"{left:.2f}"),
                             ("duration", f"{right - left:.2f}"), ("x", (left + right) / 2),
                             ("y", -row)):
            column[field].append(value)
        column["color"].append(BUBBLE_COLOR if kind == "bubble" else KIND_COLORS[kind])

    for row in range(rows):
        own = [s for s in slots if s[0] == row]
        for _, kind, j, left, right, chunk in own:
            on = f", chunk {chunk}" if chunks > 1 else ""
            add(kind, row, left, right, f"{kind}{j}" + (f".{chunk}" if chunks > 1 else ""),
                f"{KIND_WORDS[kind]} of micro-batch {j}{on} ({what})")
        for left, right in _idle([(s[3], s[4]) for s in own], 0.0, end):
            add("bubble", row, left, right, "", f"idle ({what})")
    return data


class Timeline:
    """A lane chart, one row per worker: bars for each kind of work, the bubble hatched, each
    bar labelled; :meth:`draw` replaces what it shows (its Bokeh sources change in place)."""

    def __init__(self, title: str = "", *, width: int = 720, prefix: str = "",
                 x_label: str = "ms", x_range=None):
        from bokeh.models import ColumnDataSource, HoverTool, LabelSet, Range1d
        from bokeh.plotting import figure

        self.figure = figure(title=title, x_range=x_range or Range1d(0, 1),
                             y_range=Range1d(-0.5, 0.5), width=width, height=200,
                             x_axis_label=x_label, tools="xpan,xwheel_zoom,reset,save",
                             toolbar_location="above")
        self.figure.ygrid.visible = False
        self.sources, renderers = {}, []
        for kind, name in RENDERERS.items():
            source = ColumnDataSource({field: [] for field in _FIELDS})
            self.sources[kind] = source
            legend = {"bubble": "idle: the bubble", "B": "backward", "W": "weight gradients",
                      "F": "forward"}[kind]
            renderers.append(self.figure.quad(
                left="left", right="right", bottom="bottom", top="top", color="color",
                line_color=None if kind == "bubble" else "white",
                hatch_pattern="/" if kind == "bubble" else None, hatch_color="#999999",
                source=source, legend_label=legend, name=prefix + name))
            if kind != "bubble":
                self.figure.add_layout(LabelSet(x="x", y="y", text="text", source=source,
                                                text_align="center", text_baseline="middle",
                                                text_font_size="9px", text_color="white"))
        self.renderers = renderers
        self.figure.add_tools(HoverTool(renderers=renderers, tooltips=[
            ("", "@what"), ("row", "@stage"), ("start", "@start"), ("length", "@duration")]))
        legend = self.figure.legend[0]
        legend.orientation = "horizontal"
        legend.label_text_font_size = "10px"
        self.figure.add_layout(legend, "below")

    def draw(self, slots, labels: list[str], *, end: float | None = None, what: str = "",
             chunks: int = 1, title: str | None = None, span: float | None = None) -> None:
        """Show ``slots`` (``(worker, kind, micro_batch, start, end, chunk)``) on one row per
        entry of ``labels``, the bubble up to ``end`` (by default the last piece's end). A bar
        too narrow for its label at the chart's width, ``span`` wide (by default as
        :meth:`fit` makes it), goes unlabelled: hovering it names it."""
        rows = len(labels)
        end = max((s[4] for s in slots), default=1.0) if end is None else end
        data = columns(slots, rows, end, what, chunks)
        per_unit = (self.figure.width - LANE_LABELS_PX) / (span or end * FIT)
        for column in data.values():  # what the bar shows of its label
            column["text"] = [label if (right - left) * per_unit >= len(label) * CHAR_PX + 4
                              else "" for label, left, right
                              in zip(column["label"], column["left"], column["right"])]
        for kind, source in self.sources.items():
            source.data = data[kind]
        fig = self.figure
        fig.y_range.start, fig.y_range.end = -rows + 0.5, 0.5
        fig.height = 110 + 45 * rows
        fig.yaxis.ticker = [-s for s in range(rows)]
        fig.yaxis.major_label_overrides = {-s: labels[s] for s in range(rows)}
        if title is not None:
            fig.title.text = title
        # A legend entry for a kind this schedule has none of would only puzzle: the renderer
        # and its entry go (a hidden renderer alone leaves its label, with no swatch, in the legend).
        shown = {kind: bool(data[kind]["left"]) or kind == "bubble" for kind in RENDERERS}
        for renderer, kind in zip(self.renderers, RENDERERS):
            renderer.visible = shown[kind]
        for item in self.figure.legend[0].items:
            item.visible = all(shown[kind] for renderer, kind in zip(self.renderers, RENDERERS)
                               if renderer in item.renderers)

    def fit(self, end: float) -> None:
        self.figure.x_range.start, self.figure.x_range.end = 0.0, end * FIT


def pipeline_chart(bubble, *, width: int = 720):
    """Two Bokeh figures, one above the other, sharing their x range (ms): the traced step
    (renderers ``forward``, ``backward``, ``weights`` where the schedule splits the backward,
    ``bubble``) and the schedule's formula timeline with each piece as long as the traced step's
    mean (``formula_forward``, ...)."""
    from bokeh.layouts import column

    p, m, v = bubble.stages, bubble.layout.micro_batches, bubble.layout.chunks
    origin = min(s.start_us for s in bubble.slots)
    measured = [(bubble.worker(s), s.kind, s.micro_batch, (s.start_us - origin) / 1e3,
                 (s.end_us - origin) / 1e3, s.stage // p) for s in bubble.slots]
    ideal = [(w, k, j, a / 1e3, b / 1e3, c) for w, k, j, a, b, c in bubble.timeline()]
    end = max(bubble.span_us / 1e3, max(slot[4] for slot in ideal))
    row = "worker" if v > 1 else "stage"
    labels = [f"{row} {s} ({names.task(d)})" for s, d in enumerate(bubble.devices)]
    setting = f"{bubble.layout.schedule}, m = {m}" + (f", v = {v}" if v > 1 else "")
    top = Timeline(width=width, x_label="ms from the first micro-batch")
    top.draw(measured, [f"{label}: idle {share:.0%}" for label, share
                        in zip(labels, bubble.idle_share)], end=bubble.span_us / 1e3,
             what="measured", chunks=v, span=end * FIT,
             title=f"Measured: idle {bubble.mean_idle_share:.0%} of "
                   f"{bubble.span_us / 1e3:.1f} ms ({setting})")
    top.fit(end)
    bottom = Timeline(width=width, prefix="formula_", x_range=top.figure.x_range,
                      x_label="ms, each piece the measured mean")
    bottom.draw(ideal, labels, what="formula", chunks=v, span=end * FIT,
                title=f"Formula: idle {bubble.formula:.0%} = {FORMULAS[bubble.layout.schedule]}, "
                      f"no overhead")
    return column(top.figure, bottom.figure)


def show_chart(bubble, **options) -> None:
    """:func:`pipeline_chart`, inline in a notebook."""
    from dtflab.viz.output import show

    show(pipeline_chart(bubble, **options))
