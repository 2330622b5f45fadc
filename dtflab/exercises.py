"""The tutorials' exercises: a learner solves them, Run All does not, and no check gives the
answer away.

An exercise is four cells at the end of a notebook's "Exercise" section, the same in both
editions (``tests/test_exercises.py`` checks every notebook has this shape):

1. code, the learner's cell: ends ``answer = None  # your turn``;
2. markdown: "The solution is in the collapsed cell below (click the bar at its left to open
   it); try first. Run All does not apply it: copy its lines into your cell.";
3. markdown, the solution: tagged ``solution``, collapsed (metadata
   ``"jupyter": {"source_hidden": true}``), a line of prose and then the code in one
   ```` ```python ```` block;
4. code, the check: ``from dtflab import exercises`` and one statement, either
   ``exercises.check(answer, DIGEST, hint)`` (a fact: compares a digest) or
   ``exercises.agrees(answer, measured, hint)`` (a figure from the learner's own run), or, when
   the cell computes or asserts anything before that call,
   ``if exercises.answered(answer):`` with all of it inside. Nothing else runs at its top level.

Why the solution is a markdown cell: nothing executes one (Run All in JupyterLab or VS Code,
nbclient, papermill), so a learner's Run All leaves ``answer = None`` with no mode to switch
and nothing to configure, in every front end; yet it is one click away, highlighted as code,
next to the exercise and translated with it. (A code cell that must not set the answer when
run needs a switch every runner honours; a ``reveal()`` call or a ``solutions/`` folder puts
the solution further away than a click.)

What the check prints, always one line, never the answer, never an exception, so a Run All goes
on to the cells after it (``%dtf_cluster stop``):

* ``answer is None``: :data:`OPEN`, the exercise is still open (``answered`` prints it and
  skips the measurement: a learner's Run All does not start a check's training run);
* a wrong answer: ``not yet: <hint>``. A traceback would stop the Run All before the cluster is
  stopped and bury the hint under dtflab's stack; the line says all there is to say;
* a right one: ``correct``.

CI proves each exercise solvable (``tests/test_notebooks.py``): in one kernel it runs the
notebook as a learner does up to the check (which must print :data:`OPEN`), then the solution
(:func:`apply_solutions`) and the check again (which must print ``correct``), then the rest.

In [1]: digest(19)          # how a notebook's author makes DIGEST (not in the notebook)
"""

from __future__ import annotations

import copy
import hashlib
import re

#: The tag of a solution cell.
SOLUTION = "solution"
#: What a check prints while ``answer`` is None.
OPEN = "still open: set answer in your cell above and run it, then run this cell again"
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```\s*$", re.M | re.S)


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
            right = answer == measured if not tolerance else abs(answer - measured) <= tolerance * abs(measured)
        except TypeError:  # a sentence where a number was asked for
            right = False
        _verdict(bool(right), hint)


def is_solution(cell) -> bool:
    """Whether ``cell`` (a notebook cell as a dict) is an exercise's solution cell."""
    return SOLUTION in cell.get("metadata", {}).get("tags", [])


def solution_code(cell) -> str:
    """The code of a solution cell: its one ```` ```python ```` block."""
    source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
    blocks = _PYTHON_BLOCK.findall(source)
    if cell.get("cell_type") != "markdown" or len(blocks) != 1:
        raise ValueError(f"a solution cell is a markdown cell with one ```python block; this is a "
                         f"{cell.get('cell_type')} cell with {len(blocks)}: {source[:80]!r}")
    return blocks[0].rstrip("\n")


def apply_solutions(notebook: dict) -> dict:
    """A copy of ``notebook`` (a dict as ``json.load`` or ``nbformat.read`` gives it) in which
    each solution cell is a code cell running its code: the notebook solved, for CI and the
    memory benchmark. Pass the result to ``nbformat.from_dict`` before running it."""
    solved = copy.deepcopy(notebook)
    solved["cells"] = [_as_code(cell) if is_solution(cell) else cell for cell in solved["cells"]]
    return solved


def _as_code(cell) -> dict:
    code = {"cell_type": "code", "execution_count": None, "metadata": cell["metadata"],
            "outputs": [], "source": solution_code(cell)}
    if "id" in cell:
        code["id"] = cell["id"]
    return code
