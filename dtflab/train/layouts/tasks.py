"""Which tasks of a cluster a run uses, checked against what the cluster has: one line naming
the bad value and the fix."""

from __future__ import annotations

from dtflab import checks, names


def worker_tasks(count: int) -> list[str]:
    """The task names of the first ``count`` workers: ``["worker:0", "worker:1", ...]``."""
    return [f"worker:{i}" for i in range(count)]


def worker_devices(cluster, workers, slow=None):
    """The worker devices a data-parallel run uses, and ``slow`` as {device: seconds}."""
    checks.cluster(cluster)
    tasks = worker_tasks(len(cluster.addresses.get("worker", [])))
    if not tasks:
        raise ValueError(f"data parallelism needs a 'worker' job; this cluster has: "
                         f"{', '.join(cluster.addresses)}")
    if workers is not None:
        checks.whole(workers, "workers", maximum=len(tasks), example=len(tasks))
    chosen = tasks[:workers] if workers is not None else tasks
    slow = checks.tasks_in(slow, "slow", chosen, example={chosen[-1]: 0.05})
    return [names.device(task) for task in chosen], {names.device(t): s for t, s in slow.items()}


def enough_workers(cluster, count: int, name: str, role: str) -> None:
    """Refuse ``name=count`` when the cluster has fewer worker tasks; ``role`` says what runs
    on each one ("a stage runs on a worker task")."""
    checks.cluster(cluster)
    available = len(cluster.addresses.get("worker", []))
    if count > available:
        raise ValueError(f"{name}={count}: {role} and this cluster has {available}; use "
                         f"{name}={max(available, 1)} or start more, e.g. "
                         f"dtflab.start_cluster(workers={count})")


def checked_device(cluster, device, what: str) -> str:
    """``device`` as a full device name, if it names a task of ``cluster``."""
    tasks = [f"{job}:{i}" for job, addresses in cluster.addresses.items() for i in range(len(addresses))]
    try:
        task = "{}:{}".format(*names.split(device))
    except (ValueError, AttributeError):
        task = None
    if task not in tasks:
        raise ValueError(f"{what} names {device!r}, which is not a task of this cluster; "
                         f"use one of: {', '.join(names.device(t) for t in tasks)}")
    return names.device(task)
