"""What each device held in one traced training step, by kind, in bytes: what the runtime
allocated, to set beside ``formulas.memory``'s prediction.

Read from the step's ``RunMetadata`` (FULL_TRACE): the partition graphs and the allocator
records (each op's allocations and frees, with their times) on each device.

- **parameters** and **optimizer** state: the variables each device's partition holds, from
  their shapes and types (``VarHandleOp``); a variable whose name ends in Adam's slot names
  (``/Adam``, ``/Adam_1``) or is a beta power is the optimizer's. They are allocated when
  initialised, before the step: its records do not show them.
- **gradients**: the tensors the optimizer's apply ops read, as the step allocated them.
- **weight copies**: what the forward's casts of a variable's value (its 16-bit copy, read
  where the variable is or received from its task) still held when the forward pass ended.
- **activations**: the other bytes forward ops had allocated and not yet freed when the forward
  pass ended (the end of the last forward op that allocated more than a scalar): what the
  forward keeps for the backward, and the last forward op's outputs. With micro-batches, the
  most one micro-batch's forward ops held at the end of its forward. Between tasks, two
  corrections from the outputs' buffer addresses (``_transport_bytes``): a buffer that only
  the gRPC transport still holds for a send is not counted, and a received buffer that an
  in-place op took over, and that is read after the forward ended, is.
- **peak**: the most bytes the step's ops held at once (the variables not counted).

Cannot see: memory TensorFlow allocates outside its allocator (Eigen's thread pools, gRPC), or
a run without FULL_TRACE; a view at an offset into a buffer (a slice a task sends) is not
traced to the buffer, so a buffer held only through one still counts.
"""

from __future__ import annotations

import collections
import math
import re
from dataclasses import dataclass

from dtflab import names
from dtflab.tracing.parse import dtype_name, itemsize
from dtflab.train.formulas.memory import KINDS

#: Ops of the backward pass and the optimizer, by name: ``tf.gradients``, ``minimize``, and the
#: loops' own scopes for gradients (micro-batches' ``accumulate``; the ``data_sum`` of a
#: gradient's data-parallel copies; a tied parameter's ``tied_sum``; a gradient's ``encode``
#: for the wire). A loop's op on gradients outside them reads as a forward op.
BACKWARD = re.compile(r"(^|/)(gradients|Adam|accumulate|data_sum|tied_sum|encode)(_\d+)?(/|$)")
MICRO_BATCH = re.compile(r"^micro_batch(\d+)/")
OPTIMIZER_STATE = re.compile(r"(/Adam(_\d+)?|^beta[12]_power(_\d+)?)$")
APPLY_OPS = {"ResourceApplyAdam": 9, "ApplyAdam": 9}  # the index of the gradient input


def step_memory(metadata) -> dict[str, dict[str, int]]:
    """``{device: {"parameters", "weight_copies", "gradients", "optimizer", "activations",
    "peak"}}`` in bytes
    for the step ``metadata`` traced, devices by their short names (``worker:0``; see the
    module's docstring)."""
    found = collections.defaultdict(lambda: dict.fromkeys((*KINDS, "peak"), 0))
    producers = {}  # (op, slot) -> bytes, from the step's records
    for dev in metadata.step_stats.dev_stats:
        for stats in dev.node_stats:
            for output in stats.output:
                producers[stats.node_name, output.slot] = (
                    output.tensor_description.allocation_description.requested_bytes)
    for graph in metadata.partition_graphs:
        for node in graph.node:
            held = found[names.short(node.device)]
            if node.op == "VarHandleOp":
                kind = "optimizer" if OPTIMIZER_STATE.search(node.name) else "parameters"
                held[kind] += _variable_bytes(node)
            elif node.op in APPLY_OPS:
                op, _, slot = node.input[APPLY_OPS[node.op]].partition(":")
                held["gradients"] += producers.get((op, int(slot or 0)), 0)
    stats = collections.defaultdict(list)  # a device's ops can come in several dev_stats
    for dev in metadata.step_stats.dev_stats:
        stats[names.short(dev.device)].extend(dev.node_stats)
    wiring = _Wiring(metadata.partition_graphs)
    for device, node_stats in stats.items():
        held = found[device]
        held["activations"], held["weight_copies"], held["peak"] = _live_bytes(node_stats,
                                                                               wiring)
    return {device: held for device, held in found.items() if any(held.values())}


