"""Recovery from a dead task, and the async parameter-server loop's checkpoints.

:class:`Recovery` is what every loop that survives a death records in ``history.recoveries``
(Downpour after a ps, the worker-program loops after a worker: their programs write their own
checkpoints, ``worker_programs/loop.py``). :class:`Checkpoints` is Downpour's: a dead ps costs
at most K updates.

The ps holds the only copy of the variables; when it dies they are gone. ``Checkpoints``
writes them (optimizer slots and the global step too) every K updates, and after a ps failure
the loop restarts that task, restores the newest checkpoint and carries on from its step.

The bound is exact, not "about K": a save is due K - (workers - 1) updates after the last
one, and once due it waits for the updates in flight (at most one per other worker) and holds
new ones until the files are written. So at most K updates land after a checkpoint before the
next one is on disk, and a ps failure loses at most K. Holding the workers costs one save
(a few ms for small models) every K updates.

Cannot: survive the death of the checkpoint folder's disk, or a failure during a restore.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

from dtflab._quiet import import_tf

RESTORE_RETRY_S = 10.0  # a just-restarted task may refuse connections for a moment


@dataclass(frozen=True)
class Recovery:
    """One task failure survived: the step it had reached, the step restored, the cost."""

    task: str
    failed_at: int  # updates acknowledged to workers when the ps died
    resumed_from: int  # the global step of the checkpoint restored
    seconds: float  # restart + restore
    restarted: str = "it"  # what was restarted: the ps ("it"), or "every worker"

    @property
    def lost(self) -> int:
        return self.failed_at - self.resumed_from

    def __str__(self) -> str:
        return (f"{self.task} failed at step {self.failed_at}; restarted {self.restarted} and "
                f"restored step "
                f"{self.resumed_from} from a checkpoint in {self.seconds:.1f} s: {self.lost} "
                f"update(s) lost")


class Checkpoints:
    """Saves ``graph``'s global variables into ``folder`` every ``every`` updates."""

    def __init__(self, graph, global_step, folder: str, every: int, workers: int):
        tf = import_tf()
        if isinstance(every, bool) or not isinstance(every, int) or every < workers:
            raise ValueError(f"checkpoint_every must be a whole number of updates of at least "
                             f"the number of workers ({workers}), got {every!r}")
        with graph.as_default():
            self.saver = tf.compat.v1.train.Saver(sharded=True, max_to_keep=2)
        self.graph, self.global_step, self.folder, self.every = graph, global_step, folder, every
        self.interval = every - (workers - 1)
        self.saved_step = self.seen_step = 0
        self.saves = 0
        self._cond = threading.Condition()
        self._active = 0
        self._held = False

    # -- around each update --------------------------------------------------------------------

    def begin_update(self) -> None:
        with self._cond:
            while self._held:
                self._cond.wait()
            self._active += 1

    def end_update(self, step: int | None) -> bool:
        """``step``: the global step after this update (None: it failed). True: a save is due
        and this worker must make it (every other update is finished and held), then call
        ``save``."""
        with self._cond:
            self._active -= 1
            if step is not None:
                self.seen_step = max(self.seen_step, step)
            if step is not None and not self._held and self.seen_step - self.saved_step >= self.interval:
                self._held = True
                while self._active:
                    self._cond.wait()
                return True
            self._cond.notify_all()
            return False

    @contextlib.contextmanager
    def held(self):
        """No update runs inside (a save, a recovery)."""
        with self._cond:
            while self._held:
                self._cond.wait()
            self._held = True
            while self._active:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()

    # -- saving and restoring ------------------------------------------------------------------

    def save(self, session) -> None:
        """Write a checkpoint at ``seen_step``; releases the hold taken by ``end_update``."""
        try:
            with self.graph.as_default():  # Saver works eagerly outside the graph (any thread)
                self.saver.save(session, f"{self.folder}/model", global_step=self.seen_step,
                                write_meta_graph=False)
            self.saved_step = self.seen_step
            self.saves += 1
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()

    def restore(self, session) -> int:
        """Load the newest checkpoint; returns its global step."""
        tf = import_tf()
        path = tf.train.latest_checkpoint(self.folder)
        deadline = time.monotonic() + RESTORE_RETRY_S
        while True:
            try:
                with self.graph.as_default():
                    self.saver.restore(session, path)
                step = int(session.run(self.global_step))
                break
            except tf.errors.UnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.saved_step = self.seen_step = step
        return step
