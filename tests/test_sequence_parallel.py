"""Sequence parallelism on the transformer's tensor-parallel blocks, on real task servers: it
trains as one process does, sends what its formula says (a ring all-reduce's bytes per sum,
as tensor parallelism's), and each worker keeps the LayerNorms' and the residual stream's
activations at 1/t, counted by the memory accounting from a traced step."""

import pytest

from dtflab import train
from dtflab.train.formulas import split_bytes
from dtflab.train.formulas.memory import split_activation_bytes
from dtflab.train.machinery.traced_memory import step_memory

from conftest import max_loss_diff, one_process

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # float rounding of the sums only
SHAPE = dict(blocks=2, d_model=64, heads=4, sequence=32, batch_size=8)


@pytest.fixture(scope="module")
def cluster():
    """One inter-op thread a task: each worker's ops run in one order, so what its forward
    holds when it ends is the same from run to run (as ``train.memory`` runs one process)."""
    import dtflab

    with dtflab.start_cluster(workers=3, inter_op_threads=1, intra_op_threads=1) as c:
        yield c


@pytest.mark.parametrize("shape, ways", [
    (SHAPE, 2),
    (dict(blocks=1, d_model=48, heads=6, sequence=24, batch_size=4, tied=False,
          recompute="full"), 3),
    (dict(SHAPE, recompute="selective"), 2),
], ids=["2-ways", "3-ways-untied-full-recompute", "2-ways-selective"])
def test_sequence_parallel_blocks_train_exactly_as_one_process(cluster, shape, ways):
    problem = train.transformer(**shape)
    alone = one_process(problem, steps=6, seed=4)
    split = train.tensor_parallel(problem, cluster, ways=ways, steps=6, seed=4,
                                  sequence_parallel=True)
    print(f"{problem.name}: {ways}-way sequence parallel vs single {max_loss_diff(alone, split):.2e}")
    assert split.name == f"tensor and sequence parallel ({ways} ways)"
    assert max_loss_diff(alone, split) <= TOLERANCE and split.losses[-1] < split.losses[0]


def test_bytes_and_activations_against_tensor_parallelism_and_their_formulas(cluster):
    problem = train.transformer(**SHAPE)
    runs, wires = {}, {}
    for sequence_parallel in (False, True):
        wires[sequence_parallel] = train.WireBytes(after_step=2, steps=4)
        runs[sequence_parallel] = train.tensor_parallel(
            problem, cluster, layout=train.Layout(tensor=2, sequence_parallel=sequence_parallel),
            steps=7, seed=0, trace_step=1, callbacks=[wires[sequence_parallel]])
    formula = runs[True].details["bytes_formula"]
    assert formula == dict(zip(("worker:0", "worker:1"),
                               split_bytes.transformer_sequence_parallel_bytes(2, problem)))
    a = 4 * 8 * 32 * 64
    # 4 half-blocks, each an all-gather and a reduce-scatter: 2 x A / 2 each way; the ends A / 2
    assert formula["worker:1"] == {"forward": 4 * a + a / 2, "backward": 4 * a + a / 2 + 12 * 256}
    totals = {}
    for sequence_parallel, wire in wires.items():
        predicted = runs[sequence_parallel].details["bytes_formula"]
        for source, destination in (("worker:0", "worker:1"), ("worker:1", "worker:0")):
            sent, expected = wire.per_step.sent[source, destination], sum(predicted[source].values())
            print(f"sequence_parallel={sequence_parallel} {source}: {sent / expected:.4f} of the "
                  f"formula")
            assert expected <= sent <= 1.05 * expected
        totals[sequence_parallel] = sum(wire.per_step.sent_by().values())
    # the same sums, a ring all-reduce's bytes each; the ends add A / 2 twice (2 blocks: 9 / 8)
    assert 1.0 < totals[True] / totals[False] < 1.2

    held = {sp: {w: m["activations"] for w, m in step_memory(run.trace.metadata).items()}
            for sp, run in runs.items()}
    for sequence_parallel, measured in held.items():
        predicted = split_activation_bytes(problem, 2, sequence_parallel)
        print(f"sequence_parallel={sequence_parallel}: activations {measured}, formula {predicted}")
        # each forward keeps exactly what the formula counts, wherever the transport left its
        # buffers (test_memory's recorded steps show both ways a received sum can go)
        assert abs(measured["worker:0"] - predicted[0]) <= 0.001 * predicted[0]
        if not sequence_parallel:
            assert abs(measured["worker:1"] - predicted[1]) <= 0.001 * predicted[1]
        else:
            # worker 1's forward ends on the piece of its last partial output (A) it sends to
            # worker 0: a slice, not traced to A's buffer, so A can still count (0, A / 2 or A
            # in 20 runs beside two busy loops)
            assert predicted[1] <= measured["worker:1"] <= predicted[1] + a
    # the LayerNorms' inputs and 1/std at 1/2: 2 x s x b x d x 4 bytes / 2 + 2 x s x b x 4 / 2
    saved = held[False]["worker:0"] - held[True]["worker:0"]
    assert saved == 2 * (2 * 32 * 8 * 64 * 4 // 2 + 2 * 32 * 8 * 4 // 2)


def test_a_sequence_that_does_not_cut_and_an_mlp_are_refused_with_the_fix(cluster):
    problem = train.transformer(blocks=1, d_model=48, heads=6, sequence=16, batch_size=4)
    with pytest.raises(ValueError, match=r"ways=3: transformer_1x48_h6_s16's sequence of 16 does "
                                         r"not cut into 3 equal pieces; use a sequence divisible "
                                         r"by 3, e.g. train.transformer\(sequence=18, ...\)"):
        train.tensor_parallel(problem, cluster, ways=3, sequence_parallel=True)
    with pytest.raises(ValueError, match=r"sequence_parallel=True: .* has no sequence; it cuts "
                                         r"a transformer's"):
        train.tensor_parallel(train.classification(), cluster, ways=2, sequence_parallel=True)
