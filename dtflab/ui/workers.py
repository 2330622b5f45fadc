"""Magics for persistent workers (``dtflab.cluster.persistent_workers``), in the words of
ipyparallel's ``%%px``, whose users know them:

    In [1]: %dtf_workers start 2                 # worker:0 and worker:1, in `workers`
    In [2]: %%dtf_px
       ...: import tensorflow as tf
       ...: strategy = tf.distribute.MultiWorkerMirroredStrategy()
    In [3]: %%dtf_px worker:1
       ...: print(strategy.cluster_resolver.task_id)
    In [4]: %dtf_pull strategy.num_replicas_in_sync
    In [5]: %dtf_autopx                          # every cell runs on the workers, until again
    In [6]: %dtf_workers restart worker:1
    In [7]: %dtf_workers stop

The magics act on the workers this kernel started last and has not stopped, by
``%dtf_workers start`` or ``dtflab.start_workers``. Each worker's output appears in the cell,
labelled with the worker, as it comes; an error once per worker. The stop button interrupts
what the workers run; they keep their variables.
"""

from __future__ import annotations

import re

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

COMMANDS = ("start", "stop", "status", "restart")
AUTOPX_OFF = ("%dtf_autopx", "dtf_autopx")
#: ``worker:1``, ``worker:0,2``, ``chief:0,worker:1``: which workers a magic names.
TARGETS = re.compile(r"\w+:\d+(,\d+|,\w+:\d+)*")


@magics_class
class WorkersMagics(Magics):
    """``%dtf_workers``, ``%%dtf_px``, ``%dtf_pull`` and ``%dtf_autopx``."""

    name = "workers"  # the notebook variable holding the running workers

    @line_magic
    def dtf_workers(self, line: str = ""):
        """Start, list, restart and stop persistent workers.

        In [1]: %dtf_workers start 2
        In [2]: %dtf_workers start 2 --chief
        In [3]: %dtf_workers start 2 --backend dask
        In [4]: %dtf_workers status
        In [5]: %dtf_workers restart worker:1
        In [6]: %dtf_workers stop
        """
        words = _words(line)
        command = words[0] if words else "status"
        if command not in COMMANDS:
            raise UsageError(f"unknown command {command!r}; commands: {', '.join(COMMANDS)}, "
                             f"e.g. %dtf_workers start 2")
        if command == "start":
            return self._start(words[1:])
        running = self._running()
        if command == "stop":
            running.stop()
            if self.shell.user_ns.get(self.name) is running:
                del self.shell.user_ns[self.name]
            return None
        if command == "restart":
            if len(words) != 2:
                raise UsageError("restart which worker? e.g. %dtf_workers restart worker:1")
            try:
                running.restart(words[1])
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            print(f"{words[1]} started anew: its variables are gone; run the cells that "
                  f"made them again")
            return None
        alive = running.running()
        for task in running.tasks:
            print(f"{task}: {'running' if task in alive else 'ended, ' + running.ended(task)}")
        return None

    @cell_magic
    def dtf_px(self, line: str, cell: str):
        """Run the cell on every persistent worker, or on those named.

        In [1]: %%dtf_px
        In [2]: %%dtf_px worker:0,1
        """
        workers = self._running()
        try:
            targets = workers.targets(" ".join(_words(line)) or None)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        workers.run(cell, targets)

    @line_magic
    def dtf_pull(self, line: str):
        """The value of an expression on the workers: ``{worker: value}``, or one worker's value
        where the last word names one.

        In [1]: %dtf_pull x
        In [2]: %dtf_pull x worker:1
        In [3]: %dtf_pull "strategy" in globals()
        """
        words = _words(line)
        if not words:
            raise UsageError("pull what? e.g. %dtf_pull loss worker:0")
        workers = self._running()
        target = words.pop() if len(words) > 1 and TARGETS.fullmatch(words[-1]) else None
        try:
            values = workers.pull(" ".join(words), target)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return values[workers.targets(target)[0]] if target and "," not in target else values

    @line_magic
    def dtf_autopx(self, line: str = ""):
        """Every following cell runs on the workers (as ``%%dtf_px``), until ``%dtf_autopx``
        again.

        In [1]: %dtf_autopx
        """
        transformers = self.shell.input_transformers_cleanup
        if _to_workers in transformers:
            transformers.remove(_to_workers)
            print("cells run in the kernel again")
        else:
            self._running()
            transformers.append(_to_workers)
            print("every cell now runs on the workers; %dtf_autopx to stop")

    # -- helpers ---------------------------------------------------------------------------

    def _running(self):
        """The workers the magics act on (see the module's docstring)."""
        from dtflab.cluster.persistent_workers import running_workers

        workers = running_workers()
        if workers is None:
            raise UsageError("no persistent workers are running: %dtf_workers start 2")
        return workers

    def _start(self, words: list[str]):
        from dtflab.cluster.persistent_workers import running_workers, start_workers

        running = running_workers()
        if running is not None:
            raise UsageError(f"workers are running already ({', '.join(running.tasks)}): "
                             f"%dtf_workers stop first")
        try:
            workers = start_workers(**start_arguments(words))
        except ValueError as exc:  # a backend's refusal: one line
            raise UsageError(str(exc)) from None
        self.shell.user_ns[self.name] = workers
        print(f"{', '.join(workers.tasks)} ready, each with TF_CONFIG for its task; %%dtf_px "
              f"runs a cell on them")
        return None


def _words(line: str) -> list[str]:
    """A magic's words, without a trailing ``# comment``."""
    return line.partition("#")[0].split()


def start_arguments(words: list[str]) -> dict:
    """``start_workers``'s arguments from ``%dtf_workers start [N] [--chief] [--backend dask]
    [--scheduler ADDRESS]``; UsageError naming what it cannot read."""
    found, words = {"workers": 2, "chief": False}, list(words)
    while words:
        word = words.pop(0)
        if word == "--chief":
            found["chief"] = True
        elif word in ("--backend", "--scheduler") and words:
            found[word[2:]] = words.pop(0)
        elif word.isdigit() and int(word) >= 1:
            found["workers"] = int(word)
        else:
            raise UsageError(f"{word!r}: %dtf_workers start takes a number of workers, --chief, "
                             f"--backend dask and --scheduler ADDRESS, e.g. %dtf_workers start 2")
    return found


def _to_workers(lines: list[str]) -> list[str]:
    """Under ``%dtf_autopx``: a cell becomes ``%%dtf_px`` of itself (but the one that ends it)."""
    text = "".join(lines).lstrip()
    if not text or text.startswith(AUTOPX_OFF) or text.startswith("%%"):
        return lines
    return ["%%dtf_px\n", *lines]
