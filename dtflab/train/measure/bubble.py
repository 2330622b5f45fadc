"""A traced pipeline step, stage by stage: when each forward and backward of each micro-batch
ran, how long each stage sat idle (the bubble), and how much activation memory it held.

A pipeline's ops are named ``stage{s}/forward{j}/...`` and ``stage{s}/backward{j}/...``
(``dtflab.train.strategies.pipeline``); everything here is read from a StepTrace's op timings and from
the allocator records TensorFlow's FULL_TRACE step stats carry (each op's allocations and
frees, with their times). Timings on one machine share a clock; across hosts they do not.
"""

from __future__ import annotations

import importlib
import re
import statistics
from dataclasses import dataclass, field

from dtflab import names
from dtflab.tracing.step import union
from dtflab.train.formulas import costs, schedules
from dtflab.train.layouts.layout import Layout

#: The module that draws a Bubble, named rather than imported: the data does not depend on
#: its views (as ``tracing.step`` names ``dtflab.viz.step``); it imports this module's data only.
VIEWS = "dtflab.viz.pipeline"
#: Op types that are the model's arithmetic: what a perfect pipeline would keep busy.
ARITHMETIC = re.compile(r"MatMul|^(Leaky)?Relu(Grad)?$|^BiasAdd")
_SCOPE = re.compile(r"^stage(\d+)/(forward|backward)(\d+)/")


@dataclass(frozen=True)
class Slot:
    """One stage's forward (``"F"``), backward (``"B"``) or, where the schedule runs them on
    their own, weight gradients (``"W"``) of one micro-batch, as it ran (µs from the step's
    start): from its first multiply's start to its last one's end, ``busy_us`` the time any
    of its ops ran (two ops at once on a task's two inter-op threads count once; ``busy``,
    those stretches), ``arithmetic_us`` the time its matrix multiplies and activations took.
    ``stage`` counts the model's pieces from the input; with v chunks a worker, it runs on
    worker ``stage % p``."""

    stage: int
    kind: str
    micro_batch: int
    start_us: float
    end_us: float
    busy_us: float
    arithmetic_us: float
    weight_gradient_us: float = 0.0  # a backward's multiplies for its weights' gradients
    busy: tuple = ()  # (start, end) in µs of each stretch in which one of its ops ran

    @property
    def label(self) -> str:
        return f"{self.kind}{self.micro_batch}"


