"""The local backend: real task-server processes on 127.0.0.1."""

import os
import signal
import socket
import subprocess
import sys
import tempfile

import psutil
import pytest

import dtflab
from dtflab import scratch
from dtflab.cluster import base
from dtflab.cluster.task import TaskState
from dtflab.errors import PortInUseError, TaskError

from conftest import all_gone, free_ports, owner_of, run_constant, wait_until

pytestmark = pytest.mark.slow


def test_start_3_is_one_ps_and_two_workers_each_its_own_process(start_cluster):
    cluster = start_cluster(3)
    tasks = cluster.tasks
    assert [(t.job, t.index) for t in tasks] == [("ps", 0), ("worker", 0), ("worker", 1)]
    assert all(t.state is TaskState.RUNNING for t in tasks)
    pids = {t.pid for t in tasks}
    assert len(pids) == 3 and os.getpid() not in pids
    assert all(psutil.Process(pid).is_running() for pid in pids)
    assert all(t.memory_mb and t.memory_mb > 50 for t in tasks)
    assert set(cluster.spec.as_dict()) == {"ps", "worker"}
    assert cluster.target("worker", 1) == f"grpc://{cluster.addresses['worker'][1]}"


def test_every_task_runs_the_hello_constant(start_cluster):
    cluster = start_cluster(3)
    for task in cluster.tasks:
        result = run_constant(cluster.target("worker", 0), task.device)
        assert result == b"Hello, distributed TensorFlow!"


def test_stop_ends_every_process_and_frees_every_port(start_cluster):
    cluster = start_cluster(3)
    pids = [t.pid for t in cluster.tasks]
    ports = cluster.ports
    cluster.stop()
    assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
               for pid in pids)
    assert all(t.state is TaskState.STOPPED for t in cluster.tasks)
    for port in ports:
        with socket.socket() as s:
            # SO_REUSEADDR: a connection of an earlier test may have left this port number in
            # TIME_WAIT; what must fail here is a process still listening on it.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
            s.listen()
    cluster.stop()  # twice is fine


def test_the_tasks_listen_below_the_ephemeral_range(start_cluster):
    from dtflab.cluster.ports import ephemeral_range

    cluster = start_cluster(3)
    first, _ = ephemeral_range()
    assert all(port < first for port in cluster.ports), (cluster.ports, first)


def test_kill_and_restart_keep_the_address(start_cluster):
    cluster = start_cluster(3)
    address = cluster.addresses["worker"][1]
    old_pid = cluster.tasks[2].pid
    cluster.kill("worker", 1)
    assert cluster.tasks[2].state is TaskState.KILLED
    assert not psutil.pid_exists(old_pid)
    cluster.restart("worker:1")
    task = cluster.tasks[2]
    assert task.state is TaskState.RUNNING and task.pid != old_pid
    assert cluster.addresses["worker"][1] == address  # meant: read again after the restart
    assert run_constant(cluster.target("ps"), "/job:worker/task:1", "back") == b"back"


def test_a_task_that_dies_on_its_own_shows_as_exited(start_cluster):
    cluster = start_cluster(2)
    os.kill(cluster.tasks[1].pid, signal.SIGKILL)
    assert wait_until(lambda: cluster.tasks[1].state is TaskState.EXITED)


def test_logs_hold_what_the_task_printed_and_survive_stop(start_cluster):
    cluster = start_cluster(2)
    assert "worker:0 serving grpc://" in cluster.logs("worker:0")
    cluster.stop()
    assert "worker:0 serving grpc://" in cluster.logs("worker", 0)


def test_context_manager_stops(start_cluster):
    with dtflab.start_cluster(1) as cluster:
        pid = cluster.tasks[0].pid
    assert wait_until(lambda: not psutil.pid_exists(pid))


def test_legacy_spec_with_two_ps_tasks_starts(start_cluster):
    a, b, c = free_ports(3)
    cluster = start_cluster(spec=f"master|localhost:{a},ps|localhost:{b},ps|localhost:{c}")
    assert cluster.addresses == {"master": [f"localhost:{a}"],
                                 "ps": [f"localhost:{b}", f"localhost:{c}"]}
    assert run_constant(cluster.target("master"), "/job:ps/task:1", "ps1") == b"ps1"


@pytest.mark.parametrize("network, failed", [
    ("private", "could not start"),  # the gate finds the port taken
    ("host", r"exited while starting \(exit code 75\)"),  # the task server does
])
def test_a_port_in_use_fails_with_the_task_and_starts_nothing(network, failed):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (free,) = free_ports(1)
        with pytest.raises(PortInUseError, match=rf"ps:0 {failed}: .*port {port} of ps:0 is already in use"):
            dtflab.start_cluster(spec=f"worker|127.0.0.1:{free},ps|127.0.0.1:{port}", network=network)


