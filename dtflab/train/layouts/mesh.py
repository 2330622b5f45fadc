"""A run's layout: how many ways each parallel form cuts it (data, tensor, pipeline, context),
which worker task holds which coordinates, and the groups that talk along each axis; the job
of Megatron's ``parallel_state``, picotron's ``process_group_manager`` and torchtitan's
``ParallelDims``.

Ranks are numbered as Megatron numbers them (its default order "tp-cp-dp-pp"): tensor fastest,
then context, then data, pipeline slowest, so a tensor group is neighbouring ranks (what
Megatron keeps inside a node) and a pipeline group strides across the whole mesh. Rank r runs
on ``worker:r``.

In [1]: layout = train.Layout(data=2, tensor=2, pipeline=2)
In [2]: layout.groups("data")      # [(0, 2), (1, 3), (4, 6), (5, 7)]
In [3]: layout.picture()           # the mesh: each task, each axis's links

The layout checks itself once: ways that are not whole numbers, more ways than the cluster
has worker tasks (:meth:`Layout.tasks`), ways the model does not divide into
(:meth:`Layout.fits`), each one line naming the value and the fix. It draws who talks to
whom; what they send is each strategy's and its formula's.
"""

from __future__ import annotations

import collections
import itertools
import math
from dataclasses import dataclass

from dtflab import checks

#: The axes, slowest-varying first: ``rank = ((p x D + d) x C + c) x T + t``.
AXES = ("pipeline", "data", "context", "tensor")
#: How each axis's group talks: a pipeline hands on to the next stage; context parallelism
#: passes keys and values around a ring; data and tensor parallelism reduce over the group
#: (every pair: dtflab's tensor sums are all-to-all, an all-reduce's ring is a subset).
PATTERNS = {"pipeline": "chain", "context": "ring", "data": "all pairs", "tensor": "all pairs"}
#: One colour per axis in the picture.
COLOURS = {"tensor": "#c44e52", "context": "#8172b2", "data": "#4c72b0", "pipeline": "#55a868"}


