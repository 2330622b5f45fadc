"""Bytes per step of the loops that split a transformer across worker tasks: tensor
parallelism's blocks, with sequence parallelism, ring attention, the forms combined on a
layout, experts. Counted from what each loop's graph sends; checked against the transport and
traced steps in each loop's tests. ``costs`` (the other loops' formulas) names them too."""

from __future__ import annotations

from dtflab.train.formulas.transformer import kv_heads_per_worker, mlp_parameters
from dtflab.train.layouts import ring


def transformer_tensor_parallel_bytes(ways: int, problem) -> list[dict]:
    """Bytes each of ``ways`` workers sends the others in one tensor-parallel step of a
    transformer (``graphs.tensor_parallel_blocks``), worker 0 first, as
    :func:`tensor_parallel_bytes` counts an MLP's.

    With k ways, L blocks and A = batch x sequence x d_model activations (float32 or 16-bit):

    - every half-block but the last ends in an all-reduce: each worker sends ``k - 1`` copies
      of its partial output forward, and of its sum's gradient backward: ``(2L - 1)(k - 1) A``
      each way;
    - the last block's MLP sums on worker 0: each other worker sends it A forward, and worker 0
      sends the gradient back, ``(k - 1) A``;
    - worker 0 sends the embedded batch to the others, ``(k - 1) A``, and each sends back its
      copy's gradient, A;
    - worker 0 lends each other worker, per block, the two LayerNorms' scales and biases and
      the projection's bias (and the MLP's output bias, but the last block's): ``6L - 1``
      float32 vectors of d_model, whose gradients come back (RMSNorm has no bias: ``4L - 1``);
    - with fewer key/value heads than ways, each head's key and value columns of the qkv
      (and their biases) are lent by the first worker that copies it to the others, per
      block, and their gradients come back (:func:`lent_keys_bytes`).

    It leaves out gRPC's framing, the requests for each tensor and the optimizer's scalars."""
    k, sent = ways, [{"forward": 0, "backward": 0} for _ in range(ways)]
    if k == 1:
        return sent
    blocks, d = problem.blocks, problem.d_model
    a = problem.batch_size * problem.sequence * d * (4 if problem.precision == "float32" else 2)
    vectors = (_lent_vectors(problem) * blocks - 1) * d * 4
    for worker in sent:
        worker["forward"] += (2 * blocks - 1) * (k - 1) * a
        worker["backward"] += (2 * blocks - 1) * (k - 1) * a
    sent[0]["forward"] += (k - 1) * (a + vectors)
    sent[0]["backward"] += (k - 1) * a
    for worker in sent[1:]:
        worker["forward"] += a
        worker["backward"] += a + vectors
    return lent_keys_bytes(ways, problem, sent)


def _lent_vectors(problem) -> int:
    """The vectors of d_model worker 0 lends a tensor-parallel block: both norms' parameters
    (LayerNorm's scale and bias, RMSNorm's scale) and the two output biases."""
    return 2 * (2 if getattr(problem, "norm", "layer") == "layer" else 1) + 2


def lent_keys_bytes(ways: int, problem, sent: list[dict]) -> list[dict]:
    """``sent`` with the key and value heads' bytes added, where ``ways`` outnumber them
    (``graphs.tensor_parallel_blocks``): per block, the first of each head's ``ways / kv``
    workers sends the others its key and value columns of the qkv and their biases,
    2 x (d_model + 1) x head size float32, and each sends their gradient back."""
    kv = getattr(problem, "kv_heads", problem.heads)
    if ways <= kv:
        return sent
    copies = ways // kv
    columns = 2 * (problem.d_model + 1) * problem.head_size * 4 * problem.blocks
    for worker in range(ways):
        if worker % copies:
            sent[worker - worker % copies]["forward"] += columns
            sent[worker]["backward"] += columns
    return sent


