"""How much of a step a run's threads wait for a core, read apart from their CPU time
(``measure.cpu.CpuPerStep``, from schedstat): the same synchronous data-parallel run, every
thread pinned to one core, alone there (the baseline) and beside a busy loop pinned to that
core, interleaved over ``--rounds`` rounds (alone, beside, alone again).

- ``queued_share``: the tasks' run-queue time over the run's wall time, each round's and the
  median, alone and beside the busy loop; the busy loop takes about half the core, so beside
  it the run's threads wait about as long as they run;
- ``accounted_share``: what ran and what waited, together, over the wall time (the rest the
  threads slept: on the network, on each other).

    python benchmarks/waits_for_a_core.py [--rounds 3] [--steps 8] [--smoke]

Prints one JSON line. --smoke: one round of 4 steps; the figures are not meaningful.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


def pinned_run(problem, steps: int, busy_loop: bool):
    """One synchronous data-parallel run (a ps and a worker) on a fresh cluster, every thread
    of its tasks and of this process on one core, a busy loop beside it there or not. Returns
    its ``CpuPerStep`` (steps 2 to the last) and the names of its tasks (the test of
    ``queued_s`` runs it too)."""
    import dtflab
    from dtflab import train
    from dtflab.train.measure.cpu import CpuPerStep

    everywhere = os.sched_getaffinity(0)
    core = {min(everywhere)}
    with dtflab.start_cluster(jobs="ps=1,worker=1", intra_op_threads=1, inter_op_threads=1) as cluster:
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy_loop else None
        try:
            for pid in [t.pid for t in cluster.tasks] + [os.getpid()] + ([hog.pid] if hog else []):
                pin(pid, core)
            cpu = CpuPerStep(cluster, skip=2)
            train.sync_data_parallel(problem, cluster, steps=steps, watchdog=False, callbacks=[cpu])
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
            pin(os.getpid(), everywhere)  # threads started meanwhile inherited the one core
        return cpu, [task.name for task in cluster.tasks]


def shares(cpu) -> dict:
    """What a run's threads waited for a core, and what ran and waited together, over its wall
    time."""
    ran = sum(cpu.per_step.values())
    return {"queued": cpu.queued_s / cpu.wall_s, "accounted": (ran + cpu.queued_s) / cpu.wall_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    if args.smoke:  # CpuPerStep skips 2 steps: 4 leaves two counted
        args.rounds, args.steps = 1, 4

    from dtflab import train

    problem = train.classification(width=512, batch_size=2048)
    seen = {"alone": [], "beside_a_busy_loop": []}
    for _ in range(args.rounds):
        for name in ("alone", "beside_a_busy_loop", "alone"):
            cpu, _ = pinned_run(problem, args.steps, busy_loop=name != "alone")
            seen[name].append(shares(cpu))

    def summed(key: str) -> dict:
        return {name: {"median": round(statistics.median(r[key] for r in runs), 3),
                       "rounds": [round(r[key], 3) for r in runs]} for name, runs in seen.items()}

    print(json.dumps({"benchmark": "waits_for_a_core", "rounds": args.rounds, "steps": args.steps,
                      "cpus": len(os.sched_getaffinity(0)), "queued_share": summed("queued"),
                      "accounted_share": summed("accounted")}))


if __name__ == "__main__":
    main()
