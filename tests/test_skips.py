"""A tier this machine cannot run: a skip with its reason, counted in the run's last lines; under
``CI=true`` a failure (``conftest.not_here``). Each case runs pytest on a one-test file with this
suite's conftest as a plugin."""

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent
NEEDS_A_PART = """from conftest import not_here


def test_needs_a_part():
    not_here("PART TIER NOT RUN: no part at /usr/bin/part; install it with `apt-get install part`")
"""


def run_it(tmp_path, ci: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_needs.py").write_text(NEEDS_A_PART)
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    env.update(PYTHONPATH=str(TESTS), **({"CI": "true"} if ci else {}))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider",
                           "-ra", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path / "test_needs.py")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def test_outside_ci_a_missing_part_is_a_skip_whose_reason_and_count_end_the_run(tmp_path):
    done = run_it(tmp_path, ci=False)
    assert done.returncode == 0, done.stdout[-3000:]
    last = done.stdout.strip().splitlines()[-8:]
    assert any(" 1 skipped: not checked, and why " in line for line in done.stdout.splitlines())
    assert "   1 x PART TIER NOT RUN: no part at /usr/bin/part; install it with `apt-get install part`" \
        in done.stdout.splitlines()
    assert "1 skipped" in last[-1]
    assert any("SKIPPED [1]" in line and "install it with `apt-get install part`" in line for line in last)


def test_in_ci_a_missing_part_fails_the_run_with_its_reason(tmp_path):
    done = run_it(tmp_path, ci=True)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed" in done.stdout.strip().splitlines()[-1]
    assert ("PART TIER NOT RUN: no part at /usr/bin/part; install it with `apt-get install part` "
            "[CI=true: a tier is never skipped in CI; give the machine what it names]") in done.stdout
