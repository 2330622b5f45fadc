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


def unshare_private() -> None:
    """Move this process into a new user + network namespace, map our ids, bring ``lo`` up."""
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
