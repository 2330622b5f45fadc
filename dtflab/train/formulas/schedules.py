"""Pipeline schedules: what each worker of a pipeline runs, in which order, and the bubble each
schedule's formula predicts. Pure Python; ``train.pipeline`` builds its control dependencies
from :func:`pipeline_order`, the chart draws :func:`pipeline_timeline`, the playground both.

A pipeline has p workers (``stages``), each batch m micro-batches. The model is cut into
``p x v`` pieces, *stages* numbered from the input; worker d holds stages d, d + p, d + 2p, ...
(its v *chunks*, Megatron's interleaving; v = 1 for every schedule but ``interleaved``). Each
piece of work is a :class:`Work`: a forward ``F``, a backward ``B``, or, for ``zero_bubble``
only, the backward split in two: ``B`` the gradient of the stage's input (the next worker back
waits for it) and ``W`` the gradient of its weights (nobody waits for it).

- ``gpipe``: every forward, then every backward (Huang et al. 2019).
- ``1f1b``: ``p - d - 1`` warm-up forwards, then one forward and one backward in turn
  (PipeDream-Flush, Narayanan et al. 2021): at most ``p - d`` micro-batches in flight.
- ``interleaved``: 1F1B over v chunks a worker, micro-batches in groups of p (Megatron-LM's
  ``forward_backward_pipelining_with_interleaving``, Narayanan et al. 2021): the bubble shrinks
  v times, each micro-batch crosses between workers v times as often.
- ``zero_bubble``: ZB-H1 (Qi et al. 2023): 1F1B's forwards and input gradients, each weight
  gradient deferred into a gap where the worker would otherwise wait, with at most p
  micro-batches in flight on any worker (1F1B's first worker's peak). The order is found by
  simulating unit-cost work (F = B = W), as the paper's hand-made ZB-H1 figure is drawn.
"""

from __future__ import annotations

from typing import NamedTuple

from dtflab.train.layouts.layout import SCHEDULES, Layout  # noqa: F401  (the layout checks them)


class Work(NamedTuple):
    """One piece of a worker's work: ``kind`` ``"F"``, ``"B"`` or ``"W"``, of ``micro_batch``,
    on the worker's ``chunk`` (its stage ``chunk x p + worker``)."""

    kind: str
    micro_batch: int
    chunk: int = 0


class Planned(NamedTuple):
    """A piece of work on the formula's timeline (any unit of time)."""

    worker: int
    kind: str
    micro_batch: int
    start: float
    end: float
    chunk: int = 0


def bubble_share(stages: int, micro_batches: int, chunks: int = 1) -> float:
    """The share of a pipelined step each worker sits idle while the pipeline fills and drains,
    GPipe's and 1F1B's ``(p - 1) / (m + p - 1)``; with v chunks a worker (interleaved)
    ``(p - 1) / (v m + p - 1)``. It leaves out what each micro-batch costs beyond its
    arithmetic (:func:`dtflab.train.formulas.costs.pipeline_step_s`)."""
    return (stages - 1) / (chunks * micro_batches + stages - 1)


def bubble_ratio(schedule: str, stages: int, micro_batches: int, chunks: int = 1, *,
                 forward: float = 1.0, backward: float = 2.0, weight: float | None = None) -> float:
    """The bubble over the work, the way Megatron and the zero-bubble paper state it: each
    worker's idle time divided by its busy time.

    - ``gpipe``, ``1f1b``: ``(p - 1) / m``;
    - ``interleaved``: ``(p - 1) / (v m)`` (Narayanan et al. 2021);
    - ``zero_bubble``: ``(p - 1)(F + B - W) / (m (F + B + W))`` (ZB-H1, Qi et al. 2023), where
      ``B`` is the input gradient's time (``backward - weight``) and ``W`` the weights'
      (``weight``, by default half the backward). The paper derives it for m >= p and F, B
      and W alike; where they differ, the schedule's own timeline (:func:`pipeline_timeline`)
      is the prediction to trust.

    ``forward`` and ``backward`` are one worker's time for one micro-batch (all its chunks);
    only their ratios matter."""
    Layout(pipeline=stages, micro_batches=micro_batches, schedule=schedule, chunks=chunks)
    p, m = stages, micro_batches
    if schedule == "zero_bubble":
        w = backward / 2 if weight is None else weight
        b = backward - w
        return (p - 1) * (forward + b - w) / (m * (forward + backward))
    return (p - 1) / (chunks * m)


def pipeline_order(schedule: str, stages: int, micro_batches: int,
                   chunks: int = 1) -> list[list[Work]]:
    """What each worker runs, in order: one list of :class:`Work` per worker."""
    Layout(pipeline=stages, micro_batches=micro_batches, schedule=schedule, chunks=chunks)
    p, m = stages, micro_batches
    if schedule == "gpipe":
        return [[Work("F", j) for j in range(m)] + [Work("B", j) for j in range(m)]
                for _ in range(p)]
    if schedule == "1f1b":
        return [_one_forward_one_backward(p, m, d) for d in range(p)]
    if schedule == "interleaved":
        return [_interleaved(p, m, chunks, d) for d in range(p)]
    return _zero_bubble(p, m)


def _one_forward_one_backward(p: int, m: int, worker: int) -> list[Work]:
    warm = min(p - worker - 1, m)
    order = [Work("F", j) for j in range(warm)]
    for j in range(m - warm):
        order += [Work("F", warm + j), Work("B", j)]
    return order + [Work("B", j) for j in range(m - warm, m)]


