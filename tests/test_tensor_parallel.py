"""Tensor parallelism on real task servers: the same losses as one process, the bytes each worker
sends counted at the transport against the formula, the sums in a traced step, stragglers (Stop
and a dead worker: ``test_every_loop.py``)."""

import os
import signal
import threading

import numpy as np
import pytest

from dtflab import train
from dtflab.names import task
from dtflab.train.formulas import costs
from dtflab.train.layouts.layers import split_layers, tensor_parallel_pairs
from dtflab.viz.compare import compare

from conftest import max_loss_diff as max_diff
from conftest import one_process

pytestmark = pytest.mark.slow

#: Split layers vs one process, same seed and batches: float rounding of the sums only.
TOLERANCE = 1e-5
DEEP = train.classification(width=64, batch_size=256, hidden_layers=3)
#: Wide enough that tensors dominate gRPC's framing and the optimizer's scalars.
WIRE_WIDTH = 256


@pytest.fixture(scope="module")
def cluster(split_cluster):
    return split_cluster


@pytest.mark.parametrize("problem, ways", [
    (train.exp_regression(), 2),
    (DEEP, 2),
    (train.classification(width=48, batch_size=96), 3),
    (train.classification(width=48, batch_size=96, hidden_layers=5), 3),
], ids=["exp-2-ways", "classification-4-layers-2-ways", "classification-3-layers-3-ways",
        "classification-6-layers-3-ways"])
def test_split_layers_train_exactly_as_one_process(cluster, problem, ways):
    alone = one_process(problem, steps=30, seed=4)
    split = train.tensor_parallel(problem, cluster, ways=ways, steps=30, seed=4)
    assert split.steps == 30 and split.loop == "tensor_parallel"
    assert max_diff(alone, split) <= TOLERANCE
    assert split.losses[-1] < split.losses[0]  # it learns
    assert compare(alone, split).rows[1]["max_abs_loss_diff"] <= TOLERANCE


def test_pairs_run_from_the_input_and_an_odd_depth_keeps_the_output_layer_whole():
    assert tensor_parallel_pairs(3) == ((1, 2),)
    assert tensor_parallel_pairs(4) == ((1, 2), (3, 4))
    assert split_layers(train.exp_regression(), 2, 2) == (((1, 2),), (3,))  # 1-16-32 | 32-1
    assert split_layers(DEEP, 2, 2) == (((1, 2), (3, 4)), ())


def test_the_formula_sends_one_activation_each_way_per_pair_for_two_ways():
    b, h = 100, 64
    # One pair, then the whole output layer on worker 0: the batch out, the partial in, the
    # output's gradient back.
    assert costs.tensor_parallel_bytes(2, b, (8, h, h, 10)) == [
        {"forward": 4 * b * 8, "backward": 4 * b * h}, {"forward": 4 * b * h, "backward": 0}]
    # Two pairs: the first ends in an all-reduce (both workers send B x h each way, plus the
    # bias out and its gradient back), the second in a sum on worker 0.
    deep = costs.tensor_parallel_bytes(2, b, (8, h, h, h, 10))
    assert deep[1] == {"forward": 4 * (b * h + b * 10), "backward": 4 * (b * h + h)}
    assert deep[0] == {"forward": 4 * (b * 8 + b * h + h), "backward": 4 * (b * h + b * 10)}
    assert costs.tensor_parallel_bytes(1, b, (8, h, h, 10)) == [{"forward": 0, "backward": 0}]
    # k ways, all-to-all: k - 1 copies of each partial.
    four_ways = costs.tensor_parallel_bytes(4, b, (8, h, h, h, 10))
    assert four_ways[2]["forward"] == 4 * (3 * b * h + b * 10)


