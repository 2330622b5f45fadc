"""A TF1 between-graph trainer as 2016-2018 users wrote them (TensorFlow's "Distributed
TensorFlow" how-to): one process per task, the cluster given as --ps_hosts/--worker_hosts, a
server of its own, variables on the ps through replica_device_setter, MonitoredTrainingSession
with a StopAtStepHook and per-worker device_filters, the chief writing checkpoints. Run unchanged by tests/test_programs.py
through `dtflab run ... --ps_hosts={ps_hosts} ...`.
"""

import argparse
import sys

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_eager_execution()
FLAGS = None


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
        # As TensorFlow's dist_test/mnist_replica.py: this worker's session sees only the ps
        # and itself, so it never waits for another worker (one that has finished, say).
        config = tf.ConfigProto(device_filters=["/job:ps", "/job:worker/task:%d" % FLAGS.task_index])
        rng = np.random.default_rng(FLAGS.task_index)
        with tf.train.MonitoredTrainingSession(master=server.target,
                                               is_chief=(FLAGS.task_index == 0),
                                               checkpoint_dir=FLAGS.checkpoint_dir,
                                               hooks=hooks, config=config) as mon_sess:
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
