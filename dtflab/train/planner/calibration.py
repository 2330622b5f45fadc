"""This cluster's hardware, measured in one call: what the planner's ``hardware="here"`` plans
on (``planner.hardware.Hardware`` with ``measured=True``).

These measurements, on the cluster's worker tasks, each a median of several runs; where an op is
timed, a chain of it runs in one step (Grappler off, so the chain is not folded), less a step
of none, per op: its fixed cost included, as a run's ops pay it, and no tracing's cost:

- **matrix multiplies**: each task a chain of n x n multiplies (n = 256, 512, 1024, float32 and
  bfloat16), every task at once, as a run's workers compute at once; the best size's rate is
  the peak, each size's share of it the efficiency curve (the sizes' GFLOP as its thresholds);
  and n = 32 to 1024 on one task alone (``matrix_rates``, what the executor's simulation
  prices a multiply at);
- **memory bandwidth**: each task a chain of additions on a 64 MB tensor (read and written),
  and, for it and a 512 x 512 multiply, one task alone against as many as cores at once,
  timed in turn round after round (``together``: what an op keeps of its speed while the
  other cores are busy);
- **a transfer**: one task's tensor read by another, at 4 kB and 4 MB, less the same step with
  the tensor read where it was made: the time that grows with the bytes (one over the
  bandwidth) and the time that does not (the latency);
- **a step**: feeding one number to a task and fetching it, from a session on another task:
  what a training step costs before any work (``per_step_s``);
- **the block's element-wise work**: untraced training steps of dtflab's transformer (1 and 3
  blocks, at two widths) on one task; each block's time less its multiplies' is solved for a
  fixed cost per op the model counts (``per_op_s``) and a cost per element-wise byte
  (``vector_traffic`` over the bandwidth): dtflab's LayerNorm, GELU and softmax are several
  TensorFlow ops each where fused kernels are one, and this prices what they cost here;
- **for the executor's simulation** (``planner.op_costs``): each class of op's fixed cost and
  cost a byte, a trip between two tasks inside a step, a step's cost a task, and the share of
  a trip that is work on a core (``op_costs``, ``transfer_cores``).

Every task runs on this machine, so one node holds them all and its link is the loopback. The
tasks share the machine's cores: what a task's multiply reaches with every task multiplying is
what a run's device gets. About 35 s on 2 cores.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import fields, is_dataclass, replace

from dtflab import checks, names
from dtflab._quiet import import_tf
from dtflab.machine import cpus
from dtflab.train.planner.hardware import Hardware, Link
from dtflab.train.planner.op_costs import (hops, interleaved, median_run, op_costs,
                                           timing_session, trip_on_cores)

SIZES = (256, 512, 1024)
#: The multiplies timed on one task alone, for ``Hardware.matrix_rates`` (a block's attention
#: multiplies are as small as the smallest).
ALONE_SIZES = (32, 64, 128, 256, 512, 1024)
#: The op charges the step-time model makes for a block (``planner.step_time.block_ops``: 12
#: ops forward, each again backward).
MODELLED_OPS_PER_BLOCK = 2 * 12
#: How many times the trips between tasks are measured, the median kept (``transfer``,
#: ``task``, ``transfer_cores``): about 4 s each.
TRIES = 3


def calibrate(cluster, *, repeats: int = 5, tries: int = 1) -> Hardware:
    """Measure ``cluster``'s worker tasks (see the module's docstring), ``tries`` times over
    (each try as long as one calibration), each figure then the median of its tries. A
    figure moves from one calibration to the next, and a graph loop's prediction with it
    (``benchmarks/plan.py`` prints each round's calibration): one try cannot tell a moment of
    the machine from the machine."""
    checks.cluster(cluster)
    checks.whole(repeats, "repeats", example=5)
    checks.whole(tries, "tries", example=3)
    tasks = len(cluster.addresses.get("worker", []))
    if tasks < 2:
        raise ValueError(f"calibrate needs two worker tasks to time a transfer between them; "
                         f"this cluster has {tasks}: start one with "
                         f"dtflab.start_cluster(workers=2)")
    found = [_measure(cluster, tasks, repeats) for _ in range(tries)]
    if tries == 1:
        return found[0]
    return replace(median_of(found), source=f"{found[-1].source}, each figure the median of "
                                            f"{tries} tries")


def median_of(found):
    """Each number of ``found`` (measured figures: Hardware, its Links, dicts and tuples of
    them, alike in shape), the median of its values; anything else, the first's."""
    first = found[0]
    if is_dataclass(first):
        return replace(first, **{f.name: median_of([getattr(one, f.name) for one in found])
                                 for f in fields(first)})
    if isinstance(first, dict):
        return {key: median_of([one[key] for one in found]) for key in first
                if all(key in one for one in found)}
    if isinstance(first, tuple):
        return tuple(median_of([one[i] for one in found]) for i in range(len(first)))
    if isinstance(first, bool) or not isinstance(first, (int, float)):
        return first
    return statistics.median(found) if isinstance(first, float) else statistics.median_low(found)


def _measure(cluster, tasks: int, repeats: int) -> Hardware:
    """One calibration (:func:`calibrate`'s try)."""
    import psutil

    devices = [names.device(f"worker:{i}") for i in range(tasks)]
    target = cluster.target("worker", 0)
    rates = {precision: _matmul_rates(target, devices, precision, repeats)
             for precision in ("float32", "bfloat16")}
    peak = {precision: max(rate.values()) for precision, rate in rates.items()}
    sharing = max(1.0, tasks / cpus())
    curve = tuple(sorted(((2 * n ** 3 / 1e9, rates["float32"][n] / peak["float32"])
                          for n in SIZES), reverse=True))
    curve = curve[:-1] + ((0.0, curve[-1][1]),)
    alone = _matmul_rates_alone(target, devices[0], repeats)
    bandwidth = _memory_bandwidth(target, devices, repeats)
    together = {}
    if cpus() >= 2 and tasks >= 2:  # a second core: what an op keeps while the other runs one
        busy = devices[:min(tasks, int(cpus()))]
        together = {"matrix": _kept_together(target, busy, _multiply(512, "float32"), repeats),
                    "memory": _kept_together(target, busy, _addition(), repeats)}
    latency, per_byte = _transfer(target, devices[:2], repeats)
    per_step = _per_step(cluster.target("worker", tasks - 1), devices[0], repeats)
    link = Link("this machine's loopback (gRPC)", 1 / per_byte, latency, 1.0)
    hardware = Hardware(
        f"here ({tasks} worker tasks on {psutil.cpu_count()} cores)", flops=peak, cpus=cpus(),
        memory_bytes=psutil.virtual_memory().total / tasks, memory_bandwidth=bandwidth,
        per_node=tasks, node=link, cluster=link, matrix_efficiency=curve,
        vector_efficiency=((0.0, 1.0),), per_step_s=per_step, overlap=True, measured=True,
        matrix_rates=tuple((2 * n ** 3 / 1e9, rate) for n, rate in sorted(alone.items())),
        together=together,
        source=f"calibrate(), {time.strftime('%Y-%m-%d %H:%M')}")
    per_op, seconds_per_byte = element_wise(target, devices[0], hardware, repeats)
    # timed on one task while the others wait: with more tasks than CPUs, each gets a share
    # (the multiplies were timed with every task at once and carry it already)
    # an element-wise op's bytes cost what the block's did: bytes x traffic / bandwidth
    costs, cached = op_costs(target, devices[0], repeats)
    trips = _median_of(lambda: hops(target, devices[:2], repeats))
    on_cores = (statistics.median(trip_on_cores(target, devices[:2]) for _ in range(TRIES))
                if cpus() >= 2 else 1.0)
    return replace(hardware, per_op_s=per_op * sharing,
                   vector_traffic=max(seconds_per_byte * bandwidth, 1e-3) * sharing,
                   op_costs={**costs, **trips}, cached=cached, transfer_cores=on_cores)


def _median_of(measure) -> dict:
    """Each figure of ``measure()`` (``{name: (seconds, seconds a byte)}``), the median of
    :data:`TRIES` calls: a trip between tasks, timed one step after another, moves from one
    call to the next (its fixed cost, its cost a byte and its share on a core alike)."""
    return median_of([measure() for _ in range(TRIES)])


def _chain_graph(devices, make, count: int):
    """``(graph, fetch, init)``: each task in ``devices`` a chain of ``count`` ops, all run at
    once. ``make(tf, i)`` is ``(start, step)``: the chain's first tensor and the op applied to
    it."""
    tf = import_tf()
    graph = tf.Graph()
    with graph.as_default():
        outs = []
        for i, device in enumerate(devices):
            with tf.device(device):
                h, step = make(tf, i)
                for _ in range(count):
                    h = step(h)
                outs.append(tf.reduce_sum(tf.reshape(h, [-1])[:1]))
        fetch = tf.add_n(outs)
        init = tf.compat.v1.global_variables_initializer()
    return graph, fetch, init


def _chained(target, devices, make, repeats: int, chain: int = 8) -> float:
    """Seconds one op of a chain of ``chain`` takes, every task running its chain at once:
    a step of chains less a step of none, over ``chain`` (``make``: :func:`_chain_graph`)."""
    times = {}
    for count in (0, chain):
        graph, fetch, init = _chain_graph(devices, make, count)
        with timing_session(target, graph) as session:
            session.run(init)
            times[count] = median_run(session, fetch, repeats)
    return max((times[chain] - times[0]) / chain, 1e-9)


def _kept_together(target, busy, make, repeats: int, chain: int = 8) -> float:
    """What an op keeps of its speed while every task in ``busy`` runs its chain at once (at
    most 1): one op's time alone on ``busy[0]`` over its time among them. Each round times the
    four steps (none and a chain, alone and together) one after another, and the median of
    the rounds' ratios is kept, so the machine's drift between the two falls on both. What it
    cannot remove: another program on the machine while it runs."""
    times = interleaved(target, {(who, count): _chain_graph(devices, make, count)
                                 for who, devices in (("alone", busy[:1]), ("together", busy))
                                 for count in (0, chain)}, 2 * repeats)
    ratios = []
    for round_ in range(2 * repeats):
        alone = times["alone", chain][round_] - times["alone", 0][round_]
        together = times["together", chain][round_] - times["together", 0][round_]
        if alone > 0 and together > 0:
            ratios.append(alone / together)
    return min(1.0, statistics.median(ratios)) if ratios else 1.0


def _multiply(n: int, precision: str):
    """``make`` (:func:`_chain_graph`) of an n x n multiply in ``precision``."""
    def make(tf, i):
        w = tf.cast(tf.Variable(tf.random.normal([n, n], stddev=n ** -0.5, seed=i),
                                name=f"w{i}"), precision)
        return tf.cast(tf.Variable(tf.random.normal([n, n], seed=i + 7), name=f"a{i}"),
                       precision), lambda h: tf.matmul(h, w)

    return make


def _addition(megabytes: int = 64):
    """``make`` (:func:`_chain_graph`) of an addition on a ``megabytes`` tensor."""
    elements = megabytes * 2 ** 20 // 4

    def make(tf, i):
        return tf.Variable(tf.zeros([elements]), name=f"x{i}") * 1.0, lambda h: h + 1.0

    return make


def _matmul_rates(target, devices, precision: str, repeats: int) -> dict[int, float]:
    """FLOP/s of an n x n multiply on every task at once, by n (its fixed cost included)."""
    return {n: 2 * n ** 3 / _chained(target, devices, _multiply(n, precision), repeats)
            for n in SIZES}


def _matmul_rates_alone(target, device, repeats: int) -> dict[int, float]:
    """FLOP/s of an n x n float32 multiply on one task alone, by n (:data:`ALONE_SIZES`): a
    chain long enough to take about the same time at every size."""
    rates = {}
    for n in ALONE_SIZES:
        def make(tf, i, n=n):
            w = tf.Variable(tf.random.normal([n, n], stddev=n ** -0.5, seed=i), name="w")
            return tf.Variable(tf.random.normal([n, n], seed=i + 7), name="a") * 1.0, \
                lambda h: tf.matmul(h, w)

        chain = max(8, min(256, 2 ** 24 // n ** 3 * 8))
        rates[n] = 2 * n ** 3 / _chained(target, [device], make, repeats, chain=chain)
    return rates


def _memory_bandwidth(target, devices, repeats: int, megabytes: int = 64) -> float:
    """Bytes a second an addition reads and writes on a 64 MB tensor, every task at once."""
    return 2 * megabytes * 2 ** 20 / _chained(target, devices, _addition(megabytes), repeats)


def _transfer(target, pair, repeats: int) -> tuple[float, float]:
    """(latency s, seconds a byte) of one tensor sent from ``pair[0]`` to ``pair[1]``: a step
    that sends it, less the same step with the tensor read where it was made."""
    tf = import_tf()
    times = {}
    for nbytes in (4096, 4 * 2 ** 20):
        for reader in pair:
            graph = tf.Graph()
            with graph.as_default():
                with tf.device(pair[0]):
                    x = tf.Variable(tf.zeros([nbytes // 4]), name="x")
                    sent = x + 0.0
                with tf.device(reader):
                    fetch = tf.reduce_sum(tf.math.sin(sent))
                init = tf.compat.v1.global_variables_initializer()
            with timing_session(target, graph, grappler=True) as session:
                session.run(init)
                times[nbytes, reader] = median_run(session, fetch, 3 * repeats)
    cost = {n: times[n, pair[1]] - times[n, pair[0]] for n in (4096, 4 * 2 ** 20)}
    per_byte = max((cost[4 * 2 ** 20] - cost[4096]) / (4 * 2 ** 20 - 4096), 1e-12)
    return max(cost[4096] - 4096 * per_byte, 0.0), per_byte


def _per_step(target, device, repeats: int) -> float:
    """A step that does nothing but feed one number and fetch it back from a task."""
    tf = import_tf()
    graph = tf.Graph()
    with graph.as_default(), tf.device(device):
        x = tf.compat.v1.placeholder(tf.float32, [1])
        fetch = x + 1.0
    with timing_session(target, graph, grappler=True) as session:
        session.run(fetch, {x: [0.0]})
        times = []
        for _ in range(3 * repeats):
            start = time.perf_counter()
            session.run(fetch, {x: [0.0]})
            times.append(time.perf_counter() - start)
    return statistics.median(times)


#: The two shapes the block's element-wise work is timed at (blocks vary: 1 and 3).
BLOCK_SHAPES = (dict(d_model=64, heads=4, sequence=32, batch_size=8),
                dict(d_model=128, heads=4, sequence=64, batch_size=8))


def element_wise(target, device, hardware: Hardware, repeats: int) -> tuple[float, float]:
    """``(per_op_s, seconds_per_byte)`` of the ops of dtflab's transformer block that are not
    multiplies, as the step-time model counts them (``planner.step_time.block_ops``: 24 op
    charges a block, forward and backward, and their element-wise bytes): from untraced
    training steps of 1 and 3 blocks on one task at two widths, each block's time less its
    multiplies' (``hardware``'s rates), solved for a fixed cost a modelled op and a cost a
    modelled byte. dtflab's LayerNorm, GELU and softmax are several TensorFlow ops each, and
    its executor runs each one; this prices what that costs here."""
    from dtflab.train.planner import step_time
    from dtflab.train.planner.device_memory import Plan
    from dtflab.train.problems import transformer
    from dtflab.train.graphs.one_replica import single_graph

    rows = []
    for shape in BLOCK_SHAPES:
        seconds = {}
        for blocks in (1, 3):
            problem = transformer(blocks=blocks, **shape)
            built = single_graph(problem, seed=0, device=device)
            x, t = built.inputs
            xs, ts = problem.batch(0, 0)
            with timing_session(target, built.graph, grappler=True) as session:
                session.run(built.init)
                session.run(built.train, {x: xs, t: ts})
                times = []
                for _ in range(3 * repeats):
                    start = time.perf_counter()
                    session.run(built.train, {x: xs, t: ts})
                    times.append(time.perf_counter() - start)
            seconds[blocks] = statistics.median(times)
        plan = Plan(blocks=1, d_model=shape["d_model"], heads=shape["heads"],
                    sequence=shape["sequence"], vocabulary=problem.vocabulary,
                    batch=shape["batch_size"])
        ops = step_time.block_ops(plan)
        multiplies = sum(hardware.op_seconds(scale * flops, 0.0, "float32") for scale in (1, 2)
                         for _, kind, flops, _ in ops if kind == "matrix")
        vector_bytes = 3 * sum(nbytes for _, kind, _, nbytes in ops if kind == "vector")
        rows.append(((seconds[3] - seconds[1]) / 2 - multiplies, vector_bytes))
    (rest_a, bytes_a), (rest_b, bytes_b) = rows
    per_byte = max((rest_b - rest_a) / (bytes_b - bytes_a), 0.0)
    per_op = max((rest_a - bytes_a * per_byte) / MODELLED_OPS_PER_BLOCK, 0.0)
    return per_op, per_byte
