"""The ``local`` backend: one subprocess per task server on this machine."""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dtflab.cluster.base import Cluster
from dtflab.cluster.network import HOST, PRIVATE
from dtflab.cluster.ports import free_ports
from dtflab.cluster.server import EXIT_PORT_IN_USE
from dtflab.cluster.task import TaskState
from dtflab.errors import DtflabError, NotSupportedError, PortInUseError, TaskError

STOP_GRACE_S = 2.0
LOG_TAIL_LINES = 12
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
_no_private_network: str | None = None  # why this machine refused one, once seen


class LocalCluster(Cluster):
    """Task servers as child processes, started in parallel.

    Each child runs ``python -m dtflab.cluster.server`` with the 2016 flags, writes one line on
    a pipe once its port listens, and ends by itself when this process ends (even by SIGKILL).
    Children run in their own session, so Ctrl-C in a terminal reaches only this process, which
    then stops them. Their output goes to a log file per task (``cluster.logs``); the files are
    read into memory and deleted at stop.

    ``network="private"`` (the default) puts the tasks in a network namespace of their own,
    reachable only from this machine's loopback (see ``dtflab.cluster.network``); where the
    OS refuses one, the default falls back to the host network with ``exposed`` saying so,
    while an explicit "private" raises. ``network="host"`` leaves the tasks on every
    interface, as TensorFlow alone would.
    """

    backend = "local"

    def __init__(self, layout, *, network: str | None = None, **kwargs):
        super().__init__(layout, **kwargs)
        self.network = network or PRIVATE
        self._private_asked = network == PRIVATE  # if so, no quiet fall back to the host network
        self._gate: subprocess.Popen | None = None
        self._gate_answers = None  # the gate's answers: "ready PID", "ok PORT", ...
        self._processes: dict[tuple[str, int], subprocess.Popen] = {}
        self._log_dir = Path(tempfile.mkdtemp(prefix="dtflab-logs-"))
        self._final_logs: dict[tuple[str, int], str] = {}
        self.profiler_ports: dict[tuple[str, int], int] = {}  # TF profiler server per task

    # -- backend contract --------------------------------------------------------------------

    def _start_all(self) -> None:
        keys = [(job, i) for job, tasks in self.addresses.items() for i in range(len(tasks))]
        self.profiler_ports = dict(zip(keys, free_ports(len(keys))))
        pending = {}
        try:
            self._open_gate()
            for job, addresses in self.addresses.items():
                for index in range(len(addresses)):
                    pending[job, index] = self._launch(job, index)
            self._await_ready(pending)
        except BaseException:
            self._terminate(list(self._processes))
            self._close_gate()
            raise
        finally:
            for _, ready_fd in pending.values():
                with contextlib.suppress(OSError):
                    os.close(ready_fd)

    def _stop_all(self) -> None:
        self._terminate(list(self._processes))
        self._close_gate()
        for key in self._states:
            self._final_logs[key] = self._read_log(*key)
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def _kill_task(self, job: str, index: int) -> None:
        process = self._processes.pop((job, index), None)
        if process is not None:
            process.kill()
            process.wait()
            _close_stdin(process)

    def _start_task(self, job: str, index: int) -> None:
        # The old process's port is free as soon as it is reaped, but another program may grab
        # it in between: say so rather than move the task, since every peer knows this address.
        process, ready_fd = self._launch(job, index)
        try:
            self._await_ready({(job, index): (process, ready_fd)})
        finally:
            with contextlib.suppress(OSError):
                os.close(ready_fd)

    def _task_state(self, job: str, index: int) -> tuple[TaskState, int | None]:
        state = self._states[job, index]
        process = self._processes.get((job, index))
        if process is None:
            return state, None
        if process.poll() is not None:
            if state is TaskState.RUNNING:
                self._states[job, index] = state = TaskState.EXITED
            return state, None
        return state, process.pid

    def _task_logs(self, job: str, index: int) -> str:
        if (job, index) in self._final_logs:
            return self._final_logs[job, index]
        return self._read_log(job, index)

    # -- processes ---------------------------------------------------------------------------

    def _launch(self, job: str, index: int) -> tuple[subprocess.Popen, int]:
        process, ready_fd = _spawn([
            "dtflab.cluster.server",
            "--cluster_spec", self.legacy_spec, "--job_name", job, "--task_index", str(index),
            "--inter_op_threads", str(self.inter_op_threads),
            "--intra_op_threads", str(self.intra_op_threads),
            "--profiler_port", str(self.profiler_ports.get((job, index), 0)), "--exit_with_parent",
        ] + (["--netns", str(self._gate.pid)] if self._gate is not None else []),
            self._log_path(job, index))
        self._processes[job, index] = process
        self._states[job, index] = TaskState.STARTING
        return process, ready_fd

    def _await_ready(self, pending: dict) -> None:
        """Wait until each pending task reports ready; raise the first failure."""
        deadline = time.monotonic() + self.timeout
        with selectors.DefaultSelector() as selector:
            for key, (_, ready_fd) in pending.items():
                selector.register(ready_fd, selectors.EVENT_READ, key)
            waiting = set(pending)
            while waiting:
                remaining = deadline - time.monotonic()
                events = selector.select(timeout=max(remaining, 0))
                if not events and remaining <= 0:
                    job, index = sorted(waiting)[0]
                    raise TaskError(job, index, f"did not start within {self.timeout:g} s",
                                    log_tail=self._log_tail(job, index))
                for selected, _ in events:
                    key = selected.data
                    line = os.read(selected.fd, 256)
                    selector.unregister(selected.fd)
                    waiting.discard(key)
                    if line.startswith(b"ready"):
                        self._states[key] = TaskState.RUNNING
                    else:
                        self._raise_start_failure(*key, pending[key][0])

    def _raise_start_failure(self, job: str, index: int, process: subprocess.Popen) -> None:
        try:
            code = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._states[job, index] = TaskState.EXITED
        error = PortInUseError if code == EXIT_PORT_IN_USE else TaskError
        raise error(job, index, "exited while starting", exit_code=code,
                    log_tail=self._log_tail(job, index))

    def _terminate(self, keys) -> None:
        """End the given tasks: EOF on stdin first (they exit at once), SIGKILL after a grace."""
        processes = [self._processes.pop(key) for key in keys if key in self._processes]
        for process in processes:
            _close_stdin(process)
        deadline = time.monotonic() + STOP_GRACE_S
        for process in processes:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    @property
    def ports(self) -> list[int]:
        return super().ports + list(self.profiler_ports.values())

    # -- the private network -----------------------------------------------------------------

    @property
    def exposed(self) -> list[str]:
        if self._gate is not None:
            return []
        return super().exposed

    def _open_gate(self) -> None:
        """Start the gate (see ``dtflab.cluster.network``), or say why the tasks are exposed."""
        if self.network == HOST:
            self.exposure_reason = "started with network='host'"
            return
        hosts = {host for host, _ in self.endpoints.values()}
        refused = ("its spec names hosts other than localhost" if not hosts <= set(LOOPBACK_HOSTS)
                   else _no_private_network)
        if refused is None:
            refused = self._start_gate()
        if refused is not None:
            if self._private_asked:
                raise NotSupportedError(f"no private network for this cluster: {refused}; start it "
                                        f"with network='host' (other hosts can reach it)")
            self.exposure_reason = refused

    def _start_gate(self) -> str | None:
        """Start the gate; None once it runs, else why this machine refused."""
        global _no_private_network
        owners = {port: key for key, (_, port) in self.endpoints.items()}
        owners.update({port: key for key, port in self.profiler_ports.items()})
        gate, ready_fd = _spawn(["dtflab.cluster.network", "--ports", ",".join(map(str, owners))],
                                self._log_dir / "gate.log")
        self._gate, self._gate_answers = gate, os.fdopen(ready_fd, "rb", buffering=0)
        line = self._gate_answer(self.timeout)
        silent = line is None
        word, _, rest = (line or "").partition(" ")
        if word == "ready":
            self.exposure_reason = ""
            return None
        self._close_gate()
        if silent:
            job, index = next(iter(self._states))
            raise TaskError(job, index, f"did not start within {self.timeout:g} s (the gate of its "
                                        f"private network did not answer)")
        if word == "port-in-use":
            job, index = owners[int(rest)]
            raise PortInUseError(job, index, "could not start", log_tail=(
                f"port {rest} of {job}:{index} is already in use; choose another port"))
        if word == "unavailable":  # the OS said no: it will say no again
            _no_private_network = f"this machine refused a private network namespace ({rest})"
            return _no_private_network
        log = (self._log_dir / "gate.log").read_text(errors="replace").strip()
        raise DtflabError(f"the gate of the cluster's private network failed "
                          f"(exit code {gate.returncode}): {log[-300:] or 'no answer'}; "
                          f"start with network='host' to go without it")

    def let_tasks_reach(self, port: int) -> None:
        with self._lock:
            if self._gate is None:
                return
            self._gate.stdin.write(f"reverse {port}\n".encode())
            self._gate.stdin.flush()
            answer = self._gate_answer(10.0)
        if answer != f"ok {port}":
            raise DtflabError(f"the tasks cannot reach port {port} of this process: "
                              f"{answer or 'the gate of their private network did not answer'}")

    def _gate_answer(self, timeout: float) -> str | None:
        """The gate's next line, or None if it said nothing within ``timeout`` seconds."""
        with selectors.DefaultSelector() as answered:
            answered.register(self._gate_answers, selectors.EVENT_READ)
            if not answered.select(timeout=timeout):
                return None
        return self._gate_answers.readline().decode(errors="replace").strip()

    def _close_gate(self) -> None:
        gate, self._gate = self._gate, None
        if self._gate_answers is not None:
            self._gate_answers.close()
            self._gate_answers = None
        if gate is not None:
            _close_stdin(gate)
            try:
                gate.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                gate.kill()
                gate.wait()

    # -- logs --------------------------------------------------------------------------------

    def _log_path(self, job: str, index: int) -> Path:
        return self._log_dir / f"{job}-{index}.log"

    def _read_log(self, job: str, index: int) -> str:
        try:
            return self._log_path(job, index).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _log_tail(self, job: str, index: int) -> str:
        return "\n".join(self._read_log(job, index).splitlines()[-LOG_TAIL_LINES:])


def _spawn(module_and_args: list[str], log_path: Path) -> tuple[subprocess.Popen, int]:
    """Start ``python -m MODULE ARGS --ready_fd N`` in a session of its own, output to
    ``log_path``, stdin a pipe; returns the process and the read end of its readiness pipe."""
    ready_fd, ready_write = os.pipe()
    try:
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", *module_and_args, "--ready_fd", str(ready_write)],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(ready_write,), start_new_session=True, env=_child_env())
    except BaseException:
        os.close(ready_fd)
        raise
    finally:
        os.close(ready_write)
    return process, ready_fd


def _child_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="1")  # warnings to the log
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env


def _close_stdin(process: subprocess.Popen) -> None:
    with contextlib.suppress(OSError, ValueError):
        if process.stdin:
            process.stdin.close()
