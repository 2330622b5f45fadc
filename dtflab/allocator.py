"""Memory a process has freed, given back to the system: glibc's ``malloc_trim``.

glibc keeps what a process frees in its heaps for its next allocations, and TensorFlow's
threads spread a step's buffers over several heaps: a task server or a kernel that has run a
few steps holds, as its own, memory no tensor uses any more, and on Binder's 2 GB that is
room a learner's next cell lacks. ``give_back()`` returns every heap's free pages; a later
allocation maps them again. Where the C library is not glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


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
