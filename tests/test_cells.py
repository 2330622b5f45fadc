"""A cell a learner may run on its own imports what it uses: a notebook's set-up cells (its
code cells up to the first that imports dtflab) import for every later cell; a later cell that
uses a name another later cell imported imports it itself, so running it again after a restart,
or out of order, raises no NameError for a module."""

import ast

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from tutorials import NOTEBOOKS, name


def imported(tree: ast.AST) -> set[str]:
    """The names an ``import`` or ``from ... import`` in ``tree`` binds."""
    return {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}


def imports_dtflab(tree: ast.AST) -> bool:
    return any((isinstance(node, ast.Import) and any(a.name.split(".")[0] == "dtflab"
                                                     for a in node.names))
               or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dtflab")
               for node in ast.walk(tree))


def unimported(sources: list[str]) -> list[tuple[int, list[str]]]:
    """Each code cell (by its index among ``sources``) that uses a name a later-than-set-up
    cell imported, without importing or assigning it itself, with those names."""
    setup, set_up, elsewhere, found = set(), False, set(), []
    for index, source in enumerate(sources):
        tree = ast.parse(TransformerManager().transform_cell(source))
        mine = imported(tree)
        if not set_up:
            setup |= mine
            set_up = imports_dtflab(tree)
            continue
        bound = mine | {node.id for node in ast.walk(tree)
                        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
        used = {node.id for node in ast.walk(tree)
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
        missing = sorted((used & elsewhere) - bound - setup)
        if missing:
            found.append((index, missing))
        elsewhere |= mine
    return found


def test_the_rule_finds_a_module_used_in_a_cell_that_does_not_import_it():
    cells = ["import dtflab", "import time\nstarted = time.perf_counter()",
             "print(time.perf_counter() - started)", "import time\nprint(time.time())",
             "print(dtflab.__name__)"]
    assert unimported(cells) == [(2, ["time"])]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=name)
def test_each_cell_imports_the_modules_it_uses_beyond_the_set_up(path):
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    found = unimported([cell.source for cell in code])
    assert not found, "; ".join(
        f"cell {notebook.cells.index(code[index])} uses {', '.join(names)} without importing it"
        for index, names in found)
