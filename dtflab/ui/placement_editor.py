"""The placement editor: drag variables between devices, see what each move costs."""

from __future__ import annotations

from dtflab import names
from dtflab._quiet import import_tf
from dtflab.placement.plan import STRATEGIES, PlacementPlan, variable_info
from dtflab.tracing.step import short_device

STRATEGY_LABELS = {"round_robin": "Round robin", "greedy": "Greedy by bytes",
                   "by_layer": "By layer", "single": "All on compute device"}


def build_graph(builder, plan: PlacementPlan):
    """Run ``builder()`` in a fresh graph under ``plan``: (graph, fetch, feed, init, variables)."""
    tf = import_tf()
    graph = tf.Graph()
    with graph.as_default(), plan.scope():
        fetch, feed = builder()
        init = tf.compat.v1.global_variables_initializer()
        variables = [variable_info(v) for v in tf.compat.v1.trainable_variables()]
    return graph, fetch, feed, init, variables


class PlacementEditor:
    """The placement board (a box per device, a chip per variable sized by its bytes, ps load
    bars, strategy buttons, undo) above the views of the last traced step.

    In [1]: editor = PlacementEditor(cluster, builder, job="ps")
    In [2]: editor            # shows the board; editor.plan is the live plan

    Drag a chip to another device (or focus it and press 1-9 or the arrow keys) and the plan
    assigns that variable there (a manual rule); change ``editor.plan`` from Python and the
    chips move. After a change, once nothing else has changed for ``debounce_s``, one step is
    rebuilt and traced in the background, and the board's history gains a row: the bytes
    between tasks, the step time and the imbalance, next to the earlier ones. A strategy
    button starts the plan over (manual rules are dropped); Undo takes back the last change.

    ``builder()`` builds the model in the current graph and returns ``(fetch, feed_dict)``;
    variables are those it creates (``trainable_variables``). The partition graph below the
    board starts collapsed by name scope above ``max_ops`` ops: click a scope to open it.
    """

    def __init__(self, cluster, builder, plan: PlacementPlan | None = None, *, job: str = "ps",
                 apply: bool = True, debounce_s: float = 0.4, max_ops: int = 60):
        import threading

        import ipywidgets as w

        from dtflab.ui.placement_widget import PlacementBoard

        self.cluster, self.builder, self.job, self.debounce_s = cluster, builder, job, debounce_s
        self.max_ops = max_ops  # above this, the partition graph starts collapsed by scope
        self.plan = plan or PlacementPlan.round_robin(cluster, job=job)
        self.step = None
        _, _, _, _, self.variables = build_graph(builder, self.plan)
        self._undo: list[tuple[dict, str]] = []  # (plan before, what changed)
        self._change, self._applied = "start", None
        self._lock, self._timer = threading.RLock(), None
        self.board = PlacementBoard(
            devices=[{"device": d, "name": short_device(d)} for d in self.plan.devices],
            strategies=[[key, STRATEGY_LABELS[key]] for key in STRATEGIES])
        self.board.on_msg(self._on_message)
        self.views = w.VBox()
        self.widget = w.VBox([self.board, self.views])
        self.plan._watchers.append(self._plan_changed)
        self._show_plan()
        if apply:
            self.apply()

    # -- what the user calls ------------------------------------------------------------------

    def use_strategy(self, strategy: str) -> None:
        self._remember(f"strategy: {STRATEGY_LABELS.get(strategy, strategy)}")
        self.plan.use_strategy(strategy, job=self.job, variables=self.variables)

    def move(self, name: str, device: str) -> None:
        """What a drag does: ``name`` to ``device`` (``ps:1`` or a full device name)."""
        self._remember(f"{name} → {short_device(self.plan._checked(device))}")
        self.plan.assign(name, device)

    def undo(self) -> None:
        """Take back the last change made through the board (or ``move``/``use_strategy``)."""
        if self._undo:
            before, change = self._undo.pop()
            self._change = f"undo {change}"
            self.plan.restore(before)

    def device_of(self, name: str) -> str:
        """Where the board shows ``name`` (what the page draws, not what the plan computes)."""
        return next(chip["device"] for chip in self.board.chips if chip["name"] == name)

    def apply(self) -> None:
        """Rebuild with the current plan, trace one step, redraw the views, add a history row."""
        from jupyter_bokeh import BokehModel

        from bokeh.layouts import column, row
        from dtflab.tracing.capture import trace
        from dtflab.viz.partition import link_to_timeline, partition_figure
        from dtflab.viz.placement import placement_figure
        from dtflab.viz.timeline import timeline_figure
        from dtflab.viz.transfers import transfer_matrix_figure

        tf = import_tf()
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self.board.status = "tracing a step…"
            graph, fetch, feed, init, self.variables = build_graph(self.builder, self.plan)
            target = self.cluster.target(*names.split(self.plan.compute))
            with tf.compat.v1.Session(target, graph=graph) as session:
                session.run(init)
                session.run(fetch, feed)  # the first run sets the graph up on every task
                self.step = trace(session, fetch, feed)
            self._applied = self.plan.to_dict()
            wire = sum(t.nbytes for t in self.step.transfers)
            imbalance = self.plan.imbalance(self.variables)
            self.board.history = self.board.history + [
                {"change": self._change, "bytes": wire, "step_ms": self.step.step_us / 1000,
                 "imbalance": imbalance}]
            self._change = "apply"
            self.board.status = ""
            partition = partition_figure(self.step, width=760, max_ops=self.max_ops)
            timeline = timeline_figure(self.step, width=760)
            link_to_timeline(partition, timeline)
            layout = column(row(placement_figure(self.plan, self.variables, width=420),
                                transfer_matrix_figure(self.step, width=340)),
                            partition, timeline)
            self.views.children = [BokehModel(layout)]

    def wait(self, timeout: float | None = None) -> None:
        """Block until the trace the last change scheduled has run (at once if none is due)."""
        timer = self._timer
        if timer is not None:
            timer.join(timeout)

    def close(self) -> None:
        """Cancel a pending trace and close the board (the plan stays usable)."""
        with self._lock:
            timer, self._timer = self._timer, None
            if timer is not None:
                timer.cancel()
            if self._plan_changed in self.plan._watchers:
                self.plan._watchers.remove(self._plan_changed)
        if timer is not None:
            timer.join()  # outside the lock: a trace that already started needs it
        self.board.close()

    # -- internals ----------------------------------------------------------------------------

    def _remember(self, change: str) -> None:
        self._undo.append((self.plan.to_dict(), change))
        self._change = change

    def _on_message(self, _, content, buffers=None) -> None:
        try:
            if content.get("kind") == "move":
                self.move(content["name"], content["device"])
            elif content.get("kind") == "strategy":
                self.use_strategy(content["strategy"])
            elif content.get("kind") == "undo":
                self.undo()
        except ValueError as exc:  # a device the plan does not know: say so on the board
            self.board.status = str(exc)

    def _plan_changed(self) -> None:
        if self._change == "apply":  # not through the board: changed from Python
            self._change = "plan changed from Python"
        self._show_plan()
        self._schedule()

    def _show_plan(self) -> None:
        placement = self.plan.placement(self.variables)
        self.board.chips = [{"name": v.name, "shape": "x".join(map(str, v.shape)) or "scalar",
                             "bytes": v.nbytes, "device": placement[v.name]} for v in self.variables]
        self.board.loads = self.plan.bytes_per_device(self.variables)
        self.board.imbalance = self.plan.imbalance(self.variables)
        self.board.can_undo = bool(self._undo)

    def _schedule(self) -> None:
        """Trace once the plan has stopped changing for ``debounce_s``, in the background."""
        import threading

        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.debounce_s, self._apply_if_changed)
            self._timer.daemon = True
            self._timer.start()

    def _apply_if_changed(self) -> None:
        with self._lock:
            if self.plan.to_dict() == self._applied:
                return
            try:
                self.apply()
            except Exception as exc:  # shown on the board: this runs in a timer thread
                self.board.status = f"tracing failed: {exc}"

    def _ipython_display_(self):
        from IPython.display import display

        from dtflab.viz.output import load_bokehjs

        # The embedded BokehModel renders with the page's BokehJS. %load_ext dtflab loads it
        # in an earlier cell; loading it here, in the same output, can lose the race.
        load_bokehjs()
        from html import escape

        from dtflab.viz.output import display_with_a_still
        from dtflab.viz.placement import placement_figure

        # the still: where each variable was, and the step's bytes (the views need the kernel)
        placed = self.plan.placement(self.variables)
        rows = "".join(f"<tr><td>{escape(name)}</td><td>{escape(short_device(device))}</td></tr>"
                       for name, device in placed.items())
        last = self.board.history[-1] if self.board.history else None
        step = (f"<p>{last['bytes']:,} bytes on the wire, a step of {last['step_ms']:.1f} ms</p>"
                if last else "")
        # the still's own figure, drawn once here (the one in the views is its widget's)
        figures = [placement_figure(self.plan, self.variables, width=420)] if last else []
        display_with_a_still(self.widget, figures,
                             f"<table><tr><th>variable</th><th>on</th></tr>{rows}</table>{step}")
