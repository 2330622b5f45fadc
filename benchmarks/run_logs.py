"""What writing a run's TensorBoard files costs it: the same run with ``logdir=False`` (the
baseline, in the same process) and with a run directory, interleaved over ``--rounds`` rounds.

Three runs, each the cheapest step of its kind (where a fixed cost per step shows most):

- ``single``: a one-process graph loop of a small classifier (width 64, batch 32), one record a
  step;
- ``sync``: ``train.sync_data_parallel`` on two worker tasks and a ps of a local cluster;
- ``all_reduce``: two worker programs, each reporting every step (three writers: the merged
  step and one a worker).

Each round runs a loop without the files, with them, and without them again (so a drift in the
machine's speed falls on both sides). For each loop: the median step of each run
(``history.median_step_s()``); ``ratio``, the median over rounds of with / the mean of the two
without; ``noise``, the median over rounds of |without again / without - 1|, this machine's floor
for a difference between two identical runs. The issue's bound: a ratio of 1.03 or less.
Where the noise is larger than that bound, ``log_us_per_step`` says what the writing itself
costs: the CPU time a fresh run log takes a step for that run's own records, events written
(its start and end, once a run, left out), and ``log_share`` that over the step without files.

    python benchmarks/run_logs.py [--rounds 5] [--steps 200] [--smoke]

Prints one JSON line. --smoke: one round of 8 steps (all-reduce's 4: the fewest a step is
measured from); the figures are not meaningful.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile


def replayed_us(history, problem, logdir, times: int = 20) -> float:
    """The run log's own work a step, in microseconds of this process's CPU: ``history``'s
    records handed over ``times`` in a row to one fresh RunLog as the runner hands them (the
    steps renumbered), its flusher writing them; the run's start and end are left out."""
    import dataclasses
    import time
    from pathlib import Path

    from dtflab.train.machinery.logdir import RunLog

    records = list(history.records)
    end = records[-1].time_s + records[-1].time_s / len(records)
    again = dataclasses.replace(history, records=[])
    log = RunLog(Path(logdir), problem)
    log.on_run_start(again)
    started = time.process_time()  # the flusher's thread included: it is this process's
    for turn in range(times):
        for record in records:
            record = dataclasses.replace(record, step=record.step + turn * len(records),
                                         time_s=record.time_s + turn * end)
            again.records.append(record)
            log.on_step(again, record)
    log._stop.set()
    log._flusher.join()
    log._flush()  # what the flusher had not written yet
    took = time.process_time() - started
    log.on_run_end(again)
    return took / (times * len(records) / max(history.step_reports, 1)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--loops", default="single,sync,all_reduce",
                        help="which of the three to run, comma-separated")
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    if args.smoke:  # all-reduce runs steps // 2: 4, the fewest median_step_s measures from
        args.rounds, args.steps = 1, 8

    import dtflab
    from dtflab import train

    problem = train.classification(width=64, batch_size=32, features=16)
    found = {}
    with tempfile.TemporaryDirectory(prefix="dtflab-bench-runs-") as logdir, \
            dtflab.start_cluster(workers=2) as cluster:
        loops = {
            "single": lambda **o: train.single(problem, steps=args.steps, **o),
            "sync": lambda **o: train.sync_data_parallel(problem, cluster, workers=2,
                                                         steps=args.steps, **o),
            "all_reduce": lambda **o: train.all_reduce(problem, workers=2,
                                                       steps=args.steps // 2, **o),
        }
        for name, run in loops.items():
            if name not in args.loops.split(","):
                continue
            run(logdir=False)  # warm: graphs built once, programs' imports cached
            rounds = []
            for _ in range(args.rounds):
                without = run(logdir=False).median_step_s()
                written = run(logdir=logdir)
                again = run(logdir=False).median_step_s()
                assert written.logdir, "no run directory was written"
                rounds.append({"without_ms": without * 1e3, "again_ms": again * 1e3,
                               "with_ms": written.median_step_s() * 1e3,
                               "ratio": 2 * written.median_step_s() / (without + again),
                               "noise": abs(again / without - 1)})
            found[name] = {"rounds": rounds, **{
                key: statistics.median(r[key] for r in rounds)
                for key in ("without_ms", "with_ms", "ratio", "noise")}}
            found[name]["log_us_per_step"] = replayed_us(written, problem, logdir)
            found[name]["log_share"] = (found[name]["log_us_per_step"] / 1e3
                                        / found[name]["without_ms"])
    print(json.dumps({"steps": args.steps, "rounds": args.rounds, "loops": found}))


if __name__ == "__main__":
    main()
