"""The dask backend: on a LocalCluster it makes, and on a scheduler and workers started by the CLI."""

import json
import subprocess
import sys

import psutil
import pytest

import dtflab
from dtflab import train
from dtflab.cluster.task import TaskState
from dtflab.errors import DtflabError
from dtflab.tracing import short_device
from dtflab.train.examples import exp_regression as exp_regression_graph

from conftest import run_constant, stop_last_first, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def external_dask(tmp_path):
    """A `dask scheduler` and three `dask worker` processes on 127.0.0.1, stopped afterwards."""
    scheduler_file = tmp_path / "scheduler.json"
    processes = [subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    assert wait_until(scheduler_file.exists, timeout=60)
    address = json.loads(scheduler_file.read_text())["address"]

    def add_worker():
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
             "--host", "127.0.0.1", "--no-dashboard"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    yield address, add_worker, processes
    stop_last_first(processes)


def worker_count(address):
    from dask.distributed import Client

    with Client(address, timeout="20s") as client:
        return len(client.scheduler_info(n_workers=-1)["workers"])


def test_a_local_dask_cluster_hosts_one_task_per_worker(start_cluster):
    cluster = start_cluster(3, backend="dask")
    tasks = cluster.tasks
    assert [t.state for t in tasks] == [TaskState.RUNNING] * 3
    assert len({t.host for t in tasks}) == 3 and all(t.host.startswith("tcp://127.0.0.1:") for t in tasks)
    assert all(t.pid and t.memory_mb > 50 for t in tasks)
    for task in tasks:
        assert run_constant(cluster.target("ps"), task.device, task.device).decode() == task.device
    assert cluster.dashboard_link.startswith("http://127.0.0.1:")
    html = cluster._repr_html_()
    assert "Dask worker" in html and cluster.dashboard_link in html
    cluster.stop()
    assert cluster._local_cluster is None and cluster.client is None


def test_an_external_cluster_trains_kills_restarts_and_survives_stop(external_dask):
    address, add_worker, processes = external_dask
    for _ in range(3):
        add_worker()
    cluster = dtflab.start_cluster(jobs="ps=2,worker=1", scheduler=address)
    try:
        assert cluster.backend == "dask"
        hosts = [t.host for t in cluster.tasks]
        assert hosts == sorted(hosts) and len(set(hosts)) == 3  # roles by worker address
        history = train.model_parallel(train.exp_regression(), cluster, steps=150, seed=0)
        assert history.final_loss() < history.losses[0] / 5
        built = exp_regression_graph("/job:ps/task:0", "/job:ps/task:1", "/job:worker/task:0")
        from dtflab._quiet import import_tf

        with import_tf().compat.v1.Session(cluster.target("worker"), graph=built.graph) as session:
            session.run(built.init)
            step = dtflab.trace(session, built.loss, built.feed)
        assert {(short_device(a), short_device(b)): n for (a, b), n in step.bytes_between().items()} == {
            ("ps:0", "worker:0"): 2240, ("ps:1", "worker:0"): 196}
        old_pid = cluster.tasks[2].pid
        cluster.kill("worker:0")
        assert cluster.tasks[2].state is TaskState.KILLED
        cluster.restart("worker:0")
        task = cluster.tasks[2]
        assert task.state is TaskState.RUNNING and task.pid != old_pid
        assert run_constant(cluster.target("ps", 1), "/job:worker/task:0", "w0") == b"w0"
    finally:
        task_pids = [t.pid for t in cluster.tasks if t.pid]
        cluster.stop()
    assert wait_until(lambda: not any(psutil.pid_exists(pid) for pid in task_pids), timeout=10)
    assert all(process.poll() is None for process in processes), "dtflab stopped a Dask process it did not start"
    assert worker_count(address) == 3


def check_all_reduce(**where):
    """``train.all_reduce`` on Dask (``where``) matches one process; its workers reported to
    127.0.0.1 (every Dask worker here is on this machine) and it stopped them."""
    problem = train.exp_regression()
    single = train.single(problem, steps=20, seed=1)
    history = train.all_reduce(problem, workers=2, steps=20, seed=1, **where)
    assert history.cluster.backend == "dask" and history.cluster.stopped
    assert history.steps_per_worker == {"worker:0": 20, "worker:1": 20}
    assert max(abs(r.loss - single.losses[r.step]) for r in history.records) <= 1e-5
    port = history.details["report_port"]
    assert history.details["reported_to"] == {w: f"127.0.0.1:{port}" for w in ("worker:0", "worker:1")}


def test_all_reduce_runs_its_workers_on_a_dask_scheduler(external_dask):
    address, add_worker, processes = external_dask
    for _ in range(2):
        add_worker()
    check_all_reduce(scheduler=address)  # the listener on every interface
    assert all(process.poll() is None for process in processes)  # the Dask cluster goes on


def test_all_reduce_runs_its_workers_on_a_local_dask_cluster():
    check_all_reduce(backend="dask")


def test_too_few_workers_is_said_clearly_and_starts_nothing(external_dask):
    address, add_worker, processes = external_dask
    add_worker()
    assert wait_until(lambda: worker_count(address) == 1, timeout=60)
    with pytest.raises(DtflabError, match=rf"the Dask cluster at {address} has 1 worker\(s\) after 3 s; "
                                          r"this cluster needs 3 \(one task per worker\)"):
        dtflab.start_cluster(3, scheduler=address, timeout=3)
    assert worker_count(address) == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(scheduler="tcp://127.0.0.1:1", backend="local"), r"needs --backend dask, not 'local'"),
    (dict(scheduler="127.0.0.1:8786"), r"bad Dask scheduler address '127.0.0.1:8786'; write it as tcp://host:port"),
])
def test_bad_dask_requests(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dtflab.start_cluster(3, **kwargs)


def test_an_unreachable_scheduler_says_so():
    with pytest.raises(DtflabError, match=r"cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        dtflab.start_cluster(1, scheduler="tcp://127.0.0.1:9", timeout=3)
