"""The ``dtflab`` console command.

$ dtflab lab                      # JupyterLab on the tutorials
$ dtflab server --cluster_spec 'master|localhost:2222,ps|localhost:2223' --job_name master --task_index 0
$ dtflab cluster start 3
$ dtflab run --workers 2 train.py --steps 100
$ dtflab run --workers 2 --ps 1 trainer.py --ps_hosts={ps_hosts} --worker_hosts={worker_hosts} \
      --job_name={job_name} --task_index={task_index}
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path


#: Where ``dtflab lab`` opens.
FIRST_TUTORIAL = "00_quickstart.ipynb"


def build_parser() -> argparse.ArgumentParser:
    from dtflab.cluster import backend_names
    from dtflab.processes.server import build_parser as server_parser

    parser = argparse.ArgumentParser(prog="dtflab", description="Distributed TensorFlow task servers.")
    commands = parser.add_subparsers(dest="command", metavar="{lab,server,cluster,run,binder}")
    commands.add_parser(
        "lab", help="open JupyterLab on the tutorial notebooks (extra arguments go to jupyter "
                    "lab, e.g. --no-browser --port 8899)",
        description=f"Open JupyterLab on the tutorial notebooks, at {FIRST_TUTORIAL}. Every "
                    f"other argument goes to `jupyter lab` as it is (see `jupyter lab --help`), "
                    f"for example: dtflab lab --no-browser --port 8899")
    commands.add_parser("server", parents=[server_parser()], add_help=False,
                        help="run one task server with the 2016 flags (foreground)")
    cluster = commands.add_parser("cluster", help="run a whole cluster (foreground)")
    actions = cluster.add_subparsers(dest="action", metavar="{start}")
    start = actions.add_parser("start", help="start a cluster; Ctrl-C stops every task")
    start.add_argument("n", nargs="?", help="task count (default 3: one ps, the rest workers)")
    start.add_argument("--backend", help=f"one of: {', '.join(backend_names())} (default local)")
    start.add_argument("--ps", help="number of ps tasks")
    start.add_argument("--workers", help="number of worker tasks")
    start.add_argument("--jobs", help="any jobs and counts, e.g. master=1,ps=2")
    start.add_argument("--spec", help="the 2016 cluster spec, e.g. 'master|localhost:2222,ps|localhost:2223'")
    start.add_argument("--scheduler", help="an existing Dask scheduler, e.g. tcp://10.0.0.5:8786")
    start.add_argument("--network", help="private (default for local: this machine only) or "
                                          "host (other hosts can reach the tasks)")
    start.add_argument("--timeout", type=float, default=60.0,
                       help="seconds to wait for every task to listen (default 60)")
    start.add_argument("--data-workers", dest="data_workers", default="0",
                       help="add a tf.data service: a dispatcher and this many data workers")
    binder = commands.add_parser("binder", help="print the mybinder.org badge for this clone's "
                                 "GitHub remote (paste it into README.md)")
    binder.add_argument("--remote", default="origin", help="the git remote to use (default origin)")
    binder.add_argument("--branch", default="main", help="the branch Binder builds (default main)")
    run = commands.add_parser(
        "run", help="run SCRIPT as every worker's program, with TF_CONFIG and DTENSOR_* set "
             "(foreground)",
        description="Run SCRIPT [ARGS...] as every worker task's program (and the chief's, with "
                    "--chief), beside --ps bare task servers. Each output line is prefixed with "
                    "its task; Ctrl-C or SIGTERM stops everything; the exit code is 0 only if "
                    "every program exited 0. In ARGS, {ps_hosts}, {worker_hosts}, "
                    "{chief_hosts}, {job_name} and {task_index} are replaced per task. A "
                    "program that waits for a task that has ended (a session without "
                    "device_filters) ends the run with an error naming both.")
    run.add_argument("--workers", required=True, help="number of worker tasks running SCRIPT")
    run.add_argument("--ps", default="0", help="number of bare task servers as job ps (default 0)")
    run.add_argument("--chief", action="store_true", help="add a chief task running SCRIPT too")
    run.add_argument("--chief-only", dest="chief_only", action="store_true",
                     help="run SCRIPT on a chief only; workers and ps are bare task servers "
                          "(a ParameterServerStrategy coordinator)")
    run.add_argument("--backend", help="local (default) or dask")
    run.add_argument("--scheduler", help="an existing Dask scheduler, e.g. tcp://10.0.0.5:8786")
    run.add_argument("--network", help="private (default for local) or host")
    run.add_argument("--start-method", dest="start_method",
                     help="fork (default: from a warm TensorFlow) or spawn")
    run.add_argument("--timeout", type=float, default=60.0,
                     help="seconds to wait for every task to start (default 60)")
    run.add_argument("script", help="the Python file every worker runs")
    run.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


def run_programs(args) -> int:
    """``dtflab run``: start, follow every program's output, stop; 0 if every program exited 0."""
    from dtflab.cluster import run
    from dtflab.cluster.follow import follow_programs
    from dtflab.errors import DtflabError, WaitForEndedTaskError

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        cluster = run(args.script, *args.args, workers=args.workers, ps=args.ps, chief=args.chief,
                      chief_only=args.chief_only, backend=args.backend, network=args.network, timeout=args.timeout,
                      start_method=args.start_method, scheduler=args.scheduler)
    except (ValueError, DtflabError) as exc:
        print(f"dtflab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dtflab: stopped", flush=True)
        return 130
    with cluster:
        programs = [t.name for t in cluster.tasks if t.job in cluster.programs]
        servers = [t.name for t in cluster.tasks if t.job not in cluster.programs]
        print(f"dtflab: running {args.script} on {', '.join(programs)}"
              + (f" beside task servers {', '.join(servers)}" if servers else "")
              + f" (tasks {cluster.start_method}ed); Ctrl-C stops everything", flush=True)
        try:
            codes = follow_programs(cluster, write=lambda line: print(line, flush=True))
        except KeyboardInterrupt:
            print("dtflab: stopping", flush=True)
            return 130
        except WaitForEndedTaskError as exc:  # the waiting program is stopped; stop the rest
            print(f"dtflab: error: {exc}", file=sys.stderr, flush=True)
            return 1
    failed = {name: code for name, code in codes.items() if code != 0}
    for name, code in failed.items():
        print(f"dtflab: {name} exited with code {code}", file=sys.stderr, flush=True)
    print(f"dtflab: {len(codes) - len(failed)} of {len(codes)} programs exited with code 0",
          flush=True)
    return 1 if failed else 0


