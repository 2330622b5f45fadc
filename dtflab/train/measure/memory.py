"""Memory by kind measured on one device: a transformer's step traced in this process, its
bytes by kind (``run.traced_memory``) beside ``formulas.memory``'s prediction."""

from __future__ import annotations

from dataclasses import dataclass

from dtflab import allocator
from dtflab.train.formulas.memory import KINDS, transformer_bytes
from dtflab.train.machinery.traced_memory import step_memory


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
            rows.append(f"  {kind:<14}{self.measured[kind]:>14,}"
                        + (f"{predicted:>14,}" + ("" if error is None else f"  {error:+.1%}")
                           if predicted is not None else "      (measured only)"))
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
    from dtflab.train.graphs import one_replica

    from dtflab import checks
    from dtflab.train.layouts.layout import Layout

    if batch is not None:
        problem = dataclasses.replace(problem, batch_size=checks.whole(batch, "batch", example=8))
    Layout(micro_batches=micro_batches).fits(problem)  # a whole number, dividing the batch
    tf = import_tf()
    built = one_replica.single_graph(problem, seed, micro_batches=micro_batches)
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
    allocator.let_go(built.graph)
    (measured,) = step_memory(step.metadata).values()
    name = problem.name + (f" in {micro_batches} micro-batches" if micro_batches > 1 else "")
    return MemoryReport(name, measured, transformer_bytes(problem, micro_batches=micro_batches))
