"""Binder's limits for one notebook: a cgroup of its own with 2 GiB of memory and one CPU's worth
of time, on cgroup v1 or v2, whichever this machine gives those controllers to.

* **v1** (``/sys/fs/cgroup/memory``, ``cpu``, ``cpuacct``): a child of this process's group in
  each hierarchy; ``memory.limit_in_bytes``, ``cpu.cfs_quota_us`` = ``cpu.cfs_period_us``,
  ``cpu.shares``; the peak from ``memory.max_usage_in_bytes``, the CPU seconds from
  ``cpuacct.usage``.
* **v2** (one unified hierarchy): a *sibling* of this process's group, under the parent that
  enables ``memory`` and ``cpu`` for its children (a delegated subtree: a systemd slice, or the
  root); ``memory.max``, ``cpu.max`` = ``"<period> <period>"``, ``cpu.weight``; the peak from
  ``memory.peak`` (Linux 5.19), limit hits and OOM kills from ``memory.events``, the CPU seconds
  from ``cpu.stat``'s ``usage_usec``; what outlived the kernel is ended with ``cgroup.kill``.
  A group that holds processes cannot hand controllers to children (v2's "no internal
  processes" rule), hence the sibling, and why a container whose own root holds the tests gets
  no v2 limits here (``unavailable`` says so).

v1 is used where it has both controllers, else v2. ``unavailable()`` says why neither can be set
(not root, no controller, no delegation) and ``None`` where one can. Nothing here reaches the
network; each group is removed once its processes have gone.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
# cgroup v1's figures, a process's own group and a group's removal: the memory benchmark's
from notebook_memory import memory_figures, own_cgroup, remove_group  # noqa: E402

CGROUPS = Path("/sys/fs/cgroup")
#: cgroup-v1 ``cpu.shares`` and v2 ``cpu.weight`` of a notebook run in the background (an eighth
#: of a test process's 1024 shares, weight 100) and in the foreground. Not the least there is
#: (2, 1): a notebook held there gets no CPU at all while the tests want both cores, and
#: TensorFlow's coordination service ends a program whose task sends no heartbeat for 10 s (its
#: default, which a plain DTensor or MultiWorkerMirroredStrategy program keeps). Measured: the
#: DTensor program of notebook 10, 2 clients in a background group beside 6 busy loops that ran
#: for 8-20 s with 0.5-2 s gaps, failed 2 runs of 6 at 2 shares ("stopped sending heartbeats", as
#: in a CI run) and 0 of 9 at 128, whose group gets about 2% of the CPU under that load.
SHARES = {True: 128, False: 1024}
WEIGHT = {True: 12, False: 100}
PERIOD_US = 100_000  # v2's default cpu.max period


# -- where the controllers are --------------------------------------------------------------

def v1_unavailable() -> str | None:
    """Why cgroup v1 cannot limit a notebook here, or None."""
    for controller, knob in (("memory", "memory.limit_in_bytes"), ("cpu", "cpu.cfs_quota_us"),
                             ("cpuacct", "cpuacct.usage")):
        if not (CGROUPS / controller / knob).exists():
            return f"no cgroup-v1 {controller} controller at {CGROUPS / controller}"
    return None


def v2_mount(mountinfo: str | None = None) -> Path | None:
    """Where the unified (v2) hierarchy is mounted (``/sys/fs/cgroup`` on a v2 host,
    ``/sys/fs/cgroup/unified`` on a hybrid one), or None."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    for line in text.splitlines():
        fields, _, after = line.partition(" - ")
        if after.split(" ", 1)[0] == "cgroup2":
            return Path(fields.split()[4])
    return None


def v2_own_group(mount: Path, proc_cgroup: str | None = None) -> Path:
    """This process's v2 group: ``mount`` joined with the ``0::`` line of ``/proc/self/cgroup``."""
    text = proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text()
    path = next((line[3:] for line in text.splitlines() if line.startswith("0::")), "/")
    return mount / path.strip().lstrip("/")


