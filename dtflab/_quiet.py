"""Import TensorFlow and create servers without their log lines reaching the user.

TensorFlow writes start-up chatter (oneDNN, CUDA probes, "Started server") straight to file
descriptors 1 and 2 from C++, before its own log-level settings apply, so Python-level
redirection cannot catch it. Here descriptors 1 and 2 are pointed at a file for the duration.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading

from dtflab import allocator

_lock = threading.Lock()
_captured: list[str] = []  # what TF printed while we held the descriptors, for dtflab.tf_log()


@contextlib.contextmanager
def quiet_fds():
    """Send whatever is written to fds 1 and 2 inside the block to :data:`_captured`.

    Holds a process-wide lock: output from other threads in the same interval is captured too.
    """
    with _lock:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        saved = [os.dup(1), os.dup(2)]
        with tempfile.TemporaryFile(mode="w+b") as sink:
            try:
                os.dup2(sink.fileno(), 1)
                os.dup2(sink.fileno(), 2)
                yield
            finally:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)
                sink.seek(0)
                text = sink.read().decode(errors="replace")
                if text:
                    _captured.append(text)


def import_tf():
    """``import tensorflow`` with its logging silenced; returns the module.

    Unless the user set them: ``TF_CPP_MIN_LOG_LEVEL=3`` (C++ log lines off; errors still
    reach Python as exceptions), ``allocator.SETTINGS`` and TensorFlow's Python logger at ERROR
    (no ``INFO:tensorflow`` lines from strategies and savers). Task processes log to their own files instead.
    """
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    allocator.use_settings()
    with quiet_fds():
        import tensorflow as tf
    if "TF_PYTHON_LOG_LEVEL" not in os.environ:
        tf.get_logger().setLevel(logging.ERROR)
    return tf


def tf_log() -> str:
    """Everything TensorFlow printed while dtflab kept it quiet in this process."""
    return "".join(_captured)
