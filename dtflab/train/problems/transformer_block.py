"""A transformer block's parts as each choice of ``train.transformer`` builds them: the
normalisation (GPT-2's LayerNorm or Llama's RMSNorm), causal self-attention (a key and value
head for every query head, or grouped-query attention's fewer; learned positions, added to
the embedding, or rotary ones, turned into the queries and keys), and the MLP (GELU of 4d, or
SwiGLU of its own width), dense or a mixture of experts (``problems.experts``).

The loops that cut a block (tensor, context and expert parallelism) call these parts on their
share of the weights, so every loop builds the block one way.
"""

from __future__ import annotations

import math

import numpy as np

from dtflab import checks
from dtflab.train.problems import fused_attention
from dtflab.train.problems import transformer_ops as ops

NORMS, POSITIONS, ACTIVATIONS = ("layer", "rms"), ("learned", "rotary"), ("gelu", "swiglu")
ATTENTION = ("plain", "fused")


def norm_parts(problem) -> tuple[str, ...]:
    """The parameters of each of ``problem``'s normalisations, after its prefix (``ln1_``)."""
    return ("scale", "bias") if problem.norm == "layer" else ("scale",)


def normalise(tf, problem, weights, h, name: str = "lnf"):
    """``h`` normalised by ``problem``'s norm with ``weights`` (:func:`norm_parts`' order)."""
    with tf.name_scope(name):
        if problem.norm == "layer":
            return ops.layer_norm(tf)(h, *weights)
        return ops.rms_norm(tf)(h, *weights)


def mlp_width(problem) -> int:
    """Columns of the MLP's first matrix: its hidden width, twice it for SwiGLU's gate and up."""
    return problem.hidden * (2 if problem.activation == "swiglu" else 1)


def activate(tf, problem, x):
    """The MLP's activation on the first matrix's output (SwiGLU: on [gate | up])."""
    return (ops.swiglu if problem.activation == "swiglu" else ops.gelu)(tf)(x)


