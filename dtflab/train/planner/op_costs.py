"""What the executor's simulation (``planner.executor``) needs measured on this machine, beside
``calibration``'s rates: each class of op's fixed cost and cost a byte, a trip between two
tasks inside a running step and its share of work on a core, a step's cost a task, and the
worker programs' costs a call and a collective. ``calibration.calibrate`` calls the first
three; ``train.run_layout`` calls :func:`program_costs` the first time it predicts a worker
program on a cluster.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import replace

from dtflab import allocator
from dtflab._quiet import import_tf
from dtflab.errors import sent_twice
from dtflab.train.planner.hardware import Hardware


def timing_session(target, graph, grappler: bool = False):
    """A session for timing steps: Grappler off unless ``grappler`` (a chain of the same op is
    timed as that many ops, not folded into one), and a step whose request gRPC sent twice
    (``errors.sent_twice``) run once more: a timing step can run twice."""
    tf = import_tf()
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = not grappler
    return _timing_class()(target, graph=graph, config=config)


@functools.cache
def _timing_class():
    class TimingSession(import_tf().compat.v1.Session):
        def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
            try:
                return super().run(fetches, feed_dict, options, run_metadata)
            except Exception as exc:
                if not sent_twice(exc):
                    raise
            return super().run(fetches, feed_dict, options, run_metadata)

        def close(self):
            super().close()
            allocator.let_go(self.graph)  # its graph is built for this session's runs alone

    return TimingSession


def median_run(session, fetch, repeats: int) -> float:
    """The median seconds of ``repeats`` runs of ``fetch``, after one that allocates and picks
    its kernels."""
    import time

    session.run(fetch)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(fetch)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved(target, steps: dict, rounds: int) -> dict:
    """Seconds of each of ``steps`` (``{key: (graph, fetch, init)}``), each run once a round
    for ``rounds`` rounds, every session open throughout: ``{key: [seconds a round]}``. The
    difference of two keys is then taken round by round, so the machine's drift while they
    are timed falls on both: an element-wise op's fixed cost read 1.1 to 4.9 us in four
    calibrations a minute apart, timed one step after the other, and 0.8 to 1.1 interleaved.
    Not timed so: steps whose tensors cross between tasks (interleaved, a trip read ten times
    its time, 3 ms against 0.3), and ``calibration``'s multiply rates (interleaved, a 256 x 256
    one read 96-112 GFLOP/s where one step after the other read 54-90, and a tensor-parallel
    run's multiplies were priced 15-40% fast)."""
    import contextlib
    import time

    with contextlib.ExitStack() as stack:
        sessions = {}
        for key, (graph, fetch, init) in steps.items():
            session = stack.enter_context(timing_session(target, graph))
            if init is not None:
                session.run(init)
            session.run(fetch)  # allocates and picks its kernels
            sessions[key] = (session, fetch)
        times = {key: [] for key in steps}
        for _ in range(rounds):
            for key, (session, fetch) in sessions.items():
                start = time.perf_counter()
                session.run(fetch)
                times[key].append(time.perf_counter() - start)
    return times


def median_difference(times: dict, more, less) -> float:
    """The median over rounds of ``times[more] - times[less]`` (:func:`interleaved`'s)."""
    return statistics.median(a - b for a, b in zip(times[more], times[less]))


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


#: The rows (x 128 float32) of the tensors each class's cost a byte is timed on: one larger than
#: a core's cache, and one (``CACHED_ROWS``) that fits in it, as a small op's tensors do.
ROWS, CACHED_ROWS = 8192, 512
#: How many times the uncached tensors' bytes are the cached ones' (what ``planner.executor``
#: reads a class's cost a byte between).
CACHE_SPAN = ROWS // CACHED_ROWS


