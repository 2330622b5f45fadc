"""The cost formulas the tutorials teach, in one place: the number a learner predicts in a
notebook is the number the benchmark checks and the view draws.

Each is a plain function of counts and seconds (or bytes); none measures anything. Where a
formula leaves something out, its docstring says what.
"""

from __future__ import annotations

import math


def amdahl(parallel_fraction: float, workers: float) -> float:
    """Amdahl's law: the speed-up of ``workers`` when a fraction ``parallel_fraction`` of one
    worker's step splits across them and the rest does not. ``1 / ((1 - p) + p / N)``."""
    p = parallel_fraction
    return 1.0 / ((1.0 - p) + p / workers)


def ps_link_step(compute_s: float, rest_s: float, wire_s: float, workers: float) -> float:
    """A synchronous step through one ps whose link moves each worker's parameters and
    gradients one worker after another: ``compute / N + rest + N x wire`` seconds. It leaves out
    that transfers to different workers overlap each other and the workers' compute."""
    return compute_s / workers + rest_s + workers * wire_s


def ps_link_best_workers(compute_s: float, wire_s: float) -> float:
    """Where :func:`ps_link_step` is shortest: ``sqrt(compute / wire)`` workers."""
    return math.sqrt(compute_s / wire_s) if wire_s else math.inf
