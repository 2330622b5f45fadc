"""The all-reduce loop (MultiWorkerMirroredStrategy in worker programs) beside the parameter-
server loops: correctness, faults, stragglers, bytes on the wire, traces (live records, Stop and a
killed worker: ``test_every_loop.py``)."""

import os
import signal
import time

import numpy as np
import pytest

import dtflab
from dtflab import train
from dtflab.errors import TaskError
from dtflab.train.machinery.reports import Reports, WorkerDied
from dtflab.tracing.step import short_device

from conftest import killed_with_checkpoints, wait_until

pytestmark = pytest.mark.slow

PROBLEM = train.exp_regression()
#: A program that binds 127.0.0.1:PORT (its argument) inside the tasks' network.
_PROGRAMS = __import__("pathlib").Path(__file__).with_name("programs")
_BINDS = str(_PROGRAMS / "binds_port.py")
#: Same seed and global batch as one process: float rounding of the gradient sums only.
TOLERANCE = 1e-5
#: Big enough that tensors dominate gRPC's framing: 85,002 parameters, 340,008 bytes.
WIRE_PROBLEM = train.classification(width=256, batch_size=256)


@pytest.fixture(scope="module")
def single_run():
    return train.single(PROBLEM, steps=40, seed=5)


def test_all_reduce_matches_one_process_and_every_copy_agrees(single_run):
    history = train.all_reduce(PROBLEM, workers=2, steps=40, seed=5)
    assert history.steps_per_worker == {"worker:0": 40, "worker:1": 40}
    for worker in ("worker:0", "worker:1"):
        losses = [r.loss for r in history.records if r.worker == worker]
        assert np.max(np.abs(np.array(losses) - single_run.losses)) <= TOLERANCE
    fingerprints = history.details["fingerprints"]
    assert len(fingerprints["worker:0"]) == 4  # every check_every=10 steps
    assert fingerprints["worker:0"] == fingerprints["worker:1"]  # the weights, bit for bit
    assert history.examples == 40 * PROBLEM.batch_size  # each worker trained half of each batch
    row = dtflab.compare(single_run, history).rows[1]
    assert row["max_abs_loss_diff"] <= TOLERANCE and row["steps"] == 40  # steps, not records
    assert history.steps == len(history.losses) == 40 and "40 steps" in history.summary()
    assert history.cluster.stopped  # the worker programs end with the run
    port = history.details["report_port"]  # local workers report through 127.0.0.1
    assert history.details["reported_to"] == {w: f"127.0.0.1:{port}" for w in ("worker:0", "worker:1")}


def test_softmax_all_reduce_with_three_workers_matches_one_process():
    problem = train.classification(width=32, batch_size=96)
    single = train.single(problem, steps=15, seed=1)
    history = train.all_reduce(problem, workers=3, steps=15, seed=1)
    assert set(history.steps_per_worker.values()) == {15}
    worker = [r.loss for r in history.records if r.worker == "worker:2"]
    assert np.max(np.abs(np.array(worker) - single.losses)) <= TOLERANCE


def test_with_checkpoints_every_worker_restarts_from_the_newest_and_the_curve_goes_on():
    reference, history, recovery = killed_with_checkpoints(train.all_reduce, PROBLEM)
    assert recovery.task == "worker:1" and recovery.restarted == "every worker"
    steps = [r.step for r in history.records if r.worker == "worker:0"]
    assert steps[-1] == 59 and len(steps) == 60 + recovery.lost  # the lost steps ran twice
    assert steps[recovery.failed_at] == recovery.resumed_from
    expected = {r.step: r.loss for r in reference.records}
    assert max(abs(r.loss - expected[r.step]) for r in history.records) <= TOLERANCE


def test_a_straggler_slows_every_worker():
    history = train.all_reduce(PROBLEM, workers=2, steps=16, slow={"worker:1": 0.1})
    for worker in ("worker:0", "worker:1"):
        times = [r.time_s for r in history.records if r.worker == worker]
        assert np.median(np.diff(times)) >= 0.1  # worker:0 waits for worker:1 every step


