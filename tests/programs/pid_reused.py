"""A task forked with an ended task's pid, run in a PID namespace of its own.

Run as ``unshare --pid --fork --mount-proc python pid_reused.py FOLDER`` (root): only this
program's processes and threads take pids there, so writing ``ns_last_pid`` hands the ended
task's pid to the next fork. On the host, any process on the machine may take it first (the
notebooks executing beside the tests took it in ten tries out of ten once). Prints one JSON
line of what each task read; tests/test_programs.py asserts on it.
"""

import json
import sys
import time
from pathlib import Path

import dtflab

folder = Path(sys.argv[1])
quick, slow = folder / "quick.py", folder / "slow.py"
quick.write_text("import os, sys\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n")
slow.write_text("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n"
                "time.sleep(600)\n")
ended = dtflab.run(str(quick), str(folder / "ended.pid"), workers=1)
exits = ended.wait()
pid = int((folder / "ended.pid").read_text())
before, tries = 1, []  # pids taken between the write and the fork (threads starting): learnt
for attempt in range(10):
    pid_file = folder / f"reborn{attempt}.pid"
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - before))
    reborn = dtflab.run(str(slow), str(pid_file), workers=1)
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    tries.append(int(pid_file.read_text()))
    if tries[-1] == pid:
        break
    reborn.stop()
    before = max(1, before + tries[-1] - pid)
seen = {"exits": exits, "pid": pid, "tries": tries,
        "reborn": [(t.state.name, t.pid) for t in reborn.tasks],
        "ended": [(t.state.name, t.exit_code, t.pid) for t in ended.tasks]}
ended.stop()  # what it kills is its own task, not whoever has that pid now
try:
    reborn.wait(timeout=2)
    seen["after_stop"] = "reborn ended"
except TimeoutError as error:
    seen["after_stop"] = str(error)
reborn.stop()
print(json.dumps(seen), flush=True)
