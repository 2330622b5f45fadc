"""A mixture-of-experts layer in place of a block's MLP (Switch, GShard; Mixtral's top-2): a
router sends each token to its ``top_k`` experts, each expert an MLP d -> hidden -> d of its
own (GELU or SwiGLU, as the dense MLP), and the token's output is the experts' outputs weighted
by the router's probabilities (over the top k, renormalised when k > 1). **Shared experts**
(DeepSeekMoE, Dai et al. 2024; Qwen's MoE) take every token, unrouted and unweighted: one
MLP as wide as all of them, added to the routed experts' output.

**Capacity**, per sequence (GShard's groups, one per sequence, so a data split by whole
sequences routes every token as one process does): an expert takes at most
``ceil(capacity_factor x top_k x sequence / experts)`` of a sequence's tokens, first choices
first, then in position order; the rest are **dropped** by that expert (the residual carries
the token on). An expert computes only the tokens it took: a skewed router makes one expert,
and the worker that holds it, busier than the others, and what it keeps for the backward
follows the routing, which the router learns as the run goes.

**Padded to capacity** (``pad_to_capacity=True``; GShard's and Switch's fixed expert buffers,
Megatron-LM's ``--moe-pad-expert-input-to-capacity``): every expert computes capacity x
sequences rows, the tokens it took and then copies of token 0 that its gate weighs 0. The
losses are the unpadded ones; the work, the bytes that cross and the memory no longer depend
on the routing, so they are known before the run, at the cost of the padding's compute
(capacity_factor x top_k x tokens rows, against top_k x tokens at most).

The **balance loss** (Switch Transformer's auxiliary loss), per sequence, ``experts x sum_e
f_e x P_e`` with f_e the share of the sequence's tokens whose first choice is expert e and P_e
the mean router probability of e, summed over the sequences like the loss and weighted by
``balance``: it is smallest when both are even.
"""

from __future__ import annotations

import math

from dtflab import checks
from dtflab.train.problems import transformer_block as blocks


def checked(experts: int, top_k: int, capacity_factor, pad_to_capacity, recompute: str,
            precision: str) -> None:
    """Refuse a mixture ``train.transformer`` cannot build, naming the value and the fix."""
    if not experts:
        if pad_to_capacity:
            raise ValueError("pad_to_capacity=True pads a mixture's experts; use experts=4 (or "
                             "more) with it, or leave it out")
        return
    checks.whole(experts, "experts", example=4)
    checks.whole(top_k, "top_k", maximum=experts, example=min(2, experts))
    if not isinstance(capacity_factor, (int, float)) or capacity_factor < 1 / experts:
        raise ValueError(f"capacity_factor={capacity_factor!r}: below 1/experts = "
                         f"{1 / experts:.3g} an expert takes no token; use "
                         f"capacity_factor=1.25 (or more, to drop fewer)")
    if not isinstance(pad_to_capacity, bool):
        raise ValueError(f"pad_to_capacity={pad_to_capacity!r}: use True (every expert "
                         f"computes its capacity's rows) or False")
    if recompute == "full" or precision != "float32":
        raise ValueError(f"experts={experts}: a mixture of experts trains in float32 with "
                         f"recompute 'none' or 'selective'; use precision='float32'")


def capacity(problem) -> int:
    """The most tokens of one sequence an expert takes: the one rule, read by the model, the
    planner's ``Plan.routed`` (anything with the four fields) and the bytes' formula (through
    ``Transformer.expert_capacity``)."""
    return math.ceil(problem.capacity_factor * problem.top_k * problem.sequence / problem.experts)


def route(tf, problem, m, router_w, router_b):
    """``(weight, routed, balance_loss, first)`` for the normalised input ``m`` [batch,
    sequence, d]: each token's gate for each expert that took it, 0 elsewhere; 1 where an
    expert took the token; the balance loss summed over the sequences; each token's first
    choice, one-hot."""
    E, k = problem.experts, problem.top_k
    with tf.name_scope("router"):
        probs = tf.nn.softmax(tf.einsum("bsd,de->bse", m, router_w) + router_b, axis=-1)
        top_p, top_i = tf.math.top_k(probs, k)
        gates = top_p if k == 1 else top_p / tf.reduce_sum(top_p, axis=-1, keepdims=True)
        taken = 0.0  # tokens each expert was offered by earlier choices, per sequence
        weight = routed = 0.0
        for j in range(k):
            mask = tf.one_hot(top_i[..., j], E)                          # [b, s, E]
            position = tf.cumsum(mask, axis=1, exclusive=True) + taken
            keep = mask * tf.cast(position < capacity(problem), mask.dtype)
            taken = taken + tf.reduce_sum(mask, axis=1, keepdims=True)
            weight, routed = weight + gates[..., j:j + 1] * keep, routed + keep
        first = tf.one_hot(top_i[..., 0], E)
        balance = E * tf.reduce_sum(tf.reduce_mean(first, axis=1) * tf.reduce_mean(probs, axis=1))
    return weight, routed, balance, first


