"""Every tutorial runs top to bottom in a fresh kernel, quietly, and is committed without outputs;
its exercise stays open through a learner's Run All and is solved by its solution."""

import copy
import re

import nbformat
import pytest
from tutorials import NOTEBOOKS, name

from dtflab import exercises

TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d|oneDNN|cuda|absl::InitializeLog", re.M)


def test_there_are_notebooks():
    assert [path.name for path in NOTEBOOKS][:1] == ["00_quickstart.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=name)
def test_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs"


def learner_then_solved(notebook) -> tuple[nbformat.NotebookNode, int, int]:
    """The notebook as the test runs it, one kernel, one pass: what a learner's Run All runs up to
    the exercise's check (so ``answer`` is None there), then the solution and the check again,
    then the rest. Returns it with the index of the learner's check and of the solved one."""
    solved = exercises.apply_solutions(notebook)
    cells = solved["cells"]
    (at,) = [i for i, cell in enumerate(notebook["cells"]) if exercises.is_solution(cell)]
    check = next(i for i in range(at + 1, len(cells)) if cells[i]["cell_type"] == "code")
    learner_check = copy.deepcopy(cells[check])
    learner_check["id"] = f"{cells[check].get('id', 'check')}-learner"[:64]
    solved["cells"] = cells[:at] + [learner_check] + cells[at:]
    return nbformat.from_dict(solved), at, check + 1


def printed(cell) -> list[str]:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout").splitlines()


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=name)
def test_runs_top_to_bottom_as_a_learner_then_solved_without_tensorflow_noise(path):
    from nbclient import NotebookClient

    notebook, learner, solved = learner_then_solved(nbformat.read(path, as_version=4))
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
    assert printed(notebook.cells[learner]) == [exercises.OPEN], \
        "with answer = None the check says the exercise is open, in one line, and measures nothing"
    assert printed(notebook.cells[solved])[-1:] == ["correct"], \
        f"the solution does not solve the exercise: {printed(notebook.cells[solved])}"
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                assert output["name"] != "stderr" or not TF_LOG_LINE.search(output["text"]), \
                    f"TensorFlow log lines reached the notebook:\n{output['text'][:500]}"
