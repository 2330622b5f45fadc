"""What every worker program of a worker-program loop runs around its own step
(``worker_programs/all_reduce.py``, ``worker_programs/sharded_data_parallel.py``): its arguments, the connection to the notebook and
the step loop.

The loop makes only the worker's own slice of each global batch (``Problem.batch(...,
part=...)``) and hands it to the program's step. Every ``--check-every`` steps (and at the
last) the program's check all-reduces the workers' stop votes (a Stop sent to any worker ends
every worker after the same step: a worker that stopped alone would leave the others waiting
in the next collective) and a fingerprint of the weights.

It reports to the notebook over one TCP connection (``--report host:port``), a JSON line per
message: ``hello`` (once the collectives are up; with the address it reached), ``step`` (its
slice's summed loss, its own step time, what its variables take, ``state_bytes``; on check
steps a fingerprint of the weights and the process's memory), ``done``. The notebook writes ``stop`` to it, and with
``--lockstep`` a ``go`` after each step it has recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
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


def parser(prog: str) -> argparse.ArgumentParser:
    """The arguments every worker program takes (a program adds its own)."""
    parser = argparse.ArgumentParser(prog=prog)
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
    parser.add_argument("--check-every", type=int, default=10,
                        help="steps between agreeing on Stop and fingerprinting the weights")
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="seconds a collective may wait for the others (0: no limit)")
    return parser


def problem_of(args):
    """The Problem the notebook sent as JSON."""
    from dtflab.train.problems import Problem

    fields = json.loads(args.problem)
    return Problem(**{**fields, "layers": tuple(fields["layers"])})


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


#: Seconds a traced step waits before the profiler stops: its collectives' events are recorded.
TRACE_SETTLE_S = 0.2


def trace_folder(trace_dir: str, worker: str) -> str:
    """Where ``worker`` writes its profile of the traced step (the notebook reads it there)."""
    return os.path.join(trace_dir, worker.replace(":", "-"))


def run_steps(args, report: Report, problem, name: str, index: int, workers: int, first: int,
              train_step, check, save, state_bytes) -> None:
    """Steps ``first`` to ``--steps``, reporting each, then ``done``.

    ``train_step(x, t)`` trains on the worker's slice and returns its summed loss (a tensor);
    ``check(stop_vote)`` returns the summed votes and a fingerprint (tensors, the same on
    every worker); ``save(next_step)`` writes a checkpoint; ``state_bytes()`` what the worker's
    variables take, ``{"parameters": ..., "slots": ...}`` (the optimizer's slots: Adam's m and v;
    its two scalars left out)."""
    import tensorflow as tf

    share = problem.batch_size // workers
    slow = float(json.loads(args.slow).get(name, 0.0))
    for step in range(first, args.steps):
        began = time.perf_counter()
        if slow:
            time.sleep(slow)
        x, t = problem.batch(step, args.seed, part=(index, workers))
        traced = step == args.trace_step and args.trace_dir
        if traced:
            # TensorFlow's profiler sometimes corrupts the heap in stop() on a loaded machine
            # (measured: 5 of 60 traced runs, two busy cores, forked or spawned alike): saved
            # first, the notebook can restart every worker at this step and trace it again.
            save(step)
            tf.profiler.experimental.start(trace_folder(args.trace_dir, name))
        loss = float(train_step(tf.constant(x), tf.constant(t)).numpy())  # the step is over
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
        report.send(kind="step", worker=name, step=step, loss_sum=loss, examples=share,
                    fingerprint=fingerprint, step_s=time.perf_counter() - began,
                    state_bytes=state_bytes(), memory=memory() if checking else None)
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            save(step + 1)
        if votes:
            break
        if args.lockstep:  # the notebook reads counters between steps
            report.go.wait()
            report.go.clear()
    report.send(kind="done", worker=name)
