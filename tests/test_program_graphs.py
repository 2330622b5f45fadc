"""A ZeRO worker program's step read from its own step function (``planner.program_graphs``), and
its collectives simulated as TensorFlow runs them: each waits for every member of its group.
How close the price comes is a benchmark (``benchmarks/plan.py``); the costs are fitted on real
runs in ``test_predicted_run``."""

import dataclasses

import pytest

from dtflab import train
from dtflab.train.formulas import costs
from dtflab.train.planner import executor, program_graphs
from dtflab.train.planner.graph_ops import GraphOp
from dtflab.train.planner.hardware import a100_node

SMALL = dict(blocks=2, d_model=32, heads=2, sequence=16, batch_size=8)


@pytest.mark.parametrize("stage, gathers", [(1, 1), (3, 2)])
def test_each_worker_traces_its_own_collectives_and_they_pair_across_workers(stage, gathers):
    problem = train.transformer(**SMALL)
    ops = program_graphs.program_ops(problem, stage, 2)
    tensors = len(problem.initial_values(0))
    if stage == 3:  # a parameter a block that reads it: the tied embedding, the first and last
        tensors = sum(len(problem.stage_parameters(b, b)) for b in range(1, problem.blocks + 1))
    counts = program_graphs.collective_counts(ops)
    # a reduce-scatter a parameter (two workers: one send, one receive); a gather a parameter
    # after Adam (stage 1), or one in the forward and one in the backward (stage 3)
    assert counts == {"CollectiveGatherV2": gathers * tensors,
                      "CollectiveBcastSendV2": tensors, "CollectiveBcastRecvV2": tensors}
    groups = {}
    for op in ops:
        if op.kind == "collective":
            groups.setdefault(op.group, []).append(op)
    assert {len(members) for members in groups.values()} == {2}
    assert all(len({op.task for op in members}) == 2 for members in groups.values())
    pairs = [members for members in groups.values() if members[0].type.startswith("CollectiveB")]
    assert all({op.type for op in members} == {"CollectiveBcastSendV2", "CollectiveBcastRecvV2"}
               for members in pairs)


def test_a_zero_step_puts_on_the_wire_what_a_ring_all_reduce_would():
    problem = train.transformer(**SMALL)
    ops = program_graphs.program_ops(problem, 1, 2)
    sent = sum(op.nbytes for op in ops if op.task == "worker:0"
               and op.type in ("CollectiveBcastSendV2", "CollectiveGatherV2"))
    parameters = sum(value.size for _, value in problem.initial_values(0))
    expected = costs.all_reduce_bytes(4 * parameters, 2)
    # each parameter padded to an even count of values: a few bytes over the formula
    assert expected <= sent <= expected + 4 * len(problem.initial_values(0))


def _op(name, task, kind="elementwise", nbytes=0.0, inputs=(), group=(), type_="Mul"):
    return GraphOp(name, type_, task, kind, 0.0, nbytes, (4,),
                   tuple((i, 0) for i in inputs), (), 0.0, group)


def test_a_collective_waits_for_the_last_member_of_its_group_to_be_ready():
    hardware = dataclasses.replace(
        a100_node(), cpus=2, per_step_s=0.0,
        op_costs={"elementwise": (0.0, 1e-9), "transfer": (1e-4, 0.0),
                  "collective_ring": (2e-3, 0.0)})
    ops = [_op("slow", "worker:0", nbytes=5e6),  # 5 ms of work on worker 0 first
           _op("g0", "worker:0", "collective", inputs=("slow",), group=(1, 1),
               type_="CollectiveGatherV2"),
           _op("g1", "worker:1", "collective", group=(1, 1), type_="CollectiveGatherV2")]
    spans = {name: (start, end) for _, name, *_, start, end in
             executor.simulate(ops, hardware, threads=1).spans}
    assert spans["g1"][0] == pytest.approx(spans["slow"][1])  # worker 1 waited for worker 0
    assert spans["g0"][1] - spans["g0"][0] == pytest.approx(2e-3)
    alone = executor.simulate([_op("g1", "worker:1", "collective", group=(1, 1),
                                   type_="CollectiveGatherV2")], hardware, threads=1)
    assert alone.spans[0][4] < spans["slow"][1]
