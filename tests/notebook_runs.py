"""Every tutorial executed once per test run, as a learner on Binder runs it.

Binder gives a learner 2 GB and one CPU's worth of time (a CPU quota: ``os.cpu_count()`` still
reports the host's cores). Each notebook runs in a fresh kernel, as a learner's Run All then
solved (``learner_then_solved``), and, where this machine allows it (root, cgroup v1), inside
a child cgroup of its own limited to 2 GiB and to one CPU (``cpu.cfs_quota_us`` =
``cpu.cfs_period_us``): the kernel from its first instruction and every task, fork server and
Dask worker it starts. The executions start with the test run, one at a time in the
background (their cgroup's ``cpu.shares`` at the minimum: they take the CPU time the other
tests leave idle, about half of two cores, and yield it the moment a test wants it); once the
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

from dtflab import exercises

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from notebook_memory import memory_figures, own_cgroup, remove_group  # noqa: E402
EXECUTED = ROOT / "build" / "notebooks"  # the documentation site renders these outputs
LIMIT_MB = 2048
AT_ONCE = 2
#: cgroup-v1 ``cpu.shares`` of a notebook run in the background: the least there is (a test's
#: process has 1024), so a test is never kept waiting for a notebook's CPU time.
BACKGROUND_SHARES = 2
FOREGROUND_SHARES = 1024
CGROUPS = Path("/sys/fs/cgroup")
GROUP_PREFIX = "dtflab-notebook-"  # each notebook's cgroups: f"{GROUP_PREFIX}{pid}-{label}-{ns}"
JOIN = Path(__file__).with_name("join_cgroup.py")


@dataclass
class Run:
    """One executed notebook: ``notebook`` with its outputs, or ``error`` (the failing cell and
    its traceback); the cgroup's figures where there was one (``None`` elsewhere)."""

    notebook: nbformat.NotebookNode
    at: dict[str, int]
    seconds: float  # wall seconds; more than on Binder where it began in the background
    error: str | None = None
    cpu_s: float | None = None  # CPU seconds, all the cgroup's processes: what one CPU needs at least
    background: bool = False  # began while the other tests ran (``BACKGROUND_SHARES``)
    cgroup_peak_mb: int | None = None
    limit_hits: int | None = None
    oom_kills: int | None = None
    cpu_quota: bool = False
    leftovers: list[str] = field(default_factory=list)  # processes that outlived the kernel


def in_a_notebook(pid: int) -> bool:
    """Whether process ``pid`` runs inside a notebook's cgroup (a kernel, or what it started):
    what a test that scans the whole machine's processes or ports must leave out while the
    notebooks run beside it."""
    try:
        return GROUP_PREFIX in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False


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


def cgroups_unavailable() -> str | None:
    """Why Binder's limits cannot be set here, or None."""
    if os.geteuid() != 0:
        return "not root"
    for controller, knob in (("memory", "memory.limit_in_bytes"), ("cpu", "cpu.cfs_quota_us"),
                             ("cpuacct", "cpuacct.usage")):
        if not (CGROUPS / controller / knob).exists():
            return f"no cgroup-v1 {controller} controller at {CGROUPS / controller}"
    return None


def learner_then_solved(notebook) -> tuple[nbformat.NotebookNode, dict[str, int]]:
    """The notebook as the test runs it, in one kernel and one pass: as a learner's Run All runs
    it up to the exercise's check (the solution cell not applied, ``answer`` still None), then
    the solution applied, the check again and the rest. Returns it with the indexes of the
    solution cell and the check, as the learner ran them and solved."""
    cells = notebook["cells"]
    (at,) = [i for i, cell in enumerate(cells) if exercises.is_solution(cell)]
    check = next(i for i in range(at + 1, len(cells)) if cells[i]["cell_type"] == "code")
    learner = copy.deepcopy(cells[:check + 1])
    for cell in learner[at:]:  # these run twice: ids stay unique
        cell["id"] = f"{cell.get('id', 'cell')}-learner"[:64]
    solved = exercises.apply_solutions(notebook)["cells"][at:]
    runs = dict(notebook, cells=learner + solved)
    return nbformat.from_dict(runs), {"not applied": at, "open": check, "correct": 2 * check + 1 - at}


