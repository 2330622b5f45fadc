"""What the worker programs that shard (``sharded_data_parallel``, ``zero``) share:
TensorFlow's collective ops among the N workers, Adam applied to shards, and their end of
``main``: each worker saves and resumes its own part of the state.

TensorFlow 2.21 has no CPU implementation of ``CollectiveReduceScatterV2`` ("CollectiveRegistry::
Lookup did not find collective implementation"), so :meth:`Collectives.reduce_scatter` is built
from broadcasts in groups of two (``CollectiveBcastSendV2`` / ``CollectiveBcastRecvV2``, one
group per pair of workers): worker i sends chunk j of its tensor to worker j and adds the
chunks it receives, in worker order. Each worker sends (N-1)/N of the tensor, as a ring
reduce-scatter does.
"""

from __future__ import annotations

import glob
import json
import os

from dtflab.train.worker_programs.loop import run_steps, variable_bytes, write_checkpoint

#: Group keys of this program's collectives: far above MultiWorkerMirroredStrategy's own, which
#: count from 1. The whole group is GROUP_BASE; the pair (i, j) is GROUP_BASE + 1 + i x N + j.
GROUP_BASE = 1_000_000
#: tf.compat.v1.train.AdamOptimizer's defaults.
BETA1, BETA2, EPSILON = 0.9, 0.999, 1e-8


class Collectives:
    """TensorFlow's collective ops among the N workers. Keys are handed out as a function is
    traced: every worker traces the same functions in the same order, so every worker's k-th
    collective gets the same key."""

    def __init__(self, tf, index: int, workers: int, timeout_s: float):
        self.tf, self.index, self.workers, self.timeout_s = tf, index, workers, timeout_s
        self.next_key = 1

    def _keys(self, count: int = 1) -> int:
        first, self.next_key = self.next_key, self.next_key + count
        return first

    def all_gather(self, shard):
        """``[k]`` from every worker -> ``[N x k]``, in worker order."""
        if self.workers == 1:
            return self.tf.identity(shard)
        gathered = self.tf.raw_ops.CollectiveGatherV2(
            input=shard, group_size=self.workers, group_key=GROUP_BASE, instance_key=self._keys(),
            ordering_token=[], communication_hint="ring", timeout_seconds=self.timeout_s)
        if shard.shape.rank == 1 and shard.shape[0] is not None:  # TensorFlow's says (None,)
            gathered.set_shape([self.workers * shard.shape[0]])
        return gathered

    def all_reduce(self, value):
        """The sum over every worker."""
        if self.workers == 1:
            return self.tf.identity(value)
        return self.tf.raw_ops.CollectiveReduceV2(
            input=value, group_size=self.workers, group_key=GROUP_BASE, instance_key=self._keys(),
            ordering_token=[], merge_op="Add", final_op="Id", communication_hint="ring",
            timeout_seconds=self.timeout_s)

    def reduce_scatter(self, flat, k: int):
        """``[N x k]`` from every worker -> ``[k]``: chunk i of their sum, on worker i."""
        tf, n, i = self.tf, self.workers, self.index
        if n == 1:
            return tf.identity(flat)
        first = self._keys(n * n)  # key of the chunk worker a sends worker b: first + a x n + b
        chunks = tf.split(tf.reshape(flat, [n * k]), n)
        parts, sends = [], []
        for j in range(n):
            if j == i:
                parts.append(chunks[i])
                continue
            group = GROUP_BASE + 1 + min(i, j) * n + max(i, j)
            sends.append(tf.raw_ops.CollectiveBcastSendV2(
                input=chunks[j], group_size=2, group_key=group, instance_key=first + i * n + j,
                communication_hint="auto", timeout_seconds=self.timeout_s))
            parts.append(tf.raw_ops.CollectiveBcastRecvV2(
                group_size=2, group_key=group, instance_key=first + j * n + i,
                shape=[k], T=flat.dtype, communication_hint="auto",
                timeout_seconds=self.timeout_s))
        with tf.control_dependencies(sends):  # a send nothing reads would be pruned
            return tf.add_n(parts)


def padded(tf, value, shard: int, workers: int):
    """``value`` flattened and padded with zeros to ``shard x workers`` values (a copy only
    where it needs the zeros): what :meth:`Collectives.reduce_scatter` cuts."""
    flat = tf.reshape(value, [-1])
    missing = shard * workers - flat.shape[0]
    return tf.concat([flat, tf.zeros([missing], flat.dtype)], 0) if missing else flat


