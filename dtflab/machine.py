"""How many CPUs' worth of time this process may use: the cores it may run on, capped by its
cgroup's CPU quota.

``os.cpu_count()`` counts the host's cores. On mybinder.org (and in most containers) a learner
gets a CPU *quota*, about one CPU's worth of time, on a host with many cores: two processes
then share that one CPU's time, and a second worker cannot make anything faster.

In [1]: dtflab.cpus()
Out[1]: 1.0          # on Binder
"""

from __future__ import annotations

import os
from pathlib import Path


def cpus() -> float:
    """CPUs' worth of time this process may use: its cores (``os.sched_getaffinity``), or
    fewer where its cgroup has a quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``). Linux only sees quotas; elsewhere ``os.cpu_count()``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _quota()
    return float(min(cores, quota)) if quota else float(cores)


def _quota() -> float | None:
    """The CPU quota of this process's cgroup (and its parents'), in CPUs; None if none."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            found += _limits(Path("/sys/fs/cgroup"), path, _v2)
        elif "cpu" in controllers.split(","):
            found += _limits(Path("/sys/fs/cgroup/cpu"), path, _v1) or _limits(
                Path(f"/sys/fs/cgroup/{controllers}"), path, _v1)
    return min(found) if found else None


def _limits(root: Path, path: str, read) -> list[float]:
    """The quota at each level from ``root/path`` up to ``root`` (a limit anywhere above binds)."""
    found, folder = [], root / path.lstrip("/")
    while True:
        limit = read(folder)
        if limit:
            found.append(limit)
        if folder == root or root not in folder.parents:
            return found
        folder = folder.parent


def _v2(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 else None
