"""Run steps with full tracing: ``dtflab.trace`` and the ``Session.run`` recorder."""

from __future__ import annotations

import contextlib
import threading

from dtflab import tf_private
from dtflab._quiet import import_tf
from dtflab.tracing.parse import trace_from_metadata
from dtflab.tracing.step import StepTrace

TF2_NOT_SUPPORTED = (
    "dtflab.trace takes a tf.compat.v1 Session; {what} is TF2 code. TensorFlow 2 gives no "
    "partition graphs or step stats for tf.function code on a remote cluster "
    "(context.enable_run_metadata returns nothing there). Build the step as a graph and trace "
    "it with a Session (see notebooks/00_quickstart.ipynb), or time TF2 code with the "
    "TensorFlow profiler (tf.profiler.experimental)."
)


def _traced_options(options=None):
    tf = import_tf()
    traced = tf.compat.v1.RunOptions()
    if options is not None:
        traced.CopyFrom(options)
    traced.trace_level = tf.compat.v1.RunOptions.FULL_TRACE
    traced.output_partition_graphs = True
    return traced


def _check_session(session) -> None:
    tf = import_tf()
    if isinstance(session, tf.compat.v1.Session.__mro__[1]) or (
            hasattr(session, "run") and not callable(session)):
        return
    what = type(session).__name__
    if callable(session):
        raise TypeError(TF2_NOT_SUPPORTED.format(what=f"a callable ({what})"))
    raise TypeError(f"dtflab.trace needs a tf.compat.v1 Session, got {what}; open one with "
                    f"tf.compat.v1.Session(cluster.target('worker', 0))")


def trace(session, fetches, feed_dict=None, **run_kwargs) -> StepTrace:
    """Run one step with full tracing and return what it did, device by device.

    In [1]: step = dtflab.trace(session, train_op, {x: xs, t: ts})
    In [2]: step.transfers[0].nbytes, step.show()

    Takes what ``Session.run`` takes. ``options`` you pass are kept (tracing is added to a
    copy); a ``run_metadata`` you pass is filled too. Only this one step is traced: other runs
    of the session pay nothing. The step's result is ``StepTrace.result``.
    """
    _check_session(session)
    tf = import_tf()
    metadata = tf.compat.v1.RunMetadata()
    user_metadata = run_kwargs.pop("run_metadata", None)
    options = _traced_options(run_kwargs.pop("options", None))
    result = session.run(fetches, feed_dict=feed_dict, options=options, run_metadata=metadata,
                         **run_kwargs)
    if user_metadata is not None:
        user_metadata.MergeFrom(metadata)
    return trace_from_metadata(metadata, result, feed_dict)


@contextlib.contextmanager
def recording(select="first"):
    """Trace the ``Session.run`` calls made in the block; yields the list of traces kept.

    ``select`` is ``"first"``, ``"last"`` or a 0-based call number. ``"last"`` traces every
    call (each one pays the tracing cost) and keeps the last. Calls from other threads made
    during the block are seen too. What each run returns is unchanged.
    """
    tf = import_tf()
    base = tf_private.base_session(tf)  # BaseSession: Session, InteractiveSession, ...
    original = base.run
    kept: list[StepTrace] = []
    count = {"calls": 0}
    lock = threading.Lock()

    def wanted(number: int) -> bool:
        if select == "first":
            return number == 0
        if select == "last":
            return True
        return number == select

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        with lock:
            number = count["calls"]
            count["calls"] += 1
        if not wanted(number):
            return original(self, fetches, feed_dict, options, run_metadata)
        metadata = tf.compat.v1.RunMetadata()
        result = original(self, fetches, feed_dict, _traced_options(options), metadata)
        if run_metadata is not None:
            run_metadata.MergeFrom(metadata)
        step = trace_from_metadata(metadata, result, feed_dict)
        with lock:
            if select == "last":
                kept.clear()
            kept.append(step)
        return result

    base.run = run
    try:
        yield kept
    finally:
        base.run = original
