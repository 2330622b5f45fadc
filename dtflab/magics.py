"""``%dtf_cluster``, ``%%dtf_run``, ``%%dtf_trace`` and ``%%dtf_solution``: a thin skin over
dtflab's Python API.

In [1]: %load_ext dtflab
In [2]: %dtf_cluster start 3
In [3]: %dtf_cluster kill worker:1
In [4]: %dtf_cluster run --workers 2 train.py --steps 100
"""

from __future__ import annotations

import argparse
import os
import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser, argument, magic_arguments

from dtflab import exercises, names, scratch
from dtflab.cluster import Cluster, backend_names, check_request, start_cluster
from dtflab.errors import NotSupportedError, did_you_mean
from dtflab.spec import parse_count

COMMANDS = ("start", "run", "status", "stop", "kill", "restart", "spec", "logs", "wait")
START_ONLY = ("backend", "ps", "workers", "jobs", "spec", "replace", "timeout", "scheduler", "network",
              "start_method", "data_workers")


@magics_class
class ClusterMagics(Magics):
    """Starts and drives dtflab clusters by name (default ``cluster``) in the user namespace."""

    def __init__(self, shell):
        super().__init__(shell)
        self.clusters: dict[str, Cluster] = {}

    @magic_arguments()
    @argument("command", nargs="?",
              help="start | run | status | stop | kill | restart | spec | logs | wait "
                   "(run: see %%dtf_cluster run --help)")
    @argument("task", nargs="?",
              help="start: the task count, default 3 (one ps, the rest workers); "
                   "kill, restart, logs: JOB:TASK, e.g. worker:1")
    @argument("--backend", help=f"where tasks run: {', '.join(backend_names())} (default local)")
    @argument("--ps", help="start: number of ps tasks (default 1 with --workers)")
    @argument("--workers", help="start: number of worker tasks (default 2 with --ps)")
    @argument("--jobs", help="start: any jobs and counts, e.g. master=1,ps=2")
    @argument("--spec", help="start: the 2016 cluster spec, e.g. "
                             "'master|localhost:2222,ps|localhost:2223,ps|localhost:2224'")
    @argument("--name", default="cluster",
              help="the notebook variable holding the cluster (default: cluster)")
    @argument("--replace", action="store_true",
              help="start: stop the running cluster of that name first")
    @argument("--timeout", help="start: seconds to wait for every task to listen (default 60)")
    @argument("--scheduler", help="start: an existing Dask scheduler, e.g. tcp://10.0.0.5:8786 "
                                  "(implies --backend dask)")
    @argument("--network", help="start: private (the local backend's default: reachable from "
                                "this machine only) or host (other hosts can reach the tasks)")
    @argument("--start-method", dest="start_method",
              help="start: fork (the default: tasks forked from a warm TensorFlow) or spawn")
    @argument("--data-workers", dest="data_workers", help="start: add a tf.data service: a "
              "dispatcher and this many data workers (cluster.data_service is its address)")
    @line_magic
    def dtf_cluster(self, line: str = ""):
        """Start, inspect, break and stop a TensorFlow cluster of task servers.

        In [1]: %dtf_cluster start 3
        In [2]: %dtf_cluster start --jobs master=1,ps=2 --backend inprocess --replace
        In [3]: %dtf_cluster kill worker:1
        In [4]: %dtf_cluster restart worker:1
        In [5]: %dtf_cluster start 3 --data-workers 2 --replace
        In [6]: %dtf_cluster stop
        In [7]: %dtf_cluster run --workers 2 --ps 1 trainer.py --job_name={job_name}
        In [8]: %dtf_cluster wait
        """
        tokens = _split(line)
        if tokens[:1] == ["run"]:
            return self._run(tokens[1:])
        args = self.dtf_cluster.parser.parse_args(tokens)
        if args.command is None:
            print(self.dtf_cluster.parser.format_help())
            return None
        if args.command not in COMMANDS:
            raise UsageError(f"unknown command {args.command!r}{did_you_mean(args.command, COMMANDS)}; "
                             f"commands: {', '.join(COMMANDS)}")
        if not args.name.isidentifier():
            raise UsageError(f"--name {args.name!r} is not a Python variable name; "
                             f"use letters, digits and '_', e.g. --name cluster2")
        if args.command != "start":
            misplaced = [f"--{option}" for option in START_ONLY if getattr(args, option)]
            if misplaced:
                raise UsageError(f"{', '.join(misplaced)} applies only to start, "
                                 f"e.g. %dtf_cluster start 3 {misplaced[0]} ...")
        try:
            return getattr(self, f"_{args.command}")(args)
        except (ValueError, NotSupportedError) as exc:
            raise UsageError(str(exc)) from None

    # -- commands ----------------------------------------------------------------------------

    def _start(self, args):
        options = dict(backend=args.backend, ps=args.ps, workers=args.workers, jobs=args.jobs,
                       spec=args.spec, scheduler=args.scheduler, network=args.network,
                       start_method=args.start_method)
        if args.data_workers is not None:
            options["data_workers"] = parse_count(args.data_workers, "--data-workers", minimum=0)
        if args.timeout is not None:
            options["timeout"] = _seconds(args.timeout)
        n = args.task
        if n is not None:
            n = parse_count(n, "the task count")
        # The whole request checked before the running cluster is touched: refused, it changes nothing
        check_request(n, **options)
        running = self._find(args.name, required=False)
        if running is not None and not running.stopped and not args.replace:
            raise UsageError(
                f"a cluster named {args.name!r} is already running ({running!r}); stop it with "
                f"%dtf_cluster stop, or start anew with %dtf_cluster start {line_tail(args)} --replace")
        if running is not None and not running.stopped:
            running.stop()
        cluster = start_cluster(n, **options)
        self.clusters[args.name] = cluster
        self.shell.user_ns[args.name] = cluster
        return _show(cluster.panel())

    def _run(self, tokens: list[str]):
        """``%dtf_cluster run``: start program tasks (as ``dtflab run``), bind, show the panel."""
        from dtflab.cluster import run
        from dtflab.cluster.programs import Program

        args = run_parser("%dtf_cluster run", with_script=True).parse_args(tokens)
        options = _run_options(args)
        running = self._find(args.name, required=False)
        if running is not None and not running.stopped and not args.replace:
            raise UsageError(f"a cluster named {args.name!r} is already running ({running!r}); "
                             f"stop it with %dtf_cluster stop, or add --replace")
        try:
            Program.checked(args.script, args.args)  # before stopping the running cluster
            if running is not None and not running.stopped:
                running.stop()
            cluster = run(args.script, *args.args, **options)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        self.clusters[args.name] = cluster
        self.shell.user_ns[args.name] = cluster
        return _show(cluster.panel())

    def _wait(self, args):
        codes = self._find(args.name).wait()
        print(", ".join(f"{name}: exit code {code}" for name, code in codes.items()))

    def _status(self, args):
        return _show(self._find(args.name).panel())

    def _stop(self, args):
        cluster = self._find(args.name)
        cluster.stop()
        print(f"stopped {args.name}: {cluster!r}")

    def _kill(self, args):
        task = self._task_arg(args)
        self._find(args.name).kill(task)
        print(f"killed {args.task}")

    def _restart(self, args):
        task = self._task_arg(args)
        self._find(args.name).restart(task)
        print(f"restarted {args.task}")

    def _spec(self, args):
        cluster = self._find(args.name)
        print(cluster.task_addresses)  # the data service's tasks too, beside TensorFlow's
        print(cluster.legacy_spec)

    def _logs(self, args):
        task = self._task_arg(args)
        print(self._find(args.name).logs(task))

    # -- helpers -----------------------------------------------------------------------------

    def _find(self, name: str, *, required: bool = True) -> Cluster | None:
        cluster = self.clusters.get(name)
        bound = self.shell.user_ns.get(name)
        if isinstance(bound, Cluster):  # a cluster made with the Python API works too
            cluster = bound
        if cluster is None and required:
            raise UsageError(f"no cluster named {name!r}; start one with %dtf_cluster start 3"
                             + ("" if name == "cluster" else f" --name {name}"))
        return cluster

    def _task_arg(self, args) -> str:
        if args.task is None:
            raise UsageError(f"{args.command} needs a task, e.g. %dtf_cluster {args.command} worker:1")
        return args.task


