"""Teaching problems that make their own data: the 2016 exp(x) regression, a heavier classifier.

A problem knows its layer sizes, its data and its loss, and builds variables and the forward
pass in whatever graph and device scope is current; loops decide where things go.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dtflab import checks
from dtflab._quiet import import_tf


#: Rows drawn from one generator in Problem.batch (a worker's slice is whole blocks, mostly).
BLOCK_ROWS = 256


@dataclass(frozen=True)
class Problem:
    """A model and its data. ``loss`` sums over the examples of a batch (so the loss of a batch
    is the sum of the losses of its slices, and so are the gradients); reported losses are
    divided by the batch size."""

    name: str
    layers: tuple[int, ...]
    activation: str  # "leaky_relu" (alpha 0.2) or "relu"
    loss_kind: str  # "l2" (tf.nn.l2_loss) or "softmax" (cross-entropy, integer labels)
    batch_size: int
    learning_rate: float = 0.001  # Adam's default, as in the source material

    @property
    def parameter_bytes(self) -> int:
        return self.layer_bytes(1, self.depth)

    def layer_bytes(self, first: int, last: int) -> int:
        """Bytes of the weights and biases of layers ``first`` to ``last`` (1-based)."""
        pairs = zip(self.layers[first - 1:last], self.layers[first:last + 1])
        return 4 * sum(a * b + b for a, b in pairs)

    def batch(self, step: int, seed: int = 0, part: tuple[int, int] | None = None):
        """The batch for ``step``: the same for every loop given the same seed. ``part=(i, n)``
        is the i-th of n equal slices of it (rows ``i * B / n`` on), made without the rest:
        an all-reduce worker makes only its own share. The rows come in blocks of
        ``BLOCK_ROWS``, each drawn from its own generator, so a slice costs its own rows."""
        start, stop = 0, self.batch_size
        if part is not None:
            index, parts = part
            share = self.batch_size // parts
            start, stop = index * share, (index + 1) * share
        first, last = start // BLOCK_ROWS, (stop - 1) // BLOCK_ROWS
        centers = self._centers(seed) if self.loss_kind == "softmax" else None
        blocks = [self._block(step, seed, b, min(BLOCK_ROWS, self.batch_size - b * BLOCK_ROWS),
                              centers) for b in range(first, last + 1)]
        offset = first * BLOCK_ROWS
        return tuple(np.concatenate([block[k] for block in blocks])[start - offset:stop - offset]
                     for k in range(2))

    def _block(self, step: int, seed: int, block: int, rows: int, centers):
        rng = np.random.default_rng([seed, step, block])
        if self.loss_kind == "l2":
            x = rng.random((rows, 1), dtype=np.float32)
            return x, np.exp(x).astype(np.float32)
        labels = rng.integers(0, self.layers[-1], rows)
        x = rng.standard_normal((rows, self.layers[0]), dtype=np.float32)
        x *= 1.5
        x += centers[labels]
        return x, labels.astype(np.int64)

    def _centers(self, seed: int) -> np.ndarray:
        """The class centres of a classification problem (fixed by the seed)."""
        return np.random.default_rng(seed + 1000).normal(
            0, 1, (self.layers[-1], self.layers[0])).astype(np.float32)

    def placeholders(self):
        tf = import_tf()
        x = tf.compat.v1.placeholder(tf.float32, [None, self.layers[0]], name="x")
        if self.loss_kind == "l2":
            t = tf.compat.v1.placeholder(tf.float32, [None, self.layers[-1]], name="t")
        else:
            t = tf.compat.v1.placeholder(tf.int64, [None], name="t")
        return x, t

    def initial_values(self, seed: int = 0) -> list[tuple[str, np.ndarray]]:
        """``[("w1", array), ("b1", array), ...]``: Glorot-uniform weights (TF's default) and
        zero biases, fixed by ``seed`` (not by TF's RNG), so every loop starts alike."""
        rng = np.random.default_rng(seed)
        values = []
        for i, (n_in, n_out) in enumerate(zip(self.layers, self.layers[1:]), start=1):
            limit = np.sqrt(6.0 / (n_in + n_out))
            values.append((f"w{i}", rng.uniform(-limit, limit, (n_in, n_out)).astype(np.float32)))
            values.append((f"b{i}", np.zeros(n_out, np.float32)))
        return values

    def create_variables(self, seed: int = 0) -> list:
        """``[w1, b1, w2, b2, ...]`` as tf.compat.v1 variables with :meth:`initial_values`."""
        tf = import_tf()
        return [tf.compat.v1.get_variable(name, initializer=value)
                for name, value in self.initial_values(seed)]

    @property
    def depth(self) -> int:
        """How many weight layers (matmul + bias) the model has."""
        return len(self.layers) - 1

    def forward(self, variables, x, *, first_layer: int = 1):
        """The layers whose ``[w, b, ...]`` are ``variables``, numbered from ``first_layer``
        (a pipeline stage holds a run of layers; the last layer of a softmax model has no
        activation)."""
        tf = import_tf()
        h = x
        pairs = list(zip(variables[::2], variables[1::2]))
        for i, (w, b) in enumerate(pairs, start=first_layer):
            with tf.name_scope(f"layer{i}"):
                h = self.activate(tf.matmul(h, w) + b, i)
        return h

    #: What a pipeline cuts this model into (``layouts.layers``).
    unit = "layer"

    def unit_work(self) -> list[int]:
        """Each layer's multiply-adds per example, what a balanced pipeline cut evens out."""
        return [a * b for a, b in zip(self.layers, self.layers[1:])]

    def stage_parameters(self, first: int, last: int) -> list[str]:
        """The names of the parameters a pipeline stage of layers ``first`` to ``last`` reads."""
        return [f"{kind}{i}" for i in range(first, last + 1) for kind in "wb"]

    def stage_forward(self, variables, h, first: int, last: int):
        """Layers ``first`` to ``last`` on ``h``, from the variables :meth:`stage_parameters`
        names."""
        return self.forward(variables, h, first_layer=first)

    def activate(self, h, layer: int):
        """Layer ``layer``'s activation of ``h`` (none on the last layer of a softmax model)."""
        tf = import_tf()
        if layer < self.depth or self.loss_kind == "l2":
            if self.activation == "leaky_relu":
                return tf.nn.leaky_relu(h, alpha=0.2)
            return tf.nn.relu(h)
        return h

    def loss(self, output, t):
        tf = import_tf()
        if self.loss_kind == "l2":
            return tf.nn.l2_loss(output - t)
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=t, logits=output))

    def optimizer(self):
        return import_tf().compat.v1.train.AdamOptimizer(self.learning_rate)


