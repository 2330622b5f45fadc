"""Teaching problems, training loops and their run history.

Every loop takes a Problem, a number of steps and a seed, and returns a RunHistory; with
``background=True`` it returns a :class:`BackgroundRun` at once (the kernel stays free, so a
dashboard's Stop button works). ``slow={"worker:1": 0.05}`` makes a task take that many more
seconds per step (a straggler, sleeping on the task itself). ``watchdog=`` sets when a step
counts as stalled and how often it is retried on a new session (train.machinery.watchdog).

The rooms, top to bottom (each imports only the rooms below it; ``tests/test_layers.py``):

- ``planner/``: a run planned at any size before it is run: each device's memory, the step
  time, the hardware (presets, or this cluster's, calibrated), every layout over N devices, the
  published runs it is checked against, and its front door (``dtflab.plan``).
- ``experiments/``: runs of several strategies and what they fit (scaling, the scaling model).
- ``strategies/``: one module per loop, named like the function it defines: ``single``,
  ``model_parallel`` (2016: variables on the ps tasks), ``sync_data_parallel`` (towers
  through a ps), ``async_parameter_server`` (Downpour), ``ps_strategy`` (TF2's
  ParameterServerStrategy), ``all_reduce`` (worker programs), ``pipeline`` (stages and
  micro-batches), ``tensor_parallel`` (layer pairs split by columns and rows, Megatron-style;
  a transformer's heads, with sequence parallelism), ``context_parallel`` (ring attention),
  ``combined`` (data x tensor x pipeline on a ``Layout``), ``expert_parallel`` (a mixture of
  experts over workers), ``sharded_data_parallel`` (ZeRO-3 / FSDP in worker programs), ``zero`` (ZeRO's stages 1
  and 2 in worker programs; stage 3 is ``sharded_data_parallel``).
- ``measure/``: measurements on a traced step (the bubble, a stage's arithmetic, memory).
- ``graphs/``: the pieces of training graphs that loops build, none of them a loop (one copy of
  the model, a transformer's blocks cut Megatron-style, ring attention, a backward split in two).
- ``layouts/``: where a run's parts go (layer pairs, the mesh's ranks, ring attention's cut).
- ``machinery/``: the machinery every strategy shares (the one :class:`Runner`, ``RunHistory``,
  callbacks, the watchdog, checkpoints, sessions, starting worker programs).
- ``worker_programs/``: what runs inside a worker program's process.
- ``formulas/``: the formulas predictions, benchmarks and views share (pure Python).
- ``problems``: what is trained; ``inputs/``: what feeds it when its batches cost something
  to make (tf.data, in this process or on the cluster's data service).

Every name here is imported on first use.
"""

from __future__ import annotations

import importlib

#: Each public name and the module that defines it, imported on first use: a worker program
#: that imports ``dtflab.train.worker_programs.loop`` loads the package, and must not load every
#: strategy (and the cluster, the fork server) with it.
WHERE = {
    "Problem": "problems", "exp_regression": "problems", "classification": "problems",
    "Transformer": "problems", "transformer": "problems",
    "RunHistory": "machinery.history", "StepRecord": "machinery.history",
    "Callback": "machinery.callbacks", "WireBytes": "machinery.callbacks",
    "BackgroundRun": "machinery.runner", "Runner": "machinery.runner", "Update": "machinery.runner",
    "Watchdog": "machinery.watchdog",
    "stage_arithmetic_s": "measure.stage_arithmetic", "StepModel": "measure.bubble",
    "memory": "measure.memory",
    "step_memory": "machinery.traced_memory", "split_activation_bytes": "formulas.memory",
    "single": "strategies.single", "model_parallel": "strategies.model_parallel",
    "sync_data_parallel": "strategies.sync_data_parallel",
    "async_parameter_server": "strategies.async_parameter_server",
    "ps_strategy": "strategies.ps_strategy", "strategy_for": "strategies.ps_strategy",
    "all_reduce": "strategies.all_reduce", "pipeline": "strategies.pipeline",
    "tensor_parallel": "strategies.tensor_parallel",
    "context_parallel": "strategies.context_parallel", "combined": "strategies.combined",
    "expert_parallel": "strategies.expert_parallel",
    "sharded_data_parallel": "strategies.sharded_data_parallel", "zero": "strategies.zero",
    "Layout": "layouts.layout", "calibrate": "planner.calibration",
    "run": "strategies.by_layout", "run_layout": "planner.predicted_run",
    "input_pipeline": "problems.input_pipeline", "InputPipeline": "problems.input_pipeline",
    "visits": "inputs.visits", "input_scaling": "inputs.scaling",
}


def __getattr__(name):
    if name in WHERE:
        value = getattr(importlib.import_module(f"dtflab.train.{WHERE[name]}"), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'dtflab.train' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(WHERE))


__all__ = ["Problem", "exp_regression", "classification", "Transformer", "transformer",
           "RunHistory", "StepRecord", "Callback", "BackgroundRun", "single", "model_parallel",
           "sync_data_parallel", "async_parameter_server", "ps_strategy", "strategy_for",
           "all_reduce", "pipeline", "tensor_parallel", "context_parallel", "combined",
           "expert_parallel",
           "sharded_data_parallel", "zero", "WireBytes",
           "Runner", "Update", "Watchdog", "stage_arithmetic_s", "StepModel", "memory", "step_memory",
           "split_activation_bytes", "Layout", "calibrate", "run", "run_layout", "input_pipeline",
           "InputPipeline", "visits", "input_scaling"]
