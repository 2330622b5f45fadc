"""Spawn a task process: a fresh interpreter that runs ``python -m MODULE ARGS``.

Also the environment every task process gets (``child_env``), forked or spawned.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from dtflab import allocator

SPAWN = "spawn"


def child_env(extra: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a task process: ``base`` (default: ours), unbuffered output,
    TensorFlow's warnings to the task's log, the allocator's settings (``allocator``), and
    dtflab importable."""
    env = dict(os.environ if base is None else base, PYTHONUNBUFFERED="1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    allocator.use_settings(env)
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
