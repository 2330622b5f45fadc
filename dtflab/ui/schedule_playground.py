"""The schedule playground: pick a pipeline schedule, its workers p, micro-batches m and chunks
v, and see the formula's timeline at once, with its bubble; **Run** runs that schedule on the
cluster (a small MLP with ``p x v`` full-width layers, one traced step) and draws the timeline it really
ran under it, the measured and the formula's bubble side by side.

In [1]: playground = dtflab.schedule_playground(cluster)
In [2]: playground                        # the widget
In [3]: playground.set(schedule="interleaved", chunks=2, micro_batches=8)
In [4]: playground.run()                  # or the button: a Bubble, drawn under the formula

The formula's timeline is :func:`dtflab.train.formulas.schedules.pipeline_timeline`, with a
forward taking 1, a backward ``backward`` (2 by default) and, for the zero-bubble schedule, the
weights' share of the backward ``weight_share`` (a half by default). Run cannot run more
workers than the cluster has worker tasks; it says so instead of drawing. Given no cluster, or
one that was stopped (a notebook's last cell stops it, and Run All runs that cell too), Run
starts a cluster of its own with p workers (at most ``OWN_WORKERS``, for Binder's 2 GiB) and
stops it once the step is traced: nothing of it outlives the click.
"""

from __future__ import annotations

from dtflab import checks, machine
from dtflab.train.formulas import schedules
from dtflab.train.layouts.layout import Layout, said_as

#: The largest setting Run runs here: pieces of work per step (p x m x v x 3 at most).
MAX_PIECES = 400
#: The most workers Run starts a cluster of its own with (about 140 MB of memory each here).
OWN_WORKERS = 4
#: Each chart's width: its still fits the documentation site's column (656 px, the output's
#: margin taken off), the legend's last entry and the last stage's labels included.
CHART_PX = 600

#: Each whole-number control's slider: (least, most, an example a refusal suggests).
RANGES = {"stages": (2, 8, 2), "micro_batches": (1, 32, 4), "chunks": (1, 4, 1)}


