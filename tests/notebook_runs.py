"""Every tutorial executed once per test run, as a learner on Binder runs it.

Binder gives a learner 2 GB and one CPU's worth of time (a CPU quota: ``os.cpu_count()`` still
reports the host's cores). Each notebook runs in a fresh kernel, as a learner's Run All then
solved (``learner_then_solved``), and, where this machine allows it (root, and cgroup v1 or v2:
``binder_limits``), inside a cgroup of its own limited to 2 GiB and to one CPU: the kernel from
its first instruction and every task, fork server and Dask worker it starts. What outlived the
kernel is counted in that cgroup, or without one by the tag in the kernel's environment
(``RUN_TAG``). The executions start with the test run, one at a time in the
background (their cgroup's CPU weight an eighth of a test's, ``binder_limits.SHARES``: they take
the CPU time the other tests leave idle, about half of two cores, and yield nearly all of it the
moment a test wants it, keeping enough for TensorFlow's heartbeats); once the
first test that reads one asks (``NotebookRuns.get``), two run at a time at full shares, each
on its one CPU's worth. The notebook tests read the executed notebooks, the Binder tests their
peaks and CPU seconds, and the site renders them (``build/notebooks/``): no tier executes a
notebook again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from binder_limits import Limits, kill_all, outlived, which
from binder_limits import unavailable as cgroups_unavailable  # noqa: F401  (tests import it from here)

from dtflab import exercises

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = ROOT / "build" / "notebooks"  # the documentation site renders these outputs
LIMIT_MB = 2048
#: The most a notebook's group may peak at inside Binder's 2 GiB: the kernel, everything it
#: starts (TensorBoard included) and their page cache; the rest is the notebook server's.
ROOM_MB = 1536
AT_ONCE = 2
GROUP_PREFIX = "dtflab-notebook-"  # each notebook's cgroups: f"{GROUP_PREFIX}{pid}-{label}-{ns}"
#: In each notebook kernel's environment, and so in whatever it starts, as ``RUN_TAG=<its group's
#: name>``: how a notebook's processes are found where no cgroup holds them (a process that
#: clears its environment escapes this; none of dtflab's does).
RUN_TAG = "DTFLAB_NOTEBOOK_RUN"
JOIN = Path(__file__).with_name("join_cgroup.py")
#: Notebooks whose checks compare timings closely run, in their Japanese edition (the same
#: code), beside two busy loops in their own Binder group, as on a shared machine: each check
#: a cell makes must hold there too, or the prose must state its condition. These two: a
#: straggler's cost (04), the bubble against micro-batches (09). Every notebook so would take
#: 2.6 times the executions' time; with five so, a fresh-clone run took 25 min 05 s, over the
#: budget. 01 and 03 compare a distributed toy with one process, by factors a busy loop cannot
#: reverse (both ran so twice, and held). 13 held so alone (worker 1 at 1.080 of its bytes
#: formula, once the transport counts a segment sent again apart: 1.109 in CI-9, one loopback
#: segment's 44 KB), but beside the tests too, at the background's CPU weight, its expert run's
#: first step outran the 30 s a first step has (CI-10), and its 1.5 minutes more put the run
#: past 25.
UNDER_LOAD = {f"ja/{name}.ipynb" for name in ("04_async_parameter_servers",
                                               "09_pipeline_parallelism")}
BUSY_LOOPS = 2


@dataclass
class Run:
    """One executed notebook: ``notebook`` with its outputs, or ``error`` (the failing cell and
    its traceback); the cgroup's figures where there was one (``None`` elsewhere)."""

    notebook: nbformat.NotebookNode
    at: dict[str, int]
    seconds: float  # wall seconds; more than on Binder where it began in the background
    error: str | None = None
    cpu_s: float | None = None  # CPU seconds, all the cgroup's processes: what one CPU needs at least
    background: bool = False  # began while the other tests ran, at the background's CPU weight
    cgroup_peak_mb: int | None = None
    limit_hits: int | None = None
    oom_kills: int | None = None
    cpu_quota: bool = False
    leftovers: list[str] = field(default_factory=list)  # processes that outlived the kernel
    leftovers_by: str = ""  # how they were counted: "cgroup v1", "cgroup v2" or "environment"
    busy_loops: int = 0  # busy loops beside it, in its cgroup (``UNDER_LOAD``)


