"""Binder's limits on cgroup v1 and v2 (``binder_limits``), and what a notebook left behind found
without any cgroup (``notebook_runs.leftovers_by_tag``).

This project's machines bind memory and cpu to cgroup v1 (the notebook runs use it), so v2's
memory and cpu files cannot be written for real here. What can be shown is: v2's file protocol
(which file gets which value, how its figures are read) against a folder laid out as the kernel
lays a group, and the group's life on a real cgroup2 hierarchy, mounted in a private mount
namespace: created, joined, its CPU seconds counted, what outlived its first process found and
ended with ``cgroup.kill``, removed; and the reason given when memory and cpu are not there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import binder_limits
from binder_limits import Limits
from conftest import not_here, wait_until
from notebook_runs import GROUP_PREFIX, JOIN, RUN_TAG, in_a_notebook, leftovers_by_tag, tagged

TESTS = Path(__file__).parent
#: A process that uses about 0.3 s of CPU, starts a sleeper in a session of its own (what a
#: notebook's task server looks like once its kernel is gone), prints the sleeper's pid and exits.
LEAVES_ONE = """import subprocess, sys, time
end = time.process_time() + 0.3
while time.process_time() < end:
    pass
print(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)
"""


def test_a_v2_group_gets_binders_limits_in_v2s_files_and_reads_its_figures_from_them(tmp_path):
    parent = tmp_path / "notebooks.slice"
    parent.mkdir()
    (parent / "cgroup.subtree_control").write_text("cpu memory pids\n")
    limits = Limits("nb", memory_mb=2048, cpus=1.0, background=True, version="v2", parent=parent)
    group = parent / "nb"
    assert limits.groups == [group]
    assert (group / "memory.max").read_text() == str(2 * 2**30)
    assert (group / "cpu.max").read_text() == "100000 100000"  # one CPU: the quota is the period
    assert (group / "cpu.weight").read_text() == "12"  # an eighth of a test process's: see SHARES
    limits.set_background(False)
    assert (group / "cpu.weight").read_text() == "100"
    # The kernel's own formats (Linux 6.x)
    (group / "memory.peak").write_text("1503238553\n")
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n")
    (group / "cpu.stat").write_text("usage_usec 81234567\nuser_usec 70000000\nsystem_usec 11234567\n"
                                    "nr_periods 812\nnr_throttled 40\nthrottled_usec 900000\n")
    assert limits.figures() == {"cgroup_peak_mb": 1434, "limit_hits": 7, "oom_kills": 1,
                                "cpu_quota": True, "cpu_s": 81.2}


def test_v2_is_found_where_a_v2_or_a_hybrid_host_mounts_it():
    v2_host = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
    hybrid = ("35 25 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
              "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    v1_only = "35 25 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    assert binder_limits.v2_mount(v2_host) == Path("/sys/fs/cgroup")
    assert binder_limits.v2_mount(hybrid) == Path("/sys/fs/cgroup/unified")
    assert binder_limits.v2_mount(v1_only) is None
    own = binder_limits.v2_own_group(Path("/sys/fs/cgroup"), "0::/user.slice/user-1000.slice/session-2.scope\n")
    assert own == Path("/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope")


def test_a_v2_parent_without_memory_and_cpu_is_refused_with_what_it_has(tmp_path):
    parent = tmp_path / "system.slice"
    (parent / "runner.service").mkdir(parents=True)
    (parent / "cgroup.controllers").write_text("io pids\n")
    found, why = binder_limits.v2_parent(tmp_path, parent / "runner.service")
    assert found is None
    assert why == (f"cgroup v2 at {tmp_path}: no memory and cpu controller for {parent} (it has: io "
                   f"pids); the machine binds them to cgroup v1 or does not delegate them")
    (parent / "cgroup.controllers").write_text("cpu io memory pids\n")
    (parent / "cgroup.subtree_control").write_text("cpu memory\n")  # already given to its children
    assert binder_limits.v2_parent(tmp_path, parent / "runner.service") == (parent, None)


# Run as root inside `unshare --mount --propagation private`: a cgroup2 hierarchy mounted at
# argv[1] is seen by this process alone, and unmounted with its namespace.
IN_A_PRIVATE_MOUNT = """import json, subprocess, sys, time
from pathlib import Path
mount, tests, name, join, leaves = Path(sys.argv[1]), *sys.argv[2:]
sys.path.insert(0, tests)
import binder_limits
subprocess.run(["mount", "-t", "cgroup2", "none", str(mount)], check=True)
parent, why = binder_limits.v2_parent(mount, binder_limits.v2_own_group(mount))
limits = binder_limits.Limits(name, memory_mb=None, cpus=None, version="v2", parent=mount)
(group,) = limits.groups
done = subprocess.run([sys.executable, join, str(group), "--", sys.executable, "-c", leaves],
                      capture_output=True, text=True, check=True)
