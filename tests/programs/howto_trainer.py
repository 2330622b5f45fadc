"""TensorFlow's TF1 "Distributed TensorFlow" how-to trainer as it was published: like
between_graph_trainer.py but with no device_filters, so a worker's session waits for every
task of the cluster, the other workers included.

One change, for tests, marked below: with DTFLAB_LATE_WORKER=N, worker N opens its session
only once worker 0 has exited (its port refuses connections), forcing the race in which a
worker waits for ever for a chief that has finished.
"""

import argparse
import os
import socket
import sys
import time

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_eager_execution()
FLAGS = None


def wait_until_gone(address):  # test change: not in the how-to
    """Return once nothing listens at ``address`` (host:port) any more."""
    host, port = address.rsplit(":", 1)
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            return
        time.sleep(0.1)


def main(_):
    ps_hosts = FLAGS.ps_hosts.split(",")
    worker_hosts = FLAGS.worker_hosts.split(",")
    cluster = tf.train.ClusterSpec({"ps": ps_hosts, "worker": worker_hosts})
    server = tf.train.Server(cluster, job_name=FLAGS.job_name, task_index=FLAGS.task_index)

    if FLAGS.job_name == "ps":
        server.join()
    elif FLAGS.job_name == "worker":
        with tf.device(tf.train.replica_device_setter(
                worker_device="/job:worker/task:%d" % FLAGS.task_index, cluster=cluster)):
            x = tf.placeholder(tf.float32, [None, 1])
            y = tf.placeholder(tf.float32, [None, 1])
            w = tf.get_variable("w", [1, 1])
            b = tf.get_variable("b", [1])
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
            global_step = tf.train.get_or_create_global_step()
            train_op = tf.train.AdagradOptimizer(0.1).minimize(loss, global_step=global_step)

        hooks = [tf.train.StopAtStepHook(last_step=FLAGS.last_step)]
        # Test change: this worker starts its session late, once worker 0 has exited.
        if os.environ.get("DTFLAB_LATE_WORKER") == str(FLAGS.task_index):
            wait_until_gone(worker_hosts[0])
            print("worker %d: worker 0 has exited; opening my session at %.2f"
                  % (FLAGS.task_index, time.time()), flush=True)
        rng = np.random.default_rng(FLAGS.task_index)
        with tf.train.MonitoredTrainingSession(master=server.target,
                                               is_chief=(FLAGS.task_index == 0),
                                               checkpoint_dir=FLAGS.checkpoint_dir,
                                               hooks=hooks) as mon_sess:
            step = 0
            while not mon_sess.should_stop():
                xs = rng.uniform(-1, 1, (32, 1)).astype("float32")
                _, step = mon_sess.run([train_op, global_step], {x: xs, y: 3 * xs + 1})
        print("worker %d done at global step %d" % (FLAGS.task_index, step), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ps_hosts", type=str, default="")
    parser.add_argument("--worker_hosts", type=str, default="")
    parser.add_argument("--job_name", type=str, default="")
    parser.add_argument("--task_index", type=int, default=0)
    parser.add_argument("--last_step", type=int, default=50)
    parser.add_argument("--checkpoint_dir", type=str, default=None)
    FLAGS, unparsed = parser.parse_known_args()
    tf.app.run(main=main, argv=[sys.argv[0]] + unparsed)
