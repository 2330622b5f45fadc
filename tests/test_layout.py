"""The layout object: ranks and groups as Megatron numbers them (checked against the worked
example in Megatron-LM's ``initialize_model_parallel`` docstring), its checks against a model
and a cluster, and the mesh picture's links."""

import itertools

import pytest

from dtflab import train
from dtflab.train.layouts.layout import AXES
from dtflab.viz.layout import positions


def test_groups_are_megatrons_worked_example():
    # Megatron-LM, parallel_state.initialize_model_parallel: 16 GPUs, tensor 2, pipeline 4
    # (data 2) give these groups, g0 ... g15.
    layout = train.Layout(data=2, tensor=2, pipeline=4)
    assert layout.size == 16
    assert layout.groups("data") == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11),
                                     (12, 14), (13, 15)]
    assert layout.groups("tensor") == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11),
                                       (12, 13), (14, 15)]
    assert layout.groups("pipeline") == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14),
                                         (3, 7, 11, 15)]
    assert layout.groups("context") == [(r,) for r in range(16)]


def test_every_rank_has_one_place_and_each_group_varies_one_axis():
    layout = train.Layout(data=2, tensor=3, pipeline=2, context=2)
    seen = set()
    for rank in range(layout.size):
        at = layout.coordinates(rank)
        assert layout.rank(**at) == rank
        t, c, d, p = at["tensor"], at["context"], at["data"], at["pipeline"]
        assert rank == ((p * 2 + d) * 2 + c) * 3 + t  # tensor fastest, pipeline slowest
        seen.add(tuple(at.values()))
    assert len(seen) == layout.size == 24
    for axis in AXES:
        groups = layout.groups(axis)
        assert sorted(itertools.chain(*groups)) == list(range(24))  # a partition of the ranks
        for group in groups:
            moved = [a for a in AXES if len({layout.coordinates(r)[a] for r in group}) > 1]
            assert moved == ([axis] if len(group) > 1 else [])
            assert [layout.coordinates(r)[axis] for r in group] == list(range(len(group)))


def test_links_are_a_chain_a_ring_and_all_pairs():
    layout = train.Layout(data=2, tensor=2, pipeline=3, context=3)
    by_axis = {axis: [(a, b) for a, b, along in layout.links() if along == axis] for axis in AXES}
    assert len(by_axis["pipeline"]) == 12 * 2   # 12 pipelines of 3 stages: 2 hops each
    assert len(by_axis["context"]) == 12 * 3    # 12 rings of 3
    assert len(by_axis["data"]) == 18 * 1       # 18 pairs of replicas
    assert len(by_axis["tensor"]) == 18 * 1
    first = layout.group("pipeline", 0)
    assert by_axis["pipeline"][:2] == list(zip(first, first[1:]))
    assert str(layout) == "pipeline 3 x data 2 x context 3 x tensor 2 = 36 tasks"


def test_the_picture_draws_each_task_and_each_axis_links():
    layout = train.Layout(data=2, tensor=2, pipeline=2)
    fig = layout.picture()
    tasks = fig.select(name="tasks")[0].data_source.data
    assert tasks["task"] == [f"worker:{r}" for r in range(8)]
    assert tasks["groups"][5] == "pipeline: [1, 5]; data: [5, 7]; tensor: [4, 5]"
    for axis, count in (("pipeline", 4), ("data", 4), ("tensor", 4)):
        drawn = fig.select(name=f"links_{axis}")[0].data_source.data
        assert len(drawn["x0"]) == count
    assert not fig.select(name="links_context")
    # a pipeline's stages side by side, a data replica per row
    placed = positions(layout)
    x, y = placed[layout.rank(pipeline=1, data=1, tensor=1)]
    assert x > placed[layout.rank(tensor=1)][0] and y < 0


def test_a_one_form_loop_takes_a_layout_that_cuts_its_axis_alone():
    assert train.Layout(tensor=4).alone("tensor", "tensor_parallel") == 4
    assert train.Layout().alone("context", "context_parallel") == 1
    with pytest.raises(ValueError, match=r"Layout\(data=2, tensor=2\): tensor_parallel cuts the "
                                         r"tensor axis alone; use train.combined for data x "
                                         r"tensor, or train.Layout\(tensor=2\)"):
        train.Layout(data=2, tensor=2).alone("tensor", "tensor_parallel")