def test_a_port_taken_after_choosing_is_chosen_again(monkeypatch, start_cluster):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        calls = []
        real = base.choose_ports

        def first_one_taken(layout):
            addresses = real(layout)
            calls.append(addresses)
            if len(calls) == 1:
                addresses["worker"][0] = f"127.0.0.1:{port}"
            return addresses

        monkeypatch.setattr(base, "choose_ports", first_one_taken)
        cluster = start_cluster(2)
        assert len(calls) == 2
        assert cluster.addresses["worker"][0] != f"127.0.0.1:{port}"
        assert all(t.state is TaskState.RUNNING for t in cluster.tasks)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_task_that_crashes_while_starting_is_named_with_its_stderr_and_the_others_stop(
        monkeypatch, start_method):
    import dtflab.processes.forkserver as forkserver
    import dtflab.processes.spawn as spawn

    if start_method == "fork":  # the forked worker:1 is given flags it refuses, on stderr
        real_launch, started = forkserver.ForkServer.launch, []

        def fork(self, module, args, log_path, **kwargs):
            if args[args.index("--job_name") + 1:][:3] == ["worker", "--task_index", "1"]:
                args = ["--cluster_spec", "ps|localhost:1", "--job_name", "worker"]
            process, ready = real_launch(self, module, args, log_path, **kwargs)
            started.append(process)
            return process, ready

        monkeypatch.setattr(forkserver.ForkServer, "launch", fork)
        with pytest.raises(TaskError, match=r"^worker:1 exited while starting \(exit code 2\): "
                                            r"dtflab server: --job_name 'worker' is not in the "
                                            r"cluster spec; its jobs are: ps$"):
            dtflab.start_cluster(3)
        assert len(started) == 3 and all(process.poll() is not None for process in started)
        return
    real_popen, started = subprocess.Popen, []

    def popen(command, **kwargs):  # worker:1 dies as a broken install would, on stderr
        if "dtflab.processes.server" in command and command[command.index("--job_name") + 1:][:3] == \
                ["worker", "--task_index", "1"]:
            command = [sys.executable, "-c", "import sys, time; time.sleep(1); "
                       "sys.exit('ImportError: libtensorflow_framework.so.2: cannot open shared object file')"]
        process = real_popen(command, **kwargs)
        started.append(process)
        return process

    monkeypatch.setattr(spawn.subprocess, "Popen", popen)
    with pytest.raises(TaskError, match=r"^worker:1 exited while starting \(exit code 1\): ImportError: "
                                        r"libtensorflow_framework\.so\.2: cannot open shared object file$"):
        dtflab.start_cluster(3, start_method="spawn")
    assert len(started) == 3  # three tasks (the gate is this process's, started before), all ended
    assert all(process.poll() is not None for process in started)


def test_start_deadline_names_the_task_and_leaves_nothing():
    with pytest.raises(TaskError, match=r"did not start within 0.01 s"):
        dtflab.start_cluster(2, timeout=0.01)


def test_kill_of_unknown_task_names_the_valid_tasks(start_cluster):
    cluster = start_cluster(2)
    with pytest.raises(ValueError, match=r"unknown task worker:5; this cluster has ps:0, worker:0"):
        cluster.kill("worker:5")
    with pytest.raises(ValueError, match=r"unknown task wrker:0"):
        cluster.restart("wrker", 0)


def test_tasks_die_within_5s_when_the_owner_is_killed_with_sigkill(tmp_path, monkeypatch):
    with owner_of("import json, time, dtflab\n"
                  "c = dtflab.start_cluster(3)\n"
                  "print(json.dumps([t.pid for t in c.tasks]), flush=True)\n"
                  "time.sleep(600)\n", env={"TMPDIR": str(tmp_path)}) as (tasks, pids):
        assert len(tasks) == 3 and set(tasks) < set(pids)
        assert len(pids) == 6  # and the gate of their private network, its helper, the fork server
        assert all(psutil.pid_exists(pid) for pid in pids)

    assert wait_until(lambda: all_gone(pids), timeout=5.0), "task processes outlived their owner"
    # what the killed owner could not remove (its tasks' logs, its gate's and fork server's),
    # the next process of dtflab's to make a folder does
    left = sorted(p.name.rsplit("-", 1)[0] for p in tmp_path.glob("dtflab-*"))
    assert left == ["dtflab-forkserver", "dtflab-gate", "dtflab-logs"]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert len(scratch.sweep(settle_s=0)) == 3
    assert not list(tmp_path.glob("dtflab-*"))


def test_eager_code_runs_on_a_connected_cluster():
    # connect() changes TensorFlow's process-wide context: run it in a process of its own.
    script = (
        "import dtflab\n"
        "from dtflab._quiet import import_tf\n"
        "tf = import_tf()\n"
        "with dtflab.start_cluster(2) as c:\n"
        "    devices = c.connect()\n"
        "    with tf.device('/job:worker/task:0'):\n"
        "        x = tf.reduce_sum(tf.ones([4, 4]))\n"
        "    print(sorted(devices)); print(x.device); print(float(x))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == str(sorted(["/job:ps/replica:0/task:0/device:CPU:0",
                                   "/job:worker/replica:0/task:0/device:CPU:0"]))
    assert lines[1] == "/job:worker/replica:0/task:0/device:CPU:0"
    assert lines[2] == "16.0"
