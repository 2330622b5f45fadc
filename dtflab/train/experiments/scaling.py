"""Scaling measured: steps/s and examples/s of the data-parallel loops (and, on request, of a
pipeline of as many stages as workers) as workers are added, for a fixed global batch (strong
scaling) or a fixed batch per worker (weak scaling).

Every task gets one intra-op and one inter-op thread (one core each), so N workers ask for N
cores; past the machine's cores the figures measure the machine, not the loop. Rates are taken
after the first ``skip`` steps (start-up and the first step's graph set-up), medians over
``rounds`` runs with the worker counts interleaved, so drift in the machine's load hits every
N alike. ``benchmarks/scaling.py`` prints these; notebook 07 draws them.

In [1]: from dtflab.train.experiments import scaling
In [2]: curves = scaling.measure(train.classification(), counts=(1, 2), steps=8)
In [3]: curves.speedups("all_reduce")      # {1: 1.0, 2: 1.8...}
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from dtflab import checks

#: The loops measured by default, in the order they are drawn.
LOOPS = ("sync_data_parallel", "async_parameter_server", "all_reduce")
#: Measured when asked (``loops=(..., "pipeline")``): N workers are N pipeline stages, each
#: batch in ``PIPELINE_MICRO_BATCHES`` micro-batches (GPipe), on ``pipeline_problem``'s model.
PIPELINE = "pipeline"
PIPELINE_MICRO_BATCHES = 8

#: Measured by the team on a 16-core Intel Xeon (TensorFlow 2.21, one thread per task, the
#: heavy classifier, width 1024, global batch 4096, medians of 3): steps/s (updates/s for
#: async) by worker count, before all-reduce's step was made cheaper (issue 24).
XEON_16 = {"sync_data_parallel": {1: 3.72, 2: 6.60, 4: 10.70, 8: 15.24, 12: 17.38},
           "async_parameter_server": {1: 3.57, 2: 7.02, 4: 14.10, 8: 28.22, 12: 38.74},
           "all_reduce": {1: 3.75, 2: 6.37, 4: 9.42, 8: 11.95, 12: 12.82}}


@dataclass
class Curves:
    """``rates[mode][loop][N]``: steps/s (updates/s for async, summed over its workers) for
    ``mode`` ``"strong"`` or ``"weak"``; ``examples`` the same in examples/s."""

    batch: int  # the global batch (strong) and the batch per worker (weak)
    rates: dict = field(default_factory=dict)
    examples: dict = field(default_factory=dict)
    runs: dict = field(default_factory=dict)  # every round's rate, for the record

    def speedups(self, loop: str, mode: str = "strong") -> dict[int, float]:
        """Steps/s at each N over steps/s at the smallest N measured (examples/s for weak
        scaling, where each step does N times the work)."""
        table = (self.rates if mode == "strong" else self.examples)[mode][loop]
        first = table[min(table)]
        return {n: rate / first for n, rate in sorted(table.items())}

    def as_json(self) -> dict:
        def keyed(table):
            return {mode: {loop: {str(n): round(v, 3) for n, v in sorted(by_n.items())}
                           for loop, by_n in loops.items()} for mode, loops in table.items()}
        return {"steps_per_s": keyed(self.rates), "examples_per_s": keyed(self.examples)}


def measure(problem, *, counts=(1, 2), loops=LOOPS, modes=("strong", "weak"), steps: int = 8,
            rounds: int = 3, skip: int = 2) -> Curves:
    """Run each loop at each worker count in ``counts``, ``rounds`` times; see the module."""
    checks.whole(steps, "steps", minimum=skip + 2, example=8)
    checks.whole(rounds, "rounds", example=3)
    unknown = [loop for loop in loops if loop not in (*LOOPS, PIPELINE)]
    if unknown:
        raise ValueError(f"loops={list(loops)!r}: {unknown[0]!r} is not measured here; choose "
                         f"from {', '.join((*LOOPS, PIPELINE))}")
    deepest = max(counts)
    curves = Curves(problem.batch_size)
    samples: dict = {}
    for _ in range(rounds):
        for workers in counts:
            for mode in modes:
                sized = problem if mode == "strong" else replace(
                    problem, batch_size=problem.batch_size * workers)
                for loop, rate, examples in _one_count(sized, workers, loops, steps, skip,
                                                       deepest):
                    samples.setdefault((mode, loop, workers), []).append((rate, examples))
    for (mode, loop, workers), found in samples.items():
        curves.rates.setdefault(mode, {}).setdefault(loop, {})[workers] = statistics.median(
            r for r, _ in found)
        curves.examples.setdefault(mode, {}).setdefault(loop, {})[workers] = statistics.median(
            e for _, e in found)
        curves.runs.setdefault(mode, {}).setdefault(loop, {})[workers] = [r for r, _ in found]
    return curves


def pipeline_problem(problem, deepest: int):
    """The model a pipeline of up to ``deepest`` stages is measured on: ``problem`` (its width,
    features, classes and batch) with ``deepest`` full-width layers between its first and last,
    so that every stage count that divides ``deepest`` cuts it into stages of equal work. (The
    heavy classifier itself has one: cut in two, one stage would hold nearly all its work.)"""
    features, width, classes = problem.layers[0], problem.layers[1], problem.layers[-1]
    return replace(problem, name=f"{problem.name}_pipeline{deepest}",
                   layers=(features, *[width] * (deepest + 1), classes))


def _one_count(problem, workers: int, loops, steps: int, skip: int, deepest: int):
    """(loop, steps/s, examples/s) for each loop with ``workers`` workers."""
    from dtflab.cluster import start_cluster
    from dtflab.train.strategies.all_reduce import all_reduce
    from dtflab.train.strategies.async_parameter_server import async_parameter_server
    from dtflab.train.strategies.pipeline import pipeline
    from dtflab.train.strategies.sync_data_parallel import sync_data_parallel

    ps_loops = [loop for loop in loops if loop in ("sync_data_parallel", "async_parameter_server")]
    if ps_loops:
        with start_cluster(jobs=f"ps=1,worker={workers}", intra_op_threads=1,
                                  inter_op_threads=1) as cluster:
            if "sync_data_parallel" in ps_loops:
                history = sync_data_parallel(problem, cluster, steps=steps, workers=workers,
                                             watchdog=False)
                yield ("sync_data_parallel", *_rates(history.records, skip))
            if "async_parameter_server" in ps_loops:
                # Each Downpour worker trains a whole problem batch per update: its share of
                # the global batch is a problem of batch / N.
                share = replace(problem, batch_size=problem.batch_size // workers)
                history = async_parameter_server(share, cluster, steps=steps, workers=workers,
                                                 watchdog=False)
                yield ("async_parameter_server", *_rates(history.records, skip * workers))
    if "all_reduce" in loops:
        history = all_reduce(problem, workers=workers, steps=steps, threads=1, watchdog=False)
        own = [r for r in history.records if r.worker == "worker:0"]
        steps_per_s, _ = _rates(own, skip)
        yield ("all_reduce", steps_per_s, steps_per_s * problem.batch_size)
    if PIPELINE in loops:
        # Two inter-op threads a stage: the pipeline orders a stage's multiplies one at a time
        # (one core of arithmetic), and the second thread answers the other stages' transfers.
        with start_cluster(workers=workers, intra_op_threads=1, inter_op_threads=2) as cluster:
            history = pipeline(pipeline_problem(problem, deepest), cluster, stages=workers,
                               micro_batches=PIPELINE_MICRO_BATCHES, steps=steps, watchdog=False)
        yield (PIPELINE, *_rates(history.records, skip))


def _rates(records, skip: int) -> tuple[float, float]:
    """Records/s and examples/s from the ``skip``-th record to the last."""
    late = records[skip:]
    if len(late) < 2:
        raise ValueError(f"only {len(records)} steps were recorded; measure more steps")
    seconds = late[-1].time_s - late[0].time_s
    return (len(late) - 1) / seconds, sum(r.examples for r in late[1:]) / seconds
