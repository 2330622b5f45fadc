"""This cluster's hardware, measured in one call: what the planner's ``hardware="here"`` plans
on (``planner.hardware.Hardware`` with ``measured=True``).

Five measurements, on the cluster's worker tasks, each a median of several runs; where an op is
timed, a chain of it runs in one step (Grappler off, so the chain is not folded), less a step
of none, per op: its fixed cost included, as a run's ops pay it, and no tracing's cost:

- **matrix multiplies**: each task a chain of n x n multiplies (n = 256, 512, 1024, float32 and
  bfloat16), every task at once, as a run's workers compute at once; the best size's rate is
  the peak, each size's share of it the efficiency curve (the sizes' GFLOP as its thresholds);
- **memory bandwidth**: each task a chain of additions on a 64 MB tensor (read and written);
- **a transfer**: one task's tensor read by another, at 4 kB and 4 MB, less the same step with
  the tensor read where it was made: the time that grows with the bytes (one over the
  bandwidth) and the time that does not (the latency);
- **a step**: feeding one number to a task and fetching it, from a session on another task:
  what a training step costs before any work (``per_step_s``);
- **the block's element-wise work**: untraced training steps of dtflab's transformer (1 and 3
  blocks, at two widths) on one task; each block's time less its multiplies' is solved for a
  fixed cost per op the model counts (``per_op_s``) and a cost per element-wise byte
  (``vector_traffic`` over the bandwidth): dtflab's LayerNorm, GELU and softmax are several
  TensorFlow ops each where fused kernels are one, and this prices what they cost here.

Every task runs on this machine, so one node holds them all and its link is the loopback. The
tasks share the machine's cores: what a task's multiply reaches with every task multiplying is
what a run's device gets. About 20 s on 2 cores.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from dtflab import checks, names
from dtflab._quiet import import_tf
from dtflab.machine import cpus
from dtflab.train.planner.hardware import Hardware, Link

SIZES = (256, 512, 1024)
#: The multiplies timed on one task alone, for ``Hardware.matrix_rates`` (a block's attention
#: multiplies are as small as the smallest).
ALONE_SIZES = (32, 64, 128, 256, 512, 1024)
#: The op charges the step-time model makes for a block (``planner.step_time.block_ops``: 12
#: ops forward, each again backward).
MODELLED_OPS_PER_BLOCK = 2 * 12


def calibrate(cluster, *, repeats: int = 5) -> Hardware:
    """Measure ``cluster``'s worker tasks (see the module's docstring)."""
    import psutil

    checks.cluster(cluster)
    checks.whole(repeats, "repeats", example=5)
    tasks = len(cluster.addresses.get("worker", []))
    if tasks < 2:
        raise ValueError(f"calibrate needs two worker tasks to time a transfer between them; "
                         f"this cluster has {tasks}: start one with "
                         f"dtflab.start_cluster(workers=2)")
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
        together = {"matrix": min(1.0, rates["float32"][512] * sharing / alone[512]),
                    "memory": min(1.0, _memory_bandwidth(target, busy, repeats)
                                  / _memory_bandwidth(target, devices[:1], repeats))}
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
    return replace(hardware, per_op_s=per_op * sharing,
                   vector_traffic=max(seconds_per_byte * bandwidth, 1e-3) * sharing,
                   op_costs={**op_costs(target, devices[0], repeats),
                             **hops(target, devices[:2], repeats)},
                   transfer_cores=trip_on_cores(target, devices[:2]) if cpus() >= 2 else 1.0)


def _session(target, graph):
    """A session with Grappler off: a chain of the same op is timed as that many ops, not
    folded into one."""
    tf = import_tf()
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return tf.compat.v1.Session(target, graph=graph, config=config)


def _median_run(session, fetch, repeats: int) -> float:
    session.run(fetch)  # the first run allocates and picks its kernels
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(fetch)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _chained(target, devices, make, repeats: int, chain: int = 8) -> float:
    """Seconds one op of a chain of ``chain`` takes, every task running its chain at once:
    a step of chains less a step of none, over ``chain``. ``make(tf, i)`` is ``(start,
    step)``: the chain's first tensor and the op applied to it."""
    tf = import_tf()
    times = {}
    for count in (0, chain):
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
        with _session(target, graph) as session:
            session.run(init)
            times[count] = _median_run(session, fetch, repeats)
    return max((times[chain] - times[0]) / chain, 1e-9)


