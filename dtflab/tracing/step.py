"""One traced step as plain Python data: partitions, transfers, per-device timings."""

from __future__ import annotations

import collections
import importlib
import re
from dataclasses import dataclass, field

from dtflab.names import short as short_device  # the name every view prints

#: The module that draws a StepTrace (``figure``, ``show``, ``save_html``), named rather than
#: imported: step data does not depend on its views (as pandas' ``DataFrame.plot`` names its
#: plotting backend). ``dtflab.viz.step`` imports this module, never the reverse.
VIEWS = "dtflab.viz.step"


def _views():
    return importlib.import_module(VIEWS)


@dataclass(frozen=True)
class Op:
    """One node of a device's partition graph, after TensorFlow's own rewrites."""

    name: str
    type: str
    device: str
    inputs: tuple[str, ...] = ()  # producer op names on the same device (data edges)

    @property
    def scope(self) -> str:
        return self.name.rsplit("/", 1)[0] if "/" in self.name else ""

    @property
    def is_transfer(self) -> bool:
        return self.type in ("_Send", "_Recv", "_HostSend", "_HostRecv")


@dataclass(frozen=True)
class Transfer:
    """One tensor sent from one device to another in the step.

    ``tensor_name`` is the producer's output (``layer2/MatMul/ReadVariableOp:0``); ``key`` is
    TensorFlow's rendezvous name for it. ``start_us`` and ``duration_us`` come from the
    receiving task's ``RecvTensor`` record (the RPC), relative to the step start; ``None``
    where the step stats have none: transfers between devices of one task, and now and then
    (seen under load) a cross-task RPC that TensorFlow did not record.
    """

    key: str
    tensor_name: str
    src_device: str
    dst_device: str
    dtype: str
    shape: tuple[int, ...] | None
    nbytes: int
    producer: str
    consumers: tuple[str, ...] = ()
    start_us: float | None = None
    duration_us: float | None = None
    to_client: bool = False  # a fetch going back to the client (or a feed, from_client)
    from_client: bool = False
    send_op: str = ""  # the _Send and _Recv ops that move it (names in the partitions)
    recv_op: str = ""


@dataclass(frozen=True)
class OpTiming:
    """When one op ran, in microseconds relative to the step start.

    ``kind`` is ``compute``, ``transfer`` (the receiving side of an RPC: time spent waiting for
    and copying a tensor from another task), ``send``/``recv`` (rendezvous ops), or
    ``runtime`` (TensorFlow's own bookkeeping around kernels, from the TF2 profiler).
    """

    device: str
    name: str
    op: str
    start_us: float
    duration_us: float
    kind: str = "compute"
    thread: str = ""  # the profiler's thread (``tf_Compute/<id>``); a Session.run's: none

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


