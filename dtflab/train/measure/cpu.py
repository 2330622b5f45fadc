"""CPU seconds per step of every task process, read from the kernel's scheduler statistics
(``/proc/<pid>/task/*/schedstat``) over the steps of a run: under load they stay what the work
costs, where a traced op's duration grows with the wait for a core. The same file says how long
each thread waited, runnable, for a core (in a CPU quota's cgroup, throttled time included).
Linux only."""

from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple

from dtflab.train.machinery.callbacks import Callback


class CpuPerStep(Callback):
    """CPU seconds per step of each task process (and of this process, ``"client"``) over
    steps ``skip`` to the last, the wall seconds per step, and ``queued_s``: the seconds per
    step that the step's path waited for a core, read as the waits of each task's busiest
    thread (its op thread) and of the thread that runs the steps here. It is an estimate:
    those threads' waits can overlap, and the other threads' waits are left out."""

    def __init__(self, cluster, skip: int = 3):
        self.cluster, self.skip = cluster, skip
        self.per_step: dict[str, float] = {}
        self.wall_s = None
        self.queued_s = None
        self._first = None

    def _read(self) -> _Reading:
        return _Reading(
            {task.name: _schedstat(f"/proc/{task.pid}/task") for task in self.cluster.tasks},
            # here, the thread that runs the steps: a kernel's, a notebook's or a test runner's
            # other threads are not on the step's path
            _schedstat("/proc/self/task", only=threading.get_native_id()),
            time.process_time(), time.perf_counter())

    def on_step(self, history, record) -> None:
        count = len(history.records)
        if count == self.skip:
            self._first = (count, self._read())
        elif self._first is not None and count > self.skip:
            (first_count, first), now = self._first, self._read()
            steps = count - first_count
            spent = {name: _spent(first.tasks[name], threads) for name, threads in now.tasks.items()}
            spent["client"] = (now.client_cpu_s - first.client_cpu_s,
                               _spent(first.stepper, now.stepper)[1])
            self.per_step = {name: ran / steps for name, (ran, _) in spent.items()}
            self.queued_s = sum(waited for _, waited in spent.values()) / steps
            self.wall_s = (now.wall_s - first.wall_s) / steps


class _Reading(NamedTuple):
    tasks: dict  # task name -> _schedstat of its threads
    stepper: dict  # _schedstat of the thread that runs the steps here
    client_cpu_s: float  # this process's CPU time, every thread
    wall_s: float


def _spent(before: dict, after: dict) -> tuple[float, float]:
    """Between two ``_schedstat`` readings of one process: (CPU seconds its threads ran, seconds
    its busiest thread waited for a core). A thread started in between counts from 0."""
    times = [(cpu - before.get(tid, (0.0, 0.0))[0], wait - before.get(tid, (0.0, 0.0))[1])
             for tid, (cpu, wait) in after.items()]
    busiest = max(times, key=lambda ran_waited: ran_waited[0], default=(0.0, 0.0))
    return sum(ran for ran, _ in times), busiest[1]


def _schedstat(folder: str, only: int | None = None) -> dict[str, tuple[float, float]]:
    """{thread id: (CPU seconds run, seconds waited runnable for a core)} of the live threads
    in ``folder`` (``/proc/<pid>/task``; ``only``: that thread alone), from the kernel's
    scheduler statistics in nanoseconds."""
    threads = {}
    for tid in ([str(only)] if only is not None else os.listdir(folder)):
        try:
            with open(f"{folder}/{tid}/schedstat") as stat:
                fields = stat.read().split()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        threads[tid] = (int(fields[0]) / 1e9, int(fields[1]) / 1e9)
    return threads
