"""The input pipeline as a distributed system, measured: how much of a run waits for its input
with and without the tf.data service, examples a second per data worker count against the
prediction, and elements lost or repeated per processing mode after a data worker is killed.

One local cluster: one worker task, a dispatcher and ``--data-workers`` data workers (a second,
with ``fixed_data_workers=True``, for static ``DATA`` sharding). The loop is ``train.single`` on
worker:0 of a classifier (width 256, batch 128); each example costs ``--work-ms`` of processor
time to make (``train.input_pipeline``, calibrated and measured here).

- input_wait_share: the share of the run spent waiting for batches, read in the notebook
  process ("here") and from every data worker ("service"), and fed ready batches ("ready",
  the baseline in the same run); the medians of ``--rounds`` interleaved rounds;
- scaling: ``train.input_scaling``'s rows (data workers, predicted and measured examples/s,
  the wait's share) and their errors, each round's, and the medians; the element's measured
  cost here and on a data worker;
- visits: per mode, a whole epoch read by two readers, then with data_worker:1 killed after
  30% of it and restarted 0.5 s later: elements lost and elements received more than once
  (``parallel_epochs`` receives each element once per data worker: its repeats are counted
  beyond that).

    python benchmarks/data_service.py [--data-workers 2] [--work-ms 1.0] [--rounds 3] [--smoke]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def visit_counts(cluster, mode: str, elements: int) -> dict:
    from dtflab import train

    whole = train.visits(cluster, mode=mode, elements=elements)
    faulted = train.visits(cluster, mode=mode, elements=elements, kill="data_worker:1")
    return {"whole_epoch": {"times_seen": visits_seen(whole), "lost": whole.lost,
                            "repeated": whole.repeated},
            "worker_killed": {"times_seen": visits_seen(faulted), "lost": faulted.lost,
                              "repeated": faulted.repeated, "killed_after": faulted.killed_after,
                              "waiting": faulted.waiting, "seconds": round(faulted.seconds, 2)}}


def visits_seen(visits) -> dict:
    return {str(times): n for times, n in visits.times_seen.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-workers", type=int, default=2)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--elements", type=int, default=600)
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    args = parser.parse_args()
    if args.smoke:  # 9 steps: the fewest train.input_scaling measures a rate from
        args.rounds, args.steps, args.elements = 1, 9, 100

    import dtflab
    from dtflab import train

    problem = train.classification(width=256, batch_size=128)
    started = time.perf_counter()
    waits = {"ready": [], "here": [], "service": []}
    rounds = []
    with dtflab.start_cluster(1, data_workers=args.data_workers) as cluster:
        worker = dict(cluster=cluster, device="/job:worker/task:0", steps=args.steps,
                      watchdog=None)
        here = train.input_pipeline(problem, work_ms=args.work_ms)
        for _ in range(args.rounds):
            for name, inputs in (("ready", None), ("here", here),
                                 ("service", here.served_by(cluster))):
                waits[name].append(train.single(problem, inputs=inputs, **worker)
                                   .input_wait_share())
            curve = train.input_scaling(here, cluster, steps=args.steps)
            rounds.append({"rows": [[w, round(p, 1), round(m, 1), round(s or 0, 3)]
                                    for w, p, m, s in curve.rows],
                           "errors": [round(e, 3) for e in curve.errors()],
                           "work_ms_here": round(curve.work_s * 1e3, 3),
                           "work_ms_on_a_data_worker": round(curve.served_work_s * 1e3, 3),
                           "ms_serving_an_element": round(curve.served_total_s * 1e3, 3),
                           "compute_examples_per_s": round(curve.compute_rate, 1)})
        visits = {mode: visit_counts(cluster, mode, args.elements)
                  for mode in ("distributed_epoch", "parallel_epochs")}
    with dtflab.start_cluster(1, data_workers=args.data_workers,
                              fixed_data_workers=True) as static:
        visits["DATA"] = visit_counts(static, "DATA", args.elements)

    counts = sorted({row[0] for r in rounds for row in r["rows"]})
    medians = {}
    for workers in counts:
        predicted = statistics.median(row[1] for r in rounds for row in r["rows"] if row[0] == workers)
        measured = statistics.median(row[2] for r in rounds for row in r["rows"] if row[0] == workers)
        medians[str(workers)] = {"predicted": round(predicted, 1), "measured": round(measured, 1),
                                 "error": round((measured - predicted) / measured, 3)}
    print(json.dumps({
        "cpus": dtflab.cpus(), "data_workers": args.data_workers, "work_ms": args.work_ms,
        "input_wait_share": {name: round(statistics.median(values), 3)
                             for name, values in waits.items()},
        "input_wait_share_rounds": {name: [round(v, 3) for v in values]
                                    for name, values in waits.items()},
        "scaling_medians": medians,
        "scaling_max_abs_error": max(abs(m["error"]) for m in medians.values()),
        "scaling_rounds": rounds,
        "visits": visits,
        "seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
