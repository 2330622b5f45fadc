"""What one device holds to train ``train.transformer`` on one process, by kind, in bytes:
predicted from the shape alone (pure Python), and checked against what TensorFlow allocated in
a traced step (``measure.memory``).

With N parameters, float32 and Adam:

- **parameters** 4·N; **gradients** 4·N (every parameter's, each until Adam has used it);
- **optimizer state** 8·N + 8: Adam's m and v per parameter, and its two beta powers;
- **weight copies** (16 bits only, below): the 16-bit copies of the weights that the forward
  casts and keeps for the backward, a kind of their own, as a paper's or a framework's
  breakdown counts them beside the parameters;
- **activations** (what the forward pass keeps for the backward), with s the sequence, b the
  batch, d = d_model, a heads, V the vocabulary and L blocks, in float32 elements, as
  TensorFlow 2.21 keeps them when the backward waits for the forward (one inter-op thread;
  ``measure.memory``):

  - per block, 16·s·b·d + a·s²·b + 2·s·b: each LayerNorm's normalised input, which its
    backward reads, and its output, which the qkv or the MLP's first matrix multiply
    (4·s·b·d), and each row's 1/std (2·s·b); q, k and v (3·s·b·d), the softmax (a·s²·b) and
    the joined heads the projection multiplies (s·b·d); the MLP's 4d-wide input to GELU and
    GELU's output (8·s·b·d);
  - outside the blocks, s·b·(2·V + 2·d + 2): the residual stream, one buffer the residual
    adds update in place (s·b·d); the one-hot tokens the embedding multiplies (s·b·V); the
    final LayerNorm's normalised input and 1/std (s·b·d + s·b); the cross-entropy's
    gradient, computed in its forward (s·b·V), and its losses (s·b).

  That is s·b·d·(64 + 4·a·s/d) + 8·s·b bytes per block: Korthikanti et al. 2022's
  s·b·h·(34 + 5·a·s/h) for 16 bits with dropout is s·b·h·(32 + 2·a·s/h) without dropout's
  masks and outputs, twice that in float32, the same count term by term (they keep each
  LayerNorm's input where this keeps its normalised input; the 1/std is the 8·s·b).
  LayerNorm and GELU keep only what fused kernels keep (``problems.transformer``);
  TensorFlow's autodiff of their formulas would keep every intermediate.

The levers (``problems.transformer``), each derived from the ops that keep each term and
checked against a traced step (``tests/test_memory.py``); p is the bytes of the compute type
(4 in float32, 2 in bfloat16 or float16):

- **recompute="selective"**: the softmax (a·s²·b per block) is no longer kept; the rest is.
- **recompute="full"**: per block only its input, s·b·d; the outside terms stay.
- **fused attention** (``attention="fused"``): no softmax kept (a·s²·b), as with selective
  recomputation, but each query row's log-sum-exp, a·s·b float32 values a block.
- **16 bits**: every term above in p bytes, except what stays float32: LayerNorm's 1/std
  (2·s·b per block, s·b outside), the loss's gradient and losses (s·b·(V + 1)). The forward
  also keeps the 16-bit copies of the weights a backward multiplies by: the output layer's
  (V·d, tied or not), each block's four matrices (12·d²) and the norms' scales (d each, the
  final one's too), or with full recomputation every block parameter (12·d² + 13·d), which
  the block's second run reads, and the final norm's scale: the **weight copies** kind. On a
  small model those copies outweigh what 16 bits save on the activations: full recomputation
  in 16 bits can keep more than in float32.
- **micro-batches** k: the activations of one micro-batch, b/k sequences; parameters,
  gradients (their running sum) and optimizer state unchanged.

It leaves out what the step allocates and frees while it runs (each op's output before its
consumer has read it; the transient peak, measured only) and TensorFlow's own buffers.
"""

from __future__ import annotations

from dtflab.train.formulas import transformer as shape_formulas
from dtflab.train.formulas.transformer import block_matrices, block_parameters
from dtflab.train.layouts.layout import PRECISIONS

FLOAT32 = 4
KINDS = ("parameters", "weight_copies", "gradients", "optimizer", "activations")
#: Bytes per element of each compute type ``train.transformer(precision=)`` takes.
BYTES = dict(zip(PRECISIONS, (4, 2, 2)))  # the layout names them


def activation_bytes(blocks: int, d_model: int, heads: int, sequence: int, batch: int,
                     vocabulary: int, *, recompute: str = "none", precision: str = "float32",
                     kv_heads: int | None = None, hidden: int | None = None,
                     activation: str = "gelu", fused: bool = False,
                     norm: str = "layer") -> dict[str, int]:
    """Bytes the forward keeps for the backward: ``{"per_block", "outside", "weight_copies",
    "total"}`` (see the module's docstring); ``fused``: fused attention's."""
    s, b, d, a, v = sequence, batch, d_model, heads, vocabulary
    p = BYTES[precision]
    kept = block_elements(d, a, s, b, kv_heads, hidden, activation)
    attention = FLOAT32 * a * s * b if fused else p * a * s * s * b
    per_block = {"none": p * kept + attention + FLOAT32 * 2 * s * b,
                 "selective": p * kept + FLOAT32 * 2 * s * b,
                 "full": p * s * b * d}[recompute]
    outside = p * s * b * (v + 2 * d) + FLOAT32 * s * b * (v + 2)
    weight_copies = 0
    if precision != "float32":
        choices = dict(heads=heads, kv_heads=kv_heads, hidden=hidden, activation=activation)
        block = (block_parameters(d, norm=norm, **choices) if recompute == "full"
                 else block_matrices(d, **choices) + 2 * d)  # and the two norms' scales
        weight_copies = p * (v * d + d + blocks * block)  # d: the final norm's scale
    return {"per_block": per_block, "outside": outside, "weight_copies": weight_copies,
            "total": blocks * per_block + outside + weight_copies}