def test_bytes_between_tasks_add_up_by_rank_pair_and_by_axis():
    layout = train.Layout(data=2, tensor=2)  # ranks 0 1 | 2 3: tensor pairs (0, 1), (2, 3)
    sent = {("worker:0", "worker:1"): 100, ("worker:1", "worker:0"): 50,  # tensor, both ways
            ("/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/task:2"): 7,  # data
            ("worker:1", "worker:2"): 3,  # differs in data and tensor
            ("worker:3", "other"): 1000, ("worker:0", "worker:5"): 9}  # not in the layout
    assert layout.axis_of(0, 1) == "tensor" and layout.axis_of(1, 3) == "data"
    assert layout.axis_of(1, 2) is None and layout.axis_of(2, 2) is None
    assert layout.link_bytes(sent) == {(0, 1): 150, (0, 2): 7, (1, 2): 3}
    assert layout.axis_bytes(sent) == {"pipeline": 0, "data": 7, "context": 0, "tensor": 150,
                                       "other": 3}


@pytest.mark.parametrize("kwargs, problem, message", [
    (dict(data=3), train.transformer(batch_size=16), r"data=3: the batch of 16 does not split "
                                                      r"into 3 equal slices; use data=2"),
    (dict(tensor=3), train.transformer(heads=4), r"tensor=3: transformer_2x64_h4_s32's 4 heads "
                                                  r"do not split into 3 equal groups; use "
                                                  r"tensor=2"),
    (dict(context=5), train.transformer(sequence=32), r"context=5: the sequence of 32 does not "
                                                       r"split into 5 equal pieces; use "
                                                       r"context=4"),
    (dict(pipeline=3), train.transformer(blocks=2), r"pipeline=3: transformer_2x64_h4_s32 has 2 "
                                                     r"blocks, so at most 2 stages"),
    (dict(tensor=3), train.classification(width=64), r"tensor=3: classification_64's hidden "
                                                      r"widths 64, 64 do not split"),
    (dict(context=2), train.exp_regression(), r"context=2: exp_regression has no sequence; it "
                                              r"cuts a transformer's"),
])
def test_ways_the_model_does_not_divide_are_refused_with_the_fix(kwargs, problem, message):
    with pytest.raises(ValueError, match=message):
        train.Layout(**kwargs).fits(problem)
    layout = train.Layout(data=2, tensor=2)
    assert layout.fits(train.transformer()) is layout


@pytest.mark.parametrize("kwargs, message", [
    (dict(data=0), r"data=0: data must be a whole number of at least 1; for example data=2"),
    (dict(tensor=1.5), r"tensor=1.5: tensor must be a whole number"),
])
def test_ways_that_are_not_whole_numbers_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train.Layout(**kwargs)
    with pytest.raises(ValueError, match=r"rank=8: rank must be a whole number of at most 7"):
        train.Layout(data=2, tensor=2, pipeline=2).coordinates(8)


@pytest.mark.slow
def test_more_ways_than_worker_tasks_are_refused_naming_both(start_cluster):
    cluster = start_cluster(workers=3)
    layout = train.Layout(data=2, tensor=2)
    with pytest.raises(ValueError, match=r"Layout\(data=2, tensor=2\) needs 4 worker tasks "
                                         r"\(data 2 x tensor 2 = 4 tasks\) and this cluster has "
                                         r"3; start them with dtflab.start_cluster\(workers=4\)"):
        layout.tasks(cluster)
    assert train.Layout(data=3).tasks(cluster) == [f"/job:worker/task:{i}" for i in range(3)]


