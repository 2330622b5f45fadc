"""Training hooks: subclass and override what you need; every method does nothing by default."""

from __future__ import annotations


class Callback:
    """Called by every loop. Methods run in the loop's thread (a worker's thread for async):
    keep them short, they are inside the timed step."""

    def on_run_start(self, history) -> None:
        """Before the first step."""

    def on_step(self, history, record) -> None:
        """After each applied update; ``record`` is the StepRecord just added."""

    def on_run_end(self, history) -> None:
        """After the last step, also when the run stopped early or failed."""
