"""Shared fixtures: real clusters that always stop, a real IPython shell, a leak check."""

from __future__ import annotations

import atexit
import contextlib
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import pytest

from dtflab.cluster.ports import free_ports  # noqa: F401  (tests import it from here)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every run writes its TensorBoard files (train.machinery.logdir): the tests' go to a folder of their
# own, removed at the end, not into runs/ beside the tests or the notebooks they execute.
if "DTFLAB_LOGDIR" not in os.environ:
    os.environ["DTFLAB_LOGDIR"] = tempfile.mkdtemp(prefix="dtflab-test-runs-")
    atexit.register(shutil.rmtree, os.environ["DTFLAB_LOGDIR"], ignore_errors=True)
# A graph loop's traced step profiles every task for XProf only where the run writes TensorBoard
# files; the suite writes them for every run, and reads a profile in few places: those set
# DTFLAB_PROFILE=1 around their runs (test_tensorboard), the browser tier's JupyterLab unsets it.
os.environ.setdefault("DTFLAB_PROFILE", "0")

# A shell without job control starts a background job with SIGINT ignored, and an ignored
# signal stays ignored in every program started below it: the Ctrl-C tests' own clusters would
# never see their Ctrl-C (a suite run in the background left two `dtflab cluster start` running,
# and every later test's leak check failed on them). The tests' children get the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: Under ``CI=true`` a tier this machine lacks a part for fails instead of skipping (``not_here``).
IN_CI = os.environ.get("CI") == "true"


def not_here(reason: str) -> None:
    """Skip the test with ``reason``, which names what this machine lacks (a system package,
    root, a cgroup controller) and the fix; under ``CI=true`` fail with it instead: CI is never
    green with a tier skipped that its machine can be given the means to run."""
    if IN_CI:
        pytest.fail(f"{reason} [CI=true: a tier is never skipped in CI; give the machine what "
                    f"it names]", pytrace=False)
    pytest.skip(reason)


#: iproute2's ``ip``, for the tests that build hosts as network namespaces (root only).
IP = shutil.which("ip") or "/usr/sbin/ip"


def run_ip(*args, namespace: str | None = None) -> None:
    """Run ``ip ARGS`` here, or inside network namespace ``namespace``; fails the test on error."""
    prefix = [IP, "netns", "exec", namespace, IP] if namespace else [IP]
    subprocess.run(prefix + list(args), check=True, capture_output=True, timeout=30)


