"""Nobody in: another host cannot reach a local cluster; a cluster it can reach says so.

The other host is a network namespace this module creates (``ip netns add``), joined to this
machine by a veth pair: from inside it, this machine is ``HOST_IP``. Creating it needs root
(CAP_NET_ADMIN) and iproute2; ``.ci/run`` runs as root and installs iproute2. Only this
machine's own addresses and the test's own namespace are ever targeted.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys

import psutil
import pytest

from conftest import IP, not_here, run_ip, wait_until
from test_cli import DTFLAB, stop, wait_for_line

REACH = """import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
except OSError as exc:
    sys.exit(f"unreachable: {exc}")
print("reached")
"""


@pytest.fixture(scope="module")
def other_host():
    """(namespace, HOST_IP): a second host on a veth link to this machine; removed afterwards."""
    if os.geteuid() != 0 or not os.path.exists(IP):
        not_here("EXPOSURE TESTS NOT RUN: creating a test network namespace needs root and "
                    "iproute2 (`apt-get install iproute2`; .ci/run runs as root)")
    tag = secrets.token_hex(3)
    namespace, here, there = f"dtflab-{tag}", f"dth{tag}", f"dto{tag}"
    subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
    host_ip, other_ip = f"{subnet}.1", f"{subnet}.2"

    try:
        run_ip("netns", "add", namespace)
        run_ip("link", "add", here, "type", "veth", "peer", "name", there)
        run_ip("link", "set", there, "netns", namespace)
        run_ip("addr", "add", f"{host_ip}/30", "dev", here)
        run_ip("link", "set", here, "up")
        run_ip("addr", "add", f"{other_ip}/30", "dev", there, namespace=namespace)
        run_ip("link", "set", there, "up", namespace=namespace)
        run_ip("link", "set", "lo", "up", namespace=namespace)
        yield namespace, host_ip
    finally:
        subprocess.run([IP, "netns", "del", namespace], capture_output=True)  # deletes the pair
        subprocess.run([IP, "link", "del", here], capture_output=True)


def reaches(other_host, port) -> bool:
    """Whether a TCP connection from the other host to this machine's veth address succeeds."""
    namespace, host_ip = other_host
    out = subprocess.run([IP, "netns", "exec", namespace, sys.executable, "-c", REACH, host_ip,
                          str(port)], capture_output=True, text=True, timeout=30)
    return out.returncode == 0


def run_across_tasks(cluster) -> float:
    """A graph with a variable on ps:0 read by worker:0, run from this process."""
    from dtflab._quiet import import_tf

    tf = import_tf()
    with tf.Graph().as_default():
        with tf.device("/job:ps/task:0"):
            v = tf.compat.v1.Variable(tf.fill([256, 256], 0.5))
        with tf.device("/job:worker/task:0"):
            total = tf.reduce_sum(v * 2.0)
        config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=30_000)
        with tf.compat.v1.Session(cluster.target("worker", 0), config=config) as session:
            session.run(v.initializer)
            return float(session.run(total))


def test_the_other_host_reaches_what_this_machine_exposes(other_host):
    # The control: without it, "unreachable" below could mean a broken link.
    listener = socket.create_server(("0.0.0.0", 0))
    try:
        assert reaches(other_host, listener.getsockname()[1])
    finally:
        listener.close()


def test_the_address_toward_another_host_is_this_machines_end_of_the_route(other_host):
    from dtflab.network.networks import address_toward

    _, host_ip = other_host
    assert address_toward(host_ip.rsplit(".", 1)[0] + ".2") == host_ip  # the veth, not eth0
    assert address_toward("localhost") == "127.0.0.1"


def test_no_route_to_a_host_is_an_error_naming_it():
    from dtflab.errors import DtflabError
    from dtflab.network.networks import address_toward

    with pytest.raises(DtflabError, match=r"no IPv4 route to no-such-host\.invalid \(.+\), so a "
                                          r"task there cannot call it back"):
        address_toward("no-such-host.invalid")


