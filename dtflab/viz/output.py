"""Show Bokeh objects inline in a notebook, or write them as standalone HTML."""

from __future__ import annotations

from pathlib import Path

_notebook_ready = False


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def show(obj) -> None:
    """Inline in a Jupyter kernel (JupyterLab needs jupyter_bokeh, a dtflab dependency);
    elsewhere Bokeh opens a browser tab.

    Where the Jupyter server serves BokehJS (``dtflab.viz.bokehjs``) the plot is a widget, whose
    data is not saved with the notebook; elsewhere BokehJS and the plot's data are inlined into
    the output. Never from Bokeh's CDN: classrooms, hubs and CI machines often cannot reach it
    (the plot then fails with a JS timeout).
    """
    from bokeh.io import show as bokeh_show

    from dtflab.viz import bokehjs

    load_bokehjs()
    if in_notebook() and bokehjs.served():
        from IPython.display import display
        from jupyter_bokeh import BokehModel

        display(BokehModel(obj))
    else:
        bokeh_show(obj)


def load_bokehjs() -> None:
    """Load BokehJS into the notebook page, once per kernel: from the Jupyter server where it
    serves it (a loader of about 1 kB in the notebook), else inlined (about 8 MB in the notebook).

    Needed before showing a plot, and before displaying a widget that embeds one
    (``jupyter_bokeh.BokehModel`` uses the page's BokehJS: without it, its view fails).
    """
    global _notebook_ready
    if in_notebook() and not _notebook_ready:
        from bokeh.io import output_notebook
        from bokeh.resources import INLINE

        from dtflab.viz import bokehjs

        if bokehjs.served():
            from bokeh.io.state import curstate
            from IPython.display import publish_display_data

            curstate().output_notebook()
            publish_display_data(bokehjs.loader())
        else:
            output_notebook(resources=INLINE, hide_banner=True)
        _notebook_ready = True


def with_a_still(widget, figures, text: str, *,
                 when: str = "as this run first showed it") -> dict:
    """``widget``'s display data with a still of it: its Bokeh ``figures`` as they are now and
    ``text`` (HTML), for wherever no kernel drives widgets (the documentation site, a notebook
    viewer). JupyterLab shows the live widget; a renderer without ipywidgets' manager shows the
    still, which cannot be moved: it says so. Under a server that serves BokehJS (JupyterLab,
    where the notebook is saved) there is no still."""
    from bokeh.embed import components

    from dtflab.viz import bokehjs

    bundle = widget._repr_mimebundle_()
    if bokehjs.served():  # JupyterLab draws the widget; a still would be saved with the notebook
        return bundle
    # one figure at a time: each is the only root of its widget's document, which stays as it is
    stills = "".join(div + script for script, div in (components(figure) for figure in figures))
    bundle["text/html"] = (f'<div class="dtflab-still">{stills}<div>{text}</div>'
                           f"<p><i>A still of the widget {when}: run the notebook to use "
                           f"it.</i></p></div>")
    return bundle


def display_with_a_still(widget, figures, text: str, *, display_id: str | None = None,
                         when: str = "as this run first showed it") -> None:
    """Display :func:`with_a_still`'s data; with ``display_id``, a later
    :func:`update_the_still` replaces it."""
    from IPython.display import display

    display(with_a_still(widget, figures, text, when=when), raw=True, display_id=display_id)


def update_the_still(widget, figures, text: str, *, display_id: str,
                     when: str = "as this run left it") -> None:
    """Replace the display ``display_id`` with a new still (nothing where there are none)."""
    from IPython.display import update_display

    from dtflab.viz import bokehjs

    if in_notebook() and not bokehjs.served():
        update_display(with_a_still(widget, figures, text, when=when), raw=True,
                       display_id=display_id)


def save_html(obj, path, title: str = "dtflab") -> str:
    """Write ``obj`` to ``path`` with BokehJS inlined, so the file opens offline."""
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    Path(path).write_text(file_html(obj, INLINE, title), encoding="utf-8")
    return str(path)
