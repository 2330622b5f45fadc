"""The transformer problem: its loss falls on dtflab's own text, the data-parallel loops train it
exactly as one process does, and its parameter and FLOP formulas match the built graph."""

import dataclasses

import numpy as np
import pytest

import dtflab
from dtflab import train
from dtflab._quiet import import_tf
from dtflab.errors import NotSupportedError
from dtflab.train import problems
from dtflab.train.formulas import transformer as formula
from dtflab.train.measure import flops
from dtflab.train.problems import text

tf = import_tf()
#: one process against the data-parallel loops, same seed and global batch: float rounding only
TOLERANCE = 1e-5
#: small enough that a run of a few steps takes seconds on 2 busy cores
SMALL = train.transformer(blocks=1, d_model=32, heads=2, sequence=16, batch_size=8)
SHAPES = [train.transformer(), train.transformer(blocks=3, d_model=128, heads=8, sequence=64,
                                                 batch_size=8),
          train.transformer(d_model=32, heads=2, sequence=128, batch_size=4, tied=False),
          train.transformer(blocks=1, d_model=256, heads=4, sequence=16, batch_size=4)]


def test_the_text_is_sentences_and_a_batch_is_windows_shifted_by_one():
    x, t = SMALL.batch(3, seed=1)
    assert x.shape == t.shape == (8, 16) and x.dtype == np.int32 and t.dtype == np.int64
    assert (x[:, 1:] == t[:, :-1]).all()  # each target is the next token
    assert set(text.decode(text.corpus(1)[:2000]).split(" ")) >= {"the", "cat", "sees"}
    # a worker's slice is made alone and equals the slice of the whole batch
    part_x, part_t = SMALL.batch(3, seed=1, part=(1, 2))
    assert (part_x == x[4:]).all() and (part_t == t[4:]).all()
    assert not (SMALL.batch(4, seed=1)[0] == x).all()


@pytest.mark.slow
def test_the_loss_falls_clearly_within_two_hundred_steps():
    history = train.single(train.transformer(), steps=200, seed=0)
    first, last = history.losses[0], history.final_loss()
    print(f"loss per token: {first:.3f} -> {last:.3f} nats (ln 23 = {np.log(23):.3f})")
    assert abs(first - np.log(len(text.ALPHABET))) < 0.15  # it starts knowing nothing
    assert last < 0.5 * first


@pytest.fixture(scope="module")
def small_single():
    return train.single(SMALL, steps=12, seed=4)


@pytest.mark.slow
def test_sync_data_parallel_and_2016_placement_train_it_exactly_as_one_process(small_single):
    with dtflab.start_cluster(jobs="ps=1,worker=2") as cluster:
        sync = train.sync_data_parallel(SMALL, cluster, steps=12, seed=4)
        placed = train.model_parallel(SMALL, cluster, steps=12, seed=4)
    for history in (sync, placed):
        diff = np.max(np.abs(np.array(history.losses) - np.array(small_single.losses)))
        print(f"{history.name} vs single: max |loss difference| {diff:.2e}")
        assert history.steps == small_single.steps == 12 and diff <= TOLERANCE


@pytest.mark.slow
def test_all_reduce_trains_it_exactly_as_one_process(small_single):
    history = train.all_reduce(SMALL, workers=2, steps=12, seed=4)
    diff = np.max(np.abs(np.array(history.losses) - np.array(small_single.losses)))
    print(f"all-reduce vs single: max |loss difference| {diff:.2e}")
    assert history.steps == 12 and diff <= TOLERANCE
    fingerprints = history.details["fingerprints"]
    assert fingerprints["worker:0"] == fingerprints["worker:1"]


@pytest.mark.parametrize("problem", SHAPES, ids=lambda p: p.name + ("" if p.tied else "_untied"))
def test_parameters_and_matmul_flops_are_what_the_built_graph_holds_and_runs(problem):
    graph = tf.Graph()
    with graph.as_default():
        variables = problem.create_variables(0)
    figures = formula.of(problem)
    assert figures["parameters"] == sum(v.shape.num_elements() for v in variables)
    measured = flops.training_step(problem)
    assert measured == figures["matmul_flops"]
    # The references' 6 N + 12 L S d counts the parameters that no matrix multiplies too.
    ratio = measured / figures["flops_total"]
    print(f"{problem.name}: measured matmul FLOPs / (6 N + 12 L S d) = {ratio:.3f}")
    assert 0.85 <= ratio <= 1.0