def wait_until(condition, timeout: float = 5.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def stop_last_first(processes) -> None:
    """Terminate ``processes`` newest first, each gone before the next is told: a Dask worker
    told to stop while its scheduler is going too waits 8 s for it before it exits."""
    for process in reversed(processes):
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_records(run, records: int, timeout: float = 60.0) -> None:
    """Wait until the background ``run`` holds ``records`` step records; fail with its
    failures and each worker's log if it does not within ``timeout`` s, or with its error if
    it ended first."""
    assert wait_until(lambda: len(run.history.records) >= records or run.done, timeout=timeout), (
        f"{len(run.history.records)} records in {timeout:g} s; failures: {run.history.failures}; logs: "
        + "; ".join(f"{worker}: {run.history.cluster.logs(worker)[-1000:]}"
                    for worker in run.history.workers))
    assert not run.done, run.wait()  # raises the run's error, if it ended with one

#: Python's multiprocessing starts one resource tracker per process (here for Dask's spawned
#: workers) and keeps it until that process exits, by design: not something a test left.
PROCESS_SINGLETONS = ("multiprocessing.resource_tracker",)
#: dtflab's own per-process services, kept for the life of the process by design: the private
#: network's gate (with its helper: 2 processes) and one fork server per network (2 at most).
KERNEL_SERVICES = {"dtflab.network.gate": 2, "dtflab.processes.forkserver": 2}


def beside_all_reduce(problem, loop, steps: int, **options):
    """``(plain, run, plain_sent, sent)``: ``train.all_reduce`` and ``loop`` (a worker-program
    loop) each on ``problem`` with two workers for ``steps`` steps, and the bytes each pair
    of workers sent a step (``WireBytes`` from step 2, over all but the last two steps)."""
    from dtflab import train

    plain_wire, wire = (train.WireBytes(after_step=2, steps=steps - 4) for _ in range(2))
    plain = train.all_reduce(problem, workers=2, steps=steps, callbacks=[plain_wire])
    run = loop(problem, workers=2, steps=steps, callbacks=[wire], **options)
    return plain, run, plain_wire.per_step.sent, wire.per_step.sent


def sends_as_its_formula_says(sent, plain_sent, formula: float, over_all_reduce: float):
    """Each worker sends the other ``formula`` bytes a step (gRPC's framing on top, within
    10%), ``over_all_reduce`` times what all-reduce sends."""
    for pair in (("worker:0", "worker:1"), ("worker:1", "worker:0")):
        assert formula <= sent[pair] <= 1.1 * formula, (pair, sent[pair], formula)
        assert sent[pair] / plain_sent[pair] == pytest.approx(over_all_reduce, rel=0.1)


def killed_with_checkpoints(loop, problem):
    """``(reference, history, recovery)``: ``loop`` (a worker-program loop) run 60 steps on
    ``problem`` undisturbed, and again with a checkpoint every 10 steps and worker 1 killed
    after about 25 steps a worker; the second run's one recovery."""
    reference = loop(problem, workers=2, steps=60, seed=2)
    run = loop(problem, workers=2, steps=60, seed=2, slow={"worker:0": 0.02},
               checkpoint_every=10, background=True)
    wait_for_records(run, 2 * 25)
    run.history.cluster.kill("worker", 1)
    history = run.wait(timeout=120)
    (recovery,) = history.recoveries
    assert recovery.resumed_from % 10 == 0 and 0 <= recovery.lost <= 10
    return reference, history, recovery


#: Pids of processes a module's fixture keeps for the whole module (the browser tier's one
#: chromium, by its Playwright driver): they and what they start are the fixture's, not a
#: test's (chromium starts helper processes when a page first needs them).
LASTING: set[int] = set()


def _children(services: bool = False) -> dict[int, str]:
    """This process's live descendants, without the singletons and, unless ``services``,
    without dtflab's per-process services (forked tasks inherit the fork server's command
    line: a fork server is one whose parent is not one; what a fork server runs while it
    warms up, ``uname -p`` say, is its own too). The notebook executor that ``notebook_runs``
    runs beside the tests is not counted, nor its kernels and what they start: each notebook's
    leftovers are checked in its own cgroup; nor what a module keeps (``LASTING``)."""
    commands, mine = {}, os.getpid()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                commands[child.pid] = (" ".join(child.cmdline()[:6]), child.ppid())
        except psutil.Error:
            pass
    apart = {pid for pid, (command, parent) in commands.items()
             if parent == mine and "notebook_runs.py" in command} | LASTING

    def below_one_apart(pid):
        chain, parent = {pid}, commands[pid][1]
        while parent in commands and parent not in chain:
            chain.add(parent)
            parent = commands[parent][1]
        return bool(chain & apart)

    for pid in [pid for pid in commands if below_one_apart(pid)]:
        del commands[pid]

    def service(pid):
        command, parent = commands[pid]
        parent_command = commands.get(parent, ("", 0))[0]
        if "-m dtflab.network.gate" in command:
            return True
        if "-m dtflab.processes.forkserver" in parent_command:
            return "-m dtflab.processes.forkserver" not in command  # not a task: its own helper
        return "-m dtflab.processes.forkserver" in command

    return {pid: command for pid, (command, _) in commands.items()
            if not any(name in command for name in PROCESS_SINGLETONS)
            and (services or not service(pid))}


def kernel_services() -> dict[str, list[int]]:
    """The pids of dtflab's per-process services running now, by module: the gates (each with
    its helper) and the fork servers (not the tasks they forked)."""
    every, services = _children(services=True), _children()
    found = {name: [] for name in KERNEL_SERVICES}
    for pid, command in every.items():
        for name in KERNEL_SERVICES:
            if pid not in services and f"-m {name}" in command:
                parent = psutil.Process(pid).ppid()
                if name.endswith("gate") or f"-m {name}" not in every.get(parent, ""):
                    found[name].append(pid)
    return found


def _threads() -> set[str]:
    return {f"{t.name}#{t.ident}" for t in threading.enumerate() if t.is_alive()}


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Fail a test that leaves a child process or a Python thread behind (5 s grace)."""
    processes_before, threads_before = set(_children()), _threads()
    yield
    if request.node.get_closest_marker("leaves_threads"):
        return

    def leaked_processes():
        return {pid: cmd for pid, cmd in _children().items() if pid not in processes_before}

    def leaked_threads():
        return _threads() - threads_before

    wait_until(lambda: not leaked_processes() and not leaked_threads(), timeout=5)
    assert not leaked_processes(), f"test left processes running: {leaked_processes()}"
    for name, pids in kernel_services().items():
        assert len(pids) <= KERNEL_SERVICES[name], f"more than one {name} per network: {pids}"
    assert not leaked_threads(), f"test left threads running: {leaked_threads()}"


@pytest.fixture(autouse=True)
def background_runs_stopped(no_leaks, monkeypatch):
    """Every ``background=True`` run a test started is ended after it, before the leak check:
    a test that fails while its run goes on then fails for its own reason, not for the leak.
    A run that does not end within 30 s of its Stop (one stuck in its start-up) has its
    cluster stopped under it."""
    from dtflab.train.machinery.runner import BackgroundRun

    runs, start = [], BackgroundRun.__init__

    def recorded(self, *args, **kwargs):
        start(self, *args, **kwargs)
        runs.append(self)

    monkeypatch.setattr(BackgroundRun, "__init__", recorded)
    yield
    for run in runs:
        run.stop(wait=False)
    for run in runs:
        run.thread.join(30)
        if not run.done and run.history.cluster is not None:
            run.history.cluster.stop()
            run.thread.join(30)


def _stopped_after(factory):
    """``factory`` (``dtflab.start_cluster`` or ``dtflab.run``), every cluster it started
    stopped after the test."""
    started = []

    def start(*args, **kwargs):
        cluster = factory(*args, **kwargs)
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.stop()


@pytest.fixture
def start_cluster():
    """``dtflab.start_cluster`` whose clusters are all stopped after the test."""
    import dtflab

    yield from _stopped_after(dtflab.start_cluster)


@pytest.fixture
def run_programs():
    """``dtflab.run`` whose clusters are all stopped after the test."""
    import dtflab

    yield from _stopped_after(dtflab.run)


@contextlib.contextmanager
def owner_of(code: str, env: dict | None = None):
    """A Python process running ``code`` (with ``env`` added to its environment), which starts
    clusters and prints its tasks' pids as one JSON list; yields (those pids, the pids of all
    its descendants) and SIGKILLs it when the block ends."""
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, **(env or {})})
    try:
        tasks = json.loads(owner.stdout.readline())
        yield tasks, [child.pid for child in psutil.Process(owner.pid).children(recursive=True)]
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()


def all_gone(pids) -> bool:
    """Whether every process of ``pids`` has ended (a zombie has)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


