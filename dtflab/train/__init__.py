"""Teaching problems, training loops and their run history."""

from dtflab.train.all_reduce import all_reduce
from dtflab.train.callbacks import Callback, WireBytes
from dtflab.train.history import RunHistory, StepRecord
from dtflab.train.loops import (
    async_parameter_server,
    model_parallel,
    single,
    sync_data_parallel,
)
from dtflab.train.problems import Problem, classification, exp_regression
from dtflab.train.ps_strategy import ps_strategy, strategy_for
from dtflab.train.runner import BackgroundRun, Runner, Update
from dtflab.train.watchdog import Watchdog

__all__ = ["Problem", "exp_regression", "classification", "RunHistory", "StepRecord", "Callback",
           "BackgroundRun", "single", "model_parallel", "sync_data_parallel",
           "async_parameter_server", "ps_strategy", "strategy_for", "all_reduce", "WireBytes", "Runner", "Update", "Watchdog"]
