"""The three views of one step, laid out together."""

from __future__ import annotations

from dtflab.tracing.step import StepTrace
from dtflab.viz.partition import partition_figure
from dtflab.viz.timeline import timeline_figure
from dtflab.viz.transfers import transfer_matrix_figure


def step_layout(step: StepTrace, *, max_ops: int = 150, expand=()):
    """Partition graph on top; timeline and transfer matrix below it."""
    from bokeh.layouts import column, row

    return column(partition_figure(step, max_ops=max_ops, expand=expand, width=1000),
                  row(timeline_figure(step, width=620), transfer_matrix_figure(step, width=380)))
