"""The transformer and its memory, measured in one run.

- transformer_vs_single_max_abs_loss_diff: the worst |loss difference| per step over the loops
  that train the transformer beside train.single (sync data parallel through a ps, a 2-stage
  1F1B pipeline with blocks as stages, heads split 2 ways, all-reduce in 2 worker programs),
  same seed and global batch, 20 steps; transformer_vs_single_by_loop gives each.
- memory_model_max_rel_error: for each kind (parameters, gradients, optimizer, activations),
  the worst relative error of formulas.memory's prediction against the bytes a traced step
  allocated (train.memory), over several shapes (blocks, d_model, heads, sequence, batch) and
  the levers (recompute, precision) on the last of them.
- peak_over_activations: the step's measured peak over its kept activations, per shape (the
  peak is measured only).
- flops_matmul_over_6n: the matrix multiplies a training step runs, counted from its graph,
  over the references' 6 N + 12 L S d, per shape.
- loss_first_last: train.single on train.transformer()'s defaults, 200 steps: the first loss
  and the mean of the last 20, in nats per token.
- seconds_per_step_single: the same run's median step time.
- recompute_activation_ratio: activations kept with recompute="selective" and "full" over
  none, measured and by the formula, for LEVER_SHAPE in float32.
- mixed_precision_activation_ratio: bfloat16's and float16's activations over float32's,
  measured and by the formula, LEVER_SHAPE, no recomputation.
- accumulation_vs_big_batch_max_abs_diff: the worst |loss difference| per step between
  micro_batches=4 and one batch of the same sequences, 20 steps.
- lever_step_time_over_none: each lever's median step time over float32 without
  recomputation (train.transformer()'s defaults otherwise, 100 steps each, in turn).
- zero_state_bytes_over_formula, zero_wire_bytes_over_formula: per worker of 2, the bytes its
  variables hold and the bytes it sent per step (counted at the transport, WireBytes), over
  the formula, for plain all-reduce and ZeRO stages 1, 2 and 3 on the transformer (M + 2M,
  M + 2M/N and 3M/N; 2 (N-1)/N M on the wire, 3 (N-1)/N M for stage 3, its tied embedding
  gathered by two blocks) and stage 3 on an MLP (stage_3_mlp).
- zero_step_peak: the step's peak beyond what a worker held before it (the CPU allocator's
  count in each worker program), median over steps and the 2 workers, over the model's bytes
  M, for all-reduce and ZeRO stages 1, 2 and 3 on a model whose parameters outweigh its
  activations; stage 1's over costs.zero_stage1_step_peak_bytes ((1 + 2/N) M), stage 2's
  saving over ZeRO's (1 - 1/N) M of gradients, and each loop's median step time over
  all-reduce's.

    python benchmarks/memory.py [--quick] [--smoke]

Prints one JSON line. --quick uses two shapes and fewer steps (under 2 minutes on 2 cores);
--smoke: one shape, one lever, a few steps of each figure and a small model for zero_step_peak
(the figures are not meaningful).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import dtflab  # noqa: E402
from dtflab import train  # noqa: E402
from dtflab.train.formulas import transformer as formula  # noqa: E402
from dtflab.train.measure import flops  # noqa: E402

SHAPES = [dict(blocks=1, d_model=64, heads=4, sequence=32, batch_size=16),
          dict(blocks=2, d_model=128, heads=8, sequence=64, batch_size=8),
          dict(blocks=1, d_model=32, heads=2, sequence=128, batch_size=4),
          dict(blocks=3, d_model=96, heads=6, sequence=48, batch_size=6, tied=False),
          dict(blocks=2, d_model=256, heads=4, sequence=16, batch_size=32)]
#: the shape the levers' ratios are measured on: the softmax a fair share of the activations
LEVER_SHAPE = dict(blocks=2, d_model=128, heads=8, sequence=64, batch_size=8)
LEVERS = [dict(recompute="selective"), dict(recompute="full"), dict(precision="bfloat16"),
          dict(precision="float16"), dict(recompute="selective", precision="bfloat16")]


def loops_against_single(steps: int) -> dict:
    """The worst |loss difference| per step against train.single, for each loop."""
    problem = train.transformer(blocks=2, d_model=32, heads=2, sequence=16, batch_size=8)
    single = np.array(train.single(problem, steps=steps, seed=4).losses)
    runs = {}
    with dtflab.start_cluster(jobs="ps=1,worker=2", inter_op_threads=2,
                              intra_op_threads=1) as cluster:
        runs["sync_data_parallel"] = train.sync_data_parallel(problem, cluster, steps=steps, seed=4)
        runs["pipeline_1f1b"] = train.pipeline(problem, cluster, stages=2, micro_batches=4,
                                               schedule="1f1b", steps=steps, seed=4)
        runs["tensor_parallel"] = train.tensor_parallel(problem, cluster, ways=2, steps=steps,
                                                        seed=4)
    runs["all_reduce"] = train.all_reduce(problem, workers=2, steps=steps, seed=4)
    return {loop: float(np.max(np.abs(np.array(history.losses) - single)))
            for loop, history in runs.items()}


def lever_ratios() -> tuple[dict, dict]:
    """(recompute ratios, 16-bit ratios), each ``{name: [measured, formula]}``."""
    reports = {(r, p): train.memory(train.transformer(**LEVER_SHAPE, recompute=r, precision=p))
               for r, p in [("none", "float32"), ("selective", "float32"), ("full", "float32"),
                            ("none", "bfloat16"), ("none", "float16")]}

    def ratio(key):
        return [round(reports[key].measured["activations"]
                      / reports["none", "float32"].measured["activations"], 4),
                round(reports[key].predicted["activations"]
                      / reports["none", "float32"].predicted["activations"], 4)]

    return ({r: ratio((r, "float32")) for r in ("selective", "full")},
            {p: ratio(("none", p)) for p in ("bfloat16", "float16")})


def accumulation_diff(steps: int) -> float:
    problem = train.transformer(batch_size=16)
    one = np.array(train.single(problem, steps=steps, seed=5).losses)
    four = np.array(train.single(problem, steps=steps, seed=5, micro_batches=4).losses)
    return float(np.max(np.abs(four - one)))


def zero_figures(steps: int) -> tuple[dict, dict]:
    """({loop: state bytes over formula}, {loop: wire bytes over formula}), worker 0 of 2."""
    from dtflab.train.formulas import costs

    problem = train.transformer(blocks=2, d_model=64, heads=4, sequence=32, batch_size=16)
    mlp = train.classification(width=256, batch_size=256)
    runs = {"all_reduce": (problem, lambda p, **o: train.all_reduce(p, **o)),
            "stage_1": (problem, lambda p, **o: train.zero(p, stage=1, **o)),
            "stage_2": (problem, lambda p, **o: train.zero(p, stage=2, **o)),
            "stage_3": (problem, lambda p, **o: train.zero(p, stage=3, **o)),
            "stage_3_mlp": (mlp, lambda p, **o: train.zero(p, stage=3, **o))}
    state, wire = {}, {}
    for name, (model, loop) in runs.items():
        counter = train.WireBytes(after_step=2, steps=steps)
        history = loop(model, workers=2, steps=steps + 4, callbacks=[counter])
        m = model.parameter_bytes
        held = sum(history.details["state_bytes"]["worker:0"].values())
        formula_state = (3 * m if name == "all_reduce" else costs.sharded_state_bytes(m, 2)
                         if name.startswith("stage_3") else m + 2 * m / 2)
        formula_wire = history.details.get("bytes_per_step_formula", costs.all_reduce_bytes(m, 2))
        state[name] = round(held / formula_state, 4)
        wire[name] = round(counter.per_step.sent_by()["worker:0"] / formula_wire, 4)
    return state, wire


def zero_peaks(steps: int, d_model: int = 512) -> dict:
    """The step's measured peak (beyond what the worker held before it; median over steps 1..
    and both workers) over the model's bytes, for all-reduce and ZeRO stages 1, 2 and 3, on a
    model whose parameters outweigh its activations; stage 1's over its formula, and stage 2's
    saving over ZeRO's (1 - 1/N) x M of gradients it no longer keeps."""
    from dtflab.train.formulas import costs

    problem = train.transformer(blocks=2, d_model=d_model, heads=4, sequence=16, batch_size=4)
    m = problem.parameter_bytes
    runs = {"all_reduce": lambda: train.all_reduce(problem, workers=2, steps=steps),
            "stage_1": lambda: train.zero(problem, stage=1, workers=2, steps=steps),
            "stage_2": lambda: train.zero(problem, stage=2, workers=2, steps=steps),
            "stage_3": lambda: train.zero(problem, stage=3, workers=2, steps=steps)}
    peaks, times = {}, {}
    for name, run in runs.items():
        history = run()
        peaks[name] = statistics.median(p for worker in history.details["step_peak_bytes"].values()
                                        for p in worker[1:])
        times[name] = statistics.median(np.diff([r.time_s for r in history.step_records])[1:])
    return {"over_parameter_bytes": {name: round(p / m, 3) for name, p in peaks.items()},
            "stage_1_over_formula": round(peaks["stage_1"] / costs.zero_stage1_step_peak_bytes(
                m, 2), 4),
            "stage_2_saving_over_formula": round((peaks["stage_1"] - peaks["stage_2"]) / (m / 2),
                                                 3),
            "step_s_over_all_reduce": {name: round(t / times["all_reduce"], 3)
                                       for name, t in times.items()}}


