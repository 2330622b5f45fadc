"""This cluster's hardware, measured in one call: what the planner's ``hardware="here"`` plans
on (``formulas.hardware.Hardware`` with ``measured=True``).

Four measurements, on the cluster's worker tasks, each a median of several runs:

- **matrix multiplies**: each task multiplies two n x n matrices (n = 256, 512, 1024, float32
  and bfloat16), every task at once, as a run's workers compute at once; the traced kernel's
  time gives each size's rate, the best of them the peak, each size's share of it the
  efficiency curve (the sizes' GFLOP as its thresholds);
- **memory bandwidth**: each task adds 1 to a 64 MB tensor (read and written);
- **a transfer**: one task's tensor read by another, at 4 kB and 4 MB: the time that grows
  with the bytes (one over the bandwidth) and the time that does not (the latency);
- **the executor's cost per op**: a chain of 200 additions of one number on one task, less a
  run of none, per addition, times the TensorFlow ops dtflab's transformer block runs for each
  op the step-time model counts (``ops_per_modelled_op``, read from a built graph).

Every task runs on this machine, so one node holds them all and its link is the loopback. The
tasks share the machine's cores: what a task's multiply reaches with every task multiplying is
what a run's device gets. About 20 s on 2 cores.
"""

from __future__ import annotations

import statistics
import time

from dtflab import checks, names
from dtflab._quiet import import_tf
from dtflab.train.formulas.hardware import Hardware, Link

SIZES = (256, 512, 1024)
#: TensorFlow ops a dtflab transformer block builds (forward, backward, Adam's share) over the
#: ops the step-time model charges for it (``formulas.step_time.block_ops``: 12 forward, each
#: also backward): measured by :func:`ops_per_modelled_op`.
MODELLED_OPS_PER_BLOCK = 2 * 12


def calibrate(cluster, *, repeats: int = 5) -> Hardware:
    """Measure ``cluster``'s worker tasks (see the module's docstring)."""
    import psutil

    checks.whole(repeats, "repeats", example=5)
    tasks = len(cluster.addresses.get("worker", []))
    if tasks < 2:
        raise ValueError(f"calibrate needs two worker tasks to time a transfer between them; "
                         f"this cluster has {tasks}: start one with dtflab.start_cluster(workers=2)")
    devices = [names.device(f"worker:{i}") for i in range(tasks)]
    target = cluster.target("worker", 0)
    rates = {precision: _matmul_rates(target, devices, precision, repeats)
             for precision in ("float32", "bfloat16")}
    peak = {precision: max(rate.values()) for precision, rate in rates.items()}
    curve = tuple(sorted(((2 * n ** 3 / 1e9, rates["float32"][n] / peak["float32"])
                          for n in SIZES), reverse=True))
    curve = curve[:-1] + ((0.0, curve[-1][1]),)
    bandwidth = _memory_bandwidth(target, devices, repeats)
    latency, per_byte = _transfer(target, devices[:2], repeats)
    per_op = _per_op(target, devices[0], repeats) * ops_per_modelled_op()
    link = Link("this machine's loopback (gRPC)", 1 / per_byte, latency, 1.0)
    return Hardware(
        f"here ({tasks} worker tasks on {psutil.cpu_count()} cores)", flops=peak,
        memory_bytes=psutil.virtual_memory().total / tasks, memory_bandwidth=bandwidth,
        per_node=tasks, node=link, cluster=link, matrix_efficiency=curve,
        vector_efficiency=((0.0, 1.0),), per_op_s=per_op, overlap=True, measured=True,
        source=f"calibrate(), {time.strftime('%Y-%m-%d %H:%M')}")


def _median_run(session, fetch, repeats: int) -> float:
    session.run(fetch)  # the first run allocates and picks its kernels
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(fetch)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _traced_op_s(session, fetch, op_type: str, repeats: int) -> float:
    """The median over runs of the slowest task's time in ``op_type`` ops (all at once)."""
    from dtflab.tracing.capture import trace

    session.run(fetch)
    found = []
    for _ in range(repeats):
        step = trace(session, fetch)
        per_task = [sum(t.duration_us for t in timings if op_type in t.op)
                    for timings in step.timings.values()]
        found.append(max(per_task) / 1e6)
    return statistics.median(found)


