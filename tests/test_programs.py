"""Program tasks and warm starts: real programs on every worker, forked from the fork server."""

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

from dtflab.cluster.task import TaskState
from dtflab.errors import TaskError

from conftest import wait_until
from test_cli import DTFLAB

pytestmark = pytest.mark.slow
PROGRAMS = Path(__file__).parent / "programs"

PROBE = """import json, os, sys
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__, "cwd": os.getcwd(),
                  "tf_config": json.loads(os.environ["TF_CONFIG"])}))
"""


def test_a_program_runs_as_python_script_args_would(run_programs, tmp_path, monkeypatch):
    script = tmp_path / "code" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    monkeypatch.chdir(tmp_path)
    cluster = run_programs("code/probe.py", "--job={job_name}", "--task={task_index}",
                           "--ps={ps_hosts}", "--workers={worker_hosts}", "{{literal}}",
                           workers=2, ps=1)
    assert cluster.wait() == {"worker:0": 0, "worker:1": 0}
    ps_hosts, worker_hosts = ",".join(cluster.addresses["ps"]), ",".join(cluster.addresses["worker"])
    for index in (0, 1):
        seen = json.loads(cluster.logs(f"worker:{index}").strip().splitlines()[-1])
        assert seen["argv"] == [str(script), "--job=worker", f"--task={index}",
                                f"--ps={ps_hosts}", f"--workers={worker_hosts}", "{literal}"]
        assert seen["path0"] == str(script.parent) and seen["name"] == "__main__"
        assert seen["cwd"] == str(tmp_path)
        assert seen["tf_config"] == {"cluster": cluster.addresses,
                                     "task": {"type": "worker", "index": index}}
    states = {t.name: (t.state, t.exit_code, t.program, t.started_by) for t in cluster.tasks}
    assert states["worker:1"] == (TaskState.EXITED, 0, "probe.py", "fork")
    assert states["ps:0"] == (TaskState.RUNNING, None, None, "fork")


def test_a_tf1_between_graph_trainer_runs_unchanged_with_the_placeholder_flags(run_programs, tmp_path):
    cluster = run_programs(PROGRAMS / "between_graph_trainer.py", "--ps_hosts={ps_hosts}",
                           "--worker_hosts={worker_hosts}", "--job_name={job_name}",
                           "--task_index={task_index}", "--last_step=40",
                           f"--checkpoint_dir={tmp_path}", workers=2, ps=1, timeout=120)
    assert cluster.wait(timeout=240) == {"worker:0": 0, "worker:1": 0}
    steps = []
    for index in (0, 1):
        done = re.search(r"worker (\d) done at global step (\d+)", cluster.logs(f"worker:{index}"))
        assert done and int(done[1]) == index, cluster.logs(f"worker:{index}")
        steps.append(int(done[2]))
    # A non-chief polls for the chief's initialisation every 30 s (MonitoredTrainingSession's
    # fixed wait): if the chief has reached step 40 by then, its StopAtStepHook ends it at once.
    # Each worker prints the global step its last run fetched, which may be read before that
    # run's own increment and the other worker's: at least 40 - 2 (seen: 38 and 38 under load).
    assert max(steps) >= 38, steps
    # The chief's final checkpoint: at step 40, or later by each worker's last update, which
    # may land after the step its run fetched (as above): at most one a worker, 42 (seen 41,
    # and 42 in a fresh-clone CI run under load).
    saved = [int(m[1]) for m in (re.match(r"model\.ckpt-(\d+)\.index$", f) for f in os.listdir(tmp_path)) if m]
    assert 40 <= max(saved) <= 40 + 2, (sorted(os.listdir(tmp_path)), steps)


def test_a_two_worker_multi_worker_mirrored_program_gives_both_workers_identical_losses(run_programs):
    cluster = run_programs(PROGRAMS / "mwms_custom_loop.py", "6", workers=2, timeout=120)
    assert cluster.wait(timeout=240) == {"worker:0": 0, "worker:1": 0}
    losses = [re.findall(r"^step (\d+) loss (\S+)$", cluster.logs(f"worker:{i}"), re.M) for i in (0, 1)]
    assert len(losses[0]) == 6 and losses[0] == losses[1]
    assert float(losses[0][-1][1]) < float(losses[0][0][1])  # and it learns


