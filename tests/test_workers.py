"""Persistent workers: real ipyparallel engines as a local cluster's program tasks, each with its
TF_CONFIG, driven cell by cell; TensorFlow's own multi-worker programs built up on them and
matched against the same program run from a file; the controller's stop."""

import _thread
import contextlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

import dtflab
from dtflab.cluster import execution

from conftest import free, holders

pytestmark = pytest.mark.slow

PROGRAMS = Path(__file__).parent / "programs"
TUTORIALS = PROGRAMS / "tf_tutorials"


@pytest.fixture(scope="module")
def workers():
    with dtflab.start_workers(2, cwd=str(TUTORIALS)) as started:
        yield started


def cells_of(path: Path) -> list[str]:
    """A program as notebook cells, its lines unchanged (see :func:`cells_in`)."""
    return cells_in(path.read_text())


def cells_in(text: str) -> list[str]:
    """Python source as notebook cells, its lines unchanged: a new cell at each blank line
    before a top-level statement; cells of comments only are left out."""
    lines, cells, cell = text.splitlines(), [], []
    for at, line in enumerate(lines):
        following = next((later for later in lines[at + 1:] if later.strip()), "")
        if not line.strip() and cell and not following.startswith((" ", "\t")):
            cells.append(cell)
            cell = []
        elif line.strip() or cell:
            cell.append(line)
    return ["\n".join(cell) for cell in cells + [cell]
            if any(line.strip() and not line.lstrip().startswith("#") for line in cell)]


def collected():
    """A list, and what appends to it: a run's ``show``."""
    lines = []
    return lines, lines.append


def plain(lines) -> str:
    """What was shown, without the terminal colours of IPython's tracebacks."""
    return re.sub(r"\x1b\[[0-9;]*m", "", "".join(lines))


def test_each_worker_keeps_its_variables_and_has_its_own_task(workers):
    assert workers.tasks == ["worker:0", "worker:1"]
    lines, show = collected()
    run = workers.run("import json, os\nmine = json.loads(os.environ['TF_CONFIG'])['task']\n"
                      "print('I am', mine['type'], mine['index'])\nmine['index'] * 10", show=show)
    assert run.states == {"worker:0": "done", "worker:1": "done"}
    assert "[worker:0] I am worker 0\n" in lines and "[worker:1] I am worker 1\n" in lines
    assert run.results == {"worker:0": "0", "worker:1": "10"}
    # the next call finds them, on the workers named
    assert workers.pull("mine['index']") == {"worker:0": 0, "worker:1": 1}
    workers.push({"offset": 5}, "worker:1")
    assert workers.pull("mine['index'] + offset", "worker:1") == {"worker:1": 6}
    with pytest.raises(ValueError, match=r"no worker 'worker:7'.*worker:0, worker:1"):
        workers.targets("worker:0,7")


def test_output_comes_while_the_cell_runs_labelled_by_worker(workers):
    seen = []
    run = workers.run("import time\nfor i in range(3):\n    print('tick', i, flush=True)\n"
                      "    time.sleep(0.6)", show=lambda text: seen.append((time.monotonic(), text)))
    ended = time.monotonic()
    ticks = [(at, text) for at, text in seen if "tick 0" in text]
    assert {"[worker:0] tick 0\n", "[worker:1] tick 0\n"} <= {text for _, text in seen}
    assert all(ended - at > 0.6 for at, _ in ticks), (ended, seen)  # shown before the end
    assert run.outputs["worker:1"] == "tick 0\ntick 1\ntick 2\n"


def test_a_workers_display_output_reaches_the_kernel_labelled(workers):
    lines, show = collected()
    shown = []
    run = workers.run("from IPython.display import HTML, display\n"
                      "display(HTML(f\"<b>from {mine['index']}</b>\"))", "worker:1", show=show,
                      display=shown.append)
    assert run.states == {"worker:1": "done"}
    assert lines == ["[worker:1] shows:\n"]
    assert [bundle["data"]["text/html"] for bundle in shown] == ["<b>from 1</b>"]


def test_an_error_is_shown_once_with_every_worker_that_raised_it(workers):
    lines, show = collected()
    run = workers.run("1 / 0", show=show)
    assert run.errors == {"worker:0": "ZeroDivisionError: division by zero",
                          "worker:1": "ZeroDivisionError: division by zero"}
    text = plain(lines)
    assert text.count("ZeroDivisionError: division by zero") == 1, text
    assert "[worker:0, worker:1]\n" in text
    # a syntax error is the kernel's to say, once: nothing reaches the workers
    with pytest.raises(SyntaxError):
        workers.run("def broken(:\n    pass")


