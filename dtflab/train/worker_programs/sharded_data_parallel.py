"""The program every worker of ``train.sharded_data_parallel`` runs (one process per worker,
started by ``dtflab.run`` with ``TF_CONFIG`` set): ZeRO-3 / FSDP with TensorFlow's collective
ops over gRPC.

A transformer is sharded parameter by parameter and gathered block by block
(:func:`sharded_blocks`: the backward runs each block's forward again, FSDP with activation
checkpointing); an MLP layer by layer, as follows.

Each layer's weights and bias are one flat vector, padded with zeros to a multiple of N and
cut into N equal shards: worker i holds shard i of every layer and Adam's m and v for that
shard only (the math of ``tf.compat.v1.train.AdamOptimizer``, in the order its
``ResourceApplyAdam`` kernel computes it). A step, per layer, on the worker's slice of the
global batch:

- forward: all-gather the layer's shards (``CollectiveGatherV2``, ring) once the layer's input
  is ready, compute, and keep only the layer's input and pre-activation;
- backward: all-gather the shards again once the output's gradient is there (FSDP frees the
  full layer between the two), compute the gradients, and reduce-scatter the layer's gradient:
  each worker gets the sum over all workers of its own shard;
- Adam on the shard.

TensorFlow 2.21 has no CPU implementation of ``CollectiveReduceScatterV2`` ("CollectiveRegistry::
Lookup did not find collective implementation"), so the reduce-scatter is built from
broadcasts in groups of two (``CollectiveBcastSendV2`` / ``CollectiveBcastRecvV2``, one group
per pair of workers): worker i sends chunk j of its gradient to worker j and adds the chunks
it receives, in worker order. Each worker sends (N-1)/N of the layer's gradient, as a ring
reduce-scatter does. MultiWorkerMirroredStrategy is made only to set up the workers'
collectives (its own all-reduce is not used). Its start, the step loop, the reports and Stop are
``dtflab.train.worker_programs.loop``'s; the check all-reduces the stop votes and the sum of every
worker's shards (a fingerprint the same on every worker).
"""

from __future__ import annotations

import sys

import numpy as np

from dtflab.train.formulas import costs
from dtflab.train.worker_programs.collectives import (BETA1, BETA2, Collectives, adam_on_shards,
                                                      padded, run_with_own_checkpoints)
from dtflab.train.worker_programs.loop import start

