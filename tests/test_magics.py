"""%dtf_cluster driven through a real IPython shell."""

import pytest
from IPython.core.error import UsageError

from dtflab.cluster import Cluster
from dtflab.cluster.task import TaskState

from conftest import free_ports


def magic(ip, line):
    return ip.run_line_magic("dtf_cluster", line)


@pytest.mark.slow
def test_start_binds_cluster_and_shows_the_panel(ip, capsys):
    magic(ip, "start 3")
    cluster = ip.user_ns["cluster"]
    assert isinstance(cluster, Cluster) and cluster.backend == "local"
    assert [t.name for t in cluster.tasks] == ["ps:0", "worker:0", "worker:1"]
    shown = capsys.readouterr().out
    assert "VBox" in shown or "dtflab-cluster" in shown


@pytest.mark.slow
def test_kill_restart_status_spec_logs_stop(ip, capsys):
    magic(ip, "start 2")
    cluster = ip.user_ns["cluster"]
    magic(ip, "kill worker:0")
    assert cluster.tasks[1].state is TaskState.KILLED
    magic(ip, "restart worker:0")
    assert cluster.tasks[1].state is TaskState.RUNNING
    magic(ip, "status")
    capsys.readouterr()
    magic(ip, "spec")
    out = capsys.readouterr().out
    assert cluster.legacy_spec in out and str(cluster.addresses) in out
    magic(ip, "logs worker:0")
    assert "worker:0 serving grpc://" in capsys.readouterr().out
    magic(ip, "stop")
    assert cluster.stopped


def test_named_clusters_and_the_legacy_spec(ip):
    a, b, c = free_ports(3)
    magic(ip, f"start --spec 'master|localhost:{a},ps|localhost:{b},ps|localhost:{c}' "
              f"--backend inprocess --name legacy")
    legacy = ip.user_ns["legacy"]
    assert legacy.addresses == {"master": [f"localhost:{a}"],
                                "ps": [f"localhost:{b}", f"localhost:{c}"]}
    magic(ip, "stop --name legacy")
    assert legacy.stopped


def test_a_second_start_says_so_and_replace_replaces(ip):
    magic(ip, "start 1 --backend inprocess")
    first = ip.user_ns["cluster"]
    with pytest.raises(UsageError, match=r"a cluster named 'cluster' is already running .*"
                                         r"%dtf_cluster start 2 --backend inprocess --replace"):
        magic(ip, "start 2 --backend inprocess")
    assert ip.user_ns["cluster"] is first and not first.stopped
    magic(ip, "start 2 --backend inprocess --replace")
    assert first.stopped and ip.user_ns["cluster"] is not first


def test_a_refused_replace_keeps_the_running_cluster(ip):
    magic(ip, "start 1 --backend inprocess")
    first = ip.user_ns["cluster"]
    with pytest.raises(UsageError, match=r"unknown backend 'nope'"):
        magic(ip, "start 2 --backend nope --replace")
    assert not first.stopped and ip.user_ns["cluster"] is first


def test_no_argument_prints_help(ip, capsys):
    magic(ip, "")
    out = capsys.readouterr().out
    assert "start | run | status | stop | kill | restart | spec" in out and "logs | wait" in out
    assert "--backend" in out


@pytest.mark.parametrize("line, message", [
    ("start 3 --ps 1", r"give only one of a task count, ps/workers, jobs or spec"),
    ("start --spec 'ps|localhost:2222", r"close the quotes"),
    ("start --timeout -5", r"timeout must be a positive number of seconds, got -5.0"),
    ("start --name 2nd", r"--name '2nd' is not a Python variable name"),
    ("status", r"no cluster named 'cluster'; start one with %dtf_cluster start 3"),
    ("stop --name other", r"no cluster named 'other'; start one with %dtf_cluster start 3 --name other"),
    ("kill", r"kill needs a task, e.g. %dtf_cluster kill worker:1"),
    ("status --ps 3", r"--ps applies only to start"),
    ("start 3 --bogus", r"unrecognized arguments: --bogus"),
])
def test_more_bad_input_is_one_line_naming_the_value_and_starts_nothing(ip, line, message):
    # The bulk of the bad-input cases, with a check that nothing is left, are in test_bad_input.
    with pytest.raises(UsageError, match=message) as error:
        magic(ip, line)
    assert "\n" not in str(error.value)
    assert "cluster" not in ip.user_ns


def test_kill_unknown_task_and_inprocess_refusal(ip):
    magic(ip, "start 2 --backend inprocess")
    with pytest.raises(UsageError, match=r"unknown task worker:3; this cluster has ps:0, worker:0"):
        magic(ip, "kill worker:3")
    with pytest.raises(UsageError, match=r"cannot kill worker:0 of an inprocess cluster"):
        magic(ip, "kill worker:0")


TRACE_CELL = """
import dtflab
from dtflab.train.examples import exp_regression
built = exp_regression()
with tf.compat.v1.Session(cluster.target("master"), graph=built.graph) as session:
    session.run(built.init)
    losses = [session.run(built.loss, built.feed) for _ in range(2)]
"""


@pytest.fixture
def trace_cluster(ip):
    from dtflab._quiet import import_tf

    magic(ip, "start --jobs master=1,ps=2 --backend inprocess")
    ip.user_ns["tf"] = import_tf()
    yield ip.user_ns["cluster"]
    ip.user_ns.pop("step", None)


def test_dtf_trace_traces_a_run_of_the_cell_and_keeps_its_results(ip, trace_cluster, capsys):
    ip.run_cell_magic("dtf_trace", "--run last --no-show", TRACE_CELL)
    step = ip.user_ns["step"]
    losses = ip.user_ns["losses"]
    assert len(losses) == 2 and losses[0] == losses[1] == step.result
    assert sum(t.nbytes for t in step.transfers) == 2436
    assert "6 transfers, 2,436 bytes between devices" in capsys.readouterr().out


@pytest.mark.parametrize("line, cell, message", [
    ("--run 5 --no-show", TRACE_CELL, r"no Session.run call to trace numbered 5"),
    ("--no-show", "x = 1", r"the cell made no Session.run call to trace"),
    ("--run middle", TRACE_CELL, r"--run must be first, last or a call number such as 2, got 'middle'"),
    ("--max-ops 0", TRACE_CELL, r"--max-ops must be a whole number of at least 1, got '0'"),
])
def test_dtf_trace_bad_input_is_a_one_line_error(ip, trace_cluster, line, cell, message):
    with pytest.raises(UsageError, match=message):
        ip.run_cell_magic("dtf_trace", line, cell)
    assert "step" not in ip.user_ns


def test_dtf_solution_shows_the_code_and_never_runs_it(ip, capsys):
    from dtflab import exercises

    ip.user_ns["answer"] = None
    ip.run_cell("%%dtf_solution\nanswer = 3 * 4 * 609\n")
    assert ip.user_ns["answer"] is None
    assert capsys.readouterr().out == f"{exercises.NOT_APPLIED}\n"
    with pytest.raises(UsageError, match=r"%%dtf_solution takes nothing after it, got '--apply'; to use the "
                                         r"solution, copy its lines into your cell in place of answer = None"):
        ip.run_cell_magic("dtf_solution", "--apply", "answer = 1")
    assert ip.user_ns.pop("answer") is None
