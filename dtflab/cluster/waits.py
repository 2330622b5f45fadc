"""Waiting for a cluster's programs (``Cluster.wait()``), and noticing a program that waits for
a task that has ended, which it would do for ever.

``WaitWatch`` reads the program tasks' logs (programs log TensorFlow's INFO lines:
``dtflab.cluster.programs``) together with the tasks' states. ``Cluster.wait()`` and
``dtflab run`` / ``%%dtf_run`` (``dtflab.cluster.follow``) call ``raise_if_stuck()`` while they
wait, which stops the programs that cannot go on and raises ``WaitForEndedTaskError``, one line
naming the waiting task, the ended one, how it ended and the fix. It notices three waits:

1. A TF1 session for an ended task. TensorFlow's TF1 how-to trainer gives its sessions no
   ``device_filters``, so a worker's session waits for every task of the cluster: one that opens
   its session after the chief has finished and exited waits for it for ever, and TensorFlow
   only logs, every 10 s, ``CreateSession still waiting for response from worker:
   /job:worker/replica:0/task:0``. Such a line logged *after* the task it names was seen ended
   means a wait that can never end. Noticed within about 10 s (TensorFlow's logging period).

2. The start-up of TensorFlow's coordination service (DTensor's
   ``initialize_accelerator_system``; MultiWorkerMirroredStrategy's start-up shares it), when a
   client ended before it joined. Every client (``dtensor_clients``: the chief, then the
   workers; DTensor names client I ``/job:worker/replica:0/task:I``) must connect to the leader,
   client 0, before any goes on. The leader logs, once per connection and never again,
   ``/job:worker/replica:0/task:0 has connected to coordination service``, then ``Waiting for
   1/2 tasks to connect.``, ``Example stragglers:`` and their names. A client whose connection
   the leader never logged, and which has ended (any way), can never connect: the leader, in
   that wait, is stuck. Noticed within about 1 s of both facts.

3. The same start-up, when the leader ended first. A client that is not the leader logs
   ``Started server with target: grpc://...`` and then nothing at all while it retries the
   leader, for ever (``Coordination agent has successfully connected`` once it reaches it). A
   client whose last log line has been that one for ``SILENT_S`` seconds while the leader has
   ended with a failure (a code other than 0, or killed) is stuck. States alone are no rule:
   a leader that fails *after* the start-up leaves clients that may well finish (measured with
   TF 2.21: a client went on with local work for 45 s and exited 0; TensorFlow's heartbeats
   abort its collectives within about 10 s). Noticed ``SILENT_S`` to ``SILENT_S`` + 1 s after
   both facts, so 5-10 s after the leader ended (a client still importing TensorFlow then
   starts its server first).

In 2 and 3 the start-up can never complete, so every running client program is stopped, not
only the one named.

What it cannot notice: a client that ends *after* the start-up with a clean exit (a
``sys.exit`` after ``initialize_accelerator_system``) while another waits in a collective for
it: the leader only logs ``has disconnected from coordination service``, and the others may
still have local work to finish (a client that is killed instead is found by TensorFlow's
heartbeats, which abort the others' collectives); a leader that exits with code 0 before the
start-up; a waiting client that prints from another thread (3 wants its log silent). A
restarted task's log keeps its earlier runs' lines: 2 reads the leader's from its last
``Initializing CoordinationService`` on, 3 a client's last line, whichever run wrote it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from dtflab import names
from dtflab.cluster.programs import dtensor_clients
from dtflab.cluster.task import TaskState
from dtflab.errors import (NotSupportedError, TaskError, WaitForEndedTaskError,
                           last_meaningful_line)

#: What TensorFlow logs while a session waits for a task: the task is the match's job and task.
WAITING = (re.compile(r"CreateSession still waiting for response from worker: "
                      r"/job:(?P<job>[^/\s]+)/replica:\d+/task:(?P<task>\d+)"),)
#: The coordination leader's lines: its service starts (its log from there on is this run's),
#: a task connects, it waits for the others (K of N still to connect; the stragglers follow).
SERVICE_STARTS = "Initializing CoordinationService"
CONNECTED = re.compile(r"(/job:[^/\s]+/replica:\d+/task:\d+) has connected to coordination service")
WAITING_TO_CONNECT = re.compile(r"Waiting for (\d+)/(\d+) tasks to connect\.")
#: A task's name in TensorFlow's lines: its job and index.
TF_TASK = re.compile(r"/job:([^/\s]+)/replica:\d+/task:(\d+)")
#: A client's last line while it retries a leader that does not answer.
SERVER_STARTED = re.compile(r"Started server with target: \S+$")
ENDED = (TaskState.EXITED, TaskState.KILLED)
#: Seconds between two reads of the logs.
CHECK_EVERY_S = 1.0
#: Seconds a client must stay silent after starting its server, its leader failed, to be stuck.
SILENT_S = 5.0
#: The longest last line of an ended task quoted in the message.
SHORT_LINE = 120


@dataclass(frozen=True)
class Stuck:
    """``waiter`` waits for ``ended`` (``ended_as`` to TensorFlow), which ``how``; ``line``:
    TensorFlow's line that shows it; ``also``: other programs that cannot go on either."""

    waiter: str
    ended: str
    how: str
    line: str
    fix: str
    ended_as: str = ""
    also: tuple[str, ...] = ()


