"""Long sequences: sequence parallelism and ring attention, measured in one run on local tasks
(one inter-op and one intra-op thread each, so each worker's ops run in one order).

- sequence_parallel_bytes_over_tensor_parallel: bytes all workers sent per step (counted at the
  transport, WireBytes) with sequence_parallel=True over without, 2 ways; and the formulas'
  ratio (the same sums, a ring all-reduce's bytes each; the ends add A / t twice).
- sequence_parallel_bytes_over_formula: each worker's sent bytes over
  costs.transformer_sequence_parallel_bytes.
- sequence_parallel_activation_ratio: each worker's activations (a traced step, by the memory
  accounting) with sequence parallelism over without; and formulas.memory's ratio.
- context_parallel_bytes_over_formula: for the naive and the zig-zag cut over 2 workers, each
  worker's sent bytes at the transport over costs.context_parallel_bytes.
- context_parallel_busy_max_over_min: from a traced step, each worker's time in ring
  attention's ops (forward and backward): max over min, by cut; and the scores' arithmetic's
  max over min (layouts.ring.work: c for the naive cut, 1 for zig-zag).
- context_parallel_activations_over_single: each worker's activations over one process's
  (train.memory), by cut.
- long_sequences_vs_single_max_abs_loss_diff: the worst |loss difference| per step of every
  run above against train.single, same seed.

    python benchmarks/long_sequences.py [--quick]

Prints one JSON line. --quick uses shorter sequences (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

#: Context parallelism's workers: two, one a core here (a third would share a core, and its
#: ops' times would measure the sharing).
WAYS = 2


def main(quick: bool) -> None:
    import dtflab
    from dtflab import train
    from dtflab.train.formulas import costs
    from dtflab.train.formulas.memory import split_activation_bytes
    from dtflab.train.layouts import ring
    from dtflab.train.measure.memory import step_memory

    def worst(a, b):
        return float(np.max(np.abs(np.array(a.losses) - np.array(b.losses))))

    results, diffs = {}, []
    with dtflab.start_cluster(workers=3, inter_op_threads=1, intra_op_threads=1) as cluster:
        tp = train.transformer(blocks=2, d_model=64 if quick else 128, heads=4,
                               sequence=64 if quick else 128, batch_size=8)
        alone = train.single(tp, steps=8, seed=0)
        wires, runs = {}, {}
        for sp in (False, True):
            wires[sp] = train.WireBytes(after_step=2, steps=4)
            runs[sp] = train.tensor_parallel(tp, cluster, ways=2, steps=8, seed=0, trace_step=1,
                                             sequence_parallel=sp, callbacks=[wires[sp]])
            diffs.append(worst(alone, runs[sp]))
        total = {sp: sum(w.per_step.sent_by().values()) for sp, w in wires.items()}
        formula = {sp: sum(sum(f.values()) for f in run.details["bytes_formula"].values())
                   for sp, run in runs.items()}
        results["sequence_parallel_bytes_over_tensor_parallel"] = {
            "measured": round(total[True] / total[False], 4),
            "formula": round(formula[True] / formula[False], 4)}
        results["sequence_parallel_bytes_over_formula"] = {
            w: round(wires[True].per_step.sent_by()[w] / sum(f.values()), 4)
            for w, f in runs[True].details["bytes_formula"].items()}
        held = {sp: step_memory(run.trace.metadata) for sp, run in runs.items()}
        predicted = {sp: split_activation_bytes(tp, 2, sp) for sp in (False, True)}
        results["sequence_parallel_activation_ratio"] = {
            w: {"measured": round(held[True][w]["activations"] / held[False][w]["activations"], 4),
                "formula": round(predicted[True][i] / predicted[False][i], 4)}
            for i, w in enumerate(("worker:0", "worker:1"))}

        cp = train.transformer(blocks=2, d_model=64, heads=2, sequence=192 if quick else 384,
                               batch_size=4)
        alone = train.single(cp, steps=8, seed=0)
        single_activations = train.memory(cp).measured["activations"]
        over, busy, activations = {}, {}, {}
        for cut in ring.CUTS:
            wire = train.WireBytes(after_step=2, steps=4)
            run = train.context_parallel(cp, cluster, ways=WAYS, cut=cut, steps=8, seed=0,
                                         trace_step=1, callbacks=[wire])
            diffs.append(worst(alone, run))
            over[cut] = {w: round(wire.per_step.sent_by()[w] / sum(f.values()), 4)
                         for w, f in run.details["bytes_formula"].items()}
            spent = [sum(op.duration_us for op in ops if "ring_attention" in op.name
                         and op.kind == "compute") for ops in run.trace.timings.values()]
            work = ring.work(cut, WAYS, cp.sequence)
            busy[cut] = {"measured": round(max(spent) / min(spent), 3),
                         "arithmetic": round(max(work) / min(work), 3),
                         "busy_ms": [round(s / 1e3, 2) for s in spent]}
            activations[cut] = {w: round(m["activations"] / single_activations, 4)
                                for w, m in sorted(step_memory(run.trace.metadata).items())}
        results["context_parallel_bytes_over_formula"] = over
        results["context_parallel_busy_max_over_min"] = busy
        results["context_parallel_activations_over_single"] = activations
    results["long_sequences_vs_single_max_abs_loss_diff"] = max(diffs)
    results["shapes"] = {"sequence_parallel": tp.name, "context_parallel": cp.name}
    results["median_loss_diff"] = statistics.median(diffs)
    print(json.dumps(results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    main(parser.parse_args().quick)