sleeper = int(done.stdout)
member = str(sleeper) in (group / "cgroup.procs").read_text().split()
cpu_s = limits.cpu_s()
left = limits.leftovers(grace_s=0.5)
deadline = time.monotonic() + 10
while (group / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
    time.sleep(0.05)
limits.remove()
print(json.dumps({"why": why, "sleeper": sleeper, "member": member, "cpu_s": cpu_s, "left": left,
                  "removed": not group.exists()}))
"""


def test_a_v2_group_on_a_real_hierarchy_counts_cpu_finds_what_outlived_its_process_and_ends_it(tmp_path):
    if os.geteuid() != 0:
        not_here("CGROUP-V2 TEST NOT RUN: mounting a cgroup2 hierarchy in a mount namespace needs root")
    mount = tmp_path / "cgroup2"
    mount.mkdir()
    name = f"dtflab-test-v2-{os.getpid()}-{time.monotonic_ns()}"
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                           IN_A_PRIVATE_MOUNT, str(mount), str(TESTS), name, str(JOIN), LEAVES_ONE],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["member"], "the sleeper started inside the group stays in it"
    assert 0.25 <= seen["cpu_s"] < 5, seen  # the 0.3 s the first process spent, and the sleeper's start
    assert [line.split()[0] for line in seen["left"]] == [str(seen["sleeper"])], seen
    assert not psutil.pid_exists(seen["sleeper"]) or psutil.Process(seen["sleeper"]).status() == psutil.STATUS_ZOMBIE
    assert seen["removed"]
    # This machine gives memory and cpu to cgroup v1, so v2's root has neither: said, not guessed.
    if "memory" not in Path("/sys/fs/cgroup/unified/cgroup.controllers").read_text().split():
        assert seen["why"].startswith(f"cgroup v2 at {mount}: no memory and cpu controller for {mount}")


def test_without_a_cgroup_what_a_kernel_left_is_found_by_the_tag_in_its_environment():
    name = f"{GROUP_PREFIX}test-{os.getpid()}-{time.monotonic_ns()}"
    done = subprocess.run([sys.executable, "-c", LEAVES_ONE], env={**os.environ, RUN_TAG: name},
                          capture_output=True, text=True, timeout=60, check=True)
    sleeper = int(done.stdout)
    # Popen returns once the child has exec'd, a moment before the kernel shows its new
    # environment in /proc (read empty in one CI run)
    assert wait_until(lambda: tagged(name) == [sleeper]), tagged(name)
    assert in_a_notebook(sleeper)
    left = leftovers_by_tag(name, grace_s=0.5)
    assert [line.split()[0] for line in left] == [str(sleeper)]
    deadline = time.monotonic() + 10
    while psutil.pid_exists(sleeper) and psutil.Process(sleeper).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the leftover was not ended"
        time.sleep(0.05)
    assert tagged(name) == [] or psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE
