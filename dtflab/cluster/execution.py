"""One cell run on persistent workers, followed from the kernel: each worker's output as it
comes, labelled ``[worker:0]``; an error once per worker (once in all where every worker raised
the same, a syntax error say) with what the others were doing; a worker that died named with its
last lines; the kernel's interrupt passed on to the workers. ``Workers.run`` makes one.

A worker still running after a failure elsewhere is interrupted (``KeyboardInterrupt``, which
reaches Python only between TensorFlow's ops), then, still running, released: its collectives
are aborted (``Workers.release``), which ends a wait for the failed peer for good.
"""

from __future__ import annotations

import re
import time

#: Seconds the others have to finish after a worker failed, before they are named as waiting
#: and interrupted.
GRACE_S = 10.0
#: Seconds between looks at the workers' output.
POLL_S = 0.1
#: Seconds between looks at whether the workers' processes still run.
DEATH_S = 1.0


def compiled(code: str) -> None:
    """Raise the SyntaxError the cell would raise on every worker (IPython's syntax, magics
    and ``!`` included, is the workers' too)."""
    from IPython.core.inputtransformer2 import TransformerManager

    compile(TransformerManager().transform_cell(code), "<cell>", "exec")


def _in_the_cell(bundle: dict) -> None:
    from IPython.display import display

    display(bundle.get("data", {}), metadata=bundle.get("metadata") or {}, raw=True)


class Execution:
    """What ``tasks`` made of one cell: ``outputs`` (``{task: text}``), ``results`` (each
    one's last expression's value, as text), ``errors`` (``{task: "Name: value"}``), ``states``
    (``{task: "done" | "error" | "interrupted" | "died" | "waiting" | "released" | "stuck"}``)."""

    def __init__(self, workers, tasks: list[str], result):
        self.workers, self.tasks, self._result = workers, tasks, result
        self._children = dict(zip(tasks, result._children))
        self._metadata = dict(zip(tasks, result._metadata))  # filled as the output comes
        self.outputs = dict.fromkeys(tasks, "")  # what was shown of each one's text
        self.displays: dict[str, list[dict]] = {task: [] for task in tasks}  # mime bundles
        self._looked_s = float("-inf")  # when the processes were last looked at
        self.results: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self.states: dict[str, str] = {}

    def follow(self, *, show=None, display=None, timeout: float | None = None) -> "Execution":
        """Show the output as it comes and wait for every task (or ``timeout`` seconds):
        ``show`` takes text (default: printed), ``display`` a worker's display output, a mime
        bundle (default: IPython's ``display``, raw)."""
        show = show or (lambda text: print(text, end="", flush=True))
        self._display = display or _in_the_cell
        deadline = None if timeout is None else time.monotonic() + timeout
        failed_at = interrupted_at = released_at = None
        try:
            while self._pending():
                self._stream(show)
                self._died(show)
                now = time.monotonic()
                if failed_at is None and self._failed():
                    failed_at = now
                if interrupted_at is None and failed_at is not None and now - failed_at > GRACE_S:
                    self._interrupt_waiting(show)
                    interrupted_at = now
                if released_at is None and interrupted_at is not None \
                        and now - interrupted_at > GRACE_S:
                    self._release(show)
                    released_at = now
                if released_at is not None and now - released_at > GRACE_S:
                    self._stuck(show)
                    break
                if deadline is not None and now > deadline:
                    break
                self._result.wait(POLL_S)
        except KeyboardInterrupt:
            signalled = self.workers.interrupt(self._pending())
            show(f"\n[dtflab] interrupted {', '.join(signalled) or 'nothing'}: the workers go "
                 f"on, with their variables\n")
            for task in signalled:
                self.states[task] = "interrupted"
            self._result.wait(GRACE_S)
            if self._pending():
                self._stuck(show)
        self._result.wait_for_output(POLL_S * 10)  # the last lines come after the reply
        self._stream(show, final=True)
        self._collect(show)
        return self

    def __repr__(self) -> str:
        return f"<Execution: {', '.join(f'{t} {s}' for t, s in self.states.items())}>"

    # -- looking ---------------------------------------------------------------------------

    def _pending(self) -> list[str]:
        return [task for task in self.tasks
                if not self._children[task].done() and self.states.get(task) != "died"]

    def _error(self, task: str):
        """The worker's error (ipyparallel's RemoteError, an exception it returns rather than
        raises), once its cell ended with one."""
        child = self._children[task]
        if not child.done():
            return None
        error = child.exception() or child.result()
        return error if isinstance(error, BaseException) else None

    def _failed(self) -> list[str]:
        return [task for task in self.tasks if self._error(task) is not None]

    def _stream(self, show, final: bool = False) -> None:
        for task in self.tasks:
            metadata = self._metadata[task]
            text = (metadata.get("stdout") or "") + (metadata.get("stderr") or "")
            for bundle in (metadata.get("outputs") or [])[len(self.displays[task]):]:
                show(f"[{task}] shows:\n")
                self.displays[task].append(bundle)
                self._display(bundle)
            # whole lines only, but at the end: each one labelled once
            shown = len(self.outputs[task])
            end = len(text) if final else text.rfind("\n", shown) + 1
            if end > shown:
                new = text[shown:end]
                self.outputs[task] += new
                lines = new.splitlines(keepends=True)
                show("".join(f"[{task}] {line}" for line in lines)
                     + ("" if new.endswith("\n") else "\n"))

    def _died(self, show) -> None:
        now = time.monotonic()
        if now - self._looked_s < DEATH_S:
            return
        self._looked_s = now
        running = self.workers.running()
        for task in self._pending():
            if task not in running:
                self.states[task] = "died"
                show(f"[dtflab] {task} died: {self.workers.ended(task)}\n[dtflab] its variables "
                     f"are lost: workers.restart({task!r}) starts it anew\n")

    def _interrupt_waiting(self, show) -> None:
        waiting, failed = self._pending(), self._failed()
        self._act(waiting, "waiting", self.workers.interrupt, show,
                  f"{', '.join(failed)} failed {GRACE_S:.0f} s ago; {', '.join(waiting)} still "
                  f"running (waiting for {'it' if len(failed) == 1 else 'them'}?): interrupted")

    def _release(self, show) -> None:
        """Still running after the interrupt: inside TensorFlow's C++, where a KeyboardInterrupt
        does not reach (a collective waiting for the peer that failed): its collectives are
        aborted, which ends the wait with an error."""
        waiting, failed = self._pending(), self._failed()
        self._act(waiting, "released", self.workers.release, show,
                  f"{', '.join(waiting)} waits inside TensorFlow, in a collective for "
                  f"{', '.join(failed)}: released (its collectives are aborted; restart the "
                  f"strategy's workers to build it again)")

    def _act(self, tasks: list[str], state: str, act, show, said: str) -> None:
        show(f"[dtflab] {said}\n")
        for task in tasks:
            self.states[task] = state
        act(tasks)

    def _stuck(self, show) -> None:
        """Interrupted (or released), and still running: inside TensorFlow's C++, which a
        KeyboardInterrupt reaches only when it returns (a collective waiting for a peer never
        does)."""
        stuck, failed = self._pending(), self._failed()
        for task in stuck:
            self.states[task] = "stuck"
        waited = f"for {', '.join(failed)}" if failed else "for a peer"
        show(f"[dtflab] {', '.join(stuck)} did not stop: waiting inside TensorFlow (in a "
             f"collective, {waited}?); workers.release() aborts its collectives, "
             f"%dtf_workers restart {stuck[0]} ends it (its variables are lost)\n")

    def _collect(self, show) -> None:
        shown_errors: dict[str, list[str]] = {}  # one traceback, and every task that raised it
        texts: dict[str, str] = {}
        for task in self.tasks:
            child = self._children[task]
            if not child.done():
                self.states.setdefault(task, "running")
                continue
            error = self._error(task)
            if error is None:
                self.states.setdefault(task, "done")
                value = (self._metadata[task].get("execute_result") or {}).get(
                    "data", {}).get("text/plain")
                if value is not None:
                    self.results[task] = value
                    show(f"[{task}] Out: {value}\n")
                continue
            name = getattr(error, "ename", type(error).__name__)
            if name == "KeyboardInterrupt" and self.states.get(task) in ("interrupted", "waiting") \
                    or self.states.get(task) == "released":
                continue  # said when it was interrupted or released
            self.states[task] = "error"
            self.errors[task] = f"{name}: {getattr(error, 'evalue', error)}"
            lines = list(getattr(error, "render_traceback", lambda: [str(error)])())
            if lines and re.fullmatch(r"\[\d+:\w+\]", lines[0].strip()):
                lines = lines[1:]  # ipyparallel's engine number: the label says which worker
            # the same error, whatever cell number each worker is at
            same = re.sub(r"In\s*\[\d+\]", "In[ ]", "\n".join(lines))
            texts.setdefault(same, "\n".join(lines))
            shown_errors.setdefault(same, []).append(task)
        for same, tasks in shown_errors.items():
            traceback = texts[same]
            others = {task: self.states[task] for task in self.tasks if task not in tasks}
            said = "; ".join(f"{task} {state}" for task, state in others.items())
            show(f"[{', '.join(tasks)}]\n{traceback}\n" + (f"[dtflab] meanwhile: {said}\n"
                                                            if said else ""))
