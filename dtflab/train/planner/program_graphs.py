"""A ZeRO worker program's step as its own step function traces it: ``train.zero``'s (stages 1
and 2) and ``train.sharded_data_parallel``'s (stage 3), built here by the code the workers run
(``zero_step``, ``sharded_step``), one per worker, its collectives with the keys the workers
give them, and read by ``graph_ops.function_ops`` for ``executor.simulate``.

Tracing needs no cluster: a collective is an op in a graph until it runs. Each worker's
function is traced with its own index, so the broadcasts of a reduce-scatter pair as they do
in the run (worker i's send with worker j's receive, one key). 2-5 s a worker for four blocks
at d_model 128 (4,000-5,000 ops). What it cannot see: the function's graph after Grappler
(as ``graph_ops`` says), and the worker program's work beside its graph (the call, the batch,
the report: ``op_costs``'s ``call``).
"""

from __future__ import annotations

import dataclasses

from dtflab._quiet import import_tf
from dtflab.train.planner import graph_ops

#: A collective's timeout while traced (it never runs here).
TIMEOUT_S = 60.0


def traced_step(problem, stage: int, index: int, workers: int, values, seed: int = 0):
    """Worker ``index`` of ``workers``'s step function for ZeRO ``stage`` (1, 2 or 3), traced
    on its slice of the batch: a concrete function."""
    tf = import_tf()
    from dtflab.train.worker_programs.collectives import Collectives

    collectives = Collectives(tf, index, workers, TIMEOUT_S)
    if stage == 3:
        from dtflab.train.worker_programs.sharded_data_parallel import sharded_step

        step, _, _ = sharded_step(tf, problem, collectives, values)
    else:
        from dtflab.train.worker_programs.zero import zero_step

        step, _, _ = zero_step(tf, problem, collectives, stage, values)
    replica = dataclasses.replace(problem, batch_size=problem.batch_size // workers)
    xs, ts = replica.batch(0, seed)
    return step.get_concrete_function(tf.TensorSpec(xs.shape, xs.dtype),
                                      tf.TensorSpec(ts.shape, ts.dtype))


def program_ops(problem, stage: int, workers: int, seed: int = 0) -> list[graph_ops.GraphOp]:
    """Every worker's step ops for ZeRO ``stage``, worker i's on task ``worker:i`` and named
    ``w<i>/...``: what ``executor.simulate`` runs side by side, each collective waiting for
    its members on the other workers."""
    values = problem.initial_values(seed)
    found = []
    for i in range(workers):
        function = traced_step(problem, stage, i, workers, values, seed)
        found += graph_ops.on_worker(graph_ops.function_ops(function, f"worker:{i}"), i)
    return found


def collective_counts(ops) -> dict[str, int]:
    """Worker 0's collective ops by type (``CollectiveGatherV2``: 106)."""
    counts: dict[str, int] = {}
    for op in ops:
        if op.kind == "collective" and op.task == "worker:0":
            counts[op.type] = counts.get(op.type, 0) + 1
    return counts
