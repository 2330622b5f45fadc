"""The idea of a tutorial in one picture, drawn from the real cluster, plan or problem.

Two kinds: *boxes and arrows* (tasks as boxes in columns, what crosses between them as labelled
arrows) and *lanes* (what each task does over time, step by step). Both are inline SVG: no
JavaScript, so they show in any notebook viewer, on GitHub and in an exported page. They are
drawings, not measurements: the bytes they print come from variable shapes, and the
schedules from a simulation of the rule they illustrate.
"""

from __future__ import annotations

import html
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

from dtflab import checks
from dtflab.viz.palette import PALETTE

BOX_W, LINE_H, GAP_X, GAP_Y, MARGIN, TITLE_H = 190, 15, 150, 14, 12, 28
TRANSFER = "#d62728"  # red means transfer, as in every other view of a step


@dataclass(frozen=True)
class Picture:
    """An SVG drawing; a notebook shows it inline."""

    svg: str

    def _repr_svg_(self) -> str:
        return self.svg

    def texts(self) -> list[str]:
        """Every piece of text in the drawing, top to bottom as written."""
        root = ElementTree.fromstring(self.svg)
        return ["".join(node.itertext()) for node in root.iter("{http://www.w3.org/2000/svg}text")]


@dataclass
class _Box:
    key: str
    lines: list[str]
    color: str
    x: float = 0.0
    y: float = 0.0

    @property
    def height(self) -> float:
        return 10 + LINE_H * len(self.lines)


@dataclass
class _Drawing:
    title: str
    width: float = 0.0
    height: float = 0.0
    parts: list[str] = field(default_factory=list)
    heads: set[str] = field(default_factory=set)  # the arrows' colours, one arrowhead each

    def text(self, x, y, words, *, size=11, color="#222", anchor="start", weight="normal") -> None:
        self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{color}" '
                          f'text-anchor="{anchor}" font-weight="{weight}" '
                          f'font-family="sans-serif">{html.escape(words)}</text>')

    def rect(self, x, y, w, h, fill, *, stroke="none", opacity=1.0, rx=4) -> None:
        self.parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{rx}" '
                          f'fill="{fill}" fill-opacity="{opacity}" stroke="{stroke}"/>')

    def arrow(self, x0, y0, x1, y1, color, label="", above=True, near_end=False) -> None:
        self.heads.add(color)
        self.parts.append(f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" '
                          f'stroke="{color}" stroke-width="1.6" marker-end="url(#head-{color[1:]})"/>')
        if label:  # written from one end along the gap, above or below the line
            (xa, ya), (xb, yb) = ((x1, y1), (x0, y0)) if near_end else ((x0, y0), (x1, y1))
            toward = 1 if xb > xa else -1
            x = xa + toward * 12
            y = ya + (yb - ya) * 12 / max(1.0, abs(xb - xa)) + (-5 if above else 12)
            self.text(x, y, label, size=10, color=color, anchor="start" if toward > 0 else "end")

    def picture(self) -> Picture:
        heads = "".join(f'<marker id="head-{c[1:]}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
                        f'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{c}"/></marker>'
                        for c in sorted(self.heads))
        title = (f'<text x="{MARGIN}" y="18" font-size="13" font-weight="bold" fill="#222" '
                 f'font-family="sans-serif">{html.escape(self.title)}</text>')
        return Picture(f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width:.0f}" '
                       f'height="{self.height:.0f}" viewBox="0 0 {self.width:.0f} {self.height:.0f}">'
                       f'<defs>{heads}</defs>{title}{"".join(self.parts)}</svg>')


