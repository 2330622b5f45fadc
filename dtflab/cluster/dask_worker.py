"""What runs on Dask workers for the dask backend (called through ``Client.run``).

Each worker hosts its task as a child process (a ``Task``): TensorFlow cannot stop a server
inside a running process, so a server in the worker process itself could never be killed or
stopped without restarting the Dask worker. A worker in a process of its own spawns its task,
which ends with the worker; a worker running inside the owner's process (the LocalCluster
dtflab makes) forks it from the owner's warm fork server instead, which ends with the owner. The
owner sends what each task runs (a ``Command``: a task server, or the user's program, whose
script must be at the same path on the worker's machine).

Functions return plain dicts (remote exceptions with custom arguments do not pickle well).
dtflab must be importable on the workers (installed in their environment).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from dtflab import scratch

_hosted: dict[str, dict] = {}  # cluster id -> {(job, index): Task} on this worker
_log_dirs: dict[str, Path] = {}


def worker_host(dask_worker) -> str:
    """The host other machines reach this worker at (from its Dask address)."""
    return urlparse(dask_worker.address).hostname


def reserve_port(port: int | None = None, dask_worker=None) -> str:
    """``host:port`` for this worker's task: a free port of this machine unless given."""
    if port is None:
        from dtflab.cluster.ports import free_ports

        (port,) = free_ports(1)
    return f"{worker_host(dask_worker)}:{port}"


def start_task(cluster_id: str, commands: dict, timeout: float, owner_pid: int | None = None,
               dask_worker=None) -> dict:
    """Start this worker's task ``commands[worker address] = (job, index, Command)`` and wait
    until it runs. ``owner_pid``: the process that started the cluster."""
    from dtflab.cluster.task import Task, await_ready
    from dtflab.errors import PortInUseError, TaskError
    from dtflab.processes.launch import FORK, launcher_for
    from dtflab.processes.spawn import Spawner

    if dask_worker.address not in commands:
        return {}
    job, index, command = commands[dask_worker.address]
    if cluster_id not in _log_dirs:  # one folder a cluster and worker (not one a task)
        _log_dirs[cluster_id] = Path(scratch.folder("logs"))
    log_dir = _log_dirs[cluster_id]
    tasks = _hosted.setdefault(cluster_id, {})
    task = tasks.setdefault((job, index), Task(job, index, log_dir / f"{job}-{index}.log"))
    try:
        launcher = launcher_for(FORK, None, timeout) if os.getpid() == owner_pid else Spawner()
        await_ready({task: task.launch(launcher, command)}, timeout)
    except (TaskError, OSError) as exc:
        return {"ok": False, "port_in_use": isinstance(exc, PortInUseError), "what": str(exc),
                "log_tail": getattr(exc, "log_tail", "")}
    return {"ok": True, "pid": task.pid}


def kill_task(cluster_id: str, job: str, index: int, dask_worker=None) -> bool:
    task = _hosted.get(cluster_id, {}).get((job, index))
    if task is None:
        return False
    task.kill()
    return True


def interrupt_task(cluster_id: str, job: str, index: int, signal_number: int,
                   dask_worker=None) -> bool:
    task = _hosted.get(cluster_id, {}).get((job, index))
    return task is not None and task.interrupt(signal_number)


def stop_tasks(cluster_id: str, dask_worker=None) -> dict:
    """Stop this worker's tasks of the cluster; returns their logs."""
    from dtflab.cluster.task import stop_all

    tasks = _hosted.pop(cluster_id, {})
    stop_all(tasks.values())
    logs = {task.name: task.logs() for task in tasks.values()}
    scratch.remove(_log_dirs.pop(cluster_id, ""))
    return logs


def poll(cluster_id: str, dask_worker=None) -> dict:
    """``{"job:index": (alive, pid, pss_mb, exit_code)}`` for this worker's tasks."""
    from dtflab.cluster.memory import proportional_mb

    out = {}
    for task in list(_hosted.get(cluster_id, {}).values()):
        alive = task.alive
        out[task.name] = (alive, task.pid, proportional_mb(task.pid) if alive else None,
                          task.exit_code)
    return out


def task_logs(cluster_id: str, job: str, index: int, dask_worker=None) -> str | None:
    task = _hosted.get(cluster_id, {}).get((job, index))
    return None if task is None else task.logs()
