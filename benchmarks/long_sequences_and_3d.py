"""Long sequences and the forms combined: sequence parallelism, ring attention and data x
tensor x pipeline, measured in one run on local tasks (one inter-op and one intra-op thread
each for the first two, so each worker's ops run in one order).

- sequence_parallel_bytes_over_tensor_parallel: bytes all workers sent per step (counted at the
  transport, WireBytes) with sequence_parallel=True over without, 2 ways; and the formulas'
  ratio (the same sums, a ring all-reduce's bytes each; the ends add A / t twice).
- sequence_parallel_bytes_over_formula: each worker's sent bytes over
  split_bytes.transformer_sequence_parallel_bytes.
- sequence_parallel_activation_ratio: each worker's activations (a traced step, by the memory
  accounting) with sequence parallelism over without; and formulas.memory's ratio.
- context_parallel_bytes_over_formula: for the naive and the zig-zag cut over 2 workers, each
  worker's sent bytes at the transport over split_bytes.context_parallel_bytes.
- context_parallel_busy_max_over_min: from a traced step, each worker's time in ring
  attention's ops (forward and backward): max over min, by cut; and the scores' arithmetic's
  max over min (layouts.ring.work: c for the naive cut, 1 for zig-zag).
- context_parallel_activations_over_single: each worker's activations over one process's
  (train.memory), by cut.
- long_sequences_vs_single_max_abs_loss_diff: the worst |loss difference| per step of every
  run above against train.single, same seed.
- three_d_bytes_over_formula: train.combined on data 2 x tensor 2 and data 2 x tensor 2 x
  pipeline 2 (8 worker tasks): each axis's bytes per step (Layout.axis_bytes of what
  WireBytes counted at the transport, and of the traced step) over split_bytes.combined_bytes.
- three_d_bytes_per_step: the same runs' formula bytes per axis (which axis costs what).
- combined_vs_single_max_abs_loss_diff: the worst |loss difference| per step of those runs
  against train.single.

    python benchmarks/long_sequences_and_3d.py [--quick] [--smoke]

Prints one JSON line. --quick uses shorter sequences (about a minute on 2 cores); --smoke,
--quick's with a few steps of each figure (the figures are not meaningful).
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

#: Context parallelism's workers: two, one a core here (a third would share a core, and its
#: ops' times would measure the sharing).
WAYS = 2


def main(quick: bool, smoke: bool = False) -> None:
    import dtflab
    from dtflab import train
    from dtflab.train.formulas.memory import split_activation_bytes
    from dtflab.train.layouts import ring
    from dtflab.train.machinery.traced_memory import step_memory

    def worst(a, b):
        return float(np.max(np.abs(np.array(a.losses) - np.array(b.losses))))

    # steps a run, and steps WireBytes counts from step 3 on
    steps, counted = (4, 1) if smoke else (8, 4)
    results, diffs = {}, []
    with dtflab.start_cluster(workers=3, inter_op_threads=1, intra_op_threads=1) as cluster:
        tp = train.transformer(blocks=2, d_model=64 if quick else 128, heads=4,
                               sequence=64 if quick else 128, batch_size=8)
        alone = train.single(tp, steps=steps, seed=0)
        wires, runs = {}, {}
        for sp in (False, True):
            wires[sp] = train.WireBytes(after_step=2, steps=counted)
            runs[sp] = train.tensor_parallel(tp, cluster, ways=2, steps=steps, seed=0, trace_step=1,
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
        alone = train.single(cp, steps=steps, seed=0)
        single_activations = train.memory(cp).measured["activations"]
        over, busy, activations = {}, {}, {}
        for cut in ring.CUTS:
            wire = train.WireBytes(after_step=2, steps=counted)
            run = train.context_parallel(cp, cluster, ways=WAYS, cut=cut, steps=steps, seed=0,
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

    three = train.transformer(blocks=2, d_model=128, heads=2, sequence=64 if quick else 128,
                              batch_size=8)
    steps, counted = (4, 1) if smoke else (6, 3)
    alone = train.single(three, steps=steps, seed=0)
    over, per_step, combined_diffs = {}, {}, []
    with dtflab.start_cluster(workers=8, inter_op_threads=2, intra_op_threads=1) as cluster:
        for layout in (train.Layout(data=2, tensor=2), train.Layout(data=2, tensor=2, pipeline=2)):
            wire = train.WireBytes(after_step=2, steps=counted)
            run = train.combined(three, cluster, layout, steps=steps, seed=0, trace_step=1,
                                 callbacks=[wire])
            combined_diffs.append(worst(alone, run))
            formula = run.details["bytes_formula"]
            sent, traced = (layout.axis_bytes(wire.per_step.sent),
                            layout.axis_bytes(run.trace.bytes_between()))
            axes = [a for a in ("data", "tensor", "pipeline") if formula[a]]
            over[str(layout)] = {a: {"transport": round(sent[a] / formula[a], 4),
                                     "trace": round(traced[a] / formula[a], 5)} for a in axes}
            per_step[str(layout)] = {a: formula[a] for a in axes}
    results["three_d_bytes_over_formula"] = over
    results["three_d_bytes_per_step"] = per_step
    results["combined_vs_single_max_abs_loss_diff"] = max(combined_diffs)
    results["shapes"] = {"sequence_parallel": tp.name, "context_parallel": cp.name,
                         "combined": three.name}
    results["median_loss_diff"] = statistics.median(diffs)
    print(json.dumps(results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    arguments = parser.parse_args()
    main(arguments.quick or arguments.smoke, arguments.smoke)
