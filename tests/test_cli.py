"""The `dtflab` command: the 2016 server flags with a client in another process, and `cluster start`."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import free_ports, wait_until

pytestmark = pytest.mark.slow

DTFLAB = [sys.executable, "-m", "dtflab.cli"]

# The source material's first check, as a plain tf.compat.v1 client in its own process.
HELLO_CLIENT = """
import sys, tensorflow as tf
tf.compat.v1.disable_eager_execution()
with tf.device(sys.argv[2]):
    hello = tf.constant("Hello, distributed TensorFlow!")
config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=30000)
with tf.compat.v1.Session(sys.argv[1], config=config) as session:
    print(session.run(hello).decode())
"""


def wait_for_line(process, pattern, limit=200):
    lines = []
    for _ in range(limit):
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if re.search(pattern, line):
            return line, lines
    raise AssertionError(f"{pattern!r} never printed; got {lines}")


def stop(process):
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout:
        process.stdout.close()


def test_server_with_the_2016_flags_serves_a_client_in_another_process():
    master, ps = free_ports(2)
    spec = f"master|localhost:{master},ps|localhost:{ps}"
    servers = [subprocess.Popen(DTFLAB + ["server", "--cluster_spec", spec, "--job_name", job,
                                          "--task_index", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for job in ("master", "ps")]
    try:
        for server, job, port in zip(servers, ("master", "ps"), (master, ps)):
            line, _ = wait_for_line(server, r"serving")
            assert line.strip().startswith(f"dtflab server: {job}:0 serving grpc://localhost:{port}")
        client = subprocess.run([sys.executable, "-c", HELLO_CLIENT, f"grpc://localhost:{master}",
                                 "/job:ps/task:0"], capture_output=True, text=True, timeout=120)
        assert client.returncode == 0, client.stderr[-2000:]
        assert client.stdout.strip() == "Hello, distributed TensorFlow!"
    finally:
        for server in servers:
            server.send_signal(signal.SIGINT)
        codes = [server.wait(timeout=10) for server in servers]
        stderr = [server.stderr.read() for server in servers]
        for server in servers:
            server.stdout.close()
            server.stderr.close()
    assert codes == [0, 0]
    assert all("I0000" not in err and "oneDNN" not in err for err in stderr), "TF log spam reached the terminal"
    from dtflab.network.networks import outside_addresses

    for err, port in zip(stderr, (master, ps)):  # run by hand, a server is on the host network
        named = [f"{ip}:{port}" for ip in outside_addresses()]
        assert all(address in err for address in named) and ("WARNING: reachable from other hosts" in err) == bool(named)


@pytest.mark.parametrize("argv, message", [
    (["--cluster_spec", "ps|localhost:1", "--job_name", "worker"],
     r"--job_name 'worker' is not in the cluster spec; its jobs are: ps"),
    (["--cluster_spec", "ps|localhost:1", "--job_name", "ps", "--task_index", "3"],
     r"--task_index 3 is out of range: job 'ps' has 1 task\(s\), indices 0..0"),
    (["--cluster_spec", "ps:localhost:1", "--job_name", "ps"], r"bad cluster spec entry 'ps:localhost:1'"),
    (["--cluster_spec", "ps|localhost:1", "--job_name", "ps", "--task_index", "x"],
     r"--task_index must be a whole number, got 'x'"),
])
def test_server_bad_flags_are_one_line_errors(argv, message):
    out = subprocess.run(DTFLAB + ["server"] + argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert re.search(message, out.stderr), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_cluster_start_prints_targets_and_ctrl_c_stops_everything():
    process = subprocess.Popen(DTFLAB + ["cluster", "start", "3"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        _, lines = wait_for_line(process, r"worker:1 ")
        text = "".join(lines)
        assert re.search(r"cluster spec: ps\|127\.0\.0\.1:\d+,worker\|127\.0\.0\.1:\d+,worker\|127\.0\.0\.1:\d+", text)
        targets = dict(re.findall(r"^\s+(\S+)\s+(grpc://\S+) \(pid \d+\)$", text, re.M))
        assert sorted(targets) == ["ps:0", "worker:0", "worker:1"]
        children = psutil.Process(process.pid).children(recursive=True)
        pids = {int(pid) for pid in re.findall(r"\(pid (\d+)\)", text)}
        assert len(pids) == 3 and pids < {child.pid for child in children}
        assert len(children) == 6  # and the gate to their private network, its helper, the fork server
        client = subprocess.run([sys.executable, "-c", HELLO_CLIENT, targets["worker:0"],
                                 "/job:ps/task:0"], capture_output=True, text=True, timeout=120)
        assert client.stdout.strip() == "Hello, distributed TensorFlow!", client.stderr[-2000:]
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) == 0
        rest = process.stdout.read()
        process.stdout.close()
        process.stderr.close()
    assert "dtflab: stopped" in rest
    assert wait_until(lambda: not any(psutil.pid_exists(c.pid) for c in children), timeout=5)


@pytest.mark.parametrize("argv, message", [
    (["cluster", "start", "0"], r"dtflab: error: the task count must be at least 1, got 0"),
    (["cluster", "start", "--backend", "dsak"], r"unknown backend 'dsak'"),
    (["cluster", "start", "--jobs", "a=1,a=1"], r"job 'a' is named twice"),
])
def test_cluster_start_bad_input_is_one_line_and_starts_nothing(argv, message):
    out = subprocess.run(DTFLAB + argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert re.search(message, out.stderr), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_lab_opens_jupyterlab_on_the_tutorials(tmp_path):
    import urllib.request
    import json as json_

    (port,) = free_ports(1)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    lab = subprocess.Popen(DTFLAB + ["lab", "--no-browser", f"--ServerApp.port={port}",
                                     "--IdentityProvider.token=t", "--ServerApp.ip=127.0.0.1"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listing():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token=t", timeout=2) as r:
                    return [item["name"] for item in json_.load(r)["content"]]
            except OSError:
                return None

        assert wait_until(lambda: listing() is not None, timeout=90)
        assert "00_quickstart.ipynb" in listing()
        # The browser opens the server's root, which sends it to the first tutorial, not the Launcher
        assert where_the_root_sends(port).split("?")[0].endswith("/lab/tree/00_quickstart.ipynb")
        # It serves BokehJS (dtflab.viz.bokehjs): each file the loader asks for, byte for byte
        assert_serves_bokehjs(f"http://127.0.0.1:{port}/")
    finally:
        lab.terminate()
        lab.wait(timeout=30)


def assert_serves_bokehjs(base: str) -> None:
    import urllib.error
    import urllib.request

    from bokeh.util.paths import static_path

    from dtflab.viz import bokehjs

    loader = next(iter(bokehjs.loader().values()))
    files = re.search(r"for \(const file of (\[.*?\])\)", loader).group(1)
    files = json.loads(files)
    assert "js/bokeh.min.js" in files
    for file in files:
        with urllib.request.urlopen(f"{base}{bokehjs.ROUTE}static/{file}", timeout=10) as r:
            assert r.read() == (Path(static_path()) / file).read_bytes(), file
    with pytest.raises(urllib.error.HTTPError, match="403"):  # nothing outside Bokeh's files
        urllib.request.urlopen(f"{base}{bokehjs.ROUTE}static/%2e%2e/__init__.py", timeout=10)


def where_the_root_sends(port: int) -> str:
    """The ``Location`` the lab's root answers with (the redirect not followed)."""
    import urllib.error
    import urllib.request

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    try:
        urllib.request.build_opener(Stay).open(f"http://127.0.0.1:{port}/?token=t", timeout=10)
    except urllib.error.HTTPError as answer:
        return answer.headers["Location"]
    raise AssertionError("the lab's root answered without a redirect")


def test_lab_help_says_the_other_arguments_go_to_jupyter_lab():
    done = subprocess.run(DTFLAB + ["lab", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "Every other argument goes to `jupyter lab` as it is" in text
    assert "at 00_quickstart.ipynb" in text
