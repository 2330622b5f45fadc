"""Every tutorial runs top to bottom in a fresh kernel, quietly, and is committed without outputs."""

import re
from pathlib import Path

import nbformat
import pytest
from tutorials import NOTEBOOKS, name

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


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=name)
def test_runs_top_to_bottom_without_tensorflow_noise(path, tmp_path):
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
    (EXECUTED / name(path)).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, EXECUTED / name(path))
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                assert output["name"] != "stderr" or not TF_LOG_LINE.search(output["text"]), \
                    f"TensorFlow log lines reached the notebook:\n{output['text'][:500]}"
