"""The ``inprocess`` backend: every task server inside the calling process."""

from __future__ import annotations

from dtflab.cluster.base import Cluster
from dtflab.processes.server import port_is_free
from dtflab.cluster.task import TaskState
from dtflab.errors import NotSupportedError, PortInUseError

# TensorFlow cannot shut a gRPC server down in process; keep every server referenced so what
# dtflab reports (held until the process exits) is what happens.
_lingering: list = []

WHY_NOT = ("TensorFlow cannot stop a server inside a running process; "
           "start the cluster with --backend local to kill and restart tasks")


class InProcessCluster(Cluster):
    """Task servers as ``tf.distribute.Server`` objects in this process (~0.03 s to start).

    What it cannot do: kill or restart a task, or free the servers' ports and threads before
    this process exits (``stop()`` only marks the cluster stopped). Use it for quick looks and
    for teaching graph placement; use the ``local`` backend for anything about failures.
    """

    backend = "inprocess"

    def __init__(self, layout, **kwargs):
        super().__init__(layout, **kwargs)
        self._servers: dict[tuple[str, int], object] = {}

    def _start_all(self) -> None:
        from dtflab._quiet import import_tf, quiet_fds

        tf = import_tf()
        # A server that fails to bind has already cost nothing, but one that started cannot be
        # undone, so check every port before creating any.
        for (job, index), (host, port) in self.endpoints.items():
            if not port_is_free(port):
                raise PortInUseError(job, index, f"cannot listen on {host}:{port}: port in use")
        spec = self.spec
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=self.inter_op_threads,
                                          intra_op_parallelism_threads=self.intra_op_threads)
        for job, addresses in self.addresses.items():
            for index in range(len(addresses)):
                try:
                    with quiet_fds():
                        server = tf.distribute.Server(spec, job_name=job, task_index=index,
                                                      config=config)
                except tf.errors.UnknownError as exc:
                    raise PortInUseError(job, index, f"cannot listen on {addresses[index]}",
                                         log_tail=exc.message) from None
                self._servers[job, index] = server
                _lingering.append(server)
                self._states[job, index] = TaskState.RUNNING

    def _stop_all(self) -> None:
        self._servers.clear()  # the servers live on in _lingering; see the class docstring

    def kill(self, job: str, index: int | None = None) -> None:
        job, index = self._task(job, index)
        raise NotSupportedError(f"cannot kill {job}:{index} of an inprocess cluster: {WHY_NOT}")

    def restart(self, job: str, index: int | None = None) -> None:
        job, index = self._task(job, index)
        raise NotSupportedError(f"cannot restart {job}:{index} of an inprocess cluster: {WHY_NOT}")

    def _task_state(self, job: str, index: int):
        return self._states[job, index], None

    def _task_logs(self, job: str, index: int) -> str:
        return ("inprocess task servers write to this process's own output; dtflab hides "
                "TensorFlow's start-up lines, see dtflab.tf_log()")
