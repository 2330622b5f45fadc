"""What every worker program of a worker-program loop runs around its own step
(``all_reduce.py``, ``sharded_data_parallel.py`` here): its start (flags, threads, the
connection to the notebook, the collectives), the step loop and its checkpoints.

The loop makes only the worker's own slice of each global batch (``Problem.batch(...,
part=...)``) and hands it to the program's step. Every ``--check-every`` steps (and at the
last) the program's check all-reduces the workers' stop votes (a Stop sent to any worker ends
every worker after the same step: a worker that stopped alone would leave the others waiting
in the next collective) and a fingerprint of the weights.

It reports to the notebook as ``contract`` defines: ``hello``, a ``step`` per step (its slice's
summed loss, its own step time, what its variables take, the step's peak bytes beyond what it
held before it; on check steps a fingerprint of the weights and the process's memory),
``done``; it reads ``stop`` and, with ``--lockstep``, ``go``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time

from dtflab.train.worker_programs.contract import GO, STOP, Flags, message

#: How long a worker keeps trying to reach the notebook that started it.
CONNECT_TIMEOUT_S = 60.0
#: Seconds without a heartbeat before TensorFlow's coordination service counts a worker as
#: dead and ends every worker. TensorFlow's default, 10 s, ends the whole job when one worker is
#: starved of CPU that long (measured: a worker frozen for 13 s ended both); dtflab notices dead
#: workers itself (their process ends) and stalled steps with its watchdog, so TensorFlow's
#: check is only the last resort here.
HEARTBEAT_S = 120.0


@dataclasses.dataclass
class Worker:
    """One worker program once it has set up: its flags, problem, place among the workers,
    the connection to the notebook and the MultiWorkerMirroredStrategy that set up the
    collectives."""

    flags: Flags
    problem: object
    name: str  # "worker:1"
    index: int
    report: "Report"
    strategy: object
    workers: int

    def hello(self, resumed_at: int) -> None:
        """Tell the notebook this worker is ready (its collectives are up)."""
        self.report.send("hello", worker=self.name, pid=os.getpid(), workers=self.workers,
                         resumed_at=resumed_at, reached=self.flags.report)


def start(argv, prog: str, communication=lambda flags: {}) -> Worker:
    """What every worker program does first: read its flags, set its threads, find its place
    from ``TF_CONFIG``, reach the notebook and set up MultiWorkerMirroredStrategy's collectives
    (ring; ``communication(flags)`` adds to its ``CommunicationOptions``)."""
    flags = Flags.parse(argv, prog)
    # TensorFlow's best-fit allocator on the CPU: it counts the bytes in use and their peak
    # (``step_peak_bytes``); the default CPU allocator counts nothing.
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    import tensorflow as tf

    from dtflab.tf_private import patient_coordination

    if flags.threads:
        tf.config.threading.set_intra_op_parallelism_threads(flags.threads)
        tf.config.threading.set_inter_op_parallelism_threads(flags.threads)
    from dtflab.train.problems import from_json

    problem = from_json(flags.problem)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    report = Report(flags.report)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        **communication(flags))
    patient_coordination(resolver.cluster_spec(), HEARTBEAT_S)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(resolver, communication_options=options)
    return Worker(flags, problem, f"{resolver.task_type}:{resolver.task_id}", resolver.task_id,
                  report, strategy, strategy.num_replicas_in_sync)


def write_checkpoint(checkpoint, folder: str, next_step: int, pointer: str) -> None:
    """Write a checkpoint under ``folder``, then the JSON file ``pointer`` naming it (written
    aside and renamed: a worker killed while writing leaves the previous pointer, or none)."""
    # A name of its own: a worker restarted at a step it had saved saves that step again, and
    # a kill in mid-write must not spoil the copy a pointer names.
    path = checkpoint.write(os.path.join(folder, f"step-{next_step}-{os.getpid()}"))
    with open(os.path.join(folder, pointer + ".tmp"), "w") as out:
        json.dump({"path": path, "next_step": next_step}, out)
    os.replace(os.path.join(folder, pointer + ".tmp"), os.path.join(folder, pointer))


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
                if line.strip() == STOP:
                    self.stop.set()
                    self.go.set()
                elif line.strip() == GO:
                    self.go.set()
        self.stop.set()
        self.go.set()

    def send(self, kind: str, **fields) -> None:
        self.sock.sendall(message(kind, **fields))


def variable_bytes(variables) -> int:
    """Bytes the values of ``variables`` take in this process (shape x dtype size)."""
    return sum(int(v.shape.num_elements()) * v.dtype.size for v in variables)


def memory() -> dict | None:
    """This process's resident and proportional set sizes in bytes (``rss``, ``pss``, from
    /proc/self/smaps_rollup: Linux only; ``None`` elsewhere)."""
    try:
        with open("/proc/self/smaps_rollup") as file:
            fields = dict(line.split(":", 1) for line in file if line.count(":") == 1)
    except OSError:
        return None
    return {key.lower(): int(fields[key].split()[0]) * 1024 for key in ("Rss", "Pss") if key in fields}


def _bytes_in_use(tf, *, reset_peak: bool = False, peak: bool = False) -> int | None:
    """The CPU allocator's bytes in use (or their peak since the last reset); ``None`` where it
    does not count them (a process whose allocator was made before ``start`` chose it)."""
    try:
        if reset_peak:
            tf.config.experimental.reset_memory_stats("CPU:0")
        return tf.config.experimental.get_memory_info("CPU:0")["peak" if peak else "current"]
    except ValueError:
        return None


#: Seconds a traced step waits before the profiler stops: its collectives' events are recorded.
TRACE_SETTLE_S = 0.2


def trace_folder(trace_dir: str, worker: str) -> str:
    """Where ``worker`` writes its profile of the traced step (the notebook reads it there)."""
    return os.path.join(trace_dir, worker.replace(":", "-"))


def _batches(args, problem, index: int, workers: int):
    """``batches(step) -> (x, t)``: this worker's slice of ``Problem.batch``, or its share of
    the input pipeline's batches (``--inputs``: made here from its own elements, or from the
    data service's job, which every worker shares)."""
    if not args.inputs:
        return lambda step: problem.batch(step, args.seed, part=(index, workers))
    from dtflab.train.problems.input_pipeline import from_json

    return from_json(args.inputs).batches(args.seed, part=(index, workers))


