"""Training loop overheads and the data-parallel speedup, measured in one run.

- loop_over_handwritten: steps/s of dtflab's loops over the same step written in plain
  TensorFlow (same graph shape, same cluster, same batches); the lowest ratio is reported.
- dashboard_on_over_off: async throughput with a live Dashboard attached over without, in
  steady state (after the first second, for both); the whole-run ratio, which includes
  building the dashboard, is reported beside it.
- sync_dp_speedup_2_workers: the heavy classifier, sync data parallel, 2 workers vs 1, same
  global batch, one intra-op and one inter-op thread per task (so a task uses one core).
- single_vs_sync_max_abs_loss_diff: exp(x), same seed and global batch, 200 steps.
- allreduce_speedup_2_workers: the heavy classifier, train.all_reduce (MultiWorkerMirrored-
  Strategy, ring) with 2 worker programs vs 1, same global batch, one thread each.
- allreduce_over_sync_ps: steps/s of all-reduce over sync data parallel through a ps, heavy
  classifier, 2 workers, one thread per task.
- allreduce_vs_single_max_abs_loss_diff: exp(x), same seed and global batch, 200 steps.
- allreduce_bytes_per_worker_step / sync_ps_bytes_per_ps_step: bytes each sends per step,
  counted at the transport (train.WireBytes), heavy classifier, 2 workers; and the model's.

    python benchmarks/training.py [--quick] [--smoke]

Prints one JSON line. --quick runs fewer steps (under 5 minutes on 2 cores). --smoke: one
repeat, a few steps of each figure on a light classifier (width 64, batch 256), the steady
rate from the first record on (the figures are not meaningful).
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
from dtflab.viz.dashboard import Dashboard  # noqa: E402

tf = import_tf()


def handwritten_sync(problem, cluster, steps, workers=2):
    """The sync tower step written directly in TF, run in a bare loop; returns steps/s."""
    graph = tf.Graph()
    with graph.as_default():
        with tf.device("/job:ps/task:0"):
            params = []
            for i, (a, b) in enumerate(zip(problem.layers, problem.layers[1:])):
                params.append(tf.compat.v1.get_variable(f"w{i}", [a, b]))
                params.append(tf.compat.v1.get_variable(f"b{i}", [b], initializer=tf.zeros_initializer()))
        grads, losses, feeds = [], [], []
        for k in range(workers):
            with tf.device(f"/job:worker/task:{k}"):
                x, t = problem.placeholders()
                h = x
                for i in range(0, len(params), 2):
                    h = tf.matmul(h, params[i]) + params[i + 1]
                    if i + 2 < len(params) or problem.loss_kind == "l2":
                        h = tf.nn.leaky_relu(h, 0.2) if problem.activation == "leaky_relu" else tf.nn.relu(h)
                loss = problem.loss(h, t)
                grads.append(tf.gradients(loss, params))
                losses.append(loss)
                feeds.append((x, t))
        with tf.device("/job:ps/task:0"):
            summed = [tf.add_n(list(g)) for g in zip(*grads)]
            apply = tf.compat.v1.train.AdamOptimizer(problem.learning_rate).apply_gradients(zip(summed, params))
            with tf.control_dependencies([apply]):
                total = tf.add_n(losses)
        init = tf.compat.v1.global_variables_initializer()
    share = problem.batch_size // workers
    batches = [problem.batch(s) for s in range(steps)]
    with tf.compat.v1.Session(cluster.target("ps"), graph=graph) as session:
        session.run(init)
        started = None
        for s, (xs, ts) in enumerate(batches):
            if s == 1:
                started = time.perf_counter()  # the first step sets the graph up
            feed = {}
            for k, (x, t) in enumerate(feeds):
                feed[x], feed[t] = xs[k * share:(k + 1) * share], ts[k * share:(k + 1) * share]
            session.run(total, feed)
        return (steps - 1) / (time.perf_counter() - started)


def loop_rate(history) -> float:
    """Steps/s after the first step (which sets the graph up on every task)."""
    records = history.records
    return (len(records) - 1) / (records[-1].time_s - records[0].time_s)


def worker_rate(history, worker: str = "worker:0") -> float:
    """Steps/s of one worker of an all-reduce run, after its first step."""
    times = [r.time_s for r in history.records if r.worker == worker]
    return (len(times) - 1) / (times[-1] - times[0])


def steady_rate(history, skip_s: float = 1.0) -> float:
    """Examples/s after the first ``skip_s`` seconds (set-up, dashboard construction)."""
    late = [r for r in history.records if r.time_s >= skip_s]
    return sum(r.examples for r in late[1:]) / (late[-1].time_s - late[0].time_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps: under 5 minutes")
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    smoke = args.smoke
    steps = 3 if smoke else 150 if args.quick else 600
    # long enough that the dashboard's set-up is amortised (--smoke: a run that can end
    # within the second its steady rate skips, so it is read from the first record)
    async_steps = 20 if smoke else 500 if args.quick else 1500
    skip_s = 0.0 if smoke else 1.0
    heavy_steps = 4 if smoke else 8 if args.quick else 30
    repeats = 1 if smoke else 3 if args.quick else 5
    checked = 3 if smoke else 200  # steps of the loss comparisons
    toy = train.exp_regression()
    out = {"benchmark": "training", "quick": args.quick}

    with dtflab.start_cluster(jobs="ps=1,worker=2") as cluster:
        ratios = []
        for _ in range(repeats):
            hand = handwritten_sync(toy, cluster, steps)
            ours = loop_rate(train.sync_data_parallel(toy, cluster, steps=steps))
            ratios.append(ours / hand)
        out["loop_over_handwritten"] = round(statistics.median(ratios), 3)
        out["loop_over_handwritten_runs"] = [round(r, 3) for r in ratios]

        on_off, on_off_whole = [], []
        for _ in range(repeats):
            off = train.async_parameter_server(toy, cluster, steps=async_steps)
            run = train.async_parameter_server(toy, cluster, steps=async_steps, background=True)
            dashboard = Dashboard(run)
            on = run.wait()
            dashboard.wait()
            on_off.append(steady_rate(on, skip_s) / steady_rate(off, skip_s))
            on_off_whole.append(on.examples_per_s / off.examples_per_s)
        out["dashboard_on_over_off"] = round(statistics.median(on_off), 3)
        out["dashboard_on_over_off_runs"] = [round(r, 3) for r in on_off]
        out["dashboard_on_over_off_whole_run"] = round(statistics.median(on_off_whole), 3)

        single = train.single(toy, steps=checked, seed=1)
        sync = train.sync_data_parallel(toy, cluster, steps=checked, seed=1)
        out["single_vs_sync_max_abs_loss_diff"] = float(
            np.max(np.abs(np.array(single.losses) - np.array(sync.losses))))
        out["toy_sync_over_single_time"] = round(sync.wall_s / single.wall_s, 2)

    heavy = (train.classification(width=64, batch_size=256) if smoke
             else train.classification(width=1024, batch_size=4096))
    with dtflab.start_cluster(jobs="ps=1,worker=2", intra_op_threads=1, inter_op_threads=1) as cluster:
        one, two = [], []
        for _ in range(repeats):
            one.append(loop_rate(train.sync_data_parallel(heavy, cluster, steps=heavy_steps, workers=1)))
            two.append(loop_rate(train.sync_data_parallel(heavy, cluster, steps=heavy_steps, workers=2)))
        out["sync_dp_speedup_2_workers"] = round(statistics.median(two) / statistics.median(one), 3)
        out["heavy_steps_per_s_1_worker"] = round(statistics.median(one), 2)
        out["heavy_steps_per_s_2_workers"] = round(statistics.median(two), 2)
        ps_wire = train.WireBytes(after_step=1, steps=heavy_steps - 3)
        train.sync_data_parallel(heavy, cluster, steps=heavy_steps, workers=2, callbacks=[ps_wire])
        sync_two = statistics.median(two)

    one, two = [], []
    for _ in range(repeats):
        one.append(worker_rate(train.all_reduce(heavy, workers=1, steps=heavy_steps, threads=1)))
        two.append(worker_rate(train.all_reduce(heavy, workers=2, steps=heavy_steps, threads=1)))
    out["allreduce_speedup_2_workers"] = round(statistics.median(two) / statistics.median(one), 3)
    out["allreduce_over_sync_ps"] = round(statistics.median(two) / sync_two, 3)
    out["allreduce_heavy_steps_per_s_1_worker"] = round(statistics.median(one), 2)
    out["allreduce_heavy_steps_per_s_2_workers"] = round(statistics.median(two), 2)
    wire = train.WireBytes(after_step=1, steps=heavy_steps - 3)
    train.all_reduce(heavy, workers=2, steps=heavy_steps, threads=1, callbacks=[wire])
    out["model_bytes"] = heavy.parameter_bytes
    out["allreduce_bytes_per_worker_step"] = round(statistics.mean(
        wire.per_step.sent[w, o] for w, o in (("worker:0", "worker:1"), ("worker:1", "worker:0"))))
    out["sync_ps_bytes_per_ps_step"] = {
        "sent": round(sum(v for (s, d), v in ps_wire.per_step.sent.items() if s == "ps:0" and d != "other")),
        "received": round(sum(v for (s, d), v in ps_wire.per_step.sent.items() if d == "ps:0" and s != "other"))}
    single = train.single(toy, steps=checked, seed=1)
    reduced = train.all_reduce(toy, workers=2, steps=checked, seed=1)
    out["allreduce_vs_single_max_abs_loss_diff"] = float(max(
        abs(r.loss - single.losses[r.step]) for r in reduced.records))
    out.update(cpus=os.cpu_count(), tensorflow=tf.__version__)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
