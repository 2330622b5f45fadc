"""The clusters this process started and has not stopped: stopped at interpreter exit."""

from __future__ import annotations

import atexit
import weakref

#: Clusters this process started and did not stop.
clusters: "weakref.WeakSet" = weakref.WeakSet()
#: Clusters this process joined with ``connect()`` (their reprs).
connected: list[str] = []


def stop_all_running() -> None:
    """Stop every cluster this process started and did not stop (runs at exit).

    A process that called ``connect()`` keeps TensorFlow's remote functions and tensor handles
    until its interpreter ends, and destroying them then logs a line per object for tasks that
    are gone ("Failed to remove function remotely", hundreds of them). TensorFlow has no clean
    disconnect, so from here on, the rest of the exit writes its standard error to a log file
    (``dtflab-exit-PID.log`` in the temporary folder) instead of the terminal.
    """
    for cluster in list(clusters):
        try:
            cluster.stop()
        except Exception:  # at exit, carry on with the others
            pass
    if connected:
        import os
        import sys
        import tempfile

        from dtflab import scratch

        sys.stderr.flush()
        path = os.path.join(tempfile.gettempdir(), f"dtflab-exit-{os.getpid()}.log")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        scratch.hold(fd)  # the next dtflab to make a folder removes it once this process ends
        os.dup2(fd, 2)
        os.close(fd)


def track(cluster) -> None:
    """Remember a started cluster, to stop it at exit if nobody does before."""
    clusters.add(cluster)
    if not getattr(track, "registered", False):
        atexit.register(stop_all_running)
        track.registered = True


def forget(cluster) -> None:
    """A cluster that was stopped: nothing left to stop at exit."""
    clusters.discard(cluster)


def connect(cluster, job_name: str) -> list[str]:
    """``cluster.connect(job_name)``: this process joins ``cluster`` as ``job_name`` (once per
    process: TensorFlow keeps the connection), and is listed in ``connected``."""
    from dtflab._quiet import import_tf, quiet_fds
    from dtflab.cluster.ports import free_ports

    tf = import_tf()
    (port,) = free_ports(1)
    cluster.let_tasks_reach(port)
    connected.append(repr(cluster))
    here = cluster.callback_address(port)
    spec = tf.train.ClusterSpec(dict(cluster.addresses, **{job_name: [here]}))
    with quiet_fds():
        tf.config.experimental_connect_to_cluster(spec, job_name=job_name)
    return [device.name for device in tf.config.list_logical_devices()
            if any(f"/job:{job}/" in device.name for job in cluster.addresses)]
