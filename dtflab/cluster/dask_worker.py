"""What runs on Dask workers for the dask backend (called through ``Client.run``).

Each worker hosts its task as a child process (``python -m dtflab.cluster.server``), managed
by a LocalCluster object on that worker that launches only its own task: TensorFlow cannot
stop a server inside a running process, so a server in the worker process itself could never
be killed or stopped without restarting the Dask worker. The child ends with its worker.

Functions return plain dicts (remote exceptions with custom arguments do not pickle well).
dtflab must be importable on the workers (installed in their environment).
"""

from __future__ import annotations

import socket
from urllib.parse import urlparse

_hosted: dict[str, object] = {}  # cluster id -> LocalCluster holding this worker's task


def worker_host(dask_worker) -> str:
    """The host other machines reach this worker at (from its Dask address)."""
    return urlparse(dask_worker.address).hostname


def reserve_port(port: int | None = None, dask_worker=None) -> str:
    """``host:port`` for this worker's task: a free port of this machine unless given."""
    if port is None:
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
    return f"{worker_host(dask_worker)}:{port}"


def start_task(cluster_id: str, addresses: dict, roles: dict, inter_op: int, intra_op: int,
               timeout: float, dask_worker=None) -> dict:
    """Start the task ``roles[this worker]`` and wait until it listens."""
    from dtflab.cluster.local import LocalCluster
    from dtflab.cluster.spec import parse_legacy_spec, layout_to_legacy_spec
    from dtflab.errors import PortInUseError, TaskError

    role = roles.get(dask_worker.address)
    if role is None:
        return {}
    job, index = role
    hosted = _hosted.get(cluster_id)
    if hosted is None:
        layout = parse_legacy_spec(layout_to_legacy_spec(addresses))
        hosted = LocalCluster(layout, timeout=timeout, inter_op_threads=inter_op,
                              intra_op_threads=intra_op)
        hosted.addresses = addresses
        _hosted[cluster_id] = hosted
    try:
        hosted._start_task(job, index)
    except TaskError as exc:
        return {"ok": False, "port_in_use": isinstance(exc, PortInUseError), "what": str(exc),
                "exit_code": exc.exit_code, "log_tail": exc.log_tail}
    return {"ok": True, "pid": hosted._processes[job, index].pid}


def kill_task(cluster_id: str, job: str, index: int, dask_worker=None) -> bool:
    hosted = _hosted.get(cluster_id)
    if hosted is None or (job, index) not in hosted._processes:
        return False
    hosted._kill_task(job, index)
    return True


def stop_tasks(cluster_id: str, dask_worker=None) -> dict:
    """Stop this worker's tasks of the cluster; returns their logs."""
    hosted = _hosted.pop(cluster_id, None)
    if hosted is None:
        return {}
    keys = list(hosted._processes)
    hosted._stop_all()
    return {f"{job}:{index}": hosted._task_logs(job, index) for job, index in keys}


def poll(cluster_id: str, dask_worker=None) -> dict:
    """``{"job:index": (alive, pid, pss_mb)}`` for this worker's tasks."""
    from dtflab.cluster.memory import proportional_mb

    hosted = _hosted.get(cluster_id)
    if hosted is None:
        return {}
    out = {}
    for (job, index), process in list(hosted._processes.items()):
        alive = process.poll() is None
        out[f"{job}:{index}"] = (alive, process.pid, proportional_mb(process.pid) if alive else None)
    return out


def task_logs(cluster_id: str, job: str, index: int, dask_worker=None) -> str | None:
    hosted = _hosted.get(cluster_id)
    return None if hosted is None else hosted._task_logs(job, index)
