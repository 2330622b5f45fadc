"""One task as the user sees it: job, index, address, state, process, what it runs.

``Task`` is one task process (a bare task server or a copy of the user's program) started by
a launcher (``dtflab.processes.launch``: forked from a warm fork server, or spawned). The local
backend holds one per task; a Dask worker holds one per task it hosts. ``TaskInfo`` is the
snapshot ``Cluster.tasks`` lists.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from dtflab.errors import CRASH_MARK

STOP_GRACE_S = 2.0
LOG_TAIL_LINES = 12


class TaskState(str, enum.Enum):
    """Lifecycle of one task."""

    STARTING = "starting"
    RUNNING = "running"
    KILLED = "killed"      # stopped on purpose with Cluster.kill (a fault demo)
    EXITED = "exited"      # the process ended on its own: a program that finished, a crash
    STOPPED = "stopped"    # the cluster was stopped

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class TaskInfo:
    """A snapshot of one task, as listed by ``Cluster.tasks``.

    ``pid`` and ``memory_mb`` are ``None`` where the task is not a process of its own
    (the inprocess backend) or is not running. ``memory_mb`` is the proportional set size
    (shared library pages divided among the processes that map them), in MiB. ``exit_code``
    is set once the process has ended on its own (negative: killed by that signal).
    ``started_by`` is ``"fork"`` (from the warm fork server) or ``"spawn"``.
    """

    job: str
    index: int
    address: str
    state: TaskState
    pid: int | None = None
    memory_mb: float | None = None
    host: str | None = None  # where it runs, when that is not this process (e.g. a Dask worker)
    exit_code: int | None = None
    program: str | None = None  # the script a program task runs; None for a task server
    started_by: str | None = None

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"

    @property
    def device(self) -> str:
        return f"/job:{self.job}/task:{self.index}"

    @property
    def status(self) -> str:
        """The state in words: ``exited with code 1``, ``running``, ..."""
        if self.state is TaskState.EXITED and self.exit_code is not None:
            return f"exited with code {self.exit_code}"
        return str(self.state)


@dataclass(frozen=True)
class Command:
    """What a task process runs: ``MODULE.main(ARGS)``, with ``env`` added to the launching
    process's environment, in ``cwd`` (default: the launching process's)."""

    module: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None


class Task:
    """One task process: launch, readiness, state, kill, stop, logs."""

    def __init__(self, job: str, index: int, log_path: Path):
        self.job, self.index, self.log_path = job, index, Path(log_path)
        self.state = TaskState.STARTING
        self.exit_code: int | None = None
        self.process = None
        self.started_by: str | None = None
        self.why_not_fork = ""
        self._final_log: str | None = None

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.alive else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.refresh() is None

    def launch(self, launcher, command: Command) -> int:
        """Start the process (without waiting); returns the read end of its ready pipe.

        A fork server that refuses (forking would not be safe) is replaced by a spawn. The
        process's temporary files go in its log's folder (``TMPDIR``), which its cluster
        removes when it stops: TensorFlow's AutoGraph writes a file a converted function and
        removes them only at a clean exit, which a task killed by its cluster never reaches."""
        from dtflab.processes.spawn import Spawner

        if self.process is not None:  # the one it replaces, which may have ended by itself
            self.process.close_stdin()
        self.state, self.exit_code, self._final_log = TaskState.STARTING, None, None
        env = {"TMPDIR": str(self.log_path.parent), **command.env}
        try:
            self.process, ready_fd = launcher.launch(command.module, command.args, self.log_path,
                                                     env=env, cwd=command.cwd)
            self.started_by, self.why_not_fork = launcher.method, launcher.why_not_fork
        except RuntimeError as exc:  # the fork server refused or died
            spawner = Spawner(launcher.netns_pid, f"the fork server refused: {exc}")
            self.process, ready_fd = spawner.launch(command.module, command.args, self.log_path,
                                                    env=env, cwd=command.cwd)
            self.started_by, self.why_not_fork = spawner.method, spawner.why_not_fork
        return ready_fd

    def refresh(self) -> int | None:
        """Read the process's exit code now (None while it runs); a running task that ended
        becomes ``EXITED``."""
        if self.process is None:
            return None
        code = self.process.poll()
        if code is not None:
            self.exit_code = code if self.exit_code is None else self.exit_code
            if self.state in (TaskState.RUNNING, TaskState.STARTING):
                self.state = TaskState.EXITED
        return code

    def interrupt(self, signal_number: int = signal.SIGINT) -> bool:
        """SIGINT to the process: a ``KeyboardInterrupt`` in a program's Python (it runs on);
        or ``signal_number``. False where it does not run."""
        pid = self.pid
        if pid is None:
            return False
        os.kill(pid, signal_number)
        return True

    def kill(self) -> None:
        """SIGKILL now and wait for the process to be gone."""
        if self.process is not None:
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            self.process.close_stdin()
        self.state = TaskState.KILLED

    def stop(self, *, grace: float = STOP_GRACE_S) -> None:
        """Close its stdin (it exits at once), SIGKILL after ``grace``; keep its log."""
        if self.process is not None:
            self.process.close_stdin()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=10)
        self.state = TaskState.STOPPED
        self._final_log = self.logs()

    def logs(self) -> str:
        if self._final_log is not None:
            return self._final_log
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.logs(), lines)


def stop_all(tasks, *, grace: float = STOP_GRACE_S) -> None:
    """Stop several tasks with one shared grace period: every stdin closed first."""
    import time

    tasks = list(tasks)
    for task in tasks:
        if task.process is not None:
            task.process.close_stdin()
    deadline = time.monotonic() + grace
    for task in tasks:
        task.stop(grace=max(deadline - time.monotonic(), 0.01))


def await_ready(pending: dict, timeout: float) -> None:
    """Wait until each task in ``{task: ready_fd}`` reports ready; raise the first failure as
    ``TaskError`` (``PortInUseError`` for a port in use) with its last log lines. Closes every
    fd."""
    import selectors
    import time

    from dtflab.processes.server import EXIT_PORT_IN_USE
    from dtflab.errors import PortInUseError, TaskError

    deadline = time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as selector:
            for task, ready_fd in pending.items():
                selector.register(ready_fd, selectors.EVENT_READ, task)
            waiting = set(pending)
            while waiting:
                remaining = deadline - time.monotonic()
                events = selector.select(timeout=max(remaining, 0))
                if not events and remaining <= 0:
                    task = min(waiting, key=lambda t: (t.job, t.index))
                    raise TaskError(task.job, task.index, f"did not start within {timeout:g} s",
                                    log_tail=task.log_tail())
                for selected, _ in events:
                    task = selected.data
                    line = os.read(selected.fd, 256)
                    selector.unregister(selected.fd)
                    waiting.discard(task)
                    if line.startswith(b"ready"):
                        task.state = TaskState.RUNNING
                        continue
                    try:
                        code = task.process.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        code = None
                    task.state, task.exit_code = TaskState.EXITED, code
                    error = PortInUseError if code == EXIT_PORT_IN_USE else TaskError
                    raise error(task.job, task.index, "exited while starting", exit_code=code,
                                log_tail=task.log_tail())
    finally:
        for ready_fd in pending.values():
            with contextlib.suppress(OSError):
                os.close(ready_fd)


def log_tail(log: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a task's log; after a crash that faulthandler reported, the
    crash's own lines and the crashing thread's stack instead (the other threads' stacks and
    the list of extension modules come after them)."""
    text = log.splitlines()
    fatal = [i for i, line in enumerate(text) if line.startswith(CRASH_MARK)]
    if not fatal:
        return "\n".join(text[-lines:])
    start = fatal[-1]
    current = next((i for i in range(start, len(text)) if text[i].startswith("Current thread")), None)
    stack = []
    if current is not None:
        stack = [text[current]] + [line for line in text[current + 1:current + 1 + lines]
                                   if line.startswith("  File")]
    return "\n".join(text[max(start - 2, 0):start + 1] + stack)
