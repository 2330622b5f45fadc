"""Notice a program that waits for a task that has ended, which it would do for ever.

TensorFlow's TF1 how-to trainer gives its sessions no ``device_filters``, so a worker's session
waits for every task of the cluster: a worker that opens its session after the chief has
finished and exited waits for it for ever, and TensorFlow only logs, every 10 s,
``CreateSession still waiting for response from worker: /job:worker/replica:0/task:0``.

``WaitWatch`` reads that from the program tasks' logs (programs log TensorFlow's INFO lines:
``dtflab.cluster.programs``) together with the other tasks' states: a wait logged *after* the
task it names was seen ended can never end. ``Cluster.wait()`` and ``dtflab run`` /
``%%dtf_run`` (``dtflab.cluster.follow``) call ``raise_if_stuck()`` while they wait, which stops
the waiting program and raises ``WaitForEndedTaskError``: within about 10 s of the wait
starting (TensorFlow's logging period), or of the task ending during a wait.
"""

from __future__ import annotations

import re
import time

from dtflab.cluster.task import TaskState
from dtflab.errors import NotSupportedError, WaitForEndedTaskError

#: What TensorFlow logs while a session waits for a task: the task is the match's job and task.
WAITING = (re.compile(r"CreateSession still waiting for response from worker: "
                      r"/job:(?P<job>[^/\s]+)/replica:\d+/task:(?P<task>\d+)"),)
ENDED = (TaskState.EXITED, TaskState.KILLED)
#: Seconds between two reads of the logs.
CHECK_EVERY_S = 1.0


class WaitWatch:
    """Watches one cluster's programs for a wait on an ended task; ``raise_if_stuck()`` ends it.

    It remembers how long each program's log was when each other task was first seen ended;
    a waiting line for that task further on in the log means the program waits for it still.
    """

    def __init__(self, cluster):
        self.cluster = cluster
        self._since: dict[tuple[str, str], int] = {}  # (waiter, ended) -> waiter's log length
        self._checked = 0.0

    def stuck(self) -> tuple[str, str, str, str] | None:
        """``(waiter, ended task, how it ended, TensorFlow's line)`` for the first program
        that waits for an ended task, or None. Reads the logs at most every ``CHECK_EVERY_S``."""
        if time.monotonic() - self._checked < CHECK_EVERY_S:
            return None
        self._checked = time.monotonic()
        states = self.cluster.states()
        ended = [name for name, state in states.items() if state in ENDED]
        programs = self.cluster.states(programs_only=True)
        waiters = [name for name, state in programs.items() if state is TaskState.RUNNING]
        for waiter in waiters:
            log = self.cluster.logs(waiter)
            for name in ended:
                start = self._since.setdefault((waiter, name), len(log))
                line = _waiting_line(log[start:], name)
                if line:
                    return waiter, name, _how_it_ended(self.cluster, name), line
        return None

    def raise_if_stuck(self, before_raising=None) -> None:
        """If a program waits for an ended task: stop that program, call ``before_raising()``
        (a follower's last lines), and raise ``WaitForEndedTaskError``."""
        found = self.stuck()
        if found is None:
            return
        waiter, ended, how, line = found
        job, index = waiter.split(":")
        log_tail = self.cluster._task_log_tail(job, int(index))
        try:
            self.cluster.kill(waiter)
        except NotSupportedError:  # a backend that cannot kill one task: stop them all
            self.cluster.stop()
        if before_raising is not None:
            before_raising()
        raise WaitForEndedTaskError(job, int(index), ended, how, fix=_fix(waiter, ended),
                                    log_tail=log_tail)


def _waiting_line(text: str, task: str) -> str:
    """The last line of ``text`` in which TensorFlow says it waits for ``task``, or ""."""
    job, index = task.split(":")
    found = ""
    for pattern in WAITING:
        for match in pattern.finditer(text):
            if (match["job"], match["task"]) == (job, index):
                found = match.group(0)
    return found


def _how_it_ended(cluster, name: str) -> str:
    info = next(t for t in cluster.tasks if t.name == name)
    return "was killed" if info.state is TaskState.KILLED else info.status


def _fix(waiter: str, ended: str) -> str:
    """What to change so it does not happen again."""
    job, index = waiter.split(":")
    if ended.split(":")[0] == job or ended.startswith(("chief:", "worker:")):
        return (f"give each session device_filters so a worker waits only for the ps and itself, "
                f"e.g. tf.compat.v1.ConfigProto(device_filters=['/job:ps', "
                f"'/job:{job}/task:{index}'])")
    return f"restart {ended} (cluster.restart('{ended}')) before the program waits for it"
