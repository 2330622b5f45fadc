"""The ``local`` backend: one process per task on this machine."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from dtflab import scratch
from dtflab.cluster.base import Cluster
from dtflab.cluster.data_service import DATA_JOBS
from dtflab.cluster.memory import cpu_seconds
from dtflab.processes.launch import FORK, launcher_for
from dtflab.network.networks import PRIVATE, network_for
from dtflab.cluster.ports import free_ports
from dtflab.cluster.task import Task, TaskState, await_ready, stop_all


class LocalCluster(Cluster):
    """Tasks as processes of this machine, started in parallel.

    Each task is forked from this process's warm fork server (``start_method="fork"``, the
    default on Linux) or spawned as a fresh interpreter (``"spawn"``, or where forking is not
    possible: ``cluster.start_method`` and each task's ``started_by`` say which, and
    ``why_not_fork`` why). A task writes one line on a pipe once it runs (a server: once its
    port listens) and ends by itself when this process ends, even by SIGKILL. Its output goes
    to a log file (``cluster.logs``), read into memory and deleted at stop.

    ``network="private"`` (the default) puts the tasks in this process's private network
    namespace, reachable only from this machine's loopback (``dtflab.network.networks``); where
    the OS refuses one, the default falls back to the host network with ``exposed`` saying so,
    while an explicit "private" raises. ``network="host"`` leaves the tasks on every
    interface, as TensorFlow alone would.
    """

    backend = "local"

    def __init__(self, layout, *, network: str | None = None, start_method: str | None = None,
                 **kwargs):
        super().__init__(layout, **kwargs)
        self.network = network or PRIVATE
        self._private_asked = network == PRIVATE  # if so, no quiet fall back to the host network
        self.start_method = start_method or os.environ.get("DTFLAB_START_METHOD", FORK)
        self.why_not_fork = ""
        self._net = None
        self._launcher = None
        self._doors: list[int] = []
        self._log_dir = Path(scratch.folder("logs"))
        self._tasks = {(job, index): Task(job, index, self._log_dir / f"{job}-{index}.log")
                       for job, tasks in layout.items() for index in range(len(tasks))}
        self.profiler_ports: dict[tuple[str, int], int] = {}  # TF profiler server per task server

    # -- backend contract --------------------------------------------------------------------

    def _start_all(self) -> None:
        servers = [key for key in self._tasks if key[0] not in self.programs
                   and key[0] not in DATA_JOBS]
        self.profiler_ports = dict(zip(servers, free_ports(len(servers))))
        hosts = {host for host, _ in self.endpoints.values()}
        self._net, self.exposure_reason = network_for(
            self.network, explicit=self._private_asked, hosts=hosts, timeout=self.timeout)
        try:
            owners = {port: key for key, (_, port) in self.endpoints.items()}
            owners.update({port: key for key, port in self.profiler_ports.items()})
            self._net.open_doors(owners)
            self._doors = list(owners)
            self._launcher = launcher_for(self.start_method, self._net.netns_pid, self.timeout)
            self.start_method, self.why_not_fork = self._launcher.method, self._launcher.why_not_fork
            pending = {key: task.launch(self._launcher, self._task_command(*key))
                       for key, task in self._tasks.items()}
            await_ready({self._tasks[key]: fd for key, fd in pending.items()}, self.timeout)
        except BaseException:
            self._release()
            raise
        for key, task in self._tasks.items():
            self._states[key] = task.state

    def _stop_all(self) -> None:
        self._release()
        scratch.remove(self._log_dir)

    def _release(self) -> None:
        stop_all(self._tasks.values())
        if self._net is not None:
            self._net.close_doors(self._doors)
            self._doors = []

    def _kill_task(self, job: str, index: int) -> None:
        self._tasks[job, index].kill()

    def interrupt(self, job: str, index: int | None = None, signal_number: int = signal.SIGINT) -> bool:
        """Interrupt one task's program (SIGINT: a ``KeyboardInterrupt`` in its Python; the
        process runs on), or send it ``signal_number``. False where it does not run."""
        job, index = self._task(job, index)
        return self._tasks[job, index].interrupt(signal_number)

    def _start_task(self, job: str, index: int) -> None:
        # The old process's port is free as soon as it is gone, but another program may grab
        # it in between: say so rather than move the task, since every peer knows this address.
        if not getattr(self._launcher, "alive", True):  # its fork server died: a new one
            self._launcher = launcher_for(self.start_method, self._net.netns_pid, self.timeout)
        task = self._tasks[job, index]
        await_ready({task: task.launch(self._launcher, self._task_command(job, index))},
                    self.timeout)

    def cpu_seconds(self) -> float:
        # the processes' pids, not ``task.pid``: that reads and sets the task's state
        return cpu_seconds(task.process.pid for task in list(self._tasks.values())
                           if task.process is not None)

    def _task_state(self, job: str, index: int) -> tuple[TaskState, int | None]:
        task = self._tasks[job, index]
        task.refresh()
        if task.state is TaskState.EXITED:
            self._states[job, index] = TaskState.EXITED
        return self._states[job, index], task.pid

    def _task_details(self, job: str, index: int) -> dict:
        task = self._tasks[job, index]
        return {"exit_code": task.exit_code, "started_by": task.started_by}

    def _task_logs(self, job: str, index: int) -> str:
        return self._tasks[job, index].logs()

    def _task_log_tail(self, job: str, index: int) -> str:
        return self._tasks[job, index].log_tail()

    def _server_args(self, job: str, index: int) -> list[str]:
        return ["--profiler_port", str(self.profiler_ports.get((job, index), 0))]

    @property
    def ports(self) -> list[int]:
        return super().ports + list(self.profiler_ports.values())

    @property
    def exposed(self) -> list[str]:
        if self._net is not None and self._net.name == PRIVATE:
            return []
        return super().exposed

    def let_tasks_reach(self, port: int) -> None:
        with self._lock:
            if self._net is not None:
                self._net.let_tasks_reach(port)

    def stop_letting_tasks_reach(self, port: int) -> None:
        with self._lock:
            if self._net is not None:
                self._net.stop_letting_tasks_reach(port)
