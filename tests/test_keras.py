"""Keras that works: TF's own distributed Keras tutorials, run through dtflab unchanged but for
their data (copies in tests/programs/tf_tutorials, changes marked), and strategy_for's options."""

import subprocess
import sys
from pathlib import Path

import pytest


pytestmark = pytest.mark.slow

TUTORIALS = Path(__file__).parent / "programs" / "tf_tutorials"


def test_multi_worker_with_keras_runs_model_fit_on_two_workers(run_programs):
    cluster = run_programs("main.py", workers=2, cwd=TUTORIALS)
    assert cluster.wait(timeout=240) == {"worker:0": 0, "worker:1": 0}
    for worker in ("worker:0", "worker:1"):
        log = cluster.logs(worker)
        assert "Epoch 3/3" in log and "70/70" in log
        assert "PerReplica" not in log  # Keras 3's failure


def test_parameter_server_training_runs_fit_and_the_custom_loop_as_the_chief(run_programs):
    cluster = run_programs("parameter_server_training.py", workers=3, ps=2, chief_only=True,
                           cwd=TUTORIALS)
    assert cluster.wait(timeout=240) == {"chief:0": 0}
    log = cluster.logs("chief:0")
    assert "Epoch 5/5" in log  # Model.fit
    assert "Finished epoch 3" in log and "Final loss is" in log  # the custom loop
    # the embedding was split over both ps tasks by the tutorial's MinSizePartitioner
    assert "/job:ps/replica:0/task:0" in log and "/job:ps/replica:0/task:1" in log
    assert {t.name for t in cluster.tasks} == {"chief:0", "ps:0", "ps:1", "worker:0", "worker:1",
                                               "worker:2"}


STRATEGY_FOR = """
import dtflab, tensorflow as tf
from dtflab import train
with dtflab.start_cluster(jobs="ps=2,worker=2") as cluster:
    partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
    strategy = train.strategy_for(cluster, variable_partitioner=partitioner)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(64, input_shape=(8,)),
                                     tf.keras.layers.Dense(1)])
        model.compile(tf.keras.optimizers.legacy.SGD(0.01), loss="mse")
    kernel = model.layers[0].kernel
    print("SHARDS", sorted({v.device.split("/device")[0] for v in kernel.variables}))
    x = tf.random.uniform((64, 8))
    data = tf.data.Dataset.from_tensor_slices((x, tf.reduce_sum(x, 1))).repeat().batch(16)
    history = model.fit(data, epochs=2, steps_per_epoch=5, verbose=0)
    print("LOSSES", history.history["loss"])
"""


def test_strategy_for_takes_the_strategys_options_and_model_fit_works_in_the_notebook():
    # The coordinator changes TensorFlow's process-wide context: a process of its own.
    out = subprocess.run([sys.executable, "-c", STRATEGY_FOR], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    shards = next(line for line in out.stdout.splitlines() if line.startswith("SHARDS"))
    assert "/job:ps/replica:0/task:0" in shards and "/job:ps/replica:0/task:1" in shards
    losses = next(line for line in out.stdout.splitlines() if line.startswith("LOSSES"))
    assert len(eval(losses.split(" ", 1)[1])) == 2


def test_strategy_for_names_the_bad_option():
    code = ("import dtflab\nfrom dtflab import train\n"
            "with dtflab.start_cluster(jobs='ps=1,worker=1') as c:\n"
            "    train.strategy_for(c, partitioner=None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "partitioner" in out.stderr.splitlines()[-1] and "variable_partitioner" in out.stderr
