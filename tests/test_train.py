"""Training loops on a real local cluster: correctness, stragglers, dead workers (the dashboard
and Stop for every loop: ``test_every_loop.py``)."""

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import dtflab
from dtflab import train
from dtflab.errors import TaskError
from dtflab.train.machinery import sessions

from conftest import wait_until

pytestmark = pytest.mark.slow

PROBLEM = train.exp_regression()
#: single vs sync data parallel, same seed and global batch: float rounding only.
SYNC_TOLERANCE = 1e-5
#: async Downpour on exp(x) from a loss of ~1.37 per example.
ASYNC_BELOW = 0.02


@pytest.fixture(scope="module")
def cluster():
    with dtflab.start_cluster(jobs="ps=2,worker=2") as c:
        yield c


@pytest.fixture(scope="module")
def single_run():
    return train.single(PROBLEM, steps=200, seed=3)


def test_single_and_sync_data_parallel_agree_step_by_step(cluster, single_run):
    sync = train.sync_data_parallel(PROBLEM, cluster, steps=200, seed=3)
    assert sync.steps == single_run.steps == 200
    diff = np.max(np.abs(np.array(single_run.losses) - np.array(sync.losses)))
    assert diff <= SYNC_TOLERANCE
    assert single_run.losses[-1] < single_run.losses[0] / 10  # and it does learn


def test_model_parallel_equals_single(cluster, single_run):
    parallel = train.model_parallel(PROBLEM, cluster, steps=200, seed=3)
    diff = np.max(np.abs(np.array(single_run.losses) - np.array(parallel.losses)))
    assert diff <= SYNC_TOLERANCE


def test_async_converges_and_measures_staleness(cluster):
    history = train.async_parameter_server(PROBLEM, cluster, steps=300, seed=3)
    assert history.steps_per_worker == {"worker:0": 300, "worker:1": 300}
    assert history.final_loss() < ASYNC_BELOW < history.losses[0]
    assert sorted(r.step for r in history.records) == list(range(600))  # every update counted once
    assert all(s >= 0 for s in history.staleness) and max(history.staleness) >= 1


def test_a_straggler_holds_back_every_sync_step_but_only_itself_in_async(cluster):
    delay = 0.05
    sync = train.sync_data_parallel(PROBLEM, cluster, steps=30, slow={"worker:1": delay})
    assert sync.wall_s >= 30 * delay  # each step waited for worker:1
    history = train.async_parameter_server(PROBLEM, cluster, steps=40, slow={"worker:1": delay})
    order = [r.worker for r in sorted(history.records, key=lambda r: r.time_s)]
    slow_steps_when_fast_done = order[:order.index("worker:0") + 1 + len(
        [w for w in order if w == "worker:0"]) - 1].count("worker:1")
    assert history.steps_per_worker == {"worker:0": 40, "worker:1": 40}
    # in step with the slow one it would end beside it; it ended ahead (its 40 steps at the
    # 50 ms a slow one sleeps would take 2 s)
    assert slow_steps_when_fast_done < 40, "the fast worker should not wait for the slow one"


def test_an_async_workers_first_update_slower_than_the_operation_timeout_is_not_a_failure(
        cluster, monkeypatch):
    # A session's first update places the graph on its tasks: it has the watchdog's
    # first_step_s, as a synchronous loop's first step has. Here the timeout is 1 s and
    # worker:1's updates sleep 1.5 s: the first is kept, the second ends that worker alone.
    monkeypatch.setattr(sessions, "OPERATION_TIMEOUT_MS", 1000)
    history = train.async_parameter_server(PROBLEM, cluster, steps=2, slow={"worker:1": 1.5},
                                           watchdog=False)
    assert history.steps_per_worker == {"worker:0": 2, "worker:1": 1}
    [failure] = history.failures
    assert failure.startswith("worker:1 stopped: ") and "DeadlineExceededError" in failure


def test_a_killed_worker_ends_a_sync_run_with_its_name_and_async_carries_on(start_cluster):
    cluster = start_cluster(jobs="ps=1,worker=2")  # its own: tasks get killed and restarted
    run = train.sync_data_parallel(PROBLEM, cluster, steps=100_000, background=True)
    assert wait_until(lambda: run.history.steps >= 20, timeout=60)
    cluster.kill("worker:1")
    with pytest.raises(TaskError, match=r"worker:1 failed during step \d+; the synchronous run stopped"):
        run.wait(timeout=60)
    assert run.done and run.history.failures[0].startswith("worker:1 failed")
    cluster.restart("worker:1")

    run = train.async_parameter_server(PROBLEM, cluster, steps=400, background=True)
    assert wait_until(lambda: run.history.steps_per_worker.get("worker:1", 0) >= 10, timeout=60)
    cluster.kill("worker:1")
    history = run.wait(timeout=120)
    assert history.steps_per_worker["worker:0"] == 400
    assert history.steps_per_worker["worker:1"] < 400
    assert len(history.failures) == 1
    assert history.failures[0].startswith("worker:1 stopped: worker:1 failed (")
    assert history.failures[0].endswith("the other workers carried on")
    # Sessions that touched the dead task close in the background, which waits out TF's
    # operation timeout; the run reported its error without waiting. Those threads end:
    closers = lambda: [t for t in threading.enumerate() if t.name == "dtflab-session-close"]
    assert wait_until(lambda: not closers(), timeout=sessions.OPERATION_TIMEOUT_MS / 1000 + 5)


