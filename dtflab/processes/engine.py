"""A persistent worker's program: an ipyparallel engine, run as a cluster's program task, so it
has the task's ``TF_CONFIG`` (and DTensor's variables) and keeps its namespace from one cell
to the next. ``dtflab.cluster.persistent_workers`` starts it as
``engine.py --connection BASE64 --controller-host {client_host}``: the controller's connection
file, with its address replaced by the one at which this task reaches the kernel's machine.

Interrupts: SIGINT raises ``KeyboardInterrupt`` in what the engine runs (TensorFlow's ops end
first: a step is not cut in half), and the engine goes on serving. SIGUSR2 (``RELEASE``) aborts
its collectives, which frees a worker waiting in one for a peer that failed, for good.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import sys
import threading

#: The signal that aborts a worker's collectives (``Workers.release``).
RELEASE = signal.SIGUSR2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engine.py")
    parser.add_argument("--connection", required=True, help="the connection file, base64")
    parser.add_argument("--controller-host", required=True)
    return parser


def task() -> str:
    """``job:index`` of the task this engine runs in, from its ``TF_CONFIG``."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
    return f"{config.get('type')}:{config.get('index')}"


def release_on(signal_number: int) -> None:
    """Abort this worker's collectives when ``signal_number`` comes (``Workers.release``): a
    thread of its own waits for it (blocked in every other thread), since the main thread may
    be inside TensorFlow's C++, where no Python signal handler runs."""
    from dtflab import tf_private

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal_number})  # threads made later inherit it

    def wait() -> None:
        while True:
            signal.sigwait({signal_number})
            tf_private.abort_collectives(
                f"dtflab: released by the notebook: this worker ({task()}) waited in a "
                f"collective for a peer that had failed; its collectives are aborted for good: "
                f"restart the workers to build the strategy again")

    threading.Thread(target=wait, name="dtflab-release", daemon=True).start()


def main(argv=None) -> None:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    info = json.loads(base64.b64decode(args.connection))
    protocol = info["interface"].split("://")[0]
    info.update(interface=f"{protocol}://{args.controller_host}", location=args.controller_host)
    os.environ["IPP_CONNECTION_INFO"] = json.dumps(info)
    sys.path.insert(0, os.getcwd())  # as in a notebook's kernel: modules beside it import
    release_on(RELEASE)
    from ipyparallel.engine.app import IPEngine

    # no nanny: the cluster signals the task's process itself (Cluster.interrupt, here or on
    # its Dask worker), and a nanny would be one more process to outlive a killed task
    IPEngine.launch_instance(["--log-level=ERROR", "--IPEngine.enable_nanny=False",
                              "--IPEngine.out_stream_factory=dtflab.processes.engine_output.PythonOutput"])


if __name__ == "__main__":
    main()
