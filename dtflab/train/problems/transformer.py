"""A decoder-only transformer on dtflab's own text (``problems.text``): the model every reference
on training at scale teaches on, small enough to train here.

Tokens are characters. A batch is ``batch_size`` windows of ``sequence + 1`` tokens; the model
reads the first ``sequence`` and predicts each next one. The model, GPT-2's shape in float32:

- the token embedding (``wte``, vocabulary x d_model; a one-hot matmul, so its gradient is
  dense like every other) plus a learned position embedding (``wpe``);
- ``blocks`` blocks, each: LayerNorm, causal multi-head self-attention (one ``qkv`` matrix,
  d x 3d, then heads of d/heads; scores scaled by 1/sqrt(d/heads), the future masked, softmax,
  the heads joined and projected, d x d), a residual; LayerNorm, an MLP d -> 4d -> d with
  GELU (tanh form), a residual. LayerNorm and GELU keep for their backward only what fused
  kernels keep (GELU its input; LayerNorm its normalised input and each row's 1/std);
- a final LayerNorm and the output layer: ``wte`` transposed (``tied=True``) or its own
  ``lm_head`` (d x vocabulary).

Llama's and DeepSeek's blocks are choices of the same problem (``problems.transformer_block``).

The loss of a batch is the sum over its sequences of each sequence's mean cross-entropy per
token, so a batch's loss and gradients are the sums of its slices' (what data parallelism and
gradient accumulation need) and the loss per example a loop reports is the mean per token.

Two memory levers are part of the problem, so every loop that trains it uses them:

- ``recompute``: ``"none"``; ``"selective"``, the attention's core (scores, softmax, the
  weighted sum of the values) run again in the backward instead of keeping the softmax
  (Korthikanti et al. 2022); ``"full"``, each block run again, only its input kept. The
  recomputation waits for the gradient that reaches it (a control dependency), so TensorFlow's
  common-subexpression pass cannot merge it back into the forward.
- ``precision``: ``"float32"``; ``"bfloat16"`` or ``"float16"``, the forward and backward in
  16 bits (matmul inputs, activations) with float32 master weights, Adam and loss;
  LayerNorm's statistics in float32. float16 scales the loss by :data:`LOSS_SCALE` (static:
  a long run would lower it where a gradient overflows, as Keras's LossScaleOptimizer does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dtflab import checks
from dtflab._quiet import import_tf
from dtflab.train.problems import experts, text
from dtflab.train.problems.experts import checked as checked_mixture
from dtflab.train.problems import transformer_block as block_parts
from dtflab.train.problems import transformer_ops as ops
from dtflab.train.problems.transformer_ops import LOSS_SCALE

#: What ``recompute=`` takes; what ``precision=`` takes.
RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("float32", "bfloat16", "float16")
#: Graph collections a mixture-of-experts block adds to: its balance loss, its load.
BALANCE, LOAD = "dtflab_balance_losses", "dtflab_expert_load"


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer problem (see the module's docstring)."""

    name: str
    blocks: int
    d_model: int
    heads: int
    sequence: int
    vocabulary: int
    batch_size: int
    tied: bool = True
    learning_rate: float = 0.001  # Adam's default
    recompute: str = "none"
    precision: str = "float32"
    experts: int = 0  # 0: every block's MLP is dense; else a mixture of this many (``experts``)
    top_k: int = 1
    capacity_factor: float = 1.25
    balance: float = 0.01
    skew: float = 0.0  # the router's first initial bias toward expert 0
    # Today's choices (``problems.transformer_block``); the defaults are GPT-2's.
    norm: str = "layer"  # or "rms"
    positions: str = "learned"  # or "rotary"
    kv_heads: int = 0  # key/value heads; 0: one per query head
    activation: str = "gelu"  # or "swiglu"
    hidden: int = 0  # the MLP's hidden width (each expert's); 0: 4 d
    shared_experts: int = 0  # experts every token goes through, beside the routed ones
    pad_to_capacity: bool = False  # every expert computes its capacity's rows (``experts``)
    attention_block: int = 0  # fused attention's tile side (``problems.fused_attention``); 0: plain

    def __post_init__(self):
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)
        if not self.hidden:
            object.__setattr__(self, "hidden", 4 * self.d_model)

    @property
    def head_size(self) -> int:
        return self.d_model // self.heads

    @property
    def loss_scale(self) -> float:
        return LOSS_SCALE if self.precision == "float16" else 1.0

    @property
    def expert_capacity(self) -> int:  # of a sequence's tokens (the rule: experts.capacity)
        return experts.capacity(self)

    # -- the parameters ------------------------------------------------------------------------

    def shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every parameter's name and shape, in the order the model uses them."""
        d, v, h, E = self.d_model, self.vocabulary, self.hidden, self.experts
        width = block_parts.mlp_width(self)
        norms = lambda prefix: [(f"{prefix}_{part}", (d,)) for part in block_parts.norm_parts(self)]
        qkv = (self.heads + 2 * self.kv_heads) * self.head_size

        def dense(fc, out, count):  # an MLP (``count`` experts' widths as one)
            return [(f"{fc}_w", (d, count * width)), (f"{fc}_b", (count * width,)),
                    (f"{out}_w", (count * h, d)), (f"{out}_b", (d,))]

        found = [("wte", (v, d))] + ([("wpe", (self.sequence, d))]
                                     if self.positions == "learned" else [])
        for b in range(1, self.blocks + 1):
            found += [*norms(f"h{b}_ln1"), (f"h{b}_qkv_w", (d, qkv)), (f"h{b}_qkv_b", (qkv,)),
                      (f"h{b}_proj_w", (d, d)), (f"h{b}_proj_b", (d,)), *norms(f"h{b}_ln2")]
            if not E:
                found += dense(f"h{b}_fc", f"h{b}_out", 1)
                continue
            found += [(f"h{b}_router_w", (d, E)), (f"h{b}_router_b", (E,)),
                      (f"h{b}_experts_fc_w", (E, d, width)), (f"h{b}_experts_fc_b", (E, width)),
                      (f"h{b}_experts_out_w", (E, h, d)), (f"h{b}_experts_out_b", (E, d))]
            if self.shared_experts:
                found += dense(f"h{b}_shared_fc", f"h{b}_shared_out", self.shared_experts)
        found += norms("lnf")
        if not self.tied:
            found.append(("lm_head", (d, v)))
        return found

    @property
    def parameter_count(self) -> int:
        return sum(math.prod(shape) for _, shape in self.shapes())

    @property
    def parameter_bytes(self) -> int:
        return 4 * self.parameter_count

    def initial_values(self, seed: int = 0) -> list[tuple[str, np.ndarray]]:
        """GPT-2's initialisation, fixed by ``seed``: weights and embeddings normal with standard
        deviation 0.02 (the two projections into the residual stream scaled by
        1/sqrt(2 x blocks)), biases zero, LayerNorm scales one."""
        rng = np.random.default_rng(seed)
        residual = 0.02 / math.sqrt(2 * self.blocks)
        values = []
        for name, shape in self.shapes():
            if name.endswith("_scale"):
                value = np.ones(shape, np.float32)
            elif name.endswith(("_b", "_bias")):
                value = np.zeros(shape, np.float32)
            else:
                std = residual if name.endswith(("_proj_w", "_out_w")) else 0.02
                value = rng.normal(0.0, std, shape).astype(np.float32)
            if name.endswith("_router_b"):
                value[0] = self.skew
            values.append((name, value))
        return values

    def create_variables(self, seed: int = 0) -> list:
        """The parameters as tf.compat.v1 variables with :meth:`initial_values`."""
        tf = import_tf()
        return [tf.compat.v1.get_variable(name, initializer=value)
                for name, value in self.initial_values(seed)]

    # -- the data ------------------------------------------------------------------------------

    def batch(self, step: int, seed: int = 0, part: tuple[int, int] | None = None):
        """``(x, t)`` for ``step``: token windows (int32) and the next token of each position
        (int64), the same for every loop given the same seed; ``part=(i, n)`` is the i-th of n
        equal slices, made without the rest."""
        start, stop = 0, self.batch_size
        if part is not None:
            index, parts = part
            share = self.batch_size // parts
            start, stop = index * share, (index + 1) * share
        rows = np.stack([text.window(seed, step, row, self.sequence + 1)
                         for row in range(start, stop)])
        return rows[:, :-1].astype(np.int32), rows[:, 1:].astype(np.int64)

    def placeholders(self):
        tf = import_tf()
        x = tf.compat.v1.placeholder(tf.int32, [None, self.sequence], name="x")
        t = tf.compat.v1.placeholder(tf.int64, [None, self.sequence], name="t")
        return x, t

    # -- the model -----------------------------------------------------------------------------

    def forward(self, variables, x):
        """Logits for every position of ``x`` ([batch, sequence, vocabulary], float32), from
        ``variables`` in :meth:`shapes`' order."""
        return self.stage_forward(variables, x, 1, self.blocks)

    # -- the model cut into pipeline stages ------------------------------------------------------

    #: What a pipeline cuts this model into (``layouts.layers``).
    unit = "block"

    @property
    def depth(self) -> int:
        return self.blocks

    def unit_work(self) -> list[int]:
        """Each block's multiply-adds per token (its matrices', 12 d^2 for GPT-2's, a token's
        experts' only, and the attention's 2 s d at most), the first with the embedding's and
        the last with the output layer's V d: what a balanced pipeline cut evens out."""
        d, v = self.d_model, self.vocabulary
        mlp = (block_parts.mlp_width(self) + self.hidden) * d
        mlps = (self.top_k + self.shared_experts) * mlp + d * self.experts if self.experts else mlp
        attention = d * (self.heads + 2 * self.kv_heads) * self.head_size + d * d
        work = [attention + mlps + 2 * self.sequence * d] * self.blocks
        work[0] += v * d
        work[-1] += v * d
        return work

    def stage_parameters(self, first: int, last: int) -> list[str]:
        """The names of the parameters that blocks ``first`` to ``last`` read, in
        :meth:`shapes`' order: the first stage also holds the embeddings, the last the final
        LayerNorm and the output layer (tied: the token embedding again, read from the first
        stage, where it lives)."""
        def read(name):
            if name.startswith("h"):
                return first <= int(name[1:name.index("_")]) <= last
            if name in ("lnf_scale", "lnf_bias", "lm_head"):
                return last == self.blocks
            return first == 1 or (name == "wte" and self.tied and last == self.blocks)
        return [name for name, _ in self.shapes() if read(name)]

    def stage_forward(self, variables, h, first: int, last: int):
        """Blocks ``first`` to ``last`` on ``h`` (token ids if ``first`` is 1; logits out if
        ``last`` is the last block), from the variables :meth:`stage_parameters` names. A range
        with no block is the embedding alone, ``(1, 0)``, or the output alone,
        ``(blocks + 1, blocks)``."""
        tf = import_tf()
        compute = tf.as_dtype(self.precision)
        named = dict(zip(self.stage_parameters(first, last),
                         (ops.to_compute(tf, compute, v) for v in variables)))
        if first == 1:
            with tf.name_scope("embedding"):
                h = ops.dense(tf, tf.one_hot(h, self.vocabulary, dtype=compute), named["wte"])
                if self.positions == "learned":
                    h = h + named["wpe"]
        for b in range(first, last + 1):
            with tf.name_scope(f"block{b}"):
                parts = [name[len(f"h{b}_"):] for name in named if name.startswith(f"h{b}_")]
                weights = [named[f"h{b}_{part}"] for part in parts]
                if self.recompute == "full":
                    h = ops.recomputed(tf, lambda h, *w, parts=parts: self.block(
                        tf, h, dict(zip(parts, w))))(h, *weights)
                else:
                    h = self.block(tf, h, dict(zip(parts, weights)))
        if last < self.blocks:
            return h
        with tf.name_scope("output"):
            h = self.normalise(tf, block_parts.norm_weights(self, named, "lnf"), h)
            out = tf.transpose(named["wte"]) if self.tied else named["lm_head"]
            logits = ops.dense(tf, h, out)
            return logits if compute == tf.float32 else ops.to_float32(tf, logits, self.loss_scale)

    def compute_view(self, variable):
        """``variable`` as the type the forward computes in (a cast in 16 bits, whose gradient
        comes back float32 and unscaled)."""
        tf = import_tf()
        return ops.to_compute(tf, tf.as_dtype(self.precision), variable)

    @staticmethod
    def recomputed(function):
        """``function`` (tensors in, one tensor out) run again in the backward, only its inputs
        kept: what ``recompute="full"`` does to a block."""
        return ops.recomputed(import_tf(), function)

    def block(self, tf, h, weights: dict):
        """A block on the residual stream ``h``, with its weights by name (``qkv_w``)."""
        w = weights
        a = self.normalise(tf, block_parts.norm_weights(self, w, "ln1"), h, "ln1")
        h = h + self.attention(tf, a, w["qkv_w"], w["qkv_b"], w["proj_w"], w["proj_b"])
        m = self.normalise(tf, block_parts.norm_weights(self, w, "ln2"), h, "ln2")
        if not self.experts:
            return h + self.mlp(tf, m, w["fc_w"], w["fc_b"], w["out_w"], w["out_b"])
        output, balance, load = experts.mixture(tf, self, m, w)
        tf.compat.v1.add_to_collection(BALANCE, balance)
        tf.compat.v1.add_to_collection(LOAD, load)
        return h + output

    def normalise(self, tf, weights, h, name="lnf"):
        """``h`` normalised (LayerNorm or RMSNorm) with ``weights``: scale (and bias)."""
        return block_parts.normalise(tf, self, weights, h, name)

    def attention(self, tf, a, qkv_w, qkv_b, proj_w, proj_b, heads: int | None = None,
                  kv_heads: int | None = None, positions=None):
        """Causal self-attention on a block's normalised input ``a``. Tensor parallelism gives a
        worker ``heads`` of the query heads and ``kv_heads`` of the key/value heads (its columns
        of ``qkv_w``, its rows of ``proj_w``) and ``proj_b=None``: the bias is added once,
        after the workers' sum (``problems.transformer_block``)."""
        return block_parts.attention(tf, self, a, qkv_w, qkv_b, proj_w, proj_b, heads, kv_heads,
                                positions)

    def mlp(self, tf, m, fc_w, fc_b, out_w, out_b):
        """The block's MLP on its normalised input ``m``; ``out_b=None`` leaves the output's
        bias to be added after tensor parallelism's sum."""
        return block_parts.mlp(tf, self, m, fc_w, fc_b, out_w, out_b)

    def loss(self, output, t):
        """The sum over sequences of each sequence's mean cross-entropy per token; with
        experts, plus ``balance`` x the balance losses of the blocks built since the last
        call (``problems.experts``)."""
        tf = import_tf()
        per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=t, logits=output)
        loss = tf.reduce_sum(tf.reduce_mean(per_token, axis=-1))
        graph = tf.compat.v1.get_default_graph()
        balances = graph.get_collection(BALANCE)
        graph.clear_collection(BALANCE)
        return loss + self.balance * tf.add_n(balances) if balances else loss

    def step_reports(self) -> dict:
        """Tensors a loop fetches with each step: with experts, ``tokens_per_expert``
        [blocks, experts], the tokens each expert of each block took."""
        graph = import_tf().compat.v1.get_default_graph()
        loads = graph.get_collection(LOAD)
        return {"tokens_per_expert": import_tf().stack(loads)} if loads else {}

    def optimizer(self):
        return import_tf().compat.v1.train.AdamOptimizer(self.learning_rate)


