"""Trace one step: partitions per device, transfers between them, per-device timings."""

from dtflab.tracing.capture import recording, trace
from dtflab.tracing.step import Op, OpTiming, StepTrace, Transfer, short_device

__all__ = ["trace", "recording", "StepTrace", "Op", "OpTiming", "Transfer", "short_device"]
