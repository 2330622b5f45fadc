"""Pipeline parallelism measured: the bubble, a cost model's predictions, GPipe against 1F1B;
tensor parallelism's and sharded data parallelism's bytes and losses.

Two stages of the classifier with three hidden layers (two layers a stage, width 1024, batch
2048), one intra-op thread per stage task, for m = 1, 2, 4, 8, 16 micro-batches:

- pipeline_idle_share / pipeline_idle_share_formula: each stage's idle share of the pipelined
  part of a traced step (mean over stages, median over rounds), and (p - 1) / (m + p - 1).
- pipeline_step_ms: median step time (untraced steps), per m.
- pipeline_stage_arithmetic_ms: ``train.stage_arithmetic_s``, the busiest stage's arithmetic
  for the whole batch at each m, measured alone on the stage's task (a smaller micro-batch
  does not multiply at the same rate per row on every CPU).
- pipeline_step_model_ms, pipeline_step_model_max_rel_error: ``costs.pipeline_step_s`` with the
  stage's arithmetic, the per-micro-batch cost, the overlap (weight gradients the stage before
  does not wait for) and the rest read from the traced steps (``train.StepModel.median_of``:
  one traced step per run, every m and round, each part their median, each stage time scaled
  to m = 4 by the measured ``pipeline_stage_arithmetic_ms``), the arithmetic scaled to each m
  the same way (nothing fitted to any step time), against the measured steps; the worst m.
  ``pipeline_step_model_m4_traces_max_rel_error``: the parts from the m = 4 traces alone;
  ``pipeline_step_model_one_trace_max_rel_error``: from each m = 4 trace alone, one figure a
  round (one step is one sample: on a shared machine it can run 20-40% slow).
  ``pipeline_step_model_equal_shares_*``: the arithmetic assumed to split into m equal shares
  (the model before issue 33); ``pipeline_step_model_no_overlap_*``: equal shares and no
  overlap term.
- pipeline_best_m / pipeline_model_best_m: the fastest m measured, and the model's.
- pipeline_best_speedup_over_m1: steps/s at the best m over m = 1.
- naive_best_speedup_over_m1: the same for the naive graph (one ``tf.gradients`` of the summed
  loss, one inter-op thread a task, no schedule), built here, in the same run.
- pipeline_peak_activation_bytes / pipeline_1f1b_over_gpipe_peak_activation_bytes: stage 0's
  peak activation bytes from the allocator records of a traced step, GPipe and 1F1B, m = 2,
  4, 8; the ratio at m = 8.
- pipeline_vs_single_max_abs_loss_diff: exp(x) (200 steps) and the classifier (30 steps),
  pipelined (GPipe and 1F1B) against train.single, same seed and batches.
- tensor_parallel_bytes_over_formula: bytes each worker sent the other per step, counted at the
  transport (train.WireBytes, steps 2-10), over ``costs.tensor_parallel_bytes``, for
  ``train.tensor_parallel`` with 2 ways on classification(width=256, hidden_layers=3), batch
  128 and 512.
- tensor_parallel_vs_single_max_abs_loss_diff: exp(x) (200 steps) and the classifier (30
  steps), 2 ways, against train.single, same seed and batches.
- sharded_state_bytes_per_worker_over_all_reduce: parameter and slot bytes (Adam's m and v) each
  worker of ``train.sharded_data_parallel`` holds, over a plain ``train.all_reduce``'s, as the
  workers report them, 2 workers, classification(width=256), in the same call
  (``costs.sharded_state_bytes``: 1/2); ``sharded_pss_bytes`` / ``all_reduce_pss_bytes``: each
  worker process's proportional set size then (TensorFlow's library dominates it).
- sharded_bytes_per_step_over_all_reduce: bytes each worker sent the other per step, counted at
  the transport (train.WireBytes, steps 2-10), sharded over all-reduce (``costs``: 1.5);
  ``sharded_bytes_over_formula``: over ``costs.sharded_bytes``.
- sharded_vs_single_max_abs_loss_diff: exp(x) (200 steps) and the classifier (30 steps), 2
  workers, against train.single, same seed and batches.

    python benchmarks/model_parallel.py [--quick] [--rounds 5] [--smoke]

Prints one JSON line. --quick uses width 512 and batch 1024 (under 3 minutes on 2 cores);
--smoke, width 64, batch 64, one round and a few steps of each figure (the figures are not
meaningful).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import dtflab  # noqa: E402
from dtflab import train  # noqa: E402
from dtflab._quiet import import_tf  # noqa: E402
from dtflab.train.formulas import costs, schedules  # noqa: E402

MICRO_BATCHES = (1, 2, 4, 8, 16)
MODEL_FROM = 4  # the m the cost model's stage time is scaled to


def step_times(history, skip: int = 3) -> list[float]:
    """Seconds between consecutive records, past the first ``skip`` (start-up, the trace)."""
    times = [r.time_s for r in history.records]
    return list(np.diff(times)[skip:])


def pipelined(problem, cluster, rounds, steps):
    """Per m: untraced step times (all rounds) and the bubbles of the traced steps."""
    times = {m: [] for m in MICRO_BATCHES}
    bubbles = {m: [] for m in MICRO_BATCHES}
    for _ in range(rounds):
        for m in MICRO_BATCHES:  # interleaved: drift in the machine's load hits every m alike
            history = train.pipeline(problem, cluster, stages=2, micro_batches=m, steps=steps,
                                     trace_step=1, watchdog=False, schedule="gpipe")
            times[m] += step_times(history)
            bubbles[m].append(history.bubble)
    return times, bubbles


def naive_step_times(problem, cluster, m, steps) -> list[float]:
    """The naive pipeline: per-stage ``tf.device``, micro-batches, one ``tf.gradients`` of the
    summed loss; TensorFlow's executor overlaps the stages by itself."""
    tf = import_tf()
    devices = ["/job:worker/task:0", "/job:worker/task:1"]
    initial = problem.initial_values(0)
    half = len(initial) // 2
    graph = tf.Graph()
    with graph.as_default():
        stage_vars = []
        for device, values in zip(devices, (initial[:half], initial[half:])):
            with tf.device(device):
                stage_vars.append([tf.compat.v1.get_variable(n, initializer=v) for n, v in values])
        x, t = problem.placeholders()
        losses = []
        for xs, ts in zip(tf.split(x, m), tf.split(t, m)):
            h = xs
            for s, device in enumerate(devices):
                with tf.device(device):
                    h = problem.forward(stage_vars[s], h, first_layer=1 + s * half // 2)
            with tf.device(devices[-1]):
                losses.append(problem.loss(h, ts))
        loss = tf.add_n(losses)
        variables = stage_vars[0] + stage_vars[1]
        grads = tf.compat.v1.gradients(loss, variables, colocate_gradients_with_ops=True)
        train_op = problem.optimizer().apply_gradients(list(zip(grads, variables)))
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(cluster.target("worker", 0), graph=graph) as session:
        session.run(init)
        ends = []
        for step in range(steps):
            xs, ts = problem.batch(step)
            session.run(train_op, {x: xs, t: ts})
            ends.append(time.perf_counter())
    return list(np.diff(ends)[2:])


def model_predictions(model, arithmetic=None) -> tuple[dict, dict]:
    """A ``train.StepModel``'s step(m) for every m, and its parts."""
    parts = {"stage_ms": model.stage_s * 1e3, "per_micro_batch_ms": model.per_micro_batch_s * 1e3,
             "overlap_ms": model.overlap_s * 1e3, "rest_ms": model.rest_s * 1e3}
    return {m: model.predicted_step_s(m, arithmetic) * 1e3 for m in MICRO_BATCHES}, parts


def loss_checks(smoke: bool, **classifier) -> tuple:
    """The problems each split's losses are checked on against one process, with their steps:
    exp(x) (200 steps) and a small classifier (30), 3 steps each with --smoke."""
    return ((train.exp_regression(), 3 if smoke else 200),
            (train.classification(width=64, batch_size=256, **classifier), 3 if smoke else 30))


def loss_agreement(cluster, smoke: bool = False) -> float:
    worst = 0.0
    for problem, steps in loss_checks(smoke, hidden_layers=3):
        alone = train.single(problem, steps=steps, seed=1)
        for schedule in ("gpipe", "1f1b"):
            piped = train.pipeline(problem, cluster, stages=2, micro_batches=4, schedule=schedule,
                                   steps=steps, seed=1)
            worst = max(worst, float(np.max(np.abs(np.array(alone.losses) - np.array(piped.losses)))))
    return worst


def tensor_parallel_figures(cluster, smoke: bool = False) -> dict:
    """Tensor parallelism, 2 ways: bytes at the transport over the formula, and the losses
    against one process (both from this one call, on ``cluster``'s first two workers)."""
    ratios = {}
    for batch in (128, 512):
        problem = train.classification(width=256, batch_size=batch, hidden_layers=3)
        wire = train.WireBytes(after_step=2, steps=1 if smoke else 8)
        train.tensor_parallel(problem, cluster, ways=2, steps=4 if smoke else 12, callbacks=[wire],
                              watchdog=False)
        formula = costs.tensor_parallel_bytes(2, batch, problem.layers)
        ratios[batch] = {source: round(wire.per_step.sent[source, destination]
                                       / sum(formula[worker].values()), 4)
                         for worker, (source, destination) in enumerate(
                             (("worker:0", "worker:1"), ("worker:1", "worker:0")))}
    worst = 0.0
    for problem, steps in loss_checks(smoke, hidden_layers=3):
        alone = train.single(problem, steps=steps, seed=1)
        split = train.tensor_parallel(problem, cluster, ways=2, steps=steps, seed=1)
        worst = max(worst, float(np.max(np.abs(np.array(alone.losses) - np.array(split.losses)))))
    return {"tensor_parallel_bytes_over_formula": ratios,
            "tensor_parallel_vs_single_max_abs_loss_diff": worst}


def sharded_figures(smoke: bool = False) -> dict:
    """ZeRO-3 / FSDP against a plain all-reduce in the same call, 2 workers each: the state each
    worker holds, the bytes each sends per step, and the losses against one process."""
    problem = train.classification(width=256, batch_size=256)
    runs = {}
    for loop in (train.all_reduce, train.sharded_data_parallel):
        wire = train.WireBytes(after_step=2, steps=1 if smoke else 8)
        runs[loop] = (loop(problem, workers=2, steps=4 if smoke else 12, callbacks=[wire],
                           watchdog=False), wire)
    (plain, plain_wire), (sharded, sharded_wire) = runs.values()
    pairs = (("worker:0", "worker:1"), ("worker:1", "worker:0"))
    worst = 0.0
    for checked, steps in loss_checks(smoke):
        alone = train.single(checked, steps=steps, seed=1)
        history = train.sharded_data_parallel(checked, workers=2, steps=steps, seed=1, watchdog=False)
        for worker in history.workers:
            losses = np.array([r.loss for r in history.records if r.worker == worker])
            worst = max(worst, float(np.max(np.abs(losses - np.array(alone.losses)))))

    def state(history):
        return max(sum(held.values()) for held in history.details["state_bytes"].values())

    def pss(history):
        return {worker: held["pss"] for worker, held in history.details["memory"].items()}

    return {
        "sharded_state_bytes_per_worker_over_all_reduce": round(state(sharded) / state(plain), 4),
        "sharded_state_bytes_formula_over_all_reduce": round(
            costs.sharded_state_bytes(problem.parameter_bytes, 2) / (3 * problem.parameter_bytes), 4),
        "sharded_pss_bytes": pss(sharded), "all_reduce_pss_bytes": pss(plain),
        "sharded_bytes_per_step_over_all_reduce": {
            source: round(sharded_wire.per_step.sent[source, destination]
                          / plain_wire.per_step.sent[source, destination], 4)
            for source, destination in pairs},
        "sharded_bytes_over_formula": {
            source: round(sharded_wire.per_step.sent[source, destination]
                          / costs.sharded_bytes(problem.parameter_bytes, 2), 4)
            for source, destination in pairs},
        "sharded_vs_single_max_abs_loss_diff": worst,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="width 512, batch 1024")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians)")
    parser.add_argument("--steps", type=int, default=12, help="steps per run")
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    if args.smoke:  # 5 steps: the fewest step_times reads a step time from
        args.rounds, args.steps = 1, 5
    width, batch = (64, 64) if args.smoke else (512, 1024) if args.quick else (1024, 2048)
    problem = train.classification(width=width, batch_size=batch, hidden_layers=3)
    result = {"stages": 2, "width": width, "batch": batch, "cores": os.cpu_count(),
              "rounds": args.rounds}
    with dtflab.start_cluster(workers=2, inter_op_threads=1, intra_op_threads=1) as cluster:
        naive = {m: [] for m in (1, 4, 8, 16)}
        for _ in range(args.rounds):
            for m in naive:
                naive[m] += naive_step_times(problem, cluster, m, args.steps)
    with dtflab.start_cluster(workers=2, inter_op_threads=2, intra_op_threads=1) as cluster:
        arithmetic = train.stage_arithmetic_s(problem, cluster, stages=2, micro_batches=MICRO_BATCHES,
                                              repeats=1 if args.smoke else 5)
        times, bubbles = pipelined(problem, cluster, args.rounds, args.steps)
        peaks = {}
        for schedule in ("gpipe", "1f1b"):
            for m in (2, 4, 8):
                history = train.pipeline(problem, cluster, stages=2, micro_batches=m,
                                         schedule=schedule, steps=3, trace_step=1, watchdog=False)
                peaks.setdefault(schedule, {})[m] = history.bubble.peak_activation_bytes[0]
        result["pipeline_vs_single_max_abs_loss_diff"] = loss_agreement(cluster, args.smoke)
        result.update(tensor_parallel_figures(cluster, args.smoke))
    result.update(sharded_figures(args.smoke))
    step_ms = {m: statistics.median(times[m]) * 1e3 for m in MICRO_BATCHES}
    every = bubbles[MODEL_FROM] + [b for m in MICRO_BATCHES if m != MODEL_FROM for b in bubbles[m]]
    model = train.StepModel.median_of(every, arithmetic)
    predicted, parts = model_predictions(model, arithmetic)
    m4_traces = train.StepModel.median_of(bubbles[MODEL_FROM])
    from_m4, _ = model_predictions(m4_traces, arithmetic)
    equal_shares, _ = model_predictions(m4_traces)

    def worst(predicted_ms):
        return round(max(abs(predicted_ms[m] - step_ms[m]) / step_ms[m] for m in MICRO_BATCHES), 3)
    best = min(step_ms, key=step_ms.get)
    naive_ms = {m: statistics.median(v) * 1e3 for m, v in naive.items()}
    result.update({
        "pipeline_idle_share": {m: round(statistics.median(b.mean_idle_share for b in bubbles[m]), 3)
                                for m in MICRO_BATCHES},
        "pipeline_idle_share_formula": {m: round(schedules.bubble_share(2, m), 3) for m in MICRO_BATCHES},
        "pipeline_step_ms": {m: round(v, 1) for m, v in step_ms.items()},
        "pipeline_stage_arithmetic_ms": {m: round(v * 1e3, 1) for m, v in arithmetic.items()},
        "pipeline_step_model_ms": {m: round(v, 1) for m, v in predicted.items()},
        "pipeline_step_model_parts_ms": {k: round(v, 2) for k, v in parts.items()},
        "pipeline_step_model_no_overlap_max_rel_error": round(max(
            abs(costs.pipeline_step_s(2, m, model.stage_s, model.per_micro_batch_s, model.rest_s) * 1e3
                - step_ms[m]) / step_ms[m] for m in MICRO_BATCHES), 3),
        "pipeline_step_model_traced_steps": model.steps,
        "pipeline_step_model_max_rel_error": worst(predicted),
        "pipeline_step_model_m4_traces_max_rel_error": worst(from_m4),
        "pipeline_step_model_one_trace_max_rel_error": [
            worst(model_predictions(train.StepModel.median_of([b]), arithmetic)[0])
            for b in bubbles[MODEL_FROM]],
        "pipeline_step_model_equal_shares_ms": {m: round(v, 1) for m, v in equal_shares.items()},
        "pipeline_step_model_equal_shares_max_rel_error": worst(equal_shares),
        "pipeline_best_m": best,
        "pipeline_model_best_m": min(predicted, key=predicted.get),
        "pipeline_equal_shares_best_m": min(equal_shares, key=equal_shares.get),
        "pipeline_best_speedup_over_m1": round(step_ms[1] / step_ms[best], 3),
        "naive_step_ms": {m: round(v, 1) for m, v in naive_ms.items()},
        "naive_best_speedup_over_m1": round(naive_ms[1] / min(naive_ms.values()), 3),
        "pipeline_best_over_naive_best_steps_per_s": round(min(naive_ms.values()) / step_ms[best], 3),
        "pipeline_peak_activation_bytes": peaks,
        "pipeline_1f1b_over_gpipe_peak_activation_bytes": round(peaks["1f1b"][8] / peaks["gpipe"][8], 3),
    })
    print(json.dumps(result))


if __name__ == "__main__":
    main()
