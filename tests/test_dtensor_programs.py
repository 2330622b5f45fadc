"""DTensor in program tasks: the chief and the workers are DTensor clients on their own free
ports, in TensorFlow's order; a DTensor program and TensorFlow's DTensor tutorial train on two
clients that agree on every loss."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import all_gone

pytestmark = pytest.mark.slow
PROGRAMS = Path(__file__).parent / "programs"


DTENSOR_PROBE = """import json, os, socket
names = ["DTENSOR_CLIENT_ID", "DTENSOR_NUM_CLIENTS", "DTENSOR_JOB_NAME", "DTENSOR_JOBS"]
seen = {name: os.environ.get(name) for name in names}
if seen["DTENSOR_JOBS"]:  # DTensor's gRPC server binds this port on every interface
    mine = seen["DTENSOR_JOBS"].split(",")[int(seen["DTENSOR_CLIENT_ID"])]
    with socket.create_server(("", int(mine.rsplit(":", 1)[1]))):
        seen["bound"] = mine
print(json.dumps(seen), flush=True)
"""


def test_the_chief_and_worker_programs_are_dtensor_clients_on_their_own_free_ports(run_programs, tmp_path):
    script = tmp_path / "dtensor_env.py"
    script.write_text(DTENSOR_PROBE)
    cluster = run_programs(script, workers=2, ps=1, chief=True)
    assert cluster.wait(timeout=60) == {"chief:0": 0, "worker:0": 0, "worker:1": 0}
    clients = [*cluster.addresses["chief"], *cluster.addresses["worker"]]  # TF's order
    for client_id, task in enumerate(["chief:0", "worker:0", "worker:1"]):
        seen = json.loads(cluster.logs(task).strip().splitlines()[-1])
        assert seen == {"DTENSOR_CLIENT_ID": str(client_id), "DTENSOR_NUM_CLIENTS": "3",
                        "DTENSOR_JOB_NAME": "worker", "DTENSOR_JOBS": ",".join(clients),
                        "bound": clients[client_id]}, task


@pytest.mark.parametrize("program_jobs, task, expected", [
    (("worker",), ("worker", 1), {"DTENSOR_CLIENT_ID": "1", "DTENSOR_NUM_CLIENTS": "2",
                                  "DTENSOR_JOB_NAME": "worker", "DTENSOR_JOBS": "w0:1,w1:2"}),
    (("chief",), ("chief", 0), {"DTENSOR_CLIENT_ID": "0", "DTENSOR_NUM_CLIENTS": "1",
                                "DTENSOR_JOB_NAME": "worker", "DTENSOR_JOBS": "c0:3"}),
    (("chief", "worker", "ps"), ("ps", 0), {}),  # a ps is never a DTensor client
    (("ps",), ("ps", 0), {}),
])
def test_dtensor_clients_are_the_chief_then_the_workers_that_run_the_program(program_jobs, task,
                                                                              expected):
    from dtflab.cluster.programs import dtensor_env

    addresses = {"ps": ["p0:0"], "worker": ["w0:1", "w1:2"], "chief": ["c0:3"]}
    assert dtensor_env(addresses, program_jobs, *task) == expected


def numpy_mlp_losses(steps: int, learning_rate: float) -> list[float]:
    """The losses ``dtensor_mlp.py`` should print, from the same math in one process in numpy."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dtensor_mlp", PROGRAMS / "dtensor_mlp.py")
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)  # numpy alone: TensorFlow is imported in its main()
    x, y, w1, w2 = (a.astype("float64") for a in program.synthetic())
    losses = []
    for _ in range(steps):
        hidden = np.tanh(x @ w1)
        error = hidden @ w2 - y
        losses.append(float(np.mean(error ** 2)))
        d_out = 2 * error / error.size
        d_w1 = x.T @ ((d_out @ w2.T) * (1 - hidden ** 2))
        w1, w2 = w1 - learning_rate * d_w1, w2 - learning_rate * (hidden.T @ d_out)
    return losses