@dataclass(frozen=True)
class Layout:
    """The ways of each axis (see the module's docstring)."""

    data: int = 1
    tensor: int = 1
    pipeline: int = 1
    context: int = 1

    def __post_init__(self):
        for axis in AXES:
            checks.whole(getattr(self, axis), axis, example=2)

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
        """This layout, if ``problem`` splits its way: the batch into ``data`` slices, the heads
        (an MLP: each hidden width) into ``tensor`` groups, the blocks (layers) into
        ``pipeline`` stages, the sequence into ``context`` pieces."""
        batch = problem.batch_size
        if batch % self.data:
            raise ValueError(f"data={self.data}: the batch of {batch} does not split into "
                             f"{self.data} equal slices; use data={_divisor(batch, self.data)}, "
                             f"or a batch_size divisible by {self.data}")
        if problem.unit == "block":
            if problem.heads % self.tensor:
                raise ValueError(f"tensor={self.tensor}: {problem.name}'s {problem.heads} heads "
                                 f"do not split into {self.tensor} equal groups; use "
                                 f"tensor={_divisor(problem.heads, self.tensor)}, or heads "
                                 f"divisible by {self.tensor}")
            if problem.sequence % self.context:
                raise ValueError(f"context={self.context}: the sequence of {problem.sequence} "
                                 f"does not split into {self.context} equal pieces; use "
                                 f"context={_divisor(problem.sequence, self.context)}")
        else:
            widths = problem.layers[1:-1] or (1,)
            width = math.gcd(*widths)
            if width % self.tensor:
                raise ValueError(f"tensor={self.tensor}: {problem.name}'s hidden widths "
                                 f"{', '.join(map(str, widths))} do not split into "
                                 f"{self.tensor} equal slices; use "
                                 f"tensor={_divisor(width, self.tensor)}")
            if self.context > 1:
                raise ValueError(f"context={self.context}: an MLP has no sequence to cut; use "
                                 f"context=1, or a train.transformer()")
        if self.pipeline > problem.depth:
            raise ValueError(f"pipeline={self.pipeline}: {problem.name} has {problem.depth} "
                             f"{problem.unit}s, so at most {problem.depth} stages; use "
                             f"pipeline={problem.depth}")
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

    def _arguments(self) -> str:
        return ", ".join(f"{axis}={ways}" for axis, ways in self.ways.items() if ways > 1)

    # -- the picture ---------------------------------------------------------------------------

    def positions(self) -> dict[int, tuple[float, float]]:
        """Where the picture draws each rank: a block per pipeline stage, left to right; in it a
        row per data replica, top to bottom; along the row the context pieces, each holding
        its tensor ways side by side."""
        width = self.context * self.tensor
        placed = {}
        for rank in range(self.size):
            at = self.coordinates(rank)
            x = at["pipeline"] * (width + 1) + at["context"] * self.tensor + at["tensor"]
            placed[rank] = (float(x), -float(at["data"]))
        return placed

    def picture(self, *, width: int = 640, sent: dict | None = None):
        """The mesh as a Bokeh figure: a box per task with its coordinates, a line per pair
        that talks, coloured by axis (hover a box for its groups); with ``sent`` (see
        :meth:`link_bytes`), each link labelled with the bytes that crossed it."""
        from bokeh.models import ColumnDataSource, HoverTool
        from bokeh.plotting import figure

        placed = self.positions()
        xs = [x for x, _ in placed.values()]
        ys = [y for _, y in placed.values()]
        fig = figure(title=f"layout: {self}", width=width,
                     height=max(180, 90 * self.data + 80), tools="",
                     x_range=(min(xs) - 0.7, max(xs) + 0.7), y_range=(min(ys) - 0.8, 0.8))
        fig.axis.visible = False
        fig.grid.visible = False
        for axis in AXES:
            pairs = [(a, b) for a, b, along in self.links() if along == axis]
            if not pairs:
                continue
            bend = {"pipeline": 0.0, "data": 0.12, "context": -0.25, "tensor": 0.25}[axis]
            fig.segment([placed[a][0] for a, _ in pairs], [placed[a][1] + bend for a, _ in pairs],
                        [placed[b][0] for _, b in pairs], [placed[b][1] + bend for _, b in pairs],
                        line_color=COLOURS[axis], line_width=3, alpha=0.8,
                        legend_label=f"{axis} ({PATTERNS[axis]})", name=f"links_{axis}")
            if sent is not None:
                crossed = self.link_bytes(sent)
                fig.text([(placed[a][0] + placed[b][0]) / 2 for a, b in pairs],
                         [(placed[a][1] + placed[b][1]) / 2 + bend for a, b in pairs],
                         text=[_size(crossed.get((min(a, b), max(a, b)), 0)) for a, b in pairs],
                         text_color=COLOURS[axis], text_font_size="10px", text_align="center",
                         name=f"bytes_{axis}")
        source = ColumnDataSource({
            "x": xs, "y": ys, "task": [f"worker:{r}" for r in placed],
            "where": [", ".join(f"{a[0]}{i}" for a, i in self.coordinates(r).items()
                                if self.ways[a] > 1) or "-" for r in placed],
            "groups": ["; ".join(f"{a}: {list(self.group(a, r))}" for a in AXES
                                 if self.ways[a] > 1) or "alone" for r in placed]})
        boxes = fig.rect("x", "y", 0.8, 0.55, source=source, fill_color="white",
                         line_color="#333333", name="tasks")
        fig.text("x", "y", text="task", source=source, text_align="center",
                 text_baseline="bottom", text_font_size="11px")
        fig.text("x", "y", text="where", source=source, text_align="center",
                 text_baseline="top", text_font_size="10px", text_color="#555555")
        fig.add_tools(HoverTool(renderers=[boxes], tooltips=[("task", "@task"),
                                                             ("coordinates", "@where"),
                                                             ("groups", "@groups")]))
        if fig.legend:
            fig.legend.location = "top_left"
            fig.legend.orientation = "horizontal"
        return fig


def _size(count: int) -> str:
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def _divisor(total: int, asked: int) -> int:
    """The largest divisor of ``total`` not above ``asked``."""
    return max(d for d in range(1, asked + 1) if total % d == 0)
