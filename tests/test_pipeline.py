"""Pipeline parallelism on real task servers: the same losses as one process, the bubble read
from a traced step, the step model read from traced steps (how close it comes to the
measured steps: ``benchmarks/model_parallel.py``), GPipe against 1F1B, stragglers
(Stop and a dead stage: ``test_every_loop.py``)."""

import pytest

from dtflab import train
from dtflab.errors import DtflabError, TaskError
from dtflab.train.formulas import costs, schedules
from dtflab.train.machinery import sessions
from dtflab.train.layouts.layers import balanced_cut, layer_ranges
from dtflab.viz.compare import compare

from conftest import max_loss_diff as max_diff, one_process

pytestmark = pytest.mark.slow

#: Pipeline vs one process, same seed and batches: float rounding only (the issue's bound).
TOLERANCE = 1e-5
DEEP = train.classification(width=64, batch_size=256, hidden_layers=3)


@pytest.fixture(scope="module")
def cluster(split_cluster):
    return split_cluster


@pytest.mark.parametrize("problem, stages, micro_batches, schedule", [
    (train.exp_regression(), 2, 4, "gpipe"),
    (train.exp_regression(), 3, 5, "1f1b"),
    (DEEP, 2, 8, "gpipe"),
    (DEEP, 3, 4, "1f1b"),
], ids=["exp-2x4-gpipe", "exp-3x5-1f1b", "classification-2x8-gpipe", "classification-3x4-1f1b"])
def test_a_pipeline_trains_exactly_as_one_process(cluster, problem, stages, micro_batches, schedule):
    alone = one_process(problem, steps=30, seed=4)
    piped = train.pipeline(problem, cluster, stages=stages, micro_batches=micro_batches,
                           schedule=schedule, steps=30, seed=4)
    assert piped.steps == 30 and piped.loop == "pipeline"
    assert max_diff(alone, piped) <= TOLERANCE
    assert piped.losses[-1] < piped.losses[0]  # it learns
    assert compare(alone, piped).rows[1]["max_abs_loss_diff"] <= TOLERANCE


SMALL_TRANSFORMER = train.transformer(blocks=4, d_model=32, heads=2, sequence=16, batch_size=8)


@pytest.mark.parametrize("problem, schedule, chunks", [
    (DEEP, "interleaved", 2), (DEEP, "zero_bubble", 1),
    (SMALL_TRANSFORMER, "interleaved", 2), (SMALL_TRANSFORMER, "zero_bubble", 1),
], ids=["classification-interleaved", "classification-zero-bubble", "transformer-interleaved",
        "transformer-zero-bubble"])
def test_interleaved_and_zero_bubble_pipelines_train_exactly_as_one_process(cluster, problem,
                                                                           schedule, chunks):
    alone = one_process(problem, steps=12, seed=2)
    piped = train.pipeline(problem, cluster, stages=2, micro_batches=4, schedule=schedule,
                           chunks=chunks, steps=12, seed=2)
    print(f"{problem.name} {schedule}: {max_diff(alone, piped):.2e} from one process")
    assert max_diff(alone, piped) <= TOLERANCE
    assert piped.losses[-1] < piped.losses[0]


