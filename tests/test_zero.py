"""ZeRO's stages 1 and 2 in worker programs (train.zero) beside train.single and a plain
train.all_reduce, on the transformer: the same losses, Adam's state sharded
over the workers, and an all-reduce's bytes on the wire per step."""

import numpy as np
import pytest

from dtflab import train
from dtflab.train.formulas import costs
from conftest import beside_all_reduce, one_process, sends_as_its_formula_says

pytestmark = pytest.mark.slow

PROBLEM = train.transformer(blocks=1, d_model=32, heads=2, sequence=16, batch_size=8)
#: Same seed and global batch as one process: float rounding of the gradient sums only.
TOLERANCE = 1e-5


def worst_loss_diff(history, alone) -> float:
    return max(float(np.max(np.abs(np.array([r.loss for r in history.records if r.worker == w])
                                   - alone.losses))) for w in history.workers)


@pytest.mark.parametrize("stage", [1, 2])
def test_each_stage_trains_the_transformer_as_one_process_does(stage):
    alone = one_process(PROBLEM, steps=12, seed=3)
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
    plain, zero, plain_sent, sent = beside_all_reduce(problem, train.zero, 10, stage=1)
    formula = costs.all_reduce_bytes(model, 2)
    assert zero.details["bytes_per_step_formula"] == formula == model
    sends_as_its_formula_says(sent, plain_sent, formula, 1)
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


def test_stage_three_shards_the_transformers_parameters_too():
    """Stage 3 (train.sharded_data_parallel) on the transformer: each parameter sharded,
    gathered block by block; the losses are one process's, each worker holds 3M/N, and it
    sends 3 (N-1)/N of the bytes it gathers per step (a tied embedding, read by the first and
    the last block, twice)."""
    problem = train.transformer(blocks=2, d_model=64, heads=4, sequence=16, batch_size=8)
    alone = one_process(problem, steps=8, seed=3)
    wire = train.WireBytes(after_step=2, steps=4)
    history = train.zero(problem, stage=3, workers=2, steps=8, seed=3, callbacks=[wire])
    assert worst_loss_diff(history, alone) <= TOLERANCE
    model = problem.parameter_bytes
    embedding = 4 * problem.vocabulary * problem.d_model
    formula = history.details["bytes_per_step_formula"]
    assert formula == costs.sharded_bytes(model + embedding, 2)
    for source, destination in (("worker:0", "worker:1"), ("worker:1", "worker:0")):
        sent = wire.per_step.sent[source, destination]
        print(f"{source}: {sent / formula:.4f} of the formula")
        assert formula <= sent <= 1.1 * formula
    for worker in ("worker:0", "worker:1"):
        held = sum(history.details["state_bytes"][worker].values())
        assert held == pytest.approx(costs.sharded_state_bytes(model, 2), rel=1e-3)


def test_stage_two_holds_a_shard_of_the_gradients_where_stage_one_holds_them_all():
    """The step's peak above what the worker held before it (the CPU allocator's count, each
    worker program's own): stage 1 keeps every full gradient until the backward ends, then
    exchanges them all at once; stage 2 sends each as it is made, so its peak is lower by at
    least the gradients it no longer keeps, (1 - 1/N) of the model's bytes. A model whose
    parameters outweigh its activations, so the gradients decide the peak."""
    problem = train.transformer(blocks=2, d_model=512, heads=4, sequence=16, batch_size=4)
    model, n = problem.parameter_bytes, 2
    peaks = {}
    for stage in (1, 2):
        history = train.zero(problem, stage=stage, workers=n, steps=10)
        # step 0 traces the step function; its peak is not a step's
        peaks[stage] = np.median([peak for worker in history.details["step_peak_bytes"].values()
                                  for peak in worker[1:]])
    stage1 = peaks[1] / costs.zero_stage1_step_peak_bytes(model, n)
    saving = (peaks[1] - peaks[2]) / ((1 - 1 / n) * model)
    print(f"step peak over the model's bytes: stage 1 {peaks[1] / model:.2f} ({stage1:.3f} of "
          f"the formula), stage 2 {peaks[2] / model:.2f}; saving {saving:.2f} of (1 - 1/N) x "
          f"model")
    assert stage1 == pytest.approx(1, abs=0.15)
    assert saving >= 0.9