@dataclass
class Bubble:
    """Each stage's busy and idle time in one traced pipeline step, beside the formula's.

    ``span_us`` runs from the first slot's start to the last slot's end (the pipeline itself;
    feeding the batch and applying the update sit outside it). A stage's idle share is
    ``1 - busy / span``, where busy is the time its forwards' and backwards' ops ran.
    """

    devices: list[str]
    layout: Layout  # the run's: its pipeline ways, micro-batches, schedule and chunks
    slots: list[Slot]
    span_us: float
    step_us: float
    peak_activation_bytes: list[int] = field(default_factory=list)

    @classmethod
    def from_trace(cls, trace, devices, layout: Layout, *, weight_ops=frozenset()) -> "Bubble":
        """Read a StepTrace of ``dtflab.train.strategies.pipeline``'s step on ``layout``;
        ``devices[d]`` is worker d, which runs stages d, d + p, ...; ``weight_ops`` names the
        ops that ran as ``W`` (the zero-bubble schedule's weight gradients)."""
        found: dict[tuple[int, str, int], list] = {}
        for device_timings in trace.timings.values():
            for timing in device_timings:
                match = _SCOPE.match(timing.name)
                if match and timing.kind == "compute":
                    kind = ("F" if match[2] == "forward" else
                            "W" if timing.name in weight_ops else "B")
                    found.setdefault((int(match[1]), kind, int(match[3])), []).append(timing)
        if not found:
            raise ValueError("this trace has no pipeline stages (no stage{s}/forward{j} ops); "
                             "trace a step of train.pipeline(..., trace_step=k)")
        slots = sorted((_slot(key, ops) for key, ops in found.items()), key=lambda x: x.start_us)
        start, end = min(s.start_us for s in slots), max(s.end_us for s in slots)
        peaks = activation_peaks(trace.metadata, devices) if trace.metadata is not None else []
        return cls(list(devices), layout, slots, end - start, trace.step_us, peaks)

    @property
    def stages(self) -> int:
        """The workers, p (each holds ``chunks`` stages of the model): the layout's."""
        return self.layout.pipeline

    def worker(self, slot: Slot) -> int:
        return slot.stage % self.stages

    def busy_us(self, worker: int) -> float:
        """The time any op of the worker's pieces ran (ops at once counted once)."""
        return _covered([i for s in self.slots if self.worker(s) == worker for i in s.busy])

    def arithmetic_us(self, worker: int) -> float:
        return sum(s.arithmetic_us for s in self.slots if self.worker(s) == worker)

    @property
    def idle_share(self) -> list[float]:
        """Per worker, the share of the span it ran none of its pieces of work."""
        return [1.0 - self.busy_us(s) / self.span_us for s in range(self.stages)]

    @property
    def mean_idle_share(self) -> float:
        return sum(self.idle_share) / self.stages

    @property
    def bubble_ratio(self) -> float:
        """The measured bubble as Megatron and the zero-bubble paper state it: each worker's
        idle time over its busy time, the mean over the workers."""
        return sum(share / (1 - share) for share in self.idle_share) / self.stages

    def piece_us(self, kind: str) -> float:
        """A worker's mean time for ``kind`` (``"F"``, ``"B"``, ``"W"``) of one micro-batch,
        all its chunks together: first op to last op of each piece, in µs."""
        took = [s.end_us - s.start_us for s in self.slots if s.kind == kind]
        return sum(took) / len(took) * self.layout.chunks if took else 0.0

    @property
    def formula_ratio(self) -> float:
        """The schedule's formula (:func:`dtflab.train.formulas.schedules.bubble_ratio`) with
        this step's mean forward, backward and weight-gradient times: ``(p - 1) / m``,
        ``(p - 1) / (v m)``, ZB-H1's ``(p - 1)(F + B - W) / (m (F + B + W))``."""
        weight, layout = self.piece_us("W"), self.layout
        return schedules.bubble_ratio(layout.schedule, self.stages, layout.micro_batches,
                                      layout.chunks, forward=self.piece_us("F"),
                                      backward=self.piece_us("B") + weight,
                                      weight=weight if layout.schedule == "zero_bubble" else None)

    @property
    def formula(self) -> float:
        """The idle share the schedule's formula predicts: ``(p - 1) / (m + p - 1)`` for GPipe
        and 1F1B, ``(p - 1) / (v m + p - 1)`` interleaved; in general ``r / (1 + r)`` of
        :attr:`formula_ratio` r."""
        if self.layout.schedule != "zero_bubble":
            return schedules.bubble_share(self.stages, self.layout.micro_batches,
                                          self.layout.chunks)
        return self.formula_ratio / (1 + self.formula_ratio)

    def timeline(self) -> list:
        """The schedule's timeline (:func:`dtflab.train.formulas.schedules.pipeline_timeline`)
        with this step's mean times per piece, in µs: what the chart draws as the formula's."""
        weight, layout = self.piece_us("W"), self.layout
        return schedules.pipeline_timeline(
            layout.schedule, self.stages, layout.micro_batches, chunks=layout.chunks,
            forward=self.piece_us("F") or 1.0, backward=(self.piece_us("B") + weight) or 2.0,
            weight=weight if layout.schedule == "zero_bubble" else None)

    def _model_covers(self) -> None:
        if self.layout.schedule not in ("gpipe", "1f1b"):
            raise ValueError(f"schedule={self.layout.schedule!r}: the step-time model covers "
                             f"the gpipe and 1f1b schedules; for this one read "
                             f"bubble.timeline() or trace a step at each setting")

    @property
    def stage_s(self) -> float:
        """The busiest stage's arithmetic for the whole batch, in seconds."""
        return max(self.arithmetic_us(s) for s in range(self.stages)) / 1e6

    @property
    def per_micro_batch_s(self) -> float:
        """What a stage pays per micro-batch beyond its arithmetic, in seconds: the mean time
        from one of its slots' end to its next slot's end, less that slot's arithmetic, over
        slots whose input was already there when the stage came free (the stage waited on
        nothing but itself), then for a forward and a backward together. This is measured
        on the timeline, not fitted to step times."""
        gaps = {"F": [], "B": []}
        for stage in range(self.stages):
            own = [s for s in self.slots if s.stage == stage]
            for before, slot in zip(own, own[1:]):
                ready = self._input_ready_us(slot)
                if ready <= before.end_us:
                    gaps[slot.kind].append(slot.end_us - before.end_us - slot.arithmetic_us)
        if not gaps["F"] or not gaps["B"]:  # m = 1: no slot waits on nothing but its stage
            return sum(s.busy_us - s.arithmetic_us for s in self.slots) / (
                self.stages * self.layout.micro_batches) / 1e6
        return (sum(gaps["F"]) / len(gaps["F"]) + sum(gaps["B"]) / len(gaps["B"])) / 1e6

    @property
    def overlap_s(self) -> float:
        """The weight-gradient multiplies of a stage after the first (mean over them), for the
        whole batch, in seconds: ``train.pipeline`` sends each input gradient back before them,
        so the stage before does not wait for them."""
        later = [sum(s.weight_gradient_us for s in self.slots if s.stage == stage)
                 for stage in range(1, self.stages)]
        return sum(later) / len(later) / 1e6 if later else 0.0

    @property
    def rest_s(self) -> float:
        """What the traced step spent outside the pipeline (feeding the batch, applying the
        update), in seconds."""
        return max(self.step_us - self.span_us, 0.0) / 1e6

    def predicted_step_s(self, micro_batches: int, arithmetic: dict | None = None) -> float:
        """The cost model's step time for ``micro_batches`` micro-batches, from this one traced
        step's parts (:class:`StepModel`; ``arithmetic`` as there). One step is one sample: on
        a busy machine read the parts from several, ``StepModel.median_of(bubbles)``."""
        return StepModel.median_of([self]).predicted_step_s(micro_batches, arithmetic)

    def _input_ready_us(self, slot: Slot) -> float:
        """When the slot's input was made: the previous stage's forward, the next stage's
        backward, the last stage's own forward (0 for the first stage's forwards: the batch is
        there from the start)."""
        other = slot.stage - 1 if slot.kind == "F" else slot.stage + 1
        for s in self.slots:
            if s.stage == other and s.kind == slot.kind and s.micro_batch == slot.micro_batch:
                return s.end_us
        if slot.kind == "B":  # the last stage: its own forward
            for s in self.slots:
                if s.stage == slot.stage and s.kind == "F" and s.micro_batch == slot.micro_batch:
                    return s.end_us
        return 0.0

    def summary(self) -> str:
        layout = self.layout
        stages = "; ".join(f"{'worker' if layout.chunks > 1 else 'stage'} {s}: busy "
                           f"{self.busy_us(s) / 1e3:.1f} ms, idle {share:.0%}"
                           for s, share in enumerate(self.idle_share))
        chunks = f", {layout.chunks} chunks a worker" if layout.chunks > 1 else ""
        text = (f"{self.stages} stages x {layout.micro_batches} micro-batches ({layout.schedule}"
                f"{chunks}): {stages} of a {self.span_us / 1e3:.1f} ms pipeline; formula: idle "
                f"{self.formula:.0%}")
        if self.peak_activation_bytes:
            text += "; peak activations " + ", ".join(
                f"{b / 2 ** 20:.1f} MiB" for b in self.peak_activation_bytes)
        return text

    def __repr__(self) -> str:
        return f"<Bubble {self.summary()}>"

    def figure(self, **options):
        """The pipeline chart: a row per stage, each slot where it ran, the bubble shaded,
        beside the formula's schedule for the same stages and micro-batches."""
        return importlib.import_module(VIEWS).pipeline_chart(self, **options)

    def show(self, **options) -> None:
        """The chart, inline in a notebook."""
        importlib.import_module(VIEWS).show_chart(self, **options)