def run_parser(prog: str, *, with_script: bool) -> MagicArgumentParser:
    """The options of ``%dtf_cluster run`` and ``%%dtf_run`` (those of ``dtflab run``)."""
    parser = MagicArgumentParser(prog=prog, description="Run a program on every worker task, "
                                 "with TF_CONFIG and DTENSOR_* set for its task.")
    parser.add_argument("--workers", default="2", help="worker tasks running the program (default 2)")
    parser.add_argument("--ps", default="0", help="bare task servers as job ps (default 0)")
    parser.add_argument("--chief", action="store_true", help="add a chief task running it too")
    parser.add_argument("--chief-only", dest="chief_only", action="store_true",
                        help="run it on a chief only, beside bare worker and ps servers")
    parser.add_argument("--backend", help="local (default) or dask")
    parser.add_argument("--scheduler", help="an existing Dask scheduler (implies --backend dask)")
    parser.add_argument("--network", help="private (default for local) or host")
    parser.add_argument("--start-method", dest="start_method", help="fork (default) or spawn")
    parser.add_argument("--timeout", default="60", help="seconds to wait for every task to start")
    parser.add_argument("--name", default="cluster" if with_script else None,
                        help="the notebook variable that receives the cluster")
    if with_script:
        parser.add_argument("--replace", action="store_true",
                            help="stop the running cluster of that name first")
        parser.add_argument("script", help="the Python file every worker runs")
        parser.add_argument("args", nargs=argparse.REMAINDER,
                            help="its arguments; {ps_hosts}, {worker_hosts}, {job_name}, "
                                 "{task_index} are replaced per task")
    return parser


