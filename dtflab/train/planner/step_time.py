"""How long one training step of a :class:`~dtflab.train.planner.device_memory.Plan` takes on a
:class:`~dtflab.train.planner.hardware.Hardware`, by part (pure Python).

One device's work for one micro-batch is the ops of its blocks (forward, backward, what
recomputation runs again; and the first stage's embedding, the last stage's output layer and
loss), each op charged by the hardware's roofline (``Hardware.op_seconds``), plus the
collectives its tensor, context and expert groups make for that micro-batch, plus the sends
between pipeline stages. A step is::

    (m + bubble) x (that per-micro-batch time)
        [the schedule's bubble over the work: (p - 1) / m GPipe and 1F1B, (p - 1) / (v m)
        interleaved, ZB-H1's with a third of the micro-batch each F, B and W]
    + the data axis's gradient exchange (what the compute does not hide, where it overlaps)
    + the optimizer's update (memory-bound)
    + the framework's fixed cost per step (``Hardware.per_step_s``)

The ops of a block, for b sequences of s tokens, d = d_model, a heads, t tensor ways, c
context ways (each device holds s / c of the tokens), 4d-wide MLP, p bytes an element:

- matrix multiplies: q, k, v (2·s·b·d·3d / t FLOPs), the scores and the weighted values
  (2 x 2·b·s·(s/c)·d / t, a causal block computed whole as dtflab and Megatron do), the
  projection (2·s·b·d² / t), the MLP's two (2 x 2·s·b·d·4d / t); the backward twice each;
- memory-bound ops, by the bytes they read and write: two LayerNorms, the softmax (scale,
  mask), GELU, the residual adds (with dropout: its masks and outputs, Megatron's fused
  bias-dropout-add); the backward twice those bytes.

With ``attention="fused"`` (fused, "flash", kernels): the scores and the weighted values
computed only on the causal tiles (half the square and the diagonal's tiles of
:data:`FUSED_TILE`), no score written to memory or read back (the softmax and the attention's
dropout arithmetic only), and the backward computing the scores once more (counted as
``recompute``): 3.5 times the forward's multiplies, as FlashAttention-2 counts its backward
(2.5 times). Where the hardware gives a fused kernel's measured rate
(``Hardware.attention_efficiency``), the scores, softmax and weighted values are priced at it,
as one kernel. MFU (:func:`mfu`) keeps its published convention, whichever attention runs.

Collectives, per block and micro-batch: tensor parallelism sums each half-block's output
forward and its input's gradient backward (an all-reduce of s·b·d·p bytes; with sequence
parallelism a reduce-scatter and an all-gather, the same bytes, and with ``regather`` the two
inputs gathered again in the backward; with full recomputation the forward's two again);
ring attention sends each block's keys and values round c workers (c - 1
hops of 2·(s/c)·b·d·p / t, each hidden under the attention of the block before it, a c-th of
the device's, where it is shorter; the backward's twice the bytes under twice the work);
experts send each token to its experts' worker and back (dispatch and combine, forward and
backward: 4 all-to-alls of k·s·b·d·p·(e - 1)/e bytes). Pipeline stages send each micro-batch's
activation forward and its gradient back (s·b·d·p, over the link between stages).

What it leaves out: kernels overlapping each other, stragglers and jitter, the
embedding's gather cost, and anything a framework adds between ops beyond ``per_op_s``.
"""

from __future__ import annotations

from dtflab.train.formulas import memory, schedules
from dtflab.train.planner.hardware import Hardware
from dtflab.train.planner.device_memory import Plan, stage_parameters

#: Fused attention's tile side, FlashAttention-2's usual query block.
FUSED_TILE = 128
#: The parts of a step, in the order a breakdown lists them.
PARTS = ("compute", "recompute", "tensor", "context", "expert", "pipeline", "bubble", "data",
         "optimizer", "framework")


