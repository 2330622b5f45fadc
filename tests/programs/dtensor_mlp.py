"""A DTensor multi-client training program: an original program for dtflab's tests, written
from TensorFlow's public DTensor API (``tf.experimental.dtensor``) as documented.

It reads nothing of dtflab's: only the variables DTensor itself reads when
``initialize_accelerator_system`` starts a multi-client cluster (``DTENSOR_CLIENT_ID``,
``DTENSOR_NUM_CLIENTS``, ``DTENSOR_JOB_NAME``, ``DTENSOR_JOBS``). Without them it runs alone.

Each client makes ``--num_local_devices`` CPU devices; the mesh is batch x model over every
client's devices. A two-layer MLP, ``tanh(x @ w1) @ w2``, has ``w1`` sharded on ``model`` by
columns and ``w2`` by rows; a synthetic batch from a fixed seed (the same on every client) is
sharded on ``batch``; ``--steps`` SGD steps on the mean squared error. Every client prints
``step <i> loss <value>`` lines, then ``client <id> mesh <shape> loss <last loss>``.

    python dtensor_mlp.py --num_local_devices=4 --batch=2 --model=2   # one client
    dtflab run --workers 2 dtensor_mlp.py --num_local_devices=2       # two clients
"""

import argparse

import numpy as np

BATCH, FEATURES, HIDDEN = 8, 4, 8


def synthetic(seed=0):
    """The inputs, targets and initial weights: float32 numpy arrays from ``seed``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = np.sin(x.sum(axis=1, keepdims=True)).astype(np.float32)
    w1 = (rng.normal(size=(FEATURES, HIDDEN)) * 0.5).astype(np.float32)
    w2 = (rng.normal(size=(HIDDEN, 1)) * 0.5).astype(np.float32)
    return x, y, w1, w2


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_local_devices", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2, help="the mesh's batch dimension")
    parser.add_argument("--model", type=int, default=2, help="the mesh's model dimension")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--learning_rate", type=float, default=0.1)
    flags = parser.parse_args()

    import tensorflow as tf
    from tensorflow.experimental import dtensor

    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=flags.num_local_devices)
    mesh = dtensor.create_distributed_mesh([("batch", flags.batch), ("model", flags.model)],
                                           device_type="CPU")
    U = dtensor.UNSHARDED

    def on_mesh(array, *sharding):  # the same array on every client, then sharded
        replicated = dtensor.Layout.replicated(mesh, rank=array.ndim)
        return dtensor.relayout(dtensor.copy_to_mesh(tf.constant(array), replicated),
                                dtensor.Layout(list(sharding), mesh))

    x, y, w1, w2 = synthetic()
    x, y = on_mesh(x, "batch", U), on_mesh(y, "batch", U)
    w1 = dtensor.DVariable(on_mesh(w1, U, "model"))  # columns on "model"
    w2 = dtensor.DVariable(on_mesh(w2, "model", U))  # rows on "model"

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.tanh(tf.matmul(x, w1)), w2) - y))
        g1, g2 = tape.gradient(loss, [w1, w2])
        w1.assign_sub(flags.learning_rate * g1)
        w2.assign_sub(flags.learning_rate * g2)
        return loss

    for step in range(flags.steps):
        loss = float(dtensor.unpack(train_step(x, y))[0].numpy())  # replicated: any component
        print(f"step {step} loss {loss:.6f}", flush=True)
    dtensor.barrier(mesh)  # no client leaves while another still needs it
    print(f"client {dtensor.client_id()} mesh {mesh.shape()} loss {loss:.6f}", flush=True)


if __name__ == "__main__":
    main()
