"""Who holds which slice of which matrix: a model's layers as rectangles (inputs down, outputs
across), each piece coloured by the worker that holds it, as ``train.tensor_parallel`` or
``train.sharded_data_parallel`` would cut them for the same problem and worker count.

It is drawn from the functions the loops themselves call (``tensor_parallel.split_layers``,
``costs.shard_size``), not from a run: a drawing of the plan, like ``dtflab.viz.pictures``. A
shard of a flattened layer ends where its count of values ends, usually inside a row: the
drawing shows that row cut at the fraction where the shard ends. The zeros that pad a layer to
a multiple of N are not drawn.
"""

from __future__ import annotations

from dtflab.train.formulas import costs
from dtflab.viz.palette import PALETTE
from dtflab.viz.pictures import MARGIN, TITLE_H, Picture, _Drawing

STRATEGIES = ("tensor_parallel", "sharded")
SIZE = 120.0  # pixels for the widest layer
THIN, GAP, BIAS_H = 5.0, 34.0, 7.0


def slices_picture(problem, strategy: str = "tensor_parallel", ways: int = 2) -> Picture:
    """Each weight matrix of ``problem`` (and its bias, the bar under it), cut as ``strategy``
    cuts it over ``ways`` workers:

    - ``"tensor_parallel"`` (Megatron): layer pairs, the first matrix by columns, the second
      by rows; a layer left out of every pair, and each pair's second bias, on worker:0;
    - ``"sharded"`` (ZeRO-3 / FSDP): every layer's weights and bias as one flat vector, row
      after row, cut into ``ways`` equal shards.

    Under each worker's colour, the bytes of parameters it holds."""
    from dtflab import checks
    from dtflab.train.problems import needs_mlp

    needs_mlp(problem, "slices_picture")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: choose one of {', '.join(map(repr, STRATEGIES))}")
    checks.whole(ways, "ways", example=2)
    if strategy == "tensor_parallel":
        pieces, held = _tensor_parallel(problem, ways)
        title = f"{problem.name}, tensor parallel over {ways} workers: who holds which slice"
    else:
        pieces, held = _sharded(problem, ways)
        title = f"{problem.name}, sharded (ZeRO-3) over {ways} workers: who holds which shard"
    return _draw(problem, title, pieces, held, ways)


def _tensor_parallel(problem, ways: int):
    """``(pieces, held)``: ``pieces[layer]`` is a list of ``(worker, part, x0, x1, y0, y1)``
    in fractions of the matrix (``part`` "w" or "b"); ``held[worker]`` its bytes."""
    from dtflab.train.layouts.layers import split_layers

    pairs, whole = split_layers(problem, ways, ways)
    pieces, held = {}, [0] * ways
    for first, second in pairs:
        n_in, hidden, n_out = problem.layers[first - 1], problem.layers[first], problem.layers[second]
        cut = hidden // ways
        pieces[first], pieces[second] = [], []
        for j in range(ways):
            pieces[first] += [(j, "w", j / ways, (j + 1) / ways, 0.0, 1.0),
                              (j, "b", j / ways, (j + 1) / ways, 0.0, 1.0)]
            pieces[second].append((j, "w", 0.0, 1.0, j / ways, (j + 1) / ways))
            held[j] += 4 * (n_in * cut + cut + cut * n_out)
        pieces[second].append((0, "b", 0.0, 1.0, 0.0, 1.0))
        held[0] += 4 * n_out
    for layer in whole:
        pieces[layer] = [(0, "w", 0.0, 1.0, 0.0, 1.0), (0, "b", 0.0, 1.0, 0.0, 1.0)]
        held[0] += 4 * (problem.layers[layer - 1] + 1) * problem.layers[layer]
    return pieces, held


def _sharded(problem, ways: int):
    """As :func:`_tensor_parallel`, for ``train.sharded_data_parallel``'s flat shards."""
    pieces, held = {}, [0] * ways
    for layer in range(1, problem.depth + 1):
        rows, columns = problem.layers[layer - 1], problem.layers[layer]
        weights = rows * columns
        size = costs.shard_size(weights + columns, ways)
        pieces[layer] = []
        for j in range(ways):
            start, end = j * size, min((j + 1) * size, weights + columns)
            if start < weights:  # rows start / columns .. end / columns, cut inside a row
                pieces[layer].append((j, "w", 0.0, 1.0, start / weights, min(end, weights) / weights))
            if end > weights:
                pieces[layer].append((j, "b", max(start - weights, 0) / columns,
                                      (end - weights) / columns, 0.0, 1.0))
            held[j] += 4 * size
    return pieces, held


def _draw(problem, title, pieces, held, ways) -> Picture:
    drawing = _Drawing(title)
    scale = SIZE / max(problem.layers)
    x, top = MARGIN, TITLE_H + 24
    bottom = top + max(max(THIN, n * scale) for n in problem.layers[:-1])
    for layer in range(1, problem.depth + 1):
        rows, columns = problem.layers[layer - 1], problem.layers[layer]
        width, height = max(THIN, columns * scale), max(THIN, rows * scale)
        drawing.text(x, top - 8, f"layer {layer}", size=11, weight="bold")
        for worker, part, x0, x1, y0, y1 in pieces[layer]:
            color = PALETTE[worker % len(PALETTE)]
            if part == "w":
                drawing.rect(x + x0 * width, top + y0 * height, (x1 - x0) * width,
                             (y1 - y0) * height, color, opacity=0.75, stroke="white", rx=0)
            else:
                drawing.rect(x + x0 * width, bottom + 6, (x1 - x0) * width, BIAS_H, color,
                             opacity=0.75, stroke="white", rx=0)
        drawing.text(x, bottom + 28, f"w{layer} {rows}x{columns}", size=10)
        drawing.text(x, bottom + 41, f"b{layer} {columns}", size=10, color="#555")
        x += max(width, 70.0) + GAP
    y = bottom + 62
    for worker in range(ways):
        color = PALETTE[worker % len(PALETTE)]
        drawing.rect(MARGIN, y - 10, 12, 12, color, opacity=0.75, rx=2)
        drawing.text(MARGIN + 18, y, f"worker:{worker} holds {held[worker]:,} B of parameters",
                     size=11)
        y += 18
    drawing.width = max(x - GAP + MARGIN, 12 + 7.0 * len(title))
    drawing.height = y + MARGIN - 6
    return drawing.picture()
