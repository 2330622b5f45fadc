"""What a person sees: JupyterLab in headless Chromium runs the tutorials.

Starts one `jupyter lab` on 127.0.0.1 (temporary config, token, root; each test its own folder,
workspace and kernels, shut down after it), drives Debian's chromium
through Playwright (``executable_path``: no test tool downloads a browser), runs notebooks 00
and 02 whole and, of the others, the cells a page needs (``run_cells``: the notebook tests
run every cell, once per run; notebook 13 whole, then its playground used and the notebook
saved), and checks the cluster panel, the step views, the live loss
plot and its Stop button, and the browser console. Screenshots go to the folder printed at
the start of the tier (``DTFLAB_SCREENSHOTS``, default ``./screenshots``).
"""

import io
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

import pytest

from bokeh_page import DATA, LABELS_FIT, RANGE_AGAIN, TITLES_FIT, WHERE
from conftest import LASTING, free_ports, not_here, wait_until

from dtflab import exercises
from dtflab.ui.memory_planner import COLOURS
from dtflab.ui.panel import AS_THEY_RAN

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]
SHOTS = Path(os.environ.get("DTFLAB_SCREENSHOTS", ROOT / "screenshots"))
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# A browser, JupyterLab and a kernel training on 3 tasks share 2 cores: the data-parallel test
# took 132 s on a quiet machine and CI machines were measured 1.7x slower, near the default
# 300 s limit; a hang still ends here, with the stacks printed.
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module", autouse=True)
def chromium_here():
    """Every test here needs Debian's chromium (skipped without it, before the module's lab
    starts; a failure under CI=true)."""
    if not Path(CHROMIUM).exists():
        not_here(f"BROWSER TIER NOT RUN: no chromium at {CHROMIUM}; install it with "
                 f"`apt-get install chromium` (.ci/run does)")

# Asynchronous, late in a notebook that ran several clusters: where runs used to stall
# (README, "The asynchronous stall"); the watchdog would now say so under the plot.
LIVE_CELL = """# (added by the browser test) a long run to watch, stopped with the Stop button; each
# worker sleeps 50 ms a step, so the run leaves the browser a core to draw with
live = train.async_parameter_server(problem, dtflab.start_cluster(ps=1, workers=2),
                                    steps=1_000_000, background=True, name="live",
                                    slow={"worker:0": 0.05, "worker:1": 0.05})
live_dashboard = Dashboard(live, interval_s=0.25)
live_dashboard"""

#: Rows in every ColumnDataSource of every Bokeh document on the page, by document (a view
#: rendered again leaves its old document empty: not listed).
PAGE_SOURCES = """() => { if (!window.Bokeh) return 'no BokehJS on the page';
    const docs = new Set(Bokeh.documents || []);
    try {  // after a view renders again, BokehJS's index lists a key twice and throws
        for (const view of Object.values(Bokeh.index || {})) docs.add(view.model.document);
    } catch (error) { if (docs.size === 0) throw error; }
    return [...docs].map(d => [...d._all_models.values()]
        .filter(m => typeof m.get_length === 'function').map(m => m.get_length()))
        .filter(lengths => lengths.length > 0); }"""
ALL_EXECUTED = """() => { const nb = window.jupyterapp.shell.currentWidget;
    const cells = nb.content.widgets.filter(c => c.model.type === 'code');
    return nb.sessionContext.session.kernel.status === 'idle'
        && cells.every(c => c.model.executionCount !== null); }"""
KERNEL_IDLE = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.status === 'idle'; }"""
UNFINISHED = """() => { const nb = window.jupyterapp.shell.currentWidget;
    const cells = nb.content.widgets.filter(c => c.model.type === 'code');
    const open = cells.filter(c => c.model.executionCount === null);
    const first = open[0];
    const text = first ? first.model.outputs.toJSON().map(o => o.text || JSON.stringify(o.data || o.evalue || '')).join('') : '';
    return `kernel ${nb.sessionContext.session.kernel.status}; ${open.length} of ${cells.length} code cells `
        + `unfinished; the first: ${first ? JSON.stringify(first.model.sharedModel.getSource().slice(0, 200)) : '-'}`
        + `; its output ends ${JSON.stringify(text.slice(-300))}`; }"""
#: Resolves after two animation frames: a paint requested before it has run.
FRAMES = "() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"
#: How long a test waits for what it expects on the page (an element, a drawn plot, a kernel's
#: answer): a wait that succeeds ends at once, so this is what a loaded machine may need, short
#: of the module's timeout; a shorter wait would be a timed assertion.
PATIENCE_S = 240
#: How long a notebook's Run All may take in the browser.
RUN_ALL_S = 300
#: url -> (the lab server's pid, its log): where a hung kernel's stacks are printed.
SERVERS = {}
ERROR_OUTPUTS = """() => window.jupyterapp.shell.currentWidget.content.widgets
    .filter(c => c.model.type === 'code')
    .flatMap(c => c.model.outputs.toJSON())
    .filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue)"""


@pytest.fixture(scope="module", autouse=True)
def announce_screenshots():
    SHOTS.mkdir(parents=True, exist_ok=True)
    print(f"\nbrowser tier: screenshots in {SHOTS}")


class Lab(NamedTuple):
    """One test's share of the module's JupyterLab: its own copy of the notebooks under
    ``root`` and its own workspace (nothing of an earlier test's layout is restored)."""

    url: str  # the server's
    token: str
    root: Path  # this test's folder in the server's root: root / "notebooks" / ...

    def address(self, notebook: str) -> str:
        name = self.root.name
        return f"{self.url}/lab/workspaces/{name}/tree/{name}/notebooks/{notebook}?token={self.token}"


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 for the module's tests: ``(url, token, root, pid)``;
    stopped afterwards."""
    home = tmp_path_factory.mktemp("lab")
    root, config = home / "root", home / "config"
    root.mkdir()
    (config / "labconfig").mkdir(parents=True)
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    (port,), token = free_ports(1), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / "ipython"))
    env.pop("DTFLAB_LOGDIR", None)  # each test's runs go to runs/<notebook> beside it, as a learner's
    env.pop("DTFLAB_PROFILE", None)  # and their traced steps keep their profiles, as a learner's
    startup = home / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-stacks-on-sigusr1.py").write_text(
        "import faulthandler, signal\nfaulthandler.register(signal.SIGUSR1, all_threads=True)\n")
    log = open(home / "lab.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.allow_root=True"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    SERVERS[url] = (server.pid, home / "lab.log")
    try:
        assert wait_until(lambda: lab_api(url, token, "status") is not None, timeout=PATIENCE_S), (
            (home / "lab.log").read_text()[-3000:])
        yield url, token, root, server.pid
    finally:
        server.terminate()  # shuts its kernels down; their task processes follow them
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.fixture
def lab(lab_server):
    """This test's :class:`Lab`; afterwards its kernels are shut down, and waited for with
    every process they started, before the next test begins."""
    import psutil

    url, token, root, pid = lab_server
    mine = root / f"t{len(list(root.iterdir()))}"
    shutil.copytree(ROOT / "notebooks", mine / "notebooks")
    yield Lab(url, token, mine)
    kernels = kernels_of(pid)
    started = kernels + [child for kernel in kernels for child in kernel.children(recursive=True)]
    for session in lab_api(url, token, "sessions") or []:
        lab_api(url, token, f"sessions/{session['id']}", method="DELETE")
    gone, alive = psutil.wait_procs(started, timeout=60)
    assert not alive, f"still running 60 s after its kernel was shut down: {alive}"


def kernels_of(server: int) -> list:
    """The kernel processes (``psutil``) of the lab server whose pid is ``server``."""
    import psutil

    return [p for p in psutil.Process(server).children(recursive=True)
            if "ipykernel_launcher" in " ".join(p.cmdline())]


def lab_api(url, token, path, method="GET"):
    """JupyterLab's REST answer to ``path`` as JSON (``None`` where there is none, or the
    server does not answer)."""
    request = urllib.request.Request(f"{url}/api/{path}", method=method,
                                     headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            body = answer.read()
    except OSError:
        return None
    return json.loads(body) if body else None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One chromium for the module's tests; each test has a context of its own (``page``).
    Its processes are the module's (``conftest.LASTING``), not a test's leftovers."""
    import concurrent.futures

    import psutil
    from playwright.sync_api import sync_playwright

    before = {child.pid for child in psutil.Process().children()}
    manager = sync_playwright()
    with manager as playwright:
        LASTING.update(child.pid for child in psutil.Process().children() if child.pid not in before)
        # Playwright writes a screenshot's file on its event loop's thread pool: one thread,
        # started here with the module's browser, not inside the test that first saves one
        # (whose leak check would count it)
        manager._loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="playwright-files"))
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        warm = browser.new_page()
        warm.screenshot(path=tmp_path_factory.mktemp("browser") / "blank.png")
        warm.close()
        yield browser
        browser.close()
    LASTING.clear()