def in_a_notebook(pid: int) -> bool:
    """Whether process ``pid`` is a notebook's (a kernel, or what it started: in a notebook's
    cgroup, or carrying ``RUN_TAG``): what a test that scans the whole machine's processes or
    ports must leave out while the notebooks run beside it."""
    try:
        return (GROUP_PREFIX in Path(f"/proc/{pid}/cgroup").read_text()
                or f"{RUN_TAG}=".encode() in Path(f"/proc/{pid}/environ").read_bytes())
    except OSError:
        return False


def tagged(name: str) -> list[int]:
    """The processes whose environment has ``RUN_TAG=name``."""
    import psutil

    needle, found = f"{RUN_TAG}={name}".encode(), []
    for pid in psutil.pids():
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(pid)
        except OSError:  # gone, or not ours to read
            pass
    return found


def leftovers_by_tag(name: str, grace_s: float = 10.0) -> list[str]:
    """What still carries ``RUN_TAG=name`` ``grace_s`` after the kernel ended (then killed)."""
    return outlived(lambda: tagged(name), kill_all, grace_s)


def beside_the_notebooks(processes: list) -> list:
    """``processes`` (``psutil.Process``) without the notebook executor, what it started and
    what runs in a notebook's cgroup."""
    import psutil

    def of_the_notebooks(process) -> bool:
        try:
            chain = [process, *process.parents()]
            return in_a_notebook(process.pid) or any(
                "notebook_runs.py" in " ".join(p.cmdline()[:3]) for p in chain)
        except psutil.Error:  # gone (or going) while we looked: nothing left behind
            return True

    return [process for process in processes if not of_the_notebooks(process)]


#: What the test runs between the solved check and a second run of it: an answer that must be
#: refused ("not yet: ..."), of the solution's own type.
WRONG_ANSWER = """# (added by the test) a wrong answer, of the right type: the check must refuse it
answer = (not answer if isinstance(answer, bool) else answer * 2 + 1 if isinstance(answer, (int, float))
          else f"not {answer}")"""


def learner_then_solved(notebook) -> tuple[nbformat.NotebookNode, dict[str, int]]:
    """The notebook as the test runs it, in one kernel and one pass: as a learner's Run All runs
    it up to the exercise's check (the solution cell not applied, ``answer`` still None), then
    the solution applied and the check again, then ``WRONG_ANSWER`` and the check once more,
    then the rest. Returns it with the indexes of the solution cell and of the check as the
    learner ran it ("open"), solved ("correct") and answered wrongly ("wrong")."""
    cells = notebook["cells"]
    (at,) = [i for i, cell in enumerate(cells) if exercises.is_solution(cell)]
    check = next(i for i in range(at + 1, len(cells)) if cells[i]["cell_type"] == "code")
    learner = copy.deepcopy(cells[:check + 1])
    for cell in learner[at:]:  # these run twice: ids stay unique
        cell["id"] = f"{cell.get('id', 'cell')}-learner"[:64]
    solved = exercises.apply_solutions(notebook)["cells"][at:]
    checked = check - at + 1  # the solution to the check
    again = dict(copy.deepcopy(cells[check]), id=f"{cells[check].get('id', 'cell')}-wrong"[:64])
    wrong = [nbformat.v4.new_code_cell(WRONG_ANSWER, id="wrong-answer"), again]
    runs = dict(notebook, cells=learner + solved[:checked] + wrong + solved[checked:])
    correct = 2 * check + 1 - at
    return nbformat.from_dict(runs), {"not applied": at, "open": check, "correct": correct,
                                      "wrong": correct + 2}


