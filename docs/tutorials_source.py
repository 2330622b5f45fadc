"""The tutorials the site renders: every notebook of both editions, with its outputs.

A notebook's outputs come from the copy the notebook tests executed (``build/notebooks/``) as
long as its code cells are the ones in ``notebooks/``; otherwise it is executed here, once,
from ``notebooks/`` (its working directory in the tests too), and that copy is kept for the next
build. Markdown cells always come from ``notebooks/``, so a prose edit needs no new run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

EDITIONS = {"en": "*.ipynb", "ja": "ja/*.ipynb"}
#: The output that inlines BokehJS into a notebook (4 MB): the site loads BokehJS once per page
#: from its own static files instead (conf.py), the same version, still offline.
BOKEHJS_LOAD = "application/vnd.bokehjs_load.v0+json"


def code_of(notebook) -> list[str]:
    return [cell.source for cell in notebook.cells if cell.cell_type == "code"]


def executed(source: Path, copy: Path, log, execute: bool):
    """``source`` with outputs: the executed ``copy`` if its code matches, else a new run."""
    import nbformat

    notebook = nbformat.read(source, as_version=4)
    if copy.exists():
        ran = nbformat.read(copy, as_version=4)
        if code_of(ran) == code_of(notebook):
            outputs = iter(cell for cell in ran.cells if cell.cell_type == "code")
            for cell in notebook.cells:
                if cell.cell_type == "code":
                    done = next(outputs)
                    cell.outputs, cell.execution_count = done.outputs, done.execution_count
            notebook.metadata = ran.metadata or notebook.metadata
            return notebook
        log(f"{copy} is from other code than {source}")
    if not execute:
        log(f"{source.name}: no executed copy, rendered without outputs (DTFLAB_DOCS_EXECUTE=0)")
        return notebook
    from nbclient import NotebookClient

    log(f"executing {source} (no executed copy of this code in {copy.parent})")
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(source.parent)}}).execute()
    copy.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, copy)
    return notebook


def gather(notebooks: Path, target: Path, executed_dir: Path, *, log=print, execute=True) -> None:
    """Write every tutorial with outputs under ``target/<edition>/``."""
    import nbformat

    for edition, pattern in EDITIONS.items():
        folder = target / edition
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for source in sorted(notebooks.glob(pattern)):
            relative = source.relative_to(notebooks)
            notebook = executed(source, executed_dir / relative, log, execute)
            for cell in notebook.cells:
                if cell.cell_type == "code":
                    cell.outputs = [o for o in cell.outputs if BOKEHJS_LOAD not in o.get("data", {})]
            nbformat.write(notebook, folder / source.name)