@pytest.fixture
def page(browser):
    """A page in a fresh browser context (no cookie, storage or cache of an earlier test's),
    its console's errors kept in ``page.console_errors``."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.console_errors, page.console_all = [], []
    page.on("console", lambda m: m.type == "error" and not tensorboards_fonts(m)
            and page.console_errors.append(m.text))
    page.on("console", lambda m: page.console_all.append(f"{m.type}: {m.text[:300]}"))
    page.on("pageerror", lambda e: page.console_errors.append(str(e)))
    yield page
    context.close()


def tensorboards_fonts(message) -> bool:
    """Whether a console message is TensorBoard's page failing to load its Roboto font: its
    stylesheet names the font files from the server's root (``/font-roboto/...``), which behind
    the notebook server's ``/proxy/PORT/`` is the notebook server's, and has none (TensorBoard's
    own; the page falls back to another font)."""
    return "/font-roboto/" in message.location.get("url", "")


def open_and_run_all(page, lab, notebook):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(lab.address(notebook))
    page.wait_for_selector(".jp-Notebook", timeout=PATIENCE_S * 1000)
    page.wait_for_function(KERNEL_IDLE, timeout=PATIENCE_S * 1000)
    # Not awaited: execute()'s promise ends with the last cell, and evaluate() has no timeout.
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    try:
        page.wait_for_function(ALL_EXECUTED, timeout=RUN_ALL_S * 1000, polling=1000)
    except PlaywrightTimeout:
        raise AssertionError(f"{notebook} did not finish in {RUN_ALL_S} s; "
                             f"{page.evaluate(UNFINISHED)}\n{kernel_stacks(lab.url)}") from None
    assert page.evaluate(ERROR_OUTPUTS) == []


def assert_readable(page) -> None:
    """The page said no error in its console, and every plot laid out on it has its title lines
    inside its canvas (measured on the page: a title cut off at the edge is half a sentence)."""
    assert page.console_errors == []
    cut = [fit for fit in page.evaluate(TITLES_FIT) if fit[1] > fit[2]]
    assert cut == [], f"titles past their canvas' edge ([title, its end, the canvas' width]): {cut}"


def kernel_stacks(url) -> str:
    """Every thread's stack in the lab's kernels (faulthandler, armed by the startup file the
    ``lab_server`` fixture writes, prints them to the server's log on SIGUSR1), the main thread first."""
    server, log = SERVERS[url]
    start = log.stat().st_size
    kernels = kernels_of(server)
    for kernel in kernels:
        kernel.send_signal(signal.SIGUSR1)
    time.sleep(2)
    with open(log, "rb") as text:
        text.seek(start)
        return f"kernel stacks ({len(kernels)} kernel(s)):\n" + text.read().decode(errors="replace")[:8000]


def ink(png: bytes) -> int:
    """How many pixels of a screenshot are not (near) white: 0 means nothing was drawn."""
    from PIL import Image

    histogram = Image.open(io.BytesIO(png)).convert("L").histogram()
    return sum(histogram[:200])


def reveal(locator):
    """Scrolls ``locator`` into view without Playwright's wait for it to hold still: while a
    live plot streams, JupyterLab's windowed notebook keeps re-laying cells out, and on a busy
    machine that wait ran out (CI: "waiting for element to be stable", 9 s)."""
    locator.wait_for(state="attached")
    locator.evaluate("e => e.scrollIntoView({block: 'nearest'})")


def shot(page, locator, path=None) -> bytes:
    """A screenshot of ``locator`` clipped from the page, taken without waiting for the element
    to hold still (see ``reveal``), once it has a box: a live plot's canvas is replaced when its
    run ends (``LiveBokehModel.refresh`` draws every point again), and has none meanwhile."""
    reveal(locator)
    boxes = []

    def laid_out():
        boxes.append(locator.bounding_box())
        return bool(boxes[-1] and boxes[-1]["width"] > 0 and boxes[-1]["height"] > 0)

    assert wait_until(laid_out, timeout=PATIENCE_S, interval=0.1), "the element is not on the page"
    return page.screenshot(path=path, clip=boxes[-1])


def painted(page, locator, least: int, path=None, canvases: int = 1, timeout: float = PATIENCE_S) -> bytes:
    """A screenshot of ``locator`` once it holds ``canvases`` canvases and ``least`` pixels of
    ink (Bokeh paints on a later animation frame, later still on a loaded machine); the last
    one taken if that does not happen within ``timeout`` s (the caller's assertion says so)."""
    shots = []

    def ready():
        if locator.locator("canvas").count() < canvases:
            return False
        shots.append(shot(page, locator))
        return ink(shots[-1]) > least

    wait_until(ready, timeout=timeout, interval=0.25)
    assert locator.locator("canvas").count() >= canvases, \
        f"{locator.locator('canvas').count()} canvases of {canvases} after {timeout:g} s"
    if path is not None:
        Path(path).write_bytes(shots[-1])
    return shots[-1]


def phases():
    """``mark(name)`` prints the seconds since ``phases()`` (in a failure's captured output)."""
    start = time.monotonic()
    return lambda name: print(f"{time.monotonic() - start:6.1f} s  {name}", flush=True)


def cell_containing(page, text):
    index = page.evaluate("""(text) => window.jupyterapp.shell.currentWidget.content.widgets
        .findIndex(c => c.model.sharedModel.getSource().includes(text))""", text)
    assert index >= 0, f"no cell contains {text!r}"
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


SOLVE_BY_HAND = """([code, learner]) => { const nb = window.jupyterapp.shell.currentWidget;
    const cell = nb.content.widgets[learner].model.sharedModel;
    cell.setSource(cell.getSource().replace(/^answer = None .*$/m, () => code));
    nb.content.activeCellIndex = learner;
    window.jupyterapp.commands.execute('notebook:run-all-below'); }"""


def solve_by_hand(page):
    """What a learner who gives up does: opens the solution, puts its lines in place of
    ``answer = None`` in their cell, and runs it and the check below (not awaited: see
    ``open_and_run_all``)."""
    notebook = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.model.toJSON()")
    (at,) = [i for i, cell in enumerate(notebook["cells"]) if exercises.is_solution(cell)]
    page.evaluate(SOLVE_BY_HAND, [exercises.solution_code(notebook["cells"][at]), at - 2])


def run_cells(page, lab, notebook: str, pick) -> None:
    """Run, as a notebook of its own in the page, the code cells of ``notebook`` that
    ``pick(code, source)`` returns (``code`` its code cells, ``source(cell)`` a cell's text):
    the notebook tests run all of it; here the page is the subject."""
    cells = json.loads((lab.root / "notebooks" / notebook).read_text())
    code = [cell for cell in cells["cells"] if cell["cell_type"] == "code"]
    cells["cells"] = pick(code, lambda cell: "".join(cell["source"]))
    (lab.root / "notebooks" / f"part_of_{notebook}").write_text(json.dumps(cells))
    open_and_run_all(page, lab, f"part_of_{notebook}")


def cells_with(*snippets):
    """A ``run_cells`` pick: the first code cell (the set-up) and, in the notebook's order, each
    code cell that contains one of ``snippets``; each snippet must be in some cell."""
    def pick(code, source):
        for snippet in snippets:
            assert any(snippet in source(cell) for cell in code), f"no code cell has {snippet!r}"
        return [cell for i, cell in enumerate(code)
                if i == 0 or any(snippet in source(cell) for snippet in snippets)]
    return pick


def test_quickstart_shows_the_cluster_panel_row_by_row(lab, page):
    open_and_run_all(page, lab, "00_quickstart.ipynb")
    panel = cell_containing(page, "%dtf_cluster start 3").locator(".dtflab-cluster-panel").first
    reveal(panel)
    rows = panel.locator("tr.dtflab-task")
    assert rows.count() == 3
    assert [rows.nth(i).get_attribute("data-task") for i in range(3)] == ["ps:0", "worker:0", "worker:1"]
    # The notebook ended by stopping this cluster: the panel followed.
    assert {rows.nth(i).get_attribute("data-state") for i in range(3)} == {"stopped"}
    # ... and still shows the tasks as they ran (their pids), and says so: not an empty table
    assert AS_THEY_RAN in panel.inner_text(), panel.inner_text()
    pids = [rows.nth(i).locator("td.dtflab-state + td").inner_text().strip() for i in range(3)]
    assert all(pid.isdigit() for pid in pids), pids
    # Run All left the exercise open; the learner copies the solution into their cell and runs it.
    check = cell_containing(page, "exercises.check(answer")
    assert check.locator(".jp-OutputArea").inner_text().strip() == exercises.OPEN
    solution = cell_containing(page, exercises.MAGIC)
    reveal(solution)
    assert "hello_on" not in solution.inner_text(), "Run All showed the collapsed solution"
    assert solution.locator(".jp-OutputArea").inner_text().strip() == exercises.NOT_APPLIED
    shot(page, page.locator(".jp-Notebook"), str(SHOTS / "exercise_open.png"))
    solve_by_hand(page)
    assert wait_until(lambda: check.locator(".jp-OutputArea").inner_text().strip() == "correct",
                      timeout=PATIENCE_S), check.locator(".jp-OutputArea").inner_text()
    legacy_cell = cell_containing(page, "--name legacy")  # the learner's cell, now
    reveal(legacy_cell)
    legacy = legacy_cell.locator("tr.dtflab-task")
    assert legacy.count() == 3
    assert {legacy.nth(i).get_attribute("data-state") for i in range(3)} == {"running"}
    assert legacy.first.locator("td.dtflab-state").text_content().strip() == "running"
    shot(page, panel, str(SHOTS / "cluster_panel.png"))
    shot(page, legacy_cell, str(SHOTS / "cluster_panel_running.png"))
    assert_readable(page)


def test_data_parallel_views_render_and_the_live_plot_streams_until_stopped(lab, page):
    # Notebook 03's set-up, its synchronous run and that run's traced step, then a live run.
    url = lab.url
    picked = cells_with("%dtf_cluster start", "problem = train.exp_regression()", "parallel = run.wait()",
                        "step = parallel.trace")
    live_cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                 "source": LIVE_CELL}
    mark = phases()
    run_cells(page, lab, "03_sync_data_parallelism.ipynb",
              lambda code, source: picked(code, source) + [live_cell])
    mark("notebook 03's cells ran")

    views = cell_containing(page, "step.show()")
    reveal(views)
    # the partition graph, the timeline and the transfer matrix
    drawn = painted(page, views.locator(".jp-OutputArea"), 20_000, SHOTS / "step_views.png", canvases=3)
    assert ink(drawn) > 20_000, "the partition graph and timeline drew nothing"
    mark("step views drawn")

    live = cell_containing(page, "added by the browser test")
    reveal(live)
    plot = live.locator("canvas").first
    plot.wait_for(timeout=PATIENCE_S * 1000)
    painted(page, plot, 1_000, canvases=0)  # the first render's frame and legend: compare drawn states only
    status = live.locator(".widget-html-content").last
    first = shot(page, plot)
    mark("live plot painted")
    # on a loaded machine a first step that stalls is retried by the watchdog after 30 s
    if not wait_until(lambda: shot(page, plot) != first, timeout=PATIENCE_S, interval=0.5):
        shot(page, live, str(SHOTS / "live_dashboard_unchanged.png"))
        kernel = page.evaluate(KERNEL_PRINT_WITHIN, [
            "print(live.history.steps_per_worker, repr(live.history.status), live.done, live.error)", 10_000])
        pytest.fail(f"the live loss plot did not change in {PATIENCE_S} s; the run says {status.inner_text()!r}, "
                    f"the browser console {page.console_errors}; in the kernel: {kernel}\n"
                    f"the page's plot sources: {page.evaluate(PAGE_SOURCES)}\n"
                    f"all console lines: {page.console_all[-40:]}\n"
                    f"{kernel_stacks(url)}")
    mark("live plot changed")
    shot(page, live, str(SHOTS / "live_dashboard.png"))
    live.get_by_role("button", name="Stop").dispatch_event("click")  # no wait for a still layout
    assert wait_until(lambda: "steps in" in status.inner_text(), timeout=PATIENCE_S), status.inner_text()
    mark("stopped")
    assert live.get_by_role("button", name="Stop").is_disabled()
    def settled():  # the page may still be drawing the last update when Stop takes effect
        before = shot(page, plot)
        page.wait_for_timeout(1500)
        return shot(page, plot) == before

    assert wait_until(settled, timeout=PATIENCE_S, interval=0.1), "the plot kept changing after Stop"
    shot(page, live, str(SHOTS / "live_dashboard_stopped.png"))
    assert_readable(page)


