"""dtflab.cpus(): the CPUs' worth of time a process may use, as Binder's quota sets it."""

import os
import subprocess
import sys
import time

from binder_limits import Limits
from conftest import not_here
from notebook_runs import JOIN, cgroups_unavailable


def cpus_in(tmp_path, quota_of_period: float | None, affinity: set[int] | None = None) -> float:
    """``dtflab.cpus()`` in a child process inside a fresh cgroup (v1 or v2) with that quota."""
    reason = cgroups_unavailable()
    if reason:
        not_here(f"CPU QUOTA TESTS NOT RUN: {reason}")
    limits = Limits(f"dtflab-test-cpus-{os.getpid()}-{time.monotonic_ns()}", memory_mb=None,
                    cpus=quota_of_period)
    try:
        code = "import os, dtflab\n"
        if affinity is not None:
            code += f"os.sched_setaffinity(0, {sorted(affinity)!r})\n"
        code += "print(dtflab.cpus())"
        done = subprocess.run([sys.executable, str(JOIN), *map(str, limits.groups), "--",
                               sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return float(done.stdout)
    finally:
        limits.remove()


def test_binders_quota_of_one_cpu_reads_one_whatever_the_host_has(tmp_path):
    assert os.cpu_count() >= 2  # the host's cores, which a quota does not change
    assert cpus_in(tmp_path, 1.0) == 1.0
    assert cpus_in(tmp_path, 0.5) == 0.5


def test_without_a_quota_it_is_the_cores_the_process_may_run_on(tmp_path):
    assert cpus_in(tmp_path, None) == len(os.sched_getaffinity(0))
    assert cpus_in(tmp_path, None, affinity={0}) == 1.0
    assert cpus_in(tmp_path, 8.0) == len(os.sched_getaffinity(0))  # a quota above the cores