def transformer(blocks: int = 2, d_model: int = 64, heads: int = 4, sequence: int = 32,
                vocabulary: int | None = None, batch_size: int = 16, *, tied: bool = True,
                learning_rate: float = 0.003, recompute: str = "none",
                precision: str = "float32", experts: int = 0, top_k: int = 1,
                capacity_factor: float = 1.25, balance: float = 0.01,
                skew: float = 0.0, norm: str = "layer", positions: str = "learned",
                kv_heads: int | None = None, activation: str = "gelu", hidden: int | None = None,
                shared_experts: int = 0, pad_to_capacity: bool = False, attention: str = "plain",
                attention_block: int | None = None) -> Transformer:
    """A decoder-only transformer on dtflab's generated text (see ``problems.transformer``).

    In [1]: problem = train.transformer(blocks=2, d_model=64, heads=4, sequence=32)
    In [2]: history = train.single(problem, steps=200)    # mean loss per token, in nats

    ``vocabulary`` defaults to the text's 23 characters (a larger one leaves the rest unused).
    ``recompute`` (none, selective, full) and ``precision`` (float32, bfloat16, float16) are
    the memory levers the module's docstring describes. ``experts=E`` replaces each block's MLP
    with a mixture of E experts, each token sent to its ``top_k``, at most
    ``capacity_factor`` x top_k x sequence / E of a sequence's tokens an expert, a balance
    loss weighted by ``balance``, and ``skew`` added to the router's initial bias toward
    expert 0 (a router that starts unbalanced; ``problems.experts``). ``pad_to_capacity=True``
    makes every expert compute its capacity's rows whatever the routing, so its work, bytes
    and memory are known before the run (GShard's fixed buffers).

    Today's blocks (``problems.transformer_block``), GPT-2's by default: ``norm="rms"``
    (RMSNorm), ``positions="rotary"``, ``kv_heads`` fewer than ``heads`` (grouped-query
    attention; 1 is multi-query), ``activation="swiglu"`` with its ``hidden`` width (default
    8d/3 rounded up to a multiple of 8, as Llama's rule; 4d for GELU), ``tied=False``, and
    ``shared_experts`` beside ``experts`` (DeepSeek's). Llama 3's block, small:

    In [3]: llama = train.transformer(heads=4, kv_heads=2, norm="rms", positions="rotary",
       ...:                           activation="swiglu", tied=False)

    ``attention="fused"`` computes attention as fused ("flash") kernels do
    (``problems.fused_attention``): tiles of ``attention_block`` x ``attention_block`` scores
    (default: the largest divisor of the sequence at most 128), none kept for the backward.

    The defaults (0.1 M parameters) train in a few seconds a hundred steps here; the loss
    falls from ln(23) = 3.1 nats to about 1.3 in 200 steps.
    """
    checks.whole(blocks, "blocks", example=2)
    checks.whole(d_model, "d_model", example=64)
    checks.whole(heads, "heads", example=4)
    checks.whole(sequence, "sequence", example=32)
    checks.whole(batch_size, "batch_size", example=16)
    if d_model % heads:
        fits = max(h for h in range(1, heads + 1) if d_model % h == 0)
        raise ValueError(f"heads={heads}: d_model={d_model} does not split into {heads} equal "
                         f"heads; use heads={fits}, or a d_model divisible by {heads}, e.g. "
                         f"d_model={d_model + heads - d_model % heads}")
    if sequence > text.CORPUS_CHARS // 2:
        raise ValueError(f"sequence={sequence}: dtflab's text is {text.CORPUS_CHARS} characters "
                         f"long; use sequence={text.CORPUS_CHARS // 2} or less")
    alphabet = len(text.ALPHABET)
    if vocabulary is None:
        vocabulary = alphabet
    checks.whole(vocabulary, "vocabulary", minimum=alphabet, example=alphabet)
    if not isinstance(learning_rate, (int, float)) or not learning_rate > 0:
        raise ValueError(f"learning_rate={learning_rate!r}: use a positive number, e.g. "
                         f"learning_rate=0.003")
    checks.one_of(recompute, "recompute", RECOMPUTE)
    checks.one_of(precision, "precision", PRECISIONS)
    checked_mixture(experts, top_k, capacity_factor, pad_to_capacity, recompute, precision)
    choices = block_parts.checked_choices(d_model, heads, norm, positions, kv_heads, activation,
                                          hidden, experts, shared_experts)
    choices.update(block_parts.checked_attention(attention, attention_block, sequence, recompute))
    name = f"transformer_{blocks}x{d_model}_h{heads}_s{sequence}"
    if experts:
        name += f"_e{experts}k{top_k}" + (f"s{shared_experts}" if shared_experts else "") \
            + ("_padded" if pad_to_capacity else "")
    name += block_parts.named(choices, heads, d_model)
    name += "".join(f"_{lever}" for lever, usual in ((recompute, "none"), (precision, "float32"))
                    if lever != usual)
    return Transformer(name, blocks, d_model, heads, sequence, vocabulary, batch_size, tied,
                       float(learning_rate), recompute, precision, experts, top_k,
                       float(capacity_factor), float(balance), float(skew), **choices,
                       pad_to_capacity=pad_to_capacity)
