"""Plan a run: every layout of a transformer over N devices, predicted on hardware measured
here or taken from a datasheet (``dtflab.plan``; the arithmetic is ``planner.search``'s).

In [1]: plans = dtflab.plan("GPT, 80 x 8192 (65 B)", devices=1024, hardware="h100", batch=1024)
In [2]: plans.best                       # the fastest layout that fits, with its breakdown
In [3]: plans.heatmap()                  # tensor x pipeline ways, each cell its best layout
In [4]: dtflab.plan(train.transformer(), devices=2, hardware="here", cluster=cluster)

What it cannot see: stragglers, a network that other jobs share, kernels a framework fuses or
leaves unfused beyond what ``planner.step_time`` counts, and memory the framework itself
holds (allocator slack, CUDA context, communication buffers).
"""

from __future__ import annotations

import dataclasses
import importlib
import weakref

from dtflab.train.planner import device_memory as shapes
from dtflab.train.planner import hardware as machines
from dtflab.train.planner import search
from dtflab.train.strategies.by_layout import runs
from dtflab.train.planner.hardware import Hardware

VIEWS = "dtflab.viz.plan_map"
#: Each cluster's calibration, measured the first time ``hardware="here"`` plans on it (and
#: ``train.run_layout`` predicts on it); ``train.calibrate(cluster)`` measures anew.
CALIBRATED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: Ways ``plan()`` may be told to keep (``tensor=8``): only layouts with them are planned.
WAYS = ("data", "tensor", "pipeline", "context", "expert")
#: What a table's head says of the attention and embedding it priced, and the other choice.
ATTENTION = {"fused": "fused attention, no score kept (attention='plain' keeps every score)",
             "plain": "plain attention, every score kept (attention='fused' keeps none)"}
EMBEDDING = {"lookup": "embedding looked up (embedding='one-hot' keeps the one-hot tokens)",
             "one-hot": "one-hot tokens kept (embedding='lookup' keeps only the ids)"}


class RunPlans:
    """Every layout's :class:`~dtflab.train.planner.search.Row` for one model, device count
    and hardware: ``rows`` (fastest that fit first), ``best``, ``fitting``, a text ``table()``
    and the ``heatmap()``."""

    def __init__(self, base: shapes.Plan, devices: int, hardware: Hardware, rows):
        self.base, self.devices, self.hardware, self.rows = base, devices, hardware, rows

    @property
    def fitting(self) -> list:
        return [row for row in self.rows if row.fits]

    @property
    def best(self):
        """The fastest layout that fits (a ValueError naming the smallest memory any layout
        reaches, and the lever that would help, where none does)."""
        if not self.fitting:
            raise ValueError(search.cannot_fit(self.rows, self.hardware))
        return self.fitting[0]

    def table(self, count: int = 10) -> Table:
        """The ``count`` fastest layouts that fit (or, none fitting, the rows and why): text
        to print, and a table a notebook shows in a box that scrolls rather than wraps."""
        head = (f"{self.devices} devices, {self.hardware.describe()}; "
                f"{ATTENTION[self.base.attention]}; {EMBEDDING[self.base.embedding]}")
        rows = []
        for row in (self.fitting or self.rows)[:count]:
            parts = sorted(((v, k) for k, v in row.seconds.items() if k != "total"),
                           reverse=True)[:3]
            rows.append((row.name, f"{row.memory['total'] / 1e9:.2f}",
                         f"{row.seconds['total']:.3f}", f"{row.mfu:.1%}",
                         f"{row.tokens_per_s:,.0f}",
                         "-" if row.critical_batch is None else f"{row.critical_batch:,}",
                         ", ".join(f"{k} {v:.3g}" for v, k in parts)))
        foot = "" if self.fitting else search.cannot_fit(self.rows, self.hardware)
        return Table(head, rows, foot)

    def __repr__(self) -> str:
        return (f"<RunPlans {len(self.rows)} layouts, {len(self.fitting)} fit; "
                f"best: {self.best.name if self.fitting else 'none fits'}>")

    def heatmap(self, **options):
        """The configuration map (``dtflab.viz.plan_map``)."""
        return importlib.import_module(VIEWS).heatmap(self, **options)

    def show(self, **options) -> None:
        importlib.import_module(VIEWS).show_map(self, **options)


def base_plan(model, defaults: dict | None = None, **overrides) -> shapes.Plan:
    """A Plan of ``model``'s shape: a ``train.transformer(...)`` problem (with the attention
    and embedding it runs), a preset's name (``planner.device_memory.PRESETS``) or a dict of
    Plan fields (with ``defaults``' fields where it names none: ``Hardware.plan_defaults``);
    ``overrides`` (``batch=``, ``precision=``...) on top."""
    defaults = defaults or {}
    if isinstance(model, str):
        if model not in shapes.PRESETS:
            raise ValueError(f"model={model!r}: not a known model; choose one of "
                             f"{', '.join(repr(name) for name in shapes.PRESETS)}, pass "
                             f"train.transformer(...), or a dict of its shape")
        fields = defaults | shapes.PRESETS[model]
    elif isinstance(model, dict):
        fields = defaults | model
    elif hasattr(model, "d_model"):
        fields = dict(blocks=model.blocks, d_model=model.d_model, heads=model.heads,
                      sequence=model.sequence, vocabulary=model.vocabulary,
                      batch=model.batch_size, precision=model.precision, tied=model.tied,
                      experts=model.experts, top_k=model.top_k if model.experts else 1,
                      kv_heads=model.kv_heads, hidden=model.hidden,
                      activation=model.activation, norm=model.norm,
                      positions=model.positions, shared_experts=model.shared_experts,
                      attention="fused" if model.attention_block else "plain")
        if model.experts:
            fields.update(capacity_factor=model.capacity_factor,
                          pad_to_capacity=model.pad_to_capacity)
    else:
        raise ValueError(f"model={model!r}: plan a transformer: train.transformer(...), a "
                         f"preset's name ({', '.join(repr(n) for n in shapes.PRESETS)}) or a "
                         f"dict of its shape")
    fields.update(overrides)
    return shapes.Plan(**fields)


