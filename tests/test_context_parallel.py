"""Context parallelism on real task servers: ring attention over the naive and the zig-zag cut
trains as one process does, sends what its formula says at the transport, and each worker
computes the blocks of scores its cut gives it, read from a traced step's executed ops (the
naive cut's last worker c times the first's; the zig-zag cut's the same everywhere)."""

import collections
import re

import pytest

from dtflab import names, train
from dtflab.train.formulas import split_bytes
from dtflab.train.layouts import ring

from conftest import max_loss_diff, one_process

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # the online softmax sums in another order
SCORES = re.compile(r"^block1/ring_attention_on_worker\d+/q\d+_k\d+_(full|causal)_scores$")


@pytest.mark.parametrize("ways, cut", [(2, "naive"), (2, "zigzag"), (3, "naive"), (3, "zigzag")])
def test_ring_attention_trains_exactly_as_one_process(split_cluster, ways, cut):
    problem = train.transformer(blocks=2, d_model=32, heads=2, sequence=48, batch_size=8)
    alone = one_process(problem, steps=5, seed=4)
    split = train.context_parallel(problem, split_cluster, ways=ways, cut=cut, steps=5, seed=4,
                                   trace_step=2)
    print(f"{ways} ways, {cut}: vs single {max_loss_diff(alone, split):.2e}")
    assert max_loss_diff(alone, split) <= TOLERANCE and split.losses[-1] < split.losses[0]
    computed = collections.Counter()  # query-key pairs each worker's forward of block 1 computed
    for device, ops in split.trace.timings.items():
        for op in ops:
            if SCORES.match(op.name) and op.kind == "compute":
                size = problem.sequence // (ways * (2 if cut == "zigzag" else 1))
                computed[names.short(device)] += size * size
    assert computed == split.details["attention_work"]
    work = list(computed.values())
    assert max(work) / min(work) == (ways if cut == "naive" else 1)
    assert sum(work) < problem.sequence ** 2  # the blocks above the diagonal are not computed


@pytest.mark.parametrize("cut", ["naive", "zigzag"])
def test_the_bytes_each_worker_sends_are_the_formulas_at_the_transport(split_cluster, cut):
    problem = train.transformer(blocks=2, d_model=64, heads=2, sequence=96, batch_size=8)
    wire = train.WireBytes(after_step=2, steps=4)
    history = train.context_parallel(problem, split_cluster, layout=train.Layout(context=3),
                                     cut=cut, steps=7, callbacks=[wire], trace_step=1)
    formula = history.details["bytes_formula"]
    assert formula == dict(zip(("worker:0", "worker:1", "worker:2"),
                               split_bytes.context_parallel_bytes(problem, 3, cut)))
    traced = collections.Counter()
    for transfer in history.trace.transfers:
        traced[names.short(transfer.src_device)] += transfer.nbytes
    for worker, predicted in formula.items():
        expected = sum(predicted.values())
        sent = wire.per_step.sent_by().get(worker, 0)
        print(f"{cut} {worker}: transport {sent / expected:.4f}, trace "
              f"{traced[worker] / expected:.4f} of the formula")
        assert abs(traced[worker] - expected) <= 16  # the loss, a scalar, is not counted
        assert expected <= sent <= 1.05 * expected
    position = 2 * 8 * 64 * 4 * 2  # one position's keys and values, in both blocks
    if cut == "naive":  # a chain: the last worker's keys go nowhere, the first's two hops
        assert [formula[w]["forward"] for w in ("worker:1", "worker:2")] == [64 * position, 0]
    else:  # every worker passes keys on: 48 positions, 48 (and the parameters), 64
        assert [formula[w]["forward"] for w in ("worker:1", "worker:2")] == [48 * position,
                                                                            64 * position]


def test_a_sequence_that_does_not_cut_and_unsupported_levers_are_refused_with_the_fix(
        split_cluster):
    problem = train.transformer(blocks=1, d_model=32, heads=2, sequence=20, batch_size=4)
    with pytest.raises(ValueError, match=r"ways=3, cut='zigzag': transformer_1x32_h2_s20's "
                                         r"sequence of 20 does not cut into 6 equal pieces; use a "
                                         r"sequence divisible by 6, e.g. "
                                         r"train.transformer\(sequence=24, ...\)"):
        train.context_parallel(problem, split_cluster, ways=3)
    with pytest.raises(ValueError, match=r"cut='ring': cut must be one of 'naive', 'zigzag'"):
        train.context_parallel(problem, split_cluster, ways=2, cut="ring")
    with pytest.raises(ValueError, match=r"recompute='selective', precision='float32': context "
                                         r"parallelism runs float32 without recomputation"):
        train.context_parallel(train.transformer(recompute="selective"), split_cluster)
    with pytest.raises(ValueError, match=r"ways=4: each piece of the sequence runs on a worker "
                                         r"task and this cluster has 3"):
        train.context_parallel(train.transformer(sequence=64), split_cluster, ways=4)


def test_the_ring_schedule_on_a_worked_example():
    """Two workers, a sequence of 8 positions: the zig-zag cut (4 pieces of 2) gives worker 0
    positions 0-1 and 6-7, worker 1 positions 2-5; counted here by hand."""
    assert ring.chunks("zigzag", 2, 8) == [[(0, 2), (6, 8)], [(2, 4), (4, 6)]]
    assert ring.chunks("naive", 2, 8) == [[(0, 4)], [(4, 8)]]
    # naive: worker 0 sees its own keys, under the mask; worker 1 its own and worker 0's
    assert ring.work("naive", 2, 8) == [16, 32]
    # zig-zag: 3 blocks of 2 x 2 each in the first round (2 causal, 1 full), 2 full in the second
    assert ring.work("zigzag", 2, 8) == [20, 20]
    assert ring.hops("naive", 2, 8) == [(0, 1, (0, 4))]
    assert ring.gradient_hops("naive", 2, 8) == [(1, 0, (0, 4))]
    assert sorted(ring.hops("zigzag", 2, 8)) == [(0, 1, (0, 2)), (1, 0, (2, 4)), (1, 0, (4, 6))]
