"""Persistent workers: a cluster whose worker (and chief) tasks are long-lived Python processes,
each with ``TF_CONFIG`` (and DTensor's variables) for its task, that run the code the kernel
sends them and keep their variables from one call to the next, as TensorFlow's multi-worker
programs need (one program, run by every worker, built up cell by cell).

    In [1]: workers = dtflab.start_workers(2)
    In [2]: workers.run("import tensorflow as tf\\n"
       ...:             "strategy = tf.distribute.MultiWorkerMirroredStrategy()")
    In [3]: workers.pull("strategy.cluster_resolver.task_id")   # {'worker:0': 0, 'worker:1': 1}

Each worker is an ipyparallel engine (``dtflab.processes.engine``) run as the cluster's
program task; one ipyparallel controller (``dtflab.processes.controller``) beside the kernel
carries code, output and values. What runs and what it prints is read by :class:`Execution`
(the cell magic ``%%dtf_px`` shows it live). On the local and Dask backends.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dtflab import scratch
from dtflab.errors import explaining
from dtflab.cluster.ports import free_ports
from dtflab.processes import engine as engine_program
from dtflab.processes.spawn import child_env

#: Sockets the controller binds (hub, schedulers, heartbeats, broadcast tree): ports let
#: through the private network; a pool this big leaves spares.
CONTROLLER_PORTS = 24
#: How many of a dead worker's last log lines are shown.
LAST_LINES = 8
#: Seconds the workers have to start and register once their tasks run.
REGISTER_TIMEOUT_S = 90.0


class Controller:
    """ipyparallel's controller, a process of this kernel's (ends with it)."""

    def __init__(self, ip: str = "127.0.0.1", timeout: float = 30.0):
        self.folder = Path(scratch.folder("workers"))
        self.ports = free_ports(CONTROLLER_PORTS)
        self._log = open(self.folder / "controller.log", "wb")  # noqa: SIM115 - closed by stop
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dtflab.processes.controller", "--profile-dir",
             str(self.folder), "--ip", ip, "--ports", ",".join(map(str, self.ports))],
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT, env=child_env(),
            start_new_session=True)
        engine_file = self.folder / "security" / "ipcontroller-engine.json"
        deadline = time.monotonic() + timeout
        self.engine_info = None
        while self.engine_info is None:
            if _exited(self.process.pid) or time.monotonic() > deadline:
                tail = (self.folder / "controller.log").read_text(errors="replace")[-600:]
                try:
                    self.stop()
                finally:
                    raise RuntimeError(f"the workers' controller did not start: {tail.strip()}")
            time.sleep(0.1)
            if _written(Path(self.client_file)) is not None:  # the kernel needs its file too
                self.engine_info = _written(engine_file)

    @property
    def client_file(self) -> str:
        return str(self.folder / "security" / "ipcontroller-client.json")

    def stop(self) -> None:
        """Kill the controller's process group and wait until it has ended (its sockets
        closed); raises if some of it is still there after the wait."""
        if self.process.returncode is not None:  # ended and reaped: stopped already
            return
        # the controller and its forked heartbeat monitor: a process group of their own, whose
        # id the leader, not yet reaped (a zombie at most), keeps from being given out again
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:  # every one of them gone
            pass
        try:
            _wait_group_ended(self.process.pid)  # the monitor holds the sockets too
            self.process.wait()  # the leader, a zombie by now
        finally:
            if self.process.stdin:
                self.process.stdin.close()
            self._log.close()
            scratch.remove(self.folder)


def _wait_group_ended(group: int, timeout: float = 30.0) -> None:
    """Wait until every process of process group ``group`` (killed) has ended: gone, or a zombie,
    whose sockets are closed. A killed process needs CPU to end, which a busy machine may give
    it late; one still there after ``timeout`` seconds is named in the error raised."""
    deadline = time.monotonic() + timeout
    while True:
        left = _still_running(group)
        if not left:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers' controller, process group {group}, has not ended "
                               f"{timeout:g} s after its kill ({', '.join(left)}): its ports "
                               f"stay held until it does")
        time.sleep(0.02)


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has ended, leaving it a zombie (not reaped: its id stays its)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _still_running(group: int) -> list[str]:
    """``pid N (status)`` of each process of process group ``group`` that is not a zombie."""
    import psutil

    left = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == group and process.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(f"pid {process.pid} ({process.info['status']})")
        except OSError:  # gone
            pass
    return left


#: The persistent workers this process started and has not stopped, oldest first.
_started: list[Workers] = []


def running_workers() -> Workers | None:
    """The persistent workers this process started last and has not stopped (None: none),
    however they were started (``start_workers`` or ``%dtf_workers start``)."""
    return _started[-1] if _started else None


class Workers:
    """The running workers: ``tasks`` (``["worker:0", "worker:1"]``, the chief first where
    there is one), the cluster they run in (``cluster``), and what to do with them."""

    def __init__(self, cluster, controller: Controller, client):
        self.cluster, self.controller, self.client = cluster, controller, client
        self.tasks = [info.name for info in cluster.tasks if info.program]
        self._engines: dict[str, int] = {}
        self._gone: set[int] = set()  # engines of workers that died (the hub may list them still)
        self._registered(self.tasks)
        _started.append(self)

    # -- what a learner does ---------------------------------------------------------------

    def run(self, code: str, targets=None, *, show=None, display=None,
            timeout: float | None = None):
        """Run ``code`` on ``targets`` (None: every worker; ``"worker:1"``, ``"worker:0,2"`` or
        a list) and wait for it; returns the :class:`~dtflab.cluster.execution.Execution`,
        whose output ``show`` (a callable taking text) receives as it comes (default: printed),
        and each display (a plot, a table) ``display`` (default: IPython's).
        KeyboardInterrupt (the kernel's stop button) interrupts the workers and returns."""
        from dtflab.cluster.execution import Execution, compiled

        chosen = self.targets(targets)
        compiled(code)  # a syntax error is raised here, once, not once per worker
        result = self.client[[self._engines[task] for task in chosen]].execute(
            code, silent=False, block=False)
        return Execution(self, chosen, result).follow(show=show, display=display,
                                                      timeout=timeout)

    def pull(self, name: str, targets=None) -> dict:
        """``{task: value}`` of the expression ``name`` on each of ``targets`` (None: every
        worker). The value must be picklable (a tensor: ``.numpy()`` it first)."""
        from ipyparallel import interactive
        from ipyparallel.error import CompositeError

        chosen = self.targets(targets)
        try:
            values = self.client[[self._engines[task] for task in chosen]].apply_sync(
                interactive(_evaluate), name)
        except CompositeError as error:
            failed = {self._task_of(info["engine_id"]): f"{ename}: {evalue}"
                      for ename, evalue, _, info in error.elist}
            task, why = next(iter(failed.items()))
            raise ValueError(f"{name!r} cannot be read on {', '.join(failed)} ({why}); run the "
                             f"cell that makes it there first, e.g. %%dtf_px {task}") from None
        return dict(zip(chosen, values))

    def push(self, values: dict, targets=None) -> None:
        """Set each of ``values`` (``{name: value}``) on ``targets`` (None: every worker)."""
        chosen = self.targets(targets)
        self.client[[self._engines[task] for task in chosen]].push(values, block=True)

    def interrupt(self, targets=None) -> list[str]:
        """Interrupt what ``targets`` run (SIGINT: ``KeyboardInterrupt`` there); the workers go
        on. Returns the tasks signalled."""
        return [task for task in self.targets(targets) if self.cluster.interrupt(task)]

    def release(self, targets=None) -> list[str]:
        """Abort the collectives of ``targets`` (a worker waiting in one for a peer that failed
        is freed, with an error that says so); their strategy cannot be used again, restart
        them. Returns the tasks signalled."""
        return [task for task in self.targets(targets)
                if self.cluster.interrupt(task, signal_number=engine_program.RELEASE)]

    def restart(self, task: str) -> None:
        """Start ``task``'s worker anew (after it died): its variables are lost."""
        job, _, index = self.targets(task)[0].partition(":")
        if task in self._engines:
            self._gone.add(self._engines.pop(task))
        self.cluster.restart(job, int(index))
        self._registered([task])

    def stop(self) -> None:
        """End the workers, their cluster and the controller; they stay the running workers
        (``running_workers``) if that fails, so that it can be tried again."""
        try:
            self.client.close()
            for port in self.controller.ports:
                self.cluster.stop_letting_tasks_reach(port)
        finally:
            try:
                self.cluster.stop()
            finally:
                self.controller.stop()
        if self in _started:
            _started.remove(self)

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Workers {', '.join(self.tasks)}>"

    # -- helpers ---------------------------------------------------------------------------

    def targets(self, targets=None) -> list[str]:
        """The tasks ``targets`` names, in order; ``ValueError`` naming an unknown one."""
        if targets is None or targets == "all":
            return list(self.tasks)
        names = targets.replace(" ", "").split(",") if isinstance(targets, str) else list(targets)
        chosen, job = [], None
        for name in names:
            if ":" in name:
                job, _, index = name.partition(":")
            else:  # "worker:0,2": the job carries on
                index = name
            task = f"{job}:{index}"
            if task not in self.tasks:
                raise ValueError(f"no worker {task!r}: these workers are "
                                 f"{', '.join(self.tasks)}; name one, e.g. {self.tasks[-1]}")
            chosen.append(task)
        return chosen

    def running(self) -> set[str]:
        """The workers whose process runs now (one read of the cluster's states: no memory
        figures, one round trip on Dask)."""
        return {task for task, state in self.cluster.states(programs_only=True).items()
                if state.value == "running"}

    def ended(self, task: str) -> str:
        """How ``task``'s process ended, and its last log lines that can say why (what it and
        TensorFlow's C++ wrote to its file descriptors, TensorFlow's start-up lines left out:
        ``errors.explaining``)."""
        info = next(info for info in self.cluster.tasks if info.name == task)
        how = (f"exit code {info.exit_code}" if info.exit_code is not None else info.state.value)
        tail = "\n".join(explaining(self.cluster.logs(task), LAST_LINES))
        return f"{how}, " + (f"its last lines:\n{tail}" if tail else "it logged nothing")

    def _task_of(self, engine: int) -> str:
        return next((task for task, known in self._engines.items() if known == engine),
                    f"engine {engine}")

    def _registered(self, tasks: list[str]) -> None:
        """Wait until each of ``tasks`` has an engine, and learn which is whose."""
        deadline = time.monotonic() + REGISTER_TIMEOUT_S
        while True:
            known = set(self._engines.values()) | self._gone
            new = [engine for engine in self.client.ids if engine not in known]
            if new:
                found = self.client[new].apply_sync(engine_program.task)
                self._engines.update(zip(found, new))
            missing = [task for task in tasks if task not in self._engines]
            if not missing:
                return
            dead = sorted(set(missing) - self.running())
            if dead or time.monotonic() > deadline:
                why = (f"{dead[0]} ended, {self.ended(dead[0])}" if dead else
                       f"{', '.join(missing)} did not register in {REGISTER_TIMEOUT_S:.0f} s")
                raise RuntimeError(f"the persistent workers did not start ({why})")
            time.sleep(0.2)


def _written(path: Path) -> dict | None:
    """The JSON in ``path`` once the controller has written it whole (None before)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet, or half written
        return None


def _evaluate(name):  # sent to a worker as code: its globals there are the worker's namespace
    return eval(name, globals())  # noqa: S307 - the learner's own expression


def start_workers(workers=2, *, chief: bool = False, backend: str | None = None,
                  scheduler: str | None = None, client=None, timeout: float = 60.0,
                  start_method: str | None = None, cwd: str | None = None) -> Workers:
    """Start ``workers`` persistent workers (and a chief with ``chief=True``); returns once each
    is ready to run code. Ends with the kernel, or with ``stop()``. ``backend="dask"`` (or
    ``scheduler``, ``client``) runs them on Dask workers: the controller then listens on every
    interface of this machine, and each worker reaches it at ``{client_host}``, the address of
    this machine on the way to its host (see ``dtflab.cluster.programs``)."""
    import ipyparallel

    from dtflab.cluster import run

    elsewhere = backend == "dask" or scheduler is not None or client is not None
    controller = Controller(ip="*" if elsewhere else "127.0.0.1")
    cluster = ipp_client = None
    try:
        connection = base64.b64encode(json.dumps(controller.engine_info).encode()).decode()
        cluster = run(engine_program.__file__, f"--connection={connection}",
                      "--controller-host={client_host}", workers=workers, chief=chief,
                      backend=backend, scheduler=scheduler, client=client, timeout=timeout,
                      start_method=start_method, cwd=cwd)
        for port in controller.ports:
            cluster.let_tasks_reach(port)
        ipp_client = ipyparallel.Client(controller.client_file)
        return Workers(cluster, controller, ipp_client)
    except BaseException:
        if ipp_client is not None:
            ipp_client.close()
        if cluster is not None:
            for port in controller.ports:  # those let through, and the rest: a no-op
                cluster.stop_letting_tasks_reach(port)
            cluster.stop()
        controller.stop()
        raise
