"""Peak memory of each tutorial: the kernel plus every process it starts, summed as PSS,
and, where this machine allows it, the peak of a Binder-sized memory cgroup around it all.

Each notebook is executed top to bottom in a fresh kernel, solved (its solution cell run without
``%%dtf_solution``, ``dtflab.exercises.apply_solutions``: a learner who answers runs the check's
own training, notebook 08's peak), while a sampler adds up the proportional set size (shared
TensorFlow pages divided among the processes that map them) of the kernel and all its
descendants every 0.25 s. mybinder.org gives one user 2 GB and restarts the kernel above it.

With ``--cgroup`` (root and the cgroup-v1 memory controller, as on Linux hosts without
cgroup v2), each notebook runs in a child cgroup limited to ``--limit-mb`` (default 2048), as
Binder limits a user's pod: the executor, the kernel and every task it starts are inside, and
the cgroup's own peak (``memory.max_usage_in_bytes``: page cache included) is reported beside
the PSS, with how often the limit was hit (``memory.failcnt``) and the OOM kills.

    python benchmarks/notebook_memory.py [--cgroup] [--smoke] [notebooks/03_*.ipynb ...]

Prints one JSON line: peak MB and seconds per notebook. --smoke, without notebooks named, runs
the quickstart alone (``SMOKE``): largest_peak_pss_mb is then its peak, not the tutorials'.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
from nbclient import NotebookClient

from dtflab.exercises import apply_solutions

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "notebooks" / "00_quickstart.ipynb"  # --smoke's: a short notebook


def tree_pss_mb(pid: int) -> float:
    total = 0
    try:
        root = psutil.Process(pid)
        for process in [root] + root.children(recursive=True):
            try:
                info = process.memory_full_info()
                total += getattr(info, "pss", info.rss)
            except psutil.Error:
                pass
    except psutil.Error:
        return 0.0
    return total / 2**20


def measure(path: Path) -> dict:
    notebook = apply_solutions(nbformat.read(path, as_version=4))
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    peak, done = [0.0], threading.Event()

    def sample():
        while not done.is_set():
            manager = client.km
            if manager is not None and manager.has_kernel and manager.provisioner:
                pid = getattr(manager.provisioner, "pid", None) or manager.provisioner.process.pid
                peak[0] = max(peak[0], tree_pss_mb(pid))
            done.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.perf_counter()
    sampler.start()
    try:
        client.execute()
    finally:
        done.set()
        sampler.join()
    return {"peak_pss_mb": round(peak[0]), "seconds": round(time.perf_counter() - started, 1)}


MEMORY = Path("/sys/fs/cgroup/memory")


def cgroup_unavailable() -> str | None:
    """Why a memory cgroup cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root"
    if not (MEMORY / "memory.limit_in_bytes").exists():
        return "no cgroup-v1 memory controller at /sys/fs/cgroup/memory"
    return None


def own_cgroup(controller: str = "memory") -> Path:
    """This process's cgroup-v1 folder for ``controller`` ("memory", "cpu", ...)."""
    root = MEMORY.parent / controller
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return root / path.lstrip("/")
    return root


def in_cgroup(path: Path, limit_mb: int, python: str = sys.executable) -> dict:
    """Run ``path`` in a fresh child cgroup limited to ``limit_mb``; its peaks and OOM kills."""
    group = own_cgroup() / f"dtflab-notebook-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_mb * 2**20))
        done = subprocess.run([python, __file__, "--join", str(group), str(path)],
                              capture_output=True, text=True)
        result = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {
            "error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        result.update(memory_figures(group), limit_mb=limit_mb)
        return result
    finally:
        remove_group(group)


def memory_figures(group: Path) -> dict:
    """A memory cgroup's peak (MiB, page cache included), limit hits and OOM kills."""
    oom = dict(line.split() for line in (group / "memory.oom_control").read_text().splitlines())
    return {"cgroup_peak_mb": round(int((group / "memory.max_usage_in_bytes").read_text()) / 2**20),
            "limit_hits": int((group / "memory.failcnt").read_text()),
            "oom_kills": int(oom.get("oom_kill", 0))}


def remove_group(group: Path, timeout_s: float = 10.0) -> None:
    """Remove a cgroup once its last processes have exited (they may still be exiting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            group.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="default: every notebook in notebooks/")
    parser.add_argument("--cgroup", action="store_true",
                        help="run each notebook in a memory cgroup of --limit-mb, as Binder does")
    parser.add_argument("--limit-mb", type=int, default=2048, help="the cgroup's limit (default 2048)")
    parser.add_argument("--join", metavar="CGROUP", help=argparse.SUPPRESS)  # in_cgroup's child
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    if args.join:  # move into the cgroup first: the kernel and its tasks start inside it
        (Path(args.join) / "cgroup.procs").write_text(str(os.getpid()))
        print(json.dumps(measure(Path(args.notebooks[0]))))
        return
    paths = [Path(p) for p in args.notebooks] or ([SMOKE] if args.smoke else sorted(
        (ROOT / "notebooks").glob("*.ipynb")))
    if args.cgroup and cgroup_unavailable():
        parser.error(f"--cgroup: {cgroup_unavailable()}; run as root on a host with the cgroup-v1 "
                     f"memory controller, or leave --cgroup out")
    results = {path.name: in_cgroup(path.resolve(), args.limit_mb) if args.cgroup else measure(path)
               for path in paths}
    summary = {"benchmark": "notebook_memory", "notebooks": results,
               "largest_peak_pss_mb": max(r.get("peak_pss_mb", 0) for r in results.values())}
    if args.cgroup:
        summary["largest_cgroup_peak_mb"] = max(r["cgroup_peak_mb"] for r in results.values())
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
