"""The input pipeline as a distributed system: batches made by tf.data with a cost per example,
in this process or on the cluster's tf.data service (``data_workers=N`` at start).

- :func:`input_pipeline` (defined in ``dtflab.train.problems.input_pipeline``, where worker programs
  read it too): an MLP problem's examples with CPU work per example the learner sets,
  calibrated and measured here; every loop but ``ps_strategy`` reads it (``inputs=``) and
  records each step's wait for its batch (``history.input_wait_share()``).
- ``visits``: who received which element, per processing mode and sharding policy, with a data
  worker killed part way and restarted.
- ``scaling``: examples a second as data workers are added, beside what their cores predict.
"""

from dtflab.train.problems.input_pipeline import MODES, InputPipeline, input_pipeline

__all__ = ["MODES", "InputPipeline", "input_pipeline"]
