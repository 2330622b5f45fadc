"""The tf.data service's tasks in a cluster: a ``dispatcher`` and ``data_worker`` tasks, listed,
killed and restarted like any task, but kept out of the TensorFlow cluster (``addresses``,
``spec``, ``TF_CONFIG``), whose servers they are not. What each runs is
``dtflab.processes.data_service``."""

from __future__ import annotations

from dtflab.spec import Jobs, parse_address

#: The data service's jobs.
DATA_JOBS = ("dispatcher", "data_worker")
#: Where a program task finds the cluster's data service, beside ``TF_CONFIG``.
DATA_SERVICE_ENV = "DTFLAB_DATA_SERVICE"


def with_data_service(jobs: Jobs, data_workers, backend: str) -> Jobs:
    """``jobs`` with a dispatcher and ``data_workers`` data workers added (none for 0)."""
    from dtflab import checks

    kept = sorted(set(jobs) & set(DATA_JOBS))
    if kept:
        raise ValueError(f"job name {kept[0]!r} is kept for the tf.data service; ask for it with "
                         f"data_workers=N (--data-workers N), or name your job otherwise")
    checks.whole(data_workers, "data_workers", minimum=0, example=2)
    if not data_workers:
        return jobs
    if backend == "inprocess":
        raise ValueError(f"the inprocess backend cannot hold a data service (data_workers="
                         f"{data_workers}): its servers could never be killed or stopped; use "
                         f"backend 'local' or 'dask'")
    host = next(host for tasks in jobs.values() for host, _ in tasks)
    return {**jobs, "dispatcher": [(host, None)], "data_worker": [(host, None)] * data_workers}


def data_service_command(task_addresses: dict[str, list[str]], job: str, index: int, *,
                         fixed_workers: bool):
    """What data service task ``job:index`` runs (a ``Command``). ``fixed_workers``: the
    dispatcher is given every data worker's address at start (static sharding needs it)."""
    from dtflab.cluster.task import Command

    address = task_addresses[job][index]
    _, port = parse_address(address)
    if job == "dispatcher":
        fixed = task_addresses.get("data_worker", []) if fixed_workers else []
        role = ["--role", "dispatcher", "--workers", ",".join(fixed)]
    else:
        role = ["--role", "worker", "--address", address,
                "--dispatcher", task_addresses["dispatcher"][0]]
    return Command("dtflab.processes.data_service", [*role, "--port", str(port),
                                                     "--exit_with_parent"])