def _matmul_rates(target, devices, precision: str, repeats: int) -> dict[int, float]:
    """FLOP/s of an n x n multiply on every task at once, by n (its fixed cost included)."""
    rates = {}
    for n in SIZES:
        def make(tf, i, n=n):
            w = tf.cast(tf.Variable(tf.random.normal([n, n], stddev=n ** -0.5, seed=i),
                                    name=f"w{i}"), precision)
            return tf.cast(tf.Variable(tf.random.normal([n, n], seed=i + 7), name=f"a{i}"),
                           precision), lambda h: tf.matmul(h, w)

        rates[n] = 2 * n ** 3 / _chained(target, devices, make, repeats)
    return rates


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
    elements = megabytes * 2 ** 20 // 4

    def make(tf, i):
        return tf.Variable(tf.zeros([elements]), name=f"x{i}") * 1.0, lambda h: h + 1.0

    return 2 * 4 * elements / _chained(target, devices, make, repeats)


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
            with tf.compat.v1.Session(target, graph=graph) as session:
                session.run(init)
                times[nbytes, reader] = _median_run(session, fetch, 3 * repeats)
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
    with tf.compat.v1.Session(target, graph=graph) as session:
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

    tf = import_tf()
    rows = []
    for shape in BLOCK_SHAPES:
        seconds = {}
        for blocks in (1, 3):
            problem = transformer(blocks=blocks, **shape)
            built = single_graph(problem, seed=0, device=device)
            x, t = built.inputs
            xs, ts = problem.batch(0, 0)
            with tf.compat.v1.Session(target, graph=built.graph) as session:
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


#: The op that stands for each price class (``planner.graph_ops.kind``) when its cost is
#: timed: ``make(tf, x)`` of a float32 tensor ``x`` (rows x 128), and the bytes it reads and
#: writes as ``graph_ops.step_ops`` counts them, in units of ``x``'s bytes.
CLASSES = {
    "elementwise": (lambda tf, x, y: x * y, 3.0),
    "transcendental": (lambda tf, x, y: tf.tanh(x), 2.0),
    "reduce": (lambda tf, x, y: tf.reduce_sum(x, axis=-1), 1.0 + 1 / 128),
    "move": (lambda tf, x, y: tf.transpose(x), 2.0),
    # the gradient of taking every other row: a whole zeroed output, half of it copied in
    "scatter": (lambda tf, x, y: tf.raw_ops.StridedSliceGrad(
        shape=tf.shape(x) * [2, 1], begin=[0, 0], end=tf.shape(x) * [2, 1], strides=[2, 1],
        dy=x), 3.0),
    "free": (lambda tf, x, y: tf.reshape(x, [-1]), 0.0),
    "matrix": (lambda tf, x, y: tf.matmul(x[:1, :1], y[:1, :1]), 0.0),
}