def attention(tf, problem, a, qkv_w, qkv_b, proj_w, proj_b, heads: int | None = None,
              kv_heads: int | None = None, positions=None):
    """Causal self-attention on a block's normalised input ``a`` ([batch, n, d]), for ``heads``
    query heads and ``kv_heads`` key/value heads (default: all of each), whose columns of
    ``qkv_w`` are [queries | keys | values] (or a list of such pieces, with ``qkv_b``'s);
    rotary positions are ``positions`` (default 0 to
    n - 1; context parallelism passes each piece's). ``proj_b=None`` leaves the output's bias
    to be added after tensor parallelism's sum."""
    size = problem.head_size
    heads, kv_heads = heads or problem.heads, kv_heads or problem.kv_heads
    n = a.shape[1]
    with tf.name_scope("attention"):
        if isinstance(qkv_w, list):  # the columns in pieces (a lent key/value head): no copy
            qkv = tf.concat([ops.dense(tf, a, w) for w in qkv_w], -1) + tf.concat(qkv_b, -1)
        else:
            qkv = ops.dense(tf, a, qkv_w) + qkv_b
        q, k, v = (tf.transpose(tf.reshape(part, [-1, n, count, size]), [0, 2, 1, 3])
                   for part, count in zip(
                       tf.split(qkv, [heads * size, kv_heads * size, kv_heads * size], axis=-1),
                       (heads, kv_heads, kv_heads)))
        if problem.positions == "rotary":
            turn = ops.rotary(tf, np.arange(n) if positions is None else positions, size)
            q, k = turn(q), turn(k)
        if problem.attention_block:
            joined = fused_attention.core(tf, problem.attention_block, heads // kv_heads)(q, k, v)
        else:
            core = ops.attention_core(tf, n, size, a.dtype, heads // kv_heads)
            out = (ops.recomputed(tf, core) if problem.recompute == "selective" else core)(q, k, v)
            joined = tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [-1, n, heads * size])
        projected = ops.dense(tf, joined, proj_w)
        return projected if proj_b is None else projected + proj_b


def mlp(tf, problem, m, fc_w, fc_b, out_w, out_b):
    """The dense MLP on its normalised input ``m``; ``out_b=None`` leaves the output's bias to be
    added after tensor parallelism's sum."""
    with tf.name_scope("mlp"):
        hidden = activate(tf, problem, ops.dense(tf, m, fc_w) + fc_b)
        output = ops.dense(tf, hidden, out_w)
        return output if out_b is None else output + out_b


def norm_weights(problem, weights: dict, prefix: str) -> list:
    """The weights of normalisation ``prefix`` (``ln1``) from ``weights`` by name."""
    return [weights[f"{prefix}_{part}"] for part in norm_parts(problem)]


def checked_choices(d_model: int, heads: int, norm: str, positions: str, kv_heads, activation: str,
                    hidden, experts: int, shared_experts: int) -> dict:
    """``train.transformer``'s block choices checked, with their defaults filled in: ``{norm,
    positions, kv_heads, activation, hidden, shared_experts}``."""
    checks.one_of(norm, "norm", NORMS)
    checks.one_of(positions, "positions", POSITIONS)
    checks.one_of(activation, "activation", ACTIVATIONS)
    kv_heads = heads if kv_heads is None else kv_heads
    checks.whole(kv_heads, "kv_heads", example=max(1, heads // 2))
    if heads % kv_heads:
        fits = ", ".join(str(k) for k in range(1, heads + 1) if heads % k == 0)
        raise ValueError(f"kv_heads={kv_heads}: {heads} query heads do not share {kv_heads} "
                         f"key/value heads evenly; use one of {fits}")
    size = d_model // heads
    if positions == "rotary" and size % 2:
        raise ValueError(f"positions='rotary': a head of d_model/heads = {size} is odd, and "
                         f"rotary positions turn pairs; use an even head size, e.g. "
                         f"d_model={2 * heads * math.ceil(size / 2)}")
    if hidden is None:
        hidden = 8 * math.ceil(8 * d_model / 3 / 8) if activation == "swiglu" else 4 * d_model
    checks.whole(hidden, "hidden", example=4 * d_model)
    checks.whole(shared_experts, "shared_experts", minimum=0, example=1)
    if shared_experts and not experts:
        raise ValueError(f"shared_experts={shared_experts}: shared experts sit beside routed "
                         f"ones; add experts=4 (or more), or leave shared_experts=0")
    return dict(norm=norm, positions=positions, kv_heads=kv_heads, activation=activation,
                hidden=hidden, shared_experts=shared_experts)


def checked_attention(attention: str, block, sequence: int, recompute: str) -> dict:
    """``train.transformer``'s ``attention`` and ``attention_block`` checked, the block filled
    in for fused attention (0 for plain): ``{attention_block}``."""
    checks.one_of(attention, "attention", ATTENTION)
    if attention == "plain":
        if block is not None:
            raise ValueError(f"attention_block={block}: a block is fused attention's tile; add "
                             f"attention='fused', or leave attention_block out")
        return dict(attention_block=0)
    if recompute == "selective":
        raise ValueError("recompute='selective' with attention='fused': fused attention already "
                         "computes the scores again in its backward and keeps none; use "
                         "recompute='none' (or 'full')")
    if block is None:
        block = fused_attention.default_block(sequence)
    block = checks.whole(block, "attention_block", example=fused_attention.default_block(sequence))
    if sequence % block:
        fits = fused_attention.default_block(sequence) if block > sequence else max(
            b for b in range(1, block + 1) if sequence % b == 0)
        raise ValueError(f"attention_block={block}: the tiles must cut sequence={sequence} "
                         f"evenly; use attention_block={fits}, or a sequence that is a "
                         f"multiple of {block}")
    return dict(attention_block=block)


def named(choices: dict, heads: int, d_model: int) -> str:
    """The problem's name's suffix for the choices that are not GPT-2's."""
    found = ""
    if choices["kv_heads"] != heads:
        found += f"_kv{choices['kv_heads']}"
    if choices["norm"] == "rms":
        found += "_rms"
    if choices["positions"] == "rotary":
        found += "_rope"
    if choices["activation"] == "swiglu":
        found += f"_swiglu{choices['hidden']}"
    elif choices["hidden"] != 4 * d_model:
        found += f"_mlp{choices['hidden']}"
    if choices.get("attention_block"):
        found += f"_fused{choices['attention_block']}"
    return found
