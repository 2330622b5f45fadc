"""The transformer cut across worker tasks on real task servers: a pipeline with blocks as
stages, and Megatron's block with its heads and hidden units split; each trains exactly as one
process does, and the tensor-parallel bytes are the formula's, counted at the transport."""

import pytest

from dtflab import train
from dtflab.train.formulas import split_bytes

from conftest import max_loss_diff, one_process

pytestmark = pytest.mark.slow

#: one process against a split model, same seed and batches: float rounding of the sums only
TOLERANCE = 1e-5
STEPS = 6


@pytest.mark.parametrize("problem, stages, micro_batches, schedule", [
    (train.transformer(blocks=2, d_model=32, heads=2, sequence=16, batch_size=8), 2, 4, "gpipe"),
    (train.transformer(blocks=3, d_model=32, heads=2, sequence=16, batch_size=8, tied=False,
                       recompute="selective"), 3, 2, "1f1b"),
], ids=["tied-2-stages-gpipe", "untied-3-stages-1f1b-selective"])
def test_blocks_as_pipeline_stages_train_exactly_as_one_process(split_cluster, problem, stages,
                                                                 micro_batches, schedule):
    alone = one_process(problem, steps=STEPS, seed=4)
    piped = train.pipeline(problem, split_cluster, stages=stages, micro_batches=micro_batches,
                           schedule=schedule, steps=STEPS, seed=4, trace_step=3)
    print(f"{problem.name}: pipeline vs single {max_loss_diff(alone, piped):.2e}")
    assert piped.steps == STEPS and max_loss_diff(alone, piped) <= TOLERANCE
    plan = piped.details["stages"]
    assert plan.layers == tuple((b, b) for b in range(1, stages + 1))  # equal blocks: one each
    bubble = piped.bubble
    assert all(bubble.busy_us(s) > 0 for s in range(stages))  # every stage worked in step 3
    assert len(bubble.slots) == 2 * stages * micro_batches  # each forward and backward seen


def test_a_tied_embedding_is_read_by_the_last_stage_and_updated_once(split_cluster):
    """The first stage holds the token embedding; the last reads it for the output layer. Both
    stages' gradients of it are summed once: neither counted twice nor lost."""
    problem = train.transformer(blocks=2, d_model=32, heads=2, sequence=16, batch_size=8)
    tied, untied = (train.pipeline(p, split_cluster, stages=2, micro_batches=2, steps=3, seed=1, schedule="gpipe")
                    for p in (problem, train.transformer(blocks=2, d_model=32, heads=2,
                                                         sequence=16, batch_size=8, tied=False)))
    assert max_loss_diff(train.single(problem, steps=3, seed=1), tied) <= TOLERANCE
    assert max_loss_diff(tied, untied) > 1e-3  # the tie changes training: the test can tell


@pytest.mark.parametrize("problem, ways", [
    (train.transformer(blocks=2, d_model=32, heads=2, sequence=16, batch_size=8), 2),
    (train.transformer(blocks=1, d_model=48, heads=6, sequence=16, batch_size=8, tied=False,
                       recompute="full"), 3),
    (train.transformer(blocks=2, d_model=32, heads=4, sequence=16, batch_size=8,
                       recompute="selective"), 2),
], ids=["2-ways", "3-ways-untied-full-recompute", "2-ways-selective"])
def test_heads_split_across_workers_train_exactly_as_one_process(split_cluster, problem, ways):
    alone = one_process(problem, steps=STEPS, seed=4)
    split = train.tensor_parallel(problem, split_cluster, ways=ways, steps=STEPS, seed=4)
    print(f"{problem.name}: {ways}-way tensor parallel vs single {max_loss_diff(alone, split):.2e}")
    assert split.steps == STEPS and max_loss_diff(alone, split) <= TOLERANCE
    assert split.losses[-1] < split.losses[0]


def test_the_bytes_each_worker_sends_are_the_formulas_counted_at_the_transport(split_cluster):
    problem = train.transformer(blocks=2, d_model=128, heads=4, sequence=32, batch_size=8)
    wire = train.WireBytes(after_step=2, steps=6)
    history = train.tensor_parallel(problem, split_cluster, ways=2, steps=10, callbacks=[wire])
    formula = history.details["bytes_formula"]
    assert formula == dict(zip(("worker:0", "worker:1"),
                               split_bytes.transformer_tensor_parallel_bytes(2, problem)))
    activations = 4 * 8 * 32 * 128
    # 2 blocks: 3 all-reduces each way, the last sum, the embedding, 11 small vectors
    assert formula["worker:1"] == {"forward": 4 * activations,
                                   "backward": 4 * activations + 11 * 128 * 4}
    sent = wire.per_step.sent
    for source, destination in (("worker:0", "worker:1"), ("worker:1", "worker:0")):
        predicted = sum(formula[source].values())
        print(f"{source} -> {destination}: {sent[source, destination] / predicted:.4f} of the "
              f"formula")
        assert predicted <= sent[source, destination] <= 1.05 * predicted
        assert sent.get((source, "worker:2"), 0) < 0.01 * predicted  # the third worker idles


def test_heads_that_do_not_split_and_too_many_stages_are_refused_with_the_fix(split_cluster):
    problem = train.transformer(blocks=2, d_model=32, heads=2, sequence=16, batch_size=8)
    with pytest.raises(ValueError, match=r"ways=3: transformer_2x32_h2_s16's 2 heads do not "
                                         r"split into 3 equal groups; use ways=2"):
        train.tensor_parallel(problem, split_cluster, ways=3)
    with pytest.raises(ValueError, match=r"stages=3: transformer_\w+ has 2 blocks, so at most 2 stages;"
                                         r" use stages=2 or a deeper model, e.g. "
                                         r"train.transformer\(blocks=3\)"):
        train.pipeline(problem, split_cluster, stages=3)
