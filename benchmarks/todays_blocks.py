"""Today's blocks (Llama's and DeepSeek's), measured in one run against their formulas.

- memory_max_rel_error: for each block choice (grouped-query, multi-query, SwiGLU, RMSNorm with
  rotary positions, Llama's block), the worst relative error by kind of formulas.memory's
  one-device prediction against a traced step (train.memory), over the levers none,
  selective, bfloat16, and full recomputation in bfloat16.
- tensor_parallel_activations_rel_error: per worker of 2, tensor parallelism's activations
  against formulas.memory.split_activation_bytes, for Llama's block with its 2 key/value heads
  split and with 1 copied.
- bytes_over_formula: per form, each worker's bytes per step at the transport (WireBytes) over
  the formula's: tensor parallelism (split and copied key/value heads), ring attention and
  Ulysses (grouped-query and a key/value head per query head), expert parallelism with a
  shared expert (over that routing's formula); trace_minus_formula: the traced step's bytes
  less the formula's, per worker (the losses and Adam's scalars).
- vs_single_max_abs_loss_diff: each of those runs' worst |loss - train.single's| per step.

    python benchmarks/todays_blocks.py [--smoke]

Prints one JSON line (about 3 minutes on 2 cores). --smoke: one lever, one block and a few
steps of each figure (the figures are not meaningful).
"""

from __future__ import annotations

import argparse
import collections
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import dtflab  # noqa: E402
from dtflab import names, train  # noqa: E402
from dtflab.train.formulas import memory as memory_formula, split_bytes  # noqa: E402

BASE = dict(blocks=2, d_model=64, heads=4, sequence=32, batch_size=8)
LLAMA = dict(kv_heads=2, norm="rms", positions="rotary", activation="swiglu", tied=False)
CHOICES = {"grouped_query": dict(kv_heads=2), "multi_query": dict(kv_heads=1),
           "swiglu": dict(activation="swiglu"), "rms_rotary": dict(norm="rms", positions="rotary"),
           "llama": LLAMA}
LEVERS = (dict(), dict(recompute="selective"), dict(precision="bfloat16"),
          dict(recompute="full", precision="bfloat16"))
STEPS = 7  # WireBytes counts steps 3 to STEPS - 1


def memory_errors(levers=LEVERS) -> dict:
    found = {}
    for name, choice in CHOICES.items():
        worst = collections.defaultdict(float)
        for lever in levers:
            for kind, error in train.memory(train.transformer(**BASE, **choice, **lever)).errors.items():
                worst[kind] = max(worst[kind], abs(error))
        found[name] = {kind: round(error, 5) for kind, error in worst.items()}
    return found


def by_worker(run) -> collections.Counter:
    traced = collections.Counter()
    for transfer in run.trace.transfers:
        traced[names.short(transfer.src_device)] += transfer.nbytes
    return traced


def measured(run, wire, formula: dict, alone) -> dict:
    traced = by_worker(run)
    return {"bytes_over_formula": {w: round(wire.per_step.sent_by()[w] / sum(f.values()), 4)
                                   for w, f in formula.items()},
            "trace_minus_formula": {w: int(traced[w] - sum(f.values()))
                                    for w, f in formula.items()},
            "vs_single_max_abs_loss_diff": float(np.max(np.abs(np.array(run.losses)
                                                               - np.array(alone.losses))))}


def forms(cluster, steps: int = STEPS, base: dict = BASE) -> tuple[dict, dict]:
    found, activations = {}, {}
    go = dict(steps=steps, seed=0, trace_step=1)
    counted = steps - 3
    for name, kv in (("tensor_parallel_split_kv", 2), ("tensor_parallel_copied_kv", 1)):
        problem = train.transformer(**base, **dict(LLAMA, kv_heads=kv))
        wire = train.WireBytes(after_step=2, steps=counted)
        run = train.tensor_parallel(problem, cluster, ways=2, callbacks=[wire], **go)
        found[name] = measured(run, wire, run.details["bytes_formula"], train.single(problem, **go))
        held = train.step_memory(run.trace.metadata)
        predicted = memory_formula.split_activation_bytes(problem, 2)
        activations[name] = {w: round(held[w]["activations"] / predicted[i] - 1, 5)
                             for i, w in enumerate(("worker:0", "worker:1"))}
    for kv in (4, 1):
        problem = train.transformer(**dict(base, sequence=64), **dict(LLAMA, kv_heads=kv))
        alone = train.single(problem, **go)
        for attention in ("ring", "ulysses"):
            wire = train.WireBytes(after_step=2, steps=counted)
            run = train.context_parallel(problem, cluster, ways=2, attention=attention,
                                         callbacks=[wire], **go)
            found[f"context_{attention}_kv{kv}"] = measured(run, wire, run.details["bytes_formula"],
                                                           alone)
    # tests/test_expert_parallel.py's shape (d_model 128, 64 positions), with Llama's block
    problem = train.transformer(**dict(base, d_model=128, sequence=64), **LLAMA, experts=4,
                                top_k=2, shared_experts=1)
    wire = train.WireBytes(after_step=2, steps=counted)
    run = train.expert_parallel(problem, cluster, workers=2, callbacks=[wire], **go)
    routed = run.details["per_step"]["routed"]
    window = [split_bytes.expert_parallel_bytes(problem, routed[step]) for step in range(3, steps)]
    mean = {w: {"all": float(np.mean([sum(step[i].values()) for step in window]))}
            for i, w in enumerate(("worker:0", "worker:1"))}
    traced = {w: f for w, f in zip(("worker:0", "worker:1"),
                                    split_bytes.expert_parallel_bytes(problem, routed[1]))}
    found["expert_shared"] = measured(run, wire, mean, train.single(problem, **go))
    found["expert_shared"]["trace_minus_formula"] = {
        w: int(by_worker(run)[w] - sum(f.values())) for w, f in traced.items()}
    return found, activations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    smoke = parser.parse_args().smoke
    results = {"memory_max_rel_error": memory_errors(LEVERS[:1] if smoke else LEVERS)}
    # one inter-op thread a task: each worker's ops in one order, so what its forward holds when
    # it ends is the same from run to run (tests/test_sequence_parallel.py's cluster)
    with dtflab.start_cluster(workers=2, inter_op_threads=1, intra_op_threads=1) as cluster:
        results["forms"], results["tensor_parallel_activations_rel_error"] = (
            forms(cluster, 4, dict(BASE, blocks=1)) if smoke else forms(cluster))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
