"""What each device holds to train a transformer of any size, by kind, in bytes: the memory
planner's arithmetic (``dtflab.memory_planner``), pure Python and instant.

A :class:`Plan` is a shape (``train.transformer``'s: blocks, d_model, heads, sequence,
vocabulary, tied), a global batch in sequences, and how it is trained: ``micro_batches`` per
step, ``precision``, ``recompute``, and the ways it is split: ``data`` replicas, ``tensor``
(Megatron's: the attention's heads and the MLP's hidden units), ``pipeline`` stages (blocks
cut evenly; 1F1B), and a ZeRO ``stage`` over the data replicas (1: Adam's state sharded; 2: and
the gradients; 3: and the parameters).

Measured here and what is not. With ``tensor = pipeline = 1`` and ``stage = 0`` a device holds
one replica training on ``batch / data`` sequences: exactly ``formulas.memory``'s count, which
``train.memory`` checks to the byte (``tests/test_memory.py``), and the planner's **Measure**
runs. The rest is the references' arithmetic applied to that count, not yet measured by
dtflab:

- **tensor** t (Megatron, without sequence parallelism): each block's matrices, the qkv and
  first MLP biases, and what lies between the two matrices of the attention and of the MLP
  (q, k, v, the softmax, the joined heads, the MLP's 4d-wide tensors) are cut t ways; the
  LayerNorms, the residual stream and the other biases are whole on every device; the
  embedding and output layer are cut over the vocabulary.
- **pipeline** p: a stage holds its blocks (L/p); the first holds the embedding, the last the
  final LayerNorm and the output layer (a copy of the embedding when tied). Under 1F1B the
  first stage keeps the activations of min(p, m) micro-batches at once, the last of one.
  :func:`per_device` reports the stage that holds the most.
- **ZeRO** over d data replicas: optimizer state / d from stage 1, gradients / d from stage
  2, parameters / d at stage 3 (Rajbhandari et al. 2020: (2 + 2 + K)·Ψ/N_d in their 16-bit
  terms; here float32 master weights, so (4 + 4 + 8)·Ψ/d). At stage 3 the units gathered at
  once (:data:`GATHERED_UNITS`) are held whole besides the shard: in float32 among the
  parameters where ``exchange_precision`` is float32, and their 16-bit copies, not every
  weight's, among the weight copies. The optimizer state's share is
  measured by ``train.zero`` (its workers' variables: ``tests/test_zero.py``), the
  parameters' by stage 3 (``train.sharded_data_parallel``) on the transformer and an MLP; the
  gradients' only as a step's peak (stage 2 below stage 1 by at least (1 - 1/d) of the
  gradients: ``history.details["step_peak_bytes"]``), not by kind.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from dtflab.train.formulas import memory
from dtflab.train.layouts.layout import Layout, said_as
from dtflab.train.problems.experts import capacity as expert_capacity

KINDS = memory.KINDS


@dataclass(frozen=True)
class Plan(Layout):
    """A layout (every way and choice, as the loops take it, checked there once) for one
    transformer and its global batch in sequences (the module's docstring): ``plan.layout``
    is the layout alone, for a loop (``train.pipeline(..., layout=plan.layout)``)."""

    blocks: int = 2
    d_model: int = 64
    heads: int = 4
    sequence: int = 32
    vocabulary: int = 23
    batch: int = 16
    tied: bool = True
    # The planner's levers (planner.step_time, planner.search); the defaults change nothing
    # above. ``experts`` E and ``top_k``: a mixture in each block's MLP, its experts over the
    # layout's ``expert`` of the data ways; ``dropout``: Megatron's dropouts (their masks and
    # outputs kept, Korthikanti et al.'s count); ``regather``: sequence parallelism gathers a
    # block's input again in the backward instead of keeping it whole (Megatron's choice,
    # Korthikanti et al. section 4.2.2); ``overlap``: the data axis's gradient exchange under
    # the backward (ZeRO 3's gathers under the forward too); ``exchanges``: the collectives
    # the data axis's exchange is cut into (1: bucketed, as DDP and Megatron do; dtflab's ZeRO
    # programs exchange each parameter on its own); ``exchange_precision``: what its gradients
    # and gathered parameters travel in ("float32", dtflab's and Megatron's; the 16-bit type
    # where a framework casts before it sends, as FSDP's "pure" mixed precision does).
    experts: int = 0
    top_k: int = 1
    # ``pad_to_capacity``: every expert computes its capacity's rows (``problems.experts``),
    # ``capacity_factor`` x top_k x sequence / experts of each sequence's tokens
    capacity_factor: float = 1.25
    pad_to_capacity: bool = False
    # ``routing``: rows the routed experts computed a token on the fullest device in a routing
    # known (``predicted_run``: read from the graph; 0: an even one)
    routing: float = 0.0
    # The block's choices (``train.transformer``'s; GPT-2's by default): key/value heads (0:
    # one per query head), the MLP's hidden width (0: 4 d; each expert's), its activation,
    # the norm, the positions, and shared experts beside the routed ones.
    kv_heads: int = 0
    hidden: int = 0
    activation: str = "gelu"
    norm: str = "layer"
    positions: str = "learned"
    shared_experts: int = 0
    dropout: bool = False
    regather: bool = False
    overlap: bool = False
    exchanges: int = 1
    exchange_precision: str = "float32"
    # ``attention``: "plain" keeps every head's scores (dtflab's default); "fused" as fused
    # ("flash") kernels run it: no scores kept or streamed through memory, the causal tiles
    # above the diagonal skipped, the scores computed again in the backward
    attention: str = "plain"
    # ``embedding``: "one-hot" keeps each token's one-hot row for the embedding's backward, as
    # dtflab's transformer multiplies by it (s·b·V a micro-batch); "lookup" gathers the rows,
    # as the frameworks of published runs do, and keeps only the token ids
    embedding: str = "one-hot"

    def __post_init__(self):
        from dtflab import checks
        from dtflab.train.problems.transformer_block import checked_choices

        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)
        if not self.hidden:
            object.__setattr__(self, "hidden", 4 * self.d_model)
        super().__post_init__()  # every way and choice
        for name in ("blocks", "d_model", "heads", "sequence", "vocabulary", "batch", "top_k",
                     "exchanges"):
            checks.whole(getattr(self, name), name)
        checks.whole(self.experts, "experts", minimum=0, example=8)
        if self.d_model % self.heads:
            raise ValueError(f"heads={self.heads}: d_model={self.d_model} does not split "
                             f"into {self.heads} equal heads; use a heads that divides it")
        if self.top_k > max(self.experts, 1):
            raise ValueError(f"top_k={self.top_k}: at most experts={self.experts}")
        checked_choices(self.d_model, self.heads, self.norm, self.positions, self.kv_heads,
                        self.activation, self.hidden, self.experts, self.shared_experts)
        checks.one_of(self.attention, "attention", ("plain", "fused"))
        checks.one_of(self.embedding, "embedding", ("one-hot", "lookup"))
        checks.one_of(self.exchange_precision, "exchange_precision",
                      ("float32", self.precision))
        if self.attention == "fused" and self.recompute == "selective":
            raise ValueError("recompute='selective' with attention='fused': fused attention "
                             "already computes the scores again in its backward and keeps "
                             "none; use recompute='none' (or 'full')")
        if self.dropout and (self.kv_heads != self.heads or self.hidden != 4 * self.d_model
                             or self.activation != "gelu"):
            raise ValueError("dropout=True counts Megatron's GPT block as Korthikanti et al. "
                             "do (a key/value head per query head, GELU of 4d); use "
                             "dropout=False for grouped-query attention or SwiGLU")
        with said_as(False, batch_size="batch"):
            self.fits(_Shape(self))
        # the arithmetic below cuts the blocks evenly, as Megatron does
        if self.blocks % (self.pipeline * self.chunks):
            raise ValueError(f"pipeline={self.pipeline}: {self.blocks} blocks do not cut into "
                             f"{self.pipeline * self.chunks} equal stages"
                             + (f" of {self.chunks} chunks" if self.chunks > 1 else "")
                             + "; use a pipeline (and chunks) whose product divides blocks")

    @property
    def layout(self) -> Layout:
        """The ways and choices alone, as the loops take them."""
        return Layout(**{field.name: getattr(self, field.name) for field in fields(Layout)})

    @property
    def devices(self) -> int:
        """Data x tensor x pipeline x context: the layout's size (the expert ways are some of
        the data ways)."""
        return self.size

    @property
    def micro_batch(self) -> int:
        """Sequences in one micro-batch on one replica."""
        return self.batch // (self.data * self.micro_batches)

    @property
    def measurable(self) -> bool:
        """One device is one replica of ``train.transformer``: ``train.memory`` measures it."""
        return self.tensor == 1 and self.pipeline == 1 and self.zero == 0

    def as_dict(self) -> dict:
        return asdict(self)

    def choices(self) -> dict:
        """The block's choices, as ``train.transformer`` and ``formulas`` take them."""
        return {name: getattr(self, name) for name in (
            "kv_heads", "hidden", "activation", "norm", "positions", "shared_experts")}

    @property
    def routed(self) -> float:
        """Rows the routed experts compute a token, on the device that holds them: top_k, as
        if the router spread the tokens evenly, or ``routing`` where a routing is known; with
        ``pad_to_capacity``, every expert's capacity, experts x ceil(capacity_factor x top_k
        x sequence / experts) / sequence, whatever the routing."""
        if not self.pad_to_capacity:
            return self.routing or self.top_k
        return self.experts * expert_capacity(self) / self.sequence

    @property
    def gates(self) -> int:
        """Columns of the MLP's first matrix per hidden unit: SwiGLU's gate and up, GELU's one."""
        return 2 if self.activation == "swiglu" else 1

    @property
    def kv_columns(self) -> float:
        """The key and value columns of the qkv on one device: the key/value heads split over
        the tensor ways, or one head where the ways outnumber them (copied, as Megatron does)."""
        return 2 * self.d_model // self.heads * max(self.kv_heads / self.tensor, 1)


