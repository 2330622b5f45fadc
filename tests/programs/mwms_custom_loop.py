"""Two-or-more-worker synchronous all-reduce with MultiWorkerMirroredStrategy and a custom
training loop, configured only by TF_CONFIG (as TensorFlow's multi-worker tutorials are).
Every worker prints one "step N loss X" line per step; the losses must be identical."""

import sys

import numpy as np
import tensorflow as tf

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
options = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
workers = strategy.num_replicas_in_sync
task = strategy.cluster_resolver.task_id

with strategy.scope():
    w = tf.Variable(tf.zeros([4, 1]))
    b = tf.Variable(tf.zeros([1]))


@tf.function
def train_step(x, y):
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.matmul(x, w) + b - y)) / (workers * 16.0)
        grads = tape.gradient(loss, [w, b])
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce("sum", grads)
        for var, grad in zip([w, b], grads):
            var.assign_sub(0.1 * grad)
        return ctx.all_reduce("sum", loss)
    return strategy.run(replica_step, args=(x, y))


rng = np.random.default_rng(task)  # each worker its own shard
for step in range(steps):
    x = rng.normal(size=(16, 4)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32") + 0.5
    loss = train_step(tf.constant(x), tf.constant(y))
    print(f"step {step} loss {float(loss):.9f}", flush=True)