@dataclass
class StepTrace:
    """What one ``Session.run`` did, device by device.

    ``result`` is what the run returned, unchanged. Timings from several hosts share no clock;
    on one machine they do, and transfers line up with the ops around them.
    """

    result: object
    partitions: dict[str, list[Op]]
    transfers: list[Transfer]
    client_transfers: list[Transfer]
    timings: dict[str, list[OpTiming]]
    step_us: float
    metadata: object = field(default=None, repr=False)  # the raw RunMetadata proto
    note: str = ""  # where the figures came from, when that is not a traced Session.run

    @property
    def devices(self) -> list[str]:
        names = set(self.partitions) | set(self.timings)
        names |= {t.src_device for t in self.transfers} | {t.dst_device for t in self.transfers}
        return sorted(names, key=lambda d: (short_device(d).split(":")[0], short_device(d)))

    def ops(self, device: str | None = None, *, transfers: bool = False) -> list[Op]:
        """Ops of one device (or all), without ``_Send``/``_Recv`` unless asked."""
        devices = [device] if device else list(self.partitions)
        return [op for d in devices for op in self.partitions.get(d, [])
                if transfers or not op.is_transfer]

    def bytes_between(self) -> dict[tuple[str, str], int]:
        """Bytes sent per (source device, destination device) pair in this step."""
        totals: dict[tuple[str, str], int] = collections.Counter()
        for transfer in self.transfers:
            totals[transfer.src_device, transfer.dst_device] += transfer.nbytes
        return dict(totals)

    def device_totals(self) -> dict[str, dict[str, float]]:
        """Per device: ops run, compute and transfer time (µs), bytes in and out."""
        totals = {d: {"ops": 0, "compute_us": 0.0, "transfer_us": 0.0, "bytes_in": 0,
                      "bytes_out": 0} for d in self.devices}
        for device, timings in self.timings.items():
            for timing in timings:
                if timing.kind == "compute":
                    totals[device]["compute_us"] += timing.duration_us
                    totals[device]["ops"] += 1
                elif timing.kind != "runtime":
                    totals[device]["transfer_us"] += timing.duration_us
        for transfer in self.transfers:
            totals[transfer.src_device]["bytes_out"] += transfer.nbytes
            totals[transfer.dst_device]["bytes_in"] += transfer.nbytes
        return totals

    def collective_overlap(self) -> dict[str, float]:
        """Per device that ran collectives (``CollectiveReduceV2``: an all-reduce), the share
        of their time during which the device also computed its forward or backward pass:
        collective time hidden under compute. A collective's time includes waiting for its
        slowest peer. The update that consumes the sums (the optimizer's ops and the split of
        a pack) is not counted: the profiler may record an asynchronous collective's end after
        the ops its result released have started."""
        shares = {}
        for device, timings in self.timings.items():
            collectives = [(t.start_us, t.end_us) for t in timings
                           if t.kind == "transfer" and t.name.endswith("CollectiveReduceV2")]
            if not collectives:
                continue
            busy = union((t.start_us, t.end_us) for t in timings
                          if t.kind == "compute" and not _UPDATE.search(t.name))
            hidden = sum(max(0.0, min(end, b) - max(start, a))
                         for start, end in collectives for a, b in busy)
            total = sum(end - start for start, end in collectives)
            shares[device] = hidden / total if total > 0 else 0.0
        return shares

    def summary(self) -> str:
        """A short table: one line per device, then the total bytes on the wire."""
        lines = [f"{'device':<14}{'ops':>6}{'compute ms':>12}{'transfer ms':>13}{'bytes in':>11}"
                 f"{'bytes out':>11}"]
        for device, total in self.device_totals().items():
            lines.append(f"{short_device(device):<14}{total['ops']:>6}"
                         f"{total['compute_us'] / 1000:>12.3f}{total['transfer_us'] / 1000:>13.3f}"
                         f"{total['bytes_in']:>11,}{total['bytes_out']:>11,}")
        wire = sum(t.nbytes for t in self.transfers)
        lines.append(f"{len(self.transfers)} transfers, {wire:,} bytes between devices; "
                     f"step {self.step_us / 1000:.3f} ms")
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<StepTrace {len(self.devices)} devices, {len(self.ops())} ops, "
                f"{len(self.transfers)} transfers, {sum(t.nbytes for t in self.transfers):,} bytes, "
                f"{self.step_us / 1000:.3f} ms>")

    # Views and export live in their own modules; these are the doors to them.

    def figure(self, **options):
        """The partition graph, timeline and transfer matrix laid out together (Bokeh)."""
        return _views().figure(self, **options)

    def show(self, **options) -> None:
        """Show :meth:`figure` inline in a notebook (or in a browser tab from a script)."""
        _views().show(self, **options)

    def save_html(self, path, **options) -> str:
        """Write the views as one standalone HTML file (BokehJS inlined: works offline)."""
        return _views().save_html(self, path, **options)

    def to_chrome_trace(self, path=None) -> dict:
        """The step as a Chrome/Perfetto trace (one process per task, transfers as flows)."""
        from dtflab.tracing.chrome import chrome_trace

        return chrome_trace(self, path)


#: How TensorFlow's profiler names a kernel's event: ``op_name:OpType``.
PROFILED_KERNEL = re.compile(r"^[\w./-]+:_?[A-Z]\w*$")
#: Ops of the update that an all-reduce's result feeds (``name:type`` as the profiler names them).
_UPDATE = re.compile(r"(^|/)(Adam|update_[^/]*)/|:ResourceApply|:(SplitV|Split|Reshape)$")


def union(intervals) -> list[tuple[float, float]]:
    """Overlapping ``(start, end)`` intervals merged, in time order."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]
