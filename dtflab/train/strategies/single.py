"""One process does everything, or one task of a cluster does: the baseline every loop's loss is
checked against."""

from __future__ import annotations

from dtflab import checks
from dtflab.train.graphs import one_replica
from dtflab.train.layouts.layout import Layout
from dtflab.train.layouts.tasks import checked_device
from dtflab.train.machinery.options import RunOptions, takes_options
from dtflab.train.machinery.sessions import train_graph


@takes_options(RunOptions)
def single(problem, *, cluster=None, device: str | None = None, micro_batches: int | None = None,
           layout: Layout | None = None, **options):
    """One process does everything (no cluster), or one task does (``cluster`` + ``device``,
    e.g. ``"/job:worker/task:0"``). ``micro_batches``: each batch's gradients accumulated over
    that many equal slices, one at a time, before one update (the same update, with one
    slice's activations alive at once); ``layout=train.Layout(micro_batches=m)`` says the
    same."""
    options = RunOptions(**options).checked().without("single", slow="has no other task to "
                                                      "be slower than")
    layout = Layout.given(layout, "single", {}, micro_batches=micro_batches)
    if layout.size > 1:
        raise ValueError(f"layout={layout!r}: single trains one copy on one task; use the "
                         f"loop of the form you cut, e.g. train.combined")
    layout.without("single", zero="keeps one whole copy", schedule="has no pipeline").fits(problem)
    if device is not None:
        if cluster is None:
            raise ValueError(f"device={device!r} needs the cluster it is on: pass cluster= too, "
                             f"or leave device out to train in this process")
        checks.cluster(cluster)
        device = checked_device(cluster, device, "device")
    built = one_replica.single_graph(problem, options.seed, device, layout.micro_batches)
    return train_graph("single", "single", built, device if cluster is not None else None,
                       problem, cluster, options, details={"layout": layout})
