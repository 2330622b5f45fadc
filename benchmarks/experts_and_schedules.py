"""Mixture of experts and pipeline schedules, measured in one run on two local worker tasks (two
inter-op threads and one intra-op thread each: a worker answers the other's transfers while it
computes).

- experts_vs_single_max_abs_loss_diff: the worst |loss difference| per step of
  train.expert_parallel (2 workers) against train.single on the same problem and seed.
- experts_all_to_all_bytes_over_formula: each worker's bytes per step at the transport
  (WireBytes) over split_bytes.expert_parallel_bytes for the same steps' routing (the mean over the
  window); and the traced step's tensors over the formula for that step.
- experts_busy_max_over_mean: each worker's time in its experts' multiplies in a traced step,
  max over mean, for a router that starts skewed toward expert 0 (skew=1.0), with the balance
  loss (balance=0.2) and without, at the last of 60 steps (d = 32, sequence 16, the tests'
  shape, and 32 sequences a batch); with the tokens per worker max over mean beside it (the
  arithmetic the busy time follows).
- experts_tokens_max_over_mean_by_step: the same two runs' tokens per worker (its experts', all
  blocks), max over mean, every 10th step (the balance loss bringing it down as training goes
  on); the busy figure is the median of ``--rounds`` runs of each.
- pipeline_bubble_measured, pipeline_bubble_formula: by schedule (gpipe, 1f1b, interleaved with
  v = 2, zero_bubble) at p = 2 workers and m = 4 micro-batches of an MLP of four 1024-wide
  layers: each worker's idle time over its busy time in a traced step (the median of
  ``--rounds`` runs' traced steps, each worker's mean), and the schedule's formula with that
  step's own mean forward, backward and weight-gradient times ((p - 1) / m, (p - 1) / (v m),
  (p - 1)(F + B - W) / (m (F + B + W))); pipeline_idle_share_measured beside them, and
  pipeline_vs_single_max_abs_loss_diff over all four.

    python benchmarks/experts_and_schedules.py [--quick] [--rounds 3] [--smoke]

Prints one JSON line. --quick: a smaller model and fewer steps (about a minute on 2 cores).
--smoke: --quick's, one round and a few steps of each figure (the figures are not meaningful).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

import numpy as np


#: The schedules measured, each with its chunks per worker.
SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved": 2, "zero_bubble": 1}


def schedules(cluster, quick: bool, rounds: int, smoke: bool = False) -> dict:
    from dtflab import train

    # 32 -> five full-width layers -> 10: every stage, and every chunk of the interleaved
    # schedule, gets the same arithmetic (a stage's narrow input or output layer costs little)
    problem = train.classification(width=64 if smoke else 512 if quick else 1024,
                                   batch_size=64 if smoke else 1024, features=32, hidden_layers=5)
    steps = 2 if smoke else 4
    alone = train.single(problem, steps=steps, seed=0)
    measured, formula, idle, worst = {}, {}, {}, 0.0
    for schedule, chunks in SCHEDULES.items():
        ratios, formulas, shares = [], [], []
        for _ in range(rounds):
            run = train.pipeline(problem, cluster, stages=2, micro_batches=4, schedule=schedule,
                                 chunks=chunks, steps=steps, seed=0, trace_step=steps - 1,
                                 watchdog=False)
            worst = max(worst, float(np.max(np.abs(np.array(alone.losses) - np.array(run.losses)))))
            ratios.append(run.bubble.bubble_ratio)
            formulas.append(run.bubble.formula_ratio)
            shares.append(run.bubble.mean_idle_share)
        measured[schedule] = round(statistics.median(ratios), 3)
        formula[schedule] = round(statistics.median(formulas), 3)
        idle[schedule] = round(statistics.median(shares), 3)
    return {"pipeline_bubble_measured": measured, "pipeline_bubble_formula": formula,
            "pipeline_idle_share_measured": idle, "pipeline_vs_single_max_abs_loss_diff": worst,
            "pipeline_setting": f"p = 2, m = 4, v = 2 (interleaved); {problem.name}"}


def main(quick: bool, rounds: int, smoke: bool = False) -> None:
    import dtflab
    from dtflab import train
    from dtflab.train.formulas import split_bytes

    shape = dict(blocks=2, d_model=64 if quick else 128, heads=2, sequence=32 if quick else 64,
                 batch_size=8, experts=4)
    results = {}
    with dtflab.start_cluster(workers=2, inter_op_threads=2, intra_op_threads=1) as cluster:
        problem = train.transformer(**shape, top_k=2, capacity_factor=1.0)
        alone = train.single(problem, steps=8, seed=0)
        wire = train.WireBytes(after_step=2, steps=4)
        run = train.expert_parallel(problem, cluster, workers=2, steps=8, seed=0, trace_step=1,
                                    callbacks=[wire])
        results["experts_vs_single_max_abs_loss_diff"] = float(
            np.max(np.abs(np.array(alone.losses) - np.array(run.losses))))
        routed = run.details["per_step"]["routed"]
        window = [split_bytes.expert_parallel_bytes(problem, routed[step]) for step in range(3, 7)]
        traced = collections.Counter()
        for transfer in run.trace.transfers:
            traced[dtflab.short_device(transfer.src_device)] += transfer.nbytes
        at_trace = split_bytes.expert_parallel_bytes(problem, routed[1])
        results["experts_all_to_all_bytes_over_formula"] = {
            worker: {"transport": round(wire.per_step.sent_by()[worker]
                                        / np.mean([sum(s[w].values()) for s in window]), 4),
                     "trace": round(traced[worker] / sum(at_trace[w].values()), 5)}
            for w, worker in enumerate(("worker:0", "worker:1"))}

        busy, by_step = {}, {}
        # the balance runs on the shape the tests train (tests/test_expert_parallel.py): at
        # d = 128 a router started at skew=1.0 with learning_rate=0.01 stayed on one expert a
        # block for 80 steps with the loss and without it
        small = dict(shape, d_model=32, sequence=16, batch_size=32)
        steps = 10 if smoke else 60
        for label, balance in (("without", 0.0), ("with", 0.2)):
            skewed = train.transformer(**small, top_k=1, capacity_factor=4.0, skew=1.0,
                                       balance=balance, learning_rate=0.01)
            spent, loads = [], []
            for _ in range(rounds):  # the busy times of one traced step move from run to run
                run = train.expert_parallel(skewed, cluster, workers=2, steps=steps, seed=0,
                                            trace_step=steps - 1)
                # the experts' multiplies: at d = 32 the rest of their ops cost the same
                # whatever the tokens (measured: all ops 4.5 and 1.9 ms without the loss, 8.4
                # and 4.3 with it)
                spent.append([sum(op.duration_us for device, ops in run.trace.timings.items()
                                  if device.endswith(f"task:{w}/device:CPU:0") for op in ops
                                  if f"experts_on_worker{w}/" in op.name
                                  and op.kind == "compute" and "MatMul" in op.op)
                              for w in range(2)])
                loads.append(np.array(run.details["per_step"]["tokens_per_expert"]))
            load = loads[0]  # [step, block, expert]: the same routing every round
            # each worker's tokens (its experts', all blocks), max over mean, step by step
            by_worker = load.reshape(len(load), small["blocks"], 2, -1).sum(axis=(1, 3))
            ratio = by_worker.max(axis=-1) / by_worker.mean(axis=-1)
            ratios = [max(s) / np.mean(s) for s in spent]
            busy[label] = {"busy_max_over_mean": round(float(statistics.median(ratios)), 3),
                           "busy_max_over_mean_rounds": [round(float(r), 3) for r in ratios],
                           "tokens_max_over_mean_by_worker": round(float(ratio[-1]), 3)}
            by_step[label] = [round(float(ratio[i]), 3) for i in range(0, steps, 10)]
        results["experts_busy_max_over_mean"] = busy
        results["experts_tokens_max_over_mean_by_step"] = by_step
        results.update(schedules(cluster, quick, rounds, smoke))
    results["shape"] = train.transformer(**shape).name
    print(json.dumps(results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    arguments = parser.parse_args()
    if arguments.smoke:
        arguments.quick, arguments.rounds = True, 1
    main(arguments.quick, arguments.rounds, arguments.smoke)