def v2_parent(mount: Path, own: Path) -> tuple[Path | None, str | None]:
    """``(parent, None)``: the group under which a notebook's group goes (this process's
    parent, or the root where this process is in the root), with ``memory`` and ``cpu``
    enabled for its children (enabled here if they are not); ``(None, why)`` where that cannot
    be had."""
    parent = own.parent if own != mount else mount
    available = (parent / "cgroup.controllers").read_text().split()
    missing = [c for c in ("memory", "cpu") if c not in available]
    if missing:
        return None, (f"cgroup v2 at {mount}: no {' and '.join(missing)} controller for "
                      f"{parent} (it has: {' '.join(available) or 'none'}); the machine binds "
                      f"them to cgroup v1 or does not delegate them")
    enabled = (parent / "cgroup.subtree_control").read_text().split()
    wanted = [f"+{c}" for c in ("memory", "cpu") if c not in enabled]
    if wanted:
        try:
            (parent / "cgroup.subtree_control").write_text(" ".join(wanted))
        except OSError as error:  # EBUSY: the group holds processes (v2's internal-process rule)
            return None, (f"cgroup v2: cannot enable {' '.join(wanted)} for the children of "
                          f"{parent} ({error.strerror}); run the tests in a delegated subtree, "
                          f"for example under `systemd-run --scope -p Delegate=yes`")
    return parent, None


def which() -> tuple[str | None, str | None]:
    """``("v1" | "v2", None)``: the version that limits a notebook here; ``(None, why)``."""
    if os.geteuid() != 0:
        return None, "not root: a cgroup of its own for each notebook needs root; run the tests as root (CI does)"
    why_v1 = v1_unavailable()
    if why_v1 is None:
        return "v1", None
    mount = v2_mount()
    if mount is None:
        return None, f"{why_v1}, and no cgroup v2 is mounted"
    if tuple(map(int, re.match(r"(\d+)\.(\d+)", os.uname().release).groups())) < (5, 19):
        return None, f"{why_v1}; cgroup v2 has no memory.peak before Linux 5.19 (this is {os.uname().release})"
    _, why_v2 = v2_parent(mount, v2_own_group(mount))
    return (None, f"{why_v1}; {why_v2}") if why_v2 else ("v2", None)


def unavailable() -> str | None:
    """Why Binder's limits cannot be set here, or None."""
    return which()[1]


# -- one notebook's group -------------------------------------------------------------------

class Limits:
    """A fresh cgroup (v1: one per controller) with ``memory_mb`` and ``cpus`` (either None:
    not limited): ``groups`` to join, ``figures()``, ``leftovers()``, ``remove()``."""

    def __init__(self, name: str, memory_mb: int | None = 2048, cpus: float | None = 1.0,
                 background: bool = False, version: str | None = None, parent: Path | None = None):
        self.version = version or which()[0]
        if self.version == "v2":
            mount = v2_mount()
            self._impl = _V2(name, parent or v2_parent(mount, v2_own_group(mount))[0])
        elif self.version == "v1":
            self._impl = _V1(name)
        else:
            raise RuntimeError(f"Binder's limits cannot be set here: {unavailable()}")
        self.groups = self._impl.groups
        self._impl.limit(memory_mb, cpus)
        self.set_background(background)

    def set_background(self, background: bool) -> None:
        """Run at the background's CPU weight (``True``: ``SHARES``) or a test process's
        (``False``)."""
        self._impl.set_background(background)

    def figures(self) -> dict:
        """``cgroup_peak_mb``, ``limit_hits``, ``oom_kills``, ``cpu_s`` and ``cpu_quota``."""
        return self._impl.figures()

    def cpu_s(self) -> float:
        """CPU seconds used by every process that ran in the group."""
        return self._impl.cpu_s()

    def leftovers(self, grace_s: float = 10.0) -> list[str]:
        """What still runs in the group ``grace_s`` after the kernel ended (see ``outlived``)."""
        return outlived(self._impl.pids, self._impl.kill, grace_s)

    def remove(self) -> None:
        """Remove the group once its last processes have exited (they may still be exiting)."""
        for group in self.groups:
            remove_group(group)


