"""The program every worker of ``train.zero`` with stage 1 or 2 runs (one process per worker,
started by ``dtflab.run`` with ``TF_CONFIG`` set): ZeRO's first two stages (Rajbhandari et al.
2020) with TensorFlow's collective ops over gRPC, for any problem.

Every worker holds the whole model (its working copy) and trains on its slice of each global
batch, as in ``train.all_reduce``. Each parameter, flattened and padded with zeros to a
multiple of N, is cut into N equal shards; worker i owns shard i of every parameter: Adam's m
and v for it, which no one else keeps, and the update of that shard. (In float32 the working
copy is the master copy; the paper's K = 12 bytes of state per parameter in mixed precision
include a float32 master copy besides Adam's two slots.) A step:

- forward and backward on the worker's slice: every parameter's gradient;
- each gradient reduce-scattered (``collectives.Collectives.reduce_scatter``): worker i gets
  the sum over the workers of its own shard. **Stage 1** waits for the whole backward before
  the first reduce-scatter (every full gradient is alive at once, as in data parallelism);
  **stage 2** sends each gradient as soon as it is computed, one after another in the order
  the backward makes them, and its full copy can go; the next gradient is made only once the
  one before has left (the rest of the backward goes on), so at most one full gradient waits
  for the wire however slow the wire is;
- Adam on the owned shards of the working copy (``collectives.adam_on_shards``);
- each parameter's updated shards all-gathered into the working copy, one parameter at a time
  (at most one gathered parameter alive: all at once, stage 1's peak was measured at 3.2 times
  the model's bytes, above plain all-reduce's 2.2).

Per step each worker sends (N-1)/N of the gradients and (N-1)/N of the parameters: the bytes
of one ring all-reduce (``costs.all_reduce_bytes``). Its start, the step loop, the reports and
Stop are ``dtflab.train.worker_programs.loop``'s.
"""

from __future__ import annotations

import sys

from dtflab import tf_private
from dtflab.train.formulas import costs
from dtflab.train.worker_programs.collectives import (BETA1, BETA2, Collectives, adam_on_shards,
                                                      only_for, padded, run_with_own_checkpoints)
from dtflab.train.worker_programs.loop import start


def own_shard(tf, value, index: int, shard: int):
    """Worker ``index``'s shard of ``value`` flattened, padded with zeros where the value
    ends inside it: the slice alone, not a padded copy of the whole value."""
    flat = tf.reshape(value, [-1])
    count = int(flat.shape[0])
    start, stop = min(index * shard, count), min((index + 1) * shard, count)
    part = flat[start:stop]
    missing = shard - (stop - start)
    return tf.concat([part, tf.zeros([missing], flat.dtype)], 0) if missing else part


def zero_step(tf, problem, collectives: Collectives, stage: int, values, device: str = ""):
    """Worker ``collectives.index``'s state and step function for ZeRO ``stage`` (1 or 2):
    ``(train_step, params, (ms, vs, beta1_power, beta2_power))``. ``device``: where its
    variables and ops go ("": this process's own, as the planner traces it)."""
    index, workers = collectives.index, collectives.workers
    sizes = [costs.shard_size(value.size, workers) for _, value in values]
    with tf.device(device):
        params = [tf.Variable(value, name=name) for name, value in values]
        names = [name for name, _ in values]
        ms = [tf.Variable(tf.zeros([size]), name=f"{name}_m") for name, size in zip(names, sizes)]
        vs = [tf.Variable(tf.zeros([size]), name=f"{name}_v") for name, size in zip(names, sizes)]
        beta1_power = tf.Variable(BETA1, dtype=tf.float32, name="beta1_power")
        beta2_power = tf.Variable(BETA2, dtype=tf.float32, name="beta2_power")

    @tf.function
    def train_step(x, t):
        with tf.device(device):
            with tf.GradientTape() as tape:
                loss = problem.loss(problem.forward(params, x), t)
            gradients = tape.gradient(loss, params)
            # Stage 1: no gradient leaves before the whole backward has ended. Stage 2: each
            # as soon as it is made, in the order the backward makes them (the last
            # parameter's first), one after another, so both workers exchange the same
            # gradient at once and no gradient waits long for its partner.
            owned, last = [None] * len(params), []
            for i in reversed(range(len(params))):
                with tf.control_dependencies(gradients if stage == 1 else last):
                    owned[i] = collectives.reduce_scatter(
                        padded(tf, gradients[i], sizes[i], workers), sizes[i])
                last = [owned[i]]
            if stage == 2:
                # ...and each gradient is made only once the one before it has left: at most one
                # full gradient waits for the wire. Without it the backward made every gradient
                # first (measured: 1.5 M beyond the step's start before any exchange).
                for i in range(len(params) - 1):
                    for op in only_for(gradients, i):
                        tf_private.run_after(op, owned[i + 1].op)
            # Each owned shard of the working copy is read only once its gradient is here, and
            # the updates run one parameter after another: read early, every shard (M / N) sat
            # beside the gradients through the backward, and stage 2's peak was set by Adam.
            mine, before = [], []
            for i in reversed(range(len(params))):
                with tf.control_dependencies([owned[i], *before]):
                    mine.insert(0, own_shard(tf, params[i], index, sizes[i]))
                before = [mine[0]]
            updated, done = adam_on_shards(tf, problem.learning_rate, mine, ms, vs, owned,
                                           beta1_power, beta2_power, one_at_a_time=True)
            assigned = [done]
            for param, shard in zip(params, updated):
                # One parameter gathered at a time, each after the last is in place: at most
                # one gathered parameter alive beside the working copy, not all of them.
                with tf.control_dependencies(assigned[-1:]):
                    gathered = collectives.all_gather(shard)
                count = int(param.shape.num_elements())
                assigned.append(param.assign(tf.reshape(gathered[:count], param.shape)))
            with tf.control_dependencies(assigned):
                return tf.identity(loss)

    return train_step, params, (ms, vs, beta1_power, beta2_power)


def main(argv=None) -> int:
    worker = start(sys.argv[1:] if argv is None else argv, "worker_programs/zero.py")
    import tensorflow as tf

    flags, problem = worker.flags, worker.problem
    device = worker.strategy.extended.worker_devices[0]
    collectives = Collectives(tf, worker.index, worker.workers, flags.timeout)
    train_step, params, adam = zero_step(tf, problem, collectives, flags.zero_stage,
                                         problem.initial_values(flags.seed), device)
    return run_with_own_checkpoints(worker, params, adam, train_step, collectives, device,
                                    whole=True)


if __name__ == "__main__":
    sys.exit(main())
