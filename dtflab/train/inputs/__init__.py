"""The input pipeline as a distributed system: batches made by tf.data with a cost per example,
in this process or on the cluster's tf.data service (``data_workers=N`` at start).

- ``pipeline``: :func:`input_pipeline`, an MLP problem's examples with CPU work per example the
  learner sets, calibrated and measured here; any one-session loop reads it (``inputs=``) and
  records each step's wait for its batch (``history.input_wait_share()``).
- ``visits``: who received which element, per processing mode and sharding policy, with a data
  worker killed part way and restarted.
- ``scaling``: examples a second as data workers are added, beside what their cores predict.
"""

from dtflab.train.problems.pipeline import MODES, InputPipeline, input_pipeline

__all__ = ["MODES", "InputPipeline", "input_pipeline"]
