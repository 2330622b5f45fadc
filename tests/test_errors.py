"""What a task's error shows of its log: the lines that can say why it ended, TensorFlow's
start-up lines (the GPU it looks for on a CPU machine, the instructions it was built for) left
out. (tests/test_workers.py reads them from a persistent worker that died.)"""

from dtflab.errors import TaskError, explaining, last_meaningful_line

LOG = """WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
E0000 00:00:1796224375.764489   16590 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
I0000 00:00:1796224375.9 16590 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
dtflab server: worker:1 serving grpc://127.0.0.1:28688 (pid 16632)
Traceback (most recent call last):
MemoryError: out of memory in step 12
"""


def test_a_tasks_last_lines_leave_tensorflows_start_up_out():
    assert explaining(LOG) == ["dtflab server: worker:1 serving grpc://127.0.0.1:28688 (pid 16632)",
                               "Traceback (most recent call last):",
                               "MemoryError: out of memory in step 12"]
    assert explaining(LOG, 1) == ["MemoryError: out of memory in step 12"]
    shown = "\n".join(TaskError("worker", 1, "exited", exit_code=1, log_tail=LOG)._render_traceback_())
    assert "MemoryError: out of memory in step 12" in shown and "cuInit" not in shown
    assert "optimized to use" not in shown


def test_a_log_of_start_up_lines_alone_has_no_meaningful_line():
    start_up = "\n".join(LOG.splitlines()[:3])
    assert last_meaningful_line(start_up) == "" and explaining(start_up) == []
    assert last_meaningful_line(LOG) == "MemoryError: out of memory in step 12"