@dataclass(frozen=True)
class _Shape:
    """A plan's model as :meth:`Layout.fits` reads a problem."""

    plan: Plan

    def __getattr__(self, name):
        plan = self.plan
        return {"batch_size": plan.batch, "unit": "block", "depth": plan.blocks,
                "name": f"the {plan.blocks}-block model", "recompute": plan.recompute,
                "precision": plan.precision}.get(name, getattr(plan, name, None))


def stage_parameters(plan: Plan, first: bool, last: bool) -> dict[str, int]:
    """Parameters on one device of a stage: ``{"total", "matrices", "blocks", "block",
    "block_matrices", "output"}`` (``matrices``: the weights a backward multiplies by,
    whose 16-bit copies the forward keeps, as it keeps the norms' scales). A block's qkv and MLP
    columns are split over the tensor ways (a key/value head copied where the ways outnumber
    them); with experts, a block's MLP is E experts (8 d² + 5 d each for GELU's 4d) spread
    over the expert ways and split over the tensor ways, a router of d x E, and the shared
    experts, split over the tensor ways."""
    d, v, t, h, g = plan.d_model, plan.vocabulary, plan.tensor, plan.hidden, plan.gates
    blocks = plan.blocks // plan.pipeline
    qkv = d // t + plan.kv_columns
    norms = 2 * d * (2 if plan.norm == "layer" else 1)
    attention_matrices = d * qkv + d * d // t
    attention = attention_matrices + qkv + d + norms  # its bias split, the projection's whole
    if plan.experts:
        mine = plan.experts // plan.expert
        mlps = mine + plan.shared_experts  # routed here, and shared: widths of h each
        block_matrices = attention_matrices + mlps * (g + 1) * d * h // t + d * plan.experts
        block = (block_matrices + attention - attention_matrices
                 + mlps * g * h // t + (mine + (1 if plan.shared_experts else 0)) * d
                 + plan.experts)
    else:
        block_matrices = attention_matrices + (g + 1) * d * h // t
        block = block_matrices + attention - attention_matrices + g * h // t + d
    total, matrices = blocks * block, blocks * block_matrices
    embedding = math.ceil(v / t) * d
    output = 0  # the last stage's final norm and output layer (or the tied embedding's copy)
    if first:
        total += embedding + (plan.sequence * d if plan.positions == "learned" else 0)
    if last:
        output = norms // 2 + (embedding if not plan.tied or not first else 0)
        total += output
        matrices += embedding
    return {"total": int(total), "matrices": int(matrices), "blocks": blocks,
            "block": int(block), "block_matrices": int(block_matrices), "output": int(output)}


