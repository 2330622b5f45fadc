"""How synchronous data parallelism through one ps scales, predicted from two measured runs.

A step through one ps is a bottleneck, not a sum (``costs.ps_step_s``): it lasts as long as
the longer of a worker's own path (its 1/N of the compute, then its exchange with the ps, which
the ps serves for all workers at once) and what the machine's cores can do (every process's
CPU time per step over the cores). Each part is measured, not fitted to step times:

- ``compute_s`` and ``worker_extra_s``: a worker's CPU seconds per step are ``compute / N +
  extra``; two runs (N = 1 and 2) give both;
- ``ps_fixed_s`` and ``ps_per_worker_s``: the ps's CPU seconds per step are ``fixed + N x
  per worker`` (each worker's parameters to send and gradients to receive and add up);
- ``client_s``: this process's CPU seconds per step (it feeds the batch and runs the sessions);
- ``exchange_s``: the one-worker step less the worker's CPU time: the time the worker waits;
  less, too, the time the step's path waited for a core (``CpuPerStep.queued_s``): on a busy
  machine the step grows by those waits and the exchange does not (a notebook starved beside
  other work would read its waits for a core as exchange).

CPU times are read from each task process's threads (``/proc/<pid>/task/*/schedstat``) over the steps of
a run, after its first ``skip``: under load they stay what the work costs, where a traced op's
duration grows with the wait for a core. It cannot see a ps whose gRPC threads run out of
cores on a machine that has cores left, a network slower than the loopback, or stragglers.
The waits are an estimate (``CpuPerStep``): beside busy loops the exchange it reads still
moves by a third or more.

In [1]: from dtflab.train.experiments import scaling_model
In [2]: model = scaling_model.fit(train.classification(width=1024, batch_size=4096))
In [3]: model.steps_per_s(8), model.limit(8)    # (…, 'cores') on 2 cores
"""

from __future__ import annotations

import statistics

from dtflab import checks
from dtflab.machine import cpus
from dtflab.train.formulas.scaling import ScalingModel
from dtflab.train.measure.cpu import CpuPerStep


def measure_parts(problem, workers: int, *, steps: int = 12, skip: int = 3) -> dict:
    """One synchronous run with ``workers`` workers and one ps, one thread per task:
    ``{"step_s", "worker_s" (mean over workers), "ps_s", "client_s"}``, CPU seconds per step,
    and ``"queued_s"``, the seconds per step its path waited for a core."""
    from dtflab.cluster import start_cluster
    from dtflab.train.strategies.sync_data_parallel import sync_data_parallel

    with start_cluster(jobs=f"ps=1,worker={workers}", intra_op_threads=1,
                       inter_op_threads=1) as cluster:
        cpu = CpuPerStep(cluster, skip=skip)
        sync_data_parallel(problem, cluster, steps=steps, workers=workers, watchdog=False,
                           callbacks=[cpu])
    workers_s = [s for name, s in cpu.per_step.items() if name.startswith("worker:")]
    return {"step_s": cpu.wall_s, "worker_s": statistics.fmean(workers_s),
            "ps_s": cpu.per_step["ps:0"], "client_s": cpu.per_step["client"],
            "queued_s": cpu.queued_s}


def fit(problem, *, rounds: int = 3, steps: int = 12, cores: int | None = None) -> ScalingModel:
    """Measure one and two workers (medians of ``rounds`` interleaved runs) and solve for the
    model's parts; ``cores`` defaults to the CPUs' worth of time this process may use
    (:func:`dtflab.machine.cpus`, rounded down, at least 1: one on Binder, whose quota is one
    CPU on a many-core host)."""
    checks.whole(rounds, "rounds", example=3)
    runs = {1: [], 2: []}
    for _ in range(rounds):
        for workers in runs:
            runs[workers].append(measure_parts(problem, workers, steps=steps))
    one, two = ({key: statistics.median(run[key] for run in runs[n]) for key in runs[n][0]}
                for n in (1, 2))
    compute = 2 * (one["worker_s"] - two["worker_s"])  # w(N) = compute / N + extra
    extra = max(one["worker_s"] - compute, 0.0)
    per_worker = max(two["ps_s"] - one["ps_s"], 0.0)  # p(N) = fixed + N x per worker
    waited = one["step_s"] - one["worker_s"] - one["queued_s"]  # not the waits for a core
    return ScalingModel(compute_s=compute, exchange_s=max(waited, 0.0),
                        worker_extra_s=extra, ps_fixed_s=max(one["ps_s"] - per_worker, 0.0),
                        ps_per_worker_s=per_worker,
                        client_s=statistics.fmean([one["client_s"], two["client_s"]]),
                        cores=cores or int(max(1, cpus())))
