"""What every training loop takes beside its problem, its cluster and its layout, as one object:
:class:`RunOptions` (the worker-program loops' ``ProgramOptions`` adds what theirs take), and
:func:`takes_options`, which shows its fields in a loop's signature, so a loop states only
the keywords that are its own.

In [1]: @takes_options(RunOptions)
   ...: def mine(problem, cluster, *, ways=None, layout=None, **options):
   ...:     options = RunOptions(**options).checked()
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

from dtflab import checks
from dtflab.train.machinery.logdir import run_directory
from dtflab.train.machinery.watchdog import settings as watchdog_settings


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """``steps`` and ``seed`` (the batches), ``slow`` (``{"worker:1": 0.05}``: a straggler's
    extra seconds a step), ``background`` (return a ``BackgroundRun`` at once), ``callbacks``,
    ``name`` (the history's), ``trace_step`` (the step traced into ``history.trace``),
    ``watchdog`` (``True``, ``None`` or a ``train.Watchdog``: when a step counts as stalled),
    ``predict`` (what prices the step before it runs: ``train.run_layout`` gives it),
    ``inputs`` (a ``train.input_pipeline``: the batches come from it, not ``Problem.batch``,
    and each step's wait for its batch is recorded) and ``logdir`` (where the run's TensorBoard
    files go, a folder of their own in it: ``None`` for ``$DTFLAB_LOGDIR`` or ``runs/<notebook>``,
    ``False`` for none; ``train.machinery.logdir``)."""

    steps: int = 200
    seed: int = 0
    slow: dict | None = None
    background: bool = False
    callbacks: tuple = ()
    name: str | None = None
    trace_step: int | None = None
    watchdog: object = True
    #: ``predict(built, master, problem)``, called with the loop's graph before its first step:
    #: what it returns is kept as ``history.prediction`` (``train.run_layout`` passes it)
    predict: object = None
    inputs: object = None
    logdir: object = None

    def checked(self) -> "RunOptions":
        """``steps``, ``seed``, ``trace_step`` and ``watchdog`` checked (one line naming the
        bad value and the fix), the watchdog as its settings."""
        checks.run_arguments(self.steps, self.seed, self.trace_step)
        run_directory(self.logdir)  # a path, None or False
        if self.inputs is not None and type(self.inputs).__name__ != "InputPipeline":
            raise ValueError(f"inputs must be a train.input_pipeline(problem, ...), got "
                             f"{type(self.inputs).__name__}; leave it out to read Problem.batch")
        return dataclasses.replace(self, watchdog=watchdog_settings(self.watchdog))

    def without(self, loop: str, **reasons: str) -> "RunOptions":
        """These options, if each field named in ``reasons`` is at its default
        (:func:`dtflab.checks.at_defaults`)."""
        return checks.at_defaults(self, loop, **reasons)


def takes_options(options_class):
    """A decorator: give ``loop(..., own..., **options)`` the fields of ``options_class`` as
    keyword arguments in its signature, after its own (what ``help()``, completion and the API
    reference read), and refuse any other name, in one line, before anything starts."""

    def decorate(loop):
        signature = inspect.signature(loop)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        shared = [inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY,
                                    default=field.default, annotation=field.type)
                  for field in dataclasses.fields(options_class)]
        full = signature.replace(parameters=own + shared)

        @functools.wraps(loop)
        def call(*args, **kwargs):
            try:
                full.bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"train.{loop.__name__}: {error}; its arguments are listed by "
                                f"help(train.{loop.__name__})") from None
            return loop(*args, **kwargs)

        call.__signature__ = full
        return call

    return decorate
