"""Start and stop a 3-task cluster many times: does anything stay behind?

After one warm-up cycle (which lets one-time things settle: imports, Dask's event loop, the
multiprocessing resource tracker), counts in this process the OS threads, open file
descriptors and child processes, then runs ``--cycles`` start/stop cycles and counts again.
Every port a cycle used (task and profiler ports) must be free afterwards and every task
process gone within 5 s of its stop.

    python benchmarks/start_stop_cycles.py --backend local --cycles 100
    python benchmarks/start_stop_cycles.py --backend dask --cycles 20

Prints one JSON line; exit code 1 if anything leaked (tests/test_load.py runs it with a small
count).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import psutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dtflab  # noqa: E402

IGNORED_CHILDREN = ("multiprocessing.resource_tracker",)  # one per process, by design


def snapshot() -> dict:
    children = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and not any(
                    name in " ".join(child.cmdline()) for name in IGNORED_CHILDREN):
                children.append(child.pid)
        except psutil.Error:
            pass
    return {"threads": len(os.listdir("/proc/self/task")), "fds": len(os.listdir("/proc/self/fd")),
            "children": sorted(children), "open": open_files()}


def open_files() -> dict[str, str]:
    """This process's file descriptors and what each points at (a socket, a pipe, a file)."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed while listed (the listing's own fd)
            pass
    return found


def settled(before: dict, wait_s: float = 10.0) -> dict:
    """A snapshot once this process holds no more threads and fds than ``before``, or after
    ``wait_s`` (at least 1 s: the last stop's threads wind down). A stop's last socket can close
    after 1 s on a loaded machine (a CI run beside the notebooks: one fd over after 3 Dask
    cycles, none on the rerun); a leak is still there after ``wait_s``."""
    time.sleep(1.0)
    deadline = time.monotonic() + wait_s - 1.0
    while True:
        after = snapshot()
        if (after["threads"] <= before["threads"] and after["fds"] <= before["fds"]
                or time.monotonic() > deadline):
            return after
        time.sleep(0.2)


def listening(ports: set[int]) -> list[int]:
    """Which of ``ports`` a process of this program's, or an orphan, still listens on (another
    program may since have been given one of them: the tests' notebooks run beside this)."""
    mine = {os.getpid()} | {child.pid for child in psutil.Process().children(recursive=True)}

    def ours_or_orphaned(pid) -> bool:
        try:
            return pid is None or pid in mine or psutil.Process(pid).ppid() == 1
        except psutil.Error:
            return False

    return sorted({c.laddr.port for c in psutil.net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN and c.laddr.port in ports and ours_or_orphaned(c.pid)})


def one_cycle(backend: str) -> tuple[float, set[int], list[int]]:
    """Start, check every task runs, stop; returns (seconds, ports used, pids still alive)."""
    start = time.perf_counter()
    cluster = dtflab.start_cluster(3, backend=backend)
    tasks = cluster.tasks
    assert all(str(task.state) == "running" for task in tasks), tasks
    pids = [task.pid for task in tasks if task.pid]
    ports = set(cluster.ports)
    cluster.stop()
    elapsed = time.perf_counter() - start
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return elapsed, ports, [pid for pid in pids if psutil.pid_exists(pid)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["local", "dask"], default="local")
    parser.add_argument("--cycles", type=int, default=100)
    args = parser.parse_args(argv)

    one_cycle(args.backend)  # warm-up
    before = snapshot()
    times, used, survivors = [], set(), []
    for _ in range(args.cycles):
        elapsed, ports, alive = one_cycle(args.backend)
        times.append(elapsed)
        used |= ports
        survivors += alive
    after = settled(before)
    leaked = {"processes": sorted(set(after["children"]) - set(before["children"])),
              "task_processes_alive_5s_after_stop": survivors,
              "threads": after["threads"] - before["threads"], "fds": after["fds"] - before["fds"],
              "ports_still_listening": listening(used),
              # what a leaked fd points at, to find the code that opened it (an event loop
              # holds an anon_inode:[eventpoll] and a socket pair)
              "fds_opened": sorted(target for fd, target in after["open"].items()
                                   if before["open"].get(fd) != target)}
    if leaked["fds"] > 0:  # held only by a reference cycle, or open for good?
        import gc

        gc.collect()
        leaked["fds_after_collect"] = len(os.listdir("/proc/self/fd")) - before["fds"]
    report = {"benchmark": "start_stop_cycles", "backend": args.backend, "cycles": args.cycles,
              "cycle_s_median": round(statistics.median(times), 3),
              "cycle_s_max": round(max(times), 3), "ports_used": len(used),
              "before": {k: len(v) if k == "children" else v for k, v in before.items()
                         if k != "open"},
              "after": {k: len(v) if k == "children" else v for k, v in after.items()
                        if k != "open"},
              "leaked": leaked}
    print(json.dumps(report))
    clean = not (leaked["processes"] or survivors or leaked["threads"] > 0 or leaked["fds"] > 0
                 or leaked["ports_still_listening"])
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
