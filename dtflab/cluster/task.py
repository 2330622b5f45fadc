"""One task server as the user sees it: job, index, address, state, process."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class TaskState(str, enum.Enum):
    """Lifecycle of one task server."""

    STARTING = "starting"
    RUNNING = "running"
    KILLED = "killed"      # stopped on purpose with Cluster.kill (a fault demo)
    EXITED = "exited"      # the process ended on its own (a crash, or killed from outside)
    STOPPED = "stopped"    # the cluster was stopped

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class TaskInfo:
    """A snapshot of one task, as listed by ``Cluster.tasks``.

    ``pid`` and ``memory_mb`` are ``None`` where the task is not a process of its own
    (the inprocess backend) or is not running. ``memory_mb`` is the proportional set size
    (shared library pages divided among the processes that map them), in MiB.
    """

    job: str
    index: int
    address: str
    state: TaskState
    pid: int | None = None
    memory_mb: float | None = None
    host: str | None = None  # where it runs, when that is not this process (e.g. a Dask worker)

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"

    @property
    def device(self) -> str:
        return f"/job:{self.job}/task:{self.index}"
