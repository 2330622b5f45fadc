"""Choose free TCP ports at run time, below the machine's ephemeral range.

The ephemeral range is where the kernel takes the local port of every outgoing connection
(and a ``bind`` to port 0 its port). A port probed there is free when probed, but any
connection made before the task binds it can take it: a worker program binds its port only
when its server starts, and under a test run's load one did not (``Could not start gRPC
server``). Ports below the range are taken only by programs that bind them, so they are drawn
there, at random and probed, as Google's portpicker (TensorFlow's tests) draws from 15000-24999
first; where the range leaves too few, the kernel chooses (port 0) as before.
"""

from __future__ import annotations

import collections
import contextlib
import random
import socket
from pathlib import Path

from dtflab.spec import Jobs

#: The lowest port drawn: above the ports services commonly listen on (Jupyter 8888, Dask
#: 8786-8787, TensorBoard 6006), as portpicker's 15000.
LOWEST = 15000
#: Linux's file, and its default where it cannot be read (macOS and Windows start theirs at
#: 49152, above it).
EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
EPHEMERAL_DEFAULT = (32768, 60999)
#: Random ports tried per port wanted before the kernel chooses.
TRIES = 20
#: Drawn from the operating system's randomness: a process seeded by its user (``random.seed``)
#: or forked from another would otherwise draw the same ports as its siblings.
_DRAW = random.SystemRandom()
#: The ports this process handed out last, never drawn again while they are here: a port handed
#: out is free until its user binds it, which may be long after (a DTensor client binds its
#: port when a cell initialises it; the workers' controller binds some of its pool late), and
#: this process's next draw must not give it to another.
HANDED_OUT: collections.OrderedDict[int, None] = collections.OrderedDict()
REMEMBERED = 4096


def ephemeral_range() -> tuple[int, int]:
    """The first and last port of this machine's ephemeral range."""
    try:
        first, last = map(int, EPHEMERAL_FILE.read_text().split())
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT
    return first, last


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free right now on every interface, below the ephemeral range
    where it leaves room (``LOWEST`` up to it), else chosen by the kernel; none that this
    process handed out lately (``HANDED_OUT``)."""
    first, _ = ephemeral_range()
    candidates = _DRAW.sample(range(LOWEST, first), min(n * TRIES, max(first - LOWEST, 0)))
    probes = []
    try:
        for port in candidates:
            if len(probes) == n:
                break
            if port in HANDED_OUT:
                continue
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                probe.bind(("", port))
            except OSError:  # in use (or in TIME_WAIT): draw another
                probe.close()
                continue
            probes.append(probe)
        while len(probes) < n:
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probes.append(probe)
            probe.bind(("", 0))
        ports = [probe.getsockname()[1] for probe in probes]
        for port in ports:
            HANDED_OUT[port] = None
            HANDED_OUT.move_to_end(port)
        while len(HANDED_OUT) > REMEMBERED:
            HANDED_OUT.popitem(last=False)
        return ports
    finally:
        for probe in probes:
            with contextlib.suppress(OSError):
                probe.close()


def choose_ports(jobs: Jobs) -> dict[str, list[str]]:
    """Resolve every ``(host, None)`` in ``jobs`` to ``host:port`` with a port free right now.

    Ports are probed on all interfaces, as TensorFlow's gRPC server binds ``0.0.0.0``. All probe
    sockets stay open until every port is chosen, so no two tasks get the same port. Another
    program can still take a port before the task binds it; the caller retries on that.
    """
    missing = sum(port is None for tasks in jobs.values() for _, port in tasks)
    chosen = iter(free_ports(missing))
    return {job: [f"{host}:{port if port is not None else next(chosen)}" for host, port in tasks]
            for job, tasks in jobs.items()}
