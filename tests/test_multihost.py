"""Clusters across hosts: a Dask scheduler and workers on three hosts, dtflab on the first.

The hosts are network namespaces this module creates (``ip netns add``), each with its own
address on one subnet, joined by a bridge that lives in a fourth namespace (so this machine's
own firewall never sees their traffic). ``h1`` runs the ``dask scheduler`` and the dtflab
program under test; ``h2`` and ``h3`` each run two ``dask worker`` processes. For
``train.all_reduce`` a second scheduler on ``h1`` has one worker on each of ``h2`` and ``h3``.
Nothing listens on this machine's own network: the test reads what the program on ``h1``
reports.

Needs root (CAP_NET_ADMIN) and iproute2; ``.ci/run`` runs as root and installs iproute2.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import IP, not_here, run_ip, stop_last_first

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
MWMS = ROOT / "tests" / "programs" / "mwms_custom_loop.py"

# What dtflab does from the first host, reported as one JSON object.
DRIVER = r'''
import json, sys, time
from dask.distributed import Client

import dtflab
from dtflab import train
from dtflab._quiet import import_tf
from dtflab.tracing import short_device
from dtflab.train.examples import exp_regression as exp_regression_graph

scheduler, mwms, expected_workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = {}


def dask_workers():
    with Client(scheduler, timeout="30s") as client:
        return sorted(client.scheduler_info(n_workers=-1)["workers"])


deadline = time.monotonic() + 90
while len(dask_workers()) < expected_workers and time.monotonic() < deadline:
    time.sleep(0.5)
out["dask_workers"] = dask_workers()

cluster = dtflab.start_cluster(jobs="ps=2,worker=2", scheduler=scheduler)
out["addresses"] = cluster.addresses
out["dask_hosts"] = {f"{t.job}:{t.index}": t.host for t in cluster.tasks}

problem = train.exp_regression()
single = train.single(problem, steps=60, seed=0)
model = train.model_parallel(problem, cluster, steps=60, seed=0)
sync = train.sync_data_parallel(problem, cluster, steps=60, seed=0)
out["model_parallel_vs_single"] = max(abs(a - b) for a, b in zip(single.losses, model.losses))
out["sync_vs_single"] = max(abs(a - b) / max(a, 1e-9) for a, b in zip(single.losses, sync.losses))
out["steps"] = [model.steps, sync.steps]

tf = import_tf()
built = exp_regression_graph("/job:ps/task:0", "/job:ps/task:1", "/job:worker/task:0")
with tf.compat.v1.Session(cluster.target("worker"), graph=built.graph) as session:
    session.run(built.init)
    step = dtflab.trace(session, built.loss, built.feed)
out["bytes_between"] = {f"{short_device(a)}->{short_device(b)}": n
                        for (a, b), n in step.bytes_between().items()}

before = next(t for t in cluster.tasks if (t.job, t.index) == ("worker", 1))
cluster.kill("worker:1")
out["killed_state"] = str(next(t for t in cluster.tasks if (t.job, t.index) == ("worker", 1)).state)
cluster.restart("worker:1")
after = next(t for t in cluster.tasks if (t.job, t.index) == ("worker", 1))
out["restart"] = {"state": str(after.state), "same_address": after.address == before.address,
                  "new_pid": after.pid != before.pid}
with tf.Graph().as_default():
    with tf.device("/job:worker/task:1"):
        hello = tf.constant("across hosts")
    with tf.compat.v1.Session(cluster.target("ps", 0)) as session:
        out["restarted_answers"] = session.run(hello).decode()
cluster.stop()

# data x tensor: worker:0 and worker:1 (a tensor pair) on one host, worker:2 and worker:3 on the
# other (Dask's workers are taken in address order); the data axis crosses between the hosts
cluster = dtflab.start_cluster(jobs="worker=4", scheduler=scheduler)
layout = train.Layout(data=2, tensor=2)
shape = train.transformer(blocks=2, d_model=64, heads=2, sequence=32, batch_size=8)
alone = train.single(shape, steps=5, seed=0)
combined = train.combined(shape, cluster, layout, steps=5, seed=0, trace_step=2)
out["combined_vs_single"] = max(abs(a - b) for a, b in zip(alone.losses, combined.losses))
out["combined_hosts"] = {f"{t.job}:{t.index}": t.host for t in cluster.tasks}
out["combined_axis_bytes"] = layout.axis_bytes(combined.trace.bytes_between())
out["combined_formula"] = combined.details["bytes_formula"]
cluster.stop()

programs = dtflab.run(mwms, "4", workers=2, chief=True, scheduler=scheduler)
out["program_addresses"] = programs.addresses
out["program_exit_codes"] = programs.wait(timeout=120)
out["program_losses"] = {f"{job}:{i}": [line for line in programs.logs(job, i).splitlines()
                                        if line.startswith("step ")]
                         for job, addresses in programs.addresses.items() for i in range(len(addresses))}
programs.stop()

out["dask_workers_after"] = dask_workers()
print("RESULT " + json.dumps(out), flush=True)
'''


class Hosts:
    """Three hosts (namespaces h1..h3 on one subnet) and a switch namespace with the bridge."""

    def __init__(self):
        tag = secrets.token_hex(2)
        self.switch = f"dtflab-sw-{tag}"
        self.names = [f"dtflab-h{i}-{tag}" for i in (1, 2, 3)]
        subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
        self.addresses = [f"{subnet}.{i}" for i in (1, 2, 3)]
        self.processes: list[subprocess.Popen] = []
        self.tag = tag

    def build(self) -> None:
        run_ip("netns", "add", self.switch)
        run_ip("link", "add", "br0", "type", "bridge", namespace=self.switch)
        run_ip("link", "set", "br0", "up", namespace=self.switch)
        for i, (name, address) in enumerate(zip(self.names, self.addresses), start=1):
            inside, outside = f"dth{i}{self.tag}", f"dts{i}{self.tag}"
            run_ip("netns", "add", name)
            run_ip("link", "add", inside, "type", "veth", "peer", "name", outside)
            run_ip("link", "set", inside, "netns", name)
            run_ip("link", "set", outside, "netns", self.switch)
            run_ip("link", "set", outside, "master", "br0", namespace=self.switch)
            run_ip("link", "set", outside, "up", namespace=self.switch)
            run_ip("addr", "add", f"{address}/24", "dev", inside, namespace=name)
            run_ip("link", "set", inside, "up", namespace=name)
            run_ip("link", "set", "lo", "up", namespace=name)

    def start(self, host: int, *argv, **popen) -> subprocess.Popen:
        """A process on host ``host`` (0-based), stopped when the hosts are removed."""
        process = subprocess.Popen([IP, "netns", "exec", self.names[host], *argv], **popen)
        self.processes.append(process)
        return process

    def remove(self) -> None:
        stop_last_first(self.processes)
        for name in self.names + [self.switch]:  # deleting a namespace deletes its veth ends
            subprocess.run([IP, "netns", "del", name], capture_output=True)


@pytest.fixture(scope="module")
def hosts():
    """Three hosts as network namespaces, removed (with every process started on them) after
    the module's tests."""
    if os.geteuid() != 0 or not os.path.exists(IP):
        not_here("MULTIHOST TIER NOT RUN: building hosts as network namespaces needs root and "
                    "iproute2 (`apt-get install iproute2`; .ci/run runs as root)")
    hosts = Hosts()
    try:
        hosts.build()
        yield hosts
    finally:
        hosts.remove()