def boxes_and_arrows(title: str, columns: list[list[_Box]], arrows: list[tuple[str, str, str, bool]]) -> Picture:
    """Columns of boxes, left to right; ``arrows`` are ``(from key, to key, label, tensors)``,
    red where tensors cross. Two arrows between the same boxes run side by side."""
    drawing = _Drawing(title)
    tallest = max(sum(box.height for box in column) + GAP_Y * (len(column) - 1) for column in columns)
    for i, column in enumerate(columns):
        used = sum(box.height for box in column) + GAP_Y * (len(column) - 1)
        y = TITLE_H + (tallest - used) / 2
        for box in column:
            box.x, box.y = MARGIN + i * (BOX_W + GAP_X), y
            y += box.height + GAP_Y
    boxes = {box.key: box for column in columns for box in column}
    for box in boxes.values():
        drawing.rect(box.x, box.y, BOX_W, box.height, box.color, opacity=0.15, stroke=box.color)
        for j, line in enumerate(box.lines):
            drawing.text(box.x + 8, box.y + 18 + j * LINE_H, line, weight="bold" if j == 0 else "normal",
                         size=12 if j == 0 else 10.5)
    arrivals = {key: sum(key in (a, b) for a, b, *_ in arrows) for key in boxes}
    for a, b, label, tensors in arrows:
        start, end = boxes[a], boxes[b]
        both_ways = any(x == b and y == a for x, y, *_ in arrows)
        shift = (-7 if start.x < end.x else 7) if both_ways else 0
        left, right = (start, end) if start.x < end.x else (end, start)
        y0 = start.y + start.height / 2 + shift
        y1 = end.y + end.height / 2 + shift
        x0, x1 = (left.x + BOX_W + 2, right.x - 2)
        if start is right:
            x0, x1 = x1, x0
        # the label goes near the end whose box has fewer arrows: there the arrows are apart
        drawing.arrow(x0, y0, x1, y1, TRANSFER if tensors else "#555555", label,
                      above=start.x < end.x or not both_ways, near_end=arrivals[b] < arrivals[a])
    drawing.width = MARGIN * 2 + len(columns) * BOX_W + (len(columns) - 1) * GAP_X
    drawing.height = TITLE_H + tallest + MARGIN
    return drawing.picture()


def _shape(shape) -> str:
    return "x".join(map(str, shape))


def cluster_picture(cluster, client: str = "this kernel", role: str = "the client",
                    say: str = "gRPC") -> Picture:
    """The kernel and every task of ``cluster``: name, address, process (and the Dask worker
    hosting it, if any)."""
    tasks = cluster.tasks
    jobs = list(dict.fromkeys(t.job for t in tasks))
    columns = [[_Box("client", [client, role], PALETTE[3])], []]
    for task in tasks:
        where = [f"pid {task.pid}" if task.pid else "in this process"] + ([task.host] if task.host else [])
        columns[1].append(_Box(task.name, [task.name, task.address, *where],
                               PALETTE[jobs.index(task.job) % len(PALETTE)]))
    arrows = [("client", t.name, say if i == 0 else "", False) for i, t in enumerate(tasks)]
    return boxes_and_arrows(f"{len(tasks)} tasks in {len(jobs)} job(s), started by dtflab", columns, arrows)


def placement_picture(plan, problem) -> Picture:
    """Where ``plan`` puts each of ``problem``'s variables, and the bytes that cross per step:
    every variable is read by the compute task and its gradient sent back."""
    from dtflab.names import short
    from dtflab.placement.plan import VariableInfo

    infos = [VariableInfo(name, value.shape, value.dtype.name, value.nbytes)
             for name, value in problem.initial_values()]
    where = plan.placement(infos)
    totals = plan.bytes_per_device(infos)
    holders = [d for d, n in totals.items() if n and d != plan.compute]
    columns = [[], [_Box("compute", [short(plan.compute), "every matmul, activation,", "the loss, the gradients"],
                         PALETTE[3])]]
    arrows = []
    for i, device in enumerate(holders):
        held = [f"{v.name} {_shape(v.shape)}: {v.nbytes:,} B" for v in infos if where[v.name] == device]
        columns[0].append(_Box(device, [short(device), *held], PALETTE[i % len(PALETTE)]))
        arrows += [(device, "compute", f"parameters {totals[device]:,} B", True),
                   ("compute", device, f"gradients {totals[device]:,} B", True)]
    return boxes_and_arrows(f"{problem.name}: what crosses in one step", columns, arrows)