LIVE_MODEL_CELL = """from bokeh.models import ColumnDataSource
from bokeh.plotting import figure
from dtflab.viz.live_model import LiveBokehModel
from dtflab.viz.output import load_bokehjs

load_bokehjs()
source = ColumnDataSource({"x": [], "y": []})
plot = figure(height=200, width=400)
plot.line("x", "y", source=source)
live = LiveBokehModel(plot)
live"""
#: What a view that began in the middle of a patch has left to read of it: its last fragment(s).
STRAY_THEN_STREAM = """live.send({"msg": "patch", "payload": "{}"})
for i in range(10):
    source.stream({"x": [len(source.data["x"])], "y": [i % 3]})
print(len(source.data["x"]))"""


def test_a_live_plot_whose_view_began_mid_message_draws_every_later_point(lab, page):
    # The live dashboard's blank plot (issue 33): a view constructed between the fragments of a
    # patch read every later patch out of step and dropped it, silently. Here the view is told
    # one and then two fragments it cannot place, as such a view would be, before the points.
    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                           "source": LIVE_MODEL_CELL}],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                            "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    (lab.root / "notebooks" / "live_model.ipynb").write_text(json.dumps(notebook))
    open_and_run_all(page, lab, "live_model.ipynb")
    cell_containing(page, "LiveBokehModel(plot)").locator("canvas").first.wait_for(timeout=PATIENCE_S * 1000)
    for stray, rows in ((1, 10), (2, 20)):  # one fragment out of step, then two in all
        assert page.evaluate(KERNEL_PRINT_WITHIN, [STRAY_THEN_STREAM, 30_000]) == str(rows)
        assert wait_until(lambda: page.evaluate(PAGE_SOURCES) == [[rows]], timeout=PATIENCE_S), (
            f"after {stray} stray fragment(s) the page holds {page.evaluate(PAGE_SOURCES)} rows, "
            f"the kernel {rows}; console: {page.console_all[-10:]}")
    # The page's echo of the patches and its autoscaled ranges stayed on the page: the whole
    # document sent again is the kernel's 20 points, drawn over the range they span.
    assert page.evaluate(KERNEL_PRINT_WITHIN, [
        "live.refresh()\nprint(len(source.data['x']), plot.x_range.start)", 30_000]) == "20 nan"
    assert wait_until(lambda: page.evaluate(PAGE_SOURCES) == [[20]], timeout=PATIENCE_S), page.evaluate(PAGE_SOURCES)
    assert_readable(page)


