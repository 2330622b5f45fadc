"""Scaling the input: examples a second as the data service's workers are added, measured with
one loop and predicted from what an element costs to make and the cores there are to make it.

In [1]: curve = train.input_scaling(train.input_pipeline(problem, work_ms=1.0), cluster)
In [2]: curve.rows      # data workers, predicted and measured examples/s, the wait's share

The prediction, per data worker count k (0: made in this process), is the least of three
rates, in examples a second::

    input rate   = min(max(k, 1) x parallel, cores) / work_s
    compute rate = batch / step_s
    shared cores = cores / (work_s + step_s / batch)

``work_s`` is an element's processor time, measured here for k = 0 and on a data worker for
k > 0 (``served_work_s``); ``step_s`` is the same loop's step fed ready batches, measured; the
third term has the trainer's step hold one core while it runs.

On a machine whose cores the trainer and the data workers share, the third term binds early:
two cores cannot make more than about two cores' worth of elements whatever the worker count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

#: Seconds to wait after killing a data worker for the dispatcher to drop it (its timeout,
#: ``dtflab.processes.data_service.WORKER_TIMEOUT_MS``, and some).
DROPPED_S = 3.0
#: Steps left out of a measured rate: the session's start, and the batches the data workers
#: made ahead meanwhile.
SKIP = 6


@dataclass
class InputScaling:
    """One row per data worker count: ``(workers, predicted, measured, wait_share)``,
    examples a second; ``compute_rate`` what the loop reached with ready batches, ``work_s``
    an element's measured cost here and ``served_work_s`` on a data worker (its CPU seconds
    an element), ``cores`` the cores the prediction shares."""

    work_s: float
    served_work_s: float
    compute_rate: float
    cores: float
    batch: int
    rows: list[tuple[int, float, float, float | None]] = field(default_factory=list)

    def errors(self) -> list[float]:
        """Each row's (measured - predicted) / measured."""
        return [(measured - predicted) / measured for _, predicted, measured, _ in self.rows]


def predicted_rate(workers: int, work_s: float, step_s: float, batch: int,
                   cores: float, parallel: int = 1) -> float:
    """Examples a second with ``workers`` data workers each making ``parallel`` elements at
    once (0: made here, ``parallel`` at once)."""
    makers = min(max(workers, 1) * parallel, cores)
    return min(makers / work_s, batch / step_s, cores / (work_s + step_s / batch))


def steady_rate(history, skip: int = SKIP) -> float:
    """Examples a second from the end of step ``skip`` to the last step's: what the data
    workers made ahead while the session started has been eaten by then."""
    records = history.step_records
    if len(records) < skip + 3:
        raise ValueError(f"{len(records)} steps recorded; a rate is measured from step "
                         f"{skip} on: run {skip + 3} steps or more")
    kept = records[skip:]
    return sum(r.examples for r in kept[1:]) / (kept[-1].time_s - kept[0].time_s)


def served_work_s(pipeline, cluster, batches: int = 12) -> float:
    """CPU seconds a data worker spends on an element of ``pipeline``: the data workers'
    processor time while one reader takes ``batches`` batches from a job of its own, over the
    elements it received (a data worker pays more an element than this process: the service's
    own work, and the worker's executor). This process's figure where the data workers are not
    processes of this machine."""
    import psutil

    try:
        workers = [psutil.Process(task.pid) for task in cluster.tasks
                   if task.job == "data_worker" and task.pid]
    except psutil.Error:
        workers = []
    if not workers:
        return pipeline.work_s

    def busy():
        return sum(sum(worker.cpu_times()[:2]) for worker in workers)

    reader = iter(pipeline.served_by(cluster).dataset())
    next(reader)  # the job's start and the workers' first batches, left out
    before = busy()
    for _ in range(batches):
        next(reader)
    return (busy() - before) / (batches * pipeline.problem.batch_size)


def input_scaling(pipeline, cluster, *, steps: int = 30,
                  device: str = "/job:worker/task:0") -> InputScaling:
    """Train the problem of ``pipeline`` (a ``train.input_pipeline``) with ``train.single`` on
    ``device`` for ``steps`` steps: fed ready batches (the compute rate), then reading the
    pipeline made here, then from ``cluster``'s data service with every data worker, one fewer,
    ... down to one (each dropped worker killed, and all restarted at the end)."""
    from dtflab.machine import cpus
    from dtflab.train.strategies.single import single

    problem, local = pipeline.problem, pipeline.served_by(None)

    total = len(cluster.task_addresses.get("data_worker", []))
    if not total:
        raise ValueError(f"{cluster!r} has no data workers; start it with data_workers=N "
                         f"(%dtf_cluster start 2 --data-workers 2 --replace)")

    def run(inputs):
        history = single(problem, cluster=cluster, device=device, steps=steps, inputs=inputs,
                         watchdog=None)
        return steady_rate(history), history.input_wait_share()

    compute_rate, _ = run(None)
    step_s = problem.batch_size / compute_rate
    curve = InputScaling(local.work_s, served_work_s(local, cluster), compute_rate, cpus(),
                         problem.batch_size)
    measured = {0: run(local)}
    killed = []
    try:
        for workers in range(total, 0, -1):
            if workers < total:
                killed.append(f"data_worker:{workers}")
                cluster.kill(killed[-1])
                time.sleep(DROPPED_S)
            measured[workers] = run(local.served_by(cluster))
    finally:
        for task in killed:
            cluster.restart(task)
    for workers in sorted(measured):
        rate, wait = measured[workers]
        work_s = curve.served_work_s if workers else curve.work_s
        curve.rows.append((workers, predicted_rate(workers, work_s, step_s, problem.batch_size,
                                                   curve.cores), rate, wait))
    return curve
