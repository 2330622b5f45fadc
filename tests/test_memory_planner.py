"""The memory planner: its arithmetic for one replica against a traced step, and the widget a
learner drives (fields move the bars; Measure draws measured bars beside the predicted; a plan
it cannot run says why)."""

import pytest

import dtflab
from dtflab import train
from dtflab.train.planner import device_memory


@pytest.mark.slow
@pytest.mark.parametrize("fields", [
    dict(blocks=2, d_model=64, heads=4, sequence=32, batch=16, data=2, micro_batches=2,
         recompute="selective", precision="bfloat16"),
    dict(blocks=1, d_model=32, heads=2, sequence=64, batch=8, recompute="full", tied=False),
], ids=["2x64_data2_selective_bf16", "1x32_full_untied"])
def test_one_replica_is_predicted_as_a_traced_step_holds_it(fields):
    planner = dtflab.memory_planner(budget_gb=0.004, **fields)
    measured = planner.measure()
    print(planner.line.value)
    assert set(measured) == {"parameters", "weight_copies", "gradients", "optimizer",
                             "activations", "total"}
    assert (measured["weight_copies"] > 0) == (fields.get("precision") == "bfloat16")
    for kind, error in planner.errors.items():
        assert abs(error) <= 0.01, (kind, planner.errors)
    # what the planner ran is a replica's share of the batch: half of it with data=2
    problem = train.transformer(fields["blocks"], fields["d_model"], fields["heads"],
                                fields["sequence"], batch_size=fields["batch"])
    if fields.get("data") == 2:
        whole = train.memory(dataclass_replace(problem, recompute=fields["recompute"],
                                               precision=fields["precision"]),
                             micro_batches=fields["micro_batches"])
        assert measured["activations"] < 0.6 * whole.measured["activations"]
    # the bars: predicted and measured, each stacked by kind
    assert list(planner.source.data["bar"]) == ["predicted", "measured"]
    assert "measured vs predicted" in planner.line.value


def dataclass_replace(problem, **changes):
    import dataclasses

    return dataclasses.replace(problem, **changes)


def test_the_fields_move_the_bars_and_a_plan_it_cannot_run_says_why():
    planner = dtflab.memory_planner("GPT-2 small (124 M)", budget_gb=80)
    bars = dict(planner.source.data)
    before = planner.predicted
    assert planner.figure.yaxis.axis_label == "GB"
    planner.fields["tensor"].value = 4  # as the dropdown does
    after = planner.predicted
    assert after["activations"] < before["activations"]
    assert after["parameters"] < before["parameters"]
    assert planner.source.data["activations"][0] < bars["activations"][0]  # the bar moved
    planner.fields["zero"].value = 1  # ZeRO 1 over one replica changes nothing
    assert planner.predicted["optimizer"] == after["optimizer"]
    planner.fields["data"].value = 8
    assert planner.predicted["optimizer"] < after["optimizer"] / 7
    assert "32 device(s)" in planner.line.value
    assert planner.measure() == {}
    assert "set tensor and pipeline ways to 1 and ZeRO stage to 0" in planner.status
    assert list(planner.source.data["bar"]) == ["predicted"]
    # a value that does not split: the line says so and the bars stay
    bars = dict(planner.source.data)
    planner.fields["heads"].value = 5
    assert "heads=5: d_model=768 does not split into 5 equal heads" in planner.line.value
    assert planner.source.data == bars
    # too big to run here
    planner.set(heads=12, tensor=1, pipeline=1, zero=0, data=1)
    assert planner.measure() == {} and "only plans under 1024 MB" in planner.status


def test_a_fused_attention_plan_stays_fused_as_the_fields_move():
    planner = dtflab.memory_planner("GPT-2 small (124 M)", budget_gb=80, attention="fused")
    before = planner.predicted["activations"]
    planner.fields["sequence"].value = 2048  # plain attention's square would grow 4 times
    assert planner.plan.attention == "fused"
    assert planner.predicted["activations"] < 2.5 * before