def test_a_failing_program_is_a_task_error_with_its_last_stderr_lines(run_programs, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import os, sys\nprint('starting', flush=True)\n"
                      "if os.environ['DTFLAB_TASK'] == 'worker:1':\n"
                      "    raise RuntimeError('worker 1 cannot go on')\n")
    cluster = run_programs(script, workers=2)
    with pytest.raises(TaskError, match=r"^worker:1 exited with code 1: RuntimeError: worker 1 "
                                        r"cannot go on$") as raised:
        cluster.wait()
    assert "Traceback" in raised.value.log_tail
    assert cluster.wait(check=False) == {"worker:0": 0, "worker:1": 1}
    assert [t.status for t in cluster.tasks] == ["exited with code 0", "exited with code 1"]


def test_a_program_that_crashes_in_c_leaves_its_python_stack_in_the_log(run_programs, tmp_path):
    script = tmp_path / "crashes.py"
    script.write_text("import os, sys\n"
                      "def deep_inside_the_runtime():\n"
                      "    print('free(): invalid size', file=sys.stderr, flush=True)\n"
                      "    os.abort()\n"
                      "deep_inside_the_runtime()\n")
    cluster = run_programs(script, workers=1)
    with pytest.raises(TaskError, match=r"^worker:0 exited with code -6: free\(\): invalid size; "
                                        r"Fatal Python error: Aborted$") as raised:
        cluster.wait(timeout=60)
    assert 'line 4 in deep_inside_the_runtime' in cluster.logs("worker:0")