def block_ops(plan: Plan) -> list[tuple[str, str, float, float]]:
    """One block's forward for one micro-batch on one device: ``(name, kind, flops, bytes)``,
    kind ``"matrix"``, ``"vector"`` or, fused attention's scores and weighted values,
    ``"attention"`` (``Hardware.op_seconds``)."""
    s, b, d, a, t = plan.sequence / plan.context, plan.micro_batch, plan.d_model, plan.heads, \
        plan.tensor
    full = plan.sequence
    p = memory.BYTES[plan.precision]
    k = plan.routed if plan.experts else 1
    sp = t if plan.sequence_parallel else 1  # what sequence parallelism cuts
    rows = s * b
    fused = plan.attention == "fused"
    # fused: the tiles above the diagonal skipped (of (s/B)² tiles, the lower half and the
    # diagonal's), and no score through memory; plain computes the causal square whole
    tile = min(FUSED_TILE, full)  # a sequence shorter than a tile is one tile
    causal = 0.5 + tile / (2 * full) if fused else 1.0
    heads_s = b * a / t * s * full * causal  # the scores of every head this device holds
    kept = 0.0 if fused else heads_s  # scores written to and read from memory
    qkv = d / t + plan.kv_columns  # the qkv's columns here
    h = plan.hidden / t  # the MLP's hidden units here (each expert's)
    g = plan.gates
    k += plan.shared_experts  # the shared experts run on every token
    tiles = "attention" if fused else "matrix"  # a fused kernel's multiplies
    ops = [
        ("ln1", "vector", 8 * rows * d / sp, 2 * p * rows * d / sp),
        ("qkv", "matrix", 2 * rows * d * qkv, p * (rows * d + d * qkv + rows * qkv)),
        ("scores", tiles, 2 * b * s * full * causal * d / t,
         p * (rows * d / t + b * full * plan.kv_columns / 2 + kept)),
        ("softmax", "vector", 5 * heads_s, 2 * p * kept),
        ("values", tiles, 2 * b * s * full * causal * d / t,
         p * (kept + b * full * plan.kv_columns / 2 + rows * d / t)),
        ("projection", "matrix", 2 * rows * d * d / t, p * (2 * rows * d / t + d * d / t)),
        ("residual1", "vector", rows * d / sp, 3 * p * rows * d / sp),
        ("ln2", "vector", 8 * rows * d / sp, 2 * p * rows * d / sp),
        ("fc", "matrix", k * 2 * rows * d * g * h,
         p * k * (rows * d + g * d * h + g * rows * h)),
        ("gelu" if g == 1 else "swiglu", "vector", k * 8 * rows * g * h,
         k * p * rows * (g + 1) * h),
        ("out", "matrix", k * 2 * rows * h * d, p * k * (rows * h + h * d + rows * d)),
        ("residual2", "vector", rows * d / sp, 3 * p * rows * d / sp),
    ]
    if plan.dropout:  # the attention's dropout and two bias-dropout-adds (1-byte masks)
        ops += [("attention_dropout", "vector", heads_s, (2 * p + 1) * kept),
                ("dropouts", "vector", 2 * rows * d / sp, 2 * (p + 1) * rows * d / sp)]
    if plan.experts:
        ops.append(("router", "matrix", 2 * rows * d * plan.experts, p * rows * d))
    return ops


def output_ops(plan: Plan) -> list[tuple[str, str, float, float]]:
    """The last stage's final LayerNorm, output layer (d x V / t) and loss, forward."""
    s, b, d, t = plan.sequence / plan.context, plan.micro_batch, plan.d_model, plan.tensor
    p = memory.BYTES[plan.precision]
    v = plan.vocabulary / t
    rows = s * b
    return [("lnf", "vector", 8 * rows * d, 2 * p * rows * d),
            ("logits", "matrix", 2 * rows * d * v, p * (rows * d + d * v + rows * v)),
            ("loss", "vector", 5 * rows * v, 4 * 3 * rows * v)]


def _seconds(ops, hardware: Hardware, precision: str, backward: float = 0.0) -> float:
    """The ops forward (``backward=0``) or their backward (twice each op's work)."""
    scale = backward or 1.0
    return sum(hardware.op_seconds(scale * flops, scale * nbytes, precision, kind)
               for _, kind, flops, nbytes in ops)


