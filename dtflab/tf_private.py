"""Every use of TensorFlow's private modules and attributes, in one place.

dtflab needs a few things TensorFlow does not make public: the profiler's client and its
XPlane protobuf (timing TF2 code on remote tasks), the tf.data sleep transformation (a
straggler that does not spin a core), a graph's colocation stack (optimizer slots follow their
variable while a device function runs), ``BaseSession`` (to trace the ``Session.run`` calls of a
cell), ordering ops that ``tf.gradients`` built (a pipeline stage's one multiply at a time) and the eager context (is forking still safe?). Each accessor says, when a TensorFlow
upgrade moved the thing, which dtflab feature broke and on which version; dtflab was tested
with TensorFlow 2.16 to 2.21.
"""

from __future__ import annotations

import sys

from dtflab.errors import NotSupportedError

TESTED = "2.16 to 2.21"


def _moved(what: str, feature: str, error: Exception) -> NotSupportedError:
    version = getattr(sys.modules.get("tensorflow"), "__version__", "?")
    return NotSupportedError(f"{feature} needs TensorFlow's private {what}, which TensorFlow "
                             f"{version} no longer has where dtflab looks ({error}); dtflab was "
                             f"tested with TensorFlow {TESTED}")


def profiler_client():
    """``tensorflow.python.profiler.profiler_client`` (``trace(service, logdir, ms)``)."""
    try:
        from tensorflow.python.profiler import profiler_client as client

        client.trace  # noqa: B018  (the one function used)
        return client
    except (ImportError, AttributeError) as exc:
        raise _moved("profiler_client", "dtflab.profile", exc) from None


def xplane_pb2():
    """The profiler's ``XSpace`` protobuf module."""
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2 as module

        module.XSpace  # noqa: B018
        return module
    except (ImportError, AttributeError) as exc:
        raise _moved("xplane_pb2", "reading profiler traces", exc) from None


def data_sleep(microseconds: int):
    """``tf.data.experimental`` testing's ``sleep`` transformation."""
    try:
        from tensorflow.python.data.experimental.ops import testing

        return testing.sleep(microseconds)
    except (ImportError, AttributeError) as exc:
        raise _moved("tf.data testing.sleep", "stragglers (slow=...)", exc) from None


def colocation_leaders(graph) -> list:
    """The objects on ``graph``'s colocation stack (empty where TF keeps none there)."""
    stack = getattr(graph, "_colocation_stack", None)
    peek = getattr(stack, "peek_objs", None)
    return list(peek()) if callable(peek) else []


def run_after(op, before) -> None:
    """Make graph op ``op`` wait for ``before`` (``Operation._add_control_input``: TensorFlow
    offers no public way to order ops that ``tf.gradients`` already built)."""
    try:
        op._add_control_input(before)
    except AttributeError as exc:
        raise _moved("Operation._add_control_input", "train.pipeline", exc) from None


def base_session(tf):
    """``BaseSession``, the class whose ``run`` every v1 session uses."""
    for cls in tf.compat.v1.Session.__mro__:
        if cls.__name__ == "BaseSession" and hasattr(cls, "run"):
            return cls
    raise _moved("BaseSession", "%%dtf_trace", LookupError("not among tf.compat.v1.Session's bases"))


def eager_context_created() -> bool:
    """Whether TensorFlow's eager context exists in this process (False if TF is not
    imported). Reads ``tensorflow.python.eager.context._context`` without importing TF."""
    context = sys.modules.get("tensorflow.python.eager.context")
    if context is None:
        return False
    try:
        return context._context is not None and bool(context._context._initialized)
    except AttributeError as exc:
        raise _moved("eager context", "the fork server's safety check", exc) from None


def patient_coordination(cluster_spec, heartbeat_s: float) -> None:
    """Configure the coordination service MultiWorkerMirroredStrategy would start, with
    ``heartbeat_s`` before a silent task counts as dead (TensorFlow's own default is 10 s, and
    it ends every worker when it fires). Call before the strategy is made."""
    try:
        from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
        from tensorflow.python.distribute import multi_worker_util
        from tensorflow.python.eager import context
    except ImportError as exc:
        raise _moved("coordination service config", "train.all_reduce's heartbeat", exc) from None
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker") if job in cluster_spec.jobs]
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster_spec),
        heartbeat_timeout_in_ms=int(heartbeat_s * 1000), coordinated_jobs=jobs)


def abort_collectives(message: str) -> bool:
    """Fail the collective ops this process waits in, and every later one, with ``message``
    (UNAVAILABLE), as MultiWorkerMirroredStrategy's own health check does when a peer dies;
    callable from any thread. False where TensorFlow's eager context does not exist yet. The
    process's collectives stay aborted: its strategy must be built anew in a new process."""
    if not eager_context_created():
        return False
    from tensorflow.python.eager import context
    from tensorflow.python.framework import errors

    try:
        context.context().abort_collective_ops(errors.UNAVAILABLE, message)
    except AttributeError as exc:
        raise _moved("abort_collective_ops", "releasing a worker stuck in a collective", exc) from None
    return True


def set_cpp_log_level(level: int) -> bool:
    """Set the least severity of TensorFlow's C++ log lines in this process (0 INFO, 1 WARNING,
    2 ERROR), as ``TF_CPP_MIN_LOG_LEVEL`` does at start; False where that cannot be done.

    TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL`` once, so a task forked from the warm fork server
    keeps the server's level; this calls Abseil's ``SetMinLogLevel`` in TensorFlow's library,
    whose C++ name holds the Abseil version that TensorFlow's headers name.
    """
    import ctypes
    import os
    import re

    tf = sys.modules.get("tensorflow")
    if tf is None or not getattr(tf, "__file__", None):
        return False
    root = os.path.dirname(tf.__file__)
    try:
        with open(os.path.join(root, "include", "absl", "base", "options.h")) as options:
            found = re.search(r"#define ABSL_OPTION_INLINE_NAMESPACE_NAME (\w+)", options.read())
        lib = ctypes.CDLL(os.path.join(root, "libtensorflow_framework.so.2"))
        name = found.group(1) if found else ""
        setter = getattr(lib, f"_ZN4absl{len(name)}{name}14SetMinLogLevelENS0_18LogSeverityAtLeastE")
    except (OSError, AttributeError):
        return False
    setter(ctypes.c_int(level))
    return True


def forget_custom_gradients(graph) -> int | None:
    """Drop from TensorFlow's gradient registry what ``tf.custom_gradient`` registered for
    ``graph``'s ops; how many were dropped, None where the registry has moved.

    In graph mode each call of a custom-gradient function registers its backward under a new
    name (``CustomGradient-<n>``) and never removes it: the backward's closure holds its forward
    tensors, and through them the whole graph, for as long as the process lives. Call once no
    gradient of ``graph`` is still to be built."""
    try:
        from tensorflow.python.framework import ops

        registry = ops._gradient_registry._registry
    except (ImportError, AttributeError):
        return None
    dropped = 0
    for op in graph.get_operations():
        if op.type != "IdentityN":  # what tf.custom_gradient wraps its outputs in
            continue
        try:
            name = op.get_attr("_gradient_op_type")
        except ValueError:
            continue
        name = name.decode() if isinstance(name, bytes) else name
        if name.startswith("CustomGradient-") and registry.pop(name, None) is not None:
            dropped += 1
    return dropped
