"""The code's layers: each room imports only the rooms below it (one table, ``LAYERS``), no
module imports itself in a circle, no module is a god file; data does not import its views,
clusters do not import widgets, one module owns task names, one module owns TensorFlow's
private parts."""

import ast
import re
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


#: dtflab's base modules: below every room, importing nothing of dtflab but each other.
BASE = {"errors", "names", "spec", "checks", "_quiet", "tf_private", "machine", "scratch",
        "allocator"}

#: Each room of dtflab (a package or a top-level module) and the rooms below it that it may
#: import, at any depth (function-level imports included; ``if TYPE_CHECKING:`` imports, which
#: never run, left out). Top to bottom: data flows spec -> cluster -> tasks -> placement ->
#: trace -> views. A new room fails ``test_every_room_has_a_row`` until it has a row here.
LAYERS = {
    "__init__": None,  # the package's face: names from every room, each imported on first use
    "cli": {"cluster", "processes", "network", "binder_link"} | BASE,
    "magics": {"ui", "viz", "train", "tracing", "placement", "cluster", "processes", "network",
               "exercises"} | BASE,
    "ui": {"viz", "train", "tracing", "placement", "cluster", "processes"} | BASE,
    "viz": {"train", "tracing", "placement", "cluster"} | BASE,
    "train": {"tracing", "placement", "cluster", "network"} | BASE,
    "tracing": {"placement"} | BASE,
    "placement": BASE,
    "exercises": BASE,
    "binder_link": BASE,
    "cluster": {"processes", "network"} | BASE,
    "processes": {"network"} | BASE,
    "network": BASE,
    "checks": {"errors"},
    "tf_private": {"errors"},
    "spec": set(),
    "machine": set(),
    "allocator": {"tf_private"},
    "scratch": set(),
    "names": set(),
    "errors": set(),
    "_quiet": {"allocator"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def room(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def _runs(node: ast.AST) -> bool:
    """False for ``if TYPE_CHECKING:``: what is imported there never runs."""
    test = getattr(node, "test", None)
    return not (isinstance(node, ast.If) and getattr(test, "id", getattr(test, "attr", "")) == "TYPE_CHECKING")


def named_imports(path: Path) -> set[tuple[str, str]]:
    """``(constant or "", module)`` for each dtflab module a file names in a string that
    ``importlib.import_module`` is handed: a literal, or a module-level constant."""
    tree = ast.parse(path.read_text())
    constants = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for target in node.targets if isinstance(target, ast.Name)}
    found = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
                and node.args):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(("", arg.value))
            elif isinstance(arg, ast.Name) and arg.id in constants:
                found.add((arg.id, constants[arg.id]))
    return {(name, module) for name, module in found if module.startswith("dtflab")}


def imports_of(module: str, *, types: bool = False) -> set[str]:
    """The dtflab modules ``module`` imports when it runs (``from P import M`` is module
    ``P.M`` where that is a module, else ``P``; relative imports resolved); with ``types``,
    also those under ``if TYPE_CHECKING:``. A module handed to ``importlib.import_module`` by
    name counts as imported (``named_imports``), save a view reached by ``VIEWS``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found, todo = set(), [ast.parse(path.read_text())]
    while todo:
        node = todo.pop()
        todo.extend(child for child in ast.iter_child_nodes(node) if types or _runs(child))
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                         for alias in node.names)
    found |= {named for constant, named in named_imports(path) if constant != "VIEWS"}
    return {name for name in found if name in MODULES and name != module}


def test_every_room_has_a_row():
    assert {room(module) for module in MODULES} == set(LAYERS)


def test_the_architecture_page_names_every_room_folder_and_module():
    """``docs/architecture.md`` is where a reader finds a module's room: a folder or module
    added without a word there fails here, naming it."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    page = re.sub(r"```.*?```", "", page, flags=re.S)  # the pictures' blocks
    quoted = re.findall(r"`([^`\n]+)`", page)
    words = {word for text in quoted for word in re.findall(r"[A-Za-z_]\w*", text)}
    folders = sorted({path.parent for path in PACKAGE.rglob("*.py")} - {PACKAGE})
    unnamed = [f"{folder.relative_to(PACKAGE)}/" for folder in folders
               if not any(re.search(rf"(^|/){folder.name}/$", text) for text in quoted)]
    unnamed += [str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
                if path.name != "__init__.py" and path.stem not in words]
    assert not unnamed, (f"docs/architecture.md does not name {unnamed}: give each a phrase "
                         f"in its room's row, the name in backticks")


def test_the_table_is_a_ladder_every_room_only_looks_down():
    below = {name: set(allowed) for name, allowed in LAYERS.items() if allowed is not None}
    changed = True
    while changed:  # the transitive closure: what each room reaches through the rooms it may import
        changed = False
        for name, reach in below.items():
            more = set().union(*(below.get(other, set()) for other in reach)) - reach
            if more:
                reach |= more
                changed = True
    assert [name for name, reach in below.items() if name in reach] == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_module_imports_only_the_rooms_below_its_own(module):
    allowed = LAYERS[room(module)]
    if allowed is None:
        return
    assert sorted(m for m in imports_of(module) if room(m) not in allowed | {room(module)}) == []


#: The rooms inside ``dtflab/train/`` and the train rooms below each that it may import, as
#: ``LAYERS`` does for dtflab's rooms. A strategy builds on the graphs' pieces, the run
#: machinery, the layouts and the formulas; the worker programs stand on the formulas and the
#: problems alone; the layouts, the formulas and the planner import no TensorFlow when loaded
#: (the planner's calibration runs a loop, importing TensorFlow then).
TRAIN_ROOMS = {
    "__init__": None,  # the names users call, each imported on first use
    # the planner traces the worker programs' own step functions to price them
    "planner": {"strategies", "measure", "graphs", "machinery", "worker_programs", "layouts",
                "formulas", "problems"},
    "experiments": {"strategies", "measure", "graphs", "machinery", "layouts", "formulas",
                    "problems"},
    # an input pipeline, its visits and its scaling (the loops read it by duck typing)
    "inputs": {"strategies", "measure", "graphs", "machinery", "layouts", "formulas", "problems"},
    "examples": {"strategies", "graphs", "machinery", "layouts", "formulas", "problems"},  # to trace
    "strategies": {"measure", "graphs", "machinery", "layouts", "formulas", "problems"},
    "measure": {"graphs", "machinery", "layouts", "formulas", "problems"},
    "graphs": {"machinery", "layouts", "formulas", "problems"},  # the pieces loops build graphs of
    "machinery": {"worker_programs", "layouts", "formulas", "problems"},
    "worker_programs": {"formulas", "layouts", "problems"},
    "formulas": {"layouts"},
    "layouts": set(),
    "problems": set(),
}


def train_room(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def test_every_train_room_has_a_row_and_each_imports_only_the_rooms_below_it():
    train = {module for module in MODULES if room(module) == "train"}
    assert {train_room(module) for module in train} == set(TRAIN_ROOMS)
    wrong = {module: sorted(m for m in imports_of(module, types=True)
                            if room(m) == "train" and train_room(m) not in
                            TRAIN_ROOMS[train_room(module)] | {train_room(module)})
             for module in train if TRAIN_ROOMS[train_room(module)] is not None}
    assert {module: found for module, found in wrong.items() if found} == {}


@pytest.mark.parametrize("pure", ["dtflab.train.layouts", "dtflab.train.formulas",
                                  "dtflab.train.planner"])
def test_layouts_formulas_and_the_planner_load_no_tensorflow(pure):
    modules = [m for m in MODULES if m.startswith(pure)]
    code = (f"import sys, {', '.join(modules)}\n"
            "print('tensorflow' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False"], out.stderr[-2000:]


def test_no_module_imports_itself_in_a_circle():
    # Type-checking imports count: a circle that only a type annotation closes is still one
    # a reader follows round.
    graph = {module: imports_of(module, types=True) for module in MODULES}
    circles, order, low, stack, on_stack = [], {}, {}, [], set()

    def visit(module):  # Tarjan: every strongly connected set of two or more is a circle
        order[module] = low[module] = len(order)
        stack.append(module)
        on_stack.add(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            circle = []
            while not circle or circle[-1] != module:
                circle.append(stack.pop())
                on_stack.discard(circle[-1])
            if len(circle) > 1:
                circles.append(sorted(circle))

    for module in graph:
        if module not in order:
            visit(module)
    assert circles == []


@pytest.mark.parametrize("entry_point, starters", [
    ("dtflab.processes.server", ("dtflab.cluster", "dtflab.processes.launch",
                                 "dtflab.processes.spawn", "dtflab.processes.forkserver")),
    ("dtflab.processes.script", ("dtflab.cluster", "dtflab.processes.launch",
                                  "dtflab.processes.spawn", "dtflab.processes.forkserver")),
    ("dtflab.network.gate", ("dtflab.cluster", "dtflab.network.networks")),
])
def test_an_entry_point_imports_nothing_of_the_code_that_started_it(entry_point, starters):
    loaded = loaded_by(entry_point)
    assert [m for m in loaded if m.startswith(starters)] == []


def loaded_by(module: str) -> list[str]:
    """The dtflab modules a fresh interpreter has loaded once it has imported ``module``."""
    code = (f"import sys, {module}\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('dtflab'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    loaded = out.stdout.split()
    assert module in loaded, out.stderr[-2000:]
    return loaded


#: The programs ``train.all_reduce`` and ``train.sharded_data_parallel`` run in worker processes,
#: and what they must never load: the code that starts and watches them, in the notebook.
WORKER_PROGRAMS = ("dtflab.train.worker_programs.all_reduce", "dtflab.train.worker_programs.sharded_data_parallel")
NOTEBOOK_SIDE = ("dtflab.cluster", "dtflab.processes", "dtflab.network", "dtflab.train.strategies",
                 "dtflab.train.machinery.runner", "dtflab.train.machinery.program_loops", "dtflab.train.machinery.reports",
                 "dtflab.ui", "dtflab.viz", "dtflab.magics")


def reached_from(module: str) -> set[str]:
    """Every dtflab module ``module`` can import as it runs, through every module it reaches
    (function-level imports included), and the packages each one's import runs. A package's
    ``__getattr__``, which imports a name only when it is asked for, is not followed."""
    reached, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages it is in
        if MODULES[name].name == "__init__.py":
            tree = ast.parse(MODULES[name].read_text())
            todo += [node.module for node in tree.body
                     if isinstance(node, ast.ImportFrom) and node.module in MODULES]
        else:
            todo += sorted(imports_of(name))
    return reached


@pytest.mark.parametrize("program", WORKER_PROGRAMS)
def test_a_worker_program_imports_nothing_of_the_notebook_side(program):
    assert sorted(m for m in reached_from(program) if m.startswith(NOTEBOOK_SIDE)) == []
    loaded = loaded_by(program)
    assert [m for m in loaded if m.startswith(NOTEBOOK_SIDE)] == []
    print(f"{program}: {len(loaded)} dtflab modules on import, at most "
          f"{len(reached_from(program))} as it runs")


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


def test_a_view_reached_by_name_is_a_view():
    """The one import up the table: data reaching its view by a ``VIEWS`` string, which
    ``imports_of`` leaves out; each names a module of the views' rooms."""
    views = {module: named for module, path in MODULES.items()
             for constant, named in named_imports(path) if constant == "VIEWS"}
    assert views and {module: named for module, named in views.items()
                      if room(named) not in ("viz", "ui")} == {}


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
    assert tf_private.xplane_pb2().XSpace.DESCRIPTOR.full_name == "tensorflow.profiler.XSpace"
    assert tf_private.base_session(tf).__name__ == "BaseSession"
    slept = tf.data.Dataset.range(3).apply(tf_private.data_sleep(1000))
    assert list(slept.as_numpy_iterator()) == [0, 1, 2]  # each element passed on, 1 ms later
    assert tf_private.colocation_leaders(tf.Graph()) == []
    assert tf_private.forget_custom_gradients(tf.Graph()) == 0  # None: the registry moved


def test_a_moved_private_module_names_the_feature_that_broke(monkeypatch):
    from tensorflow.python.profiler import profiler_client

    monkeypatch.delattr(profiler_client, "trace")  # as if a TF upgrade had moved it
    with pytest.raises(NotSupportedError, match=r"dtflab.profile needs TensorFlow's private "
                                                r"profiler_client.*tested with TensorFlow 2.16 to 2.21"):
        tf_private.profiler_client()


def test_the_names_a_notebook_uses_come_from_dtflab_dtflab_train_or_a_train_room():
    # A room's module is imported from its room (``from dtflab.train.formulas import costs``):
    # dtflab.train keeps no old names for them. Nothing deeper.
    from dtflab import (Dashboard, PlacementEditor, PlacementPlan, ScalingModel,  # noqa: F401
                        TaskError, scaling_figure, short_device)
    from dtflab.train import (all_reduce, async_parameter_server, model_parallel,  # noqa: F401
                              ps_strategy, single, strategy_for, sync_data_parallel)

    rooms = {path.name for path in (PACKAGE / "train").iterdir() if (path / "__init__.py").exists()}
    allowed = re.compile(rf"from dtflab\.train(\.({'|'.join(sorted(rooms))}))? import ")
    for notebook in (PACKAGE.parent / "notebooks").glob("**/*.ipynb"):
        deep = [line for line in notebook.read_text().split("\\n")
                if "from dtflab." in line and not allowed.search(line)]
        assert deep == [], (notebook.name, deep)
