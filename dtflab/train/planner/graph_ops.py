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

import copy
from dataclasses import dataclass, replace

from dtflab import names
from dtflab._quiet import import_tf
from dtflab.train.measure.flops import needed as needed_by

#: Ops that move no bytes of their own (a view, a handle, a shape, a constant, a marker): they
#: cost the executor's fixed cost alone.
FREE = frozenset({
    "Const", "Identity", "IdentityN", "NoOp", "Shape", "ShapeN", "Size", "Rank", "Reshape",
    "Squeeze", "ExpandDims", "StopGradient", "Snapshot", "ReadVariableOp", "VarHandleOp",
    "VariableV2", "Placeholder", "PlaceholderWithDefault", "BroadcastGradientArgs",
    "VarIsInitializedOp", "AssignVariableOp", "PreventGradient", "EnsureShape", "Switch",
    "Merge", "Enter", "Exit"})
#: Ops that do a matrix multiply (their arithmetic: 2·m·k·n per batch entry).
MATRIX = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
#: Element-wise ops dear per element (a polynomial or a table each), priced apart.
TRANSCENDENTAL = frozenset({
    "Tanh", "TanhGrad", "Exp", "Log", "Rsqrt", "RsqrtGrad", "Sqrt", "SqrtGrad", "Erf",
    "Sigmoid", "SigmoidGrad", "Softmax", "LogSoftmax", "Reciprocal", "Pow", "Gelu",
    "SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits", "Log1p", "Softplus"})
#: Reductions (read a tensor, write one much smaller).
REDUCE = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "ArgMax", "ArgMin", "All", "Any"})
#: Ops that write a whole output from part of it (the gradient of a slice, a scatter): zeros
#: laid down, then the part copied in, element by element.
SCATTER = frozenset({"StridedSliceGrad", "ScatterNd", "UnsortedSegmentSum", "TensorScatterAdd",
                     "TensorScatterUpdate", "SliceGrad"})
#: Ops that move a tensor's elements without arithmetic.
MOVE = frozenset({"Transpose", "ConcatV2", "Split", "SplitV", "GatherV2", "ResourceGather",
                  "StridedSlice", "Slice", "Pack", "Unpack", "Fill",
                  "ZerosLike", "OnesLike", "Where", "Range", "Cast",
                  "Pad", "Tile", "OneHot", "MirrorPad", "Roll", "ReverseV2", "TopKV2",
                  "GatherNd", "DynamicStitch", "DynamicPartition", "BroadcastTo"})
#: TensorFlow's collective ops (the worker programs'): priced as bytes on the wire and a cost a
#: call, each starting once every member of its group has its inputs.
COLLECTIVE = frozenset({"CollectiveGatherV2", "CollectiveReduceV2", "CollectiveBcastSendV2",
                        "CollectiveBcastRecvV2", "CollectiveAllToAllV2"})
#: An optimizer's fused update: reads the variable, its slots and the gradient; writes three.
UPDATE = frozenset({"ResourceApplyAdam", "ResourceApplyGradientDescent", "ResourceApplyMomentum",
                    "ResourceApplyAdagrad", "ResourceApplyRMSProp", "ResourceApplyAdamWithAmsgrad"})


def kind(op_type: str) -> str:
    """The price class of an op type: ``free``, ``matrix``, ``transcendental``, ``reduce``,
    ``scatter``, ``move``, ``update``, ``collective`` or ``elementwise`` (everything else)."""
    for name, types in (("free", FREE), ("matrix", MATRIX), ("transcendental", TRANSCENDENTAL),
                        ("reduce", REDUCE), ("scatter", SCATTER), ("move", MOVE),
                        ("update", UPDATE), ("collective", COLLECTIVE)):
        if op_type in types:
            return name
    return "elementwise"


@dataclass(frozen=True)
class GraphOp:
    """One op of the step: its task (``worker:1``), its price class, its arithmetic (FLOPs;
    ``unit_flops``: one multiply's of a batch of them, what its rate depends on), the bytes it
    reads and writes (a collective: the bytes it puts on the wire or takes off it), each
    output's bytes, and the ops it waits for (data and control inputs, by name); a
    collective's ``group``: its group and instance keys, the same on every member."""

    name: str
    type: str
    task: str
    kind: str
    flops: float
    nbytes: float
    outputs: tuple[int, ...]
    inputs: tuple[tuple[str, int], ...]  # (producer, output index), data edges
    after: tuple[str, ...]  # control inputs
    unit_flops: float = 0.0
    group: tuple = ()


