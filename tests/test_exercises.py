"""The tutorials' exercises have the shape dtflab/exercises.py describes: a learner's Run All
leaves them open, the solution is one click away in a collapsed cell that ``%%dtf_solution``
keeps from running, and a check cell never holds or prints the answer; open, wrong and right
answers each get one line. (tests/test_notebooks.py runs every notebook as a learner and
solved; tests/test_magics.py runs ``%%dtf_solution``.)"""

import ast
import json

import pytest
from IPython.core.inputtransformer2 import TransformerManager
from tutorials import NOTEBOOKS, name

from dtflab import exercises

CHECKS = {"check", "agrees", "answered"}


def source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def python(code: str) -> ast.Module:
    return ast.parse(TransformerManager().transform_cell(code))


def exercises_call(node, names=CHECKS) -> bool:
    """``exercises.<one of names>(answer, ...)``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "exercises"
            and node.func.attr in names and bool(node.args)
            and isinstance(node.args[0], ast.Name) and node.args[0].id == "answer")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=name)
def test_every_exercise_has_the_learners_cell_a_collapsed_solution_that_never_runs_and_a_check(path):
    cells = json.loads(path.read_text())["cells"]
    solutions = [i for i, c in enumerate(cells) if exercises.is_solution(c)]
    assert len(solutions) == 1, "one solution cell, tagged 'solution'"
    (i,) = solutions
    learner, where, solution, check = cells[i - 2:i + 2]
    assert learner["cell_type"] == "code"
    assert source(learner).splitlines()[-1].startswith("answer = None  # "), "the learner's cell comes first"
    assert where["cell_type"] == "markdown" and "Run All" in source(where)
    assert solution["metadata"]["jupyter"]["source_hidden"] is True
    assert "answer = " in exercises.solution_code(solution)  # a code cell under %%dtf_solution
    python(exercises.solution_code(solution))  # valid Python (magics included)
    assert check["cell_type"] == "code"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=name)
def test_a_check_cell_runs_nothing_before_it_has_an_answer_and_never_shows_it(path):
    cells = json.loads(path.read_text())["cells"]
    (i,) = [i for i, c in enumerate(cells) if exercises.is_solution(c)]
    check = source(cells[i + 1])
    first, *rest = python(check).body
    assert ast.unparse(first) == "from dtflab import exercises"
    assert len(rest) == 1, "after the import, one statement: the check, or `if exercises.answered(answer):`"
    (statement,) = rest
    guarded = isinstance(statement, ast.If) and exercises_call(statement.test, {"answered"}) and not statement.orelse
    called = isinstance(statement, ast.Expr) and exercises_call(statement.value, {"check", "agrees"})
    assert guarded or called, f"not a check: {ast.unparse(statement)[:200]}"
    uses = [n for n in ast.walk(statement) if isinstance(n, ast.Name) and n.id == "answer"]
    passed = [n.args[0] for n in ast.walk(statement) if exercises_call(n)]
    assert len(uses) == len(passed), "answer only goes to exercises.check/agrees/answered"
    assert "print(" not in check and "display(" not in check


def test_a_digest_check_takes_the_answer_in_any_spelling_and_hides_it(capsys):
    expected = exercises.digest(19)
    exercises.check(19.0, expected, "hint")
    assert capsys.readouterr().out == "correct\n"
    exercises.check(20, expected, "think about the last checkpoint")
    out = capsys.readouterr().out
    assert out == "not yet: think about the last checkpoint\n" and "19" not in out


def test_an_open_exercise_says_so_in_one_line_and_lets_the_notebook_go_on(capsys):
    exercises.check(None, exercises.digest(19), "hint")
    exercises.agrees(None, 1_040, "hint")
    assert exercises.answered(None) is False
    assert capsys.readouterr().out == f"{exercises.OPEN}\n" * 3
    assert exercises.OPEN.startswith("still open: set answer")
    assert exercises.answered(0) is True and capsys.readouterr().out == ""  # 0 is an answer


def test_a_measured_check_does_not_print_the_measurement(capsys):
    exercises.agrees(1_000, 1_040, "hint", tolerance=0.05)
    assert capsys.readouterr().out == "correct\n"
    exercises.agrees(900, 1_040, "count the pieces")
    exercises.agrees("about a thousand", 1_040, "a number of bytes", tolerance=0.05)
    out = capsys.readouterr().out
    assert out == "not yet: count the pieces\nnot yet: a number of bytes\n"


SOLUTION = {"cell_type": "code", "execution_count": None, "id": "s1", "outputs": [],
            "metadata": {"tags": ["solution"], "jupyter": {"source_hidden": True}},
            "source": "%%dtf_solution\n%dtf_cluster start 3\nanswer = 3 * 4\n"}


def test_applying_the_solutions_runs_their_code_without_the_magic():
    notebook = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "## Exercise"}, SOLUTION],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    solved = exercises.apply_solutions(notebook)
    assert solved["cells"][0] == notebook["cells"][0] and notebook["cells"][1] == SOLUTION
    assert solved["cells"][1] == dict(SOLUTION, source="%dtf_cluster start 3\nanswer = 3 * 4")


@pytest.mark.parametrize("cell", [dict(SOLUTION, cell_type="markdown"), dict(SOLUTION, source="answer = 3"),
                                  dict(SOLUTION, source="%%dtf_solution\n")],
                         ids=["markdown", "no magic", "no code"])
def test_a_solution_cell_that_is_not_code_under_the_magic_is_named(cell):
    with pytest.raises(ValueError, match=r"a solution cell is a code cell whose first line is %%dtf_solution"):
        exercises.solution_code(cell)
