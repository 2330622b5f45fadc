"""Choose free TCP ports at run time (never a fixed range)."""

from __future__ import annotations

import contextlib
import socket

from dtflab.cluster.spec import Layout


def choose_ports(layout: Layout) -> dict[str, list[str]]:
    """Resolve every ``(host, None)`` in ``layout`` to ``host:port`` with a port free right now.

    Ports are probed on all interfaces, as TensorFlow's gRPC server binds ``0.0.0.0``. All probe
    sockets stay open until every port is chosen, so no two tasks get the same port. Another
    program can still take a port before the task binds it; the caller retries on that.
    """
    probes: list[socket.socket] = []
    try:
        addresses: dict[str, list[str]] = {}
        for job, tasks in layout.items():
            addresses[job] = []
            for host, port in tasks:
                if port is None:
                    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    probes.append(probe)
                    probe.bind(("", 0))
                    port = probe.getsockname()[1]
                addresses[job].append(f"{host}:{port}")
        return addresses
    finally:
        for probe in probes:
            with contextlib.suppress(OSError):
                probe.close()