class _Binder:
    """Fresh cgroups for one notebook: memory (2 GiB), cpu (one CPU's quota; ``shares``) and
    cpuacct (its CPU seconds), wherever the last is mounted apart from cpu."""

    def __init__(self, label: str, shares: int = FOREGROUND_SHARES):
        name = f"{GROUP_PREFIX}{os.getpid()}-{label}-{time.monotonic_ns()}"
        self.memory, self.cpu = own_cgroup("memory") / name, own_cgroup("cpu") / name
        self.cpuacct = own_cgroup("cpuacct") / name
        self.memory.mkdir()
        self.cpu.mkdir()
        if not self.cpuacct.exists():  # mounted apart ("cpu" and "cpuacct", not "cpu,cpuacct")
            self.cpuacct.mkdir()
        (self.memory / "memory.limit_in_bytes").write_text(str(LIMIT_MB * 2**20))
        period = (self.cpu / "cpu.cfs_period_us").read_text().strip()
        (self.cpu / "cpu.cfs_quota_us").write_text(period)
        self.set_shares(shares)

    def set_shares(self, shares: int) -> None:
        (self.cpu / "cpu.shares").write_text(str(shares))

    @property
    def groups(self) -> list[Path]:
        return list({group.resolve(): group for group in (self.memory, self.cpu, self.cpuacct)}.values())

    def kernel_spec(self, folder: Path) -> str:
        """A kernel spec whose kernel joins both cgroups before it starts; returns its name."""
        name = folder.name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, str(JOIN), *map(str, self.groups), "--",
                     sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (Binder's limits)", "language": "python"}))
        return name

    def figures(self) -> dict:
        cpu_s = int((self.cpuacct / "cpuacct.usage").read_text()) / 1e9
        return {**memory_figures(self.memory), "cpu_quota": True, "cpu_s": round(cpu_s, 1)}

    def leftovers(self, grace_s: float = 10.0) -> list[str]:
        """What still runs in the cgroup ``grace_s`` after the kernel ended (then killed)."""
        import psutil

        procs = self.memory / "cgroup.procs"
        deadline = time.monotonic() + grace_s
        while (pids := [int(p) for p in procs.read_text().split()]) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = []
        for pid in pids:
            try:
                process = psutil.Process(pid)
                left.append(f"{pid} {' '.join(process.cmdline()[:6])}")
                process.kill()
            except psutil.Error:
                pass
        return left

    def remove(self) -> None:
        for group in self.groups:
            remove_group(group)


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
    with pace.running.lock if pace is not None else contextlib.nullcontext():
        background = pace is not None and pace.background
        if not cgroups_unavailable():
            binder = _Binder(label, BACKGROUND_SHARES if background else FOREGROUND_SHARES)
            if pace is not None:
                pace.running.add(binder)
    manager = None
    if binder is not None:
        spec = binder.kernel_spec(specs / f"binder-{label}")
        # asynchronous, as nbclient expects: a blocking client's output poll would hold the
        # event loop, and with it nbclient's check that the kernel lives (a kernel killed at
        # the memory limit left the run waiting on a zombie)
        manager = AsyncKernelManager(kernel_name=spec, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(specs)]))
    client = NotebookClient(notebook, km=manager, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    started, error = time.perf_counter(), None
    try:
        client.execute()
    except CellExecutionError as exc:
        error = str(exc)
    except Exception as exc:  # a kernel that died (killed above the limit), a timeout
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if manager is not None and manager.has_kernel:  # nbclient ends only kernels it made
            run_sync(manager.shutdown_kernel)(now=False)
    run = Run(notebook, at, round(time.perf_counter() - started, 1), error, background=background)
    if binder is not None:
        if pace is not None:
            pace.running.discard(binder)
        run.leftovers = binder.leftovers()
        for key, value in binder.figures().items():
            setattr(run, key, value)
        binder.remove()
    if error is None and tutorial:
        target = EXECUTED / path.relative_to(ROOT / "notebooks")
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, target)
    return run


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
    """How fast the executor goes: one notebook at a time at ``BACKGROUND_SHARES`` until the
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
                binder.set_shares(FOREGROUND_SHARES)
        for _ in range(AT_ONCE - 1):
            self.slots.release()


class _Running(set):
    """The ``_Binder``s of the notebooks running now, with the lock that changes them."""

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

    with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
        for future in [pool.submit(one, i, Path(p)) for i, p in enumerate(paths)]:
            future.result()


if __name__ == "__main__":
    main(*sys.argv[1:])
