"""A program task: the user's script, run in a task process as ``python SCRIPT ARGS`` would.

``sys.argv`` is ``[SCRIPT, *ARGS]``, the script's folder comes first on ``sys.path``,
``__name__ == "__main__"``, the working directory is the caller's, and the environment carries
``TF_CONFIG`` and, in a DTensor client, ``DTENSOR_CLIENT_ID``, ``DTENSOR_NUM_CLIENTS``,
``DTENSOR_JOB_NAME`` and ``DTENSOR_JOBS`` (set by the cluster: ``dtflab.cluster.programs``).
The process ends when its owner does (``--exit_with_parent`` as for task servers). Exit code:
the script's (``sys.exit``), 1 for an uncaught exception (its traceback goes to the task's log),
0 otherwise. A crash in C++ (an abort, a segfault) leaves every thread's Python stack in the
log (``faulthandler``). TensorFlow's C++ log lines are at the level ``TF_CPP_MIN_LOG_LEVEL``
gives (the cluster gives programs 0, INFO, so their logs say what a session waits for;
``dtflab.cluster.waits``), also in a task forked from a warm TensorFlow.

The process then ends with a normal interpreter exit, as ``python SCRIPT`` would: atexit
handlers run and TensorFlow shuts down as usual (MultiWorkerMirroredStrategy's workers wait
for each other there), also in a task forked from the fork server.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import runpy
import sys
import traceback

from dtflab.processes.inside import exit_with_parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dtflab.processes.script")
    parser.add_argument("--ready_fd", type=int, default=None)
    parser.add_argument("--exit_with_parent", action="store_true")
    parser.add_argument("--netns", type=int, default=None)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def run_script(script: str, args: list[str]) -> int:
    """Run ``script`` as ``__main__``; returns its exit code."""
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main(argv=None) -> int:
    # Options come before the script; everything after it is the script's own.
    argv = list(sys.argv[1:] if argv is None else argv)
    appended = {}  # the launcher appends --ready_fd and --netns after the script's arguments
    while len(argv) >= 2 and argv[-2] in ("--ready_fd", "--netns"):
        appended[argv[-2]], argv = int(argv[-1]), argv[:-2]
    ready_fd = appended.get("--ready_fd")
    args = build_parser().parse_args(argv)
    if "--netns" in appended:
        args.netns = appended["--netns"]
    if args.netns is not None:  # first: joining a user namespace needs a single thread
        from dtflab.network.netns import join

        join(args.netns)
    if args.exit_with_parent:
        exit_with_parent()
    if ready_fd is not None:
        with os.fdopen(ready_fd, "w") as ready:
            ready.write(f"ready {os.getpid()}\n")
    # A crash inside TensorFlow's C++ (an abort, a segfault) leaves the Python stack of every
    # thread in the task's log, where `%dtf_cluster logs` and a TaskError's last lines show it.
    faulthandler.enable()
    # TensorFlow's C++ log lines at this task's own level (INFO for programs, so TensorFlow
    # says what a session waits for): a task forked from the warm fork server kept its level.
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "")
    if "tensorflow" in sys.modules and level.isdigit():
        from dtflab.tf_private import set_cpp_log_level

        set_cpp_log_level(int(level))
    return run_script(args.script, args.args)


if __name__ == "__main__":
    sys.exit(main())