def run_steps(worker: Worker, first: int, train_step, check, save, state_bytes) -> None:
    """Steps ``first`` to ``--steps``, reporting each, then ``done``.

    ``train_step(x, t)`` trains on the worker's slice and returns its summed loss (a tensor);
    ``check(stop_vote)`` returns the summed votes and a fingerprint (tensors, the same on
    every worker); ``save(next_step)`` writes a checkpoint; ``state_bytes()`` what the worker's
    variables take, ``{"parameters": ..., "slots": ...}`` (the optimizer's slots: Adam's m and v;
    its two scalars left out)."""
    import tensorflow as tf

    args, report, problem, name = worker.flags, worker.report, worker.problem, worker.name
    index, workers = worker.index, worker.workers
    share = problem.batch_size // workers
    slow = float(json.loads(args.slow).get(name, 0.0))
    batches = _batches(args, problem, index, workers)
    for step in range(first, args.steps):
        began = time.perf_counter()
        if slow:
            time.sleep(slow)
        x, t = batches(step)
        waited = time.perf_counter() - began - slow  # made or received only now: no overlap
        traced = step == args.trace_step and args.trace_dir
        if traced:
            # TensorFlow's profiler sometimes corrupts the heap in stop() on a loaded machine
            # (measured: 5 of 60 traced runs, two busy cores, forked or spawned alike): saved
            # first, the notebook can restart every worker at this step and trace it again.
            save(step)
            tf.profiler.experimental.start(trace_folder(args.trace_dir, name))
        x, t = tf.constant(x), tf.constant(t)
        before = _bytes_in_use(tf, reset_peak=True)
        loss = float(train_step(x, t).numpy())  # the step is over
        step_peak = None if before is None else _bytes_in_use(tf, peak=True) - before
        if traced:
            # An asynchronous collective's event is recorded after its result is handed on,
            # so the step can end first: without this wait the profiler lost some of them
            # (a third of the traced test runs on 2 idle cores).
            time.sleep(TRACE_SETTLE_S)
            tf.profiler.experimental.stop()
        checking = (step + 1) % args.check_every == 0 or step + 1 == args.steps
        votes = fingerprint = None
        if checking:
            votes, fingerprint = (float(value.numpy()) for value in
                                  check(tf.constant(1.0 if report.stop.is_set() else 0.0)))
        report.send("step", worker=name, step=step, loss_sum=loss, examples=share,
                    fingerprint=fingerprint, step_s=time.perf_counter() - began,
                    state_bytes=state_bytes(), memory=memory() if checking else None,
                    step_peak_bytes=step_peak, input_wait_s=waited if args.inputs else None)
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            save(step + 1)
        if votes:
            break
        if args.lockstep:  # the notebook reads counters between steps
            report.go.wait()
            report.go.clear()
    report.send("done", worker=name)
