"""Time-to-ready of `start 3`: the dask backend (a new LocalCluster, and an existing one) vs local.

"Ready" as in cluster_start.py: every task answers a session run. Interleaved runs, medians.

    python benchmarks/dask_start.py [--runs 3] [--smoke]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from cluster_start import time_backend, wait_until_every_task_answers

import dtflab


def time_existing(client) -> float:
    started = time.perf_counter()
    with dtflab.start_cluster(3, client=client) as cluster:
        wait_until_every_task_answers(cluster.addresses)
        return time.perf_counter() - started


def main() -> None:
    from dask.distributed import Client, LocalCluster

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    if args.smoke:
        args.runs = 1
    local, new, existing = [], [], []
    with LocalCluster(n_workers=3, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=40) as dask_cluster, \
            Client(dask_cluster) as client:
        for _ in range(args.runs):
            local.append(time_backend("local"))
            new.append(time_backend("dask"))
            existing.append(time_existing(client))
    median = statistics.median
    print(json.dumps({
        "benchmark": "dask_start", "runs": args.runs,
        "local_s": round(median(local), 3),
        "dask_new_local_cluster_s": round(median(new), 3),
        "dask_existing_cluster_s": round(median(existing), 3),
        "dask_new_over_local": round(median(new) / median(local), 3),
        "dask_existing_over_local": round(median(existing) / median(local), 3),
        "cpus": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
