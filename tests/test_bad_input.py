"""Bad input: a one-line error that names the bad value and the fix, and nothing left behind.

Each case goes through a real entry point: the magic in an IPython shell, the ``dtflab``
command, ``dtflab.start_cluster``, ``PlacementPlan``, the training loops (on a real cluster,
started once for this module), the problems and the watchdog's settings. It runs twice (the first call warms up
lazy imports); around the second, the test compares this process's child processes, threads
and file descriptors, the listening ports of this process tree, orphaned dtflab processes
anywhere on the machine, dtflab's log folders and its running clusters: all must be unchanged.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable

import psutil
import pytest
from IPython.core.error import UsageError

import dtflab
from dtflab import train
from dtflab.cluster import base, running
from dtflab.placement import PlacementPlan
from dtflab.train.formulas import costs
from notebook_runs import beside_the_notebooks, in_a_notebook

from test_cli import DTFLAB

DEVICES = ["/job:ps/task:0", "/job:ps/task:1", "/job:worker/task:0"]


@dataclass
class Case:
    id: str
    run: Callable  # (shell) -> the error message; fails the test if nothing was refused
    value: str  # the bad value, as the message must show it
    fix: str  # a regex for the fix the message must give


def magic(line):
    def run(ip):
        with pytest.raises(UsageError) as error:
            ip.run_line_magic("dtf_cluster", line)
        assert "cluster" not in ip.user_ns
        return str(error.value)
    return run


def command(*argv):
    def run(_):
        out = subprocess.run(DTFLAB + list(argv), capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out
        assert out.stdout == "", out.stdout
        return out.stderr.rstrip("\n")
    return run


def api(call):
    def run(_):
        with pytest.raises(ValueError) as error:
            call()
        return str(error.value)
    return run


#: The cluster the training cases use (ps:0, worker:0, worker:1), started once for the module.
TRAINING: dict = {}
PROBLEM = train.exp_regression()


def on_cluster(call):
    """A case that calls ``call(cluster)`` with the module's running cluster."""
    return api(lambda: call(TRAINING["cluster"]))


@pytest.fixture(scope="module", autouse=True)
def training_cluster():
    cluster = dtflab.start_cluster(3)
    TRAINING["cluster"] = cluster
    yield cluster
    cluster.stop()


