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


#: Each public name, the module that defines it and its name there, imported on first use: a
#: task process imports the dtflab package before its entry point, and must stay
#: single-threaded until it has joined its private network (numpy starts threads on import).
CLUSTER = ("Cluster", "TaskInfo", "TaskState", "run", "start_cluster")
PICTURES = ("cluster_picture", "placement_picture", "towers_picture", "coordinator_picture",
            "downpour_picture", "checkpoint_picture", "pipeline_picture")
WHERE = {
    **{name: ("dtflab.cluster", name) for name in CLUSTER},
    **{name: ("dtflab.viz.pictures", name) for name in PICTURES},
    "PlacementPlan": ("dtflab.placement", "PlacementPlan"),
    "PlacementEditor": ("dtflab.ui.placement_editor", "PlacementEditor"),
    "memory_planner": ("dtflab.ui.memory_planner", "memory_planner"),
    "MemoryPlanner": ("dtflab.ui.memory_planner", "MemoryPlanner"),
    "plan": ("dtflab.train.planner.plans", "plan"),
    "RunPlans": ("dtflab.train.planner.plans", "RunPlans"),
    "schedule_playground": ("dtflab.ui.schedule_playground", "schedule_playground"),
    "SchedulePlayground": ("dtflab.ui.schedule_playground", "SchedulePlayground"),
    "Dashboard": ("dtflab.viz.dashboard", "Dashboard"),
    "architectures": ("dtflab.viz.architectures", "architectures"),
    "slices_picture": ("dtflab.viz.slices", "slices_picture"),
    "bytes_sent": ("dtflab.network.transport", "bytes_sent"),
    "ScalingModel": ("dtflab.viz.scaling", "ScalingModel"),
    "scaling_figure": ("dtflab.viz.scaling", "scaling_figure"),
    "curves_figure": ("dtflab.viz.scaling", "curves_figure"),
    "input_timeline": ("dtflab.viz.inputs", "input_timeline"),
    "input_scaling_figure": ("dtflab.viz.inputs", "input_scaling_figure"),
    "tensorboard": ("dtflab.ui.tensorboard", "tensorboard"),
    "start_workers": ("dtflab.cluster.persistent_workers", "start_workers"),
    "cpus": ("dtflab.machine", "cpus"),
    "short_device": ("dtflab.names", "short"),
}


def __getattr__(name):
    import importlib

    if name in ("train", "cluster"):
        return importlib.import_module(f"dtflab.{name}")
    if name in WHERE:
        module, attribute = WHERE[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'dtflab' has no attribute {name!r}")


def trace(session, fetches, feed_dict=None, *, cluster=None, logdir=None, **run_kwargs):
    """Run one step with full tracing and return a StepTrace; see dtflab.tracing.capture.trace.
    The step is kept for TensorBoard in a folder of its own under ``logdir`` (None: where the
    loops write; False: not kept): its RunMetadata for the Graphs tab and, given the
    ``cluster`` the session runs on (the ``local`` backend's), every task's profile for XProf."""
    from dtflab.tracing.capture import trace as run_traced

    def step():
        return run_traced(session, fetches, feed_dict, **run_kwargs)

    if logdir is False:
        return step()
    from dtflab.tracing.profile import profiled
    from dtflab.train.machinery.logdir import keep_trace

    traced, profiles = profiled(cluster, step) if cluster is not None else (step(), {})
    keep_trace(traced, logdir, profiles)
    return traced


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
    """``%load_ext dtflab``: registers ``%dtf_cluster``, ``%%dtf_run``, ``%%dtf_trace``,
    ``%dtf_tensorboard``, ``%%dtf_solution`` and the persistent workers' ``%dtf_workers``,
    ``%%dtf_px``, ``%dtf_pull`` and ``%dtf_autopx``."""
    from dtflab.magics import register

    register(ipython)


__all__ = ["Cluster", "PlacementPlan", "PlacementEditor", "Dashboard", "architectures",
           "ScalingModel", "scaling_figure", "curves_figure", *PICTURES, "slices_picture",
           "bytes_sent", "memory_planner", "MemoryPlanner", "schedule_playground",
           "SchedulePlayground", "plan", "RunPlans", "tensorboard", "start_workers",
           "short_device", "show", "compare", "train", "TaskInfo", "TaskState", "start_cluster", "run",
           "trace", "profile", "tf_log", "DtflabError", "input_timeline", "input_scaling_figure",
           "NotSupportedError", "TaskError", "__version__"]