def _forward_part(name: str) -> str | None:
    """The micro-batch a forward op belongs to ("" without micro-batches); None: a backward op."""
    if BACKWARD.search(name):
        return None
    micro_batch = MICRO_BATCH.match(name)
    return micro_batch.group(1) if micro_batch else ""


def _live_bytes(node_stats, wiring: _Wiring) -> tuple[int, int, int]:
    """(forward bytes live when the forward ended, besides the weight copies; the weight
    copies' then; the most bytes live at once); with micro-batches, what one micro-batch's
    forward ops held at the end of its forward, the micro-batch that held the most."""
    records, forward_ends = [], collections.defaultdict(int)  # micro-batch -> its forward's end
    for stats in node_stats:
        forward = _forward_part(stats.node_name)
        copy = stats.node_name in wiring.copies
        allocated = 0
        for memory in stats.memory:
            for record in memory.allocation_records:
                records.append((record.alloc_micros, record.alloc_bytes, forward, copy))
                allocated += max(record.alloc_bytes, 0)
        if forward is not None and allocated > 64:
            forward_ends[forward] = max(forward_ends[forward],
                                        stats.all_start_micros + stats.op_end_rel_micros)
    records.sort(key=lambda record: record[0])
    live = peak = 0
    for _, change, _, _ in records:
        live += change
        peak = max(peak, live)

    def held(key, end, copies):  # one batch: every forward op's; micro-batches: each one's own
        return sum(change for when, change, part, copy in records if copy == copies
                   and when <= end and part is not None and (part == key or not key))

    kept = [(held(key, end, False) + _transport_bytes(node_stats, wiring, key, end),
             held(key, end, True)) for key, end in forward_ends.items()]
    activations, copies = max(kept, key=sum, default=(0, 0))
    return activations, copies, peak


class _Wiring:
    """Who reads what, from the partition graphs: each op's input tensors, each tensor's
    readers, the ``_Send`` ops (the gRPC transport holds what they send until it is written)
    and the ops that read a received activation (a received tensor's buffer is the
    transport's: no allocation record shows it; a received variable's value is a parameter).
    """

    def __init__(self, partition_graphs):
        self.inputs = collections.defaultdict(list)  # op -> [(op, slot)]
        self.readers = collections.defaultdict(list)  # (op, slot) -> [op]
        self.sends, self.reads_received = set(), set()
        nodes = {node.name: node for graph in partition_graphs for node in graph.node}
        sent_variables = {node.attr["tensor_name"].s for node in nodes.values()
                          if node.op == "_Send" and node.input
                          and _reads_variable(nodes, node.input[0].partition(":")[0])}
        # a received activation; a received parameter (a copy of a variable) is no activation
        receives = {node.name for node in nodes.values() if node.op == "_Recv"
                    and node.attr["tensor_name"].s not in sent_variables}
        received_variables = {node.name for node in nodes.values() if node.op == "_Recv"
                              and node.attr["tensor_name"].s in sent_variables}
        #: the casts of a variable's value: its 16-bit copies
        self.copies = {node.name for node in nodes.values() if node.op == "Cast" and node.input
                       and (_reads_variable(nodes, source := node.input[0].partition(":")[0],
                                            constants=False)
                            or source in received_variables)}
        for graph in partition_graphs:
            for node in graph.node:
                if node.op == "_Send":
                    self.sends.add(node.name)
                for tensor in node.input:
                    if tensor.startswith("^"):
                        continue
                    op, _, slot = tensor.partition(":")
                    self.inputs[node.name].append((op, int(slot or 0)))
                    self.readers[op, int(slot or 0)].append(node.name)
                    if op in receives:
                        self.reads_received.add(node.name)


