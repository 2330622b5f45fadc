"""One TensorFlow task server process: ``dtflab server`` and the local backend's children.

Takes the 2016 server's flags (``--cluster_spec``, ``--job_name``, ``--task_index``). The local
backend adds ``--ready_fd`` (write one line there once the port listens) and
``--exit_with_parent`` (end when the owning process ends, even by SIGKILL: standard input
reaching EOF or the parent pid changing, whichever is seen first, within 0.25 s) and
``--netns`` (join the private network of the gate with this pid: ``dtflab.network.networks``).
Ctrl-C and SIGTERM stop it with a "stopped" line and exit code 0, even while TensorFlow is
still being imported.

Exit codes: 0 stopped, 2 bad flags, 75 port already in use, 1 anything else.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import socket
import sys
import threading

from dtflab.processes.inside import exit_with_parent

EXIT_PORT_IN_USE = 75


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dtflab server",
        description="Run one TensorFlow task server (the flags of the 2016 grpc_tensorflow_server).",
    )
    parser.add_argument("--cluster_spec", "--cluster-spec", required=True,
                        help="all tasks as job|host:port, comma separated, e.g. "
                             "'master|localhost:2222,ps|localhost:2223'; a repeated job adds a task")
    parser.add_argument("--job_name", "--job-name", required=True, help="this task's job, e.g. ps")
    parser.add_argument("--task_index", "--task-index", default="0",
                        help="this task's index within its job (default 0)")
    parser.add_argument("--inter_op_threads", type=int, default=0,
                        help="ConfigProto.inter_op_parallelism_threads (0: TensorFlow's default)")
    parser.add_argument("--intra_op_threads", type=int, default=0,
                        help="ConfigProto.intra_op_parallelism_threads (0: TensorFlow's default)")
    parser.add_argument("--profiler_port", type=int, default=0,
                        help="also serve the TensorFlow profiler on this port (0: no profiler)")
    parser.add_argument("--verbose", action="store_true", help="show TensorFlow's own log lines")
    parser.add_argument("--ready_fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--exit_with_parent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--netns", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def resolve_task(args) -> tuple[dict[str, list[str]], str, int, int]:
    """Validate the flags: the address map, job, index and this task's port."""
    from dtflab.spec import parse_legacy_spec, parse_count

    layout = parse_legacy_spec(args.cluster_spec)
    if args.job_name not in layout:
        raise ValueError(f"--job_name {args.job_name!r} is not in the cluster spec; "
                         f"its jobs are: {', '.join(layout)}")
    index = parse_count(args.task_index, "--task_index", minimum=0)
    tasks = layout[args.job_name]
    if index >= len(tasks):
        raise ValueError(f"--task_index {index} is out of range: job {args.job_name!r} has "
                         f"{len(tasks)} task(s), indices 0..{len(tasks) - 1}")
    addresses = {job: [f"{host}:{port}" for host, port in entries] for job, entries in layout.items()}
    return addresses, args.job_name, index, tasks[index][1]


def port_is_free(port: int) -> bool:
    """Whether this machine can bind ``port`` on all interfaces, as gRPC will."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # gRPC sets it too
    try:
        probe.bind(("", port))
        return True
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return False
        raise
    finally:
        probe.close()


_stop_requested = threading.Event()


def _request_stop(*_) -> None:
    _stop_requested.set()


def stop_on_signals() -> None:
    """Ctrl-C and SIGTERM ask the server to stop, whenever they come: none is lost."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _request_stop)


def serve(args) -> int:
    """Run the task server; returns only on bad flags or a port in use (the exit code)."""
    stop_on_signals()
    if args.netns is not None:  # first: joining a user namespace needs a single thread
        from dtflab.network.netns import join

        try:
            join(args.netns)
        except OSError as exc:
            print(f"dtflab server: {exc.strerror}", file=sys.stderr)
            return 1
    if not args.exit_with_parent:
        return _serve(args)
    exit_with_parent()
    code = _serve(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve(args) -> int:
    ready = None
    if args.ready_fd is not None:
        ready = os.fdopen(args.ready_fd, "w")
    try:
        addresses, job, index, port = resolve_task(args)
    except ValueError as exc:
        print(f"dtflab server: {exc}", file=sys.stderr)
        return 2
    if not port_is_free(port):
        print(f"dtflab server: port {port} of {job}:{index} is already in use; "
              f"choose another port in --cluster_spec", file=sys.stderr)
        return EXIT_PORT_IN_USE

    # A terminal user sees one line per task; a child of the local backend logs everything.
    quiet = ready is None and not args.verbose
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2" if quiet else "0")
    from dtflab._quiet import quiet_fds

    with quiet_fds() if quiet else contextlib.nullcontext():
        import tensorflow as tf

        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=args.inter_op_threads,
                                          intra_op_parallelism_threads=args.intra_op_threads)
        try:
            server = tf.distribute.Server(tf.train.ClusterSpec(addresses), job_name=job,
                                          task_index=index, config=config)
        except tf.errors.UnknownError as exc:
            server, failure = None, exc.message
    if server is None:
        print(f"dtflab server: {job}:{index} could not listen on port {port} ({failure}); "
              f"it is probably in use", file=sys.stderr)
        return EXIT_PORT_IN_USE
    if args.profiler_port:
        try:
            tf.profiler.experimental.server.start(args.profiler_port)
        except Exception as exc:  # timings become unavailable; the task itself is fine
            print(f"dtflab server: no profiler on port {args.profiler_port}: {exc}", file=sys.stderr)
    target = server.target.decode() if isinstance(server.target, bytes) else server.target
    print(f"dtflab server: {job}:{index} serving {target} (pid {os.getpid()})", flush=True)
    if ready is None:  # run by hand: on the host network, as in 2016
        from dtflab.network.networks import outside_addresses

        exposed = ", ".join(f"{ip}:{port}" for ip in outside_addresses())
        if exposed:
            print(f"dtflab server: WARNING: reachable from other hosts at {exposed}; anyone who "
                  f"reaches it can run code as you (see the README's Security section)",
                  file=sys.stderr, flush=True)
    if ready is not None:
        ready.write(f"ready {os.getpid()}\n")
        ready.close()
    stop_on_signals()  # again, in case importing TensorFlow replaced them
    from dtflab.allocator import give_back

    # not server.join(): Ctrl-C cannot interrupt it; what steps freed goes back each second
    while not _stop_requested.wait(1.0):
        give_back()
    print(f"dtflab server: {job}:{index} stopped", flush=True)
    # TF servers cannot be shut down in process; leaving without running finalizers is the
    # only clean way out.
    sys.stdout.flush()
    os._exit(0)


def main(argv=None) -> int:
    return serve(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
