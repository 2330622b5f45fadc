"""What each device held in one traced training step, by kind, in bytes: what the runtime
allocated, to set beside ``formulas.memory``'s prediction.

Read from the step's ``RunMetadata`` (FULL_TRACE): the partition graphs and the allocator
records (each op's allocations and frees, with their times) on each device.

- **parameters** and **optimizer** state: the variables each device's partition holds, from
  their shapes and types (``VarHandleOp``); a variable whose name ends in Adam's slot names
  (``/Adam``, ``/Adam_1``) or is a beta power is the optimizer's. They are allocated when
  initialised, before the step: its records do not show them.
- **gradients**: the tensors the optimizer's apply ops read, as the step allocated them.
- **activations**: the bytes forward ops had allocated and not yet freed when the forward
  pass ended (the end of the last forward op that allocated more than a scalar): what the
  forward keeps for the backward, and the last forward op's outputs. With micro-batches, the
  most one micro-batch's forward ops held at the end of its forward.
- **peak**: the most bytes the step's ops held at once (the variables not counted).

Cannot see: memory TensorFlow allocates outside its allocator (Eigen's thread pools, gRPC), or
a run without FULL_TRACE.
"""

from __future__ import annotations

import collections
import math
import re
from dataclasses import dataclass

from dtflab import names
from dtflab.tracing.parse import dtype_name, itemsize
from dtflab.train.formulas.memory import KINDS, transformer_bytes

#: Ops of the backward pass and the optimizer, by name (``tf.gradients``, ``minimize``).
BACKWARD = re.compile(r"(^|/)(gradients|Adam|accumulate)(_\d+)?(/|$)")
MICRO_BATCH = re.compile(r"^micro_batch(\d+)/")
OPTIMIZER_STATE = re.compile(r"(/Adam(_\d+)?|^beta[12]_power(_\d+)?)$")
APPLY_OPS = {"ResourceApplyAdam": 9, "ApplyAdam": 9}  # the index of the gradient input


def step_memory(metadata) -> dict[str, dict[str, int]]:
    """``{device: {"parameters", "gradients", "optimizer", "activations", "peak"}}`` in bytes
    for the step ``metadata`` traced, devices by their short names (``worker:0``; see the
    module's docstring)."""
    found = collections.defaultdict(lambda: dict.fromkeys((*KINDS, "peak"), 0))
    producers = {}  # (op, slot) -> bytes, from the step's records
    for dev in metadata.step_stats.dev_stats:
        for stats in dev.node_stats:
            for output in stats.output:
                producers[stats.node_name, output.slot] = (
                    output.tensor_description.allocation_description.requested_bytes)
    for graph in metadata.partition_graphs:
        for node in graph.node:
            held = found[names.short(node.device)]
            if node.op == "VarHandleOp":
                kind = "optimizer" if OPTIMIZER_STATE.search(node.name) else "parameters"
                held[kind] += _variable_bytes(node)
            elif node.op in APPLY_OPS:
                op, _, slot = node.input[APPLY_OPS[node.op]].partition(":")
                held["gradients"] += producers.get((op, int(slot or 0)), 0)
    for dev in metadata.step_stats.dev_stats:
        held = found[names.short(dev.device)]
        activations, peak = _live_bytes(dev)
        held["activations"] += activations
        held["peak"] = max(held["peak"], peak)
    return {device: held for device, held in found.items() if any(held.values())}


