"""What one device holds to train ``train.transformer`` on one process, by kind, in bytes:
predicted from the shape alone (pure Python), and checked against what TensorFlow allocated in
a traced step (``measure.memory``).

With N parameters, float32 and Adam:

- **parameters** 4·N; **gradients** 4·N (every parameter's, each until Adam has used it);
- **optimizer state** 8·N + 8: Adam's m and v per parameter, and its two beta powers;
- **activations** (what the forward pass keeps for the backward), with s the sequence, b the
  batch, d = d_model, a heads, V the vocabulary and L blocks, in float32 elements, as
  TensorFlow 2.21 keeps them when the backward waits for the forward (one inter-op thread;
  ``measure.memory``):

  - per block, 14·s·b·d + a·s²·b + 2·s·b: the two LayerNorms' outputs, which the qkv and the
    MLP's first matrix multiply (2·s·b·d), and each row's 1/std (2·s·b); q, k and v
    (3·s·b·d), the softmax (a·s²·b) and the joined heads the projection multiplies (s·b·d);
    the MLP's 4d-wide input to GELU and GELU's output (8·s·b·d);
  - outside the blocks, s·b·d + s·b·(2·V + d + 2): the residual stream, one buffer the
    residual adds update in place (s·b·d); the one-hot tokens the embedding multiplies
    (s·b·V); the final LayerNorm's output and 1/std (s·b·d + s·b); the cross-entropy's
    gradient, computed in its forward (s·b·V), and its losses (s·b).

  That is s·b·d·(56 + 4·a·s/d) bytes per block. Korthikanti et al. 2022 count s·b·h·(34 +
  5·a·s/h) in 16 bits with dropout: without dropout's masks and outputs, s·b·h·(32 +
  2·a·s/h), or s·b·h·(64 + 4·a·s/h) in float32. The 8·s·b·d less here are the LayerNorms'
  inputs, which they count and TensorFlow does not keep: the residual adds run in place, and
  each LayerNorm's backward reads its output and 1/std. LayerNorm and GELU keep only what
  fused kernels keep (``problems.transformer``); TensorFlow's autodiff of their formulas would
  keep every intermediate.

It leaves out what the step allocates and frees while it runs (each op's output before its
consumer has read it; the transient peak, measured only) and TensorFlow's own buffers.
"""

from __future__ import annotations

from dtflab.train.formulas import transformer as shape_formulas

FLOAT32 = 4
KINDS = ("parameters", "gradients", "optimizer", "activations")


def activation_elements(blocks: int, d_model: int, heads: int, sequence: int, batch: int,
                        vocabulary: int) -> dict[str, int]:
    """Float32 elements the forward keeps for the backward: ``{"per_block", "outside",
    "total"}`` (see the module's docstring)."""
    s, b, d, a = sequence, batch, d_model, heads
    per_block = 14 * s * b * d + a * s * s * b + 2 * s * b
    outside = s * b * d + s * b * (2 * vocabulary + d + 2)
    return {"per_block": per_block, "outside": outside, "total": blocks * per_block + outside}


def transformer_bytes(problem, batch: int | None = None) -> dict[str, int]:
    """Bytes one device holds to train ``problem`` (a ``Transformer``) on ``batch`` sequences
    (default: its batch), by kind: ``parameters``, ``gradients``, ``optimizer``,
    ``activations``."""
    n = shape_formulas.parameters(problem.blocks, problem.d_model, problem.vocabulary,
                                  problem.sequence, problem.tied)
    activations = activation_elements(problem.blocks, problem.d_model, problem.heads,
                                      problem.sequence, batch or problem.batch_size,
                                      problem.vocabulary)
    return {"parameters": FLOAT32 * n, "gradients": FLOAT32 * n,
            "optimizer": 2 * FLOAT32 * n + 2 * FLOAT32,
            "activations": FLOAT32 * activations["total"]}
