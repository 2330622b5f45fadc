"""How task processes start: spawned (a fresh interpreter) or forked from a warm fork server.

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
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SPAWN, FORK = "spawn", "fork"
START_METHODS = (FORK, SPAWN)


def child_env(extra: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a task process: ``base`` (default: ours), unbuffered output,
    TensorFlow's warnings to the task's log, and dtflab importable."""
    env = dict(os.environ if base is None else base, PYTHONUNBUFFERED="1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    package_root = str(Path(__file__).resolve().parents[2])
    if package_root not in env.get("PYTHONPATH", "").split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


class SpawnedProcess:
    """A ``subprocess.Popen`` with the launcher handle's ``close_stdin``."""

    def __init__(self, popen: subprocess.Popen):
        self.popen, self.pid = popen, popen.pid

    def poll(self):
        return self.popen.poll()

    def wait(self, timeout=None):
        return self.popen.wait(timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.popen.stdin:
                self.popen.stdin.close()


def spawn_module(module: str, args: list[str], log_path, *, env=None, cwd=None,
                 pass_fds=()) -> tuple[subprocess.Popen, int]:
    """Start ``python -m MODULE ARGS --ready_fd N`` in a session of its own; returns the
    process and the read end of its readiness pipe."""
    ready_fd, ready_write = os.pipe()
    try:
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", module, *args, "--ready_fd", str(ready_write)],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                pass_fds=(ready_write, *pass_fds), start_new_session=True,
                env=env if env is not None else child_env())
    except BaseException:
        os.close(ready_fd)
        raise
    finally:
        os.close(ready_write)
    return process, ready_fd


class Spawner:
    """Starts each task as a fresh interpreter: pays a full ``import tensorflow``."""

    method = SPAWN
    why_not_fork = ""

    def __init__(self, netns_pid: int | None = None, why_not_fork: str = ""):
        self.netns_pid, self.why_not_fork = netns_pid, why_not_fork

    def launch(self, module, args, log_path, *, env=None, cwd=None):
        args = list(args) + (["--netns", str(self.netns_pid)] if self.netns_pid else [])
        process, ready_fd = spawn_module(module, args, log_path, env=child_env(extra=env), cwd=cwd)
        return SpawnedProcess(process), ready_fd


_lock = threading.Lock()
_fork_servers: dict = {}  # netns pid (None: this machine's network) -> ForkServer


def fork_server(netns_pid: int | None, *, wait: float | None = 60.0):
    """This process's fork server on that network: started now if there is none (or it
    died); with ``wait``, returned once it has imported TensorFlow. Raises ``RuntimeError``
    with the reason where it cannot start."""
    from dtflab.processes.forkserver import ForkServer

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
        _logs.append(tempfile.mkdtemp(prefix="dtflab-forkserver-"))
        atexit.register(lambda: __import__("shutil").rmtree(_logs[0], ignore_errors=True))
    return _logs[0]
