"""What a program task runs: the user's script, its arguments with per-task placeholders, the
``TF_CONFIG`` TensorFlow's strategies read and the variables DTensor's multi-client mode reads.

In the arguments, ``{ps_hosts}``, ``{worker_hosts}``, ``{chief_hosts}`` (comma-separated
``host:port`` lists), ``{job_name}`` and ``{task_index}`` are replaced per task, so a 2016-2018
trainer with ``--ps_hosts=... --job_name=... --task_index=...`` flags runs unchanged.
``{client_host}`` is the address at which the task's host reaches the process that started
the cluster (``127.0.0.1`` for a task on this machine, where ``Cluster.let_tasks_reach(port)``
lets a port through the private network; on Dask, this machine's address on the interface that
routes to the task's host): a program reports back to a listener there. ``{{`` and ``}}`` are
literal braces.

DTensor's clients are the program tasks of the chief and worker jobs, the chief first, as
TensorFlow's own DTensor-backed ``tf.distribute.experimental.MultiWorkerMirroredStrategy`` maps
``TF_CONFIG`` to them. Each client gets ``DTENSOR_CLIENT_ID`` (its place in that order),
``DTENSOR_NUM_CLIENTS``, ``DTENSOR_JOB_NAME`` (``worker``) and ``DTENSOR_JOBS``: every client's
``TF_CONFIG`` address, in client order. That address is the task's own: dtflab chose its port
free and binds nothing there, so ``initialize_accelerator_system`` starts DTensor's gRPC server
on it (a program uses DTensor or a ``TF_CONFIG`` strategy, not both: each binds that port).
ps tasks and bare task servers are no clients.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from dtflab.cluster.task import Command

#: The jobs whose program tasks are DTensor's clients, in client order.
DTENSOR_CLIENT_JOBS = ("chief", "worker")
#: The job name DTensor's clients share (``DTENSOR_JOB_NAME``), as TensorFlow's own mapping has it.
DTENSOR_JOB_NAME = "worker"
PLACEHOLDERS = ("ps_hosts", "worker_hosts", "chief_hosts", "job_name", "task_index", "client_host")
#: ``{client_host}`` where the task shares this machine's loopback.
LOOPBACK = "127.0.0.1"
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Program:
    """A user's script with its arguments, run from ``cwd`` (an absolute path)."""

    script: str
    args: tuple[str, ...] = ()
    cwd: str = ""

    @classmethod
    def checked(cls, script, args=(), cwd: str | None = None) -> "Program":
        """A ``Program`` after checking the script exists and every placeholder is known;
        ``ValueError`` naming the bad value and the fix otherwise."""
        cwd = os.path.abspath(cwd or os.getcwd())
        if not isinstance(script, (str, os.PathLike)) or not str(script).strip():
            raise ValueError(f"the script must be the path of a Python file, got {script!r}; "
                             f"for example train.py")
        path = os.path.join(cwd, os.fspath(script))
        if not os.path.isfile(path):
            where = "" if os.path.isabs(os.fspath(script)) else f" in {cwd}"
            raise ValueError(f"no script {os.fspath(script)!r}{where}; give the path of a Python "
                             f"file, for example train.py")
        args = tuple(str(arg) for arg in args)
        for arg in args:
            for match in _PLACEHOLDER.finditer(arg):
                name = match.group(1)
                if name is not None and name not in PLACEHOLDERS:
                    raise ValueError(
                        f"unknown placeholder {{{name}}} in argument {arg!r}; use one of "
                        f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}, or write {{{{ and }}}} "
                        f"for literal braces")
        return cls(os.path.abspath(path), args, cwd)

    @property
    def name(self) -> str:
        return os.path.basename(self.script)

    def uses(self, placeholder: str) -> bool:
        """Whether an argument names ``{placeholder}``."""
        return any(match.group(1) == placeholder for arg in self.args
                   for match in _PLACEHOLDER.finditer(arg))

    def arguments(self, addresses: dict[str, list[str]], job: str, index: int,
                  client_host: str = LOOPBACK) -> list[str]:
        """The arguments for task ``job:index``, placeholders replaced."""
        values = {f"{j}_hosts": ",".join(addresses.get(j, [])) for j in ("ps", "worker", "chief")}
        values.update(job_name=job, task_index=str(index), client_host=client_host)

        def replace(match):
            text = match.group(0)
            return text[0] if match.group(1) is None else values[match.group(1)]

        return [_PLACEHOLDER.sub(replace, arg) for arg in self.args]

    def command(self, addresses: dict[str, list[str]], job: str, index: int,
                program_jobs=None, client_host: str = LOOPBACK) -> Command:
        """How task ``job:index`` runs this program (see ``dtflab.processes.script``);
        ``program_jobs``: every job that runs a program (default: ``job`` alone);
        ``client_host``: what ``{client_host}`` stands for."""
        return Command("dtflab.processes.script",
                       ["--exit_with_parent", self.script,
                        *self.arguments(addresses, job, index, client_host)],
                       env={"TF_CONFIG": tf_config(addresses, job, index),
                            "DTFLAB_TASK": f"{job}:{index}",
                            # TensorFlow's INFO lines in the task's log: there it says what a
                            # session waits for (dtflab.cluster.waits); followers hide them.
                            "TF_CPP_MIN_LOG_LEVEL": "0",
                            **dtensor_env(addresses, program_jobs or (job,), job, index)},
                       cwd=self.cwd)


def tf_config(addresses: dict[str, list[str]], job: str, index: int) -> str:
    """``TF_CONFIG`` for task ``job:index`` of a cluster with these addresses."""
    return json.dumps({"cluster": {j: list(tasks) for j, tasks in addresses.items()},
                       "task": {"type": job, "index": index}})


def dtensor_clients(addresses: dict[str, list[str]], program_jobs) -> list[tuple[str, int]]:
    """DTensor's clients, ``(job, index)`` in client order: the program tasks of the chief and
    worker jobs, the chief first."""
    return [(job, index) for job in DTENSOR_CLIENT_JOBS if job in program_jobs
            for index in range(len(addresses.get(job, [])))]


def dtensor_env(addresses: dict[str, list[str]], program_jobs, job: str,
                index: int) -> dict[str, str]:
    """DTensor's multi-client variables for task ``job:index``; ``{}`` for a task that is no
    client (a ps task, a job that runs no program)."""
    clients = dtensor_clients(addresses, program_jobs)
    if (job, index) not in clients:
        return {}
    return {"DTENSOR_CLIENT_ID": str(clients.index((job, index))),
            "DTENSOR_NUM_CLIENTS": str(len(clients)),
            "DTENSOR_JOB_NAME": DTENSOR_JOB_NAME,
            "DTENSOR_JOBS": ",".join(addresses[j][i] for j, i in clients)}
