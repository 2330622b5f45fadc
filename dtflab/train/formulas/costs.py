"""The cost formulas the tutorials teach, in one place: the number a learner predicts in a
notebook is the number the benchmark checks and the view draws.
The pipeline schedules and the transformer's splits have modules of their own (``schedules``,
``split_bytes``).

Each is a plain function of counts and seconds (or bytes); none measures anything. Where a
formula leaves something out, its docstring says what.
"""

from __future__ import annotations

from dtflab.train.layouts.layers import tensor_parallel_pairs


def amdahl(parallel_fraction: float, workers: float) -> float:
    """Amdahl's law: the speed-up of ``workers`` when a fraction ``parallel_fraction`` of one
    worker's step splits across them and the rest does not. ``1 / ((1 - p) + p / N)``."""
    p = parallel_fraction
    return 1.0 / ((1.0 - p) + p / workers)


def ps_step_s(workers: float, compute_s: float, exchange_s: float, *, cpu_s: float = 0.0,
              cores: float | None = None) -> float:
    """A synchronous step through one ps, as a bottleneck rather than a sum: the longer of

    - a worker's own path, ``compute / N + exchange``: its share of the compute, then its
      exchange with the ps (reading the parameters, sending its gradients, waiting for the
      update). The ps serves the workers' exchanges at the same time (gRPC threads), so the
      exchange does not grow with N while the ps has cores to spare;
    - the machine's cores: ``cpu / cores``, where ``cpu`` is every process's CPU seconds per
      step (the workers', the ps's, which grows with N, and the client's).

    It leaves out stragglers, a network slower per byte than the loopback, and the ps's own
    limit when it has no spare core for its gRPC threads (then ``cores`` is the ps's)."""
    worker_path = compute_s / workers + exchange_s
    return max(worker_path, cpu_s / cores) if cores else worker_path


# -- pipelines --------------------------------------------------------------------------------

def pipeline_step_s(stages: int, micro_batches: int, stage_s: float, per_micro_batch_s: float,
                    rest_s: float = 0.0, *, overlap_s: float = 0.0) -> float:
    """A pipelined step: ``(m + p - 1) x (stage / m + c) - (p - 1) x overlap / m + rest``
    seconds.

    ``stage_s`` is one stage's arithmetic for the whole batch (forward and backward), ``c`` what
    a stage pays per micro-batch beyond its arithmetic (transfers, per-op and accumulation
    overhead), ``rest`` what no micro-batch count changes (the update, feeding the batch). Every
    one of the ``m + p - 1`` slots on the critical path costs a micro-batch's share of the
    arithmetic plus ``c``: with ``c = 0`` and no overlap this is the bubble formula's step.
    ``overlap_s`` is the part of a stage's backward the stage before does not wait for (its
    weight gradients, when the input gradient leaves first), for the whole batch: on the
    ``p - 1`` hops back through the pipeline, only the input gradient is on the path."""
    m = micro_batches
    return (m + stages - 1) * (stage_s / m + per_micro_batch_s) - (stages - 1) * overlap_s / m + rest_s


def best_micro_batches(stages: int, stage_s: float, per_micro_batch_s: float,
                       choices=(1, 2, 4, 8, 16), *, overlap_s: float = 0.0) -> int:
    """The micro-batch count among ``choices`` with the shortest :func:`pipeline_step_s`."""
    return min(choices, key=lambda m: pipeline_step_s(stages, m, stage_s, per_micro_batch_s,
                                                      overlap_s=overlap_s))


def activation_bytes(widths, examples: int, dtype_bytes: int = 4) -> int:
    """What a stage keeps of one micro-batch for its backward: each of its layers' outputs
    (``widths``, one per layer) for ``examples`` examples. It leaves out the temporaries a
    kernel frees at once and, after an activation, the pre-activation some kernels keep."""
    return dtype_bytes * examples * sum(widths)


# -- tensor parallelism -----------------------------------------------------------------------

def tensor_parallel_bytes(ways: int, batch: int, layers, dtype_bytes: int = 4) -> list[dict]:
    """Bytes each of ``ways`` workers sends the others in one tensor-parallel step of an MLP of
    widths ``layers``: ``[{"forward": ..., "backward": ...}, ...]``, worker 0 first (it holds
    the batch, the loss, the whole layer and every row-split bias).

    With k ways, batch B and a pair whose output is h wide:

    - a pair followed by another pair ends in an all-reduce (every worker sums the k partial
      outputs itself): each worker sends ``(k - 1) x B x h`` values forward and, for the
      gradient of the next pair's input, the same backward; worker 0 also sends the bias
      (h values) to each other worker, which return their share of its gradient (h values);
    - the last pair ends in a sum on worker 0: each other worker sends its partial output
      forward (``B x h``) and receives the output's gradient (worker 0 sends ``(k - 1) x B x h``);
    - worker 0 sends the batch's input to the others: ``(k - 1) x B x layers[0]``.

    For k = 2 a pair's all-reduce moves ``B x h`` values each way, as a ring would. It leaves
    out gRPC's framing, the requests for each tensor and the optimizer's scalars."""
    k, sent = ways, [{"forward": 0, "backward": 0} for _ in range(ways)]
    if k == 1:
        return sent
    sent[0]["forward"] += (k - 1) * batch * layers[0]
    pairs = tensor_parallel_pairs(len(layers) - 1)
    for number, (_, second) in enumerate(pairs):
        h = layers[second]
        if number + 1 < len(pairs):  # all-reduce: every worker needs the sum
            for worker in sent:
                worker["forward"] += (k - 1) * batch * h
                worker["backward"] += (k - 1) * batch * h
            sent[0]["forward"] += (k - 1) * h
            for worker in sent[1:]:
                worker["backward"] += h
        else:  # reduce to worker 0, the output's gradient back
            for worker in sent[1:]:
                worker["forward"] += batch * h
            sent[0]["backward"] += (k - 1) * batch * h
    return [{way: values * dtype_bytes for way, values in worker.items()} for worker in sent]


