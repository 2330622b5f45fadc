"""The API reference's pages: one per public module of dtflab, each its docstrings (autodoc),
grouped by room. Written at build time into ``api/generated/`` (not kept in git), so a new
module gets its page without an edit here."""

from __future__ import annotations

import pkgutil
import shutil
from pathlib import Path

#: The rooms in the order the reference lists them: what a notebook touches first.
ROOMS = [("dtflab", "The package"), ("train", "Training loops"), ("placement", "Placement"),
         ("tracing", "Tracing a step"), ("viz", "Views"), ("ui", "Widgets"),
         ("cluster", "Clusters and backends"), ("processes", "Task processes"),
         ("network", "The private network"), ("", "Skins and base modules")]


def public_modules(package) -> list[str]:
    names = [package.__name__] + [info.name for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")]
    return sorted(name for name in names if not any(part.startswith("_") for part in name.split(".")))


def room_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "dtflab"
    known = {room for room, _ in ROOMS}
    return parts[1] if parts[1] in known and (len(parts) > 2 or _is_package(module)) else ""


def _is_package(module: str) -> bool:
    import importlib

    return hasattr(importlib.import_module(module), "__path__")


def exported(module: str) -> str:
    """For a package that gathers names from its modules (``__all__``): each with a link to
    where it is documented."""
    import importlib
    import inspect

    package = importlib.import_module(module)
    if not hasattr(package, "__path__") or not hasattr(package, "__all__"):
        return ""
    rows = []
    for name in package.__all__:
        obj = getattr(package, name)
        if inspect.ismodule(obj) or not hasattr(obj, "__qualname__"):
            continue
        home = f"{obj.__module__}.{obj.__qualname__}"
        if home != f"{module}.{name}":
            rows.append(f"* :py:obj:`{module}.{name} <{home}>`")
    if not rows:
        return ""
    return ("\n.. rubric:: Names gathered here from the modules that define them\n\n"
            + "\n".join(rows) + "\n")


def write(package, folder: Path) -> str:
    """Write a page per module into ``folder``; returns the reference's table of contents."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    by_room: dict[str, list[str]] = {room: [] for room, _ in ROOMS}
    for module in public_modules(package):
        title = module.replace("_", r"\_")
        (folder / f"{module}.rst").write_text(f"{title}\n{'=' * len(title)}\n\n.. automodule:: {module}\n"
                                              + exported(module))
        by_room[room_of(module)].append(module)
    parts = []
    for room, heading in ROOMS:
        if by_room[room]:
            entries = "\n".join(f"   {folder.name}/{module}" for module in by_room[room])
            parts.append(f"{heading}\n{'-' * len(heading)}\n\n.. toctree::\n   :maxdepth: 1\n\n{entries}\n")
    return "\n".join(parts)
