"""The formulas predictions, benchmarks and views share: bytes on the wire, bubbles, memory,
speedups. Pure Python: no TensorFlow, no cluster; a formula is checked against a measurement in
the tests, never against itself."""

from dtflab.train.formulas import costs, memory, scaling, transformer  # noqa: F401

__all__ = ["costs", "memory", "scaling", "transformer"]
