"""The notebook's end of worker programs' reports: a TCP listener each worker connects to,
one JSON line per message, read by a thread per worker into a queue.

The listener is on 127.0.0.1 (let through the cluster's private network) for workers on this
machine; for workers on other hosts (a Dask cluster's) it is on every interface, and each worker
is told this machine's address on the interface that routes to its host (a program's
``{client_host}``). It reads JSON lines and runs nothing it is sent. The messages are
``dtflab.train.worker_programs.contract``'s: ``hello`` (once a worker is up), ``step``,
``done``; the notebook writes lines back (``stop``, ``go``).
A worker program that ends without saying ``done`` is found from its task's state and raised
as :class:`WorkerDied`.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time

from dtflab.cluster.task import TaskState
from dtflab.train.worker_programs.contract import STOP

#: How often a wait for a worker's next message looks at whether the worker still runs.
POLL_S = 0.5
#: Where the listener is for workers on this machine, and for workers on other hosts.
LOOPBACK, EVERY_INTERFACE = "127.0.0.1", "0.0.0.0"


class WorkerDied(Exception):
    """A worker program ended before it said it was done."""

    def __init__(self, worker: str, status: str):
        super().__init__(f"{worker} {status}")
        self.worker, self.status = worker, status


class Reports:
    """The notebook's end of the workers' reports: a listener, a reader thread per worker."""

    def __init__(self, workers: int, host: str = LOOPBACK):
        self.workers = workers
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self.queues: dict[str, queue.Queue] = {}
        self.connections: dict[str, socket.socket] = {}
        self.done: set[str] = set()
        self.stopping = False  # a Stop that came before a worker connected reaches it then
        self._files: dict[socket.socket, object] = {}  # each connection's file, read by a thread

    def accept(self, cluster, timeout: float) -> dict[str, dict]:
        """Wait for every worker's ``hello``; returns them by worker. A connection it accepted
        and did not keep (no hello, or the wait ended by an error) is closed before it returns."""
        for connection in self.connections.values():
            self._close(connection)
        self.connections, self.queues, self.done = {}, {}, set()
        accepted: list[socket.socket] = []
        try:
            return self._hellos(cluster, timeout, accepted)
        finally:
            for connection in accepted:
                if connection not in self.connections.values():
                    self._close(connection)

    def _hellos(self, cluster, timeout: float, accepted: list) -> dict[str, dict]:
        hellos = {}
        deadline = time.monotonic() + timeout
        self.listener.settimeout(0.05)
        # A worker connects first and says hello once its strategy is up, which needs every
        # worker: the hellos are read in threads, so a worker that died meanwhile is noticed.
        greeted: queue.Queue = queue.Queue()
        next_look = 0.0  # at most every POLL_S: on Dask a look is a round trip to each worker
        while len(hellos) < self.workers:
            try:
                connection, _ = self.listener.accept()
                accepted.append(connection)
                threading.Thread(target=self._hello, args=(connection, greeted),
                                 name="dtflab-reports-hello", daemon=True).start()
            except socket.timeout:
                pass
            try:
                connection, lines, hello = greeted.get(timeout=0.05)
            except queue.Empty:
                if time.monotonic() >= next_look:
                    self._check_alive(cluster, greeted=set(hellos))
                    next_look = time.monotonic() + POLL_S
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {len(hellos)} of {self.workers} workers reported "
                                       f"within {timeout:g} s; see cluster.logs('worker:0')")
                continue
            if hello.get("kind") != "hello":
                continue  # closed when the wait ends
            worker = hello["worker"]
            hellos[worker] = hello
            self.connections[worker] = connection
            self.queues[worker] = queue.Queue()
            if self.stopping:
                connection.sendall(f"{STOP}\n".encode())
            threading.Thread(target=self._read, args=(lines, self.queues[worker]),
                             name=f"dtflab-reports-{worker}", daemon=True).start()
        return hellos

    def _hello(self, connection, greeted: queue.Queue) -> None:
        lines = self._files[connection] = connection.makefile("r")
        try:
            hello = json.loads(lines.readline() or "{}")
        except (OSError, ValueError):
            hello = {}
        greeted.put((connection, lines, hello))

    @staticmethod
    def _read(lines, messages: queue.Queue) -> None:
        try:
            for line in lines:
                messages.put(json.loads(line))
        except (OSError, ValueError):
            pass
        messages.put({"kind": "closed"})

    def next_step(self, cluster, waiting=lambda: None) -> list[dict] | None:
        """Every worker's next ``step`` message (the same step), or ``None`` when all are done.
        ``waiting()`` is called every POLL_S while none comes (it may raise to end the wait)."""
        messages = []
        for worker in sorted(self.queues):
            while True:
                try:
                    message = self.queues[worker].get(timeout=POLL_S)
                except queue.Empty:
                    self._check_alive(cluster)
                    waiting()
                    continue
                if message["kind"] == "step":
                    messages.append(message)
                    break
                if message["kind"] == "done":
                    self.done.add(worker)
                    break
                if message["kind"] == "closed":
                    self._check_alive(cluster, wait_s=5)
        return messages or None

    def _check_alive(self, cluster, greeted=(), wait_s: float = 0.0) -> None:
        """Raise WorkerDied for a worker program that ended without saying it was done. While
        the hellos come in, a worker that said hello and then ended with code 0 is not dead
        (its ``done`` is still unread); one that crashed or was killed is: the others wait for
        it in their start-up's collective."""
        deadline = time.monotonic() + wait_s
        while True:
            # states(): a cheap read; tasks (with its memory figures) only for the dead ones
            ended = [name for name, state in cluster.states(programs_only=True).items()
                     if name not in self.done and state in (TaskState.KILLED, TaskState.EXITED)]
            # The cause first: a survivor's collective fails once its peer is gone, and it
            # may exit (code 1) before this look.
            dead = sorted((t for t in (cluster.tasks if ended else ()) if t.name in ended
                           and not (t.name in greeted and t.state is TaskState.EXITED
                                    and t.exit_code == 0)),
                          key=lambda t: (t.state is not TaskState.KILLED, (t.exit_code or 0) >= 0))
            if dead:
                first = dead[0]
                raise WorkerDied(first.name, "was killed" if first.state is TaskState.KILLED
                                 else first.status)
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def send_stop(self) -> None:
        self.stopping = True
        self.send(STOP)

    def send(self, line: str) -> None:
        for connection in list(self.connections.values()):
            try:
                connection.sendall(line.encode() + b"\n")
            except OSError:  # that worker is gone: the caller finds out from its state
                pass

    def close(self) -> None:
        for connection in self.connections.values():
            self._close(connection)
        self.listener.close()

    def _close(self, connection: socket.socket) -> None:
        """Close a worker's connection and the file its thread reads it through: ``close``
        alone leaves the descriptor open while that file holds it (and then Python closes it,
        with a ResourceWarning, whenever it collects the two). The shutdown first wakes the
        reading thread."""
        try:
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:  # the worker closed it first
            pass
        lines = self._files.pop(connection, None)
        if lines is not None:
            lines.close()  # waits for a read in progress, which the shutdown has ended
        connection.close()