def block_activations(plan: Plan) -> float:
    """Bytes one block keeps for its backward, for one micro-batch on one device.

    Without dropout, dtflab's transformer (``formulas.memory``, measured to the byte):
    16·s·b·d + a·s²·b elements and 2·s·b float32 1/std, tensor parallelism cutting the
    12·s·b·d + a·s²·b between the matrices, sequence parallelism the LayerNorms' share but the gathered input it
    keeps whole (``memory.split_activation_bytes``). With ``dropout`` (Megatron's GPT),
    Korthikanti et al. 2022's Table 2 in 16 bits, scaled to the compute type: s·b·h·(10 + 24/t
    + 5·a·s/(h·t)), with sequence parallelism s·b·h·(34/t + 5·a·s/(h·t)); selective
    recomputation drops the 5·a·s/h; full keeps 2·s·b·h, cut t ways with sequence parallelism
    (Korthikanti et al.'s Table 2; Megatron and torchtitan keep each block's input as its
    shard). Context ways c cut s everywhere
    (ring attention keeps its own queries' scores) and, in dtflab's one graph, the fullest
    worker keeps the keys and values it received, 2·(c - 1)·s/c·b·d / t (Megatron passes them
    round the ring again in the backward: not counted with ``dropout``); experts keep their
    MLP's share k times (:attr:`Plan.routed`: an even routing, or every expert's capacity
    padded), and each taken token's gathered input and scattered output (dtflab's dispatch),
    and the shared experts their MLP's. Grouped-query attention keeps kv/a of the
    keys and values (a head on each device where the tensor ways outnumber them), SwiGLU of
    width h its gate, up and output, 3·s·b·h where GELU of 4d keeps 8·s·b·d
    (:func:`cut_elements`). Fused attention keeps no scores (no a·s² term, with dropout or
    without) but each query row's log-sum-exp, a·s·b / t float32 values."""
    s, b, d, a, t = plan.sequence / plan.context, plan.micro_batch, plan.d_model, plan.heads, \
        plan.tensor
    p = memory.BYTES[plan.precision]
    f32 = memory.FLOAT32
    sp = plan.sequence_parallel
    full_s = plan.sequence
    fused = plan.attention == "fused"
    lse = f32 * a * s * b / t if fused and plan.recompute != "full" else 0.0  # a row's sum
    if plan.dropout:
        if plan.recompute == "full":  # the block's input, cut t ways with sequence parallelism
            return 2 * s * b * d * p / 2 / (t if sp else 1)
        softmax = 5 * a * full_s / (d * t) if plan.recompute == "none" and not fused else 0.0
        mlp = 19 / t * s * b * d * (plan.routed if plan.experts else 1)
        rest = (15 / t if sp else 10 + 5 / t) * s * b * d
        return (rest + mlp + softmax * s * b * d) * p / 2 + lse
    if plan.recompute == "full":  # the block's input, cut t ways with sequence parallelism
        return p * s * b * d / (t if sp else 1)
    gathered = 2 * s * b * d / t if plan.regather else 2 * s * b * d
    norms = (p * (2 * s * b * d / t + gathered) + f32 * 2 * s * b / t) if sp else \
        (p * 4 * s * b * d + f32 * 2 * s * b)
    attention, mlp = cut_elements(plan, s * b)
    # a mixture also keeps, for each token an expert took, the gathered input its expert
    # multiplied and the weighted output the combine scattered back
    dispatch = 2 * plan.routed * s * b * d if plan.experts else 0.0
    softmax = a * s * full_s * b / t if plan.recompute == "none" and not fused else 0.0
    # the received keys and values, for the backward: (c - 1) of c pieces of the sequence
    ring = (plan.context - 1) * s * b * plan.kv_columns
    return norms + p * (attention + mlp + dispatch + softmax + ring) + lse


