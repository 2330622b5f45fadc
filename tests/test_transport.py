"""Bytes on the wire counted at the transport (``dtflab.network.transport``): what a process
sent on its own connections, each byte once; the right pair of tasks when two connections share
a local port; what the kernel sent again, apart. The namespaces here are each test's own."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

from conftest import not_here


def test_a_process_counts_the_bytes_it_sends_on_its_own_connections():
    import dtflab

    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as ours:
        theirs, _ = server.accept()
        with theirs:
            before = dtflab.bytes_sent()
            ours.sendall(b"x" * 300_000)
            theirs.sendall(b"y" * 1_000)  # sent by this process too: both ends are ours
            received = 0
            while received < 300_000:
                received += len(theirs.recv(1 << 16))
            assert dtflab.bytes_sent() - before == 301_000


#: Two processes in a network namespace of their own whose one ephemeral port makes Linux give
#: both outgoing connections the same local address (it shares a local port among connections
#: to different places). Each connects to the other's listener; a sends 30,000 bytes on the
#: connection b opened, b 20,000 on the one a opened. Prints both pids, then waits for stdin.
SHARED_LOCAL_PORT = """import os, socket, subprocess, sys
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
listeners = [socket.create_server(("127.0.0.1", port)) for port in (40001, 40002)]
with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
    f.write("61000 61000")
mine, theirs = (listeners[0], 40002) if os.fork() else (listeners[1], 40001)
out = socket.create_connection(("127.0.0.1", theirs))
accepted, _ = mine.accept()
accepted.sendall(b"x" * (30_000 if theirs == 40002 else 20_000))
os.write(1, f"{os.getpid()} {out.getsockname()[1]}\\n".encode())  # one write: lines never mix
sys.stdin.read()
"""


def test_bytes_between_tasks_go_to_the_right_pair_when_two_connections_share_a_local_port():
    from dtflab.network.transport import snapshot

    if os.geteuid() != 0:
        not_here("SHARED-PORT TEST NOT RUN: a network namespace of its own needs root")
    both = subprocess.Popen(["unshare", "-n", sys.executable, "-c", SHARED_LOCAL_PORT],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        lines = [both.stdout.readline().split() for _ in range(2)]
        assert {port for _, port in lines} == {"61000"}  # the one local address of both
        a, b = sorted(lines, key=lambda line: line[0] != str(both.pid))  # a: the parent
        sent = snapshot({"a": int(a[0]), "b": int(b[0])}).sent
        assert sent["a", "b"] == 30_000 and sent["b", "a"] == 20_000, sent
    finally:
        both.stdin.close()
        both.wait(timeout=10)
        both.stdout.close()


#: A network namespace of its own whose firewall drops one packet in four arriving at one port: the
#: client sends 2,000,000 bytes there, so the kernel sends some again. Prints the bytes the
#: process counted, then the retransmitted ones.
LOSSY_LINK = """import os, socket, subprocess
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
server = socket.create_server(("127.0.0.1", 0))
port = server.getsockname()[1]
ours = socket.create_connection(("127.0.0.1", port))
theirs, _ = server.accept()
for rule in (["add", "table", "inet", "lossy"],
             ["add", "chain", "inet", "lossy", "in", "{ type filter hook input priority 0; }"],
             ["add", "rule", "inet", "lossy", "in", "tcp", "dport", str(port),
              "numgen", "random", "mod", "4", "0", "drop"]):
    subprocess.run(["nft", *rule], check=True)
from dtflab.network.transport import bytes_sent, task_flows
before = bytes_sent()
ours.sendall(b"x" * 2_000_000)
received = 0
while received < 2_000_000:
    received += len(theirs.recv(1 << 16))
ends = [flow for flow in task_flows("here", os.getpid()) if flow.peer[1] == port]
print(bytes_sent() - before, sum(flow.retransmitted for flow in ends))
"""


def test_bytes_the_kernel_sent_again_are_counted_apart_from_what_the_program_sent():
    if os.geteuid() != 0 or shutil.which("nft") is None:
        not_here("LOSSY-LINK TEST NOT RUN: it needs root (a network namespace of its own) and "
                 "nftables' nft (apt-get install nftables)")
    done = subprocess.run(["unshare", "-n", sys.executable, "-c", LOSSY_LINK],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    sent, again = map(int, done.stdout.split())
    assert again > 0  # the firewall dropped some: the kernel sent them again
    assert sent == 2_000_000


def test_wire_bytes_per_step_leave_out_a_step_the_watchdog_ran_again(monkeypatch):
    """Step 5 stalls and runs again on a new session, so its 100 bytes cross twice: counted
    over the window, that step would read as 200 (a real one: ``test_tensor_parallel.py``)."""
    from types import SimpleNamespace

    from dtflab import train
    from dtflab.network import transport

    total = {"sent": 0}
    monkeypatch.setattr(transport, "cluster_snapshot", lambda cluster: transport.WireSnapshot(
        {("worker:0", "worker:1"): total["sent"]}))
    history = SimpleNamespace(cluster="a cluster", stalls=[])
    wire = train.WireBytes(after_step=2, steps=6)
    wire.on_run_start(history)
    for step in range(12):
        total["sent"] += 100
        if step == 5:
            total["sent"] += 100
            history.stalls.append("the run stalled at step 5; recovered")
        wire.on_step(history, SimpleNamespace(step=step))
    wire.on_run_end(history)
    assert wire.per_step.sent == {("worker:0", "worker:1"): 100}
    assert wire.skipped == 1
    # a run that ends inside the window is counted over the steps it had
    short = train.WireBytes(after_step=2, steps=6)
    short.on_run_start(history)
    for step in range(12, 16):
        total["sent"] += 100
        short.on_step(history, SimpleNamespace(step=step))
    short.on_run_end(history)
    assert short.per_step.sent == {("worker:0", "worker:1"): 100} and short.skipped == 0
