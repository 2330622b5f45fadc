"""Sharded data parallelism (ZeRO-3 / FSDP in worker programs) beside train.single and a plain
train.all_reduce: the same losses, 1/N of the state per worker, 1.5x the bytes per step."""

import numpy as np
import pytest

from dtflab import train
from dtflab.train.formulas import costs

from conftest import beside_all_reduce, killed_with_checkpoints, one_process, sends_as_its_formula_says

pytestmark = pytest.mark.slow

PROBLEM = train.exp_regression()
#: Same seed and global batch as one process: float rounding of the gradient sums only.
TOLERANCE = 1e-5
#: Big enough that tensors dominate gRPC's framing: 85,002 parameters, 340,008 bytes.
WIRE_PROBLEM = train.classification(width=256, batch_size=256)


def worst_loss_diff(history, alone) -> float:
    return max(float(np.max(np.abs(np.array([r.loss for r in history.records if r.worker == w])
                                   - alone.losses))) for w in history.workers)


def test_sharded_matches_one_process_and_every_worker_agrees():
    alone = one_process(PROBLEM, steps=40, seed=5)
    history = train.sharded_data_parallel(PROBLEM, workers=2, steps=40, seed=5)
    assert history.steps_per_worker == {"worker:0": 40, "worker:1": 40}
    assert worst_loss_diff(history, alone) <= TOLERANCE
    fingerprints = history.details["fingerprints"]
    assert len(fingerprints["worker:0"]) == 4  # every check_every=10 steps
    assert fingerprints["worker:0"] == fingerprints["worker:1"]  # the sum over every shard
    assert history.examples == 40 * PROBLEM.batch_size
    assert history.cluster.stopped


def test_softmax_with_three_workers_matches_one_process():
    # three workers: every pair of workers exchanges its chunks in the reduce-scatter
    problem = train.classification(width=32, batch_size=96)
    alone = one_process(problem, steps=15, seed=1)
    history = train.sharded_data_parallel(problem, workers=3, steps=15, seed=1)
    assert set(history.steps_per_worker.values()) == {15}
    assert worst_loss_diff(history, alone) <= TOLERANCE


def test_each_worker_holds_half_the_state_and_sends_one_and_a_half_times_all_reduce_bytes():
    model = WIRE_PROBLEM.parameter_bytes
    plain, sharded, plain_sent, sent = beside_all_reduce(WIRE_PROBLEM,
                                                         train.sharded_data_parallel, 12)
    formula = costs.sharded_bytes(model, 2)
    assert sharded.details["bytes_per_step_formula"] == formula == 1.5 * model
    sends_as_its_formula_says(sent, plain_sent, formula, 1.5)
    for worker in ("worker:0", "worker:1"):
        mine, full = sharded.details["state_bytes"][worker], plain.details["state_bytes"][worker]
        assert full == {"parameters": model, "slots": 2 * model}  # Adam's m and v
        assert sum(mine.values()) <= 1.1 * sum(full.values()) / 2
        assert sum(mine.values()) == pytest.approx(costs.sharded_state_bytes(model, 2), rel=1e-3)
        assert sharded.details["memory"][worker]["rss"] > 0


def test_with_checkpoints_every_worker_resumes_its_own_shards_and_the_curve_goes_on():
    reference, history, recovery = killed_with_checkpoints(train.sharded_data_parallel, PROBLEM)
    assert [r.step for r in history.records if r.worker == "worker:0"][-1] == 59
    expected = {r.step: r.loss for r in reference.records}
    assert max(abs(r.loss - expected[r.step]) for r in history.records) <= TOLERANCE


@pytest.mark.parametrize("kwargs, message", [
    (dict(workers=0), "workers"),
    (dict(workers=3), "does not split into 3"),
    (dict(slow={"worker:5": 0.1}), r"names 'worker:5'.*use one of: worker:0, worker:1"),
    (dict(check_every=0), r"check_every=0: .*for example check_every=10"),
])
def test_bad_input_is_refused_before_anything_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train.sharded_data_parallel(PROBLEM, steps=5, **{"workers": 2, **kwargs})


def test_a_traced_step_shows_each_worker_gathering_twice_per_layer():
    def gathers_per_worker(history):
        return [[t for t in timings if t.name.endswith(":CollectiveGatherV2")]
                for timings in history.trace.timings.values()]

    history = train.sharded_data_parallel(PROBLEM, workers=2, steps=5, trace_step=3)
    if not all(gathers_per_worker(history)):  # TensorFlow's profiler lost a worker's events
        history = train.sharded_data_parallel(PROBLEM, workers=2, steps=5, trace_step=3)
    assert len(history.trace.timings) == 2
    for gathers in gathers_per_worker(history):
        assert len(gathers) == 2 * PROBLEM.depth  # before each layer's forward and its backward