def op_costs(target, device, repeats: int, rows: int = 8192) -> dict[str, tuple[float, float]]:
    """Each price class's ``(fixed seconds, seconds a byte)`` on one task: a chain of its op
    (each after the last; 200 on a 1-row tensor, 16 on a ``rows`` x 128 one, larger than a
    core's cache as a step's many tensors are), less a step of none, per op (``CLASSES``; the
    update class: Adam's fused update of a variable). A multiply's fixed cost is a 1 x 1
    multiply's; its arithmetic is priced by its rate."""
    tf = import_tf()

    def per_op(make, n: int) -> float:
        times = {}
        chain = 200 if n == 1 else 16
        for count in (0, chain):
            graph = tf.Graph()
            with graph.as_default(), tf.device(device):
                x = tf.Variable(tf.random.normal([n, 128], seed=1), name="x")
                y = tf.Variable(tf.random.normal([n, 128], seed=2), name="y")
                z = tf.Variable(tf.zeros([n, 128]), name="z")
                xv, yv = x.read_value(), y.read_value()
                last = tf.no_op()
                for _ in range(count):
                    with tf.control_dependencies([last]):
                        last = make(tf, xv, yv, (x, y, z))
                        last = last if hasattr(last, "type") else last.op
                fetch = tf.group(last)
                init = tf.compat.v1.global_variables_initializer()
            with _session(target, graph) as session:
                session.run(init)
                times[count] = _median_run(session, fetch, 3 * repeats)
        return max((times[chain] - times[0]) / chain, 0.0)

    costs = {}
    for name, (make, share) in CLASSES.items():
        small = per_op(lambda tf, x, y, v, make=make: make(tf, x, y), 1)
        if not share:
            costs[name] = (small, 0.0)
            continue
        large = per_op(lambda tf, x, y, v, make=make: make(tf, x, y), rows)
        nbytes = share * 4 * 128 * (rows - 1)
        costs[name] = (small, max(large - small, 0.0) / nbytes)

    def adam(tf, x, y, variables):
        var, m, v = variables
        return tf.raw_ops.ResourceApplyAdam(
            var=var.handle, m=m.handle, v=v.handle, beta1_power=0.9, beta2_power=0.999,
            lr=0.0, beta1=0.9, beta2=0.999, epsilon=1e-8, grad=x)

    small, large = per_op(adam, 1), per_op(adam, rows)
    costs["update"] = (small, max(large - small, 0.0) / (7 * 4 * 128 * (rows - 1)))
    return costs


def hops(target, pair, repeats: int, hops_in_chain: int = 16) -> dict[str, tuple[float, float]]:
    """Inside a running step: ``transfer``, a tensor's trip from one task to the other
    (``(seconds, seconds a byte)``: a chain of ``hops_in_chain`` trips between ``pair``, each
    an addition on the other task, less the same additions on one task, at 4 B and 4 MB); and
    ``task``, what a step pays for each task it runs on beyond the first (``(seconds, 0)``)."""
    tf = import_tf()

    def step(n: int, hop: bool, both: bool = False) -> float:
        graph = tf.Graph()
        with graph.as_default():
            with tf.device(pair[0]):
                h = tf.Variable(tf.zeros([n]), name="x") * 1.0
            for i in range(hops_in_chain if n else 0):
                with tf.device(pair[(i + 1) % 2] if hop else pair[0]):
                    h = h + 1.0
            with tf.device(pair[0]):
                fetch = [tf.reduce_sum(h[:1])]
            if both:
                with tf.device(pair[1]):
                    fetch.append(tf.constant(1.0) + 1.0)
            init = tf.compat.v1.global_variables_initializer()
        with _session(target, graph) as session:
            session.run(init)
            return _median_run(session, fetch, 3 * repeats)

    seconds = {n: (step(n, True) - step(n, False)) / hops_in_chain for n in (1, 2 ** 20)}
    per_byte = max((seconds[2 ** 20] - seconds[1]) / (4 * (2 ** 20 - 1)), 0.0)
    one_task = step(0, False)
    return {"transfer": (max(seconds[1], 0.0), per_byte),
            "task": (max(step(0, False, both=True) - one_task, 0.0), 0.0)}


