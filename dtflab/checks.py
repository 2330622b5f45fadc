"""Checks of what users pass to the Python API, made before anything starts.

Each failure is one line that quotes the argument as it was given (``steps=0``) and says what
to pass instead: "steps=0: steps must be a whole number of at least 1; for example steps=200".
"""

from __future__ import annotations

import math
import numbers


def whole(value, name: str, *, minimum: int = 1, maximum: int | None = None, example=None) -> int:
    """An integer argument within ``minimum`` .. ``maximum``."""
    example = minimum if example is None else example
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        need = "a whole number"
    elif value < minimum:
        need = f"a whole number of at least {minimum}"
    elif maximum is not None and value > maximum:
        need = f"a whole number of at most {maximum}"
    else:
        return int(value)
    raise ValueError(f"{name}={value!r}: {name} must be {need}; for example {name}={example!r}")


def seconds(value, name: str, *, example, zero: bool = False) -> float:
    """A positive (``zero``: or zero) finite number of seconds."""
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if number and math.isfinite(value) and (value > 0 or (zero and value == 0)):
        return float(value)
    sign = "0 or more" if zero else "more than 0"
    raise ValueError(f"{name}={value!r}: {name} must be a number of seconds, {sign}; "
                     f"for example {name}={example!r}")


def one_of(value, name: str, choices) -> object:
    """``value`` if it is one of ``choices``."""
    if value in choices:
        return value
    listed = ", ".join(map(repr, choices))
    raise ValueError(f"{name}={value!r}: {name} must be one of {listed}")


def run_arguments(steps, seed, trace_step=None) -> None:
    """What every training loop takes: ``steps`` >= 1, ``seed`` >= 0, ``trace_step`` inside the run."""
    whole(steps, "steps", example=200)
    whole(seed, "seed", minimum=0, example=0)
    if trace_step is not None:
        whole(trace_step, "trace_step", minimum=0, maximum=steps - 1, example=min(5, steps - 1))


def cluster(value) -> None:
    """Something with a cluster's ``addresses`` and ``target``."""
    if not hasattr(value, "addresses") or not hasattr(value, "target"):
        raise ValueError(f"cluster={value!r}: pass a running cluster, e.g. "
                         f"cluster = dtflab.start_cluster(3) or %dtf_cluster start 3")


def tasks_in(given: dict | None, name: str, tasks: list[str], *, example) -> dict[str, float]:
    """``{"worker:1": seconds}`` naming only ``tasks``, seconds 0 or more."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise ValueError(f"{name}={given!r}: {name} must be a dict of task name to seconds; "
                         f"for example {name}={example!r}")
    from dtflab.errors import did_you_mean

    for task, value in given.items():
        if task not in tasks:
            raise ValueError(f"{name}={given!r} names {task!r}{did_you_mean(task, tasks)}, which "
                             f"is not a task of this run; use one of: {', '.join(tasks)}")
        seconds(value, f"{name}[{task!r}]", example=example[next(iter(example))], zero=True)
    return {task: float(value) for task, value in given.items()}


def at_defaults(settings, loop: str, **reasons: str):
    """``settings`` (a dataclass: a layout, a run's options), if each field named in
    ``reasons`` is at its default: what ``loop`` does not run is refused, not ignored
    (``at_defaults(layout, "combined", micro_batches="runs one micro-batch a step")``)."""
    import dataclasses

    for field in dataclasses.fields(settings):
        if field.name in reasons and getattr(settings, field.name) != field.default:
            raise ValueError(f"{field.name}={getattr(settings, field.name)!r}: {loop} "
                             f"{reasons[field.name]}; use {field.name}={field.default!r}")
    return settings
