"""ZeRO (Rajbhandari et al. 2020) stage by stage, beside plain all-reduce: every worker of data
parallelism holds the parameters, the gradients and Adam's state whole; ZeRO shards them over
the N workers, one more kind per stage.

- **stage 1**: the optimizer's state (Adam's m and v) sharded, each worker updating only its
  shard of the parameters; each worker still computes every full gradient;
- **stage 2**: the gradients too: each is reduce-scattered as soon as the backward has made it,
  so a worker keeps only its shard of the sum;
- **stage 3**: the parameters too (``train.sharded_data_parallel``: each layer, or each
  transformer block's parameters, all-gathered while it is used).

Stages 1 and 2 run ``dtflab/train/worker_programs/zero.py`` (its docstring has the step); they
train any problem, a transformer too, as stage 3 does. The records, Stop,
restarts and traces are ``dtflab.train.machinery.program_loops``'s, as for ``train.all_reduce``.

Per worker and step, the bytes sent: stages 1 and 2, a reduce-scatter of the gradients and an
all-gather of the parameters, 2 (N-1)/N x M, an all-reduce's; stage 3, 3 (N-1)/N x M.
What stage 2 saves over stage 1 is the full gradients' memory during the step, which the
state bytes (variables) do not show: ``history.details["state_bytes"]`` is the same for both.
``history.details["step_peak_bytes"]`` shows it: each worker's peak per step beyond what it
held before the step, counted by TensorFlow's allocator (stage 1:
``costs.zero_stage1_step_peak_bytes``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dtflab import checks
from dtflab.train.formulas import costs
from dtflab.train.problems.experts import dense_only
from dtflab.train.machinery.options import takes_options
from dtflab.train.machinery.program_loops import Loop, ProgramOptions, train_in_programs

LOOP = Loop(Path(__file__).parents[1] / "worker_programs" / "zero.py", "zero", "ZeRO",
            "reduce-scatter",
            "TF profiler on each worker program, one ZeRO step; CollectiveBcastSendV2/RecvV2 "
            "are the reduce-scatter's exchanges, CollectiveGatherV2 the all-gather")
STAGES = (1, 2, 3)


@takes_options(ProgramOptions)
def zero(problem, *, stage: int | None = None, **options):
    """Train ``problem`` with ZeRO stage ``stage`` (1, 2 or 3) in ``workers`` worker programs.

    In [1]: history = train.zero(train.transformer(), stage=2, workers=2, steps=100)
    In [2]: history.details["state_bytes"]   # {'worker:0': {'parameters': ..., 'slots': ...}}

    The losses are ``train.single``'s up to the rounding of the sums. ``history.details``:
    ``state_bytes`` (what each worker's variables take: the parameters, whole, and Adam's m
    and v for its shards, in bytes), ``memory`` (each
    worker process's ``rss`` and ``pss``), ``step_peak_bytes`` (each worker's peak per step
    beyond what it held before it), ``fingerprints``, ``bytes_per_step_formula`` and
    ``state_bytes_formula``. Stage 3 is ``train.sharded_data_parallel``.
    ``layout=train.Layout(data=2, zero=2)`` says the same as ``workers=2, stage=2`` (stage 1
    when neither says). The other arguments are ``train.all_reduce``'s.
    """
    dense_only(problem, "zero")
    if stage is None and options.get("layout") is None:
        stage = 1
    if stage is not None:
        checks.one_of(stage, "stage", STAGES)
    checked = ProgramOptions(**options).checked(problem, "zero", zero=stage)
    stage = checked.layout.zero
    if stage == 0:
        raise ValueError("zero=0: train.zero runs ZeRO's stages 1 to 3; use zero=1, or "
                         "train.all_reduce for a whole copy on every worker")
    if stage == 3:
        from dtflab.train.strategies.sharded_data_parallel import sharded_data_parallel

        return sharded_data_parallel(problem, **{**options, "workers": None,
                                                 "layout": checked.layout})
    options = checked
    m, n = problem.parameter_bytes, options.workers
    details = {"bytes_per_step_formula": costs.all_reduce_bytes(m, n),
               "state_bytes_formula": {"parameters": m, "slots": 2 * m / n},
               "zero_stage": stage}
    return train_in_programs(dataclasses.replace(LOOP, title=f"ZeRO {stage}"), problem, options,
                             flags={"zero_stage": stage}, details=details)