def exp_regression(batch_size: int = 100) -> Problem:
    """y = exp(x), x uniform in [0, 1): MLP 1-16-32-1, leaky ReLU 0.2, l2_loss, Adam, batch 100."""
    checks.whole(batch_size, "batch_size", example=100)
    return Problem("exp_regression", (1, 16, 32, 1), "leaky_relu", "l2", batch_size)


def classification(width: int = 1024, batch_size: int = 4096, features: int = 64,
                   classes: int = 10, hidden_layers: int = 2) -> Problem:
    """Gaussian clusters in ``features`` dimensions, an MLP with ``hidden_layers`` hidden layers
    of ``width``: heavy enough (width 1024, two hidden layers: 1.1 M parameters, batch 4096:
    ~7 GFLOP a step) for two one-core workers to beat one on 2 cores (see
    benchmarks/training.py). Deeper models (``hidden_layers=3``: four weight layers) give a
    pipeline's stages two layers each."""
    checks.whole(width, "width", example=1024)
    checks.whole(batch_size, "batch_size", example=4096)
    checks.whole(features, "features", example=64)
    checks.whole(classes, "classes", minimum=2, example=10)
    checks.whole(hidden_layers, "hidden_layers", example=2)
    name = f"classification_{width}" + (f"x{hidden_layers}" if hidden_layers != 2 else "")
    return Problem(name, (features, *[width] * hidden_layers, classes), "relu", "softmax",
                   batch_size)