def cut_elements(plan: Plan, rows: float) -> tuple[float, float]:
    """Elements a block keeps on one device for ``rows`` positions between its matrices, which
    the tensor ways cut: the attention's (queries and joined heads, 2·d/t a row; keys and
    values, :attr:`Plan.kv_columns`) and the MLP's (GELU's input and output, SwiGLU's gate,
    up and output: (gates + 1)·h/t a row; a mixture's k experts' and its shared experts')."""
    d, t = plan.d_model, plan.tensor
    attention = rows * (2 * d / t + plan.kv_columns)
    mlp = rows * (plan.gates + 1) * plan.hidden / t
    if plan.experts:
        mlp *= plan.routed + plan.shared_experts
    return attention, mlp


def stage_activations(plan: Plan, first: bool, last: bool) -> int:
    """Bytes one device of a stage keeps for its backward (``formulas.memory``'s count,
    split as the module's docstring says)."""
    s, b, d, a, t = plan.sequence, plan.micro_batch, plan.d_model, plan.heads, plan.tensor
    p = memory.BYTES[plan.precision]
    f32 = memory.FLOAT32
    v = math.ceil(plan.vocabulary / t)
    levers = (plan.context, plan.experts, plan.sequence_parallel, plan.chunks, plan.dropout,
              plan.regather, plan.attention)
    if levers == (1, 0, False, 1, False, False, "plain"):  # the memory planner's own count, unchanged
        cut = sum(cut_elements(plan, s * b))
        per_block = {"none": p * (4 * s * b * d + cut + a * s * s * b / t) + f32 * 2 * s * b,
                     "selective": p * (4 * s * b * d + cut) + f32 * 2 * s * b,
                     "full": p * s * b * d}[plan.recompute]
    else:
        per_block = block_activations(plan)
        s = s // plan.context
    parameters = stage_parameters(plan, first, last)
    in_flight = min(plan.pipeline, plan.micro_batches) if first else 1
    if plan.schedule == "gpipe" and plan.pipeline > 1:
        in_flight = plan.micro_batches  # every forward before the first backward
    if first and plan.chunks > 1 and plan.micro_batches >= plan.pipeline:
        # the interleaved schedule's first worker (Korthikanti et al. 2022, eq. 5's factor)
        in_flight *= 1 + (plan.pipeline - 1) / (plan.pipeline * plan.chunks)
    kept = int(in_flight * parameters["blocks"] * per_block)
    if first and plan.embedding == "one-hot":
        kept += in_flight * p * s * b * v  # the one-hot tokens
    if last:
        kept += p * s * b * 2 * d + f32 * s * b * (v + 2)  # residual, final LN, the loss's
    return int(kept)


