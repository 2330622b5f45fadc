"""Where a local cluster's tasks live: on this machine's network, or on a private one.

TensorFlow's gRPC server listens on ``0.0.0.0`` (hard-coded) and runs any graph it is sent,
unauthenticated. A ``PrivateNetwork`` keeps task servers off the network: they run in a
network namespace of their own, reachable only through doors on this machine's
``127.0.0.1`` that its gate (``dtflab.network.gate``) opens per cluster. One private network
serves every local cluster of a process, and the fork server lives inside it.

Cannot: where the kernel or a container's seccomp profile forbids unprivileged user
namespaces (Docker's default profile, some hubs), the gate reports why and the cluster runs on
the host network, showing the addresses other hosts can reach. Only IPv4 loopback is forwarded:
clients must use ``localhost``/``127.0.0.1`` (the addresses the cluster spec names).
"""

from __future__ import annotations

import atexit
import os
import socket
import threading

from dtflab import scratch
from dtflab.errors import DtflabError, NotSupportedError

PRIVATE, HOST = "private", "host"
NETWORKS = (PRIVATE, HOST)
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")


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


def address_toward(host: str) -> str:
    """This machine's IPv4 address on the interface that routes to ``host``: where a process
    on ``host`` reaches this one (``127.0.0.1`` for this machine's loopback). Routes are taken
    to be symmetric, as on one LAN; nothing is sent (a UDP socket's connect only asks the kernel
    for the route)."""
    try:
        target = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(target)
            return probe.getsockname()[0]
    except OSError as exc:
        raise DtflabError(f"this machine has no IPv4 route to {host} ({exc.strerror or exc}), so "
                          f"a task there cannot call it back; check that the host's name "
                          f"resolves and that this machine reaches it") from None


def one_address(hosts) -> str:
    """The one address (of ``address_toward`` each task's host) at which every task reaches this
    machine: 127.0.0.1 where all are on it; a task on this machine reaches the outside one too."""
    outside = sorted({host for host in hosts if host not in LOOPBACK_HOSTS})
    if len(outside) > 1:
        raise DtflabError(f"the tasks reach this machine at {' and '.join(outside)}, but a cluster "
                          f"spec names one address for it; run the tasks on hosts of one network")
    return outside[0] if outside else LOOPBACK_HOSTS[0]


def check_network(network) -> str:
    if network not in NETWORKS:
        raise ValueError(f"unknown network {network!r}; choose 'private' (task servers reachable "
                         f"only from this machine, the default) or 'host' (reachable from other hosts)")
    return network


class HostNetwork:
    """This machine's own network: TensorFlow's servers are reachable from other hosts."""

    name = HOST
    netns_pid = None

    def open_doors(self, owners: dict[int, tuple[str, int]]) -> None:
        pass

    def close_doors(self, ports) -> None:
        pass

    def let_tasks_reach(self, port: int) -> None:
        pass

    def stop_letting_tasks_reach(self, port: int) -> None:
        pass


class PrivateNetwork:
    """A network namespace behind a gate; one per process (see ``private_network``)."""

    name = PRIVATE

    def __init__(self, timeout: float):
        from dtflab.network.gate import Gate

        self._log_dir = scratch.folder("gate")
        try:
            self.gate = Gate(os.path.join(self._log_dir, "gate.log"), timeout)
        except BaseException:
            self._remove_log()
            raise

    @property
    def netns_pid(self) -> int:
        return self.gate.pid

    @property
    def alive(self) -> bool:
        return self.gate.alive

    def open_doors(self, owners: dict[int, tuple[str, int]]) -> None:
        """A door on 127.0.0.1 for each port; ``PortInUseError`` names the task whose port
        something else holds (no door is then open)."""
        from dtflab.errors import PortInUseError

        taken = self.gate.open(sorted(owners))
        if taken is not None:
            job, index = owners[taken]
            raise PortInUseError(job, index, "could not start", log_tail=(
                f"port {taken} of {job}:{index} is already in use; choose another port"))

    def close_doors(self, ports) -> None:
        self.gate.close_doors(sorted(ports))

    def let_tasks_reach(self, port: int) -> None:
        why_not = self.gate.reverse(port)
        if why_not is not None:
            raise DtflabError(f"the tasks cannot reach port {port} of this process: {why_not}")

    def stop_letting_tasks_reach(self, port: int) -> None:
        self.gate.unreverse(port)

    def close(self) -> None:
        self.gate.close()
        self._remove_log()

    def _remove_log(self) -> None:
        scratch.remove(self._log_dir)


_lock = threading.Lock()
_private: PrivateNetwork | None = None
_refused: str | None = None  # why this machine refused a private network, once seen
_host = HostNetwork()


def network_for(name: str, *, explicit: bool, hosts, timeout: float):
    """``(network, exposure_reason)`` for a cluster asking for network ``name``.

    A private request that cannot be met falls back to the host network with the reason, or,
    when ``explicit``, raises ``NotSupportedError``. ``hosts`` are the spec's hosts.
    """
    if name == HOST:
        return _host, "started with network='host'"
    refused = ("its spec names hosts other than localhost" if not set(hosts) <= set(LOOPBACK_HOSTS)
               else None)
    network = None
    if refused is None:
        network, refused = private_network(timeout)
    if network is not None:
        return network, ""
    if explicit:
        raise NotSupportedError(f"no private network for this cluster: {refused}; start it "
                                f"with network='host' (other hosts can reach it)")
    return _host, refused


def private_network(timeout: float = 60.0) -> tuple[PrivateNetwork | None, str | None]:
    """This process's private network, started on first use (again if its gate died), or
    ``(None, why)`` where the OS refuses one."""
    from dtflab.network.gate import GateRefused

    global _private, _refused
    with _lock:
        if _refused is not None:
            return None, _refused
        if _private is not None and _private.alive:
            return _private, None
        try:
            _private = PrivateNetwork(timeout)
        except GateRefused as exc:  # the OS said no: it will say no again
            _refused = f"this machine refused a private network namespace ({exc})"
            return None, _refused
        except TimeoutError as exc:
            raise DtflabError(f"{exc}; start the cluster with network='host' to go without it") from None
        except RuntimeError as exc:
            raise DtflabError(f"{exc}; start the cluster with network='host' to go without it") from None
        atexit.register(_close_private)
        return _private, None


def _close_private() -> None:
    global _private
    with _lock:
        if _private is not None:
            _private.close()
            _private = None
