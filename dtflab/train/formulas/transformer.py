"""The transformer's size and work, from its shape alone (pure Python): what ``train.transformer``
builds (``problems.transformer``), counted the way the references count it.

Parameters, with d = d_model, L blocks, V the vocabulary and S the sequence:

- embeddings: V·d for the tokens, S·d for learned positions (none for rotary ones);
- per block 12·d² + 13·d: the attention's qkv (3·d² + 3·d) and projection (d² + d), the MLP's
  two matrices (4·d² + 4·d and 4·d² + d), two LayerNorms (2·d each); grouped-query attention,
  SwiGLU, RMSNorm and experts change each term (:func:`block_parameters`);
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
               tied: bool = True, **choices) -> int:
    """How many parameters ``train.transformer`` with this shape has; ``choices`` are its block
    choices (:func:`block_parameters`)."""
    d = d_model
    norm = d * (2 if choices.get("norm", "layer") == "layer" else 1)
    positions = sequence * d if choices.get("positions", "learned") == "learned" else 0
    return (vocabulary * d + positions + blocks * block_parameters(d_model, **choices) + norm
            + (0 if tied else d * vocabulary))


def kv_heads_per_worker(kv_heads: int, ways: int) -> int:
    """The key/value heads one of ``ways`` workers attends with, where the heads are split
    among them (tensor or Ulysses ways): its share, or the one head it copies where the ways
    outnumber the heads."""
    return max(kv_heads // ways, 1)


def block_parameters(d_model: int, *, heads: int = 1, kv_heads: int | None = None,
                     hidden: int | None = None, activation: str = "gelu", norm: str = "layer",
                     experts: int = 0, shared_experts: int = 0, active: int | None = None,
                     **_) -> int:
    """One block's parameters, 12·d² + 13·d for GPT-2's: two norms (2·d each, RMSNorm's d), the
    qkv (d·(d + 2·kv·d/a) and its bias), the projection (d² + d), and the MLP of hidden width h
    (GELU: d·h + h + h·d + d; SwiGLU's gate and up: 2·d·h + 2·h + h·d + d), or a router
    (d·E + E), E experts and the shared ones; ``active`` counts only that many routed experts
    (a token's top k)."""
    d = d_model
    kv = (kv_heads or heads) * d // heads
    mlp = lambda count: mlp_parameters(d, count * (hidden or 4 * d), activation)
    attention = d * (d + 2 * kv) + d + 2 * kv + d * d + d
    norms = 2 * d * (2 if norm == "layer" else 1)
    if not experts:
        return norms + attention + mlp(1)
    routed = experts if active is None else active
    shared = mlp(shared_experts) if shared_experts else 0
    return norms + attention + d * experts + experts + routed * mlp(1) + shared


def mlp_parameters(d_model: int, hidden: int, activation: str = "gelu") -> int:
    """An MLP's (or one expert's) parameters: d·h + h + h·d + d with GELU, SwiGLU's gate and up
    2·d·h + 2·h + h·d + d."""
    gates = 2 if activation == "swiglu" else 1
    return gates * d_model * hidden + gates * hidden + hidden * d_model + d_model


def training_flops_per_token(blocks: int, d_model: int, vocabulary: int, sequence: int,
                             tied: bool = True, **choices) -> dict[str, int]:
    """FLOPs of one training step per token: ``{"weights": 6 N, "attention": 12 L S d,
    "total": ...}``, N the parameters a token meets (with experts, its top k of them)."""
    if choices.get("experts"):
        choices = {**choices, "active": choices.get("top_k", 1)}
    n = parameters(blocks, d_model, vocabulary, sequence, tied, **choices)
    found = {"weights": 6 * n, "attention": 12 * blocks * sequence * d_model}
    found["total"] = found["weights"] + found["attention"]
    return found


def matmul_flops_per_token(blocks: int, d_model: int, vocabulary: int, sequence: int,
                           **choices) -> int:
    """The FLOPs per token of the matrix multiplies one training step of a dense
    ``train.transformer`` runs, exactly: each block's matrices (12·d² weights for GPT-2's) and
    the output layer (d·V) at 6 FLOPs per weight, the one-hot embedding at 4 (its input needs
    no gradient), attention's 12·S·d per block. What ``6·N`` counts beyond this: the position
    embedding, the biases and the norms' parameters, which are added or scaled, never
    multiplied by a matrix."""
    d = d_model
    return (6 * block_matrices(d, **choices) * blocks + 6 * d * vocabulary
            + 4 * vocabulary * d + 12 * blocks * sequence * d)


def block_matrices(d_model: int, *, heads: int = 1, kv_heads: int | None = None,
                   hidden: int | None = None, activation: str = "gelu", **_) -> int:
    """The weights of a dense block's matrices: 12·d² for GPT-2's."""
    d = d_model
    kv = (kv_heads or heads) * d // heads
    gates = 2 if activation == "swiglu" else 1
    return d * (d + 2 * kv) + d * d + (gates + 1) * d * (hidden or 4 * d)


def choices_of(problem) -> dict:
    """A ``Transformer`` problem's block choices, as the functions above take them."""
    return {name: getattr(problem, name) for name in (
        "heads", "kv_heads", "hidden", "activation", "norm", "positions", "experts",
        "shared_experts", "top_k")}


def of(problem) -> dict[str, int]:
    """A ``Transformer`` problem's ``parameters`` and its training FLOPs per token
    (``flops_weights``, ``flops_attention``, ``flops_total``)."""
    shape = (problem.blocks, problem.d_model, problem.vocabulary, problem.sequence, problem.tied)
    choices = choices_of(problem)
    flops = training_flops_per_token(*shape, **choices)
    return {"parameters": parameters(*shape, **choices),
            **{f"flops_{part}": value for part, value in flops.items()},
            "matmul_flops": matmul_flops_per_token(*shape[:4], **choices)}