def resolve(hardware, cluster=None) -> Hardware:
    """``hardware`` as a Hardware: itself, a preset by name, or ``"here"`` measured on
    ``cluster`` (once: :data:`CALIBRATED`)."""
    if isinstance(hardware, Hardware):
        return hardware
    if hardware == machines.HERE:
        if cluster is None:
            raise ValueError("hardware='here' measures a cluster: pass cluster=... (e.g. "
                             "dtflab.start_cluster(workers=2)), or name a preset: "
                             + ", ".join(repr(name) for name in machines.PRESETS))
        from dtflab import checks
        from dtflab.train.planner.calibration import calibrate

        checks.cluster(cluster)
        if cluster not in CALIBRATED:
            CALIBRATED[cluster] = calibrate(cluster)
        return CALIBRATED[cluster]
    return machines.preset(hardware)


def plan(model, devices: int, hardware="h100", *, cluster=None, memory_gb: float | None = None,
         **overrides) -> RunPlans:
    """Every layout of ``model`` over ``devices`` devices of ``hardware``, predicted (see
    the module's docstring). ``memory_gb`` plans against less memory a device than the
    hardware has; ``overrides`` change the model's Plan fields (``batch=1024``,
    ``precision="bfloat16"``, ``dropout=True``...), and a way among them (``tensor=8``) keeps
    only the layouts with it. A preset's or a dict's model is planned with the hardware's
    attention and embedding (``Hardware.plan_defaults``: fused and a lookup on the GPU
    presets; ``attention="plain"`` keeps every score, ``embedding="one-hot"`` the one-hot
    tokens), a problem with the ones it runs. Planned for the machine it runs on
    (``hardware="here"``), only the layouts a dtflab loop trains are kept, so ``best`` can go
    to ``train.run_layout``."""
    from dtflab import checks

    checks.whole(devices, "devices", example=8)
    fixed = {axis: overrides.pop(axis) for axis in WAYS if axis in overrides}
    for axis, ways in fixed.items():
        checks.whole(ways, axis, example=1)
        if devices % ways:
            raise ValueError(f"{axis}={ways}: {ways} {axis} ways do not divide {devices} devices; "
                             f"use one of {', '.join(map(str, search.divisors(devices)))}")
    machine = resolve(hardware, cluster)
    base = base_plan(model, machine.plan_defaults, **overrides)
    if memory_gb is not None:
        machine = machines.with_memory(machine, memory_gb * 1e9)
    rows = search.plans(dataclasses.replace(base, data=1, tensor=1, pipeline=1), devices,
                         machine)
    rows = [row for row in rows if all(getattr(row.plan, axis) == ways
                                       for axis, ways in fixed.items())
            and (not machine.measured or runs(row.plan))]  # here: what a loop runs
    if not rows:
        raise ValueError(f"{', '.join(f'{a}={w}' for a, w in fixed.items())}: no layout of this "
                         f"model over {devices} devices has those ways (the heads, blocks, "
                         f"sequence or batch do not split so); drop one, or see "
                         f"dtflab.plan(...) without it")
    return RunPlans(base, devices, machine, rows)


class Table(str):
    """A plan's table: its text (what ``print`` shows), and its HTML (what a notebook shows of
    ``display(plans.table())``): one line a row, in a box that scrolls sideways when the page
    is narrow, where printed text would wrap mid-number."""

    COLUMNS = (("layout", 44), ("GB/device", 10), ("step s", 9), ("MFU", 7), ("tok/s", 11),
               ("crit. batch", 12), ("largest parts", 0))

    def __new__(cls, head: str, rows: list[tuple[str, ...]], foot: str = ""):
        def line(cells):
            (_, width), *rest = cls.COLUMNS
            text = f"{cells[0]:<{width}}" + "".join(f"{c:>{w}}" for c, (_, w)
                                                     in zip(cells[1:-1], rest[:-1]))
            return text + "   " + cells[-1]

        lines = [head, line([name for name, _ in cls.COLUMNS])] + [line(row) for row in rows]
        table = super().__new__(cls, "\n".join(lines + ([foot] if foot else [])))
        table.head, table.rows, table.foot = head, rows, foot
        return table

    def _repr_html_(self) -> str:
        from html import escape

        def cells(values, tag):
            return "".join(f'<{tag} style="white-space:nowrap; '
                           f'text-align:{"left" if i in (0, 6) else "right"}">'
                           f"{escape(str(value))}</{tag}>" for i, value in enumerate(values))

        body = "".join(f"<tr>{cells(row, 'td')}</tr>" for row in self.rows)
        return (f'<div class="dtflab-plan-table" style="overflow-x:auto">'
                f"<p>{escape(self.head)}</p><table style=\"white-space:nowrap\">"
                f"<thead><tr>{cells([name for name, _ in self.COLUMNS], 'th')}</tr></thead>"
                f"<tbody>{body}</tbody></table>"
                + (f"<p>{escape(self.foot)}</p>" if self.foot else "") + "</div>")