def test_parameter_servers_vs_all_reduce_draws_both_architectures_and_the_live_all_reduce(lab, page):
    # Notebook 08's set-up, its drawing of the two architectures and its live all-reduce run.
    run_cells(page, lab, "08_parameter_servers_vs_all_reduce.ipynb",
              cells_with("%load_ext dtflab", "show(architectures(workers=3))", "dashboard = Dashboard(run)"))
    drawing = cell_containing(page, "show(architectures(workers=3))")
    reveal(drawing)
    drawn = painted(page, drawing.locator(".jp-OutputArea"), 5_000, SHOTS / "architectures.png",
                    canvases=2)  # the ps star and the ring
    assert ink(drawn) > 5_000, "the architectures drew nothing"
    live = cell_containing(page, "dashboard = Dashboard(run)")
    reveal(live)
    status = live.locator(".widget-html-content").last
    assert wait_until(lambda: "steps in" in status.inner_text(), timeout=PATIENCE_S), status.inner_text()
    # the run has ended: the plot draws every point again (``LiveBokehModel.refresh``)
    plot = painted(page, live.locator("canvas").first, 5_000, SHOTS / "all_reduce_dashboard.png",
                   canvases=0)
    assert ink(plot) > 5_000, "the all-reduce run's loss plot is empty"
    assert_readable(page)


def test_pipeline_parallelism_draws_the_measured_bubble_beside_the_formulas(lab, page):
    # Notebook 09's set-up, its picture of the pipeline, its runs for each m and one run's chart.
    run_cells(page, lab, "09_pipeline_parallelism.ipynb",
              cells_with("%load_ext dtflab", "pipeline_picture(problem, cluster", "runs[m] = train.pipeline(",
                         "runs[4].bubble.show()"))
    picture = cell_containing(page, "pipeline_picture(problem, cluster")
    drawn = shot(page, picture.locator(".jp-OutputArea"), str(SHOTS / "pipeline_picture.png"))
    assert ink(drawn) > 5_000, "the pipeline picture drew nothing"
    chart = cell_containing(page, "runs[4].bubble.show()")
    reveal(chart)
    drawn = painted(page, chart.locator(".jp-OutputArea"), 20_000, SHOTS / "pipeline_chart.png",
                    canvases=2)  # the measured step and the formula's
    assert ink(drawn) > 20_000, "the pipeline chart drew nothing"
    assert_readable(page)


def test_tensor_and_sharded_parallelism_draws_the_slices_and_the_bytes_against_the_batch(lab, page):
    # Notebook 10's two pictures, the bytes it measures against the batch and its DTensor layouts.
    run_cells(page, lab, "10_tensor_and_sharded_parallelism.ipynb",
              cells_with("def problem_for(batch)", 'slices_picture(problem, "sharded"',
                         "cluster = dtflab.start_cluster(workers=2)", "crossing = next(", "measured = {}",
                         "Bytes each worker sends per step", "workdir = tempfile.TemporaryDirectory(",
                         "%%writefile $program", "def over_the_wire(layout)", "def reports(run)"))
    for code, name in (('slices_picture(problem, "tensor_parallel"', "tensor_parallel_slices.png"),
                       ('slices_picture(problem, "sharded"', "sharded_slices.png")):
        picture = cell_containing(page, code)
        drawn = shot(page, picture.locator(".jp-OutputArea"), str(SHOTS / name))
        assert ink(drawn) > 5_000, f"the picture of {name} drew nothing"
    plot = cell_containing(page, "Bytes each worker sends per step")
    reveal(plot)
    drawn = painted(page, plot.locator(".jp-OutputArea"), 5_000, SHOTS / "bytes_against_batch.png")
    assert ink(drawn) > 5_000, "the bytes-per-step figure drew nothing"
    layouts = cell_containing(page, "for layout in costs.LAYOUTS:\n    run = dtflab.run")
    reveal(layouts)
    table = layouts.locator(".jp-OutputArea")
    assert wait_until(lambda: "both" in table.inner_text(), timeout=PATIENCE_S), table.inner_text()
    assert_readable(page)