def test_the_ways_split_what_the_references_say_they_split():
    """A pipeline's first stage under 1F1B keeps the activations of min(p, m) micro-batches
    of its blocks; ZeRO stage s shards one more kind over the data replicas."""
    shape = dict(device_memory.PRESETS["GPT, 32 x 4096 (6.7 B)"], precision="bfloat16")
    one = device_memory.per_device(device_memory.Plan(**shape))
    staged = device_memory.per_device(device_memory.Plan(**shape, pipeline=4, micro_batches=8))
    # a quarter of the blocks, 4 micro-batches of an eighth of the batch in flight: an eighth
    # of the blocks' activations, and half the one-hot tokens (the loss's are the last stage's)
    assert 0.125 < staged["activations"] / one["activations"] < 0.2
    assert 0.24 < staged["parameters"] / one["parameters"] < 0.27
    sharded = [device_memory.per_device(device_memory.Plan(**shape, data=8, zero=stage))
               for stage in (0, 1, 2, 3)]
    assert [s["optimizer"] for s in sharded[1:]] == [sharded[0]["optimizer"] // 8] * 3
    assert sharded[2]["gradients"] == sharded[3]["gradients"] == sharded[0]["gradients"] // 8
    # stage 3: an eighth, and the two units it has gathered, whole (float32 on the wire)
    gathered = device_memory.gathered_units(device_memory.Plan(**shape, data=8, zero=3), True, True)
    assert sharded[3]["parameters"] == sharded[0]["parameters"] // 8 + 4 * gathered
    assert sharded[1]["parameters"] == sharded[0]["parameters"]


@pytest.mark.parametrize("fields, message", [
    (dict(heads=4, tensor=3), r"tensor=3: the 2-block model's 4 heads do not split into 3 equal groups; use tensor=2"),
    (dict(blocks=2, pipeline=4), r"pipeline=4: the 2-block model has 2 blocks, so at most 2 stages; use pipeline=2"),
    (dict(batch=16, data=4, micro_batches=8), r"micro_batches=8: a replica's 4 of the batch of "
                                               r"16 does not split into 8 equal micro-batches"),
    (dict(zero=4), r"zero=4: ZeRO's stage must be one of 0, 1, 2, 3 .*; for example zero=1"),
    (dict(recompute="some"), r"recompute='some': recompute must be one of"),
    (dict(precision="fp8"), r"precision='fp8': precision must be one of"),
    (dict(preset="GPT-5"), r"preset='GPT-5': preset must be one of 'dtflab default"),
])
def test_bad_plans_are_refused_with_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        dtflab.memory_planner(**fields)


def test_the_preset_menu_names_the_shape_it_shows_and_your_own_once_a_field_leaves_it():
    planner = dtflab.memory_planner("GPT-2 small (124 M)", budget_gb=80)
    assert planner.preset.value == "GPT-2 small (124 M)"
    planner.fields["data"].value = 2  # a way, not the shape: still the preset's model
    assert planner.preset.value == "GPT-2 small (124 M)"
    planner.fields["blocks"].value = 13
    assert planner.preset.value == "(your own)"
    planner.preset.value = "GPT, 32 x 4096 (6.7 B)"  # as the menu does
    assert (planner.plan.blocks, planner.plan.d_model, planner.plan.tied) == (32, 4096, False)
    assert dtflab.memory_planner(blocks=3).preset.value == "(your own)"


def test_a_zero_in_a_count_field_is_the_models_default_and_the_widget_says_so():
    import ipywidgets as w

    planner = dtflab.memory_planner("Llama 3 8B").set(kv_heads=0, hidden=0)
    assert (planner.plan.kv_heads, planner.plan.hidden) == (planner.plan.heads, 4 * planner.plan.d_model)

    def texts(widget):
        if isinstance(widget, w.HTML):
            yield widget.value
        for child in getattr(widget, "children", ()):
            yield from texts(child)

    said = " ".join(texts(planner.view()))
    for name in ("kv_heads", "hidden", "experts"):
        assert f"<b>{name}</b> 0" in said, said


def test_the_verdict_says_each_amount_in_its_own_unit_and_no_error_reads_minus_zero():
    from dtflab.ui.memory_planner import amount, percent

    assert [amount(n) for n in (10e6, 6.06e6, 79.4e9, 512, 2_000)] == \
        ["10 MB", "6.06 MB", "79.4 GB", "512 bytes", "2 kB"]
    assert [percent(e) for e in (-0.00001, 0.00001, -0.0123, 0.5)] == ["0.00%", "0.00%", "-1.23%", "+50.00%"]
    planner = dtflab.memory_planner("dtflab default (0.1 M)", budget_gb=0.01)
    spare = 0.01e9 - planner.predicted["total"]
    assert f"fits in 10 MB with {amount(spare)} to spare" in planner.line.value
    assert " GB" not in planner.line.value.split("fits in")[1]


def test_in_16_bits_the_weight_copies_are_a_bar_of_their_own_and_the_line_says_what_they_are():
    shape = dict(device_memory.PRESETS["GPT, 32 x 4096 (6.7 B)"], recompute="full")
    planner = dtflab.memory_planner(**shape, precision="float32")
    assert "16-bit copies" not in planner.line.value
    assert planner.predicted["weight_copies"] == 0 and planner.source.data["weight_copies"] == [0]
    as_float32 = planner.predicted["activations"]
    planner.set(precision="bfloat16")
    # 32 blocks of 12 d^2 + 13 d, the final norm's d and the output layer's V d, 2 bytes each
    copies = 2 * (32 * (12 * 4096**2 + 13 * 4096) + 4096 + 32000 * 4096)
    assert planner.predicted["weight_copies"] == copies
    bars = planner.source.data  # in one unit: the copies' bar to the parameters' as the bytes
    assert bars["weight_copies"][0] / bars["parameters"][0] == pytest.approx(
        copies / planner.predicted["parameters"])
    assert f"weight copies {copies / 1e9:.4g}" in planner.line.value
    assert f"16-bit copies of the weights the backward multiplies by ({copies / 1e9:.3g} GB" in planner.line.value
    # the case the line explains: the activations halve, but with the copies hold more
    assert planner.predicted["activations"] < as_float32 < planner.predicted["activations"] + copies


def test_todays_presets_have_their_published_parameter_counts_and_the_menu_sets_their_blocks():
    for name, (source, published) in device_memory.SOURCES.items():
        plan = device_memory.Plan(**device_memory.PRESETS[name])
        count = device_memory.stage_parameters(plan, True, True)["total"]
        print(f"{name}: {count / 1e9:.3f} B, published {published / 1e9:.3g} B ({source})")
        assert abs(count / published - 1) < 0.005, name
    planner = dtflab.memory_planner("Llama 3 70B", budget_gb=80)
    assert (planner.plan.kv_heads, planner.plan.activation, planner.plan.norm,
            planner.plan.tied) == (8, "swiglu", "rms", False)
    planner.preset.value = "GPT-2 small (124 M)"  # back to GPT-2's block, as the menu does
    assert (planner.plan.kv_heads, planner.plan.hidden, planner.plan.activation) == (12, 3072,
                                                                                    "gelu")
    planner.fields["d_model"].value = 1536  # the MLP's width follows d_model: 4 d
    assert planner.plan.hidden == 4 * 1536
    planner.set(d_model=1024, heads=8)  # as the control does, from code too
    assert (planner.plan.hidden, planner.plan.kv_heads) == (4 * 1024, 8)
    planner.preset.value = "Mixtral 8x7B"
    assert (planner.plan.experts, planner.plan.top_k) == (8, 2)
    # grouped-query attention keeps less: 8 key/value heads of 64 against one per query head
    llama = device_memory.Plan(**device_memory.PRESETS["Llama 3 70B"])
    every_head = device_memory.Plan(**{**device_memory.PRESETS["Llama 3 70B"], "kv_heads": 64})
    assert (device_memory.per_device(llama)["activations"]
            < device_memory.per_device(every_head)["activations"])


@pytest.mark.slow
def test_llamas_block_is_predicted_as_a_traced_step_holds_it():
    planner = dtflab.memory_planner(budget_gb=0.004, blocks=2, d_model=64, heads=4, kv_heads=2,
                                    hidden=96, activation="swiglu", norm="rms",
                                    positions="rotary", tied=False, sequence=32, batch=8,
                                    recompute="selective", precision="bfloat16")
    planner.measure()
    print(planner.line.value)
    assert planner.errors and all(abs(error) <= 0.01 for error in planner.errors.values())
