"""CPU seconds per step of every task process, read from the kernel's scheduler statistics
(``/proc/<pid>/task/*/schedstat``) over the steps of a run: under load they stay what the work
costs, where a traced op's duration grows with the wait for a core. Linux only."""

from __future__ import annotations

import os
import time

from dtflab.train.run.callbacks import Callback


class CpuPerStep(Callback):
    """CPU seconds per step of each task process (and of this process, ``"client"``) over
    steps ``skip`` to the last, and the wall seconds per step."""

    def __init__(self, cluster, skip: int = 3):
        self.cluster, self.skip = cluster, skip
        self.per_step: dict[str, float] = {}
        self.wall_s = None
        self._first = None

    def _read(self):
        pids = {task.name: task.pid for task in self.cluster.tasks}
        return {name: _cpu_s(pid) for name, pid in pids.items()} | {
            "client": time.process_time()}, time.perf_counter()

    def on_step(self, history, record) -> None:
        count = len(history.records)
        if count == self.skip:
            self._first = (count, *self._read())
        elif self._first is not None and count > self.skip:
            first_count, first_cpu, first_wall = self._first
            cpu, wall = self._read()
            steps = count - first_count
            self.per_step = {name: (cpu[name] - first_cpu[name]) / steps for name in cpu}
            self.wall_s = (wall - first_wall) / steps


def _cpu_s(pid: int) -> float:
    """CPU seconds process ``pid``'s live threads have run so far (the kernel's scheduler
    statistics, in nanoseconds: ``/proc/<pid>/task/<tid>/schedstat``)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return total / 1e9
