"""A persistent worker's stdout and stderr, as ipykernel's but of Python's writes only:
TensorFlow's C++ log lines, written to the file descriptors, stay in the task's log and out of
the cell (ipykernel's own streams would catch them there too)."""

from __future__ import annotations

from ipykernel.iostream import OutStream


class PythonOutput(OutStream):
    """``OutStream`` that does not watch the process's file descriptors."""

    def __init__(self, *args, **kwargs):
        kwargs["watchfd"] = False
        super().__init__(*args, **kwargs)