def block_elements(d: int, heads: int, s: int, b: int, kv_heads: int | None = None,
                   hidden: int | None = None, activation: str = "gelu", ways: int = 1,
                   whole: int = 4) -> int:
    """Elements a block keeps besides the softmax and the norms' 1/std: 16·s·b·d for GPT-2's.
    ``whole`` of them (the norms' normalised inputs and outputs, 4·s·b·d) stay whole under
    ``ways``-way tensor parallelism; the queries and joined heads (2·s·b·d), the keys and
    values (2·s·b·d·kv/a: a key/value head per ``heads / kv_heads`` query heads, one on each
    worker where the ways outnumber them) and the MLP's (GELU's input and output, 2·s·b·h;
    SwiGLU's gate, up and output, 3·s·b·h) are cut."""
    kv = kv_heads or heads
    hidden = hidden or 4 * d
    keys = 2 * s * b * (d // heads) * shape_formulas.kv_heads_per_worker(kv, ways)
    mlp = (3 if activation == "swiglu" else 2) * s * b * hidden // ways
    return whole * s * b * d + 2 * s * b * d // ways + keys + mlp


def transformer_bytes(problem, batch: int | None = None, micro_batches: int = 1) -> dict[str, int]:
    """Bytes one device holds to train ``problem`` (a ``Transformer``) on ``batch`` sequences
    (default: its batch) in ``micro_batches`` micro-batches, by kind (:data:`KINDS`):
    ``parameters``, ``weight_copies`` (0 in float32), ``gradients``, ``optimizer``,
    ``activations``."""
    if problem.experts:
        raise ValueError(f"experts={problem.experts}: the one-device count is for a dense "
                         f"transformer; the planner's (dtflab.plan) counts a mixture")
    n = shape_formulas.parameters(problem.blocks, problem.d_model, problem.vocabulary,
                                  problem.sequence, problem.tied,
                                  **shape_formulas.choices_of(problem))
    activations = activation_bytes(problem.blocks, problem.d_model, problem.heads,
                                   problem.sequence, (batch or problem.batch_size) // micro_batches,
                                   problem.vocabulary, recompute=problem.recompute,
                                   precision=problem.precision, kv_heads=problem.kv_heads,
                                   hidden=problem.hidden, activation=problem.activation,
                                   fused=bool(problem.attention_block), norm=problem.norm)
    copies = activations["weight_copies"]
    return {"parameters": FLOAT32 * n, "weight_copies": copies, "gradients": FLOAT32 * n,
            "optimizer": 2 * FLOAT32 * n + 2 * FLOAT32,
            "activations": activations["total"] - copies}


def split_activation_bytes(problem, ways: int, sequence_parallel: bool = False) -> list[int]:
    """Activation bytes each of ``ways`` workers keeps in one step of ``train.tensor_parallel``
    on ``problem`` (a ``Transformer``), worker 0 first, as ``run.traced_memory`` reads them.

    Per block, tensor parallelism cuts q, k and v, the softmax, the joined heads and the MLP's
    4d-wide terms by t = ``ways`` (12·s·b·d + a·s²·b of the 16·s·b·d + a·s²·b above) and leaves
    each worker its own LayerNorms: their normalised inputs and outputs (4·s·b·d) and 1/std
    (2·s·b, float32). Sequence parallelism cuts the LayerNorms too, but the matrix multiply
    after each keeps its input gathered whole: 2·s·b·d / t + 2·s·b·d and 2·s·b / t (Megatron
    gathers it again in the backward instead; in dtflab's one graph a tensor crosses once a
    step). Worker 0 also keeps the terms outside the blocks. A tensor that only the transport
    still holds when a forward ends (under sequence parallelism, each other worker's piece of
    the last block's output, on its way to worker 0's gather) is not kept, and
    ``run.traced_memory`` does not count it. Counted for float32 and ``recompute="none"`` or
    ``"selective"`` (where 16-bit weight copies and full recomputation go per worker is not
    measured yet)."""
    if problem.recompute == "full" or problem.precision != "float32":
        raise ValueError(f"recompute={problem.recompute!r}, precision={problem.precision!r}: "
                         f"split_activation_bytes counts float32 with recompute 'none' or "
                         f"'selective'; use train.transformer(recompute='selective')")
    s, b, d, a, t = problem.sequence, problem.batch_size, problem.d_model, problem.heads, ways
    p = FLOAT32
    softmax = a * s * s * b // t if problem.recompute == "none" else 0
    if problem.attention_block:  # fused: each row's log-sum-exp, float32
        softmax = a * s * b // t
    choices = dict(kv_heads=problem.kv_heads, hidden=problem.hidden,
                   activation=problem.activation)
    if sequence_parallel:
        norms = p * (2 * s * b * d // t + 2 * s * b * d) + FLOAT32 * 2 * s * b // t
    else:
        norms = p * 4 * s * b * d + FLOAT32 * 2 * s * b
    per_block = norms + p * (block_elements(d, a, s, b, ways=t, whole=0, **choices) + softmax)
    whole = activation_bytes(problem.blocks, d, a, s, b, problem.vocabulary,
                             recompute=problem.recompute, fused=bool(problem.attention_block),
                             **choices)
    return ([problem.blocks * per_block + whole["outside"]]
            + [problem.blocks * per_block] * (t - 1))
