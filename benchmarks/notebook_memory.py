"""Peak memory of each tutorial: the kernel plus every process it starts, summed as PSS.

Each notebook is executed top to bottom in a fresh kernel while a sampler adds up the
proportional set size (shared TensorFlow pages divided among the processes that map them) of
the kernel and all its descendants every 0.25 s. Binder gives 1-2 GB.

    python benchmarks/notebook_memory.py [notebooks/03_*.ipynb ...]

Prints one JSON line: peak MB and seconds per notebook.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


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
    notebook = nbformat.read(path, as_version=4)
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


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    results = {path.name: measure(path) for path in paths}
    print(json.dumps({"benchmark": "notebook_memory", "notebooks": results,
                      "largest_peak_pss_mb": max(r["peak_pss_mb"] for r in results.values())}))


if __name__ == "__main__":
    main()