def test_a_transformer_travels_to_a_worker_program_and_back():
    problem = train.transformer(blocks=3, tied=False, learning_rate=0.01)
    assert problems.from_json(problems.to_json(problem)) == problem
    assert problems.from_json(problems.to_json(train.exp_regression())) == train.exp_regression()
    fused = train.transformer(sequence=32, attention="fused", attention_block=np.int64(8))
    assert problems.from_json(problems.to_json(fused)) == fused


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=64, heads=5), r"heads=5: d_model=64 does not split into 5 equal heads; use "
                                r"heads=4, or a d_model divisible by 5, e.g. d_model=65"),
    (dict(vocabulary=10), r"vocabulary=10: vocabulary must be a whole number of at least 23"),
    (dict(sequence=1 << 20), r"sequence=1048576: dtflab's text is 65536 characters long; use "
                             r"sequence=32768 or less"),
    (dict(blocks=0), r"blocks=0: blocks must be a whole number of at least 1"),
    (dict(learning_rate=-1), r"learning_rate=-1: use a positive number"),
])
def test_bad_shapes_are_refused_with_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train.transformer(**kwargs)


@pytest.mark.parametrize("loop", [lambda p: dtflab.slices_picture(p)])
def test_the_loops_that_cut_an_mlps_layers_refuse_a_transformer_naming_those_that_train_it(loop):
    with pytest.raises(NotSupportedError, match=r"works on an MLP's layers and transformer_1x32_h2"
                                                r"_s16 is a Transformer; train it with one of "
                                                r"train.single, .*train.all_reduce"):
        loop(SMALL)


def test_layer_norm_and_gelu_keep_less_and_compute_tensorflows_gradients():
    """The two ops that keep only their input for the backward (as fused kernels do) give the
    gradients TensorFlow's own autodiff of the same formulas gives."""
    import importlib

    model = importlib.import_module("dtflab.train.problems.transformer_ops")
    rng = np.random.default_rng(0)
    x, w = (tf.constant(rng.normal(size=(3, 5, 8)).astype(np.float32)) for _ in range(2))
    scale, bias = (tf.constant(rng.normal(size=8).astype(np.float32)) for _ in range(2))

    def autodiff_layer_norm(x, scale, bias):
        centred = x - tf.reduce_mean(x, -1, keepdims=True)
        variance = tf.reduce_mean(centred * centred, -1, keepdims=True)
        return centred * tf.math.rsqrt(variance + model.EPSILON) * scale + bias

    def gradients(function, *inputs):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = tf.reduce_sum(function(*inputs) * w)
        return [float(out)] + [g.numpy() for g in tape.gradient(out, inputs)]

    for ours, theirs in [(gradients(model.layer_norm(tf), x, scale, bias),
                          gradients(autodiff_layer_norm, x, scale, bias)),
                         (gradients(model.gelu(tf), x),
                          gradients(lambda v: tf.nn.gelu(v, approximate=True), x))]:
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("problem", [
    train.transformer(blocks=1, d_model=64, heads=4, sequence=32, batch_size=16),
    train.transformer(blocks=2, d_model=128, heads=8, sequence=64, batch_size=8),
    train.transformer(blocks=3, d_model=96, heads=6, sequence=48, batch_size=6, tied=False)],
    ids=lambda p: p.name)
def test_every_byte_the_memory_formula_predicts_is_what_the_traced_step_allocated(problem):
    report = train.memory(problem)
    print(report)
    for kind, error in report.errors.items():
        assert abs(error) <= 0.01, (kind, report)
    # what the step held at its peak: at least what the forward kept, and the gradients
    assert report.measured["peak"] >= report.measured["activations"]
    # the activation term that grows with the sequence squared is the softmax: a·s²·b floats
    longer = train.memory(dataclasses.replace(problem, sequence=2 * problem.sequence,
                                              name=problem.name + "_long"))
    grown = longer.measured["activations"] - report.measured["activations"]
    s, b, a, d = problem.sequence, problem.batch_size, problem.heads, problem.d_model
    v = problem.vocabulary
    linear = (problem.blocks * (16 * s * b * d + 2 * s * b) + s * b * d + s * b * (2 * v + d + 2))
    assert grown == 4 * (linear + problem.blocks * a * (4 * s * s - s * s) * b)
