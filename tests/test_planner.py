"""The planner: its step-time model against published measured runs (Korthikanti et al. 2022 and
Narayanan et al. 2021 on A100s, Llama 3's and MPT's on H100s), its layouts over N devices, its
configuration map, and bad input refused with the fix. Its check against runs on this machine is a benchmark, not a test: ``benchmarks/plan.py``
(its numbers are in ``docs/guide/planning.md``)."""

import dataclasses

import pytest

import dtflab
from dtflab.train.planner import hardware, published, search, step_time
from dtflab.train.formulas.memory import BYTES
from dtflab.train.planner.device_memory import Plan, per_device

GPT_65B = "GPT, 80 x 8192 (65 B)"


@pytest.mark.parametrize("run", published.RUNS + published.NARAYANAN_RUNS,
                         ids=lambda run: run.name)
def test_each_published_run_is_predicted_within_15_percent_on_the_a100_preset(run):
    (found,) = published.check([run])
    calculon = f"; Calculon {found['calculon_s']} s" if run.calculon_s else ""
    print(f"{run.name} ({found['layout']}): measured {run.measured_s:.2f} s, predicted "
          f"{found['predicted_s']:.2f} s ({found['error']:+.1%}; data axis "
          f"{found['parts']['data']:.3f} s{calculon})")
    assert abs(found["error"]) <= 0.15
    # the same time, as the paper's MFU (eq. 7, 312 TFLOP/s): where the paper states one
    if run.mfu is not None:
        assert found["predicted_mfu"] == pytest.approx(run.mfu * run.measured_s
                                                       / found["predicted_s"], rel=0.01)


@pytest.mark.parametrize("run", published.LLAMA3_RUNS, ids=lambda run: run.name)
def test_each_llama_3_run_is_predicted_within_15_percent_with_fused_attention(run):
    (found,) = published.check([run])
    print(f"{run.name}: measured {run.measured_s:.2f} s (MFU {run.mfu:.0%}), predicted "
          f"{found['predicted_s']:.2f} s ({found['error']:+.1%}, MFU "
          f"{found['predicted_mfu']:.1%})")
    assert abs(found["error"]) <= 0.15
    # the same layout with every score kept and streamed: the attention nobody runs, slower
    # the longer the sequence (at 131,072 tokens, over twice the measured step)
    plain = step_time.step_seconds(dataclasses.replace(run.plan, attention="plain"),
                                   hardware.h100_node())["total"]
    print(f"  plain attention: {plain:.2f} s ({plain / run.measured_s - 1:+.1%})")
    assert plain > found["predicted_s"]
    if run.plan.sequence > 65536:
        assert plain > 2 * run.measured_s


def test_a_ring_across_nodes_shares_each_node_s_adapters_and_a_send_gets_one():
    a100 = hardware.a100_node()
    nic = a100.cluster.bandwidth
    assert a100.link(16, ring=True).bandwidth == 8 * nic  # 8 of the ring a node
    assert a100.link(16, stride=2, ring=True).bandwidth == 4 * nic
    assert a100.link(16, stride=8, ring=True) == a100.cluster  # one a node: its own adapter
    assert a100.link(16) == a100.cluster  # a send
    assert a100.link(8, ring=True) == a100.node  # inside a node
    # never past the node's own link: 8 NDR adapters would be 400 GB/s, NVLink 4 gives 450
    h100 = hardware.h100_node()
    assert h100.link(64, ring=True).bandwidth == min(8 * h100.cluster.bandwidth,
                                                     h100.node.bandwidth)
    # measured: Narayanan et al.'s 1.7B on 32 A100s (32 data ways, 8 a node) ran its step in
    # 3.53 s; the all-reduce over one adapter a device would be 14% of the step predicted, and
    # the prediction 14% long; over the node's eight it is 2% (the run's error within 4%)
    (found,) = published.check(published.NARAYANAN_RUNS[:1])
    one_adapter = step_time.data_seconds(found_plan := published.NARAYANAN_RUNS[0].plan,
                                         dataclasses.replace(a100, per_node=1))
    assert found["parts"]["data"] < one_adapter / 4
    assert abs(found["error"]) < abs((found["predicted_s"] - found["parts"]["data"]
                                      + one_adapter) / found["measured_s"] - 1)
    assert found_plan.data == 32


