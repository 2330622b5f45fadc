"""Place a step's ops for drawing: a lane per device, columns by dependency depth.

Large graphs are collapsed by name scope: each (device, top-level scope) becomes one node, with
edges and bytes summed; scopes named in ``expand`` are shown one level deeper.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

from dtflab.tracing.step import StepTrace


@dataclass
class Node:
    key: tuple[str, str]  # (device, name or scope)
    label: str
    device: str
    ops: list = field(default_factory=list)
    x: float = 0.0
    y: float = 0.0

    @property
    def is_group(self) -> bool:
        return len(self.ops) > 1 or self.label.endswith("/")


@dataclass
class Edge:
    src: tuple[str, str]
    dst: tuple[str, str]
    nbytes: int = 0
    tensors: list = field(default_factory=list)  # Transfer objects, for cross-device edges

    @property
    def crosses_devices(self) -> bool:
        return self.src[0] != self.dst[0]


@dataclass
class GraphLayout:
    devices: list[str]
    nodes: dict[tuple[str, str], Node]
    edges: list[Edge]
    collapsed: bool
    width: int


def _group_name(op_name: str, expand: tuple[str, ...]) -> str:
    parts = op_name.split("/")
    if len(parts) == 1:
        return "(top level)/"
    depth = 1
    while depth < len(parts) - 1 and "/".join(parts[:depth]) in expand:
        depth += 1
    if depth == len(parts) - 1 and "/".join(parts[:depth]) in expand:
        return op_name  # an op directly inside an open scope: itself
    return "/".join(parts[:depth]) + "/"


def _depths(step: StepTrace) -> dict[tuple[str, str], int]:
    """Longest-path depth of every non-transfer op, cross-device edges included."""
    parents: dict[tuple[str, str], set] = collections.defaultdict(set)
    ops = {(op.device, op.name): op for op in step.ops()}
    for (device, _), op in ops.items():
        for name in op.inputs:
            if (device, name) in ops:
                parents[device, op.name].add((device, name))
    for transfer in step.transfers:
        for consumer in transfer.consumers:
            if (transfer.src_device, transfer.producer) in ops:
                parents[transfer.dst_device, consumer].add((transfer.src_device, transfer.producer))
    depth: dict[tuple[str, str], int] = {}

    def visit(key, trail=()):
        if key in depth:
            return depth[key]
        if key in trail:  # cannot happen in a TF step graph; guard against odd input
            return 0
        depth[key] = 0 if not parents[key] else 1 + max(visit(p, trail + (key,)) for p in parents[key])
        return depth[key]

    for key in ops:
        visit(key)
    return depth


def layout_graph(step: StepTrace, *, max_ops: int = 150, expand=()) -> GraphLayout:
    """Node positions and edges for ``step``; collapses by scope above ``max_ops`` ops."""
    import sys

    expand = tuple(scope.rstrip("/") for scope in expand)
    ops = step.ops()
    collapsed = len(ops) > max_ops
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(ops) + 1000))
    depth = _depths(step)
    nodes: dict[tuple[str, str], Node] = {}
    member: dict[tuple[str, str], tuple[str, str]] = {}
    for op in ops:
        name = _group_name(op.name, expand) if collapsed else op.name
        key = (op.device, name)
        nodes.setdefault(key, Node(key, name, op.device)).ops.append(op)
        member[op.device, op.name] = key
    edges: dict[tuple, Edge] = {}
    for op in ops:
        for name in op.inputs:
            src = member.get((op.device, name))
            dst = member[op.device, op.name]
            if src is not None and src != dst:
                edges.setdefault((src, dst), Edge(src, dst))
    for transfer in step.transfers:
        src = member.get((transfer.src_device, transfer.producer))
        for consumer in transfer.consumers or ("",):
            dst = member.get((transfer.dst_device, consumer))
            if src is None or dst is None:
                continue
            edge = edges.setdefault((src, dst), Edge(src, dst))
            edge.nbytes += transfer.nbytes
            edge.tensors.append(transfer)
    # Columns: the (rank of the) median depth of a node's ops. A scope's variables and
    # constants sit at depth 0, so its smallest depth would put every scope in column 0.
    levels = {key: statistics.median_low(sorted(depth.get((op.device, op.name), 0) for op in node.ops))
              for key, node in nodes.items()}
    rank = {level: i for i, level in enumerate(sorted(set(levels.values())))}
    devices = step.devices
    lane = {device: -i for i, device in enumerate(devices)}
    stacks: dict[tuple[str, int], list[Node]] = collections.defaultdict(list)
    for key, node in nodes.items():
        node.x = float(rank[levels[key]])
        stacks[node.device, rank[levels[key]]].append(node)
    for (device, _), stack in stacks.items():
        for i, node in enumerate(sorted(stack, key=lambda n: n.label)):
            offset = 0.0 if len(stack) == 1 else -0.38 + 0.76 * i / (len(stack) - 1)
            node.y = lane[device] + offset
    return GraphLayout(devices, nodes, list(edges.values()), collapsed, len(rank))
