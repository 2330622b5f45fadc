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
- ``exchange_s``: the one-worker step less the worker's CPU time: the time the worker waits.

CPU times are read from each task process's threads (``/proc/<pid>/task/*/schedstat``) over the steps of
a run, after its first ``skip``: under load they stay what the work costs, where a traced op's
duration grows with the wait for a core. It cannot see a ps whose gRPC threads run out of
cores on a machine that has cores left, a network slower than the loopback, or stragglers.

In [1]: model = train.scaling_model.fit(train.classification(width=1024, batch_size=4096))
In [2]: model.steps_per_s(8), model.limit(8)    # (…, 'cores') on 2 cores
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

from dtflab import checks
from dtflab.machine import cpus
from dtflab.train.formulas import costs
from dtflab.train.run.callbacks import Callback

@dataclass(frozen=True)
class ScalingModel:
    """One ps, N workers: the parts of a step that :func:`fit` measured (seconds per step)."""

    compute_s: float
    exchange_s: float
    worker_extra_s: float = 0.0
    ps_fixed_s: float = 0.0
    ps_per_worker_s: float = 0.0
    client_s: float = 0.0
    cores: int | None = None  # None: as many as the tasks want

    @classmethod
    def from_rates(cls, rates: dict[int, float]) -> "ScalingModel":
        """The worker's path alone, from steps/s at two worker counts (another machine's table,
        whose CPU times are not known): ``1 / rate = compute / N + exchange``."""
        (n1, r1), (n2, r2) = sorted(rates.items())[:2]
        compute = (1 / r1 - 1 / r2) / (1 / n1 - 1 / n2)
        return cls(compute_s=compute, exchange_s=1 / r1 - compute / n1)

    def cpu_s(self, workers: float) -> float:
        """Every process's CPU seconds per step with ``workers`` workers."""
        return (self.compute_s + workers * (self.worker_extra_s + self.ps_per_worker_s)
                + self.ps_fixed_s + self.client_s)

    def step_s(self, workers: float) -> float:
        return costs.ps_step_s(workers, self.compute_s + workers * self.worker_extra_s,
                               self.exchange_s, cpu_s=self.cpu_s(workers), cores=self.cores)

    def steps_per_s(self, workers: float) -> float:
        return 1.0 / self.step_s(workers)

    def speedup(self, workers: float) -> float:
        return self.step_s(1) / self.step_s(workers)

    def limit(self, workers: float) -> str:
        """What sets the step at ``workers``: ``"workers"`` (their compute and exchange) or
        ``"cores"`` (the machine)."""
        path = (self.compute_s + workers * self.worker_extra_s) / workers + self.exchange_s
        return "workers" if self.step_s(workers) <= path else "cores"

    @property
    def parallel_fraction(self) -> float:
        """The share of the one-worker step that more workers split (Amdahl's p)."""
        return self.compute_s / self.step_s(1)

    def amdahl(self, workers: float) -> float:
        """Amdahl's law's speed-up with this model's parallel fraction."""
        return costs.amdahl(self.parallel_fraction, workers)


class CpuPerStep(Callback):
    """CPU seconds per step of each task process (and of this process, ``"client"``) over
    steps ``skip`` to the last, and the wall seconds per step."""

    def __init__(self, cluster, skip: int = 3):
        self.cluster, self.skip = cluster, skip
        self.per_step: dict[str, float] = {}
        self.wall_s = None
        self._first = None

    def _read(self):
        pids = {task.name: task.pid for task in self.cluster.tasks}
        return {name: _cpu_s(pid) for name, pid in pids.items()} | {
            "client": time.process_time()}, time.perf_counter()

    def on_step(self, history, record) -> None:
        count = len(history.records)
        if count == self.skip:
            self._first = (count, *self._read())
        elif self._first is not None and count > self.skip:
            first_count, first_cpu, first_wall = self._first
            cpu, wall = self._read()
            steps = count - first_count
            self.per_step = {name: (cpu[name] - first_cpu[name]) / steps for name in cpu}
            self.wall_s = (wall - first_wall) / steps


def _cpu_s(pid: int) -> float:
    """CPU seconds process ``pid``'s live threads have run so far (the kernel's scheduler
    statistics, in nanoseconds: ``/proc/<pid>/task/<tid>/schedstat``)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return total / 1e9


def measure_parts(problem, workers: int, *, steps: int = 12, skip: int = 3) -> dict:
    """One synchronous run with ``workers`` workers and one ps, one thread per task:
    ``{"step_s", "worker_s" (mean over workers), "ps_s", "client_s"}``, CPU seconds per step."""
    from dtflab.cluster import start_cluster
    from dtflab.train.strategies.sync_data_parallel import sync_data_parallel

    with start_cluster(jobs=f"ps=1,worker={workers}", intra_op_threads=1,
                       inter_op_threads=1) as cluster:
        cpu = CpuPerStep(cluster, skip=skip)
        sync_data_parallel(problem, cluster, steps=steps, workers=workers, watchdog=False,
                           callbacks=[cpu])
    workers_s = [s for name, s in cpu.per_step.items() if name.startswith("worker:")]
    return {"step_s": cpu.wall_s, "worker_s": statistics.fmean(workers_s),
            "ps_s": cpu.per_step["ps:0"], "client_s": cpu.per_step["client"]}


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
    return ScalingModel(compute_s=compute, exchange_s=max(one["step_s"] - one["worker_s"], 0.0),
                        worker_extra_s=extra, ps_fixed_s=max(one["ps_s"] - per_worker, 0.0),
                        ps_per_worker_s=per_worker,
                        client_s=statistics.fmean([one["client_s"], two["client_s"]]),
                        cores=cores or int(max(1, cpus())))
