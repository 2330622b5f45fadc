"""dtflab: learn and experiment with distributed TensorFlow from a notebook.

In [1]: %load_ext dtflab
In [2]: %dtf_cluster start 3

Importing dtflab is cheap: TensorFlow is imported only when a cluster needs it.
"""

from __future__ import annotations

import os

# tf.keras is Keras 3 on TensorFlow >= 2.16, and Keras 3 breaks TF's distribution strategies
# (MultiWorkerMirroredStrategy, ParameterServerStrategy) in model.fit and custom loops. With
# this set before tf.keras is first touched, tf.keras is Keras 2 (the tf_keras package); the
# task processes dtflab starts inherit it. Set TF_USE_LEGACY_KERAS=0 yourself to opt out.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from dtflab.errors import DtflabError, NotSupportedError, TaskError

__version__ = "0.1.0"


#: Names of ``dtflab.cluster``, imported on first use: a task process imports the dtflab package
#: before its entry point, and the entry points import nothing of the code that starts them.
CLUSTER = ("Cluster", "TaskInfo", "TaskState", "run", "start_cluster")
PICTURES = ("cluster_picture", "placement_picture", "towers_picture", "coordinator_picture",
            "downpour_picture", "checkpoint_picture", "pipeline_picture")


def __getattr__(name):
    # Imported on first use: a task server imports dtflab and must stay single-threaded until
    # it has joined its private network (numpy starts threads on import).
    if name in ("train", "cluster"):
        import importlib

        return importlib.import_module(f"dtflab.{name}")
    if name in CLUSTER:
        from dtflab import cluster

        return getattr(cluster, name)
    if name == "PlacementPlan":
        from dtflab.placement import PlacementPlan

        return PlacementPlan
    if name == "PlacementEditor":
        from dtflab.ui.placement_editor import PlacementEditor

        return PlacementEditor
    if name in ("memory_planner", "MemoryPlanner"):
        from dtflab.ui import memory_planner

        return getattr(memory_planner, name)
    if name in ("plan", "RunPlans"):
        from dtflab.train.planner import plans

        return getattr(plans, name)
    if name in ("schedule_playground", "SchedulePlayground"):
        from dtflab.ui import schedule_playground

        return getattr(schedule_playground, name)
    if name == "Dashboard":
        from dtflab.viz.dashboard import Dashboard

        return Dashboard
    if name == "architectures":
        from dtflab.viz.architectures import architectures

        return architectures
    if name in PICTURES:
        from dtflab.viz import pictures

        return getattr(pictures, name)
    if name == "slices_picture":
        from dtflab.viz.slices import slices_picture

        return slices_picture
    if name == "bytes_sent":
        from dtflab.network.transport import bytes_sent

        return bytes_sent
    if name in ("ScalingModel", "scaling_figure", "curves_figure"):
        from dtflab.viz import scaling

        return getattr(scaling, name)
    if name == "cpus":
        from dtflab.machine import cpus

        return cpus
    if name == "short_device":
        from dtflab.names import short

        return short
    raise AttributeError(f"module 'dtflab' has no attribute {name!r}")


def trace(session, fetches, feed_dict=None, **run_kwargs):
    """Run one step with full tracing and return a StepTrace; see dtflab.tracing.capture.trace."""
    from dtflab.tracing.capture import trace as run_traced

    return run_traced(session, fetches, feed_dict, **run_kwargs)


def profile(cluster, fn, *args, duration_ms: int = 1000, **kwargs):
    """Time TF2 code on a connected cluster with the TF profiler; see dtflab.tracing.profile."""
    from dtflab.tracing.profile import profile as run_profiled

    return run_profiled(cluster, fn, *args, duration_ms=duration_ms, **kwargs)


def compare(*runs):
    """Overlay runs' loss curves and tabulate time and throughput ratios against the first."""
    from dtflab.viz.compare import compare as compare_runs

    return compare_runs(*runs)


def show(figure) -> None:
    """Show a Bokeh figure inline (BokehJS inlined: works offline); see dtflab.viz.output."""
    from dtflab.viz.output import show as show_inline

    show_inline(figure)


def tf_log() -> str:
    """What TensorFlow printed in this process while dtflab kept it quiet."""
    from dtflab._quiet import tf_log as captured

    return captured()


def load_ipython_extension(ipython) -> None:
    """``%load_ext dtflab``: registers ``%dtf_cluster``, ``%%dtf_run``, ``%%dtf_trace`` and
    ``%%dtf_solution``."""
    from dtflab.magics import register

    register(ipython)


__all__ = ["Cluster", "PlacementPlan", "PlacementEditor", "Dashboard", "architectures",
           "ScalingModel", "scaling_figure", "curves_figure", *PICTURES, "slices_picture",
           "bytes_sent", "memory_planner", "MemoryPlanner", "schedule_playground",
           "SchedulePlayground", "plan", "RunPlans",
           "short_device", "show", "compare", "train", "TaskInfo", "TaskState", "start_cluster", "run",
           "trace", "profile", "tf_log", "DtflabError",
           "NotSupportedError", "TaskError", "__version__"]