def step_time(problem, steps: int) -> float:
    history = train.single(problem, steps=steps, seed=0)
    return statistics.median(np.diff([r.time_s for r in history.records]))


def flops_ratio(problem) -> float:
    return flops.training_step(problem) / formula.of(problem)["flops_total"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    smoke, quick = args.smoke, args.quick or args.smoke
    shapes = SHAPES[:1] if smoke else SHAPES[:2] if quick else SHAPES
    errors, peaks, flops = {}, {}, {}
    for shape in shapes:
        problem = train.transformer(**shape)
        report = train.memory(problem)
        for kind, error in report.errors.items():
            errors[kind] = max(errors.get(kind, 0.0), abs(error))
        peaks[problem.name] = round(report.measured["peak"] / report.measured["activations"], 3)
        flops[problem.name] = round(flops_ratio(problem), 4)
    for levers in LEVERS[: 1 if smoke else 2 if quick else None]:
        report = train.memory(train.transformer(**shapes[-1], **levers))
        for kind, error in report.errors.items():
            errors[kind] = max(errors.get(kind, 0.0), abs(error))
    by_loop = loops_against_single(3 if smoke else 8 if quick else 20)
    recompute, precision = lever_ratios()
    zero_state, zero_wire = zero_figures(1 if smoke else 4 if quick else 8)
    zero_peak = zero_peaks(3, d_model=64) if smoke else zero_peaks(6 if quick else 16)
    lever_steps = 3 if smoke else 30 if quick else 100
    base = step_time(train.transformer(), lever_steps)
    times_over_none = {"_".join(levers.values()): round(
        step_time(train.transformer(**levers), lever_steps) / base, 3) for levers in LEVERS}
    steps = 3 if smoke else 60 if quick else 200
    history = train.single(train.transformer(), steps=steps, seed=0)
    times = np.diff([r.time_s for r in history.records])
    print(json.dumps({
        "transformer_vs_single_max_abs_loss_diff": max(by_loop.values()),
        "transformer_vs_single_by_loop": {loop: float(f"{d:.2e}") for loop, d in by_loop.items()},
        "memory_model_max_rel_error": {kind: float(f"{e:.2e}") for kind, e in errors.items()},
        "peak_over_activations": peaks,
        "flops_matmul_over_6n": flops,
        "loss_first_last": [round(history.losses[0], 3), round(history.final_loss(), 3)],
        "seconds_per_step_single": round(statistics.median(times), 4),
        "steps": steps,
        "recompute_activation_ratio": recompute,
        "mixed_precision_activation_ratio": precision,
        "accumulation_vs_big_batch_max_abs_diff": accumulation_diff(
            3 if smoke else 8 if quick else 20),
        "lever_step_time_over_none": times_over_none,
        "zero_state_bytes_over_formula": zero_state,
        "zero_wire_bytes_over_formula": zero_wire,
        "zero_step_peak": zero_peak,
    }))


if __name__ == "__main__":
    main()
