"""Bytes on the wire, counted at the transport: the kernel's own TCP counters for every socket
of every task process.

For each task, dtflab borrows a copy of each of its TCP sockets (``pidfd_getfd``, Linux 5.6+;
the tasks are this process's descendants, so no privilege is needed) and reads the kernel's
``tcp_info``: bytes sent (``tcpi_bytes_sent``, Linux 4.19+) and received. What it counts is
everything gRPC put on the socket: tensors, protobuf and HTTP/2 framing, and TensorFlow's own
heartbeats. A socket closed between two snapshots takes its bytes with it, so compare
snapshots taken while the same connections are open (a training run's steady state).

Bytes the kernel sent again (``tcpi_bytes_retrans``: segments lost, which happens on loopback
too when a starved receiver's backlog overflows) are counted apart, in ``retransmitted``:
``sent`` is what the program sent, each byte once, which is what a formula predicts. One
loopback segment is up to 64 KiB: sent again, it adds tens of per cent to a small step's bytes.
"""

from __future__ import annotations

import collections
import ctypes
import os
import socket
import struct
from dataclasses import dataclass, field

from dtflab.errors import NotSupportedError

_SYS_PIDFD_GETFD = 438  # the same number on x86-64 and arm64
_BYTES_RECEIVED, _BYTES_SENT, _BYTES_RETRANS = 128, 200, 208  # offsets in struct tcp_info
_TCP_INFO_SIZE = 232


@dataclass(frozen=True)
class Flow:
    """One TCP connection end of a task: where it points and what crossed it so far (``sent``:
    the program's bytes, each once; ``retransmitted``: what the kernel sent again)."""

    task: str
    local: tuple[str, int]
    peer: tuple[str, int]
    sent: int
    received: int
    retransmitted: int = 0


_libc = None  # loaded on first use


def task_flows(task: str, pid: int) -> list[Flow]:
    """Every connected TCP socket of process ``pid``, with its byte counters."""
    global _libc
    _libc = _libc or ctypes.CDLL(None, use_errno=True)
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return []
    flows = []
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:  # closed meanwhile
                continue
            fd = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, int(name), 0)
            if fd < 0:
                error = ctypes.get_errno()
                if error in (9, 2):  # EBADF: closed meanwhile
                    continue
                raise NotSupportedError(
                    f"cannot count bytes on {task}'s sockets: pidfd_getfd failed "
                    f"({os.strerror(error)}); it needs Linux 5.6+ and the right to trace the task")
            with socket.socket(fileno=fd) as sock:
                if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET,
                                                                          socket.AF_INET6):
                    continue
                try:
                    peer = _address(sock.getpeername())
                except OSError:  # a listening socket
                    continue
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
                if len(info) < _BYTES_SENT + 8:
                    raise NotSupportedError("cannot count bytes on sockets: this kernel's tcp_info "
                                            "lacks tcpi_bytes_sent (Linux 4.19+)")
                (received,) = struct.unpack_from("Q", info, _BYTES_RECEIVED)
                (sent,) = struct.unpack_from("Q", info, _BYTES_SENT)
                (again,) = struct.unpack_from("Q", info, _BYTES_RETRANS)
                flows.append(Flow(task, _address(sock.getsockname()), peer, sent - again,
                                  received, again))
    finally:
        os.close(pidfd)
    return flows


def _address(address) -> tuple[str, int]:
    host, port = address[0], address[1]
    return (host.removeprefix("::ffff:"), port)


@dataclass(frozen=True)
class WireSnapshot:
    """Bytes sent so far from each task to each peer (another task, or ``"other"``: this
    notebook, the gate, a Dask worker), and apart from them the bytes the kernel sent again."""

    sent: dict[tuple[str, str], int]
    retransmitted: dict[tuple[str, str], int] = field(default_factory=dict)

    def __sub__(self, earlier: "WireSnapshot") -> "WireSnapshot":
        return WireSnapshot(_minus(self.sent, earlier.sent),
                            _minus(self.retransmitted, earlier.retransmitted))

    def __add__(self, other: "WireSnapshot") -> "WireSnapshot":
        return WireSnapshot(_plus(self.sent, other.sent),
                            _plus(self.retransmitted, other.retransmitted))

    def scaled(self, factor: float) -> "WireSnapshot":
        return WireSnapshot({key: value * factor for key, value in self.sent.items()},
                            {key: value * factor for key, value in self.retransmitted.items()})

    def sent_by(self) -> dict[str, int]:
        """Bytes each task sent (to anyone)."""
        totals = collections.Counter()
        for (source, _), value in self.sent.items():
            totals[source] += value
        return dict(totals)

    def received_by(self) -> dict[str, int]:
        """Bytes each task received from the other tasks and ``other``."""
        totals = collections.Counter()
        for (_, destination), value in self.sent.items():
            totals[destination] += value
        return dict(totals)


def _minus(later: dict, earlier: dict) -> dict:
    return {key: later.get(key, 0) - earlier.get(key, 0) for key in set(later) | set(earlier)}


def _plus(one: dict, other: dict) -> dict:
    return {key: one.get(key, 0) + other.get(key, 0) for key in set(one) | set(other)}


def snapshot(pids: dict[str, int]) -> WireSnapshot:
    """Bytes sent so far between the processes ``{task: pid}`` (one call reads every socket)."""
    return sent_between([flow for task, pid in pids.items() for flow in task_flows(task, pid)])


def sent_between(flows: list[Flow]) -> WireSnapshot:
    """What ``flows`` sent, by (task, the task at the other end or ``"other"``). The other end
    of a connection is the flow with the same two addresses the other way round: a local
    address alone is not enough, since Linux gives one local port to several outgoing
    connections when they go to different places."""
    ends = {(flow.local, flow.peer): flow.task for flow in flows}
    sent, again = collections.Counter(), collections.Counter()
    received_from_other = collections.Counter()
    for flow in flows:
        peer = ends.get((flow.peer, flow.local), "other")
        sent[flow.task, peer] += flow.sent
        again[flow.task, peer] += flow.retransmitted
        if peer == "other":  # what the outside sent this task: counted at this end
            received_from_other["other", flow.task] += flow.received
    sent.update(received_from_other)
    return WireSnapshot({key: value for key, value in sent.items() if key[0] != key[1]},
                        {key: value for key, value in again.items() if value and key[0] != key[1]})


def cluster_snapshot(cluster) -> WireSnapshot:
    """:func:`snapshot` of every running task of a cluster with processes of its own, on
    this machine (a task on another host has a pid of that host)."""
    tasks = cluster.tasks
    for task in tasks:  # task.host: where a task runs that is not this process's child
        host = task.address.rsplit(":", 1)[0]
        if task.host is not None and not (host == "localhost" or host.startswith("127.")):
            raise NotSupportedError(f"counting bytes on the wire reads this machine's sockets; "
                                    f"{task.name} runs on {host}: count on a cluster of this "
                                    f"machine (--backend local)")
    pids = {task.name: task.pid for task in tasks if task.pid is not None}
    if not pids:
        raise NotSupportedError(f"counting bytes on the wire needs task processes; the "
                                f"{cluster.backend} backend has none here: use --backend local")
    return snapshot(pids)


def bytes_sent(pid: int | None = None) -> int:
    """Bytes this process (or process ``pid``, one of its descendants) has sent so far on its
    open TCP connections, counted by the kernel, each byte once (not what it sent again): for a
    program to count its own traffic, e.g. a DTensor client around its steps. Connections
    already closed are not counted."""
    return sum(flow.sent for flow in task_flows("this process", pid or os.getpid()))
