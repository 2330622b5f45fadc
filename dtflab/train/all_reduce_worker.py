"""The program every worker of ``train.all_reduce`` runs (one process per worker, started by
``dtflab.run`` with ``TF_CONFIG`` set): MultiWorkerMirroredStrategy, ring all-reduce over gRPC.

It makes only its own slice of each global batch (``Problem.batch(..., part=...)``) and trains
on it; the optimizer sums the gradients over all workers (TensorFlow's v1 optimizers all-reduce
inside ``apply_gradients``), so every worker applies the same update. That is the step's one
collective: the loss it reports is its slice's (the notebook adds the slices up), and only every
``--check-every`` steps do the workers all-reduce their stop votes (a Stop sent to any worker
ends every worker after the same step: a worker that stopped alone would leave the others
waiting in the next collective) and fingerprint their weights.

It reports to the notebook over one TCP connection (``--report host:port``), a JSON line per
message: ``hello`` (once the strategy is up; with the address it reached), ``step`` (its slice's summed loss, its own step
time, a fingerprint of its weights on check steps), ``done``. The notebook writes ``stop`` to
it, and with ``--lockstep`` a ``go`` after each step it has recorded. With
``--checkpoint-every K`` it writes its variables and optimizer slots every K steps and resumes
from worker 0's newest checkpoint when started again.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time

#: How long a worker keeps trying to reach the notebook that started it.
CONNECT_TIMEOUT_S = 60.0
#: Seconds without a heartbeat before TensorFlow's coordination service counts a worker as
#: dead and ends every worker. TensorFlow's default, 10 s, ends the whole job when one worker is
#: starved of CPU that long (measured: a worker frozen for 13 s ended both); dtflab notices dead
#: workers itself (their process ends) and stalled steps with its watchdog, so TensorFlow's
#: check is only the last resort here.
HEARTBEAT_S = 120.0


def arguments(argv):
    parser = argparse.ArgumentParser(prog="all_reduce_worker")
    parser.add_argument("--problem", required=True, help="the Problem's fields as JSON")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", required=True, help="host:port of the notebook's listener")
    parser.add_argument("--slow", default="{}", help='{"worker:1": 0.05}: extra seconds per step')
    parser.add_argument("--checkpoint-dir", default="")
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--trace-step", type=int, default=-1)
    parser.add_argument("--trace-dir", default="")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra- and inter-op threads (0: TensorFlow's default, every core)")
    parser.add_argument("--lockstep", action="store_true",
                        help="after each step, wait for the notebook's go")
    parser.add_argument("--bucket-bytes", type=int, default=0,
                        help="gradients packed into all-reduces of about this many bytes "
                             "(0: one all-reduce of every gradient)")
    parser.add_argument("--check-every", type=int, default=10,
                        help="steps between agreeing on Stop and fingerprinting the weights")
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="seconds a collective may wait for the others (0: no limit)")
    return parser.parse_args(argv)


class Report:
    """The connection to the notebook: JSON lines out; ``stop`` and ``go`` in, read by a
    thread (a closed connection counts as both: nobody is left to wait for)."""

    def __init__(self, address: str):
        host, _, port = address.rpartition(":")
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                self.sock = socket.create_connection((host, int(port)), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.sock.settimeout(None)
        self.stop, self.go = threading.Event(), threading.Event()
        threading.Thread(target=self._read, name="dtflab-report", daemon=True).start()

    def _read(self) -> None:
        with self.sock.makefile("r") as lines:
            for line in lines:
                if line.strip() == "stop":
                    self.stop.set()
                    self.go.set()
                elif line.strip() == "go":
                    self.go.set()
        self.stop.set()
        self.go.set()

    def send(self, **message) -> None:
        self.sock.sendall((json.dumps(message) + "\n").encode())


def main(argv=None) -> int:
    args = arguments(sys.argv[1:] if argv is None else argv)
    import tensorflow as tf

    from dtflab.tf_private import patient_coordination
    from dtflab.train.problems import Problem

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    fields = json.loads(args.problem)
    problem = Problem(**{**fields, "layers": tuple(fields["layers"])})
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    name = f"{resolver.task_type}:{resolver.task_id}"
    report = Report(args.report)
    slow = float(json.loads(args.slow).get(name, 0.0))
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        bytes_per_pack=args.bucket_bytes, timeout_seconds=args.timeout or None)
    patient_coordination(resolver.cluster_spec(), HEARTBEAT_S)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(resolver, communication_options=options)
    workers = strategy.num_replicas_in_sync
    share = problem.batch_size // workers
    with strategy.scope():
        variables = [tf.Variable(value, name=key) for key, value in problem.initial_values(args.seed)]
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
    first = resume(checkpoint, args, resolver.task_id)
    check(tf.constant(0.0))  # traced and its collective set up now, not inside a timed step
    report.send(kind="hello", worker=name, pid=os.getpid(), workers=workers, resumed_at=first,
                reached=args.report)
    for step in range(first, args.steps):
        began = time.perf_counter()
        if slow:
            time.sleep(slow)
        x, t = problem.batch(step, args.seed, part=(resolver.task_id, workers))
        traced = step == args.trace_step and args.trace_dir
        if traced:
            # TensorFlow's profiler sometimes corrupts the heap in stop() on a loaded machine
            # (measured: 5 of 60 traced runs, two busy cores, forked or spawned alike): saved
            # first, the notebook can restart every worker at this step and trace it again.
            save(checkpoint, args, resolver.task_id, step)
            tf.profiler.experimental.start(trace_folder(args.trace_dir, name))
        loss = float(train_step(tf.constant(x), tf.constant(t)).numpy())  # the step is over
        if traced:
            tf.profiler.experimental.stop()
        checking = (step + 1) % args.check_every == 0 or step + 1 == args.steps
        votes = fingerprint = None
        if checking:
            votes, fingerprint = (float(value.numpy()) for value in
                                  check(tf.constant(1.0 if report.stop.is_set() else 0.0)))
        report.send(kind="step", worker=name, step=step, loss_sum=loss, examples=share,
                    fingerprint=fingerprint, step_s=time.perf_counter() - began)
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            save(checkpoint, args, resolver.task_id, step + 1)
        if votes:
            break
        if args.lockstep:  # the notebook reads counters between steps
            report.go.wait()
            report.go.clear()
    report.send(kind="done", worker=name)
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


def trace_folder(trace_dir: str, worker: str) -> str:
    """Where ``worker`` writes its profile of the traced step (the notebook reads it there)."""
    return os.path.join(trace_dir, worker.replace(":", "-"))


def save(checkpoint, args, task_id: int, next_step: int) -> None:
    """Write this worker's checkpoint, then point ``latest.json`` at it (a worker killed while
    writing leaves the previous one in place)."""
    folder = os.path.join(args.checkpoint_dir, f"worker-{task_id}")
    # A name of its own: a worker restarted at a step it had saved saves that step again, and
    # a kill in mid-write must not spoil the copy latest.json points at.
    path = checkpoint.write(os.path.join(folder, f"step-{next_step}-{os.getpid()}"))
    with open(os.path.join(folder, "latest.json.tmp"), "w") as out:
        json.dump({"path": path, "next_step": next_step}, out)
    os.replace(os.path.join(folder, "latest.json.tmp"), os.path.join(folder, "latest.json"))


def resume(checkpoint, args, task_id: int) -> int:
    """Restore worker 0's newest checkpoint (every worker holds the same values); the step to
    start from (0 without one)."""
    if not args.checkpoint_every and args.trace_step < 0:
        return 0
    latest = os.path.join(args.checkpoint_dir, "worker-0", "latest.json")
    if not os.path.exists(latest):
        return 0
    with open(latest) as file:
        saved = json.load(file)
    checkpoint.read(saved["path"]).expect_partial()  # slots are restored when first created
    return int(saved["next_step"])


if __name__ == "__main__":
    sys.exit(main())