def wait_for_programs(cluster, timeout: float | None, check: bool) -> dict[str, int | None]:
    """``Cluster.wait()``: poll the program tasks until each has ended, raising on a stuck wait
    (``WaitWatch``), past ``timeout`` and, with ``check``, on a program that failed."""
    if not cluster.programs:
        raise NotSupportedError("this cluster runs no programs, so there is nothing to wait "
                                "for; start one with dtflab.run(...) or %dtf_cluster run")
    deadline = None if timeout is None else time.monotonic() + timeout
    watch = WaitWatch(cluster)
    while running := [name for name, state in cluster.states(programs_only=True).items()
                      if state in (TaskState.RUNNING, TaskState.STARTING)]:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{', '.join(running)} still running after {timeout:g} s")
        watch.raise_if_stuck()
        time.sleep(0.1)
    infos = [t for t in cluster.tasks if t.job in cluster.programs]
    if check:
        for info in infos:
            if info.state is TaskState.KILLED or info.exit_code not in (0, None):
                what = "was killed" if info.state is TaskState.KILLED else info.status
                raise TaskError(info.job, info.index, what,
                                log_tail=cluster._task_log_tail(info.job, info.index))
    return {info.name: info.exit_code for info in infos}


class WaitWatch:
    """Watches one cluster's programs for a wait on an ended task; ``raise_if_stuck()`` ends it."""

    def __init__(self, cluster):
        self.cluster = cluster
        self._since: dict[tuple[str, str], int] = {}  # (waiter, ended) -> waiter's log length
        self._silent: dict[str, float] = {}  # client -> when first seen silent, leader failed
        self._checked = 0.0

    def stuck(self) -> Stuck | None:
        """The first program that waits for an ended task, or None. Reads the logs at most
        every ``CHECK_EVERY_S``."""
        if time.monotonic() - self._checked < CHECK_EVERY_S:
            return None
        self._checked = time.monotonic()
        states = self.cluster.states()  # before the logs: a line logged before a task ended
        running = [name for name, state in states.items()
                   if state is TaskState.RUNNING and names.split(name)[0] in self.cluster.programs]
        logs = {name: self.cluster.logs(name) for name in running}
        clients = [f"{job}:{index}" for job, index
                   in dtensor_clients(self.cluster.addresses, tuple(self.cluster.programs))]
        return (self._session_wait(states, logs) or self._leader_waits(states, logs, clients)
                or self._leader_gone(states, logs, clients))

    def raise_if_stuck(self, before_raising=None) -> None:
        """If a program waits for an ended task: stop it (and ``Stuck.also``), call
        ``before_raising()`` (a follower's last lines), and raise ``WaitForEndedTaskError``."""
        found = self.stuck()
        if found is None:
            return
        job, index = names.split(found.waiter)
        log_tail = self.cluster._task_log_tail(job, index)
        states = self.cluster.states()
        try:
            for name in (found.waiter, *found.also):
                if states.get(name) is TaskState.RUNNING:
                    self.cluster.kill(name)
        except NotSupportedError:  # a backend that cannot kill one task: stop them all
            self.cluster.stop()
        if before_raising is not None:
            before_raising()
        raise WaitForEndedTaskError(job, index, found.ended, found.how, fix=found.fix,
                                    log_tail=log_tail, ended_as=found.ended_as, also=found.also)

    def _session_wait(self, states, logs) -> Stuck | None:
        """1: a TF1 session's waiting line for a task, logged after that task was seen ended."""
        ended = [name for name, state in states.items() if state in ENDED]
        for waiter, log in logs.items():
            for name in ended:
                start = self._since.setdefault((waiter, name), len(log))
                line = _waiting_line(log[start:], name)
                if line:
                    return Stuck(waiter, name, _how_it_ended(self.cluster, name, quote=False),
                                 line, _fix(waiter, name))
        return None

    def _leader_waits(self, states, logs, clients) -> Stuck | None:
        """2: a leader waits for clients to connect, one of which ended without connecting."""
        for waiter, log in logs.items():
            start = log.rfind(SERVICE_STARTS)
            waits = list(WAITING_TO_CONNECT.finditer(log, max(start, 0)))
            if waiter not in clients or start < 0 or not waits or waits[-1][1] == "0" \
                    or int(waits[-1][2]) != len(clients):
                continue
            connected = set(CONNECTED.findall(log, start))
            dtensor, tf_names = _tf_names(clients, TF_TASK.findall(log, start))
            for client_id, (name, tf_name) in enumerate(zip(clients, tf_names)):
                if tf_name not in connected and states[name] in ENDED:
                    how = _how_it_ended(self.cluster, name, " before it joined")
                    others = tuple(c for c in clients if c != waiter and c in logs)
                    return Stuck(waiter, name, how, waits[-1][0],
                                 _join_fix(self.cluster, name, dtensor),
                                 f"DTensor client {client_id}, {tf_name}" if dtensor else tf_name,
                                 others)
        return None

    def _leader_gone(self, states, logs, clients) -> Stuck | None:
        """3: the leader failed, and a client has been silent since it started its server."""
        leader = clients[0] if clients else None
        failed = leader is not None and (states[leader] is TaskState.KILLED or (
            states[leader] is TaskState.EXITED and _info(self.cluster, leader).exit_code != 0))
        silent = [name for name in clients[1:] if failed and name in logs
                  and SERVER_STARTED.search(_last_line(logs[name]))]
        self._silent = {name: self._silent.get(name, time.monotonic()) for name in silent}
        for name in silent:
            if time.monotonic() - self._silent[name] >= SILENT_S:
                others = tuple(c for c in clients if c != name and c in logs)
                return Stuck(name, leader, _how_it_ended(self.cluster, leader),
                             _last_line(logs[name]), _join_fix(self.cluster, leader),
                             "DTensor client 0, the coordination leader", others)
        return None


