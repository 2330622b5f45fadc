"""Put runs side by side: loss curves overlaid, time and throughput as ratios."""

from __future__ import annotations

import html
from dataclasses import dataclass

from dtflab.viz.palette import PALETTE


@dataclass
class Comparison:
    """``rows``: one dict per run, ratios against the first run; ``figure()``: loss curves."""

    runs: tuple
    rows: list[dict]

    def figure(self, width: int = 640):
        from bokeh.plotting import figure

        fig = figure(title="Loss per example", width=width, height=320, x_axis_label="step",
                     y_axis_type="log", tools="pan,wheel_zoom,box_zoom,reset,save")
        for i, run in enumerate(self.runs):
            steps = run.step_records
            fig.line([r.step for r in steps], [max(r.loss, 1e-12) for r in steps],
                     color=PALETTE[i % len(PALETTE)], legend_label=run.name, line_width=2,
                     alpha=0.8, name=f"run{i}")
        fig.legend.location = "top_right"
        return fig

    def show(self) -> None:
        from dtflab.viz.output import show

        show(self.figure())

    def _repr_html_(self) -> str:
        head = ("<tr><th>run</th><th>steps</th><th>seconds</th><th>examples/s</th>"
                "<th>time vs first</th><th>throughput vs first</th><th>max |Δ loss| vs first</th></tr>")
        body = "".join(
            f"<tr><td>{html.escape(r['name'])}</td><td>{r['steps']}</td><td>{r['wall_s']:.2f}</td>"
            f"<td>{r['examples_per_s']:,.0f}</td><td>{r['time_ratio']:.2f}x</td>"
            f"<td>{r['throughput_ratio']:.2f}x</td><td>{r['max_abs_loss_diff']:.2e}</td></tr>"
            for r in self.rows)
        return f"<table class='dtflab-compare'>{head}{body}</table>"

    def __repr__(self) -> str:
        return "\n".join(
            f"{r['name']}: {r['steps']} steps, {r['wall_s']:.2f} s, {r['examples_per_s']:,.0f} ex/s, "
            f"time x{r['time_ratio']:.2f}, throughput x{r['throughput_ratio']:.2f}, "
            f"max |dloss| {r['max_abs_loss_diff']:.2e}" for r in self.rows)


def compare(*runs) -> Comparison:
    """Compare RunHistory objects (or BackgroundRuns) against the first one.

    ``max_abs_loss_diff`` is taken over the steps both runs have, step by step.
    """
    histories = tuple(getattr(run, "history", run) for run in runs)
    if not histories:
        raise ValueError("compare needs at least one run, e.g. compare(single_run, sync_run)")
    first = histories[0]
    base = {r.step: r.loss for r in first.records}
    rows = []
    for history in histories:
        common = [abs(r.loss - base[r.step]) for r in history.records if r.step in base]
        rows.append({
            "name": history.name, "steps": history.steps, "wall_s": history.wall_s,
            "examples_per_s": history.examples_per_s,
            "time_ratio": history.wall_s / first.wall_s if first.wall_s else float("nan"),
            "throughput_ratio": (history.examples_per_s / first.examples_per_s
                                 if first.examples_per_s else float("nan")),
            "max_abs_loss_diff": max(common) if common else float("nan"),
        })
    return Comparison(histories, rows)
