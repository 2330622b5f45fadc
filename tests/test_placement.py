"""Placement plans: strategies, where variables really land, the map and the editor."""

import pytest

from conftest import wait_until

import dtflab
from dtflab import PlacementPlan
from dtflab import train
from dtflab._quiet import import_tf
from dtflab.placement import VariableInfo
from dtflab.tracing import short_device
from dtflab.viz.placement import placement_figure

tf = import_tf()
PS0, PS1, MASTER = "/job:ps/task:0", "/job:ps/task:1", "/job:master/task:0"


@pytest.fixture(scope="module")
def cluster():
    with dtflab.start_cluster(jobs="master=1,ps=2", backend="inprocess") as c:
        yield c


def floats(name, n):
    return VariableInfo(name, (n,), "float32", 4 * n)


SIZES = [floats("a", 25), floats("b", 15), floats("c", 12), floats("d", 10), floats("e", 2)]
MLP = [floats(n, 1) for n in ("w1", "b1", "w2", "b2", "w3", "b3")]


def mlp_builder():
    """The 2016 exp(x) model, built under whatever plan is active; returns (fetch, feed).
    Its variables are made from their shapes (the plan sees their sizes as they are made)."""
    problem = train.exp_regression()
    x, t = problem.placeholders()
    variables = [tf.compat.v1.get_variable(name, value.shape)
                 for name, value in problem.initial_values()]
    loss = problem.loss(problem.forward(variables, x), t)
    step = problem.optimizer().minimize(loss)
    xs, ts = problem.batch(0)
    return [step, loss], {x: xs, t: ts}


def test_round_robin_alternates_like_replica_device_setter(cluster):
    plan = PlacementPlan.round_robin(cluster, variables=SIZES)
    assert [plan.assignments[v.name] for v in SIZES] == [PS0, PS1, PS0, PS1, PS0]


def test_greedy_takes_the_largest_first_and_balances_bytes(cluster):
    plan = PlacementPlan.greedy(cluster, variables=SIZES)
    # 25 -> ps0; 15 -> ps1; 12 -> ps1 (15 < 25); 10 -> ps0 (27 > 25); 2 -> ps1 (35 > 29)
    assert plan.assignments == {"a": PS0, "b": PS1, "c": PS1, "d": PS0, "e": PS1}
    assert plan.bytes_per_device(SIZES) == {MASTER: 0, PS0: 140, PS1: 116}
    assert plan.imbalance(SIZES) == pytest.approx(140 / 128)
    assert plan.imbalance(SIZES) < PlacementPlan.round_robin(cluster, variables=SIZES).imbalance(SIZES)


def test_by_layer_puts_layer_i_on_task_i(cluster):
    plan = PlacementPlan.by_layer(cluster, variables=MLP)
    assert plan.placement(MLP) == {"w1": PS0, "b1": PS0, "w2": PS1, "b2": PS1, "w3": PS0, "b3": PS0}


def test_single_puts_everything_on_one_device(cluster):
    plan = PlacementPlan.single(MASTER, cluster)
    assert set(plan.placement(MLP).values()) == {MASTER} and plan.compute == MASTER


def test_manual_overrides_win_and_wildcards_match(cluster):
    plan = PlacementPlan.round_robin(cluster, variables=MLP)
    plan.assign("b*", PS1).assign("w2", "ps:0")
    placed = plan.placement(MLP)
    assert placed["b1"] == placed["b2"] == placed["b3"] == PS1 and placed["w2"] == PS0


def test_variables_land_where_the_plan_says_in_the_graph_and_on_the_wire(cluster):
    plan = PlacementPlan.by_layer(cluster, compute="master:0")
    graph = tf.Graph()
    with graph.as_default(), plan.scope():
        (train, loss), feed = mlp_builder()
        init = tf.compat.v1.global_variables_initializer()
        devices = {v.op.name: v.device for v in tf.compat.v1.global_variables()}
    assert {n: devices[n] for n in ("w1", "b1", "w2", "b2", "w3", "b3")} == {
        "w1": PS0, "b1": PS0, "w2": PS1, "b2": PS1, "w3": PS0, "b3": PS0}
    assert devices["w2/Adam"] == PS1 and devices["beta1_power"] == PS0  # slots follow
    assert set(plan.assignments) == {"w1", "b1", "w2", "b2", "w3", "b3"}
    assert loss.device == MASTER
    with tf.compat.v1.Session(cluster.target("master"), graph=graph) as session:
        session.run(init)
        step = dtflab.trace(session, loss, feed)
    to_master = {short_device(src): n for (src, dst), n in step.bytes_between().items()
                 if short_device(dst) == "master:0"}
    assert to_master == {"ps:0": 4 * (16 + 16 + 32 + 1), "ps:1": 4 * (16 * 32 + 32)}


def test_plan_round_trips_through_a_dict_and_through_its_code(cluster):
    plan = PlacementPlan.greedy(cluster, variables=SIZES).assign("e", PS0)
    again = PlacementPlan.from_dict(plan.to_dict(), cluster)
    assert again == plan
    namespace = {"PlacementPlan": PlacementPlan, "cluster": cluster}
    exec(plan.to_code(), namespace)
    assert namespace["plan"].placement(SIZES) == plan.placement(SIZES)