def test_one_address_for_this_machine_in_a_cluster_spec_or_an_error_naming_both():
    from dtflab.errors import DtflabError
    from dtflab.network.networks import one_address

    assert one_address(["127.0.0.1", "127.0.0.1"]) == "127.0.0.1"
    # A task on this machine reaches the outside address too (TensorFlow binds 0.0.0.0).
    assert one_address(["127.0.0.1", "10.1.2.3", "10.1.2.3"]) == "10.1.2.3"
    with pytest.raises(DtflabError, match=r"^the tasks reach this machine at 10\.1\.2\.3 and "
                                          r"192\.168\.0\.7, but a cluster spec names one address "
                                          r"for it; run the tasks on hosts of one network$"):
        one_address(["192.168.0.7", "10.1.2.3"])


def test_a_local_cluster_is_out_of_reach_of_other_hosts_and_works_here(other_host, start_cluster):
    cluster = start_cluster(3)
    assert cluster.exposed == []
    ports = cluster.ports
    assert len(ports) == 6  # three tasks, three profiler servers
    assert not any(reaches(other_host, port) for port in ports)
    assert run_across_tasks(cluster) == 256 * 256
    # The tasks listen inside their own namespace: nothing of theirs is on this machine's
    # interfaces, only the gate on 127.0.0.1.
    task_pids = {task.pid for task in cluster.tasks}
    listening = [c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN
                 and c.laddr.port in ports]
    assert {c.laddr.ip for c in listening} == {"127.0.0.1"}
    assert not {c.pid for c in listening} & task_pids
    from dtflab.ui.panel import render_html

    assert "Reachable from other hosts" not in render_html(cluster)


def test_inside_the_private_network_tasks_connect_from_ports_this_machine_never_hands_out(
        start_cluster):
    # dtflab asks this machine for the free ports its task servers listen on; the tasks' own
    # connections to each other take theirs from the private namespace's range, kept apart, so
    # a task never finds its port held by another task's connection.
    from dtflab.network.netns import PORT_RANGE, private_port_range

    with open(PORT_RANGE) as f:
        low, high = map(int, f.read().split())
    first, last = private_port_range((low, high))
    cluster = start_cluster(3)
    assert run_across_tasks(cluster) == 256 * 256
    # Every TCP connection of the namespace (/proc/PID/net/tcp and tcp6 are the process's
    # namespace's tables; gRPC's are IPv6 sockets): the end that is not a task's listening port
    # is one a process there connected from.
    rows = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{cluster.tasks[0].pid}/net/{table}") as lines:
            rows += [line.split() for line in lines.read().splitlines()[1:]]
    established = [(int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16))
                   for _, local, remote, state, *_ in rows if state == "01"]
    outgoing = [local for local, _ in established if local not in cluster.ports]
    assert outgoing, f"no connections between the tasks: {established}"
    assert all(first <= port <= last for port in outgoing), (outgoing, first, last)
    assert not any(low <= port <= high for port in outgoing)
    # Above this machine's range where there is room, else below it, else the kernel's default.
    assert private_port_range((32768, 60999)) == (61000, 65535)
    assert private_port_range((32768, 65000)) == (1024, 32767)
    assert private_port_range((1500, 65000)) is None


def test_a_host_network_cluster_is_reachable_and_names_the_addresses(other_host, start_cluster):
    _, host_ip = other_host
    cluster = start_cluster(ps=1, workers=1, network="host")
    port = cluster.endpoints["worker", 0][1]
    assert reaches(other_host, port)  # the danger is real...
    assert f"{host_ip}:{port}" in cluster.exposed  # ...and named
    assert run_across_tasks(cluster) == 256 * 256
    from dtflab.ui.panel import render_html

    html = render_html(cluster)
    assert "Reachable from other hosts" in html and f"{host_ip}:" in html


def test_an_inprocess_cluster_names_what_it_exposes(other_host, start_cluster):
    _, host_ip = other_host
    cluster = start_cluster(2, backend="inprocess")
    port = cluster.endpoints["worker", 0][1]
    assert f"{host_ip}:{port}" in cluster.exposed
    assert "inprocess backend" in cluster.exposure_reason
    assert reaches(other_host, port)


