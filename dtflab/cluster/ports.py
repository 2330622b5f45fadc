"""Choose free TCP ports at run time (never a fixed range)."""

from __future__ import annotations

import contextlib
import socket

from dtflab.spec import Layout


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free right now on every interface."""
    probes = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for probe in probes:
            probe.bind(("", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            with contextlib.suppress(OSError):
                probe.close()


def choose_ports(layout: Layout) -> dict[str, list[str]]:
    """Resolve every ``(host, None)`` in ``layout`` to ``host:port`` with a port free right now.

    Ports are probed on all interfaces, as TensorFlow's gRPC server binds ``0.0.0.0``. All probe
    sockets stay open until every port is chosen, so no two tasks get the same port. Another
    program can still take a port before the task binds it; the caller retries on that.
    """
    missing = sum(port is None for tasks in layout.values() for _, port in tasks)
    chosen = iter(free_ports(missing))
    return {job: [f"{host}:{port if port is not None else next(chosen)}" for host, port in tasks]
            for job, tasks in layout.items()}