def pipeline_picture(problem, cluster, stages: int = 2, micro_batches: int = 4,
                     cut=None) -> Picture:
    """Pipeline parallelism: which worker task holds which layers (as ``train.pipeline`` would
    cut them), and what crosses between neighbouring stages for each micro-batch: activations
    forward, their gradients back."""
    from dtflab.train.layouts.layers import layer_ranges
    from dtflab.train.problems import needs_mlp

    needs_mlp(problem, "pipeline_picture")
    checks.cluster(cluster)
    checks.whole(micro_batches, "micro_batches", example=4)
    ranges = layer_ranges(problem, stages, cut)
    workers = cluster.addresses.get("worker", [])
    size = problem.batch_size // micro_batches
    columns, arrows = [], []
    for s, (first, last) in enumerate(ranges):
        where = f"worker:{s}" + (f" ({workers[s]})" if s < len(workers) else "")
        held = problem.layer_bytes(first, last)
        layers = f"layer {first}" if first == last else f"layers {first}-{last}"
        columns.append([_Box(f"stage{s}", [f"stage {s}", where, f"{layers}: {held:,} B",
                                           f"{micro_batches} micro-batches of {size}"],
                             PALETTE[s % len(PALETTE)])])
        if s:
            crossing = 4 * size * problem.layers[first - 1]
            arrows += [(f"stage{s - 1}", f"stage{s}", f"activations {crossing:,} B", True),
                       (f"stage{s}", f"stage{s - 1}", f"their gradients {crossing:,} B", True)]
    return boxes_and_arrows(f"{problem.name} in {stages} stages: what crosses per micro-batch",
                            columns, arrows)


def towers_picture(problem, workers: int = 2) -> Picture:
    """Synchronous data parallelism: one ps holds the variables; each worker a full copy of the
    model (a tower) for its slice of the batch."""
    checks.whole(workers, "workers", example=2)
    model = problem.parameter_bytes
    size = problem.batch_size // workers
    ps = _Box("ps:0", ["ps:0", f"the variables ({model:,} B)", "sums the towers' gradients,",
                       "applies them once"], PALETTE[3])
    towers = [_Box(f"worker:{i}", [f"worker:{i}", "a full copy of the model",
                                   f"examples {i * size}-{(i + 1) * size - 1} of each batch"], PALETTE[0])
              for i in range(workers)]
    arrows = []
    for i, tower in enumerate(towers):
        arrows += [("ps:0", tower.key, f"parameters {model:,} B" if i == 0 else "", True),
                   (tower.key, "ps:0", f"gradients {model:,} B" if i == 0 else "", True)]
    return boxes_and_arrows(f"{workers} towers, one update per step (batch {problem.batch_size})",
                            [[ps], towers], arrows)


def coordinator_picture(cluster) -> Picture:
    """TF2's ParameterServerStrategy: the kernel (the chief) schedules steps onto workers; the
    variables sit round robin on the ps tasks."""
    tasks = cluster.tasks
    workers = [_Box(t.name, [t.name, "runs the steps it is sent"], PALETTE[0]) for t in tasks if t.job == "worker"]
    ps_tasks = [t for t in tasks if t.job == "ps"]
    ps = [_Box(t.name, [t.name, f"variables {t.index}, {t.index + len(ps_tasks)}, ..."], PALETTE[1])
          for t in ps_tasks]
    chief = _Box("chief", ["this kernel: the chief", "ClusterCoordinator", "schedule(step) -> a free worker"],
                 PALETTE[3])
    arrows = [("chief", w.key, "schedule" if i == 0 else "", False) for i, w in enumerate(workers)]
    arrows += [(w.key, p.key, "read, update" if i == 0 and j == 0 else "", True)
               for i, w in enumerate(workers) for j, p in enumerate(ps)]
    return boxes_and_arrows("ParameterServerStrategy: a coordinator, workers, parameter servers",
                            [[chief], workers, ps], arrows)


@dataclass(frozen=True)
class Block:
    """One stretch of a lane: ``start`` to ``end`` in steps or time units."""

    start: float
    end: float
    label: str
    kind: str = "work"  # "work", "lost", "save", "down"


LANE_COLORS = {"work": PALETTE[0], "lost": TRANSFER, "save": PALETTE[1], "down": "#7f7f7f"}


