"""The tutorials the site renders: every notebook of both editions, with its outputs.

A notebook's outputs come from the copy the notebook tests executed (``build/notebooks/``),
matched cell by cell id, as long as that copy is newer than the notebook and has all its code
cells; otherwise it is executed here, once, from ``notebooks/`` (its working directory in the
tests too), and that copy is kept for the next build.
"""

from __future__ import annotations

import shutil
from pathlib import Path

EDITIONS = {"en": "*.ipynb", "ja": "ja/*.ipynb"}
#: The output that inlines BokehJS into a notebook (4 MB): the site loads BokehJS once per page
#: from its own static files instead (conf.py), the same version, still offline.
BOKEHJS_LOAD = "application/vnd.bokehjs_load.v0+json"


def outputs_by_id(ran) -> dict:
    """``{cell id: (outputs, execution_count)}`` of an executed notebook; where a cell ran more
    than once (the notebook tests run an exercise's check as a learner first, then solved),
    its last run."""
    return {cell.get("id"): (cell.outputs, cell.execution_count)
            for cell in ran.cells if cell.cell_type == "code" and cell.get("id")}


def executed(source: Path, copy: Path, log, execute: bool):
    """``source`` with the outputs of its executed ``copy``, cell by cell id, unless the copy
    is older than ``source`` (an edit since the tests ran) or lacks one of its code cells;
    then a new run."""
    import nbformat

    notebook = nbformat.read(source, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    if copy.exists() and copy.stat().st_mtime >= source.stat().st_mtime:
        ran = outputs_by_id(nbformat.read(copy, as_version=4))
        if all(cell.get("id") in ran for cell in code):
            for cell in code:
                cell.outputs, cell.execution_count = ran[cell["id"]]
            return notebook
        log(f"{copy} lacks cells of {source}")
    elif copy.exists():
        log(f"{source} changed after {copy} was executed")
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
