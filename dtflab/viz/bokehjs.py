"""BokehJS for notebooks in JupyterLab, served by the Jupyter server instead of written into
each notebook.

Bokeh's ``output_notebook(resources=INLINE)`` puts the whole library (about 4 MB, twice: one
copy per MIME type) into a cell's output, and JupyterLab's autosave writes it into the
notebook: a tutorial of 19 kB became 8.1 MB after one Run All. Its CDN needs the internet,
which classrooms, hubs and CI machines may not have.

This module is a Jupyter server extension (enabled for every server in the environment by
``etc/jupyter/jupyter_server_config.d/dtflab.json``, which installing dtflab puts there): it
serves Bokeh's own files at ``{base_url}dtflab/bokehjs/static/`` and tells the kernels it
starts so (``SERVED``). A kernel so told loads BokehJS from there, with a loader of about 1 kB
(:func:`loader`), and shows each plot as a widget (``dtflab.viz.output.show``), whose data
travels to the page and is not saved with the notebook; any other kernel (nbclient, the
documentation build, a plain IPython) still inlines BokehJS and the plots' data, so its outputs
stand alone.

What it cannot do: a notebook saved in JupyterLab and reopened draws its plots only when their
cells run again (its widgets' state is not saved), and a front end that is not JupyterLab or
Notebook 7 (which name their base URL in ``jupyter-config-data``) looks for the files under
``/``.
"""

from __future__ import annotations

import os

#: Set in the Jupyter server's environment, so in every kernel it starts.
SERVED = "DTFLAB_BOKEHJS_SERVED"
#: Where the files are, below the server's base URL.
ROUTE = "dtflab/bokehjs/"
#: Loads BokehJS's files, in order, from the server, before anything after it renders: the
#: page's jupyter_bokeh widgets (``BokehModel``) need ``window.Bokeh`` when their view is
#: made, which may be in the same output area, so a script tag's load, which comes later, is
#: too late. A synchronous request to this machine's own server takes tens of milliseconds,
#: once per page (Chromium notes in the console that such requests are deprecated).
_LOADER = """(function (root) {
  if (root.Bokeh !== undefined) { return; }
  const config = document.getElementById("jupyter-config-data");
  const base = (config ? JSON.parse(config.textContent).baseUrl || "/" : "/") + "%(route)s";
  for (const file of %(files)s) {
    const request = new XMLHttpRequest();
    request.open("GET", base + file, false);
    request.send();
    if (request.status !== 200) {
      console.error("dtflab: BokehJS did not load from " + base + file + ": HTTP " + request.status);
      return;
    }
    (0, eval)(request.responseText + "\\n//# sourceURL=" + base + file);
  }
})(window);"""


def served() -> bool:
    """Whether this kernel's server serves BokehJS (it set ``SERVED``)."""
    return os.environ.get(SERVED) == "1"


def loader() -> dict[str, str]:
    """The display data that loads BokehJS from the server into the page (about 1 kB, where
    Bokeh's inline resources are 4 MB): ``{mime type: JavaScript}``, one for JupyterLab's
    jupyter_bokeh and one for other front ends."""
    import json

    from bokeh.io.notebook import JS_MIME_TYPE, LOAD_MIME_TYPE
    from bokeh.resources import Resources

    files = [url.split("/static/", 1)[1].split("?")[0]
             for url in Resources(mode="server", root_url="/").js_files]
    js = _LOADER % {"route": f"{ROUTE}static/", "files": json.dumps(files)}
    return {JS_MIME_TYPE: js, LOAD_MIME_TYPE: js}


# -- the server extension ---------------------------------------------------------------------

def _jupyter_server_extension_points():
    return [{"module": "dtflab.viz.bokehjs"}]


def _load_jupyter_server_extension(server_app) -> None:
    from bokeh.util.paths import static_path
    from tornado.web import StaticFileHandler
    from tornado.web import url as route

    base = server_app.web_app.settings.get("base_url", "/")
    server_app.web_app.add_handlers(".*$", [
        route(f"{base}{ROUTE}static/(.*)", StaticFileHandler, {"path": static_path()})])
    os.environ[SERVED] = "1"
    server_app.log.info("dtflab: BokehJS served at %s%sstatic/", base, ROUTE)