def _matmul_rates(target, devices, precision: str, repeats: int) -> dict[int, float]:
    tf = import_tf()
    rates = {}
    for n in SIZES:
        graph = tf.Graph()
        with graph.as_default():
            outs = []
            for i, device in enumerate(devices):
                with tf.device(device):
                    a = tf.Variable(tf.random.normal([n, n], seed=i), name=f"a{i}")
                    b = tf.Variable(tf.random.normal([n, n], seed=i + 7), name=f"b{i}")
                    product = tf.matmul(tf.cast(a, precision), tf.cast(b, precision))
                    outs.append(tf.reduce_sum(tf.cast(product[:1, :1], tf.float32)))
            fetch = tf.add_n(outs)
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(target, graph=graph) as session:
            session.run(init)
            seconds = _traced_op_s(session, fetch, "MatMul", repeats)
        rates[n] = 2 * n ** 3 / seconds
    return rates


def _memory_bandwidth(target, devices, repeats: int) -> float:
    tf = import_tf()
    elements = 16 * 2 ** 20  # 64 MB of float32
    graph = tf.Graph()
    with graph.as_default():
        outs = []
        for i, device in enumerate(devices):
            with tf.device(device):
                x = tf.Variable(tf.zeros([elements]), name=f"x{i}")
                outs.append(tf.reduce_sum((x + 1.0)[:1]))
        fetch = tf.add_n(outs)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(target, graph=graph) as session:
        session.run(init)
        seconds = _traced_op_s(session, fetch, "AddV2", repeats)
    return 2 * 4 * elements / seconds


def _transfer(target, pair, repeats: int) -> tuple[float, float]:
    """(latency s, seconds a byte) of one tensor sent from ``pair[0]`` to ``pair[1]``."""
    tf = import_tf()
    times = {}
    for nbytes in (4096, 4 * 2 ** 20):
        graph = tf.Graph()
        with graph.as_default():
            with tf.device(pair[0]):
                x = tf.Variable(tf.zeros([nbytes // 4]), name="x")
                sent = x + 0.0
            with tf.device(pair[1]):
                fetch = tf.reduce_sum(sent[:1])
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(target, graph=graph) as session:
            session.run(init)
            times[nbytes] = _median_run(session, fetch, 3 * repeats)
    per_byte = max((times[4 * 2 ** 20] - times[4096]) / (4 * 2 ** 20 - 4096), 1e-12)
    return max(times[4096] - 4096 * per_byte, 0.0), per_byte


def _per_op(target, device, repeats: int, chain: int = 200) -> float:
    tf = import_tf()
    times = {}
    for count in (0, chain):
        graph = tf.Graph()
        with graph.as_default(), tf.device(device):
            h = tf.constant([1.0])
            for _ in range(count):
                h = h + 1.0
            fetch = tf.reduce_sum(h)
        with tf.compat.v1.Session(target, graph=graph) as session:
            times[count] = _median_run(session, fetch, 3 * repeats)
    return max((times[chain] - times[0]) / chain, 0.0)


def ops_per_modelled_op(blocks: int = 2) -> float:
    """TensorFlow ops in one of dtflab's transformer blocks' training step (the ops a block's
    forward, backward and Adam update build, from a graph of 1 and of ``blocks`` blocks: the
    difference over the added blocks) over the ops the step-time model charges a block."""
    from dtflab.train.problems import transformer
    from dtflab.train.run.graphs import single_graph

    counts = []
    for depth in (1, blocks):
        built = single_graph(transformer(blocks=depth, d_model=32, heads=2, sequence=8,
                                         batch_size=2), seed=0)
        counts.append(len(built.graph.get_operations()))
    per_block = (counts[1] - counts[0]) / (blocks - 1)
    return per_block / MODELLED_OPS_PER_BLOCK
