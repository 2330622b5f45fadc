"""The contract between the notebook and its worker programs (``worker_programs/contract.py``):
the flags the notebook writes are the flags a program reads, placeholders and all, and a
message with a missing or unknown key is refused where it is made."""

import dataclasses
import json

import pytest

from dtflab import train
from dtflab.cluster.programs import Program
from dtflab.train import problems
from dtflab.train.worker_programs import contract
from dtflab.train.worker_programs.contract import Flags

PROBLEM = train.exp_regression(batch_size=8)


def test_the_flags_the_notebook_writes_are_the_flags_a_program_reads(tmp_path):
    sent = Flags(problem=problems.to_json(PROBLEM), steps=7, seed=3,
                 report="{client_host}:4242", slow=json.dumps({"worker:1": 0.05}),
                 checkpoint_dir=str(tmp_path), checkpoint_every=5, trace_step=2,
                 trace_dir=str(tmp_path / "trace"), threads=1, lockstep=True, check_every=4,
                 timeout=30.0, bucket_bytes=1 << 20)
    script = tmp_path / "worker.py"
    script.write_text("")
    # dtflab.run replaces the placeholders and undoubles the braces, as it does for a program
    program = Program.checked(str(script), sent.argv())
    argv = program.arguments({"worker": ["127.0.0.1:1"]}, "worker", 0, client_host="10.0.0.5")
    received = Flags.parse(argv, "worker.py")
    assert received == dataclasses.replace(sent, report="10.0.0.5:4242")
    assert problems.from_json(received.problem) == PROBLEM
    # the defaults a program falls back on are the same on both sides
    assert Flags.parse(["--problem={}", "--steps=1", "--report=h:1"], "w") == Flags("{}", 1, "h:1")


def test_a_message_carries_exactly_its_keys():
    line = contract.message("done", worker="worker:0")
    assert json.loads(line) == {"kind": "done", "worker": "worker:0"}
    with pytest.raises(ValueError, match=r"a 'step' message carries \[.*'loss_sum'.*\]; got "
                                         r"\['step', 'worker'\]"):
        contract.message("step", worker="worker:0", step=1)
    with pytest.raises(ValueError, match=r"a 'goodbye' message carries \[\]"):
        contract.message("goodbye", worker="worker:0")


def test_a_misspelt_argument_is_refused_with_its_name_before_anything_starts():
    with pytest.raises(TypeError, match=r"train.all_reduce: .*'wokers'.*help\(train.all_reduce\)"):
        train.all_reduce(PROBLEM, wokers=2)
    with pytest.raises(TypeError, match=r"train.sharded_data_parallel: .*'bucket_bytes'"):
        train.sharded_data_parallel(PROBLEM, bucket_bytes=1024)