def micro_batch_seconds(plan: Plan, hardware: Hardware) -> dict[str, float]:
    """One device's time for one micro-batch, by part: its stage's blocks forward and
    backward (``compute``), what recomputation runs again, and the collectives of its tensor,
    context and expert groups; the busier of the first and last stage (the last holds the
    output layer)."""
    blocks = plan.blocks / plan.pipeline
    ops = block_ops(plan)
    if plan.attention == "fused" and hardware.attention_efficiency:
        # the kernel's measured rate holds its softmax and dropout: none priced apart
        ops = [op for op in ops if op[0] not in ("softmax", "attention_dropout")]
    forward = _seconds(ops, hardware, plan.precision)
    backward = _seconds(ops, hardware, plan.precision, backward=2.0)
    again = forward if plan.recompute == "full" else 0.0
    if plan.attention == "fused":  # the backward computes each tile's scores again
        again += _seconds([op for op in ops if op[0] in ("scores", "softmax",
                                                           "attention_dropout")],
                          hardware, plan.precision)
    elif plan.recompute == "selective":
        again = _seconds([op for op in ops if op[0] in ("scores", "softmax", "values",
                                                          "attention_dropout")],
                         hardware, plan.precision)
    out = output_ops(plan)
    output = _seconds(out, hardware, plan.precision) + _seconds(out, hardware, plan.precision, 2.0)
    parts = {"compute": blocks * (forward + backward) + output, "recompute": blocks * again}
    parts.update(collective_seconds(plan, hardware, forward_attention=_seconds(
        [op for op in ops if op[0] in ("scores", "softmax", "values")], hardware, plan.precision)))
    parts["tensor"] *= blocks
    parts["context"] *= blocks
    parts["expert"] *= blocks
    return parts


def collective_seconds(plan: Plan, hardware: Hardware, forward_attention: float = 0.0) -> dict:
    """One block's collectives for one micro-batch on one device, by group (see the module's
    docstring); each of ring attention's hops counts only where longer than the block of
    attention it hides under."""
    s, b, d, t = plan.sequence / plan.context, plan.micro_batch, plan.d_model, plan.tensor
    p = memory.BYTES[plan.precision]
    found = {"tensor": 0.0, "context": 0.0, "expert": 0.0}
    activation = s * b * d * p
    if t > 1:
        link = hardware.link(t, ring=True)
        ring = (t - 1) / t
        if plan.sequence_parallel:  # a reduce-scatter and an all-gather each time
            one = link.seconds(activation, ring) + link.seconds(activation, ring)
        else:
            one = link.seconds(activation, 2 * ring)
        count = 4 + (2 if plan.recompute == "full" else 0)
        found["tensor"] = count * one
        if plan.sequence_parallel and plan.regather:  # each matrix's input gathered again
            found["tensor"] += 2 * link.seconds(activation, ring)
    c = plan.context
    if c > 1:
        link = hardware.link(c, stride=t)
        hop = link.seconds(s * b * plan.kv_columns * p)  # a piece's keys and values
        # each hop hides under the attention of the block that arrived before it (a c-th of
        # the device's); the backward sends the keys' and values' gradients too, twice each
        block = forward_attention / c
        found["context"] = (c - 1) * (max(0.0, hop - block) + max(0.0, 2 * hop - 2 * block))
    if plan.experts and plan.expert > 1:
        e = plan.expert
        link = hardware.link(e, stride=t * plan.context)
        tokens = plan.routed * s * b * d * p
        found["expert"] = 4 * link.seconds(tokens, (e - 1) / e)
    return found


def step_seconds(plan: Plan, hardware: Hardware) -> dict[str, float]:
    """One step's time by part (:data:`PARTS`) and ``total``, in seconds."""
    per = micro_batch_seconds(plan, hardware)
    m, p, v = plan.micro_batches, plan.pipeline, plan.chunks
    sends = 0.0
    if p > 1:
        link = hardware.link(p, stride=plan.tensor * plan.context * plan.data)
        cut = plan.tensor if plan.sequence_parallel else 1  # Megatron sends 1/t, then gathers
        activation = plan.sequence / plan.context * plan.micro_batch * plan.d_model \
            * memory.BYTES[plan.precision] / cut
        sends = 2 * v * link.seconds(activation)  # forward's activation, backward's gradient
    one = sum(per.values()) + sends
    parts = {name: m * value for name, value in per.items()}
    parts["pipeline"] = m * sends
    # the schedule's bubble over the work, with this micro-batch's forward, backward and the
    # weights' half of the backward's multiplies
    forward = per["compute"] / 3
    ratio = schedules.bubble_ratio(plan.schedule, p, m, v, forward=forward,
                                   backward=2 * forward, weight=forward) if p > 1 else 0.0
    parts["bubble"] = ratio * m * one
    # what an overlapped exchange hides under: the backward's multiplies (and ZeRO 3's
    # gathers the forward's, and what recomputation runs again, too)
    hidden = m * per["compute"] * 2 / 3
    if plan.zero == 3:
        hidden = m * (per["compute"] + per["recompute"])
    parts["data"] = data_seconds(plan, hardware, backward=hidden)
    parts["optimizer"] = optimizer_seconds(plan, hardware)
    parts["framework"] = hardware.per_step_s
    parts = {name: parts.get(name, 0.0) for name in PARTS}
    parts["total"] = sum(parts.values())
    return parts