def test_the_memory_planner_draws_moves_with_a_field_and_measures(lab, page):
    # Notebook 11's own cells for the planner: its set-up, the two planners and the check.
    def planners(code, source):
        found = [i for i, cell in enumerate(code) if "dtflab.memory_planner(" in source(cell)]
        picked = [code[0]] + code[found[0]:found[-1] + 2]  # and the check after
        assert "small.errors" in source(picked[-1])
        return picked

    run_cells(page, lab, "11_transformer_memory.ipynb", planners)
    big = cell_containing(page, "planner = dtflab.memory_planner(").locator(".jp-OutputArea")
    reveal(big)
    assert ink(painted(page, big, 5_000, SHOTS / "memory_planner.png")) > 5_000
    big.locator("button", has_text="Measure").click()
    assert wait_until(lambda: "Measure runs one replica" in big.inner_text(), timeout=PATIENCE_S), \
        big.inner_text()[-500:]
    # the small plan, measured in its cell: predicted and measured bars, on the page
    small = cell_containing(page, "small.measure()").locator(".jp-OutputArea")
    reveal(small)
    painted(page, small, 5_000)
    bars = page.evaluate(DATA, "planner_activations")  # the last planner on the page
    assert list(bars["bar"]) == ["predicted", "measured"], bars
    # a field moves the bars: full recomputation keeps less; the old measurement goes
    small.locator(".widget-toggle-buttons", has_text="recompute").locator(
        "button", has_text="full").click()

    def moved():
        now = page.evaluate(DATA, "planner_activations")
        return list(now["bar"]) == ["predicted"] and now["activations"][0] < bars["activations"][0]

    assert wait_until(moved, timeout=PATIENCE_S), page.evaluate(DATA, "planner_activations")
    small.locator("button", has_text="Measure").click()
    # the bars (a Bokeh document) and the text (a widget) reach the page by two channels
    assert wait_until(lambda: len(page.evaluate(DATA, "planner_activations")["bar"]) == 2
                      and "measured vs predicted" in small.inner_text(),
                      timeout=PATIENCE_S), small.inner_text()[-500:]
    shot(page, small, str(SHOTS / "memory_planner_measured.png"))
    # a far larger preset (Llama 3 70B on one device): its bars stand whole inside the plot,
    # however short the first plan's were, also once BokehJS ranges the plot again
    first = page.evaluate(DATA, "planner_activations")
    small.locator("select").first.select_option("Llama 3 70B")

    def taller():
        now = page.evaluate(DATA, "planner_activations")
        return now["activations"][0] > 2 * first["activations"][0] and now["_y"][1] > first["_y"][1]

    wait_until(taller, timeout=PATIENCE_S)
    assert page.evaluate(RANGE_AGAIN, "planner_activations")
    page.evaluate(FRAMES)  # the paint it asked for has run
    now = page.evaluate(DATA, "planner_activations")
    top = sum(now[kind][0] for kind in COLOURS)  # the kinds the planner stacks
    assert now["_y"][0] <= 0 and top <= now["_y"][1], \
        f"the predicted bar reaches {top:.4g} in a plot drawn from {now['_y'][0]:.4g} to {now['_y'][1]:.4g}"
    shot(page, small, str(SHOTS / "memory_planner_llama_3_70b.png"))
    assert_readable(page)


SAVE = "() => window.jupyterapp.commands.execute('docmanager:save')"


def test_after_run_all_the_schedule_playground_redraws_runs_and_the_saved_notebook_stays_small(lab, page):
    # Notebook 13 with Run All, as a learner runs it: its last cell stops the cluster. The
    # playground's formula redraws with a control, and Run still runs (on workers of its own);
    # the notebook JupyterLab saves stays small: BokehJS and the plots' data are not in it.
    notebook = "13_experts_and_schedules.ipynb"
    open_and_run_all(page, lab, notebook)
    widget = cell_containing(page, "dtflab.schedule_playground(").locator(".jp-OutputArea")
    reveal(widget)
    painted(page, widget, 5_000, SHOTS / "schedule_playground.png", canvases=2)
    weights = page.evaluate(DATA, "formula_weights")  # zero bubble: the W pieces
    assert weights and len(weights["label"]) == 2 * 4, weights
    measured = page.evaluate(DATA, "measured_weights")  # the run's cell ran Run
    assert measured and len(measured["label"]) == 2 * 4, measured
    widget.locator(".widget-toggle-buttons button", has_text="gpipe").click()

    def redrawn():
        reveal(widget)
        now = page.evaluate(DATA, "formula_forward")
        return now is not None and "gpipe" in now["_title"]

    assert wait_until(redrawn, timeout=PATIENCE_S), page.evaluate(DATA, "formula_forward")
    assert "(bubble 0.250 of the work)" in widget.inner_text()
    widget.locator("button", has_text="Run").click()

    def ran():
        reveal(widget)  # a windowed notebook lays out only the cells in view
        now = page.evaluate(DATA, "measured_backward")
        return now is not None and len(now["label"]) == 2 * 4 and "Measured" in now["_title"]

    assert wait_until(ran, timeout=PATIENCE_S), widget.inner_text()[-500:]
    text = widget.inner_text()
    assert "measured: idle" in text and "Ran on 2 workers of its own" in text, text[-500:]
    shot(page, widget, str(SHOTS / "schedule_playground_gpipe.png"))
    # what the page shows fits: each bar's label inside its bar, each title inside its canvas
    for name in ("measured_forward", "measured_backward", "formula_forward", "formula_backward"):
        labels = page.evaluate(LABELS_FIT, name)
        # the formula's bars are wide enough to label; a loaded machine's measured ones may not be
        assert labels if name.startswith("formula") else labels is not None, name
        assert [fit for fit in labels if fit[2] > fit[1]] == [], (name, labels)
    assert len(page.evaluate(TITLES_FIT)) >= 2
    saved, committed = lab.root / "notebooks" / notebook, ROOT / "notebooks" / notebook
    before = saved.stat().st_mtime_ns
    page.evaluate(SAVE)
    assert wait_until(lambda: saved.stat().st_mtime_ns != before, timeout=PATIENCE_S), "not saved"
    outputs = [output for cell in json.loads(saved.read_text())["cells"]
               for output in cell.get("outputs", [])]
    assert len(outputs) >= 10  # what Run All printed and drew, saved
    print(f"saved after Run All: {saved.stat().st_size:,} bytes, committed "
          f"{committed.stat().st_size:,}; {len(outputs)} outputs")
    assert saved.stat().st_size <= 1.5 * committed.stat().st_size, \
        (saved.stat().st_size, committed.stat().st_size,
         sorted(((len(json.dumps(o)), list(o.get("data", {}))) for o in outputs), reverse=True)[:5])
    assert_readable(page)


def test_the_plan_of_a_65b_model_draws_its_configuration_map(lab, page):
    # Notebook 14's set-up and its 65 B plan and map (no cluster: the H100 preset).
    def plan_and_map(code, source):
        at = next(i for i, cell in enumerate(code) if "devices=1024" in source(cell))
        assert source(code[at + 1]).strip() == "big.show()"
        return [code[0], code[at], code[at + 1]]

    run_cells(page, lab, "14_plan_a_run.ipynb", plan_and_map)
    figure = cell_containing(page, "big.show()").locator(".jp-OutputArea")
    reveal(figure)
    assert ink(painted(page, figure, 5_000, SHOTS / "plan_map.png")) > 5_000
    cells = page.evaluate(DATA, "plan_cells")
    assert cells and len(cells["tensor"]) >= 4, cells
    # on 1,024 H100s every tensor x pipeline pair has a layout that fits (ZeRO 3 over the data
    # ways): each cell coloured by its MFU, grey only where none fits (the planner's tests
    # draw a map with grey cells, 65 B on 16 devices)
    assert any(cells["fits"]), cells["fits"]
    assert all((colour == "#d9d9d9") != fits
               for colour, fits in zip(cells["colour"], cells["fits"])), cells
    assert cells["_titles"][0].startswith("MFU of each cell's best layout")
    assert any(title.startswith("1024 devices of") for title in cells["_titles"][1:]), cells["_titles"]
    # the table above it, with the file browser open: each layout on one line, none wrapped
    page.evaluate("() => window.jupyterapp.commands.execute('filebrowser:activate')")
    page.wait_for_selector(".jp-FileBrowser", state="visible")
    table = cell_containing(page, "big.table(8)").locator(".dtflab-plan-table tr")
    reveal(table.first)
    heights = [box["height"] for box in (row.bounding_box() for row in table.all()) if box]
    assert len(heights) == 1 + 8 and max(heights) < 1.5 * min(heights), heights
    assert_readable(page)


