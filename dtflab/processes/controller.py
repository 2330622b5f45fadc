"""The controller of a cluster's persistent workers (ipyparallel's hub and schedulers, in threads
of one process), ended with the kernel that started it:
``python -m dtflab.processes.controller --profile-dir DIR --ip IP --ports P,P,...``.

It and its heartbeat monitor (a child process) end together, with the kernel or when the
kernel kills their process group. It listens on the ports given and on no other (the cluster lets its tasks reach each of them
through a private network), and writes the workers' and the kernel's connection files under
``DIR/security``. Its database keeps nothing (``NoDB``): results go to the kernel only.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dtflab.processes.controller")
    parser.add_argument("--profile-dir", required=True)
    parser.add_argument("--ip", default="127.0.0.1")
    parser.add_argument("--ports", required=True, help="comma-separated, enough for every socket")
    return parser


def exit_with_parent() -> None:
    """End this process and what it started (its heartbeat monitor, a process of its own) once
    standard input, a pipe from the kernel, reaches EOF: the kernel is gone. The kernel started
    it as the leader of a process group, which the group's kill reaches whole."""
    def watch():
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="dtflab-stdin-watch", daemon=True).start()


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    exit_with_parent()
    from ipyparallel.controller.app import IPController

    IPController.launch_instance([
        f"--profile-dir={args.profile_dir}", f"--ip={args.ip}", f"--ports={args.ports}",
        "--usethreads", "--nodb", "--log-level=WARN"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