@pytest.mark.parametrize("schedule, chunks", [("interleaved", 2), ("zero_bubble", 1)])
def test_each_worker_runs_its_schedule_in_order_and_the_bubble_is_read_against_the_formula(
        cluster, schedule, chunks):
    bubble = train.pipeline(DEEP, cluster, stages=2, micro_batches=4, schedule=schedule,
                            chunks=chunks, steps=3, trace_step=2).bubble
    pieces = 2 * 4 * chunks * (3 if schedule == "zero_bubble" else 2)
    assert len(bubble.slots) == pieces and bubble.layout.chunks == chunks
    for worker, order in enumerate(schedules.pipeline_order(schedule, 2, 4, chunks)):
        ran = [(s.kind, s.micro_batch, s.stage // 2) for s in bubble.slots
               if bubble.worker(s) == worker]
        assert ran == [tuple(work) for work in order]  # start order, as scheduled
    # Each piece's data arrived before it started: a forward after the stage before's.
    at = {(s.stage, s.kind, s.micro_batch): s for s in bubble.slots}
    for slot in bubble.slots:
        if slot.kind == "F" and slot.stage > 0:
            assert slot.start_us >= at[slot.stage - 1, "F", slot.micro_batch].end_us
        if slot.kind == "W":  # the weights' gradients: their multiplies only, after the input's
            assert slot.start_us >= at[slot.stage, "B", slot.micro_batch].end_us
            assert 0 < slot.weight_gradient_us <= slot.arithmetic_us
            assert at[slot.stage, "B", slot.micro_batch].weight_gradient_us == 0
    # The formula's closed form, p = 2 and m = 4: interleaved (p - 1) / (v m); ZB-H1
    # (p - 1)(F + B - W) / (m (F + B + W)) with this step's mean pieces (B the input's gradient).
    f, b, w = (bubble.piece_us(kind) for kind in "FBW")
    closed = 1 / 8 if schedule == "interleaved" else (f + b - w) / (4 * (f + b + w))
    assert bubble.formula_ratio == pytest.approx(closed)
    assert bubble.formula == pytest.approx(closed / (1 + closed))
    assert all(0 < share < 1 for share in bubble.idle_share) and bubble.bubble_ratio > 0
    chart = bubble.figure()
    drawn = {r.name: r.data_source.data for fig in chart.children for r in fig.renderers
             if r.name}
    kind = "weights" if schedule == "zero_bubble" else "backward"
    assert len(drawn[kind]["left"]) == len(drawn["formula_" + kind]["left"]) == 2 * 4 * chunks
    with pytest.raises(ValueError, match=f"schedule='{schedule}': the step-time model covers "
                                         f"the gpipe and 1f1b schedules"):
        bubble.predicted_step_s(8)


def test_bad_schedules_are_refused_before_anything_starts(cluster):
    with pytest.raises(ValueError, match=r"micro_batches=6: the interleaved schedule sends "
                                         r"micro-batches in groups of 4"):
        train.pipeline(DEEP, cluster, stages=4, micro_batches=6, schedule="interleaved",
                       chunks=2)
    with pytest.raises(ValueError, match=r"chunks=3: 2 workers x 3 chunks are 6 stages, and "
                                         r"classification_64x3 has 4 layers; use chunks=2 or "
                                         r"a deeper model"):
        train.pipeline(DEEP, cluster, stages=2, micro_batches=4, schedule="interleaved",
                       chunks=3)
    with pytest.raises(ValueError, match=r"chunks=2: only the interleaved schedule"):
        train.pipeline(DEEP, cluster, stages=2, schedule="1f1b", chunks=2)


def test_the_default_cut_balances_multiply_adds_and_a_cut_can_be_chosen():
    assert balanced_cut(DEEP, 2) == (3,)  # 64x64 + 64x64 | 64x64 + 64x10
    wide_first = train.classification(width=32, features=512, hidden_layers=3)
    assert balanced_cut(wide_first, 2) == (2,)  # 512x32 outweighs everything after it
    assert layer_ranges(DEEP, 2, cut=[2]) == ((1, 1), (2, 4))
    assert layer_ranges(DEEP, 4) == ((1, 1), (2, 2), (3, 3), (4, 4))


def test_the_traced_step_shows_every_micro_batch_on_its_stage_in_schedule_order(cluster):
    history = train.pipeline(DEEP, cluster, stages=3, micro_batches=4, schedule="1f1b", steps=4,
                             trace_step=2)
    bubble = history.bubble
    assert len(bubble.slots) == 2 * 3 * 4
    for stage in range(3):
        ran = [(s.kind, s.micro_batch) for s in bubble.slots if s.stage == stage]
        planned = [(work.kind, work.micro_batch) for work in schedules.pipeline_order("1f1b", 3, 4)[stage]]
        assert ran == planned  # start order, as scheduled
    # Data flows forward through the stages and back: a forward starts after the stage before
    # finished it; a backward after the stage behind began its own (whose input gradient
    # leaves before its weight multiplies, so the two may overlap).
    at = {(s.stage, s.kind, s.micro_batch): s for s in bubble.slots}
    for slot in bubble.slots:
        if slot.kind == "F" and slot.stage > 0:
            assert slot.start_us >= at[slot.stage - 1, "F", slot.micro_batch].end_us
        if slot.kind == "B" and slot.stage < 2:
            assert slot.start_us > at[slot.stage + 1, "B", slot.micro_batch].start_us
    assert all(0 < share < 1 for share in bubble.idle_share)
    assert bubble.formula == pytest.approx(2 / 6)
    assert bubble.busy_us(0) > bubble.arithmetic_us(0) > 0
    # Stages 1 and 2 send their input gradient back before their weight multiplies: those
    # multiplies, a part of each stage's arithmetic, are what the stage before need not wait
    # for. Each stage against its own arithmetic (CI32: against the other stage's, stage 1's
    # multiplies, starved, took 1.5 ms where all of stage 2's arithmetic took 0.6 ms).
    weights = [sum(s.weight_gradient_us for s in bubble.slots if s.stage == stage) for stage in (1, 2)]
    assert all(0 < w < bubble.arithmetic_us(stage) for stage, w in zip((1, 2), weights))
    assert bubble.overlap_s * 1e6 == pytest.approx(sum(weights) / 2)
    # The step model at p = 3, m = 4: 6 slots of t / 4 + c, less 2 hops' w / 4, plus the rest.
    assert bubble.predicted_step_s(4) == pytest.approx(
        1.5 * bubble.stage_s + 6 * bubble.per_micro_batch_s - bubble.overlap_s / 2 + bubble.rest_s)
    assert "3 stages x 4 micro-batches (1f1b)" in bubble.summary()


def test_each_micro_batch_size_has_its_own_measured_arithmetic_in_the_cost_model(cluster):
    arithmetic = train.stage_arithmetic_s(DEEP, cluster, stages=2, micro_batches=(1, 4, 8),
                                          repeats=1)
    assert sorted(arithmetic) == [1, 4, 8] and all(s > 0 for s in arithmetic.values())
    bubble = train.pipeline(DEEP, cluster, stages=2, micro_batches=4, steps=3, trace_step=1, schedule="gpipe").bubble
    # At the traced step's own m the measured arithmetic changes nothing; at another m the
    # stage's arithmetic is scaled by what was measured there, the rest left as traced: twice
    # the arithmetic at m = 8 adds a stage's once more, in m + p - 1 = 9 slots of 1 / 8 each.
    assert bubble.predicted_step_s(4, arithmetic) == pytest.approx(bubble.predicted_step_s(4))
    slower = bubble.predicted_step_s(8, {4: 1.0, 8: 2.0}) - bubble.predicted_step_s(8)
    assert slower == pytest.approx(9 / 8 * bubble.stage_s)
    with pytest.raises(ValueError, match="no figure for m = 2"):
        bubble.predicted_step_s(2, arithmetic)
    # Several traced steps, at any m: each part their median, the stage times scaled to the
    # first step's m by the arithmetic measured at each.
    again = train.pipeline(DEEP, cluster, stages=2, micro_batches=4, steps=3, trace_step=1, schedule="gpipe").bubble
    eight = train.pipeline(DEEP, cluster, stages=2, micro_batches=8, steps=3, trace_step=1, schedule="gpipe").bubble
    model = train.StepModel.median_of([bubble, again, eight], arithmetic)
    stages = sorted([bubble.stage_s, again.stage_s, eight.stage_s * arithmetic[4] / arithmetic[8]])
    assert (model.micro_batches, model.steps, model.stage_s) == (4, 3, stages[1])
    assert model.rest_s == sorted(b.rest_s for b in (bubble, again, eight))[1]
    assert model.per_micro_batch_s == sorted(b.per_micro_batch_s for b in (bubble, again, eight))[1]
    predicted = {m: model.predicted_step_s(m, arithmetic) for m in (1, 4, 8)}
    assert predicted[model.best_micro_batches((1, 4, 8), arithmetic)] == min(predicted.values())
    # Notebook 09's route: a stage's arithmetic is time spent, the rest never negative, the
    # overlap (a later stage's weight-gradient multiplies) a part of a stage's arithmetic, and
    # every m's step a time. How close it comes to the measured steps is a ratio of times a
    # loaded machine moves by a factor of two: ``benchmarks/model_parallel.py``'s
    # pipeline_step_model_max_rel_error.
    assert model.stage_s > 0 and model.rest_s >= 0 and 0 < model.overlap_s <= model.stage_s
    assert all(0 < model.predicted_step_s(m) < float("inf") for m in (1, 2, 4, 8, 16))
    with pytest.raises(ValueError, match=r"traced at m = \[4, 8\] need arithmetic="):
        train.StepModel.median_of([bubble, eight])
    with pytest.raises(ValueError, match="bubbles is empty"):
        train.StepModel.median_of([])
    with pytest.raises(ValueError, match="micro_batches: 3 does not divide the batch of 256"):
        train.stage_arithmetic_s(DEEP, cluster, micro_batches=(1, 3))


def test_the_pipeline_chart_draws_the_measured_slots_and_the_formulas_schedule(cluster):
    bubble = train.pipeline(DEEP, cluster, stages=2, micro_batches=4, steps=3, trace_step=1, schedule="gpipe").bubble
    chart = bubble.figure()
    measured, formula = chart.children  # one above the other
    renderers = {r.name: r.data_source.data for fig in (measured, formula) for r in fig.renderers
                 if r.name}
    assert sorted(renderers["forward"]["label"]) == sorted(f"F{j}" for j in range(4) for _ in range(2))
    assert len(renderers["backward"]["left"]) == 8 and len(renderers["formula_forward"]["left"]) == 8
    assert renderers["bubble"]["left"] and renderers["formula_bubble"]["left"]
    # The formula's chart idles (p - 1) / (m + p - 1) of each stage's time.
    ideal = schedules.pipeline_timeline("gpipe", 2, 4, forward=1.0, backward=2.0)
    span = max(piece.end for piece in ideal)
    busy = sum(end - start for s, _, _, start, end, _ in ideal if s == 0)
    assert 1 - busy / span == pytest.approx(schedules.bubble_share(2, 4))
    assert "Formula: idle 20%" in formula.title.text


def test_1f1b_holds_fewer_activations_than_gpipe(cluster):
    problem = train.classification(width=256, batch_size=512, hidden_layers=3)
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        history = train.pipeline(problem, cluster, stages=2, micro_batches=8, schedule=schedule,
                                 steps=3, trace_step=1)
        peaks[schedule] = history.bubble.peak_activation_bytes
    # Stage 0 keeps two layer outputs of 64 x 256 floats per micro-batch until its backward:
    # all 8 micro-batches under GPipe, at most p = 2 under 1F1B, and the next one's first layer
    # (2.5 micro-batches' worth on a quiet machine). On a busy one the allocator records show
    # up to one micro-batch more for a moment: stage 0's output after its backward, still held
    # by the gRPC transport that sent it, and a bias-add's output its ReLU did not overwrite in
    # place (3.0 and 3.5 in 3 of 60 steps beside two busy loops; 3.5 failed the bound of 3 once
    # in a CI run).
    held = costs.activation_bytes([256, 256], 64)
    assert held == 2 * 64 * 256 * 4
    assert peaks["gpipe"][0] >= 8 * held
    assert peaks["1f1b"][0] <= 4 * held, (
        f"1F1B's stage 0 held {peaks['1f1b'][0] / held:.2f} micro-batches' activations at once")


def test_a_slow_stage_holds_up_the_pipeline(cluster):
    history = train.pipeline(DEEP, cluster, stages=2, micro_batches=2, steps=3, trace_step=1,
                             slow={"worker:1": 0.3}, schedule="gpipe")
    bubble = history.bubble
    slept = bubble.busy_us(1) - bubble.arithmetic_us(1)
    assert slept >= 0.25e6  # its forwards slept 0.15 s each
    assert bubble.idle_share[0] > bubble.idle_share[1]  # the others wait for it


def test_a_step_slower_than_the_operation_timeout_is_not_a_failed_task(cluster, monkeypatch):
    # CI27: notebook 14's pipeline, starved beside the tests, ran past TF's 10 s operation
    # timeout in its first step (the graph is placed on every task then) and ended "unknown:0
    # failed during step 0 (DeadlineExceededError)" with every task alive. A first step has
    # the watchdog's first_step_s; here the timeout is 1 s and the first step sleeps 1.5 s.
    monkeypatch.setattr(sessions, "OPERATION_TIMEOUT_MS", 1000)
    history = train.pipeline(DEEP, cluster, stages=2, micro_batches=2, steps=1,
                             slow={"worker:1": 1.5}, schedule="gpipe")
    assert history.steps == 1 and history.failures == []
    # A later step that outlasts it with every task alive (CI-1129: a notebook starved beside
    # the tests, at step 4) is a stall the watchdog's policy recovers: a new session, the step
    # run again if its update had not run, and the longer deadline from then on.
    history = train.pipeline(DEEP, cluster, stages=2, micro_batches=2, steps=3,
                             slow={"worker:1": 1.5}, schedule="gpipe")
    assert history.steps == 3 and history.failures == []
    assert [(stall.step, stall.outcome) for stall in history.stalls] == [(1, "recovered")]
    quick = train.pipeline(DEEP, cluster, stages=2, micro_batches=2, steps=3, schedule="gpipe")
    assert history.losses == pytest.approx(quick.losses, rel=1e-6)  # each update ran once
    # Without the watchdog, no stall policy: with every task alive, none is named as failed.
    with pytest.raises(DtflabError, match=r"^step 1 failed with every task alive "
                                          r"\(DeadlineExceededError: .+\); the synchronous run stopped$"
                       ) as raised:
        train.pipeline(DEEP, cluster, stages=2, micro_batches=2, steps=2, slow={"worker:1": 1.5},
                       watchdog=False, schedule="gpipe")
    assert not isinstance(raised.value, TaskError)


@pytest.mark.parametrize("stages, micro_batches", [(2, 1), (2, 8), (4, 4), (8, 16)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_both_schedules_idle_as_the_bubble_formula_says(stages, micro_batches, schedule):
    slots = schedules.pipeline_timeline(schedule, stages, micro_batches, forward=1.0, backward=2.0)
    span = max(piece.end for piece in slots)
    assert span == 3 * (micro_batches + stages - 1)
    for stage in range(stages):
        busy = sum(piece.end - piece.start for piece in slots if piece.worker == stage)
        assert 1 - busy / span == pytest.approx(schedules.bubble_share(stages, micro_batches))
    # With no per-micro-batch cost the step model is the formula's span.
    assert costs.pipeline_step_s(stages, micro_batches, 3.0 * micro_batches, 0.0) == pytest.approx(span)


def test_1f1b_keeps_at_most_p_micro_batches_in_flight_per_stage():
    for stage, order in enumerate(schedules.pipeline_order("1f1b", 4, 8)):
        in_flight = peak = 0
        for kind, _, _ in order:
            in_flight += 1 if kind == "F" else -1
            peak = max(peak, in_flight)
        assert peak == 4 - stage
    assert costs.best_micro_batches(2, stage_s=1.0, per_micro_batch_s=0.02) == 8


def test_the_step_model_takes_off_what_the_stage_before_need_not_wait_for():
    # m = 1, p = 2: forward and backward on both stages, less stage 1's weight gradients.
    assert costs.pipeline_step_s(2, 1, 3.0, 0.1, 0.5, overlap_s=1.0) == pytest.approx(2 * 3.1 - 1.0 + 0.5)
    assert costs.pipeline_step_s(2, 8, 3.0, 0.0, overlap_s=1.0) == pytest.approx(9 * 3 / 8 - 1 / 8)


def test_scaling_measures_a_pipeline_of_as_many_stages_as_workers_on_a_model_that_cuts_evenly():
    from dtflab.train.experiments import scaling

    problem = train.classification(width=64, batch_size=256, features=8)
    deep = scaling.pipeline_problem(problem, 4)
    assert deep.layers == (8, 64, 64, 64, 64, 64, 10) and deep.batch_size == 256
    for stages in (2, 4):  # each stage gets the same number of full-width layers
        ranges = layer_ranges(deep, stages)
        full = [sum(1 for layer in range(a, b + 1) if 1 < layer < deep.depth) for a, b in ranges]
        assert full == [4 // stages] * stages
    curves = scaling.measure(problem, counts=(1, 2), loops=(scaling.PIPELINE,), modes=("strong",),
                             steps=4, rounds=1)
    rates = curves.rates["strong"][scaling.PIPELINE]
    assert sorted(rates) == [1, 2] and all(rate > 0 for rate in rates.values())
    assert curves.examples["strong"][scaling.PIPELINE][2] == pytest.approx(rates[2] * 256)
    with pytest.raises(ValueError, match=r"'tensor' is not measured here; choose from "
                                         r"sync_data_parallel, .*, all_reduce, pipeline$"):
        scaling.measure(problem, loops=("tensor",))
