"""The tutorials' idea pictures are drawn from real clusters, plans and problems, and say what
the measurements then find."""

import pytest

import dtflab
from dtflab import PlacementPlan, short_device, train
from dtflab.viz.pictures import checkpoint_schedule, downpour_schedule


@pytest.fixture(scope="module")
def cluster():
    with dtflab.start_cluster(jobs="master=1,ps=2") as c:
        yield c


def test_the_cluster_picture_names_every_task_its_address_and_process(cluster):
    picture = dtflab.cluster_picture(cluster)
    texts = picture.texts()
    assert picture._repr_svg_().startswith("<svg")
    for task in cluster.tasks:
        assert task.name in texts and task.address in texts and f"pid {task.pid}" in texts
    assert texts[0] == "3 tasks in 2 job(s), started by dtflab"


def test_the_placement_picture_counts_the_bytes_a_traced_step_moves(cluster):
    problem = train.exp_regression()
    plan = PlacementPlan(cluster, compute="master:0").assign("w*", "ps:0").assign("b*", "ps:1")
    texts = dtflab.placement_picture(plan, problem).texts()
    step = train.model_parallel(problem, cluster, plan, steps=3, trace_step=1).trace
    moved = {(short_device(a), short_device(b)): n for (a, b), n in step.bytes_between().items()}
    for ps in ("ps:0", "ps:1"):
        assert f"parameters {moved[(ps, 'master:0')]:,} B" in texts
        assert f"gradients {moved[('master:0', ps)]:,} B" in texts
    assert "w2 16x32: 2,048 B" in texts and "b3 1: 4 B" in texts


def test_the_towers_picture_splits_the_batch_and_sends_the_whole_model():
    texts = dtflab.towers_picture(train.exp_regression(batch_size=99), workers=3).texts()
    assert [t for t in texts if t.startswith("examples")] == [
        "examples 0-32 of each batch", "examples 33-65 of each batch", "examples 66-98 of each batch"]
    assert "parameters 2,436 B" in texts and "gradients 2,436 B" in texts
    with pytest.raises(ValueError, match="workers=0"):
        dtflab.towers_picture(train.exp_regression(), workers=0)


def test_downpours_staleness_counts_the_other_workers_pushes_between_a_read_and_a_push():
    rows = downpour_schedule({"worker:0": 2, "worker:1": 3}, until=12)
    # worked by hand: a step reads the version after every push up to its start, and is stale
    # by the other worker's pushes strictly between its start and its own push
    assert [b.label for b in rows["worker:0"]] == ["read v0, stale 0", "read v1, stale 1", "read v3, stale 0",
                                                   "read v5, stale 0", "read v6, stale 1", "read v8, stale 0"]
    assert [b.label for b in rows["worker:1"]] == ["read v0, stale 1", "read v2, stale 1", "read v5, stale 1",
                                                   "read v7, stale 1"]
    assert "read v8, stale 0" in dtflab.downpour_picture().texts()
    with pytest.raises(ValueError, match=r"step_times\['worker:1'\]=0"):
        dtflab.downpour_picture({"worker:0": 2, "worker:1": 0})


def test_the_checkpoint_picture_redoes_the_steps_since_the_last_save():
    (blocks,) = checkpoint_schedule(every=20, failed_at=53, steps=80).values()
    saves = [b for b in blocks if b.kind == "save"]
    (lost,) = [b for b in blocks if b.kind == "lost"]
    assert [round((b.start + b.end) / 2) for b in saves] == [20, 40]
    assert lost.end - lost.start == 13 and lost.label == "40-52 again"
    assert "40-52 again" in dtflab.checkpoint_picture().texts()
    with pytest.raises(ValueError, match="failed_at=80 must fall inside the run"):
        dtflab.checkpoint_picture(every=20, failed_at=80, steps=80)


def test_the_coordinator_picture_gives_each_task_its_role():
    with dtflab.start_cluster(ps=2, workers=2, backend="inprocess") as c:
        texts = dtflab.coordinator_picture(c).texts()
    assert "this kernel: the chief" in texts and "schedule" in texts
    assert texts.count("runs the steps it is sent") == 2
    assert "variables 0, 2, ..." in texts and "variables 1, 3, ..." in texts


def test_the_pipeline_picture_counts_the_bytes_a_traced_pipeline_step_moves(start_cluster):
    cluster = start_cluster(workers=2)
    problem = train.classification(width=64, batch_size=256, hidden_layers=3)
    texts = dtflab.pipeline_picture(problem, cluster, stages=2, micro_batches=4).texts()
    assert f"worker:0 ({cluster.addresses['worker'][0]})" in texts
    assert "layers 1-2: 33,280 B" in texts and "4 micro-batches of 64" in texts
    step = train.pipeline(problem, cluster, stages=2, micro_batches=4, steps=3, trace_step=1, schedule="gpipe").trace
    moved = {(short_device(a), short_device(b)): n for (a, b), n in step.bytes_between().items()}
    activations = next(int(t.split()[1].replace(",", "")) for t in texts if t.startswith("activations"))
    assert activations == 64 * 64 * 4
    # Four micro-batches' activations forward; back, their gradients and the optimizer's
    # step counters (Adam's beta powers live beside the first variable).
    assert 4 * activations <= moved[("worker:0", "worker:1")] <= 4 * activations + 64
    assert f"their gradients {activations:,} B" in texts


def held_bytes(texts) -> list[int]:
    """What the slices picture says each worker holds, worker:0 first."""
    return [int(t.split(" holds ")[1].split(" B")[0].replace(",", "")) for t in texts
            if t.startswith("worker:")]


@pytest.mark.parametrize("ways", [2, 4])
def test_the_slices_picture_gives_each_worker_the_variables_tensor_parallel_puts_there(ways):
    from dtflab.train.layouts.layers import split_layers
    from dtflab.train.strategies.tensor_parallel import Split, tensor_parallel_graph

    problem = train.classification(width=64, batch_size=32, hidden_layers=3)
    devices = tuple(f"/job:worker/replica:0/task:{j}" for j in range(ways))
    built = tensor_parallel_graph(problem, Split(devices, *split_layers(problem, ways, ways)), 0)
    placed = [sum(v.shape.num_elements() * 4 for v in built.variables if v.device.endswith(f"task:{j}"))
              for j in range(ways)]
    assert held_bytes(dtflab.slices_picture(problem, "tensor_parallel", ways).texts()) == placed
    assert sum(placed) == problem.parameter_bytes


@pytest.mark.parametrize("ways", [2, 3])
def test_the_slices_picture_gives_each_worker_the_shards_the_sharded_program_holds(ways):
    from dtflab.train.worker_programs.sharded_data_parallel import Unit

    problem = train.classification(width=50, batch_size=30, hidden_layers=2)  # shards pad
    units = [Unit(w, b, ways) for (_, w), (_, b) in zip(*[iter(problem.initial_values(0))] * 2)]
    held = [sum(unit.shard(j).nbytes for unit in units) for j in range(ways)]
    texts = dtflab.slices_picture(problem, "sharded", ways).texts()
    assert held_bytes(texts) == held
    assert (sum(held) > problem.parameter_bytes) == (ways == 3)  # 3 ways pad, 2 do not
    assert [t for t in texts if t.startswith("w") and " holds " not in t] == [
        "w1 64x50", "w2 50x50", "w3 50x10"]
