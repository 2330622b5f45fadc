"""The three views of one step, laid out together."""

from __future__ import annotations

from dtflab.tracing.step import StepTrace
from dtflab.viz.partition import link_to_timeline, partition_figure
from dtflab.viz.timeline import timeline_figure
from dtflab.viz.transfers import transfer_matrix_figure


def step_layout(step: StepTrace, *, max_ops: int = 150, expand=()):
    """Partition graph on top; timeline and transfer matrix below it."""
    from bokeh.layouts import column, row

    partition = partition_figure(step, max_ops=max_ops, expand=expand, width=1000)
    timeline = timeline_figure(step, width=620)
    link_to_timeline(partition, timeline)  # click a transfer: its send and receive light up
    return column(partition, row(timeline, transfer_matrix_figure(step, width=380)))


# -- what StepTrace.figure/show/save_html call (see dtflab.tracing.step.VIEWS) --------------------

def figure(step: StepTrace, **options):
    return step_layout(step, **options)


def show(step: StepTrace, **options) -> None:
    from dtflab.viz.output import show as show_inline

    show_inline(step_layout(step, **options))


def save_html(step: StepTrace, path, **options) -> str:
    from dtflab.viz.output import save_html as write_html

    return write_html(step_layout(step, **options), path, title="dtflab step trace")
