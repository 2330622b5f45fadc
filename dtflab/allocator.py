"""Memory a process has freed, given back to the system.

glibc keeps what a process frees in its heaps for its next allocations, and TensorFlow's
threads spread a step's buffers over several heaps: a task server or a kernel that has run a
few steps holds, as its own, memory no tensor uses any more, and on Binder's 2 GB that is
room a learner's next cell lacks. ``give_back()`` returns every heap's free pages (glibc's
``malloc_trim``; a later allocation maps them again); where the C library is not glibc it
does nothing. ``let_go(graph)`` does that after a graph's last run, once TensorFlow's gradient
registry no longer holds the graph. ``SETTINGS`` are what dtflab's processes allocate with,
unless the user set them (``use_settings``): TensorFlow imported by dtflab, and every task
process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

#: ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR``: TensorFlow's oneDNN build keeps large CPU buffers in a
#: pool of its own that it never returns; with 1 they come from malloc, which gives them back.
#: ``MALLOC_ARENA_MAX``: glibc's default of 8 heaps a core lets a task's freed memory scatter
#: over as many heaps, each keeping its share (read when a process starts: it reaches every
#: process dtflab starts, TensorBoard included, not the process that set it).
SETTINGS = {"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1", "MALLOC_ARENA_MAX": "2"}


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None


def give_back() -> bool:
    """Return the free pages of this process's heaps to the system; False where that cannot
    be done here."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def let_go(graph) -> None:
    """After a graph's last run: drop what TensorFlow's gradient registry keeps of it (its
    custom gradients, which would hold it for the process's life:
    ``tf_private.forget_custom_gradients``) and give back what its steps freed."""
    from dtflab import tf_private

    tf_private.forget_custom_gradients(graph)
    give_back()


def use_settings(environ=None) -> None:
    """Set each of ``SETTINGS`` in ``environ`` (default: this process's) that is not set."""
    environ = os.environ if environ is None else environ
    for name, value in SETTINGS.items():
        environ.setdefault(name, value)