def trip_on_cores(target, pair, hops_in_chain: int = 100, busy: int = 600) -> float:
    """The share of a trip between ``pair`` that is work on a core: a chain of trips timed
    from a traced step, alone and beside a chain of multiplies on each task (every core busy,
    so work on a core takes twice as long there, and waiting no longer): ``busy / alone - 1``,
    between 0 and 1."""
    tf = import_tf()

    def per_trip(with_busy: bool) -> float:
        graph = tf.Graph()
        with graph.as_default():
            with tf.device(pair[0]):
                h = tf.Variable(tf.zeros([1]), name="x") * 1.0
            for i in range(hops_in_chain):
                with tf.device(pair[(i + 1) % 2]):
                    h = tf.add(h, 1.0, name=f"trip{i}")
            fetch = [tf.reduce_sum(h)]
            for device in pair if with_busy else ():
                with tf.device(device):
                    w = tf.Variable(tf.random.normal([256, 256], stddev=1 / 16, seed=1))
                    a = w * 1.0
                    for _ in range(busy):
                        a = tf.matmul(a, w)
                    fetch.append(tf.reduce_sum(a[:1, :1]))
            init = tf.compat.v1.global_variables_initializer()
        with _session(target, graph) as session:
            session.run(init)
            session.run(fetch)
            found = []
            for _ in range(5):
                metadata = tf.compat.v1.RunMetadata()
                session.run(fetch, options=tf.compat.v1.RunOptions(trace_level=3),
                            run_metadata=metadata)
                ends = {}
                for device in metadata.step_stats.dev_stats:
                    for node in device.node_stats:
                        tail = node.node_name[4:]
                        if node.node_name.startswith("trip") and tail.isdigit():
                            ends[int(tail)] = (node.all_start_micros,
                                               node.all_start_micros + node.all_end_rel_micros)
                found.append((ends[hops_in_chain - 1][1] - ends[0][0]) / (hops_in_chain - 1))
        return statistics.median(found)

    return min(max(per_trip(True) / per_trip(False) - 1, 0.0), 1.0)


#: The transformer the worker programs' costs are timed on (small: its arithmetic is a small
#: share of its step, and its graph's simulation prices that share).
PROBE = dict(blocks=1, d_model=32, heads=2, sequence=16, batch_size=8)


def collectives_a_step(problem, zero: int, workers: int) -> int:
    """The collective calls one step of a worker program makes: all-reduce's one pack of
    every gradient; ZeRO 1 and 2 a reduce-scatter (``workers - 1`` paired broadcasts) and an
    all-gather a parameter; ZeRO 3 two gathers and a reduce-scatter a parameter."""
    tensors = len(problem.initial_values(0))
    return {0: 1, 1: workers * tensors, 2: workers * tensors,
            3: (workers + 1) * tensors}[zero]


def program_costs(hardware: Hardware, replica_seconds, *, steps: int = 14) -> Hardware:
    """``hardware`` with the worker programs' costs in ``op_costs``: ``call``, what a worker
    program's step pays beyond its graph (the step function's call, the batch, the report),
    and ``collective``, one collective call between two worker programs. Timed from
    ``train.all_reduce`` and ``train.zero(stage=1)`` of :data:`PROBE` on two workers (about
    20 s on 2 cores): each one's median step, less ``replica_seconds(problem, hardware)`` (its
    graph's simulated step, a copy a worker), solved for the two."""
    from dtflab.train.planner.predicted_run import measured_step_s
    from dtflab.train.problems import transformer
    from dtflab.train.strategies.all_reduce import all_reduce
    from dtflab.train.strategies.zero import zero

    problem = transformer(**PROBE)
    compute = replica_seconds(problem, hardware)
    go = dict(workers=2, steps=steps, seed=0, watchdog=False)
    rest = {0: measured_step_s(all_reduce(problem, **go)) - compute,
            1: measured_step_s(zero(problem, stage=1, **go)) - compute}
    calls = {stage: collectives_a_step(problem, stage, 2) for stage in rest}
    collective = max((rest[1] - rest[0]) / (calls[1] - calls[0]), 0.0)
    call = max(rest[0] - calls[0] * collective, 0.0)
    return replace(hardware, op_costs={**hardware.op_costs, "call": (call, 0.0),
                                       "collective": (collective, 0.0)})