def op_costs(target, device, repeats: int) -> tuple[dict, dict]:
    """Each price class's ``(fixed seconds, seconds a byte)`` on one task: a chain of its op
    (each after the last; 200 on a 1-row tensor, 16 on a :data:`ROWS` x 128 one, 64 on a
    :data:`CACHED_ROWS` one), less a step of none in the same round (:func:`interleaved`), per
    op (``CLASSES``; the update class: Adam's fused update of a variable); and
    ``{class: (bytes, seconds a byte)}`` on a :data:`CACHED_ROWS` x 128 one, for the
    element-wise classes (``Hardware.cached``). A multiply's fixed cost is a 1 x 1 multiply's;
    its arithmetic is priced by its rate."""
    tf = import_tf()

    def per_op(make, n: int) -> float:
        chain = 200 if n == 1 else 64 if n == CACHED_ROWS else 16
        steps = {}
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
            steps[count] = (graph, fetch, init)
        times = interleaved(target, steps, 3 * repeats)
        return max(median_difference(times, chain, 0) / chain, 0.0)

    costs, cached = {}, {}
    for name, (make, share) in CLASSES.items():
        small = per_op(lambda tf, x, y, v, make=make: make(tf, x, y), 1)
        if not share:
            costs[name] = (small, 0.0)
            continue
        for rows, into in ((ROWS, None), (CACHED_ROWS, cached)):
            if into is not None and name == "scatter":
                continue
            seconds = per_op(lambda tf, x, y, v, make=make: make(tf, x, y), rows)
            nbytes = share * 4 * 128 * (rows - 1)
            if into is None:
                costs[name] = (small, max(seconds - small, 0.0) / nbytes)
            else:
                cached[name] = (nbytes, max(seconds - small, 0.0) / nbytes)

    def adam(tf, x, y, variables):
        var, m, v = variables
        return tf.raw_ops.ResourceApplyAdam(
            var=var.handle, m=m.handle, v=v.handle, beta1_power=0.9, beta2_power=0.999,
            lr=0.0, beta1=0.9, beta2=0.999, epsilon=1e-8, grad=x)

    small, large = per_op(adam, 1), per_op(adam, ROWS)
    costs["update"] = (small, max(large - small, 0.0) / (7 * 4 * 128 * (ROWS - 1)))
    return costs, cached


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
        with timing_session(target, graph) as session:
            session.run(init)
            return median_run(session, fetch, 3 * repeats)

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
        with timing_session(target, graph) as session:
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


def dispatch_cost(hardware: Hardware, step_seconds, measured: float) -> Hardware:
    """``hardware`` with ``op_costs["dispatch"]``: what an op of a whole step costs beyond
    what a chain of it was timed at (:func:`op_costs`: in a chain the executor runs each op
    inline, in a step it hands ops between its threads), fitted so that a step simulated on
    it (``step_seconds(hardware)``) takes ``measured`` (:func:`search`, 0.01 to 100 us).
    Fitted to the one-task loop of :data:`PROBE` (``predicted_run.with_dispatch``): on one
    calibration it reads much the same on two blocks as on one; from one calibration to the next
    it moves, as the fixed costs it sits beside do."""
    def on(seconds: float) -> Hardware:
        return replace(hardware, op_costs={**hardware.op_costs, "dispatch": (seconds, 0.0)})

    return on(search(lambda d: (step_seconds(on(d)) / measured - 1) ** 2, 1e-8, 1e-4, 16))


#: The transformer the worker programs' costs are timed on: big enough that its workers'
#: arithmetic runs beside their collectives, as a learner's model's does (on one of 1 block
#: at d_model 32, fitted costs put ZeRO 1 at d_model 128 30% long; on this one, 3%).
PROBE = dict(blocks=2, d_model=64, heads=2, sequence=32, batch_size=8)