def start_dask(hosts: Hosts, folder: Path, workers_per_host: int) -> str:
    """A `dask scheduler` on h1 and ``workers_per_host`` `dask worker`s on each of h2 and h3
    (stopped with the hosts); returns the scheduler's address."""
    scheduler_file = folder / "scheduler.json"
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    hosts.start(0, sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                hosts.addresses[0], "--port", "0", "--dashboard-address",
                f"{hosts.addresses[0]}:0", "--scheduler-file", str(scheduler_file), **quiet)
    deadline = time.monotonic() + 60
    while not scheduler_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    scheduler = json.loads(scheduler_file.read_text())["address"]
    for host in (1, 2):
        for _ in range(workers_per_host):
            hosts.start(host, sys.executable, "-m", "distributed.cli.dask_worker", scheduler,
                        "--host", hosts.addresses[host], "--nthreads", "1", "--no-dashboard",
                        **quiet)
    return scheduler


def drive(hosts: Hosts, folder: Path, driver: str, *args: str) -> dict:
    """Run ``driver`` (Python code) on h1 with ``args``; what it reported as ``RESULT {json}``."""
    path = folder / "driver.py"
    path.write_text(driver)
    done = subprocess.run([IP, "netns", "exec", hosts.names[0], sys.executable, str(path), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def report(hosts, tmp_path_factory):
    """What the program on h1 saw, with the Dask scheduler on h1 and two workers on h2 and h3."""
    folder = tmp_path_factory.mktemp("multihost")
    scheduler = start_dask(hosts, folder, workers_per_host=2)
    result = drive(hosts, folder, DRIVER, scheduler, str(MWMS), "4")
    result["scheduler"], result["hosts"] = scheduler, hosts.addresses
    return result


def host_of(address: str) -> str:
    return address.removeprefix("tcp://").rsplit(":", 1)[0]


def test_tasks_advertise_their_own_hosts_address(report):
    _, h2, h3 = report["hosts"]
    assert [host_of(w) for w in report["dask_workers"]] == [h2, h2, h3, h3]
    assert {job: [host_of(a) for a in addresses] for job, addresses in report["addresses"].items()} == {
        "ps": [h2, h2], "worker": [h3, h3]}
    for task, dask_worker in report["dask_hosts"].items():
        job, index = task.split(":")
        assert host_of(dask_worker) == host_of(report["addresses"][job][int(index)])


def test_model_and_data_parallel_training_cross_hosts_and_match_one_process(report):
    assert report["steps"] == [60, 60]
    assert report["model_parallel_vs_single"] < 1e-5
    assert report["sync_vs_single"] < 1e-4


def test_a_traced_step_shows_the_bytes_each_host_sends(report):
    # The 2016 placement: weights on ps:0 (host 2), biases on ps:1 (host 2), compute on
    # worker:0 (host 3): every parameter crosses from one host to the other, once per step.
    assert report["bytes_between"] == {"ps:0->worker:0": 2240, "ps:1->worker:0": 196}


def test_data_x_tensor_puts_each_tensor_pair_on_one_host_and_the_data_axis_across(report):
    hosts = {task: host_of(worker) for task, worker in report["combined_hosts"].items()}
    assert hosts["worker:0"] == hosts["worker:1"] != hosts["worker:2"] == hosts["worker:3"]
    assert report["combined_vs_single"] <= 1e-5
    traced, formula = report["combined_axis_bytes"], report["combined_formula"]
    for axis in ("data", "tensor"):  # the data axis's bytes crossed between the hosts
        assert formula[axis] <= traced[axis] <= formula[axis] + 512, (axis, traced, formula)
    assert traced["other"] <= 512


def test_a_task_killed_on_another_host_restarts_on_its_address(report):
    assert report["killed_state"] == "killed"
    assert report["restart"] == {"state": "running", "same_address": True, "new_pid": True}
    assert report["restarted_answers"] == "across hosts"


def test_program_tasks_run_across_hosts_with_identical_losses(report):
    # MultiWorkerMirroredStrategy's all-reduce between a chief and two workers on two hosts.
    _, h2, h3 = report["hosts"]
    hosts = {job: [host_of(a) for a in addresses] for job, addresses in report["program_addresses"].items()}
    assert hosts == {"chief": [h2], "worker": [h2, h3]}
    assert report["program_exit_codes"] == {"chief:0": 0, "worker:0": 0, "worker:1": 0}
    losses = report["program_losses"]
    assert len(losses["chief:0"]) == 4
    assert losses["chief:0"] == losses["worker:0"] == losses["worker:1"]


def test_stopping_leaves_the_external_dask_cluster_running(report):
    assert report["dask_workers_after"] == report["dask_workers"]


# TF2 from h1 over tasks on h2 and h3: ParameterServerStrategy (h1 the coordinator, the spec's
# chief) and cluster.connect() (h1 a client). A task that needs a tensor h1 holds calls h1 back,
# at the address the spec gives h1: h1's own, not 127.0.0.1 (the task's own host).
TF2_DRIVER = r"""
import json, sys, threading
from dask.distributed import Client

import dtflab
from dtflab import train
from dtflab._quiet import import_tf

scheduler, how = sys.argv[1], sys.argv[2]
tf = import_tf()
with Client(scheduler, timeout="30s") as client:
    client.wait_for_workers(2, timeout=90)
cluster = dtflab.start_cluster(jobs="ps=1,worker=1", scheduler=scheduler)
out = {"addresses": cluster.addresses}
if how == "ps_strategy":
    strategy = train.strategy_for(cluster)
    history = train.ps_strategy(train.exp_regression(), cluster, steps=40, seed=0,
                                strategy=strategy, watchdog=False)
    out.update(steps=history.steps, first_loss=history.losses[0], last_loss=history.losses[-1])
    here = "chief"
else:
    cluster.connect()
    here = "client"
# The cluster as TensorFlow's runtime in this process was given it.
from tensorflow.python.eager import context
out["here"] = tf.train.ClusterSpec(context.context().get_server_def().cluster).as_dict()[here]
with tf.device(f"/job:{here}/replica:0/task:0/device:CPU:0"):
    held_here = tf.Variable([1.0, 2.0])


@tf.function
def doubled_on_the_worker():  # the worker on h3 receives held_here from h1
    with tf.device("/job:worker/replica:0/task:0/device:CPU:0"):
        return held_here * 2.0


def call():
    try:
        out["worker_read_from_here"] = doubled_on_the_worker().numpy().tolist()
    except Exception as exc:
        out["worker_read_from_here"] = type(exc).__name__


thread = threading.Thread(target=call, daemon=True)
thread.start()
thread.join(60)
out.setdefault("worker_read_from_here", "no answer in 60 s")
cluster.stop()
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def tf2_report(hosts, tmp_path_factory):
    """What ParameterServerStrategy and ``cluster.connect()`` did from h1 (one process each) on
    a Dask cluster of one worker on h2 and one on h3."""
    folder = tmp_path_factory.mktemp("multihost-tf2")
    scheduler = start_dask(hosts, folder, workers_per_host=1)
    return {"hosts": hosts.addresses,
            **{how: drive(hosts, folder, TF2_DRIVER, scheduler, how)
               for how in ("ps_strategy", "connect")}}


@pytest.mark.parametrize("how", ["ps_strategy", "connect"])
def test_tf2_tasks_on_other_hosts_reach_this_process_back(tf2_report, how):
    h1, h2, h3 = tf2_report["hosts"]
    report = tf2_report[how]
    assert {job: [host_of(a) for a in found] for job, found in report["addresses"].items()} == {
        "ps": [h2], "worker": [h3]}
    assert [host_of(a) for a in report["here"]] == [h1]
    assert report["worker_read_from_here"] == [2.0, 4.0]  # 127.0.0.1: UnavailableError


def test_parameter_server_strategy_trains_with_tasks_on_other_hosts(tf2_report):
    report = tf2_report["ps_strategy"]
    assert report["steps"] == 40
    assert report["last_loss"] < report["first_loss"]


# train.all_reduce from h1 with its two worker programs on h2 and h3 (one Dask worker each).
ALL_REDUCE_DRIVER = r'''
import json, sys, time
import psutil
from dask.distributed import Client

from dtflab import train
from dtflab.errors import NotSupportedError
from dtflab.network.transport import cluster_snapshot

scheduler, folder = sys.argv[1], sys.argv[2]
out = {}


def strays():
    """worker programs of train.all_reduce still running, on any host (the namespaces share one pid
    namespace: this machine's process table shows every host's), but not a tutorial's (notebook
    08's, in its notebook's cgroup: the notebooks run beside the tests)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if "worker_programs/all_reduce.py" in command and not in_a_notebook(process.pid):
            found.append(command[:200])
    return found


def in_a_notebook(pid):
    try:
        with open(f"/proc/{pid}/cgroup") as groups:
            return "dtflab-notebook-" in groups.read()  # notebook_runs.GROUP_PREFIX
    except OSError:
        return False


with Client(scheduler, timeout="30s") as client:
    client.wait_for_workers(2, timeout=90)
problem = train.exp_regression()
single = train.single(problem, steps=40, seed=5)
history = train.all_reduce(problem, workers=2, steps=40, seed=5, scheduler=scheduler)
out["addresses"] = history.cluster.addresses
out["steps_per_worker"] = history.steps_per_worker
out["reported_to"] = history.details["reported_to"]
out["vs_single"] = max(abs(r.loss - single.losses[r.step]) for r in history.records)
fingerprints = history.details["fingerprints"]
out["fingerprints_agree"] = fingerprints["worker:0"] == fingerprints["worker:1"] != []
out["strays_after_run"] = strays()
try:  # train.WireBytes reads this machine's sockets: a remote pid is another host's process
    cluster_snapshot(history.cluster)
    out["wire"] = "counted"
except NotSupportedError as exc:
    out["wire"] = str(exc)

reference = train.single(problem, steps=100, seed=2)
run = train.all_reduce(problem, workers=2, steps=100, seed=2, slow={"worker:0": 0.05},
                       checkpoint_every=10, checkpoint_dir=folder, scheduler=scheduler,
                       background=True)
deadline = time.monotonic() + 180
while run.history.steps < 25 and time.monotonic() < deadline:
    time.sleep(0.05)
run.history.cluster.kill("worker:1")
recovered = run.wait(timeout=300)
(recovery,) = recovered.recoveries
out["recovery"] = {"task": recovery.task, "restarted": recovery.restarted,
                   "failed_at": recovery.failed_at, "resumed_from": recovery.resumed_from}
out["recovered_steps"] = [r.step for r in recovered.records if r.worker == "worker:0"]
out["recovered_vs_single"] = max(abs(r.loss - reference.losses[r.step]) for r in recovered.records)
out["recovered_cluster_stopped"] = recovered.cluster.stopped
out["strays_after_recovery"] = strays()
with Client(scheduler, timeout="30s") as client:
    out["dask_workers_after"] = len(client.scheduler_info(n_workers=-1)["workers"])
print("RESULT " + json.dumps(out), flush=True)
'''


@pytest.fixture(scope="module")
def all_reduce_report(hosts, tmp_path_factory):
    """What ``train.all_reduce`` did from h1 on a Dask cluster of one worker on h2 and one on h3;
    the checkpoint folder is on the filesystem the namespaces share (on real hosts: NFS, say)."""
    folder = tmp_path_factory.mktemp("multihost-all-reduce")
    scheduler = start_dask(hosts, folder, workers_per_host=1)
    result = drive(hosts, folder, ALL_REDUCE_DRIVER, scheduler, str(folder / "checkpoints"))
    result["hosts"] = hosts.addresses
    return result


def test_all_reduce_workers_on_two_hosts_report_back_and_match_one_process(all_reduce_report):
    # The workers reached the notebook on h1 (not its 127.0.0.1) from their own hosts.
    h1, h2, h3 = all_reduce_report["hosts"]
    assert [host_of(a) for a in all_reduce_report["addresses"]["worker"]] == [h2, h3]
    assert {host_of(a) for a in all_reduce_report["reported_to"].values()} == {h1}
    assert all_reduce_report["steps_per_worker"] == {"worker:0": 40, "worker:1": 40}
    assert all_reduce_report["vs_single"] <= 1e-5
    assert all_reduce_report["fingerprints_agree"]


def test_bytes_on_the_wire_are_not_counted_on_tasks_of_other_hosts(all_reduce_report):
    _, h2, _ = all_reduce_report["hosts"]
    assert all_reduce_report["wire"] == (f"counting bytes on the wire reads this machine's "
                                         f"sockets; worker:0 runs on {h2}: count on a cluster "
                                         f"of this machine (--backend local)")


def test_all_reduce_recovers_a_worker_killed_on_another_host_from_the_shared_checkpoints(
        all_reduce_report):
    recovery = all_reduce_report["recovery"]
    assert recovery["task"] == "worker:1" and recovery["restarted"] == "every worker"
    assert recovery["resumed_from"] % 10 == 0 and 0 <= recovery["failed_at"] - recovery["resumed_from"] <= 10
    steps = all_reduce_report["recovered_steps"]
    lost = recovery["failed_at"] - recovery["resumed_from"]
    assert steps[-1] == 99 and len(steps) == 100 + lost  # the lost steps ran twice
    assert steps[recovery["failed_at"]] == recovery["resumed_from"]
    assert all_reduce_report["recovered_vs_single"] <= 1e-5


def test_nothing_of_an_all_reduce_run_outlives_it_on_any_host(all_reduce_report):
    assert all_reduce_report["strays_after_run"] == []
    assert all_reduce_report["strays_after_recovery"] == []
    assert all_reduce_report["recovered_cluster_stopped"]
    assert all_reduce_report["dask_workers_after"] == 2  # the Dask cluster itself goes on
