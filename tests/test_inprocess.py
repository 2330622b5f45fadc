"""The inprocess backend. Its servers cannot be stopped: they live until pytest exits."""

import pytest

from dtflab.cluster.task import TaskState
from dtflab.errors import NotSupportedError


def test_starts_in_process_and_serves_a_session(start_cluster):
    from dtflab._quiet import import_tf

    tf = import_tf()
    cluster = start_cluster(jobs="master=1,ps=2", backend="inprocess")
    assert [t.name for t in cluster.tasks] == ["master:0", "ps:0", "ps:1"]
    assert all(t.state is TaskState.RUNNING and t.pid is None for t in cluster.tasks)
    with tf.Graph().as_default():
        with tf.device("/job:ps/task:1"):
            value = tf.constant(7) * 6
        with tf.compat.v1.Session(cluster.target("master")) as session:
            assert session.run(value) == 42


@pytest.mark.parametrize("action", ["kill", "restart"])
def test_kill_and_restart_refuse_and_say_to_use_local(start_cluster, action):
    cluster = start_cluster(2, backend="inprocess")
    with pytest.raises(NotSupportedError, match=rf"cannot {action} worker:0 of an inprocess cluster: "
                                                r".*start the cluster with --backend local"):
        getattr(cluster, action)("worker:0")
    assert all(t.state is TaskState.RUNNING for t in cluster.tasks)


def test_stop_marks_stopped_and_the_panel_says_ports_stay_held(start_cluster):
    cluster = start_cluster(1, backend="inprocess")
    cluster.stop()
    assert cluster.stopped
    assert "keep their ports until the kernel exits" in cluster._repr_html_()
