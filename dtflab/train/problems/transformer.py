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

The loss of a batch is the sum over its sequences of each sequence's mean cross-entropy per
token, so a batch's loss and gradients are the sums of its slices' (what data parallelism
and gradient accumulation need) and the loss per example a loop reports is the mean loss per
token, in nats.

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
from dtflab.train.problems import text

#: LayerNorm's epsilon, GPT-2's.
EPSILON = 1e-5
#: What ``recompute=`` takes; what ``precision=`` takes.
RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("float32", "bfloat16", "float16")
#: float16's static loss scale: the backward runs on gradients this many times larger, so the
#: small ones do not underflow float16 (smallest normal 6.1e-5); the weights' gradients are
#: divided back in float32.
LOSS_SCALE = 1024.0


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

    @property
    def head_size(self) -> int:
        return self.d_model // self.heads

    @property
    def loss_scale(self) -> float:
        return LOSS_SCALE if self.precision == "float16" else 1.0

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
        """Logits for every position of ``x`` ([batch, sequence, vocabulary], float32), from
        ``variables`` in :meth:`shapes`' order."""
        tf = import_tf()
        compute = tf.as_dtype(self.precision)
        named = dict(zip((name for name, _ in self.shapes()),
                         (_to_compute(tf, compute, v) for v in variables)))
        with tf.name_scope("embedding"):
            h = tf.matmul(tf.one_hot(x, self.vocabulary, dtype=compute), named["wte"])
            h = h + named["wpe"]
        for b in range(1, self.blocks + 1):
            with tf.name_scope(f"block{b}"):
                weights = [named[name] for name, _ in self.shapes() if name.startswith(f"h{b}_")]
                if self.recompute == "full":
                    h = _recomputed(tf, lambda h, *w, b=b: self.block(tf, b, h, w))(h, *weights)
                else:
                    h = self.block(tf, b, h, weights)
        with tf.name_scope("output"):
            h = self.layer_norm(tf, named["lnf_scale"], named["lnf_bias"], h)
            out = tf.transpose(named["wte"]) if self.tied else named["lm_head"]
            logits = tf.matmul(h, out)
            return logits if compute == tf.float32 else _to_float32(tf, logits, self.loss_scale)

    def block(self, tf, b, h, weights):
        """Block ``b`` on the residual stream ``h``, with its weights in :meth:`shapes`'
        order."""
        (ln1_scale, ln1_bias, qkv_w, qkv_b, proj_w, proj_b,
         ln2_scale, ln2_bias, fc_w, fc_b, out_w, out_b) = weights
        h = h + self.attention(tf, self.layer_norm(tf, ln1_scale, ln1_bias, h, "ln1"),
                               qkv_w, qkv_b, proj_w, proj_b)
        return h + self.mlp(tf, self.layer_norm(tf, ln2_scale, ln2_bias, h, "ln2"),
                            fc_w, fc_b, out_w, out_b)

    @staticmethod
    def layer_norm(tf, scale, bias, h, name="lnf"):
        with tf.name_scope(name):
            return _layer_norm(tf)(h, scale, bias)

    def attention(self, tf, a, qkv_w, qkv_b, proj_w, proj_b):
        """Causal multi-head self-attention on a block's normalised input ``a``."""
        s, heads, size = self.sequence, self.heads, self.head_size
        with tf.name_scope("attention"):
            qkv = tf.matmul(a, qkv_w) + qkv_b
            q, k, v = (tf.transpose(tf.reshape(part, [-1, s, heads, size]), [0, 2, 1, 3])
                       for part in tf.split(qkv, 3, axis=-1))
            core = _attention_core(tf, s, size, a.dtype)
            out = (_recomputed(tf, core) if self.recompute == "selective" else core)(q, k, v)
            joined = tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [-1, s, self.d_model])
            return tf.matmul(joined, proj_w) + proj_b

    @staticmethod
    def mlp(tf, m, fc_w, fc_b, out_w, out_b):
        with tf.name_scope("mlp"):
            hidden = _gelu(tf)(tf.matmul(m, fc_w) + fc_b)
            return tf.matmul(hidden, out_w) + out_b

    def loss(self, output, t):
        """The sum over sequences of each sequence's mean cross-entropy per token."""
        tf = import_tf()
        per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=t, logits=output)
        return tf.reduce_sum(tf.reduce_mean(per_token, axis=-1))

    def optimizer(self):
        return import_tf().compat.v1.train.AdamOptimizer(self.learning_rate)