def stage_weight_copies(plan: Plan, first: bool, last: bool) -> int:
    """Bytes of the 16-bit weight copies one device of a stage keeps for its backward
    (``formulas.memory``'s count; none in float32): the matrices a backward multiplies by and
    the norms' scales (each block's, and the final one's on the last stage), or with full
    recomputation every block parameter, which the block's second run reads. Under ZeRO 3 only
    the units gathered at once (:func:`gathered_units`)."""
    if plan.precision == "float32":
        return 0
    parameters = stage_parameters(plan, first, last)
    block_extra = parameters["block"] - parameters["block_matrices"]
    if plan.zero >= 3:  # cast from the gathered float32, or gathered in 16 bits
        return int(memory.BYTES[plan.precision] * gathered_units(plan, first, last))
    rest = plan.d_model if last else 0
    rest += (block_extra if plan.recompute == "full" else 2 * plan.d_model) \
        * parameters["blocks"]
    return int(memory.BYTES[plan.precision] * (parameters["matrices"] + rest))


#: The units ZeRO 3 holds gathered at once: the one running and the next, gathered ahead
#: (PyTorch FSDP's prefetch; its ``limit_all_gathers`` lets no third start, Zhao et al. 2023,
#: "PyTorch FSDP", section 3.3; dtflab's own sharded loop gathers one block at a time).
GATHERED_UNITS = 2


def gathered_units(plan: Plan, first: bool, last: bool) -> int:
    """Parameters ZeRO 3 holds gathered at once on one device of a stage: its
    :data:`GATHERED_UNITS` largest units (a block; the first stage's embedding, with its
    positions; the last stage's final norm and output layer, or the tied embedding's copy;
    one stage alone with a tied embedding: one unit of both), each freed after its forward and
    gathered again for its backward, so no copy of the stage's every weight is kept."""
    parameters = stage_parameters(plan, first, last)
    units = [parameters["block"]] * min(GATHERED_UNITS, parameters["blocks"])
    rest = parameters["total"] - parameters["blocks"] * parameters["block"]
    if first and last and not plan.tied:  # the embedding's unit and the output layer's
        units += [rest - parameters["output"], parameters["output"]]
    elif rest:
        units.append(rest)
    return sum(sorted(units, reverse=True)[:GATHERED_UNITS])


