"""Every tutorial runs top to bottom in a fresh kernel, quietly, and is committed without outputs;
its exercise stays open through a learner's Run All and is solved by its solution."""

import copy
import re
from pathlib import Path

import nbformat
import pytest
from tutorials import NOTEBOOKS, name

from dtflab import exercises

#: Where each executed notebook is kept: the documentation site renders these outputs.
EXECUTED = Path(__file__).resolve().parents[1] / "build" / "notebooks"
TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d|oneDNN|cuda|absl::InitializeLog", re.M)


def test_there_are_notebooks():
    assert [path.name for path in NOTEBOOKS][:1] == ["00_quickstart.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=name)
def test_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs"


def learner_then_solved(notebook) -> tuple[nbformat.NotebookNode, dict[str, int]]:
    """The notebook as the test runs it, in one kernel and one pass: as a learner's Run All runs
    it up to the exercise's check (the solution cell not applied, ``answer`` still None), then
    the solution applied, the check again and the rest. Returns it with the indexes of the
    solution cell and the check, as the learner ran them and solved."""
    cells = notebook["cells"]
    (at,) = [i for i, cell in enumerate(cells) if exercises.is_solution(cell)]
    check = next(i for i in range(at + 1, len(cells)) if cells[i]["cell_type"] == "code")
    learner = copy.deepcopy(cells[:check + 1])
    for cell in learner[at:]:  # these run twice: ids stay unique
        cell["id"] = f"{cell.get('id', 'cell')}-learner"[:64]
    solved = exercises.apply_solutions(notebook)["cells"][at:]
    runs = dict(notebook, cells=learner + solved)
    return nbformat.from_dict(runs), {"not applied": at, "open": check, "correct": 2 * check + 1 - at}


def printed(cell) -> list[str]:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout").splitlines()


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=name)
def test_runs_top_to_bottom_as_a_learner_then_solved_without_tensorflow_noise(path):
    from nbclient import NotebookClient

    notebook, at = learner_then_solved(nbformat.read(path, as_version=4))
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
    (EXECUTED / name(path)).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, EXECUTED / name(path))
    assert printed(notebook.cells[at["not applied"]]) == [exercises.NOT_APPLIED]
    assert printed(notebook.cells[at["open"]]) == [exercises.OPEN], \
        "with answer = None the check says the exercise is open, in one line, and measures nothing"
    assert printed(notebook.cells[at["correct"]])[-1:] == ["correct"], \
        f"the solution does not solve the exercise: {printed(notebook.cells[at['correct']])}"
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                assert output["name"] != "stderr" or not TF_LOG_LINE.search(output["text"]), \
                    f"TensorFlow log lines reached the notebook:\n{output['text'][:500]}"
