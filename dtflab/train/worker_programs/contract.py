"""The contract between the notebook and its worker programs, defined once and imported by both
sides: the flags a program is started with (:class:`Flags`) and the messages that travel
between them (``MESSAGES`` one way, ``STOP`` and ``GO`` the other).

A worker program connects to the notebook's listener (``--report host:port``) and writes one
JSON line per message: ``hello`` once its collectives are up, ``step`` after each step,
``done`` at the end. The notebook writes one bare line back: ``stop`` (end after the next check
step) or, with ``--lockstep``, ``go`` (take the next step). Pure Python: no TensorFlow.
"""

from __future__ import annotations

import argparse
import dataclasses
import json


@dataclasses.dataclass(frozen=True)
class Flags:
    """What a worker program is told on its command line, one field per flag
    (``check_every`` is ``--check-every``)."""

    problem: str  # the Problem's fields as JSON
    steps: int
    report: str  # host:port of the notebook's listener
    seed: int = 0
    slow: str = "{}"  # {"worker:1": 0.05} as JSON: extra seconds per step
    checkpoint_dir: str = ""
    checkpoint_every: int = 0  # 0: no checkpoints
    trace_step: int = -1  # -1: no traced step
    trace_dir: str = ""
    threads: int = 0  # intra- and inter-op threads (0: TensorFlow's default, every core)
    lockstep: bool = False  # after each step, wait for the notebook's go
    check_every: int = 10  # steps between agreeing on Stop and fingerprinting the weights
    timeout: float = 0.0  # seconds a collective may wait for the others (0: no limit)
    bucket_bytes: int = 0  # train.all_reduce: gradients packed into all-reduces of this size
    zero_stage: int = 0  # train.zero: ZeRO's stage, 1 or 2
    inputs: str = ""  # an InputPipeline as JSON (its to_json): the batches come from it

    def argv(self) -> list[str]:
        """The flags as ``--name=value`` arguments for ``dtflab.run``, braces doubled (it reads
        ``{name}`` as a placeholder) except in ``report``, which may carry ``{client_host}``."""
        args = []
        for field in dataclasses.fields(self):
            value, flag = getattr(self, field.name), "--" + field.name.replace("_", "-")
            if field.type == "bool":
                args += [flag] if value else []
            else:
                text = str(value)
                args.append(f"{flag}={text if field.name == 'report' else _escaped(text)}")
        return args

    @classmethod
    def parse(cls, argv: list[str], prog: str) -> "Flags":
        """The flags a program was started with (argparse's errors for bad ones)."""
        parser = argparse.ArgumentParser(prog=prog)
        for field in dataclasses.fields(cls):
            flag = "--" + field.name.replace("_", "-")
            if field.type == "bool":
                parser.add_argument(flag, action="store_true")
            elif field.default is dataclasses.MISSING:
                parser.add_argument(flag, type=TYPES[field.type], required=True)
            else:
                parser.add_argument(flag, type=TYPES[field.type], default=field.default)
        return cls(**vars(parser.parse_args(argv)))


TYPES = {"str": str, "int": int, "float": float}

#: What a worker program says, by kind, and the keys each message carries.
MESSAGES = {
    "hello": ("worker", "pid", "workers", "resumed_at", "reached"),
    "step": ("worker", "step", "loss_sum", "examples", "fingerprint", "step_s", "state_bytes",
             "memory", "step_peak_bytes", "input_wait_s"),
    "done": ("worker",),
}
#: What the notebook writes back, one bare line each.
STOP, GO = "stop", "go"


def message(kind: str, **fields) -> bytes:
    """One message as the JSON line a worker program sends; its keys must be ``MESSAGES``'s."""
    if kind not in MESSAGES or set(fields) != set(MESSAGES[kind]):
        raise ValueError(f"a {kind!r} message carries {sorted(MESSAGES.get(kind, ()))}; "
                         f"got {sorted(fields)}")
    return (json.dumps({"kind": kind, **fields}) + "\n").encode()


def _escaped(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")
