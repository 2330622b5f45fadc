"""The planner checked against this machine: calibrate the cluster (``hardware="here"``),
predict each run's step time and memory per device from the calibration alone, then run it.

Every run is ``train.run_layout`` of the transformer (small sizes: two shapes) on the layout
named, 25 steps, step 24 traced; each run's step is predicted before its first step (a graph
loop: its own graph simulated on the calibration; ZeRO: each worker's own step function, traced
and simulated; all-reduce: a copy of the graph a worker and its pack) and measured as the
median of its 20 counted steps, 3 to 22 (the slowest worker's, for the worker programs). Runs
go in interleaved rounds (``--rounds``, 5 unless told), each round after a calibration of its
own (the machine moves between rounds, and a calibration is a moment of it: each of a round's
figures is the median of ``--tries`` calibrations, ``train.calibrate(cluster, tries=3)``); a
round runs every form twice, A-B-B-A (the forms in order, then in reverse), and pairs the
round's prediction with the mean of its two runs. A form's error is the median over rounds of
(predicted / measured - 1), paired within the round; its memory by kind the fullest device's in
the traced step (``train.step_memory``; the worker programs report their variables: parameters
and Adam's state). A round whose runs waited for a core past ``plan_queued_share_limit`` of
their step (the kernel's run-queue time of each task's op thread, ``CpuPerStep.queued_s``) is
flagged, counted in ``plan_rounds_flagged`` and left out (unless every round is).

- plan_step_time_mean_rel_error, plan_step_time_max_rel_error: |a form's error| over the
  forms, and the worst;
- plan_noise_expected_mean, plan_noise_expected_max: what a perfect prediction would score
  against these measurements, from each round's two runs (half their difference over their
  mean stands for the mean's own deviation; the median over rounds, as a form's error): the
  floor under the two figures above, in this run;
- plan_replay_max_rel_error: the structure apart from the costs: each graph loop's traced step
  replayed by the executor's simulation on its own op and transfer durations
  (``Prediction.replayed``, ``executor.replay``), against that step's wall time; the worst
  form's median over its runs (each run's in ``runs``' ``replay_error``). None where no form
  is a graph loop (the worker programs' steps are read from profiles, not replayed yet);
- plan_step_time_noise: the median over forms of one form's spread between rounds ((max -
  min) / median): what the machine's own noise is, beside the errors;
- plan_step_time_calibration_spread: the same of one form's predictions between rounds: how
  far a calibration, a moment of the machine, moves the prediction of the same graph;
- plan_memory_max_rel_error: the same for memory by kind (each kind above 1 MB), the worst,
  and plan_memory_mean_rel_error, over every run whose memory is set before it runs;
- plan_memory_routed_experts_max_rel_error: the same for expert parallelism not padded to
  capacity, signed: what its experts hold follows the routing the router learns in the run,
  which the prediction reads as the first step counted routes (``Plan.routing``), and the
  traced step routes otherwise (the padded run is in the figures above);
- plan_published_max_rel_error (and _mean_, _median_error signed): the nine published A100
  runs of Korthikanti et al. (``planner.published``) on the A100 preset; the same with
  ``narayanan_`` (Narayanan et al. 2021's Table 1, A100), ``llama3_`` (Dubey et al. 2024's
  Table 4, H100) and ``mpt_`` (llm-foundry's H100 table) in the name;
- plan_step_time_run_to_run_mean_rel_error, plan_step_time_run_to_run_max_rel_error (with
  ``--against`` an earlier run's JSON): |this run's measured / that run's measured - 1| over the
  runs both have, and the worst: what a prediction that is the other run itself misses this
  one by, the floor under the errors above on this machine;
- calibration_s: how long each round's ``calibrate`` took (with the worker programs' costs);
  calibrations: what each measured;
- runs: each run's predicted and measured step (ms; each round's, and its two runs), its
  errors round by round, each round's share waited for a core, memory by kind (MB), and
  where the predicted and traced timelines part most (``Prediction.differences``).

    python benchmarks/plan.py [--quick] [--rounds 5] [--tries 3] [--forms FORM ...]
                              [--against earlier.json] [--smoke]

Prints one JSON line. --quick: one shape, fewer runs; --smoke: one shape, two runs (tensor
parallel for the memory figures, routed experts for theirs), one round of one try, each
calibration figure from one run, 6 steps (step 5 traced): every figure, none of them meaningful.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from dtflab.train.formulas.memory import KINDS

#: 20 counted steps a run: from history.FIRST_COUNTED_STEP, the traced step and the one after
#: it left out (``RunHistory.median_step_s``)
STEPS, TRACE = 25, 24
SMOKE_STEPS, SMOKE_TRACE = 6, 5  # the fewest a traced run's step is measured from
#: A round whose runs waited, runnable, for a core more than this share of their step (the
#: median over its runs of ``CpuPerStep.queued_s`` over the wall time a step) is flagged and
#: left out of the errors: the machine, not the model, set its times
QUEUED_SHARE = 0.5
#: --smoke's runs: the cheapest of the forms whose memory is set before they run, and the
#: routed mixture (plan_memory_routed_experts_max_rel_error)
SMOKE_RUNS = ("tensor parallel", "expert parallel (routed)")


def described(hardware) -> dict:
    """What one calibration measured, in the units a reader checks."""
    return {"matmul_gflops_alone": [(round(g, 4), round(r / 1e9, 1))
                                    for g, r in hardware.matrix_rates],
            "memory_gb_s": round(hardware.memory_bandwidth / 1e9, 1),
            "op_costs_us_and_ps_a_byte": {
                kind: (round(fixed * 1e6, 2), round(per_byte * 1e12, 1))
                for kind, (fixed, per_byte) in hardware.op_costs.items()},
            "together": {k: round(v, 2) for k, v in hardware.together.items()},
            "transfer_cores": round(hardware.transfer_cores, 2),
            "per_step_ms": round(hardware.per_step_s * 1e3, 2)}


def memory(history) -> dict:
    """The fullest device's bytes by kind in the traced step, or the worker programs'
    variables (``parameters`` and ``optimizer``)."""
    from dtflab import train

    if getattr(history, "trace", None) is not None and history.trace.metadata is not None:
        held = train.step_memory(history.trace.metadata)
        fullest = max(held.values(), key=lambda kinds: sum(kinds[kind] for kind in KINDS))
        return {kind: fullest[kind] for kind in KINDS}
    state = history.details.get("state_bytes", {})
    if not state:
        return {}
    worker = max(state.values(), key=lambda kinds: sum(kinds.values()))
    return {"parameters": worker["parameters"], "optimizer": worker["slots"]}


def spread(values) -> float:
    """(max - min) / median: how far one form's rounds moved."""
    return (max(values) - min(values)) / statistics.median(values)


