"""dtflab's own files in the temporary folder (``dtflab-*``): task logs, the fork server's and
the gate's logs, checkpoints of a run that was given no folder, the exit log.

Each is held by the process that made it for as long as that process lives: an advisory lock
(``flock``) that the kernel drops when the process ends, even by SIGKILL. A process that ends
cleanly removes its own; one that was killed cannot, so whoever makes the next folder removes
every ``dtflab-*`` entry of this user that no process holds (:func:`sweep`). What it cannot do:
remove a killed kernel's logs before dtflab next makes a folder on this machine, or anything
another program put there under the same prefix (an entry is removed only if dtflab marked it).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time

PREFIX = "dtflab-"
#: The file inside a folder whose lock says its maker is alive.
OWNER = ".dtflab-owner"
#: The files :func:`hold` marks: ``dtflab-exit-PID.log`` (``cluster.running``).
HELD_FILES = PREFIX + "exit-"
#: An entry younger than this is left alone: its maker may not hold it yet.
SETTLE_S = 30.0

_held: dict[str, int] = {}  # folder -> the descriptor that holds its lock


def folder(kind: str) -> str:
    """A new folder ``dtflab-{kind}-XXXX`` held by this process, after removing the ones whose
    makers have ended (:func:`sweep`); :func:`remove` it when done."""
    sweep()
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-")
    descriptor = os.open(os.path.join(path, OWNER), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    hold(descriptor)  # where the file system has no locks, no sweep can take it either
    _held[path] = descriptor
    return path


def remove(path) -> None:
    """Let go of a folder of :func:`folder` and delete it (what cannot be deleted now, a file a
    task is still writing, goes at a later sweep)."""
    descriptor = _held.pop(str(path), None)
    if descriptor is not None:
        os.close(descriptor)
    shutil.rmtree(path, ignore_errors=True)


def hold(descriptor: int) -> None:
    """Hold an open file for as long as this process lives: a folder's :data:`OWNER`, or a
    ``dtflab-exit-*.log`` (:data:`HELD_FILES`); the lock goes with the open file, so a
    duplicate of ``descriptor`` keeps it."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass


def sweep(settle_s: float = SETTLE_S) -> list[str]:
    """Remove every ``dtflab-*`` folder of :func:`folder` and every ``dtflab-exit-*.log`` of
    :func:`hold` in the temporary folder that this user owns, no process holds and is older
    than ``settle_s``; returns what it removed."""
    where = tempfile.gettempdir()
    removed = []
    try:
        entries = [entry for entry in os.scandir(where) if entry.name.startswith(PREFIX)]
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        try:
            status = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if status.st_uid != os.getuid() or now - status.st_mtime < settle_s:
            continue
        if entry.is_dir(follow_symlinks=False):
            marker = os.path.join(entry.path, OWNER)
            if os.path.exists(marker) and not _is_held(marker):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
        elif entry.name.startswith(HELD_FILES) and entry.is_file(follow_symlinks=False):
            if not _is_held(entry.path):
                try:
                    os.unlink(entry.path)
                    removed.append(entry.path)
                except OSError:
                    pass
    return removed


def _is_held(path: str) -> bool:
    """Whether a live process holds ``path``'s lock (a file that cannot be opened: held)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(descriptor)
    return False