def test_a_dtensor_program_runs_on_two_clients_that_agree_on_the_loss(run_programs):
    cluster = run_programs(PROGRAMS / "dtensor_mlp.py", "--num_local_devices=2", "--steps=5",
                           workers=2, timeout=120)
    pids = [task.pid for task in cluster.tasks]  # while they run: seconds to import TensorFlow
    assert cluster.wait(timeout=240) == {"worker:0": 0, "worker:1": 0}
    logs = [cluster.logs(f"worker:{index}") for index in (0, 1)]
    ends = [re.findall(r"^client (\d+) mesh \[2, 2\] loss (\S+)$", log, re.M) for log in logs]
    assert [len(end) for end in ends] == [1, 1], logs
    assert [end[0][0] for end in ends] == ["0", "1"]  # each worker is its own DTensor client
    steps = [[float(loss) for loss in re.findall(r"^step \d+ loss (\S+)$", log, re.M)]
             for log in logs]
    assert steps[0] == steps[1] and ends[0][0][1] == ends[1][0][1]  # one loss on both clients
    expected = numpy_mlp_losses(steps=5, learning_rate=0.1)  # the program's default rate
    assert steps[0] == pytest.approx(expected, abs=1e-4), (steps[0], expected)
    assert float(ends[0][0][1]) == steps[0][-1] < steps[0][0]  # and it learns
    cluster.stop()
    assert None not in pids and all_gone(pids)  # nothing outlives the run


@pytest.mark.parametrize("meshes, shapes", [
    (["data"], ["[8]"]),
    (["model"], ["[4, 2]"]),
    ([], ["[8]", "[4, 2]", "[2, 2, 2]"]),  # the program's default: all three, as the tutorial
], ids=["data-parallel", "model-parallel", "the-tutorials-three-sections"])
def test_tensorflows_dtensor_tutorial_trains_on_two_clients_that_agree_on_every_loss(
        run_programs, tmp_path, meshes, shapes):
    # A copy of TensorFlow's "Distributed training with DTensors" (changes marked), synthetic
    # reviews; its 8-device meshes over two clients of 4 CPU devices each. A section trains 2
    # epochs of 4 batches; each after the first restores the checkpoint of the one before.
    mesh_flag = ["--mesh", *meshes] if meshes else []
    cluster = run_programs(PROGRAMS / "tf_tutorials" / "dtensor_ml_tutorial.py", *mesh_flag,
                           f"--checkpoint_dir={tmp_path}", workers=2, timeout=120)
    pids = [task.pid for task in cluster.tasks]  # while they run: seconds to import TensorFlow
    assert cluster.wait(timeout=240) == {"worker:0": 0, "worker:1": 0}
    logs = [cluster.logs(f"worker:{index}") for index in (0, 1)]
    ends = [re.findall(r"^client (\d+) mesh (\[[\d, ]+\]) loss (\S+)$", log, re.M) for log in logs]
    # each worker is its own DTensor client, and each section ran on its mesh
    assert [[end[:2] for end in client] for client in ends] == [
        [(str(index), shape) for shape in shapes] for index in (0, 1)], logs
    steps = [re.findall(r"^epoch (\d) step (\d) loss (\S+)$", log, re.M) for log in logs]
    assert len(steps[0]) == 8 * len(shapes) and steps[0] == steps[1]  # one loss on both clients
    for section, end in enumerate(ends[0]):
        losses = [float(loss) for _, _, loss in steps[0][8 * section:8 * section + 8]]
        assert end[2] == steps[0][8 * section + 7][2]
        assert losses[-1] < losses[0] and sum(losses[4:]) < sum(losses[:4]), losses  # it learns
    for log in logs:
        assert log.count("New training") == 1
        assert log.count("Restoring a checkpoint") == len(shapes) - 1
    cluster.stop()
    assert None not in pids and all_gone(pids)  # nothing outlives the run
