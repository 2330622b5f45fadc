"""The ``Cluster`` base class: one lifecycle contract for every backend."""

from __future__ import annotations

import threading

from dtflab.cluster import running
from dtflab.cluster.data_service import DATA_JOBS, DATA_SERVICE_ENV, data_service_command
from dtflab.cluster.memory import proportional_mb
from dtflab.cluster.ports import choose_ports
from dtflab.cluster.programs import LOOPBACK
from dtflab.cluster.task import TaskInfo, TaskState, log_tail
from dtflab.errors import NotSupportedError, PortInUseError
from dtflab.network.networks import one_address
from dtflab.spec import Jobs, jobs_to_legacy_spec, parse_address, parse_task

PORT_ATTEMPTS = 3


class Cluster:
    """A TensorFlow cluster: start, status, kill/restart a task, wait for its programs, stop.

    Each task is a bare task server, or, for the jobs named in ``programs``, a copy of the
    user's program (``dtflab.cluster.programs``) that gets ``TF_CONFIG`` and starts its own
    server. Lifecycle of a task: starting -> running -> exited (on its own, with a code) |
    killed (``kill``) | stopped (``stop``); ``restart`` starts it again on the same address.

    A backend subclass provides:

    - ``_start_all()``: start every task in ``self.task_addresses`` (in parallel where it can) and
      return once each one listens; on failure, stop what it started and raise ``TaskError``
      (``PortInUseError`` when a port was taken);
    - ``_stop_all()``;
    - ``_task_state(job, index) -> (TaskState, pid or None)`` and ``_task_logs(job, index)``;
    - optionally ``_kill_task`` / ``_start_task`` (default: refuse with ``NotSupportedError``),
      ``_task_host`` and ``_client_host`` for tasks that run elsewhere, ``_task_details`` (exit
      code, how it started) and ``_server_args`` (extra flags for a task server).

    It gets for free: ``spec``, ``target()``, ``tasks``, what each task runs
    (``_task_command``), free ports chosen at start and chosen again when one is taken
    meanwhile, ``wait()``, ``connect()``, the status panel and HTML repr, use as a context
    manager, and a stop at interpreter exit.
    """

    backend = "base"
    #: How task processes start: "fork" (from a warm fork server), "spawn", or None where
    #: tasks are not processes of this machine.
    start_method: str | None = None

    def __init__(self, jobs: Jobs, *, timeout: float = 60.0,
                 inter_op_threads: int | None = None, intra_op_threads: int | None = None,
                 programs: dict | None = None, fixed_data_workers: bool = False):
        self._jobs = jobs
        #: job -> ``Program`` for the jobs whose tasks run the user's program.
        self.programs = dict(programs or {})
        self.timeout = timeout
        n_tasks = sum(len(tasks) for job, tasks in jobs.items() if job not in DATA_JOBS)
        #: Threads per task for independent ops. Defaults to tasks + 1: ParameterServerStrategy
        #: hangs on small machines with fewer (see DESIGN.md).
        self.inter_op_threads = inter_op_threads if inter_op_threads is not None else n_tasks + 1
        self.intra_op_threads = intra_op_threads or 0
        #: Every task's ``host:port`` by job, the data service's too (``addresses``: without).
        self.task_addresses: dict[str, list[str]] = {}
        self._states: dict[tuple[str, int], TaskState] = {
            (job, index): TaskState.STARTING for job, tasks in jobs.items()
            for index in range(len(tasks))}
        #: Why other hosts can reach the task servers (see ``exposed``).
        self.exposure_reason = (f"the {self.backend} backend's task servers listen on every "
                                f"interface (TensorFlow binds 0.0.0.0)")
        self.fixed_data_workers = fixed_data_workers  # see start_cluster's
        self._lock = threading.RLock()
        self._watchers: list = []  # callables run after every change of state (panels)
        self._panel = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> "Cluster":
        """Start every task; returns once all listen. Called by ``dtflab.start_cluster``."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.task_addresses = choose_ports(self._jobs)
            try:
                self._start_all()
                break
            except PortInUseError as exc:
                chosen_here = self._jobs[exc.job][exc.index][1] is None
                if chosen_here and attempt < PORT_ATTEMPTS:
                    continue  # another program took a port we chose: choose again
                self._give_up()
                raise
            except BaseException:
                self._give_up()
                raise
        running.track(self)
        self._changed()
        return self

    def stop(self) -> None:
        """Stop every task and release what the cluster holds. Safe to call twice."""
        with self._lock:
            if self.stopped:
                return
            self._stop_all()
            for key in self._states:
                self._states[key] = TaskState.STOPPED
            running.forget(self)
        self._changed()

    def _give_up(self) -> None:
        """Release whatever a failed start left (log files), so nothing outlives the error."""
        self._stop_all()
        for key in self._states:
            self._states[key] = TaskState.STOPPED

    def kill(self, job: str, index: int | None = None) -> None:
        """Kill one task at once (SIGKILL where it is a process): a fault for teaching."""
        job, index = self._task(job, index)
        with self._lock:
            self._require_running()
            self._kill_task(job, index)
            self._states[job, index] = TaskState.KILLED
        self._changed()

    def restart(self, job: str, index: int | None = None) -> None:
        """Start one task again on the same address (killing it first if it runs)."""
        job, index = self._task(job, index)
        with self._lock:
            self._require_running()
            if self._task_state(job, index)[0] is TaskState.RUNNING:
                self._kill_task(job, index)
            self._states[job, index] = TaskState.STARTING
            try:
                self._start_task(job, index)
            except Exception:
                self._states[job, index] = TaskState.EXITED
                self._changed()
                raise
            self._states[job, index] = TaskState.RUNNING
        self._changed()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait(self, timeout: float | None = None, *, check: bool = True) -> dict[str, int | None]:
        """Wait until every program task has ended; returns each one's exit code by name.

        With ``check`` (the default), a program that exited with a code other than 0, or was
        killed, raises ``TaskError`` (``worker:1 exited with code 1`` and its last lines).
        ``timeout`` (seconds) raises ``TimeoutError`` naming the programs still running.
        A program that waits for a task that has ended (a TF1 session without ``device_filters``
        after the chief finished; a DTensor client whose peer failed at start) is stopped, and
        ``WaitForEndedTaskError`` names both and the fix, whatever ``check`` says (``waits``).
        """
        from dtflab.cluster.waits import wait_for_programs

        return wait_for_programs(self, timeout, check)

    # -- what the user reads -----------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        return all(state is TaskState.STOPPED for state in self._states.values())

    @property
    def addresses(self) -> dict[str, list[str]]:
        """The TensorFlow cluster: each job's ``host:port`` list (``task_addresses`` less the
        data service, whose tasks are not TensorFlow task servers)."""
        return {job: tasks for job, tasks in self.task_addresses.items() if job not in DATA_JOBS}

    @property
    def data_service(self) -> str | None:
        """The dispatcher's ``grpc://host:port`` (``service=`` of tf.data's ``distribute``;
        ``$DTFLAB_DATA_SERVICE`` in a program task), or None (start with ``data_workers=N``)."""
        return f"grpc://{self.task_addresses['dispatcher'][0]}" if "dispatcher" in \
            self.task_addresses else None

    @property
    def spec(self):
        """The cluster as a ``tf.train.ClusterSpec`` (imports TensorFlow)."""
        from dtflab._quiet import import_tf

        return import_tf().train.ClusterSpec(self.addresses)

    @property
    def legacy_spec(self) -> str:
        """The cluster as the 2016 server's ``--cluster_spec`` string."""
        return jobs_to_legacy_spec(self.addresses)

    @property
    def endpoints(self) -> dict[tuple[str, int], tuple[str, int]]:
        """Each task's ``(host, port)``, keyed by ``(job, index)``."""
        return {(job, index): parse_address(address)
                for job, tasks in self.task_addresses.items() for index, address in enumerate(tasks)}

    @property
    def ports(self) -> list[int]:
        """Every port of this machine the cluster listens on (the local backend adds each
        task's profiler port)."""
        return [port for _, port in self.endpoints.values()]

    def target(self, job: str, index: int | None = None) -> str:
        """The session target of one task, ``"grpc://host:port"``."""
        job, index = self._task(job, index)
        return f"grpc://{self.task_addresses[job][index]}"

    def states(self, *, programs_only: bool = False) -> dict[str, TaskState]:
        """Each task's state by name, read now (cheaper than ``tasks``: no memory figures)."""
        with self._lock:
            self._poll()
        return {f"{job}:{index}": self._task_state(job, index)[0]
                for job, tasks in self.task_addresses.items() for index in range(len(tasks))
                if job in self.programs or not programs_only}

    @property
    def tasks(self) -> list[TaskInfo]:
        """A snapshot of every task (state and memory read now)."""
        infos = []
        with self._lock:
            self._poll()
        for job, addresses in self.task_addresses.items():
            for index, address in enumerate(addresses):
                state, pid = self._task_state(job, index)
                memory = self._task_memory(job, index, pid) if state is TaskState.RUNNING else None
                program = self.programs.get(job)
                infos.append(TaskInfo(job, index, address, state, pid, memory,
                                      self._task_host(job, index),
                                      program=program.name if program else None,
                                      **self._task_details(job, index)))
        return infos

    @property
    def exposed(self) -> list[str]:
        """Addresses at which other hosts can reach this cluster's task servers ([] if none).

        TensorFlow's gRPC server runs any graph it is sent, unauthenticated: an address listed
        here lets anyone who reaches it run code as you. ``exposure_reason`` says why.
        """
        from dtflab.network.networks import outside_addresses

        if self.stopped:
            return []
        exposed, outside = [], None
        for host, port in self.endpoints.values():
            if host == "localhost" or host.startswith("127."):  # TF listens on every interface
                outside = outside_addresses() if outside is None else outside
                exposed += [f"{ip}:{port}" for ip in outside]
            else:
                exposed.append(f"{host}:{port}")
        return exposed

    def logs(self, job: str, index: int | None = None) -> str:
        """Everything one task has printed (TensorFlow's log lines included)."""
        return self._task_logs(*self._task(job, index))

    def let_tasks_reach(self, port: int) -> None:
        """Make port ``port`` of this process reachable from the tasks at 127.0.0.1:``port``
        (a TF2 client or chief listens there and the tasks call it back): the local backend's
        private network opens a way back for that port alone; elsewhere nothing to do."""

    def stop_letting_tasks_reach(self, port: int) -> None:
        """Undo ``let_tasks_reach(port)`` once nothing listens there any more."""

    def callback_address(self, port: int) -> str:
        """``host:port`` at which every task reaches ``port`` of this process, one address for
        all (a cluster spec names one): 127.0.0.1 where they all share this machine, else this
        machine's address on the interface that routes to the other hosts."""
        hosts = [self._client_host(job, index) for job, index in self.endpoints]
        return f"{one_address(hosts)}:{port}"

    def connect(self, job_name: str = "client") -> list[str]:
        """Make this cluster's devices usable from eager TF2 code in this process.

        Calls ``tf.config.experimental_connect_to_cluster``; this process joins as ``job_name``
        on a free local port. Returns the remote device names. TensorFlow keeps that connection
        for the life of the process: connect once per kernel, or restart the kernel.
        """
        return running.connect(self, job_name)

    def panel(self):
        """The status panel widget, refreshed now and on every kill, restart and stop.

        One panel per cluster: showing it again shows the same widget, kept in sync.
        """
        if self._panel is None:
            self._panel = _ui().ClusterPanel(self)
        else:
            self._changed()
        return self._panel

    def _repr_html_(self) -> str:
        return _ui().render_html(self)

    def __repr__(self) -> str:
        jobs = ", ".join(f"{job}:{len(tasks)}" for job, tasks in self._jobs.items())
        status = "stopped" if self.stopped else "running"
        started = f", tasks {self.start_method}ed" if self.start_method else ""
        return f"<{type(self).__name__} {self.backend} ({jobs}) {status}{started}>"

    # -- for backends ----------------------------------------------------------------------

    def _start_all(self) -> None:
        raise NotImplementedError

    def _stop_all(self) -> None:
        raise NotImplementedError

    def _task_state(self, job: str, index: int) -> tuple[TaskState, int | None]:
        raise NotImplementedError

    def _task_logs(self, job: str, index: int) -> str:
        raise NotImplementedError

    def _task_host(self, job: str, index: int) -> str | None:
        return None  # this machine

    def _client_host(self, job: str, index: int) -> str:
        """Where task ``job:index`` reaches this process (its program's ``{client_host}``)."""
        return LOOPBACK

    def _task_details(self, job: str, index: int) -> dict:
        """``exit_code`` and ``started_by`` of one task, where the backend knows them."""
        return {}

    def _task_log_tail(self, job: str, index: int, lines: int = 12) -> str:
        return log_tail(self._task_logs(job, index), lines)

    def _server_args(self, job: str, index: int) -> list[str]:
        return []

    def _task_command(self, job: str, index: int):
        """What task ``job:index`` runs: its program, or a bare task server."""
        from dtflab.cluster.task import Command

        if job in DATA_JOBS:
            return data_service_command(self.task_addresses, job, index,
                                        fixed_workers=self.fixed_data_workers)
        if job in self.programs:
            program = self.programs[job]
            # Only where it is used: a host this machine has no route to fails the start.
            client_host = self._client_host(job, index) if program.uses("client_host") else ""
            command = program.command(self.addresses, job, index, tuple(self.programs),
                                      client_host=client_host)
            if self.data_service:
                command.env[DATA_SERVICE_ENV] = self.data_service
            return command
        return Command("dtflab.processes.server", [
            "--cluster_spec", self.legacy_spec, "--job_name", job, "--task_index", str(index),
            "--inter_op_threads", str(self.inter_op_threads),
            "--intra_op_threads", str(self.intra_op_threads), "--exit_with_parent",
            *self._server_args(job, index)])

    def _poll(self) -> None:
        """Refresh what ``_task_state`` reads, once per ``tasks`` (remote backends batch here)."""

    def _task_memory(self, job: str, index: int, pid: int | None) -> float | None:
        return proportional_mb(pid) if pid else None

    def cpu_seconds(self) -> float | None:
        """CPU seconds its tasks' processes have used, summed (None: not this machine's).
        Safe from any thread: it reads the processes, not their states."""
        return None

    def _kill_task(self, job: str, index: int) -> None:
        raise NotSupportedError(f"the {self.backend} backend cannot kill {job}:{index}")

    def _start_task(self, job: str, index: int) -> None:
        raise NotSupportedError(f"the {self.backend} backend cannot restart {job}:{index}")

    def _changed(self) -> None:
        for watcher in list(self._watchers):
            watcher()

    def _task(self, job: str, index: int | None) -> tuple[str, int]:
        """Validate ``(job, index)``; ``job`` may also be ``"worker:1"``."""
        if index is None:
            job, index = parse_task(job)
        names = [f"{j}:{i}" for j, tasks in self._jobs.items() for i in range(len(tasks))]
        if job not in self._jobs or not isinstance(index, int) or not \
                0 <= index < len(self._jobs[job]):
            raise ValueError(f"unknown task {job}:{index}; this cluster has {', '.join(names)}")
        return job, index

    def _require_running(self) -> None:
        if self.stopped:
            raise NotSupportedError("this cluster is stopped; start a new one with "
                                    "dtflab.start_cluster() or %dtf_cluster start")


#: The module that shows a cluster (``ClusterPanel``, ``render_html``), named, not imported:
#: clusters do not depend on the widgets that draw them (``dtflab.ui`` imports them).
VIEWS = "dtflab.ui.panel"


def _ui():
    import importlib

    return importlib.import_module(VIEWS)

