"""Sphinx configuration of dtflab's documentation site.

Build it with one command, from the repository root (README "Documentation"):

    .venv/bin/python -m sphinx -W --keep-going -b html -d build/doctrees docs build/docs

Sources: the guide and the architecture page (MyST Markdown, here), the API reference
(generated from the docstrings of every module, ``api/generated/``), and the tutorials (both
editions, with their outputs, ``tutorials/en`` and ``tutorials/ja``). A tutorial's outputs come
from the copy the notebook tests executed (``build/notebooks/``, written by
``tests/test_notebooks.py``), cell by cell id, when that copy is newer than the notebook;
otherwise the build executes it once, in ``notebooks/`` as the tests do, and keeps that copy
for the next build (docs/tutorials_source.py).

Why these tools: Sphinx's autodoc reads the docstrings of every module as they are (the API
reference is the code's own text); MyST-NB renders notebooks from their stored outputs, Bokeh's
JavaScript included, so plots stay interactive without a second run; the PyData theme is the
one numpy, pandas, Dask and Bokeh use, maintained, with search built in. All three install from
the package index alone and work offline.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))

import api_pages  # noqa: E402  (docs/api_pages.py: a page per module)
import tutorials_source  # noqa: E402  (docs/tutorials_source.py: gathers the notebooks)

import dtflab  # noqa: E402

project = "dtflab"
author = "the dtflab authors"
copyright = "the dtflab authors"
release = version = dtflab.__version__

extensions = [
    "myst_nb",  # Markdown pages and notebooks (MyST-NB reads .md and .ipynb)
    "sphinx.ext.autodoc",
    "mathml",  # docs/mathml.py: $$...$$ as MathML, drawn by the browser with no script or network
]
html_math_renderer = "mathml"

exclude_patterns = ["_build", "**.ipynb_checkpoints"]
#: BokehJS, copied from the bokeh package at build time (see ``bokehjs``).
BOKEHJS = ROOT / "build" / "docs-static"
html_static_path = ["_static", str(BOKEHJS)]
html_css_files = ["dtflab.css"]
html_copy_source = False  # the tutorials' sources would double the site's size
html_show_sourcelink = False

# -- the theme: pydata-sphinx-theme (numpy, pandas, dask, bokeh use it) --------------------------
html_theme = "pydata_sphinx_theme"
html_title = "dtflab"
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
    "secondary_sidebar_items": ["page-toc"],
    "icon_links": [],
}
html_sidebars = {"index": []}
html_context = {"default_mode": "light"}
html_favicon = "_static/favicon.svg"

# -- API reference ----------------------------------------------------------------------------------
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True,
                           "ignore-module-all": True}  # each name once, where it is defined
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"

# -- notebooks ---------------------------------------------------------------------------------------
nb_ipywidgets_js = {}  # no require.js or widget manager from a CDN: the site works offline
# ...so a widget that carries a still of itself (dtflab.viz.output.display_with_a_still: the
# memory planner, the schedule playground) shows the still, not an empty widget view.
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", 35)]
nb_execution_mode = "off"  # outputs come from tutorials_source (the tests' executed copies)
nb_output_stderr = "remove-warn"
nb_merge_streams = True
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath", "amsmath"]
myst_heading_anchors = 3
suppress_warnings = [
    "mystnb.unknown_mime_type",  # widget views (ipywidgets) have no static rendering; text shows
    "misc.highlighting_failure",  # IPython magics (%dtf_cluster) in code cells
]


def ipython_examples(app, what, name, obj, options, lines):
    """Docstring examples (``In [1]: ...`` and their ``...:`` continuation lines) as IPython
    code blocks: the form STYLE.md gives them, shown as a reader would type them."""
    out, i = [], 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("In ["):
            out.append(lines[i])
            i += 1
            continue
        indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
        block = []
        while i < len(lines) and (lines[i].lstrip().startswith(("In [", "...:")) or (
                not lines[i].strip() and i + 1 < len(lines)
                and lines[i + 1].lstrip().startswith("In ["))):
            block.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].strip())
            i += 1
        out += ["", f"{indent}.. code-block:: ipythonconsole", ""] + [f"{indent}   {line}" for line in block] + [""]
    lines[:] = out


def bokehjs(app, pagename, templatename, context, doctree):
    """A tutorial page loads BokehJS from the site (the notebooks inlined it in every copy)."""
    if pagename.startswith("tutorials/") and pagename != "tutorials/index":
        for name in BOKEHJS_FILES:
            app.add_js_file(f"bokeh/{name}")


BOKEHJS_FILES = ["bokeh.min.js", "bokeh-gl.min.js", "bokeh-widgets.min.js", "bokeh-tables.min.js",
                 "bokeh-mathjax.min.js"]


def copy_bokehjs() -> None:
    import shutil

    import bokeh

    source = Path(bokeh.__file__).parent / "server" / "static" / "js"
    (BOKEHJS / "bokeh").mkdir(parents=True, exist_ok=True)
    for name in BOKEHJS_FILES:
        shutil.copyfile(source / name, BOKEHJS / "bokeh" / name)


def setup(app):
    copy_bokehjs()
    app.connect("html-page-context", bokehjs)
    app.connect("autodoc-process-docstring", ipython_examples)
    toc = api_pages.write(dtflab, DOCS / "api" / "generated")
    (DOCS / "api" / "generated" / "toc.rst.txt").write_text(toc)
    tutorials_source.gather(ROOT / "notebooks", DOCS / "tutorials", ROOT / "build" / "notebooks",
                            log=lambda text: print(f"[dtflab docs] {text}", flush=True),
                            execute=os.environ.get("DTFLAB_DOCS_EXECUTE", "1") != "0")
