"""dtflab.profile: TF2 code on a connected cluster, timed by the TF profiler on every task."""

import json
import subprocess
import sys

import pytest

import dtflab
from dtflab.errors import NotSupportedError

SCRIPT = """
import json, dtflab
from dtflab._quiet import import_tf
from dtflab.tracing import short_device
tf = import_tf()
with dtflab.start_cluster(workers=2, ps=0) as cluster:
    cluster.connect()

    @tf.function
    def step(a):
        with tf.device("/job:worker/task:0"):
            b = tf.matmul(a, a)
        with tf.device("/job:worker/task:1"):
            return tf.reduce_sum(b * 2.0)

    timings = dtflab.profile(cluster, step, tf.ones([64, 64]), duration_ms=600)
    chrome = timings.to_chrome_trace()
    print(json.dumps({
        "kernels": {short_device(d): sorted({t.name for t in ts if t.kind == "compute"})
                    for d, ts in timings.timings.items()},
        "inside": all(0 <= t.start_us and t.end_us <= timings.step_us
                      for ts in timings.timings.values() for t in ts),
        "note": timings.note,
        "processes": sorted(e["args"]["name"] for e in chrome["traceEvents"] if e.get("name") == "process_name"),
    }))
"""


@pytest.mark.slow
def test_profile_times_tf2_functions_on_each_task():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert any(name.endswith(":_MklMatMul") or name.endswith(":MatMul") for name in result["kernels"]["worker:0"])
    assert any(name.endswith(":Sum") for name in result["kernels"]["worker:1"])
    assert not any("MatMul" in name for name in result["kernels"]["worker:1"])
    assert result["inside"]
    assert result["processes"] == ["worker:0", "worker:1"]
    assert "calls of step in 600 ms" in result["note"]


def test_profile_refuses_inprocess_clusters_and_says_which_backend(start_cluster):
    cluster = start_cluster(1, backend="inprocess")
    with pytest.raises(NotSupportedError, match=r"the inprocess backend has none: start the cluster "
                                                 r"with --backend local"):
        dtflab.profile(cluster, lambda: None)
