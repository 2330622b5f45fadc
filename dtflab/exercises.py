"""The tutorials' exercises: a learner solves them, Run All does not, and no check gives the
answer away.

An exercise is the question (markdown, under ``## Exercise``) and then four cells in a row, the
same in both editions (``tests/test_exercises.py`` checks every notebook has this shape; copy
them from notebook 05, ``notebooks/`` and ``notebooks/ja/``):

1. code, the learner's cell: its last line ``answer = None  # your turn``;
2. markdown: "The solution is in the collapsed cell below (click the bar at its left to open
   it); try first. Running that cell does not apply it, so Run All leaves the exercise to you
   ..." (the words must include "Run All");
3. code, the solution: tagged ``solution``, collapsed (metadata
   ``"jupyter": {"source_hidden": true}``), its first line ``%%dtf_solution`` (so the notebook
   has run ``%load_ext dtflab`` before) and then the code a learner would put in place of
   ``answer = None``;
4. code, the check: ``from dtflab import exercises`` and one statement, either
   ``exercises.check(answer, DIGEST, hint)`` (a fact: compares a digest) or
   ``exercises.agrees(answer, measured, hint)`` (a figure from the learner's own run), or, when
   the cell computes or asserts anything before that call, ``if exercises.answered(answer):``
   with all of it inside. Nothing else runs at its top level, ``answer`` goes only to these
   three functions, and nothing is printed or displayed but what they print.

Why the solution is a code cell under ``%%dtf_solution``: the cell magic never runs its body,
it prints :data:`NOT_APPLIED`, so whatever runs the notebook (Run All in JupyterLab or VS Code,
nbclient, papermill, an exported script) leaves ``answer = None``, with no mode to switch or
forget; and the code is one click away, highlighted, beside the exercise and translated with
it. (A collapsed markdown cell is not: JupyterLab's Run All un-collapses each markdown cell it
renders, so it would show the solution to everyone who runs all; a ``reveal()`` call or a
``solutions/`` folder puts it further away than a click.)

What ``check``, ``agrees`` and ``answered`` print: one line, never the answer, and they never
raise, so a Run All goes on to the cells after the check (``%dtf_cluster stop``):

* ``answer is None``: :data:`OPEN` (``answered`` prints it and skips the measurement: a
  learner's Run All starts no check run);
* a wrong answer: ``not yet: <hint>``. A traceback would stop the Run All before the cluster is
  stopped and bury the hint under dtflab's stack; the line says all there is to say;
* a right one: ``correct``.

CI proves each exercise solvable and its check able to say no (``tests/test_notebooks.py``): in
one kernel it runs the notebook as a learner does up to the check (which must print
:data:`OPEN`), then the solution without its magic (:func:`apply_solutions`) and the check again
(which must print ``correct``), then a wrong answer of the solution's type and the check once
more (which must print ``not yet: ...``), then the rest.

In [1]: digest(19)          # how a notebook's author makes DIGEST (not in the notebook)
"""

from __future__ import annotations

import copy
import hashlib

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class

#: The tag of a solution cell.
SOLUTION = "solution"
#: The first line of a solution cell: the cell magic that shows the code and never runs it.
MAGIC = "%%dtf_solution"
#: What a check prints while ``answer`` is None.
OPEN = "still open: set answer in your cell above and run it, then run this cell again"
#: What a solution cell prints when run.
NOT_APPLIED = ("not applied: to use this solution, open it (the bar at its left) and copy its lines "
               "into your cell")


def _normal(answer) -> str:
    if isinstance(answer, bool) or answer is None:
        return repr(answer)
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    if isinstance(answer, float):
        return f"{answer:.6g}"
    return str(answer).strip()


def digest(answer) -> str:
    """The first 16 hex digits of the SHA-256 of the answer, written canonically (``19.0`` and
    ``19`` agree, strings are stripped)."""
    return hashlib.sha256(_normal(answer).encode()).hexdigest()[:16]


def answered(answer) -> bool:
    """True once ``answer`` is set; while it is None, prints :data:`OPEN` and returns False.

    In [1]: if exercises.answered(answer):
       ...:     measured = ...   # only once there is an answer to compare it with
       ...:     exercises.agrees(answer, measured, "hint")
    """
    if answer is None:
        print(OPEN)
        return False
    return True


def _verdict(right: bool, hint: str) -> None:
    print("correct" if right else f"not yet: {hint}")


def check(answer, expected_digest: str, hint: str) -> None:
    """Prints "correct" if ``answer`` has ``expected_digest``, "not yet: ``hint``" if not, and
    :data:`OPEN` if it is None. Never shows the expected answer."""
    if answered(answer):
        _verdict(digest(answer) == expected_digest, hint)


def agrees(answer, measured, hint: str, *, tolerance: float = 0.0) -> None:
    """Prints "correct" if ``answer`` is ``measured`` (within a relative ``tolerance``), "not yet:
    ``hint``" if not, and :data:`OPEN` if it is None; never the measured figure."""
    if answered(answer):
        try:
            right = (answer == measured if not tolerance
                     else abs(answer - measured) <= tolerance * abs(measured))
        except TypeError:  # a sentence where a number was asked for
            right = False
        _verdict(bool(right), hint)


def is_solution(cell) -> bool:
    """Whether ``cell`` (a notebook cell as a dict) is an exercise's solution cell."""
    return SOLUTION in cell.get("metadata", {}).get("tags", [])


def solution_code(cell) -> str:
    """The code of a solution cell (a notebook cell as a dict): its lines after ``%%dtf_solution``."""
    source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
    first, _, code = source.partition("\n")
    if cell.get("cell_type") != "code" or first.strip() != MAGIC or not code.strip():
        raise ValueError(f"a solution cell is a code cell whose first line is {MAGIC}, then the "
                         f"code; this is a {cell.get('cell_type')} cell: {source[:80]!r}")
    return code.rstrip("\n")


def apply_solutions(notebook: dict) -> dict:
    """A copy of ``notebook`` (a dict as ``json.load`` or ``nbformat.read`` gives it) whose
    solution cells run their code (``%%dtf_solution`` left out): the notebook solved, for CI and
    the memory benchmark."""
    solved = copy.deepcopy(notebook)
    for cell in solved["cells"]:
        if is_solution(cell):
            cell["source"] = solution_code(cell)
    return solved


@magics_class
class SolutionMagics(Magics):
    """``%%dtf_solution``: an exercise's solution, shown and never run (see dtflab.exercises)."""

    @cell_magic
    def dtf_solution(self, line: str, cell: str):
        """Keep the cell's code as an exercise's solution: running the cell does not run the code,
        it says so, so Run All leaves the exercise to the learner.

        In [1]: %%dtf_solution
           ...: answer = 3 * 4 * 609
        not applied: to use this solution, open it (the bar at its left) and copy its lines into your cell
        """
        if line.strip():
            raise UsageError(f"%%dtf_solution takes nothing after it, got {line.strip()!r}; to use "
                             f"the solution, copy its lines into your cell in place of answer = None")
        print(NOT_APPLIED)
