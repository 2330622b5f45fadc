"""The persistent workers' magics through a real IPython shell: started, run on, pulled from and
stopped by the magics, or started from Python and still the ones the magics see. Apart from
test_workers, whose module's workers run while its tests do."""

import psutil
import pytest

from conftest import free, holders

pytestmark = pytest.mark.slow


def test_the_magics_start_run_pull_and_stop_workers_in_a_real_shell(ip, capsys):
    from IPython.core.error import UsageError

    from dtflab import tf_private

    # TensorFlow at work in the kernel first (its eager context made): the workers start from
    # the fork server, a process of their own, and are not touched by it
    ip.run_cell("import tensorflow as tf\nkernel_sum = float(tf.constant(1.0) + 1)")
    assert ip.user_ns["kernel_sum"] == 2.0 and tf_private.eager_context_created()

    with pytest.raises(UsageError, match=r"'two': %dtf_workers start takes a number of workers"):
        ip.run_line_magic("dtf_workers", "start two")
    assert "workers" not in ip.user_ns  # nothing started
    ip.run_line_magic("dtf_workers", "start 2")
    try:
        workers = ip.user_ns["workers"]
        ip.run_cell_magic("dtf_px", "", "import os, json\n"
                         "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
                         "print('index', index)")
        out = capsys.readouterr().out
        assert "[worker:0] index 0" in out and "[worker:1] index 1" in out
        ip.run_line_magic("dtf_workers", "status")
        assert capsys.readouterr().out == "worker:0: running\nworker:1: running\n"
        ip.run_cell_magic("dtf_px", "worker:1", "index = index + 100")
        assert ip.run_line_magic("dtf_pull", "index worker:1") == 101
        assert ip.run_line_magic("dtf_pull", "index") == {"worker:0": 0, "worker:1": 101}
        ip.run_line_magic("dtf_autopx", "")
        ip.run_cell("doubled = index * 2")
        ip.run_cell("%dtf_autopx")
        assert "doubled" not in ip.user_ns
        assert ip.run_line_magic("dtf_pull", "doubled") == {"worker:0": 0, "worker:1": 202}
        for line, said_ in (("start 2", "running already"), ("launch", "unknown command"),
                            ("restart", "restart which worker")):
            with pytest.raises(UsageError, match=said_):
                ip.run_line_magic("dtf_workers", line)
        with pytest.raises(UsageError, match="no worker 'worker:5'"):
            ip.run_cell_magic("dtf_px", "worker:5", "pass")
        with pytest.raises(UsageError, match=r"^'missing' cannot be read on worker:1 \(NameError: "
                                             r"name 'missing' is not defined\); run the cell that "
                                             r"makes it there first, e.g. %%dtf_px worker:1$"):
            ip.run_line_magic("dtf_pull", "missing worker:1")
        ports = list(workers.controller.ports)
        controller = psutil.Process(workers.controller.process.pid)
        pids = ([info.pid for info in workers.cluster.tasks] + [controller.pid]
                + [child.pid for child in controller.children()])  # and its heartbeat monitor
    finally:
        ip.run_line_magic("dtf_workers", "stop")
    assert "workers" not in ip.user_ns
    assert not [pid for pid in pids if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert free(ports) == ports, holders(set(ports) - set(free(ports)))  # no port held
    with pytest.raises(UsageError, match="no persistent workers are running"):
        ip.run_cell_magic("dtf_px", "", "pass")


def test_the_magics_act_on_workers_started_from_python_and_forget_those_stopped(ip, capsys):
    from IPython.core.error import UsageError

    ip.run_cell("import dtflab\nmine = dtflab.start_workers(1)")
    mine = ip.user_ns["mine"]
    try:
        ip.run_cell_magic("dtf_px", "", "print('on', 40 + 2)")
        assert "[worker:0] on 42" in capsys.readouterr().out
        ip.run_line_magic("dtf_workers", "status")
        assert capsys.readouterr().out == "worker:0: running\n"
    finally:
        mine.stop()  # stopped from Python: the magics see no workers
    with pytest.raises(UsageError, match="no persistent workers are running"):
        ip.run_cell_magic("dtf_px", "", "pass")
