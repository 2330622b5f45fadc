"""Model parallelism as in 2016: the variables spread over the ps tasks, every op on one task."""

from __future__ import annotations

from dtflab import checks, names
from dtflab.placement import PlacementPlan
from dtflab.train.layouts.tasks import checked_device
from dtflab.train.graphs import one_replica
from dtflab.train.run.runner import checked_run, new_runner
from dtflab.train.run.sessions import run_one_replica


def model_parallel(problem, cluster, plan: PlacementPlan | None = None, *, steps: int = 200,
                   seed: int = 0, background: bool = False, callbacks=(), name: str | None = None,
                   trace_step: int | None = None, watchdog=True):
    """Variables spread over the ps tasks by layer (or by ``plan``); compute on one task."""
    watchdog = checked_run(steps, seed, trace_step, watchdog)
    checks.cluster(cluster)
    runner = new_runner("model_parallel", name or "model parallel", callbacks, watchdog)
    plan = plan or PlacementPlan.by_layer(cluster, job="ps")
    for device in [plan.compute, *plan.devices]:
        checked_device(cluster, device, "plan")
    built = one_replica.model_parallel_graph(problem, plan, seed)
    return run_one_replica(built, cluster.target(*names.split(plan.compute)), runner,
                            problem, steps, seed, cluster, background, trace_step)