def test_a_worker_left_waiting_by_a_failed_one_is_named_and_released(workers, monkeypatch):
    monkeypatch.setattr(execution, "GRACE_S", 2.0)
    lines, show = collected()
    # worker:1 sleeps for ever: that run() returns at all is its release
    run = workers.run("import json, os, time\n"
                      "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 0:\n"
                      "    raise ValueError('bad on 0')\nwhile True:\n    time.sleep(0.05)", show=show)
    assert run.states == {"worker:0": "error", "worker:1": "waiting"}
    text = plain(lines)
    assert "worker:0 failed 2 s ago; worker:1 still running" in text
    assert "ValueError: bad on 0" in text and "meanwhile: worker:1 waiting" in text
    assert workers.pull("1 + 1") == {"worker:0": 2, "worker:1": 2}  # both serve on


def test_a_worker_waiting_in_a_collective_for_a_failed_peer_is_released(monkeypatch):
    # worker:0 fails before an all-reduce that worker:1 enters: TensorFlow's C++ waits for it
    # and no KeyboardInterrupt reaches Python there; its collectives are aborted, and it says so
    monkeypatch.setattr(execution, "GRACE_S", 2.0)
    with dtflab.start_workers(2) as pair:
        pair.run("import tensorflow as tf\n"
                 "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
                 "task = strategy.cluster_resolver.task_id")
        lines, show = collected()
        run = pair.run("@tf.function\ndef summed():\n"
                       "    return tf.distribute.get_replica_context().all_reduce('sum', 1.0)\n"
                       "if task == 0:\n    raise ValueError('worker 0 fails first')\n"
                       "strategy.run(summed)", show=show)  # returns once worker:1 is released
        assert run.states == {"worker:0": "error", "worker:1": "released"}, plain(lines)
        assert ("worker:1 waits inside TensorFlow, in a collective for worker:0: released"
                in plain(lines))
        assert "ValueError: worker 0 fails first" in plain(lines)
        assert pair.pull("task", "worker:1") == {"worker:1": 1}  # it serves again


def test_the_kernels_interrupt_reaches_every_worker_and_keeps_their_variables(workers):
    lines, show = collected()
    threading.Timer(2.0, _thread.interrupt_main).start()
    run = workers.run("import time\nkept = 'still here'\nwhile True:\n    time.sleep(0.05)",
                      show=show)  # returns only once the interrupt reached both
    assert run.states == {"worker:0": "interrupted", "worker:1": "interrupted"}
    assert "interrupted worker:0, worker:1" in plain(lines)
    assert workers.pull("kept") == {"worker:0": "still here", "worker:1": "still here"}


def test_a_worker_that_dies_is_named_and_restarts_without_its_variables():
    lines, show = collected()
    with dtflab.start_workers(1) as alone:  # its own: the restarted process ends with the test
        alone.run("import os\nimport tensorflow as tf\nbefore = int(tf.constant(1))")
        run = alone.run("os.write(2, b'last words\\n')\nos._exit(3)", show=show)
        assert run.states == {"worker:0": "died"}
        assert "worker:0 died: exit code 3, its last lines:\n" in plain(lines)
        assert "last words" in plain(lines)
        assert "cuInit" not in plain(lines), plain(lines)  # TensorFlow's start-up, not the death
        assert "workers.restart('worker:0')" in plain(lines)
        alone.restart("worker:0")
        assert alone.pull("1 + 1") == {"worker:0": 2}
        with pytest.raises(Exception, match="name 'before' is not defined"):
            alone.pull("before")


def test_tensorflows_custom_loop_cell_by_cell_trains_as_the_program_does(workers, run_programs):
    # tests/programs/mwms_custom_loop.py (MultiWorkerMirroredStrategy, a custom loop, as
    # TensorFlow's tutorial) run from its file, then sent cell by cell, its lines unchanged
    program = PROGRAMS / "mwms_custom_loop.py"
    from_file = run_programs(program, "4", workers=2, timeout=120)
    assert from_file.wait(timeout=240) == {"worker:0": 0, "worker:1": 0}
    losses = {task: re.findall(r"step \d loss (\S+)", from_file.logs(task))
              for task in ("worker:0", "worker:1")}
    assert len(losses["worker:0"]) == 4

    workers.push({"sys_argv": ["mwms_custom_loop.py", "4"]})
    workers.run("import sys\nsys.argv = sys_argv")
    cells = cells_of(program)
    assert len(cells) >= 4
    lines, show = collected()
    for cell in cells:
        run = workers.run(cell, show=show)
        assert set(run.states.values()) == {"done"}, (cell, plain(lines))
    # the strategy built in the first cells is still there: one replica a worker
    assert workers.pull("strategy.num_replicas_in_sync") == {"worker:0": 2, "worker:1": 2}
    for task in ("worker:0", "worker:1"):
        cell_losses = re.findall(rf"\[{task}\] step \d loss (\S+)", plain(lines))
        assert cell_losses == losses[task]


