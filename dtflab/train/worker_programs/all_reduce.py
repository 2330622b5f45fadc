"""The program every worker of ``train.all_reduce`` runs (one process per worker, started by
``dtflab.run`` with ``TF_CONFIG`` set): MultiWorkerMirroredStrategy, ring all-reduce over gRPC.

It trains on its own slice of each global batch; the optimizer sums the gradients over all
workers (TensorFlow's v1 optimizers all-reduce inside ``apply_gradients``), so every worker
applies the same update. That is the step's one collective: the loss it reports is its slice's
(the notebook adds the slices up). Its start, the step loop, the reports and Stop are
``dtflab.train.worker_programs.loop``'s. With ``--checkpoint-every K`` it writes its variables
and optimizer slots every K steps (``latest.json`` names the newest) and resumes from worker
0's newest checkpoint when started again.
"""

from __future__ import annotations

import json
import os
import sys

from dtflab.train.worker_programs.loop import run_steps, start, variable_bytes, write_checkpoint


def main(argv=None) -> int:
    worker = start(sys.argv[1:] if argv is None else argv, "worker_programs/all_reduce.py",
                   lambda flags: {"bytes_per_pack": flags.bucket_bytes,
                                  "timeout_seconds": flags.timeout or None})
    import tensorflow as tf

    flags, problem, strategy = worker.flags, worker.problem, worker.strategy
    with strategy.scope():
        variables = [tf.Variable(value, name=key)
                     for key, value in problem.initial_values(flags.seed)]
        optimizer = problem.optimizer()

    @tf.function
    def train_step(x, t):
        def replica(x, t):
            with tf.GradientTape() as tape:
                loss = problem.loss(problem.forward(variables, x), t)
            gradients = tape.gradient(loss, variables)
            weights_first(tf.compat.v1.get_default_graph())
            optimizer.apply_gradients(zip(gradients, variables))
            return loss

        return strategy.experimental_local_results(strategy.run(replica, args=(x, t)))[0]

    @tf.function
    def check(stop_vote):
        def replica(stop_vote):
            # A tensor made in the replica: the argument itself has no device to reduce onto.
            votes = tf.distribute.get_replica_context().all_reduce("sum", tf.stack([stop_vote]))[0]
            fingerprint = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float64)) for v in variables])
            return votes, fingerprint

        votes, fingerprint = strategy.run(replica, args=(stop_vote,))
        return (strategy.experimental_local_results(votes)[0],
                strategy.experimental_local_results(fingerprint)[0])

    checkpoint = tf.train.Checkpoint(variables=variables, optimizer=optimizer)
    first = resume(checkpoint, flags)
    check(tf.constant(0.0))  # traced and its collective set up now, not inside a timed step
    worker.hello(first)

    def state_bytes():  # the slots (Adam's m and v) exist once the first step has run
        slots = [optimizer.get_slot(v, slot) for v in variables
                 for slot in optimizer.get_slot_names()]
        return {"parameters": variable_bytes(variables),
                "slots": variable_bytes([slot for slot in slots if slot is not None])}

    folder = os.path.join(flags.checkpoint_dir, f"worker-{worker.index}")
    run_steps(worker, first, train_step, check,
              lambda next_step: write_checkpoint(checkpoint, folder, next_step, "latest.json"),
              state_bytes)
    return 0


def weights_first(graph) -> None:
    """In each layer's backward, the gradients of its weights and bias before the gradient of
    its input: the all-reduce packs the last layers' gradients first (``bucket_bytes``), so a
    pack is complete, and its collective can run, while the layers before still compute.
    (With one inter-op thread TensorFlow's executor otherwise runs the input gradients first,
    depth first, and every pack waits for the end of the backward pass.)"""
    from dtflab import tf_private

    ops = {op.name: op for op in graph.get_operations()}
    for name, op in ops.items():
        if "gradient_tape/" in name and name.endswith("/MatMul/MatMul"):
            layer = name[:-len("/MatMul/MatMul")]
            for before in (ops.get(layer + "/MatMul/MatMul_1"), ops.get(layer + "/add/Sum")):
                if before is not None:
                    tf_private.run_after(op, before)


def resume(checkpoint, flags) -> int:
    """Restore worker 0's newest checkpoint (every worker holds the same values); the step to
    start from (0 without one)."""
    if not flags.checkpoint_every and flags.trace_step < 0:
        return 0
    latest = os.path.join(flags.checkpoint_dir, "worker-0", "latest.json")
    if not os.path.exists(latest):
        return 0
    with open(latest) as file:
        saved = json.load(file)
    checkpoint.read(saved["path"]).expect_partial()  # slots are restored when first created
    return int(saved["next_step"])


if __name__ == "__main__":
    sys.exit(main())
