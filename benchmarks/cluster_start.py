"""Time-to-ready of a 3-task cluster: dtflab's local and inprocess backends vs the raw floor.

"Ready" means every task answers a session run: one graph with an op on each task, fetched
through task 0. The raw floor is three bare task-server processes started in parallel by a
plain script (no dtflab). The local backend is timed cold (its fork server ended first, so the
start pays one ``import tensorflow``) and warm (the fork server already running, as after
``%load_ext dtflab``); ``restart_s`` is one task killed and started again until every task
answers. Runs are interleaved (raw, cold, warm, inprocess, raw, ...) so machine noise hits
each alike; figures are medians. TensorFlow is imported in this process before any timing, as
it is in a notebook kernel after ``%load_ext dtflab``. ``pss_mb`` is the proportional memory
of a warm 3-task local cluster plus its fork server.

    python benchmarks/cluster_start.py [--runs 5] [--smoke]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dtflab  # noqa: E402
from dtflab._quiet import import_tf  # noqa: E402
from dtflab.processes.launch import close_fork_servers, fork_server  # noqa: E402
from dtflab.cluster.memory import proportional_mb  # noqa: E402
from dtflab.cluster.ports import free_ports  # noqa: E402

tf = import_tf()

RAW_TASK = """
import sys, time, tensorflow as tf
spec = tf.train.ClusterSpec({"ps": [sys.argv[1]], "worker": [sys.argv[2], sys.argv[3]]})
server = tf.distribute.Server(spec, job_name=sys.argv[4], task_index=int(sys.argv[5]))
time.sleep(3600)
"""


def wait_until_every_task_answers(addresses: dict[str, list[str]], deadline_s: float = 120) -> None:
    devices = [f"/job:{job}/task:{i}" for job, tasks in addresses.items() for i in range(len(tasks))]
    first = next(iter(addresses.values()))[0]
    with tf.Graph().as_default():
        parts = []
        for device in devices:
            with tf.device(device):
                parts.append(tf.constant(1))
        total = tf.add_n(parts)
        config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=2000)
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                with tf.compat.v1.Session(f"grpc://{first}", config=config) as session:
                    if session.run(total) == len(devices):
                        return
            except tf.errors.OpError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


def time_raw() -> float:
    ps, w0, w1 = (f"127.0.0.1:{p}" for p in free_ports(3))
    started = time.perf_counter()
    processes = [subprocess.Popen([sys.executable, "-c", RAW_TASK, ps, w0, w1, job, str(i)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for job, i in (("ps", 0), ("worker", 0), ("worker", 1))]
    try:
        wait_until_every_task_answers({"ps": [ps], "worker": [w0, w1]})
        return time.perf_counter() - started
    finally:
        for process in processes:
            process.kill()
            process.wait()


def time_backend(backend: str, memory: list | None = None, restarts: list | None = None) -> float:
    started = time.perf_counter()
    cluster = dtflab.start_cluster(3, backend=backend)
    try:
        wait_until_every_task_answers(cluster.addresses)
        elapsed = time.perf_counter() - started
        if memory is not None:
            time.sleep(1.0)  # let the processes settle after their first step
            server = fork_server(cluster._launcher.netns_pid)
            memory.append(sum(task.memory_mb or 0 for task in cluster.tasks)
                          + (proportional_mb(server.process.pid) or 0))
        if restarts is not None:
            began = time.perf_counter()
            cluster.restart("worker:1")
            wait_until_every_task_answers(cluster.addresses)
            restarts.append(time.perf_counter() - began)
        return elapsed
    finally:
        cluster.stop()


def time_cold_local() -> float:
    close_fork_servers()
    return time_backend("local")


KERNEL_LIKE = """
import sys, time, dtflab, IPython, ipywidgets
from dtflab._quiet import import_tf
import_tf()
if sys.argv[1] == "inprocess":
    dtflab.start_cluster(3, backend="inprocess")
print("ready", flush=True)
time.sleep(3600)
"""


def kernel_pss_mb(mode: str) -> float:
    """PSS of a process that holds what a notebook kernel holds (TF, IPython, ipywidgets),
    with an inprocess 3-task cluster in it or not, measured beside a running local cluster."""
    process = subprocess.Popen([sys.executable, "-c", KERNEL_LIKE, mode], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        process.stdout.readline()
        time.sleep(1.0)
        return proportional_mb(process.pid)
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per variant (default 5)")
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    if args.smoke:
        args.runs = 1
    raw, local, warm, inprocess, memory, restart = [], [], [], [], [], []
    for _ in range(args.runs):
        raw.append(time_raw())
        local.append(time_cold_local())
        warm.append(time_backend("local", memory, restart))
        inprocess.append(time_backend("inprocess"))
    median = statistics.median
    with dtflab.start_cluster(3) as cluster:  # so shared pages are divided as in real use
        wait_until_every_task_answers(cluster.addresses)
        kernel_mb = kernel_pss_mb("plain")
        kernel_inprocess_mb = kernel_pss_mb("inprocess")
    print(json.dumps({
        "benchmark": "cluster_start",
        "runs": args.runs,
        "raw_floor_s": round(median(raw), 3),
        "local_s": round(median(local), 3),
        "inprocess_s": round(median(inprocess), 3),
        "local_over_raw": round(median(local) / median(raw), 3),
        "warm_local_s": round(median(warm), 3),
        "warm_over_raw": round(median(warm) / median(raw), 3),
        "restart_s": round(median(restart), 3),
        "pss_mb": round(median(memory), 1),
        "kernel_pss_mb": kernel_mb,
        "local_3_tasks_plus_kernel_mb": round(median(memory) + kernel_mb, 1),
        "inprocess_3_tasks_kernel_pss_mb": kernel_inprocess_mb,
        "raw_s_all": [round(x, 3) for x in raw],
        "local_s_all": [round(x, 3) for x in local],
        "warm_local_s_all": [round(x, 3) for x in warm],
        "cpus": os.cpu_count(),
        "tensorflow": tf.__version__,
    }))


if __name__ == "__main__":
    main()
