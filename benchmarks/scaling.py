"""Strong and weak scaling of the data-parallel loops, measured in one run.

For N = 1, 2, 4, ... up to the machine's cores (one intra-op and one inter-op thread per
task), the heavy classifier (width 1024, two hidden layers), global batch 4096 (strong) or
4096 per worker (weak), medians of --rounds runs with the worker counts interleaved:

- strong / weak: loop -> N -> steps/s (updates/s, summed over workers, for async) and
  examples/s (``dtflab.train.experiments.scaling``). ``pipeline``: N workers as N stages, 8 micro-batches,
  on ``pipeline_problem`` (the classifier with as many full-width layers as the largest N, so
  each stage count cuts it evenly; the plain classifier's work sits in one layer).
- pipeline_speedup_2_workers: the pipeline's steps/s at 2 stages over 1.
- allreduce_speedup_2_workers: all-reduce steps/s at 2 workers over 1, strong scaling.
- allreduce_over_sync_ps_2_workers: all-reduce steps/s over sync data parallel through one
  ps, 2 workers, strong scaling.
- cores: the machine's.
- ps_model: the bottleneck model of a synchronous ps step (``experiments.scaling_model``), its parts
  measured from one- and two-worker runs; ``ps_model_steps_per_s`` its prediction and
  ``ps_model_measured_steps_per_s`` the sync loop measured at N = 1, 2, 3, 4 (past this
  machine's cores too: where the model says the cores set the step), and
  ``ps_model_max_rel_error`` the worst N. Its fit and sync runs use a global batch of
  ``ps_model_batch`` (3072, three slices of 1024: 4096 does not split among 3 workers).
- ps_model_16_cores_max_rel_error: the same model's worker path fitted to the 16-core table's
  rates at 1 and 2 workers (``ScalingModel.from_rates``), against the table at 4, 8 and 12.

    python benchmarks/scaling.py [--quick] [--rounds 3] [--figure build/scaling.html] [--smoke]

Prints one JSON line and writes the Bokeh figure. --quick measures strong scaling only;
--smoke, one round of the fewest steps a rate is measured from, on a classifier of width 128
(the figures are not meaningful).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from dtflab import train  # noqa: E402
from dtflab.train.experiments import scaling  # noqa: E402

#: The ps model's global batch: it measures N = 3 too, and each worker takes an equal slice
#: (3 x 1024; it splits among 1, 2, 3, 4 and every power of two up to 1024 workers).
PS_MODEL_BATCH = 3072


def worker_counts(cores: int) -> list[int]:
    counts, n = [], 1
    while n <= cores:
        counts.append(n)
        n *= 2
    return counts


def ps_model_figures(problem, cores: int, rounds: int, steps: int) -> dict:
    """The bottleneck model against the measured sync curve, here and on the 16-core table."""
    from dtflab.train.experiments import scaling_model

    problem = replace(problem, batch_size=PS_MODEL_BATCH)
    model = scaling_model.fit(problem, rounds=rounds, steps=steps + 2)
    counts = sorted(set(worker_counts(cores)) | {1, 2, 3, 4})
    sync = scaling.measure(problem, counts=counts, loops=("sync_data_parallel",),
                           modes=("strong",), steps=steps, rounds=rounds)
    measured = sync.rates["strong"]["sync_data_parallel"]
    xeon = scaling.XEON_16["sync_data_parallel"]
    quoted = scaling_model.ScalingModel.from_rates({n: xeon[n] for n in (1, 2)})
    return {
        "ps_model_batch": problem.batch_size,
        "ps_model": {k: round(v, 5) if isinstance(v, float) else v
                     for k, v in vars(model).items()},
        "ps_model_steps_per_s": {str(n): round(model.steps_per_s(n), 3) for n in counts},
        "ps_model_limit": {str(n): model.limit(n) for n in counts},
        "ps_model_measured_steps_per_s": {str(n): round(r, 3) for n, r in measured.items()},
        "ps_model_max_rel_error": round(max(abs(model.steps_per_s(n) / r - 1)
                                            for n, r in measured.items()), 3),
        "ps_model_16_cores_steps_per_s": {str(n): round(quoted.steps_per_s(n), 2) for n in xeon},
        "ps_model_16_cores_max_rel_error": round(max(abs(quoted.steps_per_s(n) / xeon[n] - 1)
                                                     for n in (4, 8, 12)), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="strong scaling only")
    parser.add_argument("--rounds", type=int, default=3, help="runs per point (medians)")
    parser.add_argument("--steps", type=int, default=10, help="steps per run")
    parser.add_argument("--figure", default="build/scaling.html", help="where the figure goes")
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    if args.smoke:  # 4 steps: the fewest scaling.measure takes a rate from (2 skipped)
        args.rounds, args.steps = 1, 4
    cores = os.cpu_count() or 1
    # --smoke: the same loops on a narrow classifier (the heavy one's step is about a second)
    problem = train.classification(width=128 if args.smoke else 1024, batch_size=4096)
    counts = worker_counts(cores)
    curves = scaling.measure(problem, counts=counts, steps=args.steps, rounds=args.rounds,
                             loops=(*scaling.LOOPS, scaling.PIPELINE),
                             modes=("strong",) if args.quick else ("strong", "weak"))
    strong = curves.rates["strong"]
    result = {"benchmark": "scaling", "cores": cores, "batch": problem.batch_size,
              "rounds": args.rounds, **curves.as_json()}
    if 2 in strong["all_reduce"]:
        result["allreduce_speedup_2_workers"] = round(
            strong["all_reduce"][2] / strong["all_reduce"][1], 3)
        result["allreduce_over_sync_ps_2_workers"] = round(
            strong["all_reduce"][2] / strong["sync_data_parallel"][2], 3)
    result["pipeline_problem"] = scaling.pipeline_problem(problem, max(counts)).name
    if 2 in strong[scaling.PIPELINE]:
        result["pipeline_speedup_2_workers"] = round(
            strong[scaling.PIPELINE][2] / strong[scaling.PIPELINE][1], 3)
    result.update(ps_model_figures(problem, cores, args.rounds, args.steps))
    result["runs_steps_per_s"] = {mode: {loop: {str(n): [round(r, 3) for r in rs]
                                                for n, rs in by_n.items()}
                                         for loop, by_n in loops.items()}
                                  for mode, loops in curves.runs.items()}
    from bokeh.io import output_file, save

    from dtflab.viz.scaling import curves_figure

    os.makedirs(os.path.dirname(args.figure) or ".", exist_ok=True)
    output_file(args.figure, title="dtflab scaling")
    save(curves_figure(curves))
    result["figure"] = args.figure
    print(json.dumps(result))


if __name__ == "__main__":
    main()