def _slot(key, ops) -> Slot:
    """A slot spans its arithmetic (and a straggler's sleep): small ops that wait on nothing
    (reading a variable, a shape) may run long before the slot does, on a second inter-op
    thread."""
    work = [t for t in ops if ARITHMETIC.search(t.op) or "/straggler/" in t.name] or ops
    busy = union([(t.start_us, t.end_us) for t in ops])
    return Slot(*key, min(t.start_us for t in work), max(t.end_us for t in work),
                sum(b - a for a, b in busy),
                sum(t.duration_us for t in ops if ARITHMETIC.search(t.op)),
                sum(t.duration_us for t in ops if t.name.endswith("MatMul_grad/MatMul_1")),
                tuple(busy))


def _covered(intervals) -> float:
    return sum(b - a for a, b in union(intervals))


def activation_peaks(metadata, devices) -> list[int]:
    """Per device, the most bytes that forward ops' outputs held at once during the step:
    TensorFlow's allocator records (each op's allocations and frees, with their times), summed
    in time order. Variables, gradients and the optimizer's slots are not in it. A layer output
    sent to the next stage is held until the gRPC transport lets it go, which on a busy
    machine can be after the stage's own backward: it counts, as memory then in use."""
    records: dict[str, list[tuple[int, int]]] = {d: [] for d in devices}
    for dev in metadata.step_stats.dev_stats:
        device = _matching(dev.device, devices)
        if device is None:
            continue
        for stats in dev.node_stats:
            scope = _SCOPE.match(stats.node_name)
            if scope and scope[2] == "forward":
                for memory in stats.memory:
                    records[device] += [(r.alloc_micros, r.alloc_bytes)
                                        for r in memory.allocation_records]
    peaks = []
    for device in devices:
        live = peak = 0
        for _, change in sorted(records[device]):
            live += change
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def _matching(full: str, devices) -> str | None:
    """Which of ``devices`` (short ``/job:worker/task:1`` or full names) ``full`` is."""
    for device in devices:
        if names.task(device) == names.task(full):
            return device
    return None


