"""Which layers go where: a pipeline's stages (contiguous ranges of an MLP's layers or a
transformer's blocks, balanced by work) and tensor parallelism's layer pairs (the first of each
split by columns, the second by rows). Layers and blocks are numbered from 1."""

from __future__ import annotations

import math


def tensor_parallel_pairs(depth: int) -> tuple[tuple[int, int], ...]:
    """The layer pairs ``train.tensor_parallel`` splits (1-based): ``(1, 2), (3, 4), ...`` from
    the input, the first of each by columns, the second by rows. An odd depth leaves the last
    layer (the output layer) whole: exp(x)'s 1-16-32-1 splits 1-16-32 and keeps 32-1 on one task."""
    return tuple((first, first + 1) for first in range(1, depth, 2))


def split_layers(problem, ways: int, available: int):
    """``(pairs, whole)``: the layer pairs to split and the layers left whole, if ``ways``
    splits every pair's hidden width; ``available`` worker tasks only shape the suggestion."""
    pairs = tensor_parallel_pairs(problem.depth)
    if not pairs:
        raise ValueError(f"{problem.name} has {problem.depth} layer: tensor parallelism splits "
                         f"layer pairs; use a model of two or more, e.g. train.classification()")
    common = math.gcd(*(problem.layers[first] for first, _ in pairs))
    for first, _ in pairs:
        width = problem.layers[first]
        if width % ways:
            fits = max(d for d in range(1, max(available, 1) + 1) if common % d == 0)
            raise ValueError(f"ways={ways}: layer {first}'s {width} outputs do not split into "
                             f"{ways} equal column slices; use ways={fits}, or a width "
                             f"divisible by {ways}, e.g. {width - width % ways or ways}")
    paired = {layer for pair in pairs for layer in pair}
    return pairs, tuple(layer for layer in range(1, problem.depth + 1) if layer not in paired)


def balanced_cut(problem, stages: int) -> tuple[int, ...]:
    """Where stages 2..p start (1-based layer or block numbers) so that each stage's
    multiply-adds (``problem.unit_work()`` summed over its layers or blocks) are as even as a
    contiguous cut allows."""
    work = problem.unit_work()
    depth = len(work)
    best = None
    # Exhaustive over contiguous cuts: a model here has at most a few dozen layers.
    for cut in _cuts(depth, stages):
        bounds = (0, *[c - 1 for c in cut], depth)
        heaviest = max(sum(work[a:b]) for a, b in zip(bounds, bounds[1:]))
        if best is None or heaviest < best[0]:
            best = (heaviest, cut)
    return best[1]


def _cuts(depth: int, stages: int, first: int = 2):
    if stages == 1:
        yield ()
        return
    for start in range(first, depth - stages + 3):
        for rest in _cuts(depth, stages - 1, start + 1):
            yield (start, *rest)


def layer_ranges(problem, stages: int, cut=None) -> tuple[tuple[int, int], ...]:
    """Each stage's ``(first, last)`` layer, from ``cut`` (where stages 2..p start) or balanced."""
    depth, unit = problem.depth, problem.unit
    if stages > depth:
        deeper = (f"train.transformer(blocks={stages})" if unit == "block"
                  else f"train.classification(hidden_layers={stages})")
        raise ValueError(f"stages={stages}: the model has {depth} {unit}s, so at most {depth} "
                         f"stages; use stages={depth} or a deeper model, e.g. {deeper}")
    if cut is None:
        cut = balanced_cut(problem, stages)
    else:
        given, cut = cut, tuple(cut) if isinstance(cut, (list, tuple)) else None
        valid = (cut is not None and len(cut) == stages - 1
                 and all(isinstance(c, int) and not isinstance(c, bool) for c in cut)
                 and list(cut) == sorted(set(cut)) and all(1 < c <= depth for c in cut))
        if not valid:
            raise ValueError(f"cut={given!r}: cut lists the first {unit} of each stage after the "
                             f"first, {stages - 1} increasing {unit} number(s) from 2 to {depth}; "
                             f"for example cut={list(balanced_cut(problem, stages))!r}")
    bounds = (1, *cut, depth + 1)
    return tuple((a, b - 1) for a, b in zip(bounds, bounds[1:]))
