# From TensorFlow's tutorial "Distributed training with DTensors"
# (tensorflow/docs, site/en/tutorials/distribute/dtensor_ml_tutorial.ipynb, as of commit
# bd984cb65519aea3d2a8b466a6a79bb1455a8b9c): its code cells in order from the imports through
# "Spatial Parallel Training", Copyright 2019 The TensorFlow Authors, Apache License 2.0.
# Changes are marked "dtflab:". Left out: the `pip install tensorflow-datasets` cell and the
# last section, "SavedModel and DTensor" (its one-device mesh, create_mesh([("world", 1)],
# devices=DEVICES[:1]), is client 0's CPU:0 on every client; on client 1 building the MLP on it
# fails: InternalError: Haven't set up remote eager worker in this eager context yet).
#
# A multi-client DTensor program: every client runs this file, DTensor's multi-client set-up
# comes from the DTENSOR_* variables dtflab gives each worker, and the 8 devices of the
# tutorial's meshes are spread evenly over the clients (8 // clients each: 1, 2, 4 or 8
# clients). Every client must be given the same --checkpoint_dir (see below):
#
#   dtflab run --workers 2 dtensor_ml_tutorial.py --mesh model --checkpoint_dir /tmp/ckpt
#
# Alone (no DTENSOR_* variables) it is one client with 8 virtual CPUs, as in the tutorial.

# dtflab: the flags below
import argparse
import tempfile
import numpy as np
# dtflab: no TensorFlow Datasets (synthetic data below)
# import tensorflow_datasets as tfds

import tensorflow as tf

from tensorflow.experimental import dtensor

# dtflab: which of the tutorial's training sections to run, in the tutorial's order (all
# three by default, as the tutorial does: each goes on from the previous one's checkpoint):
# "data" (Data parallel training, mesh [("batch", 8)]), "model" (Model Parallel Training,
# [("batch", 4), ("model", 2)]), "spatial" (Spatial Parallel Training,
# [("batch", 2), ("feature", 2), ("model", 2)]); and where checkpoints go.
parser = argparse.ArgumentParser()
parser.add_argument('--mesh', nargs='+', choices=['data', 'model', 'spatial'],
                    default=['data', 'model', 'spatial'])
parser.add_argument('--checkpoint_dir', help='the same directory on every client '
                    '(default: a new temporary directory)')
FLAGS = parser.parse_args()

print('TensorFlow version:', tf.__version__)

def configure_virtual_cpus(ncpu):
  phy_devices = tf.config.list_physical_devices('CPU')
  tf.config.set_logical_device_configuration(phy_devices[0], [
        tf.config.LogicalDeviceConfiguration(),
    ] * ncpu)