def test_long_sequences_draws_the_ring_the_imbalance_and_the_mesh_with_its_bytes(lab, page):
    # Notebook 12's set-up, its ring of context parallelism and its 3D mesh.
    run_cells(page, lab, "12_long_sequences_and_3d.ipynb",
              cells_with("cluster = dtflab.start_cluster(ps=0, workers=2", "cp_runs, cp_wires = {}, {}",
                         "def ring_bytes(run)", "busy = {}", 'cp_runs["naive"].trace.show()',
                         "show(layout.picture(sent="))
    for code, name in (("def ring_bytes(run)", "ring.png"),
                       ('busy = {}', "ring_busy.png"),
                       ('cp_runs["naive"].trace.show()', "ring_timeline.png"),
                       ("show(layout.picture(sent=", "mesh_bytes.png")):
        cell = cell_containing(page, code)
        reveal(cell)
        drawn = painted(page, cell.locator(".jp-OutputArea"), 5_000, SHOTS / name)
        assert ink(drawn) > 5_000, f"{name}: the figure drew nothing"
    labels = page.evaluate(DATA, "bytes_tensor")  # the mesh's tensor links, their bytes
    assert labels and len(labels["text"]) == 2, labels
    assert all(text.endswith(("kB", "MB")) for text in labels["text"]), labels
    assert_readable(page)


def test_input_pipelines_list_the_data_service_and_draw_the_wait_on_the_timeline(lab, page):
    # Notebook 16's set-up: the data service from the magic, an input-bound run on the timeline.
    run_cells(page, lab, "16_input_pipelines.ipynb",
              cells_with("%dtf_cluster start 1 --data-workers 2",
                         "problem = train.classification(width=256", "overlap = CPUS >= 2",
                         "show(dtflab.input_timeline(ready, local"))
    panel = cell_containing(page, "--data-workers 2").locator(".dtflab-cluster-panel").first
    reveal(panel)
    rows = panel.locator("tr.dtflab-task")
    assert [rows.nth(i).get_attribute("data-task") for i in range(rows.count())] == [
        "worker:0", "dispatcher:0", "data_worker:0", "data_worker:1"]
    assert {rows.nth(i).get_attribute("data-state") for i in range(4)} == {"running"}
    said = cell_containing(page, "overlap = CPUS >= 2").locator(".jp-OutputArea").inner_text()
    assert "of the time waiting for input" in said, said
    cell = cell_containing(page, "show(dtflab.input_timeline(ready, local")
    reveal(cell)
    drawn = painted(page, cell.locator(".jp-OutputArea"), 3_000, SHOTS / "input_timeline.png")
    assert ink(drawn) > 3_000, "the input timeline drew nothing"
    assert_readable(page)


def test_persistent_workers_print_into_their_cell_live_labelled_by_worker(lab, page):
    # Notebook 15's set-up, its two workers and their strategy, then a cell whose workers print a
    # line a second: the page shows each worker's lines, labelled, while that cell still runs.
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    notebook = "15_workers_cell_by_cell.ipynb"
    cells = json.loads((lab.root / "notebooks" / notebook).read_text())
    code = [cell for cell in cells["cells"] if cell["cell_type"] == "code"]
    kept = ("%dtf_workers start 2", "strategy = tf.distribute.MultiWorkerMirroredStrategy()")
    picked = [cell for i, cell in enumerate(code)
              if i == 0 or any(text in "".join(cell["source"]) for text in kept)]
    assert len(picked) == 3
    ticking = "%%dtf_px\nimport time\nfor second in range(8):\n    print('second', second)\n" \
              "    time.sleep(1)"
    cells["cells"] = picked + [dict(picked[-1], source=ticking, outputs=[], id="ticking"),
                               dict(picked[-1], source="%dtf_workers stop", outputs=[], id="stop")]
    (lab.root / "notebooks" / f"part_of_{notebook}").write_text(json.dumps(cells))
    page.goto(lab.address(f"part_of_{notebook}"))
    page.wait_for_selector(".jp-Notebook", timeout=PATIENCE_S * 1000)
    page.wait_for_function(KERNEL_IDLE, timeout=PATIENCE_S * 1000)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    cell = cell_containing(page, "print('second', second)")

    def said() -> str:
        reveal(cell)
        return cell.locator(".jp-OutputArea").inner_text()

    assert wait_until(lambda: "[worker:0] second 1" in said() and "[worker:1] second 1" in said(),
                      timeout=PATIENCE_S), said()
    assert "second 7" not in said(), said()  # shown as it came, not once the cell ended
    shot(page, cell, str(SHOTS / "workers_live_output.png"))
    try:
        page.wait_for_function(ALL_EXECUTED, timeout=PATIENCE_S * 1000, polling=1000)
    except PlaywrightTimeout:
        raise AssertionError(f"the workers' cells did not finish: {said()}") from None
    for worker in ("worker:0", "worker:1"):
        assert f"[{worker}] second 7" in said()
        built = cell_containing(page, "MultiWorkerMirroredStrategy()")
        reveal(built)
        assert f"[{worker}] I am worker {worker[-1]}; replicas in sync: 2" in \
            built.locator(".jp-OutputArea").inner_text()
    assert page.evaluate(ERROR_OUTPUTS) == []
    assert_readable(page)


KERNEL_PRINT = """async (code) => {
    const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    const future = kernel.requestExecute({code, store_history: false});
    let out = "";
    future.onIOPub = (msg) => { if (msg.header.msg_type === "stream") out += msg.content.text; };
    await future.done;
    return out.trim();
}"""


KERNEL_PRINT_WITHIN = """async ([code, ms]) => {
    const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    const future = kernel.requestExecute({code, store_history: false});
    let out = "";
    future.onIOPub = (msg) => { if (msg.header.msg_type === "stream") out += msg.content.text; };
    const late = new Promise(done => setTimeout(() => done("no answer"), ms));
    return (await Promise.race([future.done.then(() => out.trim()), late]));
}"""