def lanes(title: str, rows: dict[str, list[Block]], unit: str, width: int = 760) -> Picture:
    """One lane per task, blocks along a common axis in ``unit``."""
    drawing = _Drawing(title)
    end = max(block.end for blocks in rows.values() for block in blocks)
    left, lane_h = 100, 34
    scale = (width - left - MARGIN) / end
    for i, (name, blocks) in enumerate(rows.items()):
        y = TITLE_H + 6 + i * (lane_h + 8)
        drawing.text(MARGIN, y + lane_h / 2 + 4, name, weight="bold")
        for block in blocks:
            drawing.rect(left + block.start * scale, y, max(2.0, (block.end - block.start) * scale - 1), lane_h,
                         LANE_COLORS[block.kind], opacity=0.85 if block.kind != "work" else 0.6, rx=2)
            drawing.text(left + (block.start + block.end) / 2 * scale, y + lane_h / 2 + 4, block.label,
                         size=9.5, color="white" if block.kind != "work" else "#111", anchor="middle")
    axis_y = TITLE_H + 6 + len(rows) * (lane_h + 8) + 10
    drawing.text(left, axis_y, f"0 {unit}", size=9.5, color="#555")
    drawing.text(width - MARGIN, axis_y, f"{end:g} {unit}", size=9.5, color="#555", anchor="end")
    drawing.width, drawing.height = width, axis_y + MARGIN
    return drawing.picture()


def downpour_schedule(step_times: dict[str, float], until: float) -> dict[str, list[Block]]:
    """Downpour's rule, simulated: each worker reads the parameters at the start of its step and
    pushes its gradient at the end, never waiting. A push's staleness is the number of other
    workers' pushes between its read and its own push."""
    pushes: list[tuple[float, str]] = []
    for worker, step in step_times.items():
        if not isinstance(step, (int, float)) or step <= 0:
            raise ValueError(f"step_times[{worker!r}]={step!r}: a step must take more than 0 time units; "
                             f"for example {{{worker!r}: 2}}")
        t = 0.0
        while t + step <= until:
            pushes.append((t + step, worker))
            t += step
    pushes.sort()
    rows: dict[str, list[Block]] = {worker: [] for worker in step_times}
    for end, worker in pushes:
        start = end - step_times[worker]
        version = sum(1 for t, _ in pushes if t <= start)
        stale = sum(1 for t, other in pushes if start < t < end and other != worker)
        rows[worker].append(Block(start, end, f"read v{version}, stale {stale}"))
    return rows


def downpour_picture(step_times: dict[str, float] | None = None, until: float = 12) -> Picture:
    """Two workers at different paces, pushing without waiting: each step's label says which
    version of the parameters it read and how stale its gradient was when applied."""
    rows = downpour_schedule(step_times or {"worker:0": 2, "worker:1": 3}, until)
    return lanes("Downpour: every worker at its own pace; v = updates the ps had applied", rows, "time units")


def checkpoint_schedule(every: int, failed_at: int, steps: int) -> dict[str, list[Block]]:
    """Checkpoints every ``every`` steps, the ps dying at step ``failed_at``: the steps since
    the last checkpoint are done twice."""
    checks.whole(every, "every", example=20)
    if not 0 < failed_at < steps:
        raise ValueError(f"failed_at={failed_at} must fall inside the run (1 to {steps - 1}); "
                         f"pass a step between them")
    saved = failed_at // every * every
    lost = failed_at - saved
    before = [Block(s, min(s + every, failed_at), f"steps {s}-{min(s + every, failed_at) - 1}")
              for s in range(0, failed_at, every)]
    saves = [Block(s - 0.6, s + 0.6, "", "save") for s in range(every, failed_at, every)]
    redo_end = steps + lost
    after = [Block(failed_at, failed_at + 4, "dies", "down"),
             Block(failed_at + 4, failed_at + 4 + lost, f"{saved}-{failed_at - 1} again", "lost"),
             Block(failed_at + 4 + lost, redo_end + 4, f"steps {failed_at}-{steps - 1}")]
    return {"ps:0": before + saves + after}


def checkpoint_picture(every: int = 20, failed_at: int = 53, steps: int = 80) -> Picture:
    """A checkpoint every ``every`` steps (green) and a ps failure: what is redone (red)."""
    rows = checkpoint_schedule(every, failed_at, steps)
    return lanes(f"A checkpoint every {every} steps; the ps dies at step {failed_at}", rows, "steps")
