"""The Binder link comes from the clone's GitHub remote, or the user is told how to set it."""

from __future__ import annotations

import subprocess

import pytest

from dtflab.binder_link import badge
from test_cli import DTFLAB


def clone_with_remote(tmp_path, url):
    clone = tmp_path / "clone"
    subprocess.run(["git", "init", "-q", str(clone)], check=True)
    if url:
        subprocess.run(["git", "-C", str(clone), "remote", "add", "origin", url], check=True)
    return clone


@pytest.mark.parametrize("url", ["https://github.com/someone/dtflab.git",
                                 "git@github.com:someone/dtflab.git",
                                 "https://github.com/someone/dtflab"])
def test_the_badge_points_at_the_github_remote(tmp_path, url):
    assert badge(clone_with_remote(tmp_path, url), branch="main") == (
        "[![Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/someone/"
        "dtflab/main?urlpath=lab/tree/notebooks)")


def test_a_clone_without_a_remote_is_told_how_to_add_one(tmp_path):
    with pytest.raises(ValueError, match=r"no git remote 'origin'; push it to GitHub and add the "
                                         r"remote \(git remote add origin https://github.com/OWNER/NAME\)"):
        badge(clone_with_remote(tmp_path, None))


def test_a_remote_elsewhere_than_github_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"remote 'origin' is 'https://gitlab.com/a/b.git', not a GitHub"):
        badge(clone_with_remote(tmp_path, "https://gitlab.com/a/b.git"))


def test_dtflab_binder_prints_the_badge_or_a_one_line_reason():
    done = subprocess.run(DTFLAB + ["binder"], capture_output=True, text=True, timeout=60)
    if done.returncode == 0:
        assert done.stdout.startswith("[![Binder](https://mybinder.org/badge_logo.svg)]")
    else:
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith("dtflab binder: ") and done.stderr.count("\n") == 1
