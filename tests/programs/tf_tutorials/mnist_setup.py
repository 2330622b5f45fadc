# From TensorFlow's tutorial "Multi-worker training with Keras"
# (tensorflow/docs, site/en/tutorials/distribute/multi_worker_with_keras.ipynb, the cell
# `%%writefile mnist_setup.py`), Apache License 2.0. Changes are marked "dtflab:".

import os
import tensorflow as tf
import numpy as np

def mnist_dataset(batch_size):
  # dtflab: synthetic digits instead of the download (tests make their own data); same
  # shapes and dtypes as tf.keras.datasets.mnist.load_data(), 6,000 examples instead of 60,000.
  # (x_train, y_train), _ = tf.keras.datasets.mnist.load_data()
  rng = np.random.default_rng(0)
  y_train = rng.integers(0, 10, 6000).astype(np.uint8)
  x_train = (rng.integers(0, 64, (6000, 28, 28)) + 19 * y_train[:, None, None]).astype(np.uint8)
  # The `x` arrays are in uint8 and have values in the [0, 255] range.
  # You need to convert them to float32 with values in the [0, 1] range.
  x_train = x_train / np.float32(255)
  y_train = y_train.astype(np.int64)
  train_dataset = tf.data.Dataset.from_tensor_slices(
      (x_train, y_train)).shuffle(60000).repeat().batch(batch_size)
  return train_dataset

def build_and_compile_cnn_model():
  model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(28, 28)),
      tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
      tf.keras.layers.Conv2D(32, 3, activation='relu'),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(128, activation='relu'),
      tf.keras.layers.Dense(10)
  ])
  model.compile(
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
      metrics=['accuracy'])
  return model
