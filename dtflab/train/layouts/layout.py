"""A run's layout: how many ways each parallel form cuts it (data, tensor, pipeline, context,
and the experts over some of the data ways) and how each step runs on them (micro-batches, the
pipeline's schedule and chunks, the ZeRO stage, recomputation, precision, sequence
parallelism); which worker task holds which coordinates, and the groups that talk along each
axis. The job of Megatron's ``parallel_state``, picotron's ``process_group_manager`` and
torchtitan's ``ParallelDims``: one object, checked once, handed to every loop and read by the
planner.

Ranks are numbered as Megatron numbers them (its default order "tp-cp-dp-pp"): tensor fastest,
then context, then data, pipeline slowest, so a tensor group is neighbouring ranks (what
Megatron keeps inside a node) and a pipeline group strides across the whole mesh. Rank r runs
on ``worker:r``. The expert ways are not an axis of their own: the experts are spread over
``expert`` of the data ways (each data replica also holds some experts, as in DeepSpeed-MoE).

In [1]: layout = train.Layout(data=2, tensor=2, pipeline=2, micro_batches=4)
In [2]: layout.groups("data")      # [(0, 2), (1, 3), (4, 6), (5, 7)]
In [3]: layout.picture()           # the mesh: each task, each axis's links

Every rule is here, once, each broken one a line naming the value and the fix: in
``__post_init__`` what a layout must be on its own (whole ways, a known schedule, chunks with
the interleaved schedule, sequence parallelism with tensor ways, ...), in :meth:`Layout.fits`
what a model must divide into, in :meth:`Layout.tasks` what a cluster must have. It draws who
talks to whom; what they send is each strategy's and its formula's.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib
import itertools
import math
import re
from dataclasses import dataclass

from dtflab import checks

#: The module that draws a layout, reached by name (the layout never imports its views).
VIEWS = "dtflab.viz.layout"
#: The axes, slowest-varying first: ``rank = ((p x D + d) x C + c) x T + t``.
AXES = ("pipeline", "data", "context", "tensor")
#: How each axis's group talks: a pipeline hands on to the next stage; context parallelism
#: passes keys and values around a ring; data and tensor parallelism reduce over the group
#: (every pair: dtflab's tensor sums are all-to-all, an all-reduce's ring is a subset).
PATTERNS = {"pipeline": "chain", "context": "ring", "data": "all pairs", "tensor": "all pairs"}
#: The pipeline's schedules (:mod:`dtflab.train.formulas.schedules`).
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero_bubble")
#: What the backward recomputes instead of keeping: nothing, the attention's softmax and what
#: feeds it (Korthikanti et al.'s selective), or each block from its input (full).
RECOMPUTE = ("none", "selective", "full")
#: The compute types; the master weights and Adam's state stay float32.
PRECISIONS = ("float32", "bfloat16", "float16")
#: ZeRO's stages over the data ways: 1 Adam's state sharded, 2 and the gradients, 3 and the
#: parameters (0: none).
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class Layout:
    """The ways of each axis and how a step runs on them (see the module's docstring)."""

    data: int = 1
    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    expert: int = 1
    micro_batches: int = 1
    schedule: str = "1f1b"
    chunks: int = 1
    zero: int = 0
    recompute: str = "none"
    precision: str = "float32"
    sequence_parallel: bool = False

    def __post_init__(self):
        for name in (*AXES, "expert", "micro_batches", "chunks"):
            checks.whole(getattr(self, name), name, example=2)
        checks.one_of(self.schedule, "schedule", SCHEDULES)
        checks.one_of(self.recompute, "recompute", RECOMPUTE)
        checks.one_of(self.precision, "precision", PRECISIONS)
        if self.zero not in ZERO_STAGES or isinstance(self.zero, bool):
            raise ValueError(f"zero={self.zero!r}: ZeRO's stage must be one of 0, 1, 2, 3 "
                             f"(1: Adam's state sharded; 2: and the gradients; 3: and the "
                             f"parameters); for example zero=1")
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"sequence_parallel={self.sequence_parallel!r}: True or False")
        if self.data % self.expert:
            raise ValueError(f"expert={self.expert}: the experts are spread over some of the "
                             f"data ways, and data={self.data} does not divide by it; use "
                             f"expert={_divisor(self.data, self.expert)}, or data={self.expert}")
        if self.sequence_parallel and self.tensor == 1:
            raise ValueError("sequence_parallel=True: it cuts what tensor parallelism leaves "
                             "whole; use tensor=2 or more, or sequence_parallel=False")
        if self.schedule == "interleaved":
            if self.chunks < 2:
                raise ValueError(f"chunks={self.chunks}: the interleaved schedule gives each "
                                 f"worker several chunks of the model; use chunks=2 or more")
            if self.micro_batches % self.pipeline:
                fits = max(self.micro_batches - self.micro_batches % self.pipeline, self.pipeline)
                raise ValueError(f"micro_batches={self.micro_batches}: the interleaved schedule "
                                 f"sends micro-batches in groups of {self.pipeline} (one per "
                                 f"worker); use a multiple of {self.pipeline}, e.g. "
                                 f"micro_batches={fits}")
        elif self.chunks != 1:
            raise ValueError(f"chunks={self.chunks}: only the interleaved schedule gives a worker "
                             f"several chunks; use schedule='interleaved' or chunks=1")

    @classmethod
    def given(cls, layout: "Layout | None", loop: str, defaults: dict, **shorthand) -> "Layout":
        """A loop's layout: ``layout`` as passed, or one built from the loop's shorthand
        keywords (``stages=2`` is ``pipeline=2``), each left as None taking ``defaults``'s
        value. Both at once is refused: which would win is not clear."""
        given = {name: value for name, value in shorthand.items() if value is not None}
        if layout is None:
            return cls(**{**defaults, **given})
        if not isinstance(layout, cls):
            raise ValueError(f"layout={layout!r}: {loop} takes a train.Layout, e.g. "
                             f"layout=train.Layout({_example(defaults)})")
        if given:
            name = next(iter(given))
            raise ValueError(f"{name}= and layout= both given to {loop}: say each way once, "
                             f"in the layout or as keywords alone")
        return layout

    @property
    def ways(self) -> dict[str, int]:
        """Each axis's ways, slowest-varying first."""
        return {axis: getattr(self, axis) for axis in AXES}

    @property
    def size(self) -> int:
        """How many tasks the layout needs: the product of the ways."""
        return math.prod(self.ways.values())

    def __str__(self) -> str:
        cut = " x ".join(f"{axis} {ways}" for axis, ways in self.ways.items() if ways > 1)
        return f"{cut or 'one task'} = {self.size} task{'s' if self.size > 1 else ''}"

    # -- ranks and coordinates -----------------------------------------------------------------

    def coordinates(self, rank: int) -> dict[str, int]:
        """Rank ``rank``'s index along each axis."""
        checks.whole(rank, "rank", minimum=0, maximum=self.size - 1, example=0)
        found = {}
        for axis in reversed(AXES):  # the fastest axis is the remainder
            rank, found[axis] = divmod(rank, getattr(self, axis))
        return {axis: found[axis] for axis in AXES}

    def rank(self, **coordinates: int) -> int:
        """The rank at ``coordinates`` (an axis left out is 0)."""
        unknown = set(coordinates) - set(AXES)
        if unknown:
            raise ValueError(f"{sorted(unknown)[0]}=: a layout's axes are {', '.join(AXES)}")
        rank = 0
        for axis in AXES:
            index = coordinates.get(axis, 0)
            checks.whole(index, axis, minimum=0, maximum=getattr(self, axis) - 1, example=0)
            rank = rank * getattr(self, axis) + index
        return rank

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """The ranks that talk along ``axis``: those that differ in it alone, each group in the
        axis's order, the groups by their first rank."""
        checks.one_of(axis, "axis", AXES)
        others = [a for a in AXES if a != axis]
        found = []
        for fixed in itertools.product(*(range(getattr(self, a)) for a in others)):
            at = dict(zip(others, fixed))
            found.append(tuple(self.rank(**at, **{axis: i}) for i in range(getattr(self, axis))))
        return sorted(found)

    def group(self, axis: str, rank: int) -> tuple[int, ...]:
        """The group of ``rank`` along ``axis``."""
        return next(g for g in self.groups(axis) if rank in g)

    def links(self) -> list[tuple[int, int, str]]:
        """``(rank, rank, axis)`` for every pair that talks (``PATTERNS``)."""
        found = []
        for axis in AXES:
            for group in self.groups(axis):
                if len(group) < 2:
                    continue
                if PATTERNS[axis] == "chain":
                    pairs = zip(group, group[1:])
                elif PATTERNS[axis] == "ring":
                    pairs = zip(group, group[1:] + group[:1]) if len(group) > 2 else [group]
                else:
                    pairs = itertools.combinations(group, 2)
                found += [(a, b, axis) for a, b in pairs]
        return found

    def axis_of(self, a: int, b: int) -> str | None:
        """The axis along which ranks ``a`` and ``b`` talk: the one coordinate they differ in,
        or None (the same rank, or more than one)."""
        at, bt = self.coordinates(a), self.coordinates(b)
        differ = [axis for axis in AXES if at[axis] != bt[axis]]
        return differ[0] if len(differ) == 1 else None

    def link_bytes(self, sent: dict) -> dict[tuple[int, int], int]:
        """``sent`` (``{(source, destination): bytes}`` by task or device name, as
        ``WireBytes`` or a traced step's ``bytes_between`` count) added up per pair of ranks,
        both ways, the lower rank first; peers outside the layout are left out."""
        from dtflab import names

        ranks = {f"worker:{r}": r for r in range(self.size)}
        found = collections.Counter()
        for (source, destination), count in sent.items():
            try:
                a, b = (ranks.get(names.task(end)) for end in (source, destination))
            except (ValueError, AttributeError):
                continue
            if a is not None and b is not None and a != b:
                found[min(a, b), max(a, b)] += count
        return dict(found)

    def axis_bytes(self, sent: dict) -> dict[str, int]:
        """``sent`` added up per axis (see :meth:`link_bytes`); ``"other"`` holds what
        crossed between ranks that differ in more than one coordinate."""
        found = dict.fromkeys((*AXES, "other"), 0)
        for (a, b), count in self.link_bytes(sent).items():
            found[self.axis_of(a, b) or "other"] += count
        return found

    # -- against a cluster and a model ---------------------------------------------------------

    def tasks(self, cluster) -> list[str]:
        """The worker device of each rank, if the cluster has enough worker tasks."""
        from dtflab import names

        checks.cluster(cluster)
        available = len(cluster.addresses.get("worker", []))
        if self.size > available:
            raise ValueError(f"Layout({self._arguments()}) needs {self.size} worker tasks "
                             f"({self}) and this cluster has {available}; start them with "
                             f"dtflab.start_cluster(workers={self.size}), or use fewer ways")
        return [names.device(f"worker:{rank}") for rank in range(self.size)]

    def fits(self, problem) -> "Layout":
        """This layout, if ``problem`` splits its way: the batch into ``data`` slices of
        ``micro_batches`` micro-batches each, the heads (an MLP: each hidden width) into
        ``tensor`` groups, the blocks (layers) into ``pipeline x chunks`` stages, the sequence
        into ``context`` pieces, the experts over ``expert`` ways."""
        experts = getattr(problem, "experts", 0) or 0
        if self.expert > 1 and not experts:
            raise ValueError(f"expert={self.expert}: {problem.name} has no experts to spread; use "
                             f"expert=1, or a train.transformer(experts=4)")
        if self.expert > 1 and experts % self.expert:
            raise ValueError(f"expert={self.expert}: {problem.name}'s {experts} experts do not "
                             f"split evenly over {self.expert} ways; use "
                             f"expert={_divisor(experts, self.expert)}")
        batch = problem.batch_size
        if batch % self.data:
            raise ValueError(f"data={self.data}: the batch of {batch} does not split into "
                             f"{self.data} equal slices; use data={_divisor(batch, self.data)}, "
                             f"or a batch_size divisible by {self.data}")
        replica = batch // self.data
        if replica % self.micro_batches:
            raise ValueError(f"micro_batches={self.micro_batches}: "
                             + (f"a replica's {replica} of the batch of {batch}" if self.data > 1
                                else f"the batch of {batch}")
                             + f" does not split into {self.micro_batches} equal micro-batches; "
                             f"use micro_batches={_divisor(replica, self.micro_batches)}, or a "
                             f"batch_size divisible by {self.data * self.micro_batches}")
        if problem.unit == "block":
            if problem.heads % self.tensor:
                raise ValueError(f"tensor={self.tensor}: {problem.name}'s {problem.heads} heads "
                                 f"do not split into {self.tensor} equal groups; use "
                                 f"tensor={_divisor(problem.heads, self.tensor)}, or heads "
                                 f"divisible by {self.tensor}")
            kv = getattr(problem, "kv_heads", None) or problem.heads
            if kv % self.tensor and self.tensor % kv:
                fits = sorted({_divisor(kv, self.tensor), kv})
                raise ValueError(f"tensor={self.tensor}: {problem.name}'s {kv} key/value heads "
                                 f"neither split over {self.tensor} ways nor copy evenly onto "
                                 f"them; use tensor={' or '.join(map(str, fits))} (a divisor or "
                                 f"a multiple of kv_heads)")
            hidden = getattr(problem, "hidden", None) or 4 * problem.d_model
            if hidden % self.tensor:
                raise ValueError(f"tensor={self.tensor}: {problem.name}'s MLP of {hidden} hidden "
                                 f"units does not split into {self.tensor} equal slices; use "
                                 f"tensor={_divisor(math.gcd(hidden, problem.heads), self.tensor)}"
                                 f", or "
                                 f"train.transformer(hidden={self.tensor * -(-hidden // self.tensor)})")
            if problem.sequence % self.context:
                raise ValueError(f"context={self.context}: the sequence of {problem.sequence} "
                                 f"does not split into {self.context} equal pieces; use "
                                 f"context={_divisor(problem.sequence, self.context)}")
            piece = problem.sequence // self.context
            if self.sequence_parallel and piece % self.tensor:
                fits = self.tensor * -(-problem.sequence // self.tensor)
                raise ValueError(f"tensor={self.tensor}: {problem.name}'s sequence of "
                                 f"{problem.sequence} does not cut into {self.tensor} equal "
                                 f"pieces; use a sequence divisible by {self.tensor}, e.g. "
                                 f"train.transformer(sequence={fits}, ...)")
        else:
            widths = problem.layers[1:-1] or (1,)
            width = math.gcd(*widths)
            if width % self.tensor:
                raise ValueError(f"tensor={self.tensor}: {problem.name}'s hidden widths "
                                 f"{', '.join(map(str, widths))} do not split into "
                                 f"{self.tensor} equal slices; use "
                                 f"tensor={_divisor(width, self.tensor)}")
            if self.context > 1 or self.sequence_parallel:
                name = f"context={self.context}" if self.context > 1 else "sequence_parallel=True"
                raise ValueError(f"{name}: {problem.name} has no sequence; it cuts a "
                                 f"transformer's, e.g. train.transformer()")
        for choice, default in (("precision", "float32"), ("recompute", "none")):
            mine, model = getattr(self, choice), getattr(problem, choice, default)
            if mine != default and mine != model:  # the default: as the model computes
                if mine == "selective" and getattr(problem, "attention_block", 0):
                    raise ValueError(f"recompute='selective': {problem.name} uses fused "
                                     f"attention, which keeps no scores to recompute; leave "
                                     f"recompute out of the layout, or use recompute='full'")
                raise ValueError(f"{choice}={mine!r}: {problem.name} computes with {choice}="
                                 f"{model!r}; build it with train.transformer({choice}={mine!r}),"
                                 f" or leave {choice} out of the layout")
        depth, unit = problem.depth, problem.unit
        if self.pipeline * self.chunks > depth and self.chunks > 1:
            fits = max(c for c in range(1, self.chunks + 1) if self.pipeline * c <= depth)
            raise ValueError(f"chunks={self.chunks}: {self.pipeline} workers x {self.chunks} "
                             f"chunks are {self.pipeline * self.chunks} stages, and "
                             f"{problem.name} has {depth} {unit}s; use chunks={fits} or a "
                             f"deeper model")
        if self.pipeline > depth:
            deeper = (f"train.transformer(blocks={self.pipeline})" if unit == "block"
                      else f"train.classification(hidden_layers={self.pipeline})")
            raise ValueError(f"pipeline={self.pipeline}: {problem.name} has {depth} {unit}s, so "
                             f"at most {depth} stages; use pipeline={depth} or a deeper model, "
                             f"e.g. {deeper}")
        return self

    def alone(self, axis: str, loop: str) -> int:
        """The ways of ``axis``, if it is the only axis cut: a loop that runs one form
        (``loop``) takes such a layout."""
        checks.one_of(axis, "axis", AXES)
        others = [a for a in AXES if a != axis and getattr(self, a) > 1]
        if others:
            raise ValueError(f"Layout({self._arguments()}): {loop} cuts the {axis} axis alone; "
                             f"use train.combined for {' x '.join((*others, axis))}, or "
                             f"train.Layout({axis}={getattr(self, axis)})")
        return getattr(self, axis)

    def without(self, loop: str, **reasons: str) -> "Layout":
        """This layout, if each field named in ``reasons`` is at its default
        (:func:`dtflab.checks.at_defaults`)."""
        return checks.at_defaults(self, loop, **reasons)

    def _arguments(self) -> str:
        """The fields that differ from the defaults, as ``train.Layout(...)`` takes them."""
        fields = {field.name: field.default for field in dataclasses.fields(self)}
        order = [*AXES, *(name for name in fields if name not in AXES)]  # the ways' order
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in order
                         if getattr(self, name) != fields[name])

    def picture(self, *, width: int = 640, sent: dict | None = None):
        """The mesh as a Bokeh figure (:func:`dtflab.viz.layout.picture`: a box per task, a line
        per pair that talks, coloured by axis; with ``sent``, each link's bytes). A view, reached
        by name so the layout never imports its views."""
        return importlib.import_module(VIEWS).picture(self, width=width, sent=sent)


@contextlib.contextmanager
def said_as(layout_given: bool, **spelling: str):
    """Inside, a refused layout names a field as the loop's shorthand keyword the user typed
    (``said_as(False, pipeline="stages")``: "stages=3: ..."), unless a layout was given."""
    try:
        yield
    except ValueError as error:
        text = str(error)
        if layout_given and "both given" not in text:
            raise
        for name, word in spelling.items():
            text = re.sub(rf"\b{name}=", f"{word}=", text)
        raise ValueError(text) from None


def _example(defaults: dict) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in defaults.items()) or "data=2"


def _divisor(total: int, asked: int) -> int:
    """The largest divisor of ``total`` not above ``asked``."""
    return max(d for d in range(1, asked + 1) if total % d == 0)
