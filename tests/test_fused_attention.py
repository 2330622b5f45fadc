"""Fused ("flash") attention (``train.transformer(attention="fused")``): against plain
attention op by op (values and gradients, grouped-query too, keys in several pieces as ring
attention passes them), what it keeps against a traced step by kind, and every loop that
trains the transformer training it as one process trains plain attention."""

import numpy as np
import pytest

from dtflab import train
from dtflab._quiet import import_tf
from dtflab.train.layouts.layout import Layout
from dtflab.train.problems import fused_attention, transformer_ops as ops

from conftest import max_loss_diff, one_process

tf = import_tf()
TOLERANCE = 1e-5
#: Llama's block, small, its 4 query heads sharing 2 key/value heads.
LLAMA = dict(blocks=2, d_model=32, heads=4, sequence=16, batch_size=8, kv_heads=2, norm="rms",
             positions="rotary", activation="swiglu", tied=False)


def gradients(function, *inputs):
    """The function's output and the gradients of its sum against fixed weights."""
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        out = function(*inputs)
        weights = tf.constant(np.random.default_rng(1).normal(size=out.shape), out.dtype)
        total = tf.reduce_sum(out * weights)
    return [out.numpy()] + [g.numpy() for g in tape.gradient(total, inputs)]


def qkv(heads, kv_heads, sequence, size=8, batch=2, seed=0):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.normal(size=(batch, count, sequence, size)).astype(np.float32))
            for count in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("heads, kv_heads, block", [(4, 4, 4), (4, 4, 16), (4, 2, 4), (4, 1, 8)],
                         ids=["4-tiles", "one-tile", "grouped", "multi-query"])
