"""Model parallelism as in 2016: the variables spread over the ps tasks, every op on one task."""

from __future__ import annotations

from dtflab import checks
from dtflab.placement import PlacementPlan
from dtflab.train.graphs import one_replica
from dtflab.train.layouts.tasks import checked_device
from dtflab.train.machinery.options import RunOptions, takes_options
from dtflab.train.machinery.sessions import train_graph


@takes_options(RunOptions)
def model_parallel(problem, cluster, plan: PlacementPlan | None = None, **options):
    """Variables spread over the ps tasks by layer (or by ``plan``); compute on one task."""
    options = RunOptions(**options).checked().without("model_parallel", slow="has one task "
                                                      "computing: nothing to be slower than")
    checks.cluster(cluster)
    plan = plan or PlacementPlan.by_layer(cluster, job="ps")
    for device in [plan.compute, *plan.devices]:
        checked_device(cluster, device, "plan")
    built = one_replica.model_parallel_graph(problem, plan, options.seed)
    return train_graph("model_parallel", "model parallel", built, plan.compute, problem, cluster,
                       options)
