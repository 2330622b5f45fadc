"""One process does everything, or one task of a cluster does: the baseline every loop's loss is
checked against."""

from __future__ import annotations

from dtflab import checks, names
from dtflab.train.layouts.tasks import checked_device
from dtflab.train.graphs import one_replica
from dtflab.train.run.runner import checked_run, new_runner
from dtflab.train.run.sessions import run_one_replica


def single(problem, *, steps: int = 200, seed: int = 0, cluster=None, device: str | None = None,
           background: bool = False, callbacks=(), name: str | None = None,
           trace_step: int | None = None, watchdog=True, micro_batches: int = 1):
    """One process does everything (no cluster), or one task does (``cluster`` + ``device``,
    e.g. ``"/job:worker/task:0"``). ``micro_batches``: each batch's gradients accumulated over
    that many equal slices, one at a time, before one update (the same update, with one
    slice's activations alive at once)."""
    watchdog = checked_run(steps, seed, trace_step, watchdog)
    checks.micro_batches(micro_batches, problem.batch_size)
    if device is not None:
        if cluster is None:
            raise ValueError(f"device={device!r} needs the cluster it is on: pass cluster= too, "
                             f"or leave device out to train in this process")
        checks.cluster(cluster)
        device = checked_device(cluster, device, "device")
    runner = new_runner("single", name or "single", callbacks, watchdog)
    built = one_replica.single_graph(problem, seed, device, micro_batches)
    target = cluster.target(*names.split(device)) if cluster is not None and device else ""
    return run_one_replica(built, target, runner, problem, steps, seed, cluster, background,
                            trace_step)
