"""Soak the asynchronous loop where it used to stall: many background runs with a live
dashboard in one process, both cores kept busy, after TF2 work in the same process.

    python benchmarks/async_soak.py --runs 30 [--smoke]

Set-up, in order, all in this process:
- two busy loops (subprocesses spinning on the two cores) for the whole soak;
- TF2 first: ``connect()`` to a local cluster with an eager op on a remote task, then a
  ParameterServerStrategy run, as notebooks 00 and 06 do;
- ``--runs`` background ``async_parameter_server`` runs, each with a ``Dashboard``, on local
  clusters replaced every ``--runs-per-cluster`` runs (a kernel late in a notebook).

A run *stalled* if the watchdog saw a step take far longer than usual (``history.stalls``);
*hung* if it had not ended ``--deadline`` seconds after it started (never expected: the
watchdog recovers or gives up well before). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

BUSY = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def tf2_first(dtflab, train, steps: int):
    """What a notebook did before: eager ops on a connected cluster, a ParameterServerStrategy run."""
    import tensorflow as tf

    connected = dtflab.start_cluster(3)
    connected.connect()
    with tf.device("/job:worker/task:1"):
        assert float(tf.reduce_sum(tf.ones([4, 4]))) == 16.0
    strategy_cluster = dtflab.start_cluster(ps=2, workers=2)
    history = train.ps_strategy(train.exp_regression(), strategy_cluster, steps=steps)
    assert history.steps == steps, history.summary()
    return [connected, strategy_cluster]


def soak(args) -> dict:
    import dtflab
    from dtflab import train
    from dtflab.viz.dashboard import Dashboard

    busy = [subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=args.busy_s)])
            for _ in range(2)]
    clusters, outcomes, walls = [], [], []
    try:
        clusters += tf2_first(dtflab, train, 3 if args.smoke else 50)
        problem, cluster = train.exp_regression(), None
        for i in range(args.runs):
            if i % args.runs_per_cluster == 0:
                if cluster is not None:
                    cluster.stop()
                cluster = dtflab.start_cluster(3)
                clusters.append(cluster)
            began = time.perf_counter()
            run = train.async_parameter_server(problem, cluster, steps=args.steps, seed=i,
                                               background=True)
            dashboard = Dashboard(run, interval_s=0.25)
            run.thread.join(args.deadline)
            hung = not run.done
            if hung:
                run.stop(wait=False)
                run.thread.join(30)
            dashboard.close()
            walls.append(time.perf_counter() - began)
            history = run.history
            outcomes.append({"run": i, "hung": hung, "stalls": [str(s) for s in getattr(history, "stalls", [])],
                             "failures": list(history.failures), "steps": history.steps,
                             "error": repr(run.error) if run.error else None})
            print(f"run {i}: {history.summary()}", file=sys.stderr, flush=True)
    finally:
        for cluster in clusters:
            cluster.stop()
        for process in busy:
            process.kill()
            process.wait()
    return {
        "runs": len(outcomes),
        "steps_per_worker": args.steps,
        "busy_loops": len(busy),
        "tf2_before": True,
        "runs_with_a_stall": sum(bool(o["stalls"]) for o in outcomes),
        "stalls": sum(len(o["stalls"]) for o in outcomes),
        "hung": sum(o["hung"] for o in outcomes),
        "runs_with_failures": sum(bool(o["failures"] or o["error"]) for o in outcomes),
        "complete_runs": sum(o["steps"] == 2 * args.steps and not o["hung"] for o in outcomes),
        "median_run_s": round(statistics.median(walls), 2) if walls else None,
        "max_run_s": round(max(walls), 2) if walls else None,
        "stall_lines": [line for o in outcomes for line in o["stalls"]],
        "failure_lines": [line for o in outcomes for line in o["failures"] + [o["error"] or ""] if line],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="background async runs (default 30)")
    parser.add_argument("--steps", type=int, default=300, help="steps per worker in each run")
    parser.add_argument("--runs-per-cluster", type=int, default=5,
                        help="runs on one local cluster before it is replaced by a new one")
    parser.add_argument("--deadline", type=float, default=180.0,
                        help="seconds after which a run that has not ended counts as hung")
    parser.add_argument("--busy-s", type=float, default=3600.0,
                        help="how long the busy loops may spin at most (they end with the soak)")
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.steps, args.runs_per_cluster = 1, 3, 1
    for name in ("runs", "steps", "runs_per_cluster"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    print(json.dumps(soak(args)))


if __name__ == "__main__":
    main()
