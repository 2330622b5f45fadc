"""dtflab.trace on real task servers: byte figures, transfers, timings, chrome export."""

import json
from pathlib import Path

import numpy as np
import pytest

import dtflab
from dtflab._quiet import import_tf
from dtflab.tracing import recording, short_device
from dtflab.train.examples import deep_chain, exp_regression, towers

tf = import_tf()
F32 = 4
WEIGHTS = [(1, 16), (16, 32), (32, 1)]
BIASES = [(16,), (32,), (1,)]
ALL_PARAMS_BYTES = F32 * sum(int(np.prod(s)) for s in WEIGHTS + BIASES)  # 609 floats


@pytest.fixture(scope="module")
def cluster():
    # inprocess servers cannot be stopped; one cluster serves the whole module.
    with dtflab.start_cluster(jobs="master=1,ps=2,worker=2", backend="inprocess") as c:
        yield c


def session_for(cluster, built):
    session = tf.compat.v1.Session(cluster.target("master"), graph=built.graph)
    session.run(built.init)
    return session


def by_route(step):
    return {(short_device(a), short_device(b)): n for (a, b), n in step.bytes_between().items()}


def test_model_parallel_forward_reads_exactly_the_float32_parameters(cluster):
    built = exp_regression()
    with session_for(cluster, built) as session:
        step = dtflab.trace(session, built.loss, built.feed)
    routes = by_route(step)
    assert routes == {("ps:0", "master:0"): F32 * sum(a * b for a, b in WEIGHTS),   # 2,240
                      ("ps:1", "master:0"): F32 * sum(a for (a,) in BIASES)}         # 196
    weights = sorted(t.shape for t in step.transfers if short_device(t.src_device) == "ps:0")
    assert weights == sorted(WEIGHTS)
    assert all(t.dtype == "float32" and t.nbytes == F32 * int(np.prod(t.shape)) for t in step.transfers)
    assert all(t.tensor_name.endswith("ReadVariableOp:0") for t in step.transfers)
    assert all(t.consumers for t in step.transfers)


def test_model_parallel_training_step_sends_the_gradients_back(cluster):
    built = exp_regression()
    with session_for(cluster, built) as session:
        step = dtflab.trace(session, built.train, built.feed)
    routes = by_route(step)
    assert routes[("ps:0", "master:0")] == 2240 and routes[("master:0", "ps:0")] == 2240
    assert routes[("master:0", "ps:1")] == 196


def test_all_variables_on_the_master_means_no_transfer_between_tasks(cluster):
    master = "/job:master/task:0"
    built = exp_regression(master, master, master)
    with session_for(cluster, built) as session:
        step = dtflab.trace(session, built.train, built.feed)
    assert step.transfers == [] and step.bytes_between() == {}
    assert {short_device(d) for d in step.partitions} == {"master:0"}
    feeds = {t.tensor_name: t for t in step.client_transfers if t.from_client}
    assert feeds["x:0"].shape == (100, 1) and feeds["x:0"].nbytes == 400


def test_sync_towers_send_each_workers_gradients_to_the_ps(cluster):
    built = towers(2)
    with session_for(cluster, built) as session:
        step = dtflab.trace(session, built.train, built.feed)
    for i in (0, 1):
        grads = [t for t in step.transfers if short_device(t.src_device) == f"worker:{i}"
                 and short_device(t.dst_device) == "ps:0" and "gradients" in t.tensor_name]
        assert sum(t.nbytes for t in grads) == ALL_PARAMS_BYTES
        assert all(t.tensor_name.startswith(f"tower{i}/") for t in grads)
        # and every worker reads all parameters from the ps
        reads = [t for t in step.transfers if short_device(t.src_device) == "ps:0"
                 and short_device(t.dst_device) == f"worker:{i}"]
        assert sum(t.nbytes for t in reads) == ALL_PARAMS_BYTES