def outlived(pids, kill, grace_s: float = 10.0) -> list[str]:
    """The processes ``pids()`` still lists ``grace_s`` after a kernel ended, a line each
    (pid and command); ``kill(pids)`` then ends them."""
    import psutil

    deadline = time.monotonic() + grace_s
    while (found := pids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = []
    for pid in found:
        try:
            left.append(f"{pid} {' '.join(psutil.Process(pid).cmdline()[:6])}")
        except psutil.Error:
            pass
    kill(found)
    return left


def kill_all(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` that is still there."""
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class _V1:
    """One child group in each of the memory, cpu and cpuacct hierarchies (cpuacct is the cpu
    group where the two are mounted together)."""

    def __init__(self, name: str):
        self.memory, self.cpu, self.cpuacct = (own_cgroup(c) / name for c in ("memory", "cpu", "cpuacct"))
        for group in (self.memory, self.cpu, self.cpuacct):
            group.mkdir(exist_ok=True)  # cpuacct may be cpu's own folder ("cpu,cpuacct")
        self.groups = list({g.resolve(): g for g in (self.memory, self.cpu, self.cpuacct)}.values())
        self.quota = False

    def limit(self, memory_mb: int | None, cpus: float | None) -> None:
        if memory_mb is not None:
            (self.memory / "memory.limit_in_bytes").write_text(str(memory_mb * 2**20))
        if cpus is not None:
            period = int((self.cpu / "cpu.cfs_period_us").read_text())
            (self.cpu / "cpu.cfs_quota_us").write_text(str(int(cpus * period)))
            self.quota = True

    def set_background(self, background: bool) -> None:
        (self.cpu / "cpu.shares").write_text(str(SHARES[background]))

    def cpu_s(self) -> float:
        return int((self.cpuacct / "cpuacct.usage").read_text()) / 1e9

    def figures(self) -> dict:
        return {**memory_figures(self.memory), "cpu_quota": self.quota, "cpu_s": round(self.cpu_s(), 1)}

    def pids(self) -> list[int]:
        return [int(p) for p in (self.memory / "cgroup.procs").read_text().split()]

    def kill(self, pids: list[int]) -> None:
        kill_all(pids)


class _V2:
    """One group in the unified hierarchy, under ``parent``."""

    def __init__(self, name: str, parent: Path):
        self.group = parent / name
        self.group.mkdir()
        self.groups = [self.group]
        self.quota = False

    def limit(self, memory_mb: int | None, cpus: float | None) -> None:
        if memory_mb is not None:
            (self.group / "memory.max").write_text(str(memory_mb * 2**20))
        if cpus is not None:
            (self.group / "cpu.max").write_text(f"{int(cpus * PERIOD_US)} {PERIOD_US}")
            self.quota = True

    def set_background(self, background: bool) -> None:
        # only where the parent gives its children the cpu controller (not in the namespace test)
        if "cpu" in (self.group.parent / "cgroup.subtree_control").read_text().split():
            (self.group / "cpu.weight").write_text(str(WEIGHT[background]))

    def cpu_s(self) -> float:
        stat = dict(line.split() for line in (self.group / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6

    def figures(self) -> dict:
        events = dict(line.split() for line in (self.group / "memory.events").read_text().splitlines())
        return {"cgroup_peak_mb": round(int((self.group / "memory.peak").read_text()) / 2**20),
                "limit_hits": int(events.get("max", 0)), "oom_kills": int(events.get("oom_kill", 0)),
                "cpu_quota": self.quota, "cpu_s": round(self.cpu_s(), 1)}

    def pids(self) -> list[int]:
        return [int(p) for p in (self.group / "cgroup.procs").read_text().split()]

    def kill(self, pids: list[int]) -> None:
        kill = self.group / "cgroup.kill"  # Linux 5.14: every process in the group, at once
        if kill.exists() and pids:
            kill.write_text("1")
        else:
            kill_all(pids)
