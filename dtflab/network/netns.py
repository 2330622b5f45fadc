"""Linux network-namespace calls: make a private one (the gate) and join it (a task, the fork
server).

Both must run while the calling process has a single thread: the kernel refuses to move a
multi-threaded process into a user namespace. A forked child qualifies (fork copies one thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
#: The network namespace's range of ports for outgoing connections (per namespace in Linux).
PORT_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
#: The fewest ports a private range may have (a cluster's tasks hold a few hundred at most).
FEWEST_PORTS = 1024


def unshare_private() -> None:
    """Move this process into a new user + network namespace, map our ids, bring ``lo`` up, and
    give the namespace outgoing ports outside this machine's range (``private_port_range``)."""
    uid, gid = os.getuid(), os.getgid()
    outside = _port_range()
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
    inside = private_port_range(outside)
    if inside is not None:
        with contextlib.suppress(OSError):  # a kernel that refuses keeps the default range
            with open(PORT_RANGE, "w") as f:
                f.write(f"{inside[0]} {inside[1]}")


def private_port_range(outside: tuple[int, int] | None) -> tuple[int, int] | None:
    """The private namespace's ports for outgoing connections: above this machine's range
    (``outside``), or below it down to 1024 where above has fewer than ``FEWEST_PORTS``; None
    where neither has. (Above first: ports people give task servers, 2222 or 8888, are low.)

    dtflab chooses the ports its task servers listen on by asking this machine for free ones,
    which come from this machine's range. Inside the namespace, the tasks' own connections to
    each other would take ports from that same range by default, so a task could find the port
    it was given held by another task's connection (TensorFlow: "Could not start gRPC server").
    With disjoint ranges it cannot."""
    if outside is None:
        return None
    low, high = outside
    for first, last in ((high + 1, 65535), (1024, low - 1)):
        if last - first + 1 >= FEWEST_PORTS:
            return first, last
    return None


def _port_range() -> tuple[int, int] | None:
    try:
        with open(PORT_RANGE) as f:
            low, high = map(int, f.read().split())
        return low, high
    except (OSError, ValueError):
        return None


def join(gate_pid: int) -> None:
    """Move this process into the namespaces of process ``gate_pid``."""
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
