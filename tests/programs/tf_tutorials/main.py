# From TensorFlow's tutorial "Multi-worker training with Keras"
# (tensorflow/docs, site/en/tutorials/distribute/multi_worker_with_keras.ipynb, the cell
# `%%writefile main.py`), Apache License 2.0. Unchanged: dtflab sets TF_CONFIG for each
# worker and TF_USE_LEGACY_KERAS=1, so tf.keras is Keras 2 (tf_keras).

import os
import json

import tensorflow as tf
import mnist_setup

per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

with strategy.scope():
  # Model building/compiling need to be within `strategy.scope()`.
  multi_worker_model = mnist_setup.build_and_compile_cnn_model()


multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70)
