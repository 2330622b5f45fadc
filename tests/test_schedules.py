"""Pipeline schedules as orders of work: each schedule's timeline, run with the formula's
assumptions (equal pieces, no overhead), idles what its published formula says; the orders
keep the memory each schedule promises; bad settings are refused with the fix."""

import pytest

from dtflab.train.formulas import schedules
from dtflab.train.formulas.schedules import Work, bubble_ratio, pipeline_order, pipeline_timeline

SETTINGS = [(2, 4), (2, 8), (3, 6), (4, 8), (4, 4), (8, 16)]


def measured_ratio(planned, forward, backward) -> float:
    """Idle over busy, per worker, from a timeline: what a traced step is read as."""
    span = max(p.end for p in planned)
    workers = max(p.worker for p in planned) + 1
    m = max(p.micro_batch for p in planned) + 1
    ratios = [(span - m * (forward + backward)) / (m * (forward + backward))
              for _ in range(workers)]
    return sum(ratios) / workers


@pytest.mark.parametrize("p, m", SETTINGS)
@pytest.mark.parametrize("schedule, chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2),
                                              ("interleaved", 4), ("zero_bubble", 1)])
def test_each_schedules_timeline_idles_as_its_formula_says(schedule, chunks, p, m):
    # Equal forward, input gradient and weight gradient (F = B = W), as the papers draw them.
    planned = pipeline_timeline(schedule, p, m, chunks=chunks, forward=1.0, backward=2.0)
    assert len(planned) == m * chunks * p * (3 if schedule == "zero_bubble" else 2)
    assert measured_ratio(planned, 1.0, 2.0) == pytest.approx(
        bubble_ratio(schedule, p, m, chunks, forward=1.0, backward=2.0))


def test_the_formulas_are_the_papers():
    # Megatron-LM (Narayanan et al. 2021): (p - 1) / m, and v chunks a worker divide it by v.
    assert bubble_ratio("1f1b", 4, 8) == pytest.approx(3 / 8)
    assert bubble_ratio("interleaved", 4, 8, 2) == pytest.approx(3 / 16)
    # ZB-H1 (Qi et al. 2023): (p - 1)(F + B - W) against 1F1B's (p - 1)(F + B + W): a third.
    assert bubble_ratio("zero_bubble", 4, 8) == pytest.approx(bubble_ratio("1f1b", 4, 8) / 3)
    # DualPipe's table writes the same with B the whole backward: (p - 1)(F + B - 2W).
    F, B, W = 1.0, 2.0, 0.8
    assert bubble_ratio("zero_bubble", 4, 8, forward=F, backward=B, weight=W) * 8 * (F + B) == \
        pytest.approx(3 * (F + B - 2 * W))
    assert schedules.bubble_share(4, 8, 2) == pytest.approx(3 / (16 + 3))


@pytest.mark.parametrize("p, m", SETTINGS)
def test_zero_bubble_holds_no_more_micro_batches_than_1f1b_does_on_its_first_worker(p, m):
    one_f_one_b = [schedules.in_flight_peak(order) for order in pipeline_order("1f1b", p, m)]
    zero_bubble = [schedules.in_flight_peak(order) for order in pipeline_order("zero_bubble", p, m)]
    assert one_f_one_b == [min(p - d, m) for d in range(p)]
    assert max(zero_bubble) <= max(one_f_one_b)
    for order in pipeline_order("zero_bubble", p, m):  # each W after its own B
        for j in range(m):
            assert order.index(Work("W", j)) > order.index(Work("B", j)) > order.index(Work("F", j))


def test_the_interleaved_order_is_megatrons():
    # p = 2, m = 4, v = 2: worker 0 warms up with 2 (p - 1) + (v - 1) p = 4 forwards: micro-
    # batches 0 and 1 on chunk 0, then 0 and 1 on chunk 1, then alternates; backwards start
    # from the last chunk.
    order = pipeline_order("interleaved", 2, 4, 2)[0]
    assert order[:6] == [Work("F", 0, 0), Work("F", 1, 0), Work("F", 0, 1), Work("F", 1, 1),
                         Work("F", 2, 0), Work("B", 0, 1)]
    assert sorted(order) == sorted([Work(k, j, c) for k in "FB" for j in range(4) for c in (0, 1)])
    # The last worker's first backward follows its first forward of the last chunk.
    last = pipeline_order("interleaved", 2, 4, 2)[1]
    assert last.index(Work("B", 0, 1)) == last.index(Work("F", 0, 1)) + 1


@pytest.mark.parametrize("schedule, p, m, chunks, message", [
    ("zigzag", 2, 4, 1, r"schedule='zigzag': schedule must be one of 'gpipe', '1f1b', "
                        r"'interleaved', 'zero_bubble'"),
    ("interleaved", 2, 4, 1, r"chunks=1: the interleaved schedule gives each worker several "
                             r"chunks of the model; use chunks=2 or more"),
    ("interleaved", 4, 6, 2, r"micro_batches=6: the interleaved schedule sends micro-batches in "
                             r"groups of 4 \(one per worker\); use a multiple of 4, e.g. "
                             r"micro_batches=4"),
    ("1f1b", 2, 4, 2, r"chunks=2: only the interleaved schedule gives a worker several chunks; "
                      r"use schedule='interleaved' or chunks=1"),
    ("interleaved", 2, 4, 0, r"chunks=0: chunks must be a whole number of at least 1; for example chunks=2"),
])
def test_bad_settings_are_refused_naming_the_value_and_the_fix(schedule, p, m, chunks, message):
    with pytest.raises(ValueError, match=message):
        pipeline_order(schedule, p, m, chunks)
