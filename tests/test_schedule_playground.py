"""The schedule playground in the kernel: moving a control redraws the formula's timeline at
once with its bubble; a setting the schedule refuses says why and draws nothing; Run runs the
schedule on real task servers and draws what it ran under the formula's."""

import pytest

import dtflab
from dtflab import machine
from dtflab.train.formulas import schedules
from dtflab.ui.schedule_playground import OWN_WORKERS


def drawn(chart, kind: str) -> list:
    return list(chart.sources[kind].data["label"])


def test_moving_a_control_redraws_the_formulas_timeline_and_its_bubble():
    playground = dtflab.schedule_playground(stages=4, micro_batches=8)
    assert len(drawn(playground.formula_chart, "F")) == 4 * 8 and not drawn(playground.formula_chart, "W")
    assert "idles 27.3% of the step (bubble 0.375 of the work)" in playground.line.value
    playground.set(schedule="zero_bubble")
    assert sorted(set(drawn(playground.formula_chart, "W"))) == sorted(f"W{j}" for j in range(8))
    assert "(bubble 0.125 of the work)" in playground.line.value  # a third of 1F1B's
    playground.set(schedule="interleaved", chunks=2)
    assert "F0.1" in drawn(playground.formula_chart, "F")
    assert playground.timeline == schedules.pipeline_timeline("interleaved", 4, 8, chunks=2)
    assert "(bubble 0.188 of the work)" in playground.line.value
    # a slower backward: GPipe's bubble share stays (p - 1) / (m + p - 1), its span grows
    playground.set(schedule="gpipe", chunks=1, backward=3.0)
    end = max(piece.end for piece in playground.timeline)
    assert end == pytest.approx((8 + 3) * 4.0)


def test_a_setting_the_schedule_refuses_says_why_and_draws_nothing(split_cluster):
    playground = dtflab.schedule_playground(split_cluster, stages=4, micro_batches=6)
    playground.set(schedule="interleaved", chunks=2)
    assert "micro_batches=6: the interleaved schedule sends micro-batches in groups of 4" in \
        playground.line.value
    assert not drawn(playground.formula_chart, "F")
    assert playground.run() is None and "cannot run" in playground.status
    playground.set(micro_batches=8)
    assert playground.run() is None
    assert playground.status == ("Run needs 4 worker tasks and the cluster has 3: lower p to 3 "
                                 "or start a larger cluster")


@pytest.mark.slow
def test_run_on_a_stopped_cluster_runs_on_workers_of_its_own_and_stops_them(start_cluster):
    # Run All runs a notebook's last cell, cluster.stop(), too: the button still works after it
    from dtflab.cluster import running

    cluster = start_cluster(workers=2)
    playground = dtflab.schedule_playground(cluster, stages=2, micro_batches=2)
    cluster.stop()
    before = set(running.clusters)
    playground.run_button.click()  # as the button does
    assert playground.bubble is not None and len(playground.bubble.slots) == 2 * 2 * 2, \
        playground.line.value
    assert "Ran on 2 workers of its own, started for this run and stopped after (the " \
           "playground's cluster was stopped)" in playground.line.value
    assert playground.measured_chart.figure.visible
    # its own is stopped too, and (no_leaks) its processes are gone
    assert cluster.stopped and set(running.clusters) == before  # meant: read again after Run
    playground.set(stages=OWN_WORKERS + 1)  # more than it starts of its own: says so, starts none
    assert playground.run() is None
    assert playground.status.startswith(f"Run starts at most {OWN_WORKERS} workers of its own "
                                        f"and p is {OWN_WORKERS + 1}: lower p")
    with pytest.raises(ValueError, match="stage=: the playground's controls are schedule, stages"):
        playground.set(stage=2)


@pytest.mark.slow
def test_run_draws_the_measured_timeline_under_the_formulas(split_cluster):
    playground = dtflab.schedule_playground(split_cluster, schedule="zero_bubble", stages=2,
                                            micro_batches=4)
    assert not playground.measured_chart.figure.visible
    bubble = playground.run()
    assert bubble.layout.schedule == "zero_bubble" and len(bubble.slots) == 2 * 4 * 3
    assert playground.measured_chart.figure.visible
    assert sorted(drawn(playground.measured_chart, "W")) == sorted(f"W{j}" for j in range(4)
                                                                   for _ in range(2))
    assert f"bubble {bubble.bubble_ratio:.3f} of the work" in playground.status
    assert f"{bubble.formula_ratio:.3f}" in playground.status
    # the measured bubble comes with the condition it was measured under: workers and cores
    assert f"here 2 workers had {machine.cpus():g} CPUs' worth of time" in playground.status
    playground.set(micro_batches=8)  # a new setting: the old measurement goes
    assert not playground.measured_chart.figure.visible and playground.bubble is None


def test_the_legend_lists_only_the_kinds_of_work_the_schedule_has():
    playground = dtflab.schedule_playground(stages=2, micro_batches=4)  # 1F1B: no weight pieces
    legend = playground.formula_chart.figure.legend[0]
    listed = lambda: [item.label.value for item in legend.items if item.visible]  # noqa: E731
    assert "weight gradients" not in listed() and {"forward", "backward"} <= set(listed())
    playground.set(schedule="zero_bubble")
    assert "weight gradients" in listed()


def test_a_bar_too_narrow_for_its_label_goes_unlabelled_and_keeps_its_name():
    from dtflab.viz.pipeline import Timeline

    chart = Timeline(width=720)
    chart.draw([(0, "F", 0, 0.0, 1.0, 0), (0, "F", 1, 1.0, 1.004, 0)], ["worker 0"])
    data = chart.sources["F"].data
    assert data["label"] == ["F0", "F1"]  # the hover's name for each bar
    assert data["text"] == ["F0", ""]  # about 2 px wide: its label would spill over its neighbours