def only_for(gradients, i: int) -> list:
    """The first ops of what only ``gradients[i]`` needs (``x^T dy`` and its sum for a weight;
    not ``dy``, which the layers below need too): the ops to hold back to make that gradient
    later without holding back the rest of the backward."""
    def ancestors(tensors) -> set:
        seen, stack = set(), [t.op for t in tensors if t is not None]
        while stack:
            op = stack.pop()
            if op not in seen:
                seen.add(op)
                stack += [t.op for t in op.inputs] + list(op.control_inputs)
        return seen

    mine = ancestors([gradients[i]])
    own = mine - ancestors([g for j, g in enumerate(gradients) if j != i])
    return sorted((op for op in own if op.inputs and not any(t.op in own for t in op.inputs)),
                  key=lambda op: op.name)


def adam_on_shards(tf, learning_rate, shards, ms, vs, gradients, beta1_power, beta2_power,
                   one_at_a_time: bool = False):
    """tf.compat.v1.train.AdamOptimizer's update of each shard (in the order its
    ``ResourceApplyAdam`` kernel computes it), then its beta powers: ``(updated, done)``, each
    shard's new value (a variable shard is assigned it) and the op that ends the update.
    ``one_at_a_time``: each shard's update after the one before it, last shard first (the
    order the backward makes the gradients), so one shard's temporaries are alive at once."""
    lr, beta1, beta2, epsilon = (tf.constant(value, tf.float32) for value in
                                 (learning_rate, BETA1, BETA2, EPSILON))
    alpha = lr * tf.sqrt(1.0 - beta2_power) / (1.0 - beta1_power)
    updated = [None] * len(shards)
    order = list(reversed(range(len(shards)))) if one_at_a_time else list(range(len(shards)))
    for i in order:
        shard, m, v, g = shards[i], ms[i], vs[i], gradients[i]
        earlier = [updated[j] for j in order[:order.index(i)][-1:]] if one_at_a_time else []
        with tf.control_dependencies(earlier):
            m_t = m.assign_add((g - m) * (1.0 - beta1))
            v_t = v.assign_add((tf.square(g) - v) * (1.0 - beta2))
            step = m_t * alpha / (tf.sqrt(v_t) + epsilon)
            updated[i] = shard.assign_sub(step) if isinstance(shard, tf.Variable) else shard - step
    with tf.control_dependencies(updated):
        return updated, tf.group(beta1_power.assign(beta1_power * beta1),
                                 beta2_power.assign(beta2_power * beta2))


def run_with_own_checkpoints(worker, held, adam, train_step, collectives: Collectives,
                             device: str, *, whole: bool) -> int:
    """Resume this worker's own part (``held``: the parameters it keeps, ``whole`` copies or
    its shards; ``adam``: Adam's ``(m, v, beta1_power, beta2_power)`` for them) from the newest
    step every worker saved, set up the check's collective, say hello, and run the steps,
    saving every ``--checkpoint-every`` steps as ``saved-<step>.json`` in this worker's
    folder; each worker's state reported as its parameters' bytes and Adam's m and v's. The
    check sums the stop votes and what the workers hold (the fingerprint: one copy's sum).
    Returns the program's exit status, 0."""
    import tensorflow as tf

    ms, vs, beta1_power, beta2_power = adam
    copies = worker.workers if whole else 1  # whole copies are the same on every worker

    @tf.function
    def check(stop_vote):
        with tf.device(device):
            mine = tf.add_n([tf.reduce_sum(tf.cast(value, tf.float64)) for value in held])
            total = collectives.all_reduce(tf.stack([tf.cast(stop_vote, tf.float64), mine]))
            return total[0], total[1] / copies

    checkpoint = tf.train.Checkpoint(held=held, m=ms, v=vs, beta1_power=beta1_power,
                                     beta2_power=beta2_power)

    def state_bytes():
        return {"parameters": variable_bytes(held), "slots": variable_bytes(ms + vs)}

    flags, index = worker.flags, worker.index
    first = resume(checkpoint, flags, index, worker.workers)
    check(tf.constant(0.0))  # traced and its collective set up now, not inside a timed step
    worker.hello(first)
    folder = os.path.join(flags.checkpoint_dir, f"worker-{index}")
    run_steps(worker, first, train_step, check,
              lambda next_step: write_checkpoint(checkpoint, folder, next_step,
                                                 f"saved-{next_step}.json"),
              state_bytes)
    return 0


def resume(checkpoint, flags, index: int, workers: int) -> int:
    """Restore this worker's shards from the newest step every worker saved (each holds a
    different part, so all must go back to the same step); the step to start from."""
    if not flags.checkpoint_every and flags.trace_step < 0:
        return 0
    saved = []
    for worker in range(workers):
        files = glob.glob(os.path.join(flags.checkpoint_dir, f"worker-{worker}", "saved-*.json"))
        saved.append({int(os.path.basename(f)[len("saved-"):-len(".json")]) for f in files})
    common = set.intersection(*saved)
    if not common:
        return 0
    step = max(common)
    with open(os.path.join(flags.checkpoint_dir, f"worker-{index}", f"saved-{step}.json")) as file:
        checkpoint.read(json.load(file)["path"]).assert_consumed()
    return step