def _layer_norm(tf):
    """LayerNorm over the last axis that keeps for its backward what a fused kernel keeps (the
    normalised input, and each row's 1/std), not every intermediate of its formula: the memory
    the activation formula counts (``formulas.memory``). Its backward reads those two tensors
    by name, not by TensorFlow merging its arithmetic with the forward's (which Grappler did
    in some graphs and not others). In 16 bits, its statistics are float32 and it keeps the
    normalised input in 16 bits."""

    @tf.custom_gradient
    def layer_norm(x, scale, bias):
        wide = x.dtype != tf.float32
        x32 = tf.cast(x, tf.float32) if wide else x
        mean = tf.reduce_mean(x32, axis=-1, keepdims=True)
        rstd = tf.math.rsqrt(tf.reduce_mean(tf.square(x32 - mean), axis=-1, keepdims=True)
                             + EPSILON)
        normal = (x32 - mean) * rstd
        normal = tf.cast(normal, x.dtype) if wide else normal

        def backward(dy):
            with tf.control_dependencies([dy]):  # not before the gradient comes: see _gelu
                n32 = tf.cast(normal, tf.float32) if wide else tf.identity(normal)
            dy32 = tf.cast(dy, tf.float32) if wide else dy
            rows = list(range(len(x.shape) - 1))
            dnormal = dy32 * (tf.cast(scale, tf.float32) if wide else scale)
            dx = rstd * (dnormal - tf.reduce_mean(dnormal, axis=-1, keepdims=True)
                         - n32 * tf.reduce_mean(dnormal * n32, axis=-1, keepdims=True))
            grads = dx, tf.reduce_sum(dy32 * n32, axis=rows), tf.reduce_sum(dy32, axis=rows)
            return [tf.cast(g, x.dtype) for g in grads] if wide else grads

        return normal * scale + bias, backward

    return layer_norm


def _attention_core(tf, s, size, dtype):
    """The attention's core on q, k and v ([batch, heads, sequence, size]): scores scaled by
    1/sqrt(size), the future masked, softmax, the weighted sum of the values."""
    future = np.triu(np.ones([s, s], np.float32), 1)  # 1 above the diagonal
    # -1e9 is -inf in float16: exp(-inf) is 0, as the mask means.
    mask = tf.constant((-1e9 * future).astype(np.float32), dtype=tf.float32)

    def core(q, k, v):
        scores = tf.matmul(q, k, transpose_b=True) * tf.cast(1.0 / math.sqrt(size), dtype)
        return tf.matmul(tf.nn.softmax(scores + tf.cast(mask, dtype), axis=-1), v)

    return core


def _recomputed(tf, function):
    """``function`` (tensors in, one tensor out) whose backward runs it again from its inputs
    instead of keeping what it computed: only the inputs stay alive for the backward.

    The second run waits for the incoming gradient (control dependencies on its inputs'
    copies), so TensorFlow's common-subexpression pass does not merge it with the first."""

    @tf.custom_gradient
    def run(*inputs):
        def backward(dy):
            with tf.control_dependencies([dy]):
                again = [tf.identity(value) for value in inputs]
            return tf.gradients(function(*again), again, grad_ys=dy)

        return function(*inputs), backward

    return run


def _to_compute(tf, compute, variable):
    """A float32 variable as the ``compute`` type the forward uses; its gradient comes back
    float32, divided by float16's loss scale (``_to_float32``)."""
    if compute == tf.float32:
        return variable
    scale = LOSS_SCALE if compute == tf.float16 else 1.0

    @tf.custom_gradient
    def cast(value):
        return tf.cast(value, compute), lambda dy: tf.cast(dy, tf.float32) / scale

    return cast(tf.convert_to_tensor(variable))


def _to_float32(tf, logits, scale: float):
    """16-bit logits as float32 for the loss; the loss's gradient goes back into the 16-bit
    backward multiplied by ``scale`` (float16's loss scale, 1 otherwise)."""
    dtype = logits.dtype

    @tf.custom_gradient
    def cast(value):
        return tf.cast(value, tf.float32), lambda dy: tf.cast(dy * scale, dtype)

    return cast(logits)


def _gelu(tf):
    """GELU, tanh form (GPT-2's), keeping only its input for the backward, as a fused kernel
    does."""
    c = math.sqrt(2.0 / math.pi)

    @tf.custom_gradient
    def gelu(x):
        inner = c * (x + 0.044715 * x * x * x)
        y = 0.5 * x * (1.0 + tf.tanh(inner))

        def backward(dy):
            # Once the gradient has come, not before: an op that needs only forward tensors
            # would otherwise run during the forward (or merge into it), and what the forward
            # keeps would change from one graph to the next.
            with tf.control_dependencies([dy]):
                x_ = tf.identity(x)
            tanh = tf.tanh(c * (x_ + 0.044715 * x_ * x_ * x_))
            slope = 0.5 * (1.0 + tanh) + 0.5 * x_ * (1.0 - tanh * tanh) * c * (
                1.0 + 3 * 0.044715 * x_ * x_)
            return dy * slope

        return y, backward

    return gelu


def transformer(blocks: int = 2, d_model: int = 64, heads: int = 4, sequence: int = 32,
                vocabulary: int | None = None, batch_size: int = 16, *, tied: bool = True,
                learning_rate: float = 0.003, recompute: str = "none",
                precision: str = "float32") -> Transformer:
    """A decoder-only transformer on dtflab's generated text (see ``problems.transformer``).

    In [1]: problem = train.transformer(blocks=2, d_model=64, heads=4, sequence=32)
    In [2]: history = train.single(problem, steps=200)    # mean loss per token, in nats

    ``vocabulary`` defaults to the text's 23 characters (a larger one leaves the rest unused).
    ``recompute`` (none, selective, full) and ``precision`` (float32, bfloat16, float16) are
    the memory levers the module's docstring describes.
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
    name = f"transformer_{blocks}x{d_model}_h{heads}_s{sequence}"
    name += "".join(f"_{lever}" for lever, usual in ((recompute, "none"), (precision, "float32"))
                    if lever != usual)
    return Transformer(name, blocks, d_model, heads, sequence, vocabulary, batch_size, tied,
                       float(learning_rate), recompute, precision)