@dataclass(frozen=True)
class StepModel:
    """The pipeline's step-time model (:func:`dtflab.train.formulas.costs.pipeline_step_s`)
    with its four parts read from traced steps: ``stage_s`` one stage's arithmetic for the
    whole batch at ``micro_batches``, ``per_micro_batch_s`` (c), ``overlap_s`` (w) and
    ``rest_s``. GPipe and 1F1B only, ``stages`` workers of one chunk.

    In [1]: model = StepModel.median_of([h.bubble for h in runs.values()], arithmetic)
    In [2]: model.predicted_step_s(8, arithmetic)

    Without ``arithmetic`` a stage's multiplies are assumed to cost the same per row at every
    micro-batch size. With it (``train.stage_arithmetic_s``: the stage's arithmetic for the
    whole batch at each m, measured alone) ``stage_s`` is scaled by
    ``arithmetic[m] / arithmetic[micro_batches]``, so the model follows a CPU on which a
    smaller micro-batch multiplies slower per row. The overlap stays as traced: the
    model takes the weight-gradient multiplies to cost the same at every m.
    """

    stages: int
    micro_batches: int
    stage_s: float
    per_micro_batch_s: float
    overlap_s: float
    rest_s: float
    steps: int = 1  # the traced steps the parts are read from

    @classmethod
    def median_of(cls, bubbles, arithmetic: dict | None = None) -> "StepModel":
        """Each part the median over ``bubbles`` (traced steps of one pipeline, any m): on a
        shared machine one step can run 20-40% slow, and a model read from it is as far off.

        Traced steps at different m need ``arithmetic`` with a figure for each: their stage
        times are scaled to the first step's m before the median. ``c`` is read from the steps
        with m > 1 where there are any (at m = 1 no slot waits on its stage alone)."""
        bubbles = list(bubbles)
        if not bubbles:
            raise ValueError("bubbles is empty; pass the history.bubble of at least one run "
                             "traced with trace_step=k")
        first = bubbles[0]
        for bubble in bubbles:
            bubble._model_covers()
            if bubble.stages != first.stages or bubble.layout.chunks != 1:
                raise ValueError(f"bubbles: a step of {bubble.stages} workers x "
                                 f"{bubble.layout.chunks} chunks beside one of {first.stages} x 1;"
                                 f" read one pipeline's steps, one chunk a worker")
        ms = sorted({b.layout.micro_batches for b in bubbles})
        if len(ms) > 1 and arithmetic is None:
            raise ValueError(f"bubbles: steps traced at m = {ms} need arithmetic= to scale their "
                             f"stage times to one m: train.stage_arithmetic_s(..., "
                             f"micro_batches={tuple(ms)})")
        if len(ms) > 1:
            _covers(arithmetic, ms)

        def stage(bubble):
            if bubble.layout.micro_batches == first.layout.micro_batches:
                return bubble.stage_s
            return (bubble.stage_s * arithmetic[first.layout.micro_batches]
                    / arithmetic[bubble.layout.micro_batches])

        several = [b for b in bubbles if b.layout.micro_batches > 1] or bubbles
        return cls(first.stages, first.layout.micro_batches,
                   statistics.median(stage(b) for b in bubbles),
                   statistics.median(b.per_micro_batch_s for b in several),
                   statistics.median(b.overlap_s for b in bubbles),
                   statistics.median(b.rest_s for b in bubbles), len(bubbles))

    def predicted_step_s(self, micro_batches: int, arithmetic: dict | None = None) -> float:
        """The step time for ``micro_batches`` micro-batches, in seconds."""
        scale = 1.0
        if arithmetic is not None:
            _covers(arithmetic, (micro_batches, self.micro_batches))
            scale = arithmetic[micro_batches] / arithmetic[self.micro_batches]
        return costs.pipeline_step_s(self.stages, micro_batches, self.stage_s * scale,
                                     self.per_micro_batch_s, self.rest_s, overlap_s=self.overlap_s)

    def best_micro_batches(self, choices=(1, 2, 4, 8, 16), arithmetic: dict | None = None) -> int:
        """The m among ``choices`` with the shortest predicted step."""
        return min(choices, key=lambda m: self.predicted_step_s(m, arithmetic))


def _covers(arithmetic, micro_batches) -> None:
    for m in sorted(micro_batches):
        if m not in arithmetic:
            raise ValueError(f"arithmetic has no figure for m = {m}; measure it: "
                             f"train.stage_arithmetic_s(..., micro_batches=(..., {m}))")
