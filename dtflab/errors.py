"""Errors a dtflab user can meet, shown in notebooks without a Python stack."""

from __future__ import annotations

import re


class DtflabError(Exception):
    """Base class. IPython shows these as their message alone (``_render_traceback_``)."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class TaskError(DtflabError):
    """A task server failed: carries which task, its exit code and the last lines it printed."""

    def __init__(self, job: str, index: int, what: str, *, exit_code: int | None = None,
                 log_tail: str = ""):
        self.job, self.index, self.exit_code, self.log_tail = job, index, exit_code, log_tail
        code = "" if exit_code is None else f" (exit code {exit_code})"
        last = last_meaningful_line(log_tail)
        super().__init__(f"{job}:{index} {what}{code}" + (f": {last}" if last else ""))

    def _render_traceback_(self) -> list[str]:
        lines = [f"{type(self).__name__}: {self}"]
        if self.log_tail.strip():
            lines.append(f"last lines printed by {self.job}:{self.index}:")
            lines += ["    " + line for line in explaining(self.log_tail)]
        return lines


class WaitForEndedTaskError(TaskError):
    """A program waited for a task that had ended, so it could never go on, and was stopped
    (``dtflab.cluster.waits``). ``ended`` names that task (``ended_as``: what it is to
    TensorFlow, e.g. ``DTensor client 1, /job:worker/replica:0/task:1``), ``fix`` what to
    change; ``also``: other programs stopped with it, which could not go on either."""

    def __init__(self, job: str, index: int, ended: str, how: str, *, fix: str,
                 log_tail: str = "", ended_as: str = "", also: tuple[str, ...] = ()):
        self.job, self.index, self.exit_code, self.log_tail = job, index, None, log_tail
        self.ended, self.fix, self.also = ended, fix, tuple(also)
        who = f"{ended} ({ended_as})" if ended_as else ended
        stopped = f"it and {', '.join(also)} were" if also else "it was"
        DtflabError.__init__(self, f"{job}:{index} waits for {who}, which {how}: it would wait "
                                   f"for ever, so {stopped} stopped; {fix}")


class StallError(DtflabError):
    """A step made no progress for far longer than usual and new sessions did not help
    (train.machinery.watchdog). ``stall`` says who, at which step, and for how long."""

    def __init__(self, stall, what_was_tried: str):
        self.stall = stall
        super().__init__(f"{stall}; {what_was_tried}: see `%dtf_cluster status` and "
                         f"`%dtf_cluster logs`, or start a new cluster")


class PortInUseError(TaskError):
    """A task could not bind its port because something else holds it."""


class NotSupportedError(DtflabError):
    """The backend cannot do this; the message says which backend can."""


def did_you_mean(word, choices) -> str:
    """`` (did you mean 'start'?)`` for a near miss among ``choices``, else ``""``."""
    import difflib

    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: What TensorFlow prints as a task starts, whatever ends it later: the GPU it looks for on a
#: machine without one, the instructions it was built for, the absl logging notice.
STARTUP_NOISE = re.compile(
    r"failed call to cuInit|Could not find cuda drivers|cuda_diagnostics|retrieving CUDA "
    r"diagnostic|oneDNN custom operations are on|This TensorFlow binary is optimized|To enable "
    r"the following instructions|Unable to register cu(DNN|FFT|BLAS) factory|computation "
    r"placer already registered|All log messages before absl::InitializeLog|TF-TRT Warning|"
    r"Attempting to register factory")


def explaining(text: str, last: int = 8) -> list[str]:
    """A task's last ``last`` log lines that can say why it ended: TensorFlow's start-up
    lines (``STARTUP_NOISE``) left out."""
    return [line for line in text.strip().splitlines() if not STARTUP_NOISE.search(line)][-last:]


#: How faulthandler begins its report of a crash (the stacks follow it).
CRASH_MARK = "Fatal Python error:"


def last_meaningful_line(text: str) -> str:
    """The line that says what went wrong: the last one, or, after a crash that faulthandler
    followed with every thread's stack, the crash's own line (``free(): invalid size; Fatal
    Python error: Aborted``)."""
    lines = [line.strip() for line in text.strip().splitlines()]
    fatal = [i for i, line in enumerate(lines) if line.startswith(CRASH_MARK)]
    if fatal:
        before = last_meaningful_line("\n".join(lines[:fatal[-1]]))
        return "; ".join(part for part in (before, lines[fatal[-1]]) if part)[:300]
    for line in reversed(lines):
        if line and not line.startswith(("I0000", "W0000")) and not STARTUP_NOISE.search(line):
            return line[:300]
    return ""


def sent_twice(error: BaseException) -> bool:
    """Whether ``error`` is a TensorFlow worker's refusal of a request gRPC delivered twice
    (AbortedError "The same RunGraph (Worker) request was received twice"): on a loaded machine
    the master's call was retried after the worker had taken it, so the step may have run."""
    return type(error).__name__ == "AbortedError" and "received twice" in str(error)
