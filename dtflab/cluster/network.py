"""Keep a local cluster off the network: its task servers live in a private network namespace.

TensorFlow's gRPC server listens on ``0.0.0.0`` (hard-coded) and runs any graph it is sent,
unauthenticated. The local backend therefore starts a *gate* process (``python -m
dtflab.cluster.network``) that

1. binds ``127.0.0.1:<port>`` on this machine for every task port: the cluster's only doors;
2. moves itself into a new user and network namespace (``unshare(CLONE_NEWUSER|CLONE_NEWNET)``,
   no root needed), whose only interface is a loopback of its own;
3. forwards each connection accepted at a door to the same port on that private loopback.

Each task server joins the gate's namespaces (``setns``) before it starts, so its ``0.0.0.0``
is the private loopback: tasks reach each other there directly, and this machine reaches them
through the gate on 127.0.0.1; no other host can reach them at all.

Cannot: where the kernel or a container's seccomp profile forbids unprivileged user
namespaces (Docker's default profile, some hubs), the gate reports why and the cluster runs on
the host network, showing the addresses other hosts can reach. Only IPv4 loopback is forwarded:
clients must use ``localhost``/``127.0.0.1`` (the addresses the cluster spec names).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import struct
import sys
import threading

EXIT_PORT_IN_USE = 75
EXIT_UNAVAILABLE = 76
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
BUFFER = 256 * 1024

PRIVATE, HOST = "private", "host"
NETWORKS = (PRIVATE, HOST)


# -- used by the cluster (this machine's side) ---------------------------------------------------

def outside_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback: where other hosts can reach it."""
    import psutil

    found = []
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                found.append(address.address)
    return sorted(set(found))


def check_network(network) -> str:
    if network not in NETWORKS:
        raise ValueError(f"unknown network {network!r}; choose 'private' (task servers reachable "
                         f"only from this machine, the default) or 'host' (reachable from other hosts)")
    return network


# -- used by each task server ----------------------------------------------------------------------

def join(gate_pid: int) -> None:
    """Move this process into the gate's namespaces. Must run before any thread starts."""
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, flag in (("user", CLONE_NEWUSER), ("net", CLONE_NEWNET)):
        fd = os.open(f"/proc/{gate_pid}/ns/{kind}", os.O_RDONLY)
        try:
            if libc.setns(fd, flag) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"cannot join the cluster's private {kind} namespace "
                                    f"(gate pid {gate_pid}): {os.strerror(code)}")
        finally:
            os.close(fd)


# -- the gate process --------------------------------------------------------------------------------

def _private_namespace() -> None:
    """unshare a user + network namespace, map our ids, and bring its loopback up."""
    uid, gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare(CLONE_NEWUSER|CLONE_NEWNET) failed: {os.strerror(code)}")
    with contextlib.suppress(FileNotFoundError):
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def _pump(source: socket.socket, sink: socket.socket) -> None:
    buffer = bytearray(BUFFER)
    view = memoryview(buffer)
    try:
        while n := source.recv_into(buffer):
            sink.sendall(view[:n])
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _forward(client: socket.socket, port: int) -> None:
    # Created after unshare, so this socket lives in the private namespace.
    try:
        inside = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        client.close()  # the task is not listening (yet, or any more): the client retries
        return
    inside.settimeout(None)
    for sock in (client, inside):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_pump, args=(inside, client), daemon=True)
    back.start()
    _pump(client, inside)
    back.join()
    client.close()
    inside.close()


def _serve_door(door: socket.socket, port: int) -> None:
    while True:
        client, _ = door.accept()
        threading.Thread(target=_forward, args=(client, port), daemon=True,
                         name=f"dtflab-gate-{port}").start()


def gate(ports: list[int], ready) -> int:
    doors = []
    for port in ports:
        door = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        door.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            door.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                ready.write(f"port-in-use {port}\n")
                return EXIT_PORT_IN_USE
            raise
        door.listen(64)
        doors.append(door)
    try:
        _private_namespace()
    except OSError as exc:
        ready.write(f"unavailable {exc.strerror or exc}\n")
        return EXIT_UNAVAILABLE
    from dtflab.cluster.server import exit_with_parent

    exit_with_parent()
    for door, port in zip(doors, ports):
        threading.Thread(target=_serve_door, args=(door, port), daemon=True).start()
    ready.write(f"ready {os.getpid()}\n")
    ready.close()
    threading.Event().wait()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dtflab.cluster.network")
    parser.add_argument("--ports", required=True, help="comma-separated ports to forward")
    parser.add_argument("--ready_fd", type=int, required=True)
    args = parser.parse_args(argv)
    ready = os.fdopen(args.ready_fd, "w", buffering=1)
    code = gate([int(p) for p in args.ports.split(",") if p], ready)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the stdin watcher holds stdin's lock


if __name__ == "__main__":
    sys.exit(main())