def data_seconds(plan: Plan, hardware: Hardware, backward: float = 0.0) -> float:
    """The data axis's gradient exchange per step: a ring all-reduce of the device's gradients
    in ``plan.exchange_precision`` (ZeRO 1 and 2: a reduce-scatter and an all-gather of the
    parameters, the same bytes; 3: the parameters gathered twice, 3/2 of it), less what the
    compute hides (``backward``) when ``plan.overlap``."""
    d = plan.data
    if d == 1:
        return 0.0
    n = stage_parameters(plan, True, plan.pipeline == 1)["total"]
    link = hardware.link(d, stride=plan.tensor * plan.context, ring=True)
    factor = 2 * (d - 1) / d * (1.5 if plan.zero == 3 else 1.0)
    exchange = link.seconds(memory.BYTES[plan.exchange_precision] * n, factor)
    # each collective pays the link's latency; ZeRO 1 and 2 a reduce-scatter and an all-gather
    # a piece, ZeRO 3 two gathers and a reduce-scatter
    collectives = plan.exchanges * {0: 1, 1: 2, 2: 2, 3: 3}[plan.zero]
    exchange += (collectives - 1) * link.latency
    return max(0.0, exchange - backward) if plan.overlap else exchange


def optimizer_seconds(plan: Plan, hardware: Hardware) -> float:
    """Adam's update of the device's parameters: memory-bound, reading the float32 parameter,
    gradient, m and v and writing the three back, and the 16-bit copy (ZeRO 1 and up: its
    shard)."""
    n = stage_parameters(plan, True, plan.pipeline == 1)["total"]
    if plan.zero >= 1:
        n /= plan.data
    nbytes = n * (4 * memory.FLOAT32 + 3 * memory.FLOAT32 + memory.BYTES[plan.precision])
    return hardware.op_seconds(10 * n, nbytes, "float32", "vector")


def model_flops(plan: Plan) -> float:
    """The step's model FLOPs (Narayanan et al. 2021, Korthikanti et al. 2022 eq. 7): 72·B·L·
    s·d²·(1 + s/(6d) + V/(12·d·L)) for GPT's block, recomputation not counted: what MFU divides
    by. For other blocks the same count, 6·B·s·(L·M + d·V) + 12·B·L·s²·d, with M a block's
    matrices a token multiplies by (grouped-query attention's smaller keys and values, SwiGLU's
    three matrices; with experts, its top k and the shared ones, and the router)."""
    B, L, s, d, V = plan.batch, plan.blocks, plan.sequence, plan.d_model, plan.vocabulary
    attention = d * (d + 2 * d * plan.kv_heads // plan.heads) + d * d
    mlp = (plan.gates + 1) * d * plan.hidden
    if plan.experts:
        mlp = (plan.top_k + plan.shared_experts) * mlp + d * plan.experts
    return 6 * B * s * (L * (attention + mlp) + d * V) + 12 * B * L * s * s * d


def mfu(plan: Plan, hardware: Hardware, seconds: float | None = None,
        flops: float | None = None) -> float:
    """Model FLOPs utilisation: :func:`model_flops` (or ``flops``, a published model's where
    the plan's shape differs) over the step's time and every device's peak."""
    seconds = step_seconds(plan, hardware)["total"] if seconds is None else seconds
    flops = model_flops(plan) if flops is None else flops
    return flops / (seconds * plan.devices * hardware.peak(plan.precision))