@pytest.mark.parametrize("call, message", [
    (lambda c: PlacementPlan(c).assign("w1", "/job:ps/task:5"),
     r"unknown device '/job:ps/task:5'; this cluster has: /job:master/task:0, /job:ps/task:0, /job:ps/task:1"),
    (lambda c: PlacementPlan(c, compute="/job:worker/task:0"), r"unknown device '/job:worker/task:0'"),
    (lambda c: PlacementPlan.round_robin(c, job="pss"), r"no job 'pss' in this cluster \(did you mean 'ps'\?\)"),
    (lambda c: PlacementPlan(c).use_strategy("greedyy"), r"unknown strategy 'greedyy' \(did you mean 'greedy'\?\)"),
    (lambda c: PlacementPlan(c).assign("w1", 3), r"a device is a string like '/job:ps/task:0', got 3"),
])
def test_bad_devices_name_the_value_and_the_valid_ones(cluster, call, message):
    with pytest.raises(ValueError, match=message):
        call(cluster)


def test_placement_map_has_a_cell_per_variable_and_device_totals(cluster):
    plan = PlacementPlan.greedy(cluster, variables=SIZES)
    fig = placement_figure(plan, SIZES)
    (cells,) = fig.select(name="cells")
    (totals,) = fig.select(name="totals")
    assert cells.data_source.data["variable"] == [v.name for v in SIZES]
    assert totals.data_source.data["label"] == ["0", "140", "116"]
    assert "imbalance 1.09" in fig.title.text


def front_end(editor, **message):
    """Send ``editor`` a message as the page does (the board's ``model.send``)."""
    editor.board._handle_custom_msg(message, [])


@pytest.mark.slow
def test_board_and_plan_stay_in_sync_both_ways(cluster):
    from jupyter_bokeh import BokehModel

    from dtflab import PlacementEditor

    editor = PlacementEditor(cluster, mlp_builder, PlacementPlan.round_robin(cluster, compute=MASTER),
                             apply=False, debounce_s=60)
    assert [chip["name"] for chip in editor.board.chips] == ["w1", "b1", "w2", "b2", "w3", "b3"]
    front_end(editor, kind="move", name="w2", device=PS1)   # the user drags w2
    assert editor.plan.device_for("w2") == PS1 and editor.device_of("w2") == PS1
    editor.plan.assign("b3", PS1)                            # Python moves b3: the chip follows
    assert editor.device_of("b3") == PS1
    assert editor.board.loads[PS1] == sum(c["bytes"] for c in editor.board.chips if c["device"] == PS1)
    front_end(editor, kind="strategy", strategy="single")    # a strategy button
    assert {chip["device"] for chip in editor.board.chips} == {MASTER}
    editor.apply()
    assert editor.step is not None and editor.step.transfers == []
    assert isinstance(editor.views.children[0], BokehModel)
    assert editor.board.history[-1]["bytes"] == 0
    assert editor.board.history[-1]["change"] == "strategy: All on compute device"
    front_end(editor, kind="undo")                           # back to w2 and b3 on ps:1
    assert editor.device_of("w2") == PS1 and editor.device_of("b3") == PS1
    assert editor.board.can_undo
    front_end(editor, kind="move", name="w2", device="/job:ps/task:7")
    assert "unknown device" in editor.board.status and editor.device_of("w2") == PS1
    editor.close()


@pytest.mark.slow
def test_a_move_on_the_board_traces_a_step_once_the_moves_settle(cluster):
    from dtflab import PlacementEditor

    editor = PlacementEditor(cluster, mlp_builder, PlacementPlan.single(MASTER, cluster),
                             debounce_s=0.3)
    assert [row["change"] for row in editor.board.history] == ["start"]
    assert editor.board.history[0]["bytes"] == 0
    front_end(editor, kind="move", name="w1", device=PS0)
    front_end(editor, kind="move", name="w2", device=PS1)   # within the debounce: one trace
    assert wait_until(lambda: len(editor.board.history) == 2, timeout=30)
    editor.wait(timeout=30)  # the last change's trace: no second one followed
    assert len(editor.board.history) == 2
    row = editor.board.history[1]
    assert row["change"] == "w2 → ps:1" and row["bytes"] > 0 and row["step_ms"] > 0
    assert row["bytes"] == sum(t.nbytes for t in editor.step.transfers)
    editor.close()


TF2_SCRIPT = """
import dtflab
from dtflab import PlacementPlan
from dtflab import train
from dtflab._quiet import import_tf
tf = import_tf()
with dtflab.start_cluster(jobs="worker=1,ps=2") as cluster:
    cluster.connect()
    plan = PlacementPlan.round_robin(cluster, job="ps").assign("bias", "ps:1")
    with plan.scope():
        kernel = tf.Variable(tf.ones([4, 4]), name="kernel")
        other = tf.Variable(tf.zeros([2]), name="other")
        bias = tf.Variable(tf.zeros([4]), name="bias")
    print(kernel.device); print(other.device); print(bias.device)
"""


@pytest.mark.slow
def test_tf2_variables_are_placed_through_a_variable_creator():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", TF2_SCRIPT], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["/job:ps/replica:0/task:0/device:CPU:0",
                                  "/job:ps/replica:0/task:1/device:CPU:0",
                                  "/job:ps/replica:0/task:1/device:CPU:0"]