def test_dragging_a_chip_moves_the_variable_in_the_kernel_and_measures_the_new_bytes(lab, page):
    open_and_run_all(page, lab, "02_placement_lab.ipynb")
    board = cell_containing(page, "editor = PlacementEditor(").locator(".dtflab-placement").first
    reveal(board)
    chip = board.locator(".dtflab-chip[data-variable='w1']")
    start = chip.locator("xpath=ancestor::div[contains(@class,'dtflab-device')]").get_attribute("data-device")
    target = "master:0"  # the compute device: w1 no longer crosses the wire
    rows = board.locator("tr.dtflab-history-row")
    before = rows.count()
    assert page.evaluate(KERNEL_PRINT, "print(editor.plan.device_for('w1'))").endswith(start.replace("ps:", "task:"))
    # Drag with the mouse: press on the chip, move over the other device's box, release.
    chip.evaluate("e => e.scrollIntoView({block: 'center'})")  # not under the notebook's toolbar
    chip.element_handle().wait_for_element_state("stable")
    box = chip.bounding_box()
    drop = board.locator(f".dtflab-device[data-device='{target}']").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(drop["x"] + drop["width"] / 2, drop["y"] + drop["height"] - 12, steps=12)
    page.mouse.up()
    moved = board.locator(f".dtflab-device[data-device='{target}'] .dtflab-chip[data-variable='w1']")
    try:
        moved.wait_for(timeout=PATIENCE_S * 1000)  # the kernel changed the plan and sent the chips back
    except Exception:
        shot(page, board, str(SHOTS / "placement_board_drag_failed.png"))
        state = page.evaluate(KERNEL_PRINT, "print(editor.plan.device_for('w1'), repr(editor.board.status), editor._undo[-1:] and editor._undo[-1][1])")
        ghosts = page.evaluate("document.querySelectorAll('.dtflab-ghost').length")
        raise AssertionError(f"w1 did not reach {target}; kernel: {state}; ghosts {ghosts}; "
                             f"console: {page.console_errors}") from None
    assert page.evaluate(KERNEL_PRINT, "print(editor.plan.device_for('w1'))") == "/job:master/task:0"
    assert wait_until(lambda: rows.count() == before + 1, timeout=PATIENCE_S), "no traced step after the drag"
    last = rows.nth(before)
    assert "w1 → " + target in last.inner_text()
    measured = int(page.evaluate(KERNEL_PRINT, "print(sum(t.nbytes for t in editor.step.transfers))"))
    assert f"{measured:,}" in last.locator(".dtflab-bytes").inner_text()
    earlier = rows.nth(before - 1).locator(".dtflab-bytes").inner_text().split(" ")[0]
    assert measured < int(earlier.replace(",", "")) - 32_768  # w1's 32 KiB no longer cross
    # The keyboard does the same: focus the chip, press the number of its old device.
    home = board.locator(f".dtflab-device[data-device='{start}']")
    number = home.locator(".dtflab-device-name").inner_text().split(" ")[0]
    moved.focus()
    page.keyboard.press(number)
    home.locator(".dtflab-chip[data-variable='w1']").wait_for(timeout=PATIENCE_S * 1000)
    assert wait_until(lambda: rows.count() == before + 2, timeout=PATIENCE_S)
    shot(page, board, str(SHOTS / "placement_board.png"))  # docs/placement_board.png is one
    # Below the board: the partition graph, collapsed by scope. Click a scope: it opens.
    before = page.evaluate(DATA, "ops")
    sizes = {scope: int(kind.split()[0]) for scope, kind in zip(before["scope"], before["type"]) if scope}
    assert sizes, f"the partition graph is not collapsed: {before['_title']}"
    scope = max(sizes, key=sizes.get)  # the biggest scope: "gradients"
    at = page.evaluate(WHERE, ["ops", "scope", scope])
    page.mouse.click(at["x"], at["y"])

    def opened():
        names = page.evaluate(DATA, "ops")["name"]
        return any(name.startswith(scope + "/") and name != scope + "/" for name in names)

    assert wait_until(opened, timeout=PATIENCE_S), f"clicking {scope!r} did not open it"
    assert_readable(page)


