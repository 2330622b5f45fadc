"""TensorBoard on the run directory, inside the notebook: ``dtflab.tensorboard()`` or
``%dtf_tensorboard [LOGDIR]``.

One server per run directory per kernel, a process of its own (``dtflab.processes.board``) on
a port chosen now, ended with the kernel. The page reaches it through the notebook server
(jupyter-server-proxy's ``/proxy/PORT/``, also under a hub's prefix on Binder), where a page
cannot reach the kernel's localhost; without jupyter-server-proxy, at ``http://HOST:PORT/``
of the page's own host. Every ``train`` loop writes its run there (``train.machinery.logdir``).

In [1]: dtflab.tensorboard()            # runs/<notebook> beside it, or $DTFLAB_LOGDIR
In [2]: %dtf_tensorboard other/runs
"""

from __future__ import annotations

import atexit
import html
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from dtflab.cluster.ports import free_ports
from dtflab.processes.spawn import child_env
from dtflab.train.machinery.logdir import run_directory

#: Seconds TensorBoard has to answer (0.8 s on an idle machine; a loaded one is slower).
START_TIMEOUT_S = 90.0
_servers: dict[Path, "TensorBoard"] = {}


class TensorBoard:
    """A TensorBoard server on ``logdir``, shown as the page inside the notebook."""

    def __init__(self, logdir: Path, *, height: int = 800):
        self.logdir, self.height = logdir, height
        self.port = free_ports(1)[0]
        self._log = tempfile.NamedTemporaryFile(prefix="dtflab-tensorboard-", suffix=".log",
                                                delete=False)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dtflab.processes.board", "--logdir", str(logdir),
             "--port", str(self.port)], stdin=subprocess.PIPE, stdout=self._log,
            stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
        atexit.register(self.stop)

    @property
    def url(self) -> str:
        """Where this machine reaches it."""
        return f"http://127.0.0.1:{self.port}/"

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> "TensorBoard":
        """Return once it answers; raises, naming its last log lines, if it ended or did not
        answer within ``timeout`` seconds (and stops it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(self.url + "data/logdir", timeout=2):
                    return self
            except OSError:
                time.sleep(0.3)
        self.stop(keep_log=True)
        tail = Path(self._log.name).read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"TensorBoard on {self.logdir} did not start ("
                           f"{'exited' if self.process.returncode else 'no answer'}): "
                           f"{' / '.join(tail) or 'no output'}; see {self._log.name}")

    def stop(self, *, keep_log: bool = False) -> None:
        """End the server (also at the kernel's exit), and remove its log file unless
        ``keep_log`` (a failed start names it)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stdin:
            self.process.stdin.close()
        self._log.close()
        if not keep_log:
            Path(self._log.name).unlink(missing_ok=True)
        _servers.pop(self.logdir, None)

    def _repr_html_(self) -> str:
        proxied = importlib.util.find_spec("jupyter_server_proxy") is not None
        frame = f"dtflab-tensorboard-{self.port}"
        # The notebook server's base URL (a hub's /user/NAME/ on Binder) is the page's to know;
        # a page that is no notebook server's (the documentation site, a saved notebook's
        # rendering) has no TensorBoard to reach, and says so instead.
        where = (f"base + 'proxy/{self.port}/'" if proxied else
                 f"location.protocol + '//' + location.hostname + ':{self.port}/'")
        said = json.dumps(f"TensorBoard on {self.logdir} ran beside this notebook's kernel; "
                          f"run the notebook to see it here").replace("</", "<\\/")
        return (f'<iframe id="{frame}" title="TensorBoard on {html.escape(str(self.logdir))}" '
                f'style="width:100%;height:{self.height}px;border:0"></iframe>'
                f"<script>(() => {{ const frame = document.getElementById('{frame}'); const config"
                f" = document.getElementById('jupyter-config-data'); if (!config) {{ "
                f"frame.replaceWith(Object.assign(document.createElement('p'), {{textContent: "
                f"{said}}})); return; }} const base = JSON.parse(config.textContent).baseUrl "
                f"|| '/'; frame.src = {where}; }})()</script>")

    def __repr__(self) -> str:
        return f"<TensorBoard on {self.logdir} at {self.url}>"


def tensorboard(logdir=None, *, height: int = 800) -> TensorBoard:
    """TensorBoard on ``logdir`` (None: where the loops write, ``$DTFLAB_LOGDIR`` or
    ``runs/<notebook>``: ``logdir.run_directory``), started once per folder and kernel; a notebook shows what it returns. Refuses,
    in one line, a folder that holds no run yet."""
    where = run_directory(None if logdir is None else logdir)
    if where is None:
        raise ValueError("logdir=False: TensorBoard needs a folder of runs; leave logdir out "
                         "for the one the loops write to")
    where = where.resolve()
    if not where.is_dir() or not any(where.rglob("events.out.tfevents.*")):
        raise ValueError(f"no run in {where} yet: train first (every train loop writes its run "
                         f"there), or pass the folder your runs are in, "
                         f"dtflab.tensorboard('path/to/runs')")
    server = _servers.get(where)
    if server is None or server.process.poll() is not None:
        server = _servers[where] = TensorBoard(where, height=height).wait_ready()
    return server  # a notebook shows it (its _repr_html_)


def tensorboard_magic(line: str = ""):
    """``%dtf_tensorboard [LOGDIR]``: TensorBoard on LOGDIR (default: where the loops write)."""
    return tensorboard(line.strip() or None)
