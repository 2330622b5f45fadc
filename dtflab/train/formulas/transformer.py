"""The transformer's size and work, from its shape alone (pure Python): what ``train.transformer``
builds (``problems.transformer``), counted the way the references count it.

Parameters, with d = d_model, L blocks, V the vocabulary and S the sequence:

- embeddings: V·d for the tokens, S·d for the positions;
- per block 12·d² + 13·d: the attention's qkv (3·d² + 3·d) and projection (d² + d), the MLP's
  two matrices (4·d² + 4·d and 4·d² + d), two LayerNorms (2·d each);
- the final LayerNorm (2·d) and, untied, the output layer (d·V).

Training FLOPs per token, 6·N + 12·L·S·d (PaLM, Chowdhery et al. 2022, appendix B; the
Ultra-Scale Playbook's): every parameter is in one multiply-add per token forward (2 FLOPs) and
two backward (4), and attention adds, per block and token, a row of scores q·kᵀ and a
weighted sum of the values, each S·d multiply-adds forward (4·S·d FLOPs), three times that
with the backward. The causal mask does not halve it here: the masked scores are computed,
then discarded. Left out: LayerNorm, softmax, GELU, the optimizer (a few FLOPs per element,
under 5% at d = 64).
"""

from __future__ import annotations


def parameters(blocks: int, d_model: int, vocabulary: int, sequence: int,
               tied: bool = True) -> int:
    """How many parameters ``train.transformer`` with this shape has."""
    d = d_model
    return (vocabulary * d + sequence * d + blocks * (12 * d * d + 13 * d) + 2 * d
            + (0 if tied else d * vocabulary))


def training_flops_per_token(blocks: int, d_model: int, vocabulary: int, sequence: int,
                             tied: bool = True) -> dict[str, int]:
    """FLOPs of one training step per token: ``{"weights": 6 N, "attention": 12 L S d,
    "total": ...}``."""
    n = parameters(blocks, d_model, vocabulary, sequence, tied)
    found = {"weights": 6 * n, "attention": 12 * blocks * sequence * d_model}
    found["total"] = found["weights"] + found["attention"]
    return found


def matmul_flops_per_token(blocks: int, d_model: int, vocabulary: int, sequence: int) -> int:
    """The FLOPs per token of the matrix multiplies one training step of ``train.transformer``
    runs, exactly: each block's four matrices (12·d² weights) and the output layer (d·V) at
    6 FLOPs per weight, the one-hot embedding at 4 (its input needs no gradient), attention's
    12·S·d per block. What ``6·N`` counts beyond this: the position embedding, the biases and
    LayerNorm's parameters, which are added or scaled, never multiplied by a matrix."""
    d = d_model
    return (6 * 12 * d * d * blocks + 6 * d * vocabulary + 4 * vocabulary * d
            + 12 * blocks * sequence * d)


def of(problem) -> dict[str, int]:
    """A ``Transformer`` problem's ``parameters`` and its training FLOPs per token
    (``flops_weights``, ``flops_attention``, ``flops_total``)."""
    shape = (problem.blocks, problem.d_model, problem.vocabulary, problem.sequence, problem.tied)
    flops = training_flops_per_token(*shape)
    return {"parameters": parameters(*shape),
            **{f"flops_{part}": value for part, value in flops.items()},
            "matmul_flops": matmul_flops_per_token(*shape[:4])}