@pytest.fixture
def site(built_site):
    """The built documentation site served on 127.0.0.1 (its search loads an index over HTTP)."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=built_site[0]))
    thread = threading.Thread(target=server.serve_forever, name="docs-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


#: For each ``mfrac`` on the page: whether its denominator is drawn below its numerator (a
#: browser that does not lay out MathML puts them side by side, as text).
FRACTIONS_STACKED = """() => [...document.querySelectorAll('mfrac')].map(f => {
    const [top, bottom] = [f.children[0], f.children[1]].map(c => c.getBoundingClientRect());
    return bottom.top >= top.bottom - 1 && top.height > 0; })"""


@pytest.mark.docs
@pytest.mark.timeout(3000)  # builds the site first if test_docs has not: executing what is missing
def test_the_site_shows_a_guide_page_the_api_a_tutorial_plot_and_finds_by_search(site, built_site, page):
    # Nothing but the site itself reaches the page: what it needs, it ships (a CDN would hide it)
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(site)
               else route.abort())
    page.goto(f"{site}/guide/notebook.html")
    assert page.locator("h1").first.inner_text().startswith("In a notebook")
    assert page.locator("table").count() >= 1  # the %dtf_cluster table

    page.goto(f"{site}/api/generated/dtflab.cluster.html")
    signature = page.locator("[id='dtflab.cluster.start_cluster']")
    assert signature.count() == 1 and "start_cluster" in signature.inner_text()

    page.goto(f"{site}/tutorials/en/01_model_parallelism.html")
    page.wait_for_function("() => window.Bokeh && Object.keys(window.Bokeh.index).length > 0", timeout=PATIENCE_S * 1000)
    canvases = page.locator(".cell_output canvas")  # Playwright's selectors pierce Bokeh's shadow roots
    plot = next(c for c in canvases.all() if (c.bounding_box() or {}).get("width", 0) > 100)
    assert ink(painted(page, plot, 5_000, SHOTS / "site_tutorial_plot.png", canvases=0)) > 5_000, \
        "the tutorial's plot is empty"

    page.goto(f"{site}/tutorials/en/09_pipeline_parallelism.html")
    assert page.locator("div.math math").count() == 2  # the bubble and the step model
    stacked = page.evaluate(FRACTIONS_STACKED)
    assert stacked == [True] * 3, stacked  # (p - 1) / (m + p - 1), t / m and w / m, drawn offline
    assert "$$" not in page.locator("main").inner_text()
    shot(page, page.locator("div.math").first, str(SHOTS / "site_formula.png"))

    # the schedule playground's still fits the page's column (its last labels and legend were cut)
    page.goto(f"{site}/tutorials/en/13_experts_and_schedules.html")
    page.wait_for_function("() => window.Bokeh && Object.keys(window.Bokeh.index).length > 0", timeout=PATIENCE_S * 1000)
    column = page.locator("article.bd-article").first.bounding_box()
    playground = page.locator(".dtflab-still", has_text="bubble").first
    painted(page, playground, 5_000, SHOTS / "site_schedule_playground.png")
    edges = [box["x"] + box["width"] for box in (c.bounding_box() for c in playground.locator("canvas").all()) if box]
    assert edges and max(edges) <= column["x"] + column["width"], (edges, column)

    # the memory planner, which needs a kernel, shows a still of itself: its bars, drawn
    page.goto(f"{site}/tutorials/en/11_transformer_memory.html")
    page.wait_for_function("() => window.Bokeh && Object.keys(window.Bokeh.index).length > 0", timeout=PATIENCE_S * 1000)
    still = page.locator(".dtflab-still").first
    assert "the fullest holds" in still.inner_text()
    assert ink(painted(page, still, 5_000, SHOTS / "site_memory_planner.png")) > 5_000

    # every tutorial page, both editions: no formula left as typed, no widget left as an empty
    # placeholder (each shows a still of itself, with text), the dashboards' stills drawn
    tutorials = sorted((Path(built_site[0]) / "tutorials").glob("*/[0-9][0-9]_*.html"))
    assert len(tutorials) == 2 * len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    stills = {}
    for tutorial in tutorials:
        address = tutorial.relative_to(built_site[0]).as_posix()
        page.goto(f"{site}/{address}")
        assert "$$" not in page.locator("main").inner_text(), address
        empty = page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
        assert empty == 0, f"{address}: {empty} widgets with nothing in their place"
        texts = page.locator(".dtflab-still").all_inner_texts()
        assert all(len(text.strip()) > 20 for text in texts), (address, texts)
        stills[address] = len(texts)
    assert stills["tutorials/en/00_quickstart.html"] >= 3, stills  # the cluster panels
    page.goto(f"{site}/tutorials/en/03_sync_data_parallelism.html")
    page.wait_for_function("() => window.Bokeh && Object.keys(window.Bokeh.index).length > 0", timeout=PATIENCE_S * 1000)
    dashboard = page.locator(".dtflab-still", has_text="as the finished run left it").first
    assert ink(painted(page, dashboard, 5_000, SHOTS / "site_dashboard.png")) > 5_000

    page.goto(f"{site}/search.html?q=start_cluster")
    results = page.locator("#search-results li a")
    results.first.wait_for(timeout=PATIENCE_S * 1000)
    assert any("start_cluster" in text for text in results.all_inner_texts())
    assert_readable(page)


#: Google Charts, which XProf's page loads from www.gstatic.com before it starts (unreachable
#: here: nothing outside the package indexes is); a stub in its place lets the page start, and
#: the trace viewer draws without it. A learner offline sees a blank Profile tab; on Binder
#: the page reaches gstatic.com itself.
CHARTS_STUB = ("window.google = window.google || {}; google.charts = {load: () => Promise.resolve(),"
               " safeLoad: () => Promise.resolve(), setOnLoadCallback: (done) => setTimeout(done)};")


def test_tensorboard_in_the_page_draws_the_runs_their_hparams_and_each_workers_traced_step(lab, page):
    # Notebook 08's runs (all-reduce over two workers, a parameter server, one process, a traced
    # all-reduce step) and its last cell: TensorBoard in the page, through the notebook server.
    run_cells(page, lab, "08_parameter_servers_vs_all_reduce.ipynb",
              cells_with("%load_ext dtflab", "problem = train.classification(width=1024 if FULL",
                         "reduced = run.wait()",
                         "traced = train.all_reduce(problem, workers=2, steps=6, trace_step=3)",
                         "dtflab.tensorboard()"))
    runs = lab.root / "notebooks" / "runs"  # beside the notebook, where a learner's go
    # a folder for this notebook's runs alone (JupyterLab tells the kernel its notebook: here
    # run_cells's copy of the cells it runs)
    assert [path.name for path in runs.iterdir()] == ["part_of_08_parameter_servers_vs_all_reduce"]
    runs = runs / "part_of_08_parameter_servers_vs_all_reduce"
    names = sorted(path.name for path in runs.iterdir())
    assert [name.split("-1")[0] for name in names] == [
        "all_reduce-d2", "all_reduce-d2", "single", "sync-d2"], names
    [traced] = [name for name in names if (runs / name / "plugins" / "profile").is_dir()]
    cell = cell_containing(page, "dtflab.tensorboard()")
    reveal(cell)
    frame = cell.locator("iframe")
    frame.wait_for(state="attached", timeout=PATIENCE_S * 1000)
    source = frame.get_attribute("src")  # through the notebook server, as on Binder
    assert re.fullmatch(r"/proxy/\d+/", source), source
    cell.frame_locator("iframe").locator("tb-webapp").wait_for(timeout=PATIENCE_S * 1000)
    shot(page, cell, str(SHOTS / "tensorboard_in_the_page.png"))
    # Scalars: every run's curves (the page's own tab, through the same proxy)
    page.goto(f"{lab.url}{source}#scalars")
    for name in names:
        page.get_by_text(name, exact=True).first.wait_for(timeout=PATIENCE_S * 1000)
    card = page.locator("tf-scalar-card, .tf-scalar-card, tf-line-chart-data-loader").first
    card.wait_for(timeout=PATIENCE_S * 1000)
    assert page.get_by_text("examples_per_s", exact=True).count() >= 1
    chart = page.locator("vz-line-chart2").first
    assert wait_until(lambda: ink(shot(page, chart)) > 2_000, timeout=PATIENCE_S), "no curve drawn"
    shot(page, chart, str(SHOTS / "tensorboard_scalars.png"))
    # HParams: one row a run, its loop and layout beside its final loss
    page.goto(f"{lab.url}{source}#hparams")
    for loop in ("all_reduce", "sync", "single"):
        page.get_by_text(loop, exact=True).first.wait_for(timeout=PATIENCE_S * 1000)
    page.get_by_text("final/loss").first.wait_for(state="attached", timeout=PATIENCE_S * 1000)  # a metric
    page.screenshot(path=str(SHOTS / "tensorboard_hparams.png"))
    # Profile (XProf): the trace viewer draws worker 1's traced step, its all-reduce among the
    # events, and the hosts to choose from are the two workers
    page.route("**/charts/loader.js", lambda route: route.fulfill(
        status=200, content_type="text/javascript", body=CHARTS_STUB))
    session = next((runs / traced / "plugins" / "profile").iterdir()).name
    page.goto(f"{lab.url}{source}?run={traced}%2F{session}&tag=trace_viewer%40&hosts=worker-1#profile")
    viewer = wait_for_frames(page, "trace_viewer_index.html")[0]
    viewer.get_by_text("worker-1 /host:CPU").first.wait_for(state="attached", timeout=PATIENCE_S * 1000)
    search = viewer.get_by_placeholder("Find Events...")
    search.fill("CollectiveReduceV2")  # the step's all-reduce, found among the drawn events
    search.press("Enter")
    viewer.get_by_text(re.compile(r"^\d+ of [1-9]\d*$")).wait_for(timeout=PATIENCE_S * 1000)  # "0 of 1"
    page.screenshot(path=str(SHOTS / "tensorboard_trace_viewer.png"))
    tool = next(f for f in page.frames if "trace_viewer@;" in f.url)
    tool.get_by_text("worker-1", exact=True).first.click()  # the hosts' list: every worker
    for worker in ("worker-0", "worker-1"):
        tool.get_by_role("option", name=worker).wait_for(timeout=PATIENCE_S * 1000)


def wait_for_frames(page, part: str, timeout: float = PATIENCE_S):
    """The page's frames whose address holds ``part``, once there is one (polled with the
    page's own wait: Playwright learns of new frames only while it is called)."""
    for _ in range(int(timeout * 4)):
        found = [f for f in page.frames if part in f.url]
        if found:
            return found
        page.wait_for_timeout(250)
    raise AssertionError(f"no frame at {part} in {timeout:g} s: {[f.url for f in page.frames]}")