def test_bytes_on_the_wire_all_reduce_against_a_parameter_server():
    model = WIRE_PROBLEM.parameter_bytes
    all_reduce_wire = train.WireBytes(after_step=2, steps=8)
    train.all_reduce(WIRE_PROBLEM, workers=2, steps=12, callbacks=[all_reduce_wire])
    sent = all_reduce_wire.per_step.sent
    for source, destination in (("worker:0", "worker:1"), ("worker:1", "worker:0")):
        # ring all-reduce: 2(N-1)/N x model bytes from each worker, here 1x, plus framing
        assert 1.0 * model <= sent[source, destination] <= 1.05 * model, sent

    ps_wire = train.WireBytes(after_step=2, steps=8)
    with dtflab.start_cluster(jobs="ps=1,worker=2") as cluster:
        train.sync_data_parallel(WIRE_PROBLEM, cluster, steps=12, callbacks=[ps_wire])
    sent = ps_wire.per_step.sent
    for worker in ("worker:0", "worker:1"):
        assert 1.0 * model <= sent["ps:0", worker] <= 1.15 * model, sent  # the parameters out
        assert 1.0 * model <= sent[worker, "ps:0"] <= 1.15 * model, sent  # the gradients in


def collectives_in(trace) -> dict[str, list]:
    return {device: [t for t in timings if t.name.endswith(":CollectiveReduceV2")]
            for device, timings in trace.timings.items()}


def test_a_traced_step_shows_each_worker_and_its_collectives():
    history = train.all_reduce(PROBLEM, workers=2, steps=6, trace_step=3)
    if not all(collectives_in(history.trace).values()):
        # TensorFlow's profiler now and then records none of a worker's asynchronous collective
        # events on a loaded machine (once in this stop's two fresh-clone runs on 2 cores; the
        # step itself ran them). A second traced run is asserted on, not skipped.
        history = train.all_reduce(PROBLEM, workers=2, steps=6, trace_step=3)
    trace = history.trace
    assert [short_device(d) for d in trace.devices] == ["worker:0", "worker:1"]
    for device, collectives in collectives_in(trace).items():
        assert collectives and all(t.kind == "transfer" for t in collectives), device
    shares = trace.collective_overlap()  # each worker's collective time under compute
    assert set(shares) == set(trace.timings) and all(0.0 <= s <= 1.0 for s in shares.values())
    assert history.overlap_share == pytest.approx(sum(shares.values()) / 2)


def test_buckets_split_the_all_reduce_into_packs_and_the_trace_measures_their_overlap():
    # w2 (1 MiB) dominates; 256 KiB buckets make [b3, w3, b2, w2] one pack and [b1, w1] the
    # other (TensorFlow packs last layer first). How much of their time hides under compute
    # depends on when the executor launches them (measured on 2 quiet cores: 0.001 with one
    # pack, 0.45 with these; under load 0.005 to 0.09): printed by the benchmark, not asserted.
    problem = train.classification(width=512, batch_size=1024)
    buckets = train.all_reduce(problem, workers=2, steps=5, threads=1, trace_step=3,
                               bucket_bytes=256 * 1024)
    if not all(collectives_in(buckets.trace).values()):  # the profiler's lost events: see above
        buckets = train.all_reduce(problem, workers=2, steps=5, threads=1, trace_step=3,
                                   bucket_bytes=256 * 1024)
    for device, timings in buckets.trace.timings.items():
        packs = [t for t in timings if t.name.endswith("CollectiveReduceV2")]
        assert len(packs) == 2, device
    assert 0.0 <= buckets.overlap_share <= 1.0
    losses = train.single(problem, steps=5).losses  # packing changes no arithmetic
    own = [r.loss for r in buckets.records if r.worker == "worker:0"]
    assert np.max(np.abs(np.array(losses) - own)) <= TOLERANCE


def test_collective_overlap_is_the_collective_time_under_compute():
    from dtflab.tracing.step import OpTiming, StepTrace

    device = "/job:worker/replica:0/task:0/device:CPU:0"
    timings = [OpTiming(device, "a:MatMul", "tf_Compute", 0, 40),
               OpTiming(device, "b:MatMul", "tf_Compute", 30, 30),       # 0-60 busy
               OpTiming(device, "pack0:CollectiveReduceV2", "collective_ops", 50, 20, "transfer"),
               OpTiming(device, "pack1:CollectiveReduceV2", "collective_ops", 80, 20, "transfer")]
    trace = StepTrace(None, {}, [], [], {device: timings}, 100.0)
    assert trace.collective_overlap() == {device: 10 / 40}  # 10 of 40 µs under compute


