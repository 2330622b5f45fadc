"""The mybinder.org link of a clone: derived from its GitHub remote, never guessed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

#: What the link opens: JupyterLab on the tutorials.
URL = "https://mybinder.org/v2/gh/{repository}/{branch}?urlpath=lab/tree/notebooks"
BADGE = "[![Binder](https://mybinder.org/badge_logo.svg)]({url})"
_GITHUB = re.compile(r"^(?:https://github\.com/|git@github\.com:|ssh://git@github\.com/)"
                     r"(?P<repository>[\w.-]+/[\w.-]+?)(?:\.git)?/?$")


def repository(clone: Path, remote: str = "origin") -> str:
    """``owner/name`` of the clone's GitHub remote, or a ValueError that says how to set it."""
    found = subprocess.run(["git", "-C", str(clone), "remote", "get-url", remote],
                           capture_output=True, text=True)
    url = found.stdout.strip()
    if found.returncode != 0 or not url:
        raise ValueError(f"this clone has no git remote {remote!r}; push it to GitHub and add "
                         f"the remote (git remote add {remote} https://github.com/OWNER/NAME), "
                         f"or write the link by hand: {URL.format(repository='OWNER/NAME', branch='main')}")
    match = _GITHUB.match(url)
    if not match:
        raise ValueError(f"remote {remote!r} is {url!r}, not a GitHub repository; mybinder.org "
                         f"builds from GitHub: push the clone there and point {remote!r} at it")
    return match["repository"]


def badge(clone: Path, branch: str = "main", remote: str = "origin") -> str:
    """The README badge in Markdown for this clone's GitHub repository."""
    return BADGE.format(url=URL.format(repository=repository(clone, remote), branch=branch))
