"""What is trained: each problem is a model, the data it makes for itself (no download) and a
loss that sums over the examples of a batch, built in whatever graph and device scope is
current, so the loops decide where things go.

- :class:`Problem` (``mlp``): the 2016 exp(x) regression and the classifier, MLPs;
- :class:`Transformer` (``transformer``): a decoder-only transformer on generated text.

A problem travels to a worker program as JSON (:func:`to_json`, :func:`from_json`).
"""

from __future__ import annotations

import dataclasses
import json

from dtflab.train.problems.mlp import BLOCK_ROWS, Problem, classification, exp_regression
from dtflab.train.problems.transformer import Transformer, transformer

#: Each kind of problem by the name its JSON carries.
KINDS = {"mlp": Problem, "transformer": Transformer}


#: The loops that train a Transformer today; the others cut an MLP's layers.
TRANSFORMER_LOOPS = ("train.single", "train.model_parallel", "train.sync_data_parallel",
                     "train.async_parameter_server", "train.ps_strategy", "train.all_reduce",
                     "train.pipeline (blocks as stages)", "train.tensor_parallel (heads split)",
                     "train.zero", "train.sharded_data_parallel")


def needs_mlp(problem, what: str) -> None:
    """Refuse a problem that is not an MLP where ``what`` works on an MLP's layers."""
    if not isinstance(problem, Problem):
        from dtflab.errors import NotSupportedError

        raise NotSupportedError(f"{what} works on an MLP's layers and {problem.name} is a "
                                f"{type(problem).__name__}; train it with one of "
                                f"{', '.join(TRANSFORMER_LOOPS)}")


def to_json(problem) -> str:
    """``problem`` as the JSON a worker program reads back with :func:`from_json`."""
    kind = next(name for name, cls in KINDS.items() if isinstance(problem, cls))
    return json.dumps({"kind": kind, "fields": dataclasses.asdict(problem)})


def from_json(text: str):
    """The problem :func:`to_json` wrote."""
    data = json.loads(text)
    cls = KINDS[data["kind"]]
    fields = {name: tuple(value) if isinstance(value, list) else value
              for name, value in data["fields"].items()}
    return cls(**fields)


__all__ = ["BLOCK_ROWS", "KINDS", "TRANSFORMER_LOOPS", "Problem", "Transformer", "classification",
           "exp_regression", "from_json", "needs_mlp", "to_json", "transformer"]