def kernel_spec(name: str, limits: Limits | None, folder: Path) -> str:
    """A kernel spec whose kernel carries ``RUN_TAG=name`` and joins ``limits``'s groups (if
    any) before it starts; returns its name."""
    folder.mkdir(parents=True, exist_ok=True)
    kernel = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    if limits is not None:
        kernel = [sys.executable, str(JOIN), *map(str, limits.groups), "--", *kernel]
    (folder / "kernel.json").write_text(json.dumps({
        "argv": kernel, "env": {RUN_TAG: name}, "language": "python",
        "display_name": "Python 3 (Binder's limits)" if limits else "Python 3"}))
    return folder.name


def execute(path: Path, label: str, specs: Path, tutorial: bool = True, pace=None) -> Run:
    """Run one notebook inside Binder's limits where they can be set: a tutorial as
    ``learner_then_solved``, its outputs kept for the site; any other notebook as it is.
    ``pace`` (a ``_Pace``) runs it in the background until the tests ask for the notebooks."""
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook, at = nbformat.read(path, as_version=4), {}
    if tutorial:
        notebook, at = learner_then_solved(notebook)
    binder, background = None, False
    name = f"{GROUP_PREFIX}{os.getpid()}-{label}-{time.monotonic_ns()}"
    with pace.running.lock if pace is not None else contextlib.nullcontext():
        background = pace is not None and pace.background
        version, _ = which()
        if version is not None:
            binder = Limits(name, LIMIT_MB, cpus=1.0, background=background, version=version)
            if pace is not None:
                pace.running.add(binder)
    spec = kernel_spec(name, binder, specs / f"binder-{label}")
    # asynchronous, as nbclient expects: a blocking client's output poll would hold the event
    # loop, and with it nbclient's check that the kernel lives (a kernel killed at the memory
    # limit left the run waiting on a zombie)
    manager = AsyncKernelManager(kernel_name=spec, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(specs)]))
    client = NotebookClient(notebook, km=manager, timeout=600, kernel_name=spec,
                            resources={"metadata": {"path": str(path.parent)}})
    started, error = time.perf_counter(), None
    busy = busy_loops(binder) if under_load(path) else []
    try:
        client.execute()
    except CellExecutionError as exc:
        error = str(exc)
    except Exception as exc:  # a kernel that died (killed above the limit), a timeout
        error = f"{type(exc).__name__}: {exc}"
    finally:
        for loop in busy:  # before the leftovers are counted: they are not the notebook's
            loop.kill()
            loop.wait()
        if manager.has_kernel:  # nbclient ends only kernels it made
            run_sync(manager.shutdown_kernel)(now=False)
    run = Run(notebook, at, round(time.perf_counter() - started, 1), error, background=background,
              busy_loops=len(busy))
    if binder is None:
        run.leftovers, run.leftovers_by = leftovers_by_tag(name), "environment"
    else:
        if pace is not None:
            pace.running.discard(binder)
        run.leftovers, run.leftovers_by = binder.leftovers(), f"cgroup {binder.version}"
        for key, value in binder.figures().items():
            setattr(run, key, value)
        binder.remove()
    if error is None and tutorial:
        target = EXECUTED / path.relative_to(ROOT / "notebooks")
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, target)
    return run


def under_load(path: Path) -> bool:
    """Whether ``path`` is one of the tutorials in ``UNDER_LOAD``."""
    tutorials = ROOT / "notebooks"
    path = path.resolve()
    return path.is_relative_to(tutorials) and path.relative_to(tutorials).as_posix() in UNDER_LOAD


def busy_loops(binder: Limits | None) -> list[subprocess.Popen]:
    """``BUSY_LOOPS`` processes that spin, in ``binder``'s groups (the machine's, without)."""
    spin = [sys.executable, "-c", "while True: pass"]
    command = [sys.executable, str(JOIN), *map(str, binder.groups), "--", *spin] if binder else spin
    return [subprocess.Popen(command, stdin=subprocess.DEVNULL) for _ in range(BUSY_LOOPS)]