CASES = [
    # the magic
    Case("magic-unknown-command", magic("strat 3"), "'strat'", r"did you mean 'start'\?"),
    Case("magic-not-a-number", magic("start x"), "got 'x'", r"for example 3"),
    Case("magic-zero", magic("start 0"), "got 0", r"use 1 or more"),
    Case("magic-job-without-name", magic("start --jobs =2"), "'=2'",
         r"a job name starts with a letter"),
    Case("magic-negative", magic("start -3"), "got -3", r"use 1 or more"),
    Case("magic-huge", magic("start 100000"), "100000", r"use a smaller count, or --backend dask"),
    Case("magic-unknown-backend", magic("start 3 --backend dsak"), "'dsak'",
         r"did you mean 'dask'\?\); choose one of: dask, inprocess, local"),
    Case("magic-negative-ps", magic("start --ps -1"), "got -1", r"use 0 or more"),
    Case("magic-workers-not-a-number", magic("start --workers two"), "got 'two'", r"for example 3"),
    Case("magic-job-without-count", magic("start --jobs master"), "'master'", r"write job=count"),
    Case("magic-port-out-of-range", magic("start --spec 'ps|localhost:70000'"), "'ps|localhost:70000'",
         r"use a port from 1 to 65535"),
    Case("magic-duplicate-port", magic("start --spec 'ps|localhost:2222,ps|localhost:2222'"),
         "localhost:2222", r"give each task its own port"),
    Case("magic-spec-without-bar", magic("start --spec 'ps:localhost:2222'"), "'ps:localhost:2222'",
         r"write job\|host:port"),
    Case("magic-timeout-not-a-number", magic("start --timeout soon"), "got 'soon'", r"e\.g\. --timeout 120"),
    Case("magic-unknown-network", magic("start --network lan"), "'lan'", r"choose 'private'"),
    Case("magic-private-inprocess", magic("start 2 --backend inprocess --network private"), "inprocess",
         r"use backend 'local'"),
    Case("magic-run-missing-script", magic("run --workers 2 nope.py"), "'nope.py'",
         r"give the path of a Python file"),
    Case("magic-run-zero-workers", magic(f"run --workers 0 {__file__}"), "got 0", r"use 1 or more"),
    Case("magic-run-unknown-placeholder", magic(f"run --workers 1 {__file__} --x={{foo}}"), "{foo}",
         r"use one of \{ps_hosts\}, .*write \{\{ and \}\} for literal braces"),
    Case("magic-unknown-start-method", magic("start 2 --start-method vfork"), "'vfork'",
         r"choose 'fork' .* or 'spawn'"),
    # the command line
    Case("cli-run-zero-workers", command("run", "--workers", "0", __file__), "got 0", r"use 1 or more"),
    Case("cli-run-missing-script", command("run", "--workers", "1", "nope.py"), "'nope.py'",
         r"give the path of a Python file"),
    Case("cli-run-unknown-placeholder", command("run", "--workers", "1", __file__, "--x={foo}"),
         "{foo}", r"use one of \{ps_hosts\}"),
    Case("cli-zero", command("cluster", "start", "0"), "got 0", r"use 1 or more"),
    Case("cli-unknown-backend", command("cluster", "start", "--backend", "kubernetes"), "'kubernetes'",
         r"choose one of: dask, inprocess, local"),
    Case("cli-job-twice", command("cluster", "start", "--jobs", "ps=1,ps=2"), "'ps'", r"give each job once"),
    Case("cli-port-zero", command("cluster", "start", "--spec", "ps|localhost:0"), "'ps|localhost:0'",
         r"use a port from 1 to 65535"),
    Case("cli-scheduler-without-scheme", command("cluster", "start", "--scheduler", "localhost:8786"),
         "'localhost:8786'", r"write it as tcp://host:port"),
    Case("cli-server-unknown-job", command("server", "--cluster_spec", "ps|localhost:2222", "--job_name",
                                           "worker"), "'worker'", r"its jobs are: ps"),
    Case("cli-server-task-out-of-range", command("server", "--cluster_spec", "ps|localhost:2222",
                                                 "--job_name", "ps", "--task_index", "3"),
         "--task_index 3", r"indices 0\.\.0"),
    # the Python API
    Case("api-fraction", api(lambda: dtflab.start_cluster(2.5)), "got 2.5", r"for example 3"),
    Case("api-bool", api(lambda: dtflab.start_cluster(True)), "got True", r"for example 3"),
    Case("api-unknown-backend", api(lambda: dtflab.start_cluster(backend="gpu")), "'gpu'", r"choose one of"),
    Case("api-empty", api(lambda: dtflab.start_cluster(ps=0, workers=0)), "ps=0 and workers=0",
         r"ask for at least one task"),
    Case("api-job-name", api(lambda: dtflab.start_cluster(jobs="9lives=1")), "'9lives'",
         r"starts with a letter"),
    Case("api-address-not-a-list", api(lambda: dtflab.start_cluster(spec={"ps": "localhost:2222"})),
         "'localhost:2222'", r"needs a list of host:port addresses"),
    Case("api-zero-timeout", api(lambda: dtflab.start_cluster(3, timeout=0)), "got 0", r"for example 120"),
    Case("api-unknown-network", api(lambda: dtflab.start_cluster(3, network="lan")), "'lan'",
         r"choose 'private'"),
    Case("api-run-missing-script", api(lambda: dtflab.run("nope.py", workers=1)), "'nope.py'",
         r"give the path of a Python file"),
    Case("api-unknown-start-method", api(lambda: dtflab.start_cluster(2, start_method="vfork")),
         "'vfork'", r"choose 'fork'"),
    Case("api-programs-for-a-missing-job", api(lambda: dtflab.start_cluster(
        2, programs={"chief": dtflab.cluster.Program.checked(__file__)})), "'chief'",
         r"its jobs are: ps, worker"),
    # placement
    Case("placement-unknown-device", api(lambda: PlacementPlan(devices=DEVICES).assign("w1", "/job:ps/task:5")),
         "'/job:ps/task:5'", r"this cluster has: /job:ps/task:0, /job:ps/task:1, /job:worker/task:0"),
    Case("placement-unknown-job", api(lambda: PlacementPlan.round_robin(None, devices=DEVICES, job="pss")),
         "'pss'", r"did you mean 'ps'\?\); its jobs are: ps, worker"),
    Case("placement-unknown-strategy", api(lambda: PlacementPlan(devices=DEVICES).use_strategy("greedyy")),
         "'greedyy'", r"did you mean 'greedy'\?"),
    Case("placement-device-not-a-string", api(lambda: PlacementPlan(devices=DEVICES).assign("w1", 3)),
         "got 3", r"a device is a string like '/job:ps/task:0'"),
    Case("api-job-count-not-a-number", api(lambda: dtflab.start_cluster(jobs="ps=x")), "'ps=x'",
         r"for example 3"),
    # the task options
    Case("task-negative-threads", api(lambda: dtflab.start_cluster(2, inter_op_threads=-1)),
         "inter_op_threads=-1", r"at least 0; for example inter_op_threads=2"),
    Case("task-huge-threads", api(lambda: dtflab.start_cluster(2, intra_op_threads=10**6)),
         "intra_op_threads=1000000", r"at most 256"),
    Case("task-threads-fraction", api(lambda: dtflab.start_cluster(2, inter_op_threads=1.5)),
         "inter_op_threads=1.5", r"a whole number"),
    # the problems
    Case("problem-zero-batch", api(lambda: train.exp_regression(batch_size=0)), "batch_size=0",
         r"at least 1; for example batch_size=100"),
    Case("problem-one-class", api(lambda: train.classification(classes=1)), "classes=1",
         r"at least 2; for example classes=10"),
    Case("problem-fractional-width", api(lambda: train.classification(width=10.5)), "width=10.5",
         r"a whole number; for example width=1024"),
    # the training loops
    Case("train-zero-steps", api(lambda: train.single(PROBLEM, steps=0)), "steps=0",
         r"at least 1; for example steps=200"),
    Case("train-negative-seed", api(lambda: train.single(PROBLEM, seed=-1)), "seed=-1",
         r"at least 0; for example seed=0"),
    Case("train-trace-step-past-the-end", api(lambda: train.single(PROBLEM, steps=10, trace_step=10)),
         "trace_step=10", r"at most 9"),
    Case("train-device-without-cluster", api(lambda: train.single(PROBLEM, device="worker:0")),
         "device='worker:0'", r"pass cluster= too"),
    Case("train-unknown-device", on_cluster(lambda c: train.single(PROBLEM, cluster=c, device="worker:7")),
         "'worker:7'", r"use one of: /job:ps/task:0, /job:worker/task:0, /job:worker/task:1"),
    Case("train-not-a-cluster", api(lambda: train.sync_data_parallel(PROBLEM, "cluster")), "cluster='cluster'",
         r"dtflab\.start_cluster\(3\)"),
    Case("train-zero-workers", on_cluster(lambda c: train.sync_data_parallel(PROBLEM, c, workers=0)),
         "workers=0", r"at least 1"),
    Case("train-too-many-workers", on_cluster(lambda c: train.async_parameter_server(PROBLEM, c, workers=3)),
         "workers=3", r"at most 2; for example workers=2"),
    Case("train-slow-unknown-task", on_cluster(
        lambda c: train.async_parameter_server(PROBLEM, c, slow={"worker:5": 0.05})), "'worker:5'",
         r"use one of: worker:0, worker:1"),
    Case("train-slow-negative", on_cluster(
        lambda c: train.sync_data_parallel(PROBLEM, c, slow={"worker:1": -1})), "slow['worker:1']=-1",
         r"0 or more"),
    Case("train-zero-checkpoint-every", on_cluster(
        lambda c: train.async_parameter_server(PROBLEM, c, checkpoint_every=0)), "checkpoint_every=0",
         r"for example checkpoint_every=20"),
    Case("train-gradient-bits", on_cluster(lambda c: train.sync_data_parallel(PROBLEM, c, gradient_bits=4)),
         "gradient_bits=4", r"one of 32, 16, 8"),
    Case("train-plan-of-another-cluster", on_cluster(
        lambda c: train.model_parallel(PROBLEM, c, PlacementPlan.by_layer(None, devices=DEVICES, job="ps"))),
         "'/job:ps/task:1'", r"use one of: /job:ps/task:0"),
    Case("train-ps-strategy-zero-steps", on_cluster(lambda c: train.ps_strategy(PROBLEM, c, steps=0)),
         "steps=0", r"for example steps=200"),
    Case("train-all-reduce-zero-threads", api(lambda: train.all_reduce(PROBLEM, threads=0)),
         "threads=0", r"for example threads=1"),
    Case("train-all-reduce-slow-unknown", api(lambda: train.all_reduce(PROBLEM, slow={"worker:2": 1})),
         "'worker:2'", r"use one of: worker:0, worker:1"),
    Case("train-all-reduce-collective-timeout", api(
        lambda: train.all_reduce(PROBLEM, collective_timeout_s=0)), "collective_timeout_s=0",
         r"more than 0; for example collective_timeout_s=30"),
    Case("train-pipeline-more-stages-than-layers", on_cluster(
        lambda c: train.pipeline(PROBLEM, c, stages=4)), "stages=4",
         r"at most 3 stages; use stages=3 or a deeper model, e\.g\. train\.classification\(hidden_layers=4\)"),
    Case("train-pipeline-more-stages-than-workers", on_cluster(
        lambda c: train.pipeline(PROBLEM, c, stages=3)), "stages=3",
         r"this cluster has 2; use stages=2 or start more, e\.g\. dtflab\.start_cluster\(workers=3\)"),
    Case("train-pipeline-uneven-micro-batches", on_cluster(
        lambda c: train.pipeline(PROBLEM, c, micro_batches=3)), "micro_batches=3",
         r"batch of 100 does not split into 3 equal micro-batches; use micro_batches=2, or a "
         r"batch_size divisible by 3"),
    Case("train-pipeline-unknown-schedule", on_cluster(
        lambda c: train.pipeline(PROBLEM, c, schedule="1F1B")), "schedule='1F1B'",
         r"one of 'gpipe', '1f1b'"),
    Case("train-pipeline-cut-past-the-model", on_cluster(
        lambda c: train.pipeline(PROBLEM, c, cut=[5])), "cut=[5]",
         r"for example cut=\[\d\]"),
    Case("train-tensor-parallel-more-ways-than-workers", on_cluster(
        lambda c: train.tensor_parallel(PROBLEM, c, ways=3)), "ways=3",
         r"this cluster has 2; use ways=2 or start more, e\.g\. dtflab\.start_cluster\(workers=3\)"),
    Case("train-tensor-parallel-ways-not-dividing-the-width", on_cluster(
        lambda c: train.tensor_parallel(train.classification(width=33, batch_size=64), c, ways=2)),
         "ways=2", r"hidden widths 33, 33 do not split into 2 equal slices; use ways=1"),
    Case("train-tensor-parallel-zero-ways", on_cluster(
        lambda c: train.tensor_parallel(PROBLEM, c, ways=0)), "ways=0", r"for example ways=2"),
    Case("train-tensor-parallel-slow-unknown-task", on_cluster(
        lambda c: train.tensor_parallel(PROBLEM, c, slow={"worker:2": 0.1})), "'worker:2'",
         r"use one of: worker:0, worker:1"),
    Case("train-sharded-uneven-batch", api(lambda: train.sharded_data_parallel(PROBLEM, workers=3)),
         "workers=3", r"batch of 100 does not split into 3 equal slices; use workers=2, or a "
                      r"batch_size divisible by 3"),
    Case("train-sharded-zero-threads", api(lambda: train.sharded_data_parallel(PROBLEM, threads=0)),
         "threads=0", r"for example threads=1"),
    Case("train-sharded-slow-unknown", api(
        lambda: train.sharded_data_parallel(PROBLEM, slow={"worker:2": 1})), "'worker:2'",
         r"use one of: worker:0, worker:1"),
    Case("train-sharded-zero-checkpoint-every", api(
        lambda: train.sharded_data_parallel(PROBLEM, checkpoint_every=0)), "checkpoint_every=0",
         r"for example checkpoint_every=10"),
    Case("train-sharded-collective-timeout", api(
        lambda: train.sharded_data_parallel(PROBLEM, collective_timeout_s=-1)),
         "collective_timeout_s=-1", r"more than 0; for example collective_timeout_s=30"),
    Case("api-slices-picture-strategy", api(lambda: dtflab.slices_picture(PROBLEM, "pipeline")),
         "'pipeline'", r"choose one of 'tensor_parallel', 'sharded'"),
    Case("train-layout-bytes-unknown", api(
        lambda: costs.layout_bytes("rows", {"batch": 2, "model": 2}, 8, (4, 8, 1))),
         "'rows'", r"choose one of 'data', 'model', 'both'"),
    # the watchdog's settings
    Case("watchdog-negative-floor", api(lambda: train.Watchdog(floor_s=-1)), "floor_s=-1",
         r"for example Watchdog\(floor_s=5\.0\)"),
    Case("watchdog-fractional-retries", api(lambda: train.Watchdog(retries=1.5)), "retries=1.5",
         r"a whole number >= 0"),
    Case("watchdog-not-settings", on_cluster(
        lambda c: train.async_parameter_server(PROBLEM, c, watchdog=30)), "watchdog=30",
         r"pass train\.Watchdog\(factor=\.\.\."),
]


