"""Plain against fused attention on this machine as the sequence grows, measured in one run.

One transformer block (d_model 64, 2 heads, one sequence a batch), ``attention="plain"`` and
``attention="fused"`` with tiles of ``sequence / 8`` (8 query blocks, 36 of the 64 tiles
computed), at each sequence length:

- kept_bytes: the activations a traced step keeps for its backward (``train.memory``), plain
  and fused, and fused over plain; kept_formula_rel_error: the worst relative error of
  ``formulas.memory`` against those measurements.
- peak_bytes: the traced step's peak, plain and fused, and fused over plain.
- step_s: the median step time of ``train.single`` (the first steps left out), plain and
  fused, and fused over plain. Fused attention here is TensorFlow ops run tile after tile, not
  one kernel: it saves a kernel's memory, not all of its time.
- attention_flops: the attention's matrix-multiply FLOPs a training step runs (its
  ``BatchMatMulV2`` ops, counted from the graph), plain and fused; causal_skip_share: the
  share of the score tiles the fused forward skips above the diagonal (1 - 36/64), and the
  FLOPs fused over plain (fused computes each kept tile's scores once more in its backward:
  7 multiplies a tile where plain's autodiff runs 6 on the whole square).

    python benchmarks/attention.py [--quick] [--smoke]

Prints one JSON line. The default runs 1,024 to 8,192 tokens (about 20 minutes on 2 cores, the
plain step at 8,192 holding about 1.6 GB at its peak); --quick 1,024 and 2,048; --smoke 128 and 256 with a
few steps (the figures are not meaningful).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from dtflab import train  # noqa: E402
from dtflab._quiet import import_tf  # noqa: E402
from dtflab.train.measure import flops  # noqa: E402

SHAPE = dict(blocks=1, d_model=64, heads=2, batch_size=1)
SEQUENCES = (1024, 2048, 4096, 8192)
TILES = 8  # query blocks a side


def problems(sequence: int) -> dict:
    return {"plain": train.transformer(**SHAPE, sequence=sequence),
            "fused": train.transformer(**SHAPE, sequence=sequence, attention="fused",
                                       attention_block=sequence // TILES)}


def attention_flops(problem) -> int:
    """The batch matrix multiplies (the attention's) a training step of ``problem`` runs."""
    tf = import_tf()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.int32, [problem.batch_size, problem.sequence])
        t = tf.compat.v1.placeholder(tf.int64, [problem.batch_size, problem.sequence])
        variables = problem.create_variables(0)
        grads = tf.gradients(problem.loss(problem.forward(variables, x), t), variables)
    return sum(flops._flops(op) for op in flops.needed(grads).values()
               if op.type == "BatchMatMulV2")


def step_s(problem, steps: int) -> float:
    history = train.single(problem, steps=steps + 2, seed=0)
    return statistics.median(np.diff([r.time_s for r in history.records])[1:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="short sequences and a few steps, "
                        "for the test suite: the figures are not meaningful")
    args = parser.parse_args()
    sequences = (128, 256) if args.smoke else SEQUENCES[:2] if args.quick else SEQUENCES
    steps = 2 if args.smoke else 5
    kept, peak, times, counted, worst = {}, {}, {}, {}, 0.0
    for s in sequences:
        pair = problems(s)
        reports = {name: train.memory(problem) for name, problem in pair.items()}
        for report in reports.values():
            worst = max(worst, abs(report.errors["activations"]))
        kept[s] = {name: r.measured["activations"] for name, r in reports.items()}
        peak[s] = {name: r.measured["peak"] for name, r in reports.items()}
        times[s] = {name: round(step_s(problem, steps), 4) for name, problem in pair.items()}
        counted[s] = {name: attention_flops(problem) for name, problem in pair.items()}
        for figures in (kept[s], peak[s], times[s], counted[s]):
            figures["fused_over_plain"] = round(figures["fused"] / figures["plain"], 4)
    print(json.dumps({
        "benchmark": "attention", "shape": SHAPE, "tiles_a_side": TILES, "steps": steps,
        "kept_bytes": kept, "kept_formula_rel_error": round(worst, 5), "peak_bytes": peak,
        "step_s": times, "attention_flops": counted,
        "causal_skip_share": round(1 - TILES * (TILES + 1) / 2 / TILES ** 2, 4)}))


if __name__ == "__main__":
    main()
