"""ZeRO's stages 1 and 2 in worker programs (train.zero) beside train.single and a plain
train.all_reduce, on the transformer: the same losses, Adam's state sharded
over the workers, and an all-reduce's bytes on the wire per step."""

import numpy as np
import pytest

from dtflab import train
from dtflab.errors import NotSupportedError
from dtflab.train.formulas import costs

pytestmark = pytest.mark.slow

PROBLEM = train.transformer(blocks=1, d_model=32, heads=2, sequence=16, batch_size=8)
#: Same seed and global batch as one process: float rounding of the gradient sums only.
TOLERANCE = 1e-5


def worst_loss_diff(history, alone) -> float:
    return max(float(np.max(np.abs(np.array([r.loss for r in history.records if r.worker == w])
                                   - alone.losses))) for w in history.workers)


@pytest.mark.parametrize("stage", [1, 2])
def test_each_stage_trains_the_transformer_as_one_process_does(stage):
    alone = train.single(PROBLEM, steps=12, seed=3)
    history = train.zero(PROBLEM, stage=stage, workers=2, steps=12, seed=3)
    assert history.steps_per_worker == {"worker:0": 12, "worker:1": 12}
    assert worst_loss_diff(history, alone) <= TOLERANCE
    fingerprints = history.details["fingerprints"]
    assert fingerprints["worker:0"] == fingerprints["worker:1"]  # one working copy everywhere
    assert history.name == f"ZeRO {stage} (2 workers)"
    assert history.cluster.stopped


def test_stage_one_shards_adams_state_and_sends_an_all_reduces_bytes():
    problem = train.transformer(blocks=2, d_model=64, heads=4, sequence=32, batch_size=16)
    model = problem.parameter_bytes
    plain_wire, zero_wire = train.WireBytes(after_step=2, steps=6), train.WireBytes(after_step=2, steps=6)
    plain = train.all_reduce(problem, workers=2, steps=10, callbacks=[plain_wire])
    zero = train.zero(problem, stage=1, workers=2, steps=10, callbacks=[zero_wire])
    formula = costs.all_reduce_bytes(model, 2)
    assert zero.details["bytes_per_step_formula"] == formula == model
    for source, destination in (("worker:0", "worker:1"), ("worker:1", "worker:0")):
        sent = zero_wire.per_step.sent[source, destination]
        assert formula <= sent <= 1.1 * formula  # gRPC's framing on top
        assert sent / plain_wire.per_step.sent[source, destination] == pytest.approx(1, rel=0.1)
    for worker in ("worker:0", "worker:1"):
        mine, full = zero.details["state_bytes"][worker], plain.details["state_bytes"][worker]
        assert full == {"parameters": model, "slots": 2 * model}
        assert mine["parameters"] == model  # the working copy stays whole
        # Adam's m and v: 8 bytes a parameter over 2 workers (each parameter padded to a
        # multiple of 2 values)
        assert mine["slots"] == pytest.approx(model, rel=1e-3)
        assert sum(mine.values()) == pytest.approx(
            sum(zero.details["state_bytes_formula"].values()), rel=1e-3)


def test_bad_stages_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"stage=4: stage must be one of 1, 2, 3"):
        train.zero(PROBLEM, stage=4)
    with pytest.raises(NotSupportedError, match=r"train.sharded_data_parallel works on an MLP's "
                                                r"layers.*train.zero \(stages 1 and 2\)"):
        train.zero(PROBLEM, stage=3)
