"""Warm starts: tasks forked from the fork server (restarts too, spawn still there), a task
forked with an ended task's pid, the fork server in the private network, and nothing of it
left when its owner is killed, even a program stuck in C holding the GIL."""

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import all_gone, kernel_services, not_here, owner_of, run_constant, wait_until

pytestmark = pytest.mark.slow
PROGRAMS = Path(__file__).parent / "programs"


def test_warm_starts_fork_restarts_fork_and_spawn_still_works(start_cluster):
    warm = start_cluster(3)
    assert warm.start_method == "fork" and "tasks forked" in repr(warm)
    assert {t.started_by for t in warm.tasks} == {"fork"}
    warm.restart("worker:0")
    assert warm.tasks[1].started_by == "fork"
    assert run_constant(warm.target("ps"), "/job:worker/task:0", "again") == b"again"
    cold = start_cluster(2, start_method="spawn")
    assert cold.start_method == "spawn" and cold.why_not_fork == "asked for start_method='spawn'"
    assert run_constant(cold.target("worker"), "/job:ps/task:0", "spawned") == b"spawned"
    assert "tasks spawned" in cold._repr_html_() and "tasks forked" in warm._repr_html_()


def test_a_task_forked_with_an_ended_tasks_pid_runs_and_the_ended_one_stays_ended(tmp_path):
    # Linux hands out pids again (32,768 by default, shared with every thread): a long run of
    # tests did, and the fork server's owner took the new task for the old one's exit
    # (pid None, '/proc/None/task' in the scaling model's callback). The program forces the
    # reuse in a PID namespace of its own, where no other process on the machine takes the pid
    # first; when it ends, the kernel ends everything in that namespace.
    if os.geteuid() != 0:
        not_here("PID-REUSE TEST NOT RUN: choosing the next pid (/proc/sys/kernel/ns_last_pid) needs root")
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                           str(PROGRAMS / "pid_reused.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["exits"] == {"worker:0": 0}
    assert seen["tries"][-1] == seen["pid"], f"no task got pid {seen['pid']} again: {seen['tries']}"
    assert seen["reborn"] == [["RUNNING", seen["pid"]]]
    assert seen["ended"] == [["EXITED", 0, None]]
    assert "worker:0 still running after 2 s" in seen["after_stop"]


def test_the_fork_server_lives_in_the_private_network_and_its_tasks_too(start_cluster):
    cluster = start_cluster(2)
    services = kernel_services()
    (fork_server,) = [pid for pid in services["dtflab.processes.forkserver"]
                      if psutil.Process(pid).children()]
    gate = min(services["dtflab.network.gate"])  # the gate; its helper stays on the host
    private = os.readlink(f"/proc/{gate}/ns/net")
    assert private != os.readlink("/proc/self/ns/net")
    assert os.readlink(f"/proc/{fork_server}/ns/net") == private
    for task in cluster.tasks:
        assert os.readlink(f"/proc/{task.pid}/ns/net") == private
        assert psutil.Process(task.pid).ppid() == fork_server


def test_owner_sigkill_leaves_no_fork_server_gate_program_or_task(tmp_path):
    script = tmp_path / "forever.py"
    script.write_text("import time\ntime.sleep(600)\n")
    with owner_of("import json, sys, time, dtflab\n"
                  "c = dtflab.start_cluster(2)\n"
                  f"r = dtflab.run({str(script)!r}, workers=2, ps=1)\n"
                  "print(json.dumps([t.pid for t in c.tasks + r.tasks]), flush=True)\n"
                  "time.sleep(600)\n") as (tasks, pids):
        assert len(tasks) == 5 and set(tasks) < set(pids)
        assert len(pids) == 8  # and the gate, its helper and the fork server

    assert wait_until(lambda: all_gone(pids), timeout=5.0), "processes outlived their owner"


def test_a_program_stuck_in_c_holding_the_gil_still_ends_with_its_owner(tmp_path):
    # As a MultiWorkerMirroredStrategy worker waiting for a dead peer in its start-up does:
    # the thread that watches standard input can never run again.
    script = tmp_path / "stuck.py"
    script.write_text("import ctypes\nctypes.PyDLL(None).sleep(600)\n")
    with owner_of("import json, sys, time, dtflab\n"
                  f"r = dtflab.run({str(script)!r}, workers=1)\n"
                  "time.sleep(2)\n"
                  "print(json.dumps([t.pid for t in r.tasks]), flush=True)\n"
                  "time.sleep(600)\n") as (tasks, pids):
        assert len(tasks) == 1 and psutil.Process(tasks[0]).status() != psutil.STATUS_ZOMBIE

    assert wait_until(lambda: all_gone(pids), timeout=5.0), "processes outlived their owner"