def test_the_cli_warns_on_stderr_with_the_exposed_addresses(other_host):
    _, host_ip = other_host
    process = subprocess.Popen(DTFLAB + ["cluster", "start", "1", "--network", "host"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line, _ = wait_for_line(process, r"worker:0 ")
        port = re.search(r"127\.0\.0\.1:(\d+)", line).group(1)
        warning = process.stderr.readline()
        assert warning.startswith("dtflab: WARNING: reachable from other hosts at "), warning
        assert f"{host_ip}:{port}" in warning
    finally:
        stop(process)
        process.stderr.close()


def test_the_cli_says_private_by_default():
    process = subprocess.Popen(DTFLAB + ["cluster", "start", "1"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(process, r"^network: private \(reachable from this machine's loopback only\)")
        children = psutil.Process(process.pid).children(recursive=True)
        assert len(children) == 4  # the task, the fork server it came from, the gate and its helper
    finally:
        stop(process)
        process.stderr.close()
    assert wait_until(lambda: not any(psutil.pid_exists(c.pid) for c in children), timeout=5)


REFUSED = """import json, sys, dtflab
from dtflab.errors import NotSupportedError
from dtflab.ui.panel import render_html
try:
    dtflab.start_cluster(1, network="private")
except NotSupportedError as error:
    print(json.dumps({"asked": str(error)}), flush=True)
with dtflab.start_cluster(2) as cluster:
    print(json.dumps({"exposed": cluster.exposed, "reason": cluster.exposure_reason,
                      "port": str(cluster.endpoints["worker", 0][1]),
                      "warned": "Reachable from other hosts" in render_html(cluster)}), flush=True)
    sys.stdin.readline()
"""


def test_where_the_os_refuses_a_private_network_the_cluster_says_so(other_host):
    # A real refusal: in a user namespace whose limit of nested user namespaces is 0, the
    # gate's unshare() fails with ENOSPC, as it fails on hosts that switch them off.
    _, host_ip = other_host
    refuse = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" -c "$1"'
    owner = subprocess.Popen(["unshare", "--user", "--map-root-user", "sh", "-c", refuse,
                              sys.executable, REFUSED], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        asked = json.loads(owner.stdout.readline())["asked"]
        assert asked.startswith("no private network for this cluster: this machine refused a "
                                "private network namespace (unshare(CLONE_NEWUSER|CLONE_NEWNET) "
                                "failed: No space left on device); start it with network='host'"), asked
        report = json.loads(owner.stdout.readline())
        assert report["reason"].startswith("this machine refused a private network namespace")
        assert f"{host_ip}:{report['port']}" in report["exposed"] and report["warned"]
        assert reaches(other_host, int(report["port"]))  # the warning tells the truth
    finally:
        owner.stdin.close()
        assert owner.wait(timeout=60) == 0, owner.stderr.read()[-2000:]
        owner.stdout.close()
        owner.stderr.close()


def test_a_private_network_asked_of_another_backend_is_refused():
    import dtflab

    with pytest.raises(ValueError, match=r"the inprocess backend cannot keep its task servers on a "
                                         r"private network; use backend 'local'"):
        dtflab.start_cluster(2, backend="inprocess", network="private")
    with pytest.raises(ValueError, match=r"unknown network 'lan'; choose 'private'"):
        dtflab.start_cluster(2, network="lan")


def test_a_gate_port_taken_meanwhile_is_chosen_again(start_cluster, monkeypatch):
    # A port taken on 127.0.0.1 between choosing and the gate binding it: chosen again.
    import dtflab.cluster.base as base
    from dtflab.spec import parse_address

    taken = []
    real_choose = base.choose_ports

    def choose_then_take(layout):
        addresses = real_choose(layout)
        if not taken:
            port = parse_address(addresses["ps"][0])[1]
            taken.append(socket.create_server(("127.0.0.1", port)))
        return addresses

    monkeypatch.setattr(base, "choose_ports", choose_then_take)
    try:
        cluster = start_cluster(2)
        held = taken[0].getsockname()[1]
        assert held not in cluster.ports
        assert cluster.exposed == []
    finally:
        for sock in taken:
            sock.close()
