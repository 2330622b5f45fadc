"""The transformer's ops that decide what its backward keeps (``problems.transformer``):
LayerNorm, RMSNorm, GELU and SwiGLU keeping what fused kernels keep, the attention's core
(grouped-query too), rotary positions, recomputation, and the casts of 16-bit training with
float16's loss scale."""

from __future__ import annotations

import math

import numpy as np

#: LayerNorm's epsilon, GPT-2's.
EPSILON = 1e-5
#: float16's static loss scale: the backward runs on gradients this many times larger, so the
#: small ones do not underflow float16 (smallest normal 6.1e-5); the weights' gradients are
#: divided back in float32.
LOSS_SCALE = 1024.0


def layer_norm(tf):
    """LayerNorm over the last axis that keeps for its backward what a fused kernel keeps (the
    normalised input, and each row's 1/std), not every intermediate of its formula: the memory
    the activation formula counts (``formulas.memory``). Its backward reads those two tensors
    by name, not by TensorFlow merging its arithmetic with the forward's (which Grappler did
    in some graphs and not others). In 16 bits, its statistics are float32 and it keeps the
    normalised input in 16 bits."""
    normalise = _normalisation(tf, centred=True)

    @tf.custom_gradient
    def layer_norm(x, scale, bias):
        y, backward = normalise(x, scale)
        return y + bias, lambda dy: (*backward(dy), _summed(tf, dy, x))

    return layer_norm


def rms_norm(tf):
    """RMSNorm (Zhang and Sennrich 2019; Llama's): x / sqrt(mean(x²) + ε) x scale, no mean
    taken away and no bias; it keeps what :func:`layer_norm` keeps (the normalised input, each
    row's 1/rms)."""
    normalise = _normalisation(tf, centred=False)

    @tf.custom_gradient
    def rms_norm(x, scale):
        return normalise(x, scale)

    return rms_norm


def _normalisation(tf, centred: bool):
    """``(x, scale) -> (normal x scale, backward)``: the shared body of LayerNorm
    (``centred``) and RMSNorm, the backward giving the gradients of x and of the scale."""

    def normalise(x, scale):
        wide = x.dtype != tf.float32
        x32 = tf.cast(x, tf.float32) if wide else x
        if centred:
            x32 = x32 - tf.reduce_mean(x32, axis=-1, keepdims=True)
        rstd = tf.math.rsqrt(tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True) + EPSILON)
        normal = x32 * rstd
        normal = tf.cast(normal, x.dtype) if wide else normal

        def backward(dy):
            with tf.control_dependencies([dy]):  # not before the gradient comes: see gelu
                n32 = tf.cast(normal, tf.float32) if wide else tf.identity(normal)
                # the scale's 16-bit copy too: cast back early, it is kept or not by schedule
                scale32 = tf.cast(scale, tf.float32) if wide else scale
            dy32 = tf.cast(dy, tf.float32) if wide else dy
            rows = list(range(len(x.shape) - 1))
            dnormal = dy32 * scale32
            dx = dnormal - n32 * tf.reduce_mean(dnormal * n32, axis=-1, keepdims=True)
            if centred:
                dx -= tf.reduce_mean(dnormal, axis=-1, keepdims=True)
            grads = rstd * dx, tf.reduce_sum(dy32 * n32, axis=rows)
            return [tf.cast(g, x.dtype) for g in grads] if wide else list(grads)

        return normal * scale, backward

    return normalise


def _summed(tf, dy, x):
    """A bias's gradient: ``dy`` summed over every axis but the last, in x's type."""
    wide = x.dtype != tf.float32
    total = tf.reduce_sum(tf.cast(dy, tf.float32) if wide else dy,
                          axis=list(range(len(x.shape) - 1)))
    return tf.cast(total, x.dtype) if wide else total


def dense(tf, x, w):
    """``x @ w`` for ``x`` [..., d] and a matrix ``w`` [d, k], as one 2-D multiply of all of
    x's rows. ``tf.matmul`` of a 3-D x and a 2-D w broadcasts w over the batch, and the
    gradient of w it builds is a [batch, d, k] product summed over the batch: the batch's times
    w's bytes alive at once (measured: 0.66 of a 2-block, d = 512 model's bytes for one MLP
    matrix at a batch of 4), where this makes [d, k] in one multiply."""
    rows = tf.reshape(x, [-1, x.shape[-1]])
    return tf.reshape(tf.matmul(rows, w), tf.concat([tf.shape(x)[:-1], [w.shape[-1]]], 0))