def test_fused_attention_computes_plain_attentions_values_and_gradients(heads, kv_heads, block):
    q, k, v = qkv(heads, kv_heads, 16)
    groups = heads // kv_heads
    plain = gradients(ops.attention_core(tf, 16, 8, tf.float32, groups), q, k, v)
    fused = gradients(fused_attention.core(tf, block, groups, joined=False), q, k, v)
    for ours, theirs in zip(fused, plain, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_keys_in_pieces_attend_as_one_sequence_and_the_causal_tiles_are_skipped():
    """Queries of positions 16-31 over the keys of 0-15 (a piece wholly before them) and of
    16-31 (their own, causal), as a ring worker holds them: plain attention's last 16 rows of
    the 32-position sequence, and its gradients. Of the 4 x 4 tiles of one sequence, the 6
    above the diagonal have no scores computed."""
    q, k, v = qkv(4, 2, 32)
    groups = 2
    plain = gradients(lambda q, k, v: ops.attention_core(tf, 32, 8, tf.float32, groups)(
        q, k, v)[:, :, 16:], q, k, v)
    pieces = lambda q, k, v: fused_attention.attend(
        tf, q[:, :, 16:], [(k[:, :, :16], v[:, :, :16], False), (k[:, :, 16:], v[:, :, 16:], True)],
        8, groups)
    fused = gradients(pieces, q, k, v)
    for ours, theirs in zip(fused, plain, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    graph = tf.Graph()
    with graph.as_default():
        q, k, v = (tf.compat.v1.placeholder(tf.float32, [1, 2, 32, 8]) for _ in range(3))
        fused_attention.core(tf, 8, 1)(q, k, v)
    # each computed tile is one matmul of scores and one of values
    assert sum(op.type == "BatchMatMulV2" for op in graph.get_operations()) == 2 * 10


@pytest.mark.slow
@pytest.mark.parametrize("shape", [
    dict(blocks=2, d_model=64, heads=4, sequence=64, batch_size=4),
    dict(LLAMA, d_model=64, sequence=64),
    dict(LLAMA, d_model=64, sequence=64, precision="bfloat16"),
    dict(LLAMA, d_model=64, sequence=64, recompute="full", precision="bfloat16"),
], ids=["gpt-2", "llama", "llama-bfloat16", "llama-full-bfloat16"])
def test_fused_attention_keeps_its_formulas_bytes_and_no_scores(shape):
    """Each kind within 1% of ``formulas.memory``; against plain attention on the same shape,
    the activations lose the softmax (a·s²·b) and gain each row's log-sum-exp (a·s·b float32)
    in every block, unless the block is recomputed whole."""
    fused = train.memory(train.transformer(**shape, attention="fused", attention_block=16))
    plain = train.memory(train.transformer(**shape))
    print(fused, plain, sep="\n")
    for kind, error in fused.errors.items():
        assert abs(error) <= 0.01, (kind, fused)
    s, b, a, p = 64, shape["batch_size"], shape["heads"], 2 if "precision" in shape else 4
    saved = 0 if shape.get("recompute") == "full" else shape["blocks"] * (p * a * s * s * b
                                                                          - 4 * a * s * b)
    assert plain.measured["activations"] - fused.measured["activations"] == saved


def fused(shape, **choices):
    return train.transformer(**shape, **choices, attention="fused", attention_block=4)


@pytest.fixture(scope="module")
def four():
    import dtflab

    with dtflab.start_cluster(workers=4, inter_op_threads=2, intra_op_threads=1) as c:
        yield c


LOOPS = {
    "all-reduce": lambda problem, cluster: train.all_reduce(problem, workers=2, steps=3, seed=4),
    "zero-1": lambda problem, cluster: train.zero(problem, stage=1, workers=2, steps=3, seed=4),
    "zero-2": lambda problem, cluster: train.zero(problem, stage=2, workers=2, steps=3, seed=4),
    "zero-3": lambda problem, cluster: train.sharded_data_parallel(problem, workers=2, steps=3,
                                                                   seed=4),
    "sync-data-parallel": lambda problem, cluster: train.sync_data_parallel(
        problem, cluster, workers=2, steps=3, seed=4),
    "pipeline-1f1b": lambda problem, cluster: train.pipeline(problem, cluster, layout=train.Layout(
        pipeline=2, micro_batches=2, schedule="1f1b"), steps=3, seed=4),
    "pipeline-interleaved": lambda problem, cluster: train.pipeline(
        problem, cluster, layout=train.Layout(pipeline=2, micro_batches=2,
                                              schedule="interleaved", chunks=2), steps=3, seed=4),
    "tensor-sequence-parallel": lambda problem, cluster: train.tensor_parallel(
        problem, cluster, ways=2, sequence_parallel=True, steps=3, seed=4),
    "ring-zigzag": lambda problem, cluster: train.context_parallel(
        problem, cluster, ways=2, steps=3, seed=4),
    "ulysses": lambda problem, cluster: train.context_parallel(
        problem, cluster, ways=2, attention="ulysses", steps=3, seed=4),
    "data-tensor": lambda problem, cluster: train.combined(
        problem, cluster, train.Layout(data=2, tensor=2), steps=3, seed=4),
}


WORKER_PROGRAMS = {"all-reduce", "zero-1", "zero-2", "zero-3"}


@pytest.mark.slow
@pytest.mark.parametrize("loop", LOOPS)
def test_every_loop_trains_fused_attention_as_one_process_trains_plain(four, loop, monkeypatch):
    """Llama's block (grouped-query attention, rotary positions), 4 blocks so that an
    interleaved pipeline has a chunk each; 16 positions in tiles of 4 (ring attention's
    zig-zag pieces are 4 positions, one tile). A loop that builds its graph here is seen to
    build fused attention (a worker program builds its own, in its process)."""
    shape = dict(LLAMA, blocks=4)
    alone = one_process(train.transformer(**shape), steps=3, seed=4)
    built, attend = [], fused_attention.attend
    monkeypatch.setattr(fused_attention, "attend", lambda *a, **k: built.append(1) or attend(
        *a, **k))
    run = LOOPS[loop](fused(shape), four)
    assert max_loss_diff(alone, run) <= TOLERANCE
    assert (len(built) > 0) == (loop not in WORKER_PROGRAMS), len(built)


@pytest.mark.slow
def test_expert_parallelism_trains_fused_attention_as_one_process(four):
    shape = dict(LLAMA, experts=4, top_k=2, shared_experts=1)
    alone = one_process(train.transformer(**shape), steps=3, seed=0)
    run = train.expert_parallel(fused(shape), four, workers=2, steps=3, seed=0)
    assert max_loss_diff(alone, run) <= TOLERANCE


@pytest.mark.parametrize("call, message", [
    (lambda: train.transformer(sequence=32, attention="fused", attention_block=12),
     "attention_block=12: the tiles must cut sequence=32 evenly; use attention_block=8"),
    (lambda: train.transformer(attention_block=8),
     "attention_block=8: a block is fused attention's tile; add attention='fused'"),
    (lambda: train.transformer(attention="flash"), "attention='flash'"),
    (lambda: train.transformer(attention="fused", recompute="selective"),
     "recompute='selective' with attention='fused'"),
    (lambda: train.context_parallel(train.transformer(sequence=32, attention="fused",
                                                      attention_block=8), None, ways=4),
     "attention_block=8: ring attention's pieces are 4 tokens (32 cut into 8)"),
    (lambda: Layout(recompute="selective").fits(train.transformer(attention="fused")),
     "recompute='selective': transformer_2x64_h4_s32_fused32 uses fused attention"),
])
def test_a_choice_fused_attention_cannot_serve_is_refused_with_the_fix(call, message):
    with pytest.raises(ValueError) as raised:
        call()
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [dict(blocks=2, d_model=64, heads=4, sequence=64, batch_size=4),
                                   dict(LLAMA, d_model=64, sequence=64)],
                         ids=["gpt-2", "llama"])
def test_the_planner_prices_fused_attentions_activations_as_measured(shape):
    """The planner's count for one device (``device_memory.per_device``) of a fused-attention
    plan against the traced step, and its saving over the plain plan against the measured one."""
    from dtflab.train.planner.device_memory import per_device
    from dtflab.train.planner.predicted_run import plan_of

    problems = {"plain": train.transformer(**shape),
                "fused": train.transformer(**shape, attention="fused", attention_block=16)}
    measured = {name: train.memory(problem).measured["activations"]
                for name, problem in problems.items()}
    predicted = {name: per_device(plan_of(problem, train.Layout()))["activations"]
                 for name, problem in problems.items()}
    assert plan_of(problems["fused"], train.Layout()).attention == "fused"
    print(measured, predicted)
    assert abs(predicted["fused"] / measured["fused"] - 1) <= 0.01
    saving = measured["plain"] - measured["fused"]
    assert abs((predicted["plain"] - predicted["fused"]) / saving - 1) <= 0.01
