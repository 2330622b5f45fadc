"""The code's layers: data does not import its views, clusters do not import widgets, one
module owns task names, one module owns TensorFlow's private parts."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import dtflab
from dtflab import names, tf_private
from dtflab.errors import NotSupportedError

PACKAGE = Path(dtflab.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every dtflab module a file imports, at any depth (function-level imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("dtflab")}


@pytest.mark.parametrize("layer, forbidden", [("tracing", "dtflab.viz"), ("cluster", "dtflab.ui"),
                                              ("cluster", "dtflab.viz"), ("train", "dtflab.ui")])
def test_a_lower_layer_never_imports_a_higher_one(layer, forbidden):
    offenders = {str(path.relative_to(PACKAGE)): sorted(m for m in imported_modules(path)
                                                        if m.startswith(forbidden))
                 for path in (PACKAGE / layer).glob("*.py")}
    assert {path: mods for path, mods in offenders.items() if mods} == {}


def test_step_data_loads_without_its_views_and_still_draws_through_them():
    code = ("import sys, dtflab.tracing.step as step\n"
            "print(any(m.startswith('dtflab.viz') for m in sys.modules))\n"
            "trace = step.StepTrace(None, {}, [], [], {}, 0.0)\n"
            "trace.figure()\n"
            "print(any(m.startswith('dtflab.viz') for m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]


@pytest.mark.parametrize("device, task, short", [
    ("/job:ps/replica:0/task:1/device:CPU:0", "ps:1", "ps:1"),
    ("/job:worker/task:0", "worker:0", "worker:0"),
    ("/job:worker/replica:0/task:2/device:GPU:0", "worker:2", "worker:2/GPU:0"),
    ("ps:3", "ps:3", "ps:3"),
])
def test_one_module_owns_task_and_device_names(device, task, short):
    assert names.task(device) == task and names.short(device) == short
    job, index = names.split(device)
    assert f"{job}:{index}" == task
    assert names.device(task) == f"/job:{job}/task:{index}"
    assert names.task(names.full(task)) == task
    assert names.find(f"error from {names.full(task)}: gone") == (job, index)


def test_a_bad_task_name_says_how_to_write_one():
    with pytest.raises(ValueError, match=r"'ps' is not a task; write it as job:index"):
        names.split("ps")


def test_tensorflows_private_parts_are_reachable_on_this_version():
    import tensorflow as tf

    assert callable(tf_private.profiler_client().trace)
    assert tf_private.xplane_pb2().XSpace is not None
    assert tf_private.base_session(tf).__name__ == "BaseSession"
    assert tf_private.data_sleep(1000) is not None
    assert tf_private.colocation_leaders(tf.Graph()) == []


def test_a_moved_private_module_names_the_feature_that_broke(monkeypatch):
    from tensorflow.python.profiler import profiler_client

    monkeypatch.delattr(profiler_client, "trace")  # as if a TF upgrade had moved it
    with pytest.raises(NotSupportedError, match=r"dtflab.profile needs TensorFlow's private "
                                                r"profiler_client.*tested with TensorFlow 2.16 to 2.21"):
        tf_private.profiler_client()


def test_the_names_a_notebook_uses_come_from_dtflab_or_dtflab_train():
    from dtflab import (Dashboard, PlacementEditor, PlacementPlan, ScalingModel,  # noqa: F401
                        TaskError, scaling_figure, short_device)
    from dtflab.train import (all_reduce, async_parameter_server, model_parallel,  # noqa: F401
                              ps_strategy, single, strategy_for, sync_data_parallel)

    for notebook in (PACKAGE.parent / "notebooks").glob("**/*.ipynb"):
        deep = [line for line in notebook.read_text().split("\\n")
                if "from dtflab." in line and "from dtflab.train import" not in line]
        assert deep == [], (notebook.name, deep)