def _shape(tensor, shapes: dict) -> list | None:
    if tensor.name in shapes:
        return list(shapes[tensor.name])
    return tensor.shape.as_list() if tensor.shape.rank is not None else None


def _size(tensor, shapes: dict) -> int:
    shape = _shape(tensor, shapes)
    if shape is None:
        return 0
    count = 1
    for dim in shape:
        count *= dim if dim is not None and dim > 0 else 1
    try:
        return count * tensor.dtype.size
    except (TypeError, ValueError):  # a resource or variant handle
        return 0


def _flops(op, shapes: dict) -> tuple[float, float]:
    """A multiply's FLOPs, and one of its batch's (the whole, for a plain MatMul)."""
    if op.type not in MATRIX:
        return 0.0, 0.0
    a, out = _shape(op.inputs[0], shapes), _shape(op.outputs[0], shapes)
    if a is None or out is None or None in a or None in out:
        return 0.0, 0.0
    transposed = op.get_attr("transpose_a") if op.type == "MatMul" else op.get_attr("adj_x")
    inner = a[-2] if transposed else a[-1]
    count = 1
    for dim in out:
        count *= dim
    unit = 2.0 * out[-1] * (out[-2] if len(out) > 1 else 1) * inner
    return 2.0 * count * inner, unit


def step_ops(graph, fetches, feeds: dict, default_task: str, init=None,
             before=()) -> list[GraphOp]:
    """The ops ``fetches`` (ops or tensors of ``graph``) need, with ``feeds`` (each
    placeholder tensor and the array fed to it) fixing the shapes, in the graph's order; an op
    with no device runs on ``default_task`` (``worker:0``), as the master places it. Where a
    shape depends on the data (a mixture's dispatch, which follows what its router has
    learned), the tensors are computed in this process, on a copy of the graph, and their
    shapes read: ``init`` (the graph's initializer) run first, then ``before``, the updates
    the run makes before the step predicted, each ``(op, feeds)``. Only their shapes are
    taken from that run, never its time."""
    tf = import_tf()
    fixed = tf.Graph()
    with fixed.as_default():
        given = {}
        for i, (tensor, value) in enumerate(feeds.items()):
            with tf.device(tensor.device):
                given[tensor.name] = tf.compat.v1.placeholder(tensor.dtype, value.shape,
                                                              name=f"fed_{i}")
        definition = graph.as_graph_def()
        tf.compat.v1.import_graph_def(definition, input_map=given, name="")
    fed_as = {tensor.op.name: given[tensor.name].op.name for tensor in feeds}
    wanted = []
    for fetch in fetches:
        name = fetch.name if hasattr(fetch, "type") else fetch.op.name
        wanted.append(fixed.get_operation_by_name(fed_as.get(name, name)))
    needed = needed_by(wanted)
    shapes = _data_shapes(definition, needed.values(), feeds, init, before)
    return _read(fixed, needed, shapes, _placed(fixed, needed, default_task))


def function_ops(function, task: str) -> list[GraphOp]:
    """The ops a traced ``tf.function`` (its concrete function, every shape known) runs on
    one ``task``, as a worker program runs its step: what its outputs and its stateful ops
    need. Its arguments (the batch, the captured variables) become ``_Arg`` ops, handed over
    by the call, not fed; a collective's bytes are what it sends or receives
    (:func:`wire_bytes`)."""
    graph = function.graph
    needed = needed_by([t.op for t in function.outputs] + list(graph.control_outputs))
    found = _read(graph, needed, {}, {name: task for name in needed})
    return [replace(op, type="_Arg") if op.type == "Placeholder" else op for op in found]


def on_worker(ops, index: int) -> list[GraphOp]:
    """``ops`` as worker ``index``'s copy: on task ``worker:<index>``, named ``w<index>/...``
    (its inputs and control inputs too), to be simulated beside the other workers' copies."""
    prefix = f"w{index}/"
    return [replace(op, name=prefix + op.name, task=f"worker:{index}",
                    inputs=tuple((prefix + name, k) for name, k in op.inputs),
                    after=tuple(prefix + name for name in op.after)) for op in ops]


def wire_bytes(op) -> float:
    """A collective's bytes through its task: a gather receives the other N - 1 members'
    inputs; a broadcast sends or receives its tensor once; a ring all-reduce sends
    2 (N - 1) / N of it."""
    n = _inputs(op)["group_size"]
    size = _size(op.outputs[0] if op.type == "CollectiveBcastRecvV2" else op.inputs[0], {})
    return {"CollectiveGatherV2": (n - 1) * size, "CollectiveReduceV2": 2 * (n - 1) / n * size,
            "CollectiveAllToAllV2": (n - 1) / n * size}.get(op.type, size)