class SchedulePlayground:
    """See the module's docstring. ``timeline`` is the formula's current timeline, ``bubble``
    the last run's (None before Run), ``status`` the line under the charts."""

    def __init__(self, cluster=None, *, schedule: str = "1f1b", stages: int = 2,
                 micro_batches: int = 4, chunks: int = 1, backward: float = 2.0,
                 weight_share: float = 0.5, width: int = 256):
        import ipywidgets as w

        from dtflab.viz.pipeline import Timeline

        # the sliders' ranges, and the one layout's rules: refused, never clamped
        for name, value in (("stages", stages), ("micro_batches", micro_batches),
                            ("chunks", chunks)):
            low, high, example = RANGES[name]
            checks.whole(value, name, minimum=low, maximum=high, example=example)
        with said_as(False, pipeline="stages"):
            Layout(pipeline=stages, micro_batches=micro_batches, schedule=schedule, chunks=chunks)
        self.cluster = cluster
        self.width = width
        self.bubble = None
        self.status = ""
        self.timeline: list = []
        self.controls = {
            "schedule": w.ToggleButtons(options=list(schedules.SCHEDULES), value=schedule,
                                        description="schedule"),
            "stages": w.IntSlider(value=stages, min=RANGES["stages"][0],
                                  max=RANGES["stages"][1], description="workers p"),
            "micro_batches": w.IntSlider(value=micro_batches, min=RANGES["micro_batches"][0],
                                         max=RANGES["micro_batches"][1],
                                         description="micro-batches m"),
            "chunks": w.IntSlider(value=chunks, min=RANGES["chunks"][0],
                                  max=RANGES["chunks"][1], description="chunks v"),
            "backward": w.FloatSlider(value=backward, min=0.5, max=4.0, step=0.1,
                                      description="backward / forward"),
            "weight_share": w.FloatSlider(value=weight_share, min=0.1, max=0.9, step=0.05,
                                          description="W share of backward"),
        }
        for control in self.controls.values():
            control.style.description_width = "initial"
            control.observe(lambda _: self._redraw(), names="value")
        self.run_button = w.Button(description="Run", icon="play",
                                   tooltip="run this schedule on the cluster and trace a step")
        self.run_button.on_click(lambda _: self._clicked())
        self.line = w.HTML()
        self.formula_chart = Timeline(prefix="formula_", x_label="time (a forward takes 1)",
                                      width=CHART_PX)
        self.measured_chart = Timeline(prefix="measured_", x_label="ms from the first piece",
                                       width=CHART_PX)
        for chart in (self.formula_chart, self.measured_chart):  # not over the title's end
            chart.figure.toolbar_location = "right"
        self.measured_chart.figure.visible = False
        self.widget = None
        self._redraw()

    # -- what a learner calls ------------------------------------------------------------------

    @property
    def setting(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def set(self, **changes) -> SchedulePlayground:
        """Move the controls (``schedule="interleaved"``, ``chunks=2``...) as a learner would;
        a name that is not a control is one line naming the controls."""
        for name in changes:
            if name not in self.controls:
                raise ValueError(f"{name}=: the playground's controls are "
                                 f"{', '.join(self.controls)}")
        for name, value in changes.items():
            self.controls[name].value = value
        return self

    def run(self, steps: int = 3):
        """Run the current schedule on the cluster, trace its last step and draw it under the
        formula's; returns the :class:`~dtflab.train.measure.bubble.Bubble` (None, with the
        reason in ``status``, where it cannot run here)."""
        s = self.setting
        p, m, v = s["stages"], s["micro_batches"], s["chunks"]
        reason = self._cannot_run(p, m, v)
        if reason:
            self.status = reason
            self._show()
            return None
        from dtflab import train
        from dtflab.cluster import start_cluster

        own = self._needs_its_own()
        self.status = f"starting {p} workers of its own, then running…" if own else "running…"
        self._show()
        # p x v full-width layers between a narrow input and output: every stage gets one
        problem = train.classification(width=self.width, features=8, batch_size=32 * m,
                                       hidden_layers=p * v + 1)
        cluster = (start_cluster(ps=0, workers=p, inter_op_threads=2, intra_op_threads=1)
                   if own else self.cluster)
        try:
            run = train.pipeline(problem, cluster, stages=p, micro_batches=m,
                                 schedule=s["schedule"], chunks=v, steps=steps,
                                 trace_step=steps - 1, watchdog=False)
        finally:
            if own:
                cluster.stop()
        self.bubble = bubble = run.bubble
        origin = min(slot.start_us for slot in bubble.slots)
        measured = [(bubble.worker(slot), slot.kind, slot.micro_batch,
                     (slot.start_us - origin) / 1e3, (slot.end_us - origin) / 1e3,
                     slot.stage // p) for slot in bubble.slots]
        chart = self.measured_chart
        chart.draw(measured, [f"worker {d}: idle {share:.0%}" for d, share
                              in enumerate(bubble.idle_share)], end=bubble.span_us / 1e3,
                   what="measured", chunks=v,
                   title=f"Measured on the cluster: idle {bubble.mean_idle_share:.0%} of "
                         f"{bubble.span_us / 1e3:.1f} ms (bubble {bubble.bubble_ratio:.2f} of "
                         f"the work)")
        chart.fit(bubble.span_us / 1e3)
        chart.figure.visible = True
        self.status = (f"measured: idle {bubble.mean_idle_share:.1%} of the pipeline, bubble "
                       f"{bubble.bubble_ratio:.3f} of the work; the formula with this run's "
                       f"pieces: {bubble.formula:.1%}, {bubble.formula_ratio:.3f}. What the "
                       f"formula leaves out (each piece's start-up, the hops between workers) "
                       f"is the difference where each worker has a core to itself; here {p} "
                       f"workers had {machine.cpus():g} CPUs' worth of time, shared with "
                       f"whatever else ran, and their waits for a core count as idle too"
                       + (f". Ran on {p} workers of its own, started for this run and stopped "
                          f"after (the playground's cluster "
                          f"{'was stopped' if self.cluster is not None else 'was not given'})"
                          if own else ""))
        self._show()
        return bubble

    # -- the widget ----------------------------------------------------------------------------

    def _clicked(self):
        """Run, from the button: an error is the status line's (a widget's callback has nowhere
        else to show it), not a status left at "running…"."""
        try:
            self.run()
        except Exception as error:  # noqa: BLE001 - shown, not swallowed
            self.status = f"Run failed: {type(error).__name__}: {error}"
            self._show()

    def _ipython_display_(self):
        from dtflab.viz.output import display_with_a_still

        figures = [self.formula_chart.figure] + ([self.measured_chart.figure]
                                                 if self.measured_chart.figure.visible else [])
        display_with_a_still(self.view(), figures, self.line.value)

    def view(self):
        """The widget: the controls, the formula's chart, the measured one, the status line."""
        if self.widget is None:
            import ipywidgets as w
            from jupyter_bokeh import BokehModel

            from dtflab.viz.output import load_bokehjs

            load_bokehjs()
            c = self.controls
            self.widget = w.VBox([
                c["schedule"], w.HBox([c["stages"], c["micro_batches"], c["chunks"]]),
                w.HBox([c["backward"], c["weight_share"], self.run_button]),
                BokehModel(self.formula_chart.figure), BokehModel(self.measured_chart.figure),
                self.line], layout=w.Layout(width="780px"))
            self.widget.add_class("dtflab-schedule-playground")
        return self.widget

    def _cannot_run(self, p: int, m: int, v: int) -> str:
        if not self.timeline:
            return f"cannot run: {self.status}"
        if self._needs_its_own():
            if p > OWN_WORKERS:
                return (f"Run starts at most {OWN_WORKERS} workers of its own and p is {p}: "
                        f"lower p, or pass a running cluster with {p} worker tasks, "
                        f"dtflab.schedule_playground(dtflab.start_cluster(workers={p}))")
            return ""
        workers = len(self.cluster.addresses.get("worker", []))
        if p > workers:
            return (f"Run needs {p} worker tasks and the cluster has {workers}: lower p to "
                    f"{workers} or start a larger cluster")
        if len(self.timeline) > MAX_PIECES:
            return (f"Run runs up to {MAX_PIECES} pieces of work a step here; this setting has "
                    f"{len(self.timeline)}: lower m or v")
        return ""

    def _needs_its_own(self) -> bool:
        return self.cluster is None or self.cluster.stopped

    def _redraw(self):
        s = self.setting
        p, m, v = s["stages"], s["micro_batches"], s["chunks"]
        weight = s["backward"] * s["weight_share"]
        try:
            self.timeline = schedules.pipeline_timeline(
                s["schedule"], p, m, chunks=v, forward=1.0, backward=s["backward"],
                weight=weight if s["schedule"] == "zero_bubble" else None)
        except ValueError as error:
            self.timeline, self.status = [], str(error)
            self.formula_chart.draw([], [f"worker {d}" for d in range(p)], end=1.0,
                                    title="no timeline for this setting")
            self._show()
            return
        ratio = schedules.bubble_ratio(s["schedule"], p, m, v, forward=1.0,
                                       backward=s["backward"], weight=weight)
        shares = schedules.idle_share(self.timeline, p)
        end = max(piece.end for piece in self.timeline)
        self.formula_chart.draw(self.timeline, [f"worker {d}: idle {share:.0%}" for d, share
                                                in enumerate(shares)], what="formula", chunks=v,
                                title=f"Formula: {s['schedule']}, p = {p}, m = {m}"
                                      + (f", v = {v}" if v > 1 else "")
                                      + f": bubble {ratio:.3f} of the work")
        self.formula_chart.fit(end)
        self.bubble, self.status = None, ""
        self.measured_chart.figure.visible = False
        self._show()

    def _show(self):
        s = self.setting
        text = ""
        if self.timeline:
            p, m, v = s["stages"], s["micro_batches"], s["chunks"]
            ratio = schedules.bubble_ratio(s["schedule"], p, m, v, forward=1.0,
                                           backward=s["backward"],
                                           weight=s["backward"] * s["weight_share"])
            peak = max(schedules.in_flight_peak(order) for order
                       in schedules.pipeline_order(s["schedule"], p, m, v))
            text = (f"<b>formula: each worker idles {ratio / (1 + ratio):.1%} of the step "
                    f"(bubble {ratio:.3f} of the work)</b>; at most {peak} pieces in flight on a "
                    f"worker" + (f" ({peak / v:.2g} micro-batches' activations)" if v > 1 else ""))
        if self.status:
            text += ("<br>" if text else "") + self.status
        self.line.value = text


def schedule_playground(cluster=None, **setting) -> SchedulePlayground:
    """A :class:`SchedulePlayground` on ``cluster`` (without one, Run starts its own), starting
    from ``setting`` (``schedule``, ``stages``, ``micro_batches``, ``chunks``, ``backward``,
    ``weight_share``)."""
    return SchedulePlayground(cluster, **setting)