def _run_options(args) -> dict:
    return dict(workers=args.workers, ps=args.ps, chief=args.chief, chief_only=args.chief_only,
                backend=args.backend, network=args.network, timeout=_seconds(args.timeout),
                start_method=args.start_method, scheduler=args.scheduler)


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"--timeout must be a number of seconds, got {text!r}; "
                         f"e.g. --timeout 120") from None


@magics_class
class RunMagics(Magics):
    """``%%dtf_run``: the cell's code as every worker's program."""

    @cell_magic
    def dtf_run(self, line: str, cell: str):
        """Run the cell as every worker's program (not in this kernel), its output labelled
        and live; returns when every program has ended, then stops the cluster.

        Options: --workers N (default 2), --ps M, --chief, --backend, --network,
        --start-method, --timeout, --name (see ``%dtf_cluster run --help``).

        In [1]: %%dtf_run --workers 2
           ...: import json, os
           ...: print(json.loads(os.environ["TF_CONFIG"])["task"])

        The cell runs from this kernel's working directory, in a fresh process forked from a
        warm TensorFlow: it sees none of the notebook's variables. Interrupting the kernel
        stops every task. ``--name c`` keeps the stopped cluster (and its logs) in ``c``.
        """
        from dtflab.cluster import run
        from dtflab.cluster.follow import follow_programs
        from dtflab.errors import TaskError

        args = run_parser("%%dtf_run", with_script=False).parse_args(_split(line))
        if args.name is not None and not args.name.isidentifier():
            raise UsageError(f"--name {args.name!r} is not a Python variable name; e.g. --name run1")
        folder = scratch.folder("cell")
        script = os.path.join(folder, "cell.py")
        with open(script, "w") as f:
            f.write(cell)
        try:
            try:
                cluster = run(script, **_run_options(args))
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            if args.name:
                self.shell.user_ns[args.name] = cluster
            with cluster:
                try:
                    codes = follow_programs(cluster)
                except KeyboardInterrupt:
                    print("dtflab: interrupted; stopped every task")
                    return None
            failed = [name for name, code in codes.items() if code != 0]
            if failed:
                job, index = names.split(failed[0])
                raise TaskError(job, index, f"exited with code {codes[failed[0]]}",
                                log_tail=cluster._task_log_tail(job, index))
        finally:
            scratch.remove(folder)
        return None


