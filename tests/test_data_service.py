"""The tf.data service as tasks of the cluster: started beside the task servers, kept out of the
TensorFlow cluster, read by the loops, counted per processing mode with a data worker killed,
and the input's wait measured per step."""

import pytest

import dtflab
from dtflab import train
from dtflab.cluster.task import TaskState

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served():
    """A ps and a worker task, a dispatcher and two data workers (the local backend)."""
    with dtflab.start_cluster(2, data_workers=2) as cluster:
        yield cluster


def test_the_data_service_is_tasks_of_the_cluster_but_not_of_tensorflows(served):
    states = served.states()
    assert list(states) == ["ps:0", "worker:0", "dispatcher:0", "data_worker:0", "data_worker:1"]
    assert set(states.values()) == {TaskState.RUNNING}
    assert list(served.addresses) == ["ps", "worker"]  # the ClusterSpec and TF_CONFIG: no dispatcher
    assert "dispatcher" not in served.legacy_spec
    assert served.data_service == f"grpc://{served.task_addresses['dispatcher'][0]}"
    import tensorflow as tf

    made = tf.data.Dataset.range(10).apply(tf.data.experimental.service.distribute(
        "parallel_epochs", served.data_service))
    assert sorted(int(i) for i in made) == sorted(list(range(10)) * 2)  # one epoch per worker


def test_each_element_reaches_one_reader_once_or_once_per_data_worker(served):
    whole = train.visits(served, mode="distributed_epoch", elements=200, work_ms=0.5)
    assert whole.times_seen == {1: 200}
    assert all(n > 0 for n, _ in whole.per_reader().values())  # both readers were served
    every_worker = train.visits(served, mode="parallel_epochs", elements=100, work_ms=0.5)
    assert every_worker.times_seen == {2: 100}


def test_a_data_worker_restarted_mid_epoch_loses_only_what_it_held(start_cluster):
    cluster = start_cluster(1, data_workers=2)
    faulted = train.visits(cluster, mode="distributed_epoch", elements=300, work_ms=1.0,
                           kill="data_worker:1", kill_after=0.3)
    assert faulted.killed_after < 300 and faulted.restarted and faulted.waiting == []
    assert set(faulted.times_seen) <= {0, 1}  # at most once: some lost, none twice
    assert cluster.states()["data_worker:1"] is TaskState.RUNNING


def test_a_loop_reads_the_service_and_its_wait_for_input_is_measured(served):
    """Each step's wait for its batch is timed and its share said, by the dashboard and the
    summary. How large the share is beside batches fed ready, here and from the service, is
    ``benchmarks/data_service.py``'s figure (``input_wait_share``): a ratio of times that a
    loaded machine moves."""
    problem = train.classification(width=64, batch_size=64, features=16)
    slow = train.input_pipeline(problem, work_ms=4.0)
    assert slow.work_s > 0  # an example's cost, measured: set again until it is near 4 ms
    running = train.single(problem, cluster=served, device="/job:worker/task:0", steps=8,
                           inputs=slow, background=True)
    board = dtflab.Dashboard(running)
    board.wait()
    here = running.history
    assert "of the time waiting for input" in board.status.value  # the dashboard says it
    waits = [r.input_wait_s for r in here.step_records[1:]]  # after the first, which places the graph
    assert len(waits) == 7 and all(w is not None and w >= 0 for w in waits)
    assert 0 < here.input_wait_share() <= 1
    assert f"{here.input_wait_share():.0%} of the time waiting for input" in here.summary()
    fast = train.single(problem, cluster=served, device="/job:worker/task:0", steps=8)
    assert "waiting for input" not in fast.summary()  # no input pipeline, nothing said
    remote = train.single(problem, cluster=served, device="/job:worker/task:0", steps=8,
                          inputs=slow.served_by(served))
    assert remote.losses[-1] < remote.losses[0]
    assert 0 < remote.input_wait_share() <= 1 and "waiting for input" in remote.summary()
    sync = train.sync_data_parallel(problem, served, workers=1, steps=4,
                                    inputs=slow.served_by(served))
    assert len(sync.losses) == 4 and sync.input_wait_share() > 0
    downpour = train.async_parameter_server(problem, served, steps=4, inputs=slow)
    assert len(downpour.losses) == 4 and 0 < downpour.input_wait_share() <= 1