class NotebookRuns:
    """The tests' side: one executor process (``python notebook_runs.py``) runs every notebook
    in ``paths``, ``AT_ONCE`` at a time, from the first ``get``; ``get`` waits for one's ``Run``.

    A process of its own, so its threads and kernels are not the tests' (the leak check leaves
    its tree alone; each notebook's leftovers are checked in its cgroup instead)."""

    def __init__(self, paths: list[Path], folder: Path):
        self.paths, self.folder = list(paths), folder
        self._lock = threading.Lock()
        self._executor: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the executor, in the background (``_Pace``), if it has not started."""
        with self._lock:
            if self._executor is None and self.paths:
                self._log = open(self.folder / "executor.log", "wb")
                self._executor = subprocess.Popen(
                    [sys.executable, __file__, str(self.folder), *map(str, self.paths)],
                    stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def get(self, path: Path, timeout: float = 3000) -> Run:
        self.start()
        (self.folder / _Pace.FLAG).touch()  # the tests read the notebooks now: full speed
        result = self.folder / f"{self.paths.index(path)}.json"
        deadline = time.monotonic() + timeout
        while not result.exists():
            if self._executor.poll() is not None and not result.exists():
                log = (self.folder / "executor.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the notebook executor ended (code {self._executor.returncode}) "
                                   f"before {path.name}:\n{log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no result for {path.name} in {timeout:g} s")
            time.sleep(0.2)
        fields = json.loads(result.read_text())
        fields["notebook"] = nbformat.read(self.folder / f"{self.paths.index(path)}.ipynb", as_version=4)
        return Run(**fields)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.terminate()
            self._executor.wait(60)
            self._log.close()


class _Pace:
    """How fast the executor goes: one notebook at a time at the background's CPU weight until the
    file ``FLAG`` appears in its folder, then ``AT_ONCE`` at a time at full shares (the running
    one raised too)."""

    FLAG = "foreground"

    def __init__(self, folder: Path):
        self.folder, self.background = folder, True
        self.slots = threading.Semaphore(1)
        self.running = _Running()
        threading.Thread(target=self._watch, daemon=True, name="pace").start()

    def _watch(self) -> None:
        while not (self.folder / self.FLAG).exists():
            time.sleep(0.5)
        with self.running.lock:
            self.background = False
            for binder in self.running:
                binder.set_background(False)
        for _ in range(AT_ONCE - 1):
            self.slots.release()


class _Running(set):
    """The ``Limits`` of the notebooks running now, with the lock that changes them."""

    def __init__(self):
        super().__init__()
        self.lock = threading.RLock()

    def add(self, binder) -> None:
        with self.lock:
            super().add(binder)

    def discard(self, binder) -> None:
        with self.lock:
            super().discard(binder)


def main(folder: str, *paths: str) -> None:
    """The executor: each notebook's ``Run`` as ``FOLDER/<i>.json`` and ``<i>.ipynb``. It ends
    with the test run that started it (SIGTERM from the kernel when its parent ends); its
    kernels then see their parent gone and shut down, and their tasks end with them."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    out, specs = Path(folder), Path(folder) / "kernels"
    pace = _Pace(out)

    def one(index: int, path: Path) -> None:
        with pace.slots:
            run = execute(path, str(index), specs, pace=pace)
        nbformat.write(run.notebook, out / f"{index}.ipynb")
        fields = {key: value for key, value in vars(run).items() if key != "notebook"}
        (out / f"{index}.json.part").write_text(json.dumps(fields))
        (out / f"{index}.json.part").rename(out / f"{index}.json")

    # the ones beside busy loops first, the longest (the last) first, while the other tiers run
    order = sorted(range(len(paths)), key=lambda i: (0, -i) if under_load(Path(paths[i])) else (1, i))
    with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
        for future in [pool.submit(one, i, Path(paths[i])) for i in order]:
            future.result()


if __name__ == "__main__":
    main(*sys.argv[1:])
