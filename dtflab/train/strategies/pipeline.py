"""Pipeline parallelism: the model's layers cut into stages on worker tasks, each batch cut into
micro-batches that flow through them (GPipe's all-forward-all-backward, or 1F1B).

One graph, one session, as TensorFlow ran GPipe itself (lingvo): each stage's variables and ops
on its own task, the batch split into m micro-batches on the first stage, and every stage's work
ordered by control dependencies as :func:`dtflab.train.formulas.costs.pipeline_order` lists it (with one
inter-op thread per task, a stage then runs one micro-batch at a time, as a pipeline stage
does). Each stage backpropagates each micro-batch on its own (``tf.gradients`` with the next
stage's gradient as ``grad_ys``), adds its gradients to a running sum and, after the last
micro-batch, the optimizer applies the sums once: the same update as one process on the whole
batch, up to float rounding.

Ops are named ``stage{s}/forward{j}/...`` and ``stage{s}/backward{j}/...``, which is how a traced
step's timings become the pipeline chart (``dtflab.train.measure.bubble``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dtflab import checks, names
from dtflab._quiet import import_tf
from dtflab.train.formulas import costs
from dtflab.train.layouts.layers import layer_ranges
from dtflab.train.layouts.tasks import enough_workers, worker_devices
from dtflab.train.measure.bubble import Bubble
from dtflab.train.run.graphs import TrainGraph, one_multiply_at_a_time, straggler
from dtflab.train.run.runner import checked_run, new_runner
from dtflab.train.run.sessions import run_one_replica


@dataclass(frozen=True)
class Stages:
    """Where a pipeline's layers run: ``devices[s]`` holds layers ``layers[s]`` (1-based,
    inclusive ranges, as ``Problem.forward`` numbers them)."""

    devices: tuple[str, ...]
    layers: tuple[tuple[int, int], ...]
    micro_batches: int
    schedule: str

    @property
    def count(self) -> int:
        return len(self.devices)


def pipeline_graph(problem, stages: Stages, seed: int, slow: dict | None = None) -> TrainGraph:
    """The pipelined training step (see the module's docstring). ``slow[device]`` seconds are
    slept on that stage each step, spread over its forwards (a slow stage holds up every
    micro-batch that passes it)."""
    tf = import_tf()
    p, m = stages.count, stages.micro_batches
    initial = dict(problem.initial_values(seed))
    graph = tf.Graph()
    with graph.as_default():
        created, stage_variables = {}, []
        for device, (first, last) in zip(stages.devices, stages.layers):
            wanted = problem.stage_parameters(first, last)
            with tf.device(device):  # a parameter lives on the first stage that reads it
                created.update({name: tf.compat.v1.get_variable(name, initializer=initial[name])
                                for name in wanted if name not in created})
            stage_variables.append([created[name] for name in wanted])
        with tf.device(stages.devices[0]):
            x = problem.placeholders()[0]
            xs = tf.split(x, m, name="micro_batches")
        with tf.device(stages.devices[-1]):
            t = problem.placeholders()[1]
            ts = tf.split(t, m, name="micro_labels")
        step = _StepBuilder(tf, problem, stages, stage_variables, xs, ts, slow or {})
        for s, kind, j, _, _ in sorted(costs.pipeline_timeline(stages.schedule, p, m),
                                       key=lambda slot: (slot[3], slot[0])):
            step.forward(s, j) if kind == "F" else step.backward(s, j)
        variables = list(created.values())
        totals = {}  # a parameter two stages read (a tied embedding) gets both stages' sums
        for stage_vars, sums in zip(stage_variables, step.sums):
            for variable, gradient in zip(stage_vars, sums):
                if variable.name in totals:
                    with tf.device(variable.device), tf.name_scope("tied"):
                        gradient = totals[variable.name] + gradient
                totals[variable.name] = gradient
        gradients = [totals[v.name] for v in variables]
        train = problem.optimizer().apply_gradients(list(zip(gradients, variables)))
        with tf.device(stages.devices[-1]):
            loss = tf.add_n(step.losses, name="loss")
        init = tf.compat.v1.global_variables_initializer()
    return TrainGraph(graph, init, train, loss, (x, t), variables=variables)


class _StepBuilder:
    """Builds one stage's forward or backward of one micro-batch at a time, each after the
    stage's previous piece of work (control dependencies), in an order the schedule allows."""

    def __init__(self, tf, problem, stages, stage_variables, xs, ts, slow):
        self.tf, self.problem, self.stages = tf, problem, stages
        self.variables, self.xs, self.ts, self.slow = stage_variables, xs, ts, slow
        p = stages.count
        self.inputs = [{} for _ in range(p)]    # stage -> micro-batch -> what came in
        self.outputs = [{} for _ in range(p)]   # stage -> micro-batch -> activation (or loss)
        self.input_grads = [{} for _ in range(p)]  # the gradient sent back to the stage before
        self.sums = [None] * p                  # each stage's running sum of gradients
        self.last = [[] for _ in range(p)]      # what the stage's previous piece produced
        self.losses = []

    def _after_last(self, s, tensor, name):
        """``tensor`` once stage ``s`` finished its previous piece of work."""
        with self.tf.control_dependencies(self.last[s]):
            return self.tf.identity(tensor, name=name)

    def forward(self, s, j):
        tf, problem = self.tf, self.problem
        device, (first, last) = self.stages.devices[s], self.stages.layers[s]
        with tf.device(device), tf.name_scope(f"stage{s}/forward{j}"):
            # A stage's gradients stop at its input (the stage before backpropagates from
            # there): without the stop, a parameter two stages read, a tied embedding, would get
            # the first stage's share twice.
            incoming = self.xs[j] if s == 0 else tf.stop_gradient(self.outputs[s - 1][j])
            # a slow stage sleeps after its previous work, as a slower machine
            waits = straggler(self.slow, device, self.last[s], 1 / self.stages.micro_batches)
            with tf.control_dependencies(waits):
                h_in = tf.identity(incoming, name="input")
            h = problem.stage_forward(self.variables[s], h_in, first, last)
            if s == self.stages.count - 1:
                h = problem.loss(h, self.ts[j])
                self.losses.append(h)
        self.inputs[s][j], self.outputs[s][j] = h_in, h
        self.last[s] = [h]

    def backward(self, s, j):
        tf = self.tf
        with tf.device(self.stages.devices[s]), tf.name_scope(f"stage{s}/backward{j}"):
            output = self.outputs[s][j]
            upstream = (tf.ones_like(output) if s == self.stages.count - 1
                        else self.input_grads[s + 1][j])
            upstream = self._after_last(s, upstream, "output_gradient")
            wrt = self.variables[s] + ([self.inputs[s][j]] if s > 0 else [])
            grads = tf.compat.v1.gradients(output, wrt, grad_ys=upstream,
                                           colocate_gradients_with_ops=True)
            one_multiply_at_a_time(tf.compat.v1.get_default_graph(), f"stage{s}/backward{j}/")
            own = grads[:len(self.variables[s])]
            if self.sums[s] is not None:
                with tf.name_scope("accumulate"):
                    own = [total + g for total, g in zip(self.sums[s], own)]
        self.sums[s] = own
        if s > 0:
            self.input_grads[s][j] = grads[-1]
        self.last[s] = own + grads[len(own):]


def pipeline(problem, cluster, *, stages: int = 2, micro_batches: int = 4,
             schedule: str = "gpipe", cut=None, steps: int = 200, seed: int = 0,
             slow: dict | None = None, background: bool = False, callbacks=(),
             name: str | None = None, trace_step: int | None = None, watchdog=True):
    """Train ``problem`` with its layers cut into ``stages`` stages on the first worker tasks,
    each batch in ``micro_batches`` micro-batches.

    In [1]: run = train.pipeline(train.classification(hidden_layers=3), cluster, stages=2,
       ...:                      micro_batches=8, trace_step=5, background=True)
    In [2]: run.wait().bubble.show()      # the pipeline chart of step 5, beside the formula's

    ``schedule`` is ``"gpipe"`` (all forwards, then all backwards) or ``"1f1b"`` (one forward,
    one backward after the warm-up: fewer micro-batches' activations held at once). ``cut``
    lists the first layer of stages 2..p (``cut=[3]``: layers 1-2, then 3 on); by default the
    cut balances each stage's multiply-adds. Gradients are summed over the micro-batches and
    applied once per step, so the losses are ``train.single``'s. ``slow={"worker:1": 0.05}``
    makes that stage sleep that long per step (spread over its micro-batches): the pipeline's
    straggler. ``trace_step=k`` traces step k: ``history.bubble`` then measures each stage's
    busy and idle time. A dead task ends the run with a TaskError naming it.
    """
    watchdog = checked_run(steps, seed, trace_step, watchdog)
    checks.one_of(schedule, "schedule", costs.SCHEDULES)
    checks.whole(stages, "stages", example=2)
    checks.whole(micro_batches, "micro_batches", example=4)
    ranges = layer_ranges(problem, stages, cut)
    enough_workers(cluster, stages, "stages", "a stage runs on a worker task")
    if problem.batch_size % micro_batches:
        divisors = [d for d in (1, 2, 4, 8, 16, 32) if problem.batch_size % d == 0]
        raise ValueError(f"micro_batches={micro_batches}: the batch of {problem.batch_size} does "
                         f"not split into {micro_batches} equal micro-batches; use a divisor, "
                         f"e.g. micro_batches={divisors[-1]}")
    devices, slow_devices = worker_devices(cluster, stages, slow)
    plan = Stages(tuple(devices), ranges, micro_batches, schedule)
    built = pipeline_graph(problem, plan, seed, slow_devices)
    runner = new_runner("pipeline", name or f"pipeline ({stages} stages, {micro_batches} "
                        f"micro-batches, {schedule})", callbacks, watchdog, cluster=cluster)
    history = runner.history
    history.details["stages"] = plan
    history.reads["bubble"] = lambda trace: Bubble.from_trace(trace, plan.devices, micro_batches,
                                                              schedule)
    # The master runs on the last stage's task: idle while the pipeline fills, it sends every
    # other stage its part of the step at once (on stage 0, whose one thread is busy with the
    # first forwards, the other stages got theirs only after those: measured, 34 of 193 ms).
    return run_one_replica(built, cluster.target(*names.split(devices[-1])),
                           runner,
                           problem, steps, seed, cluster, background, trace_step)
