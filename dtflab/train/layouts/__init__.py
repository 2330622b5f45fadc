"""Who holds what and who talks to whom: a run's layout over the data, tensor, pipeline and
context axes (``mesh``), which layers each pipeline stage holds, which layer pairs tensor
parallelism splits, which tasks a run uses. Computed and checked here once, in pure
Python (no TensorFlow), so the strategies, the formulas and the views read the same answer."""
