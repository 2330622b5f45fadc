"""``train.run``: one way in to every loop, the loop chosen from the layout's ways or named by
``loop=`` where several run it; a run through it trains as the loop's own function does, and
bad input is one line before anything starts."""

import pytest

import dtflab
from dtflab import train
from dtflab.train.strategies.by_layout import loops_for


MLP = train.classification(width=16, batch_size=32, hidden_layers=1)
SHAPE = dict(blocks=2, d_model=32, heads=2, sequence=16, batch_size=8)
STEPS = dict(steps=4, seed=0)


@pytest.fixture(scope="module")
def cluster():
    with dtflab.start_cluster(jobs="ps=1,worker=2") as c:
        yield c


@pytest.mark.slow  # the module's cluster
@pytest.mark.parametrize("layout, loop, direct", [
    (train.Layout(), None, lambda c: train.single(MLP, cluster=c, device="worker:0", **STEPS)),
    (train.Layout(tensor=2), None, lambda c: train.tensor_parallel(MLP, c, ways=2, **STEPS)),
    (train.Layout(pipeline=2, micro_batches=2), None,
     lambda c: train.pipeline(MLP, c, stages=2, micro_batches=2, **STEPS)),
    (train.Layout(data=2), "sync_data_parallel",
     lambda c: train.sync_data_parallel(MLP, c, workers=2, **STEPS)),
    (train.Layout(), "model_parallel", lambda c: train.model_parallel(MLP, c, **STEPS)),
    (train.Layout(data=2), None, lambda c: train.all_reduce(MLP, workers=2, **STEPS)),
], ids=["single", "tensor", "pipeline", "sync-ps", "placement-2016", "all-reduce-programs"])
def test_a_run_through_the_front_door_trains_as_the_loops_own_function(cluster, layout, loop,
                                                                       direct):
    through = train.run(MLP, cluster, layout, loop=loop, **STEPS)
    own = direct(cluster)
    assert through.name == own.name  # the same loop ran
    assert through.losses == pytest.approx(own.losses, rel=1e-6)
    assert len(through.losses) == STEPS["steps"]


@pytest.mark.slow
def test_downpour_runs_a_layout_of_data_ways_when_named(cluster):
    downpour = train.run(MLP, cluster, train.Layout(data=2), loop="async_parameter_server",
                         **STEPS)
    assert sorted({r.worker for r in downpour.records}) == ["worker:0", "worker:1"]
    assert "async" in downpour.name


PS_STRATEGY = """
import dtflab
from dtflab import train
with dtflab.start_cluster(ps=1, workers=2) as cluster:
    history = train.run(train.exp_regression(), cluster, train.Layout(data=2),
                        loop="ps_strategy", steps=40, seed=0)
    print(history.name)
    print(history.steps, history.losses[0], history.final_loss())
"""


@pytest.mark.slow
def test_parameter_server_strategy_runs_a_layout_of_data_ways_when_named():
    # the coordinator changes TensorFlow's process-wide context: a process of its own
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", PS_STRATEGY], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    name, numbers = out.stdout.strip().splitlines()[-2:]
    steps, first, last = numbers.split()
    assert "ParameterServerStrategy" in name, name
    assert int(steps) == 40 and float(last) < float(first)


@pytest.mark.slow
def test_a_plans_row_goes_to_the_front_door_as_it_is(cluster):
    problem = train.transformer(**SHAPE)
    plans = dtflab.plan(problem, devices=2, hardware="cpu", tensor=2)
    row = plans.best
    assert row.plan.tensor == 2
    history = train.run(problem, cluster, row, **STEPS)
    assert history.details["layout"] == row.plan.layout


def test_every_layout_a_loop_runs_lists_the_loops_that_run_it():
    assert loops_for(train.Layout(data=2)) == ("all_reduce", "sync_data_parallel",
                                               "async_parameter_server", "ps_strategy")
    # the parameter servers' loops and combined run a replica's batch at once
    assert loops_for(train.Layout(data=2, micro_batches=2)) == ("all_reduce",)
    assert loops_for(train.Layout()) == ("single", "model_parallel")
    assert loops_for(train.Layout(micro_batches=2)) == ("single",)
    assert loops_for(train.Layout(tensor=2)) == ("tensor_parallel", "combined")
    assert loops_for(train.Layout(pipeline=2, micro_batches=4)) == ("pipeline",)
    assert loops_for(train.Layout(data=2, zero=3)) == ("zero", "sharded_data_parallel")
    assert loops_for(train.Layout(data=2, tensor=2)) == ("combined",)


@pytest.mark.slow
@pytest.mark.parametrize("layout, options, message", [
    (train.Layout(data=2), dict(loop="pipelines"),
     r"loop='pipelines': not a dtflab loop; choose one of 'single', 'pipeline'"),
    (train.Layout(data=2), dict(loop="pipeline"),
     r"loop='pipeline': train.pipeline does not run layout=train.Layout\(data=2\); the loops "
     r"that do: 'all_reduce', 'sync_data_parallel', 'async_parameter_server', 'ps_strategy'$"),
    (train.Layout(tensor=2, pipeline=2), {},
     r"layout=train.Layout\(pipeline=2, tensor=2\): 4 devices, but the cluster has 2 worker "
     r"tasks; start one with dtflab.start_cluster\(workers=4\)"),
    (train.Layout(tensor=2, context=2), {},
     r"no dtflab loop runs context beside tensor ways yet"),
    (train.Layout(data=4), dict(loop="ps_strategy"),
     r"train.ps_strategy sends steps to every worker task, and the cluster has 2; use "
     r"train.Layout\(data=2\)"),
    ("d2", {}, r"layout='d2': train.run takes a train.Layout\(...\), a Plan or a row of "
               r"dtflab.plan\(...\) \(plans.best\)"),
])
def test_bad_input_is_one_line_naming_the_value_and_the_fix_and_starts_nothing(
        cluster, layout, options, message):
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match=message):
        train.run(MLP, cluster, layout, **options, **STEPS)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


@pytest.mark.slow
def test_a_plan_and_none_each_name_their_layout_and_run_layout_names_no_loop(cluster):
    from dtflab.train.planner.device_memory import Plan
    from dtflab.train.strategies.by_layout import chosen

    problem = train.transformer(**SHAPE)
    plan = Plan(blocks=2, d_model=32, heads=2, sequence=16, vocabulary=23, batch=8, tensor=2)
    assert chosen(problem, cluster, plan)[:2] == ("tensor_parallel", train.Layout(tensor=2))
    assert chosen(problem, cluster, None)[:2] == ("single", train.Layout())
    with pytest.raises(ValueError, match=r"loop='combined': train.run_layout predicts the loop "
                                         r"the layout's ways choose; name a loop with train.run"):
        train.run_layout(problem, cluster, train.Layout(tensor=2), loop="combined")