def search(error, low: float = 1e-6, high: float = 3e-3, rounds: int = 10) -> float:
    """The seconds between ``low`` and ``high`` where ``error(seconds)`` is least, by
    golden-section search on a log scale (``error`` has one valley; ``rounds`` + 1 calls)."""
    import math

    ratio = (math.sqrt(5) - 1) / 2
    a, b = math.log(low), math.log(high)
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    at_c, at_d = error(math.exp(c)), error(math.exp(d))
    for _ in range(rounds):
        if at_c <= at_d:
            b, d, at_d = d, c, at_c
            c = b - ratio * (b - a)
            at_c = error(math.exp(c))
        else:
            a, c, at_c = c, d, at_d
            d = a + ratio * (b - a)
            at_d = error(math.exp(d))
    return math.exp((a + b) / 2)


#: The range a link of the gathers' chain is searched in (:func:`program_costs`), in seconds.
LINK_RANGE = (1e-6, 1e-2)


def at_lowest_link(hardware: Hardware) -> bool:
    """Whether :func:`program_costs` put a link at the bottom of :data:`LINK_RANGE` (the
    search's last interval ends there): the probes' graphs, simulated on the step's cost an op
    alone, already took their measured steps, so the two were timed in different moments of
    the machine (a loaded one: a link of about a microsecond and ``call`` 0, where a quiet
    machine reads a millisecond or so)."""
    return hardware.op_costs["collective_ring"][0] < 1.2 * LINK_RANGE[0]


def program_costs(hardware: Hardware, graph_seconds, pack_seconds, *, steps: int = 40,
                  threads: int | None = None) -> Hardware:
    """``hardware`` with the worker programs' costs in ``op_costs``: ``collective_ring``, a
    gather's or an all-reduce's cost a call, with its bytes at the transfer's rate; and
    ``call``, what a worker program's step pays beyond its graph (the step function's call, the
    batch, the report). A broadcast (one side of a reduce-scatter's) is priced at its bytes
    alone (``collective_pair`` 0): the traced step runs them together (ZeRO 1's 52 in flight at
    once), where the gathers run one after another, each the control input of the next. Timed
    from ``train.all_reduce`` and ``train.zero(stage=1, 2, 3)`` of :data:`PROBE` on two workers
    of ``threads`` threads each, and fitted so that each probe's graph simulated
    (``graph_seconds(problem, stage, hardware)``; stage 0, all-reduce's, with its pack,
    ``pack_seconds(problem, hardware)``) plus ``call`` comes nearest its median step in
    relative error (:func:`search`; ``call`` solved for each cost). A broadcast's cost is not
    fitted: fitted beside the link's, the two trade against each other. A probe's step is the
    median of its ``steps`` after the first two (``median_step_s``): more steps steady it for
    little time, a program's start taking most of it."""
    from dtflab.train.problems import transformer
    from dtflab.train.strategies.all_reduce import all_reduce
    from dtflab.train.strategies.zero import zero

    problem = transformer(**PROBE)
    go = dict(workers=2, steps=steps, seed=0, watchdog=False, threads=threads)
    measured = {0: all_reduce(problem, **go).median_step_s()}
    for stage in (1, 2, 3):
        measured[stage] = zero(problem, stage=stage, **go).median_step_s()
    weights = {stage: 1 / seconds ** 2 for stage, seconds in measured.items()}

    def fitted(ring: float) -> tuple[float, float]:
        costs = replace(hardware, op_costs={**hardware.op_costs, "collective_ring": (ring, 0.0),
                                            "collective_pair": (0.0, 0.0)})
        graph = {stage: graph_seconds(problem, stage, costs)
                 + (pack_seconds(problem, costs) if stage == 0 else 0.0) for stage in measured}
        call = max(sum((measured[s] - graph[s]) * weights[s] for s in measured)
                   / sum(weights.values()), 0.0)
        return sum(((graph[s] + call) / measured[s] - 1) ** 2 for s in measured), call

    ring = search(lambda c: fitted(c)[0], *LINK_RANGE)  # quiet machines: 0.66-1.5 ms
    return replace(hardware, op_costs={**hardware.op_costs, "call": (fitted(ring)[1], 0.0),
                                       "collective_ring": (ring, 0.0),
                                       "collective_pair": (0.0, 0.0)})
