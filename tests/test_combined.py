"""The forms combined on real task servers: data x tensor (2 x 2) and data x tensor x pipeline
(2 x 2 x 2), GPT-2's block and Llama's, train as one process does, and a traced step's bytes, split by the layout's axes,
are each axis's formula (the transport's count too, with gRPC's framing)."""

import pytest

from dtflab import train
from dtflab.train.formulas import split_bytes
from dtflab.train.layouts.layers import layer_ranges

from conftest import max_loss_diff, one_process

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5
PROBLEM = dict(blocks=2, d_model=128, heads=2, sequence=64, batch_size=8)


@pytest.fixture(scope="module")
def mesh():
    """Eight worker tasks, one per rank of a 2 x 2 x 2 layout."""
    import dtflab

    with dtflab.start_cluster(workers=8, inter_op_threads=2, intra_op_threads=1) as c:
        yield c


@pytest.mark.parametrize("layout, shape", [
    (train.Layout(data=2, tensor=2), PROBLEM),
    (train.Layout(data=2, tensor=2, pipeline=2), PROBLEM),
    # Llama's block, its one key/value head copied on both tensor ways
    (train.Layout(data=2, tensor=2, pipeline=2), dict(PROBLEM, kv_heads=1, norm="rms",
                                                     positions="rotary", activation="swiglu",
                                                     tied=False))],
    ids=["data-2-tensor-2", "data-2-tensor-2-pipeline-2", "llama-data-2-tensor-2-pipeline-2"])
def test_the_forms_combined_train_as_one_process_and_send_each_axis_formula(mesh, layout, shape):
    problem = train.transformer(**shape)
    alone = one_process(problem, steps=6, seed=4)
    wire = train.WireBytes(after_step=2, steps=3)
    run = train.combined(problem, mesh, layout, steps=6, seed=4, trace_step=1, callbacks=[wire])
    print(f"{layout}: vs single {max_loss_diff(alone, run):.2e}")
    assert max_loss_diff(alone, run) <= TOLERANCE and run.losses[-1] < run.losses[0]
    assert run.details["stages"] == layer_ranges(problem, layout.pipeline)  # the pipeline's cut
    formula = run.details["bytes_formula"]
    assert formula == split_bytes.combined_bytes(problem, layout)
    traced = layout.axis_bytes(run.trace.bytes_between())
    sent = layout.axis_bytes(wire.per_step.sent)
    for axis in ("data", "tensor", "pipeline"):
        print(f"  {axis}: formula {formula[axis]:,}, traced {traced[axis]:,}, transport "
              f"{sent[axis]:,.0f}")
        # the traced step's tensors, but for the losses and Adam's beta powers (scalars)
        assert formula[axis] <= traced[axis] <= formula[axis] + 512
        assert formula[axis] <= sent[axis] <= 1.05 * formula[axis]
    assert (formula["pipeline"] > 0) == (layout.pipeline > 1)
    assert traced["other"] <= 512  # only scalars cross two axes at once
    # Megatron's reason to keep tensor groups inside a node: the tensor axis costs the most
    assert formula["tensor"] > formula["data"] > formula["pipeline"]


def test_the_mesh_picture_carries_each_links_measured_bytes(mesh):
    layout = train.Layout(data=2, tensor=2)
    wire = train.WireBytes(after_step=1, steps=2)
    train.combined(train.transformer(**PROBLEM), mesh, layout, steps=4, callbacks=[wire])
    picture = layout.picture(sent=wire.per_step.sent)
    labels = {axis: picture.select(name=f"bytes_{axis}")[0].data_source.data["text"]
              for axis in ("data", "tensor")}
    assert len(labels["tensor"]) == 2 and len(labels["data"]) == 2  # 2 pairs each
    assert all(label.endswith("MB") for label in labels["tensor"])  # 2 MB a pair each step


def test_layouts_the_combined_loop_cannot_run_are_refused_with_the_fix(mesh):
    problem = train.transformer(**PROBLEM)
    with pytest.raises(ValueError, match=r"context=2: combined does not cut the sequence yet "
                                         r"\(train.context_parallel does, alone\); use context=1"):
        train.combined(problem, mesh, train.Layout(data=2, context=2))
    with pytest.raises(ValueError, match=r"Layout\(pipeline=3, data=2, tensor=2\) needs 12 "
                                         r"worker tasks"):
        train.combined(train.transformer(**dict(PROBLEM, blocks=3)), mesh,
                       train.Layout(data=2, tensor=2, pipeline=3))
    with pytest.raises(ValueError, match=r"tensor=4: transformer_2x128_h2_s64's 2 heads"):
        train.combined(problem, mesh, train.Layout(data=2, tensor=4))
    with pytest.raises(ValueError, match=r"layout=\{'data': 2\}: combined takes a train.Layout"):
        train.combined(problem, mesh, {"data": 2})