def runs(shape: dict):
    """``(name, workers, problem, Layout)`` for each strategy on ``shape``."""
    from dtflab import train

    problem = train.transformer(**shape)
    found = []
    for schedule, chunks in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zero_bubble", 1)):
        found.append((f"pipeline {schedule}", 2, problem,
                      train.Layout(pipeline=2, micro_batches=4, schedule=schedule,
                                   chunks=chunks)))
    for sp in (False, True):
        found.append((f"tensor parallel{' + sequence parallel' if sp else ''}", 2, problem,
                      train.Layout(tensor=2, sequence_parallel=sp)))
    found.append(("context parallel (zig-zag)", 2, problem, train.Layout(context=2)))
    for padded in (True, False):
        moe = train.transformer(**shape, experts=4, top_k=2, capacity_factor=1.25,
                                pad_to_capacity=padded)
        found.append((f"expert parallel ({'padded to capacity' if padded else 'routed'})", 2,
                      moe, train.Layout(data=2, expert=2)))
    found.append(("all-reduce", 2, problem, train.Layout(data=2)))
    for stage in (1, 2, 3):
        found.append((f"ZeRO stage {stage}", 2, problem, train.Layout(data=2, zero=stage)))
    found.append(("data x tensor (2 x 2)", 4, problem, train.Layout(data=2, tensor=2)))
    return found


def run_to_run(rows: list, earlier: dict) -> dict:
    """This run's measured steps against ``earlier``'s (a JSON this script printed), over the
    runs both have: the mean and worst relative difference."""
    before = {row["run"]: row["step_ms"]["measured"] for row in earlier["runs"]}
    differences = [abs(row["step_ms"]["measured"] / before[row["run"]] - 1)
                   for row in rows if row["run"] in before]
    return {"plan_step_time_run_to_run_mean_rel_error": round(statistics.fmean(differences), 3),
            "plan_step_time_run_to_run_max_rel_error": round(max(differences), 3)}


def chosen(quick: bool, smoke: bool, forms: list[str] | None) -> list[tuple]:
    """``(workers, shape, run)`` for each run this invocation makes, before anything starts:
    ``forms`` (names as ``runs`` gives them, without the shape) keeps those alone."""
    shapes = [dict(blocks=4, d_model=128, heads=4, sequence=64, batch_size=16)]
    if not quick:
        shapes.append(dict(blocks=4, d_model=256, heads=4, sequence=128, batch_size=8))
    todo = []
    for workers in (2,) if smoke else (2, 4):
        these = [(workers, shape, r) for shape in shapes for r in runs(shape) if r[1] == workers]
        if smoke:
            these = [t for t in these if t[2][0] in SMOKE_RUNS]
        elif quick and not forms:
            these = these[::2] if workers == 2 else these
        todo += these
    if forms:
        known = sorted({t[2][0] for t in todo})
        for form in forms:
            if form not in known:
                raise SystemExit(f"--forms: {form!r} is not a form this run makes; choose "
                                 f"from {', '.join(repr(k) for k in known)}")
        todo = [t for t in todo if t[2][0] in forms]
    return todo


