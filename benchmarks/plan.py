"""The planner checked against this machine: calibrate the cluster (``hardware="here"``),
predict each run's step time and memory per device from the calibration alone, then run it.

Every run trains the transformer (small sizes: two shapes) with the strategy named, 10 steps,
the last traced; its step time is the median of steps 3 to 8 (the slowest worker's, for the
worker programs), its memory by kind the fullest device's in the traced step
(``train.step_memory``; the worker programs report their variables: parameters and Adam's
state). Predictions are made before the first run.

- plan_step_time_mean_rel_error, plan_step_time_max_rel_error: |predicted / measured - 1|
  over the runs, and the worst;
- plan_memory_max_rel_error: the same for memory by kind (each kind above 1 MB), the worst,
  and plan_memory_mean_rel_error;
- plan_published_max_rel_error (and _mean_): the nine published A100 runs
  (``planner.published``) on the A100 preset;
- calibration_s: how long ``calibrate`` took; calibration: what it measured;
- runs: each run's predicted and measured step (ms) and memory by kind (MB).

    python benchmarks/plan.py [--quick]

Prints one JSON line. --quick: one shape, fewer runs (about 2 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

STEPS, TRACE = 10, 9


def step_s(history) -> float:
    """The median step of steps 3 to 8 (each worker's, the slowest worker's median)."""
    by_worker = {}
    for record in history.records:
        by_worker.setdefault(record.worker, []).append(record.time_s)
    medians = []
    for times in by_worker.values():
        gaps = [b - a for a, b in zip(times[2:TRACE - 1], times[3:TRACE])]
        medians.append(statistics.median(gaps))
    return max(medians)


def memory(history) -> dict:
    """The fullest device's bytes by kind in the traced step, or the worker programs'
    variables (``parameters`` and ``optimizer``)."""
    from dtflab import train

    if getattr(history, "trace", None) is not None and history.trace.metadata is not None:
        held = train.step_memory(history.trace.metadata)
        fullest = max(held.values(), key=lambda kinds: kinds["parameters"] + kinds["gradients"]
                      + kinds["optimizer"] + kinds["activations"])
        return {kind: fullest[kind] for kind in ("parameters", "gradients", "optimizer",
                                                 "activations")}
    state = history.details.get("state_bytes", {})
    if not state:
        return {}
    worker = max(state.values(), key=lambda kinds: sum(kinds.values()))
    return {"parameters": worker["parameters"], "optimizer": worker["slots"]}


def runs(shape: dict, experts: bool):
    """``(name, workers, run(cluster) -> history, Plan)`` for each strategy on ``shape``."""
    from dtflab import train
    from dtflab.train.planner.device_memory import Plan

    problem = train.transformer(**shape)
    base = Plan(blocks=shape["blocks"], d_model=shape["d_model"], heads=shape["heads"],
                sequence=shape["sequence"], vocabulary=problem.vocabulary,
                batch=shape["batch_size"], tied=True)
    go = dict(steps=STEPS, seed=0, trace_step=TRACE, watchdog=False)
    found = []
    for schedule, chunks in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zero_bubble", 1)):
        found.append((f"pipeline {schedule}", 2,
                      lambda c, s=schedule, v=chunks: train.pipeline(
                          problem, c, stages=2, micro_batches=4, schedule=s, chunks=v, **go),
                      dataclasses.replace(base, pipeline=2, micro_batches=4, schedule=schedule,
                                          chunks=chunks)))
    for sp in (False, True):
        found.append((f"tensor parallel{' + sequence parallel' if sp else ''}", 2,
                      lambda c, sp=sp: train.tensor_parallel(problem, c, ways=2,
                                                             sequence_parallel=sp, **go),
                      dataclasses.replace(base, tensor=2, sequence_parallel=sp)))
    found.append(("context parallel (zig-zag)", 2,
                  lambda c: train.context_parallel(problem, c, ways=2, cut="zigzag", **go),
                  dataclasses.replace(base, context=2)))
    if experts:
        moe = train.transformer(**shape, experts=4, top_k=2, capacity_factor=2.0)
        found.append(("expert parallel", 2,
                      lambda c: train.expert_parallel(moe, c, workers=2, **go),
                      dataclasses.replace(base, data=2, experts=4, top_k=2, expert=2)))
    found.append(("all-reduce", 2, lambda c: train.all_reduce(problem, workers=2, **go),
                  dataclasses.replace(base, data=2)))
    tensors = len(problem.initial_values(0))  # dtflab's ZeRO programs: each parameter alone
    for stage in (1, 2, 3):
        found.append((f"ZeRO stage {stage}", 2,
                      lambda c, z=stage: train.zero(problem, stage=z, workers=2, **go),
                      # stage 3 gathers a block's parameters again for the backward and runs
                      # its forward again there (train.sharded_data_parallel)
                      dataclasses.replace(base, data=2, stage=stage,
                                          exchanges=tensors if stage < 3 else base.blocks + 2,
                                          recompute="full" if stage == 3 else "none")))
    found.append(("data x tensor (2 x 2)", 4,
                  lambda c: train.combined(problem, c, train.Layout(data=2, tensor=2), **go),
                  dataclasses.replace(base, data=2, tensor=2)))
    return found


def main(quick: bool) -> None:
    import dtflab
    from dtflab.train.planner.calibration import calibrate
    from dtflab.train.planner import published, step_time
    from dtflab.train.planner.device_memory import per_device

    shapes = [dict(blocks=4, d_model=128, heads=4, sequence=64, batch_size=16)]
    if not quick:
        shapes.append(dict(blocks=4, d_model=256, heads=4, sequence=128, batch_size=8))
    results, rows = {}, []
    for workers in (2, 4):
        with dtflab.start_cluster(workers=workers, inter_op_threads=2,
                                  intra_op_threads=1) as cluster:
            start = time.perf_counter()
            hardware = calibrate(cluster)
            if workers == 2:
                results["calibration_s"] = round(time.perf_counter() - start, 1)
                results["calibration"] = {
                    "matmul_gflops": {k: round(v / 1e9, 1) for k, v in hardware.flops.items()},
                    "memory_gb_s": round(hardware.memory_bandwidth / 1e9, 1),
                    "memory_curve": [(mb, round(share, 2))
                                     for mb, share in hardware.memory_efficiency],
                    "link_latency_us": round(hardware.node.latency * 1e6, 1),
                    "link_gb_s": round(hardware.node.bandwidth / 1e9, 2),
                    "per_modelled_op_us": round(hardware.per_op_s * 1e6, 1),
                    "per_step_ms": round(hardware.per_step_s * 1e3, 2),
                    "vector_traffic": round(hardware.vector_traffic, 2)}
            for shape in shapes:
                todo = [r for r in runs(shape, experts=True) if r[1] == workers]
                if quick:
                    todo = todo[::2] if workers == 2 else todo
                predicted = {name: (step_time.step_seconds(plan, hardware)["total"],
                                    per_device(plan)) for name, _, _, plan in todo}
                for name, _, run, plan in todo:
                    history = run(cluster)
                    measured = step_s(history)
                    held = memory(history)
                    seconds, expected = predicted[name]
                    rows.append({
                        "run": f"{name}, d_model {shape['d_model']}",
                        "step_ms": {"predicted": round(seconds * 1e3, 1),
                                    "measured": round(measured * 1e3, 1)},
                        "step_error": round(seconds / measured - 1, 3),
                        "memory_mb": {kind: {"predicted": round(expected[kind] / 1e6, 2),
                                             "measured": round(value / 1e6, 2)}
                                      for kind, value in held.items()},
                        "memory_errors": {kind: round(expected[kind] / value - 1, 3)
                                          for kind, value in held.items() if value > 1e6}})
    step_errors = [abs(row["step_error"]) for row in rows]
    memory_errors = [abs(e) for row in rows for e in row["memory_errors"].values()]
    results["plan_step_time_mean_rel_error"] = round(statistics.fmean(step_errors), 3)
    results["plan_step_time_max_rel_error"] = round(max(step_errors), 3)
    results["plan_memory_mean_rel_error"] = round(statistics.fmean(memory_errors), 3)
    results["plan_memory_max_rel_error"] = round(max(memory_errors), 3)
    checked = published.check()
    results["plan_published_mean_rel_error"] = round(
        statistics.fmean(abs(r["error"]) for r in checked), 3)
    results["plan_published_max_rel_error"] = round(max(abs(r["error"]) for r in checked), 3)
    results["runs"] = rows
    print(json.dumps(results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    main(parser.parse_args().quick)