def _interleaved(p: int, m: int, v: int, worker: int) -> list[Work]:
    """Megatron-LM's order: the k-th forward is micro-batch ``(k // pv) p + k % p`` on chunk
    ``(k // p) % v``; backwards the same with the chunks reversed; ``2 (p - d - 1) + (v - 1) p``
    warm-up forwards, then one forward and one backward in turn."""
    total = m * v

    def work(kind, k):
        chunk = (k % (p * v)) // p
        return Work(kind, (k // (p * v)) * p + k % p, chunk if kind == "F" else v - 1 - chunk)

    warm = min(2 * (p - worker - 1) + (v - 1) * p, total)
    order = [work("F", k) for k in range(warm)]
    for k in range(total - warm):
        order += [work("F", warm + k), work("B", k)]
    return order + [work("B", k) for k in range(total - warm, total)]


def _zero_bubble(p: int, m: int) -> list[list[Work]]:
    """ZB-H1's order, found by running unit-cost work: each worker takes 1F1B's next forward or
    input gradient when its input is there; while it waits, it runs its oldest deferred weight
    gradient; a forward that would put more than p micro-batches in flight (a micro-batch is
    in flight from its forward to its weight gradient) waits for a weight gradient first."""
    plans = [_one_forward_one_backward(p, m, d) for d in range(p)]
    ends: dict[tuple[int, str, int], float] = {}
    free, position = [0.0] * p, [0] * p
    deferred: list[list[int]] = [[] for _ in range(p)]
    in_flight = [0] * p
    orders: list[list[Work]] = [[] for _ in range(p)]
    while any(position[d] < len(plans[d]) or deferred[d] for d in range(p)):
        best = None  # (start, is a weight gradient, worker, work)
        for d in range(p):
            choices = []
            if position[d] < len(plans[d]):
                work = plans[d][position[d]]
                ready = _ready(ends, p, d, work)
                if work.kind == "F" and in_flight[d] >= p:
                    ready = None
                if ready is not None:
                    choices.append((max(free[d], ready), 0, d, work))
            if deferred[d]:
                choices.append((free[d], 1, d, Work("W", deferred[d][0])))
            for choice in choices:
                if best is None or choice[:3] < best[:3]:
                    best = choice
        start, _, d, work = best
        ends[d, work.kind, work.micro_batch] = free[d] = start + 1.0
        orders[d].append(work)
        if work.kind == "W":
            deferred[d].pop(0)
            in_flight[d] -= 1
        else:
            position[d] += 1
            if work.kind == "F":
                in_flight[d] += 1
            else:
                deferred[d].append(work.micro_batch)
    return orders


def _ready(ends, p: int, worker: int, work: Work, chunks: int = 1):
    """When ``work``'s input is there (None: not yet): a forward after the stage before's, a
    backward after the stage after's (the last stage's after its own forward), a weight
    gradient after its own stage's input gradient. ``ends`` is keyed by (stage, kind, j)."""
    stage = work.chunk * p + worker
    last = p * chunks - 1
    if work.kind == "F":
        return 0.0 if stage == 0 else ends.get((stage - 1, "F", work.micro_batch))
    if work.kind == "W":
        return ends.get((stage, "B", work.micro_batch))
    if stage == last:
        return ends.get((stage, "F", work.micro_batch))
    return ends.get((stage + 1, "B", work.micro_batch))


def pipeline_timeline(schedule: str, stages: int, micro_batches: int, *, chunks: int = 1,
                      forward: float = 1.0, backward: float = 2.0,
                      weight: float | None = None) -> list[Planned]:
    """The formula's picture: every piece of work as :class:`Planned`, with no transfer or
    overhead. ``forward`` and ``backward`` are a worker's time for one micro-batch through all
    its chunks (each chunk's piece takes 1/v of it); for ``zero_bubble`` the backward's
    ``weight`` part (by default half) is a ``W`` of its own and ``B`` takes the rest. A piece
    starts when its worker finished the piece before it and its input is ready."""
    orders = pipeline_order(schedule, stages, micro_batches, chunks)
    w = (backward / 2 if weight is None else weight) if schedule == "zero_bubble" else 0.0
    took = {"F": forward / chunks, "B": (backward - w) / chunks, "W": w / chunks}
    ends: dict[tuple[int, str, int], float] = {}
    free, position, planned = [0.0] * stages, [0] * stages, []
    while any(position[d] < len(orders[d]) for d in range(stages)):
        progressed = False
        for d in range(stages):
            while position[d] < len(orders[d]):
                work = orders[d][position[d]]
                ready = _ready(ends, stages, d, work, chunks)
                if ready is None:
                    break
                start = max(free[d], ready)
                end = start + took[work.kind]
                ends[work.chunk * stages + d, work.kind, work.micro_batch] = free[d] = end
                planned.append(Planned(d, work.kind, work.micro_batch, start, end, work.chunk))
                position[d] += 1
                progressed = True
        if not progressed:  # the orders above never deadlock; a bug if they do
            raise RuntimeError(f"{schedule} schedule deadlocked at {position}")
    return planned


def idle_share(planned: list[Planned], stages: int) -> list[float]:
    """Each worker's idle share of a timeline's span."""
    span = max(p.end for p in planned) - min(p.start for p in planned)
    return [1 - sum(p.end - p.start for p in planned if p.worker == d) / span
            for d in range(stages)]


def in_flight_peak(order: list[Work]) -> int:
    """The most pieces of work a worker holds the activations of at once in ``order``: from a
    forward until its backward (where the weights' gradient is separate, until that). With v
    chunks a piece holds 1/v of a micro-batch's activations on the worker."""
    split = any(work.kind == "W" for work in order)
    held = peak = 0
    for work in order:
        if work.kind == "F":
            held += 1
        elif work.kind == ("W" if split else "B"):
            held -= 1
        peak = max(peak, held)
    return peak
