"""A DTensor client that waits for a client that has failed is stopped, and the run ends with one
line naming both and the fix (``dtflab.cluster.waits``): both races forced by small programs."""

import re
import subprocess

import psutil
import pytest

from conftest import all_gone, wait_until
from test_cli import DTFLAB

pytestmark = pytest.mark.slow

#: Client ``FAILS`` waits until client ``AFTER`` has started DTensor's server (its port
#: answers: it is inside ``initialize_accelerator_system``), then fails; the others start.
PROGRAM = """import os, socket, sys, time
me = int(os.environ["DTENSOR_CLIENT_ID"])
print(f"client {{me}} starts", flush=True)
if me == {fails}:
    host, port = os.environ["DTENSOR_JOBS"].split(",")[{after}].rsplit(":", 1)
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    time.sleep(1)
    print(f"client {{me}} fails at {{time.time()}}", flush=True)
    sys.exit(f"client {{me}} gives up before it joins")
from tensorflow.experimental import dtensor
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=1)
print(f"client {{me}} joined", flush=True)
"""
FAILED_AT = re.compile(r"^client \d fails at (\d+\.\d+)$", re.M)
#: TensorFlow's time stamp on the leader's line that says it waits for the others.
WAITING = re.compile(r"^I\d{4} \d\d:\d\d:(\d+\.\d+) .*Waiting for 1/2 tasks to connect\.$", re.M)

LEADER_WAITS = ("worker:0 waits for worker:1 (DTensor client 1, /job:worker/replica:0/task:1), "
                "which exited with code 1 before it joined (its last line: client 1 gives up "
                "before it joins): it would wait for ever, so it was stopped; every DTensor client "
                "must start and reach the same steps: fix the error in worker:1's log, "
                "cluster.logs('worker:1')")
LEADER_GONE = ("worker:1 waits for worker:0 (DTensor client 0, the coordination leader), which "
               "exited with code 1 (its last line: client 0 gives up before it joins): it would "
               "wait for ever, so it was stopped; every DTensor client must start and reach the "
               "same steps: fix the error in worker:0's log, cluster.logs('worker:0')")


def write_program(tmp_path, fails: int, after: int):
    script = tmp_path / f"client_{fails}_fails.py"
    script.write_text(PROGRAM.format(fails=fails, after=after))
    return script


def stopped_wait(run_programs, tmp_path, fails: int, after: int):
    """``(cluster, pids, error)``: two DTensor clients, client ``fails`` failing ``after``
    seconds in, and the ``WaitForEndedTaskError`` that ``cluster.wait`` raised."""
    from dtflab.errors import WaitForEndedTaskError

    cluster = run_programs(write_program(tmp_path, fails=fails, after=after), workers=2,
                           timeout=120)
    pids = [task.pid for task in cluster.tasks]
    with pytest.raises(WaitForEndedTaskError) as raised:
        cluster.wait(timeout=120)
    return cluster, pids, raised.value


def test_wait_stops_a_dtensor_leader_waiting_for_a_client_that_failed_before_joining(run_programs, tmp_path):
    cluster, pids, error = stopped_wait(run_programs, tmp_path, fails=1, after=0)
    assert str(error) == LEADER_WAITS  # the wait was stopped, not ended by its timeout
    failed_at = float(FAILED_AT.search(cluster.logs("worker:1"))[1])
    waiting_since = float(WAITING.search(cluster.logs("worker:0"))[1])
    assert waiting_since < failed_at  # the race forced: the leader logged its wait, then 1 failed
    assert [t.status for t in cluster.tasks] == ["killed", "exited with code 1"]
    assert None not in pids and wait_until(lambda: all_gone(pids), timeout=5)


def test_wait_stops_a_dtensor_client_whose_leader_failed_before_it_joined(run_programs, tmp_path):
    cluster, pids, error = stopped_wait(run_programs, tmp_path, fails=0, after=1)
    assert str(error) == LEADER_GONE  # the wait was stopped, not ended by its timeout
    assert error.log_tail.rstrip().splitlines()[-1].endswith(
        "Started server with target: grpc://" + cluster.addresses["worker"][1])
    assert FAILED_AT.search(cluster.logs("worker:0"))  # the leader failed, as it was told to
    assert [t.status for t in cluster.tasks] == ["exited with code 1", "killed"]
    assert None not in pids and wait_until(lambda: all_gone(pids), timeout=5)


def test_dtflab_run_ends_a_client_whose_dtensor_leader_failed_with_one_line_and_nothing_left(tmp_path):
    script = write_program(tmp_path, fails=0, after=1)
    process = subprocess.Popen(DTFLAB + ["run", "--workers", "2", str(script)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not any("client 0 fails at" in line for line in lines):
            lines.append(process.stdout.readline())
            assert lines[-1], f"dtflab run ended early: {lines} {process.stderr.read()}"
        descendants = psutil.Process(process.pid).children(recursive=True)
        assert process.wait(timeout=120) == 1
        out, err = process.communicate()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert err.splitlines() == [f"dtflab: error: {LEADER_GONE}"], err
    assert "[worker:1] client 1 starts" in "".join(lines) + out
    assert wait_until(lambda: all_gone([p.pid for p in descendants]), timeout=5)


def test_a_dtensor_client_goes_on_when_its_leader_fails_after_the_start_up(run_programs, tmp_path):
    # Not a wait for ever: the leader fails once every client has joined; the other client
    # finishes its own work (longer than SILENT_S) and exits 0, unstopped.
    script = tmp_path / "leader_fails_after.py"
    script.write_text("""import os, sys, time
from tensorflow.experimental import dtensor
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=1)
if dtensor.client_id() == 0:
    sys.exit("client 0 fails after the start-up")
time.sleep(12)
print("client 1 done", flush=True)
""")
    cluster = run_programs(script, workers=2, timeout=120)
    assert cluster.wait(timeout=120, check=False) == {"worker:0": 1, "worker:1": 0}
    assert re.search(r"^client 1 done$", cluster.logs("worker:1"), re.M)


def test_wait_stops_a_dtensor_client_whose_leader_was_killed_before_it_joined(run_programs, tmp_path):
    from dtflab.errors import WaitForEndedTaskError

    script = tmp_path / "leader_dawdles.py"
    script.write_text("""import os, time
if os.environ["DTENSOR_CLIENT_ID"] == "0":
    time.sleep(600)  # never starts DTensor: killed by the test
from tensorflow.experimental import dtensor
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=1)
""")
    cluster = run_programs(script, workers=2, timeout=120)
    pids = [task.pid for task in cluster.tasks]
    assert wait_until(lambda: "Started server with target" in cluster.logs("worker:1"), timeout=60)
    cluster.kill("worker:0")
    with pytest.raises(WaitForEndedTaskError, match=re.escape(
            "worker:1 waits for worker:0 (DTensor client 0, the coordination leader), which was "
            "killed: it would wait for ever, so it was stopped; every DTensor client must start "
            "and reach the same steps: run them again without killing worker:0 (its log: "
            "cluster.logs('worker:0'))") + "$"):
        cluster.wait(timeout=120)
    assert [t.status for t in cluster.tasks] == ["killed", "killed"]
    assert None not in pids and wait_until(lambda: all_gone(pids), timeout=5)