@pytest.mark.parametrize("fields, message", [
    (dict(data=0), r"^data=0: data must be a whole number of at least 1; for example data=2$"),
    (dict(schedule="1F1B"), r"^schedule='1F1B': schedule must be one of 'gpipe', '1f1b'"),
    (dict(chunks=2), r"^chunks=2: only the interleaved schedule .*; use schedule='interleaved' or"),
    (dict(pipeline=2, schedule="interleaved", chunks=2, micro_batches=3),
     r"^micro_batches=3: the interleaved schedule .* e\.g\. micro_batches=2$"),
    (dict(sequence_parallel=True), r"^sequence_parallel=True: .*; use tensor=2 or more"),
    (dict(data=3, expert=2), r"^expert=2: .* data=3 does not divide by it; use expert=1, or data=2$"),
    (dict(zero=4), r"^zero=4: ZeRO's stage must be one of 0, 1, 2, 3"),
    (dict(precision="fp8"), r"^precision='fp8': precision must be one of"),
    (dict(recompute="some"), r"^recompute='some': recompute must be one of"),
])
def test_each_rule_of_a_layout_is_one_line_naming_the_value_and_the_fix(fields, message):
    with pytest.raises(ValueError, match=message) as refused:
        train.Layout(**fields)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("problem, fields, message", [
    (train.transformer(batch_size=8), dict(data=2, micro_batches=3),
     r"^micro_batches=3: a replica's 4 of the batch of 8 .*; use micro_batches=2"),
    (train.transformer(heads=4), dict(tensor=3), r"^tensor=3: .*4 heads .*; use tensor=2"),
    (train.transformer(blocks=2), dict(pipeline=2, schedule="interleaved", chunks=2,
                                       micro_batches=2), r"^chunks=2: 2 workers x 2 chunks"),
    (train.transformer(), dict(data=2, expert=2), r"^expert=2: .* has no experts"),
    (train.transformer(), dict(precision="bfloat16"),
     r"^precision='bfloat16': .* computes with precision='float32'"),
    (train.classification(), dict(context=2),
     r"^context=2: classification\w* has no sequence; it cuts a transformer's"),
])
def test_a_model_that_does_not_divide_the_way_a_layout_cuts_is_refused(problem, fields, message):
    with pytest.raises(ValueError, match=message):
        train.Layout(**fields).fits(problem)


@pytest.mark.parametrize("call, message", [
    (lambda: train.pipeline(train.transformer(blocks=2), None, stages=2,
                            layout=train.Layout(pipeline=2)), r"^stages= and layout= both given"),
    (lambda: train.pipeline(train.transformer(blocks=2), None, stages=3),
     r"^stages=3: .* at most 2 stages; use stages=2 or a deeper model"),
    (lambda: train.pipeline(train.transformer(blocks=2), None,
                            layout=train.Layout(pipeline=2, zero=1)), r"^zero=1: pipeline keeps"),
    (lambda: train.tensor_parallel(train.transformer(), None, layout=train.Layout(tensor=2,
                                                                                  micro_batches=2)),
     r"^micro_batches=2: tensor_parallel runs the whole batch at once; use micro_batches=1$"),
    (lambda: train.combined(train.transformer(), None, train.Layout(data=2, micro_batches=2)),
     r"^micro_batches=2: combined runs one micro-batch a step"),
    (lambda: train.expert_parallel(train.transformer(experts=4), None,
                                   layout=train.Layout(data=2)),
     r"^expert=1: expert_parallel spreads the experts over every data way"),
    (lambda: train.zero(train.transformer(), layout=train.Layout(data=2)),
     r"^zero=0: train.zero runs ZeRO's stages 1 to 3"),
    (lambda: train.all_reduce(train.transformer(), layout=train.Layout(data=2, zero=2)),
     r"^zero=2: all_reduce keeps a whole copy"),
    (lambda: train.all_reduce(train.transformer(), layout=train.Layout(data=2, tensor=2)),
     r"^Layout\(data=2, tensor=2\): all_reduce cuts the data axis alone"),
])
def test_every_loop_refuses_through_the_one_layout_before_it_starts_anything(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_plans_layout_is_the_layout_a_loop_takes():
    from dtflab.train.planner.device_memory import Plan

    plan = Plan(blocks=4, pipeline=2, micro_batches=4, schedule="gpipe", data=2)
    assert plan.layout == train.Layout(data=2, pipeline=2, micro_batches=4, schedule="gpipe")
    with pytest.raises(ValueError, match=r"^zero=4: ZeRO's stage must be one of"):
        Plan(zero=4)
    import dtflab

    best = dtflab.plan("GPT-2 small (124 M)", devices=8, hardware="h100").best
    assert type(best.layout) is train.Layout and best.layout == best.plan.layout
    assert best.layout.size == 8 and best.name.startswith(f"d{best.layout.data} ")