def _waiting_line(text: str, task: str) -> str:
    """The last line of ``text`` in which TensorFlow says it waits for ``task``, or ""."""
    job, index = task.split(":")
    found = ""
    for pattern in WAITING:
        for match in pattern.finditer(text):
            if (match["job"], match["task"]) == (job, index):
                found = match.group(0)
    return found


def _tf_names(clients: list[str], seen: list[tuple[str, str]]) -> tuple[bool, list[str]]:
    """Whether the clients are DTensor's, and each one's name in the coordination service, from
    the tasks its leader logged (``seen``): DTensor names client I ``/job:worker/replica:0/task:I``,
    MultiWorkerMirroredStrategy keeps each task's ``TF_CONFIG`` name (a ``chief`` job shows it).
    The two differ only beside a chief; ``[]`` while the lines seen do not tell which."""
    own = ["/job:{}/replica:0/task:{}".format(*names.split(name)) for name in clients]
    workers = sum(name.startswith("worker:") for name in clients)
    if any(job != "worker" for job, _ in seen):
        return False, own
    if workers == len(clients) or any(int(index) >= workers for _, index in seen):
        return True, [f"/job:worker/replica:0/task:{i}" for i in range(len(clients))]
    return True, []


def _last_line(log: str) -> str:
    stripped = log.rstrip()
    return stripped[stripped.rfind("\n") + 1:]


def _info(cluster, name: str):
    return next(t for t in cluster.tasks if t.name == name)


def _how_it_ended(cluster, name: str, when: str = "", quote: bool = True) -> str:
    """``was killed``, or ``exited with code 1``, ``when``, and (``quote``) its last line if
    short."""
    info = _info(cluster, name)
    if info.state is TaskState.KILLED or not quote:
        return ("was killed" if info.state is TaskState.KILLED else info.status) + when
    last = last_meaningful_line(cluster._task_log_tail(info.job, info.index))
    quoted = f" (its last line: {last})" if last and len(last) <= SHORT_LINE else ""
    return info.status + when + quoted


def _fix(waiter: str, ended: str) -> str:
    """What to change so it does not happen again."""
    job, index = waiter.split(":")
    if ended.split(":")[0] == job or ended.startswith(("chief:", "worker:")):
        return (f"give each session device_filters so a worker waits only for the ps and itself, "
                f"e.g. tf.compat.v1.ConfigProto(device_filters=['/job:ps', "
                f"'/job:{job}/task:{index}'])")
    return f"restart {ended} (cluster.restart('{ended}')) before the program waits for it"


def _join_fix(cluster, ended: str, dtensor: bool = True) -> str:
    """What to change when a client ended before the start-up completed."""
    info = _info(cluster, ended)
    who = "DTensor client" if dtensor else "MultiWorkerMirroredStrategy task"
    if info.state is TaskState.KILLED:
        return (f"every {who} must start and reach the same steps: run them again without "
                f"killing {ended} (its log: cluster.logs('{ended}'))")
    why = "see why it ended without joining" if info.exit_code == 0 else "fix the error"
    return (f"every {who} must start and reach the same steps: {why} in {ended}'s log, "
            f"cluster.logs('{ended}')")
