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
    elsewhere Bokeh opens a browser tab."""
    global _notebook_ready
    from bokeh.io import output_notebook, show as bokeh_show

    if in_notebook() and not _notebook_ready:
        output_notebook(hide_banner=True)
        _notebook_ready = True
    bokeh_show(obj)


def save_html(obj, path, title: str = "dtflab") -> str:
    """Write ``obj`` to ``path`` with BokehJS inlined, so the file opens offline."""
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    Path(path).write_text(file_html(obj, INLINE, title), encoding="utf-8")
    return str(path)
