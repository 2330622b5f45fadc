"""Task-server clusters: layouts, the Cluster lifecycle, and its backends."""

from __future__ import annotations

from dtflab.cluster.base import Cluster
from dtflab.cluster.network import PRIVATE, check_network
from dtflab.cluster.spec import resolve_layout
from dtflab.cluster.task import TaskInfo, TaskState
from dtflab.errors import did_you_mean

#: The backend used when none is named: separate processes behave like a real cluster
#: (kill, restart and stop work) and three of them plus a kernel fit in Binder's 2 GB.
DEFAULT_BACKEND = "local"


def _backends() -> dict[str, type[Cluster]]:
    from dtflab.cluster.dask import DaskCluster
    from dtflab.cluster.inprocess import InProcessCluster
    from dtflab.cluster.local import LocalCluster

    return {"dask": DaskCluster, "inprocess": InProcessCluster, "local": LocalCluster}


def backend_names() -> list[str]:
    return sorted(_backends())


def check_request(n=None, *, backend=None, ps=None, workers=None, jobs=None, spec=None,
                  timeout: float = 60.0, scheduler=None, client=None, network=None):
    """The backend class and layout for a start request, or a ValueError; starts nothing."""
    backends = _backends()
    on_dask = scheduler is not None or client is not None
    name = ("dask" if on_dask else DEFAULT_BACKEND) if backend is None else backend
    if on_dask and name != "dask":
        raise ValueError(f"a Dask scheduler or client needs --backend dask, not {name!r}")
    if scheduler is not None and not (isinstance(scheduler, str) and "://" in scheduler):
        raise ValueError(f"bad Dask scheduler address {scheduler!r}; write it as tcp://host:port, "
                         f"e.g. tcp://127.0.0.1:8786")
    if name not in backends:
        raise ValueError(f"unknown backend {backend!r}{did_you_mean(backend, backends)}; "
                         f"choose one of: {', '.join(sorted(backends))}")
    if network is not None:
        check_network(network)
        if network == PRIVATE and name != "local":
            raise ValueError(f"the {name} backend cannot keep its task servers on a private "
                             f"network; use backend 'local' for network 'private'")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}; "
                         f"for example 120")
    return backends[name], resolve_layout(n, ps=ps, workers=workers, jobs=jobs, spec=spec)


def start_cluster(n=None, *, backend=None, ps=None, workers=None, jobs=None, spec=None,
                  timeout: float = 60.0, inter_op_threads: int | None = None,
                  intra_op_threads: int | None = None, scheduler: str | None = None,
                  client=None, network: str | None = None) -> Cluster:
    """Start a cluster of TensorFlow task servers and return it once every task listens.

    In [1]: cluster = dtflab.start_cluster(3)                  # ps:0, worker:0, worker:1
    In [2]: cluster = dtflab.start_cluster(jobs="master=1,ps=2", backend="inprocess")
    In [3]: cluster = dtflab.start_cluster(spec="master|localhost:2222,ps|localhost:2223")

    In [4]: cluster = dtflab.start_cluster(3, backend="dask", scheduler="tcp://10.0.0.5:8786")

    Give one of ``n``, ``ps``/``workers``, ``jobs`` or ``spec``; ports are chosen at run time
    unless ``spec`` names them. ``timeout`` (seconds) bounds the wait for every task to listen
    (and, on Dask, for enough workers). ``scheduler`` (an address) or ``client`` (a
    ``dask.distributed.Client``) put the tasks on an existing Dask cluster.

    ``network``: ``"private"`` (the local backend's default) keeps the task servers reachable
    from this machine only; ``"host"`` lets other hosts reach them, as the inprocess and Dask
    backends always do. ``cluster.exposed`` lists what other hosts can reach.
    """
    cluster_class, layout = check_request(n, backend=backend, ps=ps, workers=workers, jobs=jobs,
                                          spec=spec, timeout=timeout, scheduler=scheduler,
                                          client=client, network=network)
    options = dict(scheduler=scheduler, client=client) if cluster_class.backend == "dask" else {}
    if cluster_class.backend == "local" and network is not None:
        options["network"] = network
    cluster = cluster_class(layout, timeout=timeout, inter_op_threads=inter_op_threads,
                            intra_op_threads=intra_op_threads, **options)
    return cluster.start()


__all__ = ["Cluster", "TaskInfo", "TaskState", "start_cluster", "backend_names", "DEFAULT_BACKEND"]