def epoch_losses(text: str) -> list[str]:
    """The loss Keras printed at the end of each epoch (the last ``loss:`` before the next)."""
    return [re.findall(r"loss: (\d+\.\d+)", epoch)[-1] for epoch in text.split("Epoch ")[1:]]


def test_tensorflows_keras_tutorial_fits_cell_by_cell_as_its_file_does(run_programs, tmp_path):
    # TensorFlow's "Multi-worker training with Keras" (main.py and mnist_setup.py, fewer epochs
    # and steps), from its file and then cell by cell, each after the same seed: same losses
    shutil.copy(TUTORIALS / "mnist_setup.py", tmp_path)
    main = (TUTORIALS / "main.py").read_text()
    (tmp_path / "main.py").write_text(main.replace("epochs=3, steps_per_epoch=70",
                                                   "epochs=2, steps_per_epoch=8"))
    seed = "import tensorflow as tf\ntf.keras.utils.set_random_seed(1)\n"
    (tmp_path / "seeded.py").write_text(seed + "import runpy\nrunpy.run_path('main.py', "
                                               "run_name='__main__')\n")
    from_file = run_programs("seeded.py", workers=2, cwd=str(tmp_path), timeout=120)
    assert from_file.wait(timeout=240) == {"worker:0": 0, "worker:1": 0}
    with dtflab.start_workers(2, cwd=str(tmp_path)) as workers:
        workers.run(seed)
        lines, show = collected()
        for cell in cells_of(tmp_path / "main.py"):
            run = workers.run(cell, show=show)
            assert set(run.states.values()) == {"done"}, (cell, plain(lines)[-2000:])
        assert workers.pull("num_workers") == {"worker:0": 2, "worker:1": 2}
    for task in ("worker:0", "worker:1"):
        mine = "".join(line[len(f"[{task}] "):] for line in plain(lines).splitlines(True)
                       if line.startswith(f"[{task}] "))
        assert re.search(r"^Epoch 2/2", mine, re.M), mine  # each worker's progress, labelled
        assert epoch_losses(mine) == epoch_losses(from_file.logs(task)), (mine, task)
        assert len(epoch_losses(mine)) == 2


def main_as_cells(path: Path) -> list[str]:
    """A program whose work is in ``main()``, as cells: its module's top (imports, helpers)
    in one, then ``main``'s body, dedented, split as :func:`cells_of` splits a program."""
    source = path.read_text()
    top, _, rest = source.partition("\ndef main():\n")
    body = textwrap.dedent(rest.partition('\nif __name__ == "__main__":')[0])
    return [top, *cells_in(body)]


def test_a_dtensor_program_cell_by_cell_trains_as_its_file_does(run_programs):
    # tests/programs/dtensor_mlp.py, a multi-client DTensor program: from its file on two
    # clients, then as cells on two persistent workers (each a DTensor client by its variables)
    program = PROGRAMS / "dtensor_mlp.py"
    args = ["--num_local_devices=2", "--steps=4"]
    from_file = run_programs(program, *args, workers=2, timeout=120)
    assert from_file.wait(timeout=240) == {"worker:0": 0, "worker:1": 0}
    losses = {task: re.findall(r"step \d loss (\S+)", from_file.logs(task))
              for task in ("worker:0", "worker:1")}
    assert len(losses["worker:0"]) == 4
    with dtflab.start_workers(2) as clients:
        clients.push({"sys_argv": [program.name, *args]})
        clients.run("import sys\nsys.argv = sys_argv")
        lines, show = collected()
        # where a client could not bind its port: who held it
        ports = {int(a.rsplit(":", 1)[1]) for a in clients.cluster.task_addresses.get("worker", [])}
        for cell in main_as_cells(program):
            run = clients.run(cell, show=show)
            assert set(run.states.values()) == {"done"}, (cell, plain(lines)[-2000:], holders(ports))
        assert clients.pull("dtensor.client_id()") == {"worker:0": 0, "worker:1": 1}
    for task in ("worker:0", "worker:1"):
        assert re.findall(rf"\[{task}\] step \d loss (\S+)", plain(lines)) == losses[task]