def transformer_sequence_parallel_bytes(ways: int, problem) -> list[dict]:
    """Bytes each of ``ways`` workers sends the others in one step of tensor parallelism with
    sequence parallelism (``tensor_parallel(..., sequence_parallel=True)``), worker 0 first.

    With k ways, L blocks and A as :func:`transformer_tensor_parallel_bytes` has it, each
    half-block gathers the k pieces of its normalised input (each worker sends its A / k to the
    k - 1 others) and reduce-scatters its partial outputs (each sends the k - 1 pieces the
    others sum): ``2 (k - 1) A / k`` forward and as much backward, per worker and half-block,
    as a ring all-reduce of A sends; ``4 L (k - 1) A / k`` each way in all. Then the ends:
    worker 0 sends each other worker its piece of the embedded batch, ``(k - 1) A / k``, and
    gathers the pieces of the last block's output, each other worker's ``A / k``; their
    gradients come back. Worker 0 lends each other worker ``6 L`` vectors of d_model per step
    (both LayerNorms' scales and biases and both output biases, every block), whose gradients
    come back. It leaves out what :func:`transformer_tensor_parallel_bytes` leaves out."""
    k, sent = ways, [{"forward": 0, "backward": 0} for _ in range(ways)]
    if k == 1:
        return sent
    blocks, d = problem.blocks, problem.d_model
    a = problem.batch_size * problem.sequence * d * (4 if problem.precision == "float32" else 2)
    vectors = _lent_vectors(problem) * blocks * d * 4
    for worker in sent:
        worker["forward"] += 4 * blocks * (k - 1) * a / k
        worker["backward"] += 4 * blocks * (k - 1) * a / k
    sent[0]["forward"] += (k - 1) * (a / k + vectors)
    sent[0]["backward"] += (k - 1) * a / k
    for worker in sent[1:]:
        worker["forward"] += a / k
        worker["backward"] += a / k + vectors
    return lent_keys_bytes(ways, problem, sent)