def _reads_variable(nodes, name: str, constants: bool = True) -> bool:
    """Whether op ``name``'s output is a variable's value (through any identities; a constant
    counts as one unless ``constants`` is False)."""
    while name in nodes and nodes[name].op in ("Identity", "Snapshot") and nodes[name].input:
        name = nodes[name].input[0].partition(":")[0]
    return name in nodes and nodes[name].op in (
        ("ReadVariableOp", "VariableV2") + (("Const",) if constants else ()))


def _transport_bytes(node_stats, wiring: _Wiring, key: str, end: int) -> int:
    """What the allocator records miscount at the end (``end``) of forward ``key``'s pass on
    a task that sends and receives: minus each forward buffer only a send still holds (no op
    reads it after ``end``), plus each received buffer a forward op had taken over in place by
    ``end`` (an add of a received partial sum) that an op reads after ``end``. TensorFlow
    forwards a buffer in place only while nothing else holds it, so which of the two happens
    depends on when the transport lets go.

    A buffer is followed by the address the ops' outputs report, in the order the ops ran: an
    output at the address of one of its op's inputs is in that input's buffer (a view, or an
    op in place); any other output starts a buffer, even at an address an earlier one had."""
    buffers = {}  # (op, slot) -> (address, the op that started it)
    made = {}  # buffer -> (bytes, "allocated" | "received", the op that started it)
    tensors = collections.defaultdict(list)  # buffer -> its forward tensors
    writes = collections.defaultdict(set)  # op -> the buffers its outputs are in
    start, allocated = {}, collections.defaultdict(int)  # op -> its bytes still live at ``end``
    for stats in sorted(node_stats, key=lambda stats: stats.all_start_micros):
        op = stats.node_name
        start[op] = stats.all_start_micros
        part = _forward_part(op)
        mine = part is not None and (part == key or not key)
        if mine:
            allocated[op] = sum(record.alloc_bytes for memory in stats.memory
                                for record in memory.allocation_records
                                if record.alloc_micros <= end)
        inputs = {buffers[tensor][0]: buffers[tensor] for tensor in wiring.inputs[op]
                  if tensor in buffers}
        for output in stats.output:
            description = output.tensor_description.allocation_description
            if not (description.ptr and description.requested_bytes):
                continue
            buffer = inputs.get(description.ptr) or (description.ptr, op)
            buffers[op, output.slot] = buffer
            writes[op].add(buffer)
            if buffer[1] == op and mine:
                if description.allocation_id:
                    made[buffer] = (description.requested_bytes, "allocated", op)
                elif op in wiring.reads_received:
                    made[buffer] = (description.requested_bytes, "received", op)
            if mine:
                tensors[buffer].append((op, output.slot))

    def readers(buffer):
        return [reader for tensor in tensors[buffer] for reader in wiring.readers[tensor]]

    def read_after_end(buffer):  # a forward op that writes into it passes it on to its readers
        return any(start.get(reader, -1) > end for reader in readers(buffer)
                   if reader not in wiring.sends
                   and not (buffer in writes[reader] and _forward_part(reader) is not None))

    correction = 0
    for buffer, (size, how, op) in made.items():
        if how == "received" and start[op] <= end and read_after_end(buffer):
            correction += size
        elif (how == "allocated" and allocated[op] > 0 and not read_after_end(buffer)
              and any(reader in wiring.sends for reader in readers(buffer))):
            correction -= min(allocated[op], size)
    return correction


def _variable_bytes(node) -> int:
    shape = [dim.size for dim in node.attr["shape"].shape.dim]
    return math.prod(shape) * (itemsize(dtype_name(node.attr["dtype"].type)) or 4)
