"""Follow program tasks' output live, each line labelled with its task: ``dtflab run`` and
``%%dtf_run`` print through this."""

from __future__ import annotations

import time

POLL_S = 0.2


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
    their exit codes (``Cluster.wait(check=False)``). Ctrl-C propagates to the caller."""
    names = list(cluster.states(programs_only=True))
    follower = LogFollower(cluster, names)
    while True:
        running = any(state.value in ("running", "starting")
                      for state in cluster.states(programs_only=True).values())
        for line in follower.new_lines(final=not running):
            write(line)
        if not running:
            return cluster.wait(check=False)
        time.sleep(POLL_S)
