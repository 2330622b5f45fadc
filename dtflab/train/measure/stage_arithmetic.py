"""One pipeline stage's arithmetic, measured at each micro-batch size on the task that runs it.

The pipeline's cost model (``costs.pipeline_step_s``) splits a stage's arithmetic for the whole
batch into m equal shares. That holds only if a multiply costs the same per row at every
micro-batch size, and on a CPU it does not: the kernel oneDNN picks, and how the operands sit
in the caches, change with the row count. On an AMD EPYC with AVX2 (issue 33), one stage's
multiplies for a batch of 2,048 rows cut into 8 micro-batches of 256 took far longer than cut
into 4 of 512, and a model that assumed equal shares chose m = 8 where m = 4 was fastest.

Here the stage's forward and backward for one micro-batch (the pipeline's own ops, ordered as
it orders them) run alone on the stage's task, traced, at each size: the time in multiplies and
activations (``bubble.ARITHMETIC``), times m, is the stage's arithmetic for the whole batch at
that m. A few hundred milliseconds per size; no step time is fitted.
"""

from __future__ import annotations

from dtflab import checks, names
from dtflab._quiet import import_tf
from dtflab.train.measure.bubble import ARITHMETIC


def stage_arithmetic_s(problem, cluster, *, stages: int = 2, micro_batches=(1, 2, 4, 8, 16),
                       cut=None, repeats: int = 5) -> dict[int, float]:
    """Per m in ``micro_batches``: the busiest stage's arithmetic for the whole batch, in
    seconds, when the batch is cut into m micro-batches: the fastest of ``repeats`` traced runs,
    taken in turn with the other sizes. Another program on the cores only ever adds time: on
    the shared Intel machine of the training guide, two calls a minute apart differed by up to
    27% at one size with the median of five, by up to 15% with the fastest.

    In [1]: arithmetic = train.stage_arithmetic_s(problem, cluster, stages=2)
    In [2]: history.bubble.predicted_step_s(8, arithmetic=arithmetic)

    Each stage runs on its own task, one at a time: the figure is the arithmetic's own cost at
    that size, not what it costs beside another stage's work on the same cores.
    """
    from dtflab.tracing.capture import trace
    from dtflab.train.layouts.layers import layer_ranges
    from dtflab.train.layouts.tasks import enough_workers, worker_devices
    from dtflab.train.problems import needs_mlp
    from dtflab.train.machinery.graphs import one_multiply_at_a_time

    needs_mlp(problem, "train.stage_arithmetic_s")
    checks.whole(repeats, "repeats", example=3)
    for m in micro_batches:
        checks.whole(m, "micro_batches", example=4)
        if problem.batch_size % m:
            raise ValueError(f"micro_batches: {m} does not divide the batch of "
                             f"{problem.batch_size}; use divisors of it, e.g. (1, 2, 4)")
    ranges = layer_ranges(problem, stages, cut)
    enough_workers(cluster, stages, "stages", "a stage runs on a worker task")
    devices, _ = worker_devices(cluster, stages, None)
    tf = import_tf()
    initial = problem.initial_values(0)
    graph = tf.Graph()
    fetches = {}
    with graph.as_default():
        for s, (device, (first, last)) in enumerate(zip(devices, ranges)):
            with tf.device(device):
                variables = [tf.compat.v1.get_variable(f"stage{s}/{name}", initializer=value)
                             for name, value in initial[2 * (first - 1):2 * last]]
                for m in micro_batches:
                    scope = f"stage{s}/m{m}/"
                    with tf.name_scope(scope[:-1]):
                        rows = problem.batch_size // m
                        h_in = tf.random.normal([rows, problem.layers[first - 1]], seed=s)
                        out = problem.forward(variables, h_in, first_layer=first)
                        if s == stages - 1:
                            labels = (tf.zeros([rows, problem.layers[-1]])
                                      if problem.loss_kind == "l2" else tf.zeros([rows], tf.int64))
                            out = problem.loss(out, labels)
                        wrt = variables + ([h_in] if s > 0 else [])
                        grads = tf.compat.v1.gradients(out, wrt, grad_ys=tf.ones_like(out),
                                                       colocate_gradients_with_ops=True)
                        one_multiply_at_a_time(graph, scope)
                        # A scalar of every gradient: a tf.group of stateless ops is pruned
                        # by Grappler (nothing ran but the input's random numbers).
                        fetches[s, m] = (tf.add_n([tf.reduce_sum(g) for g in grads]), scope)
        init = tf.compat.v1.global_variables_initializer()
    target = cluster.target(*names.split(devices[0]))
    measured: dict[tuple[int, int], list[float]] = {key: [] for key in fetches}
    with tf.compat.v1.Session(target, graph=graph) as session:
        session.run(init)
        for fetch, _ in fetches.values():
            session.run(fetch)  # the first run allocates and picks its kernels
        for _ in range(repeats):
            for key, (fetch, scope) in fetches.items():
                step = trace(session, fetch)
                us = sum(t.duration_us for timings in step.timings.values() for t in timings
                         if t.name.startswith(scope) and ARITHMETIC.search(t.op))
                measured[key].append(us * key[1] / 1e6)
    return {m: max(min(measured[s, m]) for s in range(stages)) for m in micro_batches}