def expert_mlp(tf, problem, tokens, fc_w, fc_b, out_w, out_b):
    """One expert on its tokens [n, d], with ``problem``'s activation (GELU or SwiGLU)."""
    return tf.matmul(blocks.activate(tf, problem, tf.matmul(tokens, fc_w) + fc_b), out_w) + out_b


def shared(tf, problem, m, weights: dict):
    """The shared experts on every token of ``m`` (one MLP as wide as all of them; DeepSeek's
    shared experts), or None without them."""
    if not problem.shared_experts:
        return None
    with tf.name_scope("shared_experts"):
        return blocks.mlp(tf, problem, m, *(weights[f"shared_{part}"]
                                             for part in ("fc_w", "fc_b", "out_w", "out_b")))


def taken_by(tf, routed, e):
    """The flat indices (over batch x sequence) of the tokens expert ``e`` took."""
    return tf.where(tf.reshape(routed[..., e], [-1]) > 0)[:, 0]


def dispatched(tf, problem, routed, gate, e, sequences):
    """``(index, weight)``: the flat indices of the tokens expert ``e`` took of ``sequences``
    sequences (an int, or a scalar tensor) (:func:`taken_by`) and their gates (``gate``
    [tokens, experts]); with ``pad_to_capacity``, both padded to capacity x sequences rows,
    index 0 and gate 0."""
    index = taken_by(tf, routed, e)
    weight = tf.gather(gate[:, e], index)
    if problem.pad_to_capacity:
        slots = capacity(problem) * sequences
        pad = [[0, slots - tf.shape(index)[0]]]  # never below 0: capacity caps each sequence
        index, weight = tf.pad(index, pad), tf.pad(weight, pad)
        if isinstance(slots, int):
            index.set_shape([slots])
            weight.set_shape([slots])
    return index, weight


def mixture(tf, problem, m, weights: dict):
    """The layer on ``m`` [batch, sequence, d] in one place, from the block's ``weights`` by
    name: ``(output, balance_loss, load)``, load the tokens each expert took [experts]
    (dropped: top_k x tokens - their sum); the shared experts' output added."""
    router_w, router_b, fc_w, fc_b, out_w, out_b = (weights[name] for name in (
        "router_w", "router_b", "experts_fc_w", "experts_fc_b", "experts_out_w", "experts_out_b"))
    d = problem.d_model
    with tf.name_scope("experts"):
        weight, routed, balance, _ = route(tf, problem, m, router_w, router_b)
        flat = tf.reshape(m, [-1, d])
        gate = tf.reshape(weight, [-1, problem.experts])
        output = tf.zeros_like(flat)
        # one unstack each: its gradient is one stack (indexing each expert made a full-size
        # gradient per expert)
        fc_w, fc_b, out_w, out_b = (tf.unstack(w) for w in (fc_w, fc_b, out_w, out_b))
        sequences = tf.shape(m)[0]
        for e in range(problem.experts):
            with tf.name_scope(f"expert{e}"):
                index, taken = dispatched(tf, problem, routed, gate, e, sequences)
                y = expert_mlp(tf, problem, tf.gather(flat, index), fc_w[e], fc_b[e], out_w[e],
                               out_b[e])
                output += tf.scatter_nd(index[:, None], y * taken[:, None],
                                        tf.shape(flat, out_type=tf.int64))
        load = tf.reduce_sum(routed, axis=[0, 1])
        output = tf.reshape(output, tf.shape(m))
        always = shared(tf, problem, m, weights)
    return (output if always is None else output + always), balance, load


def dense_only(problem, loop: str) -> None:
    """Refuse a mixture of experts in ``loop``, a loop that splits a dense MLP."""
    if getattr(problem, "experts", 0):
        raise ValueError(f"experts={problem.experts}: {loop} splits a dense MLP; train a "
                         f"mixture of experts with train.expert_parallel or train.single")
