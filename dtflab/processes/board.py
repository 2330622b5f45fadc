"""A TensorBoard server as a process of its own, ended with the kernel or program that started
it: ``python -m dtflab.processes.board --logdir DIR --port PORT`` (``dtflab.ui.tensorboard``
starts it). It serves on 127.0.0.1 only: a page elsewhere reaches it through the notebook
server (jupyter-server-proxy's ``/proxy/PORT/``).
"""

from __future__ import annotations

import argparse
import os
import sys
import types


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dtflab.processes.board")
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--port", type=int, required=True)
    return parser


def main(argv=None) -> int:
    from dtflab.processes.inside import exit_with_parent

    args = build_parser().parse_args(argv)
    exit_with_parent()  # standard input is a pipe from the owner
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # TensorBoard without TensorFlow: TensorFlow would add 560 MB (measured: 622 MB resident
    # against 60 MB) to a process that Binder's 2 GiB holds beside a notebook. TensorBoard reads
    # the event files with its own stub where a module of this name exists
    # (tensorboard.compat.tf), and XProf converts profiles with its own library where TensorFlow
    # cannot be imported (what it then lacks: capturing a profile from its page; dtflab
    # captures them itself).
    sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
    sys.modules["tensorflow"] = None  # import tensorflow: ImportError
    from tensorboard import program

    board = program.TensorBoard()
    # --reload_interval 2: a run that just ended shows within two seconds; --load_fast=false:
    # the Rust data server is a binary of its own that would outlive this process on a kill.
    board.configure(argv=["tensorboard", "--logdir", args.logdir, "--host", "127.0.0.1",
                          "--port", str(args.port), "--reload_interval", "2",
                          "--load_fast", "false"])
    return board.main()


if __name__ == "__main__":
    raise SystemExit(main())