def test_kill_and_restart_a_program_task(run_programs, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text("import os, time\nprint('run', os.getpid(), flush=True)\ntime.sleep(600)\n")
    cluster = run_programs(script, workers=2)
    old = cluster.tasks[1].pid
    cluster.kill("worker:1")
    assert cluster.tasks[1].state is TaskState.KILLED and not psutil.pid_exists(old)
    cluster.restart("worker:1")
    task = cluster.tasks[1]
    assert task.state is TaskState.RUNNING and task.pid not in (None, old)
    assert wait_until(lambda: f"run {task.pid}" in cluster.logs("worker:1"))
    assert cluster.tasks[0].state is TaskState.RUNNING  # the other program never noticed
    with pytest.raises(TimeoutError, match=r"worker:0, worker:1 still running after 0.2 s"):
        cluster.wait(timeout=0.2)
    cluster.kill("worker:0")
    cluster.kill("worker:1")
    with pytest.raises(TaskError, match=r"^worker:0 was killed"):
        cluster.wait()


CONVERTS = """import glob, os, tempfile, time
import tensorflow as tf

@tf.function
def absolute(x):
    if x > 0:
        return x
    return -x

absolute(tf.constant(-1.0))  # AutoGraph converts it, through a file in the temporary folder
folder = tempfile.gettempdir()
print("TMP", folder, len(glob.glob(os.path.join(folder, "__autograph_generated_file*"))),
      flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_killed_programs_autograph_files_go_with_its_cluster(run_programs, tmp_path,
                                                               start_method):
    # AutoGraph removes its files only at a clean exit: each killed task left them in /tmp
    script = tmp_path / "converts.py"
    script.write_text(CONVERTS)
    cluster = run_programs(script, workers=1, start_method=start_method)
    assert wait_until(lambda: "TMP " in cluster.logs("worker:0"), timeout=120), \
        cluster.logs("worker:0")
    folder, files = cluster.logs("worker:0").split("TMP ")[1].split()[:2]
    assert Path(folder).is_dir() and Path(folder) != Path(tempfile.gettempdir())
    assert int(files) >= 1
    cluster.kill("worker:0")
    assert any(Path(folder).glob("__autograph_generated_file*"))  # the kill left them
    cluster.stop()
    assert not Path(folder).exists()


def test_dtflab_run_prefixes_lines_and_exits_1_when_a_program_fails(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import os, sys\nprint('hello from', os.environ['DTFLAB_TASK'])\n"
                      "sys.exit(3 if os.environ['DTFLAB_TASK'] == 'worker:1' else 0)\n")
    out = subprocess.run(DTFLAB + ["run", "--workers", "2", str(script)], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert re.search(r"^\[worker:0\] +hello from worker:0$", out.stdout, re.M)
    assert re.search(r"^\[worker:1\] +hello from worker:1$", out.stdout, re.M)
    assert "dtflab: worker:1 exited with code 3" in out.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_dtflab_run_stops_everything_on_ctrl_c_or_sigterm(tmp_path, signum):
    script = tmp_path / "forever.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    process = subprocess.Popen(DTFLAB + ["run", "--workers", "2", "--ps", "1", str(script)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while len([line for line in lines if "] up" in line]) < 2:
            lines.append(process.stdout.readline())
            assert lines[-1], f"dtflab run ended early: {lines} {process.stderr.read()}"
        descendants = psutil.Process(process.pid).children(recursive=True)
        assert len(descendants) == 6  # gate, its helper, fork server, ps:0, two programs
        process.send_signal(signum)
        assert process.wait(timeout=20) == 130
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
        process.stderr.close()
    assert wait_until(lambda: not any(psutil.pid_exists(p.pid) for p in descendants), timeout=5)


def test_dtf_run_cell_magic_shows_each_workers_output_labelled(ip, capsys):
    ip.run_cell_magic("dtf_run", "--workers 2 --ps 1 --name finished",
                      "import json, os\nprint('task', json.loads(os.environ['TF_CONFIG'])['task'])\n")
    out = capsys.readouterr().out
    assert re.search(r"^\[worker:0\] +task \{'type': 'worker', 'index': 0\}$", out, re.M), out
    assert re.search(r"^\[worker:1\] +task \{'type': 'worker', 'index': 1\}$", out, re.M), out
    assert ip.user_ns["finished"].stopped


def test_dtf_cluster_run_binds_the_cluster_and_wait_reports_exit_codes(ip, capsys, tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('ok')\n")
    ip.run_line_magic("dtf_cluster", f"run --workers 2 {script}")
    assert ip.user_ns["cluster"].programs["worker"].name == "ok.py"
    ip.run_line_magic("dtf_cluster", "wait")
    assert "worker:0: exit code 0, worker:1: exit code 0" in capsys.readouterr().out


@pytest.mark.parametrize("delay", [0.3, 0.6, 1.0, 1.5, 2.5, 4.0])  # main() runs from ~0.08 s
def test_dtflab_server_never_loses_an_early_ctrl_c(delay):
    import time

    from conftest import free_ports

    (port,) = free_ports(1)
    process = subprocess.Popen(DTFLAB + ["server", "--cluster_spec", f"worker|localhost:{port}",
                                         "--job_name", "worker"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    try:
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert process.stdout.read().strip().endswith("worker:0 stopped")
    process.stdout.close()
    process.stderr.close()


def test_dtflab_server_stops_cleanly_on_sigterm():
    from conftest import free_ports

    (port,) = free_ports(1)
    process = subprocess.Popen(DTFLAB + ["server", "--cluster_spec", f"worker|localhost:{port}",
                                         "--job_name", "worker"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "serving" in process.stdout.readline()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert process.stdout.read().strip() == "dtflab server: worker:0 stopped"
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
        process.stderr.close()


def test_a_port_let_back_out_again_reaches_its_new_listener(run_programs, tmp_path):
    # train.all_reduce lets its workers reach an ephemeral port of this process; the OS may hand
    # the same number to a later run, which must get through too.
    script = tmp_path / "calls_back.py"
    script.write_text("import socket, sys\n"
                      "with socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=10) as s:\n"
                      "    s.sendall(b'hello from the task')\n")
    first = socket.create_server(("127.0.0.1", 0))
    port = first.getsockname()[1]
    (tmp_path / "idle.py").write_text("")
    cluster = run_programs(tmp_path / "idle.py", workers=1)
    cluster.let_tasks_reach(port)
    first.close()
    with socket.socket() as second:
        second.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        second.bind(("127.0.0.1", port))
        second.listen()
        cluster.let_tasks_reach(port)
        caller = run_programs(script, str(port), workers=1)
        second.settimeout(30)
        connection, _ = second.accept()
        with connection:
            assert connection.recv(100) == b"hello from the task"
        assert caller.wait(timeout=30) == {"worker:0": 0}


def test_a_spawned_program_gets_exactly_its_own_arguments(run_programs, tmp_path):
    # The launcher appends --netns and --ready_fd after the script's arguments; the script
    # must not see them (all_reduce(start_method="spawn") failed on "--netns").
    script = tmp_path / "argv.py"
    script.write_text("import json, sys\nprint(json.dumps(sys.argv[1:]), flush=True)\n")
    cluster = run_programs(script, "--steps=3", "plain", workers=1, start_method="spawn")
    assert cluster.start_method == "spawn"
    assert cluster.wait(timeout=120) == {"worker:0": 0}
    assert json.loads(cluster.logs("worker:0").strip().splitlines()[-1]) == ["--steps=3", "plain"]


TRAINER_FLAGS = ["--ps_hosts={ps_hosts}", "--worker_hosts={worker_hosts}", "--job_name={job_name}",
                 "--task_index={task_index}", "--last_step=20"]
OPENED = re.compile(r"worker 1: worker 0 has exited; opening my session at (\d+\.\d+)")


def test_dtflab_run_ends_a_worker_waiting_for_an_exited_chief_with_one_line_naming_the_fix(tmp_path):
    # TensorFlow's how-to trainer (no device_filters), the race forced: worker:1 opens its
    # session only once worker:0 has finished and exited, and would then wait for it for ever.
    env = dict(os.environ, DTFLAB_LATE_WORKER="1")
    process = subprocess.Popen(DTFLAB + ["run", "--ps", "1", "--workers", "2",
                                         str(PROGRAMS / "howto_trainer.py"), *TRAINER_FLAGS],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               cwd=tmp_path)
    descendants = []
    try:
        lines = []
        while not (opened := OPENED.search("".join(lines[-1:]))):
            lines.append(process.stdout.readline())
            assert lines[-1], f"dtflab run ended early: {lines} {process.stderr.read()}"
            if len(descendants) < 6:
                descendants = psutil.Process(process.pid).children(recursive=True)
        assert len(descendants) == 6  # gate, its helper, fork server, ps:0, two programs
        assert process.wait(timeout=60) == 1  # stopped: it would wait for ever
        out, err = process.communicate()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert opened  # the race forced: worker:1 opened its session after worker:0 exited
    assert err.splitlines() == [
        "dtflab: error: worker:1 waits for worker:0, which exited with code 0: it would wait for "
        "ever, so it was stopped; give each session device_filters so a worker waits only for "
        "the ps and itself, e.g. tf.compat.v1.ConfigProto(device_filters=['/job:ps', "
        "'/job:worker/task:1'])"], err
    assert "I0000" not in out  # TensorFlow's INFO lines stay in the logs
    assert wait_until(lambda: not any(psutil.pid_exists(p.pid) for p in descendants), timeout=5)


def test_wait_stops_a_program_waiting_for_an_exited_task_and_names_both(run_programs, monkeypatch):
    from dtflab.errors import WaitForEndedTaskError

    monkeypatch.setenv("DTFLAB_LATE_WORKER", "1")
    cluster = run_programs(PROGRAMS / "howto_trainer.py", *TRAINER_FLAGS, workers=2, ps=1,
                           timeout=120)
    waiter = cluster.tasks[2].pid
    with pytest.raises(WaitForEndedTaskError, match=r"^worker:1 waits for worker:0, which exited "
                       r"with code 0: .* device_filters .*'/job:worker/task:1'\]\)$") as raised:
        cluster.wait(timeout=240)
    assert OPENED.search(cluster.logs("worker:1"))  # the race forced, as in the test above
    assert "CreateSession still waiting for response from worker: /job:worker/replica:0/task:0" \
        in raised.value.log_tail
    assert [t.status for t in cluster.tasks] == ["running", "exited with code 0", "killed"]
    assert not psutil.pid_exists(waiter) or psutil.Process(waiter).status() == psutil.STATUS_ZOMBIE


def test_dtflab_run_still_ends_a_trainer_with_device_filters_with_exit_0(tmp_path):
    out = subprocess.run(DTFLAB + ["run", "--ps", "1", "--workers", "2",
                                   str(PROGRAMS / "between_graph_trainer.py"), *TRAINER_FLAGS],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "dtflab: 2 of 2 programs exited with code 0" in out.stdout
    assert re.search(r"^\[worker:1\] +worker 1 done at global step \d+$", out.stdout, re.M)


def test_client_host_stands_for_where_the_task_reaches_this_machine(tmp_path):
    from dtflab.cluster.programs import Program

    script = tmp_path / "report.py"
    script.write_text("")
    program = Program.checked(script, ["--report={client_host}:7000", "--job={job_name}"])
    assert program.uses("client_host") and not Program.checked(script, ["{job_name}"]).uses("client_host")
    addresses = {"worker": ["10.0.0.2:2222"]}
    assert program.arguments(addresses, "worker", 0) == ["--report=127.0.0.1:7000", "--job=worker"]
    assert program.arguments(addresses, "worker", 0, client_host="10.0.0.1") == [
        "--report=10.0.0.1:7000", "--job=worker"]