def attention_core(tf, s, size, dtype, groups: int = 1):
    """The attention's core on q ([batch, heads, sequence, size]) and k and v ([batch,
    heads / ``groups``, sequence, size]): scores scaled by 1/sqrt(size), the future masked,
    softmax, the weighted sum of the values. With grouped-query attention (``groups`` query
    heads a key/value head, Ainslie et al. 2023), each group's queries are stacked along the
    sequence against their one key and value head, as fused kernels do, instead of copying
    the keys and values for each query head (which the backward would keep, groups times)."""
    future = np.tile(np.triu(np.ones([s, s], np.float32), 1), (groups, 1))  # 1 above the diagonal
    # -1e9 is -inf in float16: exp(-inf) is 0, as the mask means.
    mask = tf.constant((-1e9 * future).astype(np.float32), dtype=tf.float32)

    def core(q, k, v):
        heads = q.shape[1]
        stacked = tf.reshape(q, [-1, heads // groups, groups * s, size]) if groups > 1 else q
        scores = tf.matmul(stacked, k, transpose_b=True) * tf.cast(1.0 / math.sqrt(size), dtype)
        out = tf.matmul(tf.nn.softmax(scores + tf.cast(mask, dtype), axis=-1), v)
        return tf.reshape(out, [-1, heads, s, size]) if groups > 1 else out

    return core


def rotary(tf, positions, size: int, base: float = 10000.0):
    """Rotary position embedding (Su et al. 2021; Llama's, halves rotated): each head's vector
    ([batch, heads, len(positions), size]) turned, pair (i, i + size/2) by the angle
    position x base^(-2i/size). A rotation's gradient is the rotation back: it keeps nothing
    for its backward."""
    half = size // 2
    angles = np.outer(np.asarray(positions, np.float64), base ** (-np.arange(half) * 2 / size))
    cos, sin = (tf.constant(f(angles).astype(np.float32)) for f in (np.cos, np.sin))

    def turn(x, sin):
        c, s = tf.cast(cos, x.dtype), tf.cast(sin, x.dtype)
        first, second = x[..., :half], x[..., half:]
        return tf.concat([first * c - second * s, first * s + second * c], axis=-1)

    @tf.custom_gradient
    def rotate(x):
        return turn(x, sin), lambda dy: turn(dy, -sin)

    return rotate


def recomputed(tf, function):
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


def to_compute(tf, compute, variable):
    """A float32 variable as the ``compute`` type the forward uses; its gradient comes back
    float32, divided by float16's loss scale (``to_float32``)."""
    if compute == tf.float32:
        return variable
    scale = LOSS_SCALE if compute == tf.float16 else 1.0

    @tf.custom_gradient
    def cast(value):
        return tf.cast(value, compute), lambda dy: tf.cast(dy, tf.float32) / scale

    return cast(tf.convert_to_tensor(variable))


def to_float32(tf, logits, scale: float):
    """16-bit logits as float32 for the loss; the loss's gradient goes back into the 16-bit
    backward multiplied by ``scale`` (float16's loss scale, 1 otherwise)."""
    dtype = logits.dtype

    @tf.custom_gradient
    def cast(value):
        return tf.cast(value, tf.float32), lambda dy: tf.cast(dy * scale, dtype)

    return cast(logits)


def gelu(tf):
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


def swiglu(tf):
    """SwiGLU (Shazeer 2020; Llama's MLP): [gate | up] -> silu(gate) x up, keeping only its
    input for the backward, as a fused kernel does."""

    @tf.custom_gradient
    def swiglu(gate_up):
        gate, up = tf.split(gate_up, 2, axis=-1)

        def backward(dy):
            with tf.control_dependencies([dy]):  # once the gradient has come: see gelu
                gate, up = tf.split(tf.identity(gate_up), 2, axis=-1)
            sig = tf.sigmoid(gate)
            return tf.concat([dy * up * sig * (1.0 + gate * (1.0 - sig)), dy * gate * sig],
                             axis=-1)

        return gate * tf.sigmoid(gate) * up, backward

    return swiglu