@pytest.fixture(autouse=True)
def own_temp_folder(tmp_path, monkeypatch):
    """dtflab's temporary folders go to a folder of this test's, where no one else writes."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def leftovers() -> dict:
    me = psutil.Process()
    def alive(process) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    tree = {me.pid} | {child.pid for child in beside_the_notebooks(me.children(recursive=True)) if alive(child)}
    orphans = set()
    for process in psutil.process_iter(["cmdline", "ppid"]):
        if process.info["ppid"] == 1 and any("dtflab" in part for part in process.info["cmdline"] or ()) \
                and not in_a_notebook(process.pid):
            orphans.add(process.pid)
    listening = {c.laddr.port for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.pid in tree | orphans}
    return {"processes": tree, "orphaned dtflab processes": orphans, "listening ports": listening,
            "threads": {thread.ident for thread in threading.enumerate()},
            "fds": len(os.listdir("/proc/self/fd")),
            "log folders": set(glob.glob(os.path.join(tempfile.gettempdir(), "dtflab-*"))),
            "running clusters": len(list(running.clusters))}


def test_there_are_enough_cases_across_every_entry_point():
    kinds = {case.id.split("-")[0] for case in CASES}
    assert len(CASES) >= 60 and kinds == {"magic", "cli", "api", "placement", "task", "problem",
                                          "train", "watchdog"}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_line_naming_the_value_and_the_fix_and_leaves_nothing(ip, case):
    case.run(ip)  # warm-up: lazy imports open files and start nothing of ours
    before = leftovers()
    message = case.run(ip)
    assert leftovers() == before  # meant: the same count before and after the bad input
    assert "\n" not in message.strip(), message
    assert case.value in message, message
    assert re.search(case.fix, message), message
