"""Stop and a dead worker, written once and run for every loop that trains on a cluster's
workers: a background run streams into the dashboard until its Stop button ends it, and a
killed worker ends the run with a TaskError naming it (a one-session loop's session touched it;
a worker-program loop's other workers wait for it in their collective). The asynchronous loops
are the exception by design, tested in ``test_train.py``: their other workers carry on."""

import threading

import pytest

from dtflab import train
from dtflab.errors import TaskError
from dtflab.train.machinery import sessions
from dtflab.viz.dashboard import Dashboard
from dtflab.viz.decimate import LIMIT

from conftest import wait_until

pytestmark = pytest.mark.slow

DEEP = train.classification(width=64, batch_size=256, hidden_layers=3)
SHAPE = dict(blocks=2, d_model=32, heads=2, sequence=16, batch_size=8)

#: Every loop that trains in one session on a cluster with a ps and two workers, as a call.
ONE_SESSION = {
    "sync_data_parallel": lambda c, **o: train.sync_data_parallel(DEEP, c, **o),
    "pipeline": lambda c, **o: train.pipeline(DEEP, c, stages=2, micro_batches=2, **o),
    "tensor_parallel": lambda c, **o: train.tensor_parallel(DEEP, c, ways=2, **o),
    "context_parallel": lambda c, **o: train.context_parallel(train.transformer(**SHAPE), c,
                                                              ways=2, **o),
    "expert_parallel": lambda c, **o: train.expert_parallel(
        train.transformer(**SHAPE, experts=4, top_k=2), c, workers=2, **o),
    "combined": lambda c, **o: train.combined(train.transformer(**SHAPE), c,
                                              train.Layout(data=2), **o),
}
#: The loops whose Stop the dashboard's button gives: the one-session loops and Downpour.
STOPPABLE = {**ONE_SESSION, "async_parameter_server": lambda c, **o: train.async_parameter_server(
    DEEP, c, **o)}
#: Every loop that trains in worker programs, two workers each.
PROGRAMS = {
    "all_reduce": lambda **o: train.all_reduce(DEEP, workers=2, **o),
    "zero": lambda **o: train.zero(DEEP, stage=1, workers=2, **o),
    "sharded_data_parallel": lambda **o: train.sharded_data_parallel(DEEP, workers=2, **o),
}


@pytest.fixture(scope="module")
def cluster():
    import dtflab

    with dtflab.start_cluster(jobs="ps=1,worker=2") as c:
        yield c


def closed_sessions() -> bool:
    """The sessions that touched a dead task close in the background, waiting out TF's
    operation timeout (the run reported its error without waiting): whether they have."""
    return not [t for t in threading.enumerate() if t.name == "dtflab-session-close"]


@pytest.mark.parametrize("loop", STOPPABLE)
def test_a_background_run_streams_to_the_dashboard_until_stop_ends_it(cluster, loop):
    run = STOPPABLE[loop](cluster, steps=100_000, background=True)
    dashboard = Dashboard(run, interval_s=0.1)
    points = lambda: sum(line.points for line in dashboard.loss_lines.values())
    assert wait_until(lambda: points() > 0, timeout=60)
    assert not run.done
    dashboard.stop_button.click()
    history = run.wait(timeout=60)
    dashboard.wait()
    assert history.stopped_early and 0 < history.steps < 100_000
    assert sum(line.records for line in dashboard.loss_lines.values()) == history.steps
    assert all(line.points <= LIMIT for line in dashboard.loss_lines.values())
    if loop == "async_parameter_server":  # the one loop whose updates can be stale
        assert sum(dashboard.stale_source.data["count"]) == history.steps
    assert "steps in" in dashboard.status.value and dashboard.stop_button.disabled


@pytest.mark.parametrize("loop", ONE_SESSION)
def test_a_dead_worker_ends_a_one_session_run_naming_it(start_cluster, monkeypatch, loop):
    # A step waiting on the dead task, and the session closed after it, wait out TensorFlow's
    # operation timeout: 3 s here, not 10 (a step of these models takes under 0.1 s).
    monkeypatch.setattr(sessions, "OPERATION_TIMEOUT_MS", 3_000)
    cluster = start_cluster(jobs="ps=1,worker=2")  # its own: a task gets killed
    run = ONE_SESSION[loop](cluster, steps=100_000, background=True, watchdog=False)
    assert wait_until(lambda: run.history.steps >= 2, timeout=60)
    cluster.kill("worker", 1)
    with pytest.raises(TaskError, match="worker:1"):
        run.wait(timeout=60)
    assert run.done and run.history.failures
    assert wait_until(closed_sessions, timeout=sessions.OPERATION_TIMEOUT_MS / 1000 + 5)


@pytest.mark.parametrize("loop", PROGRAMS)
def test_stop_ends_every_worker_program_at_the_same_step_and_every_step_is_drawn(loop):
    run = PROGRAMS[loop](steps=100_000, background=True)
    dashboard = Dashboard(run, interval_s=0.1)
    assert wait_until(lambda: run.history.steps >= 10, timeout=60)
    assert not run.done  # records arrive while the programs run
    dashboard.stop()
    history = run.wait(timeout=60)
    dashboard.wait()
    assert history.stopped_early and not history.failures
    counts = history.steps_per_worker
    assert counts["worker:0"] == counts["worker:1"] < 100_000
    assert counts["worker:0"] % 10 == 0  # the workers agree on Stop every check_every=10 steps
    assert {key[1]: line.records for key, line in dashboard.loss_lines.items()} == counts
    assert history.cluster.stopped


@pytest.mark.parametrize("loop", PROGRAMS)
def test_a_killed_worker_program_stops_the_whole_job_naming_it(loop):
    run = PROGRAMS[loop](steps=100_000, slow={"worker:0": 0.01}, background=True)
    assert wait_until(lambda: run.history.steps >= 10, timeout=60)
    run.history.cluster.kill("worker", 1)
    with pytest.raises(TaskError, match=r"worker:1 was killed during step \d+; every other "
                                        r"worker waits for it in the "):
        run.wait(timeout=60)
    assert run.history.failures and "worker:1 was killed" in run.history.failures[0]
    assert run.history.cluster.stopped  # worker:0, stuck in its collective, was stopped too
