"""Teaching problems, training loops and their run history.

Every loop takes a Problem, a number of steps and a seed, and returns a RunHistory; with
``background=True`` it returns a :class:`BackgroundRun` at once (the kernel stays free, so a
dashboard's Stop button works). ``slow={"worker:1": 0.05}`` makes a task take that many more
seconds per step (a straggler, sleeping on the task itself). ``watchdog=`` sets when a step
counts as stalled and how often it is retried on a new session (train.watchdog).

One module per strategy, each supplying its step to the one :class:`Runner`: ``single``,
``model_parallel`` (2016: variables on the ps tasks), ``sync`` (towers through a ps),
``downpour`` (asynchronous ps), ``ps_strategy`` (TF2's ParameterServerStrategy),
``all_reduce`` (worker programs), ``pipeline`` (stages and micro-batches), ``tensor_parallel``
(layer pairs split by columns and rows, Megatron-style), ``sharded`` (ZeRO-3 / FSDP in
worker programs: 1/N of every layer and of Adam's slots on each worker). ``costs`` holds the
formulas that predictions, benchmarks and views share.
"""

from dtflab.train.all_reduce import all_reduce
from dtflab.train.callbacks import Callback, WireBytes
from dtflab.train.downpour import async_parameter_server
from dtflab.train.history import RunHistory, StepRecord
from dtflab.train.model_parallel import model_parallel
from dtflab.train.pipeline import pipeline
from dtflab.train.problems import Problem, classification, exp_regression
from dtflab.train.ps_strategy import ps_strategy, strategy_for
from dtflab.train.runner import BackgroundRun, Runner, Update
from dtflab.train.sharded import sharded_data_parallel
from dtflab.train.single import single
from dtflab.train.stage_arithmetic import stage_arithmetic_s
from dtflab.train.tensor_parallel import tensor_parallel
from dtflab.train.sync import sync_data_parallel
from dtflab.train.watchdog import Watchdog

__all__ = ["Problem", "exp_regression", "classification", "RunHistory", "StepRecord", "Callback",
           "BackgroundRun", "single", "model_parallel", "sync_data_parallel",
           "async_parameter_server", "ps_strategy", "strategy_for", "all_reduce", "pipeline",
           "tensor_parallel", "sharded_data_parallel", "WireBytes", "Runner", "Update", "Watchdog",
           "stage_arithmetic_s"]