def context_parallel_bytes(problem, ways: int, cut: str) -> list[dict]:
    """Bytes each of ``ways`` workers sends the others in one step of
    ``train.context_parallel`` with the sequence cut ``cut``, worker 0 first.

    - Keys and values round the ring: per block, every hop of a chunk of n positions
      (:func:`~dtflab.train.layouts.ring.hops`) sends its keys and values,
      2 x batch x n x d_model floats (with grouped-query attention, kv_heads x head size
      instead of d_model), forward; their gradient comes back from each worker that
      attends to the chunk to the one before it that does
      (:func:`~dtflab.train.layouts.ring.gradient_hops`). The naive cut's chunks travel only
      as far as the last worker that attends to them, so its ring is a chain, busiest from the
      middle; the zig-zag cut's reach every worker.
    - Worker 0 lends every other worker the parameters, P = 4 x parameters bytes, and each
      sends its gradient back, P.
    - Worker 0 sends each other worker its positions' tokens and targets (int32 and int64).

    It leaves out gRPC's framing, the requests for each tensor, the losses and the optimizer's
    scalars."""
    sent = [{"forward": 0, "backward": 0} for _ in range(ways)]
    if ways == 1:
        return sent
    per_position = 2 * problem.batch_size * problem.kv_heads * problem.head_size * 4
    for source, _, (start, stop) in ring.hops(cut, ways, problem.sequence):
        sent[source]["forward"] += problem.blocks * per_position * (stop - start)
    for source, _, (start, stop) in ring.gradient_hops(cut, ways, problem.sequence):
        sent[source]["backward"] += problem.blocks * per_position * (stop - start)
    parameters = 4 * problem.parameter_count
    tokens = problem.batch_size * (problem.sequence // ways) * (4 + 8)
    sent[0]["forward"] += (ways - 1) * (parameters + tokens)
    for worker in sent[1:]:
        worker["backward"] += parameters
    return sent


def ulysses_bytes(problem, ways: int) -> list[dict]:
    """Bytes each of ``ways`` workers sends the others in one step of
    ``train.context_parallel(..., attention="ulysses")``, worker 0 first.

    - Per block, each worker sends every other worker its n = s / c positions of that worker's
      a / c query heads and of their key/value heads' keys and values (kv / c heads, or the
      one they share where the ways outnumber the key/value heads), and each sends every other
      its positions of its heads' outputs: (c - 1) x batch x n x size x (2 a / c + 2 kv_w)
      floats forward, and as much backward (each tensor's gradient goes back the way it came).
    - The parameters, tokens and targets as :func:`context_parallel_bytes` counts them.

    It leaves out what :func:`context_parallel_bytes` leaves out."""
    sent = [{"forward": 0, "backward": 0} for _ in range(ways)]
    if ways == 1:
        return sent
    c, size = ways, problem.head_size
    kv = kv_heads_per_worker(problem.kv_heads, c)
    n = problem.sequence // c
    block = (c - 1) * problem.batch_size * n * size * (2 * problem.heads // c + 2 * kv) * 4
    parameters = 4 * problem.parameter_count
    tokens = problem.batch_size * n * (4 + 8)
    for w, worker in enumerate(sent):
        worker["forward"] += problem.blocks * block
        worker["backward"] += problem.blocks * block + (parameters if w else 0)
    sent[0]["forward"] += (ways - 1) * (parameters + tokens)
    return sent


def ulysses_over_ring(heads: int, kv_heads: int, ways: int) -> float:
    """Ulysses' attention bytes over ring attention's (zig-zag cut), per block, each way:
    (a/c + kv_w)/kv, from (c - 1)·s·b·z·(2a/c + 2·kv_w) against (c - 1)·s·b·2·kv·z
    (:func:`ulysses_bytes`, :func:`context_parallel_bytes`)."""
    return (heads / ways + kv_heads_per_worker(kv_heads, ways)) / kv_heads


def combined_bytes(problem, layout) -> dict[str, int]:
    """Bytes per step on each axis's links of ``train.combined`` (every link, both ways), for
    a transformer on ``layout`` (D data, T tensor, P pipeline ways), with B / D sequences a
    replica, A = B / D x sequence x d_model float32 activations and M = 4 x parameters:

    - **tensor**: each replica's stages send what :func:`transformer_tensor_parallel_bytes`
      counts for its batch (the sums of every stage's blocks, the embedded batch to the first
      stage's group, the last sum to the last stage's worker 0, the lent vectors);
    - **pipeline**: per boundary, each of the T ranks hands on its copy of the stream, A, and
      gets its gradient back; the targets, int64, go on to the last stage; a tied token
      embedding is read by the last stage from the first, its gradient sent back;
    - **data**: every replica sends every other its gradient of each of its variables,
      D (D - 1) M; worker 0 sends each other replica its tokens (int32) and targets (int64).

    It leaves out gRPC's framing, the losses and Adam's beta powers (scalars)."""
    import dataclasses

    D, T, P = layout.data, layout.tensor, layout.pipeline
    replica = dataclasses.replace(problem, batch_size=problem.batch_size // D)
    positions = replica.batch_size * problem.sequence
    a = positions * problem.d_model * 4
    found = dict.fromkeys(("pipeline", "data", "context", "tensor"), 0)
    found["tensor"] = D * int(sum(sum(w.values()) for w in
                                  transformer_tensor_parallel_bytes(T, replica)))
    if P > 1:
        tied = 2 * problem.vocabulary * problem.d_model * 4 if problem.tied else 0
        found["pipeline"] = D * ((P - 1) * 2 * T * a + positions * 8 + tied)
    found["data"] = D * (D - 1) * 4 * problem.parameter_count + (D - 1) * positions * (4 + 8)
    return found


def expert_parallel_bytes(problem, routed) -> list[dict]:
    """Bytes each worker sends the others in one step of ``train.expert_parallel``, worker 0
    first, given the step's routing: ``routed[b][w][e]``, the tokens of worker w's slice that
    expert e of block b took (``history.details["per_step"]["routed"]``).

    - **dispatch**: each worker sends each token an expert on another worker took, d floats;
      **combine**: each expert's worker sends each output back to the token's worker. Backward,
      the gradients cross the other way: each worker sends what it received, forward, back.
      With ``pad_to_capacity``, every expert's capacity x the worker's sequences rows cross,
      whatever the routing.
    - the copies' gradients: each worker sends the others its gradient of every variable but
      the routed experts (4 x that many parameters bytes each; the shared experts are copies);
    - worker 0 sends each other worker its slice's tokens and targets (int32, int64), and each
      other worker sends worker 0 its tokens per expert (float32, the report).

    It leaves out gRPC's framing, the losses and Adam's beta powers."""
    W, E, d = len(routed[0]), problem.experts, problem.d_model
    mine = E // W
    slots = None
    if problem.pad_to_capacity:  # an expert's capacity x the slice
        slots = problem.expert_capacity * (problem.batch_size // W)
    sent = [{"forward": 0, "backward": 0} for _ in range(W)]
    for block in routed:
        for w, row in enumerate(block):
            for e, tokens in enumerate(row):
                owner = e // mine
                if owner != w:
                    crossing = (slots or int(round(tokens))) * d * 4
                    sent[w]["forward"] += crossing       # dispatch
                    sent[owner]["forward"] += crossing   # combine
                    sent[w]["backward"] += crossing      # combine's gradient
                    sent[owner]["backward"] += crossing  # dispatch's gradient
    expert = mlp_parameters(d, problem.hidden, problem.activation)
    copied = 4 * (problem.parameter_count - problem.blocks * E * expert)
    positions = problem.batch_size // W * problem.sequence
    for w in range(W):
        sent[w]["backward"] += (W - 1) * copied
    sent[0]["forward"] += (W - 1) * positions * (4 + 8)
    for w in range(1, W):
        sent[w]["forward"] += problem.blocks * E * 4
    return sent
