"""How task processes start: spawned (a fresh interpreter, ``spawn``) or forked from a warm
fork server (``forkserver``); this module chooses between them and owns the fork servers.

A launcher's ``launch(module, args, log_path, env=..., cwd=...)`` starts ``module.main(args +
["--ready_fd", N])`` in a process of its own session, output appended to ``log_path``, stdin a
pipe from this process (its EOF tells the task its owner is gone), and returns ``(process,
ready_fd)``: a handle with ``pid``, ``poll()``, ``wait(timeout)``, ``kill()`` and
``close_stdin()``, and the read end of the pipe the task writes ``ready PID`` on.

``fork_server(netns_pid)`` is this process's fork server for one network, started on first
use and kept until this process exits (see ``dtflab.processes.forkserver``).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

from dtflab import scratch
from dtflab.processes.forkserver import ForkServer
from dtflab.processes.spawn import SPAWN, Spawner

FORK = "fork"
START_METHODS = (FORK, SPAWN)


_lock = threading.Lock()
_fork_servers: dict = {}  # netns pid (None: this machine's network) -> ForkServer


def fork_server(netns_pid: int | None, *, wait: float | None = 60.0):
    """This process's fork server on that network: started now if there is none (or it
    died); with ``wait``, returned once it has imported TensorFlow. Raises ``RuntimeError``
    with the reason where it cannot start."""
    with _lock:
        server = _fork_servers.get(netns_pid)
        if server is None or not server.alive:
            if server is not None:
                server.close()
            server = _fork_servers[netns_pid] = ForkServer(netns_pid, _log_dir())
            if len(_fork_servers) == 1:
                atexit.register(close_fork_servers)
    if wait is not None:
        server.wait_ready(wait)
    return server


def launcher_for(method: str, netns_pid: int | None, timeout: float):
    """A fork server for ``method="fork"`` where one starts and is safe, else a ``Spawner``
    that says why not (``why_not_fork``)."""
    if method == SPAWN:
        return Spawner(netns_pid, "asked for start_method='spawn'")
    if not hasattr(os, "fork") or sys.platform != "linux":
        return Spawner(netns_pid, f"fork is not safe for TensorFlow on {sys.platform}")
    try:
        return fork_server(netns_pid, wait=timeout)
    except RuntimeError as exc:
        return Spawner(netns_pid, f"the fork server could not start: {exc}")


def close_fork_servers() -> None:
    """End every fork server of this process (the tasks they forked run on)."""
    with _lock:
        for server in _fork_servers.values():
            server.close()
        _fork_servers.clear()


_logs: list[str] = []


def _log_dir() -> str:
    if not _logs:
        _logs.append(scratch.folder("forkserver"))
        atexit.register(scratch.remove, _logs[0])
    return _logs[0]
