"""Read a ``RunMetadata`` (partition graphs + step stats) into a :class:`StepTrace`."""

from __future__ import annotations

import dataclasses
import math
import re

from dtflab.tracing.step import Op, OpTiming, StepTrace, Transfer

_RECV_LABEL = re.compile(r"^\[(?P<bytes>\d+)B\].*?\s(?P<key>\S+) from (?P<src>\S+) to (?P<dst>\S+)")
TRANSFER_OPS = ("_Send", "_Recv", "_HostSend", "_HostRecv")


def _tensor(input_name: str) -> tuple[str, str]:
    """``"foo:1"`` -> ``("foo", "foo:1")``; ``"foo"`` -> ``("foo", "foo:0")``."""
    op, _, slot = input_name.lstrip("^").partition(":")
    return op, f"{op}:{slot or 0}"


def dtype_name(enum_value: int) -> str:
    from dtflab._quiet import import_tf

    try:
        return import_tf().dtypes.as_dtype(enum_value).name
    except TypeError:
        return "unknown"


def itemsize(dtype: str) -> int | None:
    import numpy as np

    try:
        return np.dtype(dtype).itemsize if dtype not in ("string", "resource", "variant") else None
    except TypeError:
        return None


def read_partitions(metadata) -> dict[str, list[Op]]:
    partitions: dict[str, list[Op]] = {}
    for graph in metadata.partition_graphs:
        for node in graph.node:
            inputs = tuple(_tensor(name)[0] for name in node.input if not name.startswith("^"))
            partitions.setdefault(node.device, []).append(Op(node.name, node.op, node.device, inputs))
    return partitions


def read_timings(metadata):
    """Per device: OpTiming list; plus output shapes by (device, op) and RPC records by key."""
    t0 = min((stats.all_start_micros for dev in metadata.step_stats.dev_stats
              for stats in dev.node_stats if stats.all_start_micros), default=0)
    timings: dict[str, list[OpTiming]] = {}
    outputs: dict[tuple[str, str, int], tuple[str, tuple[int, ...], int]] = {}
    rpc: dict[str, tuple[float, float, int]] = {}
    for dev in metadata.step_stats.dev_stats:
        for stats in dev.node_stats:
            start = float(stats.all_start_micros - t0)
            duration = float(max(stats.all_end_rel_micros, 0))
            label = stats.timeline_label
            if stats.node_name == "RecvTensor":
                match = _RECV_LABEL.match(label)
                if match:
                    rpc[match["key"]] = (start, duration, int(match["bytes"]))
                    timings.setdefault(dev.device, []).append(OpTiming(
                        dev.device, match["key"], "RecvTensor", start, duration, "transfer"))
                continue
            if stats.node_name == "_SOURCE":
                continue
            op_type = label.split("= ", 1)[1].split("(", 1)[0] if "= " in label else ""
            kind = {"_Send": "send", "_Recv": "recv", "_HostSend": "send",
                    "_HostRecv": "recv"}.get(op_type, "compute")
            timings.setdefault(dev.device, []).append(
                OpTiming(dev.device, stats.node_name, op_type, start, duration, kind))
            for output in stats.output:
                description = output.tensor_description
                shape = tuple(dim.size for dim in description.shape.dim)
                outputs[dev.device, stats.node_name, output.slot] = (
                    dtype_name(description.dtype), shape,
                    description.allocation_description.requested_bytes)
    return timings, outputs, rpc


def trace_from_metadata(metadata, result=None, feed_dict=None) -> StepTrace:
    """A :class:`StepTrace` from a filled ``RunMetadata`` (FULL_TRACE, partition graphs).

    ``feed_dict`` gives the shapes and bytes of the feeds, which step stats do not record.
    """
    partitions = read_partitions(metadata)
    timings, outputs, rpc = read_timings(metadata)
    transfers, client = match_transfers(metadata, outputs, rpc)
    client = [_with_feed_size(transfer, feed_dict) for transfer in client]
    ends = [t.end_us for device in timings.values() for t in device]
    return StepTrace(result, partitions, transfers, client, timings, max(ends, default=0.0),
                     metadata)


def _with_feed_size(transfer: Transfer, feed_dict) -> Transfer:
    if not transfer.from_client or not feed_dict:
        return transfer
    import numpy as np

    for key, value in feed_dict.items():
        name = getattr(key, "name", key)
        if isinstance(name, str) and _tensor(name)[1] == transfer.tensor_name:
            array = np.asarray(value)
            return dataclasses.replace(transfer, shape=tuple(array.shape), nbytes=int(array.nbytes))
    return transfer


def match_transfers(metadata, outputs, rpc) -> tuple[list[Transfer], list[Transfer]]:
    """Match each ``_Send`` to its ``_Recv`` by rendezvous key and devices.

    Shape and dtype come from the producer's recorded output; bytes are shape x item size
    where both are known (exact), else the bytes the receiving RPC reported.
    """
    sends, recvs, consumers = {}, {}, {}
    for graph in metadata.partition_graphs:
        for node in graph.node:
            for name in node.input:
                if not name.startswith("^"):
                    consumers.setdefault((node.device, _tensor(name)[0]), []).append(node.name)
            if node.op not in TRANSFER_OPS:
                continue
            attr = node.attr
            key = (attr["tensor_name"].s.decode(), attr["send_device"].s.decode(),
                   attr["recv_device"].s.decode())
            if node.op.endswith("Send"):
                sends[key] = (node, attr["T"].type, attr["client_terminated"].b)
            else:
                recvs[key] = (node, attr["tensor_type"].type, attr["client_terminated"].b)
    transfers, client = [], []
    for key in sorted(set(sends) | set(recvs)):
        name, src, dst = key
        send = sends.get(key)
        recv = recvs.get(key)
        if send is not None:
            node, dtype_enum, client_terminated = send
            producer, tensor_name = _tensor(node.input[0]) if node.input else ("", name)
        else:  # a feed: the client sends, the graph receives
            node, dtype_enum, client_terminated = recv
            producer, tensor_name = "", name
        dtype = dtype_name(dtype_enum)
        op_name, _, slot = tensor_name.partition(":")
        recorded = outputs.get((src, op_name, int(slot or 0)))
        shape = recorded[1] if recorded else None
        timing = rpc.get(name)
        size = itemsize(dtype)
        if shape is not None and size is not None:
            nbytes = math.prod(shape) * size
        elif timing is not None:
            nbytes = timing[2]
        else:
            nbytes = recorded[2] if recorded else 0
        receivers = tuple(consumers.get((dst, recv[0].name), ())) if recv else ()
        transfer = Transfer(
            key=name, tensor_name=tensor_name, src_device=src, dst_device=dst, dtype=dtype,
            shape=shape, nbytes=nbytes, producer=producer, consumers=receivers,
            start_us=timing[0] if timing else None, duration_us=timing[1] if timing else None,
            to_client=send is not None and send[2], from_client=send is None,
            send_op=send[0].name if send else "", recv_op=recv[0].name if recv else "")
        (client if transfer.to_client or transfer.from_client else transfers).append(transfer)
    return transfers, client