def _interrupt(*_):
    raise KeyboardInterrupt


def run_cluster(args) -> int:
    from dtflab.cluster import start_cluster
    from dtflab.cluster.task import TaskState
    from dtflab.errors import DtflabError
    from dtflab.spec import parse_count

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        cluster = start_cluster(args.n, backend=args.backend, ps=args.ps, workers=args.workers,
                                jobs=args.jobs, spec=args.spec, timeout=args.timeout,
                                scheduler=args.scheduler, network=args.network,
                                data_workers=parse_count(args.data_workers, "--data-workers",
                                                         minimum=0))
    except (ValueError, DtflabError) as exc:
        print(f"dtflab: error: {exc}", file=sys.stderr)
        return 2
    with cluster:
        print(f"dtflab: {cluster.backend} cluster running; Ctrl-C stops it")
        print(f"cluster spec: {cluster.legacy_spec}")
        if cluster.data_service:
            print(f"data service: {cluster.data_service}")
        for task in cluster.tasks:
            pid = f" (pid {task.pid})" if task.pid else ""
            print(f"  {task.name:<12} {cluster.target(task.job, task.index)}{pid}", flush=True)
        if cluster.exposed:
            print(f"dtflab: WARNING: reachable from other hosts at {', '.join(cluster.exposed)}; "
                  f"anyone who reaches them can run code as you ({cluster.exposure_reason}); "
                  f"see the README's Security section", file=sys.stderr, flush=True)
        else:
            print("network: private (reachable from this machine's loopback only)", flush=True)
        reported = set()
        try:
            while True:
                time.sleep(1.0)
                for task in cluster.tasks:
                    if task.state is TaskState.EXITED and task.name not in reported:
                        reported.add(task.name)
                        print(f"dtflab: {task.name} exited; see its log above or restart the "
                              f"cluster", file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            print("dtflab: stopping", flush=True)
    print("dtflab: stopped", flush=True)
    return 0


def run_lab(extra: list[str]) -> int:
    """JupyterLab on the clone's notebooks/, opened at ``FIRST_TUTORIAL``; --allow-root only
    when running as root."""
    import os

    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    if not notebooks.is_dir():
        print(f"dtflab: error: no tutorials at {notebooks}; run `dtflab lab` from an install made "
              f"with `pip install -e .` in a clone of the repository", file=sys.stderr)
        return 2
    # The first tutorial, not the Launcher; a --LabApp.default_url of the user's comes later
    # and wins.
    command = [sys.executable, "-m", "jupyterlab", str(notebooks),
               f"--LabApp.default_url=/lab/tree/{FIRST_TUTORIAL}", *extra]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        print("dtflab: running as root: passing --allow-root to jupyter lab", file=sys.stderr)
        command.append("--allow-root")
    os.execv(sys.executable, command)
    return 0  # not reached


def main(argv=None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["server"]:  # before anything slow
        from dtflab.processes.server import stop_on_signals

        stop_on_signals()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "lab":
        return run_lab(extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "server":
        from dtflab.processes.server import serve

        return serve(args)
    if args.command == "cluster" and args.action == "start":
        return run_cluster(args)
    if args.command == "run":
        return run_programs(args)
    if args.command == "binder":
        from dtflab.binder_link import badge

        try:
            print(badge(Path(__file__).resolve().parents[1], args.branch, args.remote))
        except ValueError as exc:
            print(f"dtflab binder: {exc}", file=sys.stderr)
            return 2
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
