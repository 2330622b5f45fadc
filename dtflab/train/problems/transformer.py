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
  kernels keep (their input; LayerNorm each row's mean and 1/std too);
- a final LayerNorm and the output layer: ``wte`` transposed (``tied=True``) or its own
  ``lm_head`` (d x vocabulary).

The loss of a batch is the sum over its sequences of each sequence's mean cross-entropy per
token, so a batch's loss and gradients are the sums of its slices' (what data parallelism
needs) and the loss per example a loop reports is the mean loss per token, in nats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dtflab import checks
from dtflab._quiet import import_tf
from dtflab.train.problems import text

#: LayerNorm's epsilon, GPT-2's.
EPSILON = 1e-5


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

    @property
    def head_size(self) -> int:
        return self.d_model // self.heads

    # -- the parameters ------------------------------------------------------------------------

    def shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every parameter's name and shape, in the order the model uses them."""
        d, v = self.d_model, self.vocabulary
        found = [("wte", (v, d)), ("wpe", (self.sequence, d))]
        for b in range(1, self.blocks + 1):
            found += [(f"h{b}_ln1_scale", (d,)), (f"h{b}_ln1_bias", (d,)),
                      (f"h{b}_qkv_w", (d, 3 * d)), (f"h{b}_qkv_b", (3 * d,)),
                      (f"h{b}_proj_w", (d, d)), (f"h{b}_proj_b", (d,)),
                      (f"h{b}_ln2_scale", (d,)), (f"h{b}_ln2_bias", (d,)),
                      (f"h{b}_fc_w", (d, 4 * d)), (f"h{b}_fc_b", (4 * d,)),
                      (f"h{b}_out_w", (4 * d, d)), (f"h{b}_out_b", (d,))]
        found += [("lnf_scale", (d,)), ("lnf_bias", (d,))]
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
        """Logits for every position of ``x`` ([batch, sequence, vocabulary]), from
        ``variables`` in :meth:`shapes`' order."""
        tf = import_tf()
        named = dict(zip((name for name, _ in self.shapes()), variables))
        with tf.name_scope("embedding"):
            h = tf.matmul(tf.one_hot(x, self.vocabulary, dtype=tf.float32), named["wte"])
            h = h + named["wpe"]
        for b in range(1, self.blocks + 1):
            with tf.name_scope(f"block{b}"):
                h = h + self.attention(tf, named, b, self.layer_norm(tf, named, f"h{b}_ln1", h))
                h = h + self.mlp(tf, named, b, self.layer_norm(tf, named, f"h{b}_ln2", h))
        with tf.name_scope("output"):
            h = self.layer_norm(tf, named, "lnf", h)
            out = tf.transpose(named["wte"]) if self.tied else named["lm_head"]
            return tf.matmul(h, out)

    @staticmethod
    def layer_norm(tf, named, prefix, h):
        with tf.name_scope(prefix.split("_")[-1]):
            return _layer_norm(tf)(h, named[f"{prefix}_scale"], named[f"{prefix}_bias"])

    def attention(self, tf, named, b, a):
        """Causal multi-head self-attention of block ``b`` on its normalised input ``a``."""
        s, heads, size = self.sequence, self.heads, self.head_size
        with tf.name_scope("attention"):
            qkv = tf.matmul(a, named[f"h{b}_qkv_w"]) + named[f"h{b}_qkv_b"]
            q, k, v = (tf.transpose(tf.reshape(part, [-1, s, heads, size]), [0, 2, 1, 3])
                       for part in tf.split(qkv, 3, axis=-1))
            scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(size))
            future = 1.0 - tf.linalg.band_part(tf.ones([s, s]), -1, 0)  # 1 above the diagonal
            weights = tf.nn.softmax(scores - 1e9 * future, axis=-1)
            joined = tf.reshape(tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3]),
                                [-1, s, self.d_model])
            return tf.matmul(joined, named[f"h{b}_proj_w"]) + named[f"h{b}_proj_b"]

    @staticmethod
    def mlp(tf, named, b, m):
        with tf.name_scope("mlp"):
            hidden = _gelu(tf)(tf.matmul(m, named[f"h{b}_fc_w"]) + named[f"h{b}_fc_b"])
            return tf.matmul(hidden, named[f"h{b}_out_w"]) + named[f"h{b}_out_b"]

    def loss(self, output, t):
        """The sum over sequences of each sequence's mean cross-entropy per token."""
        tf = import_tf()
        per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=t, logits=output)
        return tf.reduce_sum(tf.reduce_mean(per_token, axis=-1))

    def optimizer(self):
        return import_tf().compat.v1.train.AdamOptimizer(self.learning_rate)


def _layer_norm(tf):
    """LayerNorm over the last axis that keeps for its backward what a fused kernel keeps (its
    input, and each row's mean and 1/std), not every intermediate of its formula: the memory
    the activation formula counts (``formulas.memory``)."""

    @tf.custom_gradient
    def layer_norm(x, scale, bias):
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        rstd = tf.math.rsqrt(tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True) + EPSILON)
        y = (x - mean) * rstd * scale + bias

        def backward(dy):
            normal = (x - mean) * rstd
            rows = list(range(len(x.shape) - 1))
            dnormal = dy * scale
            dx = rstd * (dnormal - tf.reduce_mean(dnormal, axis=-1, keepdims=True)
                         - normal * tf.reduce_mean(dnormal * normal, axis=-1, keepdims=True))
            return dx, tf.reduce_sum(dy * normal, axis=rows), tf.reduce_sum(dy, axis=rows)

        return y, backward

    return layer_norm


def _gelu(tf):
    """GELU, tanh form (GPT-2's), keeping only its input for the backward, as a fused kernel
    does."""
    c = math.sqrt(2.0 / math.pi)

    @tf.custom_gradient
    def gelu(x):
        inner = c * (x + 0.044715 * x * x * x)
        y = 0.5 * x * (1.0 + tf.tanh(inner))

        def backward(dy):
            tanh = tf.tanh(c * (x + 0.044715 * x * x * x))
            slope = 0.5 * (1.0 + tanh) + 0.5 * x * (1.0 - tanh * tanh) * c * (
                1.0 + 3 * 0.044715 * x * x)
            return dy * slope

        return y, backward

    return gelu


def transformer(blocks: int = 2, d_model: int = 64, heads: int = 4, sequence: int = 32,
                vocabulary: int | None = None, batch_size: int = 16, *, tied: bool = True,
                learning_rate: float = 0.003) -> Transformer:
    """A decoder-only transformer on dtflab's generated text (see ``problems.transformer``).

    In [1]: problem = train.transformer(blocks=2, d_model=64, heads=4, sequence=32)
    In [2]: history = train.single(problem, steps=200)    # mean loss per token, in nats

    ``vocabulary`` defaults to the text's 23 characters (a larger one leaves the rest unused).
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
    name = f"transformer_{blocks}x{d_model}_h{heads}_s{sequence}"
    return Transformer(name, blocks, d_model, heads, sequence, vocabulary, batch_size, tied,
                       float(learning_rate))
