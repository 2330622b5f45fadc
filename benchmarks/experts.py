"""Mixture of experts, measured in one run on two local worker tasks (two inter-op threads and
one intra-op thread each: a worker answers the other's transfers while it computes).

- experts_vs_single_max_abs_loss_diff: the worst |loss difference| per step of
  train.expert_parallel (2 workers) against train.single on the same problem and seed.
- experts_all_to_all_bytes_over_formula: each worker's bytes per step at the transport
  (WireBytes) over costs.expert_parallel_bytes for the same steps' routing (the mean over the
  window); and the traced step's tensors over the formula for that step.
- experts_busy_max_over_mean: each worker's time in its experts' ops in a traced step, max over
  mean, for a router that starts skewed toward expert 0 (skew=1.0), with the balance loss
  (balance=0.2) and without, after ``--steps`` steps; with the tokens per expert max over mean
  beside it (the arithmetic the busy time follows).
- experts_tokens_max_over_mean_by_step: the same two runs' tokens per expert, max over mean,
  every 10th step (the balance loss bringing it down as training goes on).

    python benchmarks/experts.py [--quick]

Prints one JSON line. --quick: a smaller model and fewer steps (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import collections
import json

import numpy as np


def main(quick: bool) -> None:
    import dtflab
    from dtflab import train
    from dtflab.train.formulas import costs

    shape = dict(blocks=2, d_model=64 if quick else 128, heads=2, sequence=32 if quick else 64,
                 batch_size=8, experts=4)
    steps = 40 if quick else 80
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
        window = [costs.expert_parallel_bytes(problem, routed[step]) for step in range(3, 7)]
        traced = collections.Counter()
        for transfer in run.trace.transfers:
            traced[dtflab.short_device(transfer.src_device)] += transfer.nbytes
        at_trace = costs.expert_parallel_bytes(problem, routed[1])
        results["experts_all_to_all_bytes_over_formula"] = {
            worker: {"transport": round(wire.per_step.sent_by()[worker]
                                        / np.mean([sum(s[w].values()) for s in window]), 4),
                     "trace": round(traced[worker] / sum(at_trace[w].values()), 5)}
            for w, worker in enumerate(("worker:0", "worker:1"))}

        busy, by_step = {}, {}
        for label, balance in (("without", 0.0), ("with", 0.2)):
            skewed = train.transformer(**shape, top_k=1, capacity_factor=4.0, skew=1.0,
                                       balance=balance, learning_rate=0.01)
            run = train.expert_parallel(skewed, cluster, workers=2, steps=steps, seed=0,
                                        trace_step=steps - 1)
            spent = [sum(op.duration_us for device, ops in run.trace.timings.items()
                         if device.endswith(f"task:{w}/device:CPU:0") for op in ops
                         if f"experts_on_worker{w}/" in op.name and op.kind == "compute")
                     for w in range(2)]
            load = np.array(run.details["per_step"]["tokens_per_expert"])  # [step, block, e]
            worker_load = load[-1].reshape(shape["blocks"], 2, -1).sum(axis=(0, 2))
            busy[label] = {"busy_max_over_mean": round(max(spent) / np.mean(spent), 3),
                           "tokens_max_over_mean_by_worker":
                               round(float(worker_load.max() / worker_load.mean()), 3),
                           "busy_ms": [round(s / 1e3, 2) for s in spent]}
            ratio = load.max(axis=-1) / load.mean(axis=-1)
            by_step[label] = [round(float(ratio[i].mean()), 3) for i in range(0, steps, 10)]
        results["experts_busy_max_over_mean"] = busy
        results["experts_tokens_max_over_mean_by_step"] = by_step
    results["shape"] = train.transformer(**shape).name
    print(json.dumps(results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    main(parser.parse_args().quick)
