"""One tf.data service task process: the dispatcher or a data worker of a cluster's data service.

``--role dispatcher --port P --workers HOST:PORT,...`` serves ``tf.data.experimental.service.
DispatchServer`` with the fixed list of data workers that static sharding (``DATA``, ``FILE``)
needs; ``--role worker --port P --dispatcher HOST:PORT`` serves a ``WorkerServer`` that
registers at ``HOST:P`` (the address the consumers dial). Both take ``--ready_fd``,
``--exit_with_parent`` and ``--netns`` as the task server does (``dtflab.processes.server``).

The dispatcher keeps its jobs in memory only (no ``work_dir``): restarted, it has forgotten
them, and a consumer of a job it forgot fails. A restarted data worker registers again at the
same address and takes back its tasks. Exit codes as the task server's: 0 stopped, 2 bad
flags, 75 port in use, 1 anything else.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from dtflab.processes.inside import exit_with_parent
from dtflab.processes.server import EXIT_PORT_IN_USE, _stop_requested, port_is_free, stop_on_signals

#: How long the dispatcher waits on a silent data worker before it counts it gone (ms).
WORKER_TIMEOUT_MS = 2000
#: How often a data worker tells the dispatcher it is alive (ms).
HEARTBEAT_MS = 250


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dtflab.processes.data_service")
    parser.add_argument("--role", required=True, choices=("dispatcher", "worker"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--address", default=None, help="host:port the consumers dial (worker)")
    parser.add_argument("--dispatcher", default=None, help="the dispatcher's host:port (worker)")
    parser.add_argument("--workers", default="", help="every data worker's host:port (dispatcher)")
    parser.add_argument("--ready_fd", type=int, default=None)
    parser.add_argument("--exit_with_parent", action="store_true")
    parser.add_argument("--netns", type=int, default=None)
    return parser


def serve(args) -> int:
    stop_on_signals()
    if args.netns is not None:  # first: joining a user namespace needs a single thread
        from dtflab.network.netns import join

        join(args.netns)
    if args.exit_with_parent:
        exit_with_parent()
    name = "dispatcher" if args.role == "dispatcher" else f"data worker {args.address}"
    if not port_is_free(args.port):
        print(f"dtflab data service: port {args.port} of the {name} is already in use",
              file=sys.stderr)
        return EXIT_PORT_IN_USE
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    import tensorflow as tf

    service = tf.data.experimental.service
    if args.role == "dispatcher":
        workers = [w for w in args.workers.split(",") if w]
        server = service.DispatchServer(service.DispatcherConfig(
            port=args.port, worker_addresses=workers or None,
            worker_timeout_ms=WORKER_TIMEOUT_MS))
    else:
        server = service.WorkerServer(service.WorkerConfig(
            dispatcher_address=args.dispatcher, worker_address=args.address, port=args.port,
            heartbeat_interval_ms=HEARTBEAT_MS))
    print(f"dtflab data service: {name} serving on port {args.port} (pid {os.getpid()})",
          flush=True)
    if args.ready_fd is not None:
        with os.fdopen(args.ready_fd, "w") as ready:
            ready.write(f"ready {os.getpid()}\n")
    stop_on_signals()  # again, in case importing TensorFlow replaced them
    while not _stop_requested.wait(0.5):
        pass
    print(f"dtflab data service: {name} stopped", flush=True)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(0)  # the servers cannot be shut down in process either


def main(argv=None) -> int:
    return serve(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
