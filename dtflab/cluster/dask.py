"""The ``dask`` backend: one task server per Dask worker, on a new LocalCluster or an existing one."""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from urllib.parse import urlparse

from dtflab import names
from dtflab.cluster import dask_worker as remote
from dtflab.cluster.base import Cluster
from dtflab.cluster.task import TaskState
from dtflab.errors import DtflabError, PortInUseError, TaskError

WAIT_REPORT_S = 5.0  # how often the wait for workers says how many have come
NOT_POLLED = (False, None, None, None)  # (alive, pid, pss_mb, exit_code) of a task not seen


class DaskCluster(Cluster):
    """Task servers hosted by Dask workers, one task per worker.

    Without ``scheduler``/``client`` a Dask LocalCluster is created (processes, one thread
    each), and closed again at stop. With them an existing cluster is used, and stop leaves
    it and its workers running. Roles go to workers in order of their addresses; each worker
    chooses its task's port and reports its own host, so tasks on different machines reach
    each other. Task processes are children of their worker, spawned, not forked (see
    dask_worker.py). Program tasks run a script at the same path on the worker's machine; their
    ``{client_host}`` is this machine's address on the interface that routes to their host.
    """

    backend = "dask"

    def __init__(self, jobs, *, scheduler: str | None = None, client=None, **kwargs):
        super().__init__(jobs, **kwargs)
        self._scheduler, self._client, self._owns_client = scheduler, client, client is None
        self._local_cluster = None
        self._id = uuid.uuid4().hex
        self._roles: dict[tuple[str, int], str] = {}  # task -> Dask worker address
        self._polled: dict[str, tuple] = {}
        self._final_logs: dict[tuple[str, int], str] = {}

    # -- backend contract --------------------------------------------------------------------

    def _start_all(self) -> None:
        client = self._connect()
        keys = [(job, i) for job, tasks in self._jobs.items() for i in range(len(tasks))]
        workers = self._wait_for_workers(client, len(keys))
        self._roles = dict(zip(keys, workers))
        for (job, index), worker in self._roles.items():
            port = self._jobs[job][index][1]
            reply = client.run(remote.reserve_port, port, workers=[worker])
            self.task_addresses.setdefault(job, [None] * len(self._jobs[job]))[index] = reply[worker]
        by_worker = {worker: key for key, worker in self._roles.items()}
        commands = {worker: (*key, self._task_command(*key)) for worker, key in by_worker.items()}
        replies = client.run(remote.start_task, self._id, commands, self.timeout, os.getpid(),
                             workers=list(by_worker))
        failed = [(by_worker[w], r) for w, r in replies.items() if not r.get("ok")]
        for key, reply in replies.items():
            if reply.get("ok"):
                self._states[by_worker[key]] = TaskState.RUNNING
        if failed:
            (job, index), reply = failed[0]
            client.run(remote.stop_tasks, self._id, workers=list(by_worker))
            error = PortInUseError if reply["port_in_use"] else TaskError
            raise error(job, index, f"could not start on Dask worker {self._roles[job, index]}: "
                        f"{reply['what']}", log_tail=reply.get("log_tail", ""))

    def _stop_all(self) -> None:
        client = self._client
        if client is not None and self._roles:
            try:
                logs = client.run(remote.stop_tasks, self._id, workers=sorted(set(self._roles.values())))
                for per_worker in logs.values():
                    for name, text in per_worker.items():
                        self._final_logs[names.split(name)] = text
            except Exception:  # a worker already gone: its task went with it
                pass
        if self._owns_client and client is not None:
            client.close()
            self._client = None
        if self._local_cluster is not None:
            self._local_cluster.close()
            self._local_cluster = None

    def _kill_task(self, job: str, index: int) -> None:
        worker = self._roles[job, index]
        self._client.run(remote.kill_task, self._id, job, index, workers=[worker])

    def interrupt(self, job: str, index: int | None = None, signal_number: int = signal.SIGINT) -> bool:
        """Interrupt one task's program on its Dask worker (SIGINT: a ``KeyboardInterrupt`` in
        its Python; the process runs on), or send it ``signal_number``. False where it does
        not run."""
        job, index = self._task(job, index)
        worker = self._roles[job, index]
        return self._client.run(remote.interrupt_task, self._id, job, index, signal_number,
                                workers=[worker])[worker]

    def _start_task(self, job: str, index: int) -> None:
        worker = self._roles[job, index]
        commands = {worker: (job, index, self._task_command(job, index))}
        reply = self._client.run(remote.start_task, self._id, commands, self.timeout,
                                 os.getpid(), workers=[worker])[worker]
        if not reply.get("ok"):
            error = PortInUseError if reply["port_in_use"] else TaskError
            raise error(job, index, f"could not restart on Dask worker {worker}: {reply['what']}",
                        log_tail=reply.get("log_tail", ""))

    def _poll(self) -> None:
        if self._client is None or not self._roles:
            self._polled = {}
            return
        try:
            replies = self._client.run(remote.poll, self._id, workers=sorted(set(self._roles.values())))
        except Exception:  # a worker went away; its task is gone
            replies = {}
        self._polled = {name: state for reply in replies.values() for name, state in reply.items()}

    def _task_state(self, job: str, index: int):
        state = self._states[job, index]
        alive, pid, _, _ = self._polled.get(f"{job}:{index}", NOT_POLLED)
        if state is TaskState.RUNNING and not alive:  # its process, or its worker, is gone
            self._states[job, index] = state = TaskState.EXITED
        return state, pid if alive else None

    def _task_memory(self, job: str, index: int, pid: int | None):
        return self._polled.get(f"{job}:{index}", NOT_POLLED)[2]

    def _task_details(self, job: str, index: int) -> dict:
        return {"exit_code": self._polled.get(f"{job}:{index}", NOT_POLLED)[3],
                "started_by": "spawn"}

    def _task_logs(self, job: str, index: int) -> str:
        if (job, index) in self._final_logs:
            return self._final_logs[job, index]
        worker = self._roles.get((job, index))
        if worker is None or self._client is None:
            return ""
        return self._client.run(remote.task_logs, self._id, job, index, workers=[worker])[worker] or ""

    def _task_host(self, job: str, index: int) -> str | None:
        return self._roles.get((job, index))

    def _client_host(self, job: str, index: int) -> str:
        from dtflab.network.networks import address_toward
        from dtflab.spec import parse_address

        return address_toward(parse_address(self.task_addresses[job][index])[0])

    # -- Dask --------------------------------------------------------------------------------

    @property
    def client(self):
        """The ``dask.distributed.Client`` this cluster uses."""
        return self._client

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard; under JupyterHub/Binder, through jupyter-server-proxy."""
        return self._client.dashboard_link if self._client is not None else None

    def _connect(self):
        import dask
        from dask.distributed import Client, LocalCluster

        if os.environ.get("JUPYTERHUB_SERVICE_PREFIX"):  # reach the dashboard via the hub's proxy
            dask.config.set({"distributed.dashboard.link":
                             "{JUPYTERHUB_SERVICE_PREFIX}proxy/{port}/status"})
        if self._client is not None:
            return self._client
        if self._scheduler is not None:
            # A Client that fails to connect leaves Distributed's IO-loop thread running, so
            # check a tcp:// scheduler answers before making one.
            self._check_reachable(self._scheduler)
            self._client = Client(self._scheduler, timeout=f"{self.timeout}s")
            return self._client
        n_tasks = sum(len(tasks) for tasks in self._jobs.values())
        try:
            # Workers as threads of this process (over TCP, as across machines): each forks
            # its task from this process's warm fork server rather than importing TensorFlow
            # anew (3 tasks: about 450 MB less, measured in notebook 07).
            self._local_cluster = LocalCluster(n_workers=n_tasks, threads_per_worker=1,
                                               processes=False, protocol="tcp://",
                                               host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                               silence_logs=40)
        except RuntimeError as exc:
            raise DtflabError(
                f"Dask could not start its worker processes ({exc}); in a script, start the "
                f"cluster under `if __name__ == '__main__':` (Dask's workers re-import the "
                f"script), or use --backend local") from None
        self._client = Client(self._local_cluster)
        return self._client

    def _check_reachable(self, address: str) -> None:
        parsed = urlparse(address)
        if parsed.scheme != "tcp" or not parsed.hostname or not parsed.port:
            return
        try:
            socket.create_connection((parsed.hostname, parsed.port), timeout=min(self.timeout, 10)).close()
        except OSError as exc:
            raise DtflabError(f"cannot reach the Dask scheduler at {address} ({exc.strerror or exc}); "
                              f"check the address, e.g. tcp://127.0.0.1:8786") from None

    def _wait_for_workers(self, client, needed: int) -> list[str]:
        """Worker addresses, sorted, once ``needed`` are there; says how many came meanwhile."""
        deadline = time.monotonic() + self.timeout
        next_report = time.monotonic() + WAIT_REPORT_S
        while True:
            workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
            if len(workers) >= needed:
                return workers[:needed]
            if time.monotonic() > deadline:
                raise DtflabError(
                    f"the Dask cluster at {client.scheduler.address} has {len(workers)} worker(s) "
                    f"after {self.timeout:g} s; this cluster needs {needed} (one task per worker): "
                    f"start more workers or ask for fewer tasks")
            if time.monotonic() > next_report:
                print(f"dtflab: waiting for Dask workers: {len(workers)} of {needed}", flush=True)
                next_report += WAIT_REPORT_S
            time.sleep(0.2)
