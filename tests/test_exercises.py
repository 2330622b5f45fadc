"""The tutorials' exercises check without telling: a check cell never holds or prints the
answer, the solutions sit in collapsed cells that CI still runs (the notebook tests), and a
wrong or missing answer gets a hint."""

import json

import pytest

from dtflab import exercises
from tutorials import NOTEBOOKS, name



def source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=name)
def test_every_exercise_has_a_collapsed_solution_and_a_check_that_does_not_show_it(path):
    cells = json.loads(path.read_text())["cells"]
    solutions = [i for i, c in enumerate(cells) if "solution" in c.get("metadata", {}).get("tags", [])]
    assert len(solutions) == 1, "one solution cell, tagged 'solution'"
    (i,) = solutions
    assert cells[i]["metadata"]["jupyter"]["source_hidden"] is True
    assert "answer = None" in source(cells[i - 2]), "the learner's cell comes first"
    check = next(source(c) for c in cells[i + 1:] if "exercises." in source(c))
    assert "exercises.check(" in check or "exercises.agrees(" in check
    assert "print(" not in check and "answer)" not in check.replace("agrees(answer,", "")


def test_a_digest_check_takes_the_answer_in_any_spelling_and_hides_it(capsys):
    expected = exercises.digest(19)
    exercises.check(19.0, expected, "hint")
    assert capsys.readouterr().out.strip() == "correct"
    with pytest.raises(AssertionError) as wrong:
        exercises.check(20, expected, "think about the last checkpoint")
    assert str(wrong.value) == "not yet: think about the last checkpoint" and "19" not in str(wrong.value)
    with pytest.raises(AssertionError, match="set answer first"):
        exercises.check(None, expected, "hint")


def test_a_measured_check_does_not_print_the_measurement(capsys):
    exercises.agrees(1_000, 1_040, "hint", tolerance=0.05)
    assert capsys.readouterr().out.strip() == "correct"
    with pytest.raises(AssertionError) as wrong:
        exercises.agrees(900, 1_040, "count the pieces")
    assert "1040" not in str(wrong.value) and "1,040" not in str(wrong.value)
