"""Pipeline parallelism: the model's layers cut into stages on worker tasks, each batch cut into
micro-batches that flow through them, in one of four schedules (GPipe, 1F1B, interleaved 1F1B,
zero-bubble: :mod:`dtflab.train.formulas.schedules`).

One graph, one session, as TensorFlow ran GPipe itself (lingvo): each stage's variables and ops
on its own task, the batch split into m micro-batches on the first stage, and every stage's work
ordered by control dependencies as :func:`dtflab.train.formulas.schedules.pipeline_order` lists
it (with one inter-op thread per task, a stage then runs one micro-batch at a time, as a
pipeline stage does). Each stage backpropagates each micro-batch on its own (``tf.gradients`` with the next
stage's gradient as ``grad_ys``), adds its gradients to a running sum and, after the last
micro-batch, the optimizer applies the sums once: the same update as one process on the whole
batch, up to float rounding.

Ops are named ``stage{s}/forward{j}/...`` and ``stage{s}/backward{j}/...``, which is how a traced
step's timings become the pipeline chart (``dtflab.train.measure.bubble``); the zero-bubble
schedule's weight gradients are built inside the backward's scope (one ``tf.gradients``, nothing
computed twice) and told apart by name lists (``backward_split``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dtflab import tf_private
from dtflab._quiet import import_tf
from dtflab.train.formulas import schedules
from dtflab.train.layouts.layout import Layout, said_as
from dtflab.train.layouts.layers import layer_ranges
from dtflab.train.layouts.tasks import enough_workers, worker_devices
from dtflab.train.measure.bubble import Bubble
from dtflab.train.machinery.graphs import TrainGraph, in_order, one_multiply_at_a_time, straggler
from dtflab.train.machinery.options import RunOptions, takes_options
from dtflab.train.machinery.sessions import train_graph
from dtflab.train.graphs import backward_split


@dataclass(frozen=True)
class Stages:
    """Where a pipeline's layers run: stage k holds layers ``layers[k]`` (1-based, inclusive
    ranges, as ``Problem.forward`` numbers them) and runs on ``devices[k % p]``, p workers each
    holding ``layout.chunks`` stages (more than one only for the interleaved schedule)."""

    devices: tuple[str, ...]
    layers: tuple[tuple[int, int], ...]
    layout: Layout

    @property
    def count(self) -> int:
        """The stages: ``p x chunks``."""
        return len(self.layers)

    def device(self, stage: int) -> str:
        return self.devices[stage % self.layout.pipeline]


def pipeline_graph(problem, stages: Stages, seed: int,
                   slow: dict | None = None) -> tuple[TrainGraph, frozenset]:
    """The pipelined training step (see the module's docstring), and the names of the ops that
    are weight gradients run on their own (``W``, the zero-bubble schedule; empty otherwise).
    ``slow[device]`` seconds are slept on that worker each step, spread over its forwards (a
    slow worker holds up every micro-batch that passes it)."""
    tf = import_tf()
    p, m, v = stages.layout.pipeline, stages.layout.micro_batches, stages.layout.chunks
    initial = dict(problem.initial_values(seed))
    graph = tf.Graph()
    with graph.as_default():
        created, stage_variables = {}, []
        for k, (first, last) in enumerate(stages.layers):
            wanted = problem.stage_parameters(first, last)
            with tf.device(stages.device(k)):  # a parameter lives on the first stage reading it
                created.update({name: tf.compat.v1.get_variable(name, initializer=initial[name])
                                for name in wanted if name not in created})
            stage_variables.append([created[name] for name in wanted])
        with tf.device(stages.device(0)):
            x = problem.placeholders()[0]
            xs = tf.split(x, m, name="micro_batches")
        with tf.device(stages.device(stages.count - 1)):
            t = problem.placeholders()[1]
            ts = tf.split(t, m, name="micro_labels")
        step = _StepBuilder(tf, problem, stages, stage_variables, xs, ts, slow or {})
        build = {"F": step.forward, "B": step.backward, "W": step.weights}
        # The formula's timeline puts every piece after what it needs: its start order is an
        # order to build in, and each worker's pieces come in the schedule's order.
        for piece in sorted(schedules.pipeline_timeline(stages.layout.schedule, p, m, chunks=v),
                            key=lambda piece: (piece.start, piece.worker)):
            build[piece.kind](piece.chunk * p + piece.worker, piece.micro_batch)
        variables = list(created.values())
        totals = {}  # a parameter two stages read (a tied embedding) gets both stages' sums
        for stage_vars, sums in zip(stage_variables, step.sums):
            for variable, gradient in zip(stage_vars, sums):
                if variable.name in totals:
                    with tf.device(variable.device), tf.name_scope("tied_sum"):
                        gradient = totals[variable.name] + gradient
                totals[variable.name] = gradient
        gradients = [totals[v.name] for v in variables]
        train = problem.optimizer().apply_gradients(list(zip(gradients, variables)))
        with tf.device(stages.device(stages.count - 1)):
            loss = tf.add_n(step.losses, name="loss")
        init = tf.compat.v1.global_variables_initializer()
    built = TrainGraph(graph, init, train, loss, (x, t), variables=variables)
    return built, frozenset(op.name for op in step.weight_ops)


class _StepBuilder:
    """Builds one stage's forward, backward or weight gradients of one micro-batch at a time,
    each after its worker's previous piece of work (control dependencies), in an order the
    schedule allows."""

    def __init__(self, tf, problem, stages, stage_variables, xs, ts, slow):
        self.tf, self.problem, self.stages = tf, problem, stages
        self.variables, self.xs, self.ts, self.slow = stage_variables, xs, ts, slow
        k = stages.count
        self.inputs = [{} for _ in range(k)]    # stage -> micro-batch -> what came in
        self.outputs = [{} for _ in range(k)]   # stage -> micro-batch -> activation (or loss)
        self.input_grads = [{} for _ in range(k)]  # the gradient sent back to the stage before
        self.sums = [None] * k                  # each stage's running sum of gradients
        self.deferred = {}                      # (stage, micro-batch) -> its W: (Split, grads)
        self.weight_ops = set()
        # each worker's previous piece's ends
        self.last = [[] for _ in range(stages.layout.pipeline)]
        self.losses = []

    def _after_last(self, s, tensor, name):
        """``tensor`` once stage ``s``'s worker finished its previous piece of work."""
        with self.tf.control_dependencies(self.last[s % self.stages.layout.pipeline]):
            return self.tf.identity(tensor, name=name)

    def forward(self, s, j):
        tf, problem = self.tf, self.problem
        device, (first, last) = self.stages.device(s), self.stages.layers[s]
        worker = s % self.stages.layout.pipeline
        with tf.device(device), tf.name_scope(f"stage{s}/forward{j}"):
            # A stage's gradients stop at its input (the stage before backpropagates from
            # there): without the stop, a parameter two stages read, a tied embedding, would get
            # the first stage's share twice.
            incoming = self.xs[j] if s == 0 else tf.stop_gradient(self.outputs[s - 1][j])
            # a slow worker sleeps after its previous work, as a slower machine
            share = 1 / (self.stages.layout.micro_batches * self.stages.layout.chunks)
            waits = straggler(self.slow, device, self.last[worker], share)
            with tf.control_dependencies(waits):
                h_in = tf.identity(incoming, name="input")
            h = problem.stage_forward(self.variables[s], h_in, first, last)
            if s == self.stages.count - 1:
                h = problem.loss(h, self.ts[j])
                self.losses.append(h)
        self.inputs[s][j], self.outputs[s][j] = h_in, h
        self.last[worker] = [h]

    def backward(self, s, j):
        tf = self.tf
        scope = f"stage{s}/backward{j}"
        with tf.device(self.stages.device(s)), tf.name_scope(scope):
            output = self.outputs[s][j]
            upstream = (tf.ones_like(output) if s == self.stages.count - 1
                        else self.input_grads[s + 1][j])
            upstream = self._after_last(s, upstream, "output_gradient")
            wrt = self.variables[s] + ([self.inputs[s][j]] if s > 0 else [])
            split = self.stages.layout.schedule == "zero_bubble"
            if split:  # also the tensors where the weights meet the activations: see below
                graph = tf.compat.v1.get_default_graph()
                forward = [op for op in graph.get_operations()
                           if op.name.startswith(f"stage{s}/forward{j}/")]
                met = backward_split.weight_consumers(forward)
                wrt = wrt + met
            grads = tf.compat.v1.gradients(output, wrt, grad_ys=upstream,
                                           colocate_gradients_with_ops=True)
        n = len(self.variables[s])
        own, input_grad = grads[:n], (grads[n] if s > 0 else None)
        if s > 0:
            self.input_grads[s][j] = input_grad
        worker = s % self.stages.layout.pipeline
        if split:
            ops = [op for op in tf.compat.v1.get_default_graph().get_operations()
                   if op.name.startswith(scope + "/")]
            parts = backward_split.split(ops, own, grads[n:], input_grad)
            parts.ops_in_order = ops
            self.deferred[s, j] = (parts, own)
            self.weight_ops |= parts.weight_ops
            # one multiply at a time, in the order tf.gradients made them (last layer first)
            in_order([op for op in ops if op in parts.input_ops and _multiply(op, "input")])
            self.last[worker] = parts.input_ends
            return
        one_multiply_at_a_time(tf.compat.v1.get_default_graph(), scope + "/")
        with tf.device(self.stages.device(s)), tf.name_scope(scope):  # the sums on the stage
            self._accumulate(s, own)
        self.last[worker] = self.sums[s] + ([input_grad] if s > 0 else [])

    def weights(self, s, j):
        """The zero-bubble schedule's ``W``: stage s's weight gradients of micro-batch j, which
        its backward built, run now: after the worker's previous piece."""
        parts, own = self.deferred.pop((s, j))
        for op in parts.weight_starts:
            for before in self.last[s % self.stages.layout.pipeline]:
                tf_private.run_after(op, before.op if isinstance(before, self.tf.Tensor) else before)
        in_order([op for op in parts.ops_in_order if op in parts.weight_ops
                  and _multiply(op, "weights")])
        with self.tf.device(self.stages.device(s)), self.tf.name_scope(f"stage{s}/weights{j}"):
            self._accumulate(s, own)
        self.last[s % self.stages.layout.pipeline] = list(self.sums[s])

    def _accumulate(self, s, own):
        if self.sums[s] is not None:
            with self.tf.name_scope("accumulate"):
                own = [total + g for total, g in zip(self.sums[s], own)]
        self.sums[s] = own


def _multiply(op, side: str) -> bool:
    """A MatMul's gradient with respect to its input (``side="input"``) or its weights."""
    return op.type == "MatMul" and op.name.endswith(
        "MatMul_grad/MatMul" if side == "input" else "MatMul_grad/MatMul_1")


#: What ``pipeline()``'s shorthand keywords build when no layout is given.
SHORTHAND = {"pipeline": 2, "micro_batches": 4}


@takes_options(RunOptions)
def pipeline(problem, cluster, *, stages: int | None = None, micro_batches: int | None = None,
             schedule: str | None = None, chunks: int | None = None, layout: Layout | None = None,
             cut=None, **options):
    """Train ``problem`` with its layers cut into stages on the first ``stages`` worker tasks,
    each batch in ``micro_batches`` micro-batches.

    In [1]: run = train.pipeline(train.classification(hidden_layers=3), cluster, stages=2,
       ...:                      micro_batches=8, trace_step=5, background=True)
    In [2]: run.wait().bubble.show()      # the pipeline chart of step 5, beside the formula's

    ``layout=train.Layout(pipeline=2, micro_batches=8, schedule="gpipe")`` says the same as
    the keywords ``stages``, ``micro_batches``, ``schedule`` and ``chunks``, which build one
    (2 stages and 4 micro-batches when left out; the schedule is the layout's default, 1F1B).
    ``schedule`` (:mod:`dtflab.train.formulas.schedules`): ``"gpipe"`` (all forwards, then all
    backwards), ``"1f1b"`` (one forward, one backward after the warm-up: fewer micro-batches'
    activations held at once), ``"interleaved"`` (each worker holds ``chunks`` stages, the
    model cut into ``stages x chunks`` pieces: a bubble ``chunks`` times smaller, ``chunks``
    times more hops) or ``"zero_bubble"`` (ZB-H1: each backward split into the input's
    gradient and the weights', the weights' run where the worker would wait). ``cut`` lists
    the first layer of each stage after the first (``cut=[3]``: layers 1-2, then 3 on); by
    default the cut balances each stage's multiply-adds. Gradients are summed over the
    micro-batches and applied once per step, so the losses are ``train.single``'s.
    ``slow={"worker:1": 0.05}`` makes that worker sleep that long per step (spread over its
    micro-batches): the pipeline's straggler. ``trace_step=k`` traces step k:
    ``history.bubble`` then measures each worker's busy and idle time. A dead task ends the
    run with a TaskError naming it.
    """
    options = RunOptions(**options).checked()
    with said_as(layout is not None, pipeline="stages"):
        layout = Layout.given(layout, "pipeline", SHORTHAND, pipeline=stages,
                              micro_batches=micro_batches, schedule=schedule, chunks=chunks)
        p = layout.alone("pipeline", "pipeline")
        layout.without("pipeline", zero="keeps whole copies (train.zero shards them)",
                       sequence_parallel="does not cut the sequence").fits(problem)
    ranges = layer_ranges(problem, p * layout.chunks, cut)
    enough_workers(cluster, p, "stages", "a stage runs on a worker task")
    devices, slow_devices = worker_devices(cluster, p, options.slow)
    plan = Stages(tuple(devices), ranges, layout)
    built, weight_ops = pipeline_graph(problem, plan, options.seed, slow_devices)
    m, schedule, chunks = layout.micro_batches, layout.schedule, layout.chunks
    title = (f"pipeline ({p} stages, {m} micro-batches, {schedule}"
             + (f", {chunks} chunks" if chunks > 1 else "") + ")")
    # The master runs on the last stage's task: idle while the pipeline fills, it sends every
    # other stage its part of the step at once (on stage 0, whose one thread is busy with the
    # first forwards, the other stages got theirs only after those: measured, 34 of 193 ms).
    return train_graph("pipeline", title, built, devices[-1], problem, cluster, options,
                       details={"stages": plan, "layout": layout},
                       reads={"bubble": lambda trace: Bubble.from_trace(
                           trace, plan.devices, layout, weight_ops=weight_ops)})
