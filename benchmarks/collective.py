"""What one all-reduce costs on CPU: TensorFlow's ring (MultiWorkerMirroredStrategy, RING over
gRPC) between two worker programs on this machine, one thread each, the way ``train.all_reduce``
sums its gradients.

For each size (MB of float32 gradients): the median time of one all-reduce and the CPU time
each worker process spends on it (user + system, from ``os.times``, over ``--repeat`` calls),
against the baseline in the same run: one ``memcpy`` of the same bytes (numpy, this process).
On 2 cores that CPU comes out of the cores the workers compute on, so it adds to every step of
``train.all_reduce`` at 2 workers whether or not it overlaps the backward pass.

    python benchmarks/collective.py [--sizes 1,4.4,16] [--repeat 40] [--smoke]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def worker(sizes: list[float], repeat: int) -> None:
    """One worker program: all-reduce ``sizes`` MB, ``repeat`` times each; a JSON line each."""
    import tensorflow as tf

    from dtflab.tf_private import patient_coordination

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    patient_coordination(resolver.cluster_spec(), 120.0)
    ring = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(resolver, communication_options=ring)
    for size in sizes:
        with strategy.scope():  # four gradients, as a layer's weights and biases would be
            tensors = [tf.Variable(tf.ones([int(size * 1e6) // 16])) for _ in range(4)]

        @tf.function
        def all_reduce():
            def replica():
                context = tf.distribute.get_replica_context()
                return context.all_reduce("sum", [t.read_value() for t in tensors])
            return strategy.run(replica)

        all_reduce()[0].numpy()  # traced, and the collective set up
        times, cpu = [], os.times()
        for _ in range(repeat):
            started = time.perf_counter()
            all_reduce()[0].numpy()
            times.append(time.perf_counter() - started)
        used = os.times()
        print("RESULT " + json.dumps({
            "task": resolver.task_id, "mb": size, "median_ms": statistics.median(times) * 1e3,
            "cpu_ms": (used.user + used.system - cpu.user - cpu.system) / repeat * 1e3,
            "system_ms": (used.system - cpu.system) / repeat * 1e3}), flush=True)


def memcpy_ms(size: float, repeat: int) -> float:
    import numpy as np

    source = np.ones(int(size * 1e6) // 4, np.float32)
    target = np.empty_like(source)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        np.copyto(target, source)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4.4,16", help="MB per all-reduce, comma-separated")
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.repeat = "1", 3
    sizes = [float(s) for s in args.sizes.split(",")]
    if args.worker:
        worker(sizes, args.repeat)
        return
    import dtflab

    with dtflab.run(os.path.abspath(__file__), "--worker", f"--sizes={args.sizes}",
                    f"--repeat={args.repeat}", workers=2) as cluster:
        cluster.wait(timeout=600)
        found = [json.loads(line[len("RESULT "):]) for name in ("worker:0", "worker:1")
                 for line in cluster.logs(name).splitlines() if line.startswith("RESULT ")]
    result = {"benchmark": "collective", "cores": os.cpu_count(), "workers": 2,
              "repeat": args.repeat, "sizes_mb": {}}
    for size in sizes:
        rows = [row for row in found if row["mb"] == size]
        copy = memcpy_ms(size, args.repeat)
        cpu = statistics.mean(row["cpu_ms"] for row in rows)
        result["sizes_mb"][str(size)] = {
            "all_reduce_ms": round(statistics.mean(row["median_ms"] for row in rows), 2),
            "cpu_ms_per_worker": round(cpu, 2),
            "system_ms_per_worker": round(statistics.mean(row["system_ms"] for row in rows), 2),
            "memcpy_ms": round(copy, 3),
            "cpu_over_memcpy": round(cpu / copy, 1),
            "cpu_ms_per_mb": round(cpu / size, 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
