"""The scaling model of synchronous data parallelism through one ps: a step lasts as long as the
longer of a worker's own path (its 1/N of the compute, then its exchange with the ps) and what
the machine's cores can do (every process's CPU time per step over the cores;
``costs.ps_step_s``). Its parts are measured by ``experiments.scaling_model.fit``; here they
are only combined. It cannot see a ps whose gRPC threads run out of cores on a machine that has
cores left, a network slower than the loopback, or stragglers."""

from __future__ import annotations

from dataclasses import dataclass

from dtflab.train.formulas import costs


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
