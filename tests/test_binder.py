"""Binder's 2 GB and one CPU: every tutorial, both editions, inside a cgroup of each.

mybinder.org gives one user 2 GB for everything (it restarts the kernel above it) and about one
CPU's worth of time (a CFS quota: ``os.cpu_count()`` still reports the host's cores). The
notebook tests' own executions (``notebook_runs``) run each notebook, solved (the exercise's
check trains too, as for a learner who answers), in a child cgroup limited to 2 GiB and one CPU
(v1 or v2: ``binder_limits``), the kernel and every task inside: a notebook passes if it finishes without ever reaching
the memory limit and peaks at no more than ``ROOM_MB`` (1.5 GiB: the rest of Binder's 2 GiB is
the notebook server's); TensorBoard, which a notebook's last cell starts, is inside too. Its
peak and its CPU seconds are printed (figures, quoted in the guide); no cell may take more than
nbclient's 600 s. The notebooks that compare timings
run, in their Japanese edition, beside two busy loops in the same group
(``notebook_runs.UNDER_LOAD``): on Binder a learner's CPU is shared too.

The executions run with the packages the test command installed; binder/requirements.txt pins
the ones Binder installs, and ``test_binder_pins_the_tensorflow_the_notebooks_ran_with`` keeps
the two the same where it matters for memory.

Needs root and the memory and cpu controllers, of cgroup v1 or delegated to this process's
parent group on cgroup v2 (skipped with the reason elsewhere; a failure under ``CI=true``).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
from conftest import not_here
from notebook_runs import BUSY_LOOPS, LIMIT_MB, ROOM_MB, UNDER_LOAD, cgroups_unavailable
from tutorials import NOTEBOOKS, name

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.binder, pytest.mark.slow, pytest.mark.timeout(1800)]


def pins() -> dict[str, str]:
    lines = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    return {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1].strip()
            for line in lines if "==" in line and not line.startswith("#")}


def test_binder_pins_the_tensorflow_the_notebooks_ran_with():
    pinned = pins()
    assert "tensorflow" not in pinned and "tensorflow-cpu" in pinned  # the CPU build, as on Binder
    assert pinned["tensorflow-cpu"] == metadata.version("tensorflow"), (
        f"binder/requirements.txt pins tensorflow-cpu=={pinned['tensorflow-cpu']}, the notebooks "
        f"ran here with {metadata.version('tensorflow')}: pin that one (and tensorboard, tf_keras "
        f"in binder/postBuild) so the figures below are Binder's")
    assert pinned["tensorboard"] == metadata.version("tensorboard")
    postbuild = (ROOT / "binder" / "postBuild").read_text()
    assert f"tf_keras=={metadata.version('tf_keras')}" in postbuild


@pytest.mark.parametrize("path", NOTEBOOKS, ids=name)
def test_each_notebook_runs_inside_binders_2_gib_on_one_cpu(path, notebook_runs):
    reason = cgroups_unavailable()
    if reason:
        not_here(f"BINDER CHECK NOT RUN: {reason}; it needs root and the memory and cpu "
                 f"controllers (cgroup v1, or v2 delegated to this process's parent group)")
    run = notebook_runs.get(path)
    print(f"\nBinder's limits: {name(path)} {run.cpu_s:.0f} s of one CPU ({run.seconds:.0f} s wall"
          f"{', begun in the background' if run.background else ''}"
          f"{f', beside {run.busy_loops} busy loops' if run.busy_loops else ''}), "
          f"peak {run.cgroup_peak_mb} MB of {LIMIT_MB} ({run.leftovers_by})")
    assert run.cpu_quota
    assert run.cpu_s <= run.seconds + 2, vars(run)  # never more than one CPU's worth
    assert run.error is None, run.error
    assert run.oom_kills == 0 and run.limit_hits == 0, vars(run)
    assert run.cgroup_peak_mb > 300  # the kernel and its tasks were inside
    assert run.cgroup_peak_mb <= ROOM_MB, (
        f"{name(path)} peaked at {run.cgroup_peak_mb} MB, over the {ROOM_MB} MB a notebook has "
        f"beside Binder's notebook server")
    # the notebooks that compare timings ran beside two busy loops, and their checks held
    assert run.busy_loops == (BUSY_LOOPS if name(path) in UNDER_LOAD else 0)


@pytest.mark.timeout(300)  # the cell limit is 600 s: a wait on the dead kernel ends here
def test_a_kernel_killed_inside_the_limits_is_reported_at_once(tmp_path):
    """A kernel that dies mid-notebook (Binder restarts one above 2 GB) ends its execution with
    that error in seconds; the harness once waited on the dead kernel until the run's limit."""
    import json
    import subprocess
    import sys

    import nbformat

    reason = cgroups_unavailable()
    if reason:
        not_here(f"BINDER CHECK NOT RUN: {reason}")
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import os, signal"),
        nbformat.v4.new_code_cell("os.kill(os.getpid(), signal.SIGKILL)"),
        nbformat.v4.new_code_cell("print('never')")])
    path = tmp_path / "dies.ipynb"
    nbformat.write(notebook, path)
    code = ("import json, sys; from pathlib import Path; from notebook_runs import execute; "
            f"run = execute(Path({str(path)!r}), 'dies', Path({str(tmp_path / 'kernels')!r}), tutorial=False); "
            "print(json.dumps([run.error, run.leftovers, str(run.notebook.cells[2].get('outputs'))]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, capture_output=True,
                          text=True, timeout=280)  # as the executor does: a process of its own
    error, leftovers, last_outputs = json.loads(done.stdout.strip().splitlines()[-1])
    assert error is not None and "Kernel died" in error, error
    assert "never" not in last_outputs and leftovers == []