def _live_bytes(dev) -> tuple[int, int]:
    """(forward bytes live when the forward ended, the most bytes live at once); with
    micro-batches, the most one micro-batch's forward ops held at the end of its forward."""
    records, forward_ends = [], collections.defaultdict(int)  # micro-batch -> its forward's end
    for stats in dev.node_stats:
        micro_batch = MICRO_BATCH.match(stats.node_name)
        forward = None if BACKWARD.search(stats.node_name) else (
            micro_batch.group(1) if micro_batch else "")
        allocated = 0
        for memory in stats.memory:
            for record in memory.allocation_records:
                records.append((record.alloc_micros, record.alloc_bytes, forward))
                allocated += max(record.alloc_bytes, 0)
        if forward is not None and allocated > 64:
            forward_ends[forward] = max(forward_ends[forward],
                                        stats.all_start_micros + stats.op_end_rel_micros)
    records.sort(key=lambda record: record[0])
    live = peak = 0
    for _, change, _ in records:
        live += change
        peak = max(peak, live)
    # One batch: every forward op's bytes; micro-batches: each one's own forward ops'.
    kept = max((sum(change for when, change, part in records
                    if when <= end and part is not None and (part == key or not key))
                for key, end in forward_ends.items()), default=0)
    return kept, peak


def _variable_bytes(node) -> int:
    shape = [dim.size for dim in node.attr["shape"].shape.dim]
    return math.prod(shape) * (itemsize(dtype_name(node.attr["dtype"].type)) or 4)


@dataclass(frozen=True)
class MemoryReport:
    """One device's bytes by kind, as measured in a traced step and as the formula predicts,
    and the formula's relative error per kind (``peak`` is measured only)."""

    problem: str
    measured: dict
    predicted: dict

    @property
    def errors(self) -> dict[str, float]:
        return {kind: (self.predicted[kind] - self.measured[kind]) / self.measured[kind]
                for kind in KINDS if self.measured.get(kind)}

    def __str__(self) -> str:
        rows = [f"{self.problem}: bytes per device, measured / predicted"]
        for kind in (*KINDS, "peak"):
            predicted = self.predicted.get(kind)
            error = self.errors.get(kind)
            rows.append(f"  {kind:<12}{self.measured[kind]:>14,}"
                        + (f"{predicted:>14,}  {error:+.1%}" if predicted is not None else
                           "      (measured only)"))
        return "\n".join(rows)


def memory(problem, *, batch: int | None = None, micro_batches: int = 1,
           seed: int = 0) -> MemoryReport:
    """Train ``problem`` (a ``Transformer``) one step in this process, trace the next and
    report its memory by kind beside ``formulas.memory``'s prediction: a batch of ``batch``
    sequences (default: the problem's) in ``micro_batches`` micro-batches.

    In [1]: print(train.memory(train.transformer(recompute="selective"), micro_batches=2))

    The step runs with one inter-op thread, so the backward starts once the forward has
    ended: with more, TensorFlow starts parts of the backward early and frees some of what the
    forward kept before the forward is over (measured with ``blocks=1``: 2.20 MB live at the
    forward's end instead of 2.46 MB), and the figure depends on the schedule."""
    import dataclasses

    from dtflab._quiet import import_tf
    from dtflab.tracing.capture import trace
    from dtflab.train.run import graphs

    from dtflab import checks

    if batch is not None:
        problem = dataclasses.replace(problem, batch_size=checks.whole(batch, "batch", example=8))
    checks.micro_batches(micro_batches, problem.batch_size)
    tf = import_tf()
    built = graphs.single_graph(problem, seed, micro_batches=micro_batches)
    x, t = built.inputs
    # A pool of its own: sessions share the process's first pool otherwise, whatever its size.
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1,
                                      use_per_session_threads=True)
    with tf.compat.v1.Session(graph=built.graph, config=config) as session:
        session.run(built.init)
        xs, ts = problem.batch(0, seed)
        session.run([built.train, built.loss], {x: xs, t: ts})  # the first step allocates slots
        xs, ts = problem.batch(1, seed)
        step = trace(session, [built.train, built.loss], {x: xs, t: ts})
    (measured,) = step_memory(step.metadata).values()
    name = problem.name + (f" in {micro_batches} micro-batches" if micro_batches > 1 else "")
    return MemoryReport(name, measured, transformer_bytes(problem, micro_batches=micro_batches))
