"""Sharded data parallelism (ZeRO-3 / FSDP): N worker programs, each holding 1/N of every
layer and of Adam's slots, the full layer all-gathered only while it is used.

Each worker trains on its slice of each global batch, as in ``train.all_reduce``; but no worker
holds the whole model. Before a layer's forward the workers all-gather its shards, before its
backward they gather them again (the full layer is freed in between), and its gradient is
reduce-scattered, so each worker gets the sum over all workers for its own shard and applies
Adam to that shard only. What it costs: 1.5 times the bytes of an all-reduce per step
(``costs.sharded_bytes``), for 1/N of the parameter and slot memory
(``costs.sharded_state_bytes``).

The collectives are TensorFlow's own ops, called in a ``tf.function`` on each worker:
``CollectiveGatherV2`` (ring) for the all-gathers, ``CollectiveReduceV2`` for the check; and,
because TensorFlow 2.21 has no CPU implementation of ``CollectiveReduceScatterV2``, a
reduce-scatter made of ``CollectiveBcastSendV2``/``CollectiveBcastRecvV2`` in groups of two
(worker i sends chunk j of its gradient to worker j: (N - 1)/N of the gradient from each
worker, as a ring reduce-scatter sends). ``tf.distribute``'s replica context has an
``all_gather`` but no reduce-scatter. The program is ``dtflab/train/worker_programs/sharded_data_parallel.py``;
the records, Stop, restarts and traces are ``dtflab.train.machinery.program_loops``'s, as for
``train.all_reduce``.
"""

from __future__ import annotations

import math
from pathlib import Path

from dtflab.train.formulas import costs
from dtflab.train.problems.experts import dense_only
from dtflab.train.machinery.options import takes_options
from dtflab.train.machinery.program_loops import Loop, ProgramOptions, train_in_programs

LOOP = Loop(Path(__file__).parents[1] / "worker_programs" / "sharded_data_parallel.py",
            "sharded", "sharded", "all-gather",
            "TF profiler on each worker program, one sharded step; CollectiveGatherV2 is an "
            "all-gather, CollectiveBcastSendV2/RecvV2 the reduce-scatter's exchanges")


def exchanged_bytes(problem) -> int:
    """The bytes of the units a step gathers and reduce-scatters: the model's, but a
    transformer's tied embedding counts twice, in the first block and the last (one block:
    once)."""
    if problem.unit == "layer":
        return problem.parameter_bytes
    shapes = dict(problem.shapes())
    return 4 * sum(math.prod(shapes[name]) for b in range(1, problem.blocks + 1)
                   for name in problem.stage_parameters(b, b))


@takes_options(ProgramOptions)
def sharded_data_parallel(problem, **options):
    """Train ``problem`` with ZeRO-3 / FSDP in ``workers`` worker programs.

    In [1]: history = train.sharded_data_parallel(problem, workers=2, steps=100)
    In [2]: history.details["state_bytes"]    # {'worker:0': {'parameters': ..., 'slots': ...}}

    Each worker holds shard i of every layer (the layer's weights and bias as one vector,
    padded to a multiple of N; a transformer: of every parameter, gathered block by block and
    each block's forward run again in the backward) and Adam's m and v for it; the losses are
    ``train.single``'s up to the rounding of the sums. ``history.details``: ``state_bytes`` (what each worker's
    variables take, in bytes), ``memory`` (each worker process's ``rss`` and ``pss``, read on
    check steps), ``fingerprints`` (the sum of every parameter, the same on every worker),
    ``bytes_per_step_formula`` and ``state_bytes_formula`` (``costs``).

    The other arguments are ``train.all_reduce``'s: ``background``, Stop (every
    ``check_every`` steps), ``slow``, ``checkpoint_every`` (each worker saves its own shards;
    all resume from the newest step every worker saved), ``trace_step``, ``lockstep`` (what
    ``WireBytes`` needs), ``threads``, ``collective_timeout_s`` and the watchdog. A worker that
    dies stops the whole job: the others wait for it in the next all-gather.
    ``backend``, ``scheduler`` and ``client`` run the programs on a Dask cluster, as
    ``train.all_reduce``'s do (checkpoints and traces then need a shared ``checkpoint_dir``).
    """
    dense_only(problem, "sharded_data_parallel")
    options = ProgramOptions(**options).checked(problem, "sharded_data_parallel")
    if options.layout.zero not in (0, 3):
        raise ValueError(f"zero={options.layout.zero}: sharded_data_parallel is ZeRO's stage 3; "
                         f"use zero=3, or train.zero(stage={options.layout.zero})")
    details = {"bytes_per_step_formula": costs.sharded_bytes(exchanged_bytes(problem),
                                                             options.workers),
               "state_bytes_formula": costs.sharded_state_bytes(problem.parameter_bytes,
                                                                options.workers)}
    return train_in_programs(LOOP, problem, options, details=details)
