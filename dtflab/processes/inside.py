"""What every task process does inside, whoever started it: end with its owner.

The entry points (``server``, ``script``) import this module and nothing of the code that
started them (``launch``, ``spawn``, ``forkserver``, ``dtflab.cluster``). The fork server sets
``forked`` in each child it forks.
"""

from __future__ import annotations

import os
import signal
import threading
import time

#: Set in a forked child: its parent is the fork server, not the owner.
forked = False


def _no_signals() -> None:
    """A watcher thread takes no signal sent to the process: each goes to a thread of the
    program's (a persistent worker waits for one in a thread of its own)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())


def exit_with_parent() -> None:
    """End this process as soon as its owner is gone: standard input (a pipe from the owner)
    reaches EOF, or, for a spawned process, its parent pid changes. A process forked by the
    fork server watches standard input only: its parent is the fork server, not the owner."""
    parent = os.getppid()

    def stdin_closed():
        _no_signals()
        try:
            while os.read(0, 4096):  # the raw fd: no lock that would block interpreter exit
                pass
        except OSError:
            pass
        os._exit(0)

    def parent_changed():
        _no_signals()
        while os.getppid() == parent:
            time.sleep(0.25)
        os._exit(0)

    threading.Thread(target=stdin_closed, name="dtflab-stdin-watch", daemon=True).start()
    if not forked:
        threading.Thread(target=parent_changed, name="dtflab-parent-watch", daemon=True).start()

