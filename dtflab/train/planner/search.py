"""Every layout of a transformer's training over N devices, each with its predicted memory per
device by kind (``planner.device_memory``) and its step time by part (``planner.step_time``),
sorted by time among those that fit (pure Python; ``dtflab.plan`` is the front door).

A layout is a :class:`~dtflab.train.planner.device_memory.Plan` (a ``train.Layout`` with its
model): data x tensor x pipeline x context ways multiplying to N (and expert ways among the data
ways, for a mixture), a micro-batch size, a ZeRO stage, a recomputation, sequence parallelism
with tensor ways, and the interleaved schedule's chunks. The ones enumerated keep tensor and context groups inside a node, as
Megatron does (a group across nodes is tried only where a node is one device).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from dtflab.train.layouts.layout import Layout
from dtflab.train.planner import step_time
from dtflab.train.planner.hardware import Hardware
from dtflab.train.planner.device_memory import KINDS, Plan, per_device


@dataclass(frozen=True)
class Row:
    """One layout: its Plan, bytes per device by kind (and ``total``), whether that fits, the
    step's seconds by part (and ``total``), its MFU, tokens a second, and the critical batch:
    the smallest global batch (sequences) at which this layout's arithmetic outlasts its
    communication (None where its tensor, context or expert traffic alone outlasts the
    arithmetic at any batch)."""

    plan: Plan
    memory: dict
    fits: bool
    seconds: dict
    mfu: float
    tokens_per_s: float
    critical_batch: int | None

    @property
    def name(self) -> str:
        """The layout in a few words: ``"d8 t4 p2 c1 | mb 2, zero 1, selective"``."""
        return describe(self.plan)

    @property
    def layout(self) -> Layout:
        """The layout alone, as a loop takes it: ``train.pipeline(..., layout=row.layout)``."""
        return self.plan.layout


def describe(plan: Plan) -> str:
    """``"d8 t4 p2 c1 | mb 2, zero 1, selective, sp, v2"``: the ways, then the levers."""
    ways = f"d{plan.data} t{plan.tensor} p{plan.pipeline} c{plan.context}"
    if plan.experts:
        ways += f" e{plan.expert}"
    levers = [f"mb {plan.micro_batch}", f"zero {plan.zero}", plan.recompute]
    if plan.sequence_parallel:
        levers.append("sp")
    if plan.attention == "fused":
        levers.append("fused")
    if plan.chunks > 1:
        levers.append(f"v{plan.chunks}")
    return f"{ways} | {', '.join(levers)}"


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def layouts(base: Plan, devices: int, hardware: Hardware, *, micro_batch_sizes=(1, 2, 4, 8),
            recompute=("none", "selective", "full"), stages=(0, 1, 2, 3)) -> list[Plan]:
    """Every layout of ``base``'s model and global batch over ``devices`` (see the module's
    docstring)."""
    found = []
    node = hardware.per_node
    for t in divisors(math.gcd(base.heads, devices)):
        if t > node and node > 1 or base.hidden % t or (base.kv_heads % t and t % base.kv_heads):
            continue  # past a node, or an MLP or key/value heads that do not split t ways
        for c in divisors(math.gcd(base.sequence, devices // t)):
            if t * c > node and node > 1 or c > 8:
                continue
            for p in divisors(math.gcd(base.blocks, devices // (t * c))):
                d = devices // (t * c * p)
                if base.batch % d:
                    continue
                found += _levers(base, d, t, p, c, micro_batch_sizes, recompute, stages)
    return found


def _levers(base, d, t, p, c, micro_batch_sizes, recompute, stages):
    per_replica = base.batch // d
    experts = divisors(math.gcd(d, base.experts)) if base.experts else [1]
    for b in micro_batch_sizes:
        if per_replica % b:
            continue
        m = per_replica // b
        for e in experts:
            for r in recompute:
                if r == "selective" and base.attention == "fused":
                    continue  # fused attention recomputes the scores already
                for z in (stages if d > 1 else (0,)):
                    for v in (1, 2, 3) if p > 1 else (1,):
                        if v > 1 and (base.blocks % (p * v) or m % p):
                            continue
                        yield dataclasses.replace(base, data=d, tensor=t, pipeline=p, context=c,
                                                  expert=e, micro_batches=m, recompute=r,
                                                  zero=z, chunks=v, sequence_parallel=t > 1,
                                                  schedule="interleaved" if v > 1 else "1f1b")


def row(plan: Plan, hardware: Hardware) -> Row:
    """One layout's predictions."""
    memory = per_device(plan)
    seconds = step_time.step_seconds(plan, hardware)
    return Row(plan, memory, memory["total"] <= hardware.memory_bytes, seconds,
               step_time.mfu(plan, hardware, seconds["total"]),
               plan.batch * plan.sequence / seconds["total"], critical_batch(plan, hardware))


def critical_batch(plan: Plan, hardware: Hardware) -> int | None:
    """The smallest global batch, in sequences and in steps of one micro-batch per replica, at
    which the step's arithmetic (compute and recomputation) outlasts its communication (every
    collective and send, the bubble left out)."""
    per = step_time.micro_batch_seconds(plan, hardware)
    work = per["compute"] + per["recompute"]
    traffic = per["tensor"] + per["context"] + per["expert"]
    once = step_time.data_seconds(dataclasses.replace(plan, overlap=False), hardware)
    if traffic >= work:
        return None
    m = max(1, math.ceil(once / (work - traffic)))
    return plan.data * plan.micro_batch * m


def plans(base: Plan, devices: int, hardware: Hardware, **choices) -> list[Row]:
    """Every layout's :class:`Row`, fastest first among those that fit, then those that do
    not by their memory."""
    rows = [row(plan, hardware) for plan in layouts(base, devices, hardware, **choices)]
    if not rows:
        raise ValueError(f"devices={devices}: no layout of {base.blocks} blocks, {base.heads} "
                         f"heads, a sequence of {base.sequence} and a batch of {base.batch} "
                         f"uses {devices} devices; use a batch divisible by the data ways, "
                         f"e.g. batch={devices}")
    return sorted(rows, key=lambda r: (not r.fits, r.seconds["total"] if r.fits
                                       else r.memory["total"]))


def cannot_fit(rows: list[Row], hardware: Hardware) -> str:
    """The sentence for a model no layout fits: the smallest memory any layout reaches, and the
    lever that brought it down the most."""
    smallest = min(rows, key=lambda r: r.memory["total"])
    biggest = max(smallest.memory[kind] for kind in KINDS)
    heaviest = next(kind for kind in KINDS if smallest.memory[kind] == biggest)
    lever = {"activations": "a smaller micro-batch, full recomputation, or more tensor or "
                            "context ways",
             "optimizer": "ZeRO stage 1 or more, over more data ways",
             "gradients": "ZeRO stage 2 or more, over more data ways",
             "parameters": "more tensor or pipeline ways, or ZeRO stage 3",
             "weight_copies": "more tensor or pipeline ways, or ZeRO stage 3 (float32 keeps "
                              "no 16-bit copy)"
             }[heaviest]
    return (f"no layout fits in {hardware.memory_bytes / 1e9:.4g} GB a device: the smallest "
            f"reaches {smallest.memory['total'] / 1e9:.4g} GB ({smallest.name}), most of it "
            f"{heaviest.replace('_', ' ')} ({biggest / 1e9:.4g} GB); try more devices, or {lever}")
