"""BokehJS for notebooks in JupyterLab, served by the Jupyter server instead of written into
each notebook.

Bokeh's ``output_notebook(resources=INLINE)`` puts the whole library (about 4 MB, twice: one
copy per MIME type) into a cell's output, and JupyterLab's autosave writes it into the
notebook: a tutorial of 19 kB became 8.1 MB after one Run All. Its CDN needs the internet,
which classrooms, hubs and CI machines may not have.

This module is a Jupyter server extension (enabled for every server in the environment by
``etc/jupyter/jupyter_server_config.d/dtflab.json``, which installing dtflab puts there): it
serves Bokeh's own files at ``{base_url}dtflab/bokehjs/static/`` and tells the kernels it
starts so (``SERVED``). A kernel so told loads BokehJS from there, with a loader of about 6 kB
(:func:`loader`); any other kernel (nbclient, the documentation build, a plain IPython) still
inlines it, so its outputs stand alone.

What it cannot do: a notebook reopened later draws its plots only once a cell has loaded
BokehJS again (as with Bokeh's CDN), and a front end that is not JupyterLab or Notebook 7
(which name their base URL in ``jupyter-config-data``) looks for the files under ``/``.
"""

from __future__ import annotations

import os

#: Set in the Jupyter server's environment, so in every kernel it starts.
SERVED = "DTFLAB_BOKEHJS_SERVED"
#: Where the files are, below the server's base URL.
ROUTE = "dtflab/bokehjs/"
#: Stands for the base URL in the loader until the page fills it in.
_PLACEHOLDER = "/DTFLAB-BASE-URL/"
#: The page's base URL, as JupyterLab and Notebook 7 publish it.
_BASE_URL = ("((c) => (c ? JSON.parse(c.textContent).baseUrl || '/' : '/'))"
             "(document.getElementById('jupyter-config-data'))")


def served() -> bool:
    """Whether this kernel's server serves BokehJS (it set ``SERVED``)."""
    return os.environ.get(SERVED) == "1"


def loader() -> dict[str, str]:
    """The display data that loads BokehJS from the server into the page (Bokeh's own loader,
    pointed at :data:`ROUTE` under the page's base URL): ``{mime type: JavaScript}``."""
    from bokeh.embed.bundle import bundle_for_objs_and_resources
    from bokeh.io.notebook import JS_MIME_TYPE, LOAD_MIME_TYPE, _loading_js
    from bokeh.resources import Resources

    bundle = bundle_for_objs_and_resources(None, Resources(mode="server", root_url=_PLACEHOLDER))

    def pointed(js: str) -> str:
        assert _PLACEHOLDER in js, "Bokeh's loader no longer names its files' URLs"
        return js.replace(f'"{_PLACEHOLDER}', f'{_BASE_URL} + "{ROUTE}')

    return {JS_MIME_TYPE: pointed(_loading_js(bundle, None, 5000, register_mime=True)),
            LOAD_MIME_TYPE: pointed(_loading_js(bundle, None, 5000, register_mime=False))}


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