def test_every_mpt_run_fits_the_80_gb_it_ran_in_as_fsdp_gathers_a_unit_at_a_time():
    # llm-foundry ran each of its 52 H100 rows on 80 GB GPUs; FSDP (ZeRO 3) gathers each
    # block's 16-bit weights for its forward and again for its backward, and frees them in
    # between: keeping a copy of every weight instead, as ZeRO 0-2 do, put 11 rows past 80 GB
    rows = published.check(published.MPT_RUNS)
    assert max(row["memory_gib"] for row in rows) * 2 ** 30 < 80e9
    # 70B on 32 GPUs: 121 GiB of bfloat16 weights, two of its 80 blocks (1.6 GB each) at once
    seventy = published.MPT_RUNS[1].plan
    assert seventy.data == 32 and per_device(seventy)["weight_copies"] < 4e9
    kept = per_device(dataclasses.replace(seventy, zero=2))["weight_copies"]
    assert kept > 30 * per_device(seventy)["weight_copies"]


def test_fsdp_s_exchange_across_nodes_scales_as_measured():
    # MPT 13B without recomputation on 8, 16, 32 and 64 H100s: llm-foundry measured the same
    # tokens a second a GPU within 1% (4,767-4,811), FSDP's bfloat16 gathers (the table's
    # "DEFAULT" mixed precision) prefetched under the forward and the backward
    runs = [run for run in published.MPT_RUNS
            if run.name.startswith("MPT 13b") and run.plan.sequence == 2048]
    assert sorted(run.plan.data for run in runs) == [8, 16, 32, 64]
    rows = published.check(runs)

    def per_gpu(seconds):
        return [run.plan.batch * run.plan.sequence / s / run.plan.data
                for run, s in zip(runs, seconds)]

    measured, predicted = per_gpu(r["measured_s"] for r in rows), per_gpu(
        r["predicted_s"] for r in rows)
    print(f"tokens/s a GPU: measured {[round(x) for x in measured]}, predicted "
          f"{[round(x) for x in predicted]}")
    assert max(measured) / min(measured) < 1.02 and max(predicted) / min(predicted) < 1.05

    # each ring over one adapter a device, as if a node's eight did not share the work: the
    # exchange outlasts the compute past one node and the rate a GPU falls by half or more
    class OneAdapter(hardware.Hardware):
        def link(self, group, stride=1, ring=False):
            return super().link(group, stride)

    h100 = hardware.h100_node()
    lone = OneAdapter(**{f.name: getattr(h100, f.name) for f in dataclasses.fields(h100)})
    alone = per_gpu(step_time.step_seconds(run.plan, lone)["total"] for run in runs)
    print(f"  one adapter a device: {[round(x) for x in alone]}")
    eight = next(x for run, x in zip(runs, alone) if run.plan.data == 8)
    assert all(x < eight / 2 for run, x in zip(runs, alone) if run.plan.data > 8)


