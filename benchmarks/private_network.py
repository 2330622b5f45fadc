"""What the private network costs: a local cluster with network="private" vs network="host".

Measures, for each network, interleaved so machine noise hits both alike:
- start: seconds until a 3-task cluster is ready (``start_cluster`` returning);
- round trip: one small ``session.run`` from this process to worker:0 (ms, median of 200);
- fetch: one 16 MiB tensor from worker:0 to this process (MB/s, median of 10);
- step: one step of a graph where worker:0 reads a 4 MiB variable on ps:0 (ms, median of 50;
  task-to-task traffic stays on the namespace's loopback, so this shows what tasks pay).

    python benchmarks/private_network.py [--rounds 3] [--smoke]

Prints one JSON line: medians per network and private/host ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dtflab  # noqa: E402
from dtflab._quiet import import_tf  # noqa: E402

tf = import_tf()
MIB = 1 << 20
REPEATS = {"round_trip": 200, "fetch": 10, "step": 50}


def timed(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def measure(network: str, repeats: dict[str, int]) -> dict[str, float]:
    start = time.perf_counter()
    cluster = dtflab.start_cluster(3, network=network)
    started = time.perf_counter() - start
    try:
        with tf.Graph().as_default():
            with tf.device("/job:worker/task:0"):
                small = tf.constant(1.0) + 1.0
                big = tf.random.uniform([16 * MIB // 4])
            with tf.device("/job:ps/task:0"):
                weights = tf.compat.v1.Variable(tf.ones([MIB]))  # 4 MiB
            with tf.device("/job:worker/task:0"):
                step = tf.reduce_sum(weights * 2.0)
            with tf.compat.v1.Session(cluster.target("worker", 0)) as session:
                session.run(weights.initializer)
                session.run([small, big, step])  # warm up
                round_trip = timed(lambda: session.run(small), repeats["round_trip"])
                fetch = timed(lambda: session.run(big), repeats["fetch"])
                steps = timed(lambda: session.run(step), repeats["step"])
    finally:
        cluster.stop()
    return {"start_s": started, "round_trip_ms": 1e3 * statistics.median(round_trip),
            "fetch_MBps": 16 / statistics.median(fetch), "step_ms": 1e3 * statistics.median(steps),
            "exposed": len(cluster.exposed)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    repeats = REPEATS
    if args.smoke:
        args.rounds, repeats = 1, {"round_trip": 3, "fetch": 1, "step": 3}
    runs = {"private": [], "host": []}
    for _ in range(args.rounds):
        for network in runs:
            runs[network].append(measure(network, repeats))
    medians = {network: {key: round(statistics.median(r[key] for r in results), 3)
                         for key in results[0] if key != "exposed"}
               for network, results in runs.items()}
    ratios = {key: round(medians["private"][key] / medians["host"][key], 3)
              for key in medians["private"]}
    print(json.dumps({"benchmark": "private_network", "rounds": args.rounds, "median": medians,
                      "private_over_host": ratios}))


if __name__ == "__main__":
    main()
