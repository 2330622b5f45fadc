"""Follow program tasks' output live, each line labelled with its task: ``dtflab run`` and
``%%dtf_run`` print through this."""

from __future__ import annotations

import os
import re
import time

POLL_S = 0.2
#: One of TensorFlow's C++ INFO lines: ``I0000 00:00:1795437483.503459   22677 file.cc:467] ...``.
TF_INFO = re.compile(r"I\d{4} [\d:.]+ +\d+ \S+:\d+\] ")


class LogFollower:
    """The lines each task printed since the last look, complete lines only."""

    def __init__(self, cluster, names: list[str]):
        self.cluster, self.names = cluster, names
        self.offsets = dict.fromkeys(names, 0)
        self.width = max(map(len, names), default=0) + 2

    def new_lines(self, *, final: bool = False) -> list[str]:
        """``[worker:0] line`` for every new line; with ``final``, a last unterminated one too."""
        out = []
        for name in self.names:
            text = self.cluster.logs(name)
            new = text[self.offsets[name]:]
            end = len(new) if final else new.rfind("\n") + 1
            self.offsets[name] += end
            label = f"[{name}]".ljust(self.width)
            out += [f"{label} {line}" for line in new[:end].splitlines()]
        return out


def follow_programs(cluster, write=print) -> dict[str, int | None]:
    """Write the program tasks' output, labelled, until every program has ended; returns
    their exit codes (``Cluster.wait(check=False)``). Ctrl-C propagates to the caller.

    A program that waits for a task that has ended is stopped, its last lines written, and
    ``WaitForEndedTaskError`` raised (``dtflab.cluster.waits``). TensorFlow's C++ INFO lines,
    which programs log, are not written unless this process has ``TF_CPP_MIN_LOG_LEVEL=0``."""
    from dtflab.cluster.waits import WaitWatch

    names = list(cluster.states(programs_only=True))
    follower = LogFollower(cluster, names)
    watch = WaitWatch(cluster)
    show_info = os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0"

    def write_new(final: bool) -> None:
        for line in follower.new_lines(final=final):
            if show_info or not TF_INFO.match(line, follower.width + 1):
                write(line)

    while True:
        running = any(state.value in ("running", "starting")
                      for state in cluster.states(programs_only=True).values())
        write_new(final=not running)
        if not running:
            return cluster.wait(check=False)
        watch.raise_if_stuck(before_raising=lambda: write_new(final=True))
        time.sleep(POLL_S)
