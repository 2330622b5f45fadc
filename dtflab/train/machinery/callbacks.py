"""Training hooks: subclass and override what you need; every method does nothing by default."""

from __future__ import annotations

import threading


class Callback:
    """Called by every loop. Methods run in the loop's thread (a worker's thread for async):
    keep them short, they are inside the timed step.

    ``between_steps = True`` asks loops whose steps run in other processes (``all_reduce``)
    to hold the next step until ``on_step`` has returned."""

    between_steps = False

    def on_run_start(self, history) -> None:
        """Before the first step."""

    def on_step(self, history, record) -> None:
        """After each applied update; ``record`` is the StepRecord just added."""

    def on_run_end(self, history) -> None:
        """After the last step, also when the run stopped early or failed."""


class WireBytes(Callback):
    """Bytes on the wire between tasks per step, counted at the transport (the kernel's TCP
    counters, see ``dtflab.network.transport``) over steps ``after_step`` to
    ``after_step + steps`` of a run: past the start-up (graphs sent to the tasks, first-step
    set-up), and while every connection is still open.

    In [1]: wire = WireBytes()
    In [2]: train.sync_data_parallel(problem, cluster, callbacks=[wire])
    In [3]: wire.per_step.sent_by()       # {'ps:0': 9.1e6, 'worker:0': 4.6e6, ...}

    ``per_step`` is a ``WireSnapshot`` (``None`` if the run ended before a step was counted);
    ``cluster`` defaults to the one the run trains on. The counters are read after every step
    of the window: ``all_reduce`` holds its workers while they are (``between_steps``).

    A step the watchdog saw stall is left out (``skipped`` counts them), and the window runs
    that many steps longer: a stalled step is run again on a new session, or from a checkpoint,
    so its bytes cross twice, or partly. A run that ends first is counted over the steps it had.
    """

    between_steps = True

    def __init__(self, cluster=None, *, after_step: int = 2, steps: int = 10):
        self.cluster, self.after_step, self.steps = cluster, after_step, steps
        self.per_step = None
        self.skipped = 0
        self._lock = threading.Lock()
        self._last = None  # (step, snapshot, stalls so far) at the last step counted
        self._counted, self._counted_steps = None, 0

    def on_run_start(self, history) -> None:
        self.cluster = self.cluster or history.cluster
        self.per_step, self.skipped = None, 0
        self._last, self._counted, self._counted_steps = None, None, 0
        if self.cluster is None:
            raise ValueError("WireBytes needs a cluster: this run trains in one process; "
                             "pass WireBytes(cluster)")

    def on_step(self, history, record) -> None:
        if self._counted_steps >= self.steps or record.step < self.after_step:
            return  # every record of the run passes here: return before anything else
        from dtflab.network.transport import cluster_snapshot

        with self._lock:  # an asynchronous loop's workers each call from their own thread
            now = (record.step, cluster_snapshot(self.cluster), len(history.stalls))
            if self._last is not None:
                step, before, stalls = self._last
                if now[2] == stalls:  # the segments' steps add up to the last step less the first
                    since = now[1] - before
                    self._counted = since if self._counted is None else self._counted + since
                    self._counted_steps += record.step - step
                else:
                    self.skipped += record.step - step
            self._last = now
            if self._counted_steps >= self.steps:
                self.on_run_end(history)

    def on_run_end(self, history) -> None:
        if self._counted_steps:
            self.per_step = self._counted.scaled(1 / self._counted_steps)