# -- data parallelism: bytes per step and what each worker holds -------------------------------

def all_reduce_bytes(parameter_bytes: float, workers: int) -> float:
    """Bytes each of ``workers`` (N) sends in a ring all-reduce of ``parameter_bytes`` (M: a
    model's gradients each step, or any tensor summed over a group): ``2 x (N - 1) / N x M``
    (a reduce-scatter, then an all-gather). It leaves out gRPC's framing."""
    return 2 * (workers - 1) / workers * parameter_bytes


def sharded_bytes(parameter_bytes: float, workers: int, gathers: int = 2) -> float:
    """Bytes each worker sends per step in ZeRO-3 / FSDP (``train.sharded_data_parallel``):
    ``(gathers + 1) x (N - 1) / N x M``. The parameters are all-gathered before the forward
    and again before the backward (``gathers=2``: the full layer is freed in between), and the
    gradients reduce-scattered once: ``3 x (N - 1) / N x M``, 1.5 times a ring all-reduce's
    (:func:`all_reduce_bytes`). It leaves out the padding of each layer to a multiple of N
    (fewer than N values a layer) and gRPC's framing."""
    return (gathers + 1) * (workers - 1) / workers * parameter_bytes


def sharded_state_bytes(parameter_bytes: float, workers: int, slots: int = 2) -> float:
    """Bytes of parameters and optimizer slots each worker holds in ZeRO-3 / FSDP:
    ``(1 + slots) x M / N`` (Adam: m and v, two slots), against ``(1 + slots) x M`` for every
    worker of plain data parallelism. It leaves out the padding and Adam's two scalars."""
    return (1 + slots) * parameter_bytes / workers


def zero_stage1_step_peak_bytes(parameter_bytes: float, workers: int) -> float:
    """What a ZeRO stage-1 worker's step holds at its peak beyond what it held before the step,
    once its activations are gone: every full gradient (M), then, the exchange starting only
    when the backward has ended, every received chunk and every summed shard at once
    (``2 M / N``): ``(1 + 2 / N) x M``. Stage 2 sends each gradient as it is made, so it never
    holds them all: ZeRO's saving is the ``(1 - 1/N) x M`` of gradients it no longer keeps
    (Rajbhandari et al. 2020, the gradients' share of 2Ψ + 2Ψ + KΨ); what else it holds at its
    peak, the gradients made faster than the wire takes them, is measured, not predicted."""
    return (1 + 2 / workers) * parameter_bytes


def shard_size(values: int, workers: int) -> int:
    """Values in each of ``workers`` equal shards of a flat vector of ``values``, padded with
    zeros to a multiple of ``workers`` (how ``train.sharded_data_parallel`` cuts a layer)."""
    return -(-values // workers)


# -- DTensor: one layer pair under a layout ------------------------------------------------------

LAYOUTS = ("data", "model", "both")


def layout_bytes(layout: str, mesh: dict, batch: int, layers, dtype_bytes: int = 4) -> dict:
    """Bytes each device sends per step training ``tanh(x @ w1) @ w2`` (widths ``layers``:
    inputs, hidden, outputs) on a DTensor mesh ``{"batch": b, "model": m}`` under ``layout``:

    - ``"data"``: the batch sharded on ``batch``, both matrices replicated: each step the
      gradients (all of M) are all-reduced over the b devices that share a model shard;
    - ``"model"``: ``w1`` sharded by columns and ``w2`` by rows on ``model`` (Megatron), the
      batch replicated: the partial outputs (B x outputs) are all-reduced over the m devices;
      nothing else crosses (the backward needs no sum: the output's gradient is replicated);
    - ``"both"``: both at once, each with its share: B / b rows of partial outputs, M / m of
      gradients.

    ``{"activations": ..., "gradients": ...}``, each a ring all-reduce
    (:func:`all_reduce_bytes`). It leaves out the loss's scalar all-reduce and gRPC's
    framing."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: choose one of {', '.join(map(repr, LAYOUTS))}")
    inputs, hidden, outputs = layers
    b = mesh["batch"] if layout in ("data", "both") else 1
    m = mesh["model"] if layout in ("model", "both") else 1
    parameters = dtype_bytes * hidden * (inputs + outputs)
    return {"activations": all_reduce_bytes(dtype_bytes * batch / b * outputs, m),
            "gradients": all_reduce_bytes(parameters / m, b)}


def client_wire_bytes(layout: str, mesh: dict, batch: int, layers, *, local_axis: str,
                      local_devices: int, dtype_bytes: int = 4) -> float:
    """Bytes one DTensor client sends over the network per step under :func:`layout_bytes`'s
    ``layout``, when each client holds ``local_devices`` devices that together span the mesh
    axis ``local_axis`` (``create_distributed_mesh`` gives each client a run of the last axis):
    its devices' collectives over the other axis cross to other clients, those over
    ``local_axis`` stay inside the process."""
    axis_of = {"activations": "model", "gradients": "batch"}
    parts = layout_bytes(layout, mesh, batch, layers, dtype_bytes)
    return local_devices * sum(sent for part, sent in parts.items() if axis_of[part] != local_axis)
