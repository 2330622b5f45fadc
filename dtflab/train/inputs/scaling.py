"""Scaling the input: examples a second as the data service's workers are added, measured with
one loop and predicted from what an element costs to make and the cores there are to make it.

In [1]: curve = train.input_scaling(train.input_pipeline(problem, work_ms=1.0), cluster)
In [2]: curve.rows      # data workers, predicted and measured examples/s, the wait's share

The prediction, per data worker count k (0: made in this process), is the least of three
rates, in examples a second::

    input rate   = min(max(k, 1) x parallel, cores) / work_s
    compute rate = batch / step_s
    shared cores = cores / (total_s + step_s / batch)

``work_s`` is an element's processor time, measured here for k = 0 and on a data worker for
k > 0; ``total_s`` is what an element costs every process that makes and serves it (the data
workers, the dispatcher, this process receiving it: ``served_costs``; ``work_s`` for k = 0);
``step_s`` is the same loop's step fed ready batches, measured; the third term has the
trainer's step hold one core while it runs.

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
    an element's measured cost here, ``served_work_s`` on a data worker and ``served_total_s``
    on every process that serves it (``served_costs``), ``cores`` the cores the prediction
    shares."""

    work_s: float
    served_work_s: float
    served_total_s: float
    compute_rate: float
    cores: float
    batch: int
    rows: list[tuple[int, float, float, float | None]] = field(default_factory=list)

    def errors(self) -> list[float]:
        """Each row's (measured - predicted) / measured."""
        return [(measured - predicted) / measured for _, predicted, measured, _ in self.rows]


def predicted_rate(workers: int, work_s: float, step_s: float, batch: int,
                   cores: float, parallel: int = 1, total_s: float | None = None) -> float:
    """Examples a second with ``workers`` data workers each making ``parallel`` elements at
    once (0: made here, ``parallel`` at once), an element costing a maker ``work_s`` and the
    machine ``total_s`` (default ``work_s``) of processor time."""
    makers = min(max(workers, 1) * parallel, cores)
    total_s = work_s if total_s is None else total_s
    return min(makers / work_s, batch / step_s, cores / (total_s + step_s / batch))


def steady_rate(history, skip: int = SKIP) -> float:
    """Examples a second from the end of step ``skip`` to the last step's: what the data
    workers made ahead while the session started has been eaten by then."""
    records = history.step_records
    if len(records) < skip + 3:
        raise ValueError(f"{len(records)} steps recorded; a rate is measured from step "
                         f"{skip} on: run {skip + 3} steps or more")
    kept = records[skip:]
    return sum(r.examples for r in kept[1:]) / (kept[-1].time_s - kept[0].time_s)


def served_costs(pipeline, cluster, batches: int = 12) -> tuple[float, float]:
    """What an element of ``pipeline`` read from the data service costs, in processor seconds:
    on the data workers, and on every process of this machine that serves it (the data
    workers, the dispatcher, this process receiving it), read while one reader takes
    ``batches`` batches from a job of its own. A data worker pays more an element than this
    process does making it (the service's own work, the worker's executor), and the dispatcher
    is busy whatever the element. ``pipeline.work_s`` twice where the data workers are not
    processes of this machine."""
    import psutil

    try:
        tasks = {task.job: [] for task in cluster.tasks}
        for task in cluster.tasks:
            if task.pid and task.job in ("data_worker", "dispatcher"):
                tasks[task.job].append(psutil.Process(task.pid))
        workers, serving = tasks.get("data_worker", []), tasks.get("dispatcher", [])
    except psutil.Error:
        workers, serving = [], []
    if not workers:
        return pipeline.work_s, pipeline.work_s
    serving = workers + serving + [psutil.Process()]

    def busy(processes):
        return sum(sum(process.cpu_times()[:2]) for process in processes)

    reader = iter(pipeline.served_by(cluster).dataset())
    next(reader)  # the job's start and the workers' first batches, left out
    before = busy(workers), busy(serving)
    for _ in range(batches):
        next(reader)
    elements = batches * pipeline.problem.batch_size
    return (busy(workers) - before[0]) / elements, (busy(serving) - before[1]) / elements


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
    curve = InputScaling(local.work_s, *served_costs(local, cluster), compute_rate, cpus(),
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
        work_s, total_s = (curve.served_work_s, curve.served_total_s) if workers else \
            (curve.work_s, curve.work_s)
        curve.rows.append((workers, predicted_rate(workers, work_s, step_s, problem.batch_size,
                                                   curve.cores, pipeline.parallel, total_s),
                           rate, wait))
    return curve