@magics_class
class TraceMagics(Magics):
    """``%%dtf_trace``: trace a ``Session.run`` call of the cell and show what it did."""

    @magic_arguments()
    @argument("--run", default="first",
              help="which Session.run call of the cell to trace: first (default), last "
                   "(traces every call, keeps the last), or its number counting from 0")
    @argument("--name", default="step", help="the variable that receives the StepTrace (default step)")
    @argument("--max-ops", default="150",
              help="above this many ops the graph view is collapsed by name scope (default 150)")
    @argument("--no-show", action="store_true", help="keep the trace without drawing it")
    @cell_magic
    def dtf_trace(self, line: str, cell: str):
        """Trace one Session.run of the cell; the cell computes exactly what it would untraced.

        In [1]: %%dtf_trace --run last
           ...: for _ in range(100):
           ...:     session.run(train_op, feed)
        """
        from dtflab.tracing import recording

        args = self.dtf_trace.parser.parse_args(_split(line))
        select = int(args.run) if args.run.isdigit() else args.run
        if select not in ("first", "last") and not isinstance(select, int):
            raise UsageError(f"--run must be first, last or a call number such as 2, got {args.run!r}")
        if not args.name.isidentifier():
            raise UsageError(f"--name {args.name!r} is not a Python variable name; e.g. --name step")
        max_ops = _positive(args.max_ops, "--max-ops")
        with recording(select) as kept:
            outcome = self.shell.run_cell(cell, store_history=False)
        if not outcome.success:
            return None  # IPython has shown the cell's own error
        if not kept:
            raise UsageError(
                "the cell made no Session.run call to trace" + (
                    f" numbered {select} (counting from 0)" if isinstance(select, int) else "")
                + "; tf.function (TF2) code cannot be traced, see help(dtflab.trace)")
        step = kept[-1]
        self.shell.user_ns[args.name] = step
        print(step.summary())
        if not args.no_show:
            step.show(max_ops=max_ops)
        return None


def _positive(text: str, what: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{what} must be a whole number of at least 1, got {text!r}")
    return int(text)


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"cannot read {line!r}: {exc}; close the quotes around the value") from None


def line_tail(args) -> str:
    """The start arguments, as the user would retype them."""
    parts = [args.task] if args.task else []
    for option in (o for o in START_ONLY if o != "replace"):  # --replace is not retyped
        value = getattr(args, option)
        if value is not None:
            parts.append(f"--{option.replace('_', '-')} {shlex.quote(str(value))}")
    if args.name != "cluster":
        parts.append(f"--name {args.name}")
    return " ".join(parts)


def _show(obj):
    from IPython.display import display

    display(obj)


def register(ipython) -> None:
    """Register the magics, import TensorFlow quietly (its start-up lines stay hidden) and,
    in a notebook, load BokehJS into the page: widgets that embed Bokeh plots need it loaded
    *before* they are displayed, which a later cell cannot guarantee."""
    from dtflab._quiet import import_tf
    from dtflab.ui.tensorboard import tensorboard_magic
    from dtflab.ui.workers import WorkersMagics
    from dtflab.viz.output import load_bokehjs

    import_tf()
    load_bokehjs()
    for magics in (ClusterMagics, RunMagics, TraceMagics, exercises.SolutionMagics, WorkersMagics):
        ipython.register_magics(magics)
    ipython.register_magic_function(tensorboard_magic, "line", "dtf_tensorboard")
    warm_up()


def warm_up() -> None:
    """Start this kernel's private network and fork server now, so the first cluster starts
    warm (the fork server imports TensorFlow in the background). Never fails: a later start
    reports what went wrong."""
    from dtflab.processes.launch import fork_server
    from dtflab.network.networks import private_network

    try:
        network, _ = private_network(timeout=30.0)
        fork_server(network.netns_pid if network is not None else None, wait=None)
    except Exception:  # noqa: BLE001 - the first start says why, with the user's options
        pass