def test_a_worker_that_crashes_in_the_traced_step_is_restarted_and_the_step_traced_again():
    # TensorFlow's profiler sometimes corrupts the heap in stop() on a loaded machine; here a
    # SIGABRT during the traced step stands in for it.
    run = train.all_reduce(PROBLEM, workers=2, steps=8, trace_step=3, background=True,
                           slow={"worker:0": 0.5})
    assert wait_until(lambda: run.history.steps >= 3, timeout=60)  # steps 0-2 recorded
    time.sleep(0.1)
    os.kill(next(t.pid for t in run.history.cluster.tasks if t.name == "worker:1"), signal.SIGABRT)
    history = run.wait(timeout=120)
    # One recovery, or two if the profiler really crashed in the step traced again.
    assert 1 <= len(history.recoveries) <= 2, history.recoveries
    for recovery in history.recoveries:  # resumed from 0: worker 0 had not saved yet
        assert recovery.failed_at == 3 and recovery.resumed_from in (0, 3)
    assert all("in the traced step 3" in failure for failure in history.failures)
    assert "Fatal Python error: Aborted" in history.failures[0]
    assert all(any(t.name.endswith(":CollectiveReduceV2") for t in timings)
               for timings in history.trace.timings.values())
    for worker in ("worker:0", "worker:1"):
        assert {r.step for r in history.records if r.worker == worker} == set(range(8))


def test_a_worker_that_dies_before_its_hello_ends_the_run_instead_of_hanging_it():
    # The others wait in the strategy's start-up for it and never say hello; the notebook must
    # notice the dead one (CI once hung here forever: a worker's port was taken).
    run = train.all_reduce(train.exp_regression(batch_size=99), workers=3, steps=50, background=True)
    run.history.cluster.kill("worker", 2)
    with pytest.raises(TaskError, match=r"^worker:2 was killed before its first step"):
        run.wait(timeout=60)
    assert all(str(t.state) != "running" for t in run.history.cluster.tasks)


def test_a_worker_that_crashes_after_its_hello_ends_the_wait_for_the_others_at_once(run_programs):
    # worker:0 greets and crashes while worker:1 has not greeted yet: worker:1 would wait in its
    # start-up's collective for ever, so the notebook must not wait out its whole timeout.
    reports = Reports(2)
    try:
        cluster = run_programs(str(_PROGRAMS / "greets_then_crashes.py"), str(reports.port), workers=2)
        cluster.let_tasks_reach(reports.port)
        with pytest.raises(WorkerDied, match=r"^worker:0 exited with code 3"):
            reports.accept(cluster, timeout=120)  # not TimeoutError: noticed at a look
    finally:
        reports.close()


def test_a_run_closes_the_way_back_it_opened_for_its_workers():
    history = train.all_reduce(PROBLEM, workers=2, steps=3)
    # the report port's number is free again inside the private network: a task may bind it
    port = history.details["report_port"]
    probe = dtflab.run(_BINDS, str(port), workers=1)
    try:
        assert probe.wait(timeout=60) == {"worker:0": 0}, probe.logs("worker:0")
    finally:
        probe.stop()


def test_single_runs_on_a_task_given_as_a_device_string():
    with dtflab.start_cluster(2) as cluster:
        history = train.single(PROBLEM, steps=5, cluster=cluster, device="/job:worker/task:0")
    assert history.steps == 5


@pytest.mark.parametrize("kwargs, message", [
    (dict(workers=0), "workers"),
    (dict(workers=3), "does not split into 3"),
    (dict(slow={"worker:5": 0.1}), r"names 'worker:5'.*which is not a task of this run; use one of: "
                                   r"worker:0, worker:1"),
    (dict(checkpoint_every=0), r"checkpoint_every=0: checkpoint_every must be a whole number of at "
                               r"least 1; for example checkpoint_every=10"),
    (dict(checkpoint_every=10, scheduler="tcp://127.0.0.1:1"),
     r"checkpoint_every on a Dask cluster needs checkpoint_dir, a folder this machine and every "
     r"worker's host share"),
    (dict(trace_step=3, client=object()), r"trace_step on a Dask cluster needs checkpoint_dir"),
])
def test_bad_input_is_refused_before_anything_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train.all_reduce(PROBLEM, steps=5, **{"workers": 2, **kwargs})
