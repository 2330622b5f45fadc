"""A live training dashboard: loss, throughput and staleness, streamed while runs go on.

Follows Bokeh's streaming model: each line has a ColumnDataSource fed with ``stream(new)`` from
a small updater thread, and stays at most ``decimate.LIMIT`` points (each the mean of the steps
it covers) however long the run goes on: the page never falls behind a long run. In JupyterLab
the figures sit in a ``LiveBokehModel`` widget, which sends each change as it happens in a form
a view that starts late still reads (``dtflab.viz.live_model``); when the runs end, the page is
handed the whole document once, so a view that started after the first points shows them too.
"""

from __future__ import annotations

import collections
import html
import threading

from dtflab.viz.decimate import DecimatedLine
from dtflab.viz.palette import PALETTE

THROUGHPUT_WINDOW_S = 2.0


class Dashboard:
    """Live plots for one or more running loops (``BackgroundRun``) and a Stop button.

    In [1]: run = dtflab.train.async_parameter_server(problem, cluster, background=True)
    In [2]: Dashboard(run)

    ``interval_s`` is how often new steps are pushed (default 0.4 s). With no front end (a
    script, a test) nothing is shown, and ``figures`` holds the final plots once the runs end.
    """

    def __init__(self, *runs, interval_s: float = 0.4, title: str = "Training"):
        from bokeh.layouts import column, row
        from bokeh.models import ColumnDataSource
        from bokeh.plotting import figure

        self.runs = runs
        self.interval_s = interval_s
        self.loss_fig = figure(title=f"{title}: loss per example", height=260, width=560,
                               x_axis_label="step", y_axis_type="log", tools="pan,wheel_zoom,reset,save")
        self.speed_fig = figure(title="Throughput (examples/s)", height=260, width=420,
                                x_axis_label="seconds", tools="pan,wheel_zoom,reset,save")
        self.stale_fig = figure(title="Staleness of applied gradients", height=220, width=420,
                                x_axis_label="updates by others between read and write",
                                tools="save")
        self.loss_lines: dict[tuple[int, str], DecimatedLine] = {}
        self.speed_sources = [ColumnDataSource({"time": [], "speed": []}) for _ in runs]
        self.speed_lines = [DecimatedLine(source, "time", "speed") for source in self.speed_sources]
        self.stale_source = ColumnDataSource({"left": [], "right": [], "count": []})
        self.stale_fig.quad(left="left", right="right", bottom=0, top="count",
                            source=self.stale_source, color="#9467bd", name="staleness")
        for i, (run, source) in enumerate(zip(runs, self.speed_sources)):
            self.speed_fig.line("time", "speed", source=source, color=PALETTE[i % len(PALETTE)],
                                legend_label=run.history.name, line_width=2)
        self.speed_fig.legend.location = "bottom_right"
        # Every line exists before the figure is shown: renderers added to a displayed
        # BokehModel never reach the page (only changes to existing sources do).
        for i, run in enumerate(runs):
            for worker in run.history.workers:
                self._loss_line(i, worker)
        self.seen = [0] * len(runs)
        self._staleness = collections.Counter()
        self._recent = [collections.deque() for _ in runs]
        self.figures = column(row(self.loss_fig, self.speed_fig), self.stale_fig)
        self.widget = self._widget()
        self._display_id = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._update_loop, name="dtflab-dashboard", daemon=True)
        self._thread.start()

    # -- public ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask every run to stop after its current step (returns at once)."""
        for run in self.runs:
            run.stop(wait=False)

    def wait(self) -> None:
        """Block until every run has ended and the last points are drawn; where the dashboard
        was displayed with a still (the documentation site, a viewer), the still becomes the
        finished runs' plots."""
        self._thread.join()
        if self.widget is not None and self._display_id is not None:
            from dtflab.viz.output import update_the_still

            update_the_still(self.widget, [self.figures], self.status.value,
                             display_id=self._display_id, when="as the finished run left it")

    def close(self) -> None:
        """Stop updating (the runs go on)."""
        self._closed.set()
        self._thread.join()

    def _ipython_display_(self):
        from IPython.display import display

        from dtflab.viz.output import load_bokehjs

        # The embedded BokehModel renders with the page's BokehJS. %load_ext dtflab loads it
        # in an earlier cell; loading it here, in the same output, can lose the race.
        load_bokehjs()
        if self.widget is None:
            display(self.figures)
            return
        import uuid

        from dtflab.viz.output import display_with_a_still

        self._display_id = uuid.uuid4().hex  # wait() draws the finished runs in the still
        display_with_a_still(self.widget, [], "the runs had just started: "
                             "dashboard.wait() draws them here once they finish",
                             display_id=self._display_id, when="as the runs began")

    # -- internals -------------------------------------------------------------------------

    def _widget(self):
        try:
            import ipywidgets as w

            from dtflab.viz.live_model import LiveBokehModel
        except ImportError:
            return None
        self.stop_button = w.Button(description="Stop", icon="stop", button_style="danger")
        self.stop_button.on_click(lambda _: self.stop())
        self.status = w.HTML("running")
        self.plots = LiveBokehModel(self.figures)
        return w.VBox([self.plots, w.HBox([self.stop_button, self.status])])

    @property
    def loss_sources(self):
        """The loss lines' ``ColumnDataSource`` by (run index, worker)."""
        return {key: line.source for key, line in self.loss_lines.items()}

    def _loss_line(self, run_index: int, worker: str) -> DecimatedLine:
        from bokeh.models import ColumnDataSource

        key = (run_index, worker)
        if key not in self.loss_lines:
            source = ColumnDataSource({"step": [], "loss": []})
            color = PALETTE[len(self.loss_lines) % len(PALETTE)]
            label = self.runs[run_index].history.name + ("" if worker == "all" else f" · {worker}")
            self.loss_fig.line("step", "loss", source=source, color=color, legend_label=label,
                               line_width=1.5)
            self.loss_fig.legend.location = "top_right"
            self.loss_fig.legend.label_text_font_size = "9px"
            self.loss_lines[key] = DecimatedLine(source, "step", "loss")
        return self.loss_lines[key]

    def _push(self) -> None:
        stale_changed = False
        for i, run in enumerate(self.runs):
            new = run.history.since(self.seen[i])
            if not new:
                continue
            self.seen[i] += len(new)
            by_worker: dict[str, dict] = {}
            for record in new:
                data = by_worker.setdefault(record.worker, {"step": [], "loss": []})
                data["step"].append(record.step)
                data["loss"].append(max(record.loss, 1e-12))
                if run.history.loop == "async":
                    self._staleness[record.staleness] += 1
                    stale_changed = True
                self._recent[i].append((record.time_s, record.examples))
            for worker, data in by_worker.items():
                self._loss_line(i, worker).add(data["step"], data["loss"])
            recent = self._recent[i]
            now = recent[-1][0]
            while recent and recent[0][0] < now - THROUGHPUT_WINDOW_S:
                recent.popleft()
            span = now - recent[0][0] if len(recent) > 1 else 0
            if span > 0:
                speed = sum(e for _, e in list(recent)[1:]) / span
                self.speed_lines[i].add([now], [speed])
        if stale_changed:
            keys = sorted(self._staleness)
            self.stale_source.data = {"left": [k - 0.4 for k in keys], "right": [k + 0.4 for k in keys],
                                      "count": [self._staleness[k] for k in keys]}

    def _show_status(self) -> None:
        """While runs go on: "running", or what the watchdog says (a stalled worker); for a run
        that reads an input pipeline, the share of the last seconds it waited for input."""
        said = [f"{run.history.name}: {run.history.status}" for run in self.runs
                if run.history.status]
        for run in self.runs:
            reads_inputs = run.history.details.get("inputs") is not None
            waiting = run.history.input_wait_share(last_s=THROUGHPUT_WINDOW_S) if reads_inputs \
                else None
            if waiting is not None:
                said.append(f"{run.history.name}: waiting for input {waiting:.0%} of the last "
                            f"{THROUGHPUT_WINDOW_S:g} s")
        text = "<br>".join(html.escape(line) for line in said) or "running"
        if self.widget is not None and self.status.value != text:
            self.status.value = text

    def _update_loop(self) -> None:
        try:
            while not self._closed.is_set():
                finished = all(run.done for run in self.runs)
                self._push()
                self._show_status()
                if finished:
                    break
                self._closed.wait(self.interval_s)
            self._push()
            for line in [*self.loss_lines.values(), *self.speed_lines]:
                line.flush()
        except Exception as exc:  # say so on the page rather than freeze without a word
            if self.widget is not None:
                self.status.value = f"the dashboard stopped updating: {type(exc).__name__}: {exc}"
            raise
        if self.widget is not None:
            errors = [f"{run.history.name}: {run.error}" for run in self.runs if run.error]
            summaries = [run.history.summary() for run in self.runs]
            self.status.value = "<br>".join(html.escape(line) for line in errors or summaries)
            self.stop_button.disabled = True
            self.plots.refresh()  # every point, also in a view that missed the first ones
