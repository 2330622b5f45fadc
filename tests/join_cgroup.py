"""``python join_cgroup.py CGROUP... -- COMMAND...``: move into each cgroup, then become COMMAND.

The notebook kernels start this way (``notebook_runs``): the kernel, and everything it starts,
is inside Binder's limits from its first instruction."""

import os
import sys

if __name__ == "__main__":
    split = sys.argv.index("--")
    for group in sys.argv[1:split]:
        with open(os.path.join(group, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    command = sys.argv[split + 1:]
    os.execv(command[0], command)