def test_all_reduce_workers_read_their_shares_from_one_service_job(served):
    problem = train.classification(width=64, batch_size=64, features=16)
    served_input = train.input_pipeline(problem, work_ms=1.0, service=served)
    history = train.all_reduce(problem, workers=2, steps=6, inputs=served_input, check_every=3)
    assert len(history.losses) == 6 and history.losses[-1] < history.losses[0]
    waits = [r.input_wait_s for r in history.records]
    assert len(waits) == 12 and all(w is not None and w >= 0 for w in waits)
    assert history.input_wait_share() > 0 and "waiting for input" in history.summary()


def test_a_program_task_finds_the_service_beside_tf_config(served):
    from dtflab.cluster.programs import Program

    served.programs["worker"] = Program.checked(__file__, [], None)
    try:
        command = served._task_command("worker", 0)
    finally:
        del served.programs["worker"]
    assert command.env["DTFLAB_DATA_SERVICE"] == served.data_service
    assert "dispatcher" not in command.env["TF_CONFIG"]


def test_the_dask_backend_hosts_the_data_service(start_cluster):
    cluster = start_cluster(1, backend="dask", data_workers=1)
    assert [t.name for t in cluster.tasks] == ["worker:0", "dispatcher:0", "data_worker:0"]
    import tensorflow as tf

    made = tf.data.Dataset.range(6).apply(tf.data.experimental.service.distribute(
        "distributed_epoch", cluster.data_service))
    assert sorted(int(i) for i in made) == list(range(6))


def test_the_magic_starts_a_data_service_and_kills_and_restarts_a_data_worker(ip):
    ip.run_line_magic("dtf_cluster", "start 1 --data-workers 1")
    cluster = ip.user_ns["cluster"]
    assert cluster.data_service is not None
    ip.run_line_magic("dtf_cluster", "kill data_worker:0")
    assert cluster.states()["data_worker:0"] is TaskState.KILLED
    ip.run_line_magic("dtf_cluster", "restart data_worker:0")
    assert cluster.states()["data_worker:0"] is TaskState.RUNNING
    ip.run_line_magic("dtf_cluster", "stop")


@pytest.mark.parametrize("call, message", [
    (lambda c: train.input_pipeline(train.exp_regression(), mode="distributed_epochs"),
     "unknown mode 'distributed_epochs' (did you mean 'distributed_epoch'?); choose one of"),
    (lambda c: train.input_pipeline(train.exp_regression(), work_ms=-1),
     "work_ms must be milliseconds of work an example, 0 to 1000, got -1"),
    (lambda c: train.visits(c, mode="DATA"),
     "static sharding (mode 'DATA') needs a dispatcher that knows its data workers"),
    (lambda c: train.visits(c, kill="worker:0"), "kill names 'worker:0'; name a data worker"),
])
def test_bad_input_pipelines_say_what_and_how(served, call, message):
    with pytest.raises(ValueError) as error:
        call(served)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=2, data_workers=1, backend="inprocess"),
     "the inprocess backend cannot hold a data service (data_workers=1)"),
    (dict(jobs="worker=1,dispatcher=1"), "job name 'dispatcher' is kept for the tf.data service"),
    (dict(n=2, data_workers=-1), "data_workers"),
])
def test_bad_data_service_requests_start_nothing(kwargs, message):
    with pytest.raises(ValueError) as error:
        dtflab.start_cluster(**kwargs)
    assert message in str(error.value)


def test_a_service_asked_of_a_cluster_without_one_says_how_to_start_it(start_cluster):
    bare = start_cluster(1)
    with pytest.raises(ValueError, match=r"has no data service; start one with data_workers=N"):
        train.input_pipeline(train.exp_regression(), service=bare)