class Unit:
    """One layer's weights and bias as one flat vector padded to a multiple of N."""

    def __init__(self, w: np.ndarray, b: np.ndarray, workers: int):
        self.w_shape, self.w_size, self.b_size = w.shape, w.size, b.size
        self.shard_size = costs.shard_size(w.size + b.size, workers)
        self.padded = np.zeros(self.shard_size * workers, np.float32)
        self.padded[:w.size + b.size] = np.concatenate([w.ravel(), b])

    def shard(self, index: int) -> np.ndarray:
        return self.padded[index * self.shard_size:(index + 1) * self.shard_size]

    def unflatten(self, tf, flat):
        return (tf.reshape(flat[:self.w_size], self.w_shape),
                flat[self.w_size:self.w_size + self.b_size])

    def flatten(self, tf, dw, db):
        padding = self.shard_size * (len(self.padded) // self.shard_size) - self.w_size - self.b_size
        return tf.concat([tf.reshape(dw, [-1]), db, tf.zeros([padding], dw.dtype)], 0)


def sharded_layer(tf, problem, collectives, unit: Unit, number: int):
    """Layer ``number`` as a function of its input and this worker's shard, whose gradient
    gathers the layer again and returns the reduce-scattered gradient of the shard."""

    @tf.custom_gradient
    def layer(h, shard):
        with tf.control_dependencies([h]):  # gathered when the layer is next, not all at once
            w, b = unit.unflatten(tf, collectives.all_gather(shard))
        z = tf.matmul(h, w) + b
        out = problem.activate(z, number)

        def backward(dout):
            with tf.control_dependencies([dout]):  # again: nothing kept the forward's copy
                w, _ = unit.unflatten(tf, collectives.all_gather(shard))
            with tf.GradientTape() as tape:
                tape.watch(z)
                again = problem.activate(z, number)
            dz = tape.gradient(again, z, output_gradients=dout)
            dh = None if number == 1 else tf.matmul(dz, w, transpose_b=True)
            dw = tf.matmul(h, dz, transpose_a=True)
            return dh, collectives.reduce_scatter(unit.flatten(tf, dw, tf.reduce_sum(dz, 0)),
                                                         unit.shard_size)

        return out, backward

    return layer


def sharded_blocks(tf, problem, collectives, first: int, last: int, counts: dict,
                   shapes: dict, sizes: dict):
    """Blocks ``first`` to ``last`` of a transformer (``problem.stage_forward``: the first
    with the embeddings, the last with the output layer) as a function of its input and this
    worker's shards of the parameters they read. The backward gathers the parameters again and
    runs the blocks' forward again from their input (FSDP with activation checkpointing: only
    each unit's input is kept), then reduce-scatters each parameter's gradient. A tied
    embedding is an input of the first unit and the last: its two shard gradients are summed
    by the tape."""
    names = problem.stage_parameters(first, last)

    def gathered(shards):
        return [tf.reshape(collectives.all_gather(shard)[:counts[name]], shapes[name])
                for name, shard in zip(names, shards)]

    @tf.custom_gradient
    def unit(h, *shards):
        with tf.control_dependencies([h]):  # gathered when the unit is next, not all at once
            params = gathered(shards)
        out = problem.stage_forward(params, h, first, last)

        def backward(dout):
            with tf.control_dependencies([dout]):  # again: nothing kept the forward's copy
                params = gathered(shards)
            watched = params + ([h] if first > 1 else [])  # the first unit's input is tokens
            with tf.GradientTape() as tape:
                tape.watch(watched)
                again = problem.stage_forward(params, h, first, last)
            grads = tape.gradient(again, watched, output_gradients=dout)
            dh = grads[len(params)] if first > 1 else None
            workers = collectives.workers
            return (dh, *[collectives.reduce_scatter(padded(tf, g, sizes[name], workers),
                                                     sizes[name])
                          for name, g in zip(names, grads[:len(params)])])

        return out, backward

    return unit, names


def mlp_units(tf, problem, collectives, index: int, workers: int, values):
    """``(units, shards)``: each layer as a function of its input and this worker's shard
    variable (one per layer: weights and bias as one vector)."""
    arrays = [value for _, value in values]
    layers = [Unit(w, b, workers) for w, b in zip(arrays[::2], arrays[1::2])]
    shards = [tf.Variable(unit.shard(index), name=f"layer{n}") for n, unit in enumerate(layers, 1)]
    return [(sharded_layer(tf, problem, collectives, unit, n), [shard])
            for n, (unit, shard) in enumerate(zip(layers, shards), 1)], shards


def transformer_units(tf, problem, collectives, index: int, workers: int, values):
    """``(units, shards)``: each block (the first with the embeddings, the last with the
    output layer) as a function of its input and this worker's shard of every parameter it
    reads (one shard variable per parameter, flattened and padded to a multiple of N)."""
    named = dict(values)
    counts = {name: value.size for name, value in named.items()}
    sizes = {name: costs.shard_size(count, workers) for name, count in counts.items()}
    shapes = {name: value.shape for name, value in named.items()}
    variables = {}
    for name, value in named.items():
        flat = np.zeros(sizes[name] * workers, np.float32)
        flat[:value.size] = value.ravel()
        size = sizes[name]
        variables[name] = tf.Variable(flat[index * size:(index + 1) * size], name=name)
    units = []
    for b in range(1, problem.blocks + 1):
        unit, names = sharded_blocks(tf, problem, collectives, b, b, counts, shapes, sizes)
        units.append((unit, [variables[name] for name in names]))
    return units, list(variables.values())


def sharded_step(tf, problem, collectives: Collectives, values, device: str = ""):
    """Worker ``collectives.index``'s shards and step function:
    ``(train_step, shards, (ms, vs, beta1_power, beta2_power))``. ``device``: where its
    variables and ops go ("": this process's own, as the planner traces it)."""
    index, workers = collectives.index, collectives.workers
    with tf.device(device):
        build = mlp_units if problem.unit == "layer" else transformer_units
        units, shards = build(tf, problem, collectives, index, workers, values)
        ms = [tf.Variable(tf.zeros_like(s), name=f"{s.name.split(':')[0]}_m") for s in shards]
        vs = [tf.Variable(tf.zeros_like(s), name=f"{s.name.split(':')[0]}_v") for s in shards]
        beta1_power = tf.Variable(BETA1, dtype=tf.float32, name="beta1_power")
        beta2_power = tf.Variable(BETA2, dtype=tf.float32, name="beta2_power")

    def adam(gradients):
        _, done = adam_on_shards(tf, problem.learning_rate, shards, ms, vs, gradients,
                                 beta1_power, beta2_power)
        return done

    @tf.function
    def train_step(x, t):
        with tf.device(device):
            with tf.GradientTape() as tape:
                h = x
                for unit, own in units:
                    h = unit(h, *[tf.convert_to_tensor(shard) for shard in own])
                loss = problem.loss(h, t)
            with tf.control_dependencies([adam(tape.gradient(loss, shards))]):
                return tf.identity(loss)

    return train_step, shards, (ms, vs, beta1_power, beta2_power)


def main(argv=None) -> int:
    worker = start(sys.argv[1:] if argv is None else argv,
                   "worker_programs/sharded_data_parallel.py")
    import tensorflow as tf

    flags, problem = worker.flags, worker.problem
    device = worker.strategy.extended.worker_devices[0]
    collectives = Collectives(tf, worker.index, worker.workers, flags.timeout)
    train_step, shards, adam = sharded_step(tf, problem, collectives,
                                            problem.initial_values(flags.seed), device)
    return run_with_own_checkpoints(worker, shards, adam, train_step, collectives, device,
                                    whole=False)


if __name__ == "__main__":
    sys.exit(main())