@contextlib.contextmanager
def busy_loops(count: int):
    """``count`` processes that spin while the block runs."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


FREEZER = Path("/sys/fs/cgroup/freezer")  # cgroup v1's: a frozen process cannot end, even killed


@contextlib.contextmanager
def frozen(pid: int):
    """``pid`` frozen while the block runs (as a process the machine gives no CPU), where this
    machine has cgroup v1's freezer; else ``pid`` is left running, beside four busy loops."""
    if not os.access(FREEZER, os.W_OK):
        with busy_loops(4):
            yield False
        return
    group = FREEZER / f"dtflab-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(pid))
        (group / "freezer.state").write_text("FROZEN")
        yield True
    finally:
        (group / "freezer.state").write_text("THAWED")
        deadline = time.monotonic() + 30
        while True:  # empty once the process ends or leaves
            try:
                for left in (group / "cgroup.procs").read_text().split():
                    (FREEZER / "cgroup.procs").write_text(left)
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_the_controller_ends_with_its_forked_monitor_which_holds_its_ports():
    from dtflab.cluster.persistent_workers import Controller

    controller = Controller()
    try:
        deadline = time.monotonic() + 30
        while not (found := psutil.Process(controller.process.pid).children()):
            assert time.monotonic() < deadline, "the controller forked no heartbeat monitor"
            time.sleep(0.05)
        monitor, = found
        held = {c.laddr.port for c in monitor.net_connections("tcp") if c.status == "LISTEN"}
        assert held and held <= set(controller.ports)  # forked: it holds the controller's sockets
        stopping = threading.Thread(target=controller.stop)
        with frozen(monitor.pid) as ending_late:
            stopping.start()
            stopping.join(1.0)
            assert stopping.is_alive() or not ending_late  # stop waits for the monitor to end
        stopping.join(30)
        assert not stopping.is_alive()
        assert free(controller.ports) == controller.ports
        assert not monitor.is_running() or monitor.status() == psutil.STATUS_ZOMBIE
    finally:
        controller.stop()


def test_workers_on_dask_run_cells_keep_variables_and_take_the_interrupt():
    with dtflab.start_workers(2, backend="dask") as on_dask:
        assert {info.host is not None for info in on_dask.cluster.tasks} == {True}
        lines, show = collected()
        on_dask.run("import json, os\nmine = json.loads(os.environ['TF_CONFIG'])['task']\n"
                    "print('I am', mine['type'], mine['index'])", show=show)
        assert {"[worker:0] I am worker 0\n", "[worker:1] I am worker 1\n"} <= set(lines)
        threading.Timer(2.0, _thread.interrupt_main).start()
        run = on_dask.run("import time\nwhile True:\n    time.sleep(0.05)")
        assert run.states == {"worker:0": "interrupted", "worker:1": "interrupted"}
        assert on_dask.pull("mine['index']") == {"worker:0": 0, "worker:1": 1}


def test_nothing_outlives_the_program_that_started_workers(tmp_path):
    from conftest import owner_of

    code = ("import json, dtflab\nw = dtflab.start_workers(2)\n"
            "print(json.dumps([t.pid for t in w.cluster.tasks] + [w.controller.process.pid]),"
            " flush=True)\nimport time\ntime.sleep(600)")
    with owner_of(code) as (tasks, descendants):
        assert len(tasks) == 3
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        left = [pid for pid in descendants if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        if not left:
            break
        time.sleep(0.2)
    assert not left, [psutil.Process(pid).cmdline() for pid in left]


def test_a_controller_group_that_outlives_its_wait_is_named_not_passed_over():
    from dtflab.cluster.persistent_workers import _wait_group_ended

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    try:
        with pytest.raises(RuntimeError, match=rf"process group {alive.pid}, has not ended 0.5 s "
                                               rf"after its kill \(pid {alive.pid} \(\w+\)\)"):
            _wait_group_ended(alive.pid, timeout=0.5)
    finally:
        alive.kill()
        alive.wait()
    _wait_group_ended(alive.pid, timeout=0.5)  # ended: returns


def test_a_controller_that_does_not_start_in_time_is_ended_with_its_ports():
    from dtflab.cluster.persistent_workers import Controller

    before = {child.pid for child in psutil.Process().children()}
    with pytest.raises(RuntimeError, match="the workers' controller did not start"):
        Controller(timeout=0.05)  # far too short for its Python to start
    left = [child for child in psutil.Process().children() if child.pid not in before
            and child.status() != psutil.STATUS_ZOMBIE]
    assert not left, [child.cmdline() for child in left]