# dtflab: the 8 devices are spread over the clients, and DTensor's multi-client runtime is
# started (from DTENSOR_JOBS and the other DTENSOR_* variables; with none, one local client)
# configure_virtual_cpus(8)
# DEVICES = [f'CPU:{i}' for i in range(8)]
configure_virtual_cpus(8 // dtensor.num_clients())
dtensor.initialize_accelerator_system('CPU')
DEVICES = [f'CPU:{i}' for i in range(8 // dtensor.num_clients())]

tf.config.list_logical_devices('CPU')

# dtflab: synthetic reviews instead of the IMDB download (no network and no tfds here), with
# what tfds.load(..., batch_size=64) gives: batches of 64 of {'text': string, 'label': int64}.
# 256 reviews (4 batches, so 8 steps in 2 epochs) of 80 words from a vocabulary of 1,199
# words (with the OOV token, the 1,200 tokens TextVectorization keeps, the model's input
# size). The label is a fixed linear rule of the word counts (whether the review's words'
# scores add up to more than 0), so it can be learnt. From a fixed seed, not shuffled: every
# client makes the same batches, which repack_local_tensor needs (it cuts each client's shards
# out of the global batch).
# train_data = tfds.load('imdb_reviews', split='train', shuffle_files=True, batch_size=64)
rng = np.random.default_rng(0)
words = np.array([f'w{i}' for i in range(1199)])
word_scores = rng.normal(size=len(words))
reviews = rng.integers(0, len(words), (256, 80))
labels = (word_scores[reviews].sum(axis=1) > 0).astype(np.int64)
train_data = tf.data.Dataset.from_tensor_slices(
    {'text': [' '.join(words[review]) for review in reviews], 'label': labels}).batch(64)
train_data

text_vectorization = tf.keras.layers.TextVectorization(output_mode='tf_idf', max_tokens=1200, output_sequence_length=None)
text_vectorization.adapt(data=train_data.map(lambda x: x['text']))

def vectorize(features):
  return text_vectorization(features['text']), features['label']

train_data_vec = train_data.map(vectorize)
train_data_vec

class Dense(tf.Module):

  def __init__(self, input_size, output_size,
               init_seed, weight_layout, activation=None):
    super().__init__()

    random_normal_initializer = tf.function(tf.random.stateless_normal)

    self.weight = dtensor.DVariable(
        dtensor.call_with_layout(
            random_normal_initializer, weight_layout,
            shape=[input_size, output_size],
            seed=init_seed
            ))
    if activation is None:
      activation = lambda x:x
    self.activation = activation
    
    # bias is sharded the same way as the last axis of weight.
    bias_layout = weight_layout.delete([0])

    self.bias = dtensor.DVariable(
        dtensor.call_with_layout(tf.zeros, bias_layout, [output_size]))

  def __call__(self, x):
    y = tf.matmul(x, self.weight) + self.bias
    y = self.activation(y)

    return y

class BatchNorm(tf.Module):

  def __init__(self):
    super().__init__()

  def __call__(self, x, training=True):
    if not training:
      # This branch is not used in the Tutorial.
      pass
    mean, variance = tf.nn.moments(x, axes=[0])
    return tf.nn.batch_normalization(x, mean, variance, 0.0, 1.0, 1e-5)

def make_keras_bn(bn_layout):
  return tf.keras.layers.BatchNormalization(gamma_layout=bn_layout,
                                            beta_layout=bn_layout,
                                            moving_mean_layout=bn_layout,
                                            moving_variance_layout=bn_layout,
                                            fused=False)

from typing import Tuple

class MLP(tf.Module):

  def __init__(self, dense_layouts: Tuple[dtensor.Layout, dtensor.Layout]):
    super().__init__()

    self.dense1 = Dense(
        1200, 48, (1, 2), dense_layouts[0], activation=tf.nn.relu)
    self.bn = BatchNorm()
    self.dense2 = Dense(48, 2, (3, 4), dense_layouts[1])

  def __call__(self, x):
    y = x
    y = self.dense1(y)
    y = self.bn(y)
    y = self.dense2(y)
    return y

class MLPStricter(tf.Module):

  def __init__(self, mesh, input_mesh_dim, inner_mesh_dim1, output_mesh_dim):
    super().__init__()

    self.dense1 = Dense(
        1200, 48, (1, 2), dtensor.Layout([input_mesh_dim, inner_mesh_dim1], mesh),
        activation=tf.nn.relu)
    self.bn = BatchNorm()
    self.dense2 = Dense(48, 2, (3, 4), dtensor.Layout([inner_mesh_dim1, output_mesh_dim], mesh))


  def __call__(self, x):
    y = x
    y = self.dense1(y)
    y = self.bn(y)
    y = self.dense2(y)
    return y

# dtflab: a mesh over every client's devices (create_mesh makes a mesh of this client's devices)
# WORLD = dtensor.create_mesh([("world", 8)], devices=DEVICES)
WORLD = dtensor.create_distributed_mesh([("world", 8)], local_devices=DEVICES)

model = MLP([dtensor.Layout.replicated(WORLD, rank=2),
             dtensor.Layout.replicated(WORLD, rank=2)])

sample_x, sample_y = train_data_vec.take(1).get_single_element()
sample_x = dtensor.copy_to_mesh(sample_x, dtensor.Layout.replicated(WORLD, rank=2))
print(model(sample_x))

def repack_local_tensor(x, layout):
  """Repacks a local Tensor-like to a DTensor with layout.

  This function assumes a single-client application.
  """
  x = tf.convert_to_tensor(x)
  sharded_dims = []

  # For every sharded dimension, use tf.split to split the along the dimension.
  # The result is a nested list of split-tensors in queue[0].
  queue = [x]
  for axis, dim in enumerate(layout.sharding_specs):
    if dim == dtensor.UNSHARDED:
      continue
    num_splits = layout.shape[axis]
    queue = tf.nest.map_structure(lambda x: tf.split(x, num_splits, axis=axis), queue)
    sharded_dims.append(dim)

  # Now we can build the list of component tensors by looking up the location in
  # the nested list of split-tensors created in queue[0].
  components = []
  for locations in layout.mesh.local_device_locations():
    t = queue[0]
    for dim in sharded_dims:
      split_index = locations[dim]  # Only valid on single-client mesh.
      t = t[split_index]
    components.append(t)

  return dtensor.pack(components, layout)

# dtflab: the Data parallel training section's cells, indented, if --mesh names "data" (its
# training loop below, after the two definitions all sections use)
if 'data' in FLAGS.mesh:
  # dtflab: a mesh over every client's devices
  # mesh = dtensor.create_mesh([("batch", 8)], devices=DEVICES)
  mesh = dtensor.create_distributed_mesh([("batch", 8)], local_devices=DEVICES)

  model = MLP([dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh),
               dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh),])

  def repack_batch(x, y, mesh):
    x = repack_local_tensor(x, layout=dtensor.Layout(['batch', dtensor.UNSHARDED], mesh))
    y = repack_local_tensor(y, layout=dtensor.Layout(['batch'], mesh))
    return x, y

  sample_x, sample_y = train_data_vec.take(1).get_single_element()
  sample_x, sample_y = repack_batch(sample_x, sample_y, mesh)

  print('x', sample_x[:, 0])
  print('y', sample_y)

# Refer to the CTL (custom training loop guide)
@tf.function
def train_step(model, x, y, learning_rate=tf.constant(1e-4)):
  with tf.GradientTape() as tape:
    logits = model(x)
    # tf.reduce_sum sums the batch sharded per-example loss to a replicated
    # global loss (scalar).
    loss = tf.reduce_sum(
        tf.nn.sparse_softmax_cross_entropy_with_logits(
            logits=logits, labels=y))
  parameters = model.trainable_variables
  gradients = tape.gradient(loss, parameters)
  for parameter, parameter_gradient in zip(parameters, gradients):
    parameter.assign_sub(learning_rate * parameter_gradient)

  # Define some metrics
  accuracy = 1.0 - tf.reduce_sum(tf.cast(tf.argmax(logits, axis=-1, output_type=tf.int64) != y, tf.float32)) / x.shape[0]
  loss_per_sample = loss / len(x)
  return {'loss': loss_per_sample, 'accuracy': accuracy}

# dtflab: the directory from --checkpoint_dir, the same on every client. With these meshes
# client 0 writes all of a checkpoint's data files (its devices hold a copy of every shard):
# given a directory of its own, client 1 finds only the `checkpoint` file there, and the next
# section's restore fails on it (NotFoundError: Unsuccessful TensorSliceReader constructor:
# Failed to find any matching files for .../ckpt-2).
# CHECKPOINT_DIR = tempfile.mkdtemp()
CHECKPOINT_DIR = FLAGS.checkpoint_dir or tempfile.mkdtemp()

def start_checkpoint_manager(model):
  ckpt = tf.train.Checkpoint(root=model)
  manager = tf.train.CheckpointManager(ckpt, CHECKPOINT_DIR, max_to_keep=3)

  if manager.latest_checkpoint:
    print("Restoring a checkpoint")
    ckpt.restore(manager.latest_checkpoint).assert_consumed()
  else:
    print("New training")
  return manager

# dtflab: the section's training loop, indented, if --mesh names "data"
if 'data' in FLAGS.mesh:
  num_epochs = 2
  manager = start_checkpoint_manager(model)

  for epoch in range(num_epochs):
    step = 0
    pbar = tf.keras.utils.Progbar(target=int(train_data_vec.cardinality()), stateful_metrics=[])
    metrics = {'epoch': epoch}
    for x,y in train_data_vec:

      x, y = repack_batch(x, y, mesh)

      metrics.update(train_step(model, x, y, 1e-2))

      pbar.update(step, values=metrics.items(), finalize=False)
      # dtflab: a line a step (after the progress bar's, which ends without a newline)
      print(f"\nepoch {epoch} step {step} loss {float(metrics['loss'])!r}", flush=True)
      step += 1
    manager.save()
    pbar.update(step, values=metrics.items(), finalize=True)
  # dtflab: a last line, to compare the clients
  print(f"client {dtensor.client_id()} mesh {mesh.shape()} loss {float(metrics['loss'])!r}", flush=True)

# dtflab: the Model Parallel Training section's cells, indented, if --mesh names "model"
if 'model' in FLAGS.mesh:
  # dtflab: a mesh over every client's devices
  # mesh = dtensor.create_mesh([("batch", 4), ("model", 2)], devices=DEVICES)
  mesh = dtensor.create_distributed_mesh([("batch", 4), ("model", 2)], local_devices=DEVICES)
  model = MLP([dtensor.Layout([dtensor.UNSHARDED, "model"], mesh), 
               dtensor.Layout(["model", dtensor.UNSHARDED], mesh)])

  def repack_batch(x, y, mesh):
    x = repack_local_tensor(x, layout=dtensor.Layout(['batch', dtensor.UNSHARDED], mesh))
    y = repack_local_tensor(y, layout=dtensor.Layout(['batch'], mesh))
    return x, y

  num_epochs = 2
  manager = start_checkpoint_manager(model)

  for epoch in range(num_epochs):
    step = 0
    pbar = tf.keras.utils.Progbar(target=int(train_data_vec.cardinality()))
    metrics = {'epoch': epoch}
    for x,y in train_data_vec:
      x, y = repack_batch(x, y, mesh)
      metrics.update(train_step(model, x, y, 1e-2))
      pbar.update(step, values=metrics.items(), finalize=False)
      # dtflab: a line a step
      print(f"\nepoch {epoch} step {step} loss {float(metrics['loss'])!r}", flush=True)
      step += 1
    manager.save()
    pbar.update(step, values=metrics.items(), finalize=True)
  # dtflab: a last line
  print(f"client {dtensor.client_id()} mesh {mesh.shape()} loss {float(metrics['loss'])!r}", flush=True)

# dtflab: the Spatial Parallel Training section's cells, indented, if --mesh names "spatial"
if 'spatial' in FLAGS.mesh:
  # dtflab: a mesh over every client's devices
  # mesh = dtensor.create_mesh([("batch", 2), ("feature", 2), ("model", 2)], devices=DEVICES)
  mesh = dtensor.create_distributed_mesh([("batch", 2), ("feature", 2), ("model", 2)], local_devices=DEVICES)
  model = MLP([dtensor.Layout(["feature", "model"], mesh), 
               dtensor.Layout(["model", dtensor.UNSHARDED], mesh)])

  def repack_batch_for_spt(x, y, mesh):
      # Shard data on feature dimension, too
      x = repack_local_tensor(x, layout=dtensor.Layout(["batch", 'feature'], mesh))
      y = repack_local_tensor(y, layout=dtensor.Layout(["batch"], mesh))
      return x, y

  num_epochs = 2

  manager = start_checkpoint_manager(model)
  for epoch in range(num_epochs):
    step = 0
    metrics = {'epoch': epoch}
    pbar = tf.keras.utils.Progbar(target=int(train_data_vec.cardinality()))

    for x, y in train_data_vec:
      x, y = repack_batch_for_spt(x, y, mesh)
      metrics.update(train_step(model, x, y, 1e-2))

      pbar.update(step, values=metrics.items(), finalize=False)
      # dtflab: a line a step
      print(f"\nepoch {epoch} step {step} loss {float(metrics['loss'])!r}", flush=True)
      step += 1
    manager.save()
    pbar.update(step, values=metrics.items(), finalize=True)
  # dtflab: a last line
  print(f"client {dtensor.client_id()} mesh {mesh.shape()} loss {float(metrics['loss'])!r}", flush=True)
