"""What a finished run leaves in the process that ran it: no graph of its own, and the pages
its steps freed given back to the system (``allocator.give_back``). On Binder's 2 GB a kernel
that kept every graph it ran, as TensorFlow's gradient registry keeps a custom gradient's graph,
grew by tens of MB a cell."""

from __future__ import annotations

import gc
import platform
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest

from dtflab import tf_private, train
from dtflab._quiet import import_tf

ROOT = Path(__file__).resolve().parents[1]


def graphs(tf) -> list:
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, tf.Graph)]


GLIBC = platform.libc_ver()[0] == "glibc"


def test_a_finished_run_leaves_no_graph_of_its_own_behind():
    tf = import_tf()
    from tensorflow.python.framework import ops

    before = weakref.WeakSet(graphs(tf))
    registered = set(ops._gradient_registry._registry)
    # a transformer's layer norms and attention are custom gradients
    problem = train.transformer(blocks=1, d_model=16, heads=2, sequence=8, batch_size=2)
    history = train.single(problem, steps=2, seed=0, logdir=False)
    assert len(history.losses) == 2
    left = [graph for graph in graphs(tf) if graph not in before]
    assert left == [], f"{len(left)} graphs of the run still alive, {sum(len(g.get_operations()) for g in left)} ops"
    assert sorted(set(ops._gradient_registry._registry) - registered) == []  # each one forgotten


def test_forgetting_a_graphs_custom_gradients_drops_only_its_own():
    tf = import_tf()
    from tensorflow.python.framework import ops

    def built():
        graph = tf.Graph()
        with graph.as_default():
            @tf.custom_gradient
            def doubled(x):
                return 2 * x, lambda dy: 2 * dy

            x = tf.compat.v1.placeholder(tf.float32, [3])
            y = doubled(x)
            tf.gradients(y, x)
        return graph, x, y

    (mine, _, _), (other, x, y) = built(), built()
    registered = set(ops._gradient_registry._registry)
    assert tf_private.forget_custom_gradients(mine) == 1
    assert len(registered - set(ops._gradient_registry._registry)) == 1
    with other.as_default():  # the other graph's gradient still builds, and is its own
        (grad,) = tf.gradients(y, x)
    with tf.compat.v1.Session(graph=other) as session:
        assert session.run(grad, {x: [1.0, 2.0, 3.0]}).tolist() == [2.0, 2.0, 2.0]
    assert tf_private.forget_custom_gradients(other) == 1


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's; elsewhere give_back does nothing")
def test_give_back_returns_freed_pages_the_heap_kept():
    """Chunks below glibc's mmap threshold come from the heap; freeing all but every fiftieth
    leaves holes the heap cannot trim from its top, which only ``malloc_trim`` returns."""
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from dtflab.allocator import give_back
        def rss_mb():
            return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        chunks = [bytearray(64 * 1024) for _ in range(3000)]   # about 190 MB, each page written
        kept = [chunk for i, chunk in enumerate(chunks) if i % 50 == 0]   # holding the holes open
        del chunks
        before = rss_mb()
        print(give_back(), before, rss_mb())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    gave, before, after = done.stdout.split()
    assert gave == "True", done.stderr
    assert float(before) - float(after) > 100, (before, after)  # of the ~186 MB freed


def test_tensorflow_imported_by_dtflab_and_every_task_allocate_as_the_settings_say():
    """TensorFlow reads ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR`` when it makes its CPU allocator: set
    before dtflab imports it, in the kernel and in each task's environment; a user's own value
    is kept."""
    from dtflab.allocator import SETTINGS
    from dtflab.processes.spawn import child_env

    code = textwrap.dedent("""
        import os, sys
        seen = []
        class Watch:  # what the environment held when tensorflow was first imported
            def find_spec(self, name, path=None, target=None):
                if name == "tensorflow" and not seen:
                    seen.append((os.environ.get("TF_ONEDNN_USE_SYSTEM_ALLOCATOR"),
                                 os.environ.get("MALLOC_ARENA_MAX")))
        sys.meta_path.insert(0, Watch())
        import dtflab._quiet as quiet
        quiet.import_tf()
        print(*seen[0])
    """)
    env = {k: v for k, v in child_env().items() if k not in SETTINGS}
    ours = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=dict(env, TF_ONEDNN_USE_SYSTEM_ALLOCATOR="0"))
    assert ours.stdout.split() == ["1", "2"], ours.stderr[-500:]
    assert theirs.stdout.split() == ["0", "2"], theirs.stderr[-500:]
    task = child_env(base={"MALLOC_ARENA_MAX": "4"})
    assert (task["TF_ONEDNN_USE_SYSTEM_ALLOCATOR"], task["MALLOC_ARENA_MAX"]) == ("1", "4")