def per_device(plan: Plan) -> dict[str, int]:
    """Bytes on the device that holds the most, by kind (:data:`KINDS`: ``parameters``,
    ``weight_copies``, ``gradients``, ``optimizer``, ``activations``), and ``total``."""
    stages = [(True, plan.pipeline == 1)] + ([(False, True)] if plan.pipeline > 1 else [])
    found = []
    for first, last in stages:
        n = stage_parameters(plan, first, last)["total"]
        d = plan.data
        shard = memory.FLOAT32 * n // (d if plan.zero >= 3 else 1)
        if plan.zero >= 3 and plan.exchange_precision == "float32":  # gathered whole, float32
            shard += memory.FLOAT32 * gathered_units(plan, first, last)
        held = {"parameters": shard,
                "weight_copies": stage_weight_copies(plan, first, last),
                "gradients": memory.FLOAT32 * n // (d if plan.zero >= 2 else 1),
                "optimizer": (2 * memory.FLOAT32 * n + 2 * memory.FLOAT32)
                // (d if plan.zero >= 1 else 1),
                "activations": stage_activations(plan, first, last)}
        held["total"] = sum(held.values())
        found.append(held)
    return max(found, key=lambda held: held["total"])


#: Llama's block: RMSNorm, rotary positions, SwiGLU, an untied output layer.
LLAMA = dict(norm="rms", positions="rotary", activation="swiglu", tied=False)

#: Shapes a learner may start from: this laptop's, GPT-2 small as published, GPT-shaped models
#: of Llama 2's two sizes (a GELU MLP of 4d where Llama has SwiGLU), and today's models as
#: published: each name's source is in :data:`SOURCES`. The batch is a shape's, in sequences:
#: plan a real run's with ``batch=``.
PRESETS = {
    "dtflab default (0.1 M)": dict(blocks=2, d_model=64, heads=4, sequence=32, vocabulary=23,
                                    batch=16),
    "GPT-2 small (124 M)": dict(blocks=12, d_model=768, heads=12, sequence=1024,
                                vocabulary=50257, batch=8),
    "GPT, 32 x 4096 (6.7 B)": dict(blocks=32, d_model=4096, heads=32, sequence=4096,
                             vocabulary=32000, batch=8, tied=False),
    "GPT, 80 x 8192 (65 B)": dict(blocks=80, d_model=8192, heads=64, sequence=4096,
                              vocabulary=32000, batch=8, tied=False),
    "Llama 3 8B": dict(blocks=32, d_model=4096, heads=32, kv_heads=8, hidden=14336,
                       sequence=8192, vocabulary=128256, batch=8, **LLAMA),
    "Llama 3 70B": dict(blocks=80, d_model=8192, heads=64, kv_heads=8, hidden=28672,
                        sequence=8192, vocabulary=128256, batch=8, **LLAMA),
    "Llama 3 405B": dict(blocks=126, d_model=16384, heads=128, kv_heads=8, hidden=53248,
                         sequence=8192, vocabulary=128256, batch=8, **LLAMA),
    "Mixtral 8x7B": dict(blocks=32, d_model=4096, heads=32, kv_heads=8, hidden=14336,
                         sequence=32768, vocabulary=32000, batch=8, experts=8, top_k=2,
                         **LLAMA),
    "Qwen1.5-MoE-A2.7B (shared experts)": dict(
        blocks=24, d_model=2048, heads=16, hidden=1408, sequence=8192, vocabulary=151936,
        batch=8, experts=60, top_k=4, shared_experts=4, **LLAMA),
}

#: Where each preset's shape comes from, and its published parameter count (a check).
SOURCES = {
    "GPT-2 small (124 M)": ("Radford et al. 2019, Table 2; Hugging Face gpt2 config.json", 124e6),
    "Llama 3 8B": ("Dubey et al. 2024, The Llama 3 Herd of Models, Table 3; "
                   "meta-llama/Meta-Llama-3-8B config.json", 8.03e9),
    "Llama 3 70B": ("Dubey et al. 2024, Table 3; meta-llama/Meta-Llama-3-70B config.json",
                    70.6e9),
    "Llama 3 405B": ("Dubey et al. 2024, Table 3; meta-llama/Llama-3.1-405B config.json",
                     405.9e9),
    "Mixtral 8x7B": ("Jiang et al. 2024, Mixtral of Experts, Table 1 (46.7 B parameters, "
                     "12.9 B active)", 46.7e9),
    "Qwen1.5-MoE-A2.7B (shared experts)": (
        "Qwen/Qwen1.5-MoE-A2.7B config.json (60 experts of 1,408, top 4; one shared expert "
        "of 5,632 = 4 x 1,408, its sigmoid gate left out; DeepSeekMoE's shared experts, Dai et "
        "al. 2024); the model card's 14.3 B parameters", 14.3e9),
}
