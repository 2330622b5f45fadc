"""Task-server clusters: layouts, the Cluster lifecycle, and its backends."""

from __future__ import annotations

from dtflab.cluster.base import Cluster
from dtflab.cluster.spec import resolve_layout
from dtflab.cluster.task import TaskInfo, TaskState
from dtflab.errors import did_you_mean

#: The backend used when none is named: separate processes behave like a real cluster
#: (kill, restart and stop work) and three of them plus a kernel fit in Binder's 2 GB.
DEFAULT_BACKEND = "local"


def _backends() -> dict[str, type[Cluster]]:
    from dtflab.cluster.inprocess import InProcessCluster
    from dtflab.cluster.local import LocalCluster

    return {"inprocess": InProcessCluster, "local": LocalCluster}


def backend_names() -> list[str]:
    return sorted(_backends())


def check_request(n=None, *, backend=None, ps=None, workers=None, jobs=None, spec=None,
                  timeout: float = 60.0):
    """The backend class and layout for a start request, or a ValueError; starts nothing."""
    backends = _backends()
    name = DEFAULT_BACKEND if backend is None else backend
    if name not in backends:
        raise ValueError(f"unknown backend {backend!r}{did_you_mean(backend, backends)}; "
                         f"choose one of: {', '.join(sorted(backends))}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return backends[name], resolve_layout(n, ps=ps, workers=workers, jobs=jobs, spec=spec)


def start_cluster(n=None, *, backend=None, ps=None, workers=None, jobs=None, spec=None,
                  timeout: float = 60.0, inter_op_threads: int | None = None,
                  intra_op_threads: int | None = None) -> Cluster:
    """Start a cluster of TensorFlow task servers and return it once every task listens.

    In [1]: cluster = dtflab.start_cluster(3)                  # ps:0, worker:0, worker:1
    In [2]: cluster = dtflab.start_cluster(jobs="master=1,ps=2", backend="inprocess")
    In [3]: cluster = dtflab.start_cluster(spec="master|localhost:2222,ps|localhost:2223")

    Give one of ``n``, ``ps``/``workers``, ``jobs`` or ``spec``; ports are chosen at run time
    unless ``spec`` names them. ``timeout`` (seconds) bounds the wait for every task to listen.
    """
    cluster_class, layout = check_request(n, backend=backend, ps=ps, workers=workers, jobs=jobs,
                                          spec=spec, timeout=timeout)
    cluster = cluster_class(layout, timeout=timeout, inter_op_threads=inter_op_threads,
                            intra_op_threads=intra_op_threads)
    return cluster.start()


__all__ = ["Cluster", "TaskInfo", "TaskState", "start_cluster", "backend_names", "DEFAULT_BACKEND"]