@pytest.mark.parametrize("kill_after", [65, 74])  # two points between checkpoints
def test_a_ps_killed_during_async_training_is_restored_and_costs_at_most_k_updates(
        start_cluster, tmp_path, kill_after):
    K = 20
    # Spawned: its restart takes seconds (a fresh import of TensorFlow), so every update
    # acknowledged before the kill is recorded before the first one after the restore. A
    # forked ps is back within 0.3 s, inside the wait below.
    cluster = start_cluster(ps=1, workers=2, start_method="spawn")
    run = train.async_parameter_server(PROBLEM, cluster, steps=150, seed=1, checkpoint_every=K,
                                       checkpoint_dir=str(tmp_path), background=True)
    assert wait_until(lambda: max((r.step for r in run.history.since(0)), default=0) >= kill_after,
                      timeout=120, interval=0.005), run.history.summary()
    cluster.kill("ps", 0)
    # Updates acknowledged before the kill are recorded within moments; none can succeed
    # again until the ps is restarted, which takes seconds.
    time.sleep(1.0)
    before = run.history.since(0)
    reached = max(r.step for r in before) + 1  # updates acknowledged before the ps died
    history = run.wait(timeout=180)
    assert not history.failures, history.failures
    seen = {id(r) for r in before}
    after = [r for r in history.records if id(r) not in seen]
    resumed = min(r.step for r in after)  # the first update after the restore is resumed + 1
    lost = reached - resumed
    assert 0 <= lost <= K, (reached, resumed)
    assert len(history.recoveries) == 1, history.summary()
    recovery = history.recoveries[0]
    assert (recovery.task, recovery.failed_at, recovery.resumed_from) == ("ps:0", reached, resumed)
    assert recovery.lost == lost
    assert len(list(tmp_path.glob("model-*.index"))) >= 1
    # Every worker made all its updates, and training still converged after the restore.
    assert history.steps_per_worker == {"worker:0": 150, "worker:1": 150}
    assert history.final_loss() < ASYNC_BELOW
    assert str(cluster.tasks[0].state) == "running"


def test_compare_gives_ratios_against_the_first_run(cluster, single_run):
    sync = train.sync_data_parallel(PROBLEM, cluster, steps=200, seed=3, name="sync")
    comparison = dtflab.compare(single_run, sync)
    first, second = comparison.rows
    assert first["time_ratio"] == 1.0 and first["max_abs_loss_diff"] == 0.0
    assert second["max_abs_loss_diff"] <= SYNC_TOLERANCE
    assert second["time_ratio"] == pytest.approx(sync.wall_s / single_run.wall_s)
    fig = comparison.figure()
    assert len(fig.select(name="run0")) == len(fig.select(name="run1")) == 1
    assert "<table" in comparison._repr_html_() and "sync" in comparison._repr_html_()


PS_STRATEGY = """
import dtflab
from dtflab import train
with dtflab.start_cluster(ps=1, workers=2) as cluster:
    history = train.ps_strategy(train.exp_regression(), cluster, steps=300)
    print(history.steps, history.losses[0], history.final_loss())
"""


def test_parameter_server_strategy_trains_on_a_dtflab_cluster():
    # The coordinator changes TensorFlow's process-wide context: a process of its own.
    out = subprocess.run([sys.executable, "-c", PS_STRATEGY], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    steps, first, last = out.stdout.split()[-3:]
    assert int(steps) == 300 and float(last) < float(first) / 10


@pytest.mark.parametrize("problem", [PROBLEM, train.classification(width=8, batch_size=1536)],
                         ids=["exp", "classification"])
def test_a_workers_slice_of_a_batch_is_made_alone_and_the_slices_make_the_batch(problem):
    x, t = problem.batch(7, seed=3)
    assert len(x) == len(t) == problem.batch_size
    for parts in (p for p in (2, 3, 4) if problem.batch_size % p == 0):
        slices = [problem.batch(7, seed=3, part=(i, parts)) for i in range(parts)]
        assert [len(s[0]) for s in slices] == [problem.batch_size // parts] * parts
        assert np.array_equal(np.concatenate([s[0] for s in slices]), x)
        assert np.array_equal(np.concatenate([s[1] for s in slices]), t)
    assert not np.array_equal(problem.batch(8, seed=3)[0], x)  # another step, other examples