@pytest.mark.parametrize("batch", [128, 512])
def test_bytes_each_worker_sends_are_the_formulas_counted_at_the_transport(cluster, batch):
    problem = train.classification(width=WIRE_WIDTH, batch_size=batch, hidden_layers=3)
    wire = train.WireBytes(after_step=2, steps=8)
    history = train.tensor_parallel(problem, cluster, ways=2, steps=12, callbacks=[wire])
    formula = costs.tensor_parallel_bytes(2, batch, problem.layers)
    assert history.details["bytes_formula"] == {"worker:0": formula[0], "worker:1": formula[1]}
    sent = wire.per_step.sent
    for worker, (source, destination) in enumerate((("worker:0", "worker:1"),
                                                    ("worker:1", "worker:0"))):
        predicted = sum(formula[worker].values())
        assert predicted <= sent[source, destination] <= 1.05 * predicted
        assert sent.get((source, "worker:2"), 0) < 0.01 * predicted  # the third worker idles


class FreezeOnce(train.Callback):
    """After step ``at``, stops ``task`` (SIGSTOP) for ``seconds``: the next step stalls."""

    def __init__(self, cluster, task, at, seconds):
        self.pid = next(t.pid for t in cluster.tasks if t.name == task)
        self.at, self.seconds, self.thaw = at, seconds, None

    def on_step(self, history, record):
        if record.step == self.at:
            os.kill(self.pid, signal.SIGSTOP)
            self.thaw = threading.Timer(self.seconds, os.kill, (self.pid, signal.SIGCONT))
            self.thaw.start()

    def on_run_end(self, history):
        if self.thaw is not None:
            self.thaw.cancel()
        os.kill(self.pid, signal.SIGCONT)


def test_a_step_the_watchdog_ran_again_is_left_out_of_the_bytes_per_step(cluster):
    problem = train.classification(width=WIRE_WIDTH, batch_size=512, hidden_layers=3)
    wire = train.WireBytes(after_step=2, steps=6)
    freeze = FreezeOnce(cluster, "worker:1", at=4, seconds=2.0)
    history = train.tensor_parallel(problem, cluster, ways=2, steps=12, callbacks=[freeze, wire],
                                    watchdog=train.Watchdog(floor_s=0.5, retries=10))
    assert "recovered" in {stall.outcome for stall in history.stalls}, history.stalls
    assert wire.skipped >= 1
    predicted = sum(costs.tensor_parallel_bytes(2, 512, problem.layers)[0].values())
    sent = wire.per_step.sent_by()["worker:0"]
    assert predicted <= sent <= 1.05 * predicted, sent / predicted


def test_the_traced_step_shows_the_partial_outputs_crossing_to_the_sums(cluster):
    history = train.tensor_parallel(DEEP, cluster, ways=2, steps=4, trace_step=2)
    crossing = {(t.tensor_name, task(t.src_device), task(t.dst_device)): t
                for t in history.trace.transfers}
    activations = 4 * DEEP.batch_size * 64
    # Pair 1 ends in an all-reduce: each worker's partial output goes to the other.
    first = [crossing[f"pair1/worker{source[-1]}/layer2/partial:0", source, destination]
             for source, destination in (("worker:0", "worker:1"), ("worker:1", "worker:0"))]
    assert [t.nbytes for t in first] == [activations, activations]
    # Pair 2 ends in a sum on worker 0, where the loss is.
    last = crossing["pair2/worker1/layer4/partial:0", "worker:1", "worker:0"]
    assert last.nbytes == 4 * DEEP.batch_size * 10
    # Backward: the gradient of each worker's copy of pair 1's sum goes to the other worker.
    backward = [t for (name, _, _), t in crossing.items()
                if name.startswith("gradients/pair1/sum_on_") and t.nbytes == activations]
    assert {(task(t.src_device), task(t.dst_device)) for t in backward} == {
        ("worker:0", "worker:1"), ("worker:1", "worker:0")}
    # Where the sums sit in the step: pair 1's, then pair 2's, then the gradients' (where the
    # step stats timed the transfer: now and then, under load, one is not).
    starts = [min((t.start_us for t in group if t.start_us is not None), default=None)
              for group in (first, [last], backward)]
    timed = [start for start in starts if start is not None]
    assert len(timed) >= 2 and timed == sorted(timed)


def test_a_slow_worker_holds_up_every_step(cluster):
    history = train.tensor_parallel(DEEP, cluster, ways=2, steps=5, slow={"worker:1": 0.3})
    times = [r.time_s for r in history.records]
    assert min(np.diff(times)) >= 0.25  # worker:0's sums wait for worker:1
