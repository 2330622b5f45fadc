"""The graph a run will execute, read before it runs: every op with its task, its inputs, its
arithmetic and the bytes it reads and writes, and every edge that crosses tasks with its bytes
(what ``planner.executor`` prices and simulates).

The loop's graph is imported again with its placeholders fixed to the batch's shapes, so
TensorFlow's own shape functions give every tensor's size; only the ops that the step's fetches
need are kept, as a session prunes them. What it cannot see: the rewrites TensorFlow makes when
the step first runs (Grappler folds constants and shape arithmetic, fuses a bias into its
multiply; oneDNN swaps kernels), so the ops here are the graph's, a few more than run.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtflab import names
from dtflab._quiet import import_tf

#: Ops that move no bytes of their own (a view, a handle, a shape, a constant, a marker): they
#: cost the executor's fixed cost alone.
FREE = frozenset({
    "Const", "Identity", "IdentityN", "NoOp", "Shape", "ShapeN", "Size", "Rank", "Reshape",
    "Squeeze", "ExpandDims", "StopGradient", "Snapshot", "ReadVariableOp", "VarHandleOp",
    "VariableV2", "Placeholder", "PlaceholderWithDefault", "BroadcastGradientArgs",
    "VarIsInitializedOp", "ZerosLike", "OnesLike", "Fill", "Range", "Pack", "Unpack",
    "StridedSlice", "Slice", "Cast", "AssignVariableOp", "AssignAddVariableOp",
    "PreventGradient", "EnsureShape", "Where", "Switch", "Merge", "Enter", "Exit"})
#: Ops that do a matrix multiply (their arithmetic: 2·m·k·n per batch entry).
MATRIX = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
#: Element-wise ops dear per element (a polynomial or a table each), priced apart.
TRANSCENDENTAL = frozenset({
    "Tanh", "TanhGrad", "Exp", "Log", "Rsqrt", "RsqrtGrad", "Sqrt", "SqrtGrad", "Erf",
    "Sigmoid", "SigmoidGrad", "Softmax", "LogSoftmax", "Reciprocal", "Pow", "Gelu",
    "SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits", "Log1p", "Softplus"})
#: Reductions (read a tensor, write one much smaller).
REDUCE = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "ArgMax", "ArgMin", "All", "Any"})
#: Ops that move a tensor's elements without arithmetic.
MOVE = frozenset({"Transpose", "ConcatV2", "Split", "SplitV", "GatherV2", "ResourceGather",
                  "Pad", "Tile", "OneHot", "UnsortedSegmentSum", "ScatterNd", "TensorScatterAdd",
                  "TensorScatterUpdate", "MirrorPad", "Roll", "ReverseV2", "TopKV2",
                  "GatherNd", "DynamicStitch", "DynamicPartition", "BroadcastTo"})
#: An optimizer's fused update: reads the variable, its slots and the gradient; writes three.
UPDATE = frozenset({"ResourceApplyAdam", "ResourceApplyGradientDescent", "ResourceApplyMomentum",
                    "ResourceApplyAdagrad", "ResourceApplyRMSProp", "ResourceApplyAdamWithAmsgrad"})


def kind(op_type: str) -> str:
    """The price class of an op type: ``free``, ``matrix``, ``transcendental``, ``reduce``,
    ``move``, ``update`` or ``elementwise`` (everything else)."""
    for name, types in (("free", FREE), ("matrix", MATRIX), ("transcendental", TRANSCENDENTAL),
                        ("reduce", REDUCE), ("move", MOVE), ("update", UPDATE)):
        if op_type in types:
            return name
    return "elementwise"


@dataclass(frozen=True)
class GraphOp:
    """One op of the step: its task (``worker:1``), its price class, its arithmetic (FLOPs),
    the bytes it reads and writes, each output's bytes, and the ops it waits for (data and
    control inputs, by name)."""

    name: str
    type: str
    task: str
    kind: str
    flops: float
    nbytes: float
    outputs: tuple[int, ...]
    inputs: tuple[tuple[str, int], ...]  # (producer, output index), data edges
    after: tuple[str, ...]  # control inputs


def _size(tensor) -> int:
    shape = tensor.shape
    if shape.rank is None:
        return 0
    count = 1
    for dim in shape.as_list():
        count *= dim if dim is not None and dim > 0 else 1
    try:
        return count * tensor.dtype.size
    except (TypeError, ValueError):  # a resource or variant handle
        return 0


def _flops(op) -> float:
    if op.type not in MATRIX:
        return 0.0
    a, out = op.inputs[0].shape.as_list(), op.outputs[0].shape.as_list()
    if None in a or None in out:
        return 0.0
    transposed = op.get_attr("transpose_a") if op.type == "MatMul" else op.get_attr("adj_x")
    inner = a[-2] if transposed else a[-1]
    count = 1
    for dim in out:
        count *= dim
    return 2.0 * count * inner


def step_ops(graph, fetches, feeds: dict, default_task: str) -> list[GraphOp]:
    """The ops ``fetches`` (ops or tensors of ``graph``) need, with ``feeds`` (each
    placeholder tensor and the array fed to it) fixing the shapes, in the graph's order; an op
    with no device runs on ``default_task`` (``worker:0``), as the master places it."""
    tf = import_tf()
    fixed = tf.Graph()
    with fixed.as_default():
        given = {}
        for i, (tensor, value) in enumerate(feeds.items()):
            with tf.device(tensor.device):
                given[tensor.name] = tf.compat.v1.placeholder(tensor.dtype, value.shape,
                                                              name=f"fed_{i}")
        tf.compat.v1.import_graph_def(graph.as_graph_def(), input_map=given, name="")
    fed_as = {tensor.op.name: given[tensor.name].op.name for tensor in feeds}
    wanted = []
    for fetch in fetches:
        name = fetch.name if hasattr(fetch, "type") else fetch.op.name
        wanted.append(fixed.get_operation_by_name(fed_as.get(name, name)))
    needed, stack = set(), list(wanted)
    while stack:
        op = stack.pop()
        if op.name in needed:
            continue
        needed.add(op.name)
        stack.extend(tensor.op for tensor in op.inputs)
        stack.extend(op.control_inputs)
    found = []
    for op in fixed.get_operations():
        if op.name not in needed:
            continue
        task = names.task(op.device) if op.device else default_task
        price = kind(op.type)
        outputs = tuple(_size(t) for t in op.outputs)
        if price == "free":
            nbytes = 0.0
        elif price == "update":  # the variable and its slots read and written, the gradient read
            slots = sum(1 for t in op.inputs if t.dtype == tf.resource)
            variable = _size(op.inputs[-1])
            nbytes = float(variable * (2 * slots + 1))
        else:
            nbytes = float(sum(_size(t) for t in op.inputs) + sum(outputs))
        found.append(GraphOp(op.name, op.type, task, price, _flops(op), nbytes, outputs,
                             tuple((t.op.name, t.value_index) for t in op.inputs),
                             tuple(c.name for c in op.control_inputs)))
    return found
