"""The cluster room: what a user asks for and holds.

The ``Cluster`` lifecycle contract (``base``), one ``Task`` per task process (``task``), the
backends (``inprocess``, ``local``, ``dask`` with ``dask_worker``), program tasks and
``TF_CONFIG`` (``programs``, ``follow``), ports and memory figures, and ``start_cluster`` /
``run``, which turn a request into a running cluster.

May import: ``dtflab.processes`` (how a task process starts), ``dtflab.network`` (where it
listens) and dtflab's base modules (``spec``, ``names``, ``errors``, ``checks``, ``_quiet``,
``tf_private``); never placement, tracing, training or views (``dtflab.ui`` is named, not
imported: see ``base.VIEWS``). The table in ``tests/test_layers.py`` is the rule.
"""

from __future__ import annotations

from dtflab.cluster.base import Cluster
from dtflab.cluster.data_service import with_data_service
from dtflab.cluster.programs import Program
from dtflab.cluster.task import TaskInfo, TaskState
from dtflab.errors import did_you_mean
from dtflab.network.networks import PRIVATE, check_network
from dtflab.processes.launch import START_METHODS
from dtflab.spec import parse_count, resolve_jobs

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
                  timeout: float = 60.0, scheduler=None, client=None, network=None,
                  start_method=None, data_workers=0):
    """The backend class and the jobs wanted for a start request, or a ValueError; starts nothing.
    They hold the data service's tasks too (``dispatcher``, ``data_worker``)."""
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
    if start_method is not None and start_method not in START_METHODS:
        raise ValueError(f"unknown start_method {start_method!r}{did_you_mean(start_method, START_METHODS)}; "
                         f"choose 'fork' (from a warm TensorFlow) or 'spawn' (a fresh interpreter)")
    if start_method is not None and name != "local":
        raise ValueError(f"start_method applies to the local backend only, not {name!r}; "
                         f"leave it out")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}; "
                         f"for example 120")
    wanted = resolve_jobs(n, ps=ps, workers=workers, jobs=jobs, spec=spec)
    return backends[name], with_data_service(wanted, data_workers, name)


#: More threads per task than any machine dtflab runs on has cores to give them.
MAX_THREADS = 256


def start_cluster(n=None, *, backend=None, ps=None, workers=None, jobs=None, spec=None,
                  timeout: float = 60.0, inter_op_threads: int | None = None,
                  intra_op_threads: int | None = None, scheduler: str | None = None,
                  client=None, network: str | None = None, start_method: str | None = None,
                  programs: dict[str, Program] | None = None, data_workers: int = 0,
                  fixed_data_workers: bool = False) -> Cluster:
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

    ``start_method`` (local backend): ``"fork"`` (the default on Linux: tasks are forked from
    this process's warm fork server) or ``"spawn"`` (each task imports TensorFlow anew).
    ``programs``: ``{job: Program}``, jobs whose tasks run a program (see ``dtflab.run``).

    ``data_workers=N`` adds a tf.data service beside the TensorFlow tasks: a ``dispatcher`` and
    ``N`` ``data_worker`` tasks, listed, killed and restarted like the others but not part of
    the TensorFlow cluster (``cluster.addresses``, ``TF_CONFIG``). ``cluster.data_service`` is
    the dispatcher's address; a program task finds it in ``$DTFLAB_DATA_SERVICE``
    (``dtflab.train.inputs`` reads from it). The dispatcher learns its data workers as they
    register and drops one that is silent for 2 s, so a killed data worker holds up only the
    jobs it was serving; ``fixed_data_workers=True`` gives it the list at start instead, which
    TensorFlow's static sharding policies (``DATA``) need, and then every job waits for a
    killed data worker to be restarted.
    """
    cluster_class, wanted = check_request(n, backend=backend, ps=ps, workers=workers, jobs=jobs,
                                          spec=spec, timeout=timeout, scheduler=scheduler,
                                          client=client, network=network,
                                          start_method=start_method, data_workers=data_workers)
    from dtflab import checks

    for name, threads in (("inter_op_threads", inter_op_threads), ("intra_op_threads", intra_op_threads)):
        if threads is not None:  # 0: TensorFlow's default (one per core)
            checks.whole(threads, name, minimum=0, maximum=MAX_THREADS, example=2)
    unknown = sorted(set(programs or {}) - set(wanted))
    if unknown:
        raise ValueError(f"programs name job {unknown[0]!r}, which the cluster lacks; its jobs "
                         f"are: {', '.join(wanted)}")
    options = dict(scheduler=scheduler, client=client) if cluster_class.backend == "dask" else {}
    if cluster_class.backend == "local":
        options.update(network=network, start_method=start_method)
    cluster = cluster_class(wanted, timeout=timeout, inter_op_threads=inter_op_threads,
                            intra_op_threads=intra_op_threads, programs=programs,
                            fixed_data_workers=bool(fixed_data_workers), **options)
    return cluster.start()


def run(script, *args, workers=2, ps=0, chief: bool = False, chief_only: bool = False,
        backend=None, network=None, timeout: float = 60.0, start_method=None, scheduler=None,
        client=None, cwd: str | None = None) -> Cluster:
    """Run ``script`` as every worker's program (and the chief's, with ``chief=True``) beside
    ``ps`` bare task servers; returns the running cluster at once. ``chief_only=True`` runs
    it on a chief only, beside bare worker and ps servers: a ParameterServerStrategy
    coordinator, as in TF's parameter-server tutorial.

    In [1]: cluster = dtflab.run("mwms.py", "--steps=20", workers=2)
    In [2]: cluster.wait()                                # {'worker:0': 0, 'worker:1': 0}
    In [3]: dtflab.run("trainer.py", "--ps_hosts={ps_hosts}", "--worker_hosts={worker_hosts}",
       ...:            "--job_name={job_name}", "--task_index={task_index}", workers=2, ps=1)

    Each program runs as ``python SCRIPT ARGS`` would, from ``cwd`` (default: this process's
    working directory), with ``TF_CONFIG`` set for its task; placeholders in ``args`` are
    described in ``dtflab.cluster.programs``. ``cluster.logs("worker:0")`` holds its output.

    In [4]: dtflab.run("dtensor_train.py", workers=2)      # a DTensor program on 2 clients

    The chief's and each worker's program is also a DTensor client: ``DTENSOR_CLIENT_ID`` (the
    chief 0, then the workers in order), ``DTENSOR_NUM_CLIENTS``, ``DTENSOR_JOB_NAME``
    (``worker``) and ``DTENSOR_JOBS`` (each client's ``TF_CONFIG`` address, where
    ``initialize_accelerator_system`` starts its gRPC server) are set beside ``TF_CONFIG``, so a
    DTensor program runs on every worker unchanged. Use DTensor or a ``TF_CONFIG`` strategy in
    one program, not both: each starts a server on that address.
    """
    workers = parse_count(workers, "workers")
    ps = parse_count(ps, "ps", minimum=0)
    program = Program.checked(script, args, cwd)
    counts = {"chief": 1 if chief or chief_only else 0, "ps": ps, "worker": workers}
    jobs = {job: count for job, count in counts.items() if count}
    programs = {job: program for job in (("chief",) if chief_only else ("chief", "worker"))
                if job in jobs}
    return start_cluster(jobs=jobs, backend=backend, network=network, timeout=timeout,
                         start_method=start_method, scheduler=scheduler, client=client,
                         programs=programs)


__all__ = ["Cluster", "Program", "TaskInfo", "TaskState", "start_cluster", "run", "backend_names",
           "DEFAULT_BACKEND"]