@pytest.fixture(scope="session")
def ipython_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("ipython")
    os.environ["IPYTHONDIR"] = str(path)
    return path


@pytest.fixture
def ip(ipython_dir):
    """A real IPython shell with dtflab loaded; clusters it started are stopped afterwards."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False  # no history thread, no sqlite file
    shell = InteractiveShell.instance(config=config)
    if "dtflab" not in shell.extension_manager.loaded:
        shell.run_line_magic("load_ext", "dtflab")
    yield shell
    magics = shell.magics_manager.registry["ClusterMagics"]
    for cluster in list(magics.clusters.values()):
        cluster.stop()
    magics.clusters.clear()
    shell.user_ns.pop("cluster", None)


def run_constant(target, device, value="Hello, distributed TensorFlow!"):
    """Run a constant placed on ``device`` through a session on ``target``; returns its value."""
    from dtflab._quiet import import_tf

    tf = import_tf()
    with tf.Graph().as_default():
        with tf.device(device):
            constant = tf.constant(value)
        config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=20000)
        with tf.compat.v1.Session(target, config=config) as session:
            return session.run(constant)


def python_script(code: str) -> list[str]:
    """argv that runs ``code`` in a fresh interpreter of this environment."""
    return [sys.executable, "-c", code]


#: The documentation site the tests build (README "Documentation": the same command).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = os.path.join(ROOT, "build", "docs")
BUILD_DOCS = [sys.executable, "-m", "sphinx", "-j", "auto", "-W", "--keep-going", "-b", "html", "-d",
              os.path.join(ROOT, "build", "doctrees"), "docs", SITE]


TIERS = ("browser", "docs", "binder", "notebook", "multihost", "slow")
#: Tiers run after the others, in this order (``pytest_collection_modifyitems``); a browser
#: test that opens the site runs after the site's tests.
RUN_LAST = {"browser": 1, "binder": 2, "notebook": 2, "docs": 3, "the site in a browser": 4}
_tier_seconds: dict[str, float] = {}
_tier_tests: dict[str, int] = {}
#: Seconds by test module (set-up and teardown included): the run's summary names the costliest.
_module_seconds: dict[str, float] = {}
MODULES_SHOWN = 15
#: Lines a test prints that the run's summary repeats (captured output is shown only on failure).
FIGURES = "Binder's limits:"
_figures: list[str] = []
#: Skipped cases by tier and by reason: the run's last section says what it did not check.
_skipped: dict[str, int] = {}
_skip_reasons: dict[str, int] = {}


def machine_cpu_s() -> float:
    """CPU seconds every core of this machine has spent busy since boot, all processes
    (``/proc/stat``: user, nice, system, irq, softirq and steal)."""
    with open("/proc/stat") as stat:
        fields = [int(field) for field in stat.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def suite_cpu_s() -> tuple[float, float]:
    """CPU seconds of this process, and of everything it started: the processes that ended
    (each counted once its parent waited for it, theirs with them) and the ones still running,
    with those each of them has waited for (a fork server's tasks, a notebook executor's
    kernels). A process whose parent ended before it is not counted here (the machine's figure
    has it)."""
    import resource

    def total(usage):
        return usage.ru_utime + usage.ru_stime

    ended = total(resource.getrusage(resource.RUSAGE_CHILDREN))
    running = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            times = child.cpu_times()
            running += times.user + times.system + times.children_user + times.children_system
    return total(resource.getrusage(resource.RUSAGE_SELF)), ended + running


#: When the run began: its wall clock and the machine's busy CPU seconds then.
_STARTED = (time.monotonic(), machine_cpu_s())


def tier_of(keywords) -> str:
    """The tier a test is counted in: its first marker in ``TIERS`` order ("slow" for the rest
    of the marked ones), else "fast"."""
    return next((name for name in TIERS if name in keywords), "fast")


def pytest_runtest_logreport(report):
    tier = tier_of(report.keywords)
    _tier_seconds[tier] = _tier_seconds.get(tier, 0.0) + report.duration
    module = report.nodeid.split("::")[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _tier_tests[tier] = _tier_tests.get(tier, 0) + 1
    if report.when == "call":
        _figures.extend(line for line in report.capstdout.splitlines() if line.startswith(FIGURES))
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        _skipped[tier] = _skipped.get(tier, 0) + 1
        _skip_reasons[reason] = _skip_reasons.get(reason, 0) + 1


def pytest_terminal_summary(terminalreporter):
    """The figures the Binder tier printed, a line per notebook; then one line per tier: its
    tests and their seconds (set-up and teardown included), and how many were skipped; one
    naming the costliest test modules with their seconds; one for the whole run: its wall
    time and CPU seconds, the suite's processes' and the whole machine's; then each reason for
    a skip, with its count (pytest's own last lines repeat them, with ``-ra``)."""
    if _figures:
        terminalreporter.section("each notebook inside Binder's limits")
        for line in _figures:
            terminalreporter.write_line(line[len(FIGURES):].strip())
    terminalreporter.section("time per tier")
    for tier in (*TIERS, "fast"):
        if tier in _tier_seconds:
            seconds = _tier_seconds[tier]
            skipped = f", {_skipped[tier]} SKIPPED" if tier in _skipped else ""
            terminalreporter.write_line(f"tier {tier:<9} {_tier_tests.get(tier, 0):>4} tests "
                                        f"{seconds / 60:6.1f} min ({seconds:.0f} s){skipped}")
    costliest = sorted(_module_seconds.items(), key=lambda item: -item[1])[:MODULES_SHOWN]
    terminalreporter.write_line("the costliest modules: " + ", ".join(
        f"{os.path.basename(module)[:-3]} {seconds:.0f} s" for module, seconds in costliest))
    wall, machine = time.monotonic() - _STARTED[0], machine_cpu_s() - _STARTED[1]
    own, started = suite_cpu_s()
    terminalreporter.write_line(
        f"the run: {wall / 60:.1f} min wall ({wall:.0f} s); CPU {own + started:.0f} s by the "
        f"suite's processes (pytest {own:.0f}, what it started {started:.0f}: task servers, "
        f"notebook kernels, browsers), {machine:.0f} s by the whole machine, "
        f"{machine / (wall * (os.cpu_count() or 1)):.0%} of its {os.cpu_count()} cores")
    if _skip_reasons:
        terminalreporter.section(f"{sum(_skip_reasons.values())} skipped: not checked, and why",
                                 yellow=True)
        for reason, count in sorted(_skip_reasons.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{count:>4} x {reason}")


def pytest_collection_modifyitems(session, config, items):
    """The browser tier's JupyterLab tests (a kernel and a browser leave a core partly idle:
    the notebook executions go on beside them, in the background), then the tests that read
    the notebook executions together (they run two at a time beside them: nothing else should
    share the cores then), then the site's tests, which render those executions
    (build/notebooks/), then the browser test that opens the site."""
    def order(item) -> int:
        tier = tier_of(item.keywords)
        if tier == "browser" and "built_site" in item.fixturenames:
            return RUN_LAST["the site in a browser"]
        return RUN_LAST.get(tier, 0)

    items.sort(key=order)


@pytest.fixture(scope="session")
def notebook_runs(request, tmp_path_factory):
    """Every tutorial this run's tests ask for, executed once for the whole run, inside
    Binder's limits where they can be set (``notebook_runs``): ``.get(path)`` waits for that
    notebook's ``Run``."""
    from notebook_runs import NotebookRuns
    from tutorials import NOTEBOOKS

    wanted = {item.callspec.params["path"] for item in request.session.items
              if hasattr(item, "callspec") and "path" in item.callspec.params
              and "notebook_runs" in inspect.signature(item.function).parameters}
    runs = NotebookRuns([path for path in NOTEBOOKS if path in wanted], tmp_path_factory.mktemp("notebooks"))
    yield runs
    runs.close()


@pytest.fixture(scope="session", autouse=True)
def notebooks_from_the_start(notebook_runs):
    """The notebook executions begin with the run, in the background (``notebook_runs``'s
    ``_Pace``): the other tiers leave about half of two cores idle."""
    notebook_runs.start()


@pytest.fixture(scope="session")
def built_site():
    """The documentation site, built once per run with warnings as errors: ``(path, log)``."""
    import shutil as _shutil

    _shutil.rmtree(SITE, ignore_errors=True)
    done = subprocess.run(BUILD_DOCS, cwd=ROOT, capture_output=True, text=True, timeout=3000)
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"the documentation site did not build:\n{log[-6000:]}"
    return SITE, log


@pytest.fixture(scope="module")
def split_cluster():
    """Three worker tasks, two inter-op threads and one intra-op thread each: a module's
    pipeline stages or tensor-parallel ways, one task each (the second thread answers
    transfers while the first computes)."""
    import dtflab

    with dtflab.start_cluster(workers=3, inter_op_threads=2, intra_op_threads=1) as c:
        yield c


_one_process: dict = {}


def one_process(problem, **options):
    """``train.single(problem, **options)``, run once per test run for each problem and options
    (problems compare by value): the one-process baseline that many tests compare a loop's
    losses with. The same History is handed to every test that asks: read it, do not change it."""
    from dtflab import train

    key = (problem, tuple(sorted(options.items())))
    if key not in _one_process:
        _one_process[key] = train.single(problem, **options)
    return _one_process[key]


def max_loss_diff(a, b) -> float:
    """The worst |loss difference| per step between two histories."""
    import numpy as np

    return float(np.max(np.abs(np.array(a.losses) - np.array(b.losses))))


def free(ports: list[int]) -> list[int]:
    """Those of ``ports`` that this process can listen on now on 127.0.0.1 (as a server does,
    past the closed connections' TIME_WAIT)."""
    import socket

    found = []
    for port in ports:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
                found.append(port)
            except OSError:
                pass
    return found


def holders(ports: set[int]) -> list[tuple[int, str, int | None]]:
    """``(port, state, pid)`` of each TCP socket on this machine bound to one of ``ports``
    (pid None: a socket no process holds any more, or one this process may not see)."""
    return sorted((c.laddr.port, c.status, c.pid) for c in psutil.net_connections("tcp")
                  if c.laddr and c.laddr.port in ports)
