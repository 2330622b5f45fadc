"""Cost of tracing a step and drawing it, for the 3-layer model and a generated 1,000+ op graph.

For each graph: an untraced step (baseline), ``dtflab.trace`` of one step (run + parse),
building the three views, writing standalone HTML, and untraced steps again after tracing
(tracing is opt-in per step: the ratio should be ~1). Medians; one JSON line.

    python benchmarks/trace.py [--repeat 5] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dtflab  # noqa: E402
from dtflab._quiet import import_tf  # noqa: E402
from dtflab.train.examples import deep_chain, exp_regression  # noqa: E402

tf = import_tf()


def seconds(fn, repeat):
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(cluster, built, repeat):
    with tf.compat.v1.Session(cluster.target("master"), graph=built.graph) as session:
        session.run(built.init)
        session.run(built.train, built.feed)  # first run: graph set-up on every task
        untraced_before = seconds(lambda: session.run(built.train, built.feed), 4 * repeat)
        step = dtflab.trace(session, built.train, built.feed)
        traced = seconds(lambda: dtflab.trace(session, built.train, built.feed), repeat)
        views = seconds(step.figure, repeat)
        with tempfile.TemporaryDirectory() as folder:
            html = seconds(lambda: step.save_html(os.path.join(folder, "step.html")), repeat)
        untraced_after = seconds(lambda: session.run(built.train, built.feed), 4 * repeat)
    return {
        "ops": len(step.ops()), "transfers": len(step.transfers),
        "untraced_step_s": round(untraced_before, 4),
        "trace_s": round(traced, 4),
        "trace_over_untraced": round(traced / untraced_before, 2),
        "views_s": round(views, 3), "html_s": round(html, 3),
        "untraced_after_over_before": round(untraced_after / untraced_before, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    if args.smoke:
        args.repeat = 1
    cluster = dtflab.start_cluster(jobs="master=1,ps=2,worker=2", backend="inprocess")
    devices = ["/job:worker/task:0", "/job:worker/task:1", "/job:ps/task:0"]
    print(json.dumps({
        "benchmark": "trace",
        "three_layer_model_parallel": measure(cluster, exp_regression(), args.repeat),
        "generated_graph": measure(cluster, deep_chain(devices, layers=120), args.repeat),
        "cpus": os.cpu_count(), "tensorflow": tf.__version__,
    }))


if __name__ == "__main__":
    main()