def key(shape: dict, name: str) -> str:
    return f"{name}, d_model {shape['d_model']}"


def main(quick: bool, rounds: int, tries: int, earlier: dict | None = None,
         smoke: bool = False, forms: list[str] | None = None) -> None:
    import dtflab
    from dtflab import train
    from dtflab.train.measure.cpu import CpuPerStep
    from dtflab.train.planner import published
    from dtflab.train.planner.predicted_run import with_program_costs
    from dtflab.train.strategies.by_layout import GRAPH_LOOPS, loop_for
    from dtflab.train.machinery.history import FIRST_COUNTED_STEP

    if rounds < 1:
        raise SystemExit(f"--rounds {rounds}: a run needs at least one round; use --rounds 5 "
                         f"(the default) or more")
    todo = chosen(quick, smoke, forms)
    if earlier is not None:  # refused before anything starts
        names = {key(shape, r[0]) for _, shape, r in todo}
        if not names & {row["run"] for row in earlier["runs"]}:
            raise SystemExit("--against: no run in common with this one; give a JSON of the "
                             "same shapes (--quick or not) and forms")
    results, rows = {"plan_queued_share_limit": QUEUED_SHARE}, {}
    go = dict(steps=SMOKE_STEPS if smoke else STEPS, seed=0,
              trace_step=SMOKE_TRACE if smoke else TRACE, watchdog=False)
    flagged = 0
    for workers in sorted({t[0] for t in todo}):
        with dtflab.start_cluster(workers=workers, inter_op_threads=2,
                                  intra_op_threads=1) as cluster:
            these = [(shape, r) for w, shape, r in todo if w == workers]
            # interleaved rounds: every form twice a round, A-B-B-A, so the machine's drift
            # falls on all alike and each form's two runs sit either side of the round's middle;
            # the machine calibrated afresh each round, and that round's runs predicted from it
            for round_ in range(rounds):
                start = time.perf_counter()
                hardware = train.calibrate(cluster, tries=tries, repeats=1 if smoke else 5)
                if any(loop_for(r[3]) not in GRAPH_LOOPS for _, r in these):  # a program
                    hardware = with_program_costs(hardware, cluster)
                if workers == 2:
                    results.setdefault("calibration_s", []).append(
                        round(time.perf_counter() - start, 1))
                    results.setdefault("calibrations", []).append(described(hardware))
                seen = {}
                for shape, (name, _, problem, layout) in these + these[::-1]:
                    cpu = CpuPerStep(cluster, skip=FIRST_COUNTED_STEP)
                    history = train.run_layout(problem, cluster, layout, hardware=hardware,
                                               callbacks=[cpu], **go)
                    found = seen.setdefault(key(shape, name), {"measured": [], "queued": [],
                                                               "replays": []})
                    replayed = history.prediction.replayed(history)
                    if replayed is not None:  # a graph loop's traced step, replayed
                        found["replays"].append(replayed["error"])
                    found["measured"].append(history.median_step_s())
                    found["predicted"] = history.prediction.seconds
                    if cpu.wall_s:
                        found["queued"].append(cpu.queued_s / cpu.wall_s)
                    found["prediction"], found["history"] = history.prediction, history
                    # an unpadded mixture holds what the router, learning, sends its experts
                    found["follows"] = bool(getattr(problem, "experts", 0)
                                            and not problem.pad_to_capacity)
                # a round whose runs waited for a core past the limit is flagged and left out
                waited = statistics.median(q for f in seen.values() for q in f["queued"]) \
                    if any(f["queued"] for f in seen.values()) else 0.0
                left_out = waited > QUEUED_SHARE
                flagged += left_out
                for name, found in seen.items():
                    row = rows.setdefault(name, {"run": name, "rounds": [], "replays": [],
                                                 "memory_follows_routing": found["follows"]})
                    row["replays"] += found["replays"]
                    a, b = found["measured"]
                    row["rounds"].append({"predicted": found["predicted"], "a": a, "b": b,
                                          "queued_share": round(waited, 3),
                                          "left_out": left_out})
                    row["prediction"], row["history"] = found["prediction"], found["history"]
    results["plan_rounds_flagged"] = flagged
    for row in rows.values():
        prediction, history = row.pop("prediction"), row.pop("history")
        replays = row.pop("replays")
        kept = [r for r in row["rounds"] if not r["left_out"]] or row["rounds"]
        # paired within the round: its prediction against the mean of its two runs
        errors = [r["predicted"] / ((r["a"] + r["b"]) / 2) - 1 for r in kept]
        # what a perfect prediction scores against the same measurements: the two runs' half
        # difference stands for the mean's own deviation, round by round
        noise = [(r["a"] - r["b"]) / (r["a"] + r["b"]) for r in kept]
        measured = statistics.median((r["a"] + r["b"]) / 2 for r in kept)
        predicted = statistics.median(r["predicted"] for r in kept)
        held = memory(history)
        expected = prediction.memory
        row.update({
            "loop": prediction.loop,
            "step_ms": {"predicted": round(predicted * 1e3, 1),
                        "measured": round(measured * 1e3, 1),
                        "rounds": [round((r["a"] + r["b"]) / 2 * 1e3, 1) for r in row["rounds"]],
                        "duplicates": [(round(r["a"] * 1e3, 1), round(r["b"] * 1e3, 1))
                                       for r in row["rounds"]],
                        "predicted_rounds": [round(r["predicted"] * 1e3, 1)
                                             for r in row["rounds"]]},
            "step_error": round(statistics.median(errors), 3),
            "round_errors": [round(e, 3) for e in errors],
            "noise_expected": round(abs(statistics.median(noise)), 3),
            "queued_shares": [r["queued_share"] for r in row.pop("rounds")],
            "replay_error": (round(statistics.median(replays), 3) if replays else None),
            "memory_mb": {kind: {"predicted": round(expected[kind] / 1e6, 2),
                                 "measured": round(value / 1e6, 2)}
                          for kind, value in held.items()},
            "memory_errors": {kind: round(expected[kind] / value - 1, 3)
                              for kind, value in held.items() if value > 1e6}})
        row["spread"] = round(spread(row["step_ms"]["rounds"]), 3)
        if prediction.timeline is not None and history.trace is not None:
            row["differences"] = prediction.differences(history)
    rows = list(rows.values())
    step_errors = [abs(row["step_error"]) for row in rows]
    memory_errors = [abs(e) for row in rows if not row["memory_follows_routing"]
                     for e in row["memory_errors"].values()]
    routed = [e for row in rows if row["memory_follows_routing"]
              for e in row["memory_errors"].values()]
    results["plan_step_time_mean_rel_error"] = round(statistics.fmean(step_errors), 3)
    results["plan_step_time_max_rel_error"] = round(max(step_errors), 3)
    results["plan_step_time_noise"] = round(statistics.median(row["spread"] for row in rows), 3)
    results["plan_noise_expected_mean"] = round(statistics.fmean(
        row["noise_expected"] for row in rows), 3)
    results["plan_noise_expected_max"] = round(max(row["noise_expected"] for row in rows), 3)
    replays = [abs(row["replay_error"]) for row in rows if row["replay_error"] is not None]
    results["plan_replay_max_rel_error"] = round(max(replays), 3) if replays else None
    results["plan_step_time_calibration_spread"] = round(statistics.median(
        spread(row["step_ms"]["predicted_rounds"]) for row in rows), 3)
    results["plan_memory_mean_rel_error"] = round(statistics.fmean(memory_errors), 3)
    results["plan_memory_max_rel_error"] = round(max(memory_errors), 3)
    if routed:
        results["plan_memory_routed_experts_max_rel_error"] = round(max(routed, key=abs), 3)
    # Korthikanti's and Narayanan's A100 runs; Llama 3 405B's H100 runs; MPT's H100 FSDP runs
    # (not yet met)
    for name, table in (("", published.RUNS), ("narayanan_", published.NARAYANAN_RUNS),
                        ("llama3_", published.LLAMA3_RUNS), ("mpt_", published.MPT_RUNS)):
        errors = [row["error"] for row in published.check(table)]
        results[f"plan_published_{name}mean_rel_error"] = round(
            statistics.fmean(abs(e) for e in errors), 3)
        results[f"plan_published_{name}max_rel_error"] = round(max(abs(e) for e in errors), 3)
        results[f"plan_published_{name}median_error"] = round(statistics.median(errors), 3)
    if earlier is not None:
        results.update(run_to_run(rows, earlier))
    results["runs"] = rows
    print(json.dumps(results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--forms", nargs="+", metavar="FORM",
                        help="only these forms (names as the JSON's runs give them, without "
                             "the shape: 'ZeRO stage 3', 'tensor parallel')")
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--against", type=argparse.FileType(), metavar="EARLIER.json",
                        help="an earlier run's output: report how far this run's steps moved")
    parser.add_argument("--smoke", action="store_true", help="a few steps of each figure, for "
                        "the test suite: the figures are not meaningful")
    arguments = parser.parse_args()
    if arguments.smoke:
        arguments.quick, arguments.rounds, arguments.tries = True, 1, 1
    main(arguments.quick, arguments.rounds, arguments.tries,
         json.load(arguments.against) if arguments.against else None, arguments.smoke,
         arguments.forms)
