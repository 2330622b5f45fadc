"""Keep a local cluster off the network: its task servers live in a private network namespace.

TensorFlow's gRPC server listens on ``0.0.0.0`` (hard-coded) and runs any graph it is sent,
unauthenticated. The local backend therefore starts a *gate* process (``python -m
dtflab.cluster.network``) that

1. binds ``127.0.0.1:<port>`` on this machine for every task port: the cluster's only doors;
2. moves itself into a new user and network namespace (``unshare(CLONE_NEWUSER|CLONE_NEWNET)``,
   no root needed), whose only interface is a loopback of its own;
3. forwards each connection accepted at a door to the same port on that private loopback,
   and, for ports the cluster opens on request (a TF2 client's or a chief's, which the tasks
   call back), the other way: through a helper process it forked before moving, which stays
   on this machine's network and hands over connected sockets (SCM_RIGHTS).

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
import time

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
    """This machine's addresses other than loopback, where other hosts can reach it, ready to
    put before ``:port`` (IPv6 in brackets: TensorFlow's server takes both families)."""
    import psutil

    found = []
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                found.append(address.address)
            elif address.family == socket.AF_INET6 and address.address != "::1":
                found.append(f"[{address.address}]")
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


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both sides are done, then close both."""
    for sock in (a, b):
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_pump, args=(b, a), daemon=True)
    back.start()
    _pump(a, b)
    back.join()
    a.close()
    b.close()


def _accept_forever(listener: socket.socket, handle, port: int) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn, port), daemon=True,
                         name=f"dtflab-gate-{port}").start()


def _into_namespace(client: socket.socket, port: int) -> None:
    """A connection at a door on this machine: on to the task inside the namespace."""
    try:  # created after unshare, so this socket lives in the private namespace
        inside = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        client.close()  # the task is not listening (yet, or any more): the client retries
        return
    _splice(client, inside)


class _Outside:
    """A helper process left on this machine's network: it connects to 127.0.0.1:<port> here
    and hands the socket over (SCM_RIGHTS), so tasks can reach back to their client."""

    def __init__(self):
        self.channel, theirs = socket.socketpair()
        self.pid = os.fork()  # before unshare and before any thread
        if self.pid == 0:
            keep = theirs.fileno()
            os.closerange(3, keep)  # nothing of the gate's: its pipes must close with it
            os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
            self._serve(theirs)
        theirs.close()
        self._lock = threading.Lock()

    @staticmethod
    def _serve(channel: socket.socket) -> None:
        while len(request := channel.recv(2)) == 2:
            (port,) = struct.unpack("!H", request)
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                    socket.send_fds(channel, [b"1"], [conn.fileno()])
            except OSError:
                channel.sendall(b"0")
        os._exit(0)

    def connect(self, port: int) -> socket.socket | None:
        with self._lock:
            self.channel.sendall(struct.pack("!H", port))
            answer, fds, _, _ = socket.recv_fds(self.channel, 1, 1)
        return socket.socket(fileno=fds[0]) if answer == b"1" and fds else None

    def close(self) -> None:
        self.channel.close()
        os.waitpid(self.pid, 0)


def _back_out(outside: _Outside):
    def handle(inside: socket.socket, port: int) -> None:
        """A task connecting to 127.0.0.1:<port> in the namespace: on to this machine's."""
        here = outside.connect(port)
        if here is None:
            inside.close()
            return
        _splice(inside, here)
    return handle


def gate(ports: list[int], ready, commands) -> int:
    """Serve the doors; read ``reverse PORT`` lines from ``commands`` (answering ``ok PORT`` on
    ``ready``) until it closes or the parent dies, then exit."""
    outside = _Outside()
    doors = []
    for port in ports:
        door = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        door.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            door.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                ready.write(f"port-in-use {port}\n")
                outside.close()
                return EXIT_PORT_IN_USE
            raise
        door.listen(64)
        doors.append(door)
    try:
        _private_namespace()
    except OSError as exc:
        ready.write(f"unavailable {exc.strerror or exc}\n")
        outside.close()
        return EXIT_UNAVAILABLE
    parent = os.getppid()

    def watch_parent():
        while os.getppid() == parent:
            time.sleep(0.25)
        os._exit(0)  # the helper sees its channel close and exits too

    threading.Thread(target=watch_parent, daemon=True).start()
    for door, port in zip(doors, ports):
        threading.Thread(target=_accept_forever, args=(door, _into_namespace, port), daemon=True).start()
    ready.write(f"ready {os.getpid()}\n")
    for line in commands:
        word, _, port = line.strip().partition(" ")
        if word == "reverse" and port.isdigit():
            try:
                listener = socket.create_server(("127.0.0.1", int(port)))  # inside the namespace
            except OSError as exc:
                ready.write(f"failed {port} {exc.strerror}\n")
                continue
            threading.Thread(target=_accept_forever, args=(listener, _back_out(outside), int(port)),
                             daemon=True).start()
            ready.write(f"ok {port}\n")
    outside.close()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dtflab.cluster.network")
    parser.add_argument("--ports", required=True, help="comma-separated ports to forward")
    parser.add_argument("--ready_fd", type=int, required=True)
    args = parser.parse_args(argv)
    ready = os.fdopen(args.ready_fd, "w", buffering=1)
    code = gate([int(p) for p in args.ports.split(",") if p], ready, sys.stdin)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # without waiting for the daemon threads that serve connections


if __name__ == "__main__":
    sys.exit(main())