def test_a_gpu_preset_plans_fused_attention_unless_told_and_its_table_says_which():
    fused = dtflab.plan("Llama 3 8B", devices=8, hardware="h100", batch=64)
    assert fused.base.attention == "fused"
    assert all(row.plan.attention == "fused" for row in fused.rows)
    assert "fused attention" in fused.table().head and "attention='plain'" in fused.table().head
    plain = dtflab.plan("Llama 3 8B", devices=8, hardware="h100", batch=64, attention="plain")
    assert plain.base.attention == "plain" and "attention='fused'" in plain.table().head
    # the scores kept: a slower step on the same layout, and more memory where nothing is
    # recomputed (full recomputation keeps a block's input alone, either way)
    same = {row.name.replace(", fused", ""): row for row in fused.rows}
    pairs = [(row, same[row.name]) for row in plain.rows if row.name in same]
    assert pairs and all(p.seconds["total"] > f.seconds["total"] for p, f in pairs)
    assert all(p.memory["activations"] > f.memory["activations"] for p, f in pairs
               if p.plan.recompute == "none")
    # the embedding looked up, as the published runs' frameworks do: the first stage keeps
    # no one-hot tokens (dtflab's transformer keeps s·b·V/t of them a micro-batch in flight)
    assert fused.base.embedding == "lookup" and "embedding looked up" in fused.table().head
    row = next(row for row in fused.rows if row.plan.pipeline == 1)
    one_hot = per_device(dataclasses.replace(row.plan, embedding="one-hot"))
    plan = row.plan
    assert one_hot["activations"] - row.memory["activations"] == (
        BYTES[plan.precision] * plan.sequence // plan.context * plan.micro_batch
        * -(-plan.vocabulary // plan.tensor))
    # a dict without attention takes the hardware's; the CPU preset plans plain
    shape = dict(dtflab.train.planner.device_memory.PRESETS["Llama 3 8B"], batch=64)
    assert dtflab.plan(shape, devices=8, hardware="a100").base.attention == "fused"
    cpu = dtflab.plan(shape, devices=8, hardware="cpu").base
    assert (cpu.attention, cpu.embedding) == ("plain", "one-hot")
    # a problem plans the attention it runs, whatever the hardware
    problem = dtflab.train.transformer()
    mine = dtflab.plan(problem, devices=2, hardware="h100").base
    assert (mine.attention, mine.embedding) == ("plain", "one-hot")


def test_the_published_check_as_a_whole_and_what_each_lever_bought():
    rows = published.check()
    errors = [abs(row["error"]) for row in rows]
    print(f"mean {sum(errors) / len(errors):.2%}, worst {max(errors):.2%} "
          f"(Calculon on its eight: 3.65%, 8.87%)")
    assert sum(errors) / len(errors) <= 0.10
    # Table 5's point: the present work runs 29-32% more steps than full recomputation. The
    # model sees the gain on every model and overestimates it by 4-14% (so does Calculon:
    # 1.23-1.45): it charges sequence parallelism's reduce-scatters and all-gathers an
    # all-reduce's bytes, and the paper measured them slower than that
    for model in published.MODELS:
        full, present = (row for row in rows[:8] if row["run"].startswith(model + ","))
        measured = full["measured_s"] / present["measured_s"]
        predicted = full["predicted_s"] / present["predicted_s"]
        print(f"{model}: present work over full recomputation, measured {measured:.2f}, "
              f"predicted {predicted:.2f}")
        assert 1 < predicted <= 1.2 * measured, model


def test_every_layout_uses_the_devices_and_the_fastest_that_fits_comes_first():
    plans = dtflab.plan(GPT_65B, devices=64, hardware="h100", batch=64, precision="bfloat16")
    assert plans.rows and all(row.plan.devices == 64 for row in plans.rows)
    times = [row.seconds["total"] for row in plans.fitting]
    assert times == sorted(times) and plans.best is plans.fitting[0]
    assert all(row.memory["total"] <= 80e9 for row in plans.fitting)
    assert all(row.memory["total"] > 80e9 for row in plans.rows if not row.fits)
    best = plans.best
    assert best.seconds["total"] == pytest.approx(sum(v for k, v in best.seconds.items()
                                                      if k != "total"))
    assert 0 < best.mfu < 1 and best.plan.tensor <= 8  # a tensor group inside a node
    assert "d" in plans.table() and best.name in plans.table()
    html = plans.table(3)._repr_html_()  # a notebook's: rows that scroll, never wrap
    assert 'style="overflow-x:auto"' in html and 'style="white-space:nowrap"' in html
    assert html.count("<tr>") == 1 + min(3, len(plans.fitting)) and best.name in html


def test_a_fixed_way_keeps_only_its_layouts_and_one_that_does_not_divide_is_refused():
    plans = dtflab.plan(GPT_65B, devices=64, hardware="h100", batch=64, tensor=8)
    assert {row.plan.tensor for row in plans.rows} == {8}
    with pytest.raises(ValueError, match=r"tensor=3: 3 tensor ways do not divide 64 devices; "
                                         r"use one of 1, 2, 4, 8, 16, 32, 64"):
        dtflab.plan(GPT_65B, devices=64, hardware="h100", tensor=3)


def test_the_critical_batch_is_where_the_arithmetic_first_outlasts_the_communication():
    base = Plan(blocks=8, d_model=1024, heads=16, sequence=1024, vocabulary=32000, batch=64,
                precision="bfloat16", data=8, micro_batches=8)
    machine = hardware.cpu_cluster()  # a slow network: the data axis binds at small batches
    batch = search.critical_batch(base, machine)
    # meant: critical_batch returns None where the traffic outlasts the arithmetic at any batch
    assert batch is not None and batch % 8 == 0

    def bound(global_batch):
        plan = dataclasses.replace(base, batch=global_batch, micro_batches=global_batch // 8)
        per = step_time.micro_batch_seconds(plan, machine)
        work = plan.micro_batches * (per["compute"] + per["recompute"])
        return work >= step_time.data_seconds(plan, machine)

    assert bound(batch) and (batch == 8 or not bound(batch - 8))


def test_the_configuration_map_colours_the_layouts_that_fit_and_greys_the_rest():
    plans = dtflab.plan(GPT_65B, devices=16, hardware="h100", batch=64, precision="bfloat16")
    figure = plans.heatmap()
    (cells,) = [r for r in figure.renderers if r.name == "plan_cells"]
    data = cells.data_source.data
    assert len(data["tensor"]) == len({(r.plan.tensor, r.plan.pipeline) for r in plans.rows})
    # sixteen stages, with no data ways for ZeRO to shard over, hold a sixteenth of 65 B's
    # parameters, gradients and Adam's state in float32 each: more than 80 GB
    assert any(data["fits"]) and not all(data["fits"])
    assert dict(zip(zip(data["tensor"], data["pipeline"]), data["fits"]))[("1", "16")] is False
    for fits, colour in zip(data["fits"], data["colour"]):
        assert (colour == "#d9d9d9") != fits


def test_a_model_that_fits_on_no_layout_names_the_smallest_memory_and_the_lever():
    plans = dtflab.plan(GPT_65B, devices=8, hardware="h100", batch=8)
    assert not plans.fitting
    with pytest.raises(ValueError, match=r"no layout fits in 80 GB a device: the smallest "
                                         r"reaches [\d.]+ GB \(.*\), most of it optimizer .*; "
                                         r"try more devices, or ZeRO stage 1 or more"):
        plans.best


@pytest.mark.parametrize("call, message", [
    (lambda: dtflab.plan(GPT_65B, devices=8, hardware="b200"),
     r"hardware='b200': not a known hardware; choose one of 'here', 'a100', 'h100', 'tpu-v5e', "
     r"'cpu' \('here' measures this cluster\), or pass a Hardware"),
    (lambda: dtflab.plan(GPT_65B, devices=8, hardware="here"),
     r"hardware='here' measures a cluster: pass cluster=\.\.\."),
    (lambda: dtflab.plan("GPT-5", devices=8),
     r"model='GPT-5': not a known model; choose one of 'dtflab default"),
    (lambda: dtflab.plan(GPT_65B, devices=7, batch=16),
     r"devices=7: no layout of 80 blocks, 64 heads, a sequence of 4096 and a batch of 16 uses 7 "
     r"devices; use a batch divisible by the data ways, e.g. batch=7"),
    (lambda: dtflab.plan(GPT_65B, devices=0), r"devices=0"),
])
def test_bad_input_is_one_line_naming_the_value_and_the_fix(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_memory_levers_move_the_memory_the_way_the_formulas_say():
    plan = Plan(blocks=8, d_model=1024, heads=16, sequence=2048, vocabulary=32000, batch=8,
                precision="bfloat16", tensor=4, dropout=True)
    none = per_device(plan)["activations"]
    sp = per_device(dataclasses.replace(plan, sequence_parallel=True, regather=True))
    # Korthikanti et al. Table 2: 10 + 24/t + 5as/(ht) against 34/t + 5as/(ht) per s·b·h
    s, h, a, t = 2048, 1024, 16, 4
    expected = (34 / t + 5 * a * s / (h * t)) / (10 + 24 / t + 5 * a * s / (h * t))
    blocks_share = (sp["activations"] - 0) / none
    assert blocks_share == pytest.approx(expected, rel=0.05)  # the outside terms move it a little
    with pytest.raises(ValueError, match="sequence_parallel=True: it cuts what tensor"):
        dataclasses.replace(plan, tensor=1, sequence_parallel=True)


def test_a_machine_describes_each_of_its_links_once():
    a100 = hardware.a100_node()
    nvlink, infiniband = (f"{link.name} {link.bandwidth / 1e9:.4g} GB/s" for link in (a100.node, a100.cluster))
    assert a100.describe().endswith(f"; {nvlink}, {infiniband}")
    here = dataclasses.replace(a100, name="here", cluster=a100.node)  # calibrate(): one link
    assert here.describe().endswith(f"a node; {nvlink}") and here.describe().count(nvlink) == 1


def test_the_configuration_map_is_legible_a_scale_labels_that_contrast_and_a_title_in_two_lines():
    from dtflab.viz.colours import contrast

    plans = dtflab.plan(GPT_65B, devices=64, hardware="h100", batch=64, precision="bfloat16")
    figure = plans.heatmap()
    (cells,) = [r for r in figure.renderers if r.name == "plan_cells"]
    data = cells.data_source.data
    ratios = [contrast(text, cell) for text, cell in zip(data["label_colour"], data["colour"])]
    assert min(ratios) >= 4.5, ratios  # WCAG AA for text, on the deepest and the palest cells
    assert contrast("#222832", "#08306b") < 4.5  # what the best cells had: dark grey on deep blue
    (scale,) = [r for r in figure.right if r.name == "plan_scale"]
    assert scale.color_mapper.high == max(m for m, fits in zip(data["mfu"], data["fits"]) if fits)
    titles = [figure.title.text] + [t.text for t in figure.above if hasattr(t, "text")]
    assert titles[1] == f"64 devices of {plans.hardware.name}"
    # at the title's 13 px bold, a character is at most about 8 px: each line fits the 560 px
    assert all(8 * len(text) < figure.width for text in titles), titles


def test_a_trips_figures_are_each_the_median_of_three_calls():
    from dtflab.train.planner import calibration

    calls = iter([{"transfer": (3e-4, 9e-10), "task": (1e-3, 0.0)},
                  {"transfer": (5e-4, 6e-10), "task": (2e-3, 0.0)},
                  {"transfer": (4e-4, 7e-10), "task": (9e-4, 0.0)}])
    assert calibration._median_of(lambda: next(calls)) == {"transfer": (4e-4, 7e-10),
                                                           "task": (1e-3, 0.0)}


@pytest.mark.parametrize("message, runs", [
    ("The same RunGraph (Worker) request was received twice. (injected)", 2),
    ("Step aborted (injected)", 1)])
def test_a_timing_step_whose_request_was_sent_twice_runs_once_more_and_nothing_else_does(
        monkeypatch, message, runs):
    """A calibration's step that TensorFlow aborts because gRPC delivered its request twice
    (a benchmark's calibration ended so, 2026-12-01) is run again; any other abort is raised."""
    import tensorflow as tf
    from dtflab.train.planner.op_costs import timing_session

    real, calls = tf.compat.v1.Session.run, []

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        calls.append(fetches)
        if len(calls) == 1:
            raise tf.errors.AbortedError(None, None, message)
        return real(self, fetches, feed_dict, options, run_metadata)

    graph = tf.Graph()
    with graph.as_default():
        fetch = tf.constant(2.0) * 3.0
    monkeypatch.setattr(tf.compat.v1.Session, "run", run)
    with timing_session("", graph) as session:
        if runs == 1:
            with pytest.raises(tf.errors.AbortedError, match="Step aborted"):
                session.run(fetch)
        else:
            assert session.run(fetch) == 6.0
    assert len(calls) == runs


def test_a_calibration_of_several_tries_keeps_each_figures_median_and_predicts_with_it():
    from dtflab.train.planner import calibration, executor
    from dtflab.train.planner.graph_ops import GraphOp

    base = hardware.cpu_cluster()
    tries = [dataclasses.replace(
        base, name=f"try {i}", per_step_s=step, together={"matrix": kept, "memory": 0.8},
        op_costs={"elementwise": (fixed, 4e-11), "transfer": (trip, 7e-10)},
        matrix_rates=((0.001, rate), (0.1, 2 * rate)), per_node=node,
        node=dataclasses.replace(base.node, latency=trip))
        for i, (step, kept, fixed, trip, rate, node) in enumerate([
            (3e-3, 0.61, 1e-6, 5e-4, 40e9, 2), (5e-3, 0.93, 3e-6, 3e-4, 60e9, 4),
            (4e-3, 0.90, 2e-6, 4e-4, 50e9, 2)])]  # the third try: the middle of every figure
    pooled = calibration.median_of(tries)
    assert (pooled.per_step_s, pooled.together, pooled.per_node) == (4e-3, {"matrix": 0.90,
                                                                             "memory": 0.8}, 2)
    assert pooled.op_costs == {"elementwise": (2e-6, 4e-11), "transfer": (4e-4, 7e-10)}
    assert pooled.matrix_rates == ((0.001, 50e9), (0.1, 100e9))
    assert pooled.node.latency == 4e-4 and pooled.name == "try 0"
    # and the executor prices a step on it as on the middle try
    ops = [GraphOp("a", "MatMul", "worker:0", "matrix", 2e6, 0, (4096,), (), ()),
           GraphOp("b", "AddV2", "worker:1", "elementwise", 0, 8192, (4096,), (("a", 0),), ())]
    seconds = [executor.simulate(ops, one, 2).seconds for one in (*tries, pooled)]
    assert seconds[3] == pytest.approx(seconds[2]) and len(set(seconds[:3])) == 3


def test_a_whole_steps_cost_an_op_is_paid_by_every_op_and_fitted_to_a_measured_step():
    from dtflab.train.planner import executor
    from dtflab.train.planner.graph_ops import GraphOp
    from dtflab.train.planner.op_costs import dispatch_cost

    base = dataclasses.replace(hardware.cpu_cluster(), op_costs={
        "elementwise": (1e-6, 4e-11), "matrix": (3e-6, 0.0)},
        matrix_rates=((0.001, 40e9), (0.1, 80e9)))
    ops = [GraphOp("m", "MatMul", "worker:0", "matrix", 2e6, 0, (4096,), (), ())]
    for i in range(10):  # a chain on one thread: nothing runs beside it
        ops.append(GraphOp(f"a{i}", "AddV2", "worker:0", "elementwise", 0, 8192, (4096,),
                           ((ops[-1].name, 0),), ()))

    def on(seconds: float):
        return dataclasses.replace(base, op_costs={**base.op_costs, "dispatch": (seconds, 0.0)})

    alone = executor.simulate(ops, base, 1).seconds
    assert executor.simulate(ops, on(2e-6), 1).seconds - alone == pytest.approx(11 * 2e-6)
    # fitted back from a step that took what it would at 2 us an op (a search: within 1%)
    measured = executor.simulate(ops, on(2e-6), 1).seconds
    fitted = dispatch_cost(base, lambda h: executor.simulate(ops, h, 1).seconds, measured)
    assert fitted.op_costs["dispatch"][0] == pytest.approx(2e-6, rel=0.01)
    assert {k: v for k, v in fitted.op_costs.items() if k != "dispatch"} == base.op_costs
