"""Load: repeated start/stop cycles leave no process, thread, file descriptor or port behind.

Runs ``benchmarks/start_stop_cycles.py`` (the full counts, 100 local and 20 Dask cycles, are
for the benchmark) with small counts in a fresh interpreter, whose own threads and fds it
counts.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "start_stop_cycles.py"


@pytest.mark.slow
@pytest.mark.parametrize("backend, cycles", [("local", 6), ("dask", 3)])
def test_start_stop_cycles_leave_nothing_behind(backend, cycles):
    out = subprocess.run([sys.executable, str(SCRIPT), "--backend", backend, "--cycles", str(cycles)],
                         capture_output=True, text=True, timeout=600)
    assert out.stdout.strip(), out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["cycles"] == cycles
    assert report["ports_used"] >= 3 * cycles  # every cycle really started its tasks
    leaked = report["leaked"]
    said = json.dumps(leaked)  # in full: pytest shortens a dict, and fds_opened names each fd
    counted = {"threads", "fds", "fds_opened", "fds_after_collect"}
    assert {key: value for key, value in leaked.items() if key not in counted} == {
        "processes": [], "task_processes_alive_5s_after_stop": [],
        "ports_still_listening": []}, said
    assert leaked["threads"] <= 0 and leaked["fds"] <= 0, said
    assert out.returncode == 0, out.stderr[-3000:]
