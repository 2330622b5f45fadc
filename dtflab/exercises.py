"""Checks for the tutorials' exercises that do not give the answer away.

A check cell either recomputes the figure from the learner's own run (the usual way), or, where
the answer is a fact rather than a measurement, compares a digest: ``check(answer, DIGEST,
hint)``. Neither prints the answer; a wrong one gets the hint.

In [1]: digest(19)          # how a notebook's author makes DIGEST (not in the notebook)
"""

from __future__ import annotations

import hashlib


def _normal(answer) -> str:
    if isinstance(answer, bool) or answer is None:
        return repr(answer)
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    if isinstance(answer, float):
        return f"{answer:.6g}"
    return str(answer).strip()


def digest(answer) -> str:
    """The first 16 hex digits of the SHA-256 of the answer, written canonically (``19.0`` and
    ``19`` agree, strings are stripped)."""
    return hashlib.sha256(_normal(answer).encode()).hexdigest()[:16]


def check(answer, expected_digest: str, hint: str) -> None:
    """``AssertionError`` with ``hint`` unless ``answer`` has ``expected_digest``; says
    "correct" otherwise. Never shows the expected answer."""
    if answer is None:
        raise AssertionError("set answer first, then run this cell again")
    if digest(answer) != expected_digest:
        raise AssertionError(f"not yet: {hint}")
    print("correct")


def agrees(answer, measured, hint: str, *, tolerance: float = 0.0) -> None:
    """``AssertionError`` with ``hint`` unless ``answer`` is ``measured`` (within a relative
    ``tolerance``); prints "correct" otherwise, not the measured figure."""
    if answer is None:
        raise AssertionError("set answer first, then run this cell again")
    ok = answer == measured if not tolerance else abs(answer - measured) <= tolerance * abs(measured)
    if not ok:
        raise AssertionError(f"not yet: {hint}")
    print("correct")