def _inputs(op) -> dict:
    """A collective's constant inputs by name (``group_size``, ``group_key``, ...)."""
    tf = import_tf()
    found = {}
    for arg, tensor in zip(op.op_def.input_arg, op.inputs):
        value = tf.get_static_value(tensor)
        if value is not None and getattr(value, "ndim", 1) == 0:
            found[arg.name] = int(value)
    return found


def _group(op) -> tuple:
    """A collective's group and instance keys: one collective, the same on every member."""
    keys = _inputs(op)
    return keys["group_key"], keys["instance_key"]


def _read(graph, needed, shapes: dict, placed: dict) -> list[GraphOp]:
    """``needed``'s ops of ``graph`` as GraphOps, in the graph's order."""
    tf = import_tf()
    found = []
    for op in graph.get_operations():
        if op.name not in needed:
            continue
        task = placed[op.name]
        price = kind(op.type)
        outputs = tuple(_size(t, shapes) for t in op.outputs)
        group = ()
        if price == "free":
            nbytes = 0.0
        elif price == "collective":
            nbytes, group = float(wire_bytes(op)), _group(op)
        elif price == "update":  # the variable and its slots read and written, the gradient read
            slots = sum(1 for t in op.inputs if t.dtype == tf.resource)
            variable = _size(op.inputs[-1], shapes)
            nbytes = float(variable * (2 * slots + 1))
        else:
            nbytes = float(sum(_size(t, shapes) for t in op.inputs) + sum(outputs))
        flops, unit = _flops(op, shapes)
        found.append(GraphOp(op.name, op.type, task, price, flops, nbytes, outputs,
                             tuple((t.op.name, t.value_index) for t in op.inputs),
                             tuple(c.name for c in op.control_inputs), unit, group))
    return found


def _placed(graph, needed, default_task: str) -> dict:
    """Each op's task as TensorFlow's placer will set it: an op that reads or writes a
    variable goes where the variable is, whatever device it asked for (a resource cannot
    leave its task); an op with no inputs and no device (a constant) goes to its first
    consumer's task; any other op with no device to ``default_task``."""
    tf = import_tf()
    task = {}
    for op in graph.get_operations():
        if op.name not in needed:
            continue
        resources = [t.op.name for t in op.inputs if t.dtype == tf.resource]
        if resources and resources[0] in task:
            task[op.name] = task[resources[0]]
        elif op.device:
            task[op.name] = names.task(op.device)
        else:
            task[op.name] = default_task
    for op in graph.get_operations():
        if op.name in needed and not op.device and not op.inputs:
            consumers = [c for t in op.outputs for c in t.consumers() if c.name in needed]
            if consumers:
                task[op.name] = task[consumers[0].name]
    return task


def values_after(graph, tensors, feeds: dict, init, before=()) -> list:
    """The values of ``tensors`` (of ``graph``) at the step predicted, ``feeds`` fed: computed
    in this process on a copy of the graph with its devices cleared, after ``init`` and the
    updates ``before`` (see :func:`step_ops`)."""
    return _on_a_copy(graph.as_graph_def(), [t.name for t in tensors], feeds, init, before)


def _data_shapes(definition, ops, feeds: dict, init, before=()) -> dict:
    """``{tensor name: shape}`` of the float tensors among ``ops``' outputs whose shapes
    TensorFlow cannot tell before the data (none for most graphs), from a copy of the graph
    (``definition``, its GraphDef; :func:`values_after`)."""
    unknown = [t.name for op in ops for t in op.outputs
               if t.dtype.is_floating and not t.shape.is_fully_defined()]
    if not unknown:
        return {}
    values = _on_a_copy(definition, unknown, feeds, init, before)
    return {name: value.shape for name, value in zip(unknown, values)}


def _on_a_copy(definition, names: list[str], feeds: dict, init, before) -> list:
    tf = import_tf()
    definition = copy.deepcopy(definition)
    for node in definition.node:
        node.device = ""
    local = tf.Graph()
    with local.as_default():
        tf.compat.v1.import_graph_def(definition, name="")
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=local, config=config) as session:
        if init is not None:
            session.run(local.get_operation_by_name(init.name))
        for op, fed in before:
            session.run(local.get_operation_by_name(op.name),
                        {local.get_tensor_by_name(t.name): v for t, v in fed.items()})
        return session.run([local.get_tensor_by_name(name) for name in names],
                           {local.get_tensor_by_name(t.name): v for t, v in feeds.items()})