def test_timings_are_non_negative_and_inside_the_step(cluster):
    built = towers(2)
    with session_for(cluster, built) as session:
        step = dtflab.trace(session, built.train, built.feed)
    timings = [t for device in step.timings.values() for t in device]
    assert timings and step.step_us > 0
    assert all(t.start_us >= 0 and t.duration_us >= 0 and t.end_us <= step.step_us for t in timings)
    assert {short_device(d) for d in step.timings} >= {"ps:0", "worker:0", "worker:1"}
    timed = [t for t in step.transfers if t.start_us is not None]
    # TF records a RecvTensor for most cross-task RPCs, not all: 28 of 28 on a quiet machine,
    # 20 of 28 in a loaded CI run (why some go missing is not known). Those it records are timed.
    assert timed
    assert all(0 <= t.start_us and t.start_us + t.duration_us <= step.step_us for t in timed)
    totals = step.device_totals()
    assert all(total["compute_us"] > 0 for device, total in totals.items()
               if short_device(device).startswith("worker"))


def test_tracing_does_not_change_what_the_step_returns(cluster):
    built = exp_regression()
    with session_for(cluster, built) as session:
        plain = session.run(built.loss, built.feed)
        step = dtflab.trace(session, built.loss, built.feed)
    assert step.result == plain


def test_options_you_pass_are_kept_and_your_run_metadata_is_filled(cluster):
    built = exp_regression()
    options = tf.compat.v1.RunOptions(timeout_in_ms=30000)
    metadata = tf.compat.v1.RunMetadata()
    with session_for(cluster, built) as session:
        step = dtflab.trace(session, built.loss, built.feed, options=options, run_metadata=metadata)
    assert options.trace_level == tf.compat.v1.RunOptions.NO_TRACE  # the caller's copy untouched
    assert len(metadata.partition_graphs) == 3 and step.transfers


def test_tf2_functions_get_a_clear_error():
    @tf.function
    def step():
        return tf.constant(1)

    with pytest.raises(TypeError, match=r"dtflab.trace takes a tf.compat.v1 Session; a callable "
                                         r"\(.*\) is TF2 code.*TensorFlow profiler"):
        dtflab.trace(step, None)
    with pytest.raises(TypeError, match=r"needs a tf.compat.v1 Session, got int"):
        dtflab.trace(3, None)


@pytest.mark.parametrize("select, traced_calls", [("first", {0}), ("last", {0, 1, 2}), (1, {1})])
def test_recording_traces_the_chosen_run_and_leaves_the_others_alone(cluster, select, traced_calls):
    built = exp_regression()
    base = tf.compat.v1.Session.__mro__[1]
    original = base.run
    with session_for(cluster, built) as session:
        partitions_seen = []
        with recording(select) as kept:
            for i in range(3):
                metadata = tf.compat.v1.RunMetadata()
                session.run(built.loss, built.feed, run_metadata=metadata)
                partitions_seen.append(len(metadata.partition_graphs))
    assert len(kept) == 1  # "last" traces every call but keeps one
    assert partitions_seen == [3 if i in traced_calls else 0 for i in range(3)]
    assert base.run is original


def test_chrome_trace_round_trips_with_one_process_per_task(cluster, tmp_path):
    built = towers(2)
    with session_for(cluster, built) as session:
        step = dtflab.trace(session, built.train, built.feed)
    path = tmp_path / "step.json"
    step.to_chrome_trace(path)
    trace = json.loads(Path(path).read_text())
    events = trace["traceEvents"]
    processes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == {short_device(d) for d in step.devices}
    assert sum(e["ph"] == "X" for e in events) == sum(len(t) for t in step.timings.values())
    starts = [e for e in events if e["ph"] == "s"]
    finishes = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(finishes) == len(step.transfers)
    assert {e["id"] for e in starts} == {e["id"] for e in finishes}
    assert all(e["ts"] >= 0 for e in events if "ts" in e)


def test_a_thousand_op_graph_traces(cluster):
    built = deep_chain(["/job:worker/task:0", "/job:worker/task:1", "/job:ps/task:0"], layers=60)
    with session_for(cluster, built) as session:
        step = dtflab.trace(session, built.train, built.feed)
    assert len(step.ops()) > 1000
    activations = [t for t in step.transfers if t.shape == (16, 8)]
    assert len(activations) >= 59 and all(t.nbytes == 16 * 8 * F32 for t in activations)
